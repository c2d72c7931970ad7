//! LoRA on a Llama, on every device: a new adapter changes nothing, only adapters train (frozen weights keep their bits and get no gradient), merging keeps the outputs, adapters save and load on their own.
use netcl_autograd::Tape;
use netcl_core_devices::test_devices;
use netcl_models::{Llama, LlamaConfig};
use netcl_nn::{LoraConfig, Module};
use netcl_ops::{Device, Generator, Tensor};
use netcl_optim::{AdamW, Optimizer};

fn ids(v: Vec<i32>, dev: &Device) -> Tensor {
    let t = v.len() / 2;
    Tensor::from_vec(v, &[2, t], dev).unwrap()
}

fn logits(m: &Llama, x: &Tensor) -> Vec<f64> {
    m.logits(&Tape::no_grad(), x, None, None, None)
        .unwrap()
        .value()
        .to_vec_f64()
        .unwrap()
}

#[test]
fn lora_trains_only_adapters_and_merges_into_the_weights() {
    let cfg = LlamaConfig::tiny(24);
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: ["q", "k", "v", "o", "gate", "up", "down"]
            .map(String::from)
            .to_vec(),
    };
    let dir = std::env::temp_dir().join(format!("netcl-lora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for dev in test_devices().unwrap() {
        let x = ids((0..16i32).map(|i| i * 5 % 24).collect(), &dev);
        let y = ids((0..16i32).map(|i| (i * 5 + 3) % 24).collect(), &dev);
        let mut model = Llama::new(cfg.clone(), &dev, &mut Generator::new(1)).unwrap();
        let base = logits(&model, &x);
        let frozen: Vec<(String, Vec<f64>)> = model
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.value().to_vec_f64().unwrap()))
            .collect();
        model.add_lora(&lora, &mut Generator::new(2)).unwrap();
        assert_eq!(logits(&model, &x), base, "{dev}: B = 0 changes nothing");
        let trainable = model.trainable_parameters();
        assert_eq!(trainable.len(), cfg.n_layers * 7 * 2, "{dev}");
        assert_eq!(model.lora_parameters().len(), trainable.len());
        let mut opt = AdamW::new(trainable, 1e-2).weight_decay(0.0);
        let mut losses = Vec::new();
        for _ in 0..8 {
            let tape = Tape::new();
            let loss = model.loss(&tape, &x, &y).unwrap();
            losses.push(loss.item().unwrap());
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        }
        assert!(losses[7] < losses[0] - 0.05, "{dev}: {losses:?}");
        for (n, p) in model.named_parameters() {
            if let Some((_, before)) = frozen.iter().find(|(f, _)| *f == n) {
                assert_eq!(
                    &p.value().to_vec_f64().unwrap(),
                    before,
                    "{dev}: {n} is frozen"
                );
                assert!(p.grad().is_none(), "{dev}: {n} has no gradient");
            }
        }
        let tuned = logits(&model, &x);
        assert_ne!(tuned, base);
        // Adapters alone: into a fresh copy of the base.
        model.save_lora(dir.join("adapters.safetensors")).unwrap();
        let mut other = Llama::new(cfg.clone(), &dev, &mut Generator::new(1)).unwrap();
        other.add_lora(&lora, &mut Generator::new(99)).unwrap();
        other.load_lora(dir.join("adapters.safetensors")).unwrap();
        assert_eq!(logits(&other, &x), tuned, "{dev}: loaded adapters");
        // Merged: the same outputs from plain weights.
        model.merge_lora().unwrap();
        assert!(model.lora_parameters().is_empty());
        for (g, w) in logits(&model, &x).iter().zip(&tuned) {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{dev}: merged {g} vs {w}"
            );
        }
    }
    let bad = LoraConfig {
        targets: vec!["qkv".into()],
        ..LoraConfig::default()
    };
    let mut m = Llama::new(cfg, &Device::host(), &mut Generator::new(0)).unwrap();
    let e = m
        .add_lora(&bad, &mut Generator::new(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("qkv"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The adapters' values, by name.
fn adapters(m: &Llama) -> Vec<(String, Vec<f64>)> {
    m.lora_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.value().to_vec_f64().unwrap()))
        .collect()
}

/// Adapter files record rank, alpha and targets and load only into the same; add and load are
/// all or nothing: a refused call leaves every adapter, frozen flag and the generator as they were.
#[test]
fn lora_state_is_recorded_checked_and_all_or_nothing() {
    let cfg = LlamaConfig::tiny(24);
    let lora = |rank: usize, alpha: f64, targets: &[&str]| LoraConfig {
        rank,
        alpha,
        dropout: 0.0,
        targets: targets.iter().map(|t| t.to_string()).collect(),
    };
    let dir = std::env::temp_dir().join(format!("netcl-lora-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.safetensors");
    for dev in test_devices().unwrap() {
        let fresh = || Llama::new(cfg.clone(), &dev, &mut Generator::new(1)).unwrap();
        // Trained adapters (B made non-zero), alpha 16.
        let mut a = fresh();
        a.add_lora(&lora(4, 16.0, &["q", "v"]), &mut Generator::new(2))
            .unwrap();
        for (_, p) in a.lora_parameters() {
            p.assign(&Tensor::full(p.shape(), 0.25, p.dtype(), &dev).unwrap())
                .unwrap();
        }
        let trained = adapters(&a);
        a.save_lora(&file).unwrap();
        // A second add_lora replaces nothing.
        let e = a
            .add_lora(&lora(4, 16.0, &["q"]), &mut Generator::new(3))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("adapters already (rank 4, alpha 16, targets q,v)"),
            "{e}"
        );
        assert_eq!(adapters(&a), trained, "{dev}");

        // Into adapters of another alpha or targets: refused, nothing written.
        for (rank, alpha, targets) in [(4, 4.0, &["q", "v"][..]), (4, 16.0, &["q", "k"][..])] {
            let mut b = fresh();
            b.add_lora(&lora(rank, alpha, targets), &mut Generator::new(4))
                .unwrap();
            let before = adapters(&b);
            let e = b.load_lora(&file).unwrap_err().to_string();
            assert!(
                e.contains("adapters of rank 4, alpha 16, targets q,v"),
                "{e}"
            );
            assert_eq!(adapters(&b), before, "{dev}");
        }
        let b = fresh();
        let e = b.load_lora(&file).unwrap_err().to_string();
        assert!(e.contains("the model has no adapters"), "{e}");

        // A file whose last tensor is misshapen: refused before the first adapter is written.
        let mut c = fresh();
        c.add_lora(&lora(4, 16.0, &["q", "v"]), &mut Generator::new(5))
            .unwrap();
        let before = adapters(&c);
        let mut t: Vec<(String, Tensor)> = a
            .lora_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.value().clone()))
            .collect();
        t.sort_by(|x, y| x.0.cmp(&y.0));
        let last = t.len() - 1;
        t[last].1 = Tensor::zeros(&[3, 3], t[last].1.dtype(), &dev).unwrap();
        let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let meta = netcl_nn::SafetensorsFile::open(&file)
            .unwrap()
            .metadata()
            .unwrap();
        let bad = dir.join("bad.safetensors");
        netcl_nn::save_safetensors(&bad, &refs, Some(meta)).unwrap();
        let e = c.load_lora(&bad).unwrap_err().to_string();
        assert!(e.contains("[3, 3]"), "{e}");
        assert_eq!(adapters(&c), before, "{dev}");
        // Without the record (an older file): refused.
        netcl_nn::save_safetensors(&bad, &refs[..last], None).unwrap();
        let e = c.load_lora(&bad).unwrap_err().to_string();
        assert!(e.contains("records no LoRA"), "{e}");
        c.load_lora(&file).unwrap();
        assert_eq!(adapters(&c), trained, "{dev}");

        // add_lora failing on its second target (rank 12 > k's 8 rows): nothing added or frozen.
        let mut d = fresh();
        let mut g = Generator::new(6);
        let e = d
            .add_lora(&lora(12, 8.0, &["q", "k"]), &mut g)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 12"), "{e}");
        assert!(d.lora_parameters().is_empty(), "{dev}");
        assert_eq!(
            d.trainable_parameters().len(),
            d.parameters().len(),
            "{dev}"
        );
        assert_eq!(g, Generator::new(6), "{dev}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
