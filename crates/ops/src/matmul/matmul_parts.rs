//! Launches kernels/matmul_parts.cl: the sum of a split-K product's partial products, with the bias and activation.
use super::plan::{Split, PARTS_GROUP};
use super::source::matmul_source;
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Result};
use netcl_kernels::sources::MATMUL_PARTS;
use netcl_kernels::{program, Kernel};

/// `out (M, N) = act(sum of parts (S, M, N) + bias)`.
pub(super) fn launch(
    out: &Tensor,
    parts: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
    split: &Split,
) -> Result<()> {
    let (s, m, n) = (parts.shape[0], parts.shape[1], parts.shape[2]);
    let wide = parts.dtype == DType::F32 && out.dtype != DType::F32;
    let flags = if wide { " -DPARTS_F32" } else { "" };
    let source = matmul_source(MATMUL_PARTS, act, Class::of(out.dtype));
    let program = program(
        &out.device,
        &source,
        &format!("{}{flags}", out.dtype.build_option()),
    )?;
    let mut kern = Kernel::new(&program, "matmul_parts")?;
    kern.arg_mem(out.mem()?)?
        .arg_mem(parts.mem()?)?
        .arg_mem(bias.map_or_else(|| out.mem(), |t| t.mem())?)?;
    for v in [s, n, bias.is_some() as usize, m * n, split.team] {
        kern.arg(&(v as u32))?;
    }
    kern.declare(
        (s * m * n * parts.dtype.size() + m * n * out.dtype.size()) as u64,
        (s * m * n) as u64,
    );
    let w = PARTS_GROUP / split.team;
    kern.launch(&[(m * n).div_ceil(w) * PARTS_GROUP], &[PARTS_GROUP])
}
