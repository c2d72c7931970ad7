//! netcl: deep learning on OpenCL (any vendor's GPU, CPUs through PoCL) with a host fallback.
#![doc = include_str!("../../../README.md")]
pub use netcl_core_devices as devices;
pub use netcl_core_memory as memory;
pub use netcl_data as data;
pub use netcl_kernels as kernels;
pub use netcl_ops as ops;
pub use netcl_profiling as profiling;

pub use netcl_core_devices::{DType, Device, DeviceInfo, DeviceKind, Error, Result};
pub use netcl_core_memory::{Pool, PoolStats};
pub use netcl_ops::{Generator, Tensor};

/// Everything a training script needs: `use netcl::prelude::*`.
pub mod prelude {
    pub use crate::{DType, Device, Error, Generator, Pool, Result, Tensor};
}
