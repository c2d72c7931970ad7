//! One-token decoding through the fused decode ops: the embedding lookup, one decode_block per layer, and the final RMSNorm folded into the output projection.
use super::block::plain;
use super::cache::KvCache;
use super::model::Llama;
use super::norm::Norm;
use netcl_nn::{Linear, RmsNorm};
use netcl_ops::{
    DType, DecodeBlock, Error, KvWrite, Result, RmsScale, Tensor, DECODE_MAX_HEAD_DIM,
};

fn scale(norm: &Norm) -> Result<RmsScale> {
    let n: &RmsNorm = norm
        .rms()
        .ok_or_else(|| Error::invalid("Llama::decode", "a LayerNorm model has no fused decode"))?;
    Ok(RmsScale {
        weight: n.weight.value().clone(),
        eps: n.eps,
    })
}

/// Error unless `ids` is I32 `[b]`, one token per row of a cache of batch `b`.
pub(super) fn check_ids(op: &str, ids: &Tensor, b: usize) -> Result<()> {
    if ids.shape() != [b] || ids.dtype() != DType::I32 {
        return Err(Error::shape(
            op,
            format!(
                "token ids are {} {:?}; need I32 [{b}] for a cache of batch {b}",
                ids.dtype(),
                ids.shape()
            ),
        ));
    }
    Ok(())
}

impl Llama {
    /// Whether [`Llama::decode`] runs this model: RMSNorm, SwiGLU and RoPE, no LoRA adapter,
    /// biases on all or none of q, k and v (and of gate and up), an even head dim of at most 256.
    pub fn decode_supported(&self) -> bool {
        let (hd, arch) = (self.config.head_dim(), &self.config.arch);
        let alike = |g: &[&Linear]| g.iter().all(|l| l.bias.is_some() == g[0].bias.is_some());
        let linears = self.layers.iter().all(|l| {
            let (a, f) = (&l.attention, &l.feed_forward);
            let mut all = vec![&a.wq, &a.wk, &a.wv, &a.wo];
            all.extend(f.linears());
            let gate_up = f.w3.as_ref().is_some_and(|w3| alike(&[&f.w1, w3]));
            gate_up && all.iter().all(|lin| lin.lora.is_none()) && alike(&[&a.wq, &a.wk, &a.wv])
        });
        let output = self.output.as_ref().is_none_or(plain);
        let blocks = !arch.layer_norm && !arch.gelu_mlp && !arch.learned_positions;
        blocks && linears && output && hd.is_multiple_of(2) && hd <= DECODE_MAX_HEAD_DIM
    }

    /// Logits `[B, vocab]` for one new token per row (`ids`: I32 `[B]` on the model's device)
    /// after everything `cache` holds: the tokens' keys and values are written at `cache.len()`
    /// and the cache advances by one. `pads` (I32 `[B]`): how many leading cache positions of
    /// each row are padding (batched prompts of different lengths); row b then sits at position
    /// `cache.len() - pads[b]` and attends to the positions from `pads[b]` on. One kernel per
    /// layer on OpenCL ([`Tensor::decode_block`]) plus three (embedding; the cache position's
    /// advance; final norm with the output projection); the same logits as
    /// [`Llama::logits`] with the cache, up to rounding.
    pub fn decode(&self, ids: &Tensor, cache: &KvCache, pads: Option<&Tensor>) -> Result<Tensor> {
        let op = "Llama::decode";
        let cfg = &self.config;
        check_ids(op, ids, cache.batch())?;
        if !self.decode_supported() {
            return Err(Error::invalid(
                op,
                format!(
                    "projections with a bias or a LoRA adapter, LayerNorm, GELU or learned \
                     positions, or head dim {} (odd or above {DECODE_MAX_HEAD_DIM}): use \
                     Llama::logits",
                    cfg.head_dim()
                ),
            ));
        }
        cache.check_room(1)?;
        let pos = cache.position();
        // The biases of stacked projections as one tensor: a view where they lie side by side
        // (as Llama::new makes them and imports keep them), else joined by a copy.
        let biases = |lins: &[&Linear]| -> Result<Option<Tensor>> {
            let b: Vec<&Tensor> = lins
                .iter()
                .filter_map(|l| l.bias.as_ref())
                .map(|p| p.value())
                .collect();
            if b.is_empty() {
                return Ok(None);
            }
            match Tensor::joined(&b, 0) {
                Some(t) => Ok(Some(t)),
                None => Tensor::concat(&b, 0).map(Some),
            }
        };
        let bias = |lin: &Linear| lin.bias.as_ref().map(|p| p.value().clone());
        let mut h = self.tok_embeddings.weight.value().embedding(ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (a, f) = (&layer.attention, &layer.feed_forward);
            let w = |lin: &Linear| lin.weight.value().clone();
            let (k_cache, v_cache) = cache.layer(i)?;
            let kv = KvWrite {
                k_cache: k_cache.clone(),
                v_cache: v_cache.clone(),
                pos: pos.clone(),
                pads: pads.cloned(),
                style: cfg.rope_style,
                freqs: a.freqs.clone(),
            };
            let up =
                f.w3.as_ref()
                    .ok_or_else(|| Error::invalid(op, "no up projection"))?;
            let block = DecodeBlock {
                attention_norm: scale(&layer.attention_norm)?,
                wq: w(&a.wq),
                wk: w(&a.wk),
                wv: w(&a.wv),
                qkv_bias: biases(&[&a.wq, &a.wk, &a.wv])?,
                kv,
                heads: cfg.n_heads,
                window: cfg.arch.sliding_window,
                wo: w(&a.wo),
                wo_bias: bias(&a.wo),
                ffn_norm: scale(&layer.ffn_norm)?,
                gate: w(&f.w1),
                up: w(up),
                gate_up_bias: biases(&[&f.w1, up])?,
                down: w(&f.w2),
                down_bias: bias(&f.w2),
            };
            h = h.decode_block(&block)?;
        }
        cache.advance(1)?;
        let out = match &self.output {
            Some(o) => o.weight.value(),
            None => self.tok_embeddings.weight.value(),
        };
        h.decode_linear(Some(&scale(&self.norm)?), out, None)
    }
}
