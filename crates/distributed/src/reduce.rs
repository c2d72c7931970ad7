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

/// `op` over ranks 0, 1, ..., n-1 of `slot_r[from..from + len]` (see [`fold`]).
///
/// SAFETY: every slot's `ptr` must point at `>= from + len` live f32 that nobody writes until
/// this returns.
pub(crate) unsafe fn reduce_range(
    slots: &[Slot],
    op: ReduceOp,
    from: usize,
    len: usize,
) -> Vec<f32> {
    let srcs: Vec<*const f32> = slots
        .iter()
        .map(|s| (s.ptr as *const f32).add(from))
        .collect();
    let scales: Vec<f32> = slots.iter().map(|s| s.scale).collect();
    let mut out = vec![0f32; len];
    fold(&srcs, &scales, op, out.as_mut_ptr(), len);
    out
}

/// Elements folded at once (an accumulator on the stack).
const BLOCK: usize = 1024;

/// `op` over ranks 0, 1, ..., n-1 of `srcs[r][..len]` (rank r's values weigh `scales[r]` under
/// [`ReduceOp::WeightedSum`]), written to `dst[..len]`, which may be one of the sources. Always
/// folded in rank order, so the result is bit-identical whichever thread computes it and
/// whenever, and whatever ranges it is split into. Max and min propagate NaN (a NaN in any rank
/// gives NaN, as torch does).
///
/// SAFETY: every source must hold `len` live f32 and `dst` must be writable for `len` f32;
/// nobody else writes them until this returns.
pub(crate) unsafe fn fold(
    srcs: &[*const f32],
    scales: &[f32],
    op: ReduceOp,
    dst: *mut f32,
    len: usize,
) {
    let mut acc = [0f32; BLOCK];
    for at in (0..len).step_by(BLOCK) {
        let m = BLOCK.min(len - at);
        let acc = &mut acc[..m];
        let src = |r: usize| std::slice::from_raw_parts(srcs[r].add(at), m);
        acc.copy_from_slice(src(0));
        if op == ReduceOp::WeightedSum && scales[0] != 1.0 {
            acc.iter_mut().for_each(|a| *a *= scales[0]);
        }
        for (r, &s) in scales.iter().enumerate().take(srcs.len()).skip(1) {
            let x = src(r);
            match op {
                ReduceOp::Sum | ReduceOp::Mean => acc.iter_mut().zip(x).for_each(|(a, x)| *a += *x),
                ReduceOp::WeightedSum => acc.iter_mut().zip(x).for_each(|(a, x)| *a += s * *x),
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
            let k = srcs.len() as f32;
            acc.iter_mut().for_each(|a| *a /= k);
        }
        std::ptr::copy_nonoverlapping(acc.as_ptr(), dst.add(at), m);
    }
}

/// The threads that fold for the device relay: a quarter of the cores, 1 to 8 (the rest stay
/// free for the ranks' threads and the driver's: with a pool over every core, a fold thread
/// preempted mid-part stalled whole collectives for milliseconds). `None` if the threads cannot
/// be started (the relay then folds on its own thread).
pub(crate) fn fold_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads((cores / 4).clamp(1, 8))
            .thread_name(|i| format!("netcl-fold-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// [`fold`] over parts of `len` on the threads of the current rayon pool (the same bits).
///
/// SAFETY: as [`fold`].
pub(crate) unsafe fn fold_parallel(
    srcs: &[*const f32],
    scales: &[f32],
    op: ReduceOp,
    dst: *mut f32,
    len: usize,
) {
    use rayon::prelude::*;
    const PART: usize = 64 * BLOCK;
    if len <= PART {
        return fold(srcs, scales, op, dst, len);
    }
    let addrs: Vec<usize> = srcs.iter().map(|p| *p as usize).collect();
    let dst = dst as usize;
    (0..len.div_ceil(PART)).into_par_iter().for_each(|p| {
        let at = p * PART;
        let m = PART.min(len - at);
        let part: Vec<*const f32> = addrs.iter().map(|a| (*a as *const f32).add(at)).collect();
        // SAFETY: the caller's contract; the parts are disjoint ranges of the same buffers.
        fold(&part, scales, op, (dst as *mut f32).add(at), m);
    });
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
