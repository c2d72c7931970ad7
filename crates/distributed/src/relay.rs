//! The device relay: all_reduce between the OpenCL ranks of one process through pinned host memory that every rank's device copies to and from directly, the copies on the devices' copy engines and the reduction on host threads.
//!
//! A reduction is cut into chunks of at most `chunk` f32 (data-parallel training feeds gradient
//! buckets as backward produces them). Chunk `i` splits into one segment per rank
//! (`split_range`); rank `s` reduces segment `s`. Each chunk goes through four stages on every
//! rank, several chunks in flight (one pinned slot each):
//!
//! 1. down: rank r copies its chunk into its pinned slot (copy queue);
//! 2. reduce: once every rank's chunk is in its slot, rank r folds segment r of every slot in
//!    rank order (`fold`: the host reduction's bits, on a small pool of host threads) into its
//!    own slot;
//! 3. gather: once every rank has reduced, rank r copies each rank's reduced segment out of that
//!    rank's slot into its tensor (relay queue);
//! 4. freed: once those copies are complete, rank r no longer reads anybody's slot of that chunk;
//!    when every rank is past it, the slot takes a later chunk.
//!
//! Ranks publish how many chunks passed each stage as counters on their hub (no barrier per
//! chunk). Device-to-host copies run on the copy queue and host-to-device copies on the relay
//! queue, so both directions of the bus are busy at once, and no kernel is involved: on NVIDIA a
//! kernel on another queue waits for the compute queue's running kernel to finish (measured in
//! benches/all_reduce.rs), while copies run beside it, so data-parallel training's reductions
//! overlap backward. NVIDIA's OpenCL copies at full speed from memory pinned by another device's
//! context (measured there too).
use crate::group::Comm;
use crate::hub::{Slot, Stage};
use crate::reduce::{fold_parallel, fold_pool, split_range, ReduceOp};
use crate::staging::{read, write, Queue};
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::opencl3::types::cl_mem;
use netcl_core_devices::{ClResultExt, Error, Result};
use netcl_core_memory::PinnedBuffer;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Chunks in flight (pinned slots per rank): enough to keep both bus directions busy while
/// chunks wait for folds (fewer lost bandwidth; `cargo bench --bench all_reduce`).
const SLOTS: usize = 8;
/// Elements per chunk: [`Config::relay_chunk`](netcl_core_devices::Config::relay_chunk)
/// (`NETCL_RELAY_CHUNK`, bytes, e.g. `8M`; 4 KiB to 256 MiB; default 4 MiB, the size the
/// measurements of docs/performance.md use), read once per process; a value that is not a
/// byte count is an error.
pub(crate) fn chunk_elems() -> Result<usize> {
    static CHUNK: std::sync::OnceLock<netcl_core_devices::Setting<usize>> =
        std::sync::OnceLock::new();
    let bytes = CHUNK.get_or_init(|| netcl_core_devices::Config::get().relay_chunk.clone());
    Ok(bytes.get()? / 4)
}

/// One rank's pinned slots. Its hub keeps them between sessions, and every session of every
/// rank holds them until its own folds and copies are done, so they outlive their last reader
/// also when a rank leaves part-way.
pub(crate) struct RelayBuffers {
    _pinned: PinnedBuffer,
    /// Host address of the first slot.
    addr: usize,
    chunk: usize,
}

impl RelayBuffers {
    fn new(dev: &netcl_core_devices::Device, chunk: usize) -> Result<RelayBuffers> {
        let mut pinned = PinnedBuffer::new(dev, SLOTS * chunk * 4)?;
        Ok(RelayBuffers {
            addr: pinned.as_mut_slice().as_mut_ptr() as usize,
            _pinned: pinned,
            chunk,
        })
    }
}

/// A range of a device buffer to reduce (or gather) in place: `len` elements (f32, or bf16 in a
/// bf16 session) at byte `offset` of `mem`, readable once `after` (if any) has completed and
/// once the chunks before it are. `tag` names it in the copy records. In a gather session
/// `parts[s]` is the range of the chunk's elements rank `s` holds (the same on every rank). A
/// reduction may give one range per rank too: this rank then takes back only its own range
/// of the reduced chunk (a reduce-scatter); empty takes back the whole chunk.
pub(crate) struct Chunk {
    pub mem: cl_mem,
    pub offset: usize,
    pub len: usize,
    pub after: Option<Event>,
    pub tag: usize,
    pub parts: Vec<Range<usize>>,
}

/// Device times (raw device clock, ns) of one chunk: when its data was ready (the end of its
/// `after` event; 0 without one), its down copy and its gather; and the relay's host times.
pub(crate) struct ChunkTimes {
    pub tag: usize,
    pub bytes: usize,
    pub ready: u64,
    pub host: [u64; HOST_STEPS],
    pub down: (u64, u64),
    pub gather: (u64, u64),
}

struct InFlight {
    chunk: Chunk,
    down: Option<Event>,
    gather: Vec<Event>,
    /// Host times of its steps (`HOST_STEPS`), set by the relay thread and the fold; the fold's
    /// end (`FOLDED`, stored with Release) is also the signal that this rank's segment is in
    /// its slot.
    host: Arc<[AtomicU64; HOST_STEPS]>,
}

impl InFlight {
    /// Whether this rank's segment of the chunk is folded into its slot.
    fn folded(&self) -> bool {
        self.host[FOLDED].load(Ordering::Acquire) != 0
    }
}

/// The host times a chunk records (ns since its session began, 0 if not reached), in this
/// order: its down copy issued, seen complete, its fold started, ended, its gather issued, seen
/// complete.
pub(crate) const HOST_STEPS: usize = 6;
const DOWN_ISSUED: usize = 0;
const DOWN_SEEN: usize = 1;
const FOLD_STARTED: usize = 2;
const FOLDED: usize = 3;
const GATHER_ISSUED: usize = 4;
const GATHER_SEEN: usize = 5;

/// Ns since `t0`, never 0 (0 marks a step not reached).
fn since(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64 + 1
}

/// The part of `r` (elements of a relayed buffer) in the chunk of `len` elements from `at`, as
/// elements of the chunk (empty where they do not meet).
pub(crate) fn within(r: &Range<usize>, at: usize, len: usize) -> Range<usize> {
    let (a, b) = (r.start.clamp(at, at + len), r.end.clamp(at, at + len));
    a - at..b - at
}

/// What a relay session does with its chunks.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Session {
    /// Reduce them in place on every rank.
    Reduce {
        op: ReduceOp,
        scale: f32,
        bf16: bool,
    },
    /// Give every rank each rank's part of them.
    Gather,
}

/// One reduction session of a rank: begun together by every rank, fed the same chunks in the
/// same order, finished together.
pub(crate) struct Relay<'c> {
    comm: &'c Comm,
    /// Every rank's pinned slots (this rank's among them).
    peers: Vec<Arc<RelayBuffers>>,
    /// Elements per chunk (a slot's bytes over the element size: bf16 chunks hold twice the
    /// elements, so a session has half the chunks).
    chunk: usize,
    /// Bytes per slot.
    slot_bytes: usize,
    /// Each rank's weight ([`ReduceOp::WeightedSum`]).
    scales: Vec<f32>,
    op: ReduceOp,
    /// Whether elements travel as bf16 (else f32): bytes per element 2 or 4.
    bf16: bool,
    /// A gather session: each rank sends its part of a chunk and takes the others' parts from
    /// their slots, nothing is folded.
    gather: bool,
    /// Chunks relayed on this hub before this session.
    base: u64,
    chunks: Vec<InFlight>,
    /// How many chunks have been issued to (or passed) each step.
    down_issued: usize,
    down_done: usize,
    folds_started: usize,
    reduced: usize,
    gather_issued: usize,
    freed: usize,
    name: &'static str,
    /// When the session began (the chunks' host times count from it).
    t0: Instant,
}

/// Whether every event has completed; an error for a failed command.
fn complete(events: &[Event], op: &str) -> Result<bool> {
    for e in events {
        let status = e
            .command_execution_status()
            .cl("clGetEventInfo(EXECUTION_STATUS)")?
            .0;
        if status < 0 {
            return Err(Error::device(
                op,
                format!(
                    "a relay copy failed on the device: {}",
                    netcl_core_devices::cl_code_name(status)
                ),
            ));
        }
        if status != 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

fn span(events: &[Event]) -> (u64, u64) {
    let start = events
        .iter()
        .filter_map(|e| e.profiling_command_start().ok())
        .min();
    let end = events
        .iter()
        .filter_map(|e| e.profiling_command_end().ok())
        .max();
    (start.unwrap_or(0), end.unwrap_or(0))
}

impl<'c> Relay<'c> {
    /// Start a session: every rank calls it with the same `session`, about to relay `total`
    /// elements (an exchange of the lengths, the chunk size and the weights). A reduction's
    /// `scale` is this rank's weight for [`ReduceOp::WeightedSum`]; with `bf16`, the chunks'
    /// elements are bf16 (the tensors hold bf16; the fold sums in f32 and rounds once). A
    /// gather moves f32: each chunk's `parts` say which rank holds which of its elements, a rank
    /// copies its own part down and the others' up (n - 1 parts), nothing is folded: a quarter
    /// of an all-reduce's copies on four ranks.
    pub(crate) fn begin(
        comm: &'c Comm,
        name: &'static str,
        session: Session,
        total: usize,
    ) -> Result<Relay<'c>> {
        let (op, scale, bf16, gather) = match session {
            Session::Reduce { op, scale, bf16 } => (op, scale, bf16, false),
            Session::Gather => (ReduceOp::Sum, 1.0, false, true),
        };
        let chunk = chunk_elems()?;
        let mine = {
            let mut held = comm.hub.relay_buffers();
            match &held[comm.rank] {
                Some(b) if b.chunk == chunk => b.clone(),
                _ => {
                    let b = Arc::new(RelayBuffers::new(&comm.device, chunk)?);
                    held[comm.rank] = Some(b.clone());
                    b
                }
            }
        };
        let slots = comm.exchange(
            name,
            Slot {
                ptr: mine.addr,
                len: total,
                scale,
                shape: vec![chunk, usize::from(bf16), usize::from(gather)],
            },
        )?;
        if slots.iter().any(|s| s.len != total) {
            let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
            return Err(Error::shape(
                name,
                format!("ranks hold different lengths {lens:?}"),
            ));
        }
        if slots
            .iter()
            .any(|s| s.shape != [chunk, usize::from(bf16), usize::from(gather)])
        {
            return Err(Error::invalid(
                name,
                format!(
                    "ranks relay chunks of different sizes, element types or kinds {:?} (bytes, bf16, gather; NETCL_RELAY_CHUNK and the communication dtype must be the same on every rank)",
                    slots.iter().map(|s| (s.shape[0] * 4, s.shape[1] == 1, s.shape[2] == 1)).collect::<Vec<_>>()
                ),
            ));
        }
        // Every rank stored its slots in the hub before the exchange.
        let peers = (comm.hub.relay_buffers().iter().zip(&slots))
            .map(|(b, s)| {
                b.clone().filter(|b| b.addr == s.ptr).ok_or_else(|| {
                    Error::invalid(name, "a rank's relay slots changed during the exchange")
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Relay {
            comm,
            peers,
            chunk: if bf16 { chunk * 2 } else { chunk },
            slot_bytes: chunk * 4,
            scales: slots.iter().map(|s| s.scale).collect(),
            op,
            bf16,
            gather,
            base: comm.hub.own(comm.rank, Stage::Freed),
            chunks: Vec::new(),
            down_issued: 0,
            down_done: 0,
            folds_started: 0,
            reduced: 0,
            gather_issued: 0,
            freed: 0,
            name,
            t0: Instant::now(),
        })
    }

    /// Elements per chunk: [`Relay::push`] takes at most this many.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// Queue a chunk (every rank pushes the same lengths in the same order). Its copies start
    /// in [`Relay::pump`].
    pub(crate) fn push(&mut self, chunk: Chunk) -> Result<()> {
        if chunk.len > self.chunk() {
            return Err(Error::invalid(
                self.name,
                format!("relay chunk of {} > {} elements", chunk.len, self.chunk()),
            ));
        }
        let parts_fit = chunk.parts.len() == self.comm.size
            && chunk
                .parts
                .iter()
                .all(|p| p.start <= p.end && p.end <= chunk.len);
        if !(parts_fit || !self.gather && chunk.parts.is_empty()) {
            return Err(Error::invalid(
                self.name,
                format!(
                    "a chunk of {} elements with parts {:?} in a {} session of {} ranks",
                    chunk.len,
                    chunk.parts,
                    if self.gather { "gather" } else { "reduction" },
                    self.comm.size
                ),
            ));
        }
        self.chunks.push(InFlight {
            chunk,
            down: None,
            gather: Vec::new(),
            host: Arc::new(Default::default()),
        });
        Ok(())
    }

    /// Bytes per element.
    fn esize(&self) -> usize {
        if self.bf16 {
            2
        } else {
            4
        }
    }

    /// Host address of rank `rank`'s slot for chunk `i`.
    fn slot(&self, rank: usize, i: usize) -> usize {
        let k = ((self.base + i as u64) % SLOTS as u64) as usize;
        self.peers[rank].addr + k * self.slot_bytes
    }

    /// Notes host step `step` of chunk `i` now.
    fn stamp(&self, i: usize, step: usize) {
        self.chunks[i].host[step].store(since(self.t0), Ordering::Relaxed);
    }

    fn issue_down(&mut self, i: usize) -> Result<()> {
        let (c, e) = (&self.chunks[i].chunk, self.esize());
        let part = match self.gather {
            true => c.parts[self.comm.rank].clone(),
            false => 0..c.len,
        };
        if part.is_empty() {
            return Ok(());
        }
        // SAFETY: the slot is this rank's and free (every rank is past its previous chunk); the
        // session holds it (`peers`) and waits for the copy before letting go.
        let ev = unsafe {
            read(
                &self.comm.device,
                Queue::Copy,
                c.mem,
                c.offset + part.start * e,
                (self.slot(self.comm.rank, i) + part.start * e) as *mut u8,
                part.len() * e,
                &[],
            )?
        };
        self.chunks[i].down = Some(ev);
        self.stamp(i, DOWN_ISSUED);
        Ok(())
    }

    /// Start folding segment r of every rank's slot of chunk `i` into this rank's slot, on the
    /// fold pool: this thread goes on issuing copies meanwhile. The fold notes its end (the
    /// chunk is then `folded`) and wakes the hub's waiters.
    fn start_fold(&self, i: usize) {
        if self.gather {
            self.stamp(i, FOLD_STARTED);
            self.chunks[i].host[FOLDED].store(since(self.t0), Ordering::Release);
            return;
        }
        let (n, r) = (self.comm.size, self.comm.rank);
        let own = split_range(self.chunks[i].chunk.len, n, r);
        let e = self.esize();
        let srcs: Vec<usize> = (0..n).map(|s| self.slot(s, i) + own.start * e).collect();
        let (scales, op, hub, bf16) = (
            self.scales.clone(),
            self.op,
            self.comm.hub.clone(),
            self.bf16,
        );
        let (host, t0) = (self.chunks[i].host.clone(), self.t0);
        let fold = move || {
            host[FOLD_STARTED].store(since(t0), Ordering::Relaxed);
            // SAFETY: every slot holds chunk i (every rank passed Down) and stays unchanged
            // until every rank passes Freed, which needs this fold; segment r of this rank's
            // slot is read by nobody else before this rank passes Reduced, after the fold. The
            // slots outlive the fold: the session's drop waits for it.
            unsafe {
                if bf16 {
                    let ptrs: Vec<*const half::bf16> = srcs.iter().map(|&a| a as _).collect();
                    fold_parallel(&ptrs, &scales, op, ptrs[r] as *mut _, own.len())
                } else {
                    let ptrs: Vec<*const f32> = srcs.iter().map(|&a| a as _).collect();
                    fold_parallel(&ptrs, &scales, op, ptrs[r] as *mut _, own.len())
                }
            };
            host[FOLDED].store(since(t0), Ordering::Release);
            hub.poke();
        };
        match fold_pool() {
            Some(pool) => pool.spawn(fold),
            None => fold(),
        }
    }

    fn issue_gather(&mut self, i: usize) -> Result<()> {
        let (n, e) = (self.comm.size, self.esize());
        let c = &self.chunks[i].chunk;
        let mut events = Vec::new();
        for s in 0..n {
            let seg = match (self.gather, c.parts.get(self.comm.rank)) {
                (true, _) if s == self.comm.rank => continue,
                (true, _) => c.parts[s].clone(),
                (false, None) => split_range(c.len, n, s),
                (false, Some(keep)) => {
                    let seg = split_range(c.len, n, s);
                    seg.start.max(keep.start)..seg.end.min(keep.end)
                }
            };
            if seg.is_empty() {
                continue;
            }
            // SAFETY: rank s's slot holds its reduced segment, or its part of a gather (every
            // rank passed Reduced) until this rank passes Freed.
            events.push(unsafe {
                write(
                    &self.comm.device,
                    Queue::Relay,
                    c.mem,
                    c.offset + seg.start * e,
                    (self.slot(s, i) + seg.start * e) as *const u8,
                    seg.len() * e,
                    &[],
                )?
            });
        }
        self.chunks[i].gather = events;
        self.stamp(i, GATHER_ISSUED);
        Ok(())
    }

    /// Issue whatever the ranks' progress allows and publish this rank's; whether anything
    /// moved.
    pub(crate) fn pump(&mut self) -> Result<bool> {
        let (hub, r, base) = (self.comm.hub.clone(), self.comm.rank, self.base);
        let cl = self.comm.device.cl(self.name)?;
        let mut moved = false;
        while self.freed < self.gather_issued
            && complete(&self.chunks[self.freed].gather, self.name)?
        {
            self.stamp(self.freed, GATHER_SEEN);
            self.freed += 1;
            hub.publish(r, Stage::Freed, base + self.freed as u64);
            moved = true;
        }
        let gathered = self.gather_issued;
        while self.gather_issued < self.reduced
            && hub.passed(Stage::Reduced) > base + self.gather_issued as u64
        {
            self.issue_gather(self.gather_issued)?;
            self.gather_issued += 1;
        }
        if self.gather_issued > gathered {
            cl.relay_queue.flush().cl("clFlush")?;
            moved = true;
        }
        // A chunk goes down once its data is ready (its `after` event has completed), so the
        // copy queue never holds a copy that waits for the compute queue.
        let downed = self.down_issued;
        while self.down_issued < self.chunks.len()
            && hub.passed(Stage::Freed) + SLOTS as u64 > base + self.down_issued as u64
            && complete(
                self.chunks[self.down_issued].chunk.after.as_slice(),
                self.name,
            )?
        {
            self.issue_down(self.down_issued)?;
            self.down_issued += 1;
        }
        if self.down_issued > downed {
            cl.copy_queue.flush().cl("clFlush")?;
            moved = true;
        }
        while self.down_done < self.down_issued
            && complete(self.chunks[self.down_done].down.as_slice(), self.name)?
        {
            self.stamp(self.down_done, DOWN_SEEN);
            self.down_done += 1;
            hub.publish(r, Stage::Down, base + self.down_done as u64);
            moved = true;
        }
        while self.folds_started < self.down_done
            && hub.passed(Stage::Down) > base + self.folds_started as u64
        {
            self.start_fold(self.folds_started);
            self.folds_started += 1;
            moved = true;
        }
        while self.reduced < self.folds_started && self.chunks[self.reduced].folded() {
            self.reduced += 1;
            hub.publish(r, Stage::Reduced, base + self.reduced as u64);
            moved = true;
        }
        Ok(moved)
    }

    /// Pump until `done` holds: spinning briefly, then sleeping until another rank publishes
    /// (or 100 us, for this rank's own copies). An error when the group is aborted or nothing
    /// moves for the group's timeout.
    fn pump_until(&mut self, done: impl Fn(&Self) -> bool) -> Result<()> {
        let hub = self.comm.hub.clone();
        let (mut idle, mut since) = (0u32, Instant::now());
        while !done(self) {
            if hub.abort.is_set() {
                return Err(hub.abort.error(self.name, self.comm.rank));
            }
            let version = hub.progress_version();
            if self.pump()? {
                (idle, since) = (0, Instant::now());
                continue;
            }
            if since.elapsed() > hub.timeout {
                let why = format!(
                    "{}: rank {} waited {:.1} s for the other ranks' copies ({} of {} chunks freed, {} down, {} reduced)",
                    self.name,
                    self.comm.rank,
                    since.elapsed().as_secs_f64(),
                    self.freed,
                    self.chunks.len(),
                    self.down_done,
                    self.reduced
                );
                hub.abort.raise(why.clone());
                return Err(Error::device(self.name, why));
            }
            idle += 1;
            if idle < 64 {
                std::thread::yield_now();
            } else {
                hub.wait_progress(version, Duration::from_micros(100));
            }
        }
        Ok(())
    }

    /// Whether chunks pushed are still on their way.
    pub(crate) fn busy(&self) -> bool {
        self.freed < self.chunks.len()
    }

    /// Pump until nothing moves (data-parallel training calls it between buckets, so copies go
    /// on while backward runs). Never waits for other ranks.
    pub(crate) fn poll(&mut self) -> Result<()> {
        let hub = &self.comm.hub;
        if hub.abort.is_set() {
            return Err(hub.abort.error(self.name, self.comm.rank));
        }
        while self.pump()? {}
        Ok(())
    }

    /// Relay every chunk pushed to the end, and wait until every rank is past them (so no rank
    /// reads this rank's slots any more). The tensors hold the reduction afterwards.
    pub(crate) fn finish(mut self) -> Result<Vec<ChunkTimes>> {
        let end = self.base + self.chunks.len() as u64;
        let (hub, e) = (self.comm.hub.clone(), self.esize());
        self.pump_until(|s| s.freed == s.chunks.len() && hub.passed(Stage::Freed) >= end)?;
        Ok(self
            .chunks
            .iter()
            .map(|c| ChunkTimes {
                tag: c.chunk.tag,
                bytes: c.chunk.len * e,
                ready: span(c.chunk.after.as_slice()).1,
                host: std::array::from_fn(|s| c.host[s].load(Ordering::Relaxed)),
                down: span(c.down.as_slice()),
                gather: span(&c.gather),
            })
            .collect())
    }
}

impl Drop for Relay<'_> {
    /// A session left part-way (an error): nothing of this rank's may still be copying into
    /// its slots or the tensors. (No command of a rank waits for another rank's.)
    fn drop(&mut self) {
        // Folds read and write the slots.
        for c in &self.chunks[..self.folds_started] {
            while !c.folded() {
                std::thread::yield_now();
            }
        }
        if self.freed < self.chunks.len() {
            if let Ok(cl) = self.comm.device.cl(self.name) {
                let _ = cl.copy_queue.finish();
                let _ = cl.relay_queue.finish();
            }
        }
    }
}
