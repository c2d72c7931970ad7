//! The OpenCL fills: copy.cl's `fill` (a value in every element) and `arange` (start + i * step).
use super::{Arange, Fill, Full};
use crate::base::acc::arg_acc;
use crate::base::launch::{launch_1d, program_for};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::COPY;

/// A new tensor of the description's shape with every element `value`: one `fill` kernel.
pub(super) fn full(desc: &Full, device: &Device) -> Result<Tensor> {
    let out = Tensor::alloc(&desc.shape, desc.dtype, device)?;
    fill(&out, desc.value)?;
    Ok(out)
}

/// Every element of the dense tensor `desc.out` (contiguous from its storage's first element)
/// set to `value` in place: one `fill` kernel, none when it is empty.
pub(super) fn fill_(desc: &Fill, _device: &Device) -> Result<()> {
    desc.out.mark_modified();
    if desc.out.numel() == 0 {
        return Ok(());
    }
    fill(&desc.out, desc.value)
}

/// One `fill` launch over the `numel` elements of `out` from element 0 of its storage.
fn fill(out: &Tensor, value: f64) -> Result<()> {
    let program = program_for(&out.device, &COPY, out.dtype)?;
    launch_1d(&program, "fill", out.numel(), |k| {
        k.arg_mem(out.mem()?)?;
        arg_acc(k, out.dtype, value)
    })
}

/// `start + i * step` for i below `n`, in the dtype's arithmetic: one `arange` kernel.
pub(super) fn arange(desc: &Arange, device: &Device) -> Result<Tensor> {
    let &Arange {
        start,
        step,
        n,
        dtype,
    } = desc;
    let out = Tensor::alloc(&[n], dtype, device)?;
    let program = program_for(device, &COPY, dtype)?;
    launch_1d(&program, "arange", n, |k| {
        k.arg_mem(out.mem()?)?;
        arg_acc(k, dtype, start)?;
        arg_acc(k, dtype, step)
    })?;
    Ok(out)
}
