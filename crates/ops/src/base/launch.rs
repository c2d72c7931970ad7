//! How ops reach kernels: one program per (device, source, dtype), one-dimensional launches.
use netcl_core_devices::{DType, Device, DeviceKind, Error, Result};
use netcl_kernels::{program, Kernel, Program, Source, GROUP_1D};
use std::sync::Arc;

/// The program of `source` specialised for `dtype` on `device`.
pub(crate) fn program_for(device: &Device, source: &Source, dtype: DType) -> Result<Arc<Program>> {
    program(device, source, dtype.build_option())
}

/// Largest kernel extent whose taps a CPU device's program unrolls.
const UNROLLED_TAPS: usize = 8;

/// The program of `source` for `dtype` running a sliding window of `kernel` taps (conv,
/// pooling): on CPU devices built for that kernel size (-DWIN_K0/-DWIN_K1: the tap loops unroll,
/// so the work-items run as vector lanes), elsewhere one program for every size.
pub(crate) fn window_program(
    device: &Device,
    source: &Source,
    dtype: DType,
    kernel: (usize, usize),
) -> Result<Arc<Program>> {
    if device.kind() != DeviceKind::Cpu || kernel.0.max(kernel.1) > UNROLLED_TAPS {
        return program_for(device, source, dtype);
    }
    let taps = format!(" -DWIN_K0={}u -DWIN_K1={}u", kernel.0, kernel.1);
    program(device, source, &(dtype.build_option().to_string() + &taps))
}

/// Launch kernel `name` over `n` work-items: `args` sets the leading arguments, then `n` (u32)
/// is appended as the last one.
pub(crate) fn launch_1d(
    program: &Arc<Program>,
    name: &str,
    n: usize,
    args: impl FnOnce(&mut Kernel) -> Result<()>,
) -> Result<()> {
    launch_1d_over(program, name, n, n, args)
}

/// Like `launch_1d`, over `items` work-items for `n` elements (kernels taking several elements
/// per work-item); `n` (u32) is appended as the last argument.
pub(crate) fn launch_1d_over(
    program: &Arc<Program>,
    name: &str,
    items: usize,
    n: usize,
    args: impl FnOnce(&mut Kernel) -> Result<()>,
) -> Result<()> {
    let n32 = crate::base::layout::u32_arg(name, "elements", n)?;
    let mut k = Kernel::new(program, name)?;
    args(&mut k)?;
    k.arg(&n32)?;
    let group = GROUP_1D.min(k.max_work_group_size());
    k.launch(&[items], &[group])
}

/// Launches `k` (arguments set) over `groups` work-groups of `group` work-items; an error naming
/// `op` when the grid does not fit the 32-bit index.
pub(crate) fn launch_groups(op: &str, k: &mut Kernel, groups: usize, group: usize) -> Result<()> {
    let global = groups
        .checked_mul(group)
        .filter(|&g| g <= u32::MAX as usize)
        .ok_or_else(|| {
            Error::shape(
                op,
                format!("{groups} work-groups of {group} exceed the kernel grid"),
            )
        })?;
    k.launch(&[global], &[group])
}
