//! netcl-ops: the Tensor and its ops, each with an OpenCL kernel and a host (ndarray) reference.
#[macro_use]
mod element;
mod binary;
mod create;
mod dropout;
mod expr;
mod fused;
mod index;
mod launch;
pub mod layout;
mod matmul;
mod random;
mod rope;
mod shape_ops;
mod tensor;
pub mod testing;
mod unary;
mod views;

pub use element::{Element, HostData};
pub use expr::{BinaryOp, Expr, UnaryOp};
pub use fused::{fused, fused_into};
pub use index::INDEX_CHECK_LIMIT;
pub use matmul::{Activation, MatmulOptions};
pub use netcl_core_devices::{DType, Device, Error, Result};
pub use netcl_kernels::GemmTile;
pub use random::Generator;
pub use tensor::{Storage, Tensor};
mod conv;
mod pool;
pub use conv::Conv2dParams;
pub use pool::Pool2dParams;
