//! DataParallel: one model replica per rank, the batch split between ranks, gradients all-reduced in buckets on the copy queue while backward still runs.
use crate::bucket::{Bucket, BucketWorker, CopyRecord, Job};
use crate::group::Comm;
use crate::reduce::proportional_split;
use crate::staging::{compute_done, marker, write_tensor, Queue};
use netcl_autograd::{GradBuffers, Parameter, Tape, Var};
use netcl_core_devices::{ClResultExt, DType, Error, Result};
use netcl_core_memory::PinnedBuffer;
use netcl_nn::Module;
use netcl_ops::{fused_into, Expr, Tensor};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Settings of [`DataParallel`].
#[derive(Clone, Debug)]
pub struct DdpOptions {
    /// Gradient bytes per all-reduce bucket (default 4 MiB). A bucket is sent as soon as backward
    /// has produced all of its gradients.
    pub bucket_bytes: usize,
    /// Copy rank 0's parameters and buffers to every replica at the start (default true). With
    /// false, replicas must already be equal (built from the same seed).
    pub broadcast_parameters: bool,
    /// Shares of the batch per rank (any positive numbers; default equal). See also
    /// [`DataParallel::calibrate`].
    pub weights: Option<Vec<f64>>,
    /// The dtype gradients travel in between ranks: F32 (default) or BF16. With BF16 each
    /// rank's gradient is rounded to bf16, the ranks' values are summed in f32 (in rank order,
    /// as with F32) and the sum is rounded to bf16 once before it is widened back into the f32
    /// gradients: half the bytes over the bus (the device relay sends bf16; the host and MPI
    /// paths round the same way and send f32).
    pub comm_dtype: DType,
}

impl Default for DdpOptions {
    fn default() -> DdpOptions {
        DdpOptions {
            bucket_bytes: 4 << 20,
            broadcast_parameters: true,
            weights: None,
            comm_dtype: DType::F32,
        }
    }
}

/// Data-parallel training on one rank of a [`crate::Group`] (or an MPI communicator): this
/// rank's replica of the model, its share of each batch, and the gradient all-reduce.
///
/// Each step: take this rank's rows ([`DataParallel::shard`]), compute the loss (a mean over
/// those rows) and call [`DataParallel::backward`]. Gradients go into one flat buffer, in buckets
/// ordered as backward produces them (last layer first); each full bucket is copied to pinned
/// host memory on the device's copy queue (ordered after the kernels that wrote it by an event),
/// reduced across ranks on a communication thread and copied back, while the compute queue runs
/// the rest of backward. The reduction weights each rank's gradient by its share of the batch, so
/// every replica ends with the gradient of the whole batch's mean loss and the optimizer, run on
/// every rank, keeps the replicas identical.
///
/// A complete training loop is `examples/data_parallel.rs`, shown in docs/guide/data-parallel.md
/// (whose code runs as a doctest of the `netcl` crate).
pub struct DataParallel<'c> {
    comm: &'c Comm,
    grads: GradBuffers,
    flat: Tensor,
    /// The bf16 copy of `flat` the device relay sends when gradients travel in bf16.
    wire: Option<Tensor>,
    buckets: Arc<Vec<Bucket>>,
    bucket_of: HashMap<usize, usize>,
    /// Each trainable parameter and the first element of its gradient in `flat`.
    layout: Vec<(Parameter, usize)>,
    /// Parameters of each bucket (to zero the gradient of those backward did not reach).
    members: Vec<Vec<Parameter>>,
    worker: BucketWorker,
    weights: Vec<f64>,
    /// This rank's share of the last batch split (its weight in the gradient mean).
    share: f32,
    sync: bool,
    /// Seconds of forward + backward on this rank in the last steps (for calibrate).
    last_compute_s: f64,
    /// When this step's work began: its first `shard_range`, else the start of `backward`.
    step_start: Option<Instant>,
    copies: Vec<CopyRecord>,
    /// Set by [`DataParallel::shard_optimizer`]: this rank's run of `flat` (the only gradients
    /// its optimizer reads, so the relay reduce-scatters) and the parameters outside it (whose
    /// unreduced gradients backward drops).
    pub(crate) sharded: Option<(Range<usize>, Vec<Parameter>)>,
}

impl<'c> DataParallel<'c> {
    /// Take over gradient communication for this rank's replica `module` (the model stays the
    /// caller's: forward it as usual, then call [`DataParallel::backward`]). Collective: every
    /// rank calls it with a model of the same architecture.
    pub fn new(
        comm: &'c Comm,
        module: &dyn Module,
        options: DdpOptions,
    ) -> Result<DataParallel<'c>> {
        let op = "DataParallel::new";
        let weights = options.weights.unwrap_or_else(|| vec![1.0; comm.size()]);
        check_weights(op, &weights, comm.size())?;
        let bf16 = match options.comm_dtype {
            DType::F32 => false,
            DType::BF16 => true,
            other => {
                return Err(Error::dtype(
                    op,
                    format!("gradients can travel as f32 or bf16, not {other}"),
                ))
            }
        };
        if options.broadcast_parameters {
            for p in module.parameters() {
                comm.broadcast(p.value(), 0)?;
            }
            for (_, b) in module.named_buffers() {
                comm.broadcast(&b, 0)?;
            }
        }
        // Backward reaches the parameters roughly in reverse order of use: lay the flat buffer
        // out that way, so the first buckets fill first.
        let mut params = module.trainable_parameters();
        params.reverse();
        if let Some(p) = params
            .iter()
            .find(|p| p.dtype() != DType::F32 || p.device() != comm.device())
        {
            return Err(Error::invalid(
                op,
                format!(
                    "parameter {:?} is {} on {}; data-parallel training takes f32 parameters on the rank's device {}",
                    p.shape(),
                    p.dtype(),
                    p.device(),
                    comm.device()
                ),
            ));
        }
        let grads = GradBuffers::new(&params)?;
        let flat = match grads.buffers() {
            [] => Tensor::zeros(&[0], DType::F32, comm.device())?,
            [b] => b.clone(),
            _ => {
                return Err(Error::invalid(
                    op,
                    "parameters span several gradient buffers",
                ))
            }
        };
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut members: Vec<Vec<Parameter>> = Vec::new();
        let mut bucket_of = HashMap::new();
        let mut layout = Vec::with_capacity(params.len());
        let mut at = 0;
        for p in &params {
            layout.push((p.clone(), at));
            let bytes = p.numel() * 4;
            let start_new = match buckets.last() {
                None => true,
                Some(b) => b.len > 0 && (b.len * 4 + bytes) > options.bucket_bytes,
            };
            if start_new {
                buckets.push(Bucket {
                    start: at,
                    len: 0,
                    params: 0,
                    pinned: 0,
                });
                members.push(Vec::new());
            }
            let i = buckets.len() - 1; // the bucket just started, or the open one
            buckets[i].len += p.numel();
            buckets[i].params += 1;
            members[i].push(p.clone());
            bucket_of.insert(p.id(), i);
            at += p.numel();
        }
        // Host staging for each bucket, unless the buckets go through the device relay.
        let relay = comm.device().is_opencl() && comm.hub.relay;
        let wire = match bf16 && relay {
            true => Some(Tensor::zeros(&[at], DType::BF16, comm.device())?),
            false => None,
        };
        let mut pinned = Vec::new();
        if comm.device().is_opencl() && !relay {
            for b in &mut buckets {
                let mut buf = PinnedBuffer::new(comm.device(), b.len * 4)?;
                b.pinned = buf.as_mut_slice().as_mut_ptr() as usize;
                pinned.push(buf);
            }
        }
        let buckets = Arc::new(buckets);
        let worker = BucketWorker::start(
            comm.duplicate()?,
            flat.clone(),
            wire.clone().unwrap_or_else(|| flat.clone()),
            bf16,
            buckets.clone(),
            pinned,
        )?;
        Ok(DataParallel {
            comm,
            grads,
            flat,
            wire,
            buckets,
            bucket_of,
            layout,
            members,
            worker,
            share: 1.0 / comm.size() as f32,
            weights,
            sync: true,
            last_compute_s: 0.0,
            step_start: None,
            copies: Vec::new(),
            sharded: None,
        })
    }

    pub fn comm(&self) -> &'c Comm {
        self.comm
    }
    /// Each trainable parameter and the first element of its gradient in the flat buffer.
    pub(crate) fn layout(&self) -> &[(Parameter, usize)] {
        &self.layout
    }
    /// The flat gradient buffer.
    pub(crate) fn flat(&self) -> &Tensor {
        &self.flat
    }
    /// Number of gradient buckets and their sizes in elements.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.len).collect()
    }
    /// The flat gradient buffer (every trainable parameter's gradient is a view into it).
    pub fn gradients(&self) -> &GradBuffers {
        &self.grads
    }

    /// The rows of a batch of `n` each rank takes, in rank order (proportional to the weights;
    /// every rank at least one row when `n` allows, since a rank without rows has no loss).
    pub fn split(&self, n: usize) -> Vec<usize> {
        let mut parts = proportional_split(n, &self.weights);
        if n >= parts.len() {
            while let Some(empty) = parts.iter().position(|&p| p == 0) {
                let Some((most, _)) =
                    (parts.iter().enumerate()).max_by_key(|(i, &p)| (p, std::cmp::Reverse(*i)))
                else {
                    break;
                };
                parts[most] -= 1;
                parts[empty] += 1;
            }
        }
        parts
    }

    /// The current shares of the batch per rank.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Set the shares of the batch per rank (the same on every rank).
    pub fn set_weights(&mut self, weights: Vec<f64>) -> Result<()> {
        check_weights("DataParallel::set_weights", &weights, self.comm.size())?;
        self.weights = weights;
        Ok(())
    }

    /// This rank's rows of a batch of `n`; also makes their share of `n` this rank's weight in
    /// the next gradient all-reduce.
    pub fn shard_range(&mut self, n: usize) -> Range<usize> {
        self.step_start.get_or_insert_with(Instant::now);
        let parts = self.split(n);
        let start: usize = parts[..self.comm.rank()].iter().sum();
        let mine = parts[self.comm.rank()];
        self.share = if n == 0 { 0.0 } else { mine as f32 / n as f32 };
        start..start + mine
    }

    /// This rank's rows (dim 0) of a whole batch `x`, on this rank's device.
    pub fn shard(&mut self, x: &Tensor) -> Result<Tensor> {
        let n = x.shape().first().copied().ok_or_else(|| {
            Error::shape(
                "DataParallel::shard",
                "the batch must have a batch dimension",
            )
        })?;
        let r = self.shard_range(n);
        x.narrow(0, r.start, r.len())?
            .contiguous()?
            .to_device(self.comm.device())
    }

    /// Run `f` without gradient communication: backward passes inside only accumulate locally
    /// (the next synchronised backward all-reduces the sum).
    pub fn no_sync<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        let was = std::mem::replace(&mut self.sync, false);
        let out = f(self);
        self.sync = was;
        out
    }

    /// Backward of this rank's `loss` (a scalar: the mean over this rank's rows), with the
    /// gradient all-reduce overlapped. On return every replica holds the same gradients (unless
    /// inside [`DataParallel::no_sync`]). An error here (or on any other rank) aborts the group.
    pub fn backward(&mut self, tape: &Tape, loss: &Var) -> Result<()> {
        // Forward (from the first shard_range) and backward count as this rank's compute.
        let started = self.step_start.take().unwrap_or_else(Instant::now);
        if !self.sync {
            tape.backward(loss)?;
            self.last_compute_s += started.elapsed().as_secs_f64();
            return Ok(());
        }
        self.comm
            .or_abort(self.backward_synced(tape, loss, started))
    }

    fn backward_synced(&mut self, tape: &Tape, loss: &Var, started: Instant) -> Result<()> {
        let mut pending: Vec<usize> = self.buckets.iter().map(|b| b.params).collect();
        let mut sent = vec![false; self.buckets.len()];
        let share = self.share;
        let keep = self.sharded.as_ref().map(|(run, _)| run.clone());
        let step = self.worker.begin(share, self.buckets.len(), keep)?;
        {
            let (worker, flat, buckets, bucket_of, wire) = (
                &self.worker,
                &self.flat,
                &self.buckets,
                &self.bucket_of,
                self.wire.as_ref(),
            );
            let mut hook = |p: &Parameter| -> Result<()> {
                let Some(&b) = bucket_of.get(&p.id()) else {
                    return Ok(());
                };
                pending[b] -= 1;
                if pending[b] == 0 {
                    sent[b] = true;
                    worker.send(step, b, launch(flat, wire, &buckets[b])?)?;
                }
                Ok(())
            };
            if let Err(e) = tape.backward_hooked(loss, &mut hook) {
                worker.cancel(step);
                return Err(e);
            }
        }
        // Buckets with parameters backward did not reach: their gradients are zero.
        let rest = self.send_unreached(step, &sent);
        if let Err(e) = rest {
            self.worker.cancel(step);
            return Err(e);
        }
        // This rank's compute ends when its device has run forward and backward (the thread
        // would wait for the reduction next anyway); calibrate() divides rows by this time.
        if let Ok(cl) = self.flat.device().cl("DataParallel::backward") {
            cl.queue.finish().cl("clFinish")?;
        }
        self.last_compute_s += started.elapsed().as_secs_f64();
        let done = self.worker.finish()?;
        // Later kernels (the optimizer's) must wait for the gradients copied back.
        if self.flat.device().is_opencl() {
            let waits: Vec<_> = done.writes.iter().collect();
            drop(marker(self.flat.device(), Queue::Compute, &waits)?);
        }
        if let Some(wire) = &self.wire {
            fused_into(&[wire], &[(Expr::input(0).cast(DType::F32), &self.flat)])?;
        }
        for (b, data) in done.host {
            let bucket = &self.buckets[b];
            write_tensor(&self.flat.narrow(0, bucket.start, bucket.len)?, &data)?;
        }
        self.flat.mark_modified();
        self.copies = done.copies;
        // Only this rank's run was reduced: no other gradient may be read.
        if let Some((_, others)) = &self.sharded {
            for p in others {
                p.zero_grad();
            }
        }
        Ok(())
    }

    /// Send the buckets backward did not complete: the gradients of parameters it did not reach
    /// are zero.
    fn send_unreached(&self, step: u64, sent: &[bool]) -> Result<()> {
        for (b, done) in sent.iter().enumerate() {
            if !done {
                for p in &self.members[b] {
                    if p.grad().is_none() {
                        p.set_grad(Some(Tensor::zeros(p.shape(), p.dtype(), p.device())?))?;
                    }
                }
                let bucket = &self.buckets[b];
                self.worker
                    .send(step, b, launch(&self.flat, self.wire.as_ref(), bucket)?)?;
            }
        }
        Ok(())
    }

    /// Device timings of the last synchronised step's bucket copies (OpenCL ranks).
    pub fn last_copies(&self) -> &[CopyRecord] {
        &self.copies
    }

    /// Measure each rank's throughput over the steps since the last call (rows it processed
    /// per second of its forward + backward) and set the weights in proportion. Collective.
    pub fn calibrate(&mut self, rows_done: usize) -> Result<Vec<f64>> {
        let secs = self.last_compute_s.max(1e-9);
        self.last_compute_s = 0.0;
        let mut rate = vec![rows_done as f32 / secs as f32];
        let all = self.comm.all_gather(&Tensor::from_vec(
            rate.split_off(0),
            &[1],
            self.comm.device(),
        )?)?;
        let rates: Vec<f64> = all.to_vec::<f32>()?.into_iter().map(f64::from).collect();
        if rates.iter().all(|r| r.is_finite() && *r > 0.0) {
            self.weights = rates;
        }
        Ok(self.weights.clone())
    }

    /// Save a checkpoint (see `netcl_nn::save_checkpoint`) written by rank 0, once every rank
    /// has reached this point without error (so a failed step writes nothing). Collective.
    ///
    /// A sharded optimizer's state lives on every rank: each rank `r > 0` first saves its shard
    /// beside the checkpoint ([`shard_path`]), then rank 0 saves the model and its own shard
    /// to `path`, the commit (a failure before it leaves the previous checkpoint and its shards
    /// loadable), then each rank removes its shards of other steps. Resume with
    /// [`DataParallel::load_checkpoint`], on a group of any size.
    pub fn save_checkpoint(
        &self,
        path: impl AsRef<Path>,
        module: &dyn Module,
        optimizer: Option<&dyn netcl_optim::Optimizer>,
        step: u64,
        extra: serde_json::Value,
    ) -> Result<()> {
        let path = path.as_ref();
        let rank = self.comm.rank();
        let shard = optimizer.filter(|o| self.comm.size() > 1 && is_sharded(&o.hyper_params()));
        self.comm.barrier()?;
        if let (Some(o), true) = (shard, rank > 0) {
            let saved = netcl_nn::save_optimizer(
                shard_path(path, rank, step),
                o,
                step,
                serde_json::json!({}),
            );
            self.comm.or_abort(saved.map(drop))?;
        }
        self.comm.barrier()?;
        let saved = match rank {
            0 => netcl_nn::save_checkpoint(path, module, optimizer, step, extra).map(drop),
            _ => Ok(()),
        };
        self.comm.or_abort(saved)?;
        self.comm.barrier()?;
        if shard.is_some() && rank > 0 {
            // The checkpoint names this step's shards: the others are no longer needed (a
            // leftover costs only disk, so a failure to remove one is not an error).
            remove_other_shards(path, rank, step);
        }
        Ok(())
    }

    /// Restore a checkpoint [`DataParallel::save_checkpoint`] wrote: every rank reads the model
    /// from `path`, and its optimizer state from `path` (rank 0, or an optimizer that is not
    /// sharded) or from its shard of the saved step. A sharded optimizer saved by a group of
    /// another size is resharded: every rank reads every shard and keeps the state of the
    /// parameters it owns now ([`Optimizer::load_state_parts`](netcl_optim::Optimizer::load_state_parts)).
    /// Collective; returns the checkpoint's metadata.
    pub fn load_checkpoint(
        &self,
        path: impl AsRef<Path>,
        module: &dyn Module,
        optimizer: Option<&mut dyn netcl_optim::Optimizer>,
    ) -> Result<netcl_nn::checkpoint::Checkpoint> {
        let path = path.as_ref();
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let loaded = (|| {
            let meta = netcl_nn::load_checkpoint(path, module, None)?;
            let Some(opt) = optimizer else {
                return Ok(meta);
            };
            let saved = meta.optimizer.as_ref().filter(|h| is_sharded(h));
            let ranks = saved.map(|h| h["sharded"]["ranks"].as_u64().unwrap_or(0) as usize);
            match ranks {
                // Another number of ranks: each takes its parameters' state out of every shard.
                Some(n) if n != size => {
                    let mut parts = Vec::with_capacity(n);
                    for r in 0..n {
                        let at = match r {
                            0 => path.to_path_buf(),
                            _ => shard_path(path, r, meta.step),
                        };
                        parts.push(netcl_nn::read_optimizer(at)?.0);
                    }
                    opt.load_state_parts(&parts)
                }
                Some(_) if rank > 0 => {
                    netcl_nn::load_optimizer(shard_path(path, rank, meta.step), opt).map(drop)
                }
                _ => netcl_nn::load_optimizer(path, opt).map(drop),
            }?;
            Ok(meta)
        })();
        let meta = self.comm.or_abort(loaded)?;
        self.comm.barrier()?;
        Ok(meta)
    }
}

/// Whether optimizer hyper-parameters are a sharded optimizer's (`ShardedOptimizer`).
fn is_sharded(hyper: &serde_json::Value) -> bool {
    !hyper["sharded"].is_null()
}

/// Where rank `rank` of a group with a sharded optimizer keeps its shard of the checkpoint at
/// `path` saved at `step`: `<path>.rank<rank>-step<step>` (its own `.json` and npz, beside).
pub fn shard_path(path: impl AsRef<Path>, rank: usize, step: u64) -> std::path::PathBuf {
    let path = path.as_ref();
    let base = path
        .file_name()
        .map_or_else(Default::default, |f| f.to_string_lossy().into_owned());
    path.with_file_name(format!("{base}.rank{rank}-step{step}"))
}

/// Removes rank `rank`'s shards of the checkpoint at `path` saved at steps other than `keep`.
fn remove_other_shards(path: &Path, rank: usize, keep: u64) {
    let Some(base) = path.file_name().map(|f| f.to_string_lossy().into_owned()) else {
        return;
    };
    let prefix = format!("{base}.rank{rank}-step");
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for name in entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
    {
        let step = name
            .strip_prefix(&prefix)
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(step) = step.filter(|&s| s != keep) {
            let shard = shard_path(path, rank, step);
            if let Ok(meta) = netcl_nn::checkpoint::read_meta(&shard) {
                let _ = std::fs::remove_file(netcl_nn::checkpoint::npz_path_of(&shard, &meta));
            }
            let _ = std::fs::remove_file(netcl_nn::checkpoint::json_path(&shard));
        }
    }
}

fn check_weights(op: &str, w: &[f64], size: usize) -> Result<()> {
    if w.len() != size || w.iter().any(|x| !x.is_finite() || *x <= 0.0) {
        return Err(Error::invalid(
            op,
            format!("weights {w:?}: need {size} positive finite numbers (one per rank)"),
        ));
    }
    Ok(())
}

/// Hand bucket `b` over: on an OpenCL device, a marker after the kernels that wrote it (and,
/// with a bf16 `wire`, the kernel rounding it into the wire; the communication thread reads the
/// bucket on the copy queue once the marker has passed); on the host, a copy of its values.
fn launch(flat: &Tensor, wire: Option<&Tensor>, b: &Bucket) -> Result<Job> {
    if flat.device().is_host() {
        return Ok(Job::Host(flat.narrow(0, b.start, b.len)?.to_vec::<f32>()?));
    }
    if let Some(wire) = wire {
        let (src, dst) = (
            flat.narrow(0, b.start, b.len)?,
            wire.narrow(0, b.start, b.len)?,
        );
        fused_into(&[&src], &[(Expr::input(0).cast(DType::BF16), &dst)])?;
    }
    Ok(Job::Device(compute_done(flat.device())?))
}
