//! The OpenCL RoPE: one `rope` kernel (rope.cl), a work-item per position and pair index for all heads.
use super::{Rope, RopeStyle};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::{check_reach, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::ROPE;

/// RoPE (or its backward, by `sign`) on an OpenCL device.
pub(super) fn rope(desc: &Rope, device: &Device) -> Result<Tensor> {
    let (op, x, ids, table) = (desc.op, &desc.x, &desc.ids, &desc.table);
    let out = Tensor::alloc(&x.shape, x.dtype, device)?;
    if x.numel() == 0 {
        return Ok(out);
    }
    check_reach(op, &x.shape, &x.strides, x.offset)?;
    let (b, t, h, dh) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    // Work-items over (b, t, pair index); each rotates the pair in every head (one angle).
    let pairs = [b, t, dh / 2];
    let n = b * t * (dh / 2);
    // Pair p starts at element p * step of the head; its partner is `second` elements on.
    let (step, second) = match desc.style {
        RopeStyle::Interleaved => (2, 1),
        RopeStyle::Halves => (1, dh / 2),
    };
    let out_strides = [t * h * dh, h * dh, step];
    let x_strides = [x.strides[0], x.strides[1], x.strides[3] * step];
    let layout = KernelLayout::new(op, &pairs, &[(&out_strides, 0), (&x_strides, x.offset)])?;
    let pos_rows = ids.as_ref().map_or(0, |ids| ids.numel() / t);
    let args = [
        u32_arg(op, "stride", x.strides[3] * second)?,
        u32_arg(op, "stride", second)?,
        u32_arg(op, "stride", x.strides[2])?,
        u32_arg(op, "stride", dh)?,
        u32_arg(op, "size", t)?,
        u32_arg(op, "size", h)?,
        u32_arg(op, "size", dh / 2)?,
        u32_arg(op, "offset", desc.pos_offset)?,
        u32::from(ids.is_some()),
        u32::from(pos_rows > 1),
    ];
    // Without ids the kernel never reads `pos`: any buffer of the device will do.
    let pos_mem = match ids {
        Some(ids) => ids.mem()?,
        None => out.mem()?,
    };
    let table_mem = match table {
        Some(t) => t.mem()?,
        None => out.mem()?,
    };
    let program = program_for(device, &ROPE, x.dtype)?;
    launch_1d(&program, "rope", n, |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(x.mem()?)?
            .arg_mem(pos_mem)?
            .arg_mem(table_mem)?
            .arg(&u32::from(table.is_some()))?;
        for a in &args {
            k.arg(a)?;
        }
        arg_acc(k, x.dtype, desc.theta)?;
        arg_acc(k, x.dtype, desc.sign)?;
        k.arg(&layout)?;
        Ok(())
    })?;
    Ok(out)
}
