//! Fashion-MNIST with a multi-layer perceptron: the README's main command.
//!
//! Model: 784-1024-1024-10 with ReLU and dropout 0.2, Adam (lr 1e-3, cosine schedule with
//! warmup), batch 128, 10 epochs. Target on the full dataset: test accuracy >= 0.885 within 10
//! epochs (the dataset's benchmark table: MLP 256-128-100 reaches 0.8833). See README.md for
//! what it reached, on which device, in how long.
//!
//! Data: $NETCL_DATA, ./data/fashion-mnist, /usr/share/datasets/fashion-mnist (Debian package
//! dataset-fashion-mnist), else the 2,000/500-image subset shipped in crates/data.
//! Writes runs/mlp/checkpoint.json (naming its checkpoint.<hash>.npz) and runs/mlp/history.png
//! after each epoch; with `--epochs 0` it trains nothing and saves nothing (and says so).
//!
//! `--devices all|N|list` (e.g. `--devices 2`, `--devices opencl:0:0,opencl:0:1`) trains data
//! parallel: one replica per device, each batch split between them (netcl-distributed's
//! `DataParallel`); rank 0 evaluates, logs and saves. Without it: the best device.
use netcl::cli::{parse_with, Parser};
use netcl::data::{Batches, ImageLayout, Progress};
use netcl::distributed::{
    describe_devices, mixed_devices, parse_devices, Comm, DataParallel, DdpOptions, Group,
};
use netcl::prelude::*;
use netcl::train::{evaluate, fashion_mnist_on, Meter, RunLog, TrainArgs};
use serde_json::json;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The MLP's command line: the shared training flags and the devices.
#[derive(Parser)]
#[command(about = "Fashion-MNIST with a multi-layer perceptron (784-1024-1024-10).")]
struct Args {
    #[command(flatten)]
    train: TrainArgs,
    /// Data parallel over `all` devices (of the best kind), the first `N`, or a list of specs
    /// (`opencl:0:0,opencl:0:1`); without it, the best device.
    #[arg(long)]
    devices: Option<String>,
}

fn run() -> Result<()> {
    let defaults = TrainArgs {
        epochs: 10,
        batch: 128,
        lr: 1e-3,
        seed: 1,
        out: "runs/mlp".into(),
    };
    let argv = netcl::devices::utf8_args("mlp")?;
    let Some(Args {
        train: args,
        devices,
    }) = parse_with("mlp", argv, |c| defaults.as_defaults(c))?
    else {
        return Ok(());
    };
    let spec = devices;
    match spec.as_deref().map(parse_devices).transpose()? {
        Some(devices) if devices.len() > 1 => {
            println!(
                "{}",
                describe_devices(spec.as_deref().unwrap_or(""), &devices)
            );
            // Devices that differ split each batch by their measured speed.
            let calibrate = mixed_devices(&devices);
            Group::new(devices)?.run(|comm| train(comm.device(), Some(comm), &args, calibrate))?;
            Ok(())
        }
        Some(devices) => train(&devices[0], None, &args, false),
        None => train(&Device::best()?, None, &args, false),
    }
}

/// The training run on `dev`; with `comm`, as one rank of a data-parallel group (rank 0 prints,
/// evaluates and saves; with `calibrate`, batches are split by the speed each rank showed over
/// steps 2-4).
fn train(dev: &Device, comm: Option<&Comm>, args: &TrainArgs, calibrate: bool) -> Result<()> {
    let lead = comm.is_none_or(|c| c.rank() == 0);
    if lead {
        println!("device: {dev} ({})", dev.info().name);
    }
    let (train, test, source) = fashion_mnist_on(dev, ImageLayout::Flat)?;
    if lead {
        println!(
            "data: {source} ({} train, {} test images)",
            train.len(),
            test.len()
        );
    }

    let mut gen = Generator::new(args.seed);
    let mut model = Sequential::new()
        .with(Linear::new(784, 1024, dev, &mut gen)?)
        .with(ReLU)
        .with(Dropout::new(0.2, args.seed)?)
        .with(Linear::new(1024, 1024, dev, &mut gen)?)
        .with(ReLU)
        .with(Dropout::new(0.2, args.seed + 1)?)
        .with(Linear::new(1024, 10, dev, &mut gen)?);
    if lead {
        println!("model: {} parameters", model.num_parameters());
    }
    let mut ddp = comm
        .map(|c| DataParallel::new(c, &model, DdpOptions::default()))
        .transpose()?;
    let split_line = |d: &DataParallel<'_>| {
        format!(
            "each batch's {} rows split {:?} by rank",
            args.batch,
            d.split(args.batch)
        )
    };
    if let (Some(d), true) = (&ddp, lead) {
        println!("{}", split_line(d));
    }
    let mut opt = Adam::new(model.parameters(), args.lr);
    let (steps_per_epoch, schedule) = args.schedule(train.len())?;

    let mut log = RunLog::new(&args.out, "Fashion-MNIST MLP", json!({"data": source}));
    let mut step = 0;
    for epoch in 1..=args.epochs {
        model.train();
        let mut meter = Meter::new(dev)?;
        let mut progress = Progress::new(epoch, args.epochs, steps_per_epoch);
        let started = std::time::Instant::now();
        let order = Batches::new(
            train.len(),
            args.batch,
            Some(args.seed * 1000 + epoch as u64),
        )?;
        for (i, batch) in train.batches(&order)?.enumerate() {
            let (mut x, mut y) = batch?;
            schedule.apply(&mut opt, step);
            if let Some(d) = &mut ddp {
                (x, y) = (d.shard(&x)?, d.shard(&y)?);
            }
            let tape = Tape::new();
            let logits = model.forward(&tape, &Var::from(x))?;
            let loss = cross_entropy(&logits, &y)?;
            match &mut ddp {
                Some(d) => d.backward(&tape, &loss)?,
                None => {
                    tape.backward(&loss)?;
                }
            }
            opt.step()?;
            opt.zero_grad();
            meter.add(&loss, &logits, &y)?;
            step += 1;
            if let (Some(d), Some(c), true, 1 | 4) = (&mut ddp, comm, calibrate, step) {
                // Step 1 builds kernels: its time is dropped; steps 2-4 set the weights.
                let rows = d.split(args.batch)[c.rank()] * if step == 1 { 1 } else { 3 };
                d.calibrate(rows)?;
                if step == 4 && lead {
                    println!("calibrated: {}", split_line(d));
                }
            }
            if lead && (i % 50 == 49 || i + 1 == steps_per_epoch) {
                let (l, a) = meter.read()?;
                progress.update(i + 1, l, a);
            }
        }
        let train_metrics = meter.read()?;
        let step_ms = started.elapsed().as_secs_f64() * 1e3 / steps_per_epoch.max(1) as f64;
        if !lead {
            continue;
        }
        println!("epoch {epoch}: {step_ms:.2} ms/step");
        model.eval();
        let (test_loss, test_acc) = evaluate(&model, &test, 1000)?;
        progress.finish(&format!("test loss {test_loss:.4} accuracy {test_acc:.4}"));
        log.epoch(
            epoch,
            train_metrics,
            (test_loss, test_acc),
            &model,
            &opt,
            step,
        )?;
    }
    if lead {
        log.finish();
    }
    Ok(())
}
