//! The fused tier: elementwise expressions, the one-row-per-op unary table, GEMM epilogue activations, fused kernel plans (codegen, cache, launch), their host evaluation, and grouped launches.
pub(crate) mod activation;
pub(crate) mod expr;
pub(crate) mod groups;
pub(crate) mod host_eval;
pub(crate) mod plan;
pub(crate) mod unary_table;
