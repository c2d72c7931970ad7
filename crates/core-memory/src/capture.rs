//! The recorder behind graph capture: while a thread captures on a device, its block allocations and frees, host writes, device copies and kernel launches there are appended to one event list (the work still runs).
use netcl_core_devices::{Device, Error, Result};
use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A `cl_mem` as a plain number: the identity of a buffer in a recording.
pub type Mem = usize;

/// One recorded kernel argument.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// A buffer (set with `arg_mem`).
    Mem(Mem),
    /// A plain value, as the bytes passed to clSetKernelArg.
    Bytes(Vec<u8>),
    /// Dynamic local memory of this many bytes.
    Local(usize),
}

/// One recorded kernel launch.
pub struct LaunchRecord {
    /// The built program (a `netcl_kernels::Program`; this crate sits below the kernels crate).
    pub program: Arc<dyn Any + Send + Sync>,
    pub kernel: String,
    pub args: Vec<Arg>,
    /// Global sizes, already rounded up to multiples of `local`.
    pub global: Vec<usize>,
    pub local: Vec<usize>,
    /// (bytes, flops) declared to the profiler.
    pub work: Option<(u64, u64)>,
    /// Argument pairs (output, input) that may be one buffer: the kernel reads each element of
    /// the input only in the work-item that writes the same element of the output, before
    /// writing it (elementwise kernels over dense operands at equal offsets).
    pub in_place: Vec<(usize, usize)>,
    /// Per argument: whether the kernel may write it (its declaration).
    pub writes: Vec<bool>,
}

/// What happened on the capturing device, in queue order.
pub enum Event {
    /// A pool block of `bytes` bytes (`class` reserved: its size class) was handed out as
    /// buffer `mem`.
    Alloc {
        mem: Mem,
        bytes: usize,
        class: usize,
    },
    /// The block of buffer `mem` went back to the pool.
    Free {
        mem: Mem,
    },
    Launch(LaunchRecord),
    /// Host bytes written to `mem` at `offset` (a constant of the step, replayed as is).
    Write {
        mem: Mem,
        offset: usize,
        data: Vec<u8>,
    },
    /// A device-to-device copy.
    Copy {
        src: Mem,
        src_offset: usize,
        dst: Mem,
        dst_offset: usize,
        len: usize,
    },
}

/// Everything one capture recorded.
pub struct Recording {
    pub device: Device,
    pub events: Vec<Event>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

/// Threads capturing right now: lets every hook return at once (one atomic load) when none is.
static CAPTURING: AtomicUsize = AtomicUsize::new(0);

/// Starts recording this thread's work on `device`. Errors when the thread already captures.
pub fn begin(device: &Device) -> Result<()> {
    if device.is_host() {
        return Err(Error::device(
            "Graph::capture",
            "the host device runs ops eagerly and has no kernels to record; capture on an \
             OpenCL device",
        ));
    }
    ACTIVE.with_borrow_mut(|a| {
        if a.is_some() {
            return Err(Error::invalid(
                "Graph::capture",
                "this thread is already capturing a graph (captures do not nest)",
            ));
        }
        *a = Some(Recording {
            device: device.clone(),
            events: Vec::new(),
        });
        CAPTURING.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
}

/// Stops this thread's recording and returns it (None when it was not capturing).
pub fn end() -> Option<Recording> {
    let r = ACTIVE.try_with(|a| a.borrow_mut().take()).ok().flatten();
    if r.is_some() {
        CAPTURING.fetch_sub(1, Ordering::SeqCst);
    }
    r
}

/// True when this thread is capturing work on `device`.
pub fn capturing(device: &Device) -> bool {
    CAPTURING.load(Ordering::Relaxed) > 0
        && ACTIVE
            .try_with(|a| a.borrow().as_ref().is_some_and(|r| &r.device == device))
            .unwrap_or(false)
}

/// Appends the event `make` builds when this thread captures on `device`.
pub fn record(device: &Device, make: impl FnOnce() -> Event) {
    if CAPTURING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let _ = ACTIVE.try_with(|a| {
        if let Some(r) = a.borrow_mut().as_mut().filter(|r| &r.device == device) {
            r.events.push(make());
        }
    });
}

/// The error for work that cannot be part of a captured graph (a read back to the host, whose
/// value the step's host logic could depend on), or Ok when this thread is not capturing.
pub fn forbid(device: &Device, what: &str) -> Result<()> {
    if capturing(device) {
        return Err(Error::invalid(
            "Graph::capture",
            format!(
                "{what} reads device memory back to the host on {device}; a captured step must \
                 not depend on device values (read outputs after the capture, from its output slots)"
            ),
        ));
    }
    Ok(())
}

/// The error for random draws inside a capture: the host-side Philox counter would be replayed
/// as a constant, so every replay would draw the same values. Ok when not capturing.
pub fn forbid_random(device: &Device, op: &str) -> Result<()> {
    if capturing(device) {
        return Err(Error::invalid(
            "Graph::capture",
            format!(
                "{op} draws random numbers on {device}; a replay would repeat the captured draw                  (no random ops in captured steps yet: capture without dropout, or run eagerly)"
            ),
        ));
    }
    Ok(())
}
