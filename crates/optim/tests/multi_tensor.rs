//! Optimizer steps update all parameters in one kernel launch per form of the update, with parameters and state bit for bit those of one optimizer per parameter (the per-parameter fused_into path), on every device.
mod common;

use common::*;
use netcl_autograd::Parameter;
use netcl_core_devices::{opencl_test_devices, test_devices};
use netcl_kernels::{thread_launches, thread_launches_total};
use netcl_ops::testing::Cases;
use netcl_ops::{DType, FUSED_MAX_GROUPS};
use netcl_optim::{Adam, AdamW, Optimizer, Sgd};

/// The optimizers under test, by number.
const KINDS: usize = 7;

fn make(kind: usize, params: Vec<Parameter>) -> Box<dyn Optimizer> {
    match kind {
        0 => Box::new(Sgd::new(params, 0.1).weight_decay(0.1)),
        1 => Box::new(
            Sgd::new(params, 0.1)
                .momentum(0.9)
                .dampening(0.3)
                .weight_decay(0.1),
        ),
        2 => Box::new(Sgd::new(params, 0.1).momentum(0.9).nesterov(true)),
        3 => Box::new(Adam::new(params, 0.01).weight_decay(0.1)),
        4 => Box::new(AdamW::new(params, 0.01).betas(0.3, 0.95).eps(1e-3)),
        5 => Box::new(Adam::new(params, 0.01).betas(0.5, 0.9).amsgrad(true)),
        _ => Box::new(AdamW::new(params, 0.01).amsgrad(true)),
    }
}

/// Launches `kind` makes in a step where the parameters with a gradient have had `counts`
/// updates each: one per distinct form of the update (SGD with momentum: buffer new or not;
/// Adam: one, the update number is read on the device), and for Adam one that counts the step
/// on the device.
fn forms(kind: usize, counts: &[usize]) -> u64 {
    let mut keys: Vec<usize> = counts
        .iter()
        .map(|&c| match kind {
            1 | 2 => usize::from(c == 0),
            _ => 0,
        })
        .collect();
    keys.sort();
    keys.dedup();
    let count = u64::from(kind >= 3 && !counts.is_empty());
    keys.len() as u64 + count
}

/// Launches per step of `kind` for parameters that all have state: SGD's one update, Adam's
/// update and its step count.
fn per_step(kind: usize) -> u64 {
    if kind >= 3 {
        2
    } else {
        1
    }
}

/// Kernel launches of `f` on this thread, not counting the fills that create new state.
fn launches(f: impl FnOnce()) -> u64 {
    let (t0, f0) = (thread_launches_total(), thread_launches("fill"));
    f();
    (thread_launches_total() - t0) - (thread_launches("fill") - f0)
}

#[test]
fn batched_steps_match_each_parameter_alone_bit_for_bit() {
    const STEPS: usize = 5;
    let mut cases = 0;
    for dev in test_devices().unwrap() {
        for dtype in dtypes(&dev) {
            for kind in 0..KINDS {
                let prob = Problem::new(300 + kind as u64, dtype, STEPS);
                let together = prob.params(&dev, dtype);
                let mut opt = make(kind, together.clone());
                let apart = prob.params(&dev, dtype);
                let mut alone: Vec<Box<dyn Optimizer>> =
                    apart.iter().map(|p| make(kind, vec![p.clone()])).collect();
                let mut counts = vec![0usize; SHAPES.len()];
                for s in 0..STEPS {
                    let what = format!("optimizer {kind} {dtype} on {dev} step {s}");
                    prob.set_grads(&together, s);
                    prob.set_grads(&apart, s);
                    let with_grad: Vec<usize> =
                        (0..SHAPES.len()).filter(|&i| has_grad(i, s)).collect();
                    let launched = launches(|| opt.step().unwrap());
                    if !dev.is_host() {
                        let c: Vec<usize> = with_grad.iter().map(|&i| counts[i]).collect();
                        assert_eq!(launched, forms(kind, &c), "{what}: launches");
                    }
                    for a in alone.iter_mut() {
                        a.step().unwrap();
                    }
                    for &i in &with_grad {
                        counts[i] += 1;
                    }
                    let state = opt.state_tensors();
                    for (i, (p, q)) in together.iter().zip(&apart).enumerate() {
                        same_bits(p.value(), q.value(), &format!("{what}: param {i}"));
                        // The state of parameter i, in the same order as its own optimizer's.
                        let suffix = format!(".{i}");
                        let mine = state.iter().filter(|(n, _)| n.ends_with(&suffix));
                        let own = alone[i].state_tensors();
                        assert_eq!(mine.clone().count(), own.len(), "{what}: state of {i}");
                        for ((n, t), (_, u)) in mine.zip(&own) {
                            same_bits(t, u, &format!("{what}: {n}"));
                        }
                    }
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= KINDS * 3, "{cases} cases");
}

/// The parameters of a 784-128-128-10 MLP (weights and biases) on `dev` with gradients.
fn mlp(dev: &netcl_ops::Device, c: &mut Cases) -> Vec<Parameter> {
    let shapes: [&[usize]; 6] = [&[128, 784], &[128], &[128, 128], &[128], &[10, 128], &[10]];
    shapes
        .iter()
        .map(|s| {
            let n = s.iter().product();
            let p = param(dev, DType::F32, &values(c, DType::F32, n, -1.0, 1.0), s);
            let g = tensor(dev, DType::F32, &values(c, DType::F32, n, -1.0, 1.0), s);
            p.set_grad(Some(g)).unwrap();
            p
        })
        .collect()
}

#[test]
fn one_launch_per_step_for_an_mlp() {
    for dev in opencl_test_devices().unwrap() {
        for kind in 0..KINDS {
            let params = mlp(&dev, &mut Cases::new(9 + kind as u64));
            let mut opt = make(kind, params);
            for s in 0..3 {
                let launched = launches(|| opt.step().unwrap());
                assert_eq!(
                    launched,
                    per_step(kind),
                    "optimizer {kind} step {s} on {dev}"
                );
            }
            // The first step also filled the new state with zeros; later steps launch no more.
            let total = thread_launches_total();
            opt.step().unwrap();
            assert_eq!(
                thread_launches_total() - total,
                per_step(kind),
                "optimizer {kind} on {dev}"
            );
        }
    }
}

#[test]
fn more_parameters_than_one_launch_holds() {
    for dev in opencl_test_devices().unwrap() {
        for n in [
            FUSED_MAX_GROUPS,
            FUSED_MAX_GROUPS + 1,
            2 * FUSED_MAX_GROUPS + 3,
        ] {
            for kind in 0..KINDS {
                let mut c = Cases::new(40 + n as u64);
                let params: Vec<Parameter> = (0..n)
                    .map(|k| {
                        let len = 1 + 5 * k;
                        let p = param(
                            &dev,
                            DType::F32,
                            &values(&mut c, DType::F32, len, -1.0, 1.0),
                            &[len],
                        );
                        let g = tensor(
                            &dev,
                            DType::F32,
                            &values(&mut c, DType::F32, len, -1.0, 1.0),
                            &[len],
                        );
                        p.set_grad(Some(g)).unwrap();
                        p
                    })
                    .collect();
                let mut opt = make(kind, params);
                for s in 0..2 {
                    let launched = launches(|| opt.step().unwrap());
                    let what = format!("optimizer {kind}, {n} parameters, step {s} on {dev}");
                    let full = n.div_ceil(FUSED_MAX_GROUPS) as u64;
                    let half = n.div_ceil(FUSED_MAX_GROUPS / 2) as u64;
                    let big = dev.info().max_parameter_bytes >= 2048;
                    if kind < 3 {
                        assert_eq!(launched, full, "{what}");
                    } else {
                        // Adam's 6 buffers a parameter (m, v, p, grad, step count, learning
                        // rate; 7 with amsgrad): 16 a launch only on devices that take more
                        // than the minimum 1024 bytes of arguments, else 8. The step counts
                        // (one buffer each) take 16 a launch.
                        let update = if big { full } else { half };
                        assert_eq!(launched, full + update, "{what}");
                    }
                }
            }
        }
    }
}
