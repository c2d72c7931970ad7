//! The process-wide record store: kernel launches with their pending OpenCL events, host spans, and the device times read back from finished events.
use crate::align::align_devices;
use crate::clock::thread_names;
use crate::profile::{DeviceTrack, KernelRecord, Profile, SpanRecord};
use netcl_core_devices::cl3::event::{
    get_event_info, get_event_profiling_info, release_event, CL_COMPLETE,
    CL_EVENT_COMMAND_EXECUTION_STATUS, CL_PROFILING_COMMAND_END, CL_PROFILING_COMMAND_QUEUED,
    CL_PROFILING_COMMAND_START,
};
use netcl_core_devices::opencl3::types::cl_event;
use netcl_core_devices::Device;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Most records (kernels + spans) kept; later ones are counted as dropped.
pub(crate) const MAX_RECORDS: usize = 4_000_000;
/// Finished events are read back every this many launches, so few stay alive.
const POLL_EVERY: usize = 256;
/// With more events pending than this, a launch waits for the oldest.
const MAX_PENDING: usize = 1 << 16;

/// An OpenCL event owned by the profiler (released on drop, errors ignored: at process exit the
/// driver may be gone).
pub(crate) struct OwnedEvent(cl_event);

// SAFETY: OpenCL event objects may be used and released from any thread.
unsafe impl Send for OwnedEvent {}

impl OwnedEvent {
    /// # Safety
    /// `ev` is a valid event whose one reference the caller hands over (or null).
    pub(crate) unsafe fn new(ev: cl_event) -> Option<OwnedEvent> {
        (!ev.is_null()).then_some(OwnedEvent(ev))
    }

    fn complete(&self) -> bool {
        get_event_info(self.0, CL_EVENT_COMMAND_EXECUTION_STATUS)
            .map(|v| v.to_int() <= CL_COMPLETE)
            .unwrap_or(true)
    }

    /// (queued, start, end) on the device clock, or None when the queue does not profile or the
    /// command failed.
    fn times(&self) -> Option<RawTimes> {
        let get = |what| {
            get_event_profiling_info(self.0, what)
                .ok()
                .map(|v| v.to_ulong())
        };
        let (start, end) = (
            get(CL_PROFILING_COMMAND_START)?,
            get(CL_PROFILING_COMMAND_END)?,
        );
        let queued = get(CL_PROFILING_COMMAND_QUEUED).filter(|&q| q != 0 && q <= start);
        (end >= start && start != 0).then_some(RawTimes { queued, start, end })
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        // SAFETY: the profiler holds exactly one reference to the event.
        let _ = unsafe { release_event(self.0) };
    }
}

/// Device-clock timestamps of one command.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawTimes {
    pub queued: Option<u64>,
    pub start: u64,
    pub end: u64,
}

struct Pending {
    index: usize,
    device: Device,
    event: OwnedEvent,
}

/// Where a session started: lengths of the record lists then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    kernels: usize,
    spans: usize,
}

impl Mark {
    /// The start of the store (everything recorded).
    pub(crate) const ZERO: Mark = Mark {
        kernels: 0,
        spans: 0,
    };
}

#[derive(Default)]
pub(crate) struct Collector {
    kernels: Vec<KernelRecord>,
    /// Device-clock times per kernel record (same index), filled as events finish.
    raw: Vec<Option<RawTimes>>,
    pending: VecDeque<Pending>,
    spans: Vec<SpanRecord>,
    dropped: u64,
    launches_since_poll: usize,
    names: HashSet<Arc<str>>,
    devices: HashMap<usize, String>,
}

static COLLECTOR: OnceLock<Mutex<Collector>> = OnceLock::new();

pub(crate) fn collector() -> MutexGuard<'static, Collector> {
    COLLECTOR
        .get_or_init(|| Mutex::new(Collector::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl Collector {
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            kernels: self.kernels.len(),
            spans: self.spans.len(),
        }
    }

    fn full(&mut self) -> bool {
        if self.kernels.len() + self.spans.len() >= MAX_RECORDS {
            self.dropped += 1;
            true
        } else {
            false
        }
    }

    /// The shared copy of a kernel name.
    pub(crate) fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.names.insert(n.clone());
        n
    }

    pub(crate) fn push_kernel(
        &mut self,
        record: KernelRecord,
        device: &Device,
        event: Option<OwnedEvent>,
    ) {
        if self.full() {
            return;
        }
        self.devices
            .entry(device.ordinal())
            .or_insert_with(|| device.label());
        let index = self.kernels.len();
        self.kernels.push(record);
        self.raw.push(None);
        if let Some(event) = event {
            self.pending.push_back(Pending {
                index,
                device: device.clone(),
                event,
            });
        }
        self.launches_since_poll += 1;
        if self.launches_since_poll >= POLL_EVERY || self.pending.len() > MAX_PENDING {
            self.launches_since_poll = 0;
            self.poll(self.pending.len() > MAX_PENDING);
        }
    }

    pub(crate) fn push_span(&mut self, span: SpanRecord) {
        if !self.full() {
            self.spans.push(span);
        }
    }

    /// Read back finished events from the front of the queue (oldest first); with `block`, wait
    /// for the oldest one.
    fn poll(&mut self, block: bool) {
        let mut wait = block;
        while let Some(p) = self.pending.pop_front() {
            if wait {
                let _ = p.device.synchronize();
                wait = false;
            } else if !p.event.complete() {
                self.pending.push_front(p);
                break;
            }
            self.raw[p.index] = p.event.times();
        }
    }

    /// Wait for every device with pending events, then read all of them back.
    fn resolve_all(&mut self) {
        let mut waited = HashSet::new();
        for p in &self.pending {
            if waited.insert(p.device.ordinal()) {
                let _ = p.device.synchronize();
            }
        }
        for p in std::mem::take(&mut self.pending) {
            self.raw[p.index] = p.event.times();
        }
    }

    /// Everything recorded since `mark`, with device times aligned to the host clock.
    pub(crate) fn profile_since(&mut self, mark: Mark) -> Profile {
        self.resolve_all();
        let kernels = self.kernels.get(mark.kernels..).unwrap_or(&[]).to_vec();
        let raw = self.raw.get(mark.kernels..).unwrap_or(&[]);
        let mut devices: Vec<DeviceTrack> = self
            .devices
            .iter()
            .filter(|(o, _)| kernels.iter().any(|k| k.device == **o))
            .map(|(&ordinal, label)| DeviceTrack {
                ordinal,
                label: label.clone(),
                offset_ns: 0,
                drift_ppm: 0.0,
            })
            .collect();
        devices.sort_by_key(|d| d.ordinal);
        let kernels = align_devices(kernels, raw, &mut devices);
        Profile {
            kernels,
            spans: self.spans.get(mark.spans..).unwrap_or(&[]).to_vec(),
            devices,
            threads: thread_names(),
            dropped: self.dropped,
        }
    }

    /// Forget everything (the profiler went off).
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.kernels.clear();
        self.raw.clear();
        self.spans.clear();
        self.dropped = 0;
        self.launches_since_poll = 0;
    }
}

/// How many kernel launches and host spans the store holds now (all sessions together).
pub fn stored_records() -> (usize, usize) {
    let c = collector();
    (c.kernels.len(), c.spans.len())
}
