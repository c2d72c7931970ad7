//! The KV cache: keys and values of every layer preallocated on the device for max_seq_len and written in place.
use super::config::LlamaConfig;
use netcl_ops::{fused_into, DType, Device, Error, Expr, Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys and values of every layer, `[B, n_kv_heads, max_seq_len, head_dim]` each, allocated once.
/// A forward pass writes its `T` new positions at `len()` in place (one copy kernel per tensor)
/// and attends over the first `len() + T`; [`KvCache::advance`] then moves `len` on. `len` is
/// kept twice: on the host, and on the device ([`KvCache::position`]) for the decode kernels, so
/// that a captured decode step replays at the current position.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: AtomicUsize,
    /// I32 (1) on the device: `len`, moved on by a kernel in `advance`.
    pos: Tensor,
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
            pos: Tensor::zeros(&[1], DType::I32, device)?,
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
    pub fn clear(&self) -> Result<()> {
        self.pos.fill_(0.0)?;
        self.len.store(0, Ordering::Release);
        Ok(())
    }

    /// `len()` as an I32 (1) tensor on the cache's device: the position the next token is
    /// written at, as the decode kernels read it.
    pub fn position(&self) -> &Tensor {
        &self.pos
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

    /// Writes `k`, `v` ([B, Hkv, T, hd], any strides, any float dtype: converted to the cache's)
    /// of `layer` at positions `len()..len()+T` and returns views of the cached
    /// `[B, Hkv, len()+T, hd]`.
    pub fn append(&self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (pos, t) = (self.len(), k.shape()[2]);
        self.check_room(t)?;
        let (kc, vc) = self.layer(layer)?;
        for (new, cache) in [(k, kc), (v, vc)] {
            // 16-bit keys from projections under autocast go into the model-dtype cache.
            let value = match new.dtype() == cache.dtype() {
                true => Expr::input(0),
                false => Expr::input(0).cast(cache.dtype()),
            };
            fused_into(&[new], &[(value, &cache.narrow(2, pos, t)?)])?;
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

    /// Moves `len` on by `t` positions (after every layer has appended them): on the host, and
    /// on the device by one small kernel.
    pub fn advance(&self, t: usize) -> Result<()> {
        self.check_room(t)?;
        let add = Expr::input(0) + t as f64;
        fused_into(&[&self.pos], &[(add, &self.pos)])?;
        self.note_advanced(t);
        Ok(())
    }

    /// Moves the host's `len` on by `t` after a replayed decode step moved the device's.
    pub(super) fn note_advanced(&self, t: usize) {
        self.len.fetch_add(t, Ordering::AcqRel);
    }
}
