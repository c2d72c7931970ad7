//! Batch normalisation: training (batch statistics, running stats) and eval forwards, and the training backward.
mod opencl;
mod reference;
use crate::base::checks::{check_device, check_dtype, check_float};
use crate::base::dispatch::dispatch;
use crate::base::norm_params::{check_eps, check_param, check_stat, NormGrads};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};

/// Outputs of [`Tensor::batch_norm_train`]: the result and the saved batch statistics (`[C]`, in
/// [`acc_dtype`](crate::acc_dtype)) that the backward needs.
#[derive(Clone, Debug)]
pub struct BatchNorm {
    pub y: Tensor,
    pub save_mean: Tensor,
    pub save_invstd: Tensor,
}

/// A checked training forward of float `x` (N, C, ..., any view) with `cnt` >= 2 values per
/// channel: weight and bias (C) in x's dtype, the running stats (mean, var; C, in the
/// accumulator dtype) updated in place when given.
#[derive(Clone, Debug)]
struct BatchNormTrain {
    x: Tensor,
    c: usize,
    cnt: usize,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    running: Option<(Tensor, Tensor)>,
    momentum: f64,
    eps: f64,
}

impl_op!(BatchNormTrain, BatchNorm, "batch_norm", train);

/// A checked eval forward of float `x` (N, C, ..., any view) with running stats (C, in the
/// accumulator dtype); y is contiguous in x's dtype.
#[derive(Clone, Debug)]
struct BatchNormEval {
    x: Tensor,
    c: usize,
    running_mean: Tensor,
    running_var: Tensor,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
}

impl_op!(BatchNormEval, Tensor, "batch_norm", eval);

/// A checked training backward: x and dy (N, C, ..., any views, one dtype and device), the saved
/// statistics (C); dweight when `weight` is given, dbias always.
#[derive(Clone, Debug)]
struct BatchNormBackward {
    x: Tensor,
    dy: Tensor,
    c: usize,
    save_mean: Tensor,
    save_invstd: Tensor,
    weight: Option<Tensor>,
}

impl_op!(
    BatchNormBackward,
    NormGrads,
    "batch_norm_backward",
    backward
);

impl Tensor {
    fn bn_check(
        &self,
        op: &str,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        running: &[(&Tensor, &str)],
        eps: f64,
    ) -> Result<usize> {
        check_float(op, self, "input")?;
        if self.ndim() < 2 {
            return Err(Error::shape(
                op,
                format!("input {:?} needs at least 2 dims (N, C, ...)", self.shape),
            ));
        }
        let c = self.shape[1];
        check_param(op, self, weight, "weight", &[c])?;
        check_param(op, self, bias, "bias", &[c])?;
        for (t, what) in running {
            check_stat(op, self, t, what, &[c])?;
        }
        check_eps(op, eps)?;
        Ok(c)
    }

    /// Batch normalisation in training mode for NC or NCHW (any trailing spatial dims, any
    /// strides): per-channel batch statistics over N and the spatial dims,
    /// `y = (x - mean) * invstd * weight + bias` with the biased variance. When running stats are given (`[C]`, in
    /// [`acc_dtype`](crate::acc_dtype), updated in place): `running = (1 - momentum) * running + momentum * stat`,
    /// with the unbiased variance. One kernel (one work-group per channel). Errors when a channel
    /// has fewer than 2 values.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_train(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        momentum: f64,
        eps: f64,
    ) -> Result<BatchNorm> {
        let op = "batch_norm";
        let running: Vec<(&Tensor, &str)> = running_mean
            .map(|t| (t, "running_mean"))
            .into_iter()
            .chain(running_var.map(|t| (t, "running_var")))
            .collect();
        let c = self.bn_check(op, weight, bias, &running, eps)?;
        for (t, _) in &running {
            t.mark_modified();
        }
        let running = match (running_mean, running_var) {
            (Some(m), Some(v)) if momentum.is_finite() => Some((m.clone(), v.clone())),
            (None, None) if momentum.is_finite() => None,
            _ => {
                return Err(Error::invalid(
                    op,
                    format!(
                        "need both running stats or neither, and a finite momentum ({momentum})"
                    ),
                ))
            }
        };
        let cnt = self.numel() / c.max(1);
        if cnt < 2 {
            return Err(Error::shape(
                op,
                format!(
                    "input {:?} has {cnt} value(s) per channel; training needs more than 1",
                    self.shape
                ),
            ));
        }
        let desc = BatchNormTrain {
            x: self.clone(),
            c,
            cnt,
            weight: weight.cloned(),
            bias: bias.cloned(),
            running,
            momentum,
            eps,
        };
        dispatch(&self.device, &desc)
    }

    /// Batch normalisation in eval mode with running statistics (`[C]`, [`acc_dtype`](crate::acc_dtype)):
    /// `y = (x - running_mean) / sqrt(running_var + eps) * weight + bias`. One kernel.
    pub fn batch_norm_eval(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "batch_norm";
        let c = self.bn_check(
            op,
            weight,
            bias,
            &[(running_mean, "running_mean"), (running_var, "running_var")],
            eps,
        )?;
        let desc = BatchNormEval {
            x: self.clone(),
            c,
            running_mean: running_mean.clone(),
            running_var: running_var.clone(),
            weight: weight.cloned(),
            bias: bias.cloned(),
            eps,
        };
        dispatch(&self.device, &desc)
    }

    /// Gradients of [`Tensor::batch_norm_train`] for input `self` (N, C, ...) given `dy` (same
    /// shape) and the forward's `save_mean` and `save_invstd` (`[C]`, [`acc_dtype`](crate::acc_dtype)): with
    /// xhat = (x - mean) * invstd over each channel's N * spatial values,
    /// `dx = weight * invstd * (dy - mean(dy) - xhat * mean(dy * xhat))`, dweight = sum(dy * xhat)
    /// when `weight` is given, and dbias = sum(dy) always. Any strides; dx is contiguous, all in
    /// x's dtype. Two kernels: per-channel partial sums over slices, then the channel totals and dx.
    pub fn batch_norm_backward(
        &self,
        dy: &Tensor,
        save_mean: &Tensor,
        save_invstd: &Tensor,
        weight: Option<&Tensor>,
    ) -> Result<NormGrads> {
        let op = "batch_norm_backward";
        let stats = [(save_mean, "save_mean"), (save_invstd, "save_invstd")];
        let c = self.bn_check(op, weight, None, &stats, 0.0)?;
        check_device(op, self, dy, "dy")?;
        check_dtype(op, dy, "dy", self.dtype)?;
        if dy.shape != self.shape {
            return Err(Error::shape(
                op,
                format!("dy {:?} does not match input {:?}", dy.shape, self.shape),
            ));
        }
        let desc = BatchNormBackward {
            x: self.clone(),
            dy: dy.clone(),
            c,
            save_mean: save_mean.clone(),
            save_invstd: save_invstd.clone(),
            weight: weight.cloned(),
        };
        dispatch(&self.device, &desc)
    }
}
