//! Indexing with I32 index tensors: embedding, index_select, gather, and deterministic out-of-place scatter_add / index_add (their backward).
//!
//! Index range: indices must lie in `[0, size)` of the indexed dim (no negative wrap-around).
//! Index tensors on the host, and device index tensors of at most [`INDEX_CHECK_LIMIT`] elements
//! (read back before launching), are checked and an out-of-range index is an error naming the op,
//! the index, its position and the bound. Larger device index tensors are not read back (no host
//! sync): the kernels never access memory out of bounds (gathers write 0 for an out-of-range
//! index, scatter-adds skip its contribution) and record the bad index in the device's error
//! record, so the next read from that device returns the same error (`device_errors.rs`).
//! Embedding backward and index_add along dim 0 (sorted rows) skip bad indices without a record:
//! their forward or the caller's own gather reports them.
//!
//! Determinism: scatter-adds use no atomics. Every output element sums the source values whose
//! index selects it in ascending index position, in the accumulator type (f32 for f16/bf16).
//! Results are bit-identical run to run and equal to the host reference. Whole-row scatters
//! (embedding_backward, index_select_backward and index_add along dim 0) on OpenCL devices sort
//! the indices first ([`Tensor::sort_stable`], see `sorted_rows`): an embedding gradient of
//! `[V, D]` from `N` ids costs `O(N log^2 N + V log N + V * D + N * D)`. The other scatters
//! (gather_backward, scatter_add, index ops along other dims) run one work-item per output
//! element scanning the index entries along the indexed dim: `numel(out) * idx.shape[dim]`
//! index reads.
mod opencl;
mod reference;
mod sorted_rows;
use crate::base::checks::{need_i32, same_device, same_dtype};
use crate::base::dispatch::dispatch;
use crate::base::index_checks::check_indices;
use crate::base::layout::checked_numel;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};

/// Error unless `idx` holds I32 indices on the device of `t`.
fn index_operands(op: &str, t: &Tensor, idx: &Tensor) -> Result<()> {
    same_device(op, t, idx)?;
    need_i32(op, idx)
}

/// The 1-D index list `idx` seen over `shape` with `dim` of its length: entry j of `dim`, for
/// every position of the other dims, is `idx[j]` (stride 0 elsewhere). Turns index_select into a
/// gather and index_add into a scatter_add.
fn idx_along(idx: &Tensor, dim: usize, shape: &[usize]) -> Tensor {
    let mut strides = vec![0; shape.len()];
    strides[dim] = idx.strides[0];
    idx.view_of(with_dim(shape, dim, idx.shape[0]), strides, idx.offset)
}

/// Where a gather reads: for output element i (row-major over `shape`), source position
/// `base[i] + idx[idx_pos[i]] * stride`.
#[derive(Clone, Debug)]
struct GatherPlan {
    op: &'static str,
    shape: Vec<usize>,
    src_strides: Vec<usize>, // the indexed dim's stride is 0
    idx_strides: Vec<usize>,
    stride: usize,
    bound: usize,
}

impl GatherPlan {
    /// out = src gathered along `dim` by `idx` (any strides): out has the shape of idx.
    fn along(op: &'static str, src: &Tensor, dim: usize, idx: &Tensor) -> GatherPlan {
        GatherPlan {
            op,
            shape: idx.shape.clone(),
            src_strides: with_dim(&src.strides, dim, 0),
            idx_strides: idx.strides.clone(),
            stride: src.strides[dim],
            bound: src.shape[dim],
        }
    }
}

/// A checked gather (embedding, index_select, gather): a new tensor of `plan.shape` and src's
/// dtype read from `src` at the positions `plan` gives for the I32 `idx`.
#[derive(Clone, Debug)]
struct Gather {
    src: Tensor,
    idx: Tensor,
    plan: GatherPlan,
}

/// A scatter-add: out (of `shape`) = x (or 0) + src scattered along `dim` by idx, where idx and
/// src are walked over `idx_shape` with the given strides.
#[derive(Clone, Debug)]
struct ScatterPlan {
    op: &'static str,
    shape: Vec<usize>,
    dim: usize,
    idx_shape: Vec<usize>,
    idx_strides: Vec<usize>,
    src_strides: Vec<usize>,
}

/// A checked scatter-add (gather_backward, scatter_add, index ops along other dims than 0): a
/// new tensor of `plan.shape` and src's dtype.
#[derive(Clone, Debug)]
struct ScatterAdd {
    x: Option<Tensor>,
    idx: Tensor,
    src: Tensor,
    plan: ScatterPlan,
}

impl ScatterAdd {
    /// out (of `shape`) = x (or 0) + `src` scattered along `dim` by `idx` (the shape of the
    /// region of src that is added, any strides).
    fn new(
        op: &'static str,
        x: Option<&Tensor>,
        shape: &[usize],
        dim: usize,
        idx: &Tensor,
        src: &Tensor,
    ) -> ScatterAdd {
        let plan = ScatterPlan {
            op,
            shape: shape.to_vec(),
            dim,
            idx_shape: idx.shape.clone(),
            idx_strides: idx.strides.clone(),
            src_strides: src.strides.clone(),
        };
        ScatterAdd {
            x: x.cloned(),
            idx: idx.clone(),
            src: src.clone(),
            plan,
        }
    }
}

/// A checked whole-row scatter-add (embedding_backward, and index_select_backward / index_add
/// along dim 0): out (of `shape`, `[V, ..]`) = x (or 0) + row j of `src` added at row `idx[j]`,
/// where `src` is `idx`'s shape followed by the row's dims. OpenCL devices sort the indices
/// (`sorted_rows.rs`); the host runs the scatter-add, in the same order.
#[derive(Clone, Debug)]
struct RowAdd {
    op: &'static str,
    x: Option<Tensor>,
    idx: Tensor,
    src: Tensor,
    shape: Vec<usize>,
}

impl_op!(Gather, Tensor, "gather", gather, |g| g.plan.op);
impl_op!(ScatterAdd, Tensor, "scatter_add", scatter_add, |s| s
    .plan
    .op);
impl_op!(RowAdd, Tensor, "row_add", row_add, |r| r.op);

/// Checks shared by index_select and index_add: `idx` 1-D i32 on the tensor's device, `dim` in range.
fn check_index_list(op: &str, t: &Tensor, dim: usize, idx: &Tensor) -> Result<()> {
    index_operands(op, t, idx)?;
    t.check_dim(op, dim)?;
    if idx.ndim() != 1 {
        return Err(Error::shape(
            op,
            format!(
                "indices must be 1-D, got shape {:?} (input {:?})",
                idx.shape, t.shape
            ),
        ));
    }
    check_indices(
        op,
        idx,
        t.shape[dim],
        &format!("dim {dim} of {:?}", t.shape),
    )
}

/// Checks shared by gather and scatter_add (PyTorch rules): idx has the input's rank and no dim
/// larger than the input's except `dim`; with `src`, idx fits inside src in every dim.
fn check_gather_index(
    op: &str,
    shape: &[usize],
    dim: usize,
    idx: &Tensor,
    src: Option<&Tensor>,
) -> Result<()> {
    if dim >= shape.len() {
        return Err(Error::invalid(
            op,
            format!("dim {dim} out of range for shape {shape:?}"),
        ));
    }
    if idx.ndim() != shape.len() {
        return Err(Error::shape(
            op,
            format!(
                "indices {:?} must have the rank of the input {shape:?}",
                idx.shape
            ),
        ));
    }
    if let Some(d) = (0..shape.len()).find(|&d| d != dim && idx.shape[d] > shape[d]) {
        return Err(Error::shape(
            op,
            format!(
                "indices {:?} exceed the input {shape:?} in dim {d}",
                idx.shape
            ),
        ));
    }
    if let Some(src) = src {
        if src.ndim() != shape.len() || (0..shape.len()).any(|d| idx.shape[d] > src.shape[d]) {
            return Err(Error::shape(
                op,
                format!(
                    "indices {:?} do not fit inside src {:?} (input {shape:?})",
                    idx.shape, src.shape
                ),
            ));
        }
    }
    check_indices(op, idx, shape[dim], &format!("dim {dim} of {shape:?}"))
}

fn with_dim(v: &[usize], dim: usize, value: usize) -> Vec<usize> {
    let mut v = v.to_vec();
    v[dim] = value;
    v
}

impl Tensor {
    /// Rows of this `[V, D]` weight picked by `ids` (i32, any shape): the result is `[..ids, D]`.
    /// One kernel.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        let op = "embedding";
        index_operands(op, self, ids)?;
        if self.ndim() != 2 {
            return Err(Error::shape(
                op,
                format!(
                    "weight must be [V, D], got {:?} (ids {:?})",
                    self.shape, ids.shape
                ),
            ));
        }
        checked_numel(op, &[ids.numel(), self.shape[1]], self.dtype.size())?;
        check_indices(op, ids, self.shape[0], &format!("weight {:?}", self.shape))?;
        let k = ids.ndim();
        let mut shape = ids.shape.clone();
        shape.push(self.shape[1]);
        let mut src_strides = vec![0; k];
        src_strides.push(self.strides[1]);
        let mut idx_strides = ids.strides.clone();
        idx_strides.push(0);
        let plan = GatherPlan {
            op,
            shape,
            src_strides,
            idx_strides,
            stride: self.strides[0],
            bound: self.shape[0],
        };
        run_gather(self, ids, plan)
    }

    /// The gradient of [`Tensor::embedding`]'s `[V, D]` weight (`V = num_embeddings`) from
    /// `grad` of shape `[..ids, D]`: row v sums the grad rows whose id is v, in id order.
    /// OpenCL: the kernels of [`Tensor::sort_stable`] over the N ids and one more (11 for
    /// N = 8192); cost `O(N log^2 N + V log N + V * D + N * D)`, not `V * D * N`.
    pub fn embedding_backward(
        grad: &Tensor,
        ids: &Tensor,
        num_embeddings: usize,
    ) -> Result<Tensor> {
        let op = "embedding_backward";
        index_operands(op, grad, ids)?;
        if grad.ndim() != ids.ndim() + 1 || grad.shape[..ids.ndim()] != ids.shape[..] {
            return Err(Error::shape(
                op,
                format!(
                    "grad {:?} must be ids {:?} plus one dim",
                    grad.shape, ids.shape
                ),
            ));
        }
        let d = grad.shape[ids.ndim()];
        checked_numel(op, &[num_embeddings, d], grad.dtype.size())?;
        check_indices(
            op,
            ids,
            num_embeddings,
            &format!("{num_embeddings} embeddings"),
        )?;
        run_row_add(op, None, ids, grad, &[num_embeddings, d])
    }

    /// Entries `idx[0], idx[1], ...` (1-D i32) of `dim`, as in `torch.index_select`. One kernel.
    pub fn index_select(&self, dim: usize, idx: &Tensor) -> Result<Tensor> {
        let op = "index_select";
        check_index_list(op, self, dim, idx)?;
        let idx = idx_along(idx, dim, &self.shape);
        run_gather(self, &idx, GatherPlan::along(op, self, dim, &idx))
    }

    /// The gradient of [`Tensor::index_select`] for an input of `shape`: zeros with `grad`
    /// added at the selected entries (repeats summed in order). One kernel; along dim 0 on
    /// OpenCL those of [`Tensor::sort_stable`] over the indices and one more.
    pub fn index_select_backward(
        grad: &Tensor,
        dim: usize,
        idx: &Tensor,
        shape: &[usize],
    ) -> Result<Tensor> {
        let op = "index_select_backward";
        index_operands(op, grad, idx)?;
        if dim >= shape.len() || idx.ndim() != 1 || grad.shape != with_dim(shape, dim, idx.shape[0])
        {
            return Err(Error::shape(
                op,
                format!(
                    "grad {:?} does not match input {shape:?} selected by indices {:?} along dim {dim}",
                    grad.shape, idx.shape
                ),
            ));
        }
        check_indices(op, idx, shape[dim], &format!("dim {dim} of {shape:?}"))?;
        if dim == 0 {
            return run_row_add(op, None, idx, grad, shape);
        }
        let along = idx_along(idx, dim, grad.shape());
        run_scatter(ScatterAdd::new(op, None, shape, dim, &along, grad))
    }

    /// `out[i][j][k] = self[i][idx[i][j][k]][k]` for dim 1 (and likewise for any dim), as in
    /// `torch.gather`: the result has the shape of `idx`. One kernel.
    pub fn gather(&self, dim: usize, idx: &Tensor) -> Result<Tensor> {
        let op = "gather";
        index_operands(op, self, idx)?;
        check_gather_index(op, &self.shape, dim, idx, None)?;
        run_gather(self, idx, GatherPlan::along(op, self, dim, idx))
    }

    /// The gradient of [`Tensor::gather`] for an input of `shape`: zeros scatter-added with `grad`
    /// (the shape of `idx`). One kernel.
    pub fn gather_backward(
        grad: &Tensor,
        dim: usize,
        idx: &Tensor,
        shape: &[usize],
    ) -> Result<Tensor> {
        let op = "gather_backward";
        index_operands(op, grad, idx)?;
        if grad.shape != idx.shape {
            return Err(Error::shape(
                op,
                format!(
                    "grad {:?} must have the shape of indices {:?}",
                    grad.shape, idx.shape
                ),
            ));
        }
        check_gather_index(op, shape, dim, idx, Some(grad))?;
        run_scatter(ScatterAdd::new(op, None, shape, dim, idx, grad))
    }

    /// A copy of this tensor with `src[i][j][k]` added at `[i][idx[i][j][k]][k]` for dim 1 (and
    /// likewise for any dim), as `torch.Tensor.scatter_add` but out of place. `idx` has this
    /// tensor's rank, fits inside `src`, and no dim but `dim` exceeds this tensor's. One kernel;
    /// deterministic (see the module docs).
    pub fn scatter_add(&self, dim: usize, idx: &Tensor, src: &Tensor) -> Result<Tensor> {
        let op = "scatter_add";
        index_operands(op, self, idx)?;
        same_device(op, self, src)?;
        same_dtype(op, self, src)?;
        check_gather_index(op, &self.shape, dim, idx, Some(src))?;
        run_scatter(ScatterAdd::new(op, Some(self), &self.shape, dim, idx, src))
    }

    /// A copy of this tensor with slice `j` of `src` along `dim` added at entry `idx[j]` (1-D i32),
    /// as `torch.Tensor.index_add` but out of place; `src` has this shape with `dim` of size
    /// `idx.len()`. One kernel (along dim 0 on OpenCL those of [`Tensor::sort_stable`] over the
    /// indices and one more); deterministic (see the module docs).
    pub fn index_add(&self, dim: usize, idx: &Tensor, src: &Tensor) -> Result<Tensor> {
        let op = "index_add";
        same_device(op, self, src)?;
        same_dtype(op, self, src)?;
        check_index_list(op, self, dim, idx)?;
        if src.shape != with_dim(&self.shape, dim, idx.shape[0]) {
            return Err(Error::shape(
                op,
                format!(
                    "src {:?} must be the input {:?} with dim {dim} of size {} (indices {:?})",
                    src.shape, self.shape, idx.shape[0], idx.shape
                ),
            ));
        }
        if dim == 0 {
            return run_row_add(op, Some(self), idx, src, &self.shape);
        }
        let along = idx_along(idx, dim, &src.shape);
        run_scatter(ScatterAdd::new(
            op,
            Some(self),
            &self.shape,
            dim,
            &along,
            src,
        ))
    }
}

/// Dispatch a checked gather of `src` by `idx` on their device.
fn run_gather(src: &Tensor, idx: &Tensor, plan: GatherPlan) -> Result<Tensor> {
    let desc = Gather {
        src: src.clone(),
        idx: idx.clone(),
        plan,
    };
    dispatch(&src.device, &desc)
}

/// Dispatch a checked scatter-add on its source's device.
fn run_scatter(desc: ScatterAdd) -> Result<Tensor> {
    dispatch(&desc.src.device, &desc)
}

/// Dispatch a checked whole-row scatter-add (see [`RowAdd`]).
fn run_row_add(
    op: &'static str,
    x: Option<&Tensor>,
    idx: &Tensor,
    src: &Tensor,
    shape: &[usize],
) -> Result<Tensor> {
    let desc = RowAdd {
        op,
        x: x.cloned(),
        idx: idx.clone(),
        src: src.clone(),
        shape: shape.to_vec(),
    };
    dispatch(&src.device, &desc)
}
