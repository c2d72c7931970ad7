//! netcl-ops: the Tensor and its ops, each with an OpenCL kernel and a host (ndarray) reference.
#[macro_use]
mod base;
mod fused;

// Op families: each on the base tier (and the fused tier where it builds on expressions); no
// family imports from another, with one exception: flash_attention asks matmul which tensor-core
// kind a device runs exactly (matmul's probe, the one place that knows). Vocabulary two families
// share lives in base (base::rope_types for rope and decode).
mod attention;
mod batch_norm;
mod conv;
mod create;
mod decode;
mod dropout;
mod elementwise;
mod flash_attention;
mod index;
mod matmul;
mod norm;
mod pool;
mod random;
mod reduce;
mod rope;
mod shape;
mod softmax;
mod sort;
pub mod testing;

pub use base::layout;

pub use attention::Attention;
pub use base::acc::acc_dtype;
pub use base::device_errors::{
    existing_index_error_record, index_error_record, INDEX_ERRORS_BUFFER,
};
pub use base::element::{Element, HostData};
pub use base::generator::{record_draws, replay_draws, DrawLog, Generator};
pub use base::index_checks::INDEX_CHECK_LIMIT;
pub use base::norm_params::NormGrads;
pub use base::read_async::TensorRead;
pub use base::tensor::{Storage, Tensor, VersionWatch};
pub use batch_norm::BatchNorm;
pub use conv::Conv2dParams;
pub use decode::{DecodeBlock, KvWrite, RmsScale, DECODE_MAX_HEAD_DIM};
pub use flash_attention::FLASH_ATTENTION_MAX_HEAD_DIM;
pub use fused::activation::Activation;
pub use fused::eval::{fused, fused_into};
pub use fused::expr::{BinaryOp, Expr, UnaryOp};
pub use fused::groups::{fused_into_groups, FusedGroup, FUSED_MAX_GROUPS};
pub use matmul::matmul_async::has_async_gemm;
pub use matmul::matmul_tc::has_tensor_cores;
/// The GEMM planner: `gemm::plan(&DeviceCaps, &GemmProblem) -> GemmPlan`, and the plan's parts.
pub use matmul::plan as gemm;
pub use matmul::precision::{
    device_float32_matmul_precision, float32_matmul_precision, set_device_float32_matmul_precision,
    set_float32_matmul_precision, MatmulPrecision, TensorCoreKind,
};
pub use matmul::{MatmulOptions, MatmulVectors};
pub use netcl_core_devices::{files, Config, DType, Device, Error, Result};
pub use netcl_kernels::{GemmTile, TcTile};
pub use pool::Pool2dParams;
pub use reduce::ReduceOp;
pub use rope::{RopeFreqs, RopePositions, RopeStyle};
pub use softmax::CrossEntropy;
