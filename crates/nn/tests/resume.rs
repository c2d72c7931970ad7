//! Training resumed from a checkpoint follows the uninterrupted run's loss trajectory bit for bit; a checkpoint of another model is refused.
use netcl_autograd::{Tape, Var};
use netcl_core_devices::test_devices;
use netcl_nn::*;
use netcl_ops::{DType, Device, Generator, Tensor};
use netcl_optim::{Adam, Optimizer};
use serde_json::json;

fn model(dev: &Device, seed: u64) -> Sequential {
    let mut g = Generator::new(seed);
    Sequential::new()
        .with(Linear::new(6, 8, dev, &mut g).unwrap())
        .with(ReLU)
        .with(BatchNorm2d::new(8, dev).unwrap())
        .with(Linear::new(8, 3, dev, &mut g).unwrap())
}

/// Batch `i` of a fixed synthetic task.
fn batch(dev: &Device, i: u64) -> (Tensor, Tensor) {
    let mut g = Generator::new(100 + i);
    let x = Tensor::randn(&[5, 6], DType::F32, dev, &mut g).unwrap();
    let y: Vec<i32> = (0..5).map(|k| (i as i32 + k) % 3).collect();
    (x, Tensor::from_vec(y, &[5], dev).unwrap())
}

fn train(m: &Sequential, opt: &mut Adam, dev: &Device, steps: std::ops::Range<u64>) -> Vec<f32> {
    steps
        .map(|i| {
            let (x, y) = batch(dev, i);
            let tape = Tape::new();
            let loss = cross_entropy(&m.forward(&tape, &Var::from(x)).unwrap(), &y).unwrap();
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
            loss.value().to_vec::<f32>().unwrap()[0]
        })
        .collect()
}

#[test]
fn resume_reproduces_the_loss_trajectory() {
    let dir = std::env::temp_dir().join(format!("netcl-resume-{}", std::process::id()));
    for dev in test_devices().unwrap() {
        let m = model(&dev, 1);
        let mut opt = Adam::new(m.parameters(), 0.01);
        let straight = train(&m, &mut opt, &dev, 0..6);

        let m1 = model(&dev, 1);
        let mut opt1 = Adam::new(m1.parameters(), 0.01);
        let mut resumed = train(&m1, &mut opt1, &dev, 0..3);
        let path = dir.join(format!("ckpt-{}", dev.ordinal()));
        save_checkpoint(&path, &m1, Some(&opt1), 3, json!({"epoch": 0})).unwrap();

        let m2 = model(&dev, 999); // different initial weights, overwritten by the load
        let mut opt2 = Adam::new(m2.parameters(), 0.5);
        let meta = load_checkpoint(&path, &m2, Some(&mut opt2)).unwrap();
        assert_eq!((meta.step, meta.extra["epoch"].as_i64()), (3, Some(0)));
        resumed.extend(train(&m2, &mut opt2, &dev, 3..6));
        assert_eq!(straight, resumed, "on {dev}");
        assert!(straight[5] < straight[0], "loss falls: {straight:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_of_another_model_is_refused_untouched() {
    let dir = std::env::temp_dir().join(format!("netcl-other-{}", std::process::id()));
    let dev = Device::host();
    let m = model(&dev, 1);
    let path = dir.join("ckpt");
    save_checkpoint(&path, &m, None, 0, json!(null)).unwrap();
    let mut g = Generator::new(2);
    let other = Sequential::new()
        .with(Linear::new(6, 4, &dev, &mut g).unwrap())
        .with(Linear::new(4, 3, &dev, &mut g).unwrap());
    let before = other.parameters()[0].value().to_vec_f64().unwrap();
    let err = load_checkpoint(&path, &other, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.0.weight") && err.contains("[8, 6]") && err.contains("[4, 6]"),
        "{err}"
    );
    assert!(
        err.contains("model.2.running_mean"),
        "unexpected names listed: {err}"
    );
    assert_eq!(
        before,
        other.parameters()[0].value().to_vec_f64().unwrap(),
        "nothing changed"
    );
    let mut opt = Adam::new(m.parameters(), 0.1);
    let err = load_checkpoint(&path, &m, Some(&mut opt))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no optimizer state"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
