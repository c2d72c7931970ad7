//! Data-parallel training in one file: an MLP on a synthetic regression, one replica per device.
//!
//! `cargo run --release --example data_parallel -- [--devices all|N|list]` (default: all).
use netcl::cli::{parse, Parser};
use netcl::distributed::parse_devices;
use netcl::prelude::*;
use std::time::Instant;

const BATCH: usize = 64;
const STEPS: usize = 100;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The example's command line.
#[derive(Parser)]
struct Args {
    /// `all` devices (of the best kind), the first `N`, or a list of specs (`opencl:0:0,host`).
    #[arg(long, default_value = "all")]
    devices: String,
}

fn run() -> Result<()> {
    let argv = netcl::devices::utf8_args("data_parallel")?;
    let Some(args) = parse::<Args>("data_parallel", argv)? else {
        return Ok(());
    };
    let group = Group::new(parse_devices(&args.devices)?)?;

    // One thread per device; each runs this closure as one rank.
    let losses = group.run(|comm| {
        let dev = comm.device();
        // Every replica starts from rank 0's parameters (DataParallel::new broadcasts them).
        let mut gen = Generator::new(1);
        let model = Sequential::new()
            .with(Linear::new(16, 64, dev, &mut gen)?)
            .with(ReLU)
            .with(Linear::new(64, 1, dev, &mut gen)?);
        let mut ddp = DataParallel::new(comm, &model, DdpOptions::default())?;
        let mut opt = Sgd::new(model.parameters(), 0.05).momentum(0.9);
        let rows = ddp.split(BATCH);
        println!(
            "rank {} on {dev}: {} of {BATCH} rows per step",
            comm.rank(),
            rows[comm.rank()]
        );

        let start = Instant::now();
        let mut last = 0.0;
        for step in 0..STEPS {
            // The whole batch (the same on every rank); each rank takes its rows.
            let (x, y) = synthetic_batch(step)?;
            let (x, y) = (ddp.shard(&x)?, ddp.shard(&y)?);
            let tape = Tape::new();
            let pred = model.forward(&tape, &Var::from(x))?;
            let loss = mse_loss(&pred, &Var::from(y))?;
            ddp.backward(&tape, &loss)?; // gradients averaged over all ranks' rows
            opt.step()?;
            opt.zero_grad();
            if step + 1 == STEPS {
                last = loss.item()?;
            }
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / STEPS as f64;
        println!(
            "rank {}: {ms:.2} ms/step, last loss on its rows {last:.5}",
            comm.rank()
        );
        // Rank 0 alone writes the checkpoint, once every rank got here.
        let path = std::env::temp_dir().join("netcl-data-parallel");
        ddp.save_checkpoint(
            &path,
            &model,
            Some(&opt),
            STEPS as u64,
            serde_json::json!({}),
        )?;
        Ok(last)
    })?;
    println!("final losses per rank: {losses:?}");
    Ok(())
}

/// Step `s`'s batch: inputs in [-1, 1) and the target sum(sin(x)).
fn synthetic_batch(s: usize) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..BATCH * 16)
        .map(|i| ((i * 37 + s * 101) % 200) as f32 / 100.0 - 1.0)
        .collect();
    let y: Vec<f32> = x
        .chunks(16)
        .map(|r| r.iter().map(|v| v.sin()).sum())
        .collect();
    let host = Device::host();
    Ok((
        Tensor::from_vec(x, &[BATCH, 16], &host)?,
        Tensor::from_vec(y, &[BATCH, 1], &host)?,
    ))
}
