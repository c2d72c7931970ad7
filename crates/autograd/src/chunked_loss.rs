//! The language-model loss without the logits: cross-entropy of `x · Wᵀ` computed in chunks of rows, forward and backward, so that no more than one chunk's logits exist at a time.
use crate::autocast::product_dtype;
use crate::matmul::{t, Cast};
use crate::tape::{record, Var};
use netcl_ops::{fused_into, Error, Expr, MatmulOptions, Result, Tensor};

/// Logits of at most this many elements (rows x vocabulary) are computed whole; above it,
/// [`Var::linear_cross_entropy`] works in chunks of at most `LOSS_CHUNK_ELEMENTS / vocabulary`
/// rows (64M elements: 128 MiB of bf16 logits per chunk, 512 rows of a 128256-token vocabulary).
pub const LOSS_CHUNK_ELEMENTS: usize = 1 << 26;

/// The rows per chunk the automatic rule picks for `rows` x `vocab` logits: None (one product,
/// the logits kept for backward) while they hold at most [`LOSS_CHUNK_ELEMENTS`], else
/// `LOSS_CHUNK_ELEMENTS / vocab` rows rounded down to a multiple of 64 where that leaves any
/// (at least one): a chunk's rows are the K of the head's weight gradient, which tensor cores
/// read as they lie only in whole 16-byte groups (else the chunk's logits are copied first).
pub fn loss_chunk_rows(rows: usize, vocab: usize) -> Option<usize> {
    let most = LOSS_CHUNK_ELEMENTS / vocab.max(1);
    let rounded = if most >= 64 {
        most / 64 * 64
    } else {
        most.max(1)
    };
    (rows.saturating_mul(vocab) > LOSS_CHUNK_ELEMENTS).then_some(rounded)
}

impl Var {
    /// Mean cross-entropy of the logits `self · weightᵀ` against `targets`, skipping rows whose
    /// target is `ignore_index`: self (..., D), weight (V, D) (an output head, or a tied
    /// embedding table), targets (...) I32. Products follow the autocast policy as
    /// [`Var::linear`]'s do; the loss is f32 (f64 for f64 operands).
    ///
    /// `chunk_rows: Some(r)` computes the logits `r` rows at a time: the forward keeps each
    /// chunk's logsumexp and drops its logits; the backward recomputes each chunk's logits,
    /// takes the softmax gradient, and adds that chunk's share into dX and dW (accumulated in
    /// place), so at most one chunk's logits (and their gradient) exist at any time, for one
    /// more product per chunk. `None` chooses by size ([`loss_chunk_rows`]): small logits are
    /// computed whole, as `linear` + `cross_entropy`. Equal to the unchunked loss and gradients
    /// up to the order of the weight gradient's sums over rows.
    pub fn linear_cross_entropy(
        &self,
        weight: &Var,
        targets: &Tensor,
        ignore_index: Option<i32>,
        chunk_rows: Option<usize>,
    ) -> Result<Var> {
        let op = "linear_cross_entropy";
        let d = self.shape().last().copied().unwrap_or(0);
        if weight.ndim() != 2 || weight.shape()[1] != d || d == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "input {:?} and weight {:?}: need x (..., D) and weight (V, D)",
                    self.shape(),
                    weight.shape()
                ),
            ));
        }
        if targets.shape() != &self.shape()[..self.ndim() - 1] {
            return Err(Error::shape(
                op,
                format!(
                    "targets {:?} for input {:?}: need the input's leading dims",
                    targets.shape(),
                    self.shape()
                ),
            ));
        }
        let (n, v) = (targets.numel(), weight.shape()[0]);
        let x = self.reshape(&[n, d])?;
        let targets = targets.reshape(&[n])?;
        let rows = match chunk_rows {
            Some(0) => return Err(Error::invalid(op, "chunk_rows must be at least 1")),
            Some(r) => r,
            None => match loss_chunk_rows(n, v) {
                Some(r) => r,
                None => {
                    let logits = x.linear(weight, None, netcl_ops::Activation::None)?;
                    return logits.cross_entropy(&targets, ignore_index);
                }
            },
        };
        chunked(&x, weight, &targets, ignore_index, rows)
    }
}

/// The chunked loss of x [N, D] against weight [V, D] and targets [N], `rows` rows a chunk.
fn chunked(
    x: &Var,
    weight: &Var,
    targets: &Tensor,
    ignore_index: Option<i32>,
    rows: usize,
) -> Result<Var> {
    let cast = Cast(product_dtype(&[x.dtype(), weight.dtype()]));
    let (x_dtype, w_dtype) = (x.dtype(), weight.dtype());
    let xl = cast.low(x.value())?;
    let n = targets.numel();
    let chunks: Vec<(usize, usize)> = (0..n).step_by(rows).map(|r| (r, rows.min(n - r))).collect();
    // The logits of one chunk, as the whole product would compute them.
    let logits = |xl: &Tensor, wl: &Tensor, (r, m): (usize, usize)| {
        xl.narrow(0, r, m)?
            .matmul_with(&t(wl)?, MatmulOptions::default())
    };
    let (losses, lse) = {
        let wl = cast.low(weight.value())?;
        let mut losses = Vec::with_capacity(chunks.len());
        let mut lse = Vec::with_capacity(chunks.len());
        for &c in &chunks {
            let (l, s) = logits(&xl, &wl, c)?
                .cross_entropy_rows(&targets.narrow(0, c.0, c.1)?, ignore_index)?;
            losses.push(l);
            lse.push(s);
        }
        (Tensor::concat(&losses.iter().collect::<Vec<_>>(), 0)?, lse)
    };
    let (loss, count) = losses.cross_entropy_mean(targets, ignore_index)?;
    drop(losses);
    // The backward keeps the input (in the product's dtype, as linear does), the targets, each
    // chunk's logsumexp and the count; the weight is its parameter's value.
    let (w, targets) = (weight.value().clone(), targets.clone());
    let x_shape = x.shape().to_vec();
    record(
        "linear_cross_entropy",
        &[x, weight],
        loss,
        move |g, need| {
            let wl = cast.low(&w)?;
            let mut dx = Vec::new();
            let mut dw: Option<Tensor> = None;
            for (&c, lse) in chunks.iter().zip(&lse) {
                let tc = targets.narrow(0, c.0, c.1)?;
                let dlogits = logits(&xl, &wl, c)?.cross_entropy_backward(
                    &tc,
                    lse,
                    g,
                    Some(&count),
                    ignore_index,
                )?;
                if need[0] {
                    dx.push(dlogits.matmul_with(&wl, cast.writing(x_dtype))?);
                }
                if need[1] {
                    let part = t(&dlogits)?
                        .matmul_with(&xl.narrow(0, c.0, c.1)?, cast.writing(w_dtype))?;
                    dw = Some(match dw {
                        None => part,
                        Some(acc) => {
                            fused_into(&[&acc, &part], &[(Expr::input(0) + Expr::input(1), &acc)])?;
                            acc
                        }
                    });
                }
            }
            let dx = match need[0] {
                true => Some(Tensor::concat(&dx.iter().collect::<Vec<_>>(), 0)?.reshape(&x_shape)?),
                false => None,
            };
            Ok(vec![dx, dw])
        },
    )
}
