//! Optimizer state save/load: 3 steps + save + load into a fresh optimizer + 2 steps equals 5 uninterrupted steps bit for bit on every device; mismatched state gives errors naming every problem and leaves the optimizer unchanged.
mod common;

use common::*;
use netcl_autograd::Parameter;
use netcl_core_devices::test_devices;
use netcl_ops::{DType, Device, Tensor};
use netcl_optim::{Adam, AdamW, Optimizer, Sgd};

/// The optimizers under test, configured (`tuned`) or with defaults a checkpoint must override.
fn build(kind: usize, params: Vec<Parameter>, tuned: bool) -> Box<dyn Optimizer> {
    match (kind, tuned) {
        (0, true) => Box::new(
            Sgd::new(params, 0.05)
                .momentum(0.9)
                .dampening(0.2)
                .weight_decay(0.01),
        ),
        (1, true) => Box::new(
            Sgd::new(params, 0.05)
                .momentum(0.8)
                .nesterov(true)
                .weight_decay(0.01),
        ),
        (2, true) => Box::new(
            Adam::new(params, 0.02)
                .betas(0.8, 0.99)
                .eps(1e-6)
                .weight_decay(0.05),
        ),
        (3, true) => Box::new(
            AdamW::new(params, 0.02)
                .betas(0.85, 0.995)
                .weight_decay(0.1),
        ),
        (4, true) => Box::new(Adam::new(params, 0.02).betas(0.8, 0.9).amsgrad(true)),
        (5, true) => Box::new(AdamW::new(params, 0.02).betas(0.5, 0.9).amsgrad(true)),
        (0 | 1, false) => Box::new(Sgd::new(params, 9.0)),
        (2 | 4, false) => Box::new(Adam::new(params, 9.0)),
        _ => Box::new(AdamW::new(params, 9.0)),
    }
}

/// What a checkpoint keeps: the JSON as text and the tensors copied to the host.
fn save(opt: &dyn Optimizer) -> (String, Vec<(String, Tensor)>) {
    let tensors = opt
        .state_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.to_device(&Device::host()).unwrap()))
        .collect();
    (opt.hyper_params().to_string(), tensors)
}

#[test]
fn save_load_resume_is_bit_exact() {
    let mut cases = 0;
    for dev in test_devices().unwrap() {
        for dtype in dtypes(&dev) {
            for kind in 0..6 {
                let prob = Problem::new(300 + kind as u64, dtype, 5);
                let what = format!("optimizer {kind} {dtype} on {dev}");
                // Uninterrupted.
                let pa = prob.params(&dev, dtype);
                let mut a = build(kind, pa.clone(), true);
                for s in 0..5 {
                    prob.set_grads(&pa, s);
                    a.step().unwrap();
                }
                // Interrupted after 3 steps.
                let pb = prob.params(&dev, dtype);
                let mut b = build(kind, pb.clone(), true);
                for s in 0..3 {
                    prob.set_grads(&pb, s);
                    b.step().unwrap();
                }
                let (json, tensors) = save(b.as_ref());
                drop(b);
                let hyper: serde_json::Value = serde_json::from_str(&json).unwrap();
                let mut c = build(kind, pb.clone(), false);
                c.load_state(&hyper, &tensors).unwrap();
                assert_eq!(c.hyper_params(), hyper, "{what}: hyper-parameters restored");
                for s in 3..5 {
                    prob.set_grads(&pb, s);
                    c.step().unwrap();
                }
                for (i, (x, y)) in pa.iter().zip(&pb).enumerate() {
                    same_bits(y.value(), x.value(), &format!("{what}: param {i}"));
                }
                let (sa, sc) = (a.state_tensors(), c.state_tensors());
                assert_eq!(sa.len(), sc.len(), "{what}");
                for ((na, ta), (nc, tc)) in sa.iter().zip(&sc) {
                    assert_eq!(na, nc, "{what}");
                    assert_eq!((tc.device(), tc.dtype()), (&dev, dtype), "{what}: {nc}");
                    same_bits(tc, ta, &format!("{what}: {nc}"));
                }
                assert_eq!(a.hyper_params(), c.hyper_params(), "{what}");
                cases += 1;
            }
        }
    }
    assert!(cases >= 8, "{cases} cases");
}

#[test]
fn loaded_state_is_a_copy_cast_to_the_parameter_dtype() {
    let dev = Device::host();
    let p = param(&dev, DType::F32, &[1.0, 2.0], &[2]);
    let mut opt = Sgd::new(vec![p.clone()], 0.5).momentum(0.5);
    let mut hyper = opt.hyper_params();
    hyper["step"] = 1.into();
    let buf = Tensor::from_vec(vec![1.0f64, -1.0], &[2], &dev).unwrap();
    opt.load_state(&hyper, &[("sgd.momentum.0".into(), buf.clone())])
        .unwrap();
    let (_, t) = &opt.state_tensors()[0];
    assert_eq!(t.dtype(), DType::F32);
    p.set_grad(Some(tensor(&dev, DType::F32, &[1.0, 1.0], &[2])))
        .unwrap();
    opt.step().unwrap();
    // buf = 0.5 * (1, -1) + (1, 1) = (1.5, 0.5); p = (1, 2) - 0.5 * buf.
    assert_eq!(p.value().to_vec_f64().unwrap(), [0.25, 1.75]);
    assert_eq!(
        buf.to_vec_f64().unwrap(),
        [1.0, -1.0],
        "caller's tensor untouched"
    );
}

fn adam_with_state(dev: &Device) -> (Vec<Parameter>, Adam) {
    let prob = Problem::new(1, DType::F32, 2);
    let params = prob.params(dev, DType::F32);
    let mut opt = Adam::new(params.clone(), 0.01);
    for s in 0..2 {
        prob.set_grads(&params, s);
        opt.step().unwrap();
    }
    (params, opt)
}

fn load_err(opt: &mut dyn Optimizer, hyper: &serde_json::Value, t: &[(String, Tensor)]) -> String {
    opt.load_state(hyper, t).unwrap_err().to_string()
}

#[test]
fn mismatched_state_is_an_error_listing_every_problem() {
    let dev = Device::host();
    let (params, saved) = adam_with_state(&dev);
    let hyper = saved.hyper_params();
    let tensors = saved.state_tensors();
    // Parameters 0 and 1 have state (param_steps [2, 2, 0, 0]).
    assert_eq!(hyper["param_steps"], serde_json::json!([2, 2, 0, 0]));
    let mut fresh = Adam::new(params.clone(), 0.5);
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();

    let mut bad: Vec<(String, Tensor)> = tensors
        .iter()
        .filter(|(n, _)| n != "adam.v.1")
        .cloned()
        .collect();
    bad.push(("adam.q.0".into(), z(&[7, 5])));
    bad.push(("adam.m.9".into(), z(&[7, 5])));
    bad.push(("adam.m.2".into(), z(&[4, 2, 3])));
    bad.push(("adam.m.0".into(), z(&[7, 5])));
    bad.push(("sgd.momentum.0".into(), z(&[7, 5])));
    bad.push(("adam.m.03".into(), z(&[3, 3])));
    let e = load_err(&mut fresh, &hyper, &bad);
    for needle in [
        "adam.load_state",
        "7 problems",
        "unexpected tensor \"adam.q.0\"",
        "\"adam.m.9\" is for parameter 9 but the optimizer has 4 parameters",
        "\"adam.m.2\" has shape [4, 2, 3] but parameter 2 has shape [2, 3, 4]",
        "\"adam.m.0\" is given twice",
        "unexpected tensor \"sgd.momentum.0\"",
        "unexpected tensor \"adam.m.03\"",
        "\"adam.v.1\" is missing (param_steps[1] = 2)",
    ] {
        assert!(e.contains(needle), "{needle:?} not in: {e}");
    }
    // State for a parameter that was never updated.
    let mut extra = tensors.clone();
    extra.push(("adam.v.3".into(), z(&[3, 3])));
    let e = load_err(&mut fresh, &hyper, &extra);
    assert!(
        e.contains("\"adam.v.3\" is given but param_steps[3] = 0"),
        "{e}"
    );
    // Integer state.
    let mut ints = tensors.clone();
    ints[0].1 = Tensor::zeros(&[7, 5], DType::I32, &dev).unwrap();
    let e = load_err(&mut fresh, &hyper, &ints);
    assert!(e.contains("\"adam.m.0\" is i32"), "{e}");

    // Hyper-parameter problems.
    let sgd = Sgd::new(params.clone(), 0.1);
    let e = load_err(&mut fresh, &sgd.hyper_params(), &[]);
    assert!(e.contains("\"sgd\"") && e.contains("\"adam\""), "{e}");
    let adamw = AdamW::new(params.clone(), 0.1);
    let e = load_err(&mut fresh, &adamw.hyper_params(), &[]);
    assert!(e.contains("\"adamw\", not \"adam\""), "{e}");
    let fewer = Adam::new(params[..3].to_vec(), 0.1);
    let e = load_err(&mut fresh, &fewer.hyper_params(), &[]);
    assert!(
        e.contains("covers 3 parameters; this optimizer has 4"),
        "{e}"
    );
    let mut h = hyper.clone();
    h.as_object_mut().unwrap().remove("eps");
    let e = load_err(&mut fresh, &h, &tensors);
    assert!(e.contains("\"eps\" is missing"), "{e}");
    let mut h = hyper.clone();
    h["betas"] = serde_json::json!([0.9]);
    let e = load_err(&mut fresh, &h, &tensors);
    assert!(e.contains("\"betas\" must be two numbers"), "{e}");
    let mut h = hyper.clone();
    h["param_steps"] = serde_json::json!([1, 1]);
    let e = load_err(&mut fresh, &h, &tensors);
    assert!(e.contains("\"param_steps\" must be a list of 4"), "{e}");
    let mut h = hyper.clone();
    h["betas"] = serde_json::json!([0.9, 1.5]);
    let e = load_err(&mut fresh, &h, &tensors);
    assert!(
        e.contains("adam.load_state: betas must lie in [0, 1), got (0.9, 1.5)"),
        "{e}"
    );
    let e = load_err(&mut fresh, &serde_json::json!([1, 2]), &tensors);
    assert!(e.contains("JSON object"), "{e}");
    // amsgrad keeps max_v: missing when it is on, unexpected when it is off.
    let mut h = hyper.clone();
    h["amsgrad"] = true.into();
    let e = load_err(&mut fresh, &h, &tensors);
    assert!(
        e.contains("2 problems") && e.contains("\"adam.max_v.0\" is missing (param_steps[0] = 2)"),
        "{e}"
    );
    let mut extra = tensors.clone();
    extra.push(("adam.max_v.1".into(), z(&[13])));
    let e = load_err(&mut fresh, &hyper, &extra);
    assert!(e.contains("unexpected tensor \"adam.max_v.1\""), "{e}");
    h["amsgrad"] = "on".into();
    let e = load_err(&mut fresh, &h, &tensors);
    assert!(e.contains("\"amsgrad\" must be true or false"), "{e}");

    // Every failed load left the fresh optimizer as it was.
    assert_eq!(fresh.lr(), 0.5);
    assert_eq!(fresh.steps(), 0);
    assert!(fresh.state_tensors().is_empty());
    // And the saved state loads.
    fresh.load_state(&hyper, &tensors).unwrap();
    assert_eq!(fresh.lr(), 0.01);
    assert_eq!(fresh.param_steps(1), 2);
    assert_eq!(fresh.state_tensors().len(), 4);
    // A checkpoint from before amsgrad (no key) loads with it off.
    let mut old = hyper.clone();
    old.as_object_mut().unwrap().remove("amsgrad");
    let mut amsgrad = Adam::new(params.clone(), 0.5).amsgrad(true);
    amsgrad.load_state(&old, &tensors).unwrap();
    assert_eq!(amsgrad.hyper_params(), hyper);
}

#[test]
fn sgd_state_errors() {
    let dev = Device::host();
    let p = param(&dev, DType::F32, &[1.0, 2.0], &[2]);
    let mut opt = Sgd::new(vec![p], 0.1).momentum(0.9);
    let hyper = opt.hyper_params();
    let z = Tensor::zeros(&[3], DType::F32, &dev).unwrap();
    let e = load_err(&mut opt, &hyper, &[("sgd.momentum.0".into(), z.clone())]);
    assert!(e.contains("shape [3] but parameter 0 has shape [2]"), "{e}");
    let e = load_err(&mut opt, &hyper, &[("sgd.m.0".into(), z)]);
    assert!(e.contains("expected \"sgd.momentum.<index>\""), "{e}");
    let mut h = hyper.clone();
    h["nesterov"] = "yes".into();
    let e = load_err(&mut opt, &h, &[]);
    assert!(e.contains("\"nesterov\" must be true or false"), "{e}");
}
