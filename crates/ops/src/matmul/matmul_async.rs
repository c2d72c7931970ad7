//! Launches kernels/matmul_async.cl (the f32 GEMM through a cp.async pipeline, NVIDIA) in the planner's tile and stagings, and probes which devices run it exactly.
use super::matmul_tiled;
use super::opencl::Gemm;
use super::plan::{staging_of, OperandLayout, Staging, Strip};
use super::probes::{probed, Exact, Probes};
use super::source::matmul_source;
use crate::base::tensor::Tensor;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::MATMUL_ASYNC;
use netcl_kernels::{plan_tuning, program, AsyncTile, AsyncTuning};
use std::sync::OnceLock;

/// Whether `device` runs matmul_async.cl in its large tile with exact results (probed once per
/// device).
pub fn has_async_gemm(device: &Device) -> bool {
    runs(device, false)
}

/// Whether `device` runs matmul_async.cl in the tuning's small (else large) tile with exact
/// results: probed once per device and tile; false where the pipeline is off.
pub(crate) fn runs(device: &Device, small: bool) -> bool {
    static PROBES: Probes<(usize, AsyncTile)> = OnceLock::new();
    let Some(s) = plan_tuning(device).async_f32 else {
        return false;
    };
    let tile = if small { s.small } else { s.large };
    probed(&PROBES, (device.ordinal(), tile), device, true, || {
        probe(device, s, tile).map_err(|e| {
            format!("pipelined f32 GEMM in {tile:?} tiles unavailable on {device}: {e}")
        })
    })
}

/// `g` through the pipeline in `tile` with operand `staging`, its columns past `strip.col`
/// through matmul_tiled.cl.
pub(super) fn launch(
    tile: &AsyncTile,
    staging: [Staging; 2],
    strip: &Option<Strip>,
    g: &Gemm<'_>,
) -> Result<()> {
    let settings = plan_tuning(&g.out.device).async_f32.ok_or_else(|| {
        Error::invalid("matmul", "the pipelined GEMM is turned off on this device")
    })?;
    let (_, _, n) = g.dims();
    let main = strip.map_or(n, |s| s.col);
    run(settings, *tile, staging, main, g)?;
    match strip {
        Some(s) => matmul_tiled::run_tile(&s.tile, s.k4, s.col, n - s.col, g),
        None => Ok(()),
    }
}

/// Columns `0 .. width` of `g` through matmul_async.cl.
fn run(
    s: AsyncTuning,
    t: AsyncTile,
    [a, b]: [Staging; 2],
    width: usize,
    g: &Gemm<'_>,
) -> Result<()> {
    let (m, k, _) = g.dims();
    let aligned = m.is_multiple_of(t.tm as usize)
        && width.is_multiple_of(t.tn as usize)
        && k.is_multiple_of(s.k_step as usize);
    let flag = |st: Staging, name: char| match st {
        Staging::Vec => format!(" -D{name}_VEC"),
        Staging::NarrowK => format!(" -D{name}_KFAST"),
        Staging::Narrow => String::new(),
    };
    let options = format!(
        "{} -DTM={} -DTN={} -DWM={} -DWN={} -DSTAGES={} -DTK={}{}{}{}{}{}",
        DType::F32.build_option(),
        t.tm,
        t.tn,
        t.wm,
        t.wn,
        s.stages,
        s.k_step,
        match s.max_registers {
            0 => String::new(),
            r => format!(" -cl-nv-maxrregcount={r}"),
        },
        flag(a, 'A'),
        flag(b, 'B'),
        if aligned { " -DALIGNED" } else { "" },
        if g.row_sums.is_some() {
            " -DROW_SUMS"
        } else {
            ""
        },
    );
    let source = matmul_source(MATMUL_ASYNC, g.activation, Class::of(DType::F32));
    let program = program(&g.out.device, &source, &options)?;
    let shape = ((t.tm as usize, t.tn as usize), [t.group(), 1, 1]);
    let sums = g.row_sums.is_some();
    matmul_tiled::run_columns(&program, "matmul_async", 0, width, shape, g, sums)
}

/// Small integers make every product and sum exact in f32: the device must match the host bit for
/// bit (the product, and A's row sums from a -DROW_SUMS build), over ragged M, N and K with
/// several steps of K, for each way of reaching an operand: A with K contiguous (4-byte copies
/// along K) and B with N contiguous (16-byte copies); A with M contiguous and B with K
/// contiguous; A with M contiguous but an odd K stride (4-byte copies along M).
fn probe(device: &Device, s: AsyncTuning, tile: AsyncTile) -> Result<bool> {
    let e = Exact::new(136, 132, 70);
    let (m, n, k) = (e.m, e.n, e.k);
    let f32 = DType::F32;
    let a = e.a_on(device, f32, true)?;
    let b = e.b_on(device, f32, true)?;
    let a_mk = e.a_on(device, f32, false)?;
    let b_nk = e.b_on(device, f32, false)?;
    let a_odd =
        Exact::stored(device, f32, (k, m, m + 1), &|j, r| e.a[r * k + j])?.transpose(0, 1)?;
    let layouts = [(&a, &b), (&a_mk, &b_nk), (&a_odd, &b)];
    for ((a, b), with_sums) in layouts.into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let out = Tensor::alloc(&[m, n], f32, device)?;
        let sums = Tensor::alloc(&[m], f32, device)?;
        let layout = |t: &Tensor| OperandLayout {
            strides: [t.strides[0], t.strides[1]],
            batch_strides: Vec::new(),
            offset: t.offset,
        };
        let staging = [staging_of(&layout(a), 1), staging_of(&layout(b), 0)];
        let g = Gemm {
            row_sums: with_sums.then_some(&sums),
            ..Gemm::plain(&out, a, b)
        };
        run(s, tile, staging, n, &g)?;
        if out.to_vec_f64()? != e.want || (with_sums && sums.to_vec_f64()? != e.sums) {
            return Ok(false);
        }
    }
    Ok(true)
}
