//! The host reference of the reductions: each output's row read in place and reduced in f64 (outputs in parallel), rounded to the output dtype.
use super::{Reduce, ReduceOp};
use crate::base::axis::AxisSplit;
use crate::base::element::{Element, HostData};
use crate::base::layout::{strided_positions, strided_runs};
use crate::base::tensor::{not_on_host, Tensor};
use netcl_core_devices::Result;
use netcl_core_memory::HostBuf;
use rayon::prelude::*;

/// Host reference: reduce one row of `n` f64 values, which `row()` yields afresh for each pass
/// (read where they lie: no copy of the tensor).
fn host_reduce<I: Iterator<Item = f64>>(op: ReduceOp, n: usize, row: impl Fn() -> I) -> f64 {
    let arg = |better: fn(f64, f64) -> bool| {
        let (mut best, mut b) = (0, f64::NAN);
        for (i, x) in row().enumerate() {
            if i == 0 || (!b.is_nan() && (x.is_nan() || better(x, b))) {
                (best, b) = (i, x);
            }
        }
        best as f64
    };
    match op {
        ReduceOp::Sum => row().sum(),
        ReduceOp::Mean => row().sum::<f64>() / n as f64,
        ReduceOp::Max => row().fold(
            f64::NEG_INFINITY,
            |m, x| {
                if x.is_nan() || x > m {
                    x
                } else {
                    m
                }
            },
        ),
        ReduceOp::Min => row().fold(
            f64::INFINITY,
            |m, x| {
                if x.is_nan() || x < m {
                    x
                } else {
                    m
                }
            },
        ),
        ReduceOp::ArgMax => arg(|x, b| x > b),
        ReduceOp::ArgMin => arg(|x, b| x < b),
        ReduceOp::Var { correction } => {
            let mean = row().sum::<f64>() / n as f64;
            let m2: f64 = row().map(|x| (x - mean) * (x - mean)).sum();
            m2 / (n as f64 - correction).max(0.0)
        }
        ReduceOp::LogSumExp => {
            let m = row().fold(f64::NEG_INFINITY, |m, x| m.max(x));
            if row().any(|x| x.is_nan()) {
                f64::NAN
            } else if m.is_infinite() {
                m
            } else {
                m + row().map(|x| (x - m).exp()).sum::<f64>().ln()
            }
        }
    }
}

/// What an f64 sum starts from (`Iterator::sum`'s value for no items): the sums below add in the
/// same order from the same start, so they equal `host_reduce`'s bit for bit.
fn empty_sum() -> f64 {
    std::iter::empty::<f64>().sum()
}

/// Outputs summed together where the innermost kept dim is contiguous (a column sum).
const COLUMNS: usize = 16;

/// Sums over the reduced dims for kept dims whose innermost (`inner` long) has stride 1:
/// `COLUMNS` adjacent outputs at a time, each reduced position's values added to all of them
/// (a contiguous read instead of one strided walk per output), in the same order per output as
/// one output's row would be summed.
fn column_sums(
    split: &AxisSplit,
    offset: usize,
    inner: usize,
    out: &mut [f64],
    at: impl Fn(usize) -> f64 + Sync,
) {
    out.par_chunks_mut(inner).enumerate().for_each(|(r, row)| {
        let base = split.row_base(offset, r * inner);
        for (c, acc) in row.chunks_mut(COLUMNS).enumerate() {
            acc.fill(empty_sum());
            let first = c * COLUMNS;
            for p in strided_positions(&split.red_shape, &split.red_strides, 0) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += at(base + p + first + j);
                }
            }
        }
    });
}

/// The reduction on the host, into a new host tensor: each output's row read in place from the
/// input's storage (a broadcast view is never expanded), outputs in parallel.
pub(super) fn reduce(desc: &Reduce) -> Result<Tensor> {
    let Reduce {
        x,
        op,
        mask,
        out_shape,
    } = desc;
    let split = AxisSplit::new(x, mask);
    let (nout, nred) = (split.nout(), split.nred());
    let h = x.host().ok_or_else(not_on_host)?;
    let mut vals = HostBuf::filled(nout, 0.0f64)?;
    let inner = match (split.kept_shape.last(), split.kept_strides.last()) {
        (Some(&n), Some(1)) if matches!(op, ReduceOp::Sum | ReduceOp::Mean) && n >= COLUMNS => n,
        _ => 0,
    };
    if matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
        if inner > 0 {
            with_host!(&*h, v => column_sums(&split, x.offset, inner, &mut vals, |p| v[p].to_f64()));
        } else {
            // Each row a run of its last reduced dim at a time, summed in the same order.
            let (shape, strides) = (&split.red_shape, &split.red_strides);
            with_host!(&*h, v => vals.par_iter_mut().enumerate().for_each(|(o, out)| {
                let runs = strided_runs(shape, strides, split.row_base(x.offset, o));
                *out = runs.fold(empty_sum(), |acc, (at, len, step)| match step {
                    1 => v[at..at + len].iter().fold(acc, |a, e| a + e.to_f64()),
                    s => (0..len).fold(acc, |a, j| a + v[at + j * s].to_f64()),
                });
            }));
        }
        if let ReduceOp::Mean = op {
            vals.iter_mut().for_each(|s| *s /= nred as f64);
        }
    } else {
        with_host!(&*h, v => vals.par_iter_mut().enumerate().for_each(|(o, out)| {
            let row = || split.row_positions(x.offset, o).map(|p| v[p].to_f64());
            *out = host_reduce(*op, nred, row);
        }));
    }
    Ok(Tensor::from_host_data(
        HostData::try_from_fn(op.out_dtype(x.dtype), nout, |i| vals[i])?,
        out_shape,
    ))
}
