//! The checks the decode ops share: caches, pads, the position, the q/k/v projections' fit to the cache, and the attention's sizes.
use super::{KvWrite, DECODE_MAX_HEAD_DIM};
use crate::base::checks::{check_dtype, check_float, same_float};
use crate::base::rope_types::RopeFreqs;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// Error unless `t` is (B, Hkv, S, hd) and contiguous with x's dtype and device.
pub(super) fn check_cache(op: &str, x: &Tensor, t: &Tensor, what: &str) -> Result<()> {
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
pub(super) fn check_pads(op: &str, x: &Tensor, pads: Option<&Tensor>, b: usize) -> Result<()> {
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
pub(super) fn check_position(op: &str, x: &Tensor, pos: &Tensor) -> Result<()> {
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
pub(super) fn check_qkv(
    op: &str,
    x: &Tensor,
    [wq, wk, wv]: [&Tensor; 3],
    kv: &KvWrite,
) -> Result<()> {
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
pub(super) fn check_attention(
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
