//! netcl-ops: the Tensor and its ops, each with an OpenCL kernel and a host (ndarray) reference.
#[macro_use]
mod element;
mod attention;
mod batch_norm;
mod binary;
mod checks;
mod conv;
mod create;
mod device_errors;
mod display;
mod dropout;
mod expr;
mod fused;
mod fused_groups;
mod host_eval;
mod index;
mod launch;
pub mod layout;
mod matmul;
mod matmul_cpu;
mod matmul_tc;
mod norm;
mod pool;
mod random;
mod reduce;
mod rope;
mod rows;
mod shape_ops;
mod softmax;
mod sort;
mod sorted_rows;
mod tensor;
pub mod testing;
mod unary;
mod unary_table;
mod views;
mod window;

pub use attention::Attention;
pub use batch_norm::BatchNorm;
pub use conv::Conv2dParams;
pub use device_errors::{existing_index_error_record, index_error_record, INDEX_ERRORS_BUFFER};
pub use element::{Element, HostData};
pub use expr::{BinaryOp, Expr, UnaryOp};
pub use fused::{fused, fused_into};
pub use fused_groups::{fused_into_groups, FusedGroup, FUSED_MAX_GROUPS};
pub use index::INDEX_CHECK_LIMIT;
pub use matmul::{Activation, MatmulOptions};
pub use matmul_tc::{
    device_float32_matmul_precision, float32_matmul_precision, has_tensor_cores,
    set_device_float32_matmul_precision, set_float32_matmul_precision, MatmulPrecision,
    TensorCoreKind,
};
pub use netcl_core_devices::{DType, Device, Error, Result};
pub use netcl_kernels::GemmTile;
pub use norm::NormGrads;
pub use pool::Pool2dParams;
pub use random::Generator;
pub use reduce::ReduceOp;
pub use rope::{RopeFreqs, RopePositions, RopeStyle};
pub use softmax::{acc_dtype, CrossEntropy};
pub use tensor::{Storage, Tensor, VersionWatch};
