//! The equivalence test over MPI: `mpirun -np 2 mpi_equivalence`. Each process trains the MLP for 20 steps as one rank (even split, then 3:1), each on its own device, and checks that its parameters equal single-device training at the whole batch (within the same tolerance as the in-process test) and are bit-identical on every rank; collectives are checked against a host computation. Exits non-zero on any failure.
#[path = "../tests/support/mod.rs"]
mod support;
use netcl_core_devices::{Error, Result};
use netcl_distributed::{MpiWorld, ReduceOp};
use netcl_ops::Tensor;
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
    let size = comm.size();
    // Collectives against the host: sizes 0, 1, odd, and not divisible by the rank count.
    for n in [0usize, 1, 7, 10] {
        let data = |r: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.37 - 2.9)
                .collect()
        };
        let t = Tensor::from_vec(data(comm.rank()), &[n], &device)?;
        comm.all_reduce(&t, ReduceOp::Sum)?;
        let want: Vec<f32> = (0..n)
            .map(|i| (1..size).fold(data(0)[i], |a, r| a + data(r)[i]))
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
    }
    let single = train_single(&device)?;
    for (name, weights) in [("even", None), ("3:1", Some(vec![3.0, 1.0]))] {
        let weights = weights.filter(|w: &Vec<f64>| w.len() == size);
        let mine = train_rank(&comm, weights, false)?;
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
            "rank {} {name}: max |parallel - single| = {d:e}",
            comm.rank()
        );
        if d > TOL {
            return Err(Error::invalid(
                "mpi equivalence",
                format!("{name}: max difference {d} > {TOL}"),
            ));
        }
    }
    Ok(2)
}
