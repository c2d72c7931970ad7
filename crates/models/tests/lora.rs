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
