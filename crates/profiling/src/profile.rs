//! What a profiling session recorded: kernel launches (host dispatch span, device execution on the host clock, declared work) and host spans.
use crate::collect::RawTimes;
use std::sync::Arc;

/// Work a launch declares: bytes moved to and from global memory, floating-point operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    pub bytes: u64,
    pub flops: u64,
}

/// One kernel launch.
#[derive(Clone, Debug)]
pub struct KernelRecord {
    /// The OpenCL kernel's name (`matmul`, `fused_contig`, ...).
    pub kernel: Arc<str>,
    /// The innermost host span open on the launching thread (the op: `add`, `softmax`, ...).
    pub op: Option<&'static str>,
    /// The device's ordinal ([`netcl_core_devices::Device::ordinal`]).
    pub device: usize,
    /// The launching thread's profiler id.
    pub thread: u32,
    /// Global work size as enqueued (rounded up to the local size), 1 to 3 dims.
    pub global: Vec<usize>,
    pub local: Vec<usize>,
    /// Host clock (ns): the launch call (checks and `clEnqueueNDRangeKernel`).
    pub host_start_ns: u64,
    pub host_end_ns: u64,
    /// Device execution (CL_PROFILING_COMMAND_START/END) moved onto the host clock; None when
    /// the queue has no profiling or the event could not be read.
    pub device_start_ns: Option<u64>,
    pub device_end_ns: Option<u64>,
    /// What the op declared for this launch.
    pub work: Option<Work>,
}

impl KernelRecord {
    /// Device execution time (ns).
    pub fn device_ns(&self) -> Option<u64> {
        Some(self.device_end_ns? - self.device_start_ns?)
    }

    /// Host time of the launch call (ns).
    pub fn dispatch_ns(&self) -> u64 {
        self.host_end_ns - self.host_start_ns
    }

    /// `kernel`, or `kernel[op]` when the op that launched it has another name (generic kernels
    /// such as `fused_contig[add]`).
    pub fn label(&self) -> String {
        match self.op {
            Some(op) if op != &*self.kernel => format!("{}[{op}]", self.kernel),
            _ => self.kernel.to_string(),
        }
    }
}

/// One host span (an op's dispatch, a backward pass, ...), nested per thread.
#[derive(Clone, Debug)]
pub struct SpanRecord {
    pub name: &'static str,
    /// `op`, `backward`, ... (the trace's category).
    pub category: &'static str,
    pub thread: u32,
    /// Spans open around it on its thread when it started.
    pub depth: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A device that ran kernels in the profile.
#[derive(Clone, Debug)]
pub struct DeviceTrack {
    pub ordinal: usize,
    /// `opencl:0:0 (gpu) NVIDIA H200`.
    pub label: String,
    /// Added to the device clock to get the host clock (ns).
    pub offset_ns: i128,
}

/// Everything a session recorded, device times on the host clock.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub kernels: Vec<KernelRecord>,
    pub spans: Vec<SpanRecord>,
    pub devices: Vec<DeviceTrack>,
    /// Profiler thread ids and names.
    pub threads: Vec<(u32, String)>,
    /// Records not kept because the store was full.
    pub dropped: u64,
}

impl Profile {
    /// Total device time of all kernels (ns).
    pub fn device_ns(&self) -> u64 {
        self.kernels.iter().filter_map(|k| k.device_ns()).sum()
    }

    /// The kernels named `name`.
    pub fn kernels_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a KernelRecord> {
        self.kernels.iter().filter(move |k| &*k.kernel == name)
    }
}

/// Put device times on the host clock, one offset per device. The command was queued (device
/// clock) during its launch call (host clock), so the offset lies in [host_start - queued,
/// host_end - queued] for every launch; the smallest offset consistent with all launches is
/// taken. Without QUEUED timestamps, the smallest offset that starts no kernel before its
/// launch call. Either way no kernel starts before it was enqueued.
pub(crate) fn align_devices(
    mut kernels: Vec<KernelRecord>,
    raw: &[Option<RawTimes>],
    devices: &mut [DeviceTrack],
) -> Vec<KernelRecord> {
    for d in devices.iter_mut() {
        let mut by_queued: Option<i128> = None;
        let mut by_start: Option<i128> = None;
        let mut all_queued = true;
        for (k, r) in kernels.iter().zip(raw) {
            let (Some(r), true) = (r, k.device == d.ordinal) else {
                continue;
            };
            let host = k.host_start_ns as i128;
            by_start = by_start.max(Some(host - r.start as i128));
            match r.queued {
                Some(q) => by_queued = by_queued.max(Some(host - q as i128)),
                None => all_queued = false,
            }
        }
        d.offset_ns = if all_queued { by_queued } else { by_start }
            .or(by_start)
            .unwrap_or(0);
    }
    for (k, r) in kernels.iter_mut().zip(raw) {
        let (Some(r), Some(d)) = (r, devices.iter().find(|d| d.ordinal == k.device)) else {
            continue;
        };
        let to_host = |t: u64| (t as i128 + d.offset_ns).max(0) as u64;
        k.device_start_ns = Some(to_host(r.start));
        k.device_end_ns = Some(to_host(r.end));
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(device: usize, host_start_ns: u64, host_end_ns: u64) -> KernelRecord {
        KernelRecord {
            kernel: Arc::from("k"),
            op: None,
            device,
            thread: 1,
            global: vec![1],
            local: vec![1],
            host_start_ns,
            host_end_ns,
            device_start_ns: None,
            device_end_ns: None,
            work: None,
        }
    }

    fn track(ordinal: usize) -> DeviceTrack {
        DeviceTrack {
            ordinal,
            label: format!("d{ordinal}"),
            offset_ns: 0,
        }
    }

    #[test]
    fn queued_times_pin_the_offset_between_launch_bounds() {
        // Device clock = host clock + 5_000_000; each command queued mid-launch.
        let shift = 5_000_000u64;
        let launches = [
            (100, 140, 120),
            (1_000, 1_010, 1_009),
            (2_000, 2_300, 2_001),
        ];
        let kernels: Vec<_> = launches.iter().map(|&(s, e, _)| record(1, s, e)).collect();
        let raw: Vec<_> = launches
            .iter()
            .map(|&(_, _, q)| {
                Some(RawTimes {
                    queued: Some(q + shift),
                    start: q + shift + 50,
                    end: q + shift + 80,
                })
            })
            .collect();
        let mut devices = [track(1)];
        let out = align_devices(kernels, &raw, &mut devices);
        // The tightest lower bound: launch 3 was queued 1 ns after it began, so the offset is within
        // 1 ns of the truth (never later than it).
        let true_offset = -(shift as i128);
        assert!(devices[0].offset_ns <= true_offset && devices[0].offset_ns >= true_offset - 1);
        for (k, &(s, _, q)) in out.iter().zip(&launches) {
            let start = k.device_start_ns.unwrap();
            assert!(start >= s);
            assert!((start as i128 - (q + 50) as i128).abs() <= 1, "{k:?}");
            assert_eq!(k.device_ns(), Some(30));
        }
    }

    #[test]
    fn without_queued_times_no_kernel_starts_before_its_launch() {
        let kernels = vec![record(2, 10, 20), record(2, 30, 40), record(3, 5, 6)];
        let raw = vec![
            Some(RawTimes {
                queued: None,
                start: 900,
                end: 950,
            }),
            Some(RawTimes {
                queued: None,
                start: 905,
                end: 990,
            }),
            None,
        ];
        let mut devices = [track(2), track(3)];
        let out = align_devices(kernels, &raw, &mut devices);
        // The second kernel is the binding one: it must start at its launch (30) at the earliest.
        assert_eq!(devices[0].offset_ns, 30 - 905);
        assert_eq!(out[0].device_start_ns, Some(900 - 875));
        assert_eq!(out[1].device_start_ns, Some(30));
        assert!(out
            .iter()
            .zip(&raw)
            .all(|(k, r)| r.is_none() || k.device_start_ns.unwrap() >= k.host_start_ns));
        // A launch without device times keeps none.
        assert_eq!((out[2].device_start_ns, out[2].device_ns()), (None, None));
    }

    #[test]
    fn labels_name_the_op_of_generic_kernels() {
        let mut k = record(1, 0, 1);
        assert_eq!(k.label(), "k");
        k.op = Some("k");
        assert_eq!(k.label(), "k");
        k.op = Some("add");
        assert_eq!(k.label(), "k[add]");
    }
}
