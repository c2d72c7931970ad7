//! layer_norm, rms_norm (forward, backward, finite differences) and batch_norm on every device against the host.
use netcl_core_devices::test_devices;
use netcl_kernels::thread_launches;
use netcl_ops::testing::{
    check_close, dtypes_for, expect_row_kernel, host_tensor, random_tensor, random_view, tolerance,
    Cases, MAX_REGISTER_ROW, ROW_LENGTHS,
};
use netcl_ops::{acc_dtype, DType, Device, Tensor};

fn float_dtypes(dev: &Device) -> Vec<DType> {
    dtypes_for(dev)
        .into_iter()
        .filter(|d| d.is_float())
        .collect()
}

fn close(got: &Tensor, want: &Tensor, tol: f64, scale: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    check_close(
        &got.to_vec_f64().unwrap(),
        &want.to_vec_f64().unwrap(),
        tol,
        scale,
        what,
    )
    .unwrap();
}

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

/// Central finite differences of `f` at `x`.
fn fd(x: &[f64], f: &dyn Fn(&[f64]) -> f64) -> Vec<f64> {
    (0..x.len())
        .map(|k| {
            let (mut p, mut m) = (x.to_vec(), x.to_vec());
            p[k] += 1e-6;
            m[k] -= 1e-6;
            (f(&p) - f(&m)) / 2e-6
        })
        .collect()
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

/// A copy of `t` on `dev` with its own storage (running stats are updated in place).
fn fresh(t: &Tensor, dev: &Device) -> Tensor {
    host_tensor(t.dtype(), &t.to_vec_f64().unwrap(), t.shape())
        .to_device(dev)
        .unwrap()
}

#[test]
fn random_batch_norms_match_the_host() {
    let devices = test_devices().unwrap();
    let dtypes = float_dtypes(devices.last().unwrap());
    let mut c = Cases::new(0xB4);
    for case in 0..200u64 {
        let mut shape = vec![1 + c.below(5), 1 + c.below(6)];
        if c.below(2) == 0 {
            shape.extend([1 + c.below(6), 1 + c.below(6)]);
        }
        if case % 50 == 0 {
            shape = vec![2, 3, 17, 31];
        }
        if shape.iter().product::<usize>() / shape[1].max(1) < 2 {
            shape[0] += 1;
        }
        let dtype = dtypes[c.below(dtypes.len())];
        let acc = acc_dtype(dtype);
        let ch = shape[1];
        let seed = c.next_u64();
        let host = random_tensor(dtype, &shape, -3.0, 3.0, case);
        // Views that keep the channel dim in place: slices only.
        let mut vc = Cases(seed);
        let mut hv = host.clone();
        for d in [0, 2, 3] {
            if d < hv.ndim() && hv.shape()[d] > 3 && vc.below(2) == 0 {
                hv = hv.slice(d, 1, hv.shape()[d], 2).unwrap();
            }
        }
        let view_of = |t: &Tensor| {
            let mut v = t.clone();
            for d in [0, 2, 3] {
                if d < v.ndim() && host.shape()[d] > 3 && hv.shape()[d] != host.shape()[d] {
                    v = v.slice(d, 1, v.shape()[d], 2).unwrap();
                }
            }
            v
        };
        let w = (c.below(3) != 0).then(|| random_tensor(dtype, &[ch], 0.5, 1.5, case + 1));
        let b = (c.below(2) == 0).then(|| random_tensor(dtype, &[ch], -1.0, 1.0, case + 2));
        let rm0 = random_tensor(acc, &[ch], -1.0, 1.0, case + 3);
        let rv0 = random_tensor(acc, &[ch], 0.5, 2.0, case + 4);
        let with_running = c.below(4) != 0;
        let (rm, rv) = (fresh(&rm0, &Device::host()), fresh(&rv0, &Device::host()));
        let what = format!("batch_norm {dtype} {:?}/{:?}", hv.shape(), hv.strides());
        let run = |x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, rm: &Tensor, rv: &Tensor| {
            let r = if with_running {
                x.batch_norm_train(w, b, Some(rm), Some(rv), 0.1, 1e-5)
                    .unwrap()
            } else {
                x.batch_norm_train(w, b, None, None, 0.1, 1e-5).unwrap()
            };
            let e = x.batch_norm_eval(rm, rv, w, b, 1e-5).unwrap();
            (r, e)
        };
        let (want, want_eval) = run(&hv, w.as_ref(), b.as_ref(), &rm, &rv);
        let tol = tolerance(dtype);
        let atol = tolerance(acc) * 8.0;
        for dev in &devices {
            let x = view_of(&host.to_device(dev).unwrap());
            assert_eq!(x.shape(), hv.shape());
            let wd = w.as_ref().map(|w| w.to_device(dev).unwrap());
            let bd = b.as_ref().map(|b| b.to_device(dev).unwrap());
            let (rmd, rvd) = (fresh(&rm0, dev), fresh(&rv0, dev));
            let (got, got_eval) = run(&x, wd.as_ref(), bd.as_ref(), &rmd, &rvd);
            let what = format!("{what} on {dev}");
            close(&got.y, &want.y, tol * 4.0, 4.0, &what);
            close(&got.save_mean, &want.save_mean, atol, 1.0, &what);
            close(&got.save_invstd, &want.save_invstd, atol, 1.0, &what);
            close(&rmd, &rm, atol, 1.0, &format!("running_mean {what}"));
            close(&rvd, &rv, atol, 1.0, &format!("running_var {what}"));
            close(
                &got_eval,
                &want_eval,
                tol * 4.0,
                4.0,
                &format!("eval {what}"),
            );
        }
        // Independent check of the host statistics and running update.
        let xs = hv.contiguous().unwrap().to_vec_f64().unwrap();
        let inner: usize = hv.shape()[2..].iter().product();
        let (m0, v0) = (rm0.to_vec_f64().unwrap(), rv0.to_vec_f64().unwrap());
        for k in 0..ch {
            let vals: Vec<f64> = xs
                .iter()
                .enumerate()
                .filter(|(i, _)| (i / inner) % ch == k)
                .map(|(_, &v)| v)
                .collect();
            let n = vals.len() as f64;
            let mu = vals.iter().sum::<f64>() / n;
            let var = vals.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n;
            check_close(
                &[want.save_mean.to_vec_f64().unwrap()[k]],
                &[mu],
                atol,
                1.0,
                &what,
            )
            .unwrap();
            if with_running {
                let rmk = 0.9 * m0[k] + 0.1 * mu;
                let rvk = 0.9 * v0[k] + 0.1 * var * n / (n - 1.0);
                check_close(&[rm.to_vec_f64().unwrap()[k]], &[rmk], atol, 1.0, &what).unwrap();
                check_close(&[rv.to_vec_f64().unwrap()[k]], &[rvk], atol, 1.0, &what).unwrap();
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

/// A tensor on `dev` holding `vals` (row-major over `shape`) in one of three layouts: 0 contiguous,
/// 1 stored with every dim reversed (a permuted view), 2 every other element of a last dim twice
/// as long, from element 1 (a stepped slice with an offset).
fn laid_out(dtype: DType, vals: &[f64], shape: &[usize], kind: usize, dev: &Device) -> Tensor {
    let t = host_tensor(dtype, vals, shape);
    match kind {
        0 => t.to_device(dev).unwrap(),
        1 => {
            let rev: Vec<usize> = (0..shape.len()).rev().collect();
            let stored = t.permute(&rev).unwrap().contiguous().unwrap();
            stored.to_device(dev).unwrap().permute(&rev).unwrap()
        }
        _ => {
            let last = *shape.last().unwrap();
            let mut wide = shape.to_vec();
            *wide.last_mut().unwrap() = 2 * last;
            let base: Vec<f64> = (0..vals.len() * 2)
                .map(|i| if i % 2 == 1 { vals[i / 2] } else { 7.0 })
                .collect();
            let d = shape.len() - 1;
            host_tensor(dtype, &base, &wide)
                .to_device(dev)
                .unwrap()
                .slice(d, 1, 2 * last, 2)
                .unwrap()
        }
    }
}

/// A random batch-norm shape: (N, C) or (N, C, H, W) with at least 2 values per channel.
fn bn_shape(c: &mut Cases, max: usize) -> Vec<usize> {
    let mut shape = vec![1 + c.below(max), 1 + c.below(max)];
    if c.below(2) == 0 {
        shape.extend([1 + c.below(max), 1 + c.below(max)]);
    }
    if shape.iter().product::<usize>() / shape[1] < 2 {
        shape[0] += 1;
    }
    shape
}

#[test]
fn batch_norm_gradients_match_finite_differences() {
    let mut c = Cases::new(0xBB);
    let mut checks = 0;
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        for case in 0..8u64 {
            let shape = bn_shape(&mut c, 4);
            let ch = shape[1];
            let n: usize = shape.iter().product();
            let (xk, gk) = (c.below(3), c.below(3));
            let x0 = random_tensor(DType::F64, &[n], -2.0, 2.0, case)
                .to_vec_f64()
                .unwrap();
            let r = random_tensor(DType::F64, &[n], -1.0, 1.0, case + 1)
                .to_vec_f64()
                .unwrap();
            let w0 = random_tensor(DType::F64, &[ch], 0.5, 1.5, case + 2)
                .to_vec_f64()
                .unwrap();
            let b0 = random_tensor(DType::F64, &[ch], -1.0, 1.0, case + 3)
                .to_vec_f64()
                .unwrap();
            let with_w = c.below(4) != 0;
            let t = |v: &[f64], s: &[usize]| Tensor::from_vec(v.to_vec(), s, &dev).unwrap();
            // loss = sum(y * r), so dy = r. FD noise is ~1e-9 (roundoff of loss / step): an
            // absolute floor of 1e-8.
            let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
                let wt = t(w, &[ch]);
                t(x, &shape)
                    .batch_norm_train(
                        with_w.then_some(&wt),
                        Some(&t(b, &[ch])),
                        None,
                        None,
                        0.1,
                        1e-5,
                    )
                    .unwrap()
                    .y
                    .to_vec_f64()
                    .unwrap()
                    .iter()
                    .zip(&r)
                    .map(|(a, b)| a * b)
                    .sum()
            };
            let x = laid_out(DType::F64, &x0, &shape, xk, &dev);
            let dy = laid_out(DType::F64, &r, &shape, gk, &dev);
            let wt = t(&w0, &[ch]);
            let fwd = x
                .batch_norm_train(
                    with_w.then_some(&wt),
                    Some(&t(&b0, &[ch])),
                    None,
                    None,
                    0.1,
                    1e-5,
                )
                .unwrap();
            let g = x
                .batch_norm_backward(&dy, &fwd.save_mean, &fwd.save_invstd, with_w.then_some(&wt))
                .unwrap();
            let what = format!("batch_norm {shape:?} layouts {xk}/{gk} w {with_w} on {dev}");
            let dx = fd(&x0, &|x| loss(x, &w0, &b0));
            assert!(
                g.dx.is_contiguous() && g.dx.shape() == shape.as_slice(),
                "{what}"
            );
            check_close(
                &g.dx.to_vec_f64().unwrap(),
                &dx,
                1e-6,
                1e-2,
                &format!("dx {what}"),
            )
            .unwrap();
            let db = fd(&b0, &|b| loss(&x0, &w0, b));
            let gb = g.dbias.unwrap().to_vec_f64().unwrap();
            check_close(&gb, &db, 1e-6, 1e-2, &format!("dbias {what}")).unwrap();
            assert_eq!(g.dweight.is_some(), with_w, "{what}");
            if let Some(gw) = g.dweight {
                let dw = fd(&w0, &|w| loss(&x0, w, &b0));
                check_close(
                    &gw.to_vec_f64().unwrap(),
                    &dw,
                    1e-6,
                    1e-3,
                    &format!("dweight {what}"),
                )
                .unwrap();
            }
            checks += 1;
        }
    }
    assert!(
        checks >= 16,
        "{checks} checks: the host and at least one fp64 OpenCL device"
    );
}

#[test]
fn random_batch_norm_backwards_match_the_host() {
    let devices = test_devices().unwrap();
    let dtypes = float_dtypes(devices.last().unwrap());
    let mut c = Cases::new(0xBB2);
    let mut checks = 0;
    for case in 0..120u64 {
        let mut shape = bn_shape(&mut c, 6);
        let mut dtype = dtypes[c.below(dtypes.len())];
        // Several slices per channel (P > 1), and the 256-slice cap.
        match case {
            10 => shape = vec![8, 3, 32, 33],
            20 => shape = vec![2, 2, 100, 100],
            30 => (shape, dtype) = (vec![1, 1, 1024, 1025], DType::F32),
            _ => {}
        }
        let ch = shape[1];
        let n: usize = shape.iter().product();
        let (xk, gk) = (c.below(3), c.below(3));
        let xv = random_tensor(DType::F64, &[n], -3.0, 3.0, case)
            .to_vec_f64()
            .unwrap();
        let gv = random_tensor(DType::F64, &[n], -1.0, 1.0, case + 1)
            .to_vec_f64()
            .unwrap();
        let w = (c.below(3) != 0).then(|| random_tensor(dtype, &[ch], 0.5, 1.5, case + 2));
        let run = |dev: &Device| {
            let x = laid_out(dtype, &xv, &shape, xk, dev);
            let dy = laid_out(dtype, &gv, &shape, gk, dev);
            let wd = w.as_ref().map(|w| w.to_device(dev).unwrap());
            let fwd = x
                .batch_norm_train(wd.as_ref(), None, None, None, 0.1, 1e-5)
                .unwrap();
            let g = x
                .batch_norm_backward(&dy, &fwd.save_mean, &fwd.save_invstd, wd.as_ref())
                .unwrap();
            (fwd, g)
        };
        let (want_fwd, want) = run(&Device::host());
        let what = format!(
            "batch_norm_backward {dtype} {shape:?} layouts {xk}/{gk} w {}",
            w.is_some()
        );
        let tol = tolerance(dtype) * 8.0;
        let rows = (n / ch) as f64;
        for dev in &devices {
            if dev.is_host() {
                continue;
            }
            let (fwd, g) = run(dev);
            let what = format!("{what} on {dev}");
            // The backward of the device's own statistics (they match the host's to acc precision).
            close(
                &fwd.save_invstd,
                &want_fwd.save_invstd,
                tolerance(acc_dtype(dtype)) * 8.0,
                1.0,
                &what,
            );
            close(&g.dx, &want.dx, tol, 4.0, &format!("dx {what}"));
            close(
                g.dbias.as_ref().unwrap(),
                want.dbias.as_ref().unwrap(),
                tol,
                rows.sqrt(),
                &format!("dbias {what}"),
            );
            assert_eq!(g.dweight.is_some(), w.is_some(), "{what}");
            if let (Some(a), Some(b)) = (&g.dweight, &want.dweight) {
                close(a, b, tol, 2.0 * rows.sqrt(), &format!("dweight {what}"));
            }
            checks += 1;
        }
    }
    assert!(checks >= 120, "{checks} device checks");
}

#[test]
fn batch_norm_backward_errors_name_the_op_and_shapes() {
    for dev in test_devices().unwrap() {
        let x = Tensor::zeros(&[4, 3, 2], DType::F32, &dev).unwrap();
        let fwd = x
            .batch_norm_train(None, None, None, None, 0.1, 1e-5)
            .unwrap();
        let dy = Tensor::zeros(&[4, 3, 3], DType::F32, &dev).unwrap();
        let e = x
            .batch_norm_backward(&dy, &fwd.save_mean, &fwd.save_invstd, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("batch_norm_backward") && e.contains("[4, 3, 3]"),
            "{e}"
        );
        let dy = Tensor::zeros(&[4, 3, 2], DType::F32, &dev).unwrap();
        let m4 = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let e = x
            .batch_norm_backward(&dy, &m4, &fwd.save_invstd, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("save_mean") && e.contains("[4]"), "{e}");
        let w2 = Tensor::ones(&[2], DType::F32, &dev).unwrap();
        let e = x
            .batch_norm_backward(&dy, &fwd.save_mean, &fwd.save_invstd, Some(&w2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("weight") && e.contains("[2]"), "{e}");
        let dy16 = Tensor::zeros(&[4, 3, 2], DType::F16, &dev).unwrap();
        let e = x
            .batch_norm_backward(&dy16, &fwd.save_mean, &fwd.save_invstd, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dy") && e.contains("f16"), "{e}");
        let flat = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        assert!(flat
            .batch_norm_backward(&flat, &fwd.save_mean, &fwd.save_invstd, None)
            .is_err());
    }
}
