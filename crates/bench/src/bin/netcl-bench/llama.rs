//! The Llama workloads of netcl-bench: training steps (f32, bf16 autocast, LoRA), generation, the steps' products, and the one-token decode ops.
use crate::{Record, Runner};
use netcl_bench::train::LlamaStep;
use netcl_core_devices::{DType, Result};
use std::time::Instant;

impl Runner {
    /// One AdamW step of the Llama-15M shape (dim 288, 6 layers, vocab 32000, B 32, T 256) and
    /// of the 110M shape (dim 768, 12 layers, hidden 2048, B 16, T 512), f32; and greedy KV-cache
    /// generation of 256 tokens, batch 1, with the 110M shape (ms per token).
    pub(crate) fn llama(&mut self, which: &str) -> Result<()> {
        use netcl_models::{generate, LlamaConfig, Sampler, Sampling};
        let on = |w: &str| which == "all" || which.split(',').any(|x| x == w);
        let c15 = LlamaConfig {
            max_seq_len: 256,
            ..LlamaConfig::llama_15m(32000)
        };
        let c110 = LlamaConfig {
            max_seq_len: 512,
            ..LlamaConfig::llama_110m(32000)
        };
        let lora = netcl_nn::LoraConfig::default();
        let bf16 = Some(DType::BF16);
        let shapes = [
            ("15m", "llama15m_step_B32_T256", c15.clone(), 32, None, None),
            (
                "110m",
                "llama110m_step_B16_T512",
                c110.clone(),
                16,
                None,
                None,
            ),
            ("15m_bf16", "llama15m_bf16_autocast", c15, 32, None, bf16),
            (
                "110m_bf16",
                "llama110m_bf16_autocast",
                c110.clone(),
                16,
                None,
                bf16,
            ),
            (
                "110m_lora",
                "llama110m_lora_qv_r8_B16_T512",
                c110.clone(),
                16,
                Some(&lora),
                None,
            ),
            // Fine-tuning batches, where weights, gradients and optimizer state weigh more
            // than activations: full and LoRA memory side by side.
            (
                "110m_b2",
                "llama110m_step_B2_T512",
                c110.clone(),
                2,
                None,
                None,
            ),
            (
                "110m_lora_b2",
                "llama110m_lora_qv_r8_B2_T512",
                c110.clone(),
                2,
                Some(&lora),
                None,
            ),
            (
                "110m_b1",
                "llama110m_step_B1_T512",
                c110.clone(),
                1,
                None,
                None,
            ),
            (
                "110m_lora_b1",
                "llama110m_lora_qv_r8_B1_T512",
                c110,
                1,
                Some(&lora),
                None,
            ),
        ];
        for (_, name, cfg, b, lora, cast) in shapes.into_iter().filter(|s| on(s.0)) {
            let tokens = b * cfg.max_seq_len;
            if !self.dev.is_host() {
                // Each workload's own peak: nothing of the previous one stays cached.
                let pool = netcl_core_memory::Pool::of(&self.dev)?;
                pool.empty_cache();
                pool.reset_peak();
            }
            let mut t = LlamaStep::new(cfg, b, lora, &self.dev, &mut self.gen)?;
            t.autocast = cast;
            self.measure("llama", name.into(), (0.0, 0.0, 0), || t.step())?;
            let ms = self.records.last().map_or(f64::NAN, |r| r.ms);
            self.dev.synchronize()?;
            let k0 = netcl_kernels::thread_launches_total();
            t.step()?;
            let kernels = netcl_kernels::thread_launches_total() - k0;
            self.dev.synchronize()?;
            let peak = if self.dev.is_host() {
                0
            } else {
                netcl_core_memory::Pool::of(&self.dev)?.stats().peak
            };
            println!(
                "{:<12} {name:<28} {:.0} tokens/s, {kernels} kernels per step, pool peak {:.2} GiB",
                "",
                tokens as f64 / ms * 1e3,
                peak as f64 / (1u64 << 30) as f64
            );
            print_kernels(&self.dev, name, || t.step())?;
            if !self.dev.is_host() && std::env::var("NETCL_BENCH_GRAPH").is_ok_and(|v| v == "1") {
                // The same step captured once and replayed (netcl-graph).
                let (mut graph, ()) = netcl_graph::Graph::capture(&self.dev, |_| t.step())?;
                self.measure("llama", format!("{name}_graph"), (0.0, 0.0, 0), || {
                    graph.replay()
                })?;
                let ms = self.records.last().map_or(f64::NAN, |r| r.ms);
                let st = graph.stats();
                println!(
                    "{:<12} {name:<28} graph: {:.0} tokens/s, arena {:.2} GiB vs eager {:.2} GiB \
                     of step buffers",
                    "",
                    tokens as f64 / ms * 1e3,
                    st.arena_bytes as f64 / (1u64 << 30) as f64,
                    st.eager_peak_bytes as f64 / (1u64 << 30) as f64
                );
                graph.use_queues(2)?;
                let st = graph.stats();
                self.measure("llama", format!("{name}_graph_2q"), (0.0, 0.0, 0), || {
                    graph.replay()
                })?;
                let ms = self.records.last().map_or(f64::NAN, |r| r.ms);
                println!(
                    "{:<12} {name:<28} graph over {} queues: {:.0} tokens/s, {} cross-queue waits",
                    "",
                    st.queues,
                    tokens as f64 / ms * 1e3,
                    st.cross_waits
                );
            }
        }
        if !on("generate") {
            return Ok(());
        }
        let cfg = LlamaConfig {
            max_seq_len: 512,
            ..LlamaConfig::llama_110m(32000)
        };
        let model = netcl_models::Llama::new(cfg, &self.dev, &mut self.gen)?;
        let prompt = vec![vec![1u32, 50, 300, 7]];
        let run = |n: usize| -> Result<f64> {
            let mut s = Sampler::new(Sampling::Greedy, 0)?;
            let t0 = Instant::now();
            generate(&model, &prompt, n, &mut s, None, |_, _| Ok(()))?;
            Ok(t0.elapsed().as_secs_f64())
        };
        // Warm-up over the whole length: every row length's kernels are built once (a program
        // per register layout of the growing attention rows), as in any later generation.
        run(256)?;
        let k0 = netcl_kernels::thread_launches_total();
        // The median of three runs: a generation's time varies by a fifth from run to run on
        // the H100 (host scheduling of 64 launches per token).
        let mut runs = [run(256)?, run(256)?, run(256)?];
        let mut kernels = (netcl_kernels::thread_launches_total() - k0) / (3 * 256);
        // Replayed decode steps (generate's default on OpenCL) enqueue their kernels without
        // `Kernel::launch`: add the captured step's count.
        let replay = netcl_core_devices::Config::get().decode_replay;
        if replay && self.dev.is_opencl() && model.decode_supported() {
            let cache = netcl_models::KvCache::new(&model.config, 1, &self.dev)?;
            let one = netcl_ops::Tensor::from_vec(vec![1i32], &[1], &self.dev)?;
            // What generate pays once per call: capturing its first decode step.
            self.dev.synchronize()?;
            let t0 = Instant::now();
            let (mut graph, _) = model.capture_decode(&one, &cache, None)?;
            self.dev.synchronize()?;
            println!(
                "{:<12} {:<28} capturing the decode step: {:.2} ms",
                "",
                "llama110m_decode_capture",
                t0.elapsed().as_secs_f64() * 1e3
            );
            kernels += graph.graph().stats().kernels as u64;
            // Steps queued back to back with nothing read: the host's time to queue a step
            // against the device's time to run one (whichever is longer bounds generation).
            let n = 200;
            self.dev.synchronize()?;
            let t0 = Instant::now();
            for _ in 0..n {
                graph.step(&one, &cache)?;
            }
            let host = t0.elapsed().as_secs_f64() / n as f64;
            self.dev.synchronize()?;
            let all = t0.elapsed().as_secs_f64() / n as f64;
            let dev = self
                .device_secs(|| (0..3).try_for_each(|_| graph.step(&one, &cache).map(|_| ())))?
                / 3.0;
            println!(
                "{:<12} {:<28} {:.1} us a step on the device alone",
                "",
                "llama110m_decode_device",
                dev * 1e6
            );
            println!(
                "{:<12} {:<28} decode steps back to back: {:.1} us a step ({:.0} tokens/s), \
                 host {:.1} us to queue one",
                "",
                "llama110m_decode_steady",
                all * 1e6,
                1.0 / all,
                host * 1e6
            );
        }
        runs.sort_by(f64::total_cmp);
        let secs = runs[1];
        println!(
            "{:<12} {:<28} {:.0} tokens/s (median of 3 runs: {:.0}-{:.0}; 256 new tokens, batch 1, \
             prefill included, decode replay {}), {kernels} kernels per token",
            "",
            "llama110m_generate",
            256.0 / secs,
            256.0 / runs[2],
            256.0 / runs[0],
            if replay { "on" } else { "off" }
        );
        self.records.push(Record {
            suite: "llama",
            name: "llama110m_generate_per_token".into(),
            ms: secs * 1e3 / 256.0,
            gbps: None,
            tflops: None,
            kernels: kernels as usize,
            driver_allocs_per_step: None,
        });
        Ok(())
    }

    /// The f32 products of the Llama-110M and Llama-15M training steps (8192 tokens each: B 16
    /// x T 512, B 32 x T 256): forward `x·Wᵀ` (nt), the input gradient `dY·W` (nn) and the
    /// weight gradient `dYᵀ·X` (tn), named `llama_gemm_{layout}_{M}x{N}x{K}`.
    pub(crate) fn llama_gemm(&mut self) -> Result<()> {
        let (t, v) = (8192, 32000);
        let mut shapes = Vec::new();
        for (d, h) in [(768, 2048), (288, 768)] {
            for (n, k) in [(d, d), (h, d), (d, h), (v, d)] {
                shapes.push(("nt", t, n, k));
                shapes.push(("nn", t, k, n));
                shapes.push(("tn", n, k, t));
            }
        }
        for (layout, m, n, k) in shapes {
            let a = match layout {
                "tn" => self.randn(&[k, m])?.transpose(0, 1)?,
                _ => self.randn(&[m, k])?,
            };
            let b = match layout {
                "nt" => self.randn(&[n, k])?.transpose(0, 1)?,
                _ => self.randn(&[k, n])?,
            };
            let flops = 2.0 * (m * n * k) as f64;
            let name = format!("llama_gemm_{layout}_{m}x{n}x{k}");
            self.measure("llama_gemm", name.clone(), (0.0, flops, 1), || {
                a.matmul(&b).map(|_| ())
            })?;
            if n != 288 && k != 288 && m != 288 {
                // The 110M products under bf16 autocast: bf16 operands in the same layouts, the
                // product written in f32.
                let bf16 = DType::BF16;
                let a = match layout {
                    "tn" => self.randn(&[k, m])?.to_dtype(bf16)?.transpose(0, 1)?,
                    _ => self.randn(&[m, k])?.to_dtype(bf16)?,
                };
                let b = match layout {
                    "nt" => self.randn(&[n, k])?.to_dtype(bf16)?.transpose(0, 1)?,
                    _ => self.randn(&[k, n])?.to_dtype(bf16)?,
                };
                let f32_out = netcl_ops::MatmulOptions {
                    out_dtype: Some(DType::F32),
                    ..Default::default()
                };
                self.measure(
                    "llama_gemm",
                    format!("{name}_bf16"),
                    (0.0, flops, 1),
                    || a.matmul_with(&b, f32_out).map(|_| ()),
                )?;
            }
        }
        Ok(())
    }

    /// A Llama-110M block's decode step (batch 1, f32, position 255 of 256) as one persistent
    /// `decode_block` and as its five kernels: 16 steps captured and replayed back to back, the
    /// time a block and its device time alone.
    fn decode_blocks(&mut self, norm: &netcl_ops::RmsScale, kv: &netcl_ops::KvWrite) -> Result<()> {
        let (d, hidden, heads) = (768, 2048, 12);
        let block = netcl_ops::DecodeBlock {
            attention_norm: norm.clone(),
            wq: self.randn(&[d, d])?,
            wk: self.randn(&[d, d])?,
            wv: self.randn(&[d, d])?,
            qkv_bias: None,
            kv: kv.clone(),
            heads,
            window: None,
            wo: self.randn(&[d, d])?,
            wo_bias: None,
            ffn_norm: norm.clone(),
            gate: self.randn(&[hidden, d])?,
            up: self.randn(&[hidden, d])?,
            gate_up_bias: None,
            down: self.randn(&[d, hidden])?,
            down_bias: None,
        };
        let x = self.randn(&[1, d])?;
        let bytes = (4 * (4 * d * d + 3 * hidden * d)) as f64;
        let was = netcl_core_devices::Config::get().decode_block;
        for (name, fused) in [
            ("decode_graph16_block", true),
            ("decode_graph16_five", false),
        ] {
            netcl_core_devices::Config::update(|c| c.decode_block = fused);
            let (mut g, _) = netcl_graph::Graph::capture(&self.dev, |_| {
                (0..16).try_fold(x.clone(), |h, _| h.decode_block(&block))
            })?;
            self.measure("decode", name.into(), (16.0 * bytes, 0.0, 16), || {
                g.replay()
            })?;
            let per = self.records.last().map_or(f64::NAN, |r| r.ms) * 1e3 / 16.0;
            let dev = self.device_secs(|| g.replay())? * 1e6 / 16.0;
            println!(
                "{:<12} {name:<28} {per:.2} us a block; {dev:.2} us on the device alone ({:.0} GB/s)",
                "",
                bytes / dev / 1e3
            );
        }
        netcl_core_devices::Config::update(|c| c.decode_block = was);
        Ok(())
    }

    /// Seconds `f`'s work takes on the device alone: queued behind a 4096^3 f32 product (long
    /// enough for the host to queue all of `f` meanwhile), less that product's time; median of 5.
    fn device_secs(&mut self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let a = self.randn(&[4096, 4096])?;
        let time = |with: bool, f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let mut v = Vec::new();
            for _ in 0..5 {
                self.dev.synchronize()?;
                let t0 = Instant::now();
                a.matmul(&a)?;
                if with {
                    f()?;
                }
                self.dev.synchronize()?;
                v.push(t0.elapsed().as_secs_f64());
            }
            v.sort_by(f64::total_cmp);
            Ok(v[2])
        };
        let base = time(false, &mut f)?;
        Ok(time(true, &mut f)? - base)
    }

    /// The one-token decode ops at the Llama-110M shape (batch 1, f32): each GEMV with its
    /// epilogue (bytes: the weights read once), and attention over 256 cached positions.
    pub(crate) fn decode(&mut self) -> Result<()> {
        use netcl_ops::{KvWrite, RmsScale, RopeFreqs, RopeStyle};
        let (d, hidden, vocab, heads, hd, s) = (768, 2048, 32000, 12, 64, 256);
        let norm = RmsScale {
            weight: self.randn(&[d])?,
            eps: 1e-5,
        };
        let x = self.randn(&[1, d])?;
        let long = self.randn(&[1, hidden])?;
        for (name, n, k, with_norm) in [
            ("decode_linear_N768_K768", d, d, false),
            ("decode_linear_N768_K2048", d, hidden, false),
            ("decode_linear_N32000_K768", vocab, d, true),
        ] {
            let w = self.randn(&[n, k])?;
            let input = if k == d { &x } else { &long };
            let res = (n == d).then(|| x.clone());
            let bytes = (4 * (n * k + k + 2 * n)) as f64;
            let nm = with_norm.then_some(&norm);
            self.measure(
                "decode",
                name.into(),
                (bytes, (2 * n * k) as f64, 1),
                || input.decode_linear(nm, &w, res.as_ref()).map(|_| ()),
            )?;
        }
        let (w1, w3) = (self.randn(&[hidden, d])?, self.randn(&[hidden, d])?);
        let bytes = (4 * (2 * hidden * d + d + hidden)) as f64;
        self.measure(
            "decode",
            "decode_swiglu_N2048_K768".into(),
            (bytes, (4 * hidden * d) as f64, 1),
            || x.decode_swiglu(Some(&norm), &w1, &w3).map(|_| ()),
        )?;
        let (wq, wk, wv) = (
            self.randn(&[d, d])?,
            self.randn(&[d, d])?,
            self.randn(&[d, d])?,
        );
        let kv = KvWrite {
            k_cache: self.randn(&[1, heads, s, hd])?,
            v_cache: self.randn(&[1, heads, s, hd])?,
            pos: netcl_ops::Tensor::from_vec(vec![s as i32 - 1], &[1], &self.dev)?,
            pads: None,
            style: RopeStyle::Interleaved,
            freqs: RopeFreqs::Theta(1e4),
        };
        let bytes = (4 * (3 * d * d + 4 * d)) as f64;
        self.measure(
            "decode",
            "decode_qkv_N2304_K768".into(),
            (bytes, (6 * d * d) as f64, 1),
            || x.decode_qkv(Some(&norm), &wq, &wk, &wv, &kv).map(|_| ()),
        )?;
        // The floor: one kernel that writes one element.
        let one = self.randn(&[1])?;
        self.measure("decode", "decode_floor_fill1".into(), (0.0, 0.0, 1), || {
            one.fill_(0.0)
        })?;
        if self.dev.is_opencl() {
            // Back to back: 64 kernels captured and replayed, time per kernel (the device's
            // floor per launch, and a 768 x 768 GEMV's when nothing waits between them).
            let w = self.randn(&[d, d])?;
            let (mut fills, ()) = netcl_graph::Graph::capture(&self.dev, |_| {
                (0..64).try_for_each(|_| one.fill_(0.0))
            })?;
            let (mut gemvs, _) = netcl_graph::Graph::capture(&self.dev, |_| {
                (0..64).try_fold(x.clone(), |h, _| h.decode_linear(None, &w, Some(&h)))
            })?;
            for (name, g) in [
                ("decode_graph64_fill1", &mut fills),
                ("decode_graph64_linear768", &mut gemvs),
            ] {
                self.measure("decode", name.into(), (0.0, 0.0, 64), || g.replay())?;
                let per = self.records.last().map_or(f64::NAN, |r| r.ms) * 1e3 / 64.0;
                let dev = self.device_secs(|| g.replay())? * 1e6 / 64.0;
                println!(
                    "{:<12} {name:<28} {per:.2} us a kernel; {dev:.2} us on the device alone",
                    ""
                );
            }
        }
        if self.dev.is_opencl() {
            self.decode_blocks(&norm, &kv)?;
        }
        let bytes = (4 * (2 * heads * s * hd + 2 * d)) as f64;
        let (kc, vc) = (kv.k_cache.clone(), kv.v_cache.clone());
        self.measure(
            "decode",
            "decode_attention_H12_D64_S256".into(),
            (bytes, (4 * heads * s * hd) as f64, 1),
            || {
                x.decode_attention(&kc, &vc, &kv.pos, None, heads)
                    .map(|_| ())
            },
        )
    }
}

/// `NETCL_BENCH_KERNELS=1` (or `2`: by kernel name and global size): one call of `step` under the
/// profiler, each kernel's device time, largest first.
pub(crate) fn print_kernels(
    dev: &netcl_core_devices::Device,
    name: &str,
    mut step: impl FnMut() -> Result<()>,
) -> Result<()> {
    let mode = std::env::var("NETCL_BENCH_KERNELS").unwrap_or_default();
    if dev.is_host() || !(mode == "1" || mode == "2") {
        return Ok(());
    }
    let p = netcl_profiling::Profiler::start();
    step()?;
    dev.synchronize()?;
    let mut by: std::collections::BTreeMap<String, (usize, f64)> = Default::default();
    for k in p.stop().kernels {
        let key = match mode == "2" {
            true => format!("{} {:?}", k.kernel, k.global),
            false => k.kernel.to_string(),
        };
        let e = by.entry(key).or_default();
        e.0 += 1;
        e.1 += k.device_ns().unwrap_or(0) as f64 / 1e6;
    }
    let mut by: Vec<_> = by.into_iter().collect();
    by.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (kernel, (n, ms)) in by {
        println!(
            "{:<12} {name:<28} kernel {kernel:<28} {n:>4}x {ms:>9.3} ms",
            ""
        );
    }
    Ok(())
}
