//! Checks and results shared by the normalisations (layer, RMS and batch norm).
use crate::base::acc::acc_dtype;

use crate::base::checks::{check_device, check_dtype};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// Gradients of a normalisation's input and affine parameters.
#[derive(Clone, Debug)]
pub struct NormGrads {
    pub dx: Tensor,
    /// Present when a weight was given.
    pub dweight: Option<Tensor>,
    /// Present when a bias was requested.
    pub dbias: Option<Tensor>,
}

/// Checks an optional affine parameter: x's device and dtype, shape `shape`.
pub(crate) fn check_param(
    op: &str,
    x: &Tensor,
    p: Option<&Tensor>,
    what: &str,
    shape: &[usize],
) -> Result<()> {
    p.map_or(Ok(()), |p| check_operand(op, x, p, what, x.dtype, shape))
}

/// Checks a statistics tensor: x's device, dtype [`acc_dtype`], shape `shape`.
pub(crate) fn check_stat(
    op: &str,
    x: &Tensor,
    s: &Tensor,
    what: &str,
    shape: &[usize],
) -> Result<()> {
    check_operand(op, x, s, what, acc_dtype(x.dtype), shape)
}

pub(crate) fn check_eps(op: &str, eps: f64) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            op,
            format!("eps {eps} must be finite and >= 0"),
        ));
    }
    Ok(())
}

/// Checks an operand of a normalisation of `x`: on x's device, of dtype `dtype`, shaped `shape`.
fn check_operand(
    op: &str,
    x: &Tensor,
    t: &Tensor,
    what: &str,
    dtype: DType,
    shape: &[usize],
) -> Result<()> {
    check_device(op, x, t, what)?;
    check_dtype(op, t, what, dtype)?;
    if t.shape != shape {
        return Err(Error::shape(
            op,
            format!(
                "{what} {:?} does not match {shape:?} for input {:?}",
                t.shape, x.shape
            ),
        ));
    }
    Ok(())
}
