//! Llama: config, blocks (RMSNorm, grouped-query attention with RoPE, SwiGLU), the model, its KV cache and sampling.
mod block;
mod cache;
mod checkpoint;
mod config;
mod decode;
mod decode_graph;
mod dtype;
mod hf;
mod hf_config;
mod hf_names;
mod lora;
mod memory;
mod model;
mod norm;
mod sample;
mod stored;

pub use block::{Attention, Block, FeedForward};
pub use cache::KvCache;
pub use config::{Arch, Family, LlamaConfig, RopeScaling};
pub use decode_graph::DecodeGraph;
pub use hf_config::family_of;
pub use lora::LoraSpec;
pub use model::{Llama, Positions};
pub use norm::Norm;
pub use sample::{generate, generate_until, Sampler, Sampling, StopStrings};
