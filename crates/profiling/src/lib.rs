//! netcl-profiling: kernel event timing, host spans, per-kernel statistics (GB/s, GFLOP/s) and Chrome/Perfetto trace export.
//!
//! On with `NETCL_PROFILE=1` (whole process; summary to stderr and trace to
//! `$NETCL_PROFILE_DIR/trace.json` at exit) or with a [`Profiler`] session:
//!
//! ```no_run
//! let p = netcl_profiling::Profiler::start();
//! // ... ops ...
//! let profile = p.stop();
//! eprintln!("{}", profile.summary_table());
//! profile.write_trace("trace.json").unwrap();
//! ```
//!
//! Off, every hook costs one relaxed atomic load and no OpenCL event is requested.
mod align;
mod clock;
mod collect;
mod exit;
mod launch;
mod profile;
mod span;
mod state;
mod summary;
mod trace;

pub use clock::now_ns;
pub use collect::stored_records;
pub use exit::env_trace_path;
pub use launch::{Launch, Probe};
pub use profile::{DeviceTrack, KernelRecord, Profile, SpanRecord, Work};
pub use span::{declare, span, span_in, Span};
pub use state::{enabled, env_enabled, Profiler};
pub use trace::{DEVICE_PID, HOST_PID, QUEUE_TID};
