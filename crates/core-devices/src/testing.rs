//! Device lists for test suites: every device present, with `NETCL_REQUIRE_OPENCL=1` making a missing OpenCL device an error.
use crate::{Config, Device, Error, Result};

fn require_opencl() -> bool {
    Config::get().require_opencl
}

/// Test processes build PoCL's kernels without LLVM's optimisations unless the user set
/// `POCL_EXTRA_BUILD_FLAGS` (even to nothing): the tests' tiny shapes spend most of their time
/// compiling kernel variants (the workspace's tests took 34 minutes on 2 cores with the
/// optimiser, about 15 without); results are the same. Other OpenCL drivers ignore the variable.
fn pocl_fast_builds() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("POCL_EXTRA_BUILD_FLAGS").is_none() {
            std::env::set_var("POCL_EXTRA_BUILD_FLAGS", "-cl-opt-disable");
        }
    });
}

/// The OpenCL devices to test on. With none present this says why on stderr and returns an empty
/// list, unless `NETCL_REQUIRE_OPENCL=1`, which makes it an error.
pub fn opencl_test_devices() -> Result<Vec<Device>> {
    pocl_fast_builds();
    let devices = Device::opencl_devices();
    if devices.is_empty() {
        if require_opencl() {
            return Err(Error::device(
                "test devices",
                format!(
                    "NETCL_REQUIRE_OPENCL=1 but no OpenCL device is present: {}",
                    Device::opencl_status()
                ),
            ));
        }
        // Written to the process's stderr, past the test harness's output capture, once.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "netcl: no OpenCL device, OpenCL part of the tests skipped ({})",
                Device::opencl_status()
            );
        });
    }
    Ok(devices)
}

/// The host and every OpenCL device (see [`opencl_test_devices`]).
pub fn test_devices() -> Result<Vec<Device>> {
    let mut all = vec![Device::host()];
    all.extend(opencl_test_devices()?);
    Ok(all)
}
