//! netcl-kernels: OpenCL C from kernels/*.cl and each kernel's declaration, built per device with -D options, cached in memory and on disk, launched with checks against the declarations.
mod bound;
pub mod decl;
mod decls;
mod disk_cache;
pub mod gemm_tuning;
mod launch;
mod program;
pub mod signature;
pub mod sources;
mod tc_tile;
pub mod tuning;

pub use bound::{BoundArg, BoundKernel};
pub use decl::{KernelDecl, Param, Use};
pub use disk_cache::default_dir as cache_dir;
pub use gemm_tuning::{
    AsyncTile, AsyncTuning, CpuBlocking, PlanTuning, TileCost, WgChoice, WgTile,
};
pub use launch::{
    retired_kernels, set_after_sync_check, thread_launches, thread_launches_total, Kernel,
};
pub use program::{binary_cache_dir, build, program, Origin, Program};
pub use sources::Source;
pub use tc_tile::TcTile;
pub use tuning::{gemm_tile, plan_tuning, tc_tile, tuning_generation, GemmTile};

/// The work-group size netcl uses for one-dimensional kernels (few distinct local sizes keep PoCL fast).
pub const GROUP_1D: usize = 256;
