//! The data-parallel workload of netcl-bench: the Llama-110M step (16 sequences of 512 per GPU, f32, AdamW) on one GPU and on every GPU through DataParallel; benches/reference/ddp_torch.py runs PyTorch DDP on the same shape.
//!
//! NETCL_BENCH_DDP_BUCKET sets the bucket size; NETCL_BENCH_DDP_TRACE=1 prints rank 0's bucket
//! copies of the last synchronised step (device clock) to stderr.
use crate::Runner;
use netcl_bench::train::LlamaStep;
use netcl_core_devices::{Device, DeviceKind, Result};
use netcl_distributed::{DataParallel, DdpOptions, Group};
use netcl_models::LlamaConfig;
use netcl_ops::Generator;
use netcl_optim::Optimizer;
use std::time::Instant;

/// Sequences per GPU and steps timed (after three warm-up steps).
const BATCH: usize = 16;
const STEPS: usize = 8;

impl Runner {
    pub(crate) fn ddp(&mut self) -> Result<()> {
        let gpus: Vec<Device> = Device::opencl_devices()
            .into_iter()
            .filter(|d| d.kind() == DeviceKind::Gpu)
            .collect();
        let cfg = LlamaConfig {
            max_seq_len: 512,
            ..LlamaConfig::llama_110m(32000)
        };
        let tokens = (BATCH * cfg.max_seq_len) as f64;
        let Some(first) = gpus.first() else {
            println!("ddp: needs OpenCL GPUs, found none");
            return Ok(());
        };
        let one = {
            let mut s = LlamaStep::new(cfg.clone(), BATCH, None, first, &mut self.gen)?;
            timed(first, || s.step())?
        };
        println!(
            "{:<12} {:<28} 1 GPU: {:.1} ms/step, {:.0} tokens/s",
            "ddp",
            "llama110m_step_B16_T512",
            one * 1e3,
            tokens / one
        );
        if gpus.len() < 2 {
            println!("ddp: needs two OpenCL GPUs, found {}", gpus.len());
            return Ok(());
        }
        let n = gpus.len();
        let group = Group::new(gpus)?;
        // Gradients synchronised (the real step), then the same steps without the reduction
        // (no_sync: what the GPUs cost each other apart from communication).
        for sync in [true, false] {
            let secs = group.run(|comm| {
                let mut gen = Generator::new(7);
                let mut s = LlamaStep::new(cfg.clone(), BATCH, None, comm.device(), &mut gen)?;
                let options = DdpOptions {
                    bucket_bytes: bucket_bytes()?,
                    ..Default::default()
                };
                let mut ddp = DataParallel::new(comm, &s.model, options)?;
                let secs = timed(comm.device(), || {
                    let tape = netcl_autograd::Tape::new();
                    let loss = s.model.loss(&tape, &s.x, &s.y)?;
                    if sync {
                        ddp.backward(&tape, &loss)?;
                    } else {
                        ddp.no_sync(|d| d.backward(&tape, &loss))?;
                    }
                    s.opt.step()?;
                    s.opt.zero_grad();
                    Ok(())
                })?;
                comm.barrier()?;
                if sync && comm.rank() == 0 && std::env::var("NETCL_BENCH_DDP_TRACE").is_ok() {
                    trace(&ddp);
                }
                Ok(secs)
            })?;
            let worst = secs.iter().cloned().fold(0.0, f64::max);
            println!(
                "{:<12} {:<28} {n} GPUs{}: {:.1} ms/step, {:.0} tokens/s, speed-up {:.2}x",
                "ddp",
                "llama110m_step_B16_T512",
                if sync { "" } else { " without gradient sync" },
                worst * 1e3,
                n as f64 * tokens / worst,
                n as f64 * one / worst
            );
        }
        Ok(())
    }
}

/// DdpOptions::bucket_bytes: NETCL_BENCH_DDP_BUCKET (bytes), else the default.
fn bucket_bytes() -> Result<usize> {
    Ok(std::env::var("NETCL_BENCH_DDP_BUCKET")
        .ok()
        .map(|v| netcl_core_memory::parse_bytes(&v))
        .transpose()?
        .unwrap_or(DdpOptions::default().bucket_bytes))
}

/// Seconds per call of `step` on `dev` (three warm-up calls, then STEPS timed ones).
fn timed(dev: &Device, mut step: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        step()?;
    }
    dev.synchronize()?;
    let start = Instant::now();
    for _ in 0..STEPS {
        step()?;
    }
    dev.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / STEPS as f64)
}

/// The last step's bucket copies on this rank (device clock, ms from the first copy).
fn trace(ddp: &DataParallel<'_>) {
    let c = ddp.last_copies();
    let Some(t0) = c.iter().map(|r| r.to_host.0).min() else {
        return;
    };
    let ms = |t: u64| (t.saturating_sub(t0)) as f64 / 1e6;
    for r in c {
        eprintln!(
            "bucket {:3} {:6.2} MB  down {:7.2}..{:7.2}  gather {:7.2}..{:7.2}",
            r.bucket,
            r.bytes as f64 / 1e6,
            ms(r.to_host.0),
            ms(r.to_host.1),
            ms(r.to_device.0),
            ms(r.to_device.1)
        );
    }
}
