//! The host references of softmax, log_softmax, their backwards and cross-entropy, in f64 rounded to the output dtype.
use super::{
    dim_mask, CrossEntropyBackward, CrossEntropyMean, CrossEntropyRows, Softmax, SoftmaxBackward,
};
use crate::base::acc::acc_dtype;
use crate::base::axis::AxisSplit;
use crate::base::element::{Element, HostData};
use crate::base::host::{host_f64, named};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};
use netcl_core_memory::HostBuf;
use rayon::prelude::*;

/// The error of a reference handed a tensor without host storage.
fn not_on_host(op: &str) -> Error {
    Error::device(op, "host tensor without host storage")
}

/// Host row statistics as the kernels define them: max, and the sum of exp(x - max) over
/// elements that are not -inf.
fn host_ms(row: &[f64]) -> (f64, f64) {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| {
        if x.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(x)
        }
    });
    let s = row
        .iter()
        .filter(|&&x| x != f64::NEG_INFINITY)
        .map(|&x| (x - m).exp())
        .sum();
    (m, s)
}

/// A contiguous tensor of `shape` and `dtype` from `vals` laid out as rows along `dim` in the order
/// of [`AxisSplit::host_rows`] (the other dims row-major, then `dim`).
fn from_rows(dtype: DType, vals: &[f64], shape: &[usize], dim: usize) -> Result<Tensor> {
    rows_tensor(
        HostData::try_from_fn(dtype, vals.len(), |i| vals[i])?,
        shape,
        dim,
    )
}

/// [`from_rows`] of typed values: a permuted view of them, copied contiguous unless `dim` is last.
fn rows_tensor(data: HostData, shape: &[usize], dim: usize) -> Result<Tensor> {
    let mut moved = shape.to_vec();
    let n = moved.remove(dim);
    moved.push(n);
    let last = shape.len() - 1;
    let back: Vec<usize> = (0..shape.len())
        .map(|d| match d.cmp(&dim) {
            std::cmp::Ordering::Less => d,
            std::cmp::Ordering::Equal => last,
            std::cmp::Ordering::Greater => d - 1,
        })
        .collect();
    Tensor::from_host_data(data, &moved)
        .permute(&back)?
        .contiguous()
}

/// The rows of `t` along `dim` (see [`AxisSplit::host_rows`]) with their count and length.
fn rows_along(op: &str, t: &Tensor, dim: usize) -> Result<(HostBuf<f64>, usize, usize)> {
    let split = AxisSplit::new(t, &dim_mask(t.ndim(), dim));
    let rows = split.host_rows(t).map_err(|e| named(op, e))?;
    Ok((rows, split.nout(), split.nred()))
}

/// For host targets: every target must be in [0, C) or the ignore index.
fn check_host_targets(op: &str, targets: &[f64], c: usize, ignore: Option<i32>) -> Result<()> {
    for (i, &t) in targets.iter().enumerate() {
        if Some(t as i32) != ignore && !(0.0..c as f64).contains(&t) {
            return Err(Error::invalid(
                op,
                format!("target {t} of row {i} is outside [0, {c}) for logits of {c} classes"),
            ));
        }
    }
    Ok(())
}

/// softmax or log_softmax on the host, rows in parallel: each row read where it lies into a
/// counted row buffer and written into the typed output, so the output is the one copy of the
/// tensor (two where `dim` is not last).
pub(super) fn softmax(desc: &Softmax) -> Result<Tensor> {
    let Softmax { x, dim, log } = desc;
    let split = AxisSplit::new(x, &dim_mask(x.ndim(), *dim));
    let n = split.nred();
    let h = x.host().ok_or_else(|| not_on_host(desc.op()))?;
    let read: Box<dyn Fn(usize) -> f64 + Sync> =
        with_host!(&*h, v => Box::new(move |p| v[p].to_f64()));
    let mut out = HostData::try_filled(x.dtype, split.nout() * n, 0.0)?;
    let fill = |r: usize, out: &mut dyn FnMut(usize, f64)| -> Result<()> {
        let row = HostBuf::collect(n, split.row_positions(x.offset, r).map(&read))?;
        let (m, s) = host_ms(&row);
        for (j, &v) in row.iter().enumerate() {
            out(
                j,
                if *log {
                    (v - m) - s.ln()
                } else {
                    (v - m).exp() / s
                },
            );
        }
        Ok(())
    };
    with_host!(&mut out, o => o
        .par_chunks_mut(n.max(1))
        .enumerate()
        .try_for_each(|(r, o)| fill(r, &mut |j, y| o[j] = Element::from_f64(y))))?;
    rows_tensor(out, &x.shape, *dim)
}

/// The softmax or log_softmax gradient on the host.
pub(super) fn softmax_backward(desc: &SoftmaxBackward) -> Result<Tensor> {
    let SoftmaxBackward { y, dy, dim, log } = desc;
    let (y_rows, rows, n) = rows_along(desc.op(), y, *dim)?;
    let (g_rows, ..) = rows_along(desc.op(), dy, *dim)?;
    let mut dx = vec![0.0; rows * n];
    for (o, dx) in dx.chunks_mut(n.max(1)).enumerate() {
        let (y, g) = (&y_rows[o * n..(o + 1) * n], &g_rows[o * n..(o + 1) * n]);
        let s: f64 = if *log {
            g.iter().sum()
        } else {
            g.iter().zip(y).map(|(g, y)| g * y).sum()
        };
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            *d = if *log { g - y.exp() * s } else { y * (g - s) };
        }
    }
    from_rows(y.dtype, &dx, &y.shape, *dim)
}

/// Per-row losses and lse on the host; targets out of range are an error at once.
pub(super) fn cross_entropy_rows(desc: &CrossEntropyRows) -> Result<(Tensor, Tensor)> {
    let op = "cross_entropy";
    let CrossEntropyRows {
        logits,
        targets,
        ignore_index,
        args: a,
    } = desc;
    let acc = acc_dtype(logits.dtype);
    let (x, t) = (host_f64(op, logits)?, host_f64(op, targets)?);
    check_host_targets(op, &t, a.c, *ignore_index)?;
    let mut losses = vec![0.0; a.n];
    let mut lse = vec![0.0; a.n];
    for i in 0..a.n {
        let row = &x[i * a.c..(i + 1) * a.c];
        let (m, s) = host_ms(row);
        lse[i] = m + s.ln();
        if Some(t[i] as i32) != *ignore_index {
            losses[i] = lse[i] - row[t[i] as usize];
        }
    }
    Ok((
        Tensor::from_host_data(HostData::try_from_fn(acc, a.n, |i| losses[i])?, &[a.n]),
        Tensor::from_host_data(HostData::try_from_fn(acc, a.n, |i| lse[i])?, &[a.n]),
    ))
}

/// The mean of the losses not ignored, and their count, on the host.
pub(super) fn cross_entropy_mean(desc: &CrossEntropyMean) -> Result<(Tensor, Tensor)> {
    let op = "cross_entropy";
    let acc = acc_dtype(desc.dtype);
    let (l, t) = (host_f64(op, &desc.losses)?, host_f64(op, &desc.targets)?);
    let (mut sum, mut cnt) = (0.0, 0.0);
    for i in 0..desc.args.n {
        if Some(t[i] as i32) != desc.ignore_index {
            sum += l[i];
            cnt += 1.0;
        }
    }
    Ok((
        Tensor::from_host_data(HostData::try_filled(acc, 1, sum / cnt)?, &[]),
        Tensor::from_host_data(HostData::try_filled(acc, 1, cnt)?, &[]),
    ))
}

/// The cross-entropy gradient on the host; targets out of range are an error at once.
pub(super) fn cross_entropy_backward(desc: &CrossEntropyBackward) -> Result<Tensor> {
    let op = "cross_entropy_backward";
    let CrossEntropyBackward {
        logits,
        targets,
        lse,
        grad,
        count,
        ignore_index,
        args: a,
        gs,
    } = desc;
    let (x, t, l) = (
        host_f64(op, logits)?,
        host_f64(op, targets)?,
        host_f64(op, lse)?,
    );
    let g = grad.host_view_f64(&[a.n], &[*gs])?;
    check_host_targets(op, &t, a.c, *ignore_index)?;
    let cnt = match count {
        Some(c) => c.to_vec_f64()?[0],
        None => 1.0,
    };
    let dx = HostData::try_from_fn(logits.dtype, a.n * a.c, |k| {
        let (i, j) = (k / a.c, k % a.c);
        if Some(t[i] as i32) == *ignore_index {
            return 0.0;
        }
        let p = (x[k] - l[i]).exp();
        (p - if j == t[i] as usize { 1.0 } else { 0.0 }) * (g[i] / cnt)
    })?;
    Ok(Tensor::from_host_data(dx, &logits.shape))
}
