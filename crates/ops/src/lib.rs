//! netcl-ops: the Tensor and its ops, each with an OpenCL kernel and a host (ndarray) reference.
#[macro_use]
mod element;
mod binary;
mod create;
mod launch;
pub mod layout;
mod random;
mod tensor;
pub mod testing;
mod views;

pub use binary::BinaryOp;
pub use element::{Element, HostData};
pub use netcl_core_devices::{DType, Device, Error, Result};
pub use random::Generator;
pub use tensor::{Storage, Tensor};
mod reduce;
pub use reduce::ReduceOp;
mod softmax;
pub use softmax::{acc_dtype, CrossEntropy};
mod norm;
pub use norm::{BatchNorm, NormGrads};
