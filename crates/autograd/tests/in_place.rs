//! Values written in place between forward and backward are refused (version counters), and integer leaves have no gradient.
use netcl_autograd::{Parameter, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_ops::{fused_into, DType, Device, Expr, Tensor};

fn t(dev: &Device, v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), shape, dev).unwrap()
}

#[test]
fn a_parameter_assigned_between_forward_and_backward_is_refused() {
    for dev in test_devices().unwrap() {
        // y = sum(x * x): dy/dx = 2x = [2, 2]; after x := [50, 50] backward would give [100, 100].
        let x = Parameter::new(t(&dev, &[1.0, 1.0], &[2])).unwrap();
        let tape = Tape::new();
        let xv = tape.param(&x);
        let y = xv.mul(&xv).unwrap().sum_all().unwrap();
        x.assign(&t(&dev, &[50.0, 50.0], &[2])).unwrap();
        let err = tape.backward(&y).unwrap_err().to_string();
        assert!(err.contains("modified in place"), "{dev}: {err}");
        assert!(err.contains("mul"), "names the op: {err}");
        assert!(x.grad().is_none(), "{dev}: no gradient was written");

        // Unchanged values: the same graph shape gives [2, 2].
        x.assign(&t(&dev, &[1.0, 1.0], &[2])).unwrap();
        let tape = Tape::new();
        let xv = tape.param(&x);
        let y = xv.mul(&xv).unwrap().sum_all().unwrap();
        tape.backward(&y).unwrap();
        assert_eq!(x.grad().unwrap().to_vec_f64().unwrap(), vec![2.0, 2.0]);
    }
}

#[test]
fn an_in_place_update_of_a_saved_constant_is_refused() {
    for dev in test_devices().unwrap() {
        // An optimizer-style in-place update (fused_into) of a constant input that matmul saved.
        let w = Parameter::new(t(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])).unwrap();
        let x = t(&dev, &[1.0, 0.0, 0.0, 1.0], &[2, 2]);
        let tape = Tape::new();
        let y = Var::from(&x)
            .matmul(&tape.param(&w))
            .unwrap()
            .sum_all()
            .unwrap();
        fused_into(&[&x], &[(Expr::input(0) * 3.0, &x)]).unwrap();
        let err = tape.backward(&y).unwrap_err().to_string();
        assert!(
            err.contains("input 0 of matmul") && err.contains("version 0, now 1"),
            "{dev}: {err}"
        );
        assert!(w.grad().is_none());
    }
}

#[test]
fn writes_after_backward_or_to_unrelated_tensors_are_fine() {
    for dev in test_devices().unwrap() {
        let w = Parameter::new(t(&dev, &[1.0, 2.0], &[2])).unwrap();
        let unrelated = t(&dev, &[0.0, 0.0], &[2]);
        let tape = Tape::new();
        let y = tape.param(&w).exp().unwrap().sum_all().unwrap();
        fused_into(&[&unrelated], &[(Expr::input(0) + 1.0, &unrelated)]).unwrap();
        tape.backward(&y).unwrap();
        // The usual loop: backward, then the in-place step, then the next forward.
        w.assign(&t(&dev, &[0.0, 0.0], &[2])).unwrap();
        let g = w.grad().unwrap().to_vec_f64().unwrap();
        assert!((g[0] - 1f64.exp()).abs() < 1e-6 && (g[1] - 2f64.exp()).abs() < 1e-5);
    }
}

#[test]
fn integer_leaves_have_no_gradient() {
    for dev in test_devices().unwrap() {
        let ids = Tensor::from_vec(vec![1i32, 2], &[2], &dev).unwrap();
        let err = Tape::new().leaf(&ids).unwrap_err().to_string();
        assert!(
            err.contains("i32") && err.contains("floating-point"),
            "{err}"
        );
        let f = ids.to_dtype(DType::F32).unwrap();
        assert!(Tape::new().leaf(&f).unwrap().is_tracked());
    }
}
