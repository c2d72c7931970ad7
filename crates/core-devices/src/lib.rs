//! netcl-core-devices: OpenCL device discovery, capabilities, selection, and netcl's one error type.
mod args;
pub mod debug;
mod device;
mod dtype;
mod error;
pub mod files;
mod info;
mod testing;

pub use args::{utf8_args, utf8_args_from};
pub use cl3;
pub use device::{ClDevice, Device, Selection};
pub use dtype::DType;
pub use error::{cl_code_name, is_oom_code, ClResultExt, Error, Result};
pub use info::{DeviceInfo, DeviceKind};
pub use opencl3;
pub use testing::{opencl_test_devices, test_devices};
