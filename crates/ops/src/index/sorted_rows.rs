//! Row scatter-adds on OpenCL devices through a stable sort of the indices (embedding backward, index_add / index_select_backward along dim 0): cost in the tokens, not V * D * N.
use crate::base::checks::u32_arg;
use crate::base::launch::{launch_groups, program_for};
use crate::base::layout::{check_reach, numel};
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use netcl_kernels::sources::INDEX;
use netcl_kernels::{Kernel, GROUP_1D};

/// `RowAddLayout` of kernels/index.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RowAddLayout {
    d: u32,
    nkeys: u32,
    zero_init: u32,
    x_stride: [u32; 2],
    x_offset: u32,
    src_stride: [u32; 2],
    src_offset: u32,
}

/// The one stride that walks (`shape`, `strides`) row-major as a single dim, if there is one
/// (size-1 dims do not move; no dims walk with stride 1).
fn single_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(1);
    }
    let mut inner: Option<(usize, usize)> = None; // (innermost stride, extent merged so far)
    for (&n, &s) in shape.iter().zip(strides).rev().filter(|(&n, _)| n != 1) {
        inner = match inner {
            None => Some((s, n)),
            Some((st, m)) if s == st * m => Some((st, m * n)),
            Some(_) => return None,
        };
    }
    Some(inner.map_or(1, |(st, _)| st))
}

/// `t` as the matrix `[prod(shape[..split]), prod(shape[split..])]`: a view when each group of
/// dims walks as one stride, else a contiguous copy.
pub(crate) fn as_matrix(t: &Tensor, split: usize) -> Result<Tensor> {
    let (lead, rest) = t.shape.split_at(split);
    let shape = vec![numel(lead), numel(rest)];
    match (
        single_stride(lead, &t.strides[..split]),
        single_stride(rest, &t.strides[split..]),
    ) {
        (Some(rs), Some(cs)) => Ok(t.view_of(shape, vec![rs, cs], t.offset)),
        _ => t.reshape(&shape),
    }
}

/// Strides and offset of the 2-D view `m` as the kernel takes them, checked to fit 32 bits.
fn matrix_view(op: &str, m: &Tensor) -> Result<([u32; 2], u32)> {
    check_reach(op, &m.shape, &m.strides, m.offset)?;
    Ok((
        [
            u32_arg(op, "stride", m.strides[0])?,
            u32_arg(op, "stride", m.strides[1])?,
        ],
        u32_arg(op, "offset", m.offset)?,
    ))
}

/// On an OpenCL device: an output of `shape` (`[V, ..]`, D elements per row) that is `x` (or
/// zeros) plus row j of `src` (`[N, ..]`, any strides) added at row `idx[j]`, for the 1-D i32
/// `idx` of N (already checked against V where it was read back; other out-of-range indices
/// add nothing). `x` and `src` have D elements per row.
///
/// [`Tensor::sort_stable`] orders the indices, then one kernel over the V * D outputs sums each
/// row's run of sorted indices (binary-searched once per row and work-group) in ascending j, the
/// order of the host reference and of `scatter_add`, so the result is bit-identical to theirs.
/// Kernels: those of the sort and 1; work `O(N log^2 N + V log N + V * D + N * D)` (a search
/// per row and per work-group it spans).
pub(crate) fn sorted_row_add(
    op: &str,
    x: Option<&Tensor>,
    idx: &Tensor,
    src: &Tensor,
    shape: &[usize],
) -> Result<Tensor> {
    let out = Tensor::alloc(shape, src.dtype, &src.device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let (keys, perm) = idx.sort_stable()?;
    let src = as_matrix(src, 1)?;
    let (n, d) = (src.shape[0], src.shape[1]);
    let (src_stride, src_offset) = matrix_view(op, &src)?;
    let mut l = RowAddLayout {
        d: u32_arg(op, "row length", d)?,
        nkeys: u32_arg(op, "indices", n)?,
        zero_init: x.is_none() as u32,
        x_stride: [0; 2],
        x_offset: 0,
        src_stride,
        src_offset,
    };
    let x = x.map(|x| as_matrix(x, 1)).transpose()?;
    if let Some(x) = &x {
        (l.x_stride, l.x_offset) = matrix_view(op, x)?;
    }
    let size = src.dtype.size();
    // Outputs written (and x read), src rows read once, keys and positions read.
    let reads = if x.is_some() { 2 } else { 1 };
    let bytes = (reads * out.numel() + n * d) * size + 8 * n;
    let mut k = Kernel::new(
        &program_for(&src.device, &INDEX, src.dtype)?,
        "sorted_row_add",
    )?;
    let group = GROUP_1D.min(k.max_work_group_size());
    k.arg_mem(out.mem()?)?
        .arg_mem(x.as_ref().unwrap_or(&out).mem()?)?
        .arg_mem(src.mem()?)?
        .arg_mem(keys.mem()?)?
        .arg_mem(perm.mem()?)?
        .arg_local(2 * 4 * group)?
        .arg(&l)?
        .arg(&u32_arg(op, "elements", out.numel())?)?
        .declare(bytes as u64, (n * d) as u64);
    launch_groups(op, &mut k, out.numel().div_ceil(group), group)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::single_stride;

    #[test]
    fn dims_that_walk_as_one_stride() {
        assert_eq!(single_stride(&[2, 3, 4], &[12, 4, 1]), Some(1));
        assert_eq!(single_stride(&[2, 3], &[9, 3]), Some(3));
        assert_eq!(single_stride(&[2, 1, 3], &[9, 77, 3]), Some(3));
        assert_eq!(single_stride(&[2, 3], &[10, 3]), None);
        assert_eq!(single_stride(&[3, 2], &[1, 3]), None);
        assert_eq!(single_stride(&[], &[]), Some(1));
        assert_eq!(single_stride(&[1, 1], &[5, 7]), Some(1));
        assert_eq!(single_stride(&[4, 0], &[1, 1]), Some(1));
    }
}
