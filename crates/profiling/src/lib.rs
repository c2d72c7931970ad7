//! netcl-profiling: Kernel event timing, per-kernel statistics and Chrome trace export (filled by the profiling issue).
