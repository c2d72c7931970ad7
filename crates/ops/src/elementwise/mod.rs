//! Elementwise ops: binary with broadcasting and unary, each a fused-tier expression launched as one kernel.
mod binary;
mod unary;
