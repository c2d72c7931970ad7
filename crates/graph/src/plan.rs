//! The arena plan: internal buffers whose node ranges do not overlap share memory. Largest first, each at the lowest offset clear of the already placed buffers it lives alongside.
use crate::desc::Internal;
use crate::record::aligned;

/// Sets every buffer's `offset` and returns the arena's size in bytes.
pub(crate) fn assign(bufs: &mut [Internal], align: usize) -> usize {
    let mut order: Vec<usize> = (0..bufs.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(bufs[i].bytes), bufs[i].first));
    let mut placed: Vec<usize> = Vec::with_capacity(bufs.len());
    let mut arena = 0;
    for i in order {
        let size = aligned(bufs[i].bytes, align);
        // Byte ranges of placed buffers alive at the same time, by start.
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| bufs[j].first <= bufs[i].last && bufs[i].first <= bufs[j].last)
            .map(|&j| {
                (
                    bufs[j].offset,
                    bufs[j].offset + aligned(bufs[j].bytes, align),
                )
            })
            .collect();
        busy.sort_unstable();
        let mut offset = 0;
        for (start, end) in busy {
            if offset + size <= start {
                break;
            }
            offset = offset.max(end);
        }
        bufs[i].offset = offset;
        arena = arena.max(offset + size);
        placed.push(i);
    }
    arena
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(bytes: usize, first: usize, last: usize) -> Internal {
        Internal {
            bytes,
            first,
            last,
            offset: usize::MAX,
        }
    }

    fn overlaps(a: &Internal, b: &Internal, align: usize) -> bool {
        let live = a.first <= b.last && b.first <= a.last;
        let mem = a.offset < b.offset + aligned(b.bytes, align)
            && b.offset < a.offset + aligned(a.bytes, align);
        live && mem
    }

    #[test]
    fn buffers_alive_together_never_share_bytes_and_disjoint_ones_do() {
        // A chain: each buffer lives over two nodes, so neighbours overlap and every other one can share.
        let mut bufs: Vec<Internal> = (0..10).map(|i| buf(1000 + i * 10, i, i + 1)).collect();
        let arena = assign(&mut bufs, 64);
        for a in 0..bufs.len() {
            for b in a + 1..bufs.len() {
                assert!(!overlaps(&bufs[a], &bufs[b], 64), "{a} and {b} collide");
            }
            assert_eq!(bufs[a].offset % 64, 0);
        }
        let total: usize = bufs.iter().map(|b| aligned(b.bytes, 64)).sum();
        // Two buffers are alive at any node: the arena needs about two of the largest.
        assert!(arena <= 2 * aligned(1090, 64), "arena {arena} of {total}");
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
        let arena = assign(&mut bufs, 128);
        for a in 0..bufs.len() {
            assert!(bufs[a].offset + bufs[a].bytes <= arena);
            for b in a + 1..bufs.len() {
                assert!(!overlaps(&bufs[a], &bufs[b], 128), "{a} and {b} collide");
            }
        }
    }
}
