//! Tape semantics: parameter gradients accumulate, no_grad records nothing, consumed graphs and misuse give errors.
use netcl_autograd::{Parameter, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_ops::{DType, Device, Tensor};

fn t(dev: &Device, v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), shape, dev).unwrap()
}

#[test]
fn parameter_gradients_accumulate_until_zero_grad() {
    for dev in test_devices().unwrap() {
        let w = Parameter::new(t(&dev, &[1.0, -2.0, 3.0], &[3])).unwrap();
        let x = t(&dev, &[0.5, 4.0, -1.0], &[3]);
        for round in 1..=2 {
            let tape = Tape::new();
            // loss = sum(w * x) + sum(w * w): d/dw = x + 2w
            let wv = tape.param(&w);
            let loss = wv.mul(&Var::from(&x)).unwrap().sum_all().unwrap();
            let loss = loss.add(&wv.mul(&wv).unwrap().sum_all().unwrap()).unwrap();
            tape.backward(&loss).unwrap();
            assert!(tape.is_empty(), "backward frees the graph");
            let g = w.grad().unwrap().to_vec_f64().unwrap();
            let want: Vec<f64> = [(0.5, 1.0), (4.0, -2.0), (-1.0, 3.0)]
                .iter()
                .map(|(x, w)| round as f64 * (x + 2.0 * w))
                .collect();
            assert_eq!(g, want, "{dev} round {round}");
        }
        w.zero_grad();
        assert!(w.grad().is_none());
    }
}

#[test]
fn no_grad_records_nothing() {
    let dev = Device::host();
    let w = Parameter::new(t(&dev, &[1.0, 2.0], &[2])).unwrap();
    let tape = Tape::no_grad();
    let y = tape.param(&w).exp().unwrap().sum_all().unwrap();
    assert!(!y.is_tracked());
    assert!(tape.is_empty());
    let err = tape.backward(&y).unwrap_err().to_string();
    assert!(err.contains("not recorded"), "{err}");
    // A frozen parameter is a constant on a recording tape too.
    w.set_requires_grad(false);
    let tape = Tape::new();
    assert!(!tape.param(&w).is_tracked());
}

#[test]
fn misuse_is_an_error() {
    let dev = Device::host();
    let w = Parameter::new(t(&dev, &[1.0, 2.0], &[2])).unwrap();
    let tape = Tape::new();
    let y = tape.param(&w).square().unwrap();
    let err = tape.backward(&y).unwrap_err().to_string();
    assert!(err.contains("seed"), "non-scalar without a seed: {err}");
    let s = y.sum_all().unwrap();
    tape.backward(&s).unwrap();
    let err = y.mul_scalar(2.0).unwrap_err().to_string();
    assert!(err.contains("already consumed"), "stale graph: {err}");
    let other = Tape::new();
    let a = other.param(&w);
    let b = Tape::new().param(&w);
    let err = a.add(&b).unwrap_err().to_string();
    assert!(err.contains("different tapes"), "{err}");
    let err = Parameter::new(Tensor::zeros(&[2], DType::I32, &dev).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("floating point"), "{err}");
}

#[test]
fn seeded_backward_of_a_non_scalar() {
    for dev in test_devices().unwrap() {
        let tape = Tape::new();
        let x = tape.leaf(&t(&dev, &[1.0, 2.0, 3.0], &[3])).unwrap();
        let y = x.square().unwrap();
        let seed = t(&dev, &[1.0, 0.5, -1.0], &[3]);
        let grads = tape.backward_with(&y, &seed).unwrap();
        assert_eq!(
            grads.get(&x).unwrap().to_vec_f64().unwrap(),
            vec![2.0, 2.0, -6.0]
        );
    }
}

#[test]
fn vars_print_their_values() {
    for dev in test_devices().unwrap() {
        let tape = Tape::new();
        let w = Parameter::new(t(&dev, &[1.0, -2.5], &[2])).unwrap();
        let loss = tape
            .param(&w)
            .mul(&tape.param(&w))
            .unwrap()
            .sum_all()
            .unwrap();
        let label = dev.to_string();
        assert_eq!(loss.to_string(), format!("tensor(7.2500, f32, {label})"));
        assert_eq!(
            format!("{}", tape.param(&w)),
            format!("tensor([ 1.0000, -2.5000], f32, {label})")
        );
    }
}

#[test]
fn gradient_buffers_hold_every_gradient_in_one_tensor() {
    use netcl_autograd::GradBuffers;
    for dev in test_devices().unwrap() {
        let a = Parameter::new(t(&dev, &[1.0, 2.0], &[2])).unwrap();
        let b = Parameter::new(t(&dev, &[3.0, 4.0, 5.0, 6.0], &[2, 2])).unwrap();
        let c = Parameter::new(t(&dev, &[7.0], &[1])).unwrap();
        // loss = sum(a^2) + sum(b) * 3: da = 2a, db = 3, c unused.
        let step = || {
            let tape = Tape::new();
            let la = tape.param(&a).square().unwrap().sum_all().unwrap();
            let lb = tape.param(&b).sum_all().unwrap().mul_scalar(3.0).unwrap();
            tape.backward(&la.add(&lb).unwrap()).unwrap();
        };
        step(); // an owned gradient before the buffers exist is kept
        let bufs = GradBuffers::new(&[a.clone(), b.clone(), c.clone(), a.clone()]).unwrap();
        assert_eq!(bufs.buffers().len(), 1);
        let flat = || bufs.buffers()[0].to_vec_f64().unwrap();
        assert_eq!(flat(), vec![2.0, 4.0, 3.0, 3.0, 3.0, 3.0, 0.0], "{dev}");
        step(); // accumulates in place
        assert_eq!(flat(), vec![4.0, 8.0, 6.0, 6.0, 6.0, 6.0, 0.0], "{dev}");
        assert!(c.grad().is_none(), "c was never reached");
        assert_eq!(a.grad().unwrap().to_vec_f64().unwrap(), vec![4.0, 8.0]);
        // zero_grad runs no kernel: the next gradient overwrites the stale view.
        a.zero_grad();
        b.zero_grad();
        assert!(a.grad().is_none());
        step();
        assert_eq!(flat(), vec![2.0, 4.0, 3.0, 3.0, 3.0, 3.0, 0.0], "{dev}");
        // One fill zeroes everything and every view is live (zeros).
        bufs.zero().unwrap();
        assert_eq!(flat(), vec![0.0; 7], "{dev}");
        assert_eq!(c.grad().unwrap().to_vec_f64().unwrap(), vec![0.0]);
        step();
        assert_eq!(flat(), vec![2.0, 4.0, 3.0, 3.0, 3.0, 3.0, 0.0], "{dev}");
        // set_grad writes into the view (what an all-reduce does).
        a.set_grad(Some(t(&dev, &[-1.0, -2.0], &[2]))).unwrap();
        assert_eq!(flat()[..2], [-1.0, -2.0]);
    }
}

#[test]
fn hooked_backward_hands_over_each_final_gradient() {
    for dev in test_devices().unwrap() {
        // loss = sum((x w1) w2): w2 is used last, so its gradient is final first.
        let w1 = Parameter::new(t(&dev, &[1.0, -2.0, 0.5, 3.0], &[2, 2])).unwrap();
        let w2 = Parameter::new(t(&dev, &[2.0, 1.0], &[2, 1])).unwrap();
        let x = t(&dev, &[1.0, 2.0, -1.0, 0.5], &[2, 2]);
        let run = |hooked: bool| -> (Vec<usize>, Vec<Vec<f64>>) {
            let tape = Tape::new();
            let h = Var::from(x.clone()).matmul(&tape.param(&w1)).unwrap();
            let loss = h.matmul(&tape.param(&w2)).unwrap().sum_all().unwrap();
            let mut order = Vec::new();
            if hooked {
                let mut hook = |p: &Parameter| {
                    // The gradient is already in place when the hook runs.
                    assert!(p.grad().is_some());
                    order.push(p.id());
                    Ok(())
                };
                tape.backward_hooked(&loss, &mut hook).unwrap();
            } else {
                tape.backward(&loss).unwrap();
            }
            let grads = [&w1, &w2]
                .iter()
                .map(|p| p.grad().unwrap().to_vec_f64().unwrap())
                .collect();
            w1.zero_grad();
            w2.zero_grad();
            (order, grads)
        };
        let (_, plain) = run(false);
        let (order, hooked) = run(true);
        assert_eq!(hooked, plain, "{dev}");
        assert_eq!(order, vec![w2.id(), w1.id()], "{dev}: last layer first");
        // An error from the hook stops the pass.
        let tape = Tape::new();
        let loss = tape.param(&w2).sum_all().unwrap();
        let err = tape
            .backward_hooked(&loss, &mut |_| {
                Err(netcl_ops::Error::invalid("hook", "stop"))
            })
            .unwrap_err();
        assert!(err.to_string().contains("stop"), "{err}");
    }
}
