//! Unary, binary, comparison, where, cast and fused elementwise ops on every device against the host evaluator.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, random_view, tolerance, Cases};
use netcl_ops::{fused, fused_into, BinaryOp, DType, Device, Error, Expr, Tensor, UnaryOp};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn supports(dev: &Device, dtype: DType) -> bool {
    dtype != DType::F64 || dev.info().fp64
}

/// Input range where `op` is defined and well conditioned.
fn domain(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal => (0.25, 4.0),
        _ => (-4.0, 4.0),
    }
}

/// Compares a device result with the host's; `tol` relative to `|want| + 1`.
fn compare(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    check_close(&g, &w, tol, 1.0, what).unwrap();
}

#[test]
fn unary_ops_match_the_host_over_views() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x0A11_u64);
    let mut cases = 0;
    for (k, &op) in UnaryOp::ALL.iter().enumerate() {
        // Integer tensors: float-only ops are dtype errors on every device.
        for dtype in FLOATS.into_iter().chain([DType::I32, DType::U32]) {
            for rep in 0..3 {
                let shape = if rep == 0 { vec![257] } else { c.shape(4, 6) };
                let (lo, hi) = domain(op);
                let (lo, hi) = if dtype.is_float() {
                    (lo, hi)
                } else {
                    (-50.0, 50.0)
                };
                let seed = (k * 100 + rep) as u64;
                let base = random_tensor(dtype, &shape, lo, hi, seed);
                let vseed = c.next_u64();
                let want = random_view(&base, &mut Cases(vseed)).unary(op);
                for dev in devices.iter().filter(|d| supports(d, dtype)) {
                    let v = random_view(&base.to_device(dev).unwrap(), &mut Cases(vseed));
                    let got = v.unary(op);
                    let what = format!("{} {dtype} {shape:?} on {dev}", op.name());
                    match (&got, &want) {
                        (Ok(g), Ok(w)) => compare(g, w, tolerance(dtype), &what),
                        (Err(Error::DType { .. }), Err(Error::DType { .. })) => {
                            assert!(!dtype.is_float(), "{what}: {got:?}")
                        }
                        _ => panic!("{what}: {got:?} vs host {want:?}"),
                    }
                    cases += 1;
                }
            }
        }
    }
    assert!(cases >= 300, "{cases} cases");
}

#[test]
fn binary_ops_and_comparisons_match_the_host() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xB1AA);
    for case in 0..260 {
        let op = BinaryOp::ALL[case % BinaryOp::ALL.len()];
        let dtype = DType::ALL[(case / BinaryOp::ALL.len()) % DType::ALL.len()];
        let shape = c.shape(4, 5);
        let mut bshape: Vec<usize> = shape
            .iter()
            .map(|&n| if c.below(3) == 0 { 1 } else { n })
            .collect();
        bshape.drain(..c.below(bshape.len()));
        let (lo, hi) = match (op, dtype.is_float()) {
            (BinaryOp::Pow, _) => (0.5, 2.0),
            (_, true) => (-3.0, 3.0),
            (_, false) => (1.0, 40.0),
        };
        // Small integer-valued floats make comparisons meet equal operands.
        let round = |t: Tensor| {
            if matches!(
                op,
                BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Le | BinaryOp::Ge
            ) {
                t.floor().unwrap_or(t)
            } else {
                t
            }
        };
        let a = round(random_tensor(dtype, &shape, lo, hi, case as u64 + 1));
        let b = round(random_tensor(dtype, &bshape, lo, hi, case as u64 + 500));
        let vseed = c.next_u64();
        let want = random_view(&a, &mut Cases(vseed)).binary(&b, op);
        for dev in devices.iter().filter(|d| supports(d, dtype)) {
            let av = random_view(&a.to_device(dev).unwrap(), &mut Cases(vseed));
            let got = av.binary(&b.to_device(dev).unwrap(), op);
            let what = format!(
                "case {case} {} {dtype} {shape:?} {bshape:?} on {dev}",
                op.name()
            );
            match (&got, &want) {
                (Ok(g), Ok(w)) => compare(g, w, tolerance(dtype) * 4.0, &what),
                (Err(_), Err(_)) => {}
                _ => panic!("{what}: {got:?} vs host {want:?}"),
            }
        }
    }
}

#[test]
fn scalar_forms_where_and_masked_fill() {
    for dev in test_devices().unwrap() {
        let x = Tensor::from_vec(vec![-2.0f32, -0.5, 0.0, 1.5, 3.0], &[5], &dev).unwrap();
        let v = |t: Result<Tensor, Error>| t.unwrap().to_vec::<f32>().unwrap();
        assert_eq!(v(x.add_scalar(1.0)), [-1.0, 0.5, 1.0, 2.5, 4.0]);
        assert_eq!(v(x.mul_scalar(-2.0)), [4.0, 1.0, -0.0, -3.0, -6.0]);
        assert_eq!(v(x.gt_scalar(0.0)), [0.0, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(v(x.clamp(-1.0, 2.0)), [-1.0, -0.5, 0.0, 1.5, 2.0]);
        assert_eq!(v(x.leaky_relu(0.1)), [-0.2, -0.05, 0.0, 1.5, 3.0]);
        assert_eq!(v(x.relu()), [0.0, 0.0, 0.0, 1.5, 3.0]);
        assert_eq!(
            v(x.maximum_scalar(f64::NAN))
                .iter()
                .filter(|x| x.is_nan())
                .count(),
            5
        );
        let m = Tensor::from_vec(vec![1u32, 0, 0, 1, 0], &[5], &dev).unwrap();
        assert_eq!(v(x.masked_fill(&m, -9.0)), [-9.0, -0.5, 0.0, -9.0, 3.0]);
        let y = Tensor::full(&[5], 7.0, DType::F32, &dev).unwrap();
        assert_eq!(v(Tensor::select(&m, &y, &x)), [7.0, -0.5, 0.0, 7.0, 3.0]);
        // A column mask broadcasts over rows.
        let grid = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev)
            .unwrap()
            .reshape(&[2, 3])
            .unwrap();
        let col = Tensor::from_vec(vec![0.0f32, 1.0, 0.0], &[3], &dev).unwrap();
        assert_eq!(
            v(grid.masked_fill(&col, 0.5)),
            [0.0, 0.5, 2.0, 3.0, 0.5, 5.0]
        );
        assert!(
            col.masked_fill(&grid, 1.0).is_err(),
            "the mask may not grow the tensor"
        );
        let i = Tensor::from_vec(vec![7i32, -7, 3], &[3], &dev).unwrap();
        assert_eq!(
            i.div_scalar(2.0).unwrap().to_vec::<i32>().unwrap(),
            [3, -3, 1]
        );
        assert_eq!(i.abs().unwrap().to_vec::<i32>().unwrap(), [7, 7, 3]);
        let big = Tensor::from_vec(vec![65536i32, -3], &[2], &dev).unwrap();
        assert_eq!(
            big.mul(&big).unwrap().to_vec::<i32>().unwrap(),
            [0, 9],
            "integer products wrap"
        );
    }
}

#[test]
fn casts_between_all_dtypes_match_the_host() {
    let devices = test_devices().unwrap();
    let special = [
        0.0,
        -0.0,
        1.5,
        -2.5,
        1e10,
        -1e10,
        65504.0,
        70000.0,
        3.3e-5,
        f64::NAN,
    ];
    for from in DType::ALL {
        for to in DType::ALL {
            let (lo, hi) = if from == DType::U32 {
                (0.0, 300.0)
            } else {
                (-300.0, 300.0)
            };
            let mut vals = random_tensor(from, &[300], lo, hi, 7).to_vec_f64().unwrap();
            if from.is_float() {
                vals.extend(special);
            }
            let n = vals.len();
            let x = netcl_ops::testing::host_tensor(from, &vals, &[n]);
            let want = x.to_dtype(to).unwrap();
            assert_eq!(want.dtype(), to);
            for dev in devices
                .iter()
                .filter(|d| supports(d, from) && supports(d, to))
            {
                let got = x.to_device(dev).unwrap().to_dtype(to).unwrap();
                let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
                for (j, (a, b)) in g.iter().zip(&w).enumerate() {
                    assert!(
                        a == b || (a.is_nan() && b.is_nan()),
                        "{from}->{to} on {dev}: {} gave {a}, host {b}",
                        vals[j]
                    );
                }
            }
        }
    }
    let h = Device::host();
    let f = Tensor::from_vec(vec![1e10f32, -1e10, f32::NAN, -3.7, 2.9], &[5], &h).unwrap();
    assert_eq!(
        f.to_dtype(DType::I32).unwrap().to_vec::<i32>().unwrap(),
        [i32::MAX, i32::MIN, 0, -3, 2]
    );
    assert_eq!(
        f.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        [u32::MAX, 0, 0, 0, 2]
    );
}

#[test]
fn fused_expressions_match_the_host_and_reuse_kernels() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xF05E);
    for case in 0..60 {
        let dtype = FLOATS[case % 4];
        let rows = 1 + c.below(40);
        let cols = 1 + c.below(70);
        let x = random_tensor(dtype, &[rows, cols], -3.0, 3.0, case as u64);
        let b = random_tensor(dtype, &[cols], -1.0, 1.0, case as u64 + 1);
        let g = random_tensor(dtype, &[rows, cols], -1.0, 1.0, case as u64 + 2);
        let slope = c.uniform(0.01, 0.3);
        // bias + activation, and the activation's gradient mask, in one kernel.
        let z = Expr::input(0) + Expr::input(1);
        let exprs = [
            z.clone().gelu_tanh(),
            Expr::input(2) * Expr::select(z.clone().gt(0.0), 1.0, slope),
            (z * 0.5).exp().cast(DType::F32),
        ];
        let want = fused(&[&x, &b, &g], &exprs).unwrap();
        for dev in devices.iter().filter(|d| supports(d, dtype)) {
            let (xd, bd, gd) = (
                x.to_device(dev).unwrap(),
                b.to_device(dev).unwrap(),
                g.to_device(dev).unwrap(),
            );
            let xv = xd
                .transpose(0, 1)
                .unwrap()
                .contiguous()
                .unwrap()
                .transpose(0, 1)
                .unwrap();
            let got = fused(&[&xv, &bd, &gd], &exprs).unwrap();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = if k == 2 {
                    tolerance(DType::F32).max(tolerance(dtype))
                } else {
                    tolerance(dtype)
                };
                compare(
                    g,
                    w,
                    tol * 4.0,
                    &format!("case {case} output {k} {dtype} on {dev}"),
                );
            }
            let again = fused(&[&xv, &bd, &gd], &exprs).unwrap();
            for (a, g) in again.iter().zip(&got) {
                assert_eq!(
                    a.to_host_data().unwrap(),
                    g.to_host_data().unwrap(),
                    "bit-identical rerun"
                );
            }
        }
    }
}

#[test]
fn fused_into_updates_in_place_like_an_optimizer_step() {
    for dev in test_devices().unwrap() {
        let p = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[4], &dev).unwrap();
        let m = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let grad = Tensor::from_vec(vec![0.1f32, -0.2, 0.3, 0.0], &[4], &dev).unwrap();
        let (param, mom, g) = (Expr::input(0), Expr::input(1), Expr::input(2));
        let new_m = mom * 0.9 + g;
        for step in 0..3 {
            let lr = 0.1 * (step + 1) as f64;
            fused_into(
                &[&p, &m, &grad],
                &[
                    (new_m.clone(), &m),
                    (param.clone() - new_m.clone() * lr, &p),
                ],
            )
            .unwrap();
        }
        // m: 0.1g, 0.19g, 0.271g; p -= lr_t * m_t.
        let mv = m.to_vec::<f32>().unwrap();
        let pv = p.to_vec::<f32>().unwrap();
        let gv = [0.1f64, -0.2, 0.3, 0.0];
        let p0 = [1.0f64, -2.0, 3.0, 0.5];
        for i in 0..4 {
            let (m1, m2, m3) = (gv[i], 1.9 * gv[i], 2.71 * gv[i]);
            assert!((mv[i] as f64 - m3).abs() < 1e-6, "{dev} m[{i}]");
            let want = p0[i] - 0.1 * m1 - 0.2 * m2 - 0.3 * m3;
            assert!(
                (pv[i] as f64 - want).abs() < 1e-5,
                "{dev} p[{i}] {} vs {want}",
                pv[i]
            );
        }
        // Strided destinations work; destinations that alias inputs at other elements do not.
        let grid = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        let col = grid.narrow(1, 1, 1).unwrap();
        let ones = Tensor::ones(&[3, 1], DType::F32, &dev).unwrap();
        fused_into(&[&ones], &[(Expr::input(0) * 5.0, &col)]).unwrap();
        assert_eq!(
            grid.to_vec::<f32>().unwrap(),
            [0., 5., 0., 0., 0., 5., 0., 0., 0., 5., 0., 0.]
        );
        let t = grid.transpose(0, 1).unwrap();
        let err = fused_into(
            &[&t],
            &[(
                Expr::input(0),
                &grid.narrow(0, 0, 3).unwrap().narrow(1, 0, 3).unwrap(),
            )],
        );
        assert!(err.is_err());
        // Two destinations in one buffer: disjoint halves of the last dim are written by one
        // kernel; views that meet are an error.
        let both = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        let (left, right) = (both.narrow(1, 0, 2).unwrap(), both.narrow(1, 2, 2).unwrap());
        let x =
            Tensor::from_vec((0..6).map(|i| i as f32).collect::<Vec<_>>(), &[3, 2], &dev).unwrap();
        let (a, b) = (Expr::input(0) + 1.0, Expr::input(0) * 2.0);
        fused_into(&[&x], &[(a.clone(), &left), (b.clone(), &right)]).unwrap();
        assert_eq!(
            both.to_vec::<f32>().unwrap(),
            [1., 2., 0., 2., 3., 4., 4., 6., 5., 6., 8., 10.],
            "{dev}"
        );
        let middle = both.narrow(1, 1, 2).unwrap();
        let err = fused_into(&[&x], &[(a, &left), (b, &middle)]).unwrap_err();
        assert!(err.to_string().contains("share storage"), "{err}");
    }
}

#[test]
fn bad_elementwise_input_is_an_error_naming_the_op() {
    let devices = test_devices().unwrap();
    for dev in &devices {
        let f = Tensor::zeros(&[3, 2], DType::F32, dev).unwrap();
        let h = Tensor::zeros(&[3, 2], DType::F16, dev).unwrap();
        let i = Tensor::zeros(&[3, 2], DType::I32, dev).unwrap();
        let e = f.maximum(&h).unwrap_err();
        assert!(
            matches!(e, Error::DType { .. }) && e.to_string().contains("maximum"),
            "{e}"
        );
        let e = i.exp().unwrap_err();
        assert!(
            e.to_string().contains("exp") && e.to_string().contains("i32"),
            "{e}"
        );
        let e = i.pow(&i).unwrap_err();
        assert!(e.to_string().contains("pow"), "{e}");
        let e = f
            .ge(&Tensor::zeros(&[4, 2], DType::F32, dev).unwrap())
            .unwrap_err();
        assert!(
            e.to_string().contains("[3, 2]") && e.to_string().contains("[4, 2]"),
            "{e}"
        );
        let e = fused(&[&f], &[Expr::scalar(1.0) + 2.0]).unwrap_err();
        assert!(e.to_string().contains("scalars only"), "{e}");
        let e = fused(&[&f], &[Expr::input(1)]).unwrap_err();
        assert!(e.to_string().contains("input 1"), "{e}");
        let wrong = Tensor::zeros(&[2], DType::F32, dev).unwrap();
        assert!(fused_into(&[&f], &[(Expr::input(0), &wrong)]).is_err());
        let bcast = Tensor::zeros(&[2], DType::F32, dev)
            .unwrap()
            .broadcast_to(&[3, 2])
            .unwrap();
        assert!(fused_into(&[&f], &[(Expr::input(0), &bcast)]).is_err());
        if !dev.is_host() {
            let e = f
                .add(&Tensor::zeros(&[3, 2], DType::F32, &Device::host()).unwrap())
                .unwrap_err();
            assert!(matches!(e, Error::Device { .. }), "{e}");
        }
    }
}

#[test]
fn empty_tensors_pass_through() {
    for dev in test_devices().unwrap() {
        let e = Tensor::zeros(&[0, 3], DType::F32, &dev).unwrap();
        let r = e.exp().unwrap();
        assert_eq!(r.shape(), &[0, 3]);
        let b = Tensor::ones(&[3], DType::F32, &dev).unwrap();
        assert_eq!(e.add(&b).unwrap().shape(), &[0, 3]);
    }
}

/// Dense operands at every length mod 8, small lengths and offsets that are and are not
/// multiples of 4 and 8 (the 8-wide form of 16-bit operands, the 4-wide and 1-wide
/// `fused_contig` forms), 0-dim scalar tensors broadcast,
/// and in-place updates of a narrowed view that leave its neighbours alone.
#[test]
fn fused_dense_lengths_offsets_scalars_and_in_place() {
    let devices = test_devices().unwrap();
    let lengths = (1..=9).chain([12, 13, 14, 15, 16, 17, 1021, 1024, 1026, 1027]);
    let mut cases = 0;
    for (li, n) in lengths.enumerate() {
        for (di, dtype) in DType::ALL.into_iter().enumerate() {
            let (lo, hi) = if dtype.is_float() {
                (-3.0, 3.0)
            } else {
                (0.0, 50.0)
            };
            let seed = (li * 100 + di * 10) as u64;
            let a = random_tensor(dtype, &[n + 16], lo, hi, seed);
            let b = random_tensor(dtype, &[n + 16], lo, hi, seed + 1);
            let s = random_tensor(dtype, &[], lo, hi, seed + 2);
            let (x, y, z) = (Expr::input(0), Expr::input(1), Expr::input(2));
            // Dense operands only (the contiguous kernel), then with a 0-dim tensor broadcast.
            let exprs = [
                x.clone() * y.clone() + x.clone() * 2.0,
                (y.clone() + 1.0).cast(DType::F32),
            ];
            let scaled = [x.clone() * z.clone() + y.clone()];
            let other = if dtype == DType::F32 {
                DType::F64
            } else {
                dtype
            };
            for (oa, ob) in [(0, 0), (8, 16), (4, 8), (1, 1), (0, 3), (2, 4), (3, 5)] {
                let host_in = (a.narrow(0, oa, n).unwrap(), b.narrow(0, ob, n).unwrap());
                let want = fused(&[&host_in.0, &host_in.1], &exprs).unwrap();
                let want_scaled = fused(&[&host_in.0, &host_in.1, &s], &scaled).unwrap();
                // In place: a's view += b's view * 3.
                let upd = x.clone() + y.clone() * 3.0;
                // Fresh copies: in-place updates must not reach `a` (shared on the host device).
                let fresh_a = || random_tensor(dtype, &[n + 16], lo, hi, seed);
                let host_a = fresh_a();
                let host_view = host_a.narrow(0, oa, n).unwrap();
                fused_into(&[&host_view, &host_in.1], &[(upd.clone(), &host_view)]).unwrap();
                for dev in devices
                    .iter()
                    .filter(|d| supports(d, dtype) && supports(d, other))
                {
                    let (ad, bd, sd) = (
                        fresh_a().to_device(dev).unwrap(),
                        b.to_device(dev).unwrap(),
                        s.to_device(dev).unwrap(),
                    );
                    let (av, bv) = (ad.narrow(0, oa, n).unwrap(), bd.narrow(0, ob, n).unwrap());
                    let got = fused(&[&av, &bv], &exprs).unwrap();
                    let got_scaled = fused(&[&av, &bv, &sd], &scaled).unwrap();
                    let outputs = got.iter().chain(&got_scaled);
                    for (k, (g, w)) in outputs.zip(want.iter().chain(&want_scaled)).enumerate() {
                        let what = format!("n {n} {dtype} offsets {oa},{ob} output {k} on {dev}");
                        compare(g, w, tolerance(dtype) * 4.0, &what);
                    }
                    fused_into(&[&av, &bv], &[(upd.clone(), &av)]).unwrap();
                    let what = format!("in place n {n} {dtype} offset {oa} on {dev}");
                    compare(&ad, &host_a, tolerance(dtype) * 4.0, &what);
                    cases += 1;
                }
            }
        }
    }
    assert!(cases >= 19 * 6 * 7, "{cases} cases");
}

#[test]
fn integer_division_by_zero_is_zero_on_every_device() {
    for dev in test_devices().unwrap() {
        let a = Tensor::from_vec(vec![7i32, -7, 5, i32::MIN, 0], &[5], &dev).unwrap();
        let b = Tensor::from_vec(vec![0i32, 0, 2, -1, 0], &[5], &dev).unwrap();
        assert_eq!(
            a.div(&b).unwrap().to_vec::<i32>().unwrap(),
            vec![0, 0, 2, i32::MIN, 0],
            "{dev}"
        );
        let a = Tensor::from_vec(vec![7u32, 3], &[2], &dev).unwrap();
        let b = Tensor::from_vec(vec![0u32, 2], &[2], &dev).unwrap();
        assert_eq!(
            a.div(&b).unwrap().to_vec::<u32>().unwrap(),
            vec![0, 1],
            "{dev}"
        );
    }
}
