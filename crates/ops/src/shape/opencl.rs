//! The OpenCL shape ops: shape.cl's one_hot, pad_constant, tri_select and tri_mask kernels, and copy.cl's strided copies for concat.
use super::{Concat, OneHot, Pad, Tri, TriMask};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::copy::strided_copy;
use crate::base::fastdiv::Div;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::check_reach;
use crate::base::layout::{KernelLayout, MAX_DIMS};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Error, Result};
use netcl_kernels::sources::SHAPE;

/// `PadLayout` of kernels/shape.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PadLayout {
    ndim: u32,
    shape: [u32; MAX_DIMS],
    before: [u32; MAX_DIMS],
    in_shape: [u32; MAX_DIMS],
    x_stride: [u32; MAX_DIMS],
    x_offset: u32,
    /// The output shape as divisors.
    div: [Div; MAX_DIMS],
}

/// One-hot rows on `device`: one kernel over the output, the ids read with stride 0 along the
/// class dim.
pub(super) fn one_hot(desc: &OneHot, device: &Device) -> Result<Tensor> {
    let op = "one_hot";
    let OneHot {
        ids,
        classes,
        dtype,
        shape,
    } = desc;
    let out = Tensor::alloc(shape, *dtype, device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let mut id_strides = ids.strides.clone();
    id_strides.push(0);
    let layout = KernelLayout::new(op, shape, &[(&out.strides, 0), (&id_strides, ids.offset)])?;
    let c = u32_arg(op, "size", *classes)?;
    let program = program_for(device, &SHAPE, *dtype)?;
    launch_1d(&program, "one_hot", out.numel(), |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(ids.mem()?)?
            .arg(&c)?
            .arg(&layout)?;
        Ok(())
    })?;
    Ok(out)
}

/// The join on `device`: one strided copy per non-empty input into its slice of the output.
pub(super) fn concat(desc: &Concat, device: &Device) -> Result<Tensor> {
    let Concat {
        tensors,
        dim,
        shape,
    } = desc;
    let out = Tensor::alloc(shape, tensors[0].dtype, device)?;
    let mut start = 0;
    for t in tensors {
        let dst = out.narrow(*dim, start, t.shape[*dim])?;
        strided_copy(
            "concat",
            (&out, (&dst.strides, dst.offset)),
            (t, (&t.strides, t.offset)),
            &t.shape,
        )?;
        start += t.shape[*dim];
    }
    Ok(out)
}

/// The padded tensor on `device`: one kernel over the output.
pub(super) fn pad(desc: &Pad, device: &Device) -> Result<Tensor> {
    let op = "pad";
    let Pad {
        x,
        before,
        shape,
        value,
    } = desc;
    let nd = x.ndim();
    let out = Tensor::alloc(shape, x.dtype, device)?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    if nd > MAX_DIMS {
        return Err(Error::shape(
            op,
            format!("{:?} has more than {MAX_DIMS} dims", x.shape),
        ));
    }
    check_reach(op, &x.shape, &x.strides, x.offset)?;
    let mut l = PadLayout {
        ndim: nd as u32,
        shape: [1; MAX_DIMS],
        before: [0; MAX_DIMS],
        in_shape: [1; MAX_DIMS],
        x_stride: [0; MAX_DIMS],
        x_offset: u32_arg(op, "offset", x.offset)?,
        div: [Div::new(1); MAX_DIMS],
    };
    for d in 0..nd {
        l.shape[d] = u32_arg(op, "size", shape[d])?;
        l.div[d] = Div::new(l.shape[d]);
        l.before[d] = u32_arg(op, "size", before[d])?;
        l.in_shape[d] = u32_arg(op, "size", x.shape[d])?;
        l.x_stride[d] = u32_arg(op, "stride", x.strides[d])?;
    }
    let program = program_for(device, &SHAPE, x.dtype)?;
    launch_1d(&program, "pad_constant", n, |k| {
        k.arg_mem(out.mem()?)?.arg_mem(x.mem()?)?.arg(&l)?;
        arg_acc(k, x.dtype, *value)
    })?;
    Ok(out)
}

/// The diagonal's value in the kernels' i32 argument (beyond every index when clamped).
fn diag_arg(diagonal: i64) -> i32 {
    diagonal.clamp(i32::MIN as i64, i32::MAX as i64) as i32
}

/// triu / tril on `device`: one kernel over the tensor.
pub(super) fn tri(desc: &Tri, device: &Device) -> Result<Tensor> {
    let op = desc.op();
    let Tri { x, diagonal, upper } = desc;
    let nd = x.ndim();
    let out = Tensor::alloc(&x.shape, x.dtype, device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let layout = KernelLayout::new(op, &x.shape, &[(&out.strides, 0), (&x.strides, x.offset)])?;
    let (rows, cols) = (x.shape[nd - 2], x.shape[nd - 1]);
    let (r, c) = (u32_arg(op, "size", rows)?, u32_arg(op, "size", cols)?);
    let diag = diag_arg(*diagonal);
    let program = program_for(device, &SHAPE, x.dtype)?;
    launch_1d(&program, "tri_select", out.numel(), |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(x.mem()?)?
            .arg(&r)?
            .arg(&c)?
            .arg(&diag)?
            .arg(&(*upper as u32))?;
        arg_acc(k, x.dtype, 0.0)?;
        k.arg(&layout)?;
        Ok(())
    })?;
    Ok(out)
}

/// A triangular mask on `device`: one kernel.
pub(super) fn tri_mask(desc: &TriMask, device: &Device) -> Result<Tensor> {
    let (dtype, values) = (desc.dtype, desc.values);
    let out = Tensor::alloc(&[desc.rows, desc.cols], dtype, device)?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let c = u32_arg(desc.op, "size", desc.cols)?;
    let diag = diag_arg(desc.diagonal);
    let program = program_for(device, &SHAPE, dtype)?;
    launch_1d(&program, "tri_mask", n, |k| {
        k.arg_mem(out.mem()?)?
            .arg(&c)?
            .arg(&diag)?
            .arg(&(desc.upper as u32))?;
        arg_acc(k, dtype, values.0)?;
        arg_acc(k, dtype, values.1)
    })?;
    Ok(out)
}
