//! Test data that makes the rounding of a reduction depend on the order of its terms, and the host reduction in rank order that every collective must match bit for bit.
#![allow(dead_code)]
use netcl_core_devices::Result;
use netcl_distributed::{Comm, ReduceOp};
use netcl_ops::Tensor;

/// Rank r's test data: distinct per rank and element, with fractions that make the rounding of
/// the sum depend on the order of the terms.
pub fn data(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i * 7 + rank * 13) % 17) as f32 * 0.37 - 2.9
                + rank as f32 * 1e-3
                + (i % 5) as f32 * 1.1e-7
        })
        .collect()
}

/// The reference: op over ranks in rank order, computed on the host.
pub fn reference(op: ReduceOp, size: usize, n: usize, weights: &[f32]) -> Vec<f32> {
    let all: Vec<Vec<f32>> = (0..size).map(|r| data(r, n)).collect();
    (0..n)
        .map(|i| {
            let mut acc = match op {
                ReduceOp::WeightedSum => weights[0] * all[0][i],
                _ => all[0][i],
            };
            for r in 1..size {
                let x = all[r][i];
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Mean => acc + x,
                    ReduceOp::WeightedSum => acc + weights[r] * x,
                    ReduceOp::Max => acc.max(x),
                    ReduceOp::Min => acc.min(x),
                };
            }
            if op == ReduceOp::Mean {
                acc / size as f32
            } else {
                acc
            }
        })
        .collect()
}

pub fn tensor(comm: &Comm, n: usize) -> Result<Tensor> {
    Tensor::from_vec(data(comm.rank(), n), &[n], comm.device())
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
