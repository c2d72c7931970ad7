//! netcl-ops: the Tensor and its ops, each with an OpenCL kernel and a host (ndarray) reference.
#[macro_use]
mod element;
mod attention;
mod binary;
mod create;
mod dropout;
mod expr;
mod fused;
mod index;
mod launch;
pub mod layout;
mod matmul;
mod norm;
mod random;
mod reduce;
mod rope;
mod shape_ops;
mod softmax;
mod tensor;
pub mod testing;
mod unary;
mod views;

pub use attention::Attention;
pub use element::{Element, HostData};
pub use expr::{BinaryOp, Expr, UnaryOp};
pub use fused::{fused, fused_into};
pub use index::INDEX_CHECK_LIMIT;
pub use matmul::{Activation, MatmulOptions};
pub use netcl_core_devices::{DType, Device, Error, Result};
pub use netcl_kernels::GemmTile;
pub use norm::{BatchNorm, NormGrads};
pub use random::Generator;
pub use reduce::ReduceOp;
pub use softmax::{acc_dtype, CrossEntropy};
pub use tensor::{Storage, Tensor};
