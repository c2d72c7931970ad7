//! The former name of hf_finetune, kept working: the same program and flags (it now fine-tunes Llama, Qwen2, Mistral and GPT-2 directories).
//!
//! `cargo run --release --example llama_finetune -- --model DIR ...` (see examples/hf_finetune.rs)
#[path = "hf_finetune.rs"]
mod hf_finetune;

fn main() {
    hf_finetune::main_named("llama_finetune")
}
