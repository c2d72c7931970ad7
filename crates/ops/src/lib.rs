//! netcl-ops: the Tensor and its ops, each with an OpenCL kernel and a host (ndarray) reference.
#[macro_use]
mod element;
mod binary;
mod create;
mod expr;
mod fused;
mod launch;
pub mod layout;
mod matmul;
mod random;
mod tensor;
pub mod testing;
mod unary;
mod views;

pub use element::{Element, HostData};
pub use expr::{BinaryOp, Expr, UnaryOp};
pub use fused::{fused, fused_into};
pub use matmul::{Activation, MatmulOptions};
pub use netcl_core_devices::{DType, Device, Error, Result};
pub use netcl_kernels::GemmTile;
pub use random::Generator;
pub use tensor::{Storage, Tensor};
