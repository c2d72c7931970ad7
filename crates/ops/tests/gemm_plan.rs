//! The GEMM planner without a device: a table of products on an H100-like GPU and a PoCL-like CPU, each with the kernel, tile, split and staging it must get; and the tuning data steering it.
use netcl_kernels::{PlanTuning, WgTile};
use netcl_ops::gemm::{
    plan, CpuPath, DeviceCaps, GemmKernel, GemmPlan, GemmProblem, KindSet, Operand, OperandLayout,
    Staging, TcOperand,
};
use netcl_ops::{DType, GemmTile, TcTile, TensorCoreKind};
use std::sync::Arc;

fn h100() -> DeviceCaps {
    DeviceCaps {
        host: false,
        cpu: false,
        compute_units: 132,
        max_work_group: 1024,
        local_mem_bytes: 49152,
        mma_sync: KindSet::ALL,
        wgmma: [
            TensorCoreKind::Tf32,
            TensorCoreKind::Bf16,
            TensorCoreKind::F16,
        ]
        .iter()
        .flat_map(|&k| PlanTuning::default().wg.into_iter().map(move |c| (k, c)))
        .collect(),
        async_tiles: [true, true],
        tile: GemmTile::new(128, 128, 16, 8, 8),
        tc_tile: TcTile::DEFAULT,
        tuning: Arc::new(PlanTuning::default()),
    }
}

fn pocl() -> DeviceCaps {
    DeviceCaps {
        cpu: true,
        compute_units: 2,
        max_work_group: 4096,
        local_mem_bytes: 4 << 20,
        mma_sync: KindSet::NONE,
        wgmma: Vec::new(),
        async_tiles: [false, false],
        tile: GemmTile::new(32, 32, 16, 8, 8),
        ..h100()
    }
}

/// An (m, n, k) product in `layout`: `nn` A (M, K) and B (K, N) row-major; `nt` B = Wᵀ of a
/// row-major W (N, K); `tn` A = Yᵀ of a row-major Y (K, M).
fn problem(
    layout: &str,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
    out: DType,
) -> GemmProblem {
    let a = match layout {
        "tn" => [1, m],
        _ => [k, 1],
    };
    let b = match layout {
        "nt" => [1, k],
        _ => [n, 1],
    };
    let side = |strides| OperandLayout {
        strides,
        batch_strides: vec![],
        offset: 0,
    };
    GemmProblem {
        m,
        n,
        k,
        batch: vec![],
        a: side(a),
        b: side(b),
        dtype,
        out_dtype: out,
        tf32: false,
        bias: false,
        activation: false,
        row_sums: false,
        tile: None,
        tc_tile: None,
        wg_tile: None,
    }
}

fn f32(layout: &str, dims: (usize, usize, usize)) -> GemmProblem {
    problem(layout, dims, DType::F32, DType::F32)
}

fn bf16_f32(layout: &str, dims: (usize, usize, usize)) -> GemmProblem {
    problem(layout, dims, DType::BF16, DType::F32)
}

/// The bf16 wgmma kernel in 128 x `tbn` tiles of `stages`, with a loading warpgroup where `ws`.
fn wgmma(tbn: u32, stages: u32, ws: bool, raster: u32, a: TcOperand, b: TcOperand) -> GemmKernel {
    GemmKernel::Wgmma {
        kind: TensorCoreKind::Bf16,
        tile: WgTile {
            tbn,
            stages,
            persistent: 0,
            ws,
        },
        raster,
        a,
        b,
    }
}

fn tiled(t: GemmTile) -> GemmKernel {
    GemmKernel::Tiled {
        tile: t,
        k4: [false, false],
        strip: None,
    }
}

fn check(caps: &DeviceCaps, p: &GemmProblem, want: &GemmPlan) {
    let got = plan(caps, p);
    assert_eq!(&got, want, "{p}: got {got}, want {want}");
}

/// A plan of just `kernel`.
fn only(kernel: GemmKernel) -> GemmPlan {
    GemmPlan {
        widen: false,
        copy: None,
        split: None,
        kernel,
        row_sums: false,
    }
}

#[test]
fn each_shape_gets_its_kernel_tile_split_and_staging() {
    use Staging::{NarrowK, Vec as V};
    use TcOperand::{KRows, Mn};
    let gpu = h100();
    let big = GemmTile::new(128, 128, 16, 8, 8);
    let async_large = |staging| GemmKernel::Async {
        tile: gpu.tuning.async_f32.unwrap().large,
        staging,
        strip: None,
    };
    // x Wᵀ with both operands K-contiguous: W copied N-contiguous, then the pipeline.
    let mut want = only(async_large([NarrowK, V]));
    want.copy = Some(Operand::B);
    check(&gpu, &f32("nt", (8192, 768, 768)), &want);
    // A weight gradient over 8192 tokens in 36 tiles: K split in 16 over the pipeline.
    let mut want = only(async_large([V, V]));
    want.split = Some(netcl_ops::gemm::Split {
        chunks: 16,
        f32_parts: false,
        team: 1,
    });
    check(&gpu, &f32("tn", (768, 768, 8192)), &want);
    // The MLP's first weight gradient: too small for 128 x 128 tiles, both operands copied 16
    // bytes at a time: the small pipelined tile.
    let small = GemmKernel::Async {
        tile: gpu.tuning.async_f32.unwrap().small,
        staging: [V, V],
        strip: None,
    };
    check(&gpu, &f32("tn", (1024, 784, 256)), &only(small));
    // A classifier head and its weight gradient: skinny products, either side.
    let got = plan(&gpu, &f32("nt", (256, 10, 1024)));
    assert!(
        matches!(got.kernel, GemmKernel::Gemv(g) if !g.rows_of_a && g.r == 10 && g.kmajor),
        "{got}"
    );
    let got = plan(&gpu, &f32("tn", (10, 1024, 256)));
    assert!(
        matches!(got.kernel, GemmKernel::Gemv(g) if g.rows_of_a && !g.kmajor),
        "{got}"
    );
    // 16-bit products on tensor cores: wide tiles with a loading warpgroup where they fill the
    // device.
    check(
        &gpu,
        &bf16_f32("nt", (8192, 2048, 2048)),
        &only(wgmma(256, 4, true, 0, KRows, KRows)),
    );
    check(
        &gpu,
        &problem("nn", (4096, 4096, 4096), DType::BF16, DType::BF16),
        &only(wgmma(256, 4, true, 16, KRows, Mn)),
    );
    // A narrow product's weight gradient over a long K: split, tiles as the model says.
    let got = plan(&gpu, &bf16_f32("tn", (256, 2048, 8192)));
    assert!(
        got.split.is_some_and(|s| s.chunks >= 2 && !s.f32_parts)
            && matches!(got.kernel, GemmKernel::Wgmma { a: Mn, b: Mn, .. }),
        "{got}"
    );
    // 16-bit outputs of a split keep f32 parts.
    let got = plan(
        &gpu,
        &problem("tn", (256, 2048, 8192), DType::BF16, DType::BF16),
    );
    assert!(got.split.is_some_and(|s| s.f32_parts), "{got}");
    // TF32 under the "high" precision; exact f32 otherwise.
    let mut tf32 = f32("nn", (4096, 4096, 4096));
    tf32.tf32 = true;
    assert!(
        matches!(
            plan(&gpu, &tf32).kernel,
            GemmKernel::Wgmma {
                kind: TensorCoreKind::Tf32,
                b: TcOperand::Copy,
                ..
            }
        ),
        "TF32 reads K-major operands only"
    );
    check(
        &gpu,
        &f32("nn", (4096, 4096, 4096)),
        &only(async_large([NarrowK, V])),
    );
    // Without wgmma: mma.sync in the device's tiling.
    let ampere = DeviceCaps {
        wgmma: Vec::new(),
        ..h100()
    };
    let got = plan(&ampere, &bf16_f32("nt", (8192, 2048, 2048)));
    assert!(
        matches!(got.kernel, GemmKernel::MmaSync { tile, .. } if tile == TcTile::DEFAULT),
        "{got}"
    );
    // A forced tile (the autotuner's): that tile, nothing else.
    let mut forced = f32("nt", (8192, 768, 768));
    let t = GemmTile::new(16, 16, 8, 2, 2);
    forced.tile = Some(t);
    check(&gpu, &forced, &only(tiled(t)));
    // f64 takes the portable kernel, the big tile where it fills the device.
    check(
        &gpu,
        &problem("nn", (4096, 4096, 512), DType::F64, DType::F64),
        &only(tiled(big)),
    );
}

#[test]
fn cpu_devices_and_the_host_get_their_own_paths() {
    let cpu = pocl();
    let kernel = |p: &GemmProblem| plan(&cpu, p).kernel;
    assert!(matches!(
        kernel(&f32("nn", (64, 64, 64))),
        GemmKernel::Cpu {
            path: CpuPath::Packed,
            ..
        }
    ));
    assert!(matches!(
        kernel(&f32("nt", (1, 300, 64))),
        GemmKernel::Cpu {
            path: CpuPath::Nt,
            ..
        }
    ));
    // 16-bit products on a CPU device: the portable kernel, widened to f32 after.
    let p = bf16_f32("nn", (64, 64, 64));
    let got = plan(&cpu, &p);
    assert!(got.widen, "{got}");
    assert_eq!(got.kernel, tiled(GemmTile::new(32, 32, 16, 8, 8)));
    let host = DeviceCaps {
        host: true,
        ..pocl()
    };
    let got = plan(&host, &p);
    assert!(got.widen && got.kernel == GemmKernel::Host, "{got}");
}

#[test]
fn the_tuning_data_steers_the_plan() {
    let gpu = h100();
    let head = f32("nt", (256, 10, 1024));
    assert!(matches!(plan(&gpu, &head).kernel, GemmKernel::Gemv(_)));
    let mut tuning = PlanTuning::default();
    tuning.skinny.max_rows = 8;
    let narrow = DeviceCaps {
        tuning: Arc::new(tuning.clone()),
        ..h100()
    };
    assert!(!matches!(plan(&narrow, &head).kernel, GemmKernel::Gemv(_)));
    // A forced split (NETCL_GEMM_SPLIT) applies wherever it divides K.
    tuning.split.forced = Some(4);
    let split = DeviceCaps {
        tuning: Arc::new(tuning.clone()),
        ..h100()
    };
    let got = plan(&split, &f32("nn", (512, 512, 1024)));
    assert_eq!(got.split.map(|s| s.chunks), Some(4), "{got}");
    let got = plan(&split, &bf16_f32("nn", (4096, 4096, 4096)));
    assert_eq!(got.split.map(|s| s.chunks), Some(4), "{got}");
    // No pipelined GEMM: the portable tile; only one wgmma tiling passed its probe: that one.
    tuning.split.forced = None;
    tuning.async_f32 = None;
    let mut one = h100().wgmma;
    one.retain(|(_, c)| c.tile.tbn == 128);
    let caps = DeviceCaps {
        tuning: Arc::new(tuning),
        wgmma: one,
        ..h100()
    };
    let got = plan(&caps, &f32("nn", (4096, 4096, 4096)));
    assert!(matches!(got.kernel, GemmKernel::Tiled { .. }), "{got}");
    let got = plan(&caps, &bf16_f32("nn", (4096, 4096, 4096)));
    assert!(
        matches!(got.kernel, GemmKernel::Wgmma { tile, .. } if tile.tbn == 128),
        "{got}"
    );
}

#[test]
fn plans_print_as_one_line() {
    let got = plan(&h100(), &f32("nt", (8192, 768, 768)));
    let line = got.to_string();
    assert!(
        line.starts_with("copy B mn-contiguous, then matmul_async 128x128/8x8"),
        "{line}"
    );
    let p = bf16_f32("tn", (256, 2048, 8192));
    assert_eq!(
        p.to_string(),
        "256x2048x8192 bf16->f32 A mn-major B mn-major"
    );
    let line = plan(&h100(), &p).to_string();
    assert!(
        line.starts_with("split K in") && line.contains("matmul_wg Bf16"),
        "{line}"
    );
}
