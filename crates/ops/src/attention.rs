//! Scaled dot-product attention composed from matmul, one fused scale/mask kernel and softmax (a fused attention kernel comes later).
use crate::checks::check_float;
use crate::expr::Expr;
use crate::fused::map;
use crate::tensor::Tensor;
use netcl_core_devices::{Error, Result};

/// Result of `Tensor::attention`: the output and the attention probabilities (what backward needs).
pub struct Attention {
    /// (..., Tq, Dv)
    pub out: Tensor,
    /// (..., Tq, Tk), rows summing to 1
    pub probs: Tensor,
}

impl Tensor {
    /// `softmax(q·kᵀ · scale + mask) · v` over the last two dims, batch dims broadcasting:
    /// q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv). `mask` is added to the scores (it
    /// broadcasts to (..., Tq, Tk), e.g. 0 / -inf); `causal` lets query i see keys up to
    /// i + Tk - Tq. `scale` defaults to 1/sqrt(D). Enqueues 4 kernels (5 when causal: the mask).
    pub fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Attention> {
        let op = "attention";
        for t in [q, k, v] {
            if t.ndim() < 2 {
                return Err(Error::shape(
                    op,
                    format!(
                        "q {:?}, k {:?}, v {:?} need at least 2 dims",
                        q.shape, k.shape, v.shape
                    ),
                ));
            }
        }
        let (tq, d) = (q.shape[q.ndim() - 2], q.shape[q.ndim() - 1]);
        let (tk, dk) = (k.shape[k.ndim() - 2], k.shape[k.ndim() - 1]);
        if d != dk || v.shape[v.ndim() - 2] != tk {
            return Err(Error::shape(op, format!("q {:?}, k {:?}, v {:?} do not fit (q and k share the last dim, k and v the key count)", q.shape, k.shape, v.shape)));
        }
        check_float(op, q, "q")?;
        let scale = scale.unwrap_or(1.0 / (d.max(1) as f64).sqrt());
        let scores = q.matmul(&k.transpose(k.ndim() - 2, k.ndim() - 1)?)?;
        let mut inputs = vec![&scores];
        let mut e = Expr::input(0) * scale;
        if let Some(m) = mask {
            inputs.push(m);
            e = e + Expr::input(inputs.len() - 1);
        }
        let keep;
        if causal {
            keep = Tensor::tril_mask(tq, tk, tk as i64 - tq as i64, q.dtype, &q.device)?;
            inputs.push(&keep);
            e = Expr::select(Expr::input(inputs.len() - 1), e, f64::NEG_INFINITY);
        }
        let masked = map(op, &inputs, e)?;
        if masked.shape != scores.shape {
            return Err(Error::shape(
                op,
                format!(
                    "mask {:?} does not broadcast to the scores {:?}",
                    mask.map(|m| m.shape.clone()),
                    scores.shape
                ),
            ));
        }
        let probs = masked.softmax(masked.ndim() - 1)?;
        let out = probs.matmul(v)?;
        Ok(Attention { out, probs })
    }
}
