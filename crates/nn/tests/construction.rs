//! Building models from given weights, layer options, forward contexts, Send + Sync modules, and npz / safetensors interchange on every device.
use netcl_autograd::{Tape, Var};
use netcl_core_devices::test_devices;
use netcl_nn::*;
use netcl_ops::testing::random_tensor;
use netcl_ops::{DType, Device, Generator, Tensor};
use serde_json::{json, Value};

fn rnd(dev: &Device, dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    random_tensor(dtype, shape, -1.0, 1.0, seed)
        .to_device(dev)
        .unwrap()
}

#[test]
fn layers_from_given_weights_compute_with_them() {
    for dev in test_devices().unwrap() {
        let w = rnd(&dev, DType::F32, &[3, 4], 1);
        let b = rnd(&dev, DType::F32, &[3], 2);
        let x = rnd(&dev, DType::F32, &[2, 4], 3);
        let tape = Tape::no_grad();
        let lin = Linear::from_weights(w.clone(), Some(b.clone())).unwrap();
        let y = lin
            .forward(&tape, &Var::from(&x))
            .unwrap()
            .value()
            .to_vec_f64()
            .unwrap();
        let (wv, bv, xv) = (
            w.to_vec_f64().unwrap(),
            b.to_vec_f64().unwrap(),
            x.to_vec_f64().unwrap(),
        );
        for r in 0..2 {
            for o in 0..3 {
                let want: f64 = (0..4).map(|i| xv[r * 4 + i] * wv[o * 4 + i]).sum::<f64>() + bv[o];
                assert!((y[r * 3 + o] - want).abs() < 1e-5, "{dev}");
            }
        }
        let no_bias = Linear::from_weights(w.clone(), None).unwrap();
        assert_eq!(no_bias.named_parameters().len(), 1);
        let err = Linear::from_weights(w.clone(), Some(rnd(&dev, DType::F32, &[4], 5)))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("[4]") && err.contains("[3]"), "{err}");
        let mut g = Generator::new(0);
        let lin = Linear::no_bias(4, 6, &dev, &mut g).unwrap();
        assert!(lin.bias.is_none() && lin.weight.shape() == [6, 4]);

        let table = rnd(&dev, DType::F32, &[5, 2], 6);
        let emb = Embedding::from_weights(table.clone()).unwrap();
        let ids = Tensor::from_vec(vec![4i32, 0], &[2], &dev).unwrap();
        let e = emb
            .forward(&tape, &Var::from(&ids))
            .unwrap()
            .value()
            .to_vec_f64()
            .unwrap();
        let tv = table.to_vec_f64().unwrap();
        assert_eq!(e, [tv[8], tv[9], tv[0], tv[1]], "{dev}");

        let norm = RmsNorm::new(&[4], &dev).unwrap().with_eps(1e-5).unwrap();
        assert_eq!(norm.eps, 1e-5);
        assert!(RmsNorm::new(&[4], &dev).unwrap().with_eps(-1.0).is_err());
        let nw = rnd(&dev, DType::F32, &[4], 7);
        let norm = RmsNorm::from_weight(nw.clone(), 1e-5).unwrap();
        let y = norm
            .forward(&tape, &Var::from(&x))
            .unwrap()
            .value()
            .to_vec_f64()
            .unwrap();
        let nwv = nw.to_vec_f64().unwrap();
        for r in 0..2 {
            let ms: f64 = (0..4).map(|i| xv[r * 4 + i].powi(2)).sum::<f64>() / 4.0;
            for i in 0..4 {
                let want = xv[r * 4 + i] / (ms + 1e-5).sqrt() * nwv[i];
                assert!((y[r * 4 + i] - want).abs() < 1e-5, "{dev}");
            }
        }
        // For products: as forward outside autocast, the compute dtype inside (the values a cast
        // gives), and an f64 norm stays f64 there (its products do not autocast either).
        let xin = Var::from(&x);
        let plain = norm.forward_for_products(&tape, &xin).unwrap();
        assert_eq!(plain.value().to_vec_f64().unwrap(), y, "{dev}");
        let low = netcl_autograd::autocast(DType::BF16, || norm.forward_for_products(&tape, &xin))
            .unwrap()
            .unwrap();
        assert_eq!(low.dtype(), DType::BF16, "{dev}");
        let cast = plain
            .value()
            .to_dtype(DType::BF16)
            .unwrap()
            .to_vec_f64()
            .unwrap();
        for (a, b) in low.value().to_vec_f64().unwrap().iter().zip(&cast) {
            assert!((a - b).abs() <= 1e-2 * b.abs(), "{a} {b} on {dev}");
        }
        let n64 = RmsNorm::from_weight(nw.to_dtype(DType::F64).unwrap(), 1e-5).unwrap();
        let x64 = Var::from(&x.to_dtype(DType::F64).unwrap());
        let y64 = netcl_autograd::autocast(DType::BF16, || n64.forward_for_products(&tape, &x64));
        if dev.is_host() || dev.info().fp64 {
            assert_eq!(y64.unwrap().unwrap().dtype(), DType::F64, "{dev}");
        }
        let ln = LayerNorm::from_weights(nw.clone(), rnd(&dev, DType::F32, &[4], 8), 1e-5).unwrap();
        assert_eq!(ln.eps, 1e-5);
        assert!(LayerNorm::from_weights(nw.clone(), rnd(&dev, DType::F32, &[3], 8), 1e-5).is_err());
    }
}

/// A layer that adds the context's bias (a Tensor) to its input, or fails without one.
struct AddFromContext;

struct Shift(Tensor);

impl Module for AddFromContext {
    fn forward(&self, tape: &Tape, x: &Var) -> netcl_ops::Result<Var> {
        self.forward_with(tape, x, &Context::new())
    }
    fn forward_with(&self, _tape: &Tape, x: &Var, ctx: &Context) -> netcl_ops::Result<Var> {
        let shift = ctx.require::<Shift>("AddFromContext")?;
        x.add(&Var::from(&shift.0))
    }
    fn named_parameters(&self) -> Vec<(String, netcl_autograd::Parameter)> {
        Vec::new()
    }
    fn describe(&self) -> Value {
        json!({"type": "AddFromContext"})
    }
}

#[test]
fn sequential_hands_the_context_to_every_layer() {
    for dev in test_devices().unwrap() {
        let model = Sequential::new().with(ReLU).with(AddFromContext);
        let x = Tensor::from_vec(vec![-1.0f32, 2.0], &[2], &dev).unwrap();
        let ctx = Context::new().with(Shift(
            Tensor::from_vec(vec![10.0f32, 20.0], &[2], &dev).unwrap(),
        ));
        let tape = Tape::no_grad();
        let y = model.forward_with(&tape, &Var::from(&x), &ctx).unwrap();
        assert_eq!(
            y.value().to_vec::<f32>().unwrap(),
            vec![10.0, 22.0],
            "{dev}"
        );
        let err = model
            .forward(&tape, &Var::from(&x))
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer 1") && err.contains("Shift"), "{err}");
    }
}

#[test]
fn models_move_to_and_run_on_other_threads() {
    fn send_sync<T: Send + Sync + ?Sized>() {}
    send_sync::<dyn Module>();
    send_sync::<Sequential>();
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(1);
        let model = Sequential::new()
            .with(Linear::new(4, 3, &dev, &mut g).unwrap())
            .with(ReLU);
        let x = rnd(&dev, DType::F32, &[2, 4], 9);
        let here = model
            .forward(&Tape::no_grad(), &Var::from(&x))
            .unwrap()
            .value()
            .to_vec_f64()
            .unwrap();
        let there = std::thread::spawn(move || {
            let tape = Tape::new();
            let y = model
                .forward(&tape, &Var::from(&x))
                .unwrap()
                .sum_all()
                .unwrap();
            tape.backward(&y).unwrap();
            let grads = model.parameters().iter().all(|p| p.grad().is_some());
            (
                model
                    .forward(&Tape::no_grad(), &Var::from(&x))
                    .unwrap()
                    .value()
                    .to_vec_f64()
                    .unwrap(),
                grads,
            )
        })
        .join()
        .unwrap();
        assert_eq!(here, there.0, "{dev}");
        assert!(
            there.1,
            "{dev}: backward on the worker thread reached every parameter"
        );
    }
}

#[test]
fn npz_and_safetensors_round_trip_every_dtype() {
    let dir = std::env::temp_dir().join(format!("netcl-tensor-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for dev in test_devices().unwrap() {
        let tensors: Vec<(String, Tensor)> = DType::ALL
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                (
                    format!("t{i}.{}", d.name()),
                    random_tensor(d, &[2, 3], -5.0, 5.0, i as u64)
                        .to_device(&dev)
                        .unwrap(),
                )
            })
            .collect();
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let st = dir.join("model.safetensors");
        save_safetensors(&st, &refs, None).unwrap();
        let back = load_safetensors(&st).unwrap();
        assert_eq!(back.len(), tensors.len());
        for ((n, t), (bn, bt)) in tensors.iter().zip(&back) {
            assert_eq!((n, t.dtype(), t.shape()), (bn, bt.dtype(), bt.shape()));
            assert_eq!(
                t.to_host_data().unwrap(),
                bt.to_host_data().unwrap(),
                "{dev} {n}"
            );
        }
        let f = SafetensorsFile::open(&st).unwrap();
        assert_eq!(f.info("t0.f32").unwrap(), (DType::F32, vec![2, 3]));
        assert_eq!(f.tensor("t1.f64", &dev).unwrap().device(), &dev);
        assert!(f
            .tensor("missing", &dev)
            .unwrap_err()
            .to_string()
            .contains("missing"));

        // npz: every dtype numpy has (bf16 has no numpy dtype).
        let npz = dir.join("arrays.npz");
        let no_bf16: Vec<(&str, &Tensor)> = refs
            .iter()
            .copied()
            .filter(|(_, t)| t.dtype() != DType::BF16)
            .collect();
        save_npz(&npz, &no_bf16).unwrap();
        let back = load_npz(&npz).unwrap();
        assert_eq!(back.len(), no_bf16.len());
        for (n, t) in &no_bf16 {
            let (_, bt) = back.iter().find(|(bn, _)| bn == n).unwrap();
            assert_eq!(
                t.to_host_data().unwrap(),
                bt.to_host_data().unwrap(),
                "{dev} {n}"
            );
        }
    }
    // Corrupt files are errors naming the file.
    let bad = dir.join("bad.safetensors");
    std::fs::write(&bad, b"\x10\0\0\0\0\0\0\0{not json}").unwrap();
    let err = load_safetensors(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.safetensors"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
