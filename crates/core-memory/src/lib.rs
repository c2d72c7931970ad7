//! netcl-core-memory: a bucket pool per OpenCL device and host<->device copies through pinned staging.
pub mod capture;
mod held;
mod host;
mod host_cache;
mod pool;
mod size_class;
mod transfer;
pub mod watch;

pub use held::{held, reset_held_peak};
pub use host::{
    host_charge, host_check, host_memory, host_release, host_vec, reset_host_peak, set_host_limit,
    HostBuf,
};
pub use host_cache::give as host_give;
pub use netcl_core_devices::parse_bytes;
pub use pool::{Block, Pool, PoolStats};
pub use size_class::{size_class, SLAB_BYTES, SMALL_MAX};
pub use transfer::{
    copy, enqueue_read, enqueue_write, read, read_async, write, write_async, Pending, PinnedBuffer,
    STAGING_CHUNK, STAGING_THRESHOLD,
};
