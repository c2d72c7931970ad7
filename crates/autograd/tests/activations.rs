//! softplus and mish (rows of the unary-op table): forward on every device against f64 math and the host evaluator, the matmul epilogue, and backward against finite differences.
use netcl_autograd::{gradcheck, GradcheckOptions};
use netcl_core_devices::test_devices;
use netcl_ops::testing::{assert_close, check_close, random_tensor, tolerance};
use netcl_ops::{Activation, DType, Device, Expr, MatmulOptions, Tensor, UnaryOp};

/// softplus in f64 by the other stable form `max(x, 0) + ln(1 + e^-|x|)`, with PyTorch's
/// threshold (beta 1): `x` where `x > 20`.
fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }
}

fn mish(x: f64) -> f64 {
    x * softplus(x).tanh()
}

/// Inputs across the range: large negative (e^x far below 1), around 0, near and past the
/// threshold (where e^x would overflow f32 at 100).
const XS: [f64; 16] = [
    -100.0, -30.0, -12.0, -5.0, -1.0, -0.25, 0.0, 0.125, 0.75, 2.0, 6.0, 15.0, 19.5, 20.5, 40.0,
    100.0,
];

fn float_dtypes(dev: &Device) -> Vec<DType> {
    let mut d = vec![DType::F32];
    if dev.info().fp64 {
        d.push(DType::F64);
    }
    d
}

#[test]
fn softplus_and_mish_match_f64_math_on_every_device() {
    for dev in test_devices().unwrap() {
        for dtype in float_dtypes(&dev) {
            let xs: Vec<f32> = XS.iter().map(|&v| v as f32).collect();
            let x = Tensor::from_vec(xs, &[XS.len()], &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let reference: fn(f64) -> f64 = softplus;
            let cases = [
                ("softplus", reference, x.softplus().unwrap()),
                ("mish", mish, x.mish().unwrap()),
            ];
            for (name, f, got) in cases {
                assert_eq!(got.dtype(), dtype);
                // The inputs are exact in f32, so the f64 values are the reference in both dtypes.
                let want: Vec<f64> = XS.iter().map(|&v| f(v)).collect();
                let got = got.to_vec_f64().unwrap();
                check_close(
                    &got,
                    &want,
                    tolerance(dtype) * 4.0,
                    1e-30,
                    &format!("{name} {dtype} on {dev}"),
                )
                .unwrap();
            }
            // Far below 0, softplus(x) = e^x to relative precision (no cancellation to 0).
            let tiny = x.softplus().unwrap().to_vec_f64().unwrap();
            assert!(
                tiny[2] > 0.0 && (tiny[2] / (-12f64).exp() - 1.0).abs() < 1e-5,
                "{dev}: {tiny:?}"
            );
            // The same values through an expression and through the op's name.
            let e = netcl_ops::fused(
                &[&x],
                &[Expr::input(0).mish() - Expr::input(0).unary(UnaryOp::Mish)],
            )
            .unwrap()
            .remove(0);
            assert!(e.to_vec_f64().unwrap().iter().all(|&v| v == 0.0), "{dev}");
        }
    }
    assert_eq!(UnaryOp::Softplus.name(), "softplus");
    assert_eq!(UnaryOp::Mish.name(), "mish");
}

#[test]
fn devices_match_the_host_evaluator_over_a_wide_range() {
    let devices = test_devices().unwrap();
    for (k, op) in [UnaryOp::Softplus, UnaryOp::Mish].into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            // Strided: every other column of a (9, 14) tensor over [-30, 30].
            let base = random_tensor(dtype, &[9, 14], -30.0, 30.0, 40 + k as u64);
            let want = base.slice(1, 0, 14, 2).unwrap().unary(op).unwrap();
            for dev in devices
                .iter()
                .filter(|d| dtype != DType::F64 || d.info().fp64)
            {
                let v = base.to_device(dev).unwrap().slice(1, 0, 14, 2).unwrap();
                let what = format!("{} {dtype} on {dev}", op.name());
                assert_close(&v.unary(op).unwrap(), &want, tolerance(dtype), 1.0, &what);
            }
        }
        // Integer tensors are a dtype error (float-only rows).
        let ints = Tensor::from_vec(vec![1i32, -2], &[2], &Device::host()).unwrap();
        assert!(ints.unary(op).is_err());
    }
}

#[test]
fn epilogue_equals_the_op_after_the_product() {
    for dev in test_devices().unwrap() {
        let a = random_tensor(DType::F32, &[13, 9], -2.0, 2.0, 5)
            .to_device(&dev)
            .unwrap();
        let b = random_tensor(DType::F32, &[9, 11], -2.0, 2.0, 6)
            .to_device(&dev)
            .unwrap();
        let bias = random_tensor(DType::F32, &[11], -1.0, 1.0, 7)
            .to_device(&dev)
            .unwrap();
        for (act, op) in [
            (Activation::Softplus, UnaryOp::Softplus),
            (Activation::Mish, UnaryOp::Mish),
        ] {
            assert_eq!(Activation::new(op).unwrap(), act);
            let opts = MatmulOptions {
                bias: Some(&bias),
                activation: act,
                ..Default::default()
            };
            let got = a.matmul_with(&b, opts).unwrap();
            let want = a.matmul(&b).unwrap().add(&bias).unwrap().unary(op).unwrap();
            assert_close(&got, &want, 1e-5, 1.0, &format!("{act:?} on {dev}"));
        }
    }
}

#[test]
fn backward_matches_finite_differences() {
    let opts = GradcheckOptions {
        max_elements: 12,
        ..Default::default()
    };
    for dev in test_devices().unwrap() {
        // Clear of the threshold's 2e-9 step at 20 (finite differences would see it).
        let vals = [
            -25.0, -6.0, -2.5, -1.0, -0.3, 0.2, 0.9, 1.7, 3.0, 8.0, 18.0, 23.0,
        ];
        let x = Tensor::from_vec(vals.to_vec(), &[3, 4], &dev).unwrap();
        for op in [UnaryOp::Softplus, UnaryOp::Mish] {
            let r = gradcheck(|v| v[0].unary(op), std::slice::from_ref(&x), opts)
                .unwrap_or_else(|e| panic!("{} on {dev}: {e}", op.name()));
            assert_eq!(r.checked, 12, "{} on {dev}", op.name());
        }
        let r = gradcheck(
            |v| v[0].softplus()?.mul(&v[0].mish()?),
            std::slice::from_ref(&x),
            opts,
        )
        .unwrap();
        assert_eq!(r.checked, 12, "{dev}");
        // The derivatives themselves: sigmoid(x), and tanh(sp) + x sech²(sp) sigmoid(x).
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let dmish = |v: f64| {
            let t = softplus(v).tanh();
            t + v * (1.0 - t * t) * sig(v)
        };
        for (op, d) in [
            (UnaryOp::Softplus, &sig as &dyn Fn(f64) -> f64),
            (UnaryOp::Mish, &dmish),
        ] {
            let g = netcl_ops::fused(
                &[
                    &x,
                    &x.unary(op).unwrap(),
                    &Tensor::ones(&[3, 4], DType::F64, &dev).unwrap(),
                ],
                &[op.grad().unwrap()],
            )
            .unwrap()
            .remove(0)
            .to_vec_f64()
            .unwrap();
            let want: Vec<f64> = vals.iter().map(|&v| d(v)).collect();
            check_close(&g, &want, 1e-5, 1.0, &format!("d{} on {dev}", op.name())).unwrap();
        }
    }
}
