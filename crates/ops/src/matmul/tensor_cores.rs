//! What matmul_tc.cl (mma.sync) and matmul_wg.cl (wgmma) share: their operands brought into the form the plan names (K-contiguous aligned rows, or M/N-contiguous as they lie), and their launch.
use super::opencl::Gemm;
use super::plan::TcOperand;
use super::precision::TensorCoreKind;
use crate::base::layout::{broadcast_strides, check_reach, contiguous_strides, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use netcl_kernels::{Kernel, Program};
use std::sync::Arc;

/// `t` (..., rows, K) as K-contiguous rows, as `form` says: itself (`KRows`), a fresh contiguous
/// copy, or a copy zero-padded along K.
fn k_rows(t: &Tensor, form: TcOperand) -> Result<Tensor> {
    let nd = t.ndim();
    match form {
        TcOperand::KRows | TcOperand::Mn => Ok(t.clone()),
        // A transposed operand of a backward product is copied tiled; a contiguous one whose
        // offset is not aligned is copied by a pad of nothing.
        TcOperand::Copy if !t.is_contiguous() => t.contiguous(),
        TcOperand::Copy => t.pad(&[(0, 0)], 0.0),
        TcOperand::Pad(kp) => t.pad(&[(0, kp - t.shape[nd - 1])], 0.0),
    }
}

/// The operands of `g` in forms `[a, b]`: A (..., M, K) as K rows or as it lies (`Mn`), and B
/// transposed, (..., N, K) as K rows, or B itself where N-contiguous (`Mn`).
pub(super) fn operands(g: &Gemm<'_>, [fa, fb]: [TcOperand; 2]) -> Result<(Tensor, Tensor)> {
    let nb = g.b.ndim();
    let a = k_rows(g.a, fa)?;
    let bt = match fb {
        TcOperand::Mn => g.b.clone(),
        f => k_rows(&g.b.transpose(nb - 2, nb - 1)?, f)?,
    };
    Ok((a, bt))
}

/// Kernel `name` of `program` with its arguments for `g` on operands `a` and `bt` (from
/// `operands`): the output, operands, bias, batch layout, M, N, K (padded), the rows' strides and
/// the bias flag.
pub(super) fn kernel(
    kind: TensorCoreKind,
    program: &Arc<Program>,
    name: &str,
    g: &Gemm<'_>,
    (a, bt): (&Tensor, &Tensor),
    a_mn: bool,
) -> Result<Kernel> {
    let op = "matmul";
    let (m, k, n) = g.dims();
    let kp = k.next_multiple_of(16 / kind.dtype().size());
    let mut operands = Vec::new();
    for t in [a, bt] {
        let nd = t.ndim();
        check_reach(op, &t.shape, &t.strides, t.offset)?;
        operands.push(broadcast_strides(
            op,
            &t.shape[..nd - 2],
            &t.strides[..nd - 2],
            g.batch,
        )?);
    }
    let so: Vec<usize> = contiguous_strides(g.batch)
        .iter()
        .map(|s| s * m * n)
        .collect();
    let layout = KernelLayout::new(
        op,
        g.batch,
        &[
            (&so, 0),
            (&operands[0], a.offset),
            (&operands[1], bt.offset),
        ],
    )?;
    let mut kern = Kernel::new(program, name)?;
    kern.arg_mem(g.out.mem()?)?
        .arg_mem(a.mem()?)?
        .arg_mem(bt.mem()?)?
        .arg_mem(g.bias.map_or_else(|| g.out.mem(), |t| t.mem())?)?
        .arg(&layout)?;
    // The stride between A's rows (A_MN: between its K rows), and B's likewise.
    let (na, nb) = (a.ndim(), bt.ndim());
    let sam = a.strides[if a_mn { na - 1 } else { na - 2 }];
    let sbn = bt.strides[nb - 2];
    for v in [m, n, kp, sam, sbn, g.bias.is_some() as usize] {
        kern.arg(&(v as u32))?;
    }
    let batches = g.batches();
    let elems = batches * (m * k + k * n + m * n) + g.bias.map_or(0, |_| n);
    kern.declare(
        (elems * kind.dtype().size()) as u64,
        2 * (batches * m * n * k) as u64,
    );
    Ok(kern)
}
