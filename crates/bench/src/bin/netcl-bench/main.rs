//! netcl-bench: runs the benchmark workloads on one device and prints/writes their times (benches/reference/torch_bench.py runs the same with PyTorch).
use netcl_bench::clblast::{max_abs_diff, ClBlast};
use netcl_bench::train::TrainStep;
use netcl_bench::{check_flags, device_from_args, flag_value, time_per_call};
use netcl_core_devices::{DType, Device, Result};
use netcl_ops::{
    fused, set_device_float32_matmul_precision, Expr, Generator, MatmulPrecision, Tensor,
};
use serde::Serialize;
use std::time::Instant;

mod ddp;
mod generate;
mod llama;
mod llama1b_gemm;
mod peak;
mod scale;
mod tiles;

/// One measured workload; `bytes` and `flops` are what the op must move and compute.
#[derive(Serialize)]
struct Record {
    suite: &'static str,
    name: String,
    ms: f64,
    gbps: Option<f64>,
    tflops: Option<f64>,
    kernels: usize,
    /// Driver buffer allocations per steady-state step (training steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_allocs_per_step: Option<f64>,
}

struct Runner {
    dev: Device,
    gen: Generator,
    records: Vec<Record>,
}

impl Runner {
    fn randn(&mut self, shape: &[usize]) -> Result<Tensor> {
        Tensor::randn(shape, DType::F32, &self.dev, &mut self.gen)
    }

    fn measure(
        &mut self,
        suite: &'static str,
        name: String,
        (bytes, flops, kernels): (f64, f64, usize),
        f: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let secs = time_per_call(&self.dev, 3, 10, 5, f)?;
        let r = Record {
            suite,
            name,
            ms: secs * 1e3,
            gbps: (bytes > 0.0).then(|| bytes / secs / 1e9),
            tflops: (flops > 0.0).then(|| flops / secs / 1e12),
            kernels,
            driver_allocs_per_step: None,
        };
        println!(
            "{:<12} {:<28} {:>10.4} ms {:>10} {:>10}",
            r.suite,
            r.name,
            r.ms,
            r.gbps.map_or(String::new(), |g| format!("{g:.0} GB/s")),
            r.tflops.map_or(String::new(), |t| format!("{t:.2} TF/s")),
        );
        self.records.push(r);
        Ok(())
    }

    /// Square SGEMM at each size with netcl, then with CLBlast on the same queue and buffers when
    /// the library can be opened (its result checked against netcl's once per size).
    fn gemm(&mut self, sizes: &[usize]) -> Result<()> {
        let blas = if self.dev.is_host() {
            println!("CLBlast peer skipped: the device is the host, not OpenCL");
            None
        } else {
            match ClBlast::load() {
                Ok(b) => {
                    println!("CLBlast peer: {}", b.source);
                    Some(b)
                }
                Err(e) => {
                    println!("CLBlast peer skipped: {e}");
                    None
                }
            }
        };
        for &n in sizes {
            let (a, b) = (self.randn(&[n, n])?, self.randn(&[n, n])?);
            let flops = 2.0 * (n as f64).powi(3);
            println!("  plan f32: {}", a.matmul_plan(&b, Default::default())?);
            self.measure("gemm", format!("sgemm_{n}"), (0.0, flops, 1), || {
                a.matmul(&b).map(|_| ())
            })?;
            // Tensor cores (where the device has them; the portable kernels elsewhere): TF32
            // under the "high" f32 precision, and bf16/f16 inputs.
            set_device_float32_matmul_precision(&self.dev, Some(MatmulPrecision::High));
            let tf32 = self.measure("gemm", format!("tf32_{n}"), (0.0, flops, 1), || {
                a.matmul(&b).map(|_| ())
            });
            set_device_float32_matmul_precision(&self.dev, None);
            tf32?;
            for dtype in [DType::BF16, DType::F16] {
                let (ah, bh) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
                println!(
                    "  plan {dtype}: {}",
                    ah.matmul_plan(&bh, Default::default())?
                );
                self.measure("gemm", format!("{dtype}_{n}"), (0.0, flops, 1), || {
                    ah.matmul(&bh).map(|_| ())
                })?;
            }
            if let Some(blas) = &blas {
                let c = Tensor::zeros(&[n, n], DType::F32, &self.dev)?;
                blas.sgemm(&a, &b, &c)?;
                let (diff, scale) = max_abs_diff(&c, &a.matmul(&b)?)?;
                if diff > 1e-3 * scale.max(1.0) {
                    return Err(netcl_core_devices::Error::device(
                        "CLBlastSgemm",
                        format!("n={n}: max |CLBlast - netcl| = {diff} (max |netcl| = {scale})"),
                    ));
                }
                let name = format!("clblast_sgemm_{n}");
                self.measure("gemm", name, (0.0, flops, 1), || blas.sgemm(&a, &b, &c))?;
            }
        }
        Ok(())
    }

    fn elementwise(&mut self) -> Result<()> {
        let n = 1usize << 26;
        let (x, y) = (self.randn(&[n])?, self.randn(&[n])?);
        let bytes = 12.0 * n as f64;
        self.measure("elementwise", "add_2^26".into(), (bytes, 0.0, 1), || {
            x.add(&y).map(|_| ())
        })?;
        let copy = [Expr::input(0)];
        self.measure(
            "elementwise",
            "copy_2^26".into(),
            (8.0 * n as f64, 0.0, 1),
            || fused(&[&x], &copy).map(|_| ()),
        )?;
        Ok(())
    }

    /// Row-wise softmax (rows of 4096, and of 1024 as in attention), layer_norm and rms_norm
    /// over rows of 4096 (one read and one write of the tensor).
    fn rows(&mut self, softmax: bool, norm: bool) -> Result<()> {
        let (rows, cols) = (1usize << 14, 4096usize);
        let x = self.randn(&[rows, cols])?;
        let bytes = 8.0 * (rows * cols) as f64;
        if softmax {
            let name = format!("softmax_{rows}x{cols}");
            self.measure("softmax", name, (bytes, 0.0, 1), || {
                x.softmax(1).map(|_| ())
            })?;
            let short = x.reshape(&[rows * 4, cols / 4])?;
            let name = format!("softmax_{}x{}", rows * 4, cols / 4);
            self.measure("softmax", name, (bytes, 0.0, 1), || {
                short.softmax(1).map(|_| ())
            })?;
        }
        if norm {
            let w = Tensor::ones(&[cols], DType::F32, &self.dev)?;
            let b = Tensor::zeros(&[cols], DType::F32, &self.dev)?;
            let name = format!("layer_norm_{rows}x{cols}");
            self.measure("norm", name, (bytes, 0.0, 1), || {
                x.layer_norm(&[cols], Some(&w), Some(&b), 1e-5).map(|_| ())
            })?;
            let name = format!("rms_norm_{rows}x{cols}");
            self.measure("norm", name, (bytes, 0.0, 1), || {
                x.rms_norm(&[cols], Some(&w), 1e-5).map(|_| ())
            })?;
        }
        Ok(())
    }

    /// Backwards of the row ops on the same shapes: softmax (rows of 4096 and 1024) and
    /// cross-entropy (4096 classes) in the softmax suite; layer_norm (with dweight/dbias, and dx
    /// alone without affine parameters) and rms_norm (with dweight) in the norm suite. Bytes: one
    /// read of every input, one write of every output.
    fn rows_backward(&mut self, softmax: bool, norm: bool) -> Result<()> {
        let (rows, cols) = (1usize << 14, 4096usize);
        let (x, dy) = (self.randn(&[rows, cols])?, self.randn(&[rows, cols])?);
        let (rc, r, c) = ((rows * cols) as f64, rows as f64, cols as f64);
        if softmax {
            for (rows, cols) in [(rows, cols), (rows * 4, cols / 4)] {
                let (x, dy) = (x.reshape(&[rows, cols])?, dy.reshape(&[rows, cols])?);
                let y = x.softmax(1)?;
                let name = format!("softmax_bwd_{rows}x{cols}");
                self.measure("softmax", name, (12.0 * rc, 0.0, 1), || {
                    y.softmax_backward(&dy, 1).map(|_| ())
                })?;
            }
            let t: Vec<i32> = (0..rows).map(|i| ((i * 7) % cols) as i32).collect();
            let t = Tensor::from_vec(t, &[rows], &self.dev)?;
            let ce = x.cross_entropy(&t, None)?;
            let one = Tensor::ones(&[], DType::F32, &self.dev)?;
            let name = format!("cross_entropy_bwd_{rows}x{cols}");
            // Logits, targets and lse read, dlogits written.
            self.measure("softmax", name, (8.0 * rc + 8.0 * r, 0.0, 1), || {
                x.cross_entropy_backward(&t, &ce.lse, &one, Some(&ce.count), None)
                    .map(|_| ())
            })?;
        }
        if norm {
            let w = Tensor::ones(&[cols], DType::F32, &self.dev)?;
            let b = Tensor::zeros(&[cols], DType::F32, &self.dev)?;
            let ns = [cols];
            let (_, mean, rstd) = x.layer_norm(&ns, Some(&w), Some(&b), 1e-5)?;
            // x, dy, w, mean and rstd read; dx, dweight and dbias written.
            let bytes = 4.0 * (3.0 * rc + 3.0 * c + 2.0 * r);
            let name = format!("layer_norm_bwd_{rows}x{cols}");
            self.measure("norm", name, (bytes, 0.0, 3), || {
                x.layer_norm_backward(&dy, &mean, &rstd, &ns, Some(&w), true)
                    .map(|_| ())
            })?;
            let (_, mean, rstd) = x.layer_norm(&ns, None, None, 1e-5)?;
            let name = format!("layer_norm_bwd_dx_{rows}x{cols}");
            self.measure("norm", name, (4.0 * (3.0 * rc + 2.0 * r), 0.0, 1), || {
                x.layer_norm_backward(&dy, &mean, &rstd, &ns, None, false)
                    .map(|_| ())
            })?;
            let (_, rstd) = x.rms_norm(&ns, Some(&w), 1e-5)?;
            let bytes = 4.0 * (3.0 * rc + 2.0 * c + r);
            let name = format!("rms_norm_bwd_{rows}x{cols}");
            self.measure("norm", name, (bytes, 0.0, 3), || {
                x.rms_norm_backward(&dy, &rstd, &ns, Some(&w)).map(|_| ())
            })?;
        }
        Ok(())
    }
}

impl Runner {
    /// The embedding gradient of a Llama-sized table (vocab 32000, dim 288) from 8192 tokens
    /// (B * T of the Llama example): bytes are the grad read and the table written.
    fn embedding(&mut self) -> Result<()> {
        let (v, d, n) = (32000usize, 288usize, 8192usize);
        // Token ids from a fixed LCG: uniform over the vocabulary, with repeats.
        let mut s = 7u64;
        let ids: Vec<i32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) % v as u64) as i32
            })
            .collect();
        let ids = Tensor::from_vec(ids, &[n], &self.dev)?;
        let g = self.randn(&[n, d])?;
        let k0 = netcl_kernels::thread_launches_total();
        Tensor::embedding_backward(&g, &ids, v)?;
        let kernels = (netcl_kernels::thread_launches_total() - k0) as usize;
        let bytes = (4 * (n * d + v * d + n)) as f64;
        let name = format!("embedding_backward_V{v}_D{d}_N{n}");
        self.measure("embedding", name, (bytes, 0.0, kernels), || {
            Tensor::embedding_backward(&g, &ids, v).map(|_| ())
        })
    }

    /// Causal fused attention at the Llama benchmark shapes and the 1B and 3B ones (grouped
    /// key/value heads; head dims 64 and 128), forward and backward (flops of the visible pairs:
    /// 4·B·H·pairs·D forward, 2.5 times that backward, as PyTorch's flash-attention counts), the
    /// composed forward beside the small ones, and each kernel's device time.
    fn attention(&mut self) -> Result<()> {
        // (batch, heads, key/value heads, length, head dim) and the dtypes each runs in.
        type Shape = (usize, usize, usize, usize, usize);
        let both = [DType::F32, DType::BF16];
        let shapes: [(Shape, &[DType]); 5] = [
            ((16, 12, 12, 512, 64), &both),
            ((32, 6, 6, 256, 48), &both),
            ((4, 32, 4, 2048, 64), &[DType::BF16]),
            ((4, 32, 32, 2048, 64), &[DType::BF16]),
            ((2, 24, 8, 2048, 128), &[DType::BF16]),
        ];
        for ((b, h, hkv, t, d), dtype) in shapes
            .into_iter()
            .flat_map(|(s, dts)| dts.iter().map(move |&dt| (s, dt)))
        {
            let mut operand = |heads: usize| self.randn(&[b, heads, t, d])?.to_dtype(dtype);
            let (q, k, v, g) = (operand(h)?, operand(hkv)?, operand(hkv)?, operand(h)?);
            let pairs = (b * h * t * (t + 1) / 2) as f64;
            let fwd = 4.0 * pairs * d as f64;
            let suffix = if dtype == DType::F32 { "" } else { "_bf16" };
            let kv = if hkv == h {
                String::new()
            } else {
                format!("_KV{hkv}")
            };
            let tag = format!("B{b}_H{h}{kv}_T{t}_D{d}{suffix}");
            let (o, lse) = Tensor::flash_attention(&q, &k, &v, true, None)?;
            self.measure(
                "attention",
                format!("attention_fwd_{tag}"),
                (0.0, fwd, 1),
                || Tensor::flash_attention(&q, &k, &v, true, None).map(|_| ()),
            )?;
            self.measure(
                "attention",
                format!("attention_bwd_{tag}"),
                (0.0, 2.5 * fwd, 2),
                || {
                    Tensor::flash_attention_backward(&q, &k, &v, &o, &lse, &g, true, None)
                        .map(|_| ())
                },
            )?;
            if t <= 512 {
                self.measure(
                    "attention",
                    format!("attention_composed_fwd_{tag}"),
                    (0.0, fwd, 0),
                    || Tensor::attention(&q, &k, &v, None, true, None).map(|_| ()),
                )?;
            }
            let p = netcl_profiling::Profiler::start();
            Tensor::flash_attention(&q, &k, &v, true, None)?;
            Tensor::flash_attention_backward(&q, &k, &v, &o, &lse, &g, true, None)?;
            self.dev.synchronize()?;
            for kr in p.stop().kernels {
                let ms = kr.device_ns().unwrap_or(0) as f64 / 1e6;
                println!("             {tag} kernel {:<22} {ms:>9.3} ms", kr.kernel);
            }
        }
        Ok(())
    }

    /// One Adam training step of the MLP and of the CNN (see `netcl_bench::train`).
    fn train(&mut self) -> Result<()> {
        type Build = fn(&Device, &mut Generator) -> Result<TrainStep>;
        let models: [(&str, Build); 2] =
            [("mlp_step", TrainStep::mlp), ("cnn_step", TrainStep::cnn)];
        // NETCL_BENCH_TRAIN=mlp_step (or cnn_step) runs one of them (e.g. to profile it alone).
        let only = std::env::var("NETCL_BENCH_TRAIN").ok();
        for (name, build) in models {
            if only.as_deref().is_some_and(|o| o != name) {
                continue;
            }
            let mut t = build(&self.dev, &mut self.gen)?;
            self.measure("train", name.into(), (0.0, 0.0, 0), || t.step())?;
            let allocs = t.driver_allocations_per_step(&self.dev, 20)?;
            if let Some(r) = self.records.last_mut() {
                r.driver_allocs_per_step = Some(allocs);
            }
            println!(
                "{:<12} {name:<28} {allocs} driver allocations per steady-state step",
                ""
            );
            // Kernels enqueued and host time per step (no synchronisation inside the loop).
            self.dev.synchronize()?;
            let (t0, k0) = (Instant::now(), netcl_kernels::thread_launches_total());
            for _ in 0..10 {
                t.step()?;
            }
            let host_ms = t0.elapsed().as_secs_f64() * 100.0;
            let kernels = (netcl_kernels::thread_launches_total() - k0) / 10;
            self.dev.synchronize()?;
            if let Some(r) = self.records.last_mut() {
                r.kernels = kernels as usize;
            }
            println!(
                "{:<12} {name:<28} {kernels} kernels, {host_ms:.4} ms host time per step",
                ""
            );
            if !self.dev.is_host() {
                if std::env::var("NETCL_BENCH_KERNELS").is_ok_and(|v| v == "1") {
                    self.kernel_times(name, &mut t)?;
                }
                self.graph_step(name, &mut t)?;
            }
        }
        Ok(())
    }

    /// One eager step of `t` under the profiler (`NETCL_BENCH_KERNELS=1`): each kernel's device
    /// time and the device's idle time since the previous kernel ended.
    fn kernel_times(&mut self, name: &str, t: &mut TrainStep) -> Result<()> {
        self.dev.synchronize()?;
        let p = netcl_profiling::Profiler::start();
        t.step()?;
        self.dev.synchronize()?;
        let mut prev_end = None;
        for kr in p.stop().kernels {
            let (start, end) = (
                kr.device_start_ns.unwrap_or(0),
                kr.device_end_ns.unwrap_or(0),
            );
            let gap = prev_end.map_or(0.0, |e: u64| start.saturating_sub(e) as f64 / 1e3);
            prev_end = Some(end);
            println!(
                "             {name} kernel {:<26} {:>10?} {:>8.1} us, idle before {gap:>6.1} us",
                kr.kernel,
                kr.global,
                end.saturating_sub(start) as f64 / 1e3
            );
        }
        Ok(())
    }

    /// Times replays of `graph`, a new batch copied into its input slot "x" before each.
    fn replays(
        &mut self,
        label: String,
        graph: &mut netcl_graph::Graph,
        batch: &Tensor,
    ) -> Result<()> {
        let kernels = graph.stats().kernels;
        self.measure("train", label, (0.0, 0.0, kernels), || {
            graph.set_input("x", batch)?;
            graph.replay()
        })
    }

    /// The step of `t` captured once (netcl-graph) and replayed, a new batch copied into its
    /// input slot before each replay; host time per replay and per replayed kernel against raw
    /// clEnqueueNDRangeKernel calls, and the pool's peak for an eager step and for replays.
    fn graph_step(&mut self, name: &str, t: &mut TrainStep) -> Result<()> {
        let (x, y) = (t.x.clone(), t.y.clone());
        let (mut graph, ()) = netcl_graph::Graph::capture(&self.dev, |g| {
            g.input("x", &x)?;
            g.input("y", &y)?;
            t.step()
        })?;
        let batch = Tensor::randn(x.shape(), DType::F32, &self.dev, &mut self.gen)?;
        let kernels = graph.stats().kernels;
        self.replays(format!("{name}_graph"), &mut graph, &batch)?;
        let pool = netcl_core_memory::Pool::of(&self.dev)?;
        let peak = |f: &mut dyn FnMut() -> Result<()>| -> Result<usize> {
            self.dev.synchronize()?;
            pool.reset_peak();
            f()?;
            self.dev.synchronize()?;
            Ok(pool.stats().peak)
        };
        let eager_peak = peak(&mut || t.step())?;
        let replay_peak = peak(&mut || graph.replay())?;
        let n = 50;
        self.dev.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..n {
            graph.replay()?;
        }
        let replay_host = t0.elapsed().as_secs_f64() / n as f64;
        self.dev.synchronize()?;
        let raw = raw_enqueue_secs(&self.dev, &graph, n)?;
        let s = graph.stats();
        println!(
            "{:<12} {name:<28} graph: {kernels} kernels ({} dead nodes left out), {:.4} ms host per replay = {:.2} us per \
             kernel, raw clEnqueueNDRangeKernel {:.2} us ({:.2}x); arena {} KiB vs eager {} KiB \
             of step buffers; pool peak eager {} MiB, replay {} MiB; command buffer {}",
            "",
            s.dead_nodes,
            replay_host * 1e3,
            replay_host * 1e6 / kernels as f64,
            raw * 1e6,
            replay_host / kernels as f64 / raw,
            s.arena_bytes >> 10,
            s.eager_peak_bytes >> 10,
            eager_peak >> 20,
            replay_peak >> 20,
            s.command_buffer
        );
        // The same replays over two in-order queues (`Graph::use_queues`).
        graph.use_queues(2)?;
        self.replays(format!("{name}_graph_2q"), &mut graph, &batch)?;
        println!(
            "{:<12} {name:<28} graph over {} queues: {} cross-queue waits per replay",
            "",
            graph.stats().queues,
            graph.stats().cross_waits
        );
        Ok(())
    }
}

/// Host seconds per clEnqueueNDRangeKernel, called directly on the graph's kernels in order
/// (arguments already set), `n` rounds: the floor a replay is compared with.
fn raw_enqueue_secs(dev: &Device, graph: &netcl_graph::Graph, n: usize) -> Result<f64> {
    use netcl_core_devices::cl3;
    let queue = dev.cl("raw enqueue")?.queue.get();
    let lib = cl3::load_library()
        .as_ref()
        .map_err(|_| netcl_core_devices::Error::device("raw enqueue", "no OpenCL library"))?;
    let kernels: Vec<_> = graph.kernels().collect();
    let t0 = Instant::now();
    for _ in 0..n {
        for k in &kernels {
            let (dims, global, local) = k.ndrange();
            let status = lib.clEnqueueNDRangeKernel(
                queue,
                k.cl_kernel(),
                dims,
                std::ptr::null(),
                global.as_ptr(),
                local.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            );
            if status != Some(0) {
                return Err(netcl_core_devices::Error::device(
                    "raw enqueue",
                    format!("clEnqueueNDRangeKernel returned {status:?}"),
                ));
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64() / (n * kernels.len().max(1)) as f64;
    dev.synchronize()?;
    Ok(secs)
}

const USAGE: &str = "netcl-bench [--device SPEC] [--suite all|gemm,elementwise,softmax,norm,embedding,train,llama,attention,decode,llama_gemm,llama1b_gemm,lora1b_gemm,ddp,tiles,mma_peak] [--sizes 1024,2048,4096] [--llama 15m,110m,15m_bf16,110m_bf16,110m_lora,110m_b2,110m_lora_b2,110m_b1,110m_lora_b1,generate,generate_bf16,generate_b32,generate_1b|1b,1b_lora,3b_lora,1b_tiny,1b_lora_tiny,3b_lora_tiny] [--json FILE]
  Times each workload (median of 5 batches, device synchronised around each) and prints
  one line per workload; --json writes the records for benches/reference/torch_bench.py --netcl.
  NETCL_CLBLAST=/path/libclblast.so adds CLBlast as the OpenCL GEMM peer; NETCL_BENCH_KERNELS=1 lists
  the train suite's kernels with device times; --suite tiles times small products per GEMM tile.
  --llama 1b,1b_lora,3b_lora (only when named; their _tiny twins for CPU devices): TinyLlama-1.1B
  and Llama-3.2-3B shapes, T 2048, bf16 autocast, every block checkpointed, LoRA r16 on all
  linear layers over a bf16 base; batch NETCL_BENCH_BATCH (4; a number, or fit: the largest the
  memory estimate fits); prints tokens/s, MFU over 989 TFLOP/s, pool peak and its estimate.";

fn main() -> Result<()> {
    // The program name first, as check_flags expects.
    let mut args = vec!["netcl-bench".to_string()];
    args.extend(netcl_core_devices::utf8_args("netcl-bench")?);
    let flags = ["--device", "--suite", "--sizes", "--json", "--llama"];
    if !check_flags(&args, "netcl-bench", &flags, USAGE)? {
        return Ok(());
    }
    let dev = device_from_args(&args)?;
    let suite = flag_value(&args, "--suite").unwrap_or("all").to_string();
    let suites = [
        "gemm",
        "elementwise",
        "softmax",
        "norm",
        "embedding",
        "train",
        "llama",
        "attention",
        "decode",
        "llama_gemm",
        "llama1b_gemm",
        "lora1b_gemm",
        "ddp",
        "tiles",
        "mma_peak",
    ];
    if let Some(bad) = suite
        .split(',')
        .find(|s| *s != "all" && !suites.contains(s))
    {
        return Err(netcl_core_devices::Error::invalid(
            "netcl-bench --suite",
            format!("unknown suite {bad:?}; suites: all, {}", suites.join(", ")),
        ));
    }
    println!(
        "netcl-bench on {dev} ({} {})",
        dev.info().platform,
        dev.info().driver_version
    );
    let sizes = match flag_value(&args, "--sizes") {
        None => vec![1024, 2048, 4096],
        Some(list) => list
            .split(',')
            .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                netcl_core_devices::Error::invalid(
                    "netcl-bench --sizes",
                    format!("expected positive integers like 256,512, got {list:?}"),
                )
            })?,
    };
    let mut r = Runner {
        dev,
        gen: Generator::new(7),
        records: Vec::new(),
    };
    let want = |s: &str| suite == "all" || suite.split(',').any(|x| x == s);
    if want("gemm") {
        r.gemm(&sizes)?;
    }
    if want("elementwise") {
        r.elementwise()?;
    }
    if want("softmax") || want("norm") {
        r.rows(want("softmax"), want("norm"))?;
        r.rows_backward(want("softmax"), want("norm"))?;
    }
    if want("embedding") {
        r.embedding()?;
    }
    if want("train") {
        r.train()?;
    }
    if want("attention") {
        r.attention()?;
    }
    if want("decode") {
        r.decode()?;
    }
    if suite.split(',').any(|x| x == "mma_peak") {
        r.mma_peak()?;
    }
    if suite.split(',').any(|x| x == "tiles") {
        r.tiles()?;
    }
    if want("llama_gemm") {
        r.llama_gemm()?;
    }
    if suite.split(',').any(|x| x == "llama1b_gemm") {
        r.llama1b_gemm()?;
    }
    if suite.split(',').any(|x| x == "lora1b_gemm") {
        r.lora1b_gemm()?;
    }
    if want("llama") {
        let which = flag_value(&args, "--llama").unwrap_or("all");
        r.llama(which)?;
        r.generations(&|w| which == "all" || which.split(',').any(|x| x == w))?;
        r.llama_scale(which)?;
    }
    if suite.split(',').any(|x| x == "ddp") {
        r.ddp()?;
    }
    if let Some(path) = flag_value(&args, "--json") {
        let json = serde_json::json!({
            "framework": "netcl",
            "device": r.dev.info().name,
            "driver": r.dev.info().driver_version,
            "records": r.records,
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json).expect("records serialise"),
        )
        .map_err(|e| netcl_core_devices::Error::io(path, e))?;
    }
    Ok(())
}
