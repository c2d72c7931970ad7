//! Accumulator helpers shared by the kernels of every family: the dtype they accumulate in, scalars passed in it, and row work-group sizes.
use crate::base::axis::pow2_floor;
use netcl_core_devices::{DType, Result};
use netcl_kernels::Kernel;

/// The dtype kernels accumulate in for a float `dtype` (f32 for f32/f16/bf16, f64 for f64); row
/// statistics (logsumexp, mean, rstd) and losses are returned in it.
pub fn acc_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// Work-group size for rows of `n` elements under the kernel's limit (a power of two, 64..=256).
pub(crate) fn row_group(k: &Kernel, n: usize) -> usize {
    n.next_power_of_two()
        .clamp(64, 256)
        .min(pow2_floor(k.max_work_group_size()))
}
/// Set the next kernel argument to `value` in the kernels' accumulator type (`ACC`) for `dtype`.
pub(crate) fn arg_acc(k: &mut Kernel, dtype: DType, value: f64) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => k.arg(&(value as f32)),
        DType::F64 => k.arg(&value),
        // Through i64 so that negative values wrap (as the host does) instead of saturating.
        DType::I32 => k.arg(&(value as i64 as i32)),
        DType::U32 => k.arg(&(value as i64 as u32)),
    }
    .map(|_| ())
}
