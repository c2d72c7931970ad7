//! The OpenCL draws: random.cl's `uniform` and `normal` kernels, four elements (one Philox block) per work-item.
use super::{Dist, Random};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::launch::program_for;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::RANDOM;
use netcl_kernels::{Kernel, GROUP_1D};

/// The draw into a new tensor on `device`: one kernel over `ceil(n / 4)` work-items.
pub(super) fn random(desc: &Random, device: &Device) -> Result<Tensor> {
    let Random {
        shape,
        dist,
        dtype,
        key,
        base,
    } = desc;
    let (dtype, base) = (*dtype, *base);
    let n = desc.numel();
    let out = Tensor::alloc(shape, dtype, device)?;
    let (name, a, b) = match *dist {
        Dist::Uniform { low, high } => ("uniform", low, high),
        Dist::Normal { mean, std } => ("normal", mean, std),
    };
    let n32 = u32_arg(name, "elements", n)?;
    let program = program_for(device, &RANDOM, dtype)?;
    let mut k = Kernel::new(&program, name)?;
    k.arg_mem(out.mem()?)?
        .arg(&key[0])?
        .arg(&key[1])?
        .arg(&(base as u64))?
        .arg(&((base >> 64) as u64))?;
    arg_acc(&mut k, dtype, a)?;
    arg_acc(&mut k, dtype, b)?;
    k.arg(&n32)?;
    let group = GROUP_1D.min(k.max_work_group_size());
    k.launch(&[n.div_ceil(4)], &[group])?;
    Ok(out)
}
