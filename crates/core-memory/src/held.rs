//! Bytes held on a device wherever they are counted: the pool's counters on an OpenCL device, the count of live host tensors on the host.
use crate::host::{host_memory, reset_host_peak};
use crate::pool::Pool;
use netcl_core_devices::{Device, Result};

/// Bytes held on `device` now and the most held at once since the last [`reset_held_peak`]
/// (a pool's `in_use` and `peak`, or the host's [`host_memory`]).
pub fn held(device: &Device) -> Result<(usize, usize)> {
    if device.is_host() {
        return Ok(host_memory());
    }
    let s = Pool::of(device)?.stats();
    Ok((s.in_use, s.peak))
}

/// Restarts `device`'s peak from the bytes held now.
pub fn reset_held_peak(device: &Device) -> Result<()> {
    if device.is_host() {
        reset_host_peak();
    } else {
        Pool::of(device)?.reset_peak();
    }
    Ok(())
}
