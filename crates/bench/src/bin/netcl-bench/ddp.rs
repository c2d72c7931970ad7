//! The data-parallel workloads of netcl-bench: the Llama-110M step (16 sequences of 512 per GPU, AdamW; f32 or bf16 autocast, gradients sent in f32 or bf16, optimizer sharded or not) and the 1B-class step, on one GPU and on several through DataParallel; benches/reference/ddp_torch.py runs PyTorch DDP / ZeroRedundancyOptimizer on the same shapes.
//!
//! NETCL_BENCH_DDP_BUCKET sets the bucket size; NETCL_BENCH_DDP_TRACE=1 prints each rank's buckets
//! of the last synchronised step (when backward produced each, its copies; device clock) to
//! stderr. Built with feature `mpi` and run under mpirun with NETCL_BENCH_MPI=1, each process
//! takes NETCL_BENCH_GPUS GPUs (those of its local rank on the node) and the job's ranks train
//! together (MpiWorld::group); rank 0 prints.
use crate::Runner;
use netcl_autograd::Tape;
use netcl_bench::train::LlamaStep;
use netcl_core_devices::{DType, Device, DeviceKind, Result};
use netcl_distributed::{DataParallel, DdpOptions, Group};
use netcl_models::{Llama, LlamaConfig};
use netcl_ops::{Generator, Tensor};
use netcl_optim::{AdamW, Optimizer};
use std::time::Instant;

/// Steps timed (after three warm-up steps).
const STEPS: usize = 8;

/// One data-parallel configuration: the model, the forward's precision, the dtype gradients
/// travel in, and whether the optimizer is sharded (ZeRO-1).
struct Mode {
    key: &'static str,
    /// The 1B-class shape (every block checkpointed) instead of Llama-110M.
    big: bool,
    autocast: Option<DType>,
    comm: DType,
    zero: bool,
}

const MODES: [Mode; 7] = [
    Mode {
        key: "f32",
        big: false,
        autocast: None,
        comm: DType::F32,
        zero: false,
    },
    Mode {
        key: "f32_zero",
        big: false,
        autocast: None,
        comm: DType::F32,
        zero: true,
    },
    Mode {
        key: "bf16",
        big: false,
        autocast: Some(DType::BF16),
        comm: DType::F32,
        zero: false,
    },
    Mode {
        key: "bf16_comm",
        big: false,
        autocast: Some(DType::BF16),
        comm: DType::BF16,
        zero: false,
    },
    Mode {
        key: "bf16_zero",
        big: false,
        autocast: Some(DType::BF16),
        comm: DType::BF16,
        zero: true,
    },
    Mode {
        key: "1b",
        big: true,
        autocast: Some(DType::BF16),
        comm: DType::BF16,
        zero: false,
    },
    Mode {
        key: "1b_zero",
        big: true,
        autocast: Some(DType::BF16),
        comm: DType::BF16,
        zero: true,
    },
];

impl Mode {
    /// The model, sequences per GPU, and the workload's name.
    fn shape(&self) -> (LlamaConfig, usize, &'static str) {
        match self.big {
            false => (
                LlamaConfig {
                    max_seq_len: 512,
                    ..LlamaConfig::llama_110m(32000)
                },
                16,
                "llama110m_step_B16_T512",
            ),
            true => (crate::scale::tiny_llama_1b(), 4, "llama1b_step_B4_T2048"),
        }
    }

    fn model(&self, dev: &Device, gen: &mut Generator) -> Result<LlamaStep> {
        let (cfg, b, _) = self.shape();
        let model = Llama::new(cfg, dev, gen)?.with_checkpointing(usize::from(self.big));
        let mut s = LlamaStep::from_model(model, b, dev)?;
        s.autocast = self.autocast;
        Ok(s)
    }
}

/// Forward (under autocast when set) and the loss of batch `(x, y)`.
fn loss(
    model: &Llama,
    (x, y): (&Tensor, &Tensor),
    autocast: Option<DType>,
    tape: &Tape,
) -> Result<netcl_autograd::Var> {
    match autocast {
        Some(dt) => netcl_autograd::autocast(dt, || model.loss(tape, x, y))?,
        None => model.loss(tape, x, y),
    }
}

impl Runner {
    /// `--suite ddp`: the modes named by NETCL_BENCH_DDP (default f32,bf16,bf16_comm; also
    /// f32_zero, bf16_zero, 1b, 1b_zero) on one GPU and on the first NETCL_BENCH_GPUS (default
    /// every) GPUs: tokens/s, speed-up, the pool's peak per GPU.
    pub(crate) fn ddp(&mut self) -> Result<()> {
        let mut gpus: Vec<Device> = Device::opencl_devices()
            .into_iter()
            .filter(|d| d.kind() == DeviceKind::Gpu)
            .collect();
        #[cfg(feature = "mpi")]
        if std::env::var("NETCL_BENCH_MPI").is_ok_and(|v| v == "1") {
            return self.ddp_mpi(gpus);
        }
        if let Ok(n) = std::env::var("NETCL_BENCH_GPUS") {
            gpus.truncate(n.parse().unwrap_or(gpus.len()));
        }
        let Some(first) = gpus.first().cloned() else {
            println!("ddp: needs OpenCL GPUs, found none");
            return Ok(());
        };
        let wanted =
            std::env::var("NETCL_BENCH_DDP").unwrap_or_else(|_| "f32,bf16,bf16_comm".into());
        let mut single: Vec<((bool, Option<DType>), f64)> = Vec::new();
        for mode in MODES
            .iter()
            .filter(|m| wanted.split(',').any(|w| w == m.key))
        {
            let (_, b, name) = mode.shape();
            let tokens = (b * mode.shape().0.max_seq_len) as f64;
            let key = (mode.big, mode.autocast);
            let one = match single.iter().find(|(k, _)| *k == key) {
                Some((_, t)) => *t,
                None => {
                    let mut s = mode.model(&first, &mut self.gen)?;
                    let (t, peak) = peak_of(&first, || timed(&first, || s.step()))?;
                    drop(s);
                    println!(
                        "{:<12} {name:<28} {:<10} 1 GPU: {:.1} ms/step, {:.0} tokens/s, pool peak {:.2} GiB",
                        "ddp", mode.key, t * 1e3, tokens / t, gib(peak)
                    );
                    single.push((key, t));
                    t
                }
            };
            if gpus.len() < 2 {
                println!("ddp: needs two OpenCL GPUs, found {}", gpus.len());
                return Ok(());
            }
            let n = gpus.len();
            let group = Group::new(gpus.clone())?;
            // Synchronised (the real step); for plain modes also without the reduction (what
            // the GPUs cost each other apart from communication).
            let syncs: &[bool] = if mode.zero || mode.big {
                &[true]
            } else {
                &[true, false]
            };
            for &sync in syncs {
                let runs = group.run(|comm| rank_step(comm, mode, sync))?;
                let worst = runs.iter().map(|r| r.0).fold(0.0, f64::max);
                let peak = runs.iter().map(|r| r.1).max().unwrap_or(0);
                println!(
                    "{:<12} {name:<28} {:<10} {n} GPUs{}: {:.1} ms/step, {:.0} tokens/s, speed-up {:.2}x, pool peak {:.2} GiB a GPU",
                    "ddp",
                    mode.key,
                    if sync { "" } else { " without gradient sync" },
                    worst * 1e3,
                    n as f64 * tokens / worst,
                    n as f64 * one / worst,
                    gib(peak)
                );
            }
        }
        Ok(())
    }

    /// `--suite ddp` across the processes of an MPI job: each process's NETCL_BENCH_GPUS GPUs
    /// (default 1) from its local rank on; rank 0 prints the job's slowest rank.
    #[cfg(feature = "mpi")]
    fn ddp_mpi(&mut self, gpus: Vec<Device>) -> Result<()> {
        let world = netcl_distributed::MpiWorld::init()?;
        let per: usize = std::env::var("NETCL_BENCH_GPUS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let first = world.local_rank() * per;
        let Some(mine) = gpus.get(first..first + per) else {
            return Err(netcl_core_devices::Error::invalid(
                "ddp",
                format!(
                    "local rank {} needs GPUs {first}..{} of {}",
                    world.local_rank(),
                    first + per,
                    gpus.len()
                ),
            ));
        };
        let group = world.group(mine.to_vec())?;
        let n = world.size() * per;
        let wanted = std::env::var("NETCL_BENCH_DDP").unwrap_or_else(|_| "f32".into());
        for mode in MODES
            .iter()
            .filter(|m| wanted.split(',').any(|w| w == m.key))
        {
            let (_, b, name) = mode.shape();
            let tokens = (b * mode.shape().0.max_seq_len) as f64;
            let runs = group.run(|comm| rank_step(comm, mode, true))?;
            if world.rank() == 0 {
                println!(
                    "{:<12} {name:<28} {:<10} {n} GPUs, {} processes x {per}: {:.1} ms/step, {:.0} tokens/s, pool peak {:.2} GiB a GPU",
                    "ddp",
                    mode.key,
                    world.size(),
                    runs[0].0 * 1e3,
                    n as f64 * tokens / runs[0].0,
                    gib(runs[0].1)
                );
            }
        }
        drop(group);
        Ok(())
    }
}

/// One rank's timed steps in `mode`: seconds a step and the pool's peak bytes (each the
/// largest over the ranks).
fn rank_step(comm: &netcl_distributed::Comm, mode: &Mode, sync: bool) -> Result<(f64, usize)> {
    let dev = comm.device();
    let mut gen = Generator::new(7);
    let s = mode.model(dev, &mut gen)?;
    let options = DdpOptions {
        bucket_bytes: bucket_bytes()?,
        comm_dtype: mode.comm,
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &s.model, options)?;
    let LlamaStep {
        model,
        x,
        y,
        opt,
        autocast,
    } = s;
    let mut opt: Box<dyn Optimizer + '_> = match mode.zero {
        true => Box::new(ddp.shard_optimizer(|ps| Ok(AdamW::new(ps, 3e-4).weight_decay(0.1)))?),
        false => Box::new(opt),
    };
    let out = peak_of(dev, || {
        timed(dev, || {
            let tape = Tape::new();
            let l = loss(&model, (&x, &y), autocast, &tape)?;
            match sync {
                true => ddp.backward(&tape, &l)?,
                false => ddp.no_sync(|d| d.backward(&tape, &l))?,
            }
            opt.step()?;
            opt.zero_grad();
            Ok(())
        })
    })?;
    comm.barrier()?;
    if sync && std::env::var("NETCL_BENCH_DDP_TRACE").is_ok() {
        trace(comm.rank(), &ddp);
    }
    // The slowest rank sets the pace (and reports for all, where ranks are processes).
    let mut worst = [out.0 as f32, out.1 as f32];
    comm.all_reduce_host(&mut worst, netcl_distributed::ReduceOp::Max, 1.0)?;
    Ok((worst[0] as f64, worst[1] as usize))
}

/// `f`'s result and the peak bytes the device's pool held above what it held before.
fn peak_of<T>(dev: &Device, f: impl FnOnce() -> Result<T>) -> Result<(T, usize)> {
    // The host counts its live tensors instead of a pool.
    if !dev.is_host() {
        netcl_core_memory::Pool::of(dev)?.empty_cache();
    }
    netcl_core_memory::reset_held_peak(dev)?;
    let base = netcl_core_memory::held(dev)?.0;
    let out = f()?;
    Ok((out, netcl_core_memory::held(dev)?.1.saturating_sub(base)))
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
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

/// The last step's buckets on this rank: when backward had produced each and its copies down
/// and back (device clock, ms from its first bucket ready), and the relay's host steps of its
/// last chunk (host clock, ms from the session's start: copy down issued / seen done, fold start
/// / end, gather issued / seen done).
fn trace(rank: usize, ddp: &DataParallel<'_>) {
    let c = ddp.last_copies();
    let ready = c.iter().map(|r| r.ready).filter(|&t| t > 0);
    let Some(t0) = ready.chain(c.iter().map(|r| r.to_host.0)).min() else {
        return;
    };
    let ms = |t: u64| (t.saturating_sub(t0)) as f64 / 1e6;
    let mut out = String::new();
    for r in c {
        let host: Vec<String> = r
            .host
            .iter()
            .map(|&t| format!("{:6.2}", t as f64 / 1e6))
            .collect();
        out += &format!(
            "rank {rank} bucket {:3} {:6.2} MB  ready {:7.2}  down {:7.2}..{:7.2}  gather {:7.2}..{:7.2}  host {}\n",
            r.bucket,
            r.bytes as f64 / 1e6,
            ms(r.ready),
            ms(r.to_host.0),
            ms(r.to_host.1),
            ms(r.to_device.0),
            ms(r.to_device.1),
            host.join(" ")
        );
    }
    eprint!("{out}");
}
