//! Views without copies: reshape, permute/transpose, narrow/slice, broadcast_to, squeeze/unsqueeze.
use crate::base::layout::{broadcast_strides, checked_numel, contiguous_strides, numel};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};

impl Tensor {
    pub(crate) fn view_of(&self, shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            shape,
            strides,
            offset,
            dtype: self.dtype,
            device: self.device.clone(),
        }
    }

    pub(crate) fn check_dim(&self, op: &str, dim: usize) -> Result<()> {
        if dim >= self.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for shape {:?}", self.shape),
            ));
        }
        Ok(())
    }

    /// The same elements in `shape`: a view when contiguous, else a contiguous copy.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if checked_numel("reshape", shape, 1)? != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape {:?} ({} elements) to {shape:?} ({} elements)",
                    self.shape,
                    self.numel(),
                    numel(shape)
                ),
            ));
        }
        let t = self.contiguous()?;
        Ok(t.view_of(shape.to_vec(), contiguous_strides(shape), t.offset))
    }

    /// Reorder the dims: dim i of the result is dim `dims[i]` of this tensor.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.ndim()];
        if dims.len() != self.ndim()
            || dims
                .iter()
                .any(|&d| d >= self.ndim() || std::mem::replace(&mut seen[d], true))
        {
            return Err(Error::invalid(
                "permute",
                format!(
                    "{dims:?} is not a permutation of the {} dims of {:?}",
                    self.ndim(),
                    self.shape
                ),
            ));
        }
        let shape = dims.iter().map(|&d| self.shape[d]).collect();
        let strides = dims.iter().map(|&d| self.strides[d]).collect();
        Ok(self.view_of(shape, strides, self.offset))
    }

    /// Swap two dims.
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        self.check_dim("transpose", d0)?;
        self.check_dim("transpose", d1)?;
        let mut dims: Vec<usize> = (0..self.ndim()).collect();
        dims.swap(d0, d1);
        self.permute(&dims)
    }

    /// `len` entries of `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let end = start.checked_add(len).ok_or_else(|| {
            Error::invalid(
                "narrow",
                format!(
                    "{start} + {len} overflows for dim {dim} of {:?}",
                    self.shape
                ),
            )
        })?;
        self.slice(dim, start, end, 1)
    }

    /// The concatenation of `tensors` along `dim` as a view, when they already lie side by side
    /// in one storage (one strides, each starting where the one before ends along `dim`, as
    /// narrow views of one tensor do, in order): `None` otherwise, and for fewer than two.
    /// Unlike [`Tensor::concat`], the result shares the pieces' storage.
    pub fn joined(tensors: &[&Tensor], dim: usize) -> Option<Tensor> {
        let (first, rest) = tensors.split_first()?;
        // A stride of 0 along `dim` (a broadcast) would join pieces onto one element.
        if rest.is_empty() || dim >= first.ndim() || first.strides[dim] == 0 {
            return None;
        }
        let mut end = first.offset + first.shape[dim] * first.strides[dim];
        for t in rest {
            let fits = t.shares_storage(first)
                && t.dtype == first.dtype
                && t.strides == first.strides
                && t.offset == end
                && t.ndim() == first.ndim()
                && (0..t.ndim()).all(|d| d == dim || t.shape[d] == first.shape[d]);
            if !fits {
                return None;
            }
            end += t.shape[dim] * t.strides[dim];
        }
        let mut shape = first.shape.clone();
        shape[dim] = tensors.iter().map(|t| t.shape[dim]).sum();
        Some(first.view_of(shape, first.strides.clone(), first.offset))
    }

    /// Entries `start, start + step, ...` below `end` of `dim`.
    pub fn slice(&self, dim: usize, start: usize, end: usize, step: usize) -> Result<Tensor> {
        self.check_dim("slice", dim)?;
        if step == 0 || start > end || end > self.shape[dim] {
            return Err(Error::invalid(
                "slice",
                format!(
                    "{start}..{end} step {step} does not fit dim {dim} of {:?}",
                    self.shape
                ),
            ));
        }
        let mut shape = self.shape.clone();
        let mut strides = self.strides.clone();
        shape[dim] = (end - start).div_ceil(step);
        strides[dim] = strides[dim].saturating_mul(step);
        let offset = if shape[dim] == 0 {
            self.offset
        } else {
            self.offset + start * self.strides[dim]
        };
        Ok(self.view_of(shape, strides, offset))
    }

    /// This tensor seen as `shape` by NumPy broadcasting (repeated dims have stride 0).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        checked_numel("broadcast_to", shape, 1).map_err(|_| {
            Error::shape(
                "broadcast_to",
                format!(
                    "cannot broadcast {:?} to {shape:?}: too many elements",
                    self.shape
                ),
            )
        })?;
        let strides = broadcast_strides("broadcast_to", &self.shape, &self.strides, shape)?;
        Ok(self.view_of(shape.to_vec(), strides, self.offset))
    }

    /// Remove `dim`, which must have size 1.
    pub fn squeeze(&self, dim: usize) -> Result<Tensor> {
        self.check_dim("squeeze", dim)?;
        if self.shape[dim] != 1 {
            return Err(Error::shape(
                "squeeze",
                format!(
                    "dim {dim} of {:?} has size {}, not 1",
                    self.shape, self.shape[dim]
                ),
            ));
        }
        let (mut shape, mut strides) = (self.shape.clone(), self.strides.clone());
        shape.remove(dim);
        strides.remove(dim);
        Ok(self.view_of(shape, strides, self.offset))
    }

    /// Remove every dim of size 1.
    pub fn squeeze_all(&self) -> Tensor {
        let keep: Vec<usize> = (0..self.ndim()).filter(|&d| self.shape[d] != 1).collect();
        let shape = keep.iter().map(|&d| self.shape[d]).collect();
        let strides = keep.iter().map(|&d| self.strides[d]).collect();
        self.view_of(shape, strides, self.offset)
    }

    /// Insert a dim of size 1 at `dim` (0..=ndim).
    pub fn unsqueeze(&self, dim: usize) -> Result<Tensor> {
        if dim > self.ndim() {
            return Err(Error::invalid(
                "unsqueeze",
                format!("dim {dim} out of range for shape {:?}", self.shape),
            ));
        }
        let (mut shape, mut strides) = (self.shape.clone(), self.strides.clone());
        let stride = if dim < self.ndim() {
            self.strides[dim] * self.shape[dim]
        } else {
            1
        };
        shape.insert(dim, 1);
        strides.insert(dim, stride);
        Ok(self.view_of(shape, strides, self.offset))
    }
}
