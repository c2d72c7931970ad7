//! Train a Llama on a text corpus: byte-level BPE trained on the corpus, AdamW (no decay on norms), warmup + cosine, gradient clipping and accumulation, validation loss and bits per byte against a bigram baseline, a sample at each evaluation, checkpoint + exact resume, PNG of train/val loss.
//!
//! `cargo run --release --example llama_train -- [--data PATH] [--steps N] [--resume]`
//! Flags: `--help` lists them with their defaults (data parallel with `--devices all|N|list`,
//! `--precision f32|bf16|f16`, `--checkpoint K`, `--zero`, ...).
//! The last line is `final val_loss=X.XXXX`.
//!
//! Defaults: a 14.4M-parameter model (dim 384, 8 layers, 8 heads, SwiGLU 1024, BPE vocabulary 512,
//! context 256, batch 32), sized for the fortunes corpus (2.5 MB): it beats the bigram baseline by
//! about 30% in bits per byte; larger vocabularies or longer runs overfit it. Today's numbers:
//! docs/performance.md (llama_train).
//!
//! Data path (post-mortem 004): the token stream stays on the host, each step uploads only its
//! B*T*8 bytes of ids through pinned buffers queued one batch ahead, the embedding runs on the
//! device, and the step reads back nothing but the loss every 50 steps and at evaluations.
use netcl::cli::{parse as parse_cli, Parser};
use netcl::data::{
    bigram_baseline, encode_documents, encode_documents_with_progress, plot_history, utf8_bytes,
    History, Progress, ENDOFTEXT,
};
use netcl::distributed::{describe_devices, mixed_devices, parse_devices};
use netcl::nn::{load_checkpoint, save_checkpoint};
use netcl::optim::{clip_grad_norm_of, clip_grad_norm_on_device, Optimizer};
use netcl::prelude::*;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone)]
struct Args {
    devices: Option<String>,
    data: Option<PathBuf>,
    vocab: usize,
    cfg: LlamaConfig,
    batch: usize,
    accum: usize,
    steps: usize,
    lr: f64,
    eval_every: usize,
    seed: u64,
    out: PathBuf,
    resume: bool,
    precision: Precision,
    checkpoint: usize,
    weights: Option<Vec<f64>>,
    grad_comm: DType,
    /// Shard AdamW's state across the data-parallel ranks (ZeRO-1).
    zero: bool,
    /// One process of an MPI job: the job's devices train as one group.
    mpi: bool,
    /// Measure the devices' speed and split batches by it (a list of devices that differ).
    calibrate: bool,
    /// The data-parallel group's devices, by rank (for the line that shows the split).
    ranks: Vec<String>,
}

/// llama_train's command line.
#[derive(Parser)]
#[command(about = "Train a Llama on a text corpus (BPE, AdamW, cosine schedule, checkpoints).")]
struct Cli {
    /// Text file or folder (default: /usr/share/games/fortunes, else the shipped text).
    #[arg(long)]
    data: Option<PathBuf>,
    /// BPE vocabulary trained on the corpus.
    #[arg(long, default_value_t = 512)]
    vocab: usize,
    /// Model width.
    #[arg(long, default_value_t = 384)]
    dim: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 8)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Key/value heads (grouped-query attention; default: as many as heads).
    #[arg(long = "kv-heads")]
    kv_heads: Option<usize>,
    /// SwiGLU hidden width.
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    context: usize,
    /// Sequences per step (split between devices with --devices).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Micro-batches accumulated per step.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    accum: u64,
    /// Optimizer steps.
    #[arg(long, default_value_t = 800)]
    steps: usize,
    /// Peak learning rate (warmup over 5%, cosine to a tenth).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Steps between evaluations, samples and checkpoints.
    #[arg(long = "eval-every", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: u64,
    /// Seed of the model, the tokenizer's data order and the batches.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the tokenizer, checkpoint and plot.
    #[arg(long, default_value = "runs/llama")]
    out: PathBuf,
    /// Continue from the checkpoint in --out.
    #[arg(long)]
    resume: bool,
    /// Data parallel: `all` devices (GPUs when there are any), the first `N`, or a list of specs;
    /// rank 0 evaluates, samples, saves and prints; a list of devices that differ is split by
    /// their speed measured over steps 2-4 unless --weights gives the shares.
    #[arg(long)]
    devices: Option<String>,
    /// Shares of each batch per device (`3,1`).
    #[arg(long, value_delimiter = ',')]
    weights: Option<Vec<f64>>,
    /// Shard AdamW's state across the devices of --devices (ZeRO-1): each keeps the moments of
    /// its share of the parameters; checkpoints keep a shard per device beside the checkpoint
    /// and resume on any number of devices.
    #[arg(long)]
    zero: bool,
    /// The dtype gradients travel in between devices: f32 or bf16.
    #[arg(long = "grad-comm", default_value = "f32", value_parser = ["f32", "bf16"])]
    grad_comm: String,
    /// f32, or bf16/f16 autocast with f32 master weights (f16 with loss scaling).
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Recompute every K-th block in backward instead of keeping its activations (0: none).
    #[arg(long, default_value_t = 0)]
    checkpoint: usize,
    /// Data parallel across the processes of an MPI job (`mpirun -np P`; a build with
    /// `--features mpi`): each process brings the devices of --devices (default: the device of
    /// its local rank on the node), every process as many; rank 0 of the job reports and saves.
    #[arg(long)]
    mpi: bool,
}

/// The run's settings from `args` (without the program name); `None` after `--help`.
fn parse(args: Vec<String>) -> Result<Option<Args>> {
    let Some(c) = parse_cli::<Cli>("llama_train", args)? else {
        return Ok(None);
    };
    Ok(Some(Args {
        devices: c.devices,
        data: c.data,
        vocab: c.vocab,
        cfg: LlamaConfig {
            dim: c.dim,
            n_layers: c.layers,
            n_heads: c.heads,
            n_kv_heads: c.kv_heads.unwrap_or(c.heads),
            hidden_dim: c.hidden,
            max_seq_len: c.context,
            ..LlamaConfig::llama_15m(0)
        },
        batch: c.batch,
        accum: c.accum as usize,
        steps: c.steps,
        lr: c.lr,
        eval_every: c.eval_every as usize,
        seed: c.seed,
        out: c.out,
        resume: c.resume,
        precision: c.precision,
        checkpoint: c.checkpoint,
        weights: c.weights,
        grad_comm: if c.grad_comm == "bf16" {
            DType::BF16
        } else {
            DType::F32
        },
        zero: c.zero,
        mpi: c.mpi,
        calibrate: false,
        ranks: Vec::new(),
    }))
}

fn main() {
    if let Err(e) = netcl::devices::utf8_args("llama_train").and_then(run) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The whole run with command-line `args` (without the program name).
pub fn run(args: Vec<String>) -> Result<()> {
    let Some(mut args) = parse(args)? else {
        return Ok(());
    };
    if args.mpi {
        return run_mpi(args);
    }
    match args.devices.as_deref().map(parse_devices).transpose()? {
        // --zero keeps a group of one device: its checkpoints are sharded like any group's.
        Some(devices) if devices.len() > 1 || args.zero => {
            println!(
                "{}",
                describe_devices(args.devices.as_deref().unwrap_or(""), &devices)
            );
            args.calibrate = args.weights.is_none() && mixed_devices(&devices);
            args.ranks = devices.iter().map(|d| d.to_string()).collect();
            Group::new(devices)?.run(|comm| train(comm.device(), Some(comm), args.clone()))?;
            Ok(())
        }
        Some(devices) => train(&devices[0], None, args),
        None => train(&Device::best()?, None, args),
    }
}

/// `--mpi`: this process's devices as its part of the job's data-parallel group.
#[cfg(feature = "mpi")]
fn run_mpi(mut args: Args) -> Result<()> {
    let world = netcl::distributed::MpiWorld::init()?;
    let devices = match args.devices.as_deref() {
        Some(spec) => parse_devices(spec)?,
        None => vec![world.local_device()],
    };
    let group = world.group(devices.clone())?;
    let size = world.size() * devices.len();
    if world.rank() == 0 {
        println!(
            "MPI: {} processes x {} devices ({size} ranks); process 0: {}",
            world.size(),
            devices.len(),
            describe_devices(args.devices.as_deref().unwrap_or(""), &devices)
        );
    }
    args.ranks = (0..size).map(|r| format!("rank {r}")).collect();
    let result = group.run(|comm| train(comm.device(), Some(comm), args.clone()));
    drop(group);
    result.map(drop)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: Args) -> Result<()> {
    Err(Error::invalid(
        "llama_train",
        "--mpi needs a build with MPI: cargo build --release --features mpi --example llama_train",
    ))
}

/// The run on `dev`; with `comm`, as one rank of a data-parallel group (rank 0 reports,
/// evaluates and saves; every rank draws its own windows for its share of each batch).
fn train(dev: &Device, comm: Option<&Comm>, mut args: Args) -> Result<()> {
    let lead = comm.is_none_or(|c| c.rank() == 0);
    let rank = comm.map_or(0, |c| c.rank() as u64);
    if lead {
        println!("device: {dev} ({})", dev.info().name);
    }
    std::fs::create_dir_all(&args.out).map_err(|e| Error::io(args.out.display().to_string(), e))?;

    // Corpus, tokenizer (trained once, saved beside the checkpoint), token streams, baseline.
    let corpus = TextCorpus::load(args.data.as_deref())?;
    let split = corpus.split(10)?;
    let tok_path = args.out.join("tokenizer.json");
    let tokenizer = if args.resume {
        Tokenizer::from_file(&tok_path)?
    } else {
        let t = Tokenizer::train_bpe(&split.train, args.vocab, &[ENDOFTEXT])?;
        if lead {
            t.save(&tok_path)?;
        }
        t
    };
    // Progress on long encodes (tens of MB of text take a while).
    let mut shown = 0;
    let train = encode_documents_with_progress(&tokenizer, &split.train, |done, all| {
        let pct = done * 100 / all.max(1);
        if lead && all > 16 << 20 && pct >= shown + 10 {
            shown = pct;
            eprintln!("encoding the training text: {pct}%");
        }
    })?;
    let val = encode_documents(&tokenizer, &split.val)?;
    let val_bytes = utf8_bytes(&split.val);
    let bigram = bigram_baseline(&train, &val, tokenizer.vocab_size(), 0.01, val_bytes)?;
    let bytes_per_token = val_bytes as f64 / val.len() as f64;
    if lead {
        println!(
            "data: {} ({} documents), {} train / {} val tokens, vocab {}; bigram baseline: val loss {:.4}, {:.4} bits/byte",
            corpus.source, corpus.len(), train.len(), val.len(), tokenizer.vocab_size(), bigram.loss, bigram.bits_per_byte
        );
    }

    // Model and optimizer: no weight decay on the norms (1-D parameters).
    args.cfg.vocab_size = tokenizer.vocab_size();
    let t = args.cfg.max_seq_len;
    let model = Llama::new(args.cfg.clone(), dev, &mut Generator::new(args.seed))?
        .with_checkpointing(args.checkpoint);
    if lead {
        println!(
            "model: {} parameters, {:?}; precision {}, checkpointing every {} blocks",
            model.num_parameters(),
            args.cfg,
            args.precision,
            args.checkpoint
        );
    }
    // f16 scales the loss (and so the gradients) to keep small gradients from flushing to zero.
    let mut scaler = args.precision.scaler();
    // No weight decay on norms (the only parameters that are not matrices).
    let adamw = |params: Vec<Parameter>| {
        let (matrices, norms): (Vec<_>, Vec<_>) =
            params.into_iter().partition(|p| p.shape().len() > 1);
        AdamW::new(matrices, args.lr)
            .weight_decay(0.1)
            .add_group(norms, ParamGroup::new().weight_decay(0.0))
    };
    let schedule = CosineWithWarmup {
        base: args.lr,
        warmup_steps: args.steps / 20,
        total_steps: args.steps,
        min_lr: args.lr / 10.0,
    };
    let options = DdpOptions {
        weights: args.weights.clone(),
        comm_dtype: args.grad_comm,
        ..Default::default()
    };
    let mut ddp = comm
        .map(|c| DataParallel::new(c, &model, options))
        .transpose()?;
    let mut opt: Box<dyn Optimizer + '_> = match (&mut ddp, args.zero) {
        (Some(d), true) => Box::new(d.shard_optimizer(|mine| Ok(adamw(mine)))?),
        (None, true) => {
            return Err(Error::invalid(
                "llama_train",
                "--zero shards the optimizer across devices: give them with --devices",
            ))
        }
        (_, false) => Box::new(adamw(model.parameters())),
    };
    let ckpt = args.out.join("checkpoint");
    let mut history = History::new();
    let mut step = 0;
    if args.resume {
        let meta = match &ddp {
            Some(d) => d.load_checkpoint(&ckpt, &model, Some(opt.as_mut()))?,
            None => load_checkpoint(&ckpt, &model, Some(opt.as_mut()))?,
        };
        step = meta.step as usize;
        if let Ok(h) = serde_json::from_value::<(Vec<f32>, Vec<f32>)>(meta.extra["history"].clone())
        {
            (history.train_loss, history.test_loss) = h;
        }
        if let Some(s) = scaler
            .as_mut()
            .filter(|_| !meta.extra["grad_scaler"].is_null())
        {
            s.load_state(&meta.extra["grad_scaler"])?;
        }
        println!("resumed at step {step} from {}", ckpt.display());
    }

    // This rank's rows of each batch (all of them without data parallelism).
    let mut rows = match &mut ddp {
        Some(d) => d.shard_range(args.batch).len(),
        None => args.batch,
    };
    if let (Some(d), true) = (&ddp, lead) {
        println!("{}", split_line(d, &args));
    }

    // Validation batches: fixed windows of the validation stream.
    let mut val_batches = TokenBatcher::new(val.clone(), args.batch, t, 12345, dev)?;
    let val_sets: Vec<TokenBatch> = (0..4)
        .map(|_| val_batches.next_batch())
        .collect::<Result<_>>()?;
    let mut progress_loss = Vec::new();
    let mut last_val = f64::NAN;
    let tokens_per_step = args.batch * t * args.accum;
    let start = Instant::now();
    let first_step = step;
    while step < args.steps {
        // One batcher per evaluation block, seeded by the block: resuming at a checkpoint
        // (always a block boundary) sees exactly the batches an uninterrupted run would.
        let block = step / args.eval_every;
        let mut batches = TokenBatcher::new(
            train.clone(),
            rows,
            t,
            args.seed * 1_000_003 + block as u64 + rank * 7_919,
            dev,
        )?;
        let block_end = ((block + 1) * args.eval_every).min(args.steps);
        let mut progress = Progress::new(
            block + 1,
            args.steps.div_ceil(args.eval_every),
            block_end - step,
        );
        let mut losses = Vec::new();
        while step < block_end {
            schedule.apply(opt.as_mut(), step);
            let mut loss_sum = None;
            for micro in 0..args.accum {
                let b = batches.next_batch()?;
                let tape = Tape::new();
                let loss = args
                    .precision
                    .forward(|| model.loss(&tape, &b.inputs, &b.targets))?
                    .mul_scalar(1.0 / args.accum as f64)?;
                let scaled = match &scaler {
                    Some(s) => s.scale(&loss)?,
                    None => loss.clone(),
                };
                match &mut ddp {
                    // Only the last micro-batch's backward communicates (the sum of all).
                    Some(d) if micro + 1 == args.accum => d.backward(&tape, &scaled)?,
                    Some(d) => d.no_sync(|d| d.backward(&tape, &scaled))?,
                    None => {
                        tape.backward(&scaled)?;
                    }
                }
                let l = loss.into_value();
                loss_sum = Some(match loss_sum {
                    None => l,
                    Some(s) => l.add(&s)?,
                });
            }
            // Scaled gradients clip at the scaled norm: the unscaled ones at 1.0.
            let scale = scaler.as_ref().map_or(1.0, |s| s.scale_factor());
            match args.zero {
                // A shard's ranks hold their own gradients only: the norm is summed across them.
                true => drop(clip_grad_norm_of(opt.as_ref(), scale)?),
                false => drop(clip_grad_norm_on_device(&model.parameters(), scale)?),
            }
            match &mut scaler {
                // A step whose gradients overflowed is skipped and the scale halves.
                Some(s) => {
                    s.step(opt.as_mut())?;
                }
                None => opt.step()?,
            }
            opt.zero_grad();
            step += 1;
            // Devices that differ: time steps 2-4 (the first builds kernels), then split each
            // batch by the measured speed (the same windows' seeds, new sizes).
            if let (Some(d), true) = (&mut ddp, args.calibrate) {
                let done = step - first_step;
                if done == 1 || done == 4 {
                    d.calibrate(rows * (done - 1).max(1) * args.accum)?;
                }
                if done == 4 {
                    rows = d.shard_range(args.batch).len();
                    batches = TokenBatcher::new(
                        train.clone(),
                        rows,
                        t,
                        args.seed * 1_000_003 + step as u64 + rank * 7_919,
                        dev,
                    )?;
                    if lead {
                        println!("calibrated: {}", split_line(d, &args));
                    }
                }
            }
            if let Some(l) = loss_sum {
                losses.push(l);
            }
            if lead && (step % 50 == 0 || step == block_end) {
                let l = losses
                    .last()
                    .map(|l| l.to_vec_f64())
                    .transpose()?
                    .map_or(f64::NAN, |v| v[0]);
                progress_loss.push(l as f32);
                let done = (step - first_step) as f64;
                let secs = start.elapsed().as_secs_f64();
                let tok_s = done * tokens_per_step as f64 / secs;
                let eta = (args.steps - step) as f64 * secs / done;
                progress.advance(step - block * args.eval_every);
                progress.println(&format!(
                    "step {step}/{} loss {l:.4} lr {:.2e} {:.0} tok/s {:.1} ms/step ETA {eta:.0}s",
                    args.steps,
                    schedule.lr(step),
                    tok_s,
                    secs * 1e3 / done
                ));
            }
        }
        if !lead {
            // Other ranks take part in the checkpoint (rank 0 writes it) and go on.
            if let Some(d) = &ddp {
                d.save_checkpoint(&ckpt, &model, Some(opt.as_ref()), step as u64, json!({}))?;
            }
            continue;
        }
        // Evaluation: validation loss and bits per byte, a sample, the plot, a checkpoint.
        last_val = val_loss(&model, &val_sets, args.precision)?;
        let bpb = last_val / bytes_per_token / std::f64::consts::LN_2;
        let train_loss = progress_loss.last().copied().unwrap_or(f32::NAN);
        history.train_loss.push(train_loss);
        history.test_loss.push(last_val as f32);
        let prompt = tokenizer.encode("The ")?;
        let mut sampler = Sampler::new(
            Sampling::Random {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
            },
            args.seed,
        )?;
        let sample = generate(
            &model,
            std::slice::from_ref(&prompt),
            48,
            &mut sampler,
            tokenizer.eos_id(),
            |_, _| Ok(()),
        )?;
        let text = tokenizer.decode(&[prompt, sample[0].clone()].concat())?;
        progress.finish(&format!(
            "val loss {last_val:.4} ({bpb:.4} bits/byte; bigram {:.4})",
            bigram.bits_per_byte
        ));
        println!("sample: {}", text.replace('\n', " "));
        plot_history(
            args.out.join("loss.png"),
            "Llama: train / val loss",
            &history,
        )?;
        let extra = json!({"history": (&history.train_loss, &history.test_loss), "val_loss": last_val, "bits_per_byte": bpb, "grad_scaler": scaler.as_ref().map(|s| s.state())});
        match &ddp {
            Some(d) => d.save_checkpoint(&ckpt, &model, Some(opt.as_ref()), step as u64, extra)?,
            None => {
                save_checkpoint(&ckpt, &model, Some(opt.as_ref()), step as u64, extra)?;
            }
        }
    }
    if !lead {
        return Ok(());
    }
    if last_val.is_nan() {
        // No step ran (`--steps 0`, or resumed at the end): report the model as it is.
        last_val = val_loss(&model, &val_sets, args.precision)?;
    }
    let bpb = last_val / bytes_per_token / std::f64::consts::LN_2;
    println!(
        "{} steps in {:.1}s on {dev}; val {bpb:.4} bits/byte vs bigram {:.4} ({:.0}% better)",
        step - first_step,
        start.elapsed().as_secs_f64(),
        bigram.bits_per_byte,
        100.0 * (1.0 - bpb / bigram.bits_per_byte)
    );
    println!("final val_loss={last_val:.4}");
    Ok(())
}

/// How each batch is split between the ranks, and what the gradients travel as.
fn split_line(d: &DataParallel<'_>, args: &Args) -> String {
    let parts: Vec<String> = (d.split(args.batch).iter().zip(&args.ranks))
        .map(|(n, dev)| format!("{n} on {dev}"))
        .collect();
    format!(
        "data parallel: {} ranks, each batch of {} sequences split {}; gradients travel as {}",
        args.ranks.len(),
        args.batch,
        parts.join(", "),
        args.grad_comm
    )
}

/// The mean loss over the fixed validation batches.
fn val_loss(model: &Llama, val_sets: &[TokenBatch], precision: Precision) -> Result<f64> {
    let eval = Tape::no_grad();
    let mut v = 0.0;
    for b in val_sets {
        v += precision
            .forward(|| model.loss(&eval, &b.inputs, &b.targets))?
            .item()?;
    }
    Ok(v / val_sets.len() as f64)
}
