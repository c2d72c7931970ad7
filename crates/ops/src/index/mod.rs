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
pub(crate) mod sorted_rows;
use crate::base::checks::{need_i32, same_device, same_dtype, u32_arg};
use crate::base::device_errors::{code_of, record_arg};
use crate::base::element::{Element, HostData};
use crate::base::index_checks::check_indices;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::check_reach;
use crate::base::layout::{checked_numel, contiguous_strides, numel, KernelLayout, MAX_DIMS};
use crate::index::sorted_rows::{as_matrix, sorted_row_add};

use crate::base::tensor::Tensor;
use half::{bf16, f16};
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::INDEX;

/// Storage positions of a strided view in row-major order (host reference paths).
fn positions(shape: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    crate::base::layout::strided_positions(shape, strides, offset).collect()
}

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

/// Element types with the kernels' accumulator arithmetic (f16/bf16 in f32, integers wrapping).
pub(crate) trait Accum: Element {
    type A: Copy;
    fn zero() -> Self::A;
    fn to_acc(self) -> Self::A;
    fn from_acc(a: Self::A) -> Self;
    fn add(a: Self::A, b: Self::A) -> Self::A;
}

macro_rules! accum {
    ($t:ty, $a:ty, $to:expr, $from:expr, $add:expr) => {
        impl Accum for $t {
            type A = $a;
            fn zero() -> $a {
                <$a>::default()
            }
            fn to_acc(self) -> $a {
                ($to)(self)
            }
            fn from_acc(a: $a) -> $t {
                ($from)(a)
            }
            fn add(a: $a, b: $a) -> $a {
                ($add)(a, b)
            }
        }
    };
}
accum!(f32, f32, |x| x, |a| a, |a: f32, b| a + b);
accum!(f64, f64, |x| x, |a| a, |a: f64, b| a + b);
accum!(f16, f32, f16::to_f32, f16::from_f32, |a: f32, b| a + b);
accum!(bf16, f32, bf16::to_f32, bf16::from_f32, |a: f32, b| a + b);
accum!(i32, i32, |x| x, |a| a, i32::wrapping_add);
accum!(u32, u32, |x| x, |a| a, u32::wrapping_add);

/// Where a gather reads: for output element i (row-major over `shape`), source position
/// `base[i] + idx[idx_pos[i]] * stride`.
struct GatherPlan<'a> {
    op: &'a str,
    shape: Vec<usize>,
    src_strides: Vec<usize>, // the indexed dim's stride is 0
    idx_strides: Vec<usize>,
    stride: usize,
    bound: usize,
}

impl GatherPlan<'_> {
    /// out = src gathered along `dim` by `idx` (any strides): out has the shape of idx.
    fn along<'a>(op: &'a str, src: &Tensor, dim: usize, idx: &Tensor) -> GatherPlan<'a> {
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

fn host_gather<T: Element>(
    src: &[T],
    idx: &[i32],
    plan: &GatherPlan,
    src_off: usize,
    idx_off: usize,
) -> HostData {
    let base = positions(&plan.shape, &plan.src_strides, src_off);
    let ip = positions(&plan.shape, &plan.idx_strides, idx_off);
    T::wrap(
        base.iter()
            .zip(&ip)
            .map(|(&b, &p)| src[b + idx[p] as usize * plan.stride])
            .collect(),
    )
}

fn run_gather(src: &Tensor, idx: &Tensor, plan: GatherPlan) -> Result<Tensor> {
    let op = plan.op;
    if let (Some(s), Some(i)) = (src.host(), idx.host()) {
        let HostData::I32(iv) = &*i else {
            return Err(Error::dtype(op, "index storage is not i32"));
        };
        let data = with_host!(&*s, v => host_gather(v, iv, &plan, src.offset, idx.offset));
        return Ok(Tensor::from_host_data(data, &plan.shape));
    }
    let out = Tensor::alloc(&plan.shape, src.dtype, &src.device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    check_reach(op, &src.shape, &src.strides, src.offset)?;
    let layout = KernelLayout::new(
        op,
        &plan.shape,
        &[
            (&out.strides, 0),
            (&plan.src_strides, src.offset),
            (&plan.idx_strides, idx.offset),
        ],
    )?;
    let (stride, bound) = (
        u32_arg(op, "stride", plan.stride)?,
        u32_arg(op, "size", plan.bound)?,
    );
    let program = program_for(&src.device, &INDEX, src.dtype)?;
    launch_1d(&program, "gather_rows", out.numel(), |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(src.mem()?)?
            .arg_mem(idx.mem()?)?
            .arg(&stride)?
            .arg(&bound)?
            .arg(&layout)?;
        k.arg_mem(record_arg(&src.device)?)?.arg(&code_of(op))?;
        Ok(())
    })?;
    Ok(out)
}

/// `ScatterLayout` of kernels/index.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ScatterLayout {
    ndim: u32,
    dim: u32,
    zero_init: u32,
    shape: [u32; MAX_DIMS],
    x_stride: [u32; MAX_DIMS],
    idx_shape: [u32; MAX_DIMS],
    idx_stride: [u32; MAX_DIMS],
    src_stride: [u32; MAX_DIMS],
    x_offset: u32,
    idx_offset: u32,
    src_offset: u32,
}

/// A scatter-add: out (of `shape`) = x (or 0) + src scattered along `dim` by idx, where idx and
/// src are walked over `idx_shape` with the given strides.
struct ScatterPlan<'a> {
    op: &'a str,
    shape: Vec<usize>,
    dim: usize,
    idx_shape: Vec<usize>,
    idx_strides: Vec<usize>,
    src_strides: Vec<usize>,
}

fn host_scatter<T: Accum>(
    x: Option<(&[T], &[usize], usize)>,
    idx: &[i32],
    src: &[T],
    plan: &ScatterPlan,
    idx_off: usize,
    src_off: usize,
) -> HostData {
    let mut acc: Vec<T::A> = match x {
        Some((v, strides, off)) => positions(&plan.shape, strides, off)
            .iter()
            .map(|&p| v[p].to_acc())
            .collect(),
        None => vec![T::zero(); numel(&plan.shape)],
    };
    let out_strides = contiguous_strides(&plan.shape);
    let ip = positions(&plan.idx_shape, &plan.idx_strides, idx_off);
    let sp = positions(&plan.idx_shape, &plan.src_strides, src_off);
    // Output position of idx-space position p with the indexed coordinate removed.
    let base = positions(
        &plan.idx_shape,
        &out_strides
            .iter()
            .enumerate()
            .map(|(d, &s)| if d == plan.dim { 0 } else { s })
            .collect::<Vec<_>>(),
        0,
    );
    // Row-major order over idx space visits each output's contributions in ascending j, as the kernel does.
    for ((&b, &i), &s) in base.iter().zip(&ip).zip(&sp) {
        let o = b + idx[i] as usize * out_strides[plan.dim];
        acc[o] = T::add(acc[o], src[s].to_acc());
    }
    T::wrap(acc.into_iter().map(T::from_acc).collect())
}

fn run_scatter(
    x: Option<&Tensor>,
    idx: &Tensor,
    src: &Tensor,
    plan: ScatterPlan,
) -> Result<Tensor> {
    let op = plan.op;
    let (dtype, device) = (src.dtype, src.device.clone());
    if device.is_host() {
        let (i, s) = (idx.host(), src.host());
        let (Some(i), Some(s)) = (i, s) else {
            return Err(Error::device(op, "host tensors without host storage"));
        };
        let HostData::I32(iv) = &*i else {
            return Err(Error::dtype(op, "index storage is not i32"));
        };
        let xg = x.map(|t| (t, t.host()));
        let data = match (&*s, xg.as_ref().map(|(t, g)| (t, g.as_deref()))) {
            (s, None) => {
                with_host!(s, v => host_scatter(None, iv, v, &plan, idx.offset, src.offset))
            }
            (s, Some((xt, Some(xd)))) => {
                macro_rules! arm {
                    ($($var:ident),*) => {
                        match (s, xd) {
                            $((HostData::$var(sv), HostData::$var(xv)) => host_scatter(
                                Some((xv.as_slice(), xt.strides.as_slice(), xt.offset)),
                                iv, sv, &plan, idx.offset, src.offset),)*
                            _ => return Err(Error::dtype(op, "storage does not match the dtype")),
                        }
                    };
                }
                arm!(F32, F64, F16, BF16, I32, U32)
            }
            (_, Some((_, None))) => return Err(Error::device(op, "x has no host storage")),
        };
        return Ok(Tensor::from_host_data(data, &plan.shape));
    }
    let out = Tensor::alloc(&plan.shape, dtype, &device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let nd = plan.shape.len();
    if nd > MAX_DIMS {
        return Err(Error::shape(
            op,
            format!("{:?} has more than {MAX_DIMS} dims", plan.shape),
        ));
    }
    check_reach(op, &plan.idx_shape, &plan.idx_strides, idx.offset)?;
    check_reach(op, &plan.idx_shape, &plan.src_strides, src.offset)?;
    let mut l = ScatterLayout {
        ndim: nd as u32,
        dim: plan.dim as u32,
        zero_init: x.is_none() as u32,
        shape: [1; MAX_DIMS],
        x_stride: [0; MAX_DIMS],
        idx_shape: [1; MAX_DIMS],
        idx_stride: [0; MAX_DIMS],
        src_stride: [0; MAX_DIMS],
        x_offset: 0,
        idx_offset: u32_arg(op, "offset", idx.offset)?,
        src_offset: u32_arg(op, "offset", src.offset)?,
    };
    if let Some(x) = x {
        check_reach(op, &x.shape, &x.strides, x.offset)?;
        l.x_offset = u32_arg(op, "offset", x.offset)?;
        for d in 0..nd {
            l.x_stride[d] = u32_arg(op, "stride", x.strides[d])?;
        }
    }
    for d in 0..nd {
        l.shape[d] = u32_arg(op, "size", plan.shape[d])?;
        l.idx_shape[d] = u32_arg(op, "size", plan.idx_shape[d])?;
        l.idx_stride[d] = u32_arg(op, "stride", plan.idx_strides[d])?;
        l.src_stride[d] = u32_arg(op, "stride", plan.src_strides[d])?;
    }
    let program = program_for(&device, &INDEX, dtype)?;
    let x_mem = match x {
        Some(x) => x.mem()?,
        None => out.mem()?,
    };
    launch_1d(&program, "scatter_add", out.numel(), |k| {
        k.arg_mem(out.mem()?)?
            .arg_mem(x_mem)?
            .arg_mem(idx.mem()?)?
            .arg_mem(src.mem()?)?
            .arg(&l)?;
        k.arg_mem(record_arg(&device)?)?.arg(&code_of(op))?;
        Ok(())
    })?;
    Ok(out)
}

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
        run_gather(
            self,
            ids,
            GatherPlan {
                op,
                shape,
                src_strides,
                idx_strides,
                stride: self.strides[0],
                bound: self.shape[0],
            },
        )
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
        let n = ids.numel();
        let shape = [num_embeddings, d];
        if !grad.device.is_host() {
            let grad = as_matrix(grad, ids.ndim())?;
            let ids = as_matrix(ids, ids.ndim())?;
            let ids = ids.view_of(vec![n], vec![ids.strides[0]], ids.offset);
            return sorted_row_add(op, None, &ids, &grad, &shape);
        }
        let ids = ids.reshape(&[n])?;
        let grad = grad.reshape(&[n, d])?;
        run_scatter(
            None,
            &ids,
            &grad,
            ScatterPlan {
                op,
                shape: shape.to_vec(),
                dim: 0,
                idx_shape: vec![n, d],
                idx_strides: vec![ids.strides[0], 0],
                src_strides: grad.strides.clone(),
            },
        )
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
        if dim == 0 && !grad.device.is_host() {
            return sorted_row_add(op, None, idx, grad, shape);
        }
        scatter_plan(
            op,
            None,
            shape,
            dim,
            &idx_along(idx, dim, grad.shape()),
            grad,
        )
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
        scatter_plan(op, None, shape, dim, idx, grad)
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
        scatter_plan(op, Some(self), &self.shape, dim, idx, src)
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
        if dim == 0 && !self.device.is_host() {
            return sorted_row_add(op, Some(self), idx, src, &self.shape);
        }
        scatter_plan(
            op,
            Some(self),
            &self.shape,
            dim,
            &idx_along(idx, dim, &src.shape),
            src,
        )
    }
}

fn scatter_plan(
    op: &str,
    x: Option<&Tensor>,
    shape: &[usize],
    dim: usize,
    idx: &Tensor,
    src: &Tensor,
) -> Result<Tensor> {
    run_scatter(
        x,
        idx,
        src,
        ScatterPlan {
            op,
            shape: shape.to_vec(),
            dim,
            idx_shape: idx.shape.clone(),
            idx_strides: idx.strides.clone(),
            src_strides: src.strides.clone(),
        },
    )
}
