//! Capabilities of one device, queried once at discovery.
use crate::{ClResultExt, Result};
use opencl3::device::{
    Device as ClDeviceId, CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
};
use opencl3::platform::Platform;

/// What kind of device this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Host,
    Gpu,
    Cpu,
    Accelerator,
    Other,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Host => "host",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Cpu => "cpu",
            DeviceKind::Accelerator => "accelerator",
            DeviceKind::Other => "other",
        }
    }
}

/// Capabilities recorded for every device. For the host device the sizes describe the machine.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub vendor: String,
    pub platform: String,
    pub platform_version: String,
    pub driver_version: String,
    pub device_version: String,
    pub opencl_c_version: String,
    pub kind: DeviceKind,
    pub compute_units: u32,
    pub global_mem_bytes: u64,
    pub local_mem_bytes: u64,
    pub max_alloc_bytes: u64,
    pub max_work_group_size: usize,
    pub max_work_item_sizes: Vec<usize>,
    /// CL_DEVICE_MAX_PARAMETER_SIZE: bytes of arguments one kernel may take (at least 1024 on
    /// full-profile devices).
    pub max_parameter_bytes: usize,
    /// CL_DEVICE_MEM_BASE_ADDR_ALIGN converted from bits to bytes.
    pub base_addr_align_bytes: usize,
    pub fp16: bool,
    pub fp64: bool,
    pub subgroups: bool,
    pub extensions: String,
}

impl DeviceInfo {
    pub(crate) fn host() -> DeviceInfo {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let mem = host_memory_bytes();
        DeviceInfo {
            name: "host (ndarray)".into(),
            vendor: "netcl".into(),
            platform: "host".into(),
            platform_version: String::new(),
            driver_version: env!("CARGO_PKG_VERSION").into(),
            device_version: String::new(),
            opencl_c_version: String::new(),
            kind: DeviceKind::Host,
            compute_units: cores,
            global_mem_bytes: mem,
            local_mem_bytes: 0,
            max_alloc_bytes: mem,
            max_work_group_size: 1,
            max_work_item_sizes: vec![1],
            max_parameter_bytes: 1024,
            base_addr_align_bytes: 64,
            fp16: false,
            fp64: true,
            subgroups: false,
            extensions: String::new(),
        }
    }

    pub(crate) fn query(platform: &Platform, dev: &ClDeviceId) -> Result<DeviceInfo> {
        let op = "query device info";
        let ty = dev.dev_type().cl(op)?;
        let kind = if ty & CL_DEVICE_TYPE_GPU != 0 {
            DeviceKind::Gpu
        } else if ty & CL_DEVICE_TYPE_CPU != 0 {
            DeviceKind::Cpu
        } else if ty & CL_DEVICE_TYPE_ACCELERATOR != 0 {
            DeviceKind::Accelerator
        } else {
            DeviceKind::Other
        };
        let extensions = dev.extensions().cl(op)?;
        let has = |e: &str| extensions.split_whitespace().any(|x| x == e);
        Ok(DeviceInfo {
            name: dev.name().cl(op)?.trim().to_string(),
            vendor: dev.vendor().cl(op)?.trim().to_string(),
            platform: platform.name().cl(op)?.trim().to_string(),
            platform_version: platform.version().cl(op)?.trim().to_string(),
            driver_version: dev.driver_version().cl(op)?.trim().to_string(),
            device_version: dev.version().cl(op)?.trim().to_string(),
            opencl_c_version: dev.opencl_c_version().cl(op)?.trim().to_string(),
            kind,
            compute_units: dev.max_compute_units().cl(op)?,
            global_mem_bytes: dev.global_mem_size().cl(op)?,
            local_mem_bytes: dev.local_mem_size().cl(op)?,
            max_alloc_bytes: dev.max_mem_alloc_size().cl(op)?,
            max_work_group_size: dev.max_work_group_size().cl(op)?,
            max_work_item_sizes: dev.max_work_item_sizes().cl(op)?,
            max_parameter_bytes: dev.max_parameter_size().cl(op)?,
            base_addr_align_bytes: (dev.mem_base_addr_align().cl(op)? as usize / 8).max(1),
            fp16: has("cl_khr_fp16"),
            fp64: has("cl_khr_fp64") || dev.double_fp_config().map(|c| c != 0).unwrap_or(false),
            subgroups: has("cl_khr_subgroups") || has("cl_intel_subgroups"),
            extensions,
        })
    }
}

fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
