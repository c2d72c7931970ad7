//! Rotary position embeddings (forward, backward, finite-difference gradient check) and Bernoulli/dropout masks on every device.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, random_view, sample, tolerance, Cases};
use netcl_ops::{DType, Generator, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Naive RoPE in f64: `x` row-major [B, T, H, Dh], interleaved pairs, rotation by `sign * angle`.
fn naive_rope(x: &[f64], shape: &[usize], pos0: usize, theta: f64, sign: f64) -> Vec<f64> {
    let (t_len, h, dh) = (shape[1], shape[2], shape[3]);
    let mut y = x.to_vec();
    if dh == 0 {
        return y;
    }
    for (row, chunk) in y.chunks_mut(dh).enumerate() {
        let t = (row / h) % t_len;
        for i in 0..dh / 2 {
            let a = (pos0 + t) as f64 * theta.powf(-((2 * i) as f64) / dh as f64);
            let (c, s) = (a.cos(), sign * a.sin());
            let (x0, x1) = (chunk[2 * i], chunk[2 * i + 1]);
            chunk[2 * i] = x0 * c - x1 * s;
            chunk[2 * i + 1] = x0 * s + x1 * c;
        }
    }
    y
}

#[test]
fn rope_matches_a_naive_reference_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x80BE);
    for case in 0..320 {
        let dtype = FLOATS[case % 4];
        // Views of a larger tensor: the case's x is whatever random_view leaves, if it is 4-D with
        // an even last dim; otherwise a plain tensor.
        let shape = vec![c.below(3), 1 + c.below(5), 1 + c.below(3), 2 * c.below(5)];
        let base = sample(dtype, &shape, case as u64);
        let seed = c.next_u64();
        let use_view = c.below(2) == 0;
        let pick = |t: Tensor| {
            let v = random_view(&t, &mut Cases(seed));
            if use_view && v.ndim() == 4 && v.shape()[3].is_multiple_of(2) {
                v
            } else {
                t
            }
        };
        let xh = pick(base.clone());
        let pos0 = c.below(60);
        let theta = [10000.0, 500.0, 2.0][c.below(3)];
        let backward = c.below(3) == 0;
        let sign = if backward { -1.0 } else { 1.0 };
        let xv = xh.to_vec_f64().unwrap();
        let want = naive_rope(&xv, xh.shape(), pos0, theta, sign);
        let scale = xv.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        for dev in &devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let x = pick(base.to_device(dev).unwrap());
            assert_eq!(x.shape(), xh.shape());
            let y = if backward {
                x.rope_backward(pos0, theta)
            } else {
                x.rope(pos0, theta)
            }
            .unwrap();
            assert_eq!((y.shape(), y.dtype(), y.device()), (xh.shape(), dtype, dev));
            // f32 angles carry |pos| * eps of error; the tolerance covers positions below ~70.
            let tol = match dtype {
                DType::F32 => 1e-5,
                d => tolerance(d),
            };
            let what = format!(
                "case {case} {dtype} {:?} pos0 {pos0} theta {theta} on {dev}",
                xh.shape()
            );
            if let Err(m) = check_close(&y.to_vec_f64().unwrap(), &want, tol, scale, &what) {
                panic!("{m}");
            }
        }
    }
}

#[test]
fn rope_backward_inverts_rope_and_matches_the_host() {
    for dev in test_devices().unwrap() {
        for dtype in [DType::F32, DType::F64] {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let x = random_tensor(dtype, &[3, 37, 4, 10], -1.0, 1.0, 3);
            let xd = x.to_device(&dev).unwrap();
            let y = xd.rope(100, 10000.0).unwrap();
            let back = y.rope_backward(100, 10000.0).unwrap();
            let tol = if dtype == DType::F64 { 1e-13 } else { 1e-6 };
            let (b, xv) = (back.to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
            check_close(&b, &xv, tol, 1.0, &format!("{dev} {dtype}")).unwrap();
            // The device follows the host's arithmetic to within the devices' pow/cos accuracy.
            let yh = x.rope(100, 10000.0).unwrap();
            let tol = if dtype == DType::F64 { 1e-13 } else { 1e-5 };
            check_close(
                &y.to_vec_f64().unwrap(),
                &yh.to_vec_f64().unwrap(),
                tol,
                1.0,
                &format!("{dev} {dtype} vs host"),
            )
            .unwrap();
        }
    }
}

#[test]
fn rope_backward_is_the_finite_difference_vjp_in_f64() {
    let shape = [2, 3, 2, 4];
    let n: usize = shape.iter().product();
    let x = random_tensor(DType::F64, &shape, -1.0, 1.0, 11);
    let g = random_tensor(DType::F64, &shape, -1.0, 1.0, 12);
    let (xv, gv) = (x.to_vec_f64().unwrap(), g.to_vec_f64().unwrap());
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        let (pos0, theta) = (7, 10000.0);
        let grad = g
            .to_device(&dev)
            .unwrap()
            .rope_backward(pos0, theta)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let loss = |v: &[f64]| -> f64 {
            let t = Tensor::from_vec(v.to_vec(), &shape, &dev).unwrap();
            let y = t.rope(pos0, theta).unwrap().to_vec_f64().unwrap();
            y.iter().zip(&gv).map(|(a, b)| a * b).sum()
        };
        let h = 1e-6;
        for k in 0..n {
            let (mut p, mut m) = (xv.clone(), xv.clone());
            p[k] += h;
            m[k] -= h;
            let fd = (loss(&p) - loss(&m)) / (2.0 * h);
            assert!(
                (fd - grad[k]).abs() <= 1e-8 * (1.0 + fd.abs()),
                "{dev} element {k}: finite difference {fd} vs rope_backward {}",
                grad[k]
            );
        }
    }
}

#[test]
fn rope_rejects_bad_input() {
    for dev in test_devices().unwrap() {
        let odd = Tensor::zeros(&[1, 2, 1, 3], DType::F32, &dev).unwrap();
        let three = Tensor::zeros(&[2, 1, 4], DType::F32, &dev).unwrap();
        let int = Tensor::zeros(&[1, 2, 1, 4], DType::I32, &dev).unwrap();
        let ok = Tensor::zeros(&[1, 2, 1, 4], DType::F32, &dev).unwrap();
        for (r, op, needle) in [
            (odd.rope(0, 1e4), "rope", "[1, 2, 1, 3]"),
            (three.rope_backward(0, 1e4), "rope_backward", "[2, 1, 4]"),
            (int.rope(0, 1e4), "rope", "i32"),
            (ok.rope(0, 0.0), "rope", "theta"),
            (ok.rope(usize::MAX, 1e4), "rope", "[1, 2, 1, 4]"),
        ] {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(op) && e.contains(needle), "{e}");
        }
    }
}

/// The independent mask: rand_philox's stream, 1 where a word is below round(keep * 2^32).
fn philox_mask(seed: u64, n: usize, keep: f64) -> Vec<f64> {
    let mut r = rand_philox::Philox::from_u64_seed(seed);
    let thr = (keep * 4_294_967_296.0).round() as u64;
    (0..n)
        .map(|_| ((r.next_u32() as u64) < thr) as u8 as f64)
        .collect()
}

#[test]
fn bernoulli_and_dropout_masks_are_bit_identical_everywhere() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xD80);
    for case in 0..240 {
        let dtype = if case % 2 == 0 {
            FLOATS[(case / 2) % 4]
        } else {
            DType::ALL[(case / 2) % 6]
        };
        let shape = c.shape(4, 7);
        let n: usize = shape.iter().product();
        let p = [0.0, 0.1, 0.5, 0.9, 1.0, 0.37][c.below(6)];
        let seed = c.next_u64();
        let what = format!("case {case} {dtype} {shape:?} p {p}");
        if !dtype.is_float() || case % 3 == 0 {
            let want = philox_mask(seed, n, p);
            for dev in &devices {
                if dtype == DType::F64 && !dev.info().fp64 {
                    continue;
                }
                let mut g = Generator::new(seed);
                let m = Tensor::bernoulli(p, &shape, dtype, dev, &mut g).unwrap();
                assert_eq!((m.shape(), m.dtype()), (&shape[..], dtype), "{what}");
                assert_eq!(m.to_vec_f64().unwrap(), want, "{what} on {dev}");
                assert_eq!(g.counter(), n.div_ceil(4) as u128, "{what}");
            }
            continue;
        }
        // dropout of a random view: the mask follows the view's row-major order.
        let base = sample(dtype, &shape, case as u64);
        let vseed = c.next_u64();
        let xh = random_view(&base, &mut Cases(vseed));
        let m = xh.numel();
        let mask = philox_mask(seed, m, 1.0 - p);
        let xv = xh.to_vec_f64().unwrap();
        let want_y: Vec<f64> = xv
            .iter()
            .zip(&mask)
            .map(|(x, k)| if *k == 1.0 { x / (1.0 - p) } else { 0.0 })
            .collect();
        let mut host_y = None;
        for dev in &devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let x = random_view(&base.to_device(dev).unwrap(), &mut Cases(vseed));
            let mut g = Generator::new(seed);
            let (y, mk) = x.dropout(p, &mut g).unwrap();
            assert_eq!(g.counter(), m.div_ceil(4) as u128, "{what}");
            assert_eq!((y.shape(), mk.shape()), (xh.shape(), xh.shape()), "{what}");
            assert_eq!(mk.to_vec_f64().unwrap(), mask, "{what} mask on {dev}");
            let yv = y.to_vec_f64().unwrap();
            check_close(
                &yv,
                &want_y,
                tolerance(dtype),
                0.0,
                &format!("{what} y on {dev}"),
            )
            .unwrap();
            // y is bit-identical across devices too (one correctly rounded multiply).
            match &host_y {
                None => host_y = Some(yv),
                Some(h) => assert_eq!(&yv, h, "{what} y on {dev} vs host"),
            }
        }
    }
}

#[test]
fn dropout_keeps_about_one_minus_p_and_checks_arguments() {
    for dev in test_devices().unwrap() {
        let x = Tensor::ones(&[100_000], DType::F32, &dev).unwrap();
        let (y, m) = x.dropout(0.3, &mut Generator::new(5)).unwrap();
        let kept = m.to_vec::<f32>().unwrap().iter().sum::<f32>() / 100_000.0;
        assert!((kept - 0.7).abs() < 0.01, "{dev}: kept {kept}");
        let mean = y.to_vec::<f32>().unwrap().iter().sum::<f32>() / 100_000.0;
        assert!((mean - 1.0).abs() < 0.02, "{dev}: mean {mean}");
        for p in [-0.1, 1.5, f64::NAN] {
            let e = x
                .dropout(p, &mut Generator::new(1))
                .unwrap_err()
                .to_string();
            assert!(e.contains("dropout") && e.contains("[100000]"), "{e}");
            let e = Tensor::bernoulli(p, &[2, 3], DType::F32, &dev, &mut Generator::new(1))
                .unwrap_err()
                .to_string();
            assert!(e.contains("bernoulli") && e.contains("[2, 3]"), "{e}");
        }
        let i = Tensor::zeros(&[4], DType::I32, &dev).unwrap();
        let e = i
            .dropout(0.5, &mut Generator::new(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("dropout") && e.contains("i32"), "{e}");
        let (y, m) = x.dropout(1.0, &mut Generator::new(2)).unwrap();
        assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        assert!(m.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        let (y, _) = x.dropout(0.0, &mut Generator::new(2)).unwrap();
        assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
    }
}
