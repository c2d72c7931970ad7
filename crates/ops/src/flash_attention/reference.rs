//! The host reference of fused attention: the scores of one row at a time in f64, a plain softmax, and the textbook backward.
use super::{Dims, FlashAttention, FlashAttentionBackward};
use crate::base::acc::acc_dtype;
use crate::base::element::HostData;
use crate::base::host::host_f64;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Result};

impl Dims {
    /// Element index of (b, h, t, 0) in a row-major (B, heads, T, D) array.
    fn at(&self, heads: usize, t: usize, b: usize, h: usize, i: usize) -> usize {
        ((b * heads + h) * t + i) * self.d
    }

    /// The softmax row of query `i` of head (b, h) over its visible keys `first(i)..` (scaled
    /// scores), and its log-sum-exp (-inf when it sees no key).
    fn probs(&self, q: &[f64], k: &[f64], b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
        let hk = h / (self.h / self.hkv);
        let qi = &q[self.at(self.h, self.tq, b, h, i)..][..self.d];
        let s: Vec<f64> = (self.first(i)..self.visible(i))
            .map(|j| {
                let kj = &k[self.at(self.hkv, self.tk, b, hk, j)..][..self.d];
                self.scale * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>()
            })
            .collect();
        if s.is_empty() {
            return (s, f64::NEG_INFINITY);
        }
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
        (
            s.iter().map(|x| (x - m).exp() / sum).collect(),
            m + sum.ln(),
        )
    }

    /// A (B, heads, T, D) result from its row-major values, laid out (B, T, heads, D) as the
    /// kernels write it.
    fn t_major_host(&self, vals: &[f64], t: usize, heads: usize, dtype: DType) -> Result<Tensor> {
        let mut moved = vec![0.0; vals.len()];
        for b in 0..self.b {
            for h in 0..heads {
                for i in 0..t {
                    let src = self.at(heads, t, b, h, i);
                    let dst = ((b * t + i) * heads + h) * self.d;
                    moved[dst..dst + self.d].copy_from_slice(&vals[src..src + self.d]);
                }
            }
        }
        let data = HostData::try_from_fn(dtype, moved.len(), |i| moved[i])?;
        Tensor::from_host_data(data, &[self.b, t, heads, self.d]).transpose(1, 2)
    }
}

fn host_tensor(vals: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Ok(Tensor::from_host_data(
        HostData::try_from_fn(dtype, vals.len(), |i| vals[i])?,
        shape,
    ))
}

pub(super) fn forward(desc: &FlashAttention) -> Result<(Tensor, Tensor)> {
    if desc.dims.compute.is_some() {
        return super::narrowed_forward(desc);
    }
    let op = "flash_attention";
    let d = &desc.dims;
    let (q, k, v) = (
        host_f64(op, &desc.q)?,
        host_f64(op, &desc.k)?,
        host_f64(op, &desc.v)?,
    );
    let mut out = vec![0.0; d.b * d.h * d.tq * d.d];
    let mut lse = vec![0.0; d.b * d.h * d.tq];
    for b in 0..d.b {
        for h in 0..d.h {
            let hk = h / (d.h / d.hkv);
            for i in 0..d.tq {
                let (p, l) = d.probs(&q, &k, b, h, i);
                lse[(b * d.h + h) * d.tq + i] = l;
                let o = d.at(d.h, d.tq, b, h, i);
                for (j, pj) in (d.first(i)..).zip(&p) {
                    let vj = d.at(d.hkv, d.tk, b, hk, j);
                    for e in 0..d.d {
                        out[o + e] += pj * v[vj + e];
                    }
                }
            }
        }
    }
    let dtype = desc.q.dtype();
    Ok((
        d.t_major_host(&out, d.tq, d.h, dtype)?,
        host_tensor(&lse, &[d.b, d.h, d.tq], acc_dtype(dtype))?,
    ))
}

pub(super) fn backward(desc: &FlashAttentionBackward) -> Result<(Tensor, Tensor, Tensor)> {
    if desc.dims.compute.is_some() {
        return super::narrowed_backward(desc);
    }
    let op = "flash_attention_backward";
    let d = &desc.dims;
    let (q, k, v) = (
        host_f64(op, &desc.q)?,
        host_f64(op, &desc.k)?,
        host_f64(op, &desc.v)?,
    );
    let g = host_f64(op, &desc.grad)?;
    let mut dq = vec![0.0; q.len()];
    let (mut dk, mut dv) = (vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..d.b {
        for h in 0..d.h {
            let hk = h / (d.h / d.hkv);
            for i in 0..d.tq {
                // Probabilities recomputed from q and k (the reference does not trust lse).
                let (p, _) = d.probs(&q, &k, b, h, i);
                let qi = d.at(d.h, d.tq, b, h, i);
                let first = d.first(i);
                let dp: Vec<f64> = (first..first + p.len())
                    .map(|j| {
                        let vj = d.at(d.hkv, d.tk, b, hk, j);
                        (0..d.d).map(|e| g[qi + e] * v[vj + e]).sum()
                    })
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for ((j, pj), dpj) in (first..).zip(&p).zip(&dp) {
                    let kj = d.at(d.hkv, d.tk, b, hk, j);
                    let ds = pj * (dpj - delta) * d.scale;
                    for e in 0..d.d {
                        dv[kj + e] += pj * g[qi + e];
                        dq[qi + e] += ds * k[kj + e];
                        dk[kj + e] += ds * q[qi + e];
                    }
                }
            }
        }
    }
    let dtype = desc.q.dtype();
    Ok((
        d.t_major_host(&dq, d.tq, d.h, dtype)?,
        d.t_major_host(&dk, d.tk, d.hkv, dtype)?,
        d.t_major_host(&dv, d.tk, d.hkv, dtype)?,
    ))
}
