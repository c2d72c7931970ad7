//! Launches kernels/matmul_cpu.cl on CPU OpenCL devices (PoCL): B packed into column panels, or read in place for one block row of A, in the planner's register blocking.
use super::opencl::Gemm;
use super::plan::CpuPath;
use super::source::matmul_source;
use crate::base::tensor::Tensor;
use crate::fused::expr::Class;
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::MATMUL_CPU;
use netcl_kernels::{program, CpuBlocking, Kernel};

/// Rows of B per work-group of the packing kernel.
const PACK_GROUP: usize = 64;

/// `g` through matmul_cpu.cl along `path` in blocking `blk`.
pub(super) fn launch(path: CpuPath, blk: CpuBlocking, g: &Gemm<'_>) -> Result<()> {
    let (out, a, b) = (g.out, g.a, g.b);
    let (m, k, n) = g.dims();
    let batch = g.batches();
    let layout = g.layout()?;
    let [sam, sak, sbk, sbn] = g.strides();
    let dtype = out.dtype;
    let (rm, nv, rmt, rn) = (
        blk.rm as usize,
        blk.nv as usize,
        blk.rmt as usize,
        blk.rn as usize,
    );
    let vn = 64 / dtype.size(); // one 512-bit vector
    let w = nv * vn; // columns per NN work-item and packed panel
    let options = format!(
        "{} -DVN={vn} -DRM={rm} -DNV={nv} -DRMT={rmt} -DRN={rn}",
        dtype.build_option(),
    );
    let source = matmul_source(MATMUL_CPU, g.activation, Class::of(dtype));
    let prog = program(&out.device, &source, &options)?;
    let u = |x: usize| x as u32;
    let panels = n.div_ceil(w);
    let packed = match path {
        CpuPath::Packed => {
            if batch * panels * k * w > u32::MAX as usize {
                return Err(Error::shape(
                    "matmul",
                    format!("B packed for the CPU kernel ({batch} x {panels} x {k} x {w}) reaches past the 32-bit kernel index"),
                ));
            }
            let bp = Tensor::alloc(&[batch, panels, k, w], dtype, &out.device)?;
            let mut pack = Kernel::new(&prog, "matmul_cpu_pack")?;
            pack.arg_mem(bp.mem()?)?.arg_mem(b.mem()?)?.arg(&layout)?;
            for v in [k, n, sbk, sbn, panels] {
                pack.arg(&u(v))?;
            }
            pack.declare(((b.numel() + bp.numel()) * dtype.size()) as u64, 0);
            let group = PACK_GROUP.min(k);
            pack.launch(&[k.next_multiple_of(group), panels, batch], &[group, 1, 1])?;
            Some(bp)
        }
        _ => None,
    };
    let (name, rows, cols) = match path {
        CpuPath::Nt => ("matmul_cpu_nt", rmt, rn),
        _ => ("matmul_cpu_nn", rm, w),
    };
    let mut kern = Kernel::new(&prog, name)?;
    let bmem = match &packed {
        Some(bp) => bp.mem()?,
        None => b.mem()?,
    };
    kern.arg_mem(out.mem()?)?
        .arg_mem(a.mem()?)?
        .arg_mem(bmem)?
        .arg_mem(g.bias.map_or_else(|| out.mem(), |t| t.mem())?)?
        .arg(&layout)?;
    let args: Vec<usize> = match path {
        CpuPath::Packed => vec![m, n, k, sam, sak, w, k * w, panels * k * w],
        CpuPath::Nn => vec![m, n, k, sam, sak, sbk, w, 0],
        CpuPath::Nt => vec![m, n, k, sam, sbn],
    };
    for v in args {
        kern.arg(&u(v))?;
    }
    kern.arg(&u(g.bias.is_some() as usize))?;
    let elems = a.numel() + b.numel() + batch * m * n + g.bias.map_or(0, |_| n);
    kern.declare(
        (elems * dtype.size()) as u64,
        2 * (batch * m * n * k) as u64,
    );
    let blocks = m.div_ceil(rows);
    let group = (blk.group as usize).min(blocks);
    kern.launch(
        &[blocks.next_multiple_of(group), n.div_ceil(cols), batch],
        &[group, 1, 1],
    )
}
