//! The tuning table is data the planner reads: a user table (`NETCL_TUNING`) whose entry for a device changes its portable tile and a threshold changes the plans of that device's products.
use netcl_core_devices::test_devices;
use netcl_ops::gemm::GemmKernel;
use netcl_ops::{DType, GemmTile, Tensor};

#[test]
fn a_tile_and_a_threshold_changed_in_the_file_change_the_plan() {
    let dir = std::env::temp_dir().join(format!("netcl-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tuning.json");
    for dev in test_devices().unwrap().iter().filter(|d| d.is_opencl()) {
        // A 10-row bf16 product: a skinny product by default, the portable tile otherwise.
        let a = Tensor::zeros(&[10, 96], DType::BF16, dev).unwrap();
        let b = Tensor::zeros(&[96, 200], DType::BF16, dev).unwrap();
        let before = a.matmul_plan(&b, Default::default()).unwrap();
        assert!(
            matches!(before.kernel, GemmKernel::Gemv(_)),
            "{dev}: {before}"
        );
        let table = format!(
            r#"{{"schema": 2, "devices": [{{"match": {name:?},
                "gemm": {{"bm": 16, "bn": 16, "bk": 8, "wm": 2, "wn": 2}},
                "plan": {{"skinny": {{"max_rows": 4, "max_k": 2048, "max_few": 16384,
                                      "decode_rows": 4}}}}}}]}}"#,
            name = dev.info().name
        );
        std::fs::write(&path, table).unwrap();
        let before = netcl_core_devices::Config::get().tuning.clone();
        netcl_core_devices::Config::update(|c| c.tuning = Some(path.clone()));
        netcl_kernels::tuning::reset_tuning();
        let after = a.matmul_plan(&b, Default::default()).unwrap();
        netcl_core_devices::Config::update(|c| c.tuning = before);
        netcl_kernels::tuning::reset_tuning();
        // No tensor cores for bf16 here (PoCL), else their plan: the file's tile shows where the
        // portable kernel runs.
        match after.kernel {
            GemmKernel::Tiled { tile, .. } => assert_eq!(
                tile,
                GemmTile::new(16, 16, 8, 2, 2).fit(10, 200, 1, dev.info().compute_units as usize),
                "{dev}: {after}"
            ),
            GemmKernel::Wgmma { .. } | GemmKernel::MmaSync { .. } => {}
            _ => panic!("{dev}: the file's threshold was not read: {after}"),
        }
        // And the product still runs, in the new plan, after the table is forgotten.
        let y = a.matmul(&b).unwrap();
        assert_eq!(y.shape(), &[10, 200]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
