//! Training-step benches: one Adam step of the MLP 784-1024-1024-10 (batch 256) and of the small CNN (batch 128), the same workloads as `netcl-bench --suite train`.
//!
//! Device: `NETCL_DEVICE`, else the best one. Each sample runs a batch of steps and synchronises
//! once, so device time is included.
use criterion::{criterion_group, criterion_main, Criterion};
use netcl::prelude::*;
use netcl_bench::train::TrainStep;
use std::time::{Duration, Instant};

fn steps(c: &mut Criterion) {
    let dev = Device::best().expect("NETCL_DEVICE names a device");
    let mut group = c.benchmark_group(format!("train/{dev}"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    type Build = fn(&Device, &mut Generator) -> Result<TrainStep>;
    let models: [(&str, Build); 2] = [("mlp_step", TrainStep::mlp), ("cnn_step", TrainStep::cnn)];
    for (name, build) in models {
        let mut step = build(&dev, &mut Generator::new(7)).expect("model builds");
        step.step().expect("warm-up step");
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                dev.synchronize().expect("synchronize");
                let t = Instant::now();
                for _ in 0..iters {
                    step.step().expect("training step");
                }
                dev.synchronize().expect("synchronize");
                t.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);
