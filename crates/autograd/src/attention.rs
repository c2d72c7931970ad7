//! Scaled dot-product attention composed from recorded ops (matmul, mask, softmax, matmul).
use crate::tape::Var;
use netcl_ops::{Error, Result, Tensor};

impl Var {
    /// softmax(q·kᵀ·scale + mask)·v over q, k, v: (..., T, D); `mask` is an additive constant
    /// broadcast to (..., Tq, Tk) (0 / -inf, as [`Tensor::attention`]); `causal` lets query i see
    /// keys up to i + Tk − Tq.
    /// `scale` defaults to 1/sqrt(D).
    pub fn attention(
        q: &Var,
        k: &Var,
        v: &Var,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Var> {
        if q.ndim() < 2 || k.ndim() < 2 || v.ndim() < 2 {
            return Err(Error::shape(
                "attention",
                format!(
                    "q {:?}, k {:?}, v {:?}: need (..., T, D)",
                    q.shape(),
                    k.shape(),
                    v.shape()
                ),
            ));
        }
        let d = q.shape()[q.ndim() - 1];
        let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
        let kt = k.transpose(k.ndim() - 2, k.ndim() - 1)?;
        let mut s = q.matmul(&kt)?.mul_scalar(scale)?;
        if let Some(m) = mask {
            s = s.add(&Var::constant(m.clone()))?;
        }
        if causal {
            let n = s.ndim();
            let (tq, tk) = (s.shape()[n - 2], s.shape()[n - 1]);
            let m = Tensor::causal_hidden_mask(tq, tk, s.dtype(), s.device())?;
            s = s.masked_fill(&m, f64::NEG_INFINITY)?;
        }
        let p = s.softmax(s.ndim() - 1)?;
        p.matmul(v)
    }
}
