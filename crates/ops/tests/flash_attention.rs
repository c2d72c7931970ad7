//! Fused attention (forward, lse, backward; causal or not, grouped heads, strided inputs, every float dtype) against a naive f64 attention with the full probability matrix, and finite differences, on every device.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, tolerance, Cases};
use netcl_ops::{DType, Device, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Naive attention in f64 over row-major q (B, H, Tq, D), k and v (B, Hkv, Tk, D) and the
/// output gradient g: (out, lse, dq, dk, dv), through the whole (Tq, Tk) probability matrix of
/// each head with -inf where the causal mask hides a key.
#[allow(clippy::type_complexity)]
fn naive(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: &[f64],
    [b, h, hkv, tq, tk, d]: [usize; 6],
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; b * h * tq];
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for bi in 0..b {
        for hi in 0..h {
            let hk = hi / (h / hkv);
            let qa = |i: usize| ((bi * h + hi) * tq + i) * d;
            let ka = |j: usize| ((bi * hkv + hk) * tk + j) * d;
            // Scores with the mask, then softmax row by row.
            let mut p = vec![vec![f64::NEG_INFINITY; tk]; tq];
            for (i, row) in p.iter_mut().enumerate() {
                for (j, s) in row.iter_mut().enumerate() {
                    if !causal || j + tq <= i + tk {
                        *s = scale * (0..d).map(|e| q[qa(i) + e] * k[ka(j) + e]).sum::<f64>();
                    }
                }
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    lse[(bi * h + hi) * tq + i] = m;
                    row.iter_mut().for_each(|x| *x = 0.0);
                    continue;
                }
                let z: f64 = row.iter().map(|x| (x - m).exp()).sum();
                lse[(bi * h + hi) * tq + i] = m + z.ln();
                row.iter_mut().for_each(|x| *x = (*x - m).exp() / z);
            }
            for i in 0..tq {
                for j in 0..tk {
                    for e in 0..d {
                        out[qa(i) + e] += p[i][j] * v[ka(j) + e];
                        dv[ka(j) + e] += p[i][j] * g[qa(i) + e];
                    }
                }
                let dp: Vec<f64> = (0..tk)
                    .map(|j| (0..d).map(|e| g[qa(i) + e] * v[ka(j) + e]).sum())
                    .collect();
                let rowdot: f64 = (0..tk).map(|j| p[i][j] * dp[j]).sum();
                for j in 0..tk {
                    let ds = p[i][j] * (dp[j] - rowdot) * scale;
                    for e in 0..d {
                        dq[qa(i) + e] += ds * k[ka(j) + e];
                        dk[ka(j) + e] += ds * q[qa(i) + e];
                    }
                }
            }
        }
    }
    (out, lse, dq, dk, dv)
}

/// A (B, H, T, D) operand: plain, or the transposed view of a (B, T, H, D) tensor.
fn operand(dtype: DType, shape: [usize; 4], seed: u64, transposed: bool) -> Tensor {
    let [b, h, t, d] = shape;
    if transposed {
        random_tensor(dtype, &[b, t, h, d], -1.5, 1.5, seed)
            .transpose(1, 2)
            .unwrap()
    } else {
        random_tensor(dtype, &shape, -1.5, 1.5, seed)
    }
}

/// The largest magnitude in `v`, at least 1 (the inputs' scale): errors are measured against it.
fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(1.0f64, |m, x| m.max(x.abs()))
}

/// One problem: (B, H, Hkv, Tq, Tk, D), causal or not, the default scale or 0.3, q, k and v as
/// transposed views or plain: the fused forward, lse and backward on every device against the
/// naive attention.
struct Case {
    dtype: DType,
    dims: [usize; 6],
    causal: bool,
    scale: Option<f64>,
    transposed: [bool; 3],
    seed: u64,
    /// The products' dtype for f32 operands (autocast), if not the operands'.
    compute: Option<DType>,
}

impl Case {
    fn check(&self, devices: &[Device]) {
        let (dtype, dims, causal, scale) = (self.dtype, self.dims, self.causal, self.scale);
        let [b, h, hkv, tq, tk, d] = dims;
        let seed = self.seed;
        let q = operand(dtype, [b, h, tq, d], seed, self.transposed[0]);
        let k = operand(dtype, [b, hkv, tk, d], seed + 1, self.transposed[1]);
        let v = operand(dtype, [b, hkv, tk, d], seed + 2, self.transposed[2]);
        let g = operand(dtype, [b, h, tq, d], seed + 3, false);
        let vals = |t: &Tensor| t.to_vec_f64().unwrap();
        // The reference sees the operands as the products do (rounded to `compute`).
        let low = |t: &Tensor| vals(&t.to_dtype(self.compute.unwrap_or(dtype)).unwrap());
        let s = scale.unwrap_or(1.0 / (d as f64).sqrt());
        let want = naive(&low(&q), &low(&k), &low(&v), &low(&g), dims, causal, s);
        let tol = 4.0 * tolerance(self.compute.unwrap_or(dtype)).max(1e-12);
        for dev in devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let c = self.compute;
            let what = format!("seed {seed} {dtype} in {c:?} {dims:?} causal {causal} on {dev}");
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let (qd, kd, vd) = (on(&q), on(&k), on(&v));
            let (out, lse) = Tensor::flash_attention_in(&qd, &kd, &vd, causal, scale, c).unwrap();
            assert_eq!(out.shape(), q.shape(), "{what}");
            assert_eq!(out.dtype(), dtype, "{what}");
            check_close(
                &vals(&out),
                &want.0,
                tol,
                max_abs(&want.0),
                &format!("{what}: out"),
            )
            .unwrap();
            check_close(&vals(&lse), &want.1, tol, 1.0, &format!("{what}: lse")).unwrap();
            let g = on(&g);
            let grads = Tensor::flash_attention_backward_in(
                &qd, &kd, &vd, &out, &lse, &g, causal, scale, c,
            )
            .unwrap();
            // All three gradients are checked before failing: which of them is off tells the
            // kernel (dq alone, dk from the delta dq stores, dv).
            let errors: Vec<String> = [
                ("dq", grads.0, &want.2),
                ("dk", grads.1, &want.3),
                ("dv", grads.2, &want.4),
            ]
            .into_iter()
            .filter_map(|(name, got, want)| {
                let msg = format!("{what}: {name}");
                check_close(&vals(&got), want, 2.0 * tol, max_abs(want), &msg).err()
            })
            .collect();
            assert!(errors.is_empty(), "{}", errors.join("\n"));
        }
    }
}

#[test]
fn flash_attention_matches_naive_attention_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xF1A5);
    for case in 0..48 {
        let dtype = FLOATS[case % 4];
        let (b, hkv, rep) = (1 + c.below(2), 1 + c.below(2), 1 + c.below(3));
        let h = hkv * rep;
        // Up to 64 the register-blocked backward, above it the streaming kernels.
        let d = [4, 8, 12, 16, 32, 64, 96, 128][c.below(8)];
        // Lengths across the 64-query and 32-key tiles; causal with fewer keys than queries too.
        let tq = [1, 3, 17, 64, 65, 70][c.below(6)];
        let tk = [1, 5, 32, 33, 64, 70][c.below(6)].max(if c.below(4) == 0 { 1 } else { tq });
        let causal = c.below(3) != 0;
        let scale = if c.below(2) == 0 { None } else { Some(0.3) };
        let transposed = [c.below(2) == 0, c.below(2) == 0, c.below(2) == 0];
        let seed = 1000 * case as u64;
        let dims = [b, h, hkv, tq, tk, d];
        Case {
            dtype,
            dims,
            causal,
            scale,
            transposed,
            seed,
            compute: None,
        }
        .check(&devices);
    }
}

/// Head dim 64, the Llama shapes' (the register-blocked forward and backward on devices whose local
/// memory holds their tiles): lengths across several 32-row blocks of queries and keys, grouped
/// heads, causal with fewer and with more keys than queries, f32 and f64.
#[test]
fn head_dim_64_blocks_match_naive_attention() {
    let devices = test_devices().unwrap();
    for (n, (tq, tk)) in [(130, 130), (64, 97), (97, 40), (1, 70)]
        .into_iter()
        .enumerate()
    {
        for causal in [true, false] {
            let dtype = [DType::F32, DType::F64][n % 2];
            Case {
                dtype,
                dims: [2, 4, 2, tq, tk, 64],
                causal,
                scale: None,
                transposed: [n == 1, false, causal],
                seed: 500 + 10 * n as u64 + causal as u64,
                compute: None,
            }
            .check(&devices);
        }
    }
}

/// The shapes the tensor-core kernels take on GPUs that have them (16-bit, head dims 16 to 64 in
/// steps of 16), with lengths across their 64-row blocks, grouped heads, causal with fewer keys
/// than queries (queries that see no key) and more; in 16-bit storage and as f32 operands
/// computing in 16 bits (autocast); other devices run their own kernels.
#[test]
fn tensor_core_attention_shapes_match_naive_attention() {
    let devices = test_devices().unwrap();
    let lengths = [(64, 64), (65, 130), (130, 65), (1, 70), (128, 128), (70, 1)];
    for (n, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
        for (m, d) in [16, 48, 64].into_iter().enumerate() {
            let (tq, tk) = lengths[(3 * n + m) % lengths.len()];
            for causal in [true, false] {
                let seed = (100 * n + 10 * m + causal as usize) as u64;
                let dims = [1, 4, 2, tq, tk, d];
                let transposed = [true, causal, false];
                let scale = (!causal).then_some(0.3);
                // 16-bit operands, then f32 ones computing in 16 bits.
                for (dtype, compute) in [(dtype, None), (DType::F32, Some(dtype))] {
                    let case = Case {
                        dtype,
                        dims,
                        causal,
                        scale,
                        transposed,
                        seed,
                        compute,
                    };
                    case.check(&devices);
                }
            }
        }
    }
}

/// sum(out * g) of the fused forward, in f64 on `dev`.
fn loss(q: &Tensor, k: &Tensor, v: &Tensor, g: &[f64], causal: bool) -> f64 {
    let (out, _) = Tensor::flash_attention(q, k, v, causal, None).unwrap();
    let o = out.to_vec_f64().unwrap();
    o.iter().zip(g).map(|(a, b)| a * b).sum()
}

#[test]
fn flash_attention_backward_matches_finite_differences() {
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        let (b, h, hkv, tq, tk, d) = (1, 4, 2, 5, 7, 8);
        let mk = |shape: &[usize], seed| {
            random_tensor(DType::F64, shape, -1.0, 1.0, seed)
                .to_device(&dev)
                .unwrap()
        };
        let (q, k, v) = (
            mk(&[b, h, tq, d], 1),
            mk(&[b, hkv, tk, d], 2),
            mk(&[b, hkv, tk, d], 3),
        );
        let g = mk(&[b, h, tq, d], 4);
        let gv = g.to_vec_f64().unwrap();
        let (out, lse) = Tensor::flash_attention(&q, &k, &v, true, None).unwrap();
        let grads =
            Tensor::flash_attention_backward(&q, &k, &v, &out, &lse, &g, true, None).unwrap();
        for (which, t, grad) in [(0, &q, &grads.0), (1, &k, &grads.1), (2, &v, &grads.2)] {
            let base = t.to_vec_f64().unwrap();
            let analytic = grad.to_vec_f64().unwrap();
            for idx in [0, base.len() / 3, base.len() - 1] {
                let bumped = |delta: f64| {
                    let mut x = base.clone();
                    x[idx] += delta;
                    let t2 = Tensor::from_vec(x, t.shape(), &dev).unwrap();
                    let (q2, k2, v2) = match which {
                        0 => (&t2, &k, &v),
                        1 => (&q, &t2, &v),
                        _ => (&q, &k, &t2),
                    };
                    loss(q2, k2, v2, &gv, true)
                };
                let numeric = (bumped(1e-6) - bumped(-1e-6)) / 2e-6;
                assert!(
                    (numeric - analytic[idx]).abs() <= 1e-6 * (1.0 + numeric.abs()),
                    "{dev}: input {which} element {idx}: analytic {} vs numeric {numeric}",
                    analytic[idx]
                );
            }
        }
    }
}

#[test]
fn bad_operands_are_errors_naming_the_shapes() {
    let dev = Device::host();
    let t = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
    let q = t(&[1, 4, 3, 8]);
    let err = |r: Result<(Tensor, Tensor), netcl_ops::Error>| r.err().unwrap().to_string();
    let e = err(Tensor::flash_attention(
        &q,
        &t(&[1, 3, 3, 8]),
        &t(&[1, 3, 3, 8]),
        true,
        None,
    ));
    assert!(
        e.contains("4 query heads") && e.contains("3 key/value heads"),
        "{e}"
    );
    let e = err(Tensor::flash_attention(
        &t(&[1, 1, 3, 6]),
        &t(&[1, 1, 3, 6]),
        &t(&[1, 1, 3, 6]),
        false,
        None,
    ));
    assert!(e.contains("head dim 6"), "{e}");
    let e = err(Tensor::flash_attention(
        &t(&[4, 3, 8]),
        &t(&[4, 3, 8]),
        &t(&[4, 3, 8]),
        false,
        None,
    ));
    assert!(e.contains("[4, 3, 8]"), "{e}");
    let bf = Some(DType::BF16);
    let e = Tensor::flash_attention_in(&q, &q, &q, false, None, Some(DType::F64))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("f32 operands cannot compute in f64"), "{e}");
    let h = q.to_dtype(DType::F16).unwrap();
    let e = Tensor::flash_attention_in(&h, &h, &h, false, None, bf)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("f16 operands cannot compute in bf16"), "{e}");
    let f64q = Tensor::zeros(&[1, 4, 3, 8], DType::F64, &dev).unwrap();
    assert!(
        Tensor::flash_attention(&f64q, &t(&[1, 2, 3, 8]), &t(&[1, 2, 3, 8]), true, None).is_err()
    );
    assert!(!Tensor::flash_attention_supports(
        &q,
        &t(&[1, 3, 3, 8]),
        &t(&[1, 3, 3, 8])
    ));
    assert!(Tensor::flash_attention_supports(
        &q,
        &t(&[1, 2, 5, 8]),
        &t(&[1, 2, 5, 8])
    ));
}
