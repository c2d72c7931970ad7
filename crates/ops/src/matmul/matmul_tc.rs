//! Launches kernels/matmul_tc.cl (tensor cores through inline PTX `mma.sync`, NVIDIA) in the planner's tiling, and probes which devices and kinds run it exactly.
use super::opencl::Gemm;
use super::plan::TcOperand;
use super::precision::{device_float32_matmul_precision, MatmulPrecision, TensorCoreKind};
use super::probes::{probed, Exact, Probes};
use super::source::matmul_source;
use super::tensor_cores;
use crate::base::tensor::Tensor;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::MATMUL_TC;
use netcl_kernels::{program, tc_tile, TcTile};
use std::sync::OnceLock;

/// Whether `device` runs matmul_tc.cl for `kind` with exact results: probed once per device and
/// kind (NVIDIA OpenCL devices only, as the kernel is PTX; [`Config::tensor_cores`](netcl_core_devices::Config::tensor_cores),
/// `NETCL_TENSOR_CORES=0`, turns it off).
pub fn has_tensor_cores(device: &Device, kind: TensorCoreKind) -> bool {
    static PROBES: Probes<(usize, TensorCoreKind)> = OnceLock::new();
    let enabled = netcl_core_devices::Config::get().tensor_cores;
    probed(&PROBES, (device.ordinal(), kind), device, enabled, || {
        probe(device, kind)
            .map_err(|e| format!("tensor cores ({kind:?}) unavailable on {device}: {e}"))
    })
}

/// The tensor-core kind a `dtype` product on `device` uses now, if any.
pub(crate) fn tensor_core_kind(device: &Device, dtype: DType) -> Option<TensorCoreKind> {
    let kind = match dtype {
        DType::F32 if device_float32_matmul_precision(device) == MatmulPrecision::High => {
            TensorCoreKind::Tf32
        }
        DType::BF16 => TensorCoreKind::Bf16,
        DType::F16 => TensorCoreKind::F16,
        _ => return None,
    };
    has_tensor_cores(device, kind).then_some(kind)
}

/// `g` through matmul_tc.cl in `tile`, its operands in `forms`.
pub(super) fn launch(
    kind: TensorCoreKind,
    tile: &TcTile,
    forms: [TcOperand; 2],
    g: &Gemm<'_>,
) -> Result<()> {
    tile.check(&g.out.device)?;
    let (m, _, n) = g.dims();
    let (a, bt) = tensor_cores::operands(g, forms)?;
    let a_mn = forms[0] == TcOperand::Mn;
    let aligned = m.is_multiple_of(tile.rows()) && n.is_multiple_of(tile.cols());
    let flags = [
        (aligned, " -DALIGNED"),
        (a_mn, " -DA_MN"),
        (forms[1] == TcOperand::Mn, " -DB_KN"),
        (g.out.dtype != kind.dtype(), " -DC_F32"),
    ];
    let flags: String = flags.iter().filter(|f| f.0).map(|f| f.1).collect();
    let source = matmul_source(MATMUL_TC, g.activation, Class::of(kind.dtype()));
    let options = format!(
        "{} {} {}{flags}",
        kind.dtype().build_option(),
        kind.define(),
        tile.options(a_mn)
    );
    let program = program(&g.out.device, &source, &options)?;
    let mut kern = tensor_cores::kernel(kind, &program, "matmul_tc", g, (&a, &bt), a_mn)?;
    let (rows, cols, group) = (tile.rows(), tile.cols(), tile.group());
    kern.launch(
        &[n.div_ceil(cols) * group, m.div_ceil(rows), g.batches()],
        &[group, 1, 1],
    )
}

/// Small integers make every product and sum exact in each input format and in f32: the device
/// must match the host bit for bit (ragged M, N, K over two K steps, B transposed), in the
/// device's tiling.
fn probe(device: &Device, kind: TensorCoreKind) -> Result<bool> {
    let e = Exact::new(40, 24, 70);
    let dtype = kind.dtype();
    let a = e.a_on(device, dtype, true)?;
    let b = e.b_on(device, dtype, false)?; // (k, n) with K contiguous
    let out = Tensor::alloc(&[e.m, e.n], dtype, device)?;
    let q = 16 / dtype.size();
    let form = match e.k.next_multiple_of(q) {
        kp if kp == e.k => TcOperand::Copy,
        kp => TcOperand::Pad(kp),
    };
    let g = Gemm::plain(&out, &a, &b);
    launch(kind, &tc_tile(device), [form, form], &g)?;
    Ok(out.to_vec_f64()? == e.want)
}
