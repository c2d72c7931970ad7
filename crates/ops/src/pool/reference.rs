//! The host side of pooling: every output (or input pixel, for the gradients) computed in f64 over its window.
use super::{Avg, AvgPool, Geom, MaxPool2d, MaxPool2dBackward};
use crate::base::element::{Element, HostData};
use crate::base::host::{host_f64, named};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Result};
use rayon::prelude::*;

fn host_tensor(dtype: DType, v: Vec<f64>, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_host_data(
        HostData::try_from_fn(dtype, v.len(), |i| v[i])?,
        shape,
    ))
}

/// Adaptive window [floor(o * size / out), ceil((o + 1) * size / out)).
fn adaptive(o: usize, size: usize, out: usize) -> (usize, usize) {
    (o * size / out, ((o + 1) * size).div_ceil(out))
}

impl Geom {
    /// Clipped window [hs, he) x [ws, we) of output (oh, ow) and the average's divisor.
    fn avg_window(&self, oh: usize, ow: usize) -> (usize, usize, usize, usize, f64) {
        let g = &self.win;
        let hs = (oh * g.stride.0) as isize - g.padding.0 as isize;
        let ws = (ow * g.stride.1) as isize - g.padding.1 as isize;
        let he = (hs + g.kernel.0 as isize).min((g.h + g.padding.0) as isize);
        let we = (ws + g.kernel.1 as isize).min((g.w + g.padding.1) as isize);
        let pool = (he - hs) * (we - ws);
        let (hs, ws) = (hs.max(0) as usize, ws.max(0) as usize);
        let (he, we) = (
            (he as usize).min(g.h).max(hs),
            (we as usize).min(g.w).max(ws),
        );
        let div = if self.include_pad {
            pool as f64
        } else {
            ((he - hs) * (we - ws)) as f64
        };
        (hs, he, ws, we, div)
    }
}

/// First maximum over the in-range taps (NaN wins and stays), and its index h * W + w.
pub(super) fn max_pool2d(desc: &MaxPool2d) -> Result<(Tensor, Tensor)> {
    let MaxPool2d { x, g } = desc;
    let out = g.out_shape();
    let xv = x
        .host_view(&x.shape, &x.strides)
        .map_err(|e| named("max_pool2d", e))?;
    let best = with_host!(&xv, v => maxima(v, g));
    let y = best
        .iter()
        .map(|b| b.map_or(f64::NEG_INFINITY, |b| b.0))
        .collect();
    let idx = best.iter().map(|b| b.map_or(-1, |b| b.1 as i32)).collect();
    let idx = Tensor::from_host_data(HostData::I32(idx), &out);
    Ok((host_tensor(x.dtype, y, &out)?, idx))
}

/// Each window's first maximum and its index in the plane, over the row-major input `xv`.
fn maxima<T: Element>(xv: &[T], g: &Geom) -> Vec<Option<(f64, usize)>> {
    let gw = &g.win;
    gw.per_output(|plane, oh, ow| {
        let mut best: Option<(f64, usize)> = None;
        for ki in 0..gw.kernel.0 {
            let Some(h) = gw.tap_in(0, oh, ki) else {
                continue;
            };
            for kj in 0..gw.kernel.1 {
                let Some(w) = gw.tap_in(1, ow, kj) else {
                    continue;
                };
                let at = h * gw.w + w;
                let v = xv[plane * gw.h * gw.w + at].to_f64();
                if best.is_none_or(|(b, _)| !b.is_nan() && (v > b || v.is_nan())) {
                    best = Some((v, at));
                }
            }
        }
        best
    })
}

/// Each input pixel sums the gradients of the covering windows whose index names it.
pub(super) fn max_pool2d_backward(desc: &MaxPool2dBackward) -> Result<Tensor> {
    let MaxPool2dBackward { grad_y, indices, g } = desc;
    let gy = host_f64("max_pool2d_backward", grad_y)?;
    let idx = indices.to_vec::<i32>()?;
    let gw = &g.win;
    if gw.tiles_input() {
        // Each pixel lies in one window: 0 + the window's gradient at its maximum, 0 elsewhere.
        let mut dx = vec![0.0; gw.n * gw.c * gw.h * gw.w];
        let (plane_in, plane_out) = (gw.h * gw.w, gw.ho * gw.wo);
        let (k0, k1) = gw.kernel;
        dx.par_chunks_mut(plane_in.max(1))
            .enumerate()
            .for_each(|(plane, d)| {
                let at = plane * plane_out..(plane + 1) * plane_out;
                for (o, (&m, &v)) in idx[at.clone()].iter().zip(&gy[at]).enumerate() {
                    // An index outside its own window names no pixel (as the gather finds none).
                    let Ok(m) = usize::try_from(m) else { continue };
                    if (m / gw.w) / k0 == o / gw.wo && (m % gw.w) / k1 == o % gw.wo {
                        d[m] = 0.0 + v;
                    }
                }
            });
        return host_tensor(grad_y.dtype, dx, &gw.in_shape());
    }
    let cover = gw.coverings();
    let dx = gw.per_input(|plane, h, w| {
        let me = (h * gw.w + w) as i32;
        let outs = cover[h * gw.w + w]
            .iter()
            .map(|&(_, _, oh, ow)| gw.out_at(plane, oh, ow));
        outs.filter(|&o| idx[o] == me).map(|o| gy[o]).sum()
    });
    host_tensor(grad_y.dtype, dx, &gw.in_shape())
}

pub(super) fn avg_pool(desc: &AvgPool) -> Result<Tensor> {
    let AvgPool { kind, src, g } = desc;
    let v = host_f64(kind.name(), src)?;
    let gw = &g.win;
    let out = match kind {
        Avg::Pool => gw.per_output(|plane, oh, ow| {
            let (hs, he, ws, we, div) = g.avg_window(oh, ow);
            gw.plane_sum(&v, plane, (hs, he), (ws, we)) / div
        }),
        Avg::PoolBackward => {
            let cover = gw.coverings();
            gw.per_input(|plane, h, w| {
                let taps = cover[h * gw.w + w].iter();
                taps.map(|&(_, _, oh, ow)| v[gw.out_at(plane, oh, ow)] / g.avg_window(oh, ow).4)
                    .sum()
            })
        }
        Avg::Adaptive => gw.per_output(|plane, oh, ow| {
            let (rows, cols) = (adaptive(oh, gw.h, gw.ho), adaptive(ow, gw.w, gw.wo));
            let size = (rows.1 - rows.0) * (cols.1 - cols.0);
            gw.plane_sum(&v, plane, rows, cols) / size as f64
        }),
        Avg::AdaptiveBackward => gw.per_input(|plane, h, w| {
            let mut d = 0.0;
            for oh in 0..gw.ho {
                let (hs, he) = adaptive(oh, gw.h, gw.ho);
                if hs > h {
                    break;
                }
                if h >= he {
                    continue;
                }
                for ow in 0..gw.wo {
                    let (ws, we) = adaptive(ow, gw.w, gw.wo);
                    if ws > w {
                        break;
                    }
                    if w >= we {
                        continue;
                    }
                    d += v[gw.out_at(plane, oh, ow)] / ((he - hs) * (we - ws)) as f64;
                }
            }
            d
        }),
    };
    host_tensor(src.dtype, out, &desc.out_shape())
}
