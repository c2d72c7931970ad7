//! A backward pass that fails part-way (out of memory) leaves every parameter's gradient as it was.
//! One test in its own binary: it caps the memory of every device for a moment.
use netcl_autograd::{Parameter, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_core_memory::{host_memory, set_host_limit, Pool};
use netcl_ops::{DType, Device, Generator, Tensor};

/// Caps `dev`'s memory at what is live now plus 1 MiB (None: lifts the cap).
fn cap(dev: &Device, on: bool) {
    if dev.is_host() {
        set_host_limit(on.then(|| host_memory().0 + (1 << 20)));
    } else {
        let pool = Pool::of(dev).unwrap();
        pool.set_limit(on.then(|| pool.stats().in_use + (1 << 20)));
    }
}

#[test]
fn an_error_in_backward_leaves_gradients_unchanged() {
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(3);
        // loss = sum(a * (b @ c)): a's gradient arrives before matmul's backward, which needs a
        // 1024 x 1024 gradient for c (4 MiB): over the cap.
        let (k, m) = (1024, 1024);
        let a = Parameter::new(Tensor::randn(&[1, m], DType::F32, &dev, &mut g).unwrap()).unwrap();
        let b = Parameter::new(Tensor::randn(&[1, k], DType::F32, &dev, &mut g).unwrap()).unwrap();
        let c = Parameter::new(Tensor::randn(&[k, m], DType::F32, &dev, &mut g).unwrap()).unwrap();
        let step = |fail: bool| {
            let tape = Tape::new();
            let h = tape.param(&b).matmul(&tape.param(&c)).unwrap();
            let loss = tape.param(&a).mul(&h).unwrap().sum_all().unwrap();
            cap(&dev, fail);
            let r = tape.backward(&loss);
            cap(&dev, false);
            r.map(|_| ())
        };
        step(false).unwrap();
        let before: Vec<Vec<f64>> = [&a, &b, &c]
            .iter()
            .map(|p| p.grad().unwrap().to_vec_f64().unwrap())
            .collect();
        let err = step(true).unwrap_err();
        assert!(err.is_out_of_memory(), "{dev}: {err}");
        for (p, want) in [&a, &b, &c].iter().zip(&before) {
            assert_eq!(&p.grad().unwrap().to_vec_f64().unwrap(), want, "{dev}");
        }
        // The next successful step adds exactly one more gradient.
        step(false).unwrap();
        for (p, once) in [&a, &b, &c].iter().zip(&before) {
            let twice: Vec<f64> = once.iter().map(|x| (*x as f32 * 2.0) as f64).collect();
            assert_eq!(p.grad().unwrap().to_vec_f64().unwrap(), twice, "{dev}");
        }
        let _ = Var::from(&Tensor::zeros(&[1], DType::F32, &dev).unwrap());
    }
}
