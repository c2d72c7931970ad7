//! One-token decoding through the fused decode ops: the embedding lookup, five kernels per layer, and the final RMSNorm folded into the output projection.
use super::block::plain;
use super::cache::KvCache;
use super::model::Llama;
use netcl_nn::{Linear, RmsNorm};
use netcl_ops::{DType, Error, KvWrite, Result, RmsScale, Tensor, DECODE_MAX_HEAD_DIM};

fn scale(norm: &RmsNorm) -> RmsScale {
    RmsScale {
        weight: norm.weight.value().clone(),
        eps: norm.eps,
    }
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
    /// Whether [`Llama::decode`] runs this model: every projection without bias or LoRA
    /// adapter, an even head dim of at most 256.
    pub fn decode_supported(&self) -> bool {
        let hd = self.config.head_dim();
        let linears = self.layers.iter().all(|l| {
            let (a, f) = (&l.attention, &l.feed_forward);
            [&a.wq, &a.wk, &a.wv, &a.wo, &f.w1, &f.w2, &f.w3]
                .iter()
                .all(|lin| plain(lin))
        });
        let output = self.output.as_ref().is_none_or(plain);
        linears && output && hd.is_multiple_of(2) && hd <= DECODE_MAX_HEAD_DIM
    }

    /// Logits `[B, vocab]` for one new token per row (`ids`: I32 `[B]` on the model's device)
    /// after everything `cache` holds: the tokens' keys and values are written at `cache.len()`
    /// and the cache advances by one. `pads` (I32 `[B]`): how many leading cache positions of
    /// each row are padding (batched prompts of different lengths); row b then sits at position
    /// `cache.len() - pads[b]` and attends to the positions from `pads[b]` on. Five kernels per
    /// layer plus three (embedding; the cache position's advance; final norm with the output
    /// projection); the same logits as
    /// [`Llama::logits`] with the cache, up to rounding.
    pub fn decode(&self, ids: &Tensor, cache: &KvCache, pads: Option<&Tensor>) -> Result<Tensor> {
        let op = "Llama::decode";
        let cfg = &self.config;
        check_ids(op, ids, cache.batch())?;
        if !self.decode_supported() {
            return Err(Error::invalid(
                op,
                format!(
                    "projections with a bias or a LoRA adapter, or head dim {} (odd or above \
                     {DECODE_MAX_HEAD_DIM}): use Llama::logits",
                    cfg.head_dim()
                ),
            ));
        }
        cache.check_room(1)?;
        let pos = cache.position();
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
            let norm = scale(&layer.attention_norm);
            let q = h.decode_qkv(Some(&norm), &w(&a.wq), &w(&a.wk), &w(&a.wv), &kv)?;
            let o = q.decode_attention(k_cache, v_cache, pos, pads, cfg.n_heads)?;
            h = o.decode_linear(None, &w(&a.wo), Some(&h))?;
            let s = h.decode_swiglu(Some(&scale(&layer.ffn_norm)), &w(&f.w1), &w(&f.w3))?;
            h = s.decode_linear(None, &w(&f.w2), Some(&h))?;
        }
        cache.advance(1)?;
        let out = match &self.output {
            Some(o) => o.weight.value(),
            None => self.tok_embeddings.weight.value(),
        };
        h.decode_linear(Some(&scale(&self.norm)), out, None)
    }
}
