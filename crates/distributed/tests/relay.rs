//! The device relay (every rank an OpenCL device) with 4 KiB chunks: tensors of many chunks wrap around the pinned slots, sessions follow each other, views at an offset reduce only their elements; every rank gets the host reduction's bits.
use netcl_core_devices::{opencl_test_devices, DType, Result};
use netcl_distributed::{Group, ReduceOp};
use netcl_ops::Tensor;

mod support;
use support::reference::{bits, data, reference, tensor};

/// Chunks of 1024 f32: the relay reads `Config::relay_chunk` once per process, and every test of
/// this binary sets the same value before its first collective.
fn small_chunks() {
    netcl_core_devices::Config::update(|c| c.relay_chunk = 4096.into());
}

fn opencl_group() -> Option<Group> {
    let cl = opencl_test_devices().unwrap();
    (cl.len() >= 2).then(|| Group::new(cl).unwrap())
}

#[test]
fn many_chunks_and_sessions_match_the_host_bit_for_bit() -> Result<()> {
    small_chunks();
    let Some(group) = opencl_group() else {
        return Ok(());
    };
    let size = group.size();
    let weights: Vec<f32> = (0..size).map(|r| (r + 2) as f32 / 5.0).collect();
    // One after another in one run: each all_reduce is a session on the same counters.
    let sizes = [1, 3, 1023, 1024, 1025, 10 * 1024 + 7, 2];
    let ops = ReduceOp::ALL;
    let got = group.run(|comm| {
        let mut out = Vec::new();
        for op in ops {
            for n in sizes {
                let t = tensor(comm, n)?;
                comm.all_reduce_scaled(&t, op, weights[comm.rank()])?;
                out.push(t.to_vec::<f32>()?);
            }
        }
        Ok(out)
    })?;
    for (r, results) in got.iter().enumerate() {
        let mut i = 0;
        for op in ops {
            for n in sizes {
                assert!(
                    bits(&results[i]) == bits(&reference(op, size, n, &weights)),
                    "{op:?} n {n} rank {r} of {size}"
                );
                i += 1;
            }
        }
    }
    Ok(())
}

#[test]
fn a_view_at_an_offset_reduces_only_its_elements() -> Result<()> {
    small_chunks();
    let Some(group) = opencl_group() else {
        return Ok(());
    };
    let (n, at, len) = (5000, 1234, 3001);
    let got = group.run(|comm| {
        let whole = tensor(comm, n)?;
        comm.all_reduce(&whole.narrow(0, at, len)?, ReduceOp::Sum)?;
        whole.to_vec::<f32>()
    })?;
    let sum = reference(ReduceOp::Sum, group.size(), n, &[]);
    for (r, v) in got.iter().enumerate() {
        assert_eq!(
            bits(&v[..at]),
            bits(&data(r, n)[..at]),
            "rank {r}: before the view"
        );
        assert_eq!(
            bits(&v[at..at + len]),
            bits(&sum[at..at + len]),
            "rank {r}: the view"
        );
        assert_eq!(
            bits(&v[at + len..]),
            bits(&data(r, n)[at + len..]),
            "rank {r}: after"
        );
    }
    Ok(())
}

#[test]
fn a_rank_that_leaves_fails_the_others_instead_of_hanging() -> Result<()> {
    small_chunks();
    let Some(group) = opencl_group() else {
        return Ok(());
    };
    let group = group.with_timeout(std::time::Duration::from_secs(20));
    let start = std::time::Instant::now();
    let out = group.run(|comm| {
        let t = Tensor::ones(&[4096], DType::F32, comm.device())?;
        comm.all_reduce(&t, ReduceOp::Sum)?;
        if comm.rank() == 1 {
            return Err(netcl_core_devices::Error::invalid("test", "rank 1 leaves"));
        }
        comm.all_reduce(&t, ReduceOp::Sum)?;
        Ok(())
    });
    let e = out.expect_err("the group must fail");
    assert!(e.to_string().contains("rank 1 leaves"), "{e}");
    assert!(start.elapsed().as_secs() < 15, "took {:?}", start.elapsed());
    Ok(())
}
