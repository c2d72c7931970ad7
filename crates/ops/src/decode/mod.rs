//! One-token decoding ops for pre-norm decoder blocks (RMSNorm, RoPE attention with a KV cache, gated MLP: the Llama, Qwen2 and Mistral families) in five kernels, or all five in one: GEMV with a fused RMSNorm and a residual, SwiGLU or RoPE-and-KV-cache epilogue, single-query attention over a KV cache, and the whole block. Ops on tensors like any other family (the model crate composes them), so they live with the kernel machinery they launch through.
//!
//! A decode step reads each weight once for a handful of rows, so its cost is the number of
//! kernels it launches; these ops fold a layer's norms, projections, rotations, cache writes,
//! activations and residual adds into five. Inputs are rows `x` (B, K) with small B; weights
//! (N, K) as `Linear` stores them; every tensor on one device and (but for the I32 `pads`) of
//! one float dtype.
mod block;
mod block_opencl;
mod checks;
mod opencl;
mod reference;

pub use block::DecodeBlock;

use crate::base::checks::same_float;
use crate::base::dispatch::dispatch;
use crate::base::rope_types::{RopeFreqs, RopeStyle};
use crate::base::tensor::Tensor;
use checks::{check_attention, check_qkv};
use netcl_core_devices::{Error, Result};

/// Largest head dim [`Tensor::decode_attention`] takes (two dims per work-item).
pub const DECODE_MAX_HEAD_DIM: usize = 256;

/// Where [`Tensor::decode_qkv`] writes this step's keys and values, and how it rotates them.
#[derive(Clone, Debug)]
pub struct KvWrite {
    /// (B, Hkv, S, hd), contiguous: the keys of one layer.
    pub k_cache: Tensor,
    /// (B, Hkv, S, hd), contiguous: the values of one layer.
    pub v_cache: Tensor,
    /// I32 (1) on the op's device: the cache position written, `at` (`< S`). Read by the kernel,
    /// so a captured decode step replays at the position the buffer holds then; a position
    /// outside the cache writes nothing and is reported at the next read (as a bad index is).
    pub pos: Tensor,
    /// (B) I32 left padding of each row (batched prompts of different lengths): row b's RoPE
    /// position is `at - pads[b]`; `None`: every row is at `at`. Each pad must be `<= at`.
    pub pads: Option<Tensor>,
    pub style: RopeStyle,
    pub freqs: RopeFreqs,
}

/// The RMSNorm folded into a decode GEMV's input: `x / rms(x) * weight` over K.
#[derive(Clone, Debug)]
pub struct RmsScale {
    /// (K), the input's dtype.
    pub weight: Tensor,
    pub eps: f64,
}

/// What a decode GEMV does with its dot products.
#[derive(Clone, Debug)]
enum Epilogue {
    /// y = W0·x (+ residual (B, N0)).
    Plain(Option<Tensor>),
    /// y = silu(W0·x) * (W1·x).
    SwiGlu,
    /// q = rope(Wq·x) returned; rope(Wk·x) and Wv·x written into the caches.
    Qkv(Box<KvWrite>),
}

/// A checked decode GEMV: x (B, K) contiguous, weights (N_i, K) contiguous.
#[derive(Clone, Debug)]
struct DecodeGemv {
    x: Tensor,
    norm: Option<RmsScale>,
    weights: Vec<Tensor>,
    epilogue: Epilogue,
    /// The weights' biases joined in their order (sum of N_i), added before the epilogue.
    bias: Option<Tensor>,
}

impl_op!(DecodeGemv, Tensor, "decode_gemv", gemv);

/// A checked decode attention: q (B, H·hd), caches (B, Hkv, S, hd), keys `0..=pos[0]`.
#[derive(Clone, Debug)]
struct DecodeAttention {
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    pos: Tensor,
    pads: Option<Tensor>,
    heads: usize,
    /// Sliding window: only the last `window` keys (None: all).
    window: Option<usize>,
}

impl_op!(DecodeAttention, Tensor, "decode_attention", attention);

impl DecodeGemv {
    /// Error unless x (B, K), the norm's weight (K) and the weights (N_i, K) fit `op`.
    fn check(op: &str, x: &Tensor, norm: Option<&RmsScale>, weights: &[&Tensor]) -> Result<()> {
        if x.ndim() != 2 || x.shape[0] == 0 || x.shape[1] == 0 {
            return Err(Error::shape(
                op,
                format!("x is {:?}; need non-empty rows (B, K)", x.shape),
            ));
        }
        Self::check_weights(op, x, x.shape[1], norm, weights)
    }

    /// Error unless the norm's weight (K) and the weights (N_i, K) have x's float dtype and
    /// device (x's K may be another's: a later stage's input in decode_block).
    fn check_weights(
        op: &str,
        x: &Tensor,
        k: usize,
        norm: Option<&RmsScale>,
        weights: &[&Tensor],
    ) -> Result<()> {
        let mut all = vec![x];
        all.extend(weights);
        all.extend(norm.map(|n| &n.weight));
        same_float(op, &all)?;
        for (i, w) in weights.iter().enumerate() {
            if w.ndim() != 2 || w.shape[1] != k || w.shape[0] == 0 {
                return Err(Error::shape(
                    op,
                    format!(
                        "weight {i} is {:?}; need (N, {k}) for inputs of {k} columns",
                        w.shape
                    ),
                ));
            }
        }
        if let Some(n) = norm {
            if n.weight.shape != [k] || !(n.eps.is_finite() && n.eps >= 0.0) {
                return Err(Error::shape(
                    op,
                    format!(
                        "norm weight {:?} and eps {} for x {:?}: need ({k}) and a finite eps >= 0",
                        n.weight.shape, n.eps, x.shape
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Error unless `bias` (where given) is the weights' biases joined, of x's dtype.
    fn check_bias(op: &str, x: &Tensor, weights: &[&Tensor], bias: Option<&Tensor>) -> Result<()> {
        if let Some(b) = bias {
            same_float(op, &[x, b])?;
            let n: usize = weights.iter().map(|w| w.shape[0]).sum();
            if b.shape != [n] {
                return Err(Error::shape(
                    op,
                    format!("bias {:?}; need ({n}): the weights' biases joined", b.shape),
                ));
            }
        }
        Ok(())
    }

    /// The checked GEMV of `x` by `weights` with `epilogue` and the weights' joined biases,
    /// on x's device.
    fn run(
        x: &Tensor,
        norm: Option<&RmsScale>,
        (weights, bias): (&[&Tensor], Option<&Tensor>),
        epilogue: Epilogue,
    ) -> Result<Tensor> {
        Self::check_bias("decode_gemv", x, weights, bias)?;
        let desc = DecodeGemv {
            x: x.clone(),
            norm: norm.cloned(),
            weights: weights.iter().map(|&w| w.clone()).collect(),
            epilogue,
            bias: bias.cloned(),
        };
        dispatch(&x.device, &desc)
    }
}

impl Tensor {
    /// `norm(x) · wᵀ (+ residual)` for rows x (B, K), w (N, K), residual (B, N): one kernel.
    pub fn decode_linear(
        &self,
        norm: Option<&RmsScale>,
        w: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.decode_linear_biased(norm, w, None, residual)
    }

    /// [`Tensor::decode_linear`] with a bias (N) added to the product.
    pub fn decode_linear_biased(
        &self,
        norm: Option<&RmsScale>,
        w: &Tensor,
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let op = "decode_linear";
        DecodeGemv::check(op, self, norm, &[w])?;
        if let Some(r) = residual {
            same_float(op, &[self, r])?;
            if r.shape != [self.shape[0], w.shape[0]] {
                return Err(Error::shape(
                    op,
                    format!(
                        "residual is {:?}; need ({}, {})",
                        r.shape, self.shape[0], w.shape[0]
                    ),
                ));
            }
        }
        let epilogue = Epilogue::Plain(residual.cloned());
        DecodeGemv::run(self, norm, (&[w], bias), epilogue)
    }

    /// `silu(norm(x) · gateᵀ) * (norm(x) · upᵀ)` for rows x (B, K), gate and up (N, K): one
    /// kernel, (B, N).
    pub fn decode_swiglu(
        &self,
        norm: Option<&RmsScale>,
        gate: &Tensor,
        up: &Tensor,
    ) -> Result<Tensor> {
        self.decode_swiglu_biased(norm, gate, up, None)
    }

    /// [`Tensor::decode_swiglu`] with the gate's and up's biases joined (2N) added to the products.
    pub fn decode_swiglu_biased(
        &self,
        norm: Option<&RmsScale>,
        gate: &Tensor,
        up: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let op = "decode_swiglu";
        DecodeGemv::check(op, self, norm, &[gate, up])?;
        if gate.shape != up.shape {
            return Err(Error::shape(
                op,
                format!("gate {:?} and up {:?} differ", gate.shape, up.shape),
            ));
        }
        DecodeGemv::run(self, norm, (&[gate, up], bias), Epilogue::SwiGlu)
    }

    /// One token's attention inputs in one kernel: `q = rope(norm(x) · wqᵀ)` is returned (B,
    /// H·hd); `rope(norm(x) · wkᵀ)` and `norm(x) · wvᵀ` are written into `kv`'s caches at
    /// the position `kv.pos` holds. wq (H·hd, K), wk and wv (Hkv·hd, K) with hd the caches' last dim.
    pub fn decode_qkv(
        &self,
        norm: Option<&RmsScale>,
        wq: &Tensor,
        wk: &Tensor,
        wv: &Tensor,
        kv: &KvWrite,
    ) -> Result<Tensor> {
        self.decode_qkv_biased(norm, [wq, wk, wv], None, kv)
    }

    /// [`Tensor::decode_qkv`] with the q, k and v biases joined (H·hd + 2 Hkv·hd) added to the
    /// products before RoPE (Qwen2's).
    pub fn decode_qkv_biased(
        &self,
        norm: Option<&RmsScale>,
        [wq, wk, wv]: [&Tensor; 3],
        bias: Option<&Tensor>,
        kv: &KvWrite,
    ) -> Result<Tensor> {
        let op = "decode_qkv";
        DecodeGemv::check(op, self, norm, &[wq, wk, wv])?;
        check_qkv(op, self, [wq, wk, wv], kv)?;
        let epilogue = Epilogue::Qkv(Box::new(kv.clone()));
        DecodeGemv::run(self, norm, (&[wq, wk, wv], bias), epilogue)
    }

    /// Attention of one query per row over a KV cache: q (B, H·hd) against keys and values
    /// `0..=at` of the caches (B, Hkv, S, hd), where `pos` (I32 (1), read by the kernel as in
    /// [`KvWrite::pos`]) holds the query's position `at`; query head h uses key/value head h /
    /// (H / Hkv); keys before `pads[b]` (I32 (B)) are hidden from row b. Scores are scaled by
    /// 1/sqrt(hd). One kernel, (B, H·hd).
    pub fn decode_attention(
        &self,
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: &Tensor,
        pads: Option<&Tensor>,
        heads: usize,
    ) -> Result<Tensor> {
        self.decode_attention_window(k_cache, v_cache, pos, pads, heads, None)
    }

    /// [`Tensor::decode_attention`] where the token sees only its last `window` keys (itself
    /// included; None: every key), as Mistral's sliding window.
    pub fn decode_attention_window(
        &self,
        k_cache: &Tensor,
        v_cache: &Tensor,
        pos: &Tensor,
        pads: Option<&Tensor>,
        heads: usize,
        window: Option<usize>,
    ) -> Result<Tensor> {
        let op = "decode_attention";
        check_attention(
            op,
            self,
            &self.shape,
            (k_cache, v_cache),
            (pos, pads),
            (heads, window),
        )?;
        let desc = DecodeAttention {
            q: self.clone(),
            k_cache: k_cache.clone(),
            v_cache: v_cache.clone(),
            pos: pos.clone(),
            pads: pads.cloned(),
            heads,
            window,
        };
        dispatch(&self.device, &desc)
    }
}
