//! Learning-rate schedules against hand-computed values: warmup endpoints, cosine midpoint and quarter point, step-decay boundaries, and applying a schedule to an optimizer.
use netcl_autograd::Parameter;
use netcl_ops::{DType, Device, Tensor};
use netcl_optim::{ConstantLr, CosineWithWarmup, LrSchedule, Optimizer, Sgd, StepLr};

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-15 * want.abs().max(1.0),
        "{what}: {got} vs {want}"
    );
}

#[test]
fn constant() {
    let s = ConstantLr { base: 3e-4 };
    for step in [0, 1, 10, 1_000_000] {
        assert_eq!(s.lr(step), 3e-4);
    }
}

#[test]
fn step_decay_boundaries() {
    let s = StepLr {
        base: 0.1,
        step_size: 3,
        gamma: 0.5,
    };
    let want = [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125];
    for (step, &w) in want.iter().enumerate() {
        close(s.lr(step), w, &format!("step {step}"));
    }
    close(s.lr(30), 0.1 * 0.5f64.powi(10), "step 30");
    // step_size 0 never decays.
    let s = StepLr { step_size: 0, ..s };
    assert_eq!(s.lr(100), 0.1);
}

#[test]
fn cosine_with_warmup_known_values() {
    let s = CosineWithWarmup {
        base: 1.0,
        warmup_steps: 10,
        total_steps: 110,
        min_lr: 0.1,
    };
    // Linear warmup from 0 to base.
    close(s.lr(0), 0.0, "warmup start");
    close(s.lr(1), 0.1, "warmup step 1");
    close(s.lr(5), 0.5, "warmup middle");
    close(s.lr(9), 0.9, "warmup end - 1");
    close(s.lr(10), 1.0, "warmup end = base");
    // Midpoint of the cosine: (base + min) / 2; quarter: min + (base - min)(1 + cos(pi/4))/2.
    close(s.lr(60), 0.55, "cosine midpoint");
    close(
        s.lr(35),
        0.1 + 0.45 * (1.0 + std::f64::consts::FRAC_1_SQRT_2),
        "quarter",
    );
    close(
        s.lr(85),
        0.1 + 0.45 * (1.0 - std::f64::consts::FRAC_1_SQRT_2),
        "3/4",
    );
    close(s.lr(110), 0.1, "end");
    close(s.lr(1000), 0.1, "after the end");
    // Monotone decay after warmup.
    for k in 10..110 {
        assert!(s.lr(k + 1) <= s.lr(k), "step {k}");
    }
    // Without warmup the first step is at base.
    let s = CosineWithWarmup {
        warmup_steps: 0,
        total_steps: 4,
        min_lr: 0.0,
        base: 2.0,
    };
    close(s.lr(0), 2.0, "no warmup");
    close(s.lr(2), 1.0, "no warmup midpoint");
    close(s.lr(4), 0.0, "no warmup end");
}

#[test]
fn apply_sets_the_optimizer_lr() {
    let p = Parameter::new(Tensor::zeros(&[2], DType::F32, &Device::host()).unwrap()).unwrap();
    let mut opt = Sgd::new(vec![p], 1.0);
    let s = StepLr {
        base: 0.2,
        step_size: 2,
        gamma: 0.1,
    };
    assert_eq!(s.apply(&mut opt, 0), 0.2);
    assert_eq!(opt.lr(), 0.2);
    s.apply(&mut opt, 3);
    close(opt.lr(), 0.02, "after apply at step 3");
}
