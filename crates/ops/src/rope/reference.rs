//! The host reference of RoPE: each pair rotated with the kernel's arithmetic (f32 angles for f32/f16/bf16, f64 for f64).
use super::{Rope, RopeStyle};
use crate::base::element::HostData;
use crate::base::host::host_f64;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Result};

/// Element offsets of pair `p`'s two elements within a head of `dh` elements (head-dim stride 1).
fn pair_elements(style: RopeStyle, p: usize, dh: usize) -> (usize, usize) {
    match style {
        RopeStyle::Interleaved => (2 * p, 2 * p + 1),
        RopeStyle::Halves => (p, p + dh / 2),
    }
}

/// Host RoPE with the kernel's arithmetic; `x` row-major `[B, T, H, Dh]`, `pos[b * T + t]`.
fn host_rope(
    x: &[f64],
    shape: &[usize],
    style: RopeStyle,
    pos: &[u32],
    freqs: (f64, Option<&[f64]>),
    sign: f64,
    dtype: DType,
) -> Result<HostData> {
    let (theta, table) = freqs;
    let (heads, dh) = (shape[2], shape[3]);
    let half = dh / 2;
    let mut y = vec![0.0f64; x.len()];
    for pair in 0..x.len() / 2 {
        let p = pair % half;
        let bt = pair / (half * heads);
        let pos = pos[bt % pos.len().max(1)];
        let head = (pair / half) * dh;
        let (e0, e1) = pair_elements(style, p, dh);
        let (x0, x1) = (x[head + e0], x[head + e1]);
        let (y0, y1) = if dtype == DType::F64 {
            let freq = table.map_or_else(|| 1.0 / theta.powf((2 * p) as f64 / dh as f64), |t| t[p]);
            let a = pos as f64 * freq;
            let (c, s) = (a.cos(), sign * a.sin());
            (x0 * c - x1 * s, x0 * s + x1 * c)
        } else {
            let freq = table.map_or_else(
                || 1.0f32 / (theta as f32).powf((2 * p) as f32 / dh as f32),
                |t| t[p] as f32,
            );
            let a = pos as f32 * freq;
            let (c, s) = (a.cos(), sign as f32 * a.sin());
            let (x0, x1) = (x0 as f32, x1 as f32);
            ((x0 * c - x1 * s) as f64, (x0 * s + x1 * c) as f64)
        };
        y[head + e0] = y0;
        y[head + e1] = y1;
    }
    HostData::try_from_fn(dtype, y.len(), |i| y[i])
}

/// RoPE (or its backward, by `sign`) on the host, into a new host tensor.
pub(super) fn rope(desc: &Rope) -> Result<Tensor> {
    let x = &desc.x;
    let xv = host_f64(desc.op, x)?;
    let pos: Vec<u32> = match &desc.ids {
        Some(ids) => ids.to_vec::<i32>()?.iter().map(|&p| p as u32).collect(),
        None => (0..x.shape[1])
            .map(|t| (desc.pos_offset + t) as u32)
            .collect(),
    };
    let tv = desc.table.as_ref().map(|t| t.to_vec_f64()).transpose()?;
    let f = (desc.theta, tv.as_deref());
    let data = host_rope(&xv, &x.shape, desc.style, &pos, f, desc.sign, x.dtype)?;
    Ok(Tensor::from_host_data(data, &x.shape))
}
