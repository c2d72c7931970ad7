//! The OpenCL indexing kernels of kernels/index.cl: gather_rows, scatter_add (one work-item per output element) and, through sorted_rows.rs, the sorted whole-row scatter-add.
use super::sorted_rows::{as_matrix, sorted_row_add};
use super::{Gather, RowAdd, ScatterAdd};
use crate::base::checks::u32_arg;
use crate::base::device_errors::{code_of, record_arg};
use crate::base::fastdiv::Div;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::{check_reach, KernelLayout, MAX_DIMS};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Error, Result};
use netcl_kernels::sources::INDEX;

/// A gather on `device`: one `gather_rows` kernel over the output (none when it is empty); an
/// out-of-range index reads 0 and is recorded in the device's error record.
pub(super) fn gather(desc: &Gather, device: &Device) -> Result<Tensor> {
    let Gather { src, idx, plan } = desc;
    let op = plan.op;
    let out = Tensor::alloc(&plan.shape, src.dtype, device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    check_reach(op, &src.shape, &src.strides, src.offset)?;
    let layout = KernelLayout::new(
        op,
        &plan.shape,
        &[
            (&out.strides, 0),
            (&plan.src_strides, src.offset),
            (&plan.idx_strides, idx.offset),
        ],
    )?;
    let (stride, bound) = (
        u32_arg(op, "stride", plan.stride)?,
        u32_arg(op, "size", plan.bound)?,
    );
    let program = program_for(device, &INDEX, src.dtype)?;
    launch_1d(&program, "gather_rows", out.numel(), |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(src.mem()?)?
            .arg_mem(idx.mem()?)?
            .arg(&stride)?
            .arg(&bound)?
            .arg(&layout)?;
        k.arg_mem(record_arg(device)?)?.arg(&code_of(op))?;
        Ok(())
    })?;
    Ok(out)
}

/// `ScatterLayout` of kernels/index.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ScatterLayout {
    ndim: u32,
    dim: u32,
    zero_init: u32,
    shape: [u32; MAX_DIMS],
    x_stride: [u32; MAX_DIMS],
    idx_shape: [u32; MAX_DIMS],
    idx_stride: [u32; MAX_DIMS],
    src_stride: [u32; MAX_DIMS],
    x_offset: u32,
    idx_offset: u32,
    src_offset: u32,
    /// The output shape as divisors.
    div: [Div; MAX_DIMS],
}

/// A scatter-add on `device`: one `scatter_add` kernel over the output (none when it is empty),
/// each work-item scanning the index entries along the indexed dim in ascending order; an
/// out-of-range index adds nothing and is recorded in the device's error record.
pub(super) fn scatter_add(desc: &ScatterAdd, device: &Device) -> Result<Tensor> {
    let ScatterAdd { x, idx, src, plan } = desc;
    let op = plan.op;
    let dtype = src.dtype;
    let out = Tensor::alloc(&plan.shape, dtype, device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let nd = plan.shape.len();
    if nd > MAX_DIMS {
        return Err(Error::shape(
            op,
            format!("{:?} has more than {MAX_DIMS} dims", plan.shape),
        ));
    }
    check_reach(op, &plan.idx_shape, &plan.idx_strides, idx.offset)?;
    check_reach(op, &plan.idx_shape, &plan.src_strides, src.offset)?;
    let mut l = ScatterLayout {
        ndim: nd as u32,
        dim: plan.dim as u32,
        zero_init: x.is_none() as u32,
        shape: [1; MAX_DIMS],
        x_stride: [0; MAX_DIMS],
        idx_shape: [1; MAX_DIMS],
        idx_stride: [0; MAX_DIMS],
        src_stride: [0; MAX_DIMS],
        x_offset: 0,
        idx_offset: u32_arg(op, "offset", idx.offset)?,
        src_offset: u32_arg(op, "offset", src.offset)?,
        div: [Div::new(1); MAX_DIMS],
    };
    if let Some(x) = x {
        check_reach(op, &x.shape, &x.strides, x.offset)?;
        l.x_offset = u32_arg(op, "offset", x.offset)?;
        for d in 0..nd {
            l.x_stride[d] = u32_arg(op, "stride", x.strides[d])?;
        }
    }
    for d in 0..nd {
        l.shape[d] = u32_arg(op, "size", plan.shape[d])?;
        l.div[d] = Div::new(l.shape[d]);
        l.idx_shape[d] = u32_arg(op, "size", plan.idx_shape[d])?;
        l.idx_stride[d] = u32_arg(op, "stride", plan.idx_strides[d])?;
        l.src_stride[d] = u32_arg(op, "stride", plan.src_strides[d])?;
    }
    let program = program_for(device, &INDEX, dtype)?;
    let x_mem = match x {
        Some(x) => x.mem()?,
        None => out.mem()?,
    };
    launch_1d(&program, "scatter_add", out.numel(), |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(x_mem)?
            .arg_mem(idx.mem()?)?
            .arg_mem(src.mem()?)?
            .arg(&l)?;
        k.arg_mem(record_arg(device)?)?.arg(&code_of(op))?;
        Ok(())
    })?;
    Ok(out)
}

/// A whole-row scatter-add on an OpenCL device: the indices sorted, then one kernel over the
/// output (`sorted_rows.rs`). Ids of another rank than 1 (embedding) and the grad rows they pick
/// are seen as a list and a matrix first (views where the strides allow, else a copy).
pub(super) fn row_add(desc: &RowAdd, _device: &Device) -> Result<Tensor> {
    let (op, x, idx) = (desc.op, desc.x.as_ref(), &desc.idx);
    if idx.ndim() == 1 {
        return sorted_row_add(op, x, idx, &desc.src, &desc.shape);
    }
    let src = as_matrix(&desc.src, idx.ndim())?;
    let ids = as_matrix(idx, idx.ndim())?;
    let ids = ids.view_of(vec![idx.numel()], vec![ids.strides[0]], ids.offset);
    sorted_row_add(op, x, &ids, &src, &desc.shape)
}
