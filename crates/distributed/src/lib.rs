//! netcl-distributed: collectives across devices (one thread per device, host staging) and data-parallel training.
mod collectives;
mod group;
mod hub;
mod reduce;
mod staging;

pub use collectives::CHUNK_ELEMS;
pub use group::{Comm, Group, DEFAULT_TIMEOUT};
pub use reduce::{proportional_split, split_range, ReduceOp};
