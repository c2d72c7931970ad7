//! Backward rules of softmax, log_softmax and the fused cross-entropy.
use crate::tape::{record, Var};
use netcl_ops::{Result, Tensor};

impl Var {
    /// softmax over `dim`; dx = y · (g − Σ g·y) ([`Tensor::softmax_backward`]).
    #[track_caller]
    pub fn softmax(&self, dim: usize) -> Result<Var> {
        let y = self.value().softmax(dim)?;
        let ys = y.clone();
        record("softmax", &[self], y, move |g, _| {
            Ok(vec![Some(ys.softmax_backward(g, dim)?)])
        })
    }

    /// log_softmax over `dim`; dx = g − exp(y) · Σ g ([`Tensor::log_softmax_backward`]).
    #[track_caller]
    pub fn log_softmax(&self, dim: usize) -> Result<Var> {
        let y = self.value().log_softmax(dim)?;
        let ys = y.clone();
        record("log_softmax", &[self], y, move |g, _| {
            Ok(vec![Some(ys.log_softmax_backward(g, dim)?)])
        })
    }

    /// Mean cross-entropy of logits (N, C) against integer targets (N, I32), skipping rows whose
    /// target is `ignore_index`. One fused forward (losses + logsumexp) and one fused backward.
    #[track_caller]
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: Option<i32>) -> Result<Var> {
        let ce = self.value().cross_entropy(targets, ignore_index)?;
        let (x, t, lse, count) = (self.value().clone(), targets.clone(), ce.lse, ce.count);
        record("cross_entropy", &[self], ce.loss, move |g, _| {
            let dx = x.cross_entropy_backward(&t, &lse, g, Some(&count), ignore_index)?;
            Ok(vec![Some(dx)])
        })
    }
}
