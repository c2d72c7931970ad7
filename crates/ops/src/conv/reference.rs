//! The host side of conv's own steps: im2col (a copy in the input's dtype), col2im and the channel bias in f64 (the products are matmul's host reference).
use super::{AddChannelBias, Col2im, Geom, Im2col};
use crate::base::element::{Element, HostData};
use crate::base::host::named;
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use netcl_core_memory::host_vec;
use rayon::prelude::*;

/// The columns (N, G, K, L), contiguous (`batch_inner` only matters to the kernels' layout), in
/// x's dtype (a copy of its values: no arithmetic).
pub(super) fn im2col(desc: &Im2col) -> Result<Tensor> {
    let Im2col { op, x, g, .. } = desc;
    let (gr, k, l, n) = (g.groups, g.k(), g.l(), g.win.n);
    let xv = x
        .host_view(&x.shape, &x.strides)
        .map_err(|e| named(op, e))?;
    let cols = with_host!(&xv, v => Element::wrap(columns(v, g)?));
    Ok(Tensor::from_host_data(cols, &[n, gr, k, l]))
}

/// im2col of the row-major input `xv`: a row of L columns per (b, group, k), its tap and input
/// plane found once, then the output pixels in order (0 in the padding).
fn columns<T: Element>(xv: &[T], g: &Geom) -> Result<Vec<T>> {
    let w = &g.win;
    let (gr, k, l) = (g.groups, g.k(), g.l());
    let len = w.n * gr * k * l;
    let mut cols = host_vec(len)?;
    cols.resize(len, T::from_f64(0.0));
    let taps = w.kernel.0 * w.kernel.1;
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
                let src = &xv[plane + hh * w.w..][..w.w];
                for (ow, col) in line.iter_mut().enumerate() {
                    if let Some(ww) = w.tap_in(1, ow, kj) {
                        *col = src[ww];
                    }
                }
            }
        });
    Ok(cols)
}

/// Each input pixel sums its taps, ki then kj ascending.
pub(super) fn col2im(desc: &Col2im) -> Result<Tensor> {
    let Col2im { op, cols, g } = desc;
    let w = &g.win;
    let cv = cols
        .host_view(&cols.shape, &cols.strides)
        .map_err(|e| named(op, e))?;
    let dx = with_host!(&cv, v => tap_sums(v, g));
    let dx = HostData::try_from_fn(cols.dtype, dx.len(), |i| dx[i])?;
    Ok(Tensor::from_host_data(dx, &w.in_shape()))
}

/// col2im of the row-major columns `cv`: each input pixel's taps summed in f64.
fn tap_sums<T: Element>(cv: &[T], g: &Geom) -> Vec<f64> {
    let w = &g.win;
    let (gr, k, l) = (g.groups, g.k(), g.l());
    let cover = w.coverings();
    w.per_input(|plane, h, x| {
        let (b, c) = (plane / w.c, plane % w.c);
        let (gi, ci) = (c / g.cg(), c % g.cg());
        let taps = cover[h * w.w + x].iter();
        taps.map(|&(ki, kj, oh, ow)| {
            let kk = (ci * w.kernel.0 + ki) * w.kernel.1 + kj;
            cv[((b * gr + gi) * k + kk) * l + oh * w.wo + ow].to_f64()
        })
        .sum()
    })
}

/// y + bias[c] as a new tensor.
pub(super) fn add_channel_bias(desc: &AddChannelBias) -> Result<Tensor> {
    let AddChannelBias { op, y, bias } = desc;
    let (c, p) = (y.shape[1], y.shape[2] * y.shape[3]);
    let yv = y
        .host_view(&y.shape, &y.strides)
        .map_err(|e| named(op, e))?;
    let bv = bias.to_vec_f64()?;
    let data = with_host!(&yv, v => Element::wrap(biased(v, &bv, (c, p))?));
    Ok(Tensor::from_host_data(data, &y.shape))
}

/// `y + bias[c]` over planes of `p` values (added in f64, rounded to T).
fn biased<T: Element>(y: &[T], bias: &[f64], (c, p): (usize, usize)) -> Result<Vec<T>> {
    let mut out = host_vec(y.len())?;
    out.resize(y.len(), T::from_f64(0.0));
    let planes = out.par_chunks_mut(p.max(1)).zip(y.par_chunks(p.max(1)));
    planes.enumerate().for_each(|(plane, (o, y))| {
        let b = bias[plane % c];
        for (o, &v) in o.iter_mut().zip(y) {
            *o = T::from_f64(v.to_f64() + b);
        }
    });
    Ok(out)
}
