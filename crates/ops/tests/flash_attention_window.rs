//! Sliding-window causal attention (Mistral's window) in the fused kernels, forward and backward, and in the decode kernel, against a naive f64 attention on every device.
use netcl_core_devices::test_devices;
use netcl_ops::testing::random_tensor;
use netcl_ops::{DType, Tensor};

/// Naive windowed causal attention in f64 over row-major q (B, H, Tq, D), k and v (B, Hkv, Tk,
/// D) and the output gradient g: (out, dq, dk, dv). Query i sees keys j with
/// i + Tk - Tq - w < j <= i + Tk - Tq.
#[allow(clippy::type_complexity)]
fn naive(
    (q, k, v, g): (&[f64], &[f64], &[f64], &[f64]),
    [b, h, hkv, tq, tk, d]: [usize; 6],
    w: usize,
) -> [Vec<f64>; 4] {
    let scale = 1.0 / (d as f64).sqrt();
    let (mut out, mut dq) = (vec![0.0; q.len()], vec![0.0; q.len()]);
    let (mut dk, mut dv) = (vec![0.0; k.len()], vec![0.0; v.len()]);
    for bi in 0..b {
        for hi in 0..h {
            let hk = hi / (h / hkv);
            let qa = |i: usize| ((bi * h + hi) * tq + i) * d;
            let ka = |j: usize| ((bi * hkv + hk) * tk + j) * d;
            for i in 0..tq {
                let last = i as i64 + tk as i64 - tq as i64;
                let keys: Vec<usize> = (0..tk)
                    .filter(|&j| j as i64 <= last && j as i64 > last - w as i64)
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| scale * (0..d).map(|e| q[qa(i) + e] * k[ka(j) + e]).sum::<f64>())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let dp: Vec<f64> = keys
                    .iter()
                    .map(|&j| (0..d).map(|e| g[qa(i) + e] * v[ka(j) + e]).sum())
                    .collect();
                let rowdot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (n, &j) in keys.iter().enumerate() {
                    let ds = p[n] * (dp[n] - rowdot) * scale;
                    for e in 0..d {
                        out[qa(i) + e] += p[n] * v[ka(j) + e];
                        dv[ka(j) + e] += p[n] * g[qa(i) + e];
                        dq[qa(i) + e] += ds * k[ka(j) + e];
                        dk[ka(j) + e] += ds * q[qa(i) + e];
                    }
                }
            }
        }
    }
    [out, dq, dk, dv]
}

fn close(what: &str, got: &Tensor, want: &[f64], tol: f64) {
    let got = got.contiguous().unwrap().to_vec_f64().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i}: {a} vs {b}"
        );
    }
}

#[test]
fn windowed_flash_attention_matches_naive_attention() {
    let devices = test_devices().unwrap();
    // Streaming (head dim 8) and register-blocked (64) kernels; windows shorter than a tile,
    // across tiles and longer than the keys; fewer queries than keys (a cache's prefix).
    let cases = [
        ([1, 4, 2, 17, 17, 8], 4),
        ([2, 2, 1, 70, 70, 8], 33),
        ([1, 2, 2, 40, 40, 64], 5),
        ([1, 2, 1, 66, 66, 64], 40),
        ([1, 2, 2, 3, 37, 8], 2),
        ([1, 2, 1, 20, 20, 16], 100),
    ];
    for (n, (dims, w)) in cases.into_iter().enumerate() {
        let [b, h, hkv, tq, tk, d] = dims;
        for dtype in [DType::F32, DType::F64] {
            let seed = 40 + n as u64;
            let q = random_tensor(dtype, &[b, h, tq, d], -1.0, 1.0, seed);
            let k = random_tensor(dtype, &[b, hkv, tk, d], -1.0, 1.0, seed + 100);
            let v = random_tensor(dtype, &[b, hkv, tk, d], -1.0, 1.0, seed + 200);
            let g = random_tensor(dtype, &[b, h, tq, d], -1.0, 1.0, seed + 300);
            let f = |t: &Tensor| t.to_vec_f64().unwrap();
            let want = naive((&f(&q), &f(&k), &f(&v), &f(&g)), dims, w);
            let tol = if dtype == DType::F64 { 1e-10 } else { 2e-5 };
            for dev in &devices {
                let on = |t: &Tensor| t.to_device(dev).unwrap();
                let (q, k, v, g) = (on(&q), on(&k), on(&v), on(&g));
                let (out, lse) = Tensor::flash_attention_window(&q, &k, &v, Some(w), None, None)
                    .unwrap_or_else(|e| panic!("{dev}: {e}"));
                let what = |x: &str| format!("{dev} {dtype} {dims:?} window {w}: {x}");
                close(&what("out"), &out, &want[0], tol);
                let (dq, dk, dv) = Tensor::flash_attention_backward_window(
                    &q,
                    &k,
                    &v,
                    &out,
                    &lse,
                    &g,
                    (true, Some(w)),
                    None,
                    None,
                )
                .unwrap();
                close(&what("dq"), &dq, &want[1], tol);
                close(&what("dk"), &dk, &want[2], tol);
                close(&what("dv"), &dv, &want[3], tol);
            }
        }
    }
    // A window needs causal attention and at least one key.
    let t = random_tensor(DType::F32, &[1, 1, 4, 8], -1.0, 1.0, 1);
    assert!(Tensor::flash_attention_window(&t, &t, &t, Some(0), None, None).is_err());
    let e = Tensor::flash_attention_backward_window(
        &t,
        &t,
        &t,
        &t,
        &Tensor::zeros(&[1, 1, 4], DType::F32, t.device()).unwrap(),
        &t,
        (false, Some(2)),
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("sliding window 2"), "{e}");
}

#[test]
fn windowed_decode_attention_matches_naive_attention() {
    let devices = test_devices().unwrap();
    let host = netcl_ops::Device::host();
    let (b, h, hkv, s, hd) = (2, 4, 2, 24, 8);
    for (at, w) in [(0, 3), (10, 3), (23, 4), (23, 30)] {
        let q = random_tensor(DType::F32, &[b, 1, h, hd], -1.0, 1.0, 7);
        let kc = random_tensor(DType::F32, &[b, hkv, s, hd], -1.0, 1.0, 8);
        let vc = random_tensor(DType::F32, &[b, hkv, s, hd], -1.0, 1.0, 9);
        // The naive attention of the one query at position `at` over keys 0..=at.
        let f = |t: &Tensor| t.to_vec_f64().unwrap();
        let prefix = |t: &Tensor| t.narrow(2, 0, at + 1).unwrap().contiguous().unwrap();
        let qh = q.transpose(1, 2).unwrap().contiguous().unwrap();
        let zeros = vec![0.0; b * h * hd];
        let dims = [b, h, hkv, 1, at + 1, hd];
        let (kp, vp) = (prefix(&kc), prefix(&vc));
        let want = naive((&f(&qh), &f(&kp), &f(&vp), &zeros), dims, w);
        let pos = Tensor::from_vec(vec![at as i32], &[1], &host).unwrap();
        for dev in &devices {
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let q2 = on(&q).reshape(&[b, h * hd]).unwrap();
            let o = q2
                .decode_attention_window(&on(&kc), &on(&vc), &on(&pos), None, h, Some(w))
                .unwrap_or_else(|e| panic!("{dev}: {e}"));
            close(&format!("{dev} at {at} window {w}"), &o, &want[0], 2e-5);
        }
    }
}
