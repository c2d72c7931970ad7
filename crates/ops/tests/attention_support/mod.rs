//! The naive attention and the cases shared by the fused-attention tests (flash_attention.rs).
#![allow(dead_code)] // each test file uses its own part
use netcl_ops::testing::{check_close, random_tensor, tolerance};
use netcl_ops::{DType, Device, Tensor};

/// Naive attention in f64 over row-major q (B, H, Tq, D), k and v (B, Hkv, Tk, D) and the
/// output gradient g: (out, lse, dq, dk, dv), through the whole (Tq, Tk) probability matrix of
/// each head with -inf where the causal mask hides a key.
#[allow(clippy::type_complexity)]
pub fn naive(
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
pub fn operand(dtype: DType, shape: [usize; 4], seed: u64, transposed: bool) -> Tensor {
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
pub fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(1.0f64, |m, x| m.max(x.abs()))
}

/// One problem: (B, H, Hkv, Tq, Tk, D), causal or not, the default scale or 0.3, q, k and v as
/// transposed views or plain: the fused forward, lse and backward on every device against the
/// naive attention.
pub struct Case {
    pub dtype: DType,
    pub dims: [usize; 6],
    pub causal: bool,
    pub scale: Option<f64>,
    pub transposed: [bool; 3],
    pub seed: u64,
    /// The products' dtype for f32 operands (autocast), if not the operands'.
    pub compute: Option<DType>,
}

impl Case {
    pub fn check(&self, devices: &[Device]) {
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

/// Head dim 64 (the register-blocked kernels): lengths across several 32-row blocks of queries and
/// keys, grouped heads, causal with fewer and with more keys than queries, f32 and f64.
pub fn head_dim_64_cases(devices: &[Device]) {
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
            .check(devices);
        }
    }
}
