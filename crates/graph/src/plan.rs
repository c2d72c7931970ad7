//! The buffer plan: internal buffers whose node ranges do not overlap share one buffer (a slot). Largest first, each into the smallest slot none of whose buffers lives alongside it, else a new slot of its size. Slots are whole buffers, never overlapping sub-buffers of one arena: NVIDIA's OpenCL crashes releasing overlapping sub-buffers.
use crate::desc::Internal;
use crate::record::aligned;

/// Sets every buffer's `slot` and returns the slots' sizes in bytes.
pub(crate) fn assign(bufs: &mut [Internal], align: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..bufs.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(bufs[i].bytes), bufs[i].first));
    // Per slot: its size and the node ranges of its buffers.
    let mut slots: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    for i in order {
        let (first, last) = (bufs[i].first, bufs[i].last);
        let clear =
            |ranges: &Vec<(usize, usize)>| ranges.iter().all(|&(f, l)| l < first || last < f);
        // The smallest slot that is free over this buffer's range (all are large enough).
        let best = (slots.iter().enumerate())
            .filter(|(_, (_, r))| clear(r))
            .min_by_key(|(_, (size, _))| *size)
            .map(|(s, _)| s);
        let s = match best {
            Some(s) => s,
            None => {
                // Sizes come in decreasing order: a new slot's first buffer is its largest.
                slots.push((aligned(bufs[i].bytes, align), Vec::new()));
                slots.len() - 1
            }
        };
        slots[s].1.push((first, last));
        bufs[i].slot = s;
    }
    slots.into_iter().map(|(size, _)| size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(bytes: usize, first: usize, last: usize) -> Internal {
        Internal {
            bytes,
            first,
            last,
            slot: usize::MAX,
        }
    }

    /// Every slot holds its buffers, and no two buffers of a slot are alive together.
    fn check(bufs: &[Internal], slots: &[usize]) {
        for (a, x) in bufs.iter().enumerate() {
            assert!(x.bytes <= slots[x.slot], "buffer {a} fits its slot");
            for (b, y) in bufs.iter().enumerate().skip(a + 1) {
                let live = x.first <= y.last && y.first <= x.last;
                assert!(!(live && x.slot == y.slot), "{a} and {b} collide");
            }
        }
    }

    #[test]
    fn buffers_alive_together_never_share_and_disjoint_ones_do() {
        // A chain: each buffer lives over two nodes, so neighbours overlap and every other one can share.
        let mut bufs: Vec<Internal> = (0..10).map(|i| buf(1000 + i * 10, i, i + 1)).collect();
        let slots = assign(&mut bufs, 64);
        check(&bufs, &slots);
        assert_eq!(
            slots.len(),
            2,
            "two buffers are alive at any node: {slots:?}"
        );
        let total: usize = bufs.iter().map(|b| aligned(b.bytes, 64)).sum();
        assert!(slots.iter().sum::<usize>() < total / 4);
    }

    #[test]
    fn a_random_plan_is_valid() {
        // A small linear congruential generator: fixed, reproducible lifetimes and sizes.
        let mut s: u64 = 12345;
        let mut next = |m: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % m) as usize
        };
        let mut bufs: Vec<Internal> = (0..200)
            .map(|_| {
                let first = next(100);
                buf(1 + next(5000), first, first + next(20))
            })
            .collect();
        let slots = assign(&mut bufs, 128);
        check(&bufs, &slots);
    }
}
