//! SGD, Adam and AdamW over every option combination, five steps on every device, against f64 references of PyTorch's formulas; skipped parameters, state names and setting errors.
mod common;

use common::*;
use netcl_core_devices::test_devices;
use netcl_ops::testing::check_close;
use netcl_ops::DType;
use netcl_optim::{Adam, AdamW, Optimizer, Sgd};

const STEPS: usize = 5;

fn sgd_configs() -> Vec<SgdCfg> {
    let mut out = Vec::new();
    for weight_decay in [0.0, 0.1] {
        // Dampening is ignored without momentum.
        out.push(SgdCfg {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.3,
            nesterov: false,
            weight_decay,
        });
        for dampening in [0.0, 0.3] {
            out.push(SgdCfg {
                lr: 0.1,
                momentum: 0.9,
                dampening,
                nesterov: false,
                weight_decay,
            });
        }
        out.push(SgdCfg {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay,
        });
    }
    out
}

fn adam_configs() -> Vec<AdamCfg> {
    let mut out = Vec::new();
    for decoupled in [false, true] {
        for weight_decay in [0.0, 0.1] {
            // beta1 = 0.3 takes lerp's other branch (weight 0.7); eps 1e-3 makes eps matter.
            for (beta1, beta2, eps) in [(0.9, 0.999, 1e-8), (0.3, 0.95, 1e-3)] {
                // amsgrad with weight decay only (it does not interact with the decay).
                for amsgrad in [false, true] {
                    if amsgrad && weight_decay == 0.0 {
                        continue;
                    }
                    out.push(AdamCfg {
                        decoupled,
                        lr: 0.01,
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                        amsgrad,
                    });
                }
            }
        }
    }
    out
}

/// Compare a state or parameter tensor with the reference values.
fn compare(got: &netcl_ops::Tensor, want: &[f64], dtype: DType, scale: f64, what: &str) {
    let g = got.to_vec_f64().unwrap();
    if let Err(msg) = check_close(&g, want, tol(dtype), scale, what) {
        panic!("{msg}");
    }
}

#[test]
fn sgd_matches_the_reference_for_every_option() {
    let mut cases = 0;
    for dev in test_devices().unwrap() {
        for dtype in dtypes(&dev) {
            for (k, cfg) in sgd_configs().into_iter().enumerate() {
                let prob = Problem::new(100 + k as u64, dtype, STEPS);
                let params = prob.params(&dev, dtype);
                let mut opt = Sgd::new(params.clone(), cfg.lr)
                    .momentum(cfg.momentum)
                    .dampening(cfg.dampening)
                    .nesterov(cfg.nesterov)
                    .weight_decay(cfg.weight_decay);
                let mut want = prob.init.clone();
                let mut bufs: Vec<Option<Vec<f64>>> = vec![None; SHAPES.len()];
                for s in 0..STEPS {
                    prob.set_grads(&params, s);
                    opt.step().unwrap();
                    for i in 0..SHAPES.len() {
                        if let Some(g) = &prob.grads[s][i] {
                            sgd_ref(&cfg, &mut want[i], g, &mut bufs[i]);
                        }
                    }
                }
                assert_eq!(opt.steps(), STEPS);
                let what = format!("sgd {cfg:?} {dtype} on {dev}");
                for (i, p) in params.iter().enumerate() {
                    compare(
                        p.value(),
                        &want[i],
                        dtype,
                        0.1,
                        &format!("{what}: param {i}"),
                    );
                }
                // Momentum buffers exist exactly for the parameters that had a gradient.
                let state = opt.state_tensors();
                let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
                if cfg.momentum == 0.0 {
                    assert!(names.is_empty(), "{what}: {names:?}");
                } else {
                    assert_eq!(
                        names,
                        ["sgd.momentum.0", "sgd.momentum.1", "sgd.momentum.2"],
                        "{what}"
                    );
                    for (i, (_, t)) in state.iter().enumerate() {
                        let b = bufs[i].as_ref().unwrap();
                        compare(t, b, dtype, 0.1, &format!("{what}: buffer {i}"));
                        assert_eq!(t.device(), &dev);
                        assert_eq!(t.dtype(), dtype);
                    }
                }
                cases += 1;
            }
        }
    }
    assert!(cases >= 8, "{cases} cases");
}

#[test]
fn adam_and_adamw_match_the_reference_for_every_option() {
    let mut cases = 0;
    for dev in test_devices().unwrap() {
        for dtype in dtypes(&dev) {
            for (k, cfg) in adam_configs().into_iter().enumerate() {
                let prob = Problem::new(200 + k as u64, dtype, STEPS);
                let params = prob.params(&dev, dtype);
                let mut opt: Box<dyn Optimizer> = if cfg.decoupled {
                    Box::new(
                        AdamW::new(params.clone(), cfg.lr)
                            .betas(cfg.beta1, cfg.beta2)
                            .eps(cfg.eps)
                            .weight_decay(cfg.weight_decay)
                            .amsgrad(cfg.amsgrad),
                    )
                } else {
                    Box::new(
                        Adam::new(params.clone(), cfg.lr)
                            .betas(cfg.beta1, cfg.beta2)
                            .eps(cfg.eps)
                            .weight_decay(cfg.weight_decay)
                            .amsgrad(cfg.amsgrad),
                    )
                };
                let mut want = prob.init.clone();
                let mut st: Vec<AdamRefState> = vec![AdamRefState::default(); SHAPES.len()];
                for s in 0..STEPS {
                    prob.set_grads(&params, s);
                    opt.step().unwrap();
                    for i in 0..SHAPES.len() {
                        if let Some(g) = &prob.grads[s][i] {
                            adam_ref(&cfg, &mut want[i], g, &mut st[i]);
                        }
                    }
                }
                let what = format!("adam {cfg:?} {dtype} on {dev}");
                for (i, p) in params.iter().enumerate() {
                    compare(
                        p.value(),
                        &want[i],
                        dtype,
                        0.1,
                        &format!("{what}: param {i}"),
                    );
                }
                let prefix = if cfg.decoupled { "adamw" } else { "adam" };
                let state = opt.state_tensors();
                let names: Vec<String> = state.iter().map(|(n, _)| n.clone()).collect();
                let kinds: &[&str] = if cfg.amsgrad {
                    &["m", "v", "max_v"]
                } else {
                    &["m", "v"]
                };
                let expected: Vec<String> = (0..3)
                    .flat_map(|i| kinds.iter().map(move |k| format!("{prefix}.{k}.{i}")))
                    .collect();
                assert_eq!(names, expected, "{what}");
                for (j, (name, t)) in state.iter().enumerate() {
                    let r = &st[j / kinds.len()];
                    let want = [&r.m, &r.v, &r.max_v][j % kinds.len()];
                    compare(t, want, dtype, 1e-3, &format!("{what}: {name}"));
                    assert_eq!((t.device(), t.dtype()), (&dev, dtype), "{what}: {name}");
                }
                // The maximum must matter somewhere (v fell below an earlier value) for amsgrad
                // to be tested at all; with beta2 = 0.95 it does.
                if cfg.amsgrad && cfg.beta2 < 0.99 {
                    let below = st.iter().flat_map(|r| r.v.iter().zip(&r.max_v));
                    let fell = below.filter(|(v, mx)| v < mx).count();
                    assert!(fell > 10, "{what}: v fell below max_v at {fell} elements");
                }
                let hyper = opt.hyper_params();
                assert_eq!(hyper["name"], prefix);
                assert_eq!(hyper["step"], STEPS);
                // Per-parameter update counts drive the bias correction.
                assert_eq!(
                    hyper["param_steps"],
                    serde_json::json!([5, 4, 3, 0]),
                    "{what}"
                );
                cases += 1;
            }
        }
    }
    assert!(cases >= 8, "{cases} cases");
}

#[test]
fn parameters_without_gradients_are_untouched_and_get_no_state() {
    for dev in test_devices().unwrap() {
        let prob = Problem::new(7, DType::F32, 1);
        let params = prob.params(&dev, DType::F32);
        let mut opts: Vec<Box<dyn Optimizer>> = vec![
            Box::new(
                Sgd::new(params.clone(), 0.1)
                    .momentum(0.9)
                    .weight_decay(0.1),
            ),
            Box::new(Adam::new(params.clone(), 0.1).weight_decay(0.1)),
            Box::new(AdamW::new(params.clone(), 0.1)),
        ];
        for opt in opts.iter_mut() {
            for p in &params {
                p.zero_grad();
            }
            // Only parameter 0 has a gradient.
            let g = tensor(&dev, DType::F32, &vec![0.5; 35], &[7, 5]);
            params[0].set_grad(Some(g)).unwrap();
            let before: Vec<Vec<f64>> = params
                .iter()
                .map(|p| p.value().to_vec_f64().unwrap())
                .collect();
            opt.step().unwrap();
            assert_ne!(params[0].value().to_vec_f64().unwrap(), before[0]);
            for i in 1..params.len() {
                assert_eq!(params[i].value().to_vec_f64().unwrap(), before[i], "{dev}");
            }
            let names: Vec<String> = opt.state_tensors().into_iter().map(|(n, _)| n).collect();
            assert!(names.iter().all(|n| n.ends_with(".0")), "{dev}: {names:?}");
            assert!(!names.is_empty(), "{dev}");
            // zero_grad drops every gradient.
            opt.zero_grad();
            assert!(params.iter().all(|p| p.grad().is_none()));
        }
    }
}

#[test]
fn set_lr_takes_effect_at_the_next_step() {
    // lr is a kernel argument: the same kernel runs with the new value (exact values below).
    for dev in test_devices().unwrap() {
        let p = param(&dev, DType::F32, &[1.0, -2.0], &[2]);
        let mut opt = Sgd::new(vec![p.clone()], 0.5);
        // lr 0.5, g (1, 2): p = (1 - 0.5, -2 - 1) = (0.5, -3).
        // lr 0.25, g (1, 4): p = (0.5 - 0.25, -3 - 1) = (0.25, -4).
        for (lr, g, want) in [
            (0.5, [1.0, 2.0], [0.5, -3.0]),
            (0.25, [1.0, 4.0], [0.25, -4.0]),
        ] {
            opt.set_lr(lr);
            assert_eq!(opt.lr(), lr);
            p.set_grad(Some(tensor(&dev, DType::F32, &g, &[2])))
                .unwrap();
            opt.step().unwrap();
            assert_eq!(p.value().to_vec_f64().unwrap(), want, "{dev} lr {lr}");
        }
    }
}

#[test]
fn invalid_settings_are_errors_naming_the_setting() {
    let dev = netcl_ops::Device::host();
    let p = param(&dev, DType::F32, &[1.0], &[1]);
    p.set_grad(Some(tensor(&dev, DType::F32, &[1.0], &[1])))
        .unwrap();
    let err = |r: netcl_ops::Result<()>| r.unwrap_err().to_string();
    let e = err(Sgd::new(vec![p.clone()], 0.1).nesterov(true).step());
    assert!(e.contains("nesterov") && e.contains("momentum"), "{e}");
    let e = err(Sgd::new(vec![p.clone()], 0.1)
        .momentum(0.9)
        .dampening(0.1)
        .nesterov(true)
        .step());
    assert!(e.contains("dampening 0.1"), "{e}");
    let e = err(Sgd::new(vec![p.clone()], -1.0).step());
    assert!(e.contains("lr") && e.contains("-1"), "{e}");
    let e = err(Adam::new(vec![p.clone()], 0.1).betas(0.9, 1.0).step());
    assert!(e.contains("betas") && e.contains("(0.9, 1)"), "{e}");
    let e = err(AdamW::new(vec![p.clone()], 0.1).eps(f64::NAN).step());
    assert!(e.contains("eps"), "{e}");
    let e = err(AdamW::new(vec![p.clone()], 0.1).weight_decay(-0.5).step());
    assert!(e.contains("weight_decay"), "{e}");
    let e = err(Adam::new(vec![p.clone(), p.clone()], 0.1).step());
    assert!(e.contains("positions 0 and 1"), "{e}");
    // Nothing was updated by the failed steps.
    assert_eq!(p.value().to_vec_f64().unwrap(), [1.0]);
}
