//! Shared by the data-parallel tests and the MPI example: an MLP, its batches, single-device training (the reference) and one rank's data-parallel training.
#![allow(dead_code)]
use netcl_autograd::{Tape, Var};
use netcl_core_devices::{Device, Result};
use netcl_distributed::{Comm, DataParallel, DdpOptions};
use netcl_nn::{mse_loss, Linear, Module, Sequential, Tanh};
use netcl_ops::{Generator, Tensor};
use netcl_optim::{Optimizer, Sgd};

pub const STEPS: usize = 20;
pub const BATCH: usize = 16;
/// Parameters of the data-parallel runs may differ from the single-device run by this much
/// (absolute; parameters are O(0.5); measured 4.5e-8 to 7.5e-8 on two PoCL devices): the shards' gradients are summed in another order than
/// one device's matmul sums over the batch, which changes f32 rounding (about 1e-7 relative per
/// step), and 20 momentum steps carry it forward.
pub const TOL: f32 = 1e-6;

pub fn mlp(device: &Device, seed: u64) -> Result<Sequential> {
    let mut gen = Generator::new(seed);
    Ok(Sequential::new()
        .with(Linear::new(6, 16, device, &mut gen)?)
        .with(Tanh)
        .with(Linear::new(16, 16, device, &mut gen)?)
        .with(Tanh)
        .with(Linear::new(16, 3, device, &mut gen)?))
}

/// Step `s`'s whole batch (host tensors): inputs and regression targets.
pub fn batch(s: usize, n: usize) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..n * 6)
        .map(|i| (((i * 31 + s * 17) % 23) as f32 / 11.0) - 1.0)
        .collect();
    let y: Vec<f32> = (0..n * 3)
        .map(|i| (((i * 13 + s * 7) % 19) as f32 / 9.0) - 1.0)
        .collect();
    Ok((
        Tensor::from_vec(x, &[n, 6], &Device::host())?,
        Tensor::from_vec(y, &[n, 3], &Device::host())?,
    ))
}

pub fn params(m: &dyn Module) -> Result<Vec<Vec<f32>>> {
    m.parameters()
        .iter()
        .map(|p| p.value().to_vec::<f32>())
        .collect()
}

/// The reference: one device, the whole batch.
pub fn train_single(device: &Device) -> Result<Vec<Vec<f32>>> {
    let model = mlp(device, 7)?;
    let mut opt = Sgd::new(model.parameters(), 0.1).momentum(0.9);
    for s in 0..STEPS {
        let (x, y) = batch(s, BATCH)?;
        let tape = Tape::new();
        let pred = model.forward(&tape, &Var::from(x.to_device(device)?))?;
        let loss = mse_loss(&pred, &Var::from(y.to_device(device)?))?;
        tape.backward(&loss)?;
        opt.step()?;
        opt.zero_grad();
    }
    params(&model)
}

/// One data-parallel step: this rank's rows of `(x, y)`, forward, the loss times `scale`,
/// overlapped backward.
pub fn ddp_step(
    ddp: &mut DataParallel<'_>,
    model: &Sequential,
    (x, y): (&Tensor, &Tensor),
    scale: f64,
) -> Result<()> {
    let (xs, ys) = (ddp.shard(x)?, ddp.shard(y)?);
    let tape = Tape::new();
    let pred = model.forward(&tape, &Var::from(xs))?;
    let loss = mse_loss(&pred, &Var::from(ys))?.mul_scalar(scale)?;
    ddp.backward(&tape, &loss)
}

/// One rank's data-parallel training; replicas start from different seeds (rank 0's parameters
/// are broadcast). With `accumulate`, each step is two half-batches, the first under no_sync.
pub fn train_rank(
    comm: &Comm,
    weights: Option<Vec<f64>>,
    accumulate: bool,
) -> Result<Vec<Vec<f32>>> {
    let model = mlp(comm.device(), 7 + comm.rank() as u64)?;
    // Small buckets: several per step, sent while backward runs.
    let options = DdpOptions {
        bucket_bytes: 512,
        weights,
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &model, options)?;
    assert!(ddp.bucket_sizes().len() >= 3, "{:?}", ddp.bucket_sizes());
    let mut opt = Sgd::new(model.parameters(), 0.1).momentum(0.9);
    for s in 0..STEPS {
        let (x, y) = batch(s, BATCH)?;
        if accumulate {
            let half = |t: &Tensor, i: usize| t.narrow(0, i * BATCH / 2, BATCH / 2)?.contiguous();
            let (x0, y0, x1, y1) = (half(&x, 0)?, half(&y, 0)?, half(&x, 1)?, half(&y, 1)?);
            // Two halves whose losses are each half the mean: their sum is the batch mean.
            ddp.no_sync(|d| ddp_step(d, &model, (&x0, &y0), 0.5))?;
            ddp_step(&mut ddp, &model, (&x1, &y1), 0.5)?;
        } else {
            ddp_step(&mut ddp, &model, (&x, &y), 1.0)?;
        }
        opt.step()?;
        opt.zero_grad();
    }
    params(&model)
}

pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

pub fn check(name: &str, single: &[Vec<f32>], ranks: &[Vec<Vec<f32>>]) {
    for (r, p) in ranks.iter().enumerate() {
        // Every replica holds the same bits: the reduction is deterministic and identical.
        assert!(p == &ranks[0], "{name}: rank {r} differs from rank 0");
    }
    let d = max_diff(single, &ranks[0]);
    eprintln!("{name}: max |parallel - single| = {d:e}");
    assert!(d <= TOL, "{name}: max difference {d} > {TOL}");
}
