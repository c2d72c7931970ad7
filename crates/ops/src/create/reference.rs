//! The host fills: host data made element by element in the dtype's arithmetic.
use super::{fill_by_expr, Arange, Fill, Full};
use crate::base::element::HostData;
use crate::base::layout::checked_numel;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Result};

/// A new host tensor of the description's shape with every element `value`.
pub(super) fn full(desc: &Full) -> Result<Tensor> {
    let n = checked_numel("full", &desc.shape, desc.dtype.size())?;
    Ok(Tensor::from_host_data(
        HostData::try_filled(desc.dtype, n, desc.value)?,
        &desc.shape,
    ))
}

/// Every element of the host tensor `desc.out` set to `value` in place (the expression path).
pub(super) fn fill_(desc: &Fill) -> Result<()> {
    fill_by_expr(&desc.out, desc.value)
}

/// `start + i * step` for i below `n`: in f64 for f64, wrapping i32/u32 for the integers, f32
/// for the other floats (as the kernel computes them).
pub(super) fn arange(desc: &Arange) -> Result<Tensor> {
    let &Arange {
        start,
        step,
        n,
        dtype,
    } = desc;
    let data = match dtype {
        DType::F64 => HostData::try_from_fn(dtype, n, |i| start + i as f64 * step)?,
        DType::I32 => HostData::try_from_fn(dtype, n, |i| {
            (start as i64 as i32).wrapping_add((i as i32).wrapping_mul(step as i64 as i32)) as f64
        })?,
        DType::U32 => HostData::try_from_fn(dtype, n, |i| {
            (start as i64 as u32).wrapping_add((i as u32).wrapping_mul(step as i64 as u32)) as f64
        })?,
        _ => HostData::try_from_fn(dtype, n, |i| (start as f32 + i as f32 * step as f32) as f64)?,
    };
    Ok(Tensor::from_host_data(data, &[n]))
}
