//! Scaled dot-product attention: the fused kernel's op and backward rule (`Var::flash_attention`), and `Var::attention`, which takes it where it can and composes recorded ops (matmul, mask, softmax, matmul) elsewhere.
use crate::autocast::autocast_dtype;
use crate::tape::{any_tracked, record, Var};
use netcl_ops::{DType, Error, Result, Tensor};

impl Var {
    /// softmax(q·kᵀ·scale + mask)·v over q, k, v: (..., T, D); `mask` is an additive constant
    /// broadcast to (..., Tq, Tk) (0 / -inf, as [`Tensor::attention`]); `causal` lets query i see
    /// keys up to i + Tk − Tq. `scale` defaults to 1/sqrt(D).
    ///
    /// Without a mask, 4-D operands that [`Tensor::flash_attention_supports`] and at least
    /// [`FLASH_MIN_QUERIES`] queries go to the fused kernel ([`Var::flash_attention`]); other
    /// calls record the composed ops. With `causal`, a query that sees no key (Tq > Tk) gives 0
    /// and no gradient on both paths ([`Tensor::causal_empty_rows`]).
    #[track_caller]
    pub fn attention(
        q: &Var,
        k: &Var,
        v: &Var,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Var> {
        Var::attention_masked(q, k, v, mask, (causal, None), scale)
    }

    /// [`Var::attention`] with its mask as (causal, sliding window): with a window (which needs
    /// `causal`), query i sees only keys `j > i + Tk - Tq - window` of those before it, fused
    /// ([`Var::flash_attention_window`]) or composed.
    #[track_caller]
    pub fn attention_masked(
        q: &Var,
        k: &Var,
        v: &Var,
        mask: Option<&Tensor>,
        (causal, window): (bool, Option<usize>),
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
        if window.is_some_and(|w| w == 0) || (window.is_some() && !causal) {
            return Err(Error::invalid(
                "attention",
                format!(
                    "sliding window {window:?} (causal {causal}): needs causal and 1 or more keys"
                ),
            ));
        }
        if Var::attention_is_fused(q, k, v, mask) {
            return Var::flash_attention_masked(q, k, v, (causal, window), scale);
        }
        let d = q.shape()[q.ndim() - 1];
        let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
        let kt = k.transpose(k.ndim() - 2, k.ndim() - 1)?;
        let mut s = q.matmul(&kt)?.mul_scalar(scale)?;
        // Autocast: the scores of a 16-bit product are softmaxed in f32 (as PyTorch's autocast
        // runs softmax), and the output comes back in q's dtype, as the fused path returns it.
        let autocast = autocast_dtype().is_some();
        if autocast && s.dtype().size() < 4 {
            s = s.to_dtype(DType::F32)?;
        }
        if let Some(m) = mask {
            s = s.add(&Var::constant(m.clone()))?;
        }
        let mut empty = None;
        if causal {
            let n = s.ndim();
            let (tq, tk) = (s.shape()[n - 2], s.shape()[n - 1]);
            let mut m = Tensor::causal_hidden_mask(tq, tk, s.dtype(), s.device())?;
            empty = Tensor::causal_empty_rows(tq, tk, s.dtype(), s.device())?;
            if let Some(rows) = &empty {
                // Rows that see no key keep finite scores; their probabilities become 0 below.
                m = m.masked_fill(rows, 0.0)?;
            }
            s = s.masked_fill(&m, f64::NEG_INFINITY)?;
            if let Some(w) = window {
                // Keys j <= i + tk - tq - w are out of the window.
                let far = tk as i64 - tq as i64 - w as i64;
                let m = Tensor::tril_mask(tq, tk, far, s.dtype(), s.device())?;
                s = s.masked_fill(&m, f64::NEG_INFINITY)?;
            }
        }
        let mut p = s.softmax(s.ndim() - 1)?;
        if let Some(rows) = &empty {
            p = p.masked_fill(rows, 0.0)?;
        }
        let o = p.matmul(v)?;
        match autocast && o.dtype() != q.dtype() {
            true => o.to_dtype(q.dtype()),
            false => Ok(o),
        }
    }

    /// Whether attention over these operands takes the fused kernel: no mask, 4-D operands that
    /// [`Tensor::flash_attention_supports`] (grouped heads included) and at least
    /// [`FLASH_MIN_QUERIES`] queries. `Var::attention` and the Llama block decide by it.
    pub fn attention_is_fused(q: &Var, k: &Var, v: &Var, mask: Option<&Tensor>) -> bool {
        mask.is_none()
            && q.ndim() == 4
            && q.shape()[2] >= FLASH_MIN_QUERIES
            && Tensor::flash_attention_supports(q.value(), k.value(), v.value())
    }

    /// Fused attention of q (B, H, Tq, D) over k, v (B, Hkv, Tk, D) ([`Tensor::flash_attention`]:
    /// grouped-query heads, no materialised scores). The tape keeps q, k, v, the output and
    /// the rows' log-sum-exp (B, H, Tq), and the backward is the fused one (dq, dk and dv kernels).
    /// Under autocast, f32 operands compute in the autocast dtype ([`Tensor::flash_attention_in`]:
    /// tensor cores read and write the f32 tensors), as PyTorch's autocast runs attention; 16-bit
    /// operands (the projections' outputs under autocast) compute in their own dtype.
    #[track_caller]
    pub fn flash_attention(
        q: &Var,
        k: &Var,
        v: &Var,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Var> {
        Var::flash_attention_masked(q, k, v, (causal, None), scale)
    }

    /// [`Var::flash_attention`] of causal attention where each query sees at most its last
    /// `window` keys ([`Tensor::flash_attention_window`]; None: all before it).
    #[track_caller]
    pub fn flash_attention_window(
        q: &Var,
        k: &Var,
        v: &Var,
        window: Option<usize>,
        scale: Option<f64>,
    ) -> Result<Var> {
        Var::flash_attention_masked(q, k, v, (true, window), scale)
    }

    /// The fused attention with its mask as (causal, window).
    #[track_caller]
    fn flash_attention_masked(
        q: &Var,
        k: &Var,
        v: &Var,
        (causal, window): (bool, Option<usize>),
        scale: Option<f64>,
    ) -> Result<Var> {
        let all_f32 = [q, k, v].iter().all(|x| x.dtype() == DType::F32);
        let compute = autocast_dtype().filter(|_| all_f32);
        let (qv, kv, vv) = (q.value(), k.value(), v.value());
        let (out, lse) = match window {
            None => Tensor::flash_attention_in(qv, kv, vv, causal, scale, compute)?,
            Some(_) => Tensor::flash_attention_window(qv, kv, vv, window, scale, compute)?,
        };
        if !any_tracked(&[q, k, v]) {
            return Ok(Var::constant(out));
        }
        let (qv, kv, vv, o) = (qv.clone(), kv.clone(), vv.clone(), out.clone());
        record("flash_attention", &[q, k, v], out, move |g, _| {
            let (dq, dk, dv) = Tensor::flash_attention_backward_window(
                &qv,
                &kv,
                &vv,
                &o,
                &lse,
                g,
                (causal, window),
                scale,
                compute,
            )?;
            Ok(vec![Some(dq), Some(dk), Some(dv)])
        })
    }
}

/// Fewest queries for which `Var::attention` takes the fused kernel: it runs a work-item per
/// query, so a few decoding queries are faster through the composed GEMV and softmax.
pub const FLASH_MIN_QUERIES: usize = 16;
