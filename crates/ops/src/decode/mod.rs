//! One-token decoding ops (a Llama layer in five kernels, or all five in one): GEMV with a fused RMSNorm and a residual, SwiGLU or RoPE-and-KV-cache epilogue, single-query attention over a KV cache, and the whole block.
//!
//! A decode step reads each weight once for a handful of rows, so its cost is the number of
//! kernels it launches; these ops fold a layer's norms, projections, rotations, cache writes,
//! activations and residual adds into five. Inputs are rows `x` (B, K) with small B; weights
//! (N, K) as `Linear` stores them; every tensor on one device and (but for the I32 `pads`) of
//! one float dtype.
mod opencl;
mod reference;

use crate::base::checks::{check_dtype, check_float, same_float};
use crate::base::dispatch::dispatch;
use crate::base::rope_types::{RopeFreqs, RopeStyle};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

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

/// The weights, cache and sizes of one Llama block for [`Tensor::decode_block`]: what its five
/// decode ops take, in their order.
#[derive(Clone, Debug)]
pub struct DecodeBlock {
    pub attention_norm: RmsScale,
    /// (H·hd, d), (Hkv·hd, d), (Hkv·hd, d).
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    /// The q, k and v biases joined (H·hd + 2 Hkv·hd).
    pub qkv_bias: Option<Tensor>,
    pub kv: KvWrite,
    pub heads: usize,
    /// Sliding window of the attention (None: every key).
    pub window: Option<usize>,
    /// (d, H·hd) and its bias (d).
    pub wo: Tensor,
    pub wo_bias: Option<Tensor>,
    pub ffn_norm: RmsScale,
    /// (F, d) each, and their biases joined (2F).
    pub gate: Tensor,
    pub up: Tensor,
    pub gate_up_bias: Option<Tensor>,
    /// (d, F) and its bias (d).
    pub down: Tensor,
    pub down_bias: Option<Tensor>,
}

/// A checked decode block: x (B, d).
#[derive(Clone, Debug)]
struct DecodeBlockOp {
    x: Tensor,
    block: DecodeBlock,
}

impl_op!(DecodeBlockOp, Tensor, "decode_block", block);

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

/// Error unless `t` is (B, Hkv, S, hd) and contiguous with x's dtype and device.
fn check_cache(op: &str, x: &Tensor, t: &Tensor, what: &str) -> Result<()> {
    same_float(op, &[x, t])?;
    if t.ndim() != 4 || !t.is_contiguous() || t.offset != 0 {
        return Err(Error::shape(
            op,
            format!(
                "{what} is {:?} (strides {:?}, offset {}); need a whole contiguous (B, Hkv, S, hd)",
                t.shape, t.strides, t.offset
            ),
        ));
    }
    Ok(())
}

/// Error unless `pads` is an I32 (B) tensor on x's device.
fn check_pads(op: &str, x: &Tensor, pads: Option<&Tensor>, b: usize) -> Result<()> {
    if let Some(p) = pads {
        check_dtype(op, p, "pads", DType::I32)?;
        crate::base::checks::check_device(op, x, p, "pads")?;
        if p.shape != [b] {
            return Err(Error::shape(
                op,
                format!("pads are {:?}; need ({b}) for x {:?}", p.shape, x.shape),
            ));
        }
    }
    Ok(())
}

/// Error unless `pos` is an I32 (1) tensor on x's device.
fn check_position(op: &str, x: &Tensor, pos: &Tensor) -> Result<()> {
    check_dtype(op, pos, "position", DType::I32)?;
    crate::base::checks::check_device(op, x, pos, "position")?;
    if pos.shape != [1] {
        return Err(Error::shape(
            op,
            format!("the position is {:?}; need (1)", pos.shape),
        ));
    }
    Ok(())
}

/// Error unless the caches, pads, position and frequencies of `kv` fit x (B, K) projected by wq
/// (H·hd, K), wk and wv (Hkv·hd, K).
fn check_qkv(op: &str, x: &Tensor, [wq, wk, wv]: [&Tensor; 3], kv: &KvWrite) -> Result<()> {
    check_cache(op, x, &kv.k_cache, "k_cache")?;
    check_cache(op, x, &kv.v_cache, "v_cache")?;
    let cs = &kv.k_cache.shape;
    let (b, hkv, hd) = (cs[0], cs[1], cs[3]);
    let fits = kv.v_cache.shape == *cs
        && b == x.shape[0]
        && hd.is_multiple_of(2)
        && wq.shape[0].is_multiple_of(hd)
        && wk.shape[0] == hkv * hd
        && wv.shape[0] == hkv * hd;
    if !fits {
        return Err(Error::shape(
            op,
            format!(
                "x {:?}, wq {:?}, wk {:?}, wv {:?}, caches {:?} and {:?}: need caches \
                     (B, Hkv, S, hd) with an even hd, wq (H·hd, K), wk and wv (Hkv·hd, K)",
                x.shape, wq.shape, wk.shape, wv.shape, cs, kv.v_cache.shape
            ),
        ));
    }
    check_pads(op, x, kv.pads.as_ref(), b)?;
    check_position(op, x, &kv.pos)?;
    if let RopeFreqs::Theta(theta) = kv.freqs {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::invalid(
                op,
                format!("theta {theta} must be finite and positive"),
            ));
        }
    }
    if let RopeFreqs::Table(t) = &kv.freqs {
        crate::base::checks::check_device(op, x, t, "frequency table")?;
        check_dtype(op, t, "frequency table", crate::acc_dtype(x.dtype))?;
        if t.shape != [hd / 2] || !t.is_contiguous() {
            return Err(Error::shape(
                op,
                format!(
                    "frequency table {:?}; need contiguous ({})",
                    t.shape,
                    hd / 2
                ),
            ));
        }
    }
    Ok(())
}

/// Error unless queries of `q_shape` (B, H·hd) and x's dtype fit the caches (B, Hkv, S, hd), the
/// position, pads, head count and window of a decode attention.
fn check_attention(
    op: &str,
    x: &Tensor,
    q_shape: &[usize],
    (k_cache, v_cache): (&Tensor, &Tensor),
    (pos, pads): (&Tensor, Option<&Tensor>),
    (heads, window): (usize, Option<usize>),
) -> Result<()> {
    if let Some(w) = window.filter(|&w| w == 0 || w > u32::MAX as usize) {
        return Err(Error::invalid(
            op,
            format!("sliding window {w}: need 1 to 2^32 - 1 keys"),
        ));
    }
    check_float(op, x, "q")?;
    check_cache(op, x, k_cache, "k_cache")?;
    check_cache(op, x, v_cache, "v_cache")?;
    let cs = &k_cache.shape;
    let (b, hkv, s, hd) = (cs[0], cs[1], cs[2], cs[3]);
    let fits = q_shape.len() == 2
        && v_cache.shape == *cs
        && q_shape[0] == b
        && heads > 0
        && hkv > 0
        && heads.is_multiple_of(hkv)
        && q_shape[1] == heads * hd
        && (1..=DECODE_MAX_HEAD_DIM).contains(&hd);
    if !fits || s == 0 {
        return Err(Error::shape(
            op,
            format!(
                "q {:?} with {heads} heads over caches {cs:?} and {:?}: need q (B, H·hd), \
                     caches (B, Hkv, S, hd) with S > 0, H a multiple of Hkv and hd <= \
                     {DECODE_MAX_HEAD_DIM}",
                q_shape, v_cache.shape
            ),
        ));
    }
    check_pads(op, x, pads, b)?;
    check_position(op, x, pos)?;
    Ok(())
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

    /// One token per row through a whole Llama block: `h = x + wo · attention(q)` with `q =
    /// rope(norm(x) · wqᵀ)` (keys and values written into the caches as in
    /// [`Tensor::decode_qkv`]), then `h + down · swiglu(norm(h))`. x (B, d); (B, d). The same
    /// values as the five ops in turn; on an OpenCL device one persistent kernel.
    pub fn decode_block(&self, block: &DecodeBlock) -> Result<Tensor> {
        let op = "decode_block";
        let blk = block;
        let qkv = [&blk.wq, &blk.wk, &blk.wv];
        DecodeGemv::check(op, self, Some(&blk.attention_norm), &qkv)?;
        DecodeGemv::check_bias(op, self, &qkv, blk.qkv_bias.as_ref())?;
        check_qkv(op, self, qkv, &blk.kv)?;
        let (b, d, qd) = (self.shape[0], self.shape[1], blk.wq.shape[0]);
        let kv = &blk.kv;
        let at = (&kv.pos, kv.pads.as_ref());
        let caches = (&kv.k_cache, &kv.v_cache);
        check_attention(op, self, &[b, qd], caches, at, (blk.heads, blk.window))?;
        let f = blk.gate.shape[0];
        // The later GEMVs: their inputs' columns, norm, weights and joined biases.
        let gate_up = [&blk.gate, &blk.up];
        let later = [
            (qd, None, &[&blk.wo][..], &blk.wo_bias),
            (d, Some(&blk.ffn_norm), &gate_up[..], &blk.gate_up_bias),
            (f, None, &[&blk.down][..], &blk.down_bias),
        ];
        for (k, norm, w, bias) in later {
            DecodeGemv::check_weights(op, self, k, norm, w)?;
            DecodeGemv::check_bias(op, self, w, bias.as_ref())?;
        }
        if blk.wo.shape[0] != d || blk.up.shape != blk.gate.shape || blk.down.shape[0] != d {
            return Err(Error::shape(
                op,
                format!(
                    "wo {:?}, gate {:?}, up {:?}, down {:?} for x {:?}: need wo (d, H·hd), gate \
                     and up (F, d), down (d, F)",
                    blk.wo.shape, blk.gate.shape, blk.up.shape, blk.down.shape, self.shape
                ),
            ));
        }
        let desc = DecodeBlockOp {
            x: self.clone(),
            block: block.clone(),
        };
        dispatch(&self.device, &desc)
    }
}
