//! Out-of-range indices give the same error on every device (at once on the host and for small device index tensors, at the next read for large ones); views of more dims than kernels take still copy.
use netcl_core_devices::test_devices;
use netcl_ops::{DType, Device, Result, Tensor, INDEX_CHECK_LIMIT};

/// `n` ids in [0, v) with `bad` at position `at`.
fn ids(n: usize, v: i32, at: usize, bad: i32, dev: &Device) -> Tensor {
    let data: Vec<i32> = (0..n)
        .map(|i| if i == at { bad } else { i as i32 % v })
        .collect();
    Tensor::from_vec(data, &[n], dev).unwrap()
}

/// The op's error, whether it comes from the op or from the next read of its result.
fn error_of(r: Result<Tensor>) -> String {
    match r.and_then(|t| t.to_vec_f64()) {
        Ok(v) => panic!("no error; {} values came back", v.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn out_of_range_ids_are_errors_on_every_device() {
    let n = INDEX_CHECK_LIMIT + 500; // past the read-back limit: checked by the kernel
    for dev in test_devices().unwrap() {
        let w = Tensor::ones(&[50, 4], DType::F32, &dev).unwrap();
        for bad in [50, -3, 1 << 20] {
            let err = error_of(w.embedding(&ids(n, 50, 1200, bad, &dev)));
            assert!(err.contains("embedding"), "{dev}: {err}");
            assert!(err.contains(&format!("index {bad}")), "{dev}: {err}");
            assert!(err.contains("50"), "names the bound: {err}");
            // The error is reported once; the device stays usable.
            let ok = w.embedding(&ids(n, 50, 0, 0, &dev)).unwrap();
            assert_eq!(ok.to_vec::<f32>().unwrap().len(), n * 4, "{dev}");
        }
        let err = error_of(w.index_select(0, &ids(n, 50, 7, 99, &dev)));
        assert!(
            err.contains("index_select") && err.contains("index 99"),
            "{dev}: {err}"
        );
        // Every index in [0, 4) but one: which bad index is reported is then determined.
        let g = ids(n, 4, 3, 4, &dev).reshape(&[n, 1]).unwrap();
        let x = Tensor::ones(&[n, 4], DType::F32, &dev).unwrap();
        let err = error_of(x.gather(1, &g));
        assert!(
            err.contains("gather") && err.contains("index 4"),
            "{dev}: {err}"
        );
        let src = Tensor::ones(&[n, 1], DType::F32, &dev).unwrap();
        let err = error_of(x.scatter_add(1, &g, &src));
        assert!(
            err.contains("scatter_add") && err.contains("index 4"),
            "{dev}: {err}"
        );
    }
}

#[test]
fn out_of_range_targets_are_errors_on_every_device() {
    for dev in test_devices().unwrap() {
        for n in [3, INDEX_CHECK_LIMIT + 10] {
            let logits = Tensor::zeros(&[n, 5], DType::F32, &dev).unwrap();
            for bad in [5, -1] {
                let t = ids(n, 5, n - 1, bad, &dev);
                let err = error_of(logits.cross_entropy(&t, None).map(|ce| ce.loss));
                assert!(err.contains("cross_entropy"), "{dev} n {n}: {err}");
                assert!(err.contains(&format!("{bad}")), "{dev} n {n}: {err}");
            }
            // An ignored target is not an error.
            let t = ids(n, 5, 0, -100, &dev);
            let ce = logits.cross_entropy(&t, Some(-100)).unwrap();
            assert!(ce.loss.to_vec_f64().unwrap()[0].is_finite(), "{dev}");
        }
    }
}

#[test]
fn a_ten_dim_permute_copies_on_every_device() {
    let shape = [2usize, 3, 2, 2, 3, 2, 2, 2, 3, 2];
    let n: usize = shape.iter().product();
    let perm = [9usize, 0, 8, 1, 7, 2, 6, 3, 5, 4];
    let host = Tensor::arange(0.0, n as f64, 1.0, DType::F32, &Device::host()).unwrap();
    let want = host
        .reshape(&shape)
        .unwrap()
        .permute(&perm)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for dev in test_devices().unwrap() {
        let t = host.to_device(&dev).unwrap().reshape(&shape).unwrap();
        let got = t.permute(&perm).unwrap().contiguous().unwrap();
        assert_eq!(got.to_vec::<f32>().unwrap(), want, "{dev}");
    }
}
