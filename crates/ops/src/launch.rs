//! How ops reach kernels: one program per (device, source, dtype), one-dimensional launches.
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::{program, Kernel, Program, Source, GROUP_1D};
use std::sync::Arc;

/// The program of `source` specialised for `dtype` on `device`.
pub(crate) fn program_for(device: &Device, source: &Source, dtype: DType) -> Result<Arc<Program>> {
    program(device, source, dtype.build_option())
}

/// Launch kernel `name` over `n` work-items: `args` sets the leading arguments, then `n` (u32)
/// is appended as the last one.
pub(crate) fn launch_1d(
    program: &Arc<Program>,
    name: &str,
    n: usize,
    args: impl FnOnce(&mut Kernel) -> Result<()>,
) -> Result<()> {
    let n32 = u32::try_from(n).map_err(|_| {
        netcl_core_devices::Error::shape(
            name,
            format!("{n} work-items exceed the 32-bit index of kernel {name}"),
        )
    })?;
    let mut k = Kernel::new(program, name)?;
    args(&mut k)?;
    k.arg(&n32)?;
    let group = GROUP_1D.min(k.max_work_group_size());
    k.launch(&[n], &[group])
}
