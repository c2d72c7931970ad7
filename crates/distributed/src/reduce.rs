//! Reduction operators and the deterministic host reduction of one range over every rank's staged copy.
use crate::hub::Slot;
use half::bf16;

/// An element type values travel in between ranks: f32, or bf16 (half the bytes; the fold
/// still sums in f32 and rounds its result to nearest even once).
pub(crate) trait Wire: Copy + Send + Sync + 'static {
    fn get(self) -> f32;
    fn put(x: f32) -> Self;
}

impl Wire for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
    #[inline(always)]
    fn put(x: f32) -> f32 {
        x
    }
}

/// Branch-free conversions (the fold's loops vectorise), equal to `half`'s: widening is a
/// shift; narrowing rounds to nearest even, NaN stays a (quiet) NaN.
impl Wire for bf16 {
    #[inline(always)]
    fn get(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn put(x: f32) -> bf16 {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        let nan = ((b >> 16) as u16) | 0x40;
        bf16::from_bits(if x.is_nan() { nan } else { rounded })
    }
}

/// `x` rounded to bf16 and back (what a bf16 wire keeps of an f32), in place.
pub(crate) fn round_to_bf16(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = bf16::put(*v).get());
}

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
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::WeightedSum,
    ];

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
/// Elements are f32 or bf16 ([`Wire`]); the accumulation is f32 either way.
///
/// SAFETY: every source must hold `len` live elements and `dst` must be writable for `len`;
/// nobody else writes them until this returns.
pub(crate) unsafe fn fold<T: Wire>(
    srcs: &[*const T],
    scales: &[f32],
    op: ReduceOp,
    dst: *mut T,
    len: usize,
) {
    // The widest vectors the CPU has (the same operations in each: the same bits; bf16's
    // conversions gain the most).
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            return fold_avx512(srcs, scales, op, dst, len);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return fold_avx2(srcs, scales, op, dst, len);
        }
    }
    fold_lanes(srcs, scales, op, dst, len)
}

/// [`fold_lanes`] compiled for more instruction sets than the build's baseline.
macro_rules! fold_for {
    ($name:ident, $features:literal) => {
        /// [`fold_lanes`] compiled with
        #[doc = $features]
        ///
        /// SAFETY: as [`fold`], on a CPU with those features.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<T: Wire>(
            srcs: &[*const T],
            scales: &[f32],
            op: ReduceOp,
            dst: *mut T,
            len: usize,
        ) {
            fold_lanes(srcs, scales, op, dst, len)
        }
    };
}
fold_for!(fold_avx512, "avx512f,avx512bw");
fold_for!(fold_avx2, "avx2");

/// [`fold`]'s loops, inlined into each instruction set's copy.
#[inline(always)]
unsafe fn fold_lanes<T: Wire>(
    srcs: &[*const T],
    scales: &[f32],
    op: ReduceOp,
    dst: *mut T,
    len: usize,
) {
    let mut acc = [0f32; BLOCK];
    let mut row = [0f32; BLOCK];
    for at in (0..len).step_by(BLOCK) {
        let m = BLOCK.min(len - at);
        let acc = &mut acc[..m];
        let row = &mut row[..m];
        // Rank r's elements of this block, as f32.
        let load = |r: usize, into: &mut [f32]| {
            let x = std::slice::from_raw_parts(srcs[r].add(at), m);
            into.iter_mut().zip(x).for_each(|(o, v)| *o = v.get());
        };
        load(0, acc);
        if op == ReduceOp::WeightedSum && scales[0] != 1.0 {
            acc.iter_mut().for_each(|a| *a *= scales[0]);
        }
        for (r, &s) in scales.iter().enumerate().take(srcs.len()).skip(1) {
            load(r, row);
            let x = &*row;
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
        let out = std::slice::from_raw_parts_mut(dst.add(at), m);
        out.iter_mut()
            .zip(acc.iter())
            .for_each(|(o, a)| *o = T::put(*a));
    }
}

/// The threads that fold for the device relay: a quarter of the cores, 1 to 16 (the rest stay
/// free for the ranks' threads and the driver's: with a pool over every core, a fold thread
/// preempted mid-part stalled whole collectives for milliseconds). `None` if the threads cannot
/// be started (the relay then folds on its own thread).
pub(crate) fn fold_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads((cores / 4).clamp(1, 16))
            .thread_name(|i| format!("netcl-fold-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// [`fold`] over parts of `len` on the threads of the current rayon pool (the same bits).
///
/// SAFETY: as [`fold`].
pub(crate) unsafe fn fold_parallel<T: Wire>(
    srcs: &[*const T],
    scales: &[f32],
    op: ReduceOp,
    dst: *mut T,
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
        let part: Vec<*const T> = addrs.iter().map(|a| (*a as *const T).add(at)).collect();
        // SAFETY: the caller's contract; the parts are disjoint ranges of the same buffers.
        fold(&part, scales, op, (dst as *mut T).add(at), m);
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
    fn bf16_conversions_equal_the_half_crates() {
        let mut x: Vec<f32> = (0..200_000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
            .collect();
        x.extend([
            0.0,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        for v in x {
            let (ours, theirs) = (bf16::put(v), bf16::from_f32(v));
            if v.is_nan() {
                assert!(ours.is_nan() && theirs.is_nan(), "{v:e}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{v:e}");
            }
            assert_eq!(Wire::get(theirs).to_bits(), theirs.to_f32().to_bits());
        }
    }

    /// Every instruction set's fold gives the portable loop's bits: f32 and bf16, every op,
    /// three ranks with weights, NaN and infinities, lengths off the vector width and BLOCK.
    #[test]
    fn vector_folds_equal_the_portable_loop() {
        let len = 2 * BLOCK + 37;
        let value = |r: usize, i: usize| match (i * 7 + r) % 97 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => -0.0,
            _ => f32::from_bits(((i * 31 + r * 1013) as u32).wrapping_mul(2_654_435_761)) % 1e6,
        };
        let scales = [0.5, 0.25, 0.125];
        fn check<T: Wire>(data: &[Vec<T>], scales: &[f32], op: ReduceOp, len: usize) {
            let srcs: Vec<*const T> = data.iter().map(|d| d.as_ptr()).collect();
            let mut want = data[0].clone();
            let mut got = data[0].clone();
            // SAFETY: every source holds `len` elements; the outputs are separate vectors.
            unsafe {
                fold_lanes(&srcs, scales, op, want.as_mut_ptr(), len);
                fold(&srcs, scales, op, got.as_mut_ptr(), len);
            }
            let bits = |v: &[T]| v.iter().map(|x| x.get().to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{op:?}");
        }
        for op in ReduceOp::ALL {
            let f: Vec<Vec<f32>> = (0..3)
                .map(|r| (0..len).map(|i| value(r, i)).collect())
                .collect();
            check(&f, &scales, op, len);
            let h: Vec<Vec<bf16>> = f
                .iter()
                .map(|v| v.iter().map(|&x| bf16::put(x)).collect())
                .collect();
            check(&h, &scales, op, len - 5);
        }
    }

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
