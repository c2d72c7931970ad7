//! The host side of conv's own steps: im2col, col2im and the channel bias in f64 (the products are matmul's host reference).
use super::{AddChannelBias, Col2im, Im2col};
use crate::base::element::HostData;
use crate::base::host::host_f64;
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use rayon::prelude::*;

/// The columns (N, G, K, L), contiguous (`batch_inner` only matters to the kernels' layout).
pub(super) fn im2col(desc: &Im2col) -> Result<Tensor> {
    let Im2col { op, x, g, .. } = desc;
    let (gr, k, l, n) = (g.groups, g.k(), g.l(), g.win.n);
    let w = &g.win;
    let xv = host_f64(op, x)?;
    let mut cols = vec![0.0; n * gr * k * l];
    let taps = w.kernel.0 * w.kernel.1;
    // A row of L columns per (b, group, k): its tap and input plane found once, then the output
    // pixels in order.
    cols.par_chunks_mut(l.max(1))
        .enumerate()
        .for_each(|(row, out)| {
            let (kk, rest) = (row % k, row / k);
            let (gi, b) = (rest % gr, rest / gr);
            let (ci, kr) = (kk / taps, kk % taps);
            let (ki, kj) = (kr / w.kernel.1, kr % w.kernel.1);
            let plane = ((b * w.c + gi * g.cg() + ci) * w.h) * w.w;
            for (oh, line) in out.chunks_mut(w.wo.max(1)).enumerate() {
                let Some(hh) = w.tap_in(0, oh, ki) else {
                    continue;
                };
                for (ow, col) in line.iter_mut().enumerate() {
                    if let Some(ww) = w.tap_in(1, ow, kj) {
                        *col = xv[plane + hh * w.w + ww];
                    }
                }
            }
        });
    let t = Tensor::from_host_data(
        HostData::try_from_fn(x.dtype, cols.len(), |i| cols[i])?,
        &[n, gr, k, l],
    );
    Ok(t)
}

/// Each input pixel sums its taps, ki then kj ascending.
pub(super) fn col2im(desc: &Col2im) -> Result<Tensor> {
    let Col2im { op, cols, g } = desc;
    let w = &g.win;
    let cv = host_f64(op, cols)?;
    let (gr, k, l) = (g.groups, g.k(), g.l());
    let cover = w.coverings();
    let dx = w.per_input(|plane, h, x| {
        let (b, c) = (plane / w.c, plane % w.c);
        let (gi, ci) = (c / g.cg(), c % g.cg());
        let taps = cover[h * w.w + x].iter();
        taps.map(|&(ki, kj, oh, ow)| {
            let kk = (ci * w.kernel.0 + ki) * w.kernel.1 + kj;
            cv[((b * gr + gi) * k + kk) * l + oh * w.wo + ow]
        })
        .sum()
    });
    let dx = HostData::try_from_fn(cols.dtype, dx.len(), |i| dx[i])?;
    Ok(Tensor::from_host_data(dx, &w.in_shape()))
}

/// y + bias[c] as a new tensor.
pub(super) fn add_channel_bias(desc: &AddChannelBias) -> Result<Tensor> {
    let AddChannelBias { op, y, bias } = desc;
    let (c, p) = (y.shape[1], y.shape[2] * y.shape[3]);
    let (yv, bv) = (host_f64(op, y)?, bias.to_vec_f64()?);
    let data = HostData::try_from_fn(y.dtype, yv.len(), |i| yv[i] + bv[(i / p) % c])?;
    Ok(Tensor::from_host_data(data, &y.shape))
}
