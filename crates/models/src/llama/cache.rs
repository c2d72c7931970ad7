//! The KV cache: keys and values of every layer preallocated on the device for max_seq_len and written in place.
use super::config::LlamaConfig;
use netcl_ops::{fused_into, Device, Error, Expr, Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys and values of every layer, `[B, n_kv_heads, max_seq_len, head_dim]` each, allocated once.
/// A forward pass writes its `T` new positions at `len()` in place (one copy kernel per tensor)
/// and attends over the first `len() + T`; [`KvCache::advance`] then moves `len` on.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: AtomicUsize,
    max: usize,
}

impl KvCache {
    pub fn new(cfg: &LlamaConfig, batch: usize, device: &Device) -> Result<KvCache> {
        let shape = [batch, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim()];
        let make = || {
            (0..cfg.n_layers)
                .map(|_| Tensor::zeros(&shape, cfg.dtype, device))
                .collect::<Result<Vec<_>>>()
        };
        Ok(KvCache {
            k: make()?,
            v: make()?,
            len: AtomicUsize::new(0),
            max: cfg.max_seq_len,
        })
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn capacity(&self) -> usize {
        self.max
    }
    pub fn batch(&self) -> usize {
        self.k.first().map_or(0, |t| t.shape()[0])
    }
    /// Forget everything (the memory stays allocated).
    pub fn clear(&self) {
        self.len.store(0, Ordering::Release);
    }

    /// Error unless `t` more positions fit.
    pub fn check_room(&self, t: usize) -> Result<()> {
        if self.len() + t > self.max {
            return Err(Error::invalid(
                "KvCache",
                format!(
                    "{} cached + {t} new positions exceed max_seq_len {}",
                    self.len(),
                    self.max
                ),
            ));
        }
        Ok(())
    }

    /// Writes `k`, `v` ([B, Hkv, T, hd], any strides) of `layer` at positions `len()..len()+T`
    /// and returns views of the cached `[B, Hkv, len()+T, hd]`.
    pub fn append(&self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (pos, t) = (self.len(), k.shape()[2]);
        self.check_room(t)?;
        let (kc, vc) = self.layer(layer)?;
        for (new, cache) in [(k, kc), (v, vc)] {
            fused_into(&[new], &[(Expr::input(0), &cache.narrow(2, pos, t)?)])?;
        }
        Ok((kc.narrow(2, 0, pos + t)?, vc.narrow(2, 0, pos + t)?))
    }

    /// The whole key and value caches of `layer`, `[B, n_kv_heads, max_seq_len, head_dim]`.
    pub(super) fn layer(&self, layer: usize) -> Result<(&Tensor, &Tensor)> {
        match (self.k.get(layer), self.v.get(layer)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(Error::invalid(
                "KvCache",
                format!("layer {layer} of a {}-layer cache", self.k.len()),
            )),
        }
    }

    /// Moves `len` on by `t` positions (after every layer has appended them).
    pub fn advance(&self, t: usize) -> Result<()> {
        self.check_room(t)?;
        self.len.fetch_add(t, Ordering::AcqRel);
        Ok(())
    }
}
