//! Scaled dot-product attention composed from matmul, one fused scale/mask kernel and softmax (the reference and fallback of the fused kernels in flash_attention/).
use crate::base::checks::check_float;
use crate::base::tensor::Tensor;
use crate::fused::eval::map;
use crate::fused::expr::Expr;
use netcl_core_devices::{DType, Device, Error, Result};

/// Result of `Tensor::attention`: the output and the attention probabilities.
pub struct Attention {
    /// (..., Tq, Dv)
    pub out: Tensor,
    /// (..., Tq, Tk), rows summing to 1 (for inspection: `Var::attention` records its own ops
    /// and keeps what their backward rules need)
    pub probs: Tensor,
}

impl Tensor {
    /// The causal mask of attention over `tq` queries and `tk` keys (the queries being the last
    /// `tq` positions): 1 where query i may not see key j (`j > i + tk - tq`), 0 elsewhere. Both
    /// `Tensor::attention` and `Var::attention` apply this mask.
    pub fn causal_hidden_mask(
        tq: usize,
        tk: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::triu_mask(tq, tk, 1 + tk as i64 - tq as i64, dtype, device)
    }

    /// The queries of causal attention that see no key (`tq > tk`: the first `tq - tk`) as a
    /// (tq, 1) mask of 1s, or `None` when every query sees one. Both composed paths give such
    /// rows output 0 and no gradient, as the fused kernels do: their scores stay unmasked (so
    /// softmax and its backward stay finite) and their probabilities are set to 0.
    pub fn causal_empty_rows(
        tq: usize,
        tk: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        if tq <= tk {
            return Ok(None);
        }
        let rows: Vec<f32> = (0..tq).map(|i| f32::from(u8::from(i < tq - tk))).collect();
        Tensor::from_vec(rows, &[tq, 1], device)?
            .to_dtype(dtype)
            .map(Some)
    }
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
        let (hidden, empty);
        if causal {
            hidden = Tensor::causal_hidden_mask(tq, tk, q.dtype, &q.device)?;
            inputs.push(&hidden);
            let masked = Expr::select(Expr::input(inputs.len() - 1), f64::NEG_INFINITY, e.clone());
            empty = Tensor::causal_empty_rows(tq, tk, q.dtype, &q.device)?;
            e = match &empty {
                Some(rows) => {
                    inputs.push(rows);
                    Expr::select(Expr::input(inputs.len() - 1), e, masked)
                }
                None => masked,
            };
        } else {
            empty = None;
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
        let mut probs = masked.softmax(masked.ndim() - 1)?;
        if let Some(rows) = &empty {
            probs = probs.masked_fill(rows, 0.0)?;
        }
        let out = probs.matmul(v)?;
        Ok(Attention { out, probs })
    }
}
