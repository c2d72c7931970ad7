//! Step counts and learning rates on the device, read by the update kernels as one-element inputs: the kernels of every step are the same kernels with the same argument values, so a captured step (netcl-graph) replays the optimizer exactly as eager steps run it.
use netcl_ops::{DType, Device, Expr, Result, Tensor};
use std::collections::HashMap;

/// The dtype of a parameter's step count and learning rate: f64 for f64 parameters (their
/// update runs in f64), else f32 (f16/bf16 updates run in f32; counts stay exact to 2^24).
pub(crate) fn counter_dtype(param: DType) -> DType {
    if param == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The arithmetic of an update over parameters of `dtype` reading counts and rates in
/// [`counter_dtype`]: f16/bf16 operands are read as f32 (`widen`) and results stored back
/// (`narrow`); other dtypes compute in their own type.
pub(crate) struct UpdateTypes {
    dtype: DType,
}

impl UpdateTypes {
    pub(crate) fn new(dtype: DType) -> UpdateTypes {
        UpdateTypes { dtype }
    }
    fn half(&self) -> bool {
        matches!(self.dtype, DType::F16 | DType::BF16)
    }
    /// Parameter-dtype input `i`, in the update's arithmetic.
    pub(crate) fn input(&self, i: usize) -> Expr {
        let e = Expr::input(i);
        if self.half() {
            e.cast(DType::F32)
        } else {
            e
        }
    }
    /// A result stored into a parameter-dtype destination.
    pub(crate) fn narrow(&self, e: Expr) -> Expr {
        if self.half() {
            e.cast(self.dtype)
        } else {
            e
        }
    }
}

/// A new step count of 0 for a parameter of `dtype` on `device`.
pub(crate) fn new_count(dtype: DType, device: &Device) -> Result<Tensor> {
    Tensor::zeros(&[1], counter_dtype(dtype), device)
}

/// A step count holding `t` (a loaded checkpoint's).
pub(crate) fn count_of(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    Tensor::full(&[1], t as f64, counter_dtype(dtype), device)
}

/// `1 - beta^t` for the step count input `t`, as `-expm1(t ln(beta))` (no cancellation for
/// small `t`, and exact 1 for `beta = 0`).
pub(crate) fn bias_correction(t: Expr, beta: f64) -> Expr {
    -((t * beta.ln()).expm1())
}

/// One learning-rate tensor per (parameter group, device, dtype), written only when the rate
/// changes.
#[derive(Default)]
pub(crate) struct DeviceLr {
    tensors: HashMap<(usize, usize, DType), (Tensor, f64)>,
}

impl Clone for DeviceLr {
    /// A clone makes its own tensors on first use (two optimizers never share a rate).
    fn clone(&self) -> Self {
        DeviceLr::default()
    }
}

impl DeviceLr {
    /// The rate `lr` of `group` for parameters of `dtype` on `device`.
    pub(crate) fn get(
        &mut self,
        group: usize,
        device: &Device,
        dtype: DType,
        lr: f64,
    ) -> Result<Tensor> {
        let key = (group, device.ordinal(), counter_dtype(dtype));
        if let Some((t, v)) = self.tensors.get_mut(&key) {
            if *v != lr {
                t.fill_(lr)?;
                *v = lr;
            }
            return Ok(t.clone());
        }
        let t = Tensor::full(&[1], lr, key.2, device)?;
        self.tensors.insert(key, (t.clone(), lr));
        Ok(t)
    }

    /// The rate tensors, named `"<optimizer>.lr.<group>.<device ordinal>.<dtype>"`.
    pub(crate) fn named(&self, optimizer: &str) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self
            .tensors
            .iter()
            .map(|((g, d, dt), (t, _))| (format!("{optimizer}.lr.{g}.{d}.{dt}"), t.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Writes the rate of each group (`lr_of(group)`) where it changed; what `set_lr` calls, so
    /// a replayed step reads the new rate.
    pub(crate) fn refresh(&mut self, lr_of: impl Fn(usize) -> f64) {
        for ((group, _, _), (t, v)) in self.tensors.iter_mut() {
            let lr = lr_of(*group);
            if *v != lr {
                match t.fill_(lr) {
                    Ok(()) => *v = lr,
                    // The next step writes it again (its error surfaces there).
                    Err(e) => log::warn!("writing learning rate {lr}: {e}"),
                }
            }
        }
    }
}
