//! Parameter groups: a grouped optimizer steps each group exactly as a separate optimizer with the group's learning rate and weight decay would (bit for bit, on every device), follows set_lr in every group, and saves, checks and restores its groups.
mod common;

use common::*;
use netcl_autograd::Parameter;
use netcl_core_devices::test_devices;
use netcl_optim::{Adam, AdamW, Optimizer, ParamGroup, Sgd};

const KINDS: usize = 4;
const LR: f64 = 0.02;
const SCALE: f64 = 0.25;

/// Optimizer `kind` with the base settings over `params` and learning rate `lr`, weight decay
/// `wd`.
fn base(kind: usize, params: Vec<Parameter>, lr: f64, wd: f64) -> Box<dyn Optimizer> {
    match kind {
        0 => Box::new(Sgd::new(params, lr).momentum(0.9).weight_decay(wd)),
        1 => Box::new(Sgd::new(params, lr).weight_decay(wd)),
        2 => Box::new(Adam::new(params, lr).weight_decay(wd).amsgrad(true)),
        _ => Box::new(AdamW::new(params, lr).weight_decay(wd)),
    }
}

/// Optimizer `kind` over `a` (weight decay 0.1) plus the group `b` (lr x SCALE, no decay).
fn grouped(kind: usize, a: Vec<Parameter>, b: Vec<Parameter>) -> Box<dyn Optimizer> {
    let g = ParamGroup::new().lr_scale(SCALE).weight_decay(0.0);
    match kind {
        0 => Box::new(
            Sgd::new(a, LR)
                .momentum(0.9)
                .weight_decay(0.1)
                .add_group(b, g),
        ),
        1 => Box::new(Sgd::new(a, LR).weight_decay(0.1).add_group(b, g)),
        2 => Box::new(
            Adam::new(a, LR)
                .weight_decay(0.1)
                .amsgrad(true)
                .add_group(b, g),
        ),
        _ => Box::new(AdamW::new(a, LR).weight_decay(0.1).add_group(b, g)),
    }
}

#[test]
fn groups_step_as_separate_optimizers_with_their_settings() {
    const STEPS: usize = 5;
    let mut cases = 0;
    for dev in test_devices().unwrap() {
        for dtype in dtypes(&dev) {
            for kind in 0..KINDS {
                let prob = Problem::new(700 + kind as u64, dtype, STEPS);
                let together = prob.params(&dev, dtype);
                let half = together.len() / 2;
                let mut opt = grouped(kind, together[..half].to_vec(), together[half..].to_vec());
                let apart = prob.params(&dev, dtype);
                let mut first = base(kind, apart[..half].to_vec(), LR, 0.1);
                let mut second = base(kind, apart[half..].to_vec(), LR * SCALE, 0.0);
                for s in 0..STEPS {
                    let what = format!("optimizer {kind} {dtype} on {dev} step {s}");
                    // A schedule sets the optimizer's rate; the group follows at its scale.
                    let lr = LR / (1 + s) as f64;
                    opt.set_lr(lr);
                    first.set_lr(lr);
                    second.set_lr(lr * SCALE);
                    prob.set_grads(&together, s);
                    prob.set_grads(&apart, s);
                    opt.step().unwrap();
                    first.step().unwrap();
                    second.step().unwrap();
                    for (i, (p, q)) in together.iter().zip(&apart).enumerate() {
                        same_bits(p.value(), q.value(), &format!("{what}: param {i}"));
                    }
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= KINDS * 3, "{cases} cases");
}

#[test]
fn groups_are_saved_checked_and_restored() {
    let dev = netcl_ops::Device::host();
    let dtype = netcl_ops::DType::F64;
    for kind in 0..KINDS {
        let prob = Problem::new(800 + kind as u64, dtype, 4);
        let ps = prob.params(&dev, dtype);
        let half = ps.len() / 2;
        let mut opt = grouped(kind, ps[..half].to_vec(), ps[half..].to_vec());
        for s in 0..2 {
            prob.set_grads(&ps, s);
            opt.step().unwrap();
        }
        let hyper = opt.hyper_params();
        let groups = hyper["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 1, "{hyper}");
        assert_eq!(groups[0]["lr_scale"], SCALE);
        assert_eq!(groups[0]["weight_decay"], 0.0);
        assert_eq!(groups[0]["params"], ps.len() - half);
        let state = opt.state_tensors();

        // The same split restores and continues bit for bit.
        let qs = prob.params(&dev, dtype);
        for (p, q) in ps.iter().zip(&qs) {
            q.assign(p.value()).unwrap();
        }
        let mut back = grouped(kind, qs[..half].to_vec(), qs[half..].to_vec());
        back.load_state(&hyper, &state).unwrap();
        for s in 2..4 {
            prob.set_grads(&ps, s);
            prob.set_grads(&qs, s);
            opt.step().unwrap();
            back.step().unwrap();
        }
        for (i, (p, q)) in ps.iter().zip(&qs).enumerate() {
            same_bits(
                p.value(),
                q.value(),
                &format!("optimizer {kind}: param {i}"),
            );
        }

        // Another split, or none, is an error naming the groups; the optimizer is unchanged.
        let rs = prob.params(&dev, dtype);
        let mut other = grouped(kind, rs[..half - 1].to_vec(), rs[half - 1..].to_vec());
        let err = other.load_state(&hyper, &state).unwrap_err().to_string();
        assert!(err.contains("parameter groups"), "{err}");
        let mut plain = base(kind, rs.clone(), LR, 0.1);
        let err = plain.load_state(&hyper, &state).unwrap_err().to_string();
        assert!(err.contains("parameter groups"), "{err}");
        assert!(plain.state_tensors().is_empty());
    }
}

#[test]
fn bad_group_settings_are_errors_naming_the_group() {
    let dev = netcl_ops::Device::host();
    let prob = Problem::new(900, netcl_ops::DType::F32, 1);
    let ps = prob.params(&dev, netcl_ops::DType::F32);
    prob.set_grads(&ps, 0);
    let bad = ParamGroup::new().lr_scale(-1.0);
    let mut opt = AdamW::new(ps[..1].to_vec(), 0.1).add_group(ps[1..].to_vec(), bad);
    let err = opt.step().unwrap_err().to_string();
    assert!(err.contains("group 1 lr_scale"), "{err}");
    // A parameter in two groups would be updated twice.
    let mut twice = Sgd::new(ps.clone(), 0.1).add_group(ps[..1].to_vec(), ParamGroup::new());
    let err = twice.step().unwrap_err().to_string();
    assert!(err.contains("appears at positions"), "{err}");
}
