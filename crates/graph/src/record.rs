//! From a recording to nodes and buffers: each buffer a node touches becomes internal (made and freed inside the step, planned into shared slots) or external (it existed before, or the step kept it), with the node range it lives over.
use crate::desc::{BufRef, External, Internal, Node, NodeArg, ProgramDesc, Role};
use netcl_core_devices::{Error, Result};
use netcl_core_memory::capture::{Arg, Event, Mem, Recording};
use netcl_kernels::Program;
use std::collections::HashMap;
use std::sync::Arc;

/// A recording resolved into nodes over numbered buffers.
pub(crate) struct Resolved {
    pub nodes: Vec<Node>,
    pub programs: Vec<Arc<Program>>,
    pub program_descs: Vec<ProgramDesc>,
    pub internals: Vec<Internal>,
    pub externals: Vec<External>,
    /// The buffer of each external.
    pub external_mems: Vec<Mem>,
    pub eager_peak_bytes: usize,
    /// Internal buffers (input, output) that one kernel may run in place on: the input's last
    /// node is the output's first, and the kernel declared the pair safe.
    pub in_place: Vec<(usize, usize)>,
}

/// Rounds `n` up to a multiple of `align` (at least one `align`).
pub(crate) fn aligned(n: usize, align: usize) -> usize {
    n.max(1).div_ceil(align) * align
}

struct Builder {
    /// Live blocks allocated during the capture: mem -> (alloc index, bytes).
    live: HashMap<Mem, usize>,
    /// Per alloc event: its bytes, whether it was freed before the end, its pool class.
    allocs: Vec<(usize, bool, usize)>,
    /// For each alloc that is kept alive past the end, its external index (filled lazily).
    externals: Vec<External>,
    external_mems: Vec<Mem>,
    external_of: HashMap<Mem, usize>,
    /// Externals that existed before the capture and were released during it, with their size.
    released_before: HashMap<Mem, usize>,
}

impl Builder {
    fn external(&mut self, mem: Mem, bytes: usize, role: Role) -> usize {
        *self.external_of.entry(mem).or_insert_with(|| {
            self.externals.push(External {
                name: None,
                bytes,
                role,
            });
            self.external_mems.push(mem);
            self.externals.len() - 1
        })
    }
}

/// Resolves `rec`; `bytes_of` gives the storage size of a buffer that existed before the capture.
pub(crate) fn resolve(rec: Recording, bytes_of: impl Fn(Mem) -> usize) -> Result<Resolved> {
    // Pass 1: which allocations are freed inside the step.
    let mut b = Builder {
        live: HashMap::new(),
        allocs: Vec::new(),
        externals: Vec::new(),
        external_mems: Vec::new(),
        external_of: HashMap::new(),
        released_before: HashMap::new(),
    };
    for e in &rec.events {
        match e {
            Event::Alloc { mem, bytes, class } => {
                b.live.insert(*mem, b.allocs.len());
                b.allocs.push((*bytes, false, *class));
            }
            Event::Free { mem } => {
                if let Some(i) = b.live.remove(mem) {
                    b.allocs[i].1 = true;
                }
            }
            _ => {}
        }
    }
    // Pass 2: nodes over numbered buffers.
    b.live.clear();
    let mut alloc_index = 0;
    // alloc index -> internal index (freed allocations that a node touches).
    let mut internal_of: HashMap<usize, usize> = HashMap::new();
    let mut internals: Vec<Internal> = Vec::new();
    let mut nodes = Vec::new();
    let mut programs: Vec<Arc<Program>> = Vec::new();
    let mut program_descs = Vec::new();
    let (mut in_use, mut peak) = (0usize, 0usize);
    // (node, input internal, output internal) declared in place at that node.
    let mut in_place = Vec::new();
    for e in rec.events {
        let n = nodes.len();
        let mut buf = |b: &mut Builder, mem: Mem| -> Result<BufRef> {
            match b.live.get(&mem) {
                Some(&a) if b.allocs[a].1 => {
                    let i = *internal_of.entry(a).or_insert_with(|| {
                        internals.push(Internal {
                            bytes: b.allocs[a].0,
                            first: n,
                            last: n,
                            slot: 0,
                        });
                        internals.len() - 1
                    });
                    internals[i].last = n;
                    Ok(BufRef::Internal(i))
                }
                Some(&a) => Ok(BufRef::External(b.external(mem, b.allocs[a].0, Role::Kept))),
                None => {
                    if let Some(bytes) = b.released_before.get(&mem) {
                        return Err(Error::invalid(
                            "Graph::capture",
                            format!(
                                "a {bytes}-byte buffer the step used was released during the \
                                 capture and used again: tensors the step reads must outlive it"
                            ),
                        ));
                    }
                    Ok(BufRef::External(b.external(
                        mem,
                        bytes_of(mem),
                        Role::Bound,
                    )))
                }
            }
        };
        let node = match e {
            Event::Alloc { mem, class, .. } => {
                b.live.insert(mem, alloc_index);
                if b.allocs[alloc_index].1 {
                    in_use += class;
                    peak = peak.max(in_use);
                }
                alloc_index += 1;
                continue;
            }
            Event::Free { mem } => {
                match b.live.remove(&mem) {
                    Some(a) if b.allocs[a].1 => in_use -= b.allocs[a].2,
                    Some(_) => {}
                    None => {
                        // An outside buffer let go inside the step: an error only if a node used
                        // it (a later use is caught above; an earlier one here).
                        if let Some(&x) = b.external_of.get(&mem) {
                            return Err(Error::invalid(
                                "Graph::capture",
                                format!(
                                    "a {}-byte buffer the step used was released during the \
                                     capture: tensors the step reads must outlive it",
                                    b.externals[x].bytes
                                ),
                            ));
                        }
                        b.released_before.insert(mem, bytes_of(mem));
                    }
                }
                continue;
            }
            Event::Launch(l) => {
                let program: Arc<Program> = l.program.downcast().map_err(|_| {
                    Error::invalid("Graph::capture", "a launch recorded a foreign program")
                })?;
                let p = match programs.iter().position(|q| Arc::ptr_eq(q, &program)) {
                    Some(p) => p,
                    None => {
                        program_descs.push(ProgramDesc {
                            name: program.source.name.to_string(),
                            text: program.source.text.to_string(),
                            options: program.options.clone(),
                        });
                        programs.push(program);
                        programs.len() - 1
                    }
                };
                let mut args = Vec::with_capacity(l.args.len());
                for a in l.args {
                    args.push(match a {
                        Arg::Mem(m) => NodeArg::Buf(buf(&mut b, m)?),
                        Arg::Bytes(v) => NodeArg::Bytes(v),
                        Arg::Local(n) => NodeArg::Local(n),
                    });
                }
                // Declared pairs of internal buffers that appear once each in this launch.
                let once = |r: BufRef| {
                    args.iter()
                        .filter(|a| matches!(a, NodeArg::Buf(x) if *x == r))
                        .count()
                        == 1
                };
                for &(o, i) in &l.in_place {
                    if let (
                        Some(&NodeArg::Buf(y @ BufRef::Internal(yi))),
                        Some(&NodeArg::Buf(x @ BufRef::Internal(xi))),
                    ) = (args.get(o), args.get(i))
                    {
                        if xi != yi && once(x) && once(y) {
                            in_place.push((n, xi, yi));
                        }
                    }
                }
                Node::Launch {
                    program: p,
                    kernel: l.kernel,
                    args,
                    global: l.global,
                    local: l.local,
                    writes: l.writes,
                }
            }
            Event::Write { mem, offset, data } => Node::Write {
                dst: buf(&mut b, mem)?,
                offset,
                data,
            },
            Event::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => Node::Copy {
                src: buf(&mut b, src)?,
                src_offset,
                dst: buf(&mut b, dst)?,
                dst_offset,
                len,
            },
        };
        nodes.push(node);
    }
    // A pair counts where the input dies at the node that makes the output.
    let in_place = in_place
        .into_iter()
        .filter(|&(n, x, y)| internals[x].last == n && internals[y].first == n)
        .map(|(_, x, y)| (x, y))
        .collect();
    Ok(Resolved {
        in_place,
        nodes,
        programs,
        program_descs,
        internals,
        externals: b.externals,
        external_mems: b.external_mems,
        eager_peak_bytes: peak,
    })
}
