//! Shape ops: one_hot, concat, stack, split (views), constant pad, triu/tril and triangular (causal) masks.
mod opencl;
mod reference;
use crate::base::checks::{need_i32, same_device};
use crate::base::dispatch::dispatch;
use crate::base::index_checks::check_indices;
use crate::base::layout::checked_numel;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};

/// Checked one-hot rows: `ids` (i32, any strides) in `[0, classes)` where checked; the output
/// is a new `shape = [..ids, classes]` tensor of `dtype`.
#[derive(Clone, Debug)]
struct OneHot {
    ids: Tensor,
    classes: usize,
    dtype: DType,
    shape: Vec<usize>,
}

/// A checked join along `dim` of tensors that differ only there (same dtype and device), into a
/// new tensor of `shape`.
#[derive(Clone, Debug)]
struct Concat {
    tensors: Vec<Tensor>,
    dim: usize,
    shape: Vec<usize>,
}

/// `x` at offset `before` (per dim) inside a new tensor of `shape` filled with `value`.
#[derive(Clone, Debug)]
struct Pad {
    x: Tensor,
    before: Vec<usize>,
    shape: Vec<usize>,
    value: f64,
}

/// triu (`upper`) or tril of the last two dims of `x` (at least 2 dims) into a new tensor: the
/// elements outside the triangle 0.
#[derive(Clone, Debug)]
struct Tri {
    x: Tensor,
    diagonal: i64,
    upper: bool,
}

/// A new `[rows, cols]` tensor of `dtype`: `values.0` where triu (`upper`) / tril keeps the
/// element, else `values.1`; named `op` (triu_mask, tril_mask, causal_mask).
#[derive(Clone, Debug)]
struct TriMask {
    op: &'static str,
    rows: usize,
    cols: usize,
    diagonal: i64,
    upper: bool,
    values: (f64, f64),
    dtype: DType,
}

impl Tri {
    /// The op's name: triu or tril.
    fn op(&self) -> &'static str {
        if self.upper {
            "triu"
        } else {
            "tril"
        }
    }
}

impl_op!(OneHot, Tensor, "one_hot", one_hot);
impl_op!(Concat, Tensor, "concat", concat);
impl_op!(Pad, Tensor, "pad", pad);
impl_op!(Tri, Tensor, "triu", tri, |t| t.op());
impl_op!(TriMask, Tensor, "tri_mask", tri_mask, |m| m.op);

impl Tensor {
    /// `ids` (i32, any shape) as one-hot rows: the result is `[..ids, classes]` of `dtype`, 1 at
    /// each id and 0 elsewhere. Ids must be in `[0, classes)`; unchecked large device id tensors
    /// (see [`crate::INDEX_CHECK_LIMIT`]) give all-zero rows for ids out of range. One kernel.
    pub fn one_hot(ids: &Tensor, classes: usize, dtype: DType) -> Result<Tensor> {
        let op = "one_hot";
        need_i32(op, ids)?;
        let mut shape = ids.shape.clone();
        shape.push(classes);
        checked_numel(op, &shape, dtype.size())?;
        check_indices(op, ids, classes, &format!("{classes} classes"))?;
        let desc = OneHot {
            ids: ids.clone(),
            classes,
            dtype,
            shape,
        };
        dispatch(&ids.device, &desc)
    }

    /// The tensors joined along `dim`: same dtype, device and rank, equal sizes but in `dim`.
    /// One strided-copy kernel per non-empty input, writing into a view of the result.
    pub fn concat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let op = "concat";
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(op, "no tensors to concatenate"))?;
        let shapes: Vec<&Vec<usize>> = tensors.iter().map(|t| &t.shape).collect();
        if dim >= first.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for shapes {shapes:?}"),
            ));
        }
        for t in &tensors[1..] {
            same_device(op, first, t)?;
            if t.dtype != first.dtype {
                return Err(Error::dtype(
                    op,
                    format!(
                        "{} and {} tensors (shapes {shapes:?})",
                        first.dtype, t.dtype
                    ),
                ));
            }
            let fits = t.ndim() == first.ndim()
                && (0..t.ndim()).all(|d| d == dim || t.shape[d] == first.shape[d]);
            if !fits {
                return Err(Error::shape(
                    op,
                    format!("shapes {shapes:?} differ outside dim {dim}"),
                ));
            }
        }
        let total = tensors
            .iter()
            .try_fold(0usize, |a, t| a.checked_add(t.shape[dim]))
            .ok_or_else(|| Error::shape(op, format!("shapes {shapes:?} overflow in dim {dim}")))?;
        let mut shape = first.shape.clone();
        shape[dim] = total;
        checked_numel(op, &shape, first.dtype.size())?;
        let desc = Concat {
            tensors: tensors.iter().map(|&t| t.clone()).collect(),
            dim,
            shape,
        };
        dispatch(&first.device, &desc)
    }

    /// The tensors (same shape, dtype and device) stacked along a new dim `dim` (0..=ndim).
    /// One strided-copy kernel per non-empty input.
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let op = "stack";
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(op, "no tensors to stack"))?;
        let shapes: Vec<&Vec<usize>> = tensors.iter().map(|t| &t.shape).collect();
        if dim > first.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for stacking shapes {shapes:?}"),
            ));
        }
        if tensors.iter().any(|t| t.shape != first.shape) {
            return Err(Error::shape(op, format!("shapes {shapes:?} differ")));
        }
        let views = tensors
            .iter()
            .map(|t| t.unsqueeze(dim))
            .collect::<Result<Vec<_>>>()?;
        Tensor::concat(&views.iter().collect::<Vec<_>>(), dim).map_err(|e| match e {
            Error::DType { msg, .. } => Error::dtype(op, msg),
            Error::Device { msg, .. } => Error::device(op, msg),
            other => other,
        })
    }

    /// Views of consecutive chunks of `size` entries along `dim` (the last may be shorter), as
    /// `torch.split` with an int. No copies; an empty dim gives one empty view.
    pub fn split(&self, size: usize, dim: usize) -> Result<Vec<Tensor>> {
        let op = "split";
        if dim >= self.ndim() || size == 0 {
            return Err(Error::invalid(
                op,
                format!("chunk size {size} along dim {dim} of {:?}", self.shape),
            ));
        }
        let n = self.shape[dim];
        if n == 0 {
            return Ok(vec![self.clone()]);
        }
        (0..n)
            .step_by(size)
            .map(|s| self.narrow(dim, s, size.min(n - s)))
            .collect()
    }

    /// Views of consecutive chunks of the given sizes along `dim`, which must sum to its size.
    /// No copies.
    pub fn split_sizes(&self, sizes: &[usize], dim: usize) -> Result<Vec<Tensor>> {
        let op = "split_sizes";
        if dim >= self.ndim()
            || sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) != Some(self.shape[dim])
        {
            return Err(Error::invalid(
                op,
                format!("sizes {sizes:?} do not split dim {dim} of {:?}", self.shape),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                start += s;
                self.narrow(dim, start - s, s)
            })
            .collect()
    }

    /// This tensor surrounded by `value`: `pads[0] = (before, after)` pads the last dim,
    /// `pads[1]` the one before it, and so on (the order of `torch.nn.functional.pad`); pads are
    /// non-negative (no cropping). One kernel.
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
        let op = "pad";
        let nd = self.ndim();
        if pads.len() > nd {
            return Err(Error::invalid(
                op,
                format!(
                    "{} pad pairs for the {nd} dims of {:?}",
                    pads.len(),
                    self.shape
                ),
            ));
        }
        let mut before = vec![0usize; nd];
        let mut shape = self.shape.clone();
        for (k, &(b, a)) in pads.iter().enumerate() {
            let d = nd - 1 - k;
            before[d] = b;
            shape[d] = b
                .checked_add(a)
                .and_then(|p| p.checked_add(self.shape[d]))
                .ok_or_else(|| {
                    Error::shape(op, format!("pads {pads:?} overflow shape {:?}", self.shape))
                })?;
        }
        checked_numel(op, &shape, self.dtype.size())?;
        let desc = Pad {
            x: self.clone(),
            before,
            shape,
            value,
        };
        dispatch(&self.device, &desc)
    }

    /// The upper triangle of the last two dims: elements with `col - row >= diagonal` kept, the
    /// rest 0 (`torch.triu`). One kernel.
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        self.tri(diagonal, true)
    }

    /// The lower triangle of the last two dims: elements with `col - row <= diagonal` kept, the
    /// rest 0 (`torch.tril`). One kernel.
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        self.tri(diagonal, false)
    }

    /// triu (`upper`) or tril after its check.
    fn tri(&self, diagonal: i64, upper: bool) -> Result<Tensor> {
        let desc = Tri {
            x: self.clone(),
            diagonal,
            upper,
        };
        if self.ndim() < 2 {
            return Err(Error::shape(
                desc.op(),
                format!("needs at least 2 dims, got {:?}", self.shape),
            ));
        }
        dispatch(&self.device, &desc)
    }

    /// A `[rows, cols]` mask: 1 where `col - row >= diagonal` (what `triu` keeps), else 0. One kernel.
    pub fn triu_mask(
        rows: usize,
        cols: usize,
        diagonal: i64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        tri_mask(
            "triu_mask",
            [rows, cols],
            diagonal,
            true,
            (1.0, 0.0),
            dtype,
            device,
        )
    }

    /// A `[rows, cols]` mask: 1 where `col - row <= diagonal` (what `tril` keeps), else 0. One kernel.
    pub fn tril_mask(
        rows: usize,
        cols: usize,
        diagonal: i64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        tri_mask(
            "tril_mask",
            [rows, cols],
            diagonal,
            false,
            (1.0, 0.0),
            dtype,
            device,
        )
    }

    /// The additive causal attention mask `[t, t]`: 0 where a query (row) may attend a key
    /// (col <= row), `-inf` above the diagonal; add it to the scores before softmax. Float dtypes.
    /// One kernel.
    pub fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::dtype(
                "causal_mask",
                format!("needs a float dtype for -inf, not {dtype} (shape [{t}, {t}])"),
            ));
        }
        tri_mask(
            "causal_mask",
            [t, t],
            0,
            false,
            (0.0, f64::NEG_INFINITY),
            dtype,
            device,
        )
    }
}

/// A checked `[rows, cols]` mask of `dtype`: `values.0` where triu (`upper`) / tril keeps the
/// element, else `values.1`.
fn tri_mask(
    op: &'static str,
    [rows, cols]: [usize; 2],
    diagonal: i64,
    upper: bool,
    values: (f64, f64),
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    checked_numel(op, &[rows, cols], dtype.size())?;
    let mask = TriMask {
        op,
        rows,
        cols,
        diagonal,
        upper,
        values,
        dtype,
    };
    dispatch(device, &mask)
}
