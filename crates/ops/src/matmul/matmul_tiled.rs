//! Launches kernels/matmul_tiled.cl (the portable tiled GEMM) over a product's columns, and the column launch it shares with matmul_async.cl (same arguments).
use super::opencl::Gemm;
use super::plan::Strip;
use super::source::matmul_source;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::MATMUL_TILED;
use netcl_kernels::{program, GemmTile, Kernel, Program};
use std::sync::Arc;

/// `g` in `tile` (16-byte runs along K per operand where `k4`), its columns past `strip.col` in
/// the strip's tile.
pub(super) fn launch(
    tile: &GemmTile,
    k4: [bool; 2],
    strip: &Option<Strip>,
    g: &Gemm<'_>,
) -> Result<()> {
    let (_, _, n) = g.dims();
    let main = strip.map_or(n, |s| s.col);
    run_tile(tile, k4, 0, main, g)?;
    match strip {
        Some(s) => run_tile(&s.tile, s.k4, s.col, n - s.col, g),
        None => Ok(()),
    }
}

/// Columns `col .. col + width` of `g` through matmul_tiled.cl in tile `t`.
pub(super) fn run_tile(
    t: &GemmTile,
    k4: [bool; 2],
    col: usize,
    width: usize,
    g: &Gemm<'_>,
) -> Result<()> {
    let acc_bytes = if g.a.dtype == DType::F64 { 8 } else { 4 };
    t.check(&g.out.device, acc_bytes)?;
    let (m, k, _) = g.dims();
    let aligned = m.is_multiple_of(t.bm as usize)
        && width.is_multiple_of(t.bn as usize)
        && k.is_multiple_of(t.bk as usize);
    let sums = g.row_sums.is_some() && col == 0;
    let flags = [
        (aligned, " -DALIGNED"),
        (sums, " -DROW_SUMS"),
        (k4[0], " -DA_K4"),
        (k4[1], " -DB_K4"),
    ];
    let flags: String = flags.iter().filter(|f| f.0).map(|f| f.1).collect();
    let source = matmul_source(MATMUL_TILED, g.activation, Class::of(g.a.dtype));
    let options = format!("{} {}{flags}", g.a.dtype.build_option(), t.options());
    let program = program(&g.out.device, &source, &options)?;
    let [tx, ty] = t.local();
    let shape = ((t.bm as usize, t.bn as usize), [tx, ty, 1]);
    run_columns(&program, "matmul_tiled", col, width, shape, g, sums)
}

/// Launches `name` of `program` (matmul_tiled.cl's or matmul_async.cl's kernel) over columns
/// `col .. col + width` of `g`, in work-groups of `local` work-items that each compute a `tile`
/// (rows, columns) of the output; A's row sums where `sums`.
pub(super) fn run_columns(
    program: &Arc<Program>,
    name: &str,
    col: usize,
    width: usize,
    (tile, local): ((usize, usize), [usize; 3]),
    g: &Gemm<'_>,
    sums: bool,
) -> Result<()> {
    let (m, k, n) = g.dims();
    let batches = g.batches();
    let u = |x: usize| x as u32;
    let mut kern = Kernel::new(program, name)?;
    kern.arg_mem(g.out.mem()?)?
        .arg_mem(g.a.mem()?)?
        .arg_mem(g.b.mem()?)?
        .arg_mem(g.bias.map_or_else(|| g.out.mem(), |t| t.mem())?)?
        .arg(&g.layout()?)?;
    let [sam, sak, sbk, sbn] = g.strides();
    for v in [m, width, k, sam, sak, sbk, sbn] {
        kern.arg(&u(v))?;
    }
    kern.arg(&u(g.bias.is_some() as usize))?;
    kern.arg(&u(n))?.arg(&u(col))?;
    let diag = g
        .lower
        .unwrap_or(0)
        .clamp(i32::MIN as isize, i32::MAX as isize) as i32;
    kern.arg(&u(g.lower.is_some() as usize))?.arg(&diag)?;
    // Written only by a -DROW_SUMS build.
    let rsum = match (sums, g.row_sums) {
        (true, Some(t)) => t.mem()?,
        (true, None) => {
            return Err(Error::invalid(
                "matmul",
                "a row-sum build launched without a row-sum buffer",
            ))
        }
        _ => g.out.mem()?,
    };
    kern.arg_mem(rsum)?;
    // A once, this launch's columns of B and C (and the bias); a multiply and an add per
    // (batch, m, column, k).
    let elems = g.a.numel() + (k + m) * width * batches + g.bias.map_or(0, |_| width);
    kern.declare(
        (elems * g.a.dtype.size()) as u64,
        2 * (batches * m * width * k) as u64,
    );
    let groups = [width.div_ceil(tile.1), m.div_ceil(tile.0), batches];
    let global = [
        groups[0] * local[0],
        groups[1] * local[1],
        groups[2] * local[2],
    ];
    kern.launch(&global, &local)
}
