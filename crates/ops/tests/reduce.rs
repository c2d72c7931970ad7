//! Reductions (sum, mean, max, min, argmax, argmin, var, logsumexp) on every device against the host reference.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, dtypes_for, random_tensor, random_view, tolerance, Cases};
use netcl_ops::{DType, Device, ReduceOp, Tensor};

const OPS: [ReduceOp; 9] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
    ReduceOp::Var { correction: 1.0 },
    ReduceOp::Var { correction: 0.0 },
    ReduceOp::LogSumExp,
];

fn float_only(op: ReduceOp) -> bool {
    matches!(
        op,
        ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::LogSumExp
    )
}

/// Values for a case: integers in 0..20 for integer dtypes, else uniform in [-2, 2).
fn values(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    if dtype.is_float() {
        random_tensor(dtype, shape, -2.0, 2.0, seed)
    } else {
        random_tensor(dtype, shape, 0.0, 20.0, seed)
    }
}

/// Independent f64 reference of one reduction over `axes` of a host tensor (row-major walk).
fn reference(op: ReduceOp, t: &Tensor, axes: &[usize]) -> Vec<f64> {
    let x = t.to_vec_f64().unwrap();
    let shape = t.shape();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let mut red: Vec<usize> = axes.to_vec();
    red.sort();
    let nout: usize = kept.iter().map(|&d| shape[d]).product();
    let nred: usize = red.iter().map(|&d| shape[d]).product();
    let strides = netcl_ops::layout::contiguous_strides(shape);
    let offset = |dims: &[usize], mut i: usize| -> usize {
        let mut off = 0;
        for &d in dims.iter().rev() {
            off += (i % shape[d]) * strides[d];
            i /= shape[d];
        }
        off
    };
    (0..nout)
        .map(|o| {
            let base = offset(&kept, o);
            let row: Vec<f64> = (0..nred).map(|r| x[base + offset(&red, r)]).collect();
            let n = row.len() as f64;
            match op {
                ReduceOp::Sum => row.iter().sum(),
                ReduceOp::Mean => row.iter().sum::<f64>() / n,
                ReduceOp::Max => row.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => row.iter().cloned().fold(f64::INFINITY, f64::min),
                ReduceOp::ArgMax => {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    row.iter().position(|&v| v == m).unwrap() as f64
                }
                ReduceOp::ArgMin => {
                    let m = row.iter().cloned().fold(f64::INFINITY, f64::min);
                    row.iter().position(|&v| v == m).unwrap() as f64
                }
                ReduceOp::Var { correction } => {
                    let mean = row.iter().sum::<f64>() / n;
                    row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - correction).max(0.0)
                }
                ReduceOp::LogSumExp => {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    if m.is_infinite() {
                        m
                    } else {
                        m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                    }
                }
            }
        })
        .collect()
}

fn tol_and_scale(op: ReduceOp, dtype: DType, nred: usize) -> (f64, f64) {
    let tol = tolerance(dtype);
    let scale = match op {
        ReduceOp::Sum => 2.0 * (nred as f64).sqrt().max(1.0),
        ReduceOp::Var { .. } => 4.0,
        _ => 2.0,
    };
    (tol, scale)
}

/// Checks one case on every device: the host op against the independent reference, each device
/// against the host op. Returns the number of (device, case) checks.
#[allow(clippy::too_many_arguments)]
fn check_case(
    devices: &[Device],
    op: ReduceOp,
    dtype: DType,
    shape: &[usize],
    axes: Option<&[usize]>,
    keepdim: bool,
    view_seed: Option<u64>,
    seed: u64,
) -> usize {
    let host = values(dtype, shape, seed);
    let view = |t: &Tensor| match view_seed {
        Some(s) => random_view(t, &mut Cases(s)),
        None => t.clone(),
    };
    let hv = view(&host);
    let all: Vec<usize> = (0..hv.ndim()).collect();
    let axes_v = axes.unwrap_or(&all);
    let run = |t: &Tensor| match axes {
        Some(a) => t.reduce(op, a, keepdim),
        None => t.reduce_all(op),
    };
    let what = format!(
        "{} {dtype} shape {:?} view {:?} axes {axes:?} keepdim {keepdim}",
        op.name(),
        hv.shape(),
        hv.strides()
    );
    let nred: usize = axes_v.iter().map(|&d| hv.shape()[d]).product();
    let empty_arg = nred == 0
        && matches!(
            op,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
        );
    let want = match run(&hv) {
        Ok(w) => w,
        Err(e) => {
            assert!(empty_arg, "{what}: unexpected error {e}");
            let msg = e.to_string();
            assert!(
                msg.contains(op.name()) && msg.contains(&format!("{:?}", hv.shape())),
                "{msg}"
            );
            for dev in devices {
                assert!(
                    run(&view(&host.to_device(dev).unwrap())).is_err(),
                    "{what} on {dev}"
                );
            }
            return devices.len();
        }
    };
    assert!(!empty_arg, "{what}: expected an error");
    let (tol, scale) = tol_and_scale(op, dtype, nred);
    let w = want.to_vec_f64().unwrap();
    let contiguous = hv.contiguous().unwrap();
    let r = reference(op, &contiguous, axes_v);
    if let Err(m) = check_close(&w, &r, tol, scale, &format!("host vs reference: {what}")) {
        panic!("{m}");
    }
    for dev in devices {
        let got = run(&view(&host.to_device(dev).unwrap())).unwrap();
        assert_eq!(got.shape(), want.shape(), "{what} on {dev}");
        assert_eq!(got.dtype(), want.dtype(), "{what} on {dev}");
        assert_eq!(got.device(), dev);
        let g = got.to_vec_f64().unwrap();
        if let Err(m) = check_close(&g, &w, tol, scale, &format!("{what} on {dev}")) {
            panic!("{m}");
        }
    }
    devices.len()
}

#[test]
fn random_reductions_match_the_host() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x5EED_0001);
    let mut cases = 0;
    for case in 0..700u64 {
        let shape = c.shape(4, 9);
        let dev_dtypes = dtypes_for(devices.last().unwrap());
        let dtype = dev_dtypes[c.below(dev_dtypes.len())];
        let op = OPS[c.below(OPS.len())];
        if float_only(op) && !dtype.is_float() {
            continue;
        }
        let nd = shape.len();
        let axes: Vec<usize> = (0..nd).filter(|_| c.below(2) == 0).collect();
        let keepdim = c.below(2) == 0;
        let view_seed = (c.below(3) != 0).then(|| c.next_u64());
        let all = c.below(8) == 0;
        check_case(
            &devices,
            op,
            dtype,
            &shape,
            if all { None } else { Some(&axes) },
            keepdim,
            view_seed,
            case,
        );
        cases += 1;
    }
    assert!(cases >= 500, "{cases} cases");
}

#[test]
fn awkward_extents_and_large_reductions() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(77);
    let shapes: [(&[usize], &[usize]); 15] = [
        // Column sums of a bias gradient: on CPU devices a work-item per output.
        (&[300, 100], &[0]),
        // A convolution's bias gradient (N, H, W of NCHW; CPU devices sum the H x W runs first),
        // dense and through a view.
        (&[6, 3, 9, 8], &[0, 2, 3]),
        (&[5, 4, 10, 7], &[0, 2, 3]),
        (&[1], &[0]),
        (&[255], &[0]),
        (&[257], &[0]),
        (&[4097], &[0]),
        (&[3, 4097], &[1]),
        (&[4097, 3], &[0]),
        (&[5000, 2], &[0]),
        (&[2, 300, 17], &[0, 2]),
        (&[70001], &[0]),
        (&[2, 33000], &[1]),
        (&[0, 5], &[1]),
        (&[5, 0], &[1]),
    ];
    for (i, (shape, axes)) in shapes.iter().enumerate() {
        for op in OPS {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let view_seed = (i % 2 == 1).then(|| c.next_u64());
                check_case(
                    &devices,
                    op,
                    dtype,
                    shape,
                    Some(axes),
                    i % 3 == 0,
                    view_seed,
                    i as u64,
                );
            }
        }
        for dtype in [DType::I32, DType::U32] {
            check_case(
                &devices,
                ReduceOp::Sum,
                dtype,
                shape,
                Some(axes),
                false,
                None,
                5,
            );
            check_case(
                &devices,
                ReduceOp::Max,
                dtype,
                shape,
                Some(axes),
                false,
                None,
                6,
            );
        }
    }
    for dev in &devices {
        if dev.info().fp64 {
            check_case(
                std::slice::from_ref(dev),
                ReduceOp::Var { correction: 1.0 },
                DType::F64,
                &[3, 50000],
                None,
                false,
                None,
                9,
            );
            check_case(
                std::slice::from_ref(dev),
                ReduceOp::LogSumExp,
                DType::F64,
                &[50000, 2],
                Some(&[0]),
                false,
                None,
                9,
            );
        }
    }
}

#[test]
fn special_values_ties_and_empty() {
    for dev in test_devices().unwrap() {
        let t = |v: Vec<f32>, s: &[usize]| Tensor::from_vec(v, s, &dev).unwrap();
        let x = t(vec![1.0, 3.0, 3.0, -1.0, 2.0, -1.0], &[2, 3]);
        assert_eq!(
            x.argmax(&[1], false).unwrap().to_vec::<i32>().unwrap(),
            vec![1, 1]
        );
        assert_eq!(
            x.argmin(&[1], false).unwrap().to_vec::<i32>().unwrap(),
            vec![0, 0]
        );
        assert_eq!(x.argmax_all().unwrap().to_vec::<i32>().unwrap(), vec![1]);
        assert_eq!(x.argmax(&[0], true).unwrap().shape(), &[1, 3]);
        assert_eq!(x.sum_all().unwrap().shape(), &[] as &[usize]);
        assert_eq!(
            x.sum(&[], false).unwrap().to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap()
        );
        let n = t(vec![1.0, f32::NAN, 5.0, f32::NAN], &[4]);
        assert!(n.max_all().unwrap().to_vec::<f32>().unwrap()[0].is_nan());
        assert!(n.min_all().unwrap().to_vec::<f32>().unwrap()[0].is_nan());
        assert_eq!(n.argmax_all().unwrap().to_vec::<i32>().unwrap(), vec![1]);
        let inf = t(vec![f32::NEG_INFINITY; 3], &[3]);
        assert_eq!(
            inf.logsumexp_all().unwrap().to_vec::<f32>().unwrap(),
            vec![f32::NEG_INFINITY]
        );
        let e = t(vec![], &[0, 4]);
        assert_eq!(
            e.sum(&[0], false).unwrap().to_vec::<f32>().unwrap(),
            vec![0.0; 4]
        );
        assert!(e
            .mean(&[0], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.is_nan()));
        assert_eq!(
            e.logsumexp(&[0], false).unwrap().to_vec::<f32>().unwrap(),
            vec![f32::NEG_INFINITY; 4]
        );
        assert_eq!(e.max(&[1], false).unwrap().shape(), &[0]);
        let one = t(vec![4.0], &[1]);
        assert!(one.var_all(1.0).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
        assert_eq!(
            one.var_all(0.0).unwrap().to_vec::<f32>().unwrap(),
            vec![0.0]
        );
    }
}

#[test]
fn bad_arguments_are_errors_naming_the_op_and_shape() {
    for dev in test_devices().unwrap() {
        let x = Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap();
        for (r, words) in [
            (x.sum(&[2], false), vec!["sum", "axis 2", "[2, 3]"]),
            (x.max(&[1, 1], false), vec!["max", "repeated", "[2, 3]"]),
            (x.var(&[0, 5], 1.0, true), vec!["var", "axis 5", "[2, 3]"]),
        ] {
            let e = r.unwrap_err().to_string();
            assert!(words.iter().all(|w| e.contains(w)), "{e}");
        }
        let i = Tensor::zeros(&[2, 3], DType::I32, &dev).unwrap();
        let e = i.mean_all().unwrap_err().to_string();
        assert!(
            e.contains("mean") && e.contains("[2, 3]") && e.contains("i32"),
            "{e}"
        );
        let e = Tensor::zeros(&[3, 0], DType::F32, &dev)
            .unwrap()
            .argmax(&[1], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("argmax") && e.contains("[3, 0]"), "{e}");
    }
}

#[test]
fn reductions_are_deterministic() {
    for dev in test_devices().unwrap() {
        let x = random_tensor(DType::F32, &[3, 40001], -1.0, 1.0, 11)
            .to_device(&dev)
            .unwrap();
        let xt = x.transpose(0, 1).unwrap();
        for op in [
            ReduceOp::Sum,
            ReduceOp::Var { correction: 1.0 },
            ReduceOp::LogSumExp,
            ReduceOp::ArgMax,
        ] {
            for run in [
                |t: &Tensor, op| t.reduce_all(op),
                |t: &Tensor, op| t.reduce(op, &[1], false),
                |t: &Tensor, op| t.reduce(op, &[0], false),
            ] {
                for t in [&x, &xt] {
                    let a = run(t, op).unwrap().to_host_data().unwrap();
                    let b = run(t, op).unwrap().to_host_data().unwrap();
                    assert_eq!(a.as_bytes(), b.as_bytes(), "{} on {dev}", op.name());
                }
            }
        }
    }
}
