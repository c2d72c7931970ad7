//! End-to-end training: the MLP learns the shipped Fashion-MNIST subset on an OpenCL device (PoCL in CI), and a profiled training step gives a valid Chrome trace.
use netcl::data::{BatchBuilder, Batches, DeviceData, FashionMnist, ImageLayout};
use netcl::prelude::*;
use netcl::profiling::Profiler;
use netcl_core_devices::opencl_test_devices;

#[path = "../crates/profiling/tests/common/trace_check.rs"]
mod trace_check;

/// The first OpenCL device (the host when none is present and none is required).
fn device() -> Device {
    opencl_test_devices()
        .unwrap()
        .into_iter()
        .next()
        .unwrap_or_else(Device::host)
}

fn mlp(dev: &Device) -> Sequential {
    let mut g = Generator::new(3);
    Sequential::new()
        .with(Linear::new(784, 128, dev, &mut g).unwrap())
        .with(ReLU)
        .with(Linear::new(128, 10, dev, &mut g).unwrap())
}

#[test]
fn mlp_learns_the_shipped_subset() {
    let dev = device();
    let data = FashionMnist::embedded_subset().unwrap();
    let builder = BatchBuilder::new(ImageLayout::Flat);
    let train = DeviceData::upload(&builder, &data.train_images, &data.train_labels, &dev).unwrap();
    let test = DeviceData::upload(&builder, &data.test_images, &data.test_labels, &dev).unwrap();
    let mut model = mlp(&dev);
    let mut opt = Adam::new(model.parameters(), 2e-3);
    let (_, chance_acc) = evaluate(&model, &test, 500).unwrap();
    let mut epoch_losses = Vec::new();
    for epoch in 0..6 {
        model.train();
        let mut meter = Meter::new(&dev).unwrap();
        for batch in train
            .batches(&Batches::new(train.len(), 64, Some(epoch)).unwrap())
            .unwrap()
        {
            let (x, y) = batch.unwrap();
            let tape = Tape::new();
            let logits = model.forward(&tape, &Var::from(x)).unwrap();
            let loss = cross_entropy(&logits, &y).unwrap();
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
            meter.add(&loss, &logits, &y).unwrap();
        }
        epoch_losses.push(meter.read().unwrap().0);
    }
    model.eval();
    let (test_loss, acc) = evaluate(&model, &test, 500).unwrap();
    println!("{dev}: epoch losses {epoch_losses:?}, test loss {test_loss}, accuracy {acc} (untrained {chance_acc})");
    assert!(
        epoch_losses[5] < 0.6 * epoch_losses[0],
        "loss falls: {epoch_losses:?}"
    );
    assert!(
        acc > 0.75,
        "test accuracy {acc} is not well above chance (0.1)"
    );
}

#[test]
fn a_profiled_training_step_is_a_valid_chrome_trace() {
    let dev = device();
    let model = mlp(&dev);
    let mut opt = Adam::new(model.parameters(), 1e-3);
    let mut g = Generator::new(1);
    let x = Tensor::randn(&[32, 784], DType::F32, &dev, &mut g).unwrap();
    let y = Tensor::from_vec((0..32).map(|i| i % 10).collect::<Vec<i32>>(), &[32], &dev).unwrap();
    let profiler = Profiler::start();
    let tape = Tape::new();
    let loss = cross_entropy(&model.forward(&tape, &Var::from(&x)).unwrap(), &y).unwrap();
    tape.backward(&loss).unwrap();
    opt.step().unwrap();
    dev.synchronize().unwrap();
    let profile = profiler.stop();
    let xs = trace_check::check_trace(&profile.chrome_trace_json());
    let spans = xs
        .iter()
        .filter(|e| e["pid"] == netcl::profiling::HOST_PID)
        .count();
    let kernels = xs.iter().filter(|e| e["cat"] == "kernel").count();
    assert!(spans > 0, "host spans recorded");
    if dev.is_opencl() {
        // forward (2 GEMMs + cross-entropy), backward, 4 Adam updates at least.
        assert!(kernels >= 10, "{kernels} kernels in the trace");
        assert_eq!(kernels, profile.kernels.len());
    }
    println!("{}", profile.summary_table());
}
