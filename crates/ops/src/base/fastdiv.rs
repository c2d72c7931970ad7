//! `Div` of kernels/common.cl: a u32 divisor with the magic numbers that let a kernel divide by it in a multiply-high, an add and two shifts (Granlund and Montgomery's round-up method) instead of a division's twenty-odd instructions.

/// A divisor `d` and its magic numbers; `divq` in kernels/common.cl gives `n / d` exactly for
/// every u32 `n`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Div {
    d: u32,
    m: u32,
    s1: u32,
    s2: u32,
}

impl Div {
    /// The divisor `d`; 0 is taken as 1 (extents of empty tensors, whose kernels never run).
    pub(crate) fn new(d: u32) -> Div {
        let d = d.max(1);
        // l = ceil(log2(d)); m = floor(2^32 (2^l - d) / d) + 1 < 2^32.
        let l = 32 - (d - 1).leading_zeros();
        let m = ((((1u64 << l) - d as u64) << 32) / d as u64 + 1) as u32;
        Div {
            d,
            m,
            s1: l.min(1),
            s2: l.saturating_sub(1),
        }
    }

    /// The four words of the kernels' struct, for arguments built as words.
    pub(crate) fn words(&self) -> [u32; 4] {
        [self.d, self.m, self.s1, self.s2]
    }

    /// The kernels' quotient, computed as they do.
    #[cfg(test)]
    fn quotient(&self, n: u32) -> u32 {
        let t = ((n as u64 * self.m as u64) >> 32) as u32;
        (t + ((n - t) >> self.s1)) >> self.s2
    }
}

#[cfg(test)]
mod tests {
    use super::Div;

    #[test]
    fn the_quotient_is_exact_for_every_divisor_kind_and_edge_numerators() {
        let mut divisors: Vec<u32> = (1..=300).collect();
        for p in 1..32 {
            let b = 1u32 << p;
            divisors.extend([b - 1, b, b + 1]);
        }
        divisors.extend([7 * 7 * 64, 28 * 28, 1_000_003, u32::MAX - 1, u32::MAX]);
        // A fixed pseudo-random stream of numerators besides the edges.
        let mut x = 0x9e37_79b9_u32;
        for &d in &divisors {
            let f = Div::new(d);
            let mut ns = vec![0, 1, d - 1, d, d.wrapping_add(1), u32::MAX, u32::MAX - 1];
            ns.extend((1..4).map(|k| d.saturating_mul(k).saturating_sub(1)));
            for _ in 0..200 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                ns.push(x);
                ns.push(x >> (x % 32));
            }
            for n in ns {
                assert_eq!(f.quotient(n), n / d, "{n} / {d}");
            }
        }
        assert_eq!(Div::new(0), Div::new(1));
    }
}
