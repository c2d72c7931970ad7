//! Argument checks shared by the ops: devices, dtypes and 32-bit kernel indices, with errors naming the op and the operands.
pub(crate) use crate::base::layout::u32_arg;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// Error unless `other` (named `what`) is on the device of `input`.
pub(crate) fn check_device(op: &str, input: &Tensor, other: &Tensor, what: &str) -> Result<()> {
    if input.device != other.device {
        return Err(Error::device(
            op,
            format!(
                "{what} {:?} is on {} but the input {:?} is on {}",
                other.shape, other.device, input.shape, input.device
            ),
        ));
    }
    Ok(())
}

/// Error unless both tensors are on the same device.
pub(crate) fn same_device(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    check_device(op, a, b, "operand")
}

/// Error unless `t` (named `what`) has a float dtype.
pub(crate) fn check_float(op: &str, t: &Tensor, what: &str) -> Result<()> {
    if !t.dtype.is_float() {
        return Err(Error::dtype(
            op,
            format!(
                "{what} is {} {:?}; {op} needs a float dtype",
                t.dtype, t.shape
            ),
        ));
    }
    Ok(())
}

/// Error unless `t` (named `what`) has dtype `want`.
pub(crate) fn check_dtype(op: &str, t: &Tensor, what: &str, want: DType) -> Result<()> {
    if t.dtype != want {
        return Err(Error::dtype(
            op,
            format!("{what} is {} {:?}; {op} needs {want}", t.dtype, t.shape),
        ));
    }
    Ok(())
}

/// Error unless `idx` holds I32 indices.
pub(crate) fn need_i32(op: &str, idx: &Tensor) -> Result<()> {
    check_dtype(op, idx, "indices", DType::I32)
}

/// Error unless both tensors have the same dtype.
pub(crate) fn same_dtype(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(Error::dtype(
            op,
            format!(
                "operands are {} {:?} and {} {:?}",
                a.dtype, a.shape, b.dtype, b.shape
            ),
        ));
    }
    Ok(())
}

/// Error unless every tensor is a float tensor of the first one's dtype on its device.
pub(crate) fn same_float(op: &str, ts: &[&Tensor]) -> Result<()> {
    let Some(first) = ts.first() else {
        return Ok(());
    };
    for t in ts {
        same_device(op, first, t)?;
        if t.dtype != first.dtype || !t.dtype.is_float() {
            return Err(Error::dtype(
                op,
                format!(
                    "operands {}; {op} needs one float dtype",
                    ts.iter()
                        .map(|t| format!("{} {:?}", t.dtype, t.shape))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    Ok(())
}
