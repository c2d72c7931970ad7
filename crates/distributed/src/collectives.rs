//! Collectives on tensors (all_reduce, broadcast, reduce, scatter, gather, all_gather, reduce_scatter, barrier) through host staging.
//!
//! When every rank is an OpenCL device, all_reduce goes through the device relay (relay.rs: pinned
//! slots that every device copies to and from, sums on host threads). Otherwise every
//! rank's data is staged in host memory (pinned buffers for OpenCL devices), which all ranks of
//! the process share. A reduction is the ring's two phases without the hops: rank r reduces
//! segment r of every rank's staged copy in rank order (reduce-scatter), then copies the other
//! ranks' reduced segments (all-gather); so every rank holds bit-identical results, computed by
//! N threads at once. all_reduce streams 4 MiB chunks through two pinned buffers per rank: the
//! device->host copy of chunk c+1 and the host->device copy of chunk c-1 run while chunk c is
//! reduced.
use crate::group::Comm;
use crate::hub::Slot;
use crate::reduce::{reduce_range, split_range, ReduceOp};
use crate::relay::{within, Chunk, Relay, Session};
use crate::staging::{check_f32, compute_done, read, write, write_tensor, Queue};
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::{ClResultExt, Error, Result};
use netcl_core_memory::PinnedBuffer;
use netcl_ops::Tensor;
use std::ops::Range;

/// Elements per pipelined chunk of all_reduce (4 MiB of f32).
pub const CHUNK_ELEMS: usize = 1 << 20;

impl Comm {
    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.barrier();
        }
        self.sync("barrier")
    }

    /// Every rank's `len` and `shape`, checking that all lengths are equal (the same decision on
    /// every rank, so all return the same error).
    fn agree(&self, op: &str, t: &Tensor) -> Result<Vec<Slot>> {
        check_f32(op, t)?;
        let slots = self.exchange(
            op,
            Slot {
                len: t.numel(),
                shape: t.shape().to_vec(),
                ..Default::default()
            },
        )?;
        if let Some(other) = slots.iter().find(|s| s.shape != slots[0].shape) {
            return Err(Error::shape(
                op,
                format!(
                    "ranks hold different shapes ({:?} on rank 0, {:?} on another); rank {} has {:?}",
                    slots[0].shape, other.shape, self.rank, t.shape()
                ),
            ));
        }
        Ok(slots)
    }

    /// One chunk of a reduction: every rank's `ptr` holds `len` f32; afterwards every rank's
    /// holds the reduction. `after_exchange` runs once every rank has published its chunk.
    /// SAFETY: `ptr` must hold `len` live f32 that only this call touches until the next
    /// exchange on this communicator has completed.
    pub(crate) unsafe fn reduce_chunk(
        &self,
        op_name: &str,
        ptr: *mut f32,
        len: usize,
        op: ReduceOp,
        scale: f32,
        after_exchange: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let slots = self.exchange(
            op_name,
            Slot {
                ptr: ptr as usize,
                len,
                scale,
                shape: Vec::new(),
            },
        )?;
        after_exchange()?;
        let mine = split_range(len, self.size, self.rank);
        let acc = reduce_range(&slots, op, mine.start, mine.len());
        std::ptr::copy_nonoverlapping(acc.as_ptr(), ptr.add(mine.start), acc.len());
        self.sync(op_name)?;
        for (s, slot) in slots.iter().enumerate().filter(|(s, _)| *s != self.rank) {
            let seg = split_range(len, self.size, s);
            let src = (slot.ptr as *const f32).add(seg.start);
            std::ptr::copy_nonoverlapping(src, ptr.add(seg.start), seg.len());
        }
        Ok(())
    }

    /// Reduce host memory in place across ranks (each rank's `data` has the same length);
    /// `scale` is this rank's weight for [`ReduceOp::WeightedSum`].
    pub fn all_reduce_host(&self, data: &mut [f32], op: ReduceOp, scale: f32) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.all_reduce_host(data, op, scale);
        }
        let name = "all_reduce";
        let slots = self.exchange(
            name,
            Slot {
                len: data.len(),
                ..Default::default()
            },
        )?;
        if slots.iter().any(|s| s.len != data.len()) {
            let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
            return Err(Error::shape(
                name,
                format!("ranks hold different lengths {lens:?}"),
            ));
        }
        self.all_reduce_host_chunks(name, data, op, scale)?;
        self.sync(name)
    }

    /// Reduce `t` (contiguous f32, the same shape on every rank) in place across ranks: every
    /// rank ends with the same, bit-identical values.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_scaled(t, op, 1.0)
    }

    /// [`Comm::all_reduce`] with this rank's weight for [`ReduceOp::WeightedSum`].
    pub fn all_reduce_scaled(&self, t: &Tensor, op: ReduceOp, scale: f32) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.all_reduce(self, t, op, scale);
        }
        let name = "all_reduce";
        self.agree(name, t)?;
        if t.device().is_host() {
            let mut data = t.to_vec::<f32>()?;
            self.all_reduce_host_chunks(name, &mut data, op, scale)?;
            self.sync(name)?;
            return write_tensor(t, &data);
        }
        // A failure part-way leaves the other ranks inside a chunk's rendezvous: abort the group
        // so they return an error too instead of waiting.
        let done = if self.hub.relay {
            let session = Session::Reduce {
                op,
                scale,
                bf16: false,
            };
            self.relay(name, t, session, &[])
        } else {
            self.all_reduce_device(name, t, op, scale)
                .and_then(|()| self.sync(name))
        };
        self.or_abort(done)?;
        t.mark_modified();
        Ok(())
    }

    /// Every rank an OpenCL device: `t` through a device relay session (relay.rs), in chunks,
    /// after the kernels enqueued so far on the compute queue; each chunk's parts are `runs`
    /// (elements of `t`) within it, none where `runs` is empty.
    fn relay(
        &self,
        name: &'static str,
        t: &Tensor,
        session: Session,
        runs: &[Range<usize>],
    ) -> Result<()> {
        let n = t.numel();
        if n == 0 {
            return Ok(());
        }
        let mut relay = Relay::begin(self, name, session, n)?;
        let (mem, base, step) = (t.mem()?, t.offset() * 4, relay.chunk());
        let mut ready = Some(compute_done(&self.device)?);
        for s in (0..n).step_by(step) {
            let len = step.min(n - s);
            relay.push(Chunk {
                mem,
                offset: base + s * 4,
                len,
                after: ready.take(),
                tag: 0,
                parts: runs.iter().map(|r| within(r, s, len)).collect(),
            })?;
        }
        relay.finish().map(drop)
    }

    /// Gather in place: `runs[s]` is the range of `t`'s elements rank `s` holds (ranges that do
    /// not overlap, the same on every rank); afterwards every rank's `t` holds every rank's run
    /// (elements in no run are unspecified). Between OpenCL ranks a relay gather (each rank
    /// copies its run down and the others' up, nothing is folded); elsewhere an all-reduce of
    /// `t` with zeros outside this rank's run (exact: one rank holds each value).
    pub fn all_gather_runs(&self, t: &Tensor, runs: &[Range<usize>]) -> Result<()> {
        let name = "all_gather_runs";
        check_f32(name, t)?;
        let n = t.numel();
        let mut sorted: Vec<&Range<usize>> = runs.iter().filter(|r| !r.is_empty()).collect();
        sorted.sort_by_key(|r| r.start);
        let overlap = sorted.windows(2).any(|w| w[0].end > w[1].start);
        if runs.len() != self.size || overlap || runs.iter().any(|r| r.start > r.end || r.end > n) {
            return Err(Error::invalid(
                name,
                format!(
                    "runs {runs:?} must be one range per rank ({}), within the {n} elements and apart",
                    self.size
                ),
            ));
        }
        #[cfg(feature = "mpi")]
        let mpi = self.mpi.is_some();
        #[cfg(not(feature = "mpi"))]
        let mpi = false;
        if !self.hub.relay || mpi || !t.is_contiguous() {
            let (own, flat) = (&runs[self.rank], t.reshape(&[n])?);
            for (from, len) in [(0, own.start), (own.end, n - own.end)] {
                if len > 0 {
                    flat.narrow(0, from, len)?.fill_(0.0)?;
                }
            }
            return self.all_reduce(t, ReduceOp::Sum);
        }
        self.agree(name, t)?;
        self.or_abort(self.relay(name, t, Session::Gather, runs))?;
        t.mark_modified();
        Ok(())
    }

    fn all_reduce_host_chunks(
        &self,
        name: &str,
        data: &mut [f32],
        op: ReduceOp,
        scale: f32,
    ) -> Result<()> {
        for start in (0..data.len()).step_by(CHUNK_ELEMS) {
            let len = CHUNK_ELEMS.min(data.len() - start);
            // SAFETY: the chunk is part of `data`, borrowed mutably for the whole call.
            unsafe {
                self.reduce_chunk(
                    name,
                    data.as_mut_ptr().add(start),
                    len,
                    op,
                    scale,
                    || Ok(()),
                )?
            };
        }
        Ok(())
    }

    /// The pipelined device path: chunk c+1 is read while chunk c is reduced; chunk c is written
    /// back while chunk c+1 is reduced. Everything runs on the compute queue, in order after the
    /// kernels that produced `t` and before those enqueued after this call.
    fn all_reduce_device(&self, name: &str, t: &Tensor, op: ReduceOp, scale: f32) -> Result<()> {
        let n = t.numel();
        let chunks: Vec<(usize, usize)> = (0..n)
            .step_by(CHUNK_ELEMS)
            .map(|s| (s, CHUNK_ELEMS.min(n - s)))
            .collect();
        if chunks.is_empty() {
            return Ok(());
        }
        let dev = &self.device;
        let (mem, base) = (t.mem()?, t.offset() * 4);
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        while staging.len() < 2 {
            staging.push(PinnedBuffer::new(dev, CHUNK_ELEMS * 4)?);
        }
        let ptrs: [*mut f32; 2] = [
            staging[0].as_mut_slice().as_mut_ptr().cast(),
            staging[1].as_mut_slice().as_mut_ptr().cast(),
        ];
        // Events of copies in flight; dropping them (also on an error return) waits for them.
        let mut reads: [Option<Event>; 2] = [None, None];
        let mut writes: Vec<Event> = Vec::new();
        let start_read = |c: usize| -> Result<Event> {
            let (s, len) = chunks[c];
            // SAFETY: the pinned buffer lives in `staging`, locked for the whole call; nothing
            // else touches slot c % 2 until this read has been waited for.
            unsafe {
                read(
                    dev,
                    Queue::Compute,
                    mem,
                    base + s * 4,
                    ptrs[c % 2].cast(),
                    len * 4,
                    &[],
                )
            }
        };
        reads[0] = Some(start_read(0)?);
        for (c, &(s, len)) in chunks.iter().enumerate() {
            let slot = c % 2;
            if let Some(ev) = reads[slot].take() {
                ev.wait().cl("clWaitForEvents")?;
            }
            let next = |reads: &mut [Option<Event>; 2]| -> Result<()> {
                // Every rank has finished chunk c-1 (it is past this exchange), so slot
                // (c+1) % 2 may be refilled; the in-order queue runs the read after the write of
                // chunk c-1 out of the same slot.
                if c + 1 < chunks.len() {
                    reads[(c + 1) % 2] = Some(start_read(c + 1)?);
                }
                Ok(())
            };
            // SAFETY: slot `slot` holds chunk c, which only this call touches.
            unsafe {
                self.reduce_chunk(name, ptrs[slot], len, op, scale, || next(&mut reads))?;
                writes.push(write(
                    dev,
                    Queue::Compute,
                    mem,
                    base + s * 4,
                    ptrs[slot].cast(),
                    len * 4,
                    &[],
                )?);
            }
        }
        for ev in writes {
            ev.wait().cl("clWaitForEvents")?;
        }
        Ok(())
    }

    /// Copy root's `t` into every other rank's `t` (same shape on every rank).
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return self
                .check_root("broadcast", root)
                .and_then(|_| m.broadcast(self, t, root));
        }
        let name = "broadcast";
        self.check_root(name, root)?;
        self.agree(name, t)?;
        let mut data = if self.rank == root {
            t.to_vec::<f32>()?
        } else {
            vec![0f32; t.numel()]
        };
        let slots = self.exchange(
            name,
            Slot {
                ptr: data.as_mut_ptr() as usize,
                len: data.len(),
                ..Default::default()
            },
        )?;
        if self.rank != root {
            // SAFETY: root's vector lives until the closing barrier below.
            let src =
                unsafe { std::slice::from_raw_parts(slots[root].ptr as *const f32, data.len()) };
            data.copy_from_slice(src);
        }
        self.sync(name)?;
        if self.rank != root {
            write_tensor(t, &data)?;
        }
        Ok(())
    }

    /// Reduce every rank's `t` into root's `t` (the others' are left unchanged).
    pub fn reduce(&self, t: &Tensor, root: usize, op: ReduceOp) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return self
                .check_root("reduce", root)
                .and_then(|_| m.reduce(self, t, root, op));
        }
        let name = "reduce";
        self.check_root(name, root)?;
        self.agree(name, t)?;
        let mut data = t.to_vec::<f32>()?;
        self.all_reduce_host_chunks(name, &mut data, op, 1.0)?;
        self.sync(name)?;
        if self.rank == root {
            write_tensor(t, &data)?;
        }
        Ok(())
    }

    /// Every rank's `t` concatenated along dim 0 in rank order (a 0-d tensor counts as `[1]`); the
    /// ranks may hold different numbers of rows but the same trailing dims.
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.gather_impl("all_gather", t, None)?.ok_or_else(|| {
            Error::device("all_gather", format!("rank {} received no rows", self.rank))
        })
    }

    /// Like [`Comm::all_gather`], but only `root` gets the result (`None` elsewhere).
    pub fn gather(&self, t: &Tensor, root: usize) -> Result<Option<Tensor>> {
        self.check_root("gather", root)?;
        self.gather_impl("gather", t, Some(root))
    }

    fn gather_impl(&self, name: &str, t: &Tensor, root: Option<usize>) -> Result<Option<Tensor>> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.gather(self, t, root);
        }
        check_f32(name, t)?;
        let data = t.to_vec::<f32>()?;
        let shape = if t.shape().is_empty() {
            vec![1]
        } else {
            t.shape().to_vec()
        };
        let slots = self.exchange(name, Slot::of(&data, shape.clone()))?;
        if let Some(s) = slots.iter().find(|s| s.shape[1..] != shape[1..]) {
            let e = Error::shape(
                name,
                format!(
                    "ranks hold rows of different shapes: {:?} here, {:?} on another rank",
                    shape, s.shape
                ),
            );
            self.sync(name)?;
            return Err(e);
        }
        let out = if root.is_none_or(|r| r == self.rank) {
            let mut all = Vec::with_capacity(slots.iter().map(|s| s.len).sum());
            for s in &slots {
                // SAFETY: each rank's vector lives until the closing barrier below.
                all.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.ptr as *const f32, s.len)
                });
            }
            let mut out_shape = shape.clone();
            out_shape[0] = slots.iter().map(|s| s.shape[0]).sum();
            Some((all, out_shape))
        } else {
            None
        };
        self.sync(name)?;
        out.map(|(all, shape)| Tensor::from_vec(all, &shape, &self.device))
            .transpose()
    }

    /// Root's `src` (`[rows, ...]`) split along dim 0 into `size` balanced parts (the first
    /// `rows % size` ranks get one row more); rank r receives part r. Other ranks pass `None`.
    pub fn scatter(&self, src: Option<&Tensor>, root: usize) -> Result<Tensor> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return self
                .check_root("scatter", root)
                .and_then(|_| m.scatter(self, src, root));
        }
        let name = "scatter";
        self.check_root(name, root)?;
        let (data, shape) = match (self.rank == root, src) {
            (true, Some(t)) if !t.shape().is_empty() => {
                check_f32(name, t)?;
                (t.to_vec::<f32>()?, t.shape().to_vec())
            }
            _ => (Vec::new(), Vec::new()),
        };
        let slots = self.exchange(name, Slot::of(&data, shape.clone()))?;
        let root_shape = slots[root].shape.clone();
        if root_shape.is_empty() {
            self.sync(name)?;
            return Err(Error::invalid(
                name,
                format!("root {root} must pass a tensor of at least one dimension"),
            ));
        }
        let row: usize = root_shape[1..].iter().product();
        let rows = split_range(root_shape[0], self.size, self.rank);
        // SAFETY: root's vector lives until the barrier below.
        let part = unsafe {
            std::slice::from_raw_parts(
                (slots[root].ptr as *const f32).add(rows.start * row),
                rows.len() * row,
            )
        }
        .to_vec();
        self.sync(name)?;
        let mut out_shape = root_shape;
        out_shape[0] = rows.len();
        Tensor::from_vec(part, &out_shape, &self.device)
    }

    /// The reduction over ranks of `t` (`[rows, ...]`, the same shape on every rank), split along
    /// dim 0 like [`Comm::scatter`]: rank r receives the reduced part r.
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.reduce_scatter(self, t, op);
        }
        let name = "reduce_scatter";
        if t.shape().is_empty() {
            return Err(Error::invalid(
                name,
                "the tensor needs at least one dimension",
            ));
        }
        self.agree(name, t)?;
        let data = t.to_vec::<f32>()?;
        let slots = self.exchange(
            name,
            Slot {
                ptr: data.as_ptr() as usize,
                len: data.len(),
                scale: 1.0,
                shape: Vec::new(),
            },
        )?;
        let row: usize = t.shape()[1..].iter().product();
        let rows = split_range(t.shape()[0], self.size, self.rank);
        // SAFETY: every rank's vector lives until the barrier below.
        let part = unsafe { reduce_range(&slots, op, rows.start * row, rows.len() * row) };
        self.sync(name)?;
        let mut shape = t.shape().to_vec();
        shape[0] = rows.len();
        Tensor::from_vec(part, &shape, &self.device)
    }

    fn check_root(&self, op: &str, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::invalid(
                op,
                format!("root {root} is not a rank of this group of {}", self.size),
            ));
        }
        Ok(())
    }
}
