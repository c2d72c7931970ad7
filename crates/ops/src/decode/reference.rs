//! The host reference of the decode ops, composed of the general ops (RMSNorm, matmul, RoPE, elementwise) and a plain softmax loop for attention.
use super::block::DecodeBlockOp;
use super::{DecodeAttention, DecodeGemv, Epilogue};
use crate::base::element::HostData;
use crate::base::rope_types::RopePositions;
use crate::base::tensor::Tensor;
use crate::fused::eval::{fused, fused_into};
use crate::fused::expr::Expr;
use netcl_core_devices::{Error, Result};

/// `norm(x) · wᵀ` (B, N), plus the biases from `at` of the joined biases where there are some.
fn project(desc: &DecodeGemv, w: &Tensor, at: usize) -> Result<Tensor> {
    let k = desc.x.shape[1];
    let x = match &desc.norm {
        Some(n) => desc.x.rms_norm_inference(&[k], Some(&n.weight), n.eps)?,
        None => desc.x.clone(),
    };
    let y = x.matmul(&w.transpose(0, 1)?)?;
    match &desc.bias {
        None => Ok(y),
        Some(b) => {
            let b = b.narrow(0, at, w.shape[0])?;
            Ok(fused(&[&y, &b], &[Expr::input(0) + Expr::input(1)])?.remove(0))
        }
    }
}

pub(super) fn gemv(desc: &DecodeGemv) -> Result<Tensor> {
    let w = &desc.weights;
    match &desc.epilogue {
        Epilogue::Plain(res) => {
            let y = project(desc, &w[0], 0)?;
            match res {
                Some(r) => Ok(fused(&[&y, r], &[Expr::input(0) + Expr::input(1)])?.remove(0)),
                None => Ok(y),
            }
        }
        Epilogue::SwiGlu => {
            let n0 = w[0].shape[0];
            let (g, u) = (project(desc, &w[0], 0)?, project(desc, &w[1], n0)?);
            Ok(fused(&[&g, &u], &[Expr::input(0).silu() * Expr::input(1)])?.remove(0))
        }
        Epilogue::Qkv(kv) => {
            let b = desc.x.shape[0];
            let hd = kv.k_cache.shape[3];
            let pads = match &kv.pads {
                Some(p) => p.to_vec::<i32>()?,
                None => vec![0; b],
            };
            let at = position("decode_qkv", &kv.pos, kv.k_cache.shape[2])?;
            let pos: Vec<i32> = pads.iter().map(|&p| at as i32 - p).collect();
            let pos = Tensor::from_host_data(HostData::I32(pos), &[b, 1]);
            let rope_at = RopePositions::Ids(pos);
            // (B, 1, heads, hd) rotated, as the model's prefill computes it.
            let rotate = |y: Tensor| {
                let heads = y.shape[1] / hd;
                y.reshape(&[b, 1, heads, hd])?
                    .rope_with_freqs(kv.style, &rope_at, &kv.freqs)
            };
            let (n0, n1) = (w[0].shape[0], w[1].shape[0]);
            let q = rotate(project(desc, &w[0], 0)?)?;
            let k = rotate(project(desc, &w[1], n0)?)?;
            let v = project(desc, &w[2], n0 + n1)?.reshape(&[b, 1, w[2].shape[0] / hd, hd])?;
            for (new, cache) in [(&k, &kv.k_cache), (&v, &kv.v_cache)] {
                let slot = cache.narrow(2, at, 1)?;
                fused_into(&[&new.transpose(1, 2)?], &[(Expr::input(0), &slot)])?;
            }
            q.reshape(&[b, w[0].shape[0]])
        }
    }
}

/// The cache position `pos` (I32 (1)) holds, checked against the cache length `s` as the
/// kernels check it.
fn position(op: &str, pos: &Tensor, s: usize) -> Result<usize> {
    let at = pos.to_vec::<i32>()?[0];
    usize::try_from(at).ok().filter(|&a| a < s).ok_or_else(|| {
        Error::invalid(
            op,
            format!("cache position {at} is outside [0, {s}) of the KV cache"),
        )
    })
}

pub(super) fn attention(desc: &DecodeAttention) -> Result<Tensor> {
    let cs = &desc.k_cache.shape;
    let (b, hkv, s, hd) = (cs[0], cs[1], cs[2], cs[3]);
    let h = desc.heads;
    let q = desc.q.to_vec_f64()?;
    let len = position("decode_attention", &desc.pos, s)? + 1;
    // The first `len` positions only, not the cache's whole capacity.
    let filled = |c: &Tensor| -> Result<_> {
        let c = c.narrow(2, 0, len)?;
        c.host_view_f64(&c.shape, &c.strides)
    };
    let (k, v) = (filled(&desc.k_cache)?, filled(&desc.v_cache)?);
    let pads = match &desc.pads {
        Some(p) => p.to_vec::<i32>()?,
        None => vec![0; b],
    };
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0.0; b * h * hd];
    for bi in 0..b {
        for hi in 0..h {
            let qr = &q[(bi * h + hi) * hd..][..hd];
            let head = (bi * hkv + hi / (h / hkv)) * len * hd;
            let first = (pads[bi].max(0) as usize).min(len);
            let keys = first.max(len.saturating_sub(desc.window.unwrap_or(len)))..len;
            let scores: Vec<f64> = keys
                .clone()
                .map(|j| (0..hd).map(|d| qr[d] * k[head + j * hd + d]).sum::<f64>() * scale)
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|sc| (sc - m).exp()).collect();
            let total: f64 = e.iter().sum();
            let o = &mut out[(bi * h + hi) * hd..][..hd];
            for (j, p) in keys.zip(&e) {
                for d in 0..hd {
                    o[d] += p / total * v[head + j * hd + d];
                }
            }
        }
    }
    let data = HostData::try_from_fn(desc.q.dtype, out.len(), |i| out[i])?;
    Ok(Tensor::from_host_data(data, &[b, h * hd]))
}

/// The block as its five ops in turn.
pub(super) fn block(desc: &DecodeBlockOp) -> Result<Tensor> {
    let (x, b) = (&desc.x, &desc.block);
    let kv = &b.kv;
    let norm = Some(&b.attention_norm);
    let q = x.decode_qkv_biased(norm, [&b.wq, &b.wk, &b.wv], b.qkv_bias.as_ref(), kv)?;
    let (pads, w) = (kv.pads.as_ref(), b.window);
    let o = q.decode_attention_window(&kv.k_cache, &kv.v_cache, &kv.pos, pads, b.heads, w)?;
    let h = o.decode_linear_biased(None, &b.wo, b.wo_bias.as_ref(), Some(x))?;
    let ffn = Some(&b.ffn_norm);
    let s = h.decode_swiglu_biased(ffn, &b.gate, &b.up, b.gate_up_bias.as_ref())?;
    s.decode_linear_biased(None, &b.down, b.down_bias.as_ref(), Some(&h))
}
