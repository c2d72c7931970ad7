//! netcl-distributed: collectives across devices (one thread per device, host staging) and data-parallel training.
mod bucket;
mod collectives;
mod ddp;
mod devices;
mod group;
mod hub;
#[cfg(feature = "mpi")]
mod mpi;
mod reduce;
mod relay;
mod staging;
#[cfg(feature = "mpi")]
mod tier;
mod zero;

pub use bucket::CopyRecord;
pub use collectives::CHUNK_ELEMS;
pub use ddp::{shard_path, DataParallel, DdpOptions};
pub use devices::{
    describe_devices, mixed_devices, parse_devices, select_of_kinds, take_devices_flag,
};
pub use group::{Comm, Group, DEFAULT_TIMEOUT};
#[cfg(feature = "mpi")]
pub use mpi::MpiWorld;
pub use reduce::{proportional_split, split_range, ReduceOp};
pub use zero::{shard_owners, ShardedOptimizer};
