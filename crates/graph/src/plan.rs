//! The buffer plan: internal buffers whose node ranges do not overlap, or meet at a kernel declared safe to run in place, share one buffer (a slot). A few orders of placement (largest first, first use first, longest lived first), each buffer into the compatible slot that grows least, else a new slot; the smallest total wins. Slots are whole buffers, never overlapping sub-buffers of one arena: NVIDIA's OpenCL crashes releasing overlapping sub-buffers.
use crate::desc::Internal;
use crate::record::aligned;
use std::collections::HashSet;

/// Sets every buffer's `slot` and returns the slots' sizes in bytes. `in_place` lists pairs
/// (input, output) where one kernel may read the input and write the output as one buffer: the
/// two may share a slot although their ranges meet at that kernel.
pub(crate) fn assign(
    bufs: &mut [Internal],
    in_place: &[(usize, usize)],
    align: usize,
) -> Vec<usize> {
    let pairs: HashSet<(usize, usize)> = in_place.iter().copied().collect();
    let by = |key: &dyn Fn(&Internal) -> (usize, usize, usize)| {
        let mut order: Vec<usize> = (0..bufs.len()).collect();
        order.sort_by_key(|&i| (key(&bufs[i]), i));
        order
    };
    let orders = [
        by(&|b| (usize::MAX - b.bytes, b.first, 0)),
        by(&|b| (b.first, usize::MAX - b.bytes, 0)),
        by(&|b| {
            (
                usize::MAX - (b.last - b.first),
                usize::MAX - b.bytes,
                b.first,
            )
        }),
    ];
    let (slot_of, sizes) = orders
        .iter()
        .map(|order| place(bufs, order, &pairs, align))
        .min_by_key(|(_, sizes)| sizes.iter().sum::<usize>())
        .unwrap_or_default();
    for (b, s) in bufs.iter_mut().zip(slot_of) {
        b.slot = s;
    }
    sizes
}

/// Places the buffers in `order`: each into the slot free over its range that grows least
/// (then the smallest), or a new slot when growing one would cost as much. Returns each
/// buffer's slot and the slots' sizes.
fn place(
    bufs: &[Internal],
    order: &[usize],
    pairs: &HashSet<(usize, usize)>,
    align: usize,
) -> (Vec<usize>, Vec<usize>) {
    let mut slot_of = vec![usize::MAX; bufs.len()];
    // Per slot: its size and its buffers.
    let mut slots: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in order {
        let (first, last) = (bufs[i].first, bufs[i].last);
        let bytes = aligned(bufs[i].bytes, align);
        let apart = |j: usize| {
            let (f, l) = (bufs[j].first, bufs[j].last);
            l < first
                || last < f
                || (l == first && pairs.contains(&(j, i)))
                || (last == f && pairs.contains(&(i, j)))
        };
        let best = (slots.iter().enumerate())
            .filter(|(_, (_, held))| held.iter().all(|&j| apart(j)))
            .map(|(s, (size, _))| (bytes.saturating_sub(*size), *size, s))
            .min_by_key(|&(grow, size, _)| (grow, size))
            .filter(|&(grow, _, _)| grow < bytes);
        let s = match best {
            Some((_, size, s)) => {
                slots[s].0 = size.max(bytes);
                s
            }
            None => {
                slots.push((bytes, Vec::new()));
                slots.len() - 1
            }
        };
        slots[s].1.push(i);
        slot_of[i] = s;
    }
    (slot_of, slots.into_iter().map(|(size, _)| size).collect())
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

    /// Every slot holds its buffers, and no two buffers of a slot are alive together (except
    /// a declared in-place pair meeting at one node).
    fn check(bufs: &[Internal], slots: &[usize], in_place: &[(usize, usize)]) {
        for (a, x) in bufs.iter().enumerate() {
            assert!(x.bytes <= slots[x.slot], "buffer {a} fits its slot");
            for (b, y) in bufs.iter().enumerate().skip(a + 1) {
                let meet = |p: usize, q: usize| {
                    bufs[p].last == bufs[q].first && in_place.contains(&(p, q))
                };
                let live = x.first <= y.last && y.first <= x.last && !meet(a, b) && !meet(b, a);
                assert!(!(live && x.slot == y.slot), "{a} and {b} collide");
            }
        }
    }

    #[test]
    fn buffers_alive_together_never_share_and_disjoint_ones_do() {
        // A chain: each buffer lives over two nodes, so neighbours overlap and every other one can share.
        let mut bufs: Vec<Internal> = (0..10).map(|i| buf(1000 + i * 10, i, i + 1)).collect();
        let slots = assign(&mut bufs, &[], 64);
        check(&bufs, &slots, &[]);
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
        let slots = assign(&mut bufs, &[], 128);
        check(&bufs, &slots, &[]);
    }

    #[test]
    fn an_elementwise_chain_runs_in_one_slot_only_where_declared() {
        // x0 -> x1 -> x2 -> x3, each made by the kernel that last reads the one before.
        let make = || -> Vec<Internal> { (0..4).map(|i| buf(4096, i, i + 1)).collect() };
        let chain = [(0, 1), (1, 2), (2, 3)];
        let mut bufs = make();
        let slots = assign(&mut bufs, &chain, 256);
        check(&bufs, &slots, &chain);
        assert_eq!(slots, vec![4096], "the whole chain in place");
        let mut bufs = make();
        let slots = assign(&mut bufs, &chain[..1], 256);
        check(&bufs, &slots, &chain[..1]);
        assert_eq!(slots.len(), 2, "only x0 -> x1 in place: {slots:?}");
    }
}
