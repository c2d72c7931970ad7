//! Qwen2, Mistral and GPT-2 against transformers' own numbers (fixtures/families, made by make_families.py): logits, 5 AdamW losses and greedy ids through the KV cache on every device; and the exports that check_exports.py loads into transformers.
use netcl_autograd::Tape;
use netcl_core_devices::test_devices;
use netcl_models::{generate, Arch, Family, Llama, LlamaConfig, Sampler, Sampling};
use netcl_nn::{load_safetensors, Init, LoraConfig, Module};
use netcl_ops::{Device, Generator, RopeStyle, Tensor};
use netcl_optim::{AdamW, Optimizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/families")
        .join(family)
}

fn ids(rows: &[Vec<i32>], dev: &Device) -> Tensor {
    Tensor::from_vec(rows.concat(), &[rows.len(), rows[0].len()], dev).unwrap()
}

fn logits(m: &Llama, x: &Tensor) -> Vec<f64> {
    let l = m.logits(&Tape::no_grad(), x, None, None, None).unwrap();
    l.value().to_vec_f64().unwrap()
}

/// Greedy ids after `prompt` through `generate` (the KV cache).
fn greedy(m: &Llama, prompt: &[i32], n: usize) -> Vec<u32> {
    let p: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
    let out = generate(m, &[p], n, &mut s, None, |_, _| Ok(())).unwrap();
    out.into_iter().next().unwrap()
}

/// A model whose every parameter is drawn (biases and norms too).
fn randomize(m: &Llama, seed: u64) {
    let mut g = Generator::new(seed);
    for (n, p) in m.named_parameters() {
        let norm = n.contains("norm") && n.ends_with("weight");
        let init = Init::Normal {
            mean: if norm { 1.0 } else { 0.0 },
            std: 0.1,
        };
        let t = init
            .tensor(p.shape(), 1, 1, p.dtype(), p.device(), &mut g)
            .unwrap();
        p.assign(&t).unwrap();
    }
}

/// Per family, on every device: the fixture imports as its family, its logits match
/// transformers' within 1e-4, the greedy ids through the KV cache (the decode kernels for
/// Mistral's window, the cached forward for the biased Qwen2 and GPT-2) equal transformers', and
/// 5 AdamW steps (lr 1e-3, weight decay 0.01) give its losses within 1e-4. Returns the worst
/// differences seen, printed for the record.
#[test]
fn each_family_matches_transformers() {
    for (name, family) in [
        ("qwen2", Family::Qwen2),
        ("mistral", Family::Mistral),
        ("gpt2", Family::Gpt2),
    ] {
        let dir = fixture(name);
        let want: Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let rows: Vec<Vec<i32>> = serde_json::from_value(want["ids"].clone()).unwrap();
        let losses: Vec<f64> = serde_json::from_value(want["losses"].clone()).unwrap();
        let greedy_ids: Vec<u32> = serde_json::from_value(want["greedy"].clone()).unwrap();
        let prompt = want["prompt"].as_u64().unwrap() as usize;
        let expected = load_safetensors(dir.join("expected.safetensors")).unwrap();
        let ref_logits = expected[0].1.to_vec_f64().unwrap();
        let (mut worst_logit, mut worst_loss) = (0f64, 0f64);
        for dev in test_devices().unwrap() {
            let model = Llama::from_hf(&dir, &dev, None).unwrap();
            assert_eq!(model.config.arch.family, family);
            let x = ids(&rows, &dev);
            let got = logits(&model, &x);
            assert_eq!(got.len(), ref_logits.len());
            for (i, (g, w)) in got.iter().zip(&ref_logits).enumerate() {
                let d = (g - w).abs();
                worst_logit = worst_logit.max(d);
                assert!(
                    d <= 1e-4 * w.abs().max(1.0),
                    "{dev} {name}: logit {i}: {g} vs transformers {w}"
                );
            }
            let g = greedy(&model, &rows[0][..prompt], greedy_ids.len());
            assert_eq!(g, greedy_ids, "{dev} {name}: greedy ids");
            let t = x.shape()[1];
            let (inp, tgt) = (
                x.narrow(1, 0, t - 1).unwrap().contiguous().unwrap(),
                x.narrow(1, 1, t - 1).unwrap().contiguous().unwrap(),
            );
            let mut opt = AdamW::new(model.parameters(), 1e-3).weight_decay(0.01);
            for (step, w) in losses.iter().enumerate() {
                let tape = Tape::new();
                let loss = model.loss(&tape, &inp, &tgt).unwrap();
                let l = loss.item().unwrap();
                worst_loss = worst_loss.max((l - w).abs() / w.abs());
                assert!(
                    (l - w).abs() <= 1e-4 * w.abs(),
                    "{dev} {name}: step {step}: loss {l} vs transformers {w}"
                );
                tape.backward(&loss).unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
        }
        eprintln!(
            "{name}: worst |logit difference| {worst_logit:.2e}, worst relative loss difference \
             {worst_loss:.2e}, greedy ids equal"
        );
    }
}

/// Qwen2's embedding is padded past its tokenizer's vocabulary (320 rows, 300 tokens): the
/// model keeps all rows, and a sampler restricted to the tokenizer never picks a padding id.
#[test]
fn a_padded_qwen2_vocabulary_is_kept_and_restricted_at_sampling() {
    let dev = Device::host();
    let model = Llama::from_hf(fixture("qwen2"), &dev, None).unwrap();
    assert_eq!(model.config.vocab_size, 320);
    let tok_path = fixture("qwen2").join("../../hf_tiny/tokenizer.json");
    let tok = netcl_data::Tokenizer::from_file(tok_path).unwrap();
    assert_eq!(tok.vocab_size(), 300);
    let mut s = Sampler::new(Sampling::Greedy, 0)
        .unwrap()
        .restricted_to(tok.vocab_size())
        .unwrap();
    let out = generate(&model, &[vec![1, 2, 3]], 20, &mut s, None, |_, _| Ok(())).unwrap();
    assert!(out[0].iter().all(|&t| t < 300), "{:?}", out[0]);
}

/// Writes netcl exports for check_exports.py into `$NETCL_FAMILY_EXPORTS`: per family (and
/// quirk: tied or not, a window, biases, LoRA merged after training), `config.json`,
/// `model.safetensors`, and `netcl.json` with the ids, netcl's logits and greedy ids.
#[test]
#[ignore = "writes the exports that check_exports.py loads into transformers"]
fn write_exports_for_transformers() {
    let Ok(root) = std::env::var("NETCL_FAMILY_EXPORTS") else {
        return;
    };
    let dev = Device::host();
    let base = LlamaConfig {
        dim: 32,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        hidden_dim: 48,
        max_seq_len: 32,
        rope_style: RopeStyle::Halves,
        ..LlamaConfig::llama_15m(64)
    };
    let with = |family: Family, f: &dyn Fn(&mut LlamaConfig)| {
        let mut c = LlamaConfig {
            arch: Arch::of(family),
            ..base.clone()
        };
        if family == Family::Gpt2 {
            c.n_kv_heads = 4;
        }
        f(&mut c);
        c
    };
    let cases: Vec<(&str, LlamaConfig, Option<Vec<&str>>)> = vec![
        ("qwen2_tied", with(Family::Qwen2, &|_| {}), None),
        (
            "qwen2_untied_window",
            with(Family::Qwen2, &|c| {
                c.tied_embeddings = false;
                c.arch.sliding_window = Some(5);
            }),
            None,
        ),
        (
            "mistral_window",
            with(Family::Mistral, &|c| {
                c.tied_embeddings = false;
                c.arch.sliding_window = Some(5);
            }),
            None,
        ),
        ("gpt2_tied", with(Family::Gpt2, &|_| {}), None),
        (
            "gpt2_untied",
            with(Family::Gpt2, &|c| c.tied_embeddings = false),
            None,
        ),
        (
            "llama_biases_linear_rope",
            with(Family::Llama, &|c| {
                (c.arch.qkv_bias, c.arch.out_bias, c.arch.mlp_bias) = (true, true, true);
                c.arch.rope_linear = Some(2.0);
            }),
            None,
        ),
        (
            "gpt2_lora",
            with(Family::Gpt2, &|_| {}),
            Some(vec!["c_attn", "c_fc"]),
        ),
        (
            "qwen2_lora",
            with(Family::Qwen2, &|_| {}),
            Some(vec!["q_proj", "v_proj", "up_proj"]),
        ),
    ];
    let rows: Vec<Vec<i32>> = (0..2)
        .map(|r| (0..20).map(|t| (7 * t + 3 * r + 1) % 64).collect())
        .collect();
    for (i, (name, cfg, lora)) in cases.into_iter().enumerate() {
        let mut m = Llama::new(cfg, &dev, &mut Generator::new(i as u64)).unwrap();
        randomize(&m, 100 + i as u64);
        let x = ids(&rows, &dev);
        if let Some(targets) = lora {
            let c = LoraConfig {
                rank: 2,
                alpha: 4.0,
                dropout: 0.0,
                targets: targets.iter().map(|s| s.to_string()).collect(),
            };
            m.add_lora(&c, &mut Generator::new(5)).unwrap();
            let (inp, tgt) = (x.narrow(1, 0, 19).unwrap(), x.narrow(1, 1, 19).unwrap());
            let (inp, tgt) = (inp.contiguous().unwrap(), tgt.contiguous().unwrap());
            let mut opt = AdamW::new(m.trainable_parameters(), 5e-2);
            for _ in 0..3 {
                let tape = Tape::new();
                let loss = m.loss(&tape, &inp, &tgt).unwrap();
                tape.backward(&loss).unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
            m.merge_lora().unwrap();
        }
        let dir = Path::new(&root).join(name);
        m.save_hf(&dir).unwrap();
        let out = serde_json::json!({
            "ids": rows,
            "logits": logits(&m, &x),
            "greedy": greedy(&m, &rows[0][..4], 12),
        });
        std::fs::write(dir.join("netcl.json"), out.to_string()).unwrap();
    }
}
