//! softmax, log_softmax and cross-entropy (forward and backward, register-resident rows, gradients by finite differences) on every device against the host reference.
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

/// Independent f64 softmax (or log_softmax) along `dim` of a contiguous host tensor.
fn softmax_reference(t: &Tensor, dim: usize, log: bool) -> Vec<f64> {
    let x = t.to_vec_f64().unwrap();
    let shape = t.shape();
    let n = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = vec![0.0; x.len()];
    for a in 0..outer {
        for b in 0..inner {
            let at = |j: usize| a * n * inner + j * inner + b;
            let m = (0..n).map(|j| x[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..n).map(|j| (x[at(j)] - m).exp()).sum();
            for j in 0..n {
                out[at(j)] = if log {
                    x[at(j)] - m - s.ln()
                } else {
                    (x[at(j)] - m).exp() / s
                };
            }
        }
    }
    out
}

#[test]
fn random_softmax_matches_the_host() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x50F7);
    let dtypes = float_dtypes(devices.last().unwrap());
    let mut cases = 0;
    for case in 0..600u64 {
        let mut shape = c.shape(4, 9);
        if case % 50 == 0 {
            shape = vec![[255, 257, 4097][c.below(3)], 1 + c.below(3)];
        }
        let dtype = dtypes[c.below(dtypes.len())];
        let dim = c.below(shape.len());
        let log = c.below(2) == 0;
        let seed = c.next_u64();
        let host = random_tensor(dtype, &shape, -4.0, 4.0, case);
        let hv = random_view(&host, &mut Cases(seed));
        let dim = dim.min(hv.ndim() - 1);
        let run = |t: &Tensor| {
            if log {
                t.log_softmax(dim)
            } else {
                t.softmax(dim)
            }
        };
        let what = format!(
            "softmax log={log} {dtype} {:?}/{:?} dim {dim}",
            hv.shape(),
            hv.strides()
        );
        let want = run(&hv).unwrap();
        let w = want.to_vec_f64().unwrap();
        let tol = tolerance(dtype);
        let r = softmax_reference(&hv.contiguous().unwrap(), dim, log);
        check_close(&w, &r, tol, 1.0, &format!("host vs reference: {what}")).unwrap();
        for dev in &devices {
            let got = run(&random_view(
                &host.to_device(dev).unwrap(),
                &mut Cases(seed),
            ))
            .unwrap();
            assert!(got.is_contiguous() && got.shape() == want.shape() && got.dtype() == dtype);
            check_close(
                &got.to_vec_f64().unwrap(),
                &w,
                tol,
                1.0,
                &format!("{what} on {dev}"),
            )
            .unwrap();
        }
        cases += 1;
    }
    assert!(cases >= 500);
}

/// Logits [n, c] as (base, transposed): the base is [c, n] when transposed. Targets have some
/// rows at the ignore index -100.
fn ce_inputs(
    c: &mut Cases,
    dtype: DType,
    n: usize,
    classes: usize,
    seed: u64,
) -> (Tensor, bool, Tensor) {
    let transposed = c.below(2) == 0;
    let base = if transposed {
        random_tensor(dtype, &[classes, n], -4.0, 4.0, seed)
    } else {
        random_tensor(dtype, &[n, classes], -4.0, 4.0, seed)
    };
    let t: Vec<i32> = (0..n)
        .map(|_| {
            if c.below(6) == 0 {
                -100
            } else {
                c.below(classes) as i32
            }
        })
        .collect();
    let targets = Tensor::from_vec(t, &[n], &Device::host()).unwrap();
    (base, transposed, targets)
}

fn ce_view(base: &Tensor, transposed: bool) -> Tensor {
    if transposed {
        base.transpose(0, 1).unwrap()
    } else {
        base.clone()
    }
}

#[test]
fn random_cross_entropy_matches_the_host() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xCE);
    let dtypes = float_dtypes(devices.last().unwrap());
    for case in 0..500u64 {
        let n = c.below(20);
        let classes = if case % 60 == 0 {
            [257, 4097][c.below(2)]
        } else {
            1 + c.below(40)
        };
        let dtype = dtypes[c.below(dtypes.len())];
        let ignore = if c.below(3) == 0 { None } else { Some(-100) };
        let (base, transposed, mut targets) = ce_inputs(&mut c, dtype, n, classes, case);
        let logits = ce_view(&base, transposed);
        if ignore.is_none() {
            targets = Tensor::from_vec(
                targets
                    .to_vec::<i32>()
                    .unwrap()
                    .iter()
                    .map(|&t| t.max(0))
                    .collect(),
                &[n],
                &Device::host(),
            )
            .unwrap();
        }
        let per_row = c.below(2) == 0;
        let grad = if per_row {
            random_tensor(acc_dtype(dtype), &[n], -1.0, 1.0, case + 1)
        } else {
            host_tensor(acc_dtype(dtype), &[1.5], &[])
        };
        let what = format!(
            "cross_entropy {dtype} [{n}, {classes}] ignore {ignore:?} strides {:?}",
            logits.strides()
        );
        let want = logits.cross_entropy(&targets, ignore).unwrap();
        let count = (!per_row).then_some(&want.count);
        let want_dx = logits
            .cross_entropy_backward(&targets, &want.lse, &grad, count, ignore)
            .unwrap();
        // Independent f64 reference.
        let x = logits.contiguous().unwrap().to_vec_f64().unwrap();
        let t = targets.to_vec::<i32>().unwrap();
        let g = grad.to_vec_f64().unwrap();
        let mut losses = vec![0.0; n];
        let mut lse = vec![0.0; n];
        let mut dx = vec![0.0; n * classes];
        let kept: Vec<usize> = (0..n).filter(|&i| Some(t[i]) != ignore).collect();
        for i in 0..n {
            let row = &x[i * classes..(i + 1) * classes];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            lse[i] = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            if Some(t[i]) != ignore {
                losses[i] = lse[i] - row[t[i] as usize];
                let gi = if per_row {
                    g[i]
                } else {
                    g[0] / kept.len() as f64
                };
                for j in 0..classes {
                    let onehot = if j == t[i] as usize { 1.0 } else { 0.0 };
                    dx[i * classes + j] = ((row[j] - lse[i]).exp() - onehot) * gi;
                }
            }
        }
        let mean = kept.iter().map(|&i| losses[i]).sum::<f64>() / kept.len() as f64;
        let tol = tolerance(acc_dtype(dtype)) * 4.0;
        let dtol = tolerance(dtype) * 2.0;
        check_close(&want.losses.to_vec_f64().unwrap(), &losses, tol, 1.0, &what).unwrap();
        check_close(&want.lse.to_vec_f64().unwrap(), &lse, tol, 1.0, &what).unwrap();
        check_close(&want.loss.to_vec_f64().unwrap(), &[mean], tol, 1.0, &what).unwrap();
        check_close(&want_dx.to_vec_f64().unwrap(), &dx, dtol, 1.0, &what).unwrap();
        for dev in &devices {
            let (l, tg, gr) = (
                ce_view(&base.to_device(dev).unwrap(), transposed),
                targets.to_device(dev).unwrap(),
                grad.to_device(dev).unwrap(),
            );
            let got = l.cross_entropy(&tg, ignore).unwrap();
            let what = format!("{what} on {dev}");
            check_close(
                &got.losses.to_vec_f64().unwrap(),
                &want.losses.to_vec_f64().unwrap(),
                tol,
                1.0,
                &what,
            )
            .unwrap();
            check_close(
                &got.lse.to_vec_f64().unwrap(),
                &want.lse.to_vec_f64().unwrap(),
                tol,
                1.0,
                &what,
            )
            .unwrap();
            check_close(
                &got.loss.to_vec_f64().unwrap(),
                &want.loss.to_vec_f64().unwrap(),
                tol,
                1.0,
                &what,
            )
            .unwrap();
            assert_eq!(got.count.to_vec_f64().unwrap(), vec![kept.len() as f64]);
            let count = (!per_row).then_some(&got.count);
            let gdx = l
                .cross_entropy_backward(&tg, &got.lse, &gr, count, ignore)
                .unwrap();
            assert_eq!(gdx.shape(), &[n, classes]);
            check_close(
                &gdx.to_vec_f64().unwrap(),
                &want_dx.to_vec_f64().unwrap(),
                dtol,
                1.0,
                &what,
            )
            .unwrap();
        }
    }
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        let (n, classes) = (3, 5);
        let x = random_tensor(DType::F64, &[n, classes], -2.0, 2.0, 3);
        let t = Tensor::from_vec(vec![4i32, 0, 2], &[n], &Device::host()).unwrap();
        let loss = |x: &[f64]| {
            let xt = Tensor::from_vec(x.to_vec(), &[n, classes], &dev).unwrap();
            xt.cross_entropy(&t.to_device(&dev).unwrap(), None)
                .unwrap()
                .loss
                .to_vec_f64()
                .unwrap()[0]
        };
        let xd = x.to_device(&dev).unwrap();
        let td = t.to_device(&dev).unwrap();
        let ce = xd.cross_entropy(&td, None).unwrap();
        let one = Tensor::from_vec(vec![1.0f64], &[], &dev).unwrap();
        let dx = xd
            .cross_entropy_backward(&td, &ce.lse, &one, Some(&ce.count), None)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let x0 = x.to_vec_f64().unwrap();
        for k in 0..n * classes {
            let (mut p, mut m) = (x0.clone(), x0.clone());
            p[k] += 1e-6;
            m[k] -= 1e-6;
            let fd = (loss(&p) - loss(&m)) / 2e-6;
            assert!(
                (fd - dx[k]).abs() < 1e-7,
                "{dev} element {k}: fd {fd} vs {}",
                dx[k]
            );
        }
    }
}

/// A host base [5, n + 1] of `dtype` for the row-kernel tests. With `special`, row 0 holds -inf
/// at columns 0 and n / 2, row 2 is shifted by +20, row 3 is all -inf and row 4 holds a NaN.
fn row_base(dtype: DType, n: usize, seed: u64, special: bool) -> Tensor {
    let mut c = Cases::new(seed);
    let mut v: Vec<f64> = (0..5 * (n + 1)).map(|_| c.uniform(-4.0, 4.0)).collect();
    if special {
        let at = |r: usize, j: usize| r * (n + 1) + j;
        for j in 0..=n {
            v[at(2, j)] += 20.0;
            v[at(3, j)] = f64::NEG_INFINITY;
        }
        v[at(0, 0)] = f64::NEG_INFINITY;
        v[at(0, n / 2)] = f64::NEG_INFINITY;
        v[at(4, n / 3 + 1)] = f64::NAN;
    }
    host_tensor(dtype, &v, &[5, n + 1])
}

/// Rows of length n of `base` [5, n + 1]: view 0 is a contiguous copy of columns 0..n (rows start
/// at multiples of n: 4-wide loads when n is a multiple of 4), view 1 the columns 1..=n in place
/// (rows start at 1, n + 2, ...: scalar loads).
fn row_view(base: &Tensor, view: usize) -> Tensor {
    let n = base.shape()[1] - 1;
    match view {
        0 => base.narrow(1, 0, n).unwrap().contiguous().unwrap(),
        _ => base.narrow(1, 1, n).unwrap(),
    }
}

#[test]
fn softmax_rows_at_register_boundaries() {
    let devices = test_devices().unwrap();
    let mut checks = 0;
    for &n in &ROW_LENGTHS {
        for dtype in float_dtypes(devices.last().unwrap()) {
            let base = row_base(dtype, n, n as u64, true);
            for view in 0..2 {
                let x = row_view(&base, view);
                for log in [false, true] {
                    let r = softmax_reference(&x.contiguous().unwrap(), 1, log);
                    let what = format!("softmax log={log} {dtype} [5, {n}] view {view}");
                    // Softmax values go down to exp(-8) / n: compare relative to that floor.
                    let scale = if log { 1.0 } else { 1.0 / n as f64 };
                    for dev in &devices {
                        let xd = row_view(&base.to_device(dev).unwrap(), view);
                        let before = thread_launches("softmax_rows");
                        let got = if log {
                            xd.log_softmax(1)
                        } else {
                            xd.softmax(1)
                        };
                        let got = got.unwrap().to_vec_f64().unwrap();
                        let rows_kernel = thread_launches("softmax_rows") - before;
                        let expect = u64::from(!dev.is_host() && n <= MAX_REGISTER_ROW);
                        assert_eq!(rows_kernel, expect, "{what} on {dev}: row kernel launches");
                        let w = format!("{what} on {dev}");
                        check_close(&got, &r, tolerance(dtype), scale, &w).unwrap();
                        checks += 1;
                    }
                }
            }
        }
    }
    println!("{checks} softmax checks");
}

#[test]
fn cross_entropy_rows_at_register_boundaries() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xCE2);
    let mut checks = 0;
    for &n in &ROW_LENGTHS {
        for dtype in float_dtypes(devices.last().unwrap()) {
            let t: Vec<i32> = (0..5)
                .map(|i| if i == 3 { -100 } else { c.below(n) as i32 })
                .collect();
            let targets = Tensor::from_vec(t.clone(), &[5], &Device::host()).unwrap();
            let base = row_base(dtype, n, c.next_u64(), false);
            for view in 0..2 {
                let xs = row_view(&base, view).to_vec_f64().unwrap();
                let mut lse = vec![0.0; 5];
                let mut losses = vec![0.0; 5];
                for i in 0..5 {
                    let row = &xs[i * n..(i + 1) * n];
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    lse[i] = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                    if t[i] != -100 {
                        losses[i] = lse[i] - row[t[i] as usize];
                    }
                }
                let what = format!("cross_entropy {dtype} [5, {n}] view {view}");
                let tol = tolerance(acc_dtype(dtype)) * 4.0;
                for dev in &devices {
                    let before = thread_launches("cross_entropy_rows");
                    let xd = row_view(&base.to_device(dev).unwrap(), view);
                    let td = targets.to_device(dev).unwrap();
                    let (l, s) = xd.cross_entropy_rows(&td, Some(-100)).unwrap();
                    let rows_kernel = thread_launches("cross_entropy_rows") - before;
                    let expect = u64::from(!dev.is_host() && n <= MAX_REGISTER_ROW);
                    assert_eq!(rows_kernel, expect, "{what} on {dev}: row kernel launches");
                    let w = format!("{what} on {dev}");
                    check_close(&l.to_vec_f64().unwrap(), &losses, tol, 1.0, &w).unwrap();
                    check_close(&s.to_vec_f64().unwrap(), &lse, tol, 1.0, &w).unwrap();
                    checks += 1;
                }
            }
        }
    }
    println!("{checks} cross-entropy checks");
}

#[test]
fn softmax_and_cross_entropy_errors() {
    for dev in test_devices().unwrap() {
        let x = Tensor::zeros(&[4, 3], DType::F32, &dev).unwrap();
        let e = x.softmax(2).unwrap_err().to_string();
        assert!(e.contains("softmax") && e.contains("[4, 3]"), "{e}");
        let i = Tensor::zeros(&[4, 3], DType::I32, &dev).unwrap();
        assert!(i
            .log_softmax(0)
            .unwrap_err()
            .to_string()
            .contains("log_softmax"));
        let t = Tensor::zeros(&[3], DType::I32, &dev).unwrap();
        let e = x.cross_entropy(&t, None).unwrap_err().to_string();
        assert!(
            e.contains("cross_entropy") && e.contains("[4, 3]") && e.contains("[3]"),
            "{e}"
        );
        let tf = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let e = x.cross_entropy(&tf, None).unwrap_err().to_string();
        assert!(e.contains("cross_entropy") && e.contains("targets"), "{e}");
        let t4 = Tensor::zeros(&[4], DType::I32, &dev).unwrap();
        let other = if dev.is_host() {
            test_devices().unwrap().pop().unwrap()
        } else {
            Device::host()
        };
        if other != dev {
            let e = x
                .cross_entropy(&t4.to_device(&other).unwrap(), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("cross_entropy") && e.contains("[4]"), "{e}");
        }
        let ce = x.cross_entropy(&t4, None).unwrap();
        let g = Tensor::zeros(&[2], DType::F32, &dev).unwrap();
        let e = x
            .cross_entropy_backward(&t4, &ce.lse, &g, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cross_entropy_backward") && e.contains("[2]"),
            "{e}"
        );
        let g64 = Tensor::zeros(&[], DType::I32, &dev).unwrap();
        assert!(x
            .cross_entropy_backward(&t4, &ce.lse, &g64, None, None)
            .is_err());
        // Out-of-range targets: an error at once on the host; on devices the kernel records it
        // and the next read reports it (then the row reads as NaN).
        let bad = Tensor::from_vec(vec![0i32, 7, 1, 2], &[4], &dev).unwrap();
        match x.cross_entropy_rows(&bad, None) {
            Err(e) => {
                assert!(dev.is_host());
                assert!(e.to_string().contains("target 7 of row 1"), "{e}");
            }
            Ok((loss, _)) => {
                let e = loss.to_vec_f64().unwrap_err().to_string();
                assert!(e.contains("target 7 of row 1"), "{dev}: {e}");
                let l = loss.to_vec_f64().unwrap();
                assert!(l[1].is_nan() && !l[0].is_nan(), "{l:?}");
            }
        }
    }
}

#[test]
fn softmax_is_deterministic() {
    for dev in test_devices().unwrap() {
        let x = random_tensor(DType::F32, &[7, 4097], -3.0, 3.0, 5)
            .to_device(&dev)
            .unwrap();
        for dim in [0, 1] {
            let a = x.softmax(dim).unwrap().to_host_data().unwrap();
            let b = x.softmax(dim).unwrap().to_host_data().unwrap();
            assert_eq!(a.as_bytes(), b.as_bytes());
        }
        let t = Tensor::from_vec(vec![1i32, 5, 4000, 0, 9, 9, 9], &[7], &dev).unwrap();
        let a = x
            .cross_entropy(&t, None)
            .unwrap()
            .loss
            .to_host_data()
            .unwrap();
        let b = x
            .cross_entropy(&t, None)
            .unwrap()
            .loss
            .to_host_data()
            .unwrap();
        assert_eq!(a.as_bytes(), b.as_bytes());
    }
}

// ---- backward of softmax, log_softmax and cross-entropy ----

/// Independent f64 gradient of softmax (or log_softmax) along `dim` from contiguous output values
/// `y` and upstream `g` of `shape`: y * (g - sum(g * y)), or g - exp(y) * sum(g).
fn softmax_backward_reference(
    y: &[f64],
    g: &[f64],
    shape: &[usize],
    dim: usize,
    log: bool,
) -> Vec<f64> {
    let n = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = vec![0.0; y.len()];
    for a in 0..outer {
        for b in 0..inner {
            let at = |j: usize| a * n * inner + j * inner + b;
            let s: f64 = (0..n)
                .map(|j| if log { g[at(j)] } else { g[at(j)] * y[at(j)] })
                .sum();
            for j in 0..n {
                let (y, g) = (y[at(j)], g[at(j)]);
                out[at(j)] = if log { g - y.exp() * s } else { y * (g - s) };
            }
        }
    }
    out
}

fn softmax_backward(y: &Tensor, g: &Tensor, dim: usize, log: bool) -> Tensor {
    if log {
        y.log_softmax_backward(g, dim).unwrap()
    } else {
        y.softmax_backward(g, dim).unwrap()
    }
}

#[test]
fn random_softmax_backward_matches_the_host() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x5B4D);
    let dtypes = float_dtypes(devices.last().unwrap());
    for case in 0..300u64 {
        let mut shape = c.shape(4, 9);
        if case % 50 == 0 {
            shape = vec![[255, 257, 4097][c.below(3)], 1 + c.below(3)];
        }
        let dtype = dtypes[c.below(dtypes.len())];
        let dim = c.below(shape.len());
        let log = c.below(2) == 0;
        // dy: the same view as y, or a contiguous copy of it (other strides and offset).
        let dense_dy = c.below(2) == 0;
        let seed = c.next_u64();
        let x = random_tensor(dtype, &shape, -4.0, 4.0, case);
        let yh = if log {
            x.log_softmax(dim)
        } else {
            x.softmax(dim)
        }
        .unwrap();
        let gh = random_tensor(dtype, &shape, -1.0, 1.0, case + 1);
        let views = |y: &Tensor, g: &Tensor| {
            let g = random_view(g, &mut Cases(seed));
            let g = if dense_dy { g.contiguous().unwrap() } else { g };
            (random_view(y, &mut Cases(seed)), g)
        };
        let (yv, gv) = views(&yh, &gh);
        let what = format!(
            "softmax_backward log={log} {dtype} {:?}/{:?} dy {:?} dim {dim}",
            yv.shape(),
            yv.strides(),
            gv.strides()
        );
        let want = softmax_backward(&yv, &gv, dim, log);
        let w = want.to_vec_f64().unwrap();
        let tol = tolerance(dtype);
        let r = softmax_backward_reference(
            &yv.contiguous().unwrap().to_vec_f64().unwrap(),
            &gv.contiguous().unwrap().to_vec_f64().unwrap(),
            yv.shape(),
            dim,
            log,
        );
        check_close(&w, &r, tol, 1.0, &format!("host vs reference: {what}")).unwrap();
        for dev in &devices {
            let (y, g) = views(&yh.to_device(dev).unwrap(), &gh.to_device(dev).unwrap());
            let got = softmax_backward(&y, &g, dim, log);
            assert!(got.is_contiguous() && got.shape() == want.shape() && got.dtype() == dtype);
            let got = got.to_vec_f64().unwrap();
            check_close(&got, &w, tol * 2.0, 1.0, &format!("{what} on {dev}")).unwrap();
        }
    }
}

#[test]
fn softmax_backward_rows_at_register_boundaries() {
    let devices = test_devices().unwrap();
    let mut checks = 0;
    for &n in &ROW_LENGTHS {
        for dtype in float_dtypes(devices.last().unwrap()) {
            let xbase = row_base(dtype, n, n as u64 + 3, true);
            let gbase = row_base(dtype, n, n as u64 + 4, false);
            for log in [false, true] {
                // y: the forward of the special rows (zeros or -inf, NaN rows).
                let ybase = if log {
                    xbase.log_softmax(1)
                } else {
                    xbase.softmax(1)
                }
                .unwrap();
                // (y view, dy view): both aligned, both unaligned, y aligned and dy not.
                for (yk, gk) in [(0, 0), (1, 1), (0, 1)] {
                    let y = row_view(&ybase, yk).to_vec_f64().unwrap();
                    let g = row_view(&gbase, gk).to_vec_f64().unwrap();
                    let r = softmax_backward_reference(&y, &g, &[5, n], 1, log);
                    let what =
                        format!("softmax_backward log={log} {dtype} [5, {n}] views {yk}/{gk}");
                    let scale = if log { 1.0 } else { 1.0 / n as f64 };
                    for dev in &devices {
                        let y = row_view(&ybase.to_device(dev).unwrap(), yk);
                        let g = row_view(&gbase.to_device(dev).unwrap(), gk);
                        let got = expect_row_kernel("softmax_bwd_rows", dev, n, &what, || {
                            softmax_backward(&y, &g, 1, log)
                        });
                        let got = got.to_vec_f64().unwrap();
                        let w = format!("{what} on {dev}");
                        check_close(&got, &r, tolerance(dtype), scale, &w).unwrap();
                        checks += 1;
                    }
                }
            }
        }
    }
    println!("{checks} softmax backward checks");
}

#[test]
fn cross_entropy_backward_rows_at_register_boundaries() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xCE3);
    let mut checks = 0;
    for &n in &ROW_LENGTHS {
        for dtype in float_dtypes(devices.last().unwrap()) {
            let acc = acc_dtype(dtype);
            // Row 1 targets the last class (the end of the last unit), row 3 is ignored.
            let t: Vec<i32> = (0..5)
                .map(|i| match i {
                    1 => n as i32 - 1,
                    3 => -100,
                    _ => c.below(n) as i32,
                })
                .collect();
            let targets = Tensor::from_vec(t.clone(), &[5], &Device::host()).unwrap();
            let mut bad_t = t.clone();
            bad_t[1] = n as i32;
            let bad = Tensor::from_vec(bad_t, &[5], &Device::host()).unwrap();
            let base = row_base(dtype, n, c.next_u64(), false);
            let per_row = random_tensor(acc, &[5], -1.0, 1.0, c.next_u64());
            let (scalar, count) = (host_tensor(acc, &[1.5], &[]), host_tensor(acc, &[4.0], &[]));
            for view in 0..2 {
                let xs = row_view(&base, view).to_vec_f64().unwrap();
                let lse: Vec<f64> = xs
                    .chunks(n)
                    .map(|row| {
                        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                    })
                    .collect();
                let lse = host_tensor(acc, &lse, &[5]);
                let l = lse.to_vec_f64().unwrap();
                for (grad, count) in [(&per_row, None), (&scalar, Some(&count))] {
                    let g = grad.to_vec_f64().unwrap();
                    let scale = |i: usize| if count.is_some() { g[0] / 4.0 } else { g[i] };
                    let dx: Vec<f64> = (0..5 * n)
                        .map(|k| {
                            let (i, j) = (k / n, k % n);
                            if t[i] == -100 {
                                return 0.0;
                            }
                            let hot = if j == t[i] as usize { 1.0 } else { 0.0 };
                            ((xs[k] - l[i]).exp() - hot) * scale(i)
                        })
                        .collect();
                    let what = format!(
                        "cross_entropy_backward {dtype} [5, {n}] view {view} count {}",
                        count.is_some()
                    );
                    for dev in &devices {
                        let xd = row_view(&base.to_device(dev).unwrap(), view);
                        let (ld, gd) = (lse.to_device(dev).unwrap(), grad.to_device(dev).unwrap());
                        let cd = count.map(|c| c.to_device(dev).unwrap());
                        let run = |t: &Tensor| {
                            let t = t.to_device(dev).unwrap();
                            xd.cross_entropy_backward(&t, &ld, &gd, cd.as_ref(), Some(-100))
                        };
                        let name = "cross_entropy_bwd_rows";
                        let got = expect_row_kernel(name, dev, n, &what, || run(&targets));
                        let got = got.unwrap().to_vec_f64().unwrap();
                        let w = format!("{what} on {dev}");
                        check_close(&got, &dx, tolerance(dtype) * 2.0, 1.0, &w).unwrap();
                        // A target outside [0, n): that row NaN on devices, an error on the host.
                        match run(&bad) {
                            Err(e) => assert!(dev.is_host(), "{w}: {e}"),
                            Ok(d) => {
                                let d = d.to_vec_f64().unwrap();
                                for (k, (&a, &b)) in d.iter().zip(&got).enumerate() {
                                    let ok = if k / n == 1 { a.is_nan() } else { a == b };
                                    assert!(ok, "{w}: bad target, element {k}: {a} vs {b}");
                                }
                            }
                        }
                        checks += 1;
                    }
                }
            }
        }
    }
    println!("{checks} cross-entropy backward checks");
}

#[test]
fn softmax_and_cross_entropy_backwards_are_deterministic() {
    for dev in test_devices().unwrap() {
        for shape in [[7, 4097], [6, 4096]] {
            let x = random_tensor(DType::F32, &shape, -3.0, 3.0, 5)
                .to_device(&dev)
                .unwrap();
            let g = random_tensor(DType::F32, &shape, -1.0, 1.0, 6)
                .to_device(&dev)
                .unwrap();
            let bytes = |t: Tensor| t.to_host_data().unwrap().as_bytes().to_vec();
            for dim in [0, 1] {
                for log in [false, true] {
                    let y = if log {
                        x.log_softmax(dim)
                    } else {
                        x.softmax(dim)
                    }
                    .unwrap();
                    let a = bytes(softmax_backward(&y, &g, dim, log));
                    let b = bytes(softmax_backward(&y, &g, dim, log));
                    assert_eq!(a, b, "{dev} {shape:?} dim {dim} log {log}");
                }
            }
            let t = Tensor::from_vec(vec![1i32, 5, 4000, 0, 9, 9], &[6], &dev).unwrap();
            let x = x.narrow(0, 0, 6).unwrap();
            let ce = x.cross_entropy(&t, None).unwrap();
            let run = || {
                x.cross_entropy_backward(&t, &ce.lse, &ce.loss, Some(&ce.count), None)
                    .unwrap()
            };
            assert_eq!(bytes(run()), bytes(run()), "{dev} {shape:?}");
        }
    }
}

#[test]
fn softmax_backward_errors_name_the_op() {
    for dev in test_devices().unwrap() {
        let y = Tensor::zeros(&[4, 3], DType::F32, &dev).unwrap();
        let g = Tensor::zeros(&[4, 2], DType::F32, &dev).unwrap();
        let e = y.softmax_backward(&g, 1).unwrap_err().to_string();
        assert!(
            e.contains("softmax_backward") && e.contains("[4, 2]"),
            "{e}"
        );
        let e = y.log_softmax_backward(&y, 2).unwrap_err().to_string();
        assert!(
            e.contains("log_softmax_backward") && e.contains("dim 2"),
            "{e}"
        );
        let g16 = Tensor::zeros(&[4, 3], DType::F16, &dev).unwrap();
        let e = y.softmax_backward(&g16, 0).unwrap_err().to_string();
        assert!(e.contains("softmax_backward") && e.contains("dy"), "{e}");
        let i = Tensor::zeros(&[4, 3], DType::I32, &dev).unwrap();
        assert!(i.softmax_backward(&i, 0).is_err());
    }
}
