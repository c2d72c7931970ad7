//! layer_norm and rms_norm (forward, backward, finite differences) on every device against the host; errors and determinism of every norm (batch_norm too).
mod norm_support;
use netcl_core_devices::test_devices;
use netcl_kernels::thread_launches;
use netcl_ops::testing::{
    check_close, expect_row_kernel, host_tensor, random_tensor, random_view, tolerance, Cases,
    MAX_REGISTER_ROW, ROW_LENGTHS,
};
use netcl_ops::{acc_dtype, DType, Device, Tensor};
use norm_support::{close, fd, float_dtypes};

/// Independent f64 layer/rms norm of a contiguous [rows, n] slice.
fn norm_reference(
    x: &[f64],
    n: usize,
    rms: bool,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> Vec<f64> {
    if n == 0 {
        return vec![];
    }
    x.chunks(n)
        .flat_map(|row| {
            let mu = if rms {
                0.0
            } else {
                row.iter().sum::<f64>() / n as f64
            };
            let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n as f64;
            row.iter()
                .enumerate()
                .map(|(j, v)| {
                    (v - mu) / (var + eps).sqrt() * w.map_or(1.0, |w| w[j])
                        + b.map_or(0.0, |b| b[j])
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn random_layer_and_rms_norms_match_the_host() {
    let devices = test_devices().unwrap();
    let dtypes = float_dtypes(devices.last().unwrap());
    let mut c = Cases::new(0x40F);
    for case in 0..360u64 {
        let mut shape = c.shape(4, 9);
        if case % 40 == 0 {
            shape = vec![1 + c.below(3), [255, 257, 4097][c.below(3)]];
        }
        let dtype = dtypes[c.below(dtypes.len())];
        let rms = c.below(2) == 0;
        let seed = c.next_u64();
        let host = random_tensor(dtype, &shape, -3.0, 3.0, case);
        let hv = random_view(&host, &mut Cases(seed));
        let k = 1 + c.below(hv.ndim());
        let ns = hv.shape()[hv.ndim() - k..].to_vec();
        let w = (c.below(3) != 0).then(|| random_tensor(dtype, &ns, 0.5, 1.5, case + 1));
        let b = (!rms && c.below(2) == 0).then(|| random_tensor(dtype, &ns, -1.0, 1.0, case + 2));
        let dy = random_tensor(dtype, hv.shape(), -1.0, 1.0, case + 3);
        let eps = 1e-5;
        let what = format!(
            "{} {dtype} {:?}/{:?} normalized {ns:?} w {} b {}",
            if rms { "rms_norm" } else { "layer_norm" },
            hv.shape(),
            hv.strides(),
            w.is_some(),
            b.is_some()
        );
        let run = |x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, dy: &Tensor| {
            if rms {
                let (y, rstd) = x.rms_norm(&ns, w, eps).unwrap();
                let g = x.rms_norm_backward(dy, &rstd, &ns, w).unwrap();
                (y, None, rstd, g)
            } else {
                let (y, mean, rstd) = x.layer_norm(&ns, w, b, eps).unwrap();
                let g = x
                    .layer_norm_backward(dy, &mean, &rstd, &ns, w, b.is_some())
                    .unwrap();
                (y, Some(mean), rstd, g)
            }
        };
        let (y, mean, rstd, g) = run(&hv, w.as_ref(), b.as_ref(), &dy);
        let tol = tolerance(dtype);
        let n: usize = ns.iter().product();
        let wv = w.as_ref().map(|w| w.to_vec_f64().unwrap());
        let bv = b.as_ref().map(|b| b.to_vec_f64().unwrap());
        let r = norm_reference(
            &hv.to_vec_f64().unwrap(),
            n,
            rms,
            wv.as_deref(),
            bv.as_deref(),
            eps,
        );
        check_close(
            &y.to_vec_f64().unwrap(),
            &r,
            tol * 4.0,
            4.0,
            &format!("host vs reference: {what}"),
        )
        .unwrap();
        for dev in &devices {
            let x = random_view(&host.to_device(dev).unwrap(), &mut Cases(seed));
            let wd = w.as_ref().map(|w| w.to_device(dev).unwrap());
            let bd = b.as_ref().map(|b| b.to_device(dev).unwrap());
            let (gy, gmean, grstd, gg) =
                run(&x, wd.as_ref(), bd.as_ref(), &dy.to_device(dev).unwrap());
            let what = format!("{what} on {dev}");
            let atol = tolerance(acc_dtype(dtype)) * 8.0;
            close(&gy, &y, tol * 4.0, 4.0, &what);
            close(&grstd, &rstd, atol, 1.0, &what);
            if let (Some(a), Some(b)) = (&gmean, &mean) {
                close(a, b, atol, 1.0, &what);
            }
            let gtol = tol * 8.0;
            close(&gg.dx, &g.dx, gtol, 4.0, &format!("dx {what}"));
            let rows = (hv.numel() / n.max(1)) as f64;
            if let (Some(a), Some(b)) = (&gg.dweight, &g.dweight) {
                close(a, b, gtol, 2.0 * rows.sqrt(), &format!("dweight {what}"));
            }
            assert_eq!(gg.dweight.is_some(), w.is_some());
            assert_eq!(gg.dbias.is_some(), b.is_some());
            if let (Some(a), Some(b)) = (&gg.dbias, &g.dbias) {
                close(a, b, gtol, rows.sqrt(), &format!("dbias {what}"));
            }
        }
    }
}

#[test]
fn norm_rows_at_register_boundaries() {
    let devices = test_devices().unwrap();
    let mut checks = 0;
    for &n in &ROW_LENGTHS {
        for dtype in float_dtypes(devices.last().unwrap()) {
            // Base [5, n + 1]; row 2 is shifted by +20 (mean far from 0).
            let mut c = Cases::new(n as u64 + 7);
            let v: Vec<f64> = (0..5 * (n + 1))
                .map(|i| c.uniform(-3.0, 3.0) + if i / (n + 1) == 2 { 20.0 } else { 0.0 })
                .collect();
            let base = host_tensor(dtype, &v, &[5, n + 1]);
            // View 0: a contiguous copy (row starts multiples of n); view 1: columns 1..=n in place.
            let view = |b: &Tensor, k: usize| match k {
                0 => b.narrow(1, 0, n).unwrap().contiguous().unwrap(),
                _ => b.narrow(1, 1, n).unwrap(),
            };
            let w = random_tensor(dtype, &[n], 0.5, 1.5, n as u64 + 1);
            let b = random_tensor(dtype, &[n], -1.0, 1.0, n as u64 + 2);
            let (wv, bv) = (w.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
            for k in 0..2 {
                let xs = view(&base, k).to_vec_f64().unwrap();
                for rms in [false, true] {
                    let bias = (!rms).then_some(&bv[..]);
                    let r = norm_reference(&xs, n, rms, Some(&wv), bias, 1e-5);
                    let what = format!("rms={rms} {dtype} [5, {n}] view {k}");
                    let tol = tolerance(dtype) * 4.0;
                    for dev in &devices {
                        let x = view(&base.to_device(dev).unwrap(), k);
                        let (wd, bd) = (w.to_device(dev).unwrap(), b.to_device(dev).unwrap());
                        let before = thread_launches("norm_rows");
                        let (y, rstd) = if rms {
                            x.rms_norm(&[n], Some(&wd), 1e-5).unwrap()
                        } else {
                            let (y, _, rstd) =
                                x.layer_norm(&[n], Some(&wd), Some(&bd), 1e-5).unwrap();
                            (y, rstd)
                        };
                        let rows_kernel = thread_launches("norm_rows") - before;
                        let expect = u64::from(!dev.is_host() && n <= MAX_REGISTER_ROW);
                        let what = format!("{what} on {dev}");
                        assert_eq!(rows_kernel, expect, "{what}: row kernel launches");
                        check_close(&y.to_vec_f64().unwrap(), &r, tol, 4.0, &what).unwrap();
                        // rstd from the f64 reference's variance.
                        let want_rstd: Vec<f64> = xs
                            .chunks(n)
                            .map(|row| {
                                let mu = if rms {
                                    0.0
                                } else {
                                    row.iter().sum::<f64>() / n as f64
                                };
                                let var =
                                    row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n as f64;
                                1.0 / (var + 1e-5).sqrt()
                            })
                            .collect();
                        let atol = tolerance(acc_dtype(dtype)) * 8.0;
                        check_close(&rstd.to_vec_f64().unwrap(), &want_rstd, atol, 0.0, &what)
                            .unwrap();
                        checks += 1;
                    }
                }
            }
        }
    }
    println!("{checks} norm checks");
}

/// Independent f64 gradients (dx, dweight, dbias) of layer/rms norm of contiguous [rows, n] `x`
/// with upstream `dy`, from the reference's own statistics.
fn norm_grads_reference(
    x: &[f64],
    dy: &[f64],
    n: usize,
    rms: bool,
    w: &[f64],
    eps: f64,
) -> [Vec<f64>; 3] {
    let (mut dx, mut dw, mut db) = (vec![], vec![0.0; n], vec![0.0; n]);
    for (row, g) in x.chunks(n).zip(dy.chunks(n)) {
        let mu = if rms {
            0.0
        } else {
            row.iter().sum::<f64>() / n as f64
        };
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n as f64;
        let rs = 1.0 / (var + eps).sqrt();
        let xh: Vec<f64> = row.iter().map(|v| (v - mu) * rs).collect();
        let gw: Vec<f64> = g.iter().zip(w).map(|(g, w)| g * w).collect();
        let mg = if rms {
            0.0
        } else {
            gw.iter().sum::<f64>() / n as f64
        };
        let mgx = gw.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / n as f64;
        for j in 0..n {
            dx.push(rs * (gw[j] - mg - xh[j] * mgx));
            dw[j] += g[j] * xh[j];
            db[j] += g[j];
        }
    }
    [dx, dw, db]
}

#[test]
fn norm_backward_rows_at_register_boundaries() {
    let devices = test_devices().unwrap();
    let mut checks = 0;
    for &n in &ROW_LENGTHS {
        for dtype in float_dtypes(devices.last().unwrap()) {
            // Bases [5, n + 1] of x (row 2 shifted by +20) and dy.
            let mut c = Cases::new(n as u64 + 11);
            let v: Vec<f64> = (0..5 * (n + 1))
                .map(|i| c.uniform(-3.0, 3.0) + if i / (n + 1) == 2 { 20.0 } else { 0.0 })
                .collect();
            let base = host_tensor(dtype, &v, &[5, n + 1]);
            let gbase = random_tensor(dtype, &[5, n + 1], -1.0, 1.0, n as u64 + 12);
            // View 0: a contiguous copy (row starts multiples of n); view 1: columns 1..=n in place.
            let view = |b: &Tensor, k: usize| match k {
                0 => b.narrow(1, 0, n).unwrap().contiguous().unwrap(),
                _ => b.narrow(1, 1, n).unwrap(),
            };
            let w = random_tensor(dtype, &[n], 0.5, 1.5, n as u64 + 13);
            let wv = w.to_vec_f64().unwrap();
            // (x view, dy view): both aligned, both unaligned, x aligned and dy not.
            for (xk, gk) in [(0, 0), (1, 1), (0, 1)] {
                let xs = view(&base, xk).to_vec_f64().unwrap();
                let gs = view(&gbase, gk).to_vec_f64().unwrap();
                for rms in [false, true] {
                    let [dx, dw, db] = norm_grads_reference(&xs, &gs, n, rms, &wv, 1e-5);
                    let what = format!("backward rms={rms} {dtype} [5, {n}] views {xk}/{gk}");
                    let tol = tolerance(dtype) * 8.0;
                    for dev in &devices {
                        let x = view(&base.to_device(dev).unwrap(), xk);
                        let dy = view(&gbase.to_device(dev).unwrap(), gk);
                        let wd = w.to_device(dev).unwrap();
                        let (mean, rstd) = if rms {
                            (None, x.rms_norm(&[n], Some(&wd), 1e-5).unwrap().1)
                        } else {
                            let (_, m, r) = x.layer_norm(&[n], Some(&wd), None, 1e-5).unwrap();
                            (Some(m), r)
                        };
                        let g = expect_row_kernel("norm_bwd_rows", dev, n, &what, || match &mean {
                            None => x.rms_norm_backward(&dy, &rstd, &[n], Some(&wd)),
                            Some(m) => x.layer_norm_backward(&dy, m, &rstd, &[n], Some(&wd), true),
                        });
                        let g = g.unwrap();
                        let what = format!("{what} on {dev}");
                        let got = g.dx.to_vec_f64().unwrap();
                        check_close(&got, &dx, tol, 4.0, &format!("dx {what}")).unwrap();
                        let gw = g.dweight.unwrap().to_vec_f64().unwrap();
                        check_close(&gw, &dw, tol, 8.0, &format!("dweight {what}")).unwrap();
                        assert_eq!(g.dbias.is_some(), !rms, "{what}");
                        if let Some(gb) = g.dbias {
                            let gb = gb.to_vec_f64().unwrap();
                            check_close(&gb, &db, tol, 4.0, &format!("dbias {what}")).unwrap();
                        }
                        checks += 1;
                    }
                }
            }
        }
    }
    println!("{checks} norm backward checks");
}

#[test]
fn norm_backward_over_many_rows_matches_the_reference() {
    // Parameter gradients summed over many chunks of rows (a row count no chunk divides), rows
    // of 4-wide and 1-wide units.
    let devices = test_devices().unwrap();
    for (rows, n) in [(1029, 96), (517, 257)] {
        for dtype in [DType::F32, DType::F64] {
            let x = random_tensor(dtype, &[rows, n], -3.0, 3.0, n as u64);
            let gy = random_tensor(dtype, &[rows, n], -1.0, 1.0, n as u64 + 1);
            let w = random_tensor(dtype, &[n], 0.5, 1.5, n as u64 + 2);
            let (xs, gs, wv) = (
                x.to_vec_f64().unwrap(),
                gy.to_vec_f64().unwrap(),
                w.to_vec_f64().unwrap(),
            );
            for rms in [false, true] {
                let [dx, dw, db] = norm_grads_reference(&xs, &gs, n, rms, &wv, 1e-5);
                for dev in devices
                    .iter()
                    .filter(|d| dtype != DType::F64 || d.info().fp64)
                {
                    let what = format!("rms={rms} {dtype} [{rows}, {n}] on {dev}");
                    let [x, dy, wd] = [&x, &gy, &w].map(|t| t.to_device(dev).unwrap());
                    let g = if rms {
                        let (_, r) = x.rms_norm(&[n], Some(&wd), 1e-5).unwrap();
                        x.rms_norm_backward(&dy, &r, &[n], Some(&wd)).unwrap()
                    } else {
                        let (_, m, r) = x.layer_norm(&[n], Some(&wd), None, 1e-5).unwrap();
                        x.layer_norm_backward(&dy, &m, &r, &[n], Some(&wd), true)
                            .unwrap()
                    };
                    let tol = tolerance(dtype) * 8.0;
                    let got = g.dx.to_vec_f64().unwrap();
                    check_close(&got, &dx, tol, 4.0, &format!("dx {what}")).unwrap();
                    let gw = g.dweight.unwrap().to_vec_f64().unwrap();
                    check_close(&gw, &dw, tol, 8.0, &format!("dweight {what}")).unwrap();
                    if let Some(gb) = g.dbias {
                        let gb = gb.to_vec_f64().unwrap();
                        check_close(&gb, &db, tol, 8.0, &format!("dbias {what}")).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn norm_gradients_match_finite_differences() {
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        let (shape, ns) = ([2usize, 3, 4], [3usize, 4]);
        let t = |v: &[f64], s: &[usize]| Tensor::from_vec(v.to_vec(), s, &dev).unwrap();
        let x0 = random_tensor(DType::F64, &shape, -2.0, 2.0, 1)
            .to_vec_f64()
            .unwrap();
        let w0 = random_tensor(DType::F64, &ns, 0.5, 1.5, 2)
            .to_vec_f64()
            .unwrap();
        let b0 = random_tensor(DType::F64, &ns, -1.0, 1.0, 3)
            .to_vec_f64()
            .unwrap();
        let r = random_tensor(DType::F64, &shape, -1.0, 1.0, 4)
            .to_vec_f64()
            .unwrap();
        for rms in [false, true] {
            // loss = sum(y * r), so dy = r.
            let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
                let y = if rms {
                    t(x, &shape)
                        .rms_norm(&ns, Some(&t(w, &ns)), 1e-5)
                        .unwrap()
                        .0
                } else {
                    t(x, &shape)
                        .layer_norm(&ns, Some(&t(w, &ns)), Some(&t(b, &ns)), 1e-5)
                        .unwrap()
                        .0
                };
                y.to_vec_f64()
                    .unwrap()
                    .iter()
                    .zip(&r)
                    .map(|(a, b)| a * b)
                    .sum()
            };
            let (xt, wt, bt, dy) = (t(&x0, &shape), t(&w0, &ns), t(&b0, &ns), t(&r, &shape));
            let g = if rms {
                let (_, rstd) = xt.rms_norm(&ns, Some(&wt), 1e-5).unwrap();
                xt.rms_norm_backward(&dy, &rstd, &ns, Some(&wt)).unwrap()
            } else {
                let (_, mean, rstd) = xt.layer_norm(&ns, Some(&wt), Some(&bt), 1e-5).unwrap();
                xt.layer_norm_backward(&dy, &mean, &rstd, &ns, Some(&wt), true)
                    .unwrap()
            };
            let what = format!("rms {rms} on {dev}");
            let dx = fd(&x0, &|x| loss(x, &w0, &b0));
            check_close(
                &g.dx.to_vec_f64().unwrap(),
                &dx,
                1e-6,
                1e-3,
                &format!("dx {what}"),
            )
            .unwrap();
            let dw = fd(&w0, &|w| loss(&x0, w, &b0));
            check_close(
                &g.dweight.unwrap().to_vec_f64().unwrap(),
                &dw,
                1e-6,
                1e-3,
                &format!("dw {what}"),
            )
            .unwrap();
            if !rms {
                let db = fd(&b0, &|b| loss(&x0, &w0, b));
                check_close(
                    &g.dbias.unwrap().to_vec_f64().unwrap(),
                    &db,
                    1e-6,
                    1e-3,
                    &format!("db {what}"),
                )
                .unwrap();
            }
        }
    }
}

#[test]
fn norm_errors_name_the_op_and_shapes() {
    for dev in test_devices().unwrap() {
        let x = Tensor::zeros(&[2, 3, 4], DType::F32, &dev).unwrap();
        let w = Tensor::ones(&[5], DType::F32, &dev).unwrap();
        let e = x
            .layer_norm(&[3], None, None, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer_norm") && e.contains("[3]") && e.contains("[2, 3, 4]"),
            "{e}"
        );
        let e = x
            .layer_norm(&[4], Some(&w), None, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer_norm") && e.contains("[5]") && e.contains("[4]"),
            "{e}"
        );
        let w16 = Tensor::ones(&[4], DType::F16, &dev).unwrap();
        let e = x.rms_norm(&[4], Some(&w16), 1e-5).unwrap_err().to_string();
        assert!(e.contains("rms_norm") && e.contains("f16"), "{e}");
        let (_, mean, rstd) = x.layer_norm(&[4], None, None, 1e-5).unwrap();
        let dy = Tensor::zeros(&[2, 3, 5], DType::F32, &dev).unwrap();
        let e = x
            .layer_norm_backward(&dy, &mean, &rstd, &[4], None, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer_norm_backward") && e.contains("[2, 3, 5]"),
            "{e}"
        );
        let dy = Tensor::zeros(&[2, 3, 4], DType::F32, &dev).unwrap();
        let e = x
            .layer_norm_backward(&dy, &rstd, &mean.reshape(&[6]).unwrap(), &[4], None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rstd") && e.contains("[6]"), "{e}");
        let e = x
            .batch_norm_train(Some(&w), None, None, None, 0.1, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_norm") && e.contains("[5]"), "{e}");
        let one = Tensor::zeros(&[1, 3], DType::F32, &dev).unwrap();
        let e = one
            .batch_norm_train(None, None, None, None, 0.1, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_norm") && e.contains("[1, 3]"), "{e}");
        let r = Tensor::zeros(&[3], DType::F32, &dev).unwrap();
        assert!(x
            .batch_norm_train(None, None, Some(&r), None, 0.1, 1e-5)
            .is_err());
        let i = Tensor::zeros(&[2, 3], DType::I32, &dev).unwrap();
        assert!(i.layer_norm(&[3], None, None, 1e-5).is_err());
        let other = if dev.is_host() {
            test_devices().unwrap().pop().unwrap()
        } else {
            Device::host()
        };
        if other != dev {
            let w4 = Tensor::ones(&[4], DType::F32, &other).unwrap();
            let e = x
                .layer_norm(&[4], Some(&w4), None, 1e-5)
                .unwrap_err()
                .to_string();
            assert!(e.contains("layer_norm") && e.contains("weight"), "{e}");
        }
    }
}

#[test]
fn norms_are_deterministic() {
    for dev in test_devices().unwrap() {
        let x = random_tensor(DType::F32, &[5, 4097], -3.0, 3.0, 9)
            .to_device(&dev)
            .unwrap();
        let dy = random_tensor(DType::F32, &[5, 4097], -1.0, 1.0, 10)
            .to_device(&dev)
            .unwrap();
        let w = random_tensor(DType::F32, &[4097], 0.5, 1.5, 11)
            .to_device(&dev)
            .unwrap();
        let run = || {
            let (y, mean, rstd) = x.layer_norm(&[4097], Some(&w), None, 1e-5).unwrap();
            let g = x
                .layer_norm_backward(&dy, &mean, &rstd, &[4097], Some(&w), true)
                .unwrap();
            let bn = x
                .reshape(&[5, 4097, 1])
                .unwrap()
                .transpose(0, 1)
                .unwrap()
                .batch_norm_train(None, None, None, None, 0.1, 1e-5)
                .unwrap();
            [
                y,
                g.dx,
                g.dweight.unwrap(),
                g.dbias.unwrap(),
                bn.y,
                bn.save_invstd,
            ]
            .map(|t| t.to_host_data().unwrap())
        };
        let (a, b) = (run(), run());
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.as_bytes(), b.as_bytes(), "{dev}");
        }
    }
}

/// `norm_backward_plus`: dx with the input's gradient from elsewhere added (the residual stream's
/// sum folded into the norm's kernel), for contiguous rows (the rows kernel) and transposed ones
/// (the general kernel, then a sum), with the addend a strided view or a contiguous one at an
/// offset.
#[test]
fn norm_backward_plus_adds_the_other_gradient() {
    let devices = test_devices().unwrap();
    let (rows, n) = (7, 33);
    for dtype in [DType::F32, DType::F64] {
        let base = random_tensor(dtype, &[rows, n], -3.0, 3.0, 71);
        let gy = random_tensor(dtype, &[rows, n], -1.0, 1.0, 72);
        let pbase = random_tensor(dtype, &[rows + 1, n + 1], -1.0, 1.0, 73);
        let w = random_tensor(dtype, &[n], 0.5, 1.5, 74);
        // The addend: columns 1..=n of the first rows (strided), or rows 1..=rows of the first
        // n columns made contiguous (a contiguous view at an offset of n elements).
        let addend = |t: &Tensor, strided: bool| match strided {
            true => t.narrow(0, 0, rows).unwrap().narrow(1, 1, n).unwrap(),
            false => {
                let dense = t.narrow(1, 0, n).unwrap().contiguous().unwrap();
                dense.narrow(0, 1, rows).unwrap()
            }
        };
        let (gs, wv) = (gy.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        for (transposed, strided) in [(false, true), (false, false), (true, true)] {
            // The same values as a contiguous [rows, n] or as the transpose of an [n, rows] tensor.
            let xt = base.transpose(0, 1).unwrap().contiguous().unwrap();
            let xs = base.to_vec_f64().unwrap();
            let ps = addend(&pbase, strided).to_vec_f64().unwrap();
            for rms in [false, true] {
                let [dx, _, _] = norm_grads_reference(&xs, &gs, n, rms, &wv, 1e-5);
                let want: Vec<f64> = dx.iter().zip(&ps).map(|(a, b)| a + b).collect();
                for dev in devices
                    .iter()
                    .filter(|d| dtype != DType::F64 || d.info().fp64)
                {
                    let what = format!(
                        "rms={rms} transposed={transposed} strided={strided} {dtype} on {dev}"
                    );
                    let x = match transposed {
                        true => xt.to_device(dev).unwrap().transpose(0, 1).unwrap(),
                        false => base.to_device(dev).unwrap(),
                    };
                    let [dy, wd] = [&gy, &w].map(|t| t.to_device(dev).unwrap());
                    let plus = addend(&pbase.to_device(dev).unwrap(), strided);
                    let (mean, rstd) = if rms {
                        (None, x.rms_norm(&[n], Some(&wd), 1e-5).unwrap().1)
                    } else {
                        let (_, m, r) = x.layer_norm(&[n], Some(&wd), None, 1e-5).unwrap();
                        (Some(m), r)
                    };
                    let (m, wr) = (mean.as_ref(), Some(&wd));
                    let g = x
                        .norm_backward_plus(&dy, m, &rstd, &[n], wr, !rms, Some(&plus))
                        .unwrap();
                    let got = g.dx.to_vec_f64().unwrap();
                    check_close(&got, &want, tolerance(dtype) * 8.0, 4.0, &what).unwrap();
                    // A wrong-shaped addend is an error naming it.
                    let bad = dy.narrow(0, 0, 2).unwrap();
                    let e = x
                        .norm_backward_plus(&dy, m, &rstd, &[n], None, false, Some(&bad))
                        .unwrap_err()
                        .to_string();
                    assert!(e.contains("plus"), "{e}");
                }
            }
        }
    }
}

/// An f32 norm writing bf16 or f16 (`*_norm_to`, autocast's norms before products) gives what a
/// cast after it gives (on the host within one rounding: f64 rounds to 16 bits directly there),
/// and its backward takes the 16-bit dy as the f32 backward takes dy widened; contiguous rows of
/// both row widths and a transposed input (the general kernels).
#[test]
fn sixteen_bit_outputs_of_f32_norms_match_a_cast_after_them() {
    let devices = test_devices().unwrap();
    for (n, seed) in [(33, 81), (64, 82)] {
        let rows = 6;
        let base = random_tensor(DType::F32, &[rows, n], -3.0, 3.0, seed);
        let xt = base.transpose(0, 1).unwrap().contiguous().unwrap();
        let w = random_tensor(DType::F32, &[n], 0.5, 1.5, seed + 10);
        for out in [DType::BF16, DType::F16] {
            let dy16 = random_tensor(out, &[rows, n], -1.0, 1.0, seed + 20);
            for dev in &devices {
                for transposed in [false, true] {
                    let what = format!("n={n} {out} transposed={transposed} on {dev}");
                    let x = match transposed {
                        true => xt.to_device(dev).unwrap().transpose(0, 1).unwrap(),
                        false => base.to_device(dev).unwrap(),
                    };
                    let (wd, dy) = (w.to_device(dev).unwrap(), dy16.to_device(dev).unwrap());
                    let dy32 = dy.to_dtype(DType::F32).unwrap();
                    for rms in [false, true] {
                        let (y, mean, rstd) = if rms {
                            let (y, r) = x.rms_norm_to(&[n], Some(&wd), 1e-5, out).unwrap();
                            (y, None, r)
                        } else {
                            let (y, m, r) =
                                x.layer_norm_to(&[n], Some(&wd), None, 1e-5, out).unwrap();
                            (y, Some(m), r)
                        };
                        let cast = match rms {
                            true => x.rms_norm(&[n], Some(&wd), 1e-5).unwrap().0,
                            false => x.layer_norm(&[n], Some(&wd), None, 1e-5).unwrap().0,
                        };
                        assert_eq!(y.dtype(), out, "{what}");
                        let (got, want) = (y.to_vec_f64().unwrap(), cast.to_dtype(out).unwrap());
                        let want = want.to_vec_f64().unwrap();
                        match dev.is_host() {
                            true => check_close(&got, &want, tolerance(out), 1.0, &what).unwrap(),
                            false => assert_eq!(got, want, "forward rms={rms} {what}"),
                        }
                        let m = mean.as_ref();
                        let grads = |g: &Tensor| {
                            x.norm_backward_plus(g, m, &rstd, &[n], Some(&wd), !rms, None)
                                .unwrap()
                        };
                        let (a, b) = (grads(&dy), grads(&dy32));
                        assert_eq!(a.dx.dtype(), DType::F32, "{what}");
                        for (ga, gb) in [(&a.dx, &b.dx)]
                            .into_iter()
                            .chain(a.dweight.as_ref().zip(b.dweight.as_ref()))
                            .chain(a.dbias.as_ref().zip(b.dbias.as_ref()))
                        {
                            assert_eq!(
                                ga.to_vec_f64().unwrap(),
                                gb.to_vec_f64().unwrap(),
                                "backward rms={rms} {what}"
                            );
                        }
                    }
                }
            }
        }
    }
    // Other pairs of input and output dtypes are errors naming both.
    let host = Device::host();
    let x64 = random_tensor(DType::F64, &[2, 8], -1.0, 1.0, 90)
        .to_device(&host)
        .unwrap();
    let e = x64
        .rms_norm_to(&[8], None, 1e-5, DType::BF16)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rms_norm") && e.contains("bf16") && e.contains("f64"),
        "{e}"
    );
    let x16 = x64.to_dtype(DType::BF16).unwrap();
    let e = x16
        .layer_norm_to(&[8], None, None, 1e-5, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer_norm") && e.contains("f32"), "{e}");
}
