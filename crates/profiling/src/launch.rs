//! The kernel-launch hook netcl-kernels calls: `Probe::begin` before the enqueue (None when off), `finish` with the enqueue's event after.
use crate::clock::{now_ns, thread_id};
use crate::collect::{collector, OwnedEvent};
use crate::profile::{KernelRecord, Work};
use crate::span::{current_op, take_declared};
use crate::state::enabled;
use netcl_core_devices::opencl3::types::cl_event;
use netcl_core_devices::Device;

/// A launch being profiled.
pub struct Probe {
    start_ns: u64,
    declared: Option<Work>,
}

/// What was launched.
pub struct Launch<'a> {
    pub kernel: &'a str,
    pub device: &'a Device,
    /// As enqueued (rounded up to the local size).
    pub global: &'a [usize],
    pub local: &'a [usize],
    /// The launch's own declaration (`Kernel::declare`); else the thread's (`declare`) is used.
    pub work: Option<Work>,
}

impl Probe {
    /// Start profiling a launch; None (after one relaxed atomic load) when the profiler is off.
    /// When on, this takes the thread's pending [`crate::declare`] so it never outlives a launch.
    #[inline]
    pub fn begin() -> Option<Probe> {
        if !enabled() {
            return None;
        }
        Some(Probe {
            start_ns: now_ns(),
            declared: take_declared(),
        })
    }

    /// Record the launch. `event` is the enqueue's event (its reference passes to the profiler,
    /// which reads the device times once it has finished), or null for none.
    ///
    /// # Safety
    /// `event` is null or a valid event whose reference the caller gives up.
    pub unsafe fn finish(self, launch: Launch<'_>, event: cl_event) {
        let host_end_ns = now_ns();
        // SAFETY: forwarded from the caller.
        let event = unsafe { OwnedEvent::new(event) };
        let op = current_op();
        let thread = thread_id();
        crate::exit::arm();
        let mut c = collector();
        let record = KernelRecord {
            kernel: c.intern(launch.kernel),
            op,
            device: launch.device.ordinal(),
            thread,
            global: launch.global.to_vec(),
            local: launch.local.to_vec(),
            host_start_ns: self.start_ns,
            host_end_ns,
            device_start_ns: None,
            device_end_ns: None,
            work: launch.work.or(self.declared),
        };
        c.push_kernel(record, launch.device, event);
    }
}
