//! Learning-rate schedules (constant, step decay, linear warmup + cosine) as functions of the step number.
use crate::optimizer::Optimizer;

/// A learning rate as a function of the step number (0 for the first step).
pub trait LrSchedule {
    fn lr(&self, step: usize) -> f64;

    /// Set `opt`'s learning rate for `step` and return it: call before `opt.step()`.
    fn apply(&self, opt: &mut dyn Optimizer, step: usize) -> f64 {
        let lr = self.lr(step);
        opt.set_lr(lr);
        lr
    }
}

/// The same learning rate at every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConstantLr {
    pub base: f64,
}

impl LrSchedule for ConstantLr {
    fn lr(&self, _step: usize) -> f64 {
        self.base
    }
}

/// `base * gamma^(step / step_size)` (integer division): multiplied by `gamma` every
/// `step_size` steps, as PyTorch's `StepLR`. A `step_size` of 0 never decays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepLr {
    pub base: f64,
    pub step_size: usize,
    pub gamma: f64,
}

impl LrSchedule for StepLr {
    fn lr(&self, step: usize) -> f64 {
        let k = step.checked_div(self.step_size).unwrap_or(0);
        self.base * self.gamma.powi(i32::try_from(k).unwrap_or(i32::MAX))
    }
}

/// Linear warmup from 0 (step 0) to `base` (step `warmup_steps`), then half a cosine from
/// `base` down to `min_lr` at step `total_steps`, and `min_lr` after that.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineWithWarmup {
    pub base: f64,
    pub warmup_steps: usize,
    pub total_steps: usize,
    pub min_lr: f64,
}

impl LrSchedule for CosineWithWarmup {
    fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.base * step as f64 / self.warmup_steps as f64;
        }
        if step >= self.total_steps {
            return self.min_lr;
        }
        let progress =
            (step - self.warmup_steps) as f64 / (self.total_steps - self.warmup_steps) as f64;
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.base - self.min_lr) * cos
    }
}
