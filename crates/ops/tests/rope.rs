//! Rotary position embeddings (both pairings, offsets and position ids; forward, backward, finite-difference gradient check) on every device.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, random_view, sample, tolerance, Cases};
use netcl_ops::{DType, RopeFreqs, RopePositions, RopeStyle, Tensor};

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

/// Hugging Face's convention in f64: pairs (i, i + Dh/2) of `x` row-major [B, T, H, Dh], at
/// position `pos(b, t)`.
fn naive_rope_halves(
    x: &[f64],
    shape: &[usize],
    pos: impl Fn(usize, usize) -> usize,
    theta: f64,
) -> Vec<f64> {
    let (t_len, h, dh) = (shape[1], shape[2], shape[3]);
    let mut y = x.to_vec();
    for (row, chunk) in y.chunks_mut(dh).enumerate() {
        let (b, t) = (row / (h * t_len), (row / h) % t_len);
        for i in 0..dh / 2 {
            let a = pos(b, t) as f64 * theta.powf(-((2 * i) as f64) / dh as f64);
            let (c, s) = (a.cos(), a.sin());
            let (x0, x1) = (chunk[i], chunk[i + dh / 2]);
            chunk[i] = x0 * c - x1 * s;
            chunk[i + dh / 2] = x0 * s + x1 * c;
        }
    }
    y
}

#[test]
fn rope_halves_and_position_ids_match_naive_references_on_every_device() {
    let shape = [2usize, 5, 3, 8];
    let mut c = Cases::new(0x4A1F);
    let ids: Vec<i32> = (0..10).map(|_| c.below(300) as i32).collect();
    for dtype in [DType::F32, DType::F64] {
        let xh = sample(dtype, &shape, 7);
        let xv = xh.to_vec_f64().unwrap();
        let scale = xv.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        for dev in test_devices().unwrap() {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let x = xh.to_device(&dev).unwrap();
            let tol = tolerance(dtype) * 4.0;
            let per_row = Tensor::from_vec(ids.clone(), &[2, 5], &dev).unwrap();
            let shared = Tensor::from_vec(ids[..5].to_vec(), &[5], &dev).unwrap();
            for (pos, name) in [(&per_row, "[B, T] ids"), (&shared, "[T] ids")] {
                let y = x
                    .rope_with(RopeStyle::Halves, &RopePositions::Ids(pos.clone()), 10000.0)
                    .unwrap();
                let b_rows = pos.shape().len() == 2;
                let want = naive_rope_halves(
                    &xv,
                    &shape,
                    |b, t| ids[if b_rows { b * 5 + t } else { t }] as usize,
                    10000.0,
                );
                check_close(
                    &y.to_vec_f64().unwrap(),
                    &want,
                    tol,
                    scale,
                    &format!("{dev} {dtype} halves {name}"),
                )
                .unwrap();
                // The backward is the inverse rotation.
                let back = y
                    .rope_backward_with(
                        RopeStyle::Halves,
                        &RopePositions::Ids(pos.clone()),
                        10000.0,
                    )
                    .unwrap();
                check_close(
                    &back.to_vec_f64().unwrap(),
                    &xv,
                    tol,
                    scale,
                    &format!("{dev} {dtype} inverse {name}"),
                )
                .unwrap();
            }
            // Ids equal to offset + t give exactly the offset form, in both pairings.
            let offset_ids: Vec<i32> = (0..5).map(|t| 40 + t).collect();
            let pos = RopePositions::Ids(Tensor::from_vec(offset_ids, &[5], &dev).unwrap());
            for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
                let a = x
                    .rope_with(style, &pos, 500.0)
                    .unwrap()
                    .to_vec_f64()
                    .unwrap();
                let b = x
                    .rope_with(style, &RopePositions::Offset(40), 500.0)
                    .unwrap()
                    .to_vec_f64()
                    .unwrap();
                assert_eq!(a, b, "{dev} {dtype} {style:?}");
            }
            let bad = Tensor::from_vec(vec![0i32; 4], &[4], &dev).unwrap();
            let err = x
                .rope_with(RopeStyle::Halves, &RopePositions::Ids(bad), 1e4)
                .unwrap_err()
                .to_string();
            assert!(err.contains("[4]") && err.contains("[B, T]"), "{err}");
        }
    }
}

#[test]
fn a_frequency_table_rotates_by_its_frequencies() {
    let shape = [2usize, 5, 3, 8];
    for dtype in [DType::F32, DType::F64] {
        let xh = sample(dtype, &shape, 11);
        let xv = xh.to_vec_f64().unwrap();
        let scale = xv.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        // Halved frequencies: position p with freq f/2 is position p/2 with f, for even p.
        let half: Vec<f64> = (0..4)
            .map(|i| 0.5 * 500f64.powf(-((2 * i) as f64) / 8.0))
            .collect();
        for dev in test_devices().unwrap() {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let x = xh.to_device(&dev).unwrap();
            let table = Tensor::from_vec(half.clone(), &[4], &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let freqs = RopeFreqs::Table(table);
            let even =
                RopePositions::Ids(Tensor::from_vec(vec![0i32, 2, 4, 6, 8], &[5], &dev).unwrap());
            let y = x.rope_with_freqs(RopeStyle::Halves, &even, &freqs).unwrap();
            let want = x
                .rope_with(RopeStyle::Halves, &RopePositions::Offset(0), 500.0)
                .unwrap();
            let tol = tolerance(dtype) * 4.0;
            check_close(
                &y.to_vec_f64().unwrap(),
                &want.to_vec_f64().unwrap(),
                tol,
                scale,
                &format!("{dev} {dtype}"),
            )
            .unwrap();
            let back = y
                .rope_backward_with_freqs(RopeStyle::Halves, &even, &freqs)
                .unwrap();
            check_close(
                &back.to_vec_f64().unwrap(),
                &xv,
                tol,
                scale,
                &format!("{dev} {dtype} inverse"),
            )
            .unwrap();
            let bad = RopeFreqs::Table(Tensor::zeros(&[3], dtype, &dev).unwrap());
            let e = x
                .rope_with_freqs(RopeStyle::Halves, &even, &bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("[3]") && e.contains("[4]"), "{e}");
        }
    }
}
