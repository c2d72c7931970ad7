//! The decode GEMVs with biases (Qwen2's q/k/v, Llama's attention and MLP biases) on every device against the host's composition, and a bias of the wrong size.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, tolerance};
use netcl_ops::{DType, Device, KvWrite, RmsScale, RopeFreqs, RopeStyle, Tensor};

fn rand(shape: &[usize], seed: u64) -> Tensor {
    random_tensor(DType::F32, shape, -1.0, 1.0, seed)
}

fn close(got: &Tensor, want: &Tensor, what: &str) {
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if let Err(msg) = check_close(&g, &w, tolerance(DType::F32), scale, what) {
        panic!("{msg}");
    }
}

#[test]
fn biased_decode_gemvs_match_the_composed_ops() {
    let host = Device::host();
    let (b, k, n, hkv, hd, s) = (3, 40, 6, 2, 4, 8);
    let x = rand(&[b, k], 1);
    let (w, up) = (rand(&[n, k], 2), rand(&[n, k], 3));
    let (wq, wk, wv) = (
        rand(&[4 * hd, k], 4),
        rand(&[hkv * hd, k], 5),
        rand(&[hkv * hd, k], 6),
    );
    let norm = RmsScale {
        weight: random_tensor(DType::F32, &[k], 0.5, 1.5, 7),
        eps: 1e-5,
    };
    let (b1, b2) = (rand(&[n], 8), rand(&[2 * n], 9));
    let bqkv = rand(&[4 * hd + 2 * hkv * hd], 10);
    let write = |d: &Device| KvWrite {
        k_cache: rand(&[b, hkv, s, hd], 11).to_device(d).unwrap(),
        v_cache: rand(&[b, hkv, s, hd], 12).to_device(d).unwrap(),
        pos: Tensor::from_vec(vec![3i32], &[1], d).unwrap(),
        pads: None,
        style: RopeStyle::Halves,
        freqs: RopeFreqs::Theta(10000.0),
    };
    let kv_h = write(&host);
    let lin = x
        .decode_linear_biased(Some(&norm), &w, Some(&b1), None)
        .unwrap();
    let glu = x.decode_swiglu_biased(None, &w, &up, Some(&b2)).unwrap();
    let q = x
        .decode_qkv_biased(Some(&norm), [&wq, &wk, &wv], Some(&bqkv), &kv_h)
        .unwrap();
    // The bias counts: without it the product differs.
    let plain = x.decode_linear(Some(&norm), &w, None).unwrap();
    let moved = lin.to_vec_f64().unwrap()[0] - plain.to_vec_f64().unwrap()[0];
    assert!((moved - b1.to_vec_f64().unwrap()[0]).abs() < 1e-5);
    for dev in test_devices().unwrap() {
        let on = |t: &Tensor| t.to_device(&dev).unwrap();
        let nd = RmsScale {
            weight: on(&norm.weight),
            eps: norm.eps,
        };
        let got = on(&x)
            .decode_linear_biased(Some(&nd), &on(&w), Some(&on(&b1)), None)
            .unwrap();
        close(&got, &lin, &format!("{dev} linear"));
        let got = on(&x)
            .decode_swiglu_biased(None, &on(&w), &on(&up), Some(&on(&b2)))
            .unwrap();
        close(&got, &glu, &format!("{dev} swiglu"));
        let kv_d = write(&dev);
        let got = on(&x)
            .decode_qkv_biased(
                Some(&nd),
                [&on(&wq), &on(&wk), &on(&wv)],
                Some(&on(&bqkv)),
                &kv_d,
            )
            .unwrap();
        close(&got, &q, &format!("{dev} q"));
        close(&kv_d.k_cache, &kv_h.k_cache, &format!("{dev} k cache"));
        close(&kv_d.v_cache, &kv_h.v_cache, &format!("{dev} v cache"));
    }
    let e = x
        .decode_linear_biased(None, &w, Some(&b2), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias [12]"), "{e}");
}
