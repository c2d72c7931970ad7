//! Reduction operators and the deterministic host reduction of one range over every rank's staged copy.
use crate::hub::Slot;

/// How all_reduce, reduce and reduce_scatter combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the number of ranks.
    Mean,
    Max,
    Min,
    /// The sum of each rank's values times the weight the rank gives (data-parallel training's
    /// gradient mean over shards of different sizes).
    WeightedSum,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::WeightedSum => "weighted_sum",
        }
    }
}

/// `op` over ranks 0, 1, ..., n-1 of `slot_r[from..from + len]`, always folded in rank order, so
/// the result is bit-identical whichever thread computes it and whenever. Max and min propagate
/// NaN (a NaN in any rank gives NaN, as torch does).
///
/// SAFETY: every slot's `ptr` must point at `>= from + len` live f32 that nobody writes until
/// this returns.
pub(crate) unsafe fn reduce_range(
    slots: &[Slot],
    op: ReduceOp,
    from: usize,
    len: usize,
) -> Vec<f32> {
    let src = |r: usize| std::slice::from_raw_parts((slots[r].ptr as *const f32).add(from), len);
    let scale0 = if op == ReduceOp::WeightedSum {
        slots[0].scale
    } else {
        1.0
    };
    let mut acc: Vec<f32> = if len == 0 {
        Vec::new()
    } else if scale0 == 1.0 {
        src(0).to_vec()
    } else {
        src(0).iter().map(|x| scale0 * *x).collect()
    };
    for (r, slot) in slots.iter().enumerate().skip(1) {
        if len == 0 {
            break;
        }
        let x = src(r);
        match op {
            ReduceOp::Sum | ReduceOp::Mean => acc.iter_mut().zip(x).for_each(|(a, x)| *a += *x),
            ReduceOp::WeightedSum => {
                let s = slot.scale;
                acc.iter_mut().zip(x).for_each(|(a, x)| *a += s * *x)
            }
            ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, x)| {
                if x.is_nan() || *x > *a {
                    *a = if a.is_nan() { *a } else { *x }
                }
            }),
            ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, x)| {
                if x.is_nan() || *x < *a {
                    *a = if a.is_nan() { *a } else { *x }
                }
            }),
        }
    }
    if op == ReduceOp::Mean {
        let k = slots.len() as f32;
        acc.iter_mut().for_each(|a| *a /= k);
    }
    acc
}

/// The part of `0..n` that rank `r` of `size` owns: balanced, the first `n % size` ranks one longer.
pub fn split_range(n: usize, size: usize, r: usize) -> std::ops::Range<usize> {
    let (q, rem) = (n / size, n % size);
    let start = r * q + r.min(rem);
    start..start + q + usize::from(r < rem)
}

/// Split `n` into parts proportional to `weights` (largest remainders, ties to the lower rank):
/// the parts sum to `n`, and equal weights give [`split_range`]'s sizes.
pub fn proportional_split(n: usize, weights: &[f64]) -> Vec<usize> {
    let total: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| n as f64 * w / total).collect();
    let mut parts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut left = n - parts.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.partial_cmp(&fa)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    for &r in order.iter().cycle() {
        if left == 0 {
            break;
        }
        parts[r] += 1;
        left -= 1;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_range() {
        for n in [0, 1, 7, 10] {
            for size in 1..5 {
                let parts: Vec<_> = (0..size).map(|r| split_range(n, size, r)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[size - 1].end, n);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let even = proportional_split(n, &vec![1.0; size]);
                let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
                assert_eq!(even, lens, "n {n} size {size}");
            }
        }
        assert_eq!(proportional_split(8, &[3.0, 1.0]), vec![6, 2]);
        assert_eq!(proportional_split(10, &[3.0, 1.0]), vec![8, 2]);
    }
}
