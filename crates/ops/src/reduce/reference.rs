//! The host reference of the reductions: each output's row reduced in f64 (outputs in parallel), rounded to the output dtype.
use super::{Reduce, ReduceOp};
use crate::base::axis::AxisSplit;
use crate::base::element::HostData;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};
use rayon::prelude::*;

/// Host reference: reduce one row of f64 values.
fn host_reduce(op: ReduceOp, row: &[f64]) -> f64 {
    let n = row.len();
    let arg = |better: fn(f64, f64) -> bool| {
        let mut best = 0;
        for i in 1..n {
            let (b, x) = (row[best], row[i]);
            if !b.is_nan() && (x.is_nan() || better(x, b)) {
                best = i;
            }
        }
        best as f64
    };
    match op {
        ReduceOp::Sum => row.iter().sum(),
        ReduceOp::Mean => row.iter().sum::<f64>() / n as f64,
        ReduceOp::Max => {
            row.iter().fold(
                f64::NEG_INFINITY,
                |m, &x| {
                    if x.is_nan() || x > m {
                        x
                    } else {
                        m
                    }
                },
            )
        }
        ReduceOp::Min => row.iter().fold(
            f64::INFINITY,
            |m, &x| {
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
            let mean = row.iter().sum::<f64>() / n as f64;
            let m2: f64 = row.iter().map(|x| (x - mean) * (x - mean)).sum();
            m2 / (n as f64 - correction).max(0.0)
        }
        ReduceOp::LogSumExp => {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
            if row.iter().any(|x| x.is_nan()) {
                f64::NAN
            } else if m.is_infinite() {
                m
            } else {
                m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
            }
        }
    }
}

/// The reduction on the host, into a new host tensor.
pub(super) fn reduce(desc: &Reduce) -> Result<Tensor> {
    let Reduce {
        x,
        op,
        mask,
        out_shape,
    } = desc;
    let split = AxisSplit::new(x, mask);
    let (nout, nred) = (split.nout(), split.nred());
    let rows = split
        .host_rows(x)
        .ok_or_else(|| Error::device(op.name(), "host tensor without host storage"))?;
    let vals: Vec<f64> = (0..nout)
        .into_par_iter()
        .map(|o| host_reduce(*op, &rows[o * nred..(o + 1) * nred]))
        .collect();
    Ok(Tensor::from_host_data(
        HostData::from_fn(op.out_dtype(x.dtype), nout, |i| vals[i]),
        out_shape,
    ))
}
