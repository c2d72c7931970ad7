//! GEMM for CPU OpenCL devices (PoCL) through kernels/matmul_cpu.cl: which path a product takes (B packed into column panels, or read in place for one block row of A), the register blocking, and the launch.
use super::{matmul_source, MatmulOptions};
use crate::base::layout::KernelLayout;
use crate::base::tensor::Tensor;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, DeviceKind, Error, Result};
use netcl_kernels::sources::MATMUL_CPU;
use netcl_kernels::{program, Kernel};
use std::sync::OnceLock;

/// The kernels' names, passed to the build as `-DCPU_NN_KERNEL`, `-DCPU_NT_KERNEL` and
/// `-DCPU_PACK_KERNEL`.
const NN_KERNEL: &str = "matmul_cpu_nn";
const NT_KERNEL: &str = "matmul_cpu_nt";
const PACK_KERNEL: &str = "matmul_cpu_pack";
/// Rows of B per work-group of the packing kernel.
const PACK_GROUP: usize = 64;

/// How matmul_cpu.cl computes a product, with the blocking in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuGemm {
    path: Path,
    blk: Blocking,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// B copied into column panels, then the NN kernel (any strides).
    Packed,
    /// The NN kernel on B itself (`sbn == 1`): one block row of A, where packing would copy all
    /// of B to read it once.
    Nn,
    /// Vectors of partial dot products (`sak == sbk == 1`: B a transposed row-major weight), for
    /// one block row of A.
    Nt,
}

/// The register blocking: rows and vectors of columns per work-item of the NN kernel, rows and
/// columns per work-item of the NT kernel, work-items per work-group (along M). `NETCL_CPU_GEMM=rm,nv,rmt,rn,group`
/// overrides the default (8 x 32 and 4 x 4 in f32, groups of 4: the fastest on the MLP's GEMM
/// shapes on a 2-core AMD EPYC, docs/performance.md); `NETCL_CPU_GEMM=0` sends CPU devices to
/// the portable kernel (matmul.cl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocking {
    rm: usize,
    nv: usize,
    rmt: usize,
    rn: usize,
    group: usize,
}

impl Blocking {
    /// The blocking in force, read once per process; None when the CPU kernel is switched off.
    fn get() -> Option<Blocking> {
        static B: OnceLock<Option<Blocking>> = OnceLock::new();
        *B.get_or_init(|| {
            let default = Blocking {
                rm: 8,
                nv: 2,
                rmt: 4,
                rn: 4,
                group: 4,
            };
            let Ok(v) = std::env::var("NETCL_CPU_GEMM") else {
                return Some(default);
            };
            let f: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            match f[..] {
                [0] => None,
                [rm, nv, rmt, rn, group] if rm * nv * rmt * rn * group > 0 => Some(Blocking {
                    rm,
                    nv,
                    rmt,
                    rn,
                    group,
                }),
                _ => {
                    log::warn!(
                        "NETCL_CPU_GEMM={v:?} is not rm,nv,rmt,rn,group or 0; using the default"
                    );
                    Some(default)
                }
            }
        })
    }
}

/// How a `dtype` product of `m` rows and depth `k` with strides `[sam, sak, sbk, sbn]` runs on
/// `device` through matmul_cpu.cl, if it does (a CPU OpenCL device, f32 or f64, `k > 0`).
pub(crate) fn cpu_gemm(
    device: &Device,
    dtype: DType,
    [m, k]: [usize; 2],
    strides: [usize; 4],
) -> Option<CpuGemm> {
    let [_, sak, sbk, sbn] = strides;
    let float = matches!(dtype, DType::F32 | DType::F64);
    if device.kind() != DeviceKind::Cpu || !float || k == 0 {
        return None;
    }
    let blk = Blocking::get()?;
    let path = if m > blk.rm {
        Path::Packed
    } else if sak == 1 && sbk == 1 {
        Path::Nt
    } else if sbn == 1 {
        Path::Nn
    } else {
        Path::Packed
    };
    Some(CpuGemm { path, blk })
}

/// `out (batch, M, N) = act(a x b + bias)` through matmul_cpu.cl as `how` says; `layout` holds the
/// batch offsets of out, a and b, `dims` is `[M, N, K, batch]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    how: CpuGemm,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    layout: &KernelLayout,
    dims: [usize; 4],
    strides: [usize; 4],
    opts: MatmulOptions<'_>,
) -> Result<()> {
    let blk = how.blk;
    let [m, n, k, batch] = dims;
    let [sam, sak, sbk, sbn] = strides;
    let dtype = out.dtype;
    let vn = 64 / dtype.size(); // one 512-bit vector
    let w = blk.nv * vn; // columns per NN work-item and packed panel
    let options = format!(
        "{} -DVN={vn} -DRM={} -DNV={} -DRMT={} -DRN={} -DCPU_NN_KERNEL={NN_KERNEL} \
         -DCPU_NT_KERNEL={NT_KERNEL} -DCPU_PACK_KERNEL={PACK_KERNEL}",
        dtype.build_option(),
        blk.rm,
        blk.nv,
        blk.rmt,
        blk.rn
    );
    let source = matmul_source(MATMUL_CPU, opts.activation, Class::of(dtype));
    let prog = program(&out.device, &source, &options)?;
    let u = |x: usize| x as u32;
    let panels = n.div_ceil(w);
    let packed = match how.path {
        Path::Packed => {
            if batch * panels * k * w > u32::MAX as usize {
                return Err(Error::shape(
                    "matmul",
                    format!("B packed for the CPU kernel ({batch} x {panels} x {k} x {w}) reaches past the 32-bit kernel index"),
                ));
            }
            let bp = Tensor::alloc(&[batch, panels, k, w], dtype, &out.device)?;
            let mut pack = Kernel::new(&prog, PACK_KERNEL)?;
            pack.arg_mem(bp.mem()?)?.arg_mem(b.mem()?)?.arg(layout)?;
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
    let (name, rows, cols) = match how.path {
        Path::Nt => (NT_KERNEL, blk.rmt, blk.rn),
        _ => (NN_KERNEL, blk.rm, w),
    };
    let mut kern = Kernel::new(&prog, name)?;
    let bmem = match &packed {
        Some(bp) => bp.mem()?,
        None => b.mem()?,
    };
    kern.arg_mem(out.mem()?)?
        .arg_mem(a.mem()?)?
        .arg_mem(bmem)?
        .arg_mem(opts.bias.map_or_else(|| out.mem(), |t| t.mem())?)?
        .arg(layout)?;
    let args: Vec<usize> = match how.path {
        Path::Packed => vec![m, n, k, sam, sak, w, k * w, panels * k * w],
        Path::Nn => vec![m, n, k, sam, sak, sbk, w, 0],
        Path::Nt => vec![m, n, k, sam, sbn],
    };
    for v in args {
        kern.arg(&u(v))?;
    }
    kern.arg(&u(opts.bias.is_some() as usize))?;
    let elems = a.numel() + b.numel() + batch * m * n + opts.bias.map_or(0, |_| n);
    kern.declare(
        (elems * dtype.size()) as u64,
        2 * (batch * m * n * k) as u64,
    );
    let blocks = m.div_ceil(rows);
    let group = blk.group.min(blocks);
    kern.launch(
        &[blocks.next_multiple_of(group), n.div_ceil(cols), batch],
        &[group, 1, 1],
    )
}
