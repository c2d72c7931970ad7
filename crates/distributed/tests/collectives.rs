//! Every collective against a host computation (sizes 0, 1, odd, not divisible by the rank count, several chunks) on groups of every OpenCL device, and of the host plus them.
use netcl_core_devices::opencl_test_devices;
use netcl_core_devices::{Device, Result};
use netcl_distributed::{split_range, Group, ReduceOp, CHUNK_ELEMS};
use netcl_ops::Tensor;

mod support;
use support::reference::{bits, data, reference, tensor};

/// The groups to test: the OpenCL devices (when two or more), and the host with them.
fn groups() -> Vec<Group> {
    let cl = opencl_test_devices().unwrap();
    let mut out = Vec::new();
    if cl.len() >= 2 {
        out.push(Group::new(cl.clone()).unwrap());
    }
    let mut mixed = vec![Device::host()];
    mixed.extend(cl);
    out.push(Group::new(mixed).unwrap());
    out
}

const SIZES: [usize; 5] = [0, 1, 7, 10, 2 * CHUNK_ELEMS + 5];

#[test]
fn all_reduce_matches_the_host_bit_for_bit() -> Result<()> {
    for group in groups() {
        let size = group.size();
        let weights: Vec<f32> = (0..size).map(|r| (r + 1) as f32 / 7.0).collect();
        for op in ReduceOp::ALL {
            for n in SIZES {
                let want = bits(&reference(op, size, n, &weights));
                let got = group.run(|comm| {
                    let t = tensor(comm, n)?;
                    comm.all_reduce_scaled(&t, op, weights[comm.rank()])?;
                    let first = t.to_vec::<f32>()?;
                    // Again from the same inputs: the same bits whatever the timing.
                    let t2 = tensor(comm, n)?;
                    comm.all_reduce_scaled(&t2, op, weights[comm.rank()])?;
                    assert_eq!(bits(&first), bits(&t2.to_vec::<f32>()?), "rerun differs");
                    Ok(first)
                })?;
                for (r, v) in got.iter().enumerate() {
                    assert!(
                        bits(v) == want,
                        "{op:?} n {n} rank {r} of {:?}",
                        group.devices()
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn host_all_reduce_of_slices() -> Result<()> {
    for group in groups() {
        let size = group.size();
        let got = group.run(|comm| {
            let mut v = data(comm.rank(), 9);
            comm.all_reduce_host(&mut v, ReduceOp::Sum, 1.0)?;
            Ok(v)
        })?;
        for v in got {
            assert_eq!(bits(&v), bits(&reference(ReduceOp::Sum, size, 9, &[])));
        }
    }
    Ok(())
}

#[test]
fn broadcast_reduce_and_barrier() -> Result<()> {
    for group in groups() {
        let size = group.size();
        for n in [0, 1, 7, 10] {
            let root = size - 1;
            let got = group.run(|comm| {
                let b = tensor(comm, n)?;
                comm.broadcast(&b, root)?;
                comm.barrier()?;
                let r = tensor(comm, n)?;
                comm.reduce(&r, 0, ReduceOp::Sum)?;
                Ok((b.to_vec::<f32>()?, r.to_vec::<f32>()?))
            })?;
            for (rank, (b, r)) in got.iter().enumerate() {
                assert_eq!(bits(b), bits(&data(root, n)), "broadcast n {n} rank {rank}");
                let want = if rank == 0 {
                    reference(ReduceOp::Sum, size, n, &[])
                } else {
                    data(rank, n)
                };
                assert_eq!(bits(r), bits(&want), "reduce n {n} rank {rank}");
            }
        }
    }
    Ok(())
}

#[test]
fn scatter_gather_all_gather_reduce_scatter() -> Result<()> {
    for group in groups() {
        let size = group.size();
        for rows in [0, 1, 7, 10] {
            let cols = 3;
            let got = group.run(|comm| {
                // Rank r holds r + 1 rows in the gathers (ranks of different sizes).
                let mine = Tensor::from_vec(
                    data(comm.rank(), (comm.rank() + 1) * cols),
                    &[comm.rank() + 1, cols],
                    comm.device(),
                )?;
                let all = comm.all_gather(&mine)?;
                let at_root = comm.gather(&mine, 0)?;
                let src = Tensor::from_vec(data(0, rows * cols), &[rows, cols], comm.device())?;
                let part = comm.scatter((comm.rank() == 0).then_some(&src), 0)?;
                let whole =
                    Tensor::from_vec(data(comm.rank(), rows * cols), &[rows, cols], comm.device())?;
                let reduced = comm.reduce_scatter(&whole, ReduceOp::Max)?;
                Ok((
                    (all.shape().to_vec(), all.to_vec::<f32>()?),
                    at_root.map(|t| t.to_vec::<f32>()).transpose()?,
                    (part.shape().to_vec(), part.to_vec::<f32>()?),
                    (reduced.shape().to_vec(), reduced.to_vec::<f32>()?),
                ))
            })?;
            let gathered: Vec<f32> = (0..size).flat_map(|r| data(r, (r + 1) * cols)).collect();
            let max = reference(ReduceOp::Max, size, rows * cols, &[]);
            for (rank, (all, root, part, red)) in got.into_iter().enumerate() {
                assert_eq!(all.0, vec![size * (size + 1) / 2, cols]);
                assert_eq!(bits(&all.1), bits(&gathered), "all_gather rank {rank}");
                assert_eq!(root.is_some(), rank == 0);
                if let Some(v) = root {
                    assert_eq!(bits(&v), bits(&gathered));
                }
                let range = split_range(rows, size, rank);
                assert_eq!(
                    part.0,
                    vec![range.len(), cols],
                    "scatter rows {rows} rank {rank}"
                );
                assert_eq!(
                    bits(&part.1),
                    bits(&data(0, rows * cols)[range.start * cols..range.end * cols])
                );
                assert_eq!(red.0, vec![range.len(), cols]);
                assert_eq!(
                    bits(&red.1),
                    bits(&max[range.start * cols..range.end * cols]),
                    "reduce_scatter rank {rank}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn all_gather_runs_gives_every_rank_every_run() -> Result<()> {
    for group in groups() {
        let size = group.size();
        // Runs with gaps between them, an empty one, and runs across chunk boundaries.
        for n in SIZES {
            let runs: Vec<std::ops::Range<usize>> = (0..size)
                .map(|r| {
                    let (a, b) = (n * r / size, n * (r + 1) / size);
                    match r {
                        1 => a..a,
                        _ => (a + usize::from(b > a + 2))..b,
                    }
                })
                .collect();
            let got = group.run(|comm| {
                let t = tensor(comm, n)?;
                comm.all_gather_runs(&t, &runs)?;
                t.to_vec::<f32>()
            })?;
            for (rank, v) in got.iter().enumerate() {
                for (owner, run) in runs.iter().enumerate() {
                    assert_eq!(
                        bits(&v[run.clone()]),
                        bits(&data(owner, n)[run.clone()]),
                        "n {n} rank {rank}: run {run:?} of rank {owner} on {:?}",
                        group.devices()
                    );
                }
            }
        }
        // Runs that overlap or leave the tensor are an error on every rank.
        let bad = group.run(|comm| {
            let t = tensor(comm, 10)?;
            let runs: Vec<_> = (0..comm.size()).map(|r| r * 4..r * 4 + 5).collect();
            Ok(comm.all_gather_runs(&t, &runs).is_err())
        })?;
        assert!(bad.iter().all(|&e| e), "{bad:?}");
    }
    Ok(())
}

#[test]
fn mismatched_shapes_are_an_error_on_every_rank() -> Result<()> {
    for group in groups() {
        let outcomes = std::sync::Mutex::new(Vec::new());
        let res = group.run(|comm| {
            let t = Tensor::zeros(
                &[3 + comm.rank()],
                netcl_core_devices::DType::F32,
                comm.device(),
            )?;
            let r = comm.all_reduce(&t, ReduceOp::Sum);
            outcomes
                .lock()
                .unwrap()
                .push(r.as_ref().map_err(|e| e.to_string()).err());
            r
        });
        let msg = res.unwrap_err().to_string();
        assert!(msg.contains("all_reduce") && msg.contains("shape"), "{msg}");
        let outcomes = outcomes.into_inner().unwrap();
        assert_eq!(outcomes.len(), group.size());
        assert!(outcomes.iter().all(|o| o.is_some()), "{outcomes:?}");
    }
    // Bad arguments name the op and the values.
    let g = Group::new(vec![Device::host()])?;
    let e = g
        .run(|comm| {
            comm.broadcast(
                &Tensor::zeros(&[2], netcl_core_devices::DType::F32, comm.device())?,
                3,
            )
        })
        .unwrap_err();
    assert!(e.to_string().contains("root 3"), "{e}");
    assert!(Group::new(vec![Device::host(), Device::host()]).is_err());
    Ok(())
}

/// A rank whose closure returns while the others go on to a collective fails them at once (a
/// barrier, and an all_reduce that also waits for it), not after the group's timeout.
#[test]
fn a_rank_that_returns_early_fails_the_others_at_once() -> Result<()> {
    for group in groups() {
        let group = group.with_timeout(std::time::Duration::from_secs(120));
        for reduce in [false, true] {
            let started = std::time::Instant::now();
            let e = group
                .run(|comm| {
                    if comm.rank() == 1 {
                        return Ok(());
                    }
                    let t = Tensor::zeros(&[5], netcl_core_devices::DType::F32, comm.device())?;
                    match reduce {
                        true => comm.all_reduce(&t, ReduceOp::Sum),
                        false => comm.barrier(),
                    }
                })
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("rank 1, whose closure has already returned"),
                "{e}"
            );
            let took = started.elapsed();
            assert!(took < std::time::Duration::from_secs(20), "{took:?}: {e}");
        }
    }
    Ok(())
}
