//! The 1B-class workloads of netcl-bench (`--llama 1b,1b_lora,3b_lora`, and tiny twins for CPU devices): AdamW steps under bf16 autocast with every block checkpointed and the chunked loss, LoRA r16 on all linear layers over a bf16 base; tokens/s, pool peak against Llama::memory_estimate, model FLOPs utilisation.
use crate::{Record, Runner};
use netcl_bench::time_per_call;
use netcl_bench::train::LlamaStep;
use netcl_core_devices::{DType, Error, Result};
use netcl_models::{Llama, LlamaConfig, RopeScaling};
use netcl_nn::LoraConfig;
use netcl_ops::RopeStyle;

/// The H100 SXM's dense bf16 tensor-core peak (FLOP/s), what MFU divides by.
const PEAK_BF16_FLOPS: f64 = 989e12;

/// One workload: its `--llama` key, record name, shape, LoRA (r16 over a bf16 base) and a
/// forced loss chunk (None: the automatic rule).
struct Scale {
    key: &'static str,
    name: &'static str,
    cfg: LlamaConfig,
    lora: bool,
    chunk: Option<usize>,
}

/// TinyLlama-1.1B's shape (dim 2048, 22 layers, 32 heads, 4 key/value heads, SwiGLU 5632,
/// vocabulary 32000, own output head), context 2048.
pub(crate) fn tiny_llama_1b() -> LlamaConfig {
    LlamaConfig {
        dim: 2048,
        n_layers: 22,
        n_heads: 32,
        n_kv_heads: 4,
        vocab_size: 32000,
        hidden_dim: 5632,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Halves,
        max_seq_len: 2048,
        tied_embeddings: false,
        dtype: DType::F32,
        rope_scaling: None,
        arch: Default::default(),
    }
}

/// Llama-3.2-3B's shape (dim 3072, 28 layers, 24 heads, 8 key/value heads, SwiGLU 8192,
/// vocabulary 128256, tied head, Llama 3 RoPE scaling), context 2048.
fn llama_3b() -> LlamaConfig {
    LlamaConfig {
        dim: 3072,
        n_layers: 28,
        n_heads: 24,
        n_kv_heads: 8,
        vocab_size: 128256,
        hidden_dim: 8192,
        rope_theta: 500000.0,
        tied_embeddings: true,
        rope_scaling: Some(RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        ..tiny_llama_1b()
    }
}

fn workloads() -> Vec<Scale> {
    // The tiny twins run the same code paths at sizes a CPU device trains in seconds (the 3B
    // twin's loss in chunks of 32 rows, as a 128k vocabulary's is).
    let tiny = |c: LlamaConfig, (dim, n_heads, n_kv_heads), vocab_size| LlamaConfig {
        dim,
        n_layers: 2,
        n_heads,
        n_kv_heads,
        vocab_size,
        hidden_dim: dim * 11 / 4,
        max_seq_len: 64,
        ..c
    };
    let scale = |key, name, cfg, lora, chunk| Scale {
        key,
        name,
        cfg,
        lora,
        chunk,
    };
    vec![
        scale("1b", "llama1b_bf16_ckpt", tiny_llama_1b(), false, None),
        scale(
            "1b_lora",
            "llama1b_lora_r16_bf16_ckpt",
            tiny_llama_1b(),
            true,
            None,
        ),
        scale(
            "3b_lora",
            "llama3b_lora_r16_bf16_ckpt",
            llama_3b(),
            true,
            None,
        ),
        scale(
            "1b_tiny",
            "llama1b_tiny",
            tiny(tiny_llama_1b(), (64, 4, 1), 512),
            false,
            None,
        ),
        scale(
            "1b_lora_tiny",
            "llama1b_lora_tiny",
            tiny(tiny_llama_1b(), (64, 4, 1), 512),
            true,
            None,
        ),
        scale(
            "3b_lora_tiny",
            "llama3b_lora_tiny",
            tiny(llama_3b(), (96, 6, 2), 1000),
            true,
            Some(32),
        ),
    ]
}

/// The batch: `NETCL_BENCH_BATCH` (a number, or `fit`: the largest power of two up to 64
/// whose estimated peak fits in nine tenths of the device's memory), else 4.
fn batch(model: &Llama, mem: u64) -> Result<usize> {
    let t = model.config.max_seq_len;
    match std::env::var("NETCL_BENCH_BATCH").as_deref() {
        Err(_) => Ok(4),
        Ok("fit") => {
            let fits = |b: usize| {
                (model.memory_estimate(b, t, Some(DType::BF16), 1) as f64) <= 0.9 * mem as f64
            };
            Ok((0..=6)
                .map(|e| 1 << e)
                .take_while(|&b| fits(b))
                .last()
                .unwrap_or(1))
        }
        Ok(v) => v.parse::<usize>().ok().filter(|&b| b > 0).ok_or_else(|| {
            Error::invalid(
                "NETCL_BENCH_BATCH",
                format!("{v:?}: use a positive number or fit"),
            )
        }),
    }
}

impl Runner {
    /// The workloads named in `which` (never part of `all`): one AdamW step per call under
    /// bf16 autocast, every block checkpointed; prints tokens/s, model FLOPs utilisation
    /// (`(6 x matmul parameters + 6 x layers x dim x T) x tokens`, causal attention forward and
    /// backward, over the H100's 989 TFLOP/s dense bf16), the pool's peak and the estimate.
    pub(crate) fn llama_scale(&mut self, which: &str) -> Result<()> {
        let named = |k: &str| which.split(',').any(|x| x == k);
        for w in workloads().into_iter().filter(|w| named(w.key)) {
            let mut cfg = w.cfg;
            if w.lora {
                cfg.dtype = DType::BF16;
            }
            // Each workload's own peak (the host counts its live tensors instead of a pool).
            if !self.dev.is_host() {
                netcl_core_memory::Pool::of(&self.dev)?.empty_cache();
            }
            netcl_core_memory::reset_held_peak(&self.dev)?;
            let base = netcl_core_memory::held(&self.dev)?.0;
            let (t, layers, dim) = (cfg.max_seq_len, cfg.n_layers, cfg.dim);
            // Parameters that take part in products: all but an untied embedding table.
            let untied_table = match cfg.tied_embeddings {
                true => 0,
                false => cfg.vocab_size * cfg.dim,
            };
            let mm_params = (cfg.num_parameters() - untied_table) as f64;
            let mut model = Llama::new(cfg, &self.dev, &mut self.gen)?.with_checkpointing(1);
            model.loss_chunk_rows = w.chunk;
            if w.lora {
                let lora = LoraConfig {
                    rank: 16,
                    alpha: 32.0,
                    dropout: 0.0,
                    targets: vec!["all-linear".into()],
                };
                model.add_lora(&lora, &mut self.gen)?;
            }
            let b = batch(&model, self.dev.info().global_mem_bytes)?;
            let estimate = model.memory_estimate(b, t, Some(DType::BF16), 1);
            let mut step = LlamaStep::from_model(model, b, &self.dev)?;
            step.autocast = Some(DType::BF16);
            let secs = time_per_call(&self.dev, 2, 3, 3, || step.step())?;
            let tokens = (b * t) as f64;
            let attention = 6.0 * (layers * dim * t) as f64;
            let flops = (6.0 * mm_params + attention) * tokens;
            // A frozen base computes no weight gradients: 4 x its parameters a token.
            let frozen = (4.0 * mm_params + attention) * tokens;
            let peak = netcl_core_memory::held(&self.dev)?.1 - base;
            let size = |b: usize| match b >> 30 {
                0 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
                _ => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
            };
            let name = format!("{}_B{b}_T{t}", w.name);
            println!(
                "{:<12} {name:<36} {:.0} tokens/s, {:.1} ms/step, MFU {:.3}{}, pool peak {} \
                 (estimate {}, {:.3}x)",
                "llama",
                tokens / secs,
                secs * 1e3,
                flops / secs / PEAK_BF16_FLOPS,
                match w.lora {
                    true => format!(
                        " (4N for the frozen base: {:.3})",
                        frozen / secs / PEAK_BF16_FLOPS
                    ),
                    false => String::new(),
                },
                size(peak),
                size(estimate),
                estimate as f64 / peak.max(1) as f64
            );
            super::llama::print_kernels(&self.dev, &name, || step.step())?;
            self.records.push(Record {
                suite: "llama",
                name,
                ms: secs * 1e3,
                gbps: None,
                tflops: Some(flops / secs / 1e12),
                kernels: 0,
                driver_allocs_per_step: None,
            });
        }
        Ok(())
    }
}
