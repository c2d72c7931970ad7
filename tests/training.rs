//! End-to-end training: the MLP learns the shipped Fashion-MNIST subset on an OpenCL device (PoCL in CI), and a profiled training step gives a valid Chrome trace.
use netcl::data::{BatchBuilder, Batches, DeviceData, FashionMnist, ImageLayout};
use netcl::prelude::*;
use netcl::profiling::Profiler;
use netcl::train::{evaluate, Meter};
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

/// Held by every test here: the profiler records the whole process's launches, so the profiled
/// test would see the other tests' kernels (from their own queues, overlapping its own on the
/// device's one trace track) if they ran beside it.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
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
    let _alone = alone();
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
fn half_precision_parameters_train() {
    let _alone = alone();
    // f16 and bf16 storage (f32 arithmetic inside the kernels): parameters, activations,
    // gradients and Adam's state all in the half type, as a user who builds the model in it gets.
    // Half types are storage only (vload_half / bit ops): every device runs both.
    let data = FashionMnist::embedded_subset().unwrap();
    let builder = BatchBuilder::new(ImageLayout::Flat);
    let mut devices = vec![Device::host()];
    devices.extend(opencl_test_devices().unwrap().into_iter().take(1));
    for (dev, dtype) in devices
        .iter()
        .flat_map(|d| [(d.clone(), DType::F16), (d.clone(), DType::BF16)])
    {
        let upload = |images: &[u8], labels: &[u8]| {
            DeviceData::upload(&builder, images, labels, &dev).unwrap()
        };
        let train = upload(&data.train_images, &data.train_labels);
        let test = upload(&data.test_images, &data.test_labels);
        let mut g = Generator::new(5);
        let layer = |i, o, g: &mut Generator| {
            Linear::with_init(i, o, true, Init::KaimingUniform, dtype, &dev, g).unwrap()
        };
        let model = Sequential::new()
            .with(layer(784, 64, &mut g))
            .with(ReLU)
            .with(layer(64, 10, &mut g));
        let mut opt = Adam::new(model.parameters(), 2e-3).eps(1e-4);
        let mut epoch_losses = Vec::new();
        for epoch in 0..4 {
            let mut meter = Meter::new(&dev).unwrap();
            let order = Batches::new(train.len(), 64, Some(epoch)).unwrap();
            for batch in train.batches(&order).unwrap() {
                let (x, y) = batch.unwrap();
                let tape = Tape::new();
                let x = Var::from(x.to_dtype(dtype).unwrap());
                let logits = model.forward(&tape, &x).unwrap();
                assert_eq!(logits.dtype(), dtype);
                let loss = cross_entropy(&logits, &y).unwrap();
                tape.backward(&loss).unwrap();
                opt.step().unwrap();
                opt.zero_grad();
                meter.add(&loss, &logits, &y).unwrap();
            }
            epoch_losses.push(meter.read().unwrap().0);
        }
        let mut hits = 0.0;
        for batch in test
            .batches(&Batches::new(test.len(), 500, None).unwrap())
            .unwrap()
        {
            let (x, y) = batch.unwrap();
            let x = Var::from(x.to_dtype(dtype).unwrap());
            let logits = model.forward(&Tape::no_grad(), &x).unwrap();
            let pred = logits.value().argmax(&[1], false).unwrap();
            hits += pred
                .eq(&y)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_vec_f64()
                .unwrap()[0];
        }
        let acc = hits / test.len() as f64;
        println!("{dtype} on {dev}: epoch losses {epoch_losses:?}, test accuracy {acc}");
        assert!(
            epoch_losses.iter().all(|l| l.is_finite()),
            "{dtype}: {epoch_losses:?}"
        );
        assert!(
            epoch_losses[3] < 0.7 * epoch_losses[0],
            "{dtype}: {epoch_losses:?}"
        );
        assert!(acc > 0.7, "{dtype}: test accuracy {acc}");
    }
}

#[test]
fn a_profiled_training_step_is_a_valid_chrome_trace() {
    let _alone = alone();
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
