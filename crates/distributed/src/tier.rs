//! Tier: a rank of a job of several processes with several devices each (`MpiWorld::group`): collectives fold the process's ranks through its hub, then the processes through MPI.
//!
//! Process p's device l is rank p L + l of P L. A reduction sums the L ranks of each process in
//! rank order (the hub's host fold), then local rank l sums segment l of the P process sums in
//! process order over the MPI communicator that local rank l of every process shares (so the L
//! threads of a process reduce at once, each segment crossing once), and the process's ranks
//! copy each other's segments; every rank ends with the same bits. Broadcasts and
//! gathers copy within the process through the hub's exchanged pointers. A failure within a
//! process ends the MPI job (MPI_Abort): the other processes would wait for it forever.
use crate::group::Comm;
use crate::hub::{Hub, Slot};
use crate::mpi::{Link, Net};
use crate::reduce::{split_range, ReduceOp};
use netcl_core_devices::{Device, Error, Result};
use std::sync::Arc;

/// One rank's two communicators: its process's ranks (`local`, a hub) and local rank l of every
/// process (`link`, MPI).
pub(crate) struct Tier {
    local: Comm,
    link: Link,
}

/// The job-wide communicator of rank `local.rank` of its process, whose local rank's MPI
/// communicator is `link`.
pub(crate) fn tiered(local: Comm, link: Link) -> Comm {
    let (l, size) = (local.rank, local.size);
    let rank = link.rank() * size + l;
    let processes = link.size();
    let device: Device = local.device.clone();
    // The job's ranks never meet in this hub (every collective goes through the tier); it
    // carries the process's abort flag, and no relay (data parallelism reduces on the host).
    let hub = Arc::new(Hub::new(
        1,
        local.hub.abort.clone(),
        local.hub.timeout,
        false,
    ));
    let mut c = Comm::new(rank, processes * size, device, hub);
    c.mpi = Some(Arc::new(Tier { local, link }));
    c
}

impl Tier {
    /// `r`, or the end of the job when it is an error (the other processes wait in MPI).
    fn or_abort<T>(&self, r: Result<T>) -> T {
        r.unwrap_or_else(|e| self.abort(&e.to_string()))
    }

    /// Local rank `root`'s `data` into every local rank's (pointers exchanged through the hub).
    fn local_broadcast<T: Copy>(&self, op: &str, data: &mut [T], root: usize) -> Result<()> {
        let slots = self.local.exchange(op, Slot::of(data, Vec::new()))?;
        let from = &slots[root];
        if from.len != data.len() {
            return Err(Error::shape(
                op,
                format!(
                    "rank {root} holds {} elements, this rank {}",
                    from.len,
                    data.len()
                ),
            ));
        }
        if self.local.rank != root {
            // SAFETY: the root's slice stays alive and unchanged until the sync below.
            let src = unsafe { std::slice::from_raw_parts(from.ptr as *const T, from.len) };
            data.copy_from_slice(src);
        }
        self.local.sync(op)
    }

    /// Rank `root`'s `data` into every rank's: within the root's process, then from that
    /// process to the others through `across` (the MPI broadcast of this element type).
    fn spread<T: Copy>(
        &self,
        data: &mut [T],
        root: usize,
        across: impl FnOnce(&Link, &mut [T], usize) -> Result<()>,
    ) -> Result<()> {
        let l = self.local.size;
        if self.link.rank() == root / l {
            self.or_abort(self.local_broadcast("broadcast", data, root % l));
        }
        across(&self.link, data, root / l)
    }
}

impl Net for Tier {
    fn all_reduce_host(&self, data: &mut [f32], op: ReduceOp, scale: f32) -> Result<()> {
        // Weights apply once, in the process's fold; Mean divides by L, then by P.
        let across = match op {
            ReduceOp::WeightedSum => ReduceOp::Sum,
            op => op,
        };
        self.or_abort(self.local.all_reduce_host(data, op, scale));
        // Local rank l folds segment l over the processes, then the process's ranks copy each
        // other's segments: every segment crosses between processes once.
        let (n, size) = (data.len(), self.local.size);
        let seg = |k: usize| split_range(n, size, k);
        let mine = seg(self.local.rank);
        let folded = self.link.all_reduce_host(&mut data[mine], across, 1.0);
        self.or_abort(folded);
        let slots = self.or_abort(
            self.local
                .exchange("all_reduce", Slot::of(data, Vec::new())),
        );
        for (k, slot) in slots
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != self.local.rank)
        {
            let r = seg(k);
            // SAFETY: rank k's buffer has data.len() elements (the local fold checked) and its
            // segment k is final and unchanged until the sync below; nobody writes segment k of
            // this rank's buffer but this rank.
            let src = unsafe {
                std::slice::from_raw_parts((slot.ptr as *const f32).add(r.start), r.len())
            };
            data[r].copy_from_slice(src);
        }
        self.or_abort(self.local.sync("all_reduce"));
        Ok(())
    }

    fn broadcast_host(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.spread(data, root, <Link as Net>::broadcast_host)
    }

    fn broadcast_sizes(&self, data: &mut [u64], root: usize) -> Result<()> {
        self.spread(data, root, <Link as Net>::broadcast_sizes)
    }

    fn all_gather_rows(
        &self,
        data: &[f32],
        rows: usize,
        row: usize,
    ) -> Result<(Vec<usize>, Vec<f32>)> {
        let op = "all_gather";
        // The process's block: its ranks' rows in local order (the same on each of them).
        let slots = self.or_abort(self.local.exchange(op, Slot::of(data, vec![rows, row])));
        let block: Vec<f32> = slots
            .iter()
            // SAFETY: every slice stays alive and unchanged until the sync below.
            .flat_map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const f32, s.len) })
            .copied()
            .collect();
        let local_rows: Vec<u64> = slots.iter().map(|s| s.shape[0] as u64).collect();
        let rows_differ = slots.iter().any(|s| s.shape[1] != row);
        self.or_abort(self.local.sync(op));
        if rows_differ {
            self.abort("all_gather: the ranks of a process hold rows of different shapes");
        }
        let (_, all) = self
            .link
            .all_gather_rows(&block, block.len() / row.max(1), row)?;
        let per_rank = self.link.all_gather_sizes(&local_rows);
        Ok((per_rank.into_iter().map(|r| r as usize).collect(), all))
    }

    fn barrier(&self) -> Result<()> {
        self.or_abort(self.local.sync("barrier"));
        self.link.barrier()?;
        self.or_abort(self.local.sync("barrier"));
        Ok(())
    }

    fn duplicate(&self, _comm: &Comm) -> Result<Comm> {
        let local = self.or_abort(self.local.duplicate());
        Ok(tiered(local, self.link.dup()))
    }

    fn abort(&self, why: &str) -> ! {
        self.local.hub.abort.raise(why.to_string());
        self.link.abort(why)
    }
}
