//! Fused scaled dot-product attention: softmax(q·kᵀ·scale, causal or not)·v in one kernel that never materialises the scores (online softmax), its backward (dq, dk, dv kernels), grouped-query heads.
//!
//! q is (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv: query head h attends
//! with key/value head h / (H / Hkv), so grouped-query attention needs no repeated keys. Inputs
//! may be strided views (a transposed (B, T, H, D) projection, a KV cache's prefix) as long as
//! the last dim is dense. Outputs are laid out (B, T, H, D) and returned as (B, H, T, D) views,
//! so the usual transpose back to (B, T, H·D) costs no copy. Causal: query i sees keys
//! j <= i + Tk - Tq (the queries being the last Tq positions); a query that sees no key gets
//! output 0 and no gradient (the composed `Tensor::attention` gives NaN there). A sliding window
//! W (causal) hides keys j <= i + Tk - Tq - W too: each query sees its last W keys at most
//! (Mistral's `sliding_window`).
mod opencl;
mod reference;

use crate::base::acc::acc_dtype;
use crate::base::checks::same_float;
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// Largest head dim the kernels take.
pub const FLASH_ATTENTION_MAX_HEAD_DIM: usize = 128;

/// The checked sizes of one attention: batch, query heads, key/value heads, query and key
/// lengths, head dim; causal masking and the score scale.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dims {
    b: usize,
    h: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
    /// Causal attention over at most this many of the last keys (implies `causal`).
    window: Option<usize>,
    scale: f64,
    /// The dtype the products run in when not the operands' (bf16 or f16 for f32 operands).
    compute: Option<DType>,
}

impl Dims {
    /// The number of keys query `i` sees.
    fn visible(&self, i: usize) -> usize {
        if !self.causal {
            return self.tk;
        }
        (i + 1 + self.tk).saturating_sub(self.tq).min(self.tk)
    }

    /// The first key query `i` sees (0 without a window): it sees `first(i)..visible(i)`.
    fn first(&self, i: usize) -> usize {
        match self.window {
            Some(w) if self.causal => self.visible(i).saturating_sub(w),
            _ => 0,
        }
    }
}

/// Why `q`, `k`, `v` cannot go to the fused kernels, or their sizes.
fn dims(
    op: &str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: Option<f64>,
) -> Result<Dims> {
    same_float(op, &[q, k, v])?;
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs.len() != 4 || ks.len() != 4 || ks != vs || qs[0] != ks[0] || qs[3] != ks[3] {
        return Err(Error::shape(
            op,
            format!("q {qs:?}, k {ks:?}, v {vs:?}: need q (B, H, Tq, D) and k, v (B, Hkv, Tk, D)"),
        ));
    }
    let (b, h, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, tk) = (ks[1], ks[2]);
    if hkv == 0 || h % hkv != 0 {
        return Err(Error::shape(
            op,
            format!(
                "{h} query heads are not a multiple of {hkv} key/value heads (q {qs:?}, k {ks:?})"
            ),
        ));
    }
    if d == 0 || d % 4 != 0 || d > FLASH_ATTENTION_MAX_HEAD_DIM {
        return Err(Error::shape(
            op,
            format!(
                "head dim {d} (q {qs:?}) must be a multiple of 4 from 4 to {FLASH_ATTENTION_MAX_HEAD_DIM}"
            ),
        ));
    }
    if b == 0 || h == 0 || tq == 0 || tk == 0 {
        return Err(Error::shape(
            op,
            format!("q {qs:?}, k {ks:?}: empty attention"),
        ));
    }
    Ok(Dims {
        b,
        h,
        hkv,
        tq,
        tk,
        d,
        causal,
        window: None,
        scale: scale.unwrap_or(1.0 / (d as f64).sqrt()),
        compute: None,
    })
}

/// `dims` with a sliding window of `window` keys (None: none); a window needs causal attention
/// and at least one key.
fn windowed(op: &str, mut dims: Dims, window: Option<usize>) -> Result<Dims> {
    if let Some(w) = window {
        if w == 0 || !dims.causal || w > i32::MAX as usize {
            return Err(Error::invalid(
                op,
                format!(
                    "sliding window {w} (causal {}): a window needs causal attention and 1 to                      2^31 - 1 keys",
                    dims.causal
                ),
            ));
        }
    }
    dims.window = window;
    Ok(dims)
}

/// `dims` computing in `compute`: None or the operands' own dtype, or bf16/f16 for f32 operands.
fn computing(op: &str, mut dims: Dims, dtype: DType, compute: Option<DType>) -> Result<Dims> {
    match compute {
        Some(c) if c != dtype => {
            if dtype != DType::F32 || !matches!(c, DType::BF16 | DType::F16) {
                return Err(Error::dtype(
                    op,
                    format!("{dtype} operands cannot compute in {c}; only f32 in bf16 or f16"),
                ));
            }
            dims.compute = Some(c);
        }
        _ => dims.compute = None,
    }
    Ok(dims)
}

/// The forward of f32 operands computing in `dims.compute`, through casts: for devices without
/// a kernel that reads and writes f32 around 16-bit products.
fn narrowed_forward(desc: &FlashAttention) -> Result<(Tensor, Tensor)> {
    let (c, d) = (desc.dims.compute.unwrap_or(desc.q.dtype()), desc.dims);
    let (q, k, v) = (
        desc.q.to_dtype(c)?,
        desc.k.to_dtype(c)?,
        desc.v.to_dtype(c)?,
    );
    let (out, lse) = match d.window {
        None => Tensor::flash_attention(&q, &k, &v, d.causal, Some(d.scale))?,
        w => Tensor::flash_attention_window(&q, &k, &v, w, Some(d.scale), None)?,
    };
    Ok((out.to_dtype(desc.q.dtype())?, lse))
}

/// The backward likewise.
fn narrowed_backward(desc: &FlashAttentionBackward) -> Result<(Tensor, Tensor, Tensor)> {
    let (c, d) = (desc.dims.compute.unwrap_or(desc.q.dtype()), desc.dims);
    let low = |t: &Tensor| t.to_dtype(c);
    let (q, k, v) = (low(&desc.q)?, low(&desc.k)?, low(&desc.v)?);
    let (out, grad) = (low(&desc.out)?, low(&desc.grad)?);
    let (dq, dk, dv) = Tensor::flash_attention_backward_window(
        &q,
        &k,
        &v,
        &out,
        &desc.lse,
        &grad,
        (d.causal, d.window),
        Some(d.scale),
        None,
    )?;
    let f = desc.q.dtype();
    Ok((dq.to_dtype(f)?, dk.to_dtype(f)?, dv.to_dtype(f)?))
}

/// A checked forward: out (B, H, Tq, D) and the rows' log-sum-exp (B, H, Tq).
#[derive(Clone, Debug)]
struct FlashAttention {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dims: Dims,
}

impl_op!(FlashAttention, (Tensor, Tensor), "flash_attention", forward);

/// A checked backward: dq (B, H, Tq, D), dk and dv (B, Hkv, Tk, D).
#[derive(Clone, Debug)]
struct FlashAttentionBackward {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    dims: Dims,
}

impl_op!(
    FlashAttentionBackward,
    (Tensor, Tensor, Tensor),
    "flash_attention_backward",
    backward
);

/// Error unless `t` (named `what`) has `shape`.
fn need_shape(op: &str, t: &Tensor, what: &str, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::shape(
            op,
            format!("{what} is {:?}; expected {shape:?}", t.shape()),
        ));
    }
    Ok(())
}

impl Tensor {
    /// Whether [`Tensor::flash_attention`] takes these operands (4-D, grouped heads, a head dim
    /// that is a multiple of 4 up to 128, nothing empty); callers fall back to the composed
    /// [`Tensor::attention`] otherwise.
    pub fn flash_attention_supports(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
        dims("flash_attention", q, k, v, false, None).is_ok()
    }

    /// softmax(q·kᵀ·scale)·v, causal or not, without materialising the scores: returns the
    /// output (B, H, Tq, D), a view of a (B, Tq, H, D) tensor, and each row's log-sum-exp of the
    /// scaled scores (B, H, Tq) in the accumulation dtype (f64 for f64, else f32), which the
    /// backward needs. `scale` defaults to 1/sqrt(D).
    pub fn flash_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<(Tensor, Tensor)> {
        Tensor::flash_attention_in(q, k, v, causal, scale, None)
    }

    /// [`Tensor::flash_attention`] of f32 operands with its products in `compute` (bf16 or f16;
    /// None: the operands' dtype), as autocast runs it: tensor cores read and write the f32
    /// tensors directly; other devices cast the operands and the output.
    pub fn flash_attention_in(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
        compute: Option<DType>,
    ) -> Result<(Tensor, Tensor)> {
        Tensor::flash_attention_masked(q, k, v, (causal, None), scale, compute)
    }

    /// [`Tensor::flash_attention_in`] of causal attention where each query sees at most its last
    /// `window` keys (None: all before it), as Mistral's sliding window.
    pub fn flash_attention_window(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
        scale: Option<f64>,
        compute: Option<DType>,
    ) -> Result<(Tensor, Tensor)> {
        Tensor::flash_attention_masked(q, k, v, (true, window), scale, compute)
    }

    /// The forward with its mask as (causal, window).
    fn flash_attention_masked(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        (causal, window): (bool, Option<usize>),
        scale: Option<f64>,
        compute: Option<DType>,
    ) -> Result<(Tensor, Tensor)> {
        let op = "flash_attention";
        let dims = windowed(op, dims(op, q, k, v, causal, scale)?, window)?;
        let dims = computing(op, dims, q.dtype(), compute)?;
        let op = FlashAttention {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            dims,
        };
        dispatch(q.device(), &op)
    }

    /// The gradients (dq, dk, dv) of [`Tensor::flash_attention`] given its inputs, its output
    /// `out`, its `lse` and the output's gradient `grad` (B, H, Tq, D); laid out like the
    /// forward's output. Three kernels: dq (with each row's rowsum(grad·out)), then dk and dv,
    /// each key summing over the query heads of its group. No atomics: deterministic.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attention_backward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        Tensor::flash_attention_backward_in(q, k, v, out, lse, grad, causal, scale, None)
    }

    /// [`Tensor::flash_attention_backward`] with the products in `compute`, as
    /// [`Tensor::flash_attention_in`].
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attention_backward_in(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
        causal: bool,
        scale: Option<f64>,
        compute: Option<DType>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let mask = (causal, None);
        Tensor::flash_attention_backward_window(q, k, v, out, lse, grad, mask, scale, compute)
    }

    /// [`Tensor::flash_attention_backward_in`] with the mask as (causal, sliding window), the
    /// backward of [`Tensor::flash_attention_window`] (`(true, window)`).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attention_backward_window(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
        (causal, window): (bool, Option<usize>),
        scale: Option<f64>,
        compute: Option<DType>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "flash_attention_backward";
        let dims = windowed(op, dims(op, q, k, v, causal, scale)?, window)?;
        let dims = computing(op, dims, q.dtype(), compute)?;
        same_float(op, &[q, out, grad])?;
        need_shape(op, out, "out", q.shape())?;
        need_shape(op, grad, "grad", q.shape())?;
        need_shape(op, lse, "lse", &q.shape()[..3])?;
        if lse.dtype() != acc_dtype(q.dtype()) || lse.device() != q.device() {
            return Err(Error::dtype(
                op,
                format!(
                    "lse is {} on {}; expected {} on {}",
                    lse.dtype(),
                    lse.device(),
                    acc_dtype(q.dtype()),
                    q.device()
                ),
            ));
        }
        let desc = FlashAttentionBackward {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            out: out.clone(),
            lse: lse.clone(),
            grad: grad.clone(),
            dims,
        };
        dispatch(q.device(), &desc)
    }
}
