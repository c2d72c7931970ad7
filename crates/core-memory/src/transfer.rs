//! Host<->device copies: pinned staging buffers, chunked synchronous copies, non-blocking copies with events.
use crate::capture;
use crate::pool::Block;
use netcl_core_devices::opencl3::command_queue::CommandQueue;
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::opencl3::memory::{
    Buffer, ClMem, CL_MAP_READ, CL_MAP_WRITE, CL_MEM_ALLOC_HOST_PTR, CL_MEM_READ_WRITE,
};
use netcl_core_devices::opencl3::types::{cl_event, cl_mem, CL_BLOCKING, CL_NON_BLOCKING};
use netcl_core_devices::{cl3, ClResultExt, Device, Error, Result};
use std::ptr;
use std::sync::{Mutex, OnceLock};

/// Copies above this size go through the pinned staging ring; smaller ones are written directly.
pub const STAGING_THRESHOLD: usize = 1 << 20;
/// Size of each of the two staging buffers of a device.
pub const STAGING_CHUNK: usize = 16 << 20;

/// Records a host write into the capture on `dst`'s device, if this thread captures there.
fn record_write(dst: &Block, offset: usize, data: &[u8]) {
    if !data.is_empty() {
        capture::record(dst.device(), || capture::Event::Write {
            mem: dst.mem() as capture::Mem,
            offset,
            data: data.to_vec(),
        });
    }
}

fn check_range(op: &str, block: &Block, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= block.len() => Ok(()),
        _ => Err(Error::invalid(
            op,
            format!(
                "range {offset}..{} is outside the {}-byte block",
                offset + len,
                block.len()
            ),
        )),
    }
}

/// The raw pointer and count of an event wait list, as the enqueue calls take them.
fn wait_ptr(wait: &[cl_event]) -> (u32, *const cl_event) {
    if wait.is_empty() {
        (0, ptr::null())
    } else {
        (wait.len() as u32, wait.as_ptr())
    }
}

/// Enqueue a write of `len` bytes from `src` into `dst` at byte `offset` on `q`, after the `wait`
/// events; blocking or not. No capture record (the callers above record what a graph needs).
///
/// # Safety
/// `src` must stay valid and unchanged until the returned event completes; the range
/// must lie inside `dst`.
pub unsafe fn enqueue_write(
    q: &CommandQueue,
    dst: cl_mem,
    offset: usize,
    src: *const u8,
    len: usize,
    blocking: bool,
    wait: &[cl_event],
) -> Result<Event> {
    let (n, list) = wait_ptr(wait);
    let b = if blocking {
        CL_BLOCKING
    } else {
        CL_NON_BLOCKING
    };
    cl3::command_queue::enqueue_write_buffer(q.get(), dst, b, offset, len, src.cast(), n, list)
        .map(Event::new)
        .cl("clEnqueueWriteBuffer")
}

/// Enqueue a read of `len` bytes of `src` at byte `offset` into `dst` on `q`, after the `wait`
/// events; blocking or not.
///
/// # Safety
/// `dst` must stay valid, and not be read, until the returned event completes; the
/// range must lie inside `src`.
pub unsafe fn enqueue_read(
    q: &CommandQueue,
    src: cl_mem,
    offset: usize,
    dst: *mut u8,
    len: usize,
    blocking: bool,
    wait: &[cl_event],
) -> Result<Event> {
    let (n, list) = wait_ptr(wait);
    let b = if blocking {
        CL_BLOCKING
    } else {
        CL_NON_BLOCKING
    };
    cl3::command_queue::enqueue_read_buffer(q.get(), src, b, offset, len, dst.cast(), n, list)
        .map(Event::new)
        .cl("clEnqueueReadBuffer")
}

/// Page-locked host memory (CL_MEM_ALLOC_HOST_PTR, mapped once): the fast path for copies.
pub struct PinnedBuffer {
    buf: Buffer<u8>,
    ptr: *mut u8,
    len: usize,
    device: Device,
}

// SAFETY: the mapping is owned by this value; access goes through &self / &mut self.
unsafe impl Send for PinnedBuffer {}
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` bytes of pinned host memory usable for copies to and from `device`.
    pub fn new(device: &Device, len: usize) -> Result<PinnedBuffer> {
        let cl = device.cl("PinnedBuffer::new")?;
        let len = len.max(1);
        // SAFETY: the driver allocates the host memory; no host pointer is passed.
        let buf = unsafe {
            Buffer::<u8>::create(
                &cl.context,
                CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                len,
                ptr::null_mut(),
            )
        }
        .map_err(|e| match e.0 {
            c if netcl_core_devices::is_oom_code(c) => Error::OutOfMemory {
                device: device.label(),
                requested: len,
                stats: "pinned host staging buffer".into(),
            },
            c => Error::opencl("clCreateBuffer(CL_MEM_ALLOC_HOST_PTR)", c),
        })?;
        let mut mapped: cl_mem = ptr::null_mut();
        // SAFETY: a blocking map of the whole buffer; the pointer lives until unmap in Drop.
        unsafe {
            cl.queue.enqueue_map_buffer(
                &buf,
                CL_BLOCKING,
                CL_MAP_READ | CL_MAP_WRITE,
                0,
                len,
                &mut mapped,
                &[],
            )
        }
        .cl("clEnqueueMapBuffer")?;
        Ok(PinnedBuffer {
            buf,
            ptr: mapped.cast(),
            len,
            device: device.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping covers len bytes and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self excludes other access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Start copying the first `len` bytes of this buffer to `dst` at `offset`. The buffer moves
    /// into the returned [`Pending`] and comes back from `wait`, so it cannot be touched (or freed)
    /// while the copy runs.
    pub fn write_to(self, dst: &Block, offset: usize, len: usize) -> Result<Pending<PinnedBuffer>> {
        self.check(dst, "PinnedBuffer::write_to", len)?;
        check_range("PinnedBuffer::write_to", dst, offset, len)?;
        record_write(dst, offset, &self.as_slice()[..len]);
        let q = &dst.device().cl("PinnedBuffer::write_to")?.queue;
        // SAFETY: the buffer (and its mapping) moves into Pending and is handed back only after the wait.
        let ev = unsafe { enqueue_write(q, dst.mem(), offset, self.ptr, len, false, &[])? };
        Ok(Pending::new(Some(ev), self))
    }

    /// Start copying `len` bytes of `src` at `offset` into the start of this buffer (see [`Self::write_to`]).
    pub fn read_from(
        self,
        src: &Block,
        offset: usize,
        len: usize,
    ) -> Result<Pending<PinnedBuffer>> {
        self.check(src, "PinnedBuffer::read_from", len)?;
        check_range("PinnedBuffer::read_from", src, offset, len)?;
        capture::forbid(src.device(), "PinnedBuffer::read_from")?;
        let q = &src.device().cl("PinnedBuffer::read_from")?.queue;
        // SAFETY: as in write_to; nothing can read the buffer until the wait hands it back.
        let ev = unsafe { enqueue_read(q, src.mem(), offset, self.ptr, len, false, &[])? };
        Ok(Pending::new(Some(ev), self))
    }

    fn check(&self, block: &Block, op: &str, len: usize) -> Result<()> {
        if block.device() != &self.device {
            return Err(Error::device(
                op,
                format!(
                    "pinned buffer of {} used with a block on {}",
                    self.device,
                    block.device()
                ),
            ));
        }
        if len > self.len {
            return Err(Error::invalid(
                op,
                format!(
                    "{len} bytes requested from a {}-byte pinned buffer",
                    self.len
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Ok(cl) = self.device.cl("PinnedBuffer::drop") {
            // SAFETY: ptr came from mapping buf; no copy can be pending (a pending copy owns self).
            let unmapped = unsafe {
                cl.queue
                    .enqueue_unmap_mem_object(self.buf.get(), self.ptr.cast(), &[])
            };
            if let Ok(ev) = unmapped {
                let _ = ev.wait();
            }
        }
    }
}

/// A copy in flight that owns its host memory (`H`); `wait` hands the memory back.
#[must_use = "a pending copy completes only when waited for (dropping it waits)"]
pub struct Pending<H> {
    event: Option<Event>,
    host: Option<H>,
    /// Runs once the copy is complete (also when dropped): a small read's pinned slot copies
    /// into the host memory and goes back to its device's slots.
    after: Option<AfterCopy<H>>,
}

/// What a [`Pending`] runs once its copy is complete: given the host memory at `wait`, none
/// when dropped.
type AfterCopy<H> = Box<dyn FnOnce(Option<&mut H>) + Send>;

impl<H> Pending<H> {
    fn new(event: Option<Event>, host: H) -> Pending<H> {
        Pending {
            event,
            host: Some(host),
            after: None,
        }
    }

    /// Wait for the copy and return the host memory (the data, for a read).
    pub fn wait(mut self) -> Result<H> {
        if let Some(ev) = self.event.take() {
            ev.wait().cl("clWaitForEvents")?;
        }
        if let Some(after) = self.after.take() {
            after(self.host.as_mut());
        }
        self.host
            .take()
            .ok_or_else(|| Error::invalid("Pending::wait", "already waited"))
    }
    /// True once the device has finished the copy.
    pub fn is_done(&self) -> bool {
        use netcl_core_devices::opencl3::event::CL_COMPLETE;
        self.event
            .as_ref()
            .map(|e| {
                e.command_execution_status()
                    .map(|s| s.0 == CL_COMPLETE)
                    .unwrap_or(true)
            })
            .unwrap_or(true)
    }
}

impl<H> Drop for Pending<H> {
    fn drop(&mut self) {
        if let Some(ev) = self.event.take() {
            let _ = ev.wait();
        }
        if let Some(after) = self.after.take() {
            after(None);
        }
    }
}

/// Start copying `data` to `dst` at `offset`; `data` is kept alive (boxed, so it never moves)
/// until the copy completes, and `wait` hands it back.
pub fn write_async<H: AsRef<[u8]> + Send + 'static>(
    dst: &Block,
    offset: usize,
    data: H,
) -> Result<Pending<Box<H>>> {
    let data = Box::new(data);
    let bytes = (*data).as_ref();
    check_range("write_async", dst, offset, bytes.len())?;
    record_write(dst, offset, bytes);
    if bytes.is_empty() {
        return Ok(Pending::new(None, data));
    }
    let q = &dst.device().cl("write_async")?.queue;
    // SAFETY: the bytes live on the heap inside the box, which moves into Pending untouched until done.
    let ev = unsafe {
        enqueue_write(
            q,
            dst.mem(),
            offset,
            bytes.as_ptr(),
            bytes.len(),
            false,
            &[],
        )?
    };
    Ok(Pending::new(Some(ev), data))
}

/// Start copying `len` bytes of `src` at `offset` into a new host vector, returned by `wait`.
/// Reads of up to `SMALL_READ` (64 KiB) land in a pinned slot first (copied out at `wait`): on
/// NVIDIA's OpenCL a non-blocking read into pageable memory holds the host until the queue has
/// run up to it, so a token id read back would keep the next step from being queued meanwhile.
pub fn read_async(src: &Block, offset: usize, len: usize) -> Result<Pending<Vec<u8>>> {
    check_range("read_async", src, offset, len)?;
    capture::forbid(src.device(), "read_async")?;
    let q = &src.device().cl("read_async")?.queue;
    let mut host = vec![0u8; len];
    if len == 0 {
        return Ok(Pending::new(None, host));
    }
    if len <= SMALL_READ {
        let slots = small_read_slots(src.device())?;
        let slot = slots.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut slot = match slot {
            Some(s) => s,
            None => PinnedBuffer::new(src.device(), SMALL_READ)?,
        };
        let at = slot.as_mut_slice().as_mut_ptr();
        // SAFETY: the slot moves into the Pending's `after` and is touched again (copied out,
        // then handed back to the device's slots) only once the read is complete.
        let ev = unsafe { enqueue_read(q, src.mem(), offset, at, len, false, &[])? };
        let mut pending = Pending::new(Some(ev), host);
        pending.after = Some(Box::new(move |host: Option<&mut Vec<u8>>| {
            if let Some(h) = host {
                h.copy_from_slice(&slot.as_slice()[..len]);
            }
            slots.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
        }));
        return Ok(pending);
    }
    // SAFETY: the vector's heap memory moves into Pending and is handed out only after the wait.
    let ev = unsafe { enqueue_read(q, src.mem(), offset, host.as_mut_ptr(), len, false, &[])? };
    Ok(Pending::new(Some(ev), host))
}

/// The largest read [`read_async`] stages through a pinned slot.
pub const SMALL_READ: usize = 64 << 10;

/// Each device's free pinned slots for small reads (as many as were ever in flight at once).
fn small_read_slots(device: &Device) -> Result<&'static Mutex<Vec<PinnedBuffer>>> {
    static SLOTS: OnceLock<Vec<Mutex<Vec<PinnedBuffer>>>> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| {
        (Device::all().iter())
            .map(|_| Mutex::new(Vec::new()))
            .collect()
    });
    slots
        .get(device.ordinal())
        .ok_or_else(|| Error::device("read_async", format!("unknown device {device}")))
}

/// Events of copies into or out of the staging ring; dropping the set waits for all of them, so
/// an early error return never leaves a copy running into a slot another call may reuse.
#[derive(Default)]
struct InFlight([Option<Event>; 2]);

impl InFlight {
    fn wait(&mut self, slot: usize) -> Result<()> {
        match self.0[slot].take() {
            Some(ev) => ev.wait().cl("clWaitForEvents"),
            None => Ok(()),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for ev in self.0.iter_mut().filter_map(Option::take) {
            let _ = ev.wait();
        }
    }
}

fn staging_ring(device: &Device) -> Result<&'static Mutex<Vec<PinnedBuffer>>> {
    static RINGS: OnceLock<Vec<Mutex<Vec<PinnedBuffer>>>> = OnceLock::new();
    let rings = RINGS.get_or_init(|| {
        Device::all()
            .iter()
            .map(|_| Mutex::new(Vec::new()))
            .collect()
    });
    rings
        .get(device.ordinal())
        .ok_or_else(|| Error::device("staging", format!("unknown device {device}")))
}

fn with_ring<R>(device: &Device, f: impl FnOnce(&mut [PinnedBuffer]) -> Result<R>) -> Result<R> {
    let mut ring = staging_ring(device)?
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    while ring.len() < 2 {
        ring.push(PinnedBuffer::new(device, STAGING_CHUNK)?);
    }
    f(&mut ring)
}

/// Copy `data` to `dst` at `offset` and wait. Large copies stream through two pinned staging
/// buffers, so the memcpy of one chunk overlaps the DMA of the previous one.
pub fn write(dst: &Block, offset: usize, data: &[u8]) -> Result<()> {
    check_range("write", dst, offset, data.len())?;
    record_write(dst, offset, data);
    if data.is_empty() {
        return Ok(());
    }
    let q = &dst.device().cl("write")?.queue;
    if data.len() <= STAGING_THRESHOLD {
        // SAFETY: blocking write from a live slice.
        unsafe { enqueue_write(q, dst.mem(), offset, data.as_ptr(), data.len(), true, &[])? };
        return Ok(());
    }
    with_ring(dst.device(), |ring| {
        let mut events = InFlight::default();
        for (i, chunk) in data.chunks(STAGING_CHUNK).enumerate() {
            let slot = i % 2;
            events.wait(slot)?;
            let stage = &mut ring[slot];
            stage.as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the staging buffer is not touched again until this event has been waited for.
            let ev = unsafe {
                enqueue_write(
                    q,
                    dst.mem(),
                    offset + i * STAGING_CHUNK,
                    stage.ptr,
                    chunk.len(),
                    false,
                    &[],
                )?
            };
            events.0[slot] = Some(ev);
        }
        events.wait(0)?;
        events.wait(1)?;
        Ok(())
    })
}

/// Copy `out.len()` bytes of `src` at `offset` into `out` and wait (staged like [`write()`]).
pub fn read(src: &Block, offset: usize, out: &mut [u8]) -> Result<()> {
    check_range("read", src, offset, out.len())?;
    capture::forbid(src.device(), "read")?;
    if out.is_empty() {
        return Ok(());
    }
    let q = &src.device().cl("read")?.queue;
    if out.len() <= STAGING_THRESHOLD {
        // SAFETY: blocking read into a live slice.
        unsafe { enqueue_read(q, src.mem(), offset, out.as_mut_ptr(), out.len(), true, &[])? };
        return Ok(());
    }
    with_ring(src.device(), |ring| {
        let total = out.len();
        let n = total.div_ceil(STAGING_CHUNK);
        let span = move |i: usize| (i * STAGING_CHUNK, ((i + 1) * STAGING_CHUNK).min(total));
        let mut events = InFlight::default();
        let issue = |i: usize, ring: &mut [PinnedBuffer]| -> Result<Event> {
            let (a, b) = span(i);
            // SAFETY: the slot is read back only after this event has been waited for.
            unsafe { enqueue_read(q, src.mem(), offset + a, ring[i % 2].ptr, b - a, false, &[]) }
        };
        for (i, slot) in events.0.iter_mut().enumerate().take(n) {
            *slot = Some(issue(i, ring)?);
        }
        for i in 0..n {
            events.wait(i % 2)?;
            let (a, b) = span(i);
            out[a..b].copy_from_slice(&ring[i % 2].as_slice()[..b - a]);
            if i + 2 < n {
                events.0[i % 2] = Some(issue(i + 2, ring)?);
            }
        }
        Ok(())
    })
}

/// Copy `len` bytes between two blocks of the same device, in queue order (no wait).
pub fn copy(
    src: &Block,
    src_offset: usize,
    dst: &Block,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check_range("copy", src, src_offset, len)?;
    check_range("copy", dst, dst_offset, len)?;
    if src.device() != dst.device() {
        return Err(Error::device(
            "copy",
            format!("blocks on {} and {}", src.device(), dst.device()),
        ));
    }
    if len == 0 {
        return Ok(());
    }
    capture::record(src.device(), || capture::Event::Copy {
        src: src.mem() as capture::Mem,
        src_offset,
        dst: dst.mem() as capture::Mem,
        dst_offset,
        len,
    });
    let q = &src.device().cl("copy")?.queue;
    // SAFETY: both ranges were checked to lie inside live buffers.
    unsafe {
        cl3::command_queue::enqueue_copy_buffer(
            q.get(),
            src.mem(),
            dst.mem(),
            src_offset,
            dst_offset,
            len,
            0,
            ptr::null(),
        )
        .map(|ev| drop(Event::new(ev)))
        .cl("clEnqueueCopyBuffer")
    }
}
