//! all_reduce bus bandwidth over every OpenCL device (nccl-tests' formula: 2(n-1)/n x bytes / time) for 1 KiB..1 GiB, against a device->host->device round trip of the same bytes on one device measured in the same run.
//!
//! `cargo bench -p netcl --bench all_reduce` (NETCL_BENCH_MAX_BYTES caps the largest size, default
//! 1 GiB, also capped by the devices' max allocation). Prints a markdown table.
use netcl::distributed::{Group, ReduceOp};
use netcl::prelude::*;
use std::time::Instant;

fn main() -> Result<()> {
    let devices = Device::opencl_devices();
    if devices.len() < 2 {
        println!(
            "all_reduce bench: needs two OpenCL devices, found {}",
            devices.len()
        );
        return Ok(());
    }
    let n = devices.len();
    let cap = std::env::var("NETCL_BENCH_MAX_BYTES")
        .ok()
        .and_then(|v| netcl::memory::parse_bytes(&v).ok())
        .unwrap_or(1 << 30)
        .min(
            devices
                .iter()
                .map(|d| d.info().max_alloc_bytes as usize)
                .min()
                .unwrap_or(0),
        );
    println!("all_reduce (sum, f32) over {n} devices: {}", devices[0]);
    println!("| bytes | time (ms) | bus bandwidth (GB/s) | round trip on one device (ms) | all_reduce / round trip |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    let group = Group::new(devices.clone())?;
    let mut bytes = 1usize << 10;
    while bytes <= cap {
        let elems = bytes / 4;
        // Repetitions: enough for ~0.2 s of small sizes, at least 3.
        let reps = ((256 << 20) / bytes).clamp(3, 200);
        let times = group.run(|comm| {
            let t = Tensor::full(&[elems], 1.0, DType::F32, comm.device())?;
            comm.all_reduce(&t, ReduceOp::Sum)?; // warm-up: staging buffers, first copies
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..reps {
                comm.all_reduce(&t, ReduceOp::Sum)?;
            }
            comm.device().synchronize()?;
            comm.barrier()?;
            Ok(start.elapsed().as_secs_f64() / reps as f64)
        })?;
        let secs = times.iter().cloned().fold(0.0, f64::max);
        let busbw = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64 / secs / 1e9;
        // The peer: the same bytes device -> host -> device on one device (what any host-relayed
        // collective must at least move per rank).
        let dev = &devices[0];
        let t = Tensor::full(&[elems], 1.0, DType::F32, dev)?;
        let start = Instant::now();
        for _ in 0..reps {
            let host = t.to_vec::<f32>()?;
            drop(Tensor::from_vec(host, &[elems], dev)?);
        }
        dev.synchronize()?;
        let round = start.elapsed().as_secs_f64() / reps as f64;
        println!(
            "| {bytes} | {:.3} | {busbw:.2} | {:.3} | {:.2} |",
            secs * 1e3,
            round * 1e3,
            secs / round
        );
        bytes *= 4;
    }
    Ok(())
}
