//! netcl-core-devices: OpenCL device discovery, capabilities, selection, netcl's one error type and its settings (`Config`).
mod args;
pub mod config;
pub mod debug;
mod device;
mod dtype;
mod error;
pub mod files;
mod info;
mod testing;

pub use args::{utf8_args, utf8_args_from};
pub use cl3;
pub use config::{parse_bytes, Config, MatmulPrecision, Setting};
pub use device::{ClDevice, Device, Selection};
pub use dtype::DType;
pub use error::{cl_code_name, is_oom_code, ClResultExt, Error, Result};
pub use info::{DeviceInfo, DeviceKind};
pub use opencl3;
pub use testing::{opencl_test_devices, test_devices};
