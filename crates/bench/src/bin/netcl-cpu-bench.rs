//! netcl-cpu-bench: the CPU workloads (SGEMM 256..2048, MLP training step) on the host backend and on every CPU OpenCL device (PoCL), as JSON for benches/reference/numpy_cpu_bench.py, which runs the same with numpy/OpenBLAS.
use netcl_bench::train::TrainStep;
use netcl_bench::{check_flags, flag_value, time_per_call};
use netcl_core_devices::{DType, Device, DeviceKind, Result};
use netcl_ops::{Generator, Tensor};
use serde::Serialize;

const USAGE: &str = "netcl-cpu-bench [--out FILE] [--sizes 256,512,1024,2048]
  Times SGEMM at each size and one MLP 784-1024-1024-10 Adam step (batch 256) on the host and on
  each CPU OpenCL device. Threads: RAYON_NUM_THREADS and MATMUL_NUM_THREADS (host), the driver's
  own (PoCL: POCL_MAX_PTHREAD_COUNT).";

/// One measured workload on one device.
#[derive(Serialize)]
struct Record {
    device: String,
    name: String,
    ms: f64,
    gflops: f64,
}

/// Multiply-adds of one MLP step: forward 2·B·Σ(in·out), backward twice that.
fn mlp_flops(batch: usize) -> f64 {
    let macs: usize = [(784, 1024), (1024, 1024), (1024, 10)]
        .iter()
        .map(|(i, o)| i * o)
        .sum();
    6.0 * (batch * macs) as f64
}

fn main() -> Result<()> {
    // The program name first, as check_flags expects.
    let mut args = vec!["netcl-cpu-bench".to_string()];
    args.extend(netcl_core_devices::utf8_args("netcl-cpu-bench")?);
    if !check_flags(&args, "netcl-cpu-bench", &["--out", "--sizes"], USAGE)? {
        return Ok(());
    }
    let sizes: Vec<usize> = flag_value(&args, "--sizes")
        .unwrap_or("256,512,1024,2048")
        .split(',')
        .map(|s| {
            s.parse().map_err(|_| {
                netcl_core_devices::Error::invalid("netcl-cpu-bench", format!("bad size {s:?}"))
            })
        })
        .collect::<Result<_>>()?;
    let devices: Vec<Device> = Device::all()
        .into_iter()
        .filter(|d| d.is_host() || d.info().kind == DeviceKind::Cpu)
        .collect();
    let mut records = Vec::new();
    for dev in &devices {
        let name = format!("{dev} ({})", dev.info().name);
        println!("{name}");
        let mut gen = Generator::new(1);
        let mut record = |what: String, secs: f64, flops: f64| {
            println!(
                "  {what:<12} {:>10.3} ms {:>8.1} GFLOP/s",
                secs * 1e3,
                flops / secs / 1e9
            );
            records.push(Record {
                device: name.clone(),
                name: what,
                ms: secs * 1e3,
                gflops: flops / secs / 1e9,
            });
        };
        for &n in &sizes {
            let a = Tensor::randn(&[n, n], DType::F32, dev, &mut gen)?;
            let b = Tensor::randn(&[n, n], DType::F32, dev, &mut gen)?;
            let iters = (2e9 / (2.0 * (n as f64).powi(3))).clamp(1.0, 20.0) as usize;
            let secs = time_per_call(dev, 1, iters, 5, || a.matmul(&b).map(|_| ()))?;
            record(format!("sgemm_{n}"), secs, 2.0 * (n as f64).powi(3));
        }
        let mut step = TrainStep::mlp(dev, &mut gen)?;
        let secs = time_per_call(dev, 2, 3, 5, || step.step())?;
        record("mlp_step".into(), secs, mlp_flops(step.x.shape()[0]));
    }
    let json = serde_json::to_string_pretty(&records)
        .map_err(|e| netcl_core_devices::Error::invalid("netcl-cpu-bench", e.to_string()))?;
    match flag_value(&args, "--out") {
        Some(path) => std::fs::write(path, json)
            .map_err(|e| netcl_core_devices::Error::invalid("netcl-cpu-bench", e.to_string()))?,
        None => println!("{json}"),
    }
    Ok(())
}
