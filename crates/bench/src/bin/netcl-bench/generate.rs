//! Generation workloads beyond the 110M f32 one: 110M with bf16 weights (batch 1, and 32 prompts of different lengths) and the 1B-class shape in bf16, batch 1, against the weights' bandwidth limit.
use crate::scale::tiny_llama_1b;
use crate::{Record, Runner};
use netcl_core_devices::{DType, Error, Result};
use netcl_models::{generate, Llama, LlamaConfig, Sampler, Sampling};
use netcl_nn::Module;
use std::time::Instant;

impl Runner {
    /// `generate_bf16`, `generate_b32` and `generate_1b` of `--llama`.
    pub(crate) fn generations(&mut self, on: &dyn Fn(&str) -> bool) -> Result<()> {
        let c110 = LlamaConfig {
            max_seq_len: 512,
            dtype: DType::BF16,
            ..LlamaConfig::llama_110m(32000)
        };
        if on("generate_bf16") {
            let prompts = vec![vec![1u32, 50, 300, 7]];
            self.generation("llama110m_bf16_generate", &c110, &prompts, 256)?;
        }
        if on("generate_b32") {
            // 32 prompts of 4 to 32 tokens (`NETCL_BENCH_PROMPTS`: the first N of them instead).
            let n = match std::env::var("NETCL_BENCH_PROMPTS") {
                Ok(v) => v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                    Error::invalid(
                        "NETCL_BENCH_PROMPTS",
                        format!("{v:?}: use a positive number"),
                    )
                })?,
                Err(_) => 32,
            };
            let prompts: Vec<Vec<u32>> = (0..n)
                .map(|i| {
                    (0..4 + (i * 7) % 29)
                        .map(|j| (1 + 37 * i + 11 * j) as u32 % 32000)
                        .collect()
                })
                .collect();
            let name = format!("llama110m_bf16_generate_b{n}");
            self.generation(&name, &c110, &prompts, 256)?;
        }
        if on("generate_1b") {
            let cfg = LlamaConfig {
                max_seq_len: 512,
                dtype: DType::BF16,
                ..tiny_llama_1b()
            };
            self.generation(
                "llama1b_bf16_generate",
                &cfg,
                &[vec![1u32, 50, 300, 7]],
                128,
            )?;
        }
        Ok(())
    }

    /// Greedy generation of `n` tokens after each of `prompts` (one batch) with a model of
    /// `cfg`: new tokens per second over all rows (median of 3 runs after a warm-up), and the
    /// weights' bytes a step reads, per second.
    fn generation(
        &mut self,
        name: &str,
        cfg: &LlamaConfig,
        prompts: &[Vec<u32>],
        n: usize,
    ) -> Result<()> {
        let model = Llama::new(cfg.clone(), &self.dev, &mut self.gen)?;
        let run = || -> Result<f64> {
            let mut s = Sampler::new(Sampling::Greedy, 0)?;
            self.dev.synchronize()?;
            let t0 = Instant::now();
            generate(&model, prompts, n, &mut s, None, |_, _| Ok(()))?;
            Ok(t0.elapsed().as_secs_f64())
        };
        run()?;
        let mut runs = [run()?, run()?, run()?];
        runs.sort_by(f64::total_cmp);
        let tokens = (prompts.len() * n) as f64;
        // What a step reads: every weight but an untied embedding table (one row of it).
        let weights: usize = (model.named_parameters().iter())
            .filter(|(n, _)| cfg.tied_embeddings || n != "tok_embeddings.weight")
            .map(|(_, p)| p.value().numel() * cfg.dtype.size())
            .sum();
        let gbps = weights as f64 * n as f64 / runs[1] / 1e9;
        println!(
            "{:<12} {name:<28} {:.0} tokens/s (median of 3: {:.0}-{:.0}; {} prompts, {n} new tokens \
             each, prefill included), weights {:.2} GB read at {gbps:.0} GB/s",
            "",
            tokens / runs[1],
            tokens / runs[2],
            tokens / runs[0],
            prompts.len(),
            weights as f64 / 1e9
        );
        self.records.push(Record {
            suite: "llama",
            name: format!("{name}_per_token"),
            ms: runs[1] * 1e3 / tokens,
            gbps: Some(gbps),
            tflops: None,
            kernels: 0,
            driver_allocs_per_step: None,
        });
        Ok(())
    }
}
