//! contiguous() of a transposed view through copy.cl's tiled `transpose_copy` (both sides coalesced), where the view's layout allows it.
use crate::base::checks::u32_arg;
use crate::base::launch::program_for;
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use netcl_kernels::sources::COPY;
use netcl_kernels::Kernel;

/// `transpose_copy`'s tile edge and work-group rows (copy.cl's TT, TT_ROWS).
const TT: usize = 32;
const TT_ROWS: usize = 8;

/// Work-groups a grid dim other than the first may hold on every device (CUDA's limit, which
/// NVIDIA's OpenCL inherits).
const MAX_GROUPS_HIGH_DIM: usize = 65_535;

/// The (batch stride, ld) of `t` when it is a transposed view: its last dim strides `ld >=
/// rows`, its second-last strides 1, and its leading dims (size-1 dims left out: their strides
/// mean nothing) merge into one batch stride.
fn transposed_layout(t: &Tensor) -> Option<(usize, usize)> {
    let nd = t.shape.len();
    if nd < 2 || t.shape[nd - 2] < 2 || t.shape[nd - 1] < 2 {
        return None;
    }
    let (rows, s) = (t.shape[nd - 2], &t.strides);
    if s[nd - 2] != 1 || s[nd - 1] < rows {
        return None;
    }
    let kept: Vec<usize> = (0..nd - 2).filter(|&d| t.shape[d] > 1).collect();
    let merged = kept.windows(2).all(|w| s[w[0]] == s[w[1]] * t.shape[w[1]]);
    let batch_stride = kept.last().map_or(0, |&d| s[d]);
    merged.then_some((batch_stride, s[nd - 1]))
}

/// Copies `t` into `out` (same shape, contiguous) with one tiled transpose when `t` is a
/// transposed view (see `transposed_layout`); `Ok(false)` when it is not (nothing launched).
pub(crate) fn transpose_into(t: &Tensor, out: &Tensor) -> Result<bool> {
    let Some((sb, ld)) = transposed_layout(t) else {
        return Ok(false);
    };
    let op = "contiguous";
    let nd = t.shape.len();
    let (rows, cols) = (t.shape[nd - 2], t.shape[nd - 1]);
    let batch: usize = t.shape[..nd - 2].iter().product();
    if rows.div_ceil(TT) > MAX_GROUPS_HIGH_DIM || batch > MAX_GROUPS_HIGH_DIM {
        return Ok(false);
    }
    // The largest element offset must fit the kernel's 32-bit arguments.
    let reach = t.offset + (batch - 1) * sb + (rows - 1) + (cols - 1) * ld;
    u32_arg(op, "source extent", reach)?;
    u32_arg(op, "elements", t.numel())?;
    let program = program_for(&t.device, &COPY, t.dtype)?;
    let mut k = Kernel::new(&program, "transpose_copy")?;
    k.arg_mem(out.mem()?)?.arg_mem(t.mem()?)?;
    for v in [rows, cols, ld, sb, t.offset] {
        k.arg(&(v as u32))?;
    }
    k.declare((2 * t.numel() * t.dtype.size()) as u64, 0);
    k.launch(
        &[cols.div_ceil(TT) * TT, rows.div_ceil(TT) * TT_ROWS, batch],
        &[TT, TT_ROWS, 1],
    )?;
    Ok(true)
}
