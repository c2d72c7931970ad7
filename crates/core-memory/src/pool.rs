//! The per-device bucket pool: size classes, slabs carved into aligned sub-buffers, free-lists, reuse after other queues' events, OOM retry.
use crate::size_class::{size_class, SLAB_BYTES, SMALL_MAX};
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::opencl3::memory::{Buffer, ClMem, CL_MEM_READ_WRITE};
use netcl_core_devices::opencl3::types::{cl_event, cl_mem};
use netcl_core_devices::{cl3, ClResultExt, Config, Device, Error, Result};
use std::collections::HashMap;
use std::fmt;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Counters of one pool. Byte counts are in block (size-class) bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of blocks handed out and not yet returned.
    pub in_use: usize,
    /// Highest `in_use` seen.
    pub peak: usize,
    /// Bytes held from the driver (slabs and dedicated buffers).
    pub reserved: usize,
    /// Bytes held but not in use: free blocks and uncarved slab space (`reserved - in_use`).
    pub cached: usize,
    /// clCreateBuffer calls (slabs and dedicated buffers; sub-buffers not counted).
    pub driver_allocations: u64,
    /// Driver buffers released back by `empty_cache`.
    pub driver_frees: u64,
    /// Sub-buffers carved from slabs.
    pub sub_buffers: u64,
    /// Requests served from a free-list.
    pub hits: u64,
    /// Requests that needed a new block.
    pub misses: u64,
    /// Blocks handed out and not yet returned (those waiting for another queue included).
    pub live_blocks: usize,
    /// Dropped blocks not yet reusable: work recorded with [`Block::record_use`] on another
    /// queue has not completed. They count as in use until it has.
    pub pending_blocks: usize,
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "in use {} B, peak {} B, reserved {} B, cached {} B, driver allocations {}, hits {}, misses {}",
            self.in_use, self.peak, self.reserved, self.cached, self.driver_allocations, self.hits, self.misses
        )
    }
}

struct FreeBlock {
    buf: Buffer<u8>,
    slab: Option<u64>,
    origin: usize,
}

struct Slab {
    buf: Buffer<u8>,
    class: usize,
    carved: usize,
    live: usize,
}

/// A dropped block whose recorded uses on other queues are still running.
struct Pending {
    class: usize,
    block: FreeBlock,
    uses: Vec<Event>,
}

#[derive(Default)]
struct State {
    free: HashMap<usize, Vec<FreeBlock>>,
    pending: Vec<Pending>,
    slabs: HashMap<u64, Slab>,
    open_slab: HashMap<usize, u64>,
    next_slab: u64,
    stats: PoolStats,
    limit: Option<usize>,
    /// `NETCL_POOL_EXACT=1`: every block is a buffer of exactly its size, released when dropped,
    /// so a memory checker (Oclgrind) sees each access past a block's end.
    exact: bool,
}

struct Shared {
    device: Device,
    align: usize,
    max_alloc: usize,
    /// CL_DEVICE_GLOBAL_MEM_SIZE: the pool never holds more (PoCL asserts inside the driver
    /// instead of failing cleanly when it runs out of host address space).
    global_mem: usize,
    state: Mutex<State>,
}

/// A block of device memory from the pool. Returns to its free-list when dropped.
pub struct Block {
    buf: Option<Buffer<u8>>,
    len: usize,
    class: usize,
    slab: Option<u64>,
    origin: usize,
    /// Events of commands on queues other than the device's compute queue that use this block
    /// ([`Block::record_use`]); the block is reused only once they have completed.
    uses: Mutex<Vec<Event>>,
    pool: Arc<Shared>,
}

impl Block {
    /// Record that the command of `event`, enqueued on another queue than the device's compute
    /// queue (the copy queue, say), uses this block: when the block is dropped, the pool hands it
    /// out again only after that command has completed (PyTorch's `record_stream`); flush that
    /// queue, or the block stays pending until an out-of-memory waits for it. Work on the
    /// compute queue needs no record: the queue is in order, so later kernels on it run after.
    /// The other direction is the caller's: a block's first use on another queue must wait for
    /// the compute queue (a marker event), since its previous owner's kernels may still run.
    pub fn record_use(&self, event: &Event) -> Result<()> {
        let raw = event.get();
        // SAFETY: `raw` is a live event; the retain is released by the new `Event`'s drop.
        unsafe { cl3::event::retain_event(raw) }.cl("clRetainEvent")?;
        lock(&self.uses).push(Event::new(raw));
        Ok(())
    }

    /// The OpenCL buffer (a sub-buffer for small blocks).
    pub fn buffer(&self) -> &Buffer<u8> {
        self.buf
            .as_ref()
            .expect("a live block always holds its buffer")
    }
    /// The raw cl_mem, for kernel arguments and copies.
    pub fn mem(&self) -> cl_mem {
        self.buffer().get()
    }
    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes actually reserved (the size class).
    pub fn capacity(&self) -> usize {
        self.class
    }
    /// Offset inside its slab (0 for dedicated buffers).
    pub fn origin(&self) -> usize {
        self.origin
    }
    pub fn is_sub_buffer(&self) -> bool {
        self.slab.is_some()
    }
    pub fn device(&self) -> &Device {
        &self.pool.device
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Block({} B of class {} on {})",
            self.len, self.class, self.pool.device
        )
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mem = buf.get() as crate::capture::Mem;
            crate::capture::record(&self.pool.device, || crate::capture::Event::Free { mem });
            // A graph that uses this buffer is marked stale, or adopts the block: it stays in
            // use (its slab too) and comes back here when the graph drops.
            if let Some(graph) = crate::watch::released(mem) {
                let block = Block {
                    buf: Some(buf),
                    len: self.len,
                    class: self.class,
                    slab: self.slab,
                    origin: self.origin,
                    uses: Mutex::new(std::mem::take(&mut *lock(&self.uses))),
                    pool: self.pool.clone(),
                };
                crate::watch::adopt(&graph, block);
                return;
            }
            let block = FreeBlock {
                buf,
                slab: self.slab,
                origin: self.origin,
            };
            let mut uses = std::mem::take(&mut *lock(&self.uses));
            uses.retain(|e| !completed(e));
            let mut st = self.pool.lock();
            if uses.is_empty() {
                release(&mut st, self.class, block);
            } else {
                st.stats.pending_blocks += 1;
                st.pending.push(Pending {
                    class: self.class,
                    block,
                    uses,
                });
            }
        }
    }
}

/// Whether the command of `event` has finished (an aborted command counts: it no longer
/// touches memory).
fn completed(event: &Event) -> bool {
    event
        .command_execution_status()
        .map_or(true, |s| s.0 <= cl3::event::CL_COMPLETE)
}

/// A block back on its free-list: no longer in use (in exact mode, back to the driver).
fn release(st: &mut State, class: usize, block: FreeBlock) {
    st.stats.in_use -= class;
    st.stats.live_blocks -= 1;
    if st.exact {
        st.stats.reserved -= class;
        st.stats.driver_frees += 1;
        st.stats.cached = st.stats.reserved - st.stats.in_use;
        return;
    }
    if let Some(id) = block.slab {
        if let Some(s) = st.slabs.get_mut(&id) {
            s.live -= 1;
        }
    }
    st.free.entry(class).or_default().push(block);
    st.stats.cached = st.stats.reserved - st.stats.in_use;
}

/// Pending blocks whose recorded uses have completed go back to their free-lists.
fn settle_pending(st: &mut State) {
    if st.pending.is_empty() {
        return;
    }
    let (done, still): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut st.pending)
        .into_iter()
        .partition(|p| p.uses.iter().all(completed));
    st.pending = still;
    for p in done {
        st.stats.pending_blocks -= 1;
        release(st, p.class, p.block);
    }
}

/// Own handles of every pending block's recorded events, to wait on without the pool's lock.
fn pending_events(st: &State) -> Vec<Event> {
    let raw = st
        .pending
        .iter()
        .flat_map(|p| p.uses.iter().map(|e| e.get()));
    // SAFETY: each handle is live (held by its pending block); the retain is released by the
    // new `Event`'s drop. A failed retain leaves that event out (it is then not waited for).
    raw.filter(|&e| unsafe { cl3::event::retain_event(e) }.is_ok())
        .map(Event::new)
        .collect()
}

/// Waits for `events` after flushing the device's queues (a command on one queue may wait on
/// the other's). A failed command counts as finished (`completed`), so errors are ignored.
fn wait_for(device: &Device, events: &[Event]) {
    if let Ok(cl) = device.cl("Pool::alloc") {
        let _ = cl.queue.flush();
        let _ = cl.copy_queue.flush();
        let _ = cl.relay_queue.flush();
    }
    let raw: Vec<cl_event> = events.iter().map(|e| e.get()).collect();
    let _ = cl3::event::wait_for_events(&raw);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data: keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The memory pool of one OpenCL device.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Pool {
    /// A new, empty pool for `device` (an OpenCL device). [`Config::pool_limit`]
    /// (`NETCL_POOL_LIMIT`) caps the bytes it may hold from the driver; [`Config::pool_exact`]
    /// (`NETCL_POOL_EXACT=1`) makes it exact ([`Pool::exact`]).
    pub fn new(device: &Device) -> Result<Pool> {
        let exact = Config::get().pool_exact.get()?;
        Pool::with_mode(device, exact)
    }

    /// A pool whose every block is an OpenCL buffer of exactly the bytes asked (no size
    /// classes, no sub-buffers of a slab, nothing cached): slower, but a memory checker such as
    /// Oclgrind then sees every access past a block's end. `NETCL_POOL_LIMIT` applies.
    pub fn exact(device: &Device) -> Result<Pool> {
        Pool::with_mode(device, true)
    }

    fn with_mode(device: &Device, exact: bool) -> Result<Pool> {
        let info = device.info();
        device.cl("Pool::new")?;
        let limit = Config::get().pool_limit.get()?;
        let state = State {
            limit,
            exact,
            ..State::default()
        };
        Ok(Pool {
            shared: Arc::new(Shared {
                device: device.clone(),
                align: info.base_addr_align_bytes.max(256),
                max_alloc: info.max_alloc_bytes as usize,
                global_mem: usize::try_from(info.global_mem_bytes).unwrap_or(usize::MAX),
                state: Mutex::new(state),
            }),
        })
    }

    /// The process-wide pool of `device`.
    pub fn of(device: &Device) -> Result<Pool> {
        static POOLS: OnceLock<Vec<Option<Pool>>> = OnceLock::new();
        let pools = POOLS.get_or_init(|| Device::all().iter().map(|d| Pool::new(d).ok()).collect());
        pools
            .get(device.ordinal())
            .and_then(|p| p.clone())
            .ok_or_else(|| match Pool::new(device) {
                // Rare path: say why the pool could not be made (a bad NETCL_POOL_LIMIT, no OpenCL).
                Err(e) => e,
                Ok(_) => Error::device("Pool::of", format!("{device} has no device memory pool")),
            })
    }

    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// Alignment of sub-buffer origins in bytes (at least the device's base-address alignment).
    pub fn alignment(&self) -> usize {
        self.shared.align
    }

    pub fn stats(&self) -> PoolStats {
        self.shared.lock().stats
    }

    /// Cap the bytes held from the driver (`None`: no cap).
    pub fn set_limit(&self, limit: Option<usize>) {
        self.shared.lock().limit = limit;
    }

    /// Starts the peak over: `stats().peak` becomes what is in use now.
    pub fn reset_peak(&self) {
        let mut st = self.shared.lock();
        st.stats.peak = st.stats.in_use;
    }

    /// Release every cached block and every slab with no live block back to the driver (blocks
    /// still used by another queue stay until that work completes).
    pub fn empty_cache(&self) {
        let mut st = self.shared.lock();
        settle_pending(&mut st);
        release_cached(&mut st);
    }

    /// A block of at least `bytes` bytes. Out of memory: release the cache, retry once, then
    /// `Error::OutOfMemory` with the size and the stats.
    pub fn alloc(&self, bytes: usize) -> Result<Block> {
        let sh = &self.shared;
        if bytes > sh.max_alloc {
            let stats = sh.lock().stats;
            return Err(self.oom(bytes, &stats, "larger than the device's max allocation"));
        }
        let class = size_class(bytes, sh.align);
        if class > sh.max_alloc {
            return Err(self.oom(
                bytes,
                &sh.lock().stats,
                "larger than the device's max allocation",
            ));
        }
        let mut st = sh.lock();
        settle_pending(&mut st);
        if st.exact {
            let size = bytes.max(1);
            st.stats.misses += 1;
            let buf = self.driver_alloc(&mut st, size)?;
            let fb = FreeBlock {
                buf,
                slab: None,
                origin: 0,
            };
            return Ok(self.hand_out(&mut st, fb, bytes, size));
        }
        if let Some(fb) = st.free.get_mut(&class).and_then(|v| v.pop()) {
            st.stats.hits += 1;
            return Ok(self.hand_out(&mut st, fb, bytes, class));
        }
        st.stats.misses += 1;
        let fb = match self.grow(&mut st, class) {
            Ok(fb) => fb,
            Err(e) if e.is_out_of_memory() => {
                log::info!(
                    "pool on {}: out of memory for {bytes} B, waiting for other queues, releasing cache and retrying",
                    sh.device
                );
                // Blocks other queues still use are waited for first, one may be the size asked;
                // without the lock, since that work may wait on a thread that needs the pool.
                let events = pending_events(&st);
                if !events.is_empty() {
                    drop(st);
                    wait_for(&sh.device, &events);
                    st = sh.lock();
                    settle_pending(&mut st);
                    if let Some(fb) = st.free.get_mut(&class).and_then(|v| v.pop()) {
                        st.stats.hits += 1;
                        return Ok(self.hand_out(&mut st, fb, bytes, class));
                    }
                }
                release_cached(&mut st);
                self.grow(&mut st, class).map_err(|e| match e {
                    Error::OutOfMemory { stats: why, .. } => self.oom(bytes, &st.stats, &why),
                    e if e.is_out_of_memory() => self.oom(bytes, &st.stats, &e.to_string()),
                    e => e,
                })?
            }
            Err(e) => return Err(e),
        };
        Ok(self.hand_out(&mut st, fb, bytes, class))
    }

    fn oom(&self, bytes: usize, stats: &PoolStats, why: &str) -> Error {
        Error::OutOfMemory {
            device: self.shared.device.label(),
            requested: bytes,
            stats: format!("{why}; {stats}"),
        }
    }

    fn hand_out(&self, st: &mut State, fb: FreeBlock, len: usize, class: usize) -> Block {
        if let Some(id) = fb.slab {
            if let Some(s) = st.slabs.get_mut(&id) {
                s.live += 1;
            }
        }
        st.stats.in_use += class;
        st.stats.live_blocks += 1;
        st.stats.peak = st.stats.peak.max(st.stats.in_use);
        st.stats.cached = st.stats.reserved - st.stats.in_use;
        crate::capture::record(&self.shared.device, || crate::capture::Event::Alloc {
            mem: fb.buf.get() as crate::capture::Mem,
            bytes: len,
            class,
        });
        Block {
            buf: Some(fb.buf),
            len,
            class,
            slab: fb.slab,
            origin: fb.origin,
            uses: Mutex::new(Vec::new()),
            pool: self.shared.clone(),
        }
    }

    /// A new block of `class` bytes: carved from an open slab, from a new slab, or a dedicated buffer.
    fn grow(&self, st: &mut State, class: usize) -> Result<FreeBlock> {
        if class > SMALL_MAX {
            let buf = self.driver_alloc(st, class)?;
            return Ok(FreeBlock {
                buf,
                slab: None,
                origin: 0,
            });
        }
        let id = match st.open_slab.get(&class) {
            Some(&id) => id,
            None => {
                let bytes = SLAB_BYTES.max(class * 4);
                let buf = self.driver_alloc(st, bytes)?;
                let id = st.next_slab;
                st.next_slab += 1;
                st.slabs.insert(
                    id,
                    Slab {
                        buf,
                        class,
                        carved: 0,
                        live: 0,
                    },
                );
                st.open_slab.insert(class, id);
                id
            }
        };
        let slab = st.slabs.get_mut(&id).expect("open slab is registered");
        let origin = slab.carved;
        // SAFETY: origin + class lies inside the slab, and origin is a multiple of the alignment.
        let buf = unsafe { slab.buf.create_sub_buffer(CL_MEM_READ_WRITE, origin, class) }
            .cl("clCreateSubBuffer")?;
        slab.carved += class;
        let slab_size = SLAB_BYTES.max(slab.class * 4);
        if slab.carved + class > slab_size {
            st.open_slab.remove(&class);
        }
        st.stats.sub_buffers += 1;
        Ok(FreeBlock {
            buf,
            slab: Some(id),
            origin,
        })
    }

    fn driver_alloc(&self, st: &mut State, bytes: usize) -> Result<Buffer<u8>> {
        if let Some(limit) = st.limit {
            if st.stats.reserved + bytes > limit {
                return Err(Error::OutOfMemory {
                    device: self.shared.device.label(),
                    requested: bytes,
                    stats: format!("NETCL_POOL_LIMIT of {limit} B reached"),
                });
            }
        }
        let global = self.shared.global_mem;
        if st.stats.reserved.saturating_add(bytes) > global {
            return Err(Error::OutOfMemory {
                device: self.shared.device.label(),
                requested: bytes,
                stats: format!("the device's global memory of {global} B would be exceeded"),
            });
        }
        let cl = self.shared.device.cl("Pool::alloc")?;
        // SAFETY: no host pointer; the context is valid for the life of the device.
        let buf =
            unsafe { Buffer::<u8>::create(&cl.context, CL_MEM_READ_WRITE, bytes, ptr::null_mut()) }
                .cl("clCreateBuffer")?;
        // Drivers may defer the allocation to the first command that touches the buffer, and only
        // then report out-of-memory: touch it now, while the failure can still be handled.
        let byte = [0u8; 1];
        // SAFETY: a blocking write of one byte inside the buffer, from a live stack array.
        unsafe {
            crate::transfer::enqueue_write(
                &cl.queue,
                buf.get(),
                bytes - 1,
                byte.as_ptr(),
                1,
                true,
                &[],
            )
        }
        .map_err(|e| match e {
            Error::OpenCl { code, .. } => Error::opencl("touch new buffer", code),
            e => e,
        })?;
        st.stats.driver_allocations += 1;
        st.stats.reserved += bytes;
        st.stats.cached = st.stats.reserved - st.stats.in_use;
        Ok(buf)
    }
}

fn release_cached(st: &mut State) {
    let mut freed = 0usize;
    let mut frees = 0u64;
    // Dedicated buffers go back to the driver one by one.
    for (class, list) in st.free.iter_mut() {
        if *class > SMALL_MAX {
            freed += *class * list.len();
            frees += list.len() as u64;
            list.clear();
        }
    }
    // Slabs go back when none of their blocks is live.
    let empty: Vec<u64> = st
        .slabs
        .iter()
        .filter(|(_, s)| s.live == 0)
        .map(|(id, _)| *id)
        .collect();
    for id in empty {
        if let Some(slab) = st.slabs.remove(&id) {
            if let Some(list) = st.free.get_mut(&slab.class) {
                list.retain(|fb| fb.slab != Some(id));
            }
            if st.open_slab.get(&slab.class) == Some(&id) {
                st.open_slab.remove(&slab.class);
            }
            freed += SLAB_BYTES.max(slab.class * 4);
            frees += 1;
        }
    }
    st.free.retain(|_, v| !v.is_empty());
    st.stats.reserved -= freed;
    st.stats.driver_frees += frees;
    st.stats.cached = st.stats.reserved - st.stats.in_use;
}
