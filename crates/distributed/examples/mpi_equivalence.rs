//! The equivalence test over MPI: `mpirun -np 2 mpi_equivalence`. Each process trains the MLP for 20 steps as one rank (even split, then 3:1), each on its own device, and checks that its parameters equal single-device training at the whole batch (within the same tolerance as the in-process test) and are bit-identical on every rank; collectives are checked against a host computation. Where a process sees two OpenCL devices or more, the same again with two devices per process (`MpiWorld::group`: 2 P ranks). Exits non-zero on any failure.
#[path = "../tests/support/mod.rs"]
mod support;
use netcl_core_devices::{Error, Result};
use netcl_distributed::{Comm, DataParallel, DdpOptions, MpiWorld, ReduceOp};
use netcl_nn::Module;
use netcl_ops::Tensor;
use netcl_optim::{AdamW, Optimizer};
use support::equivalence::*;

fn main() {
    let world = match MpiWorld::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let result = run(&world);
    match &result {
        Ok(n) => println!("rank {rank} of {size}: {n} passed, 0 failed"),
        Err(e) => eprintln!("rank {rank} of {size}: error: {e}"),
    }
    drop(world);
    std::process::exit(i32::from(result.is_err()));
}

fn run(world: &MpiWorld) -> Result<usize> {
    let device = world.local_device();
    println!("rank {} of {} on {device}", world.rank(), world.size());
    let comm = world.comm(device.clone());
    let mut passed = check(&comm, 1)?;
    drop(comm);
    // Two devices per process: every process's ranks are ranks of the job.
    let devices = netcl_core_devices::Device::opencl_devices();
    if devices.len() >= 2 {
        // Processes that bring different numbers of devices: an error on every process.
        let uneven = devices[..1 + usize::from(world.rank() == 0)].to_vec();
        match world.group(uneven) {
            Err(e) if e.to_string().contains("different numbers of devices") => passed += 1,
            other => {
                return Err(Error::invalid(
                    "MpiWorld::group",
                    format!("uneven device counts gave {:?}", other.map(|g| g.size())),
                ))
            }
        }
        let group = world.group(devices[..2].to_vec())?;
        passed += group.run(|c| check(c, 2))?.into_iter().sum::<usize>();
    }
    Ok(passed)
}

/// The collectives against the host, then data-parallel training against one device, on `comm`
/// (`local` ranks a process: a sum folds each process's ranks, then the processes, in order).
fn check(comm: &Comm, local: usize) -> Result<usize> {
    let device = comm.device().clone();
    let size = comm.size();
    // A root that is not rank 0 (on another process than rank 0 where there are several).
    let root = size - 1;
    // Collectives against the host: sizes 0, 1, odd, and not divisible by the rank count.
    for n in [0usize, 1, 7, 10] {
        let data = |r: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.37 - 2.9)
                .collect()
        };
        let t = Tensor::from_vec(data(comm.rank()), &[n], &device)?;
        comm.all_reduce(&t, ReduceOp::Sum)?;
        let process = |p: usize, i: usize| {
            (1..local).fold(data(p * local)[i], |a, r| a + data(p * local + r)[i])
        };
        let want: Vec<f32> = (0..n)
            .map(|i| (1..size / local).fold(process(0, i), |a, p| a + process(p, i)))
            .collect();
        if t.to_vec::<f32>()? != want {
            return Err(Error::invalid(
                "mpi all_reduce",
                format!("n {n}: {:?} != {want:?}", t.to_vec::<f32>()?),
            ));
        }
        let all = comm.all_gather(&Tensor::from_vec(data(comm.rank()), &[n], &device)?)?;
        let want: Vec<f32> = (0..size).flat_map(data).collect();
        if all.to_vec::<f32>()? != want {
            return Err(Error::invalid("mpi all_gather", format!("n {n}")));
        }
        let b = Tensor::from_vec(data(comm.rank()), &[n], &device)?;
        comm.broadcast(&b, root)?;
        if b.to_vec::<f32>()? != data(root) {
            return Err(Error::invalid(
                "mpi broadcast",
                format!("n {n} from rank {root}"),
            ));
        }
        let whole = Tensor::from_vec(data(root), &[n], &device)?;
        let part = comm.scatter((comm.rank() == root).then_some(&whole), root)?;
        let rows = netcl_distributed::split_range(n, size, comm.rank());
        if part.to_vec::<f32>()? != data(root)[rows] {
            return Err(Error::invalid(
                "mpi scatter",
                format!("n {n} from rank {root}"),
            ));
        }
    }
    comm.barrier()?;
    let single = train_single(&device)?;
    let uneven: Vec<f64> = (0..size).map(|r| if r == 0 { 3.0 } else { 1.0 }).collect();
    for (name, weights) in [("even", None), ("3:1", Some(uneven))] {
        let mine = train_rank(comm, weights, false)?;
        // Every rank's parameters, to compare them bit for bit.
        let flat: Vec<f32> = mine.iter().flatten().copied().collect();
        let all = comm
            .all_gather(&Tensor::from_vec(flat.clone(), &[1, flat.len()], &device)?)?
            .to_vec::<f32>()?;
        if all.chunks(flat.len()).any(|c| c != flat.as_slice()) {
            return Err(Error::invalid(
                "mpi equivalence",
                format!("{name}: ranks hold different parameters"),
            ));
        }
        let d = max_diff(&single, &mine);
        println!(
            "rank {} of {size} {name}: max |parallel - single| = {d:e}",
            comm.rank()
        );
        if d > TOL {
            return Err(Error::invalid(
                "mpi equivalence",
                format!("{name}: max difference {d} > {TOL}"),
            ));
        }
    }
    // ZeRO-1: AdamW's state sharded over the ranks steps the parameters as the whole does.
    let (plain, sharded) = (train_adamw(comm, false)?, train_adamw(comm, true)?);
    let d = max_diff(&plain, &sharded);
    println!(
        "rank {} of {size} ZeRO-1: max |sharded - unsharded| = {d:e}",
        comm.rank()
    );
    if d != 0.0 {
        return Err(Error::invalid(
            "mpi ZeRO-1",
            format!("sharded AdamW differs from unsharded by {d}"),
        ));
    }
    Ok(3)
}

/// Six data-parallel AdamW steps, the optimizer sharded over the ranks or not: the parameters.
fn train_adamw(comm: &Comm, sharded: bool) -> Result<Vec<Vec<f32>>> {
    let model = mlp(comm.device(), 7 + comm.rank() as u64)?;
    let options = DdpOptions {
        bucket_bytes: 512,
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &model, options)?;
    let make = |ps| Ok(AdamW::new(ps, 3e-3).weight_decay(0.1));
    let mut opt: Box<dyn Optimizer + '_> = match sharded {
        true => Box::new(ddp.shard_optimizer(make)?),
        false => Box::new(make(model.parameters())?),
    };
    for s in 0..6 {
        let (x, y) = batch(s, BATCH)?;
        ddp_step(&mut ddp, &model, (&x, &y), 1.0)?;
        opt.step()?;
        opt.zero_grad();
    }
    params(&model)
}
