//! Stable sort of 1-D i32 tensors (sorted keys and the permutation): a bitonic network on (key, position) pairs on OpenCL devices (kernels/sort.cl), a stable sort on the host.
mod opencl;
mod reference;
use crate::base::checks::need_i32;
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};

/// A checked sort: `x` is 1-D i32 of at most `i32::MAX` keys; the outputs are the sorted keys
/// and the permutation, new contiguous i32 tensors of x's length.
#[derive(Clone, Debug)]
struct SortStable {
    x: Tensor,
}

impl_op!(SortStable, (Tensor, Tensor), "sort_stable", sort_stable);

impl Tensor {
    /// This 1-D i32 tensor's keys in ascending order and the i32 permutation that sorts them
    /// (`sorted[r] == self[perm[r]]`), equal keys in ascending position: a stable sort, as
    /// `torch.sort(x, stable=True)`. Any stride; the results are contiguous. Deterministic: the
    /// result is the one stable order on every device and run.
    ///
    /// OpenCL: a bitonic network on (key, position) pairs padded to `p`, the next power of two
    /// at least one chunk of `c` pairs (`c = 1024` where the device runs work-groups of 256).
    /// One kernel sorts each chunk in local memory; each further merge stage `k = 2c, 4c, .., p`
    /// runs its strides of a chunk or more as one global pass each and the smaller strides in
    /// one local-memory kernel. Launches: `1 + s(s+3)/2` for `s = log2(p / c)`: 1 up to n = 1024,
    /// 3 at 2048, 6 at 4096, 10 at 8192, 15 at 16384, 28 at 65536 (none for n = 0). Work:
    /// `O(p log^2 p)` compare-exchanges, of which the global passes move `16 p` bytes each.
    pub fn sort_stable(&self) -> Result<(Tensor, Tensor)> {
        let op = "sort_stable";
        need_i32(op, self)?;
        if self.ndim() != 1 {
            return Err(Error::shape(
                op,
                format!("keys must be 1-D, got shape {:?}", self.shape),
            ));
        }
        let n = self.shape[0];
        if n > i32::MAX as usize {
            return Err(Error::shape(
                op,
                format!("{n} keys exceed the i32 positions of the permutation"),
            ));
        }
        dispatch(&self.device, &SortStable { x: self.clone() })
    }

    /// The permutation of [`Tensor::sort_stable`] alone: positions of this 1-D i32 tensor's keys
    /// in ascending order, ties in ascending position (`torch.argsort(x, stable=True)`).
    pub fn argsort_stable(&self) -> Result<Tensor> {
        Ok(self.sort_stable()?.1)
    }
}
