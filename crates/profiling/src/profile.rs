//! What a profiling session recorded: kernel launches (host dispatch span, device execution on the host clock, declared work) and host spans.
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
    /// Added to the device clock to get the host clock (ns), at the first kernel; later kernels
    /// follow the measured drift.
    pub offset_ns: i128,
    /// How fast the device clock runs against the host clock, in parts per million (positive:
    /// the device clock runs fast), between the first and last second-long windows of the
    /// profile; 0 when it spans less than a second of device time.
    pub drift_ppm: f64,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_the_op_of_generic_kernels() {
        let mut k = KernelRecord {
            kernel: Arc::from("k"),
            op: None,
            device: 1,
            thread: 1,
            global: vec![1],
            local: vec![1],
            host_start_ns: 0,
            host_end_ns: 1,
            device_start_ns: None,
            device_end_ns: None,
            work: None,
        };
        assert_eq!(k.label(), "k");
        k.op = Some("k");
        assert_eq!(k.label(), "k");
        k.op = Some("add");
        assert_eq!(k.label(), "k[add]");
    }
}
