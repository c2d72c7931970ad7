//! batch_norm (training and eval forwards, backward, finite differences) on every device against the host.
mod norm_support;
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, host_tensor, random_tensor, tolerance, Cases};
use netcl_ops::{acc_dtype, DType, Device, Tensor};
use norm_support::{close, fd, float_dtypes};

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
