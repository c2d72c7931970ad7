//! Host-side views that reference implementations read, and the dense copy kernels read from.
use crate::base::copy::strided_copy;
use crate::base::dispatch::{backend, Backend};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};
use netcl_core_memory::HostBuf;

/// The elements of a host tensor as f64 in row-major order (a counted buffer); `op` names the
/// caller in errors.
pub(crate) fn host_f64(op: &str, t: &Tensor) -> Result<HostBuf<f64>> {
    t.host_view_f64(&t.shape, &t.strides)
        .map_err(|e| named(op, e))
}

/// A host-view error (a tensor without host storage) under the name of the op that met it.
pub(crate) fn named(op: &str, e: Error) -> Error {
    match e {
        Error::Device { msg, .. } => Error::device(op, msg),
        e => e,
    }
}
/// `t` as a contiguous tensor starting at element 0 of its storage (kernels index from 0): `t`
/// itself when it already is, else a copy.
pub(crate) fn dense(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() && t.offset == 0 || backend(&t.device) == Backend::Host {
        return Ok(t.clone());
    }
    let out = Tensor::alloc(&t.shape, t.dtype, &t.device)?;
    if crate::base::transpose::transpose_into(t, &out)? {
        return Ok(out);
    }
    strided_copy(
        "contiguous",
        (&out, (&out.strides, 0)),
        (t, (&t.strides, t.offset)),
        &t.shape,
    )?;
    Ok(out)
}

pub(crate) fn host_vals(t: Option<&Tensor>) -> Result<Option<Vec<f64>>> {
    // Small parameter vectors (norm weights, biases): their f64 copies are not counted.
    t.map(|t| t.to_vec_f64()).transpose()
}
