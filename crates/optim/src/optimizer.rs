//! The `Optimizer` trait shared by SGD, Adam and AdamW, and the checks of their settings.
use netcl_autograd::Parameter;
use netcl_ops::{Error, Result, Tensor};
use std::collections::HashMap;

/// An optimizer over a fixed list of parameters. `step` updates every parameter that has a
/// gradient through `fused_into_groups` (parameter, gradient and state in; parameter and state
/// out, written in place): one kernel launch for all parameters of a device and dtype (up to
/// `FUSED_MAX_GROUPS` a launch; non-contiguous parameters are updated one by one). Parameters
/// whose gradient is `None` are skipped and get no state.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;
    /// Drop every parameter's gradient (no kernel).
    fn zero_grad(&mut self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
    /// The learning rate the next `step` uses.
    fn lr(&self) -> f64;
    /// Set the learning rate of later steps (parameter groups scale it by their `lr_scale`).
    fn set_lr(&mut self, lr: f64);
    /// The parameters, in the order the optimizer was built with (state tensors are numbered by
    /// this position).
    fn params(&self) -> &[Parameter];
    /// The per-parameter state tensors, named `"<optimizer>.<kind>.<index>"` (for example
    /// `"adam.m.3"`). They share storage with the live state: read or copy them before the next
    /// `step`.
    fn state_tensors(&self) -> Vec<(String, Tensor)>;
    /// Every tensor a `step` reads or writes besides parameters and gradients, named: the state
    /// tensors, and the step counts and learning rates the update kernels read on the device.
    /// What a captured graph names (`Capture::name`) so that a saved graph loads against another
    /// process's optimizer.
    fn step_tensors(&self) -> Vec<(String, Tensor)> {
        self.state_tensors()
    }
    /// Sum `values` over the ranks that step this optimizer together: a sharded optimizer's
    /// ranks each hold the gradients of their shard only, so the gradient scaler's overflow
    /// check and [`clip_grad_norm_of`](crate::clip_grad_norm_of) add up what each rank found
    /// (collective there). An optimizer alone leaves them as they are.
    fn sum_over_ranks(&self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }
    /// Name, hyper-parameters and step counts as JSON (see each optimizer for the keys).
    fn hyper_params(&self) -> serde_json::Value;
    /// Restore what `hyper_params` and `state_tensors` saved. Names, indices, shapes and the
    /// presence of each parameter's state are checked first, and every mismatch is listed in the
    /// error; on error the optimizer is unchanged. Tensors may come from any device and float
    /// dtype: they are copied onto each parameter's device in its dtype.
    fn load_state(&mut self, hyper: &serde_json::Value, tensors: &[(String, Tensor)])
        -> Result<()>;
    /// Restore the state an optimizer sharded over `parts.len()` ranks saved, each rank's
    /// (`hyper_params`, `state_tensors`) in rank order, into this optimizer, which may be sharded
    /// otherwise: what resuming a sharded run on another number of devices needs. One part is
    /// `load_state`; only sharded optimizers take several.
    fn load_state_parts(
        &mut self,
        parts: &[(serde_json::Value, Vec<(String, Tensor)>)],
    ) -> Result<()> {
        match parts {
            [(hyper, tensors)] => self.load_state(hyper, tensors),
            _ => Err(Error::invalid(
                "Optimizer::load_state_parts",
                format!(
                    "the state of {} ranks of a sharded optimizer; this optimizer is not sharded \
                     (shard it over a group of one device: DataParallel::shard_optimizer)",
                    parts.len()
                ),
            )),
        }
    }
}

/// `Err` naming `op` and `what` unless `ok`.
pub(crate) fn require(op: &str, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(op, what()))
    }
}

/// A learning rate, weight decay or epsilon: finite and non-negative.
pub(crate) fn check_non_negative(op: &str, name: &str, v: f64) -> Result<()> {
    require(op, v.is_finite() && v >= 0.0, || {
        format!("{name} must be finite and >= 0, got {v}")
    })
}

/// No parameter may appear twice (it would be updated twice per step).
pub(crate) fn check_distinct(op: &str, params: &[Parameter]) -> Result<()> {
    let mut seen: HashMap<usize, usize> = HashMap::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        if let Some(first) = seen.insert(p.id(), i) {
            return Err(Error::invalid(
                op,
                format!(
                    "parameter {p:?} appears at positions {first} and {i}; each parameter may be listed once"
                ),
            ));
        }
    }
    Ok(())
}
