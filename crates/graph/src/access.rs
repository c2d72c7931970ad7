//! What a node of a graph reads and writes: a kernel's arguments by the write flags its declaration gave the launch record, a copy's source read and destination written. A replay over several queues orders its nodes by them; pruning keeps a node whose writes reach something kept.
use crate::desc::{BufRef, Node, NodeArg};

/// The buffers `node` writes and those it only reads: a kernel's arguments by its write flags
/// (every buffer counts as written where it has none), a copy's source read and destination
/// written.
pub(crate) fn node_buffers(node: &Node) -> (Vec<BufRef>, Vec<BufRef>) {
    match node {
        Node::Launch {
            args, writes: w, ..
        } => {
            let known = w.len() == args.len();
            let (mut writes, mut reads) = (Vec::new(), Vec::new());
            for (i, arg) in args.iter().enumerate() {
                if let NodeArg::Buf(b) = arg {
                    let w = !known || w[i];
                    if w { &mut writes } else { &mut reads }.push(*b);
                }
            }
            (writes, reads)
        }
        Node::Write { dst, .. } => (vec![*dst], Vec::new()),
        Node::Copy { src, dst, .. } => (vec![*dst], vec![*src]),
    }
}
