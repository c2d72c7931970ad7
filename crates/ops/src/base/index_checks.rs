//! Range checks of I32 index tensors (host ones, and device ones small enough to read back) shared by the index and shape families.
use crate::base::dispatch::{backend, Backend};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};

/// Device index tensors with at most this many elements are read back and range-checked before a
/// launch; larger ones are trusted (see the module docs for what kernels do with bad indices).
pub const INDEX_CHECK_LIMIT: usize = 1024;

/// The indices of `idx` in row-major order when they are on the host or few enough to read back
/// (never while a graph is captured on the device: its kernels' error record reports instead).
pub(crate) fn readable_indices(idx: &Tensor) -> Result<Option<Vec<i32>>> {
    if backend(&idx.device) == Backend::Host
        || (idx.numel() <= INDEX_CHECK_LIMIT && !netcl_core_memory::capture::capturing(&idx.device))
    {
        return Ok(Some(idx.to_vec::<i32>()?));
    }
    Ok(None)
}
/// Error naming `op` when an index (host or small device tensor) is outside `[0, bound)`.
pub(crate) fn check_indices(op: &str, idx: &Tensor, bound: usize, what: &str) -> Result<()> {
    if let Some(v) = readable_indices(idx)? {
        if let Some((pos, &i)) = v
            .iter()
            .enumerate()
            .find(|(_, &i)| i < 0 || i as usize >= bound)
        {
            return Err(Error::invalid(
                op,
                format!(
                    "index {i} at position {pos} of indices {:?} is out of range for {what} (size {bound})",
                    idx.shape
                ),
            ));
        }
    }
    Ok(())
}
