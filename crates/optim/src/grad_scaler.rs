//! Dynamic loss scaling for f16 mixed precision (PyTorch's `GradScaler`): scale the loss, unscale the gradients, skip the step when one is inf/NaN, grow and shrink the scale; its state goes into a checkpoint's `extra`.
use crate::optimizer::Optimizer;
use netcl_autograd::Var;
use netcl_ops::{fused, DType, Error, Expr, Result, Tensor};
use serde_json::{json, Value};

/// Loss scaling: `scale(loss)` before backward, then `step(optimizer)` instead of
/// `optimizer.step()`. A step whose gradients hold an inf or NaN is skipped (parameters and
/// optimizer state untouched) and the scale shrinks by `backoff_factor`; after `growth_interval`
/// good steps in a row it grows by `growth_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct GradScaler {
    scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
    good_steps: u64,
    skipped: u64,
}

impl Default for GradScaler {
    /// PyTorch's defaults: scale 2^16, x2 after 2000 good steps, x0.5 on overflow.
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            good_steps: 0,
            skipped: 0,
        }
    }
}

impl GradScaler {
    /// A scaler starting at `init_scale` (> 0, finite) with PyTorch's other defaults.
    pub fn new(init_scale: f64) -> Result<GradScaler> {
        if !(init_scale.is_finite() && init_scale > 0.0) {
            return Err(Error::invalid(
                "GradScaler",
                format!("init_scale must be finite and > 0, got {init_scale}"),
            ));
        }
        Ok(GradScaler {
            scale: init_scale,
            ..Default::default()
        })
    }

    /// The current scale.
    pub fn scale_factor(&self) -> f64 {
        self.scale
    }

    /// Steps skipped so far because of inf/NaN gradients.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    /// `loss x scale`, to call `backward` on.
    pub fn scale(&self, loss: &Var) -> Result<Var> {
        loss.mul_scalar(self.scale)
    }

    /// Unscales every gradient of `optimizer`'s parameters and steps it, unless a gradient holds
    /// an inf or NaN: then the gradients are dropped, nothing is updated and the scale shrinks.
    /// Returns whether the optimizer stepped. One read from each device per call; a sharded
    /// optimizer's ranks agree on the overflow ([`Optimizer::sum_over_ranks`]).
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        let inv = 1.0 / self.scale;
        let mut unscaled = Vec::new();
        // Per device: the sum over every gradient of (g x 0): NaN exactly when one is inf/NaN.
        let mut probes: Vec<Tensor> = Vec::new();
        for p in optimizer.params() {
            let Some(g) = p.grad() else { continue };
            let acc = if g.dtype() == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
            // g: (n...) -> unscaled g: (n...), g * 0 in the accumulation dtype: (n...)
            let mut outs = fused(
                &[&g],
                &[Expr::input(0) * inv, Expr::input(0).cast(acc) * 0.0],
            )?;
            let zero = outs.remove(1).sum_all()?;
            match probes.iter_mut().find(|t| t.device() == g.device()) {
                Some(t) if t.dtype() == zero.dtype() => *t = t.add(&zero)?,
                _ => probes.push(zero),
            }
            unscaled.push((p.clone(), outs.remove(0)));
        }
        let mut finite = true;
        for t in &probes {
            finite &= t.to_vec_f64()?.iter().all(|v| v.is_finite());
        }
        // Every rank of a sharded optimizer must take the same decision.
        let mut overflowed = [f64::from(u8::from(!finite))];
        optimizer.sum_over_ranks(&mut overflowed)?;
        if overflowed[0] != 0.0 {
            optimizer.zero_grad();
            self.scale *= self.backoff_factor;
            self.good_steps = 0;
            self.skipped += 1;
            return Ok(false);
        }
        for (p, g) in unscaled {
            p.set_grad(Some(g))?;
        }
        optimizer.step()?;
        self.good_steps += 1;
        if self.good_steps >= self.growth_interval {
            self.scale *= self.growth_factor;
            self.good_steps = 0;
        }
        Ok(true)
    }

    /// The scaler's state as JSON (for a checkpoint's `extra`).
    pub fn state(&self) -> Value {
        json!({
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "good_steps": self.good_steps,
            "skipped": self.skipped,
        })
    }

    /// Restores what `state` saved; an error naming the key when one is missing or invalid (the
    /// scaler is then unchanged).
    pub fn load_state(&mut self, state: &Value) -> Result<()> {
        let num = |k: &str| {
            state[k].as_f64().ok_or_else(|| {
                Error::invalid("GradScaler::load_state", format!("missing or bad {k:?}"))
            })
        };
        let int = |k: &str| {
            state[k].as_u64().ok_or_else(|| {
                Error::invalid("GradScaler::load_state", format!("missing or bad {k:?}"))
            })
        };
        let loaded = GradScaler {
            scale: num("scale")?,
            growth_factor: num("growth_factor")?,
            backoff_factor: num("backoff_factor")?,
            growth_interval: int("growth_interval")?,
            good_steps: int("good_steps")?,
            skipped: int("skipped")?,
        };
        if !(loaded.scale.is_finite() && loaded.scale > 0.0) {
            return Err(Error::invalid(
                "GradScaler::load_state",
                format!("scale must be finite and > 0, got {}", loaded.scale),
            ));
        }
        *self = loaded;
        Ok(())
    }
}
