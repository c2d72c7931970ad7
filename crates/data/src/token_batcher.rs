//! Language-model batches from a token stream: seeded windows of T+1 tokens as i32 inputs/targets `[B, T]`, uploaded through pinned buffers one batch ahead, with transfer counters.
use netcl_core_devices::opencl3::event::{Event, CL_COMPLETE};
use netcl_core_devices::{ClResultExt, DType, Device, Error, Result};
use netcl_core_memory::{enqueue_write, host_vec, PinnedBuffer};
use netcl_ops::Tensor;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// Pinned upload buffers per OpenCL batcher: a buffer is refilled three batches after its last
/// upload, by which time that upload has normally long finished.
const RING: usize = 3;

/// Host-to-device traffic, either of one batch or summed over a [`TokenBatcher`]'s batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Batches prepared.
    pub batches: u64,
    /// Bytes copied from the host to the device (0 on the host device).
    pub h2d_bytes: u64,
    /// Times the host waited for the device: a pinned buffer was still being copied from when
    /// it was due to be refilled. Blocking reads and writes would count here too; there are none.
    pub host_syncs: u64,
}

/// One batch: `inputs[b][t] = tokens[starts[b] + t]`, `targets[b][t] = tokens[starts[b] + t + 1]`.
#[derive(Clone, Debug)]
pub struct TokenBatch {
    /// i32 `[B, T]`.
    pub inputs: Tensor,
    /// i32 `[B, T]`: the next token of each input position.
    pub targets: Tensor,
    /// Where each row's window starts in the token stream.
    pub starts: Vec<usize>,
    /// This batch's traffic (`batches` is 1).
    pub stats: TransferStats,
}

struct Slot {
    pinned: PinnedBuffer,
    /// The upload that reads `pinned`, if not yet waited for.
    upload: Option<Event>,
}

/// Random windows of a token stream as training batches on a device.
///
/// Sampling: row `b` of batch `k` starts at the `(k * B + b)`-th draw of
/// `Xoshiro256PlusPlus::seed_from_u64(seed)` via `random_range(0..=N - T - 1)` (`N` stream
/// tokens), so every start has a full window of `T + 1` tokens and runs repeat for a seed.
///
/// Transfers: the stream stays on the host. On an OpenCL device a batch costs one non-blocking
/// write of its `2 * B * T` i32 ids (inputs then targets, `8 * B * T` bytes) from a pinned
/// buffer into a fresh `[2, B, T]` tensor (allocated from the pool and zero-filled by one kernel
/// first); `inputs` and `targets` are contiguous views of it. The next batch is prepared and its
/// upload queued when a batch is handed out, so the step that uses batch `k` never waits for
/// its ids, and the host never blocks on the queue except when a pinned buffer from three
/// batches back is still in flight (counted in [`TransferStats::host_syncs`]). On the host
/// device the batch is two host vectors: no transfer.
pub struct TokenBatcher {
    tokens: Vec<u32>,
    batch: usize,
    context: usize,
    device: Device,
    rng: Xoshiro256PlusPlus,
    ring: Vec<Slot>,
    next_slot: usize,
    ahead: Option<TokenBatch>,
    totals: TransferStats,
}

impl std::fmt::Debug for TokenBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenBatcher({} tokens, B {}, T {}, {})",
            self.tokens.len(),
            self.batch,
            self.context,
            self.device
        )
    }
}

impl TokenBatcher {
    /// Batches of `batch` windows of `context + 1` tokens of `tokens`, drawn with `seed`, on
    /// `device`. Needs `batch, context >= 1`, at least `context + 1` tokens, ids below 2^31.
    pub fn new(
        tokens: Vec<u32>,
        batch: usize,
        context: usize,
        seed: u64,
        device: &Device,
    ) -> Result<TokenBatcher> {
        let op = "TokenBatcher::new";
        if batch == 0 || context == 0 {
            return Err(Error::invalid(
                op,
                format!("batch {batch} and context {context} must both be at least 1"),
            ));
        }
        if tokens.len() <= context {
            return Err(Error::invalid(
                op,
                format!(
                    "{} tokens are too few for windows of context {context} + 1",
                    tokens.len()
                ),
            ));
        }
        if let Some((pos, id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t > i32::MAX as u32)
        {
            return Err(Error::invalid(
                op,
                format!("token {id} at position {pos} does not fit an i32"),
            ));
        }
        let bytes = batch
            .checked_mul(context)
            .and_then(|n| n.checked_mul(8))
            .ok_or_else(|| {
                Error::invalid(op, format!("batch {batch} x context {context} overflows"))
            })?;
        let ring = if device.is_host() {
            Vec::new()
        } else {
            (0..RING)
                .map(|_| {
                    Ok(Slot {
                        pinned: PinnedBuffer::new(device, bytes)?,
                        upload: None,
                    })
                })
                .collect::<Result<Vec<Slot>>>()?
        };
        Ok(TokenBatcher {
            tokens,
            batch,
            context,
            device: device.clone(),
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            ring,
            next_slot: 0,
            ahead: None,
            totals: TransferStats::default(),
        })
    }

    /// The token stream.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// `(B, T)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.batch, self.context)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Traffic summed over every batch prepared so far (including the one prepared ahead).
    pub fn stats(&self) -> TransferStats {
        self.totals
    }

    /// The next batch; the one after it is prepared (and its upload queued) before returning.
    pub fn next_batch(&mut self) -> Result<TokenBatch> {
        let current = match self.ahead.take() {
            Some(b) => b,
            None => self.prepare()?,
        };
        self.ahead = Some(self.prepare()?);
        Ok(current)
    }

    fn prepare(&mut self) -> Result<TokenBatch> {
        let (b, t) = (self.batch, self.context);
        let hi = self.tokens.len() - t - 1;
        // Fallible and within the host budget: a huge batch is an error, not an abort.
        let mut starts: Vec<usize> = host_vec(b)?;
        starts.extend((0..b).map(|_| self.rng.random_range(0..=hi)));
        let mut stats = TransferStats {
            batches: 1,
            ..TransferStats::default()
        };
        let shape = [2, b, t];
        let both = if self.device.is_host() {
            let mut ids = host_vec(2 * b * t)?;
            for shift in 0..2 {
                for &s in &starts {
                    ids.extend(
                        self.tokens[s + shift..s + shift + t]
                            .iter()
                            .map(|&x| x as i32),
                    );
                }
            }
            Tensor::from_vec(ids, &shape, &self.device)?
        } else {
            let slot = &mut self.ring[self.next_slot];
            self.next_slot = (self.next_slot + 1) % RING;
            if let Some(ev) = slot.upload.take() {
                let done = ev
                    .command_execution_status()
                    .map(|s| s.0 == CL_COMPLETE)
                    .unwrap_or(false);
                if !done {
                    stats.host_syncs += 1;
                }
                ev.wait().cl("clWaitForEvents")?;
            }
            let host = slot.pinned.as_mut_slice();
            let mut i = 0;
            for shift in 0..2 {
                for &s in &starts {
                    for &x in &self.tokens[s + shift..s + shift + t] {
                        host[i..i + 4].copy_from_slice(&(x as i32).to_ne_bytes());
                        i += 4;
                    }
                }
            }
            let out = Tensor::zeros(&shape, DType::I32, &self.device)?;
            let q = &self.device.cl("TokenBatcher")?.queue;
            // SAFETY: the source is the pinned mapping, which lives in `slot` and is not written
            // again until this event has been waited for (above, or in Drop); the destination
            // range is the fresh, contiguous tensor's `i` bytes from its offset.
            let ev = unsafe {
                enqueue_write(
                    q,
                    out.mem()?,
                    out.offset() * 4,
                    slot.pinned.as_slice().as_ptr(),
                    i,
                    false,
                    &[],
                )?
            };
            slot.upload = Some(ev);
            stats.h2d_bytes = i as u64;
            out
        };
        self.totals.batches += 1;
        self.totals.h2d_bytes += stats.h2d_bytes;
        self.totals.host_syncs += stats.host_syncs;
        Ok(TokenBatch {
            inputs: both.narrow(0, 0, 1)?.reshape(&[b, t])?,
            targets: both.narrow(0, 1, 1)?.reshape(&[b, t])?,
            starts,
            stats,
        })
    }
}

impl Drop for TokenBatcher {
    fn drop(&mut self) {
        for slot in &mut self.ring {
            if let Some(ev) = slot.upload.take() {
                let _ = ev.wait();
            }
        }
    }
}
