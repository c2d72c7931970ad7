//! netcl-models: model architectures built from netcl's layers (Llama: training forward, KV-cache generation, sampling).
//!
//! A crate of its own rather than part of `netcl-nn`: models combine layers, caches and sampling
//! and grow with architectures (and their importers), while `nn` stays the small set of layers
//! every model uses.
pub mod llama;

pub use llama::{
    generate, generate_until, Arch, DecodeGraph, Family, KvCache, Llama, LlamaConfig, LoraSpec,
    Norm, Positions, RopeScaling, Sampler, Sampling, StopStrings,
};
