//! Launches kernels/matmul_gemv.cl: a few rows of one operand against the many columns of the other (classifier heads, narrow layers' weight gradients, one-token decoding).
use super::opencl::Gemm;
use super::plan::{Gemv, GEMV_GROUP};
use super::source::matmul_source;
use crate::fused::expr::Class;
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::MATMUL_GEMV;
use netcl_kernels::{program, Kernel};

/// `g` (one product) as `v` says: the 4-row kernel for at most 4 rows, else the 16-row one.
pub(super) fn launch(v: &Gemv, g: &Gemm<'_>) -> Result<()> {
    let (m, k, n) = g.dims();
    let dtype = g.a.dtype;
    let sums = g.row_sums.filter(|_| v.rows_of_a);
    let flags = if sums.is_some() { " -DROW_SUMS" } else { "" };
    let source = matmul_source(MATMUL_GEMV, g.activation, Class::of(dtype));
    let program = program(
        &g.out.device,
        &source,
        &format!("{}{flags}", dtype.build_option()),
    )?;
    let name = if v.r <= 4 {
        "matmul_gemv4"
    } else {
        "matmul_gemv16"
    };
    let mut kern = Kernel::new(&program, name)?;
    if kern.max_work_group_size() < GEMV_GROUP {
        return Err(Error::invalid(
            "matmul",
            format!(
                "{name} needs work-groups of {GEMV_GROUP} on {}, which allows {}",
                g.out.device,
                kern.max_work_group_size()
            ),
        ));
    }
    let (f, gm) = if v.rows_of_a { (g.a, g.b) } else { (g.b, g.a) };
    kern.arg_mem(g.out.mem()?)?
        .arg_mem(f.mem()?)?
        .arg_mem(gm.mem()?)?
        .arg_mem(g.bias.map_or_else(|| g.out.mem(), |t| t.mem())?)?
        .arg_mem(sums.map_or_else(|| g.out.mem(), |t| t.mem())?)?;
    let [sfr, sfk, sgk, sgj] = v.strides;
    let [scr, scj] = if v.rows_of_a { [n, 1] } else { [1, n] };
    for x in [
        v.r, v.j, k, sfr, sfk, sgk, sgj, f.offset, gm.offset, scr, scj, v.team,
    ] {
        kern.arg(&(x as u32))?;
    }
    for x in [v.kmajor, g.bias.is_some(), !v.rows_of_a] {
        kern.arg(&(x as u32))?;
    }
    let elems = m * k + k * n + m * n + g.bias.map_or(0, |_| n);
    kern.declare((elems * dtype.size()) as u64, 2 * (m * n * k) as u64);
    let groups = v.j.div_ceil(GEMV_GROUP / v.team);
    kern.launch(&[groups * GEMV_GROUP], &[GEMV_GROUP])
}
