//! Dead nodes out of a recording: a node whose writes reach nothing the step keeps (no external buffer, no internal one a later live node touches) is left out of the graph, with the internal buffers only such nodes used (a loss no one reads, e.g. when the step returns nothing).
use crate::access::node_buffers;
use crate::desc::{BufRef, Internal};
use crate::record::Resolved;
use std::collections::HashSet;

/// Drops the dead nodes of `r` and the internal buffers no node left uses, renumbering the rest
/// (their node ranges and in-place pairs follow). Returns how many nodes were dropped.
pub(crate) fn prune(r: &mut Resolved) -> usize {
    // Backwards: internal buffers some later live node touches.
    let mut needed: HashSet<usize> = HashSet::new();
    let mut live = vec![false; r.nodes.len()];
    for (i, node) in r.nodes.iter().enumerate().rev() {
        live[i] = node_buffers(node).0.iter().any(|b| match b {
            BufRef::External(_) => true,
            BufRef::Internal(x) => needed.contains(x),
        });
        if live[i] {
            // Written buffers too: a partial write leaves the earlier writers' elements in use.
            needed.extend(node.buffers().into_iter().filter_map(|b| match b {
                BufRef::Internal(x) => Some(x),
                BufRef::External(_) => None,
            }));
        }
    }
    let dropped = live.iter().filter(|l| !**l).count();
    if dropped == 0 {
        return 0;
    }
    r.nodes = std::mem::take(&mut r.nodes)
        .into_iter()
        .zip(&live)
        .filter_map(|(n, l)| l.then_some(n))
        .collect();
    // New internal numbers in first-use order, with ranges over the new node numbers.
    let mut renumber: Vec<Option<usize>> = vec![None; r.internals.len()];
    let mut internals: Vec<Internal> = Vec::new();
    for (n, node) in r.nodes.iter_mut().enumerate() {
        for b in node.buffers_mut() {
            if let BufRef::Internal(x) = b {
                let y = *renumber[*x].get_or_insert_with(|| {
                    internals.push(Internal {
                        first: n,
                        ..r.internals[*x].clone()
                    });
                    internals.len() - 1
                });
                internals[y].last = n;
                *x = y;
            }
        }
    }
    // An in-place pair stays one where both buffers are left and still meet at one node.
    r.in_place = std::mem::take(&mut r.in_place)
        .into_iter()
        .filter_map(|(x, y)| Some((renumber[x]?, renumber[y]?)))
        .filter(|&(x, y)| internals[x].last == internals[y].first)
        .collect();
    r.internals = internals;
    dropped
}
