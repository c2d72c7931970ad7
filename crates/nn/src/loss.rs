//! Losses: cross-entropy (fused; optional label smoothing and ignore_index), nll_loss, mse_loss.
use netcl_autograd::Var;
use netcl_ops::{Error, Result, Tensor};

/// Options of [`cross_entropy_with`] (PyTorch semantics).
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossEntropyOptions {
    /// Rows with this target are skipped (they count neither in the sum nor the mean).
    pub ignore_index: Option<i32>,
    /// ε in [0, 1): the target distribution is (1 − ε)·onehot + ε/C.
    pub label_smoothing: f64,
}

/// Mean cross-entropy of logits (N, C) against I32 class targets (N): one fused kernel forward
/// and one backward.
pub fn cross_entropy(logits: &Var, targets: &Tensor) -> Result<Var> {
    logits.cross_entropy(targets, None)
}

/// Cross-entropy with ignore_index and label smoothing.
pub fn cross_entropy_with(
    logits: &Var,
    targets: &Tensor,
    opts: CrossEntropyOptions,
) -> Result<Var> {
    let eps = opts.label_smoothing;
    if !(0.0..1.0).contains(&eps) {
        return Err(Error::invalid(
            "cross_entropy",
            format!("label_smoothing {eps} is not in [0, 1)"),
        ));
    }
    let ce = logits.cross_entropy(targets, opts.ignore_index)?;
    if eps == 0.0 {
        return Ok(ce);
    }
    // ε · mean over counted rows of −mean_c log p.
    let smooth_rows = logits.log_softmax(1)?.mean(&[1], false)?.neg()?;
    let smooth = match opts.ignore_index {
        None => smooth_rows.mean_all()?,
        Some(ig) => {
            let keep = targets
                .ne_scalar(ig as f64)?
                .to_dtype(smooth_rows.dtype())?;
            let count = keep.sum_all()?;
            smooth_rows
                .mul(&Var::constant(keep))?
                .sum_all()?
                .div(&Var::constant(count))?
        }
    };
    ce.mul_scalar(1.0 - eps)?
        .add(&smooth.to_dtype(ce.dtype())?.mul_scalar(eps)?)
}

/// Mean negative log-likelihood of log-probabilities (N, C) at I32 targets (N).
pub fn nll_loss(log_probs: &Var, targets: &Tensor) -> Result<Var> {
    if log_probs.ndim() != 2 || targets.ndim() != 1 || targets.shape()[0] != log_probs.shape()[0] {
        return Err(Error::shape(
            "nll_loss",
            format!(
                "log_probs {:?} and targets {:?}: need (N, C) and (N)",
                log_probs.shape(),
                targets.shape()
            ),
        ));
    }
    let idx = targets.reshape(&[targets.numel(), 1])?;
    log_probs.gather(1, &idx)?.mean_all()?.neg()
}

/// Mean squared error between same-shaped prediction and target.
pub fn mse_loss(pred: &Var, target: &Var) -> Result<Var> {
    if pred.shape() != target.shape() {
        return Err(Error::shape(
            "mse_loss",
            format!(
                "prediction {:?} and target {:?} differ",
                pred.shape(),
                target.shape()
            ),
        ));
    }
    pred.sub(target)?.square()?.mean_all()
}
