//! The fused tier: elementwise expressions, the one-row-per-op unary table, GEMM epilogue activations, fused plans, their code generation and program cache, running them (kernel or host evaluation), and grouped launches.
pub(crate) mod activation;
pub(crate) mod codegen;
pub(crate) mod eval;
pub(crate) mod expr;
pub(crate) mod groups;
pub(crate) mod host_eval;
pub(crate) mod plan;
pub(crate) mod unary_table;
