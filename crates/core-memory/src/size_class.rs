//! Size classes of the pool: four steps per power of two, so a block wastes under 25% of itself.

/// Blocks up to this size are carved out of shared slabs; larger ones get a buffer of their own.
pub const SMALL_MAX: usize = 512 * 1024;
/// Size of one slab that small blocks are carved from.
pub const SLAB_BYTES: usize = 2 * 1024 * 1024;

/// The class (block size in bytes) that serves a request of `bytes`, for sub-buffer alignment `align`.
///
/// Between 2^e and 2^(e+1) there are four classes, 2^e·(5/4, 6/4, 7/4, 8/4), so
/// `(class - bytes) / class < 1/4` whenever the class step is at least `align`
/// (requests of at least `4 * align` bytes). Smaller requests round up to a multiple of `align`,
/// because every sub-buffer must start at an aligned offset.
pub fn size_class(bytes: usize, align: usize) -> usize {
    let align = align.max(1);
    let b = bytes.max(1);
    if b <= align {
        return align;
    }
    let e = usize::BITS - 1 - (b - 1).leading_zeros(); // 2^e < b <= 2^(e+1)
    let step = ((1usize << e) / 4).max(align);
    b.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_the_request_and_waste_under_a_quarter() {
        for align in [64usize, 128, 256, 512, 4096] {
            let mut s = 1usize;
            while s < (1 << 31) {
                for b in [s, s + 1, s * 5 / 4, s * 3 / 2 + 7, s * 2 - 1] {
                    let c = size_class(b, align);
                    assert!(
                        c >= b && c.is_multiple_of(align),
                        "class {c} for {b} (align {align})"
                    );
                    if b >= 4 * align {
                        assert!(
                            ((c - b) as f64) < 0.25 * c as f64,
                            "class {c} wastes too much for {b}"
                        );
                    } else {
                        assert!(c - b < align.max(b / 4 + align), "class {c} for small {b}");
                    }
                }
                s *= 2;
            }
        }
    }

    #[test]
    fn few_distinct_classes() {
        let mut classes: Vec<usize> = (1..=1 << 20)
            .step_by(97)
            .map(|b| size_class(b, 128))
            .collect();
        classes.dedup();
        assert!(classes.len() < 80, "{} classes up to 1 MiB", classes.len());
    }
}
