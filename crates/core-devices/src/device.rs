//! Device handles: discovery of every OpenCL device plus the host, selection, one context, a compute queue, a copy queue and a relay queue each.
use crate::info::{DeviceInfo, DeviceKind};
use crate::{ClResultExt, Error, Result};
use opencl3::command_queue::{CommandQueue, CL_QUEUE_PROFILING_ENABLE};
use opencl3::context::Context;
use opencl3::device::{Device as ClDeviceId, CL_DEVICE_TYPE_ALL};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// An OpenCL device with its one context, its in-order compute queue, and two more in-order
/// queues for transfers.
pub struct ClDevice {
    pub id: ClDeviceId,
    pub context: Context,
    /// Every kernel and ordinary copy runs here, in order.
    pub queue: CommandQueue,
    /// A second in-order queue for transfers that should overlap the compute queue's kernels
    /// (gradient buckets of data-parallel training). Work on it is ordered against `queue` only
    /// through events (a marker on one queue, waited on by the other).
    pub copy_queue: CommandQueue,
    /// A third in-order queue, for the collectives' relay (netcl-distributed): its host-to-device
    /// copies run here while its device-to-host copies run on `copy_queue`, so both directions
    /// of the bus are busy at once.
    pub relay_queue: CommandQueue,
    /// Platform index and device index within the platform (`opencl:P:D`).
    pub platform_index: usize,
    pub device_index: usize,
    /// Whether the queue has CL_QUEUE_PROFILING_ENABLE (event timestamps for netcl-profiling).
    pub profiling: bool,
}

enum Backend {
    Host,
    OpenCl(ClDevice),
}

struct Inner {
    ordinal: usize,
    info: DeviceInfo,
    backend: Backend,
}

/// A cheap, clonable handle to one device: the host, or one OpenCL device.
#[derive(Clone)]
pub struct Device(Arc<Inner>);

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.0.ordinal == other.0.ordinal
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.label())
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Everything discovered in this process: the host first, then every OpenCL device.
pub struct Registry {
    devices: Vec<Device>,
    /// Why no OpenCL device is present, when none is.
    opencl_status: String,
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();

fn registry() -> &'static Registry {
    REGISTRY.get_or_init(discover)
}

fn discover() -> Registry {
    let mut devices = vec![Device(Arc::new(Inner {
        ordinal: 0,
        info: DeviceInfo::host(),
        backend: Backend::Host,
    }))];
    let opencl_status = match opencl3::platform::get_platforms() {
        Err(e) => format!("OpenCL unavailable: {}", crate::cl_code_name(e.0)),
        Ok(platforms) if platforms.is_empty() => {
            "OpenCL loader found but no platform is installed".into()
        }
        Ok(platforms) => {
            let mut problems = Vec::new();
            for (pi, platform) in platforms.iter().enumerate() {
                let ids = match platform.get_devices(CL_DEVICE_TYPE_ALL) {
                    Ok(ids) => ids,
                    Err(e) => {
                        problems.push(format!("platform {pi}: {}", crate::cl_code_name(e.0)));
                        continue;
                    }
                };
                for (di, raw) in ids.into_iter().enumerate() {
                    let ordinal = devices.len();
                    match open_device(platform, raw, pi, di) {
                        Ok((info, cl)) => devices.push(Device(Arc::new(Inner {
                            ordinal,
                            info,
                            backend: Backend::OpenCl(cl),
                        }))),
                        Err(e) => problems.push(format!("opencl:{pi}:{di}: {e}")),
                    }
                }
            }
            if devices.len() == 1 {
                format!(
                    "OpenCL platforms found but no usable device ({})",
                    problems.join("; ")
                )
            } else {
                for p in &problems {
                    log::warn!("skipped OpenCL device {p}");
                }
                String::new()
            }
        }
    };
    Registry {
        devices,
        opencl_status,
    }
}

fn open_device(
    platform: &opencl3::platform::Platform,
    raw: opencl3::types::cl_device_id,
    platform_index: usize,
    device_index: usize,
) -> Result<(DeviceInfo, ClDevice)> {
    let id = ClDeviceId::new(raw);
    let info = DeviceInfo::query(platform, &id)?;
    let context = Context::from_device(&id).cl("clCreateContext")?;
    // Queues always profile, so a profiler session (netcl-profiling) can start at any time;
    // launches ask for no event while the profiler is off. benches/ops.rs `queue_profiling`
    // measures the property's enqueue cost. A driver that refuses it gets a plain queue.
    let (queue, profiling) = match CommandQueue::create_default_with_properties(
        &context,
        CL_QUEUE_PROFILING_ENABLE,
        0,
    ) {
        Ok(q) => (q, true),
        Err(e) => {
            log::warn!(
                "{}: no profiling queue ({}); kernel device times unavailable",
                info.name,
                crate::cl_code_name(e.0)
            );
            let q = CommandQueue::create_default_with_properties(&context, 0, 0)
                .cl("clCreateCommandQueue")?;
            (q, false)
        }
    };
    let props = if profiling {
        CL_QUEUE_PROFILING_ENABLE
    } else {
        0
    };
    let copy_queue = CommandQueue::create_default_with_properties(&context, props, 0)
        .cl("clCreateCommandQueue(copy)")?;
    let relay_queue = CommandQueue::create_default_with_properties(&context, props, 0)
        .cl("clCreateCommandQueue(relay)")?;
    Ok((
        info,
        ClDevice {
            id,
            context,
            queue,
            copy_queue,
            relay_queue,
            platform_index,
            device_index,
            profiling,
        },
    ))
}

/// A device together with the reason it was chosen.
pub struct Selection {
    pub device: Device,
    pub reason: String,
}

impl Device {
    /// Every device in this process: the host first, then each OpenCL device.
    pub fn all() -> Vec<Device> {
        registry().devices.clone()
    }

    /// The OpenCL devices only.
    pub fn opencl_devices() -> Vec<Device> {
        registry()
            .devices
            .iter()
            .filter(|d| d.is_opencl())
            .cloned()
            .collect()
    }

    /// Why there is no OpenCL device ("" when there is one).
    pub fn opencl_status() -> &'static str {
        &registry().opencl_status
    }

    /// The host device (ndarray), always present.
    pub fn host() -> Device {
        registry().devices[0].clone()
    }

    /// The best device: `NETCL_DEVICE` ([`crate::Config::device`]) if set, else a GPU, else any OpenCL device, else the host.
    pub fn best() -> Result<Device> {
        let sel = Device::select_best()?;
        log::info!("netcl: using {} ({})", sel.device, sel.reason);
        Ok(sel.device)
    }

    /// Like [`Device::best`], also telling why the device was chosen.
    pub fn select_best() -> Result<Selection> {
        let spec = crate::Config::get().device.clone();
        select_best_from(
            &registry().devices,
            spec.as_deref(),
            &registry().opencl_status,
        )
    }

    /// Look a device up by spec: `host`, `cpu`, `gpu`, `gpu:1`, `cpu:0`, `opencl:P:D`, `opencl:N`.
    pub fn parse(spec: &str) -> Result<Device> {
        find(&registry().devices, spec)
    }

    /// Position in [`Device::all`]; stable for the life of the process.
    pub fn ordinal(&self) -> usize {
        self.0.ordinal
    }

    /// What the device reports (name, memory, work-group limits, fp64, ...).
    pub fn info(&self) -> &DeviceInfo {
        &self.0.info
    }

    /// Host, CPU, GPU or accelerator.
    pub fn kind(&self) -> DeviceKind {
        self.0.info.kind
    }

    /// The host device (ndarray), not OpenCL.
    pub fn is_host(&self) -> bool {
        matches!(self.0.backend, Backend::Host)
    }

    /// An OpenCL device.
    pub fn is_opencl(&self) -> bool {
        !self.is_host()
    }

    /// The OpenCL side of this device, or an error naming `op` when it is the host.
    pub fn cl(&self, op: &str) -> Result<&ClDevice> {
        match &self.0.backend {
            Backend::OpenCl(c) => Ok(c),
            Backend::Host => Err(Error::device(op, "the host device has no OpenCL context")),
        }
    }

    /// The spec that selects this device: `host` or `opencl:P:D`.
    pub fn spec(&self) -> String {
        match &self.0.backend {
            Backend::Host => "host".into(),
            Backend::OpenCl(c) => format!("opencl:{}:{}", c.platform_index, c.device_index),
        }
    }

    /// `opencl:0:1 (gpu) NVIDIA H200`.
    pub fn label(&self) -> String {
        match &self.0.backend {
            Backend::Host => "host".into(),
            Backend::OpenCl(_) => format!(
                "{} ({}) {}",
                self.spec(),
                self.kind().name(),
                self.0.info.name
            ),
        }
    }

    /// Wait until every command queued on this device has finished.
    pub fn synchronize(&self) -> Result<()> {
        match &self.0.backend {
            Backend::Host => Ok(()),
            Backend::OpenCl(c) => {
                c.queue.finish().cl("clFinish")?;
                c.copy_queue.finish().cl("clFinish(copy)")?;
                c.relay_queue.finish().cl("clFinish(relay)")
            }
        }
    }
}

fn select_best_from(
    devices: &[Device],
    spec: Option<&str>,
    opencl_status: &str,
) -> Result<Selection> {
    if let Some(spec) = spec {
        let device = find(devices, spec)?;
        return Ok(Selection {
            device,
            reason: format!("NETCL_DEVICE={spec}"),
        });
    }
    if let Some(d) = devices.iter().find(|d| d.kind() == DeviceKind::Gpu) {
        return Ok(Selection {
            device: d.clone(),
            reason: "first OpenCL GPU".into(),
        });
    }
    if let Some(d) = devices.iter().find(|d| d.is_opencl()) {
        return Ok(Selection {
            device: d.clone(),
            reason: "no OpenCL GPU; first other OpenCL device".into(),
        });
    }
    let why = if opencl_status.is_empty() {
        "no OpenCL device"
    } else {
        opencl_status
    };
    Ok(Selection {
        device: devices[0].clone(),
        reason: format!("falling back to the host device: {why}"),
    })
}

fn find(devices: &[Device], spec: &str) -> Result<Device> {
    let s = spec.trim().to_ascii_lowercase();
    let not_found = || Error::DeviceNotFound {
        requested: spec.to_string(),
        available: devices.iter().map(|d| d.label()).collect(),
    };
    let parts: Vec<&str> = s.split(':').collect();
    let index = |p: Option<&&str>| -> Result<usize> {
        match p {
            None => Ok(0),
            Some(x) => x.parse::<usize>().map_err(|_| not_found()),
        }
    };
    let found = match parts[0] {
        "host" if parts.len() == 1 => devices.first().cloned(),
        "gpu" | "cpu" | "accelerator" if parts.len() <= 2 => {
            let n = index(parts.get(1))?;
            devices
                .iter()
                .filter(|d| d.is_opencl() && d.kind().name() == parts[0])
                .nth(n)
                .cloned()
        }
        "opencl" if parts.len() == 2 => {
            let n = index(parts.get(1))?;
            devices.iter().filter(|d| d.is_opencl()).nth(n).cloned()
        }
        "opencl" if parts.len() == 3 => {
            let (p, d) = (index(parts.get(1))?, index(parts.get(2))?);
            devices
                .iter()
                .find(|x| {
                    x.cl("")
                        .map(|c| c.platform_index == p && c.device_index == d)
                        .unwrap_or(false)
                })
                .cloned()
        }
        _ => None,
    };
    found.ok_or_else(not_found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_always_first_and_selectable() {
        let all = Device::all();
        assert!(all[0].is_host());
        assert_eq!(find(&all, "host").unwrap(), all[0]);
        assert_eq!(find(&all, " HOST ").unwrap(), all[0]);
    }

    #[test]
    fn unknown_device_lists_the_available_ones() {
        let all = Device::all();
        let err = find(&all, "gpu:7").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("gpu:7") && msg.contains("host"), "{msg}");
        assert!(matches!(
            find(&all, "tpu").unwrap_err(),
            Error::DeviceNotFound { .. }
        ));
        assert!(matches!(
            find(&all, "opencl:x:1").unwrap_err(),
            Error::DeviceNotFound { .. }
        ));
    }

    #[test]
    fn selection_order_and_override() {
        let all = Device::all();
        let sel = select_best_from(&all, None, Device::opencl_status()).unwrap();
        match all.iter().find(|d| d.kind() == DeviceKind::Gpu) {
            Some(gpu) => assert_eq!(&sel.device, gpu),
            None => match all.iter().find(|d| d.is_opencl()) {
                Some(d) => assert_eq!(&sel.device, d),
                None => {
                    assert!(sel.device.is_host());
                    assert!(sel.reason.contains("host"));
                }
            },
        }
        let host = select_best_from(&all, Some("host"), "").unwrap();
        assert!(host.device.is_host() && host.reason.contains("NETCL_DEVICE"));
        // Every device is reachable through the spec it reports.
        for d in &all {
            assert_eq!(&find(&all, &d.spec()).unwrap(), d);
        }
        // Host-only registries fall back with a reason.
        let sel = select_best_from(&all[..1], None, "no OpenCL loader").unwrap();
        assert!(sel.device.is_host() && sel.reason.contains("no OpenCL loader"));
    }
}
