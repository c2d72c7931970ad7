//! Mixed precision on every device: autocast (bf16, f16) training of an MLP and a tiny Llama tracks f32, GradScaler skips an overflowing step without touching the parameters, and its state survives a checkpoint.
use netcl::autograd::autocast;
use netcl::optim::GradScaler;
use netcl::prelude::*;
use netcl_core_devices::test_devices;

fn mlp(dev: &Device) -> Sequential {
    let mut g = Generator::new(11);
    Sequential::new()
        .with(Linear::new(16, 32, dev, &mut g).unwrap())
        .with(ReLU)
        .with(Linear::new(32, 4, dev, &mut g).unwrap())
}

/// Losses of `steps` Adam steps on a fixed batch, with the forward inside autocast to `cast`
/// (None: plain f32) and, when `scaler` is given, through loss scaling.
fn mlp_losses(
    dev: &Device,
    cast: Option<DType>,
    mut scaler: Option<&mut GradScaler>,
    steps: usize,
) -> Vec<f64> {
    let mut g = Generator::new(5);
    let x = Tensor::randn(&[24, 16], DType::F32, dev, &mut g).unwrap();
    let y = Tensor::from_vec((0..24).map(|i| i % 4).collect(), &[24], dev).unwrap();
    let model = mlp(dev);
    let mut opt = Adam::new(model.parameters(), 1e-2);
    let mut losses = Vec::new();
    for _ in 0..steps {
        let tape = Tape::new();
        let forward = || cross_entropy(&model.forward(&tape, &Var::from(x.clone()))?, &y);
        let loss = match cast {
            Some(dt) => autocast(dt, forward).unwrap().unwrap(),
            None => forward().unwrap(),
        };
        losses.push(loss.value().to_vec_f64().unwrap()[0]);
        match scaler.as_deref_mut() {
            Some(s) => {
                tape.backward(&s.scale(&loss).unwrap()).unwrap();
                assert!(s.step(&mut opt).unwrap(), "step skipped on {dev}");
            }
            None => {
                tape.backward(&loss).unwrap();
                opt.step().unwrap();
            }
        }
        opt.zero_grad();
    }
    losses
}

fn assert_tracks(got: &[f64], want: &[f64], tol: f64, what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: step {i}: {g} vs f32 {w}\n{got:?}\n{want:?}"
        );
    }
    // And it learns: the last loss is well below the first.
    assert!(got[got.len() - 1] < 0.7 * got[0], "{what}: {got:?}");
}

#[test]
fn autocast_mlp_tracks_f32_and_f16_needs_no_skip_at_a_sane_scale() {
    for dev in test_devices().unwrap() {
        let f32_losses = mlp_losses(&dev, None, None, 20);
        // bf16 keeps 8 significant bits, f16 11: the loss trajectories stay within a few percent.
        let bf16 = mlp_losses(&dev, Some(DType::BF16), None, 20);
        assert_tracks(&bf16, &f32_losses, 0.05, &format!("bf16 on {dev}"));
        let mut scaler = GradScaler::new(1024.0).unwrap();
        let f16 = mlp_losses(&dev, Some(DType::F16), Some(&mut scaler), 20);
        assert_tracks(&f16, &f32_losses, 0.02, &format!("f16 on {dev}"));
        assert_eq!(scaler.skipped_steps(), 0);
        // Outside the region products are f32 again.
        assert_eq!(netcl::autograd::autocast_dtype(), None);
    }
}

#[test]
fn an_overflowing_f16_step_is_skipped_and_the_scale_backs_off() {
    for dev in test_devices().unwrap() {
        let model = mlp(&dev);
        let mut opt = Adam::new(model.parameters(), 1e-2);
        let before: Vec<Vec<f64>> = model
            .parameters()
            .iter()
            .map(|p| p.value().to_vec_f64().unwrap())
            .collect();
        let mut g = Generator::new(2);
        let x = Tensor::randn(&[8, 16], DType::F32, &dev, &mut g).unwrap();
        let y = Tensor::from_vec(vec![0i32, 1, 2, 3, 0, 1, 2, 3], &[8], &dev).unwrap();
        // 2^40 x the loss: the gradients reaching the f16 products overflow f16 (max 65504).
        let mut scaler = GradScaler::new(2f64.powi(40)).unwrap();
        let tape = Tape::new();
        let loss = autocast(DType::F16, || {
            cross_entropy(&model.forward(&tape, &Var::from(x.clone()))?, &y)
        })
        .unwrap()
        .unwrap();
        tape.backward(&scaler.scale(&loss).unwrap()).unwrap();
        assert!(
            !scaler.step(&mut opt).unwrap(),
            "overflow not seen on {dev}"
        );
        assert_eq!(scaler.scale_factor(), 2f64.powi(39));
        assert_eq!(scaler.skipped_steps(), 1);
        for (p, b) in model.parameters().iter().zip(&before) {
            assert_eq!(&p.value().to_vec_f64().unwrap(), b, "updated on {dev}");
            assert!(p.grad().is_none());
        }
        // The state goes through a checkpoint's `extra` and comes back equal.
        let dir = std::env::temp_dir().join(format!("netcl-scaler-{}", std::process::id()));
        let path = dir.join(format!("ckpt-{}", dev.ordinal()));
        std::fs::create_dir_all(&dir).unwrap();
        save_checkpoint(&path, &model, Some(&opt), 1, scaler.state()).unwrap();
        let ckpt = load_checkpoint(&path, &model, Some(&mut opt)).unwrap();
        let mut restored = GradScaler::default();
        restored.load_state(&ckpt.extra).unwrap();
        assert_eq!(restored, scaler);
        let bad = serde_json::json!({"scale": -1.0});
        assert!(restored.load_state(&bad).is_err());
        assert_eq!(restored, scaler);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn autocast_tiny_llama_tracks_f32() {
    for dev in test_devices().unwrap() {
        let run = |cast: Option<DType>| -> Vec<f64> {
            let mut g = Generator::new(7);
            let model = Llama::new(LlamaConfig::tiny(32), &dev, &mut g).unwrap();
            // 16 tokens: the fused attention (autocast runs it in bf16), not the composed one.
            let ids: Vec<i32> = (0..2 * 16).map(|i| i * 7 % 32).collect();
            let targets: Vec<i32> = (0..2 * 16).map(|i| (i * 7 + 7) % 32).collect();
            let ids = Tensor::from_vec(ids, &[2, 16], &dev).unwrap();
            let targets = Tensor::from_vec(targets, &[2, 16], &dev).unwrap();
            let mut opt = AdamW::new(model.parameters(), 1e-2);
            (0..10)
                .map(|_| {
                    let tape = Tape::new();
                    let f = || model.loss(&tape, &ids, &targets);
                    let loss = match cast {
                        Some(dt) => autocast(dt, f).unwrap().unwrap(),
                        None => f().unwrap(),
                    };
                    tape.backward(&loss).unwrap();
                    opt.step().unwrap();
                    opt.zero_grad();
                    loss.value().to_vec_f64().unwrap()[0]
                })
                .collect()
        };
        let want = run(None);
        assert_tracks(
            &run(Some(DType::BF16)),
            &want,
            0.05,
            &format!("llama bf16 on {dev}"),
        );
    }
}

/// `v` rounded to bf16 (round to nearest even), back in f64.
fn bf16_round(v: &[f64]) -> Vec<f64> {
    v.iter()
        .map(|&x| half::bf16::from_f64(x).to_f64())
        .collect()
}

fn assert_near(got: &[f64], want: &[f64], rel: f64, what: &str) {
    let scale = want.iter().fold(1e-3f64, |m, w| m.max(w.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * scale, "{what}[{i}]: {g} vs {w}");
    }
}

/// Under autocast a linear's output is bf16 (as PyTorch's autocast returns it), a binary op of
/// an f32 and a bf16 operand computes and returns f32, and every gradient comes back in its
/// input's dtype; values against f64 on the bf16-rounded operands.
#[test]
fn autocast_products_are_16_bit_and_gradients_keep_their_dtypes() {
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(3);
        let mut randn = |shape: &[usize]| Tensor::randn(shape, DType::F32, &dev, &mut g).unwrap();
        let (x, w, b, r) = (randn(&[5, 8]), randn(&[6, 8]), randn(&[6]), randn(&[5, 6]));
        let tape = Tape::new();
        let [xv, wv, bv, rv] = [&x, &w, &b, &r].map(|t| tape.leaf(t).unwrap());
        let (y, h) = autocast(DType::BF16, || -> netcl::Result<(Var, Var)> {
            let y = xv.linear(&wv, Some(&bv), Activation::None)?;
            Ok((y.clone(), rv.mul(&y)?))
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            (y.dtype(), h.dtype()),
            (DType::BF16, DType::F32),
            "on {dev}"
        );
        let grads = tape.backward(&h.sum_all().unwrap()).unwrap();
        let vals = |t: &Tensor| t.to_vec_f64().unwrap();
        let (xr, wr, br, rv64) = (
            bf16_round(&vals(&x)),
            bf16_round(&vals(&w)),
            bf16_round(&vals(&b)),
            vals(&r),
        );
        let yref: Vec<f64> = (0..30)
            .map(|e| {
                (0..8)
                    .map(|k| xr[e / 6 * 8 + k] * wr[e % 6 * 8 + k])
                    .sum::<f64>()
                    + br[e % 6]
            })
            .collect();
        let yv = vals(y.value());
        // One bf16 rounding of an f32 sum: within one unit of the last place.
        assert_near(&yv, &bf16_round(&yref), 1.0 / 128.0, &format!("y on {dev}"));
        // f32 times the widened bf16 output, exactly.
        let hv: Vec<f64> = rv64.iter().zip(&yv).map(|(a, b)| a * b).collect();
        assert_near(&vals(h.value()), &hv, 1e-6, &format!("h on {dev}"));
        let grad = |v: &Var| grads.get(v).unwrap().clone();
        for v in [&xv, &wv, &bv, &rv] {
            assert_eq!(grad(v).dtype(), DType::F32, "on {dev}");
        }
        // d h / d r = y; y's gradient is r rounded to bf16, which the products read.
        assert_near(&vals(&grad(&rv)), &yv, 1e-6, &format!("dr on {dev}"));
        let gy = bf16_round(&rv64);
        let dx: Vec<f64> = (0..40)
            .map(|e| (0..6).map(|o| gy[e / 8 * 6 + o] * wr[o * 8 + e % 8]).sum())
            .collect();
        let dw: Vec<f64> = (0..48)
            .map(|e| (0..5).map(|i| gy[i * 6 + e / 8] * xr[i * 8 + e % 8]).sum())
            .collect();
        let db: Vec<f64> = (0..6)
            .map(|o| (0..5).map(|i| gy[i * 6 + o]).sum())
            .collect();
        assert_near(&vals(&grad(&xv)), &dx, 1.0 / 128.0, &format!("dx on {dev}"));
        assert_near(&vals(&grad(&wv)), &dw, 1.0 / 128.0, &format!("dw on {dev}"));
        assert_near(&vals(&grad(&bv)), &db, 1.0 / 128.0, &format!("db on {dev}"));
    }
}

/// The composed attention (a mask, or a few queries) and decoding through the KV cache under
/// autocast: scores softmaxed in f32, the output in the queries' dtype, 16-bit keys written into
/// the f32 cache; against the same computation in f32.
#[test]
fn autocast_composed_attention_and_cached_decoding_track_f32() {
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(9);
        let shape = [1, 2, 5, 8];
        let [q, k, v] = [0; 3].map(|_| Tensor::randn(&shape, DType::F32, &dev, &mut g).unwrap());
        let attend = || -> netcl::Result<Var> {
            let [q, k, v] = [&q, &k, &v].map(|t| Var::from(t.clone()));
            Var::attention(&q, &k, &v, None, true, None)
        };
        let want = attend().unwrap().value().to_vec_f64().unwrap();
        let got = autocast(DType::BF16, attend).unwrap().unwrap();
        assert_eq!(got.dtype(), DType::F32, "on {dev}");
        assert_near(
            &got.value().to_vec_f64().unwrap(),
            &want,
            0.05,
            &format!("attention on {dev}"),
        );

        let model = Llama::new(LlamaConfig::tiny(32), &dev, &mut Generator::new(7)).unwrap();
        let ids = Tensor::from_vec(vec![3i32, 1, 4, 1, 5], &[1, 5], &dev).unwrap();
        let tape = Tape::no_grad();
        let full = model.logits(&tape, &ids, None, None, None).unwrap();
        let want = full.value().to_vec_f64().unwrap();
        let cache = KvCache::new(&model.config, 1, &dev).unwrap();
        let cached = autocast(DType::BF16, || {
            model.logits(&tape, &ids, None, Some(&cache), None)
        })
        .unwrap()
        .unwrap();
        assert_eq!(cached.dtype(), DType::BF16, "on {dev}");
        let got = cached.value().to_vec_f64().unwrap();
        assert_near(&got, &want, 0.05, &format!("cached logits on {dev}"));
    }
}
