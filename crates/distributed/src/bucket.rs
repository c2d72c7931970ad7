//! The communication thread of data-parallel training: reduces gradient buckets across ranks as backward hands them over (through the device relay where every rank is an OpenCL device, else through host staging on the copy queue).
use crate::group::Comm;
use crate::reduce::{round_to_bf16, ReduceOp};
use crate::relay::{within, Chunk, ChunkTimes, Relay, Session, HOST_STEPS};
use crate::staging::{queue, read, write, Queue};
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::{ClResultExt, Error, Result};
use netcl_core_memory::PinnedBuffer;
use netcl_ops::Tensor;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A range of the flat gradient buffer reduced as one unit.
pub(crate) struct Bucket {
    /// First element and number of elements in the flat buffer.
    pub start: usize,
    pub len: usize,
    /// How many parameters' gradients it holds.
    pub params: usize,
    /// Address of its pinned host staging (OpenCL ranks; 0 on the host).
    pub pinned: usize,
}

/// A bucket on its way off the device.
pub(crate) enum Job {
    /// The values, copied on the host device.
    Host(Vec<f32>),
    /// A marker on the compute queue after the kernels that produced the bucket.
    Device(Event),
}

/// Device timings of one bucket's copies in the last step: raw device clock (ns,
/// CL_PROFILING_COMMAND_START/END), the clock the device's kernel events use.
#[derive(Clone, Debug)]
pub struct CopyRecord {
    pub bucket: usize,
    pub bytes: usize,
    /// When backward had produced it (the end of the compute queue's marker after its kernels;
    /// 0 where the device does not time markers).
    pub ready: u64,
    /// Device to host (start, end).
    pub to_host: (u64, u64),
    /// Host to device (start, end).
    pub to_device: (u64, u64),
    /// The device relay's host times of its last chunk, ns since the step's relay session began
    /// (0: not through the relay): its copy down issued, seen complete, its fold started, ended,
    /// its gather issued, seen complete.
    pub host: [u64; HOST_STEPS],
}

enum Msg {
    Begin {
        step: u64,
        share: f32,
        buckets: usize,
        keep: Option<Range<usize>>,
    },
    Bucket {
        step: u64,
        index: usize,
        job: Job,
    },
    Cancel {
        step: u64,
    },
}

/// What a step's reduction left: write events (completed), host buckets' values, copy timings.
#[derive(Default)]
pub(crate) struct Done {
    pub writes: Vec<Event>,
    pub host: Vec<(usize, Vec<f32>)>,
    pub copies: Vec<CopyRecord>,
}

pub(crate) struct BucketWorker {
    tx: Option<Sender<Msg>>,
    rx: Receiver<Result<Done>>,
    handle: Option<JoinHandle<()>>,
    step: u64,
}

impl BucketWorker {
    /// `flat` holds the gradients; `wire` is what the device relay sends (`flat` itself, or a
    /// bf16 copy of it); `bf16` rounds the values sent on the other paths the same way.
    pub(crate) fn start(
        comm: Comm,
        flat: Tensor,
        wire: Tensor,
        bf16: bool,
        buckets: Arc<Vec<Bucket>>,
        pinned: Vec<PinnedBuffer>,
    ) -> Result<BucketWorker> {
        let (tx, jobs) = channel();
        let (done_tx, rx) = channel();
        let handle = std::thread::Builder::new()
            .name(format!("netcl-ddp-{}", comm.rank()))
            .spawn(move || {
                let worker = Worker {
                    comm,
                    flat,
                    wire,
                    bf16,
                    buckets,
                };
                worker.run(jobs, done_tx);
                // Nothing may still be copying into the pinned buffers when they are freed.
                if let Ok(q) = queue(worker.flat.device(), Queue::Copy) {
                    let _ = q.finish();
                }
                drop(pinned);
            })
            .map_err(|e| {
                Error::invalid(
                    "DataParallel",
                    format!("spawning the communication thread: {e}"),
                )
            })?;
        Ok(BucketWorker {
            tx: Some(tx),
            rx,
            handle: Some(handle),
            step: 0,
        })
    }

    fn post(&self, msg: Msg) -> Result<()> {
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(msg).ok())
            .ok_or_else(|| Error::invalid("DataParallel", "the communication thread has stopped"))
    }

    /// Start a step whose gradients weigh `share` in the mean; returns its number. With `keep`,
    /// the device relay copies back only that range of the flat buffer reduced (a
    /// reduce-scatter); the other paths reduce everything.
    pub(crate) fn begin(
        &mut self,
        share: f32,
        buckets: usize,
        keep: Option<Range<usize>>,
    ) -> Result<u64> {
        self.step += 1;
        self.post(Msg::Begin {
            step: self.step,
            share,
            buckets,
            keep,
        })?;
        Ok(self.step)
    }

    pub(crate) fn send(&self, step: u64, index: usize, job: Job) -> Result<()> {
        self.post(Msg::Bucket { step, index, job })
    }

    /// Abandon the step (backward failed part-way).
    pub(crate) fn cancel(&self, step: u64) {
        if self.post(Msg::Cancel { step }).is_ok() {
            let _ = self.rx.recv();
        }
    }

    /// Wait for every bucket of the step to be reduced and copied back.
    pub(crate) fn finish(&self) -> Result<Done> {
        self.rx
            .recv()
            .map_err(|_| Error::invalid("DataParallel", "the communication thread has stopped"))?
    }
}

impl Drop for BucketWorker {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Worker {
    comm: Comm,
    flat: Tensor,
    wire: Tensor,
    bf16: bool,
    buckets: Arc<Vec<Bucket>>,
}

impl Worker {
    fn run(&self, jobs: Receiver<Msg>, done: Sender<Result<Done>>) {
        while let Ok(msg) = jobs.recv() {
            let Msg::Begin {
                step,
                share,
                buckets,
                keep,
            } = msg
            else {
                continue;
            };
            let out = self
                .comm
                .or_abort(self.step(&jobs, step, share, buckets, keep));
            if done.send(out).is_err() {
                return;
            }
        }
    }

    /// One step: reduce its `buckets` in bucket order (the same on every rank) as backward
    /// hands them over. Where every rank is an OpenCL device, the buckets stream through one
    /// relay session (relay.rs), which copies while this thread waits for the next bucket.
    fn step(
        &self,
        jobs: &Receiver<Msg>,
        step: u64,
        share: f32,
        buckets: usize,
        keep: Option<Range<usize>>,
    ) -> Result<Done> {
        let stopped = || Error::invalid("DataParallel", "the step's sender has stopped");
        let mut relay = if self.comm.hub.relay && self.flat.device().is_opencl() {
            let session = Session::Reduce {
                op: ReduceOp::WeightedSum,
                scale: share,
                bf16: self.wire.dtype() == netcl_core_devices::DType::BF16,
            };
            let total = self.buckets.iter().map(|b| b.len).sum();
            Some(Relay::begin(&self.comm, "DataParallel", session, total)?)
        } else {
            None
        };
        let mut waiting: Vec<Option<Job>> = (0..buckets).map(|_| None).collect();
        let (mut next, mut done) = (0, Done::default());
        while next < buckets {
            let msg = match relay.as_mut() {
                Some(r) if r.busy() => match jobs.recv_timeout(Duration::from_micros(50)) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => {
                        r.poll()?;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return Err(stopped()),
                },
                _ => jobs.recv().map_err(|_| stopped())?,
            };
            match msg {
                Msg::Bucket {
                    step: s,
                    index,
                    job,
                } if s == step && index < buckets => waiting[index] = Some(job),
                Msg::Cancel { step: s } if s == step => {
                    return Err(Error::invalid("DataParallel", "step cancelled"))
                }
                _ => continue,
            }
            while let Some(job) = waiting.get_mut(next).and_then(Option::take) {
                match (relay.as_mut(), job) {
                    (Some(r), Job::Device(produced)) => self.push(r, next, produced, &keep)?,
                    (_, job) => self.reduce(next, job, share, &mut done)?,
                }
                next += 1;
            }
            if let Some(r) = relay.as_mut() {
                r.poll()?;
            }
        }
        match relay {
            Some(r) => done.copies = records(r.finish()?),
            None => self.timings(&mut done)?,
        }
        Ok(done)
    }

    /// Hand bucket `index` to the relay, in chunks; the first waits for `produced`. With
    /// `keep`, each chunk takes back only its part of that range of the flat buffer.
    fn push(
        &self,
        relay: &mut Relay<'_>,
        index: usize,
        produced: Event,
        keep: &Option<Range<usize>>,
    ) -> Result<()> {
        let b = &self.buckets[index];
        let e = self.wire.dtype().size();
        let (mem, at) = (self.wire.mem()?, (self.wire.offset() + b.start) * e);
        let mut after = Some(produced);
        for s in (0..b.len).step_by(relay.chunk()) {
            let len = relay.chunk().min(b.len - s);
            let parts = match keep {
                None => Vec::new(),
                Some(k) => {
                    let mut parts = vec![0..0; self.comm.size()];
                    parts[self.comm.rank()] = within(k, b.start + s, len);
                    parts
                }
            };
            relay.push(Chunk {
                mem,
                offset: at + s * e,
                len,
                after: after.take(),
                tag: index,
                parts,
            })?;
        }
        Ok(())
    }

    fn reduce(&self, index: usize, job: Job, share: f32, done: &mut Done) -> Result<()> {
        let b = &self.buckets[index];
        match job {
            Job::Host(mut data) => {
                self.all_reduce_host(&mut data, share)?;
                done.host.push((index, data));
            }
            Job::Device(produced) => {
                let dev = self.flat.device();
                let mem = self.flat.mem()?;
                let at = (self.flat.offset() + b.start) * 4;
                // The copy queue holds only this bucket's copies: a read queued there for a
                // later bucket (waiting for its kernels) would hold up this bucket's write back.
                // SAFETY: the pinned buffer is this bucket's and outlives the copies (the worker
                // finishes the copy queue before freeing it); nothing touches it meanwhile.
                let read = unsafe {
                    read(
                        dev,
                        Queue::Copy,
                        mem,
                        at,
                        b.pinned as *mut u8,
                        b.len * 4,
                        &[&produced],
                    )?
                };
                queue(dev, Queue::Copy)?.flush().cl("clFlush")?;
                read.wait().cl("clWaitForEvents")?;
                // SAFETY: the pinned buffer holds the bucket (the read completed) and nothing
                // else touches it until the write below has completed.
                let data = unsafe { std::slice::from_raw_parts_mut(b.pinned as *mut f32, b.len) };
                self.all_reduce_host(data, share)?;
                // SAFETY: as above; `timings` waits for the write before the step ends.
                let w = unsafe {
                    write(
                        dev,
                        Queue::Copy,
                        mem,
                        at,
                        b.pinned as *const u8,
                        b.len * 4,
                        &[],
                    )?
                };
                queue(dev, Queue::Copy)?.flush().cl("clFlush")?;
                done.copies.push(CopyRecord {
                    bucket: index,
                    bytes: b.len * 4,
                    ready: times(&produced).1,
                    to_host: times(&read),
                    to_device: (0, 0),
                    host: [0; HOST_STEPS],
                });
                done.writes.push(w);
            }
        }
        Ok(())
    }

    /// The weighted sum over ranks through host memory; with a bf16 wire, each rank's values
    /// and the result rounded to bf16 as the device relay's would be.
    fn all_reduce_host(&self, data: &mut [f32], share: f32) -> Result<()> {
        if self.bf16 {
            round_to_bf16(data);
        }
        self.comm
            .all_reduce_host(data, ReduceOp::WeightedSum, share)?;
        if self.bf16 {
            round_to_bf16(data);
        }
        Ok(())
    }

    /// Wait for the writes back and note their device times.
    fn timings(&self, done: &mut Done) -> Result<()> {
        for (w, rec) in done.writes.iter().zip(done.copies.iter_mut()) {
            w.wait().cl("clWaitForEvents")?;
            rec.to_device = times(w);
        }
        Ok(())
    }
}

/// One record per bucket from the relay's chunk times.
fn records(chunks: Vec<ChunkTimes>) -> Vec<CopyRecord> {
    let mut out: Vec<CopyRecord> = Vec::new();
    for c in chunks {
        match out.last_mut() {
            Some(r) if r.bucket == c.tag => {
                r.bytes += c.bytes;
                r.ready = r.ready.max(c.ready);
                r.host = std::array::from_fn(|s| r.host[s].max(c.host[s]));
                r.to_host = (r.to_host.0.min(c.down.0), r.to_host.1.max(c.down.1));
                r.to_device = (r.to_device.0.min(c.gather.0), r.to_device.1.max(c.gather.1));
            }
            _ => out.push(CopyRecord {
                bucket: c.tag,
                bytes: c.bytes,
                ready: c.ready,
                to_host: c.down,
                to_device: c.gather,
                host: c.host,
            }),
        }
    }
    out
}

fn times(ev: &Event) -> (u64, u64) {
    (
        ev.profiling_command_start().unwrap_or(0),
        ev.profiling_command_end().unwrap_or(0),
    )
}
