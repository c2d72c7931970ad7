//! One Llama block's decode step as one op: its five decode ops in turn (the host's reference and the fallback), one persistent kernel on OpenCL (block_opencl.rs).
use super::checks::{check_attention, check_qkv};
use super::{block_opencl as opencl, reference};
use super::{DecodeGemv, KvWrite, RmsScale};
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};

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
pub(super) struct DecodeBlockOp {
    pub(super) x: Tensor,
    pub(super) block: DecodeBlock,
}

impl_op!(DecodeBlockOp, Tensor, "decode_block", block);

impl Tensor {
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
