//! Qwen2, Mistral and GPT-2 through the shared Llama blocks on every device: export and reimport, sliding-window attention through the KV cache and the decode kernels, generation, LoRA by each family's module names, and bad configs (fixtures against transformers: families_hf.rs).
use netcl_autograd::Tape;
use netcl_core_devices::test_devices;
use netcl_models::{generate, Arch, Family, KvCache, Llama, LlamaConfig, Sampler, Sampling};
use netcl_nn::{load_safetensors, Init, LoraConfig, Module};
use netcl_ops::{Device, Generator, RopeStyle, Tensor};
use netcl_optim::{AdamW, Optimizer};
use serde_json::Value;

/// A tiny model of `family` with its quirks: Qwen2 biased and tied, Mistral with a window of
/// 5 and its own head, GPT-2 (LayerNorm, GELU, learned positions, biases) tied.
fn config(family: Family) -> LlamaConfig {
    let base = LlamaConfig {
        dim: 32,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        hidden_dim: 48,
        max_seq_len: 32,
        rope_style: RopeStyle::Halves,
        arch: Arch::of(family),
        ..LlamaConfig::llama_15m(40)
    };
    match family {
        Family::Mistral => LlamaConfig {
            tied_embeddings: false,
            arch: Arch {
                sliding_window: Some(5),
                ..base.arch.clone()
            },
            ..base
        },
        Family::Gpt2 => LlamaConfig {
            n_kv_heads: 4,
            ..base
        },
        _ => base,
    }
}

const FAMILIES: [Family; 3] = [Family::Qwen2, Family::Mistral, Family::Gpt2];

/// A model whose every parameter is drawn (biases and norms too, so that they count).
fn random_model(cfg: &LlamaConfig, dev: &Device, seed: u64) -> Llama {
    let mut g = Generator::new(seed);
    let m = Llama::new(cfg.clone(), dev, &mut g).unwrap();
    for (n, p) in m.named_parameters() {
        let norm = n.contains("norm") && n.ends_with("weight");
        let init = Init::Normal {
            mean: if norm { 1.0 } else { 0.0 },
            std: 0.1,
        };
        let t = init
            .tensor(p.shape(), 1, 1, p.dtype(), dev, &mut g)
            .unwrap();
        p.assign(&t).unwrap();
    }
    m
}

fn ids(rows: &[Vec<i32>], dev: &Device) -> Tensor {
    Tensor::from_vec(rows.concat(), &[rows.len(), rows[0].len()], dev).unwrap()
}

fn seq(n: usize, vocab: usize, seed: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((7 * i + 3 * seed + 1) % vocab) as i32)
        .collect()
}

fn logits(m: &Llama, x: &Tensor) -> Vec<f64> {
    let l = m.logits(&Tape::no_grad(), x, None, None, None).unwrap();
    l.value().to_vec_f64().unwrap()
}

fn worst(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("netcl-families-{name}-{}", std::process::id()))
}

#[test]
fn each_family_exports_in_its_layout_and_reimports_exactly() {
    for family in FAMILIES {
        let cfg = config(family);
        for dev in test_devices().unwrap() {
            let m = random_model(&cfg, &dev, 3);
            let dir = temp(&format!("{family:?}"));
            m.save_hf(&dir).unwrap();
            let json: Value =
                serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
            let (model_type, arch) = family.names();
            assert_eq!(json["model_type"], model_type);
            assert_eq!(json["architectures"][0], arch);
            let tensors = load_safetensors(dir.join("model.safetensors")).unwrap();
            let shape = |n: &str| {
                let t = tensors.iter().find(|(name, _)| name == n);
                t.unwrap_or_else(|| panic!("{family:?}: no {n}"))
                    .1
                    .shape()
                    .to_vec()
            };
            match family {
                // Conv1D weights [in, out]; queries, keys and values fused.
                Family::Gpt2 => {
                    assert_eq!(shape("transformer.h.0.attn.c_attn.weight"), [32, 96]);
                    assert_eq!(shape("transformer.h.1.attn.c_attn.bias"), [96]);
                    assert_eq!(shape("transformer.h.0.mlp.c_fc.weight"), [32, 48]);
                    assert_eq!(shape("transformer.h.0.mlp.c_proj.weight"), [48, 32]);
                    assert_eq!(shape("transformer.wpe.weight"), [32, 32]);
                    assert_eq!(shape("transformer.ln_f.bias"), [32]);
                    assert_eq!(json["n_inner"], 48);
                }
                Family::Qwen2 => {
                    assert_eq!(shape("model.layers.0.self_attn.k_proj.bias"), [16]);
                    assert!(!tensors.iter().any(|(n, _)| n.contains("o_proj.bias")));
                    assert_eq!(json["use_sliding_window"], false);
                }
                _ => {
                    assert_eq!(shape("lm_head.weight"), [40, 32]);
                    assert_eq!(json["sliding_window"], 5);
                }
            }
            let back = Llama::from_hf(&dir, &dev, None).unwrap();
            assert_eq!(back.config, cfg, "{family:?}");
            let x = ids(&[seq(20, 40, 1), seq(20, 40, 2)], &dev);
            assert_eq!(logits(&m, &x), logits(&back, &x), "{dev} {family:?}");
            // A netcl checkpoint keeps the family's switches too.
            let ckpt = dir.join("ckpt");
            netcl_nn::save_checkpoint(&ckpt, &m, None, 1, Value::Null).unwrap();
            let (restored, _) = Llama::from_checkpoint(&ckpt, &dev).unwrap();
            assert_eq!(restored.config, cfg);
            assert_eq!(logits(&restored, &x), logits(&m, &x), "{dev} {family:?}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// A window shorter than the sequence: the fused training forward, the composed attention (a
/// mask forces it), the KV cache in steps and the fused decode kernels give the same logits,
/// and other logits than without the window.
#[test]
fn a_sliding_window_holds_in_every_attention_path() {
    const T: usize = 24;
    let cfg = config(Family::Mistral);
    for dev in test_devices().unwrap() {
        let m = random_model(&cfg, &dev, 5);
        let rows = [seq(T, 40, 1), seq(T, 40, 2)];
        let x = ids(&rows, &dev);
        let full = logits(&m, &x);
        // Composed: an all-zero additive mask [B, 1, 1, T, T].
        let zeros = Tensor::zeros(&[2, 1, 1, T, T], cfg.dtype, &dev).unwrap();
        let composed = m
            .logits(&Tape::no_grad(), &x, None, None, Some(&zeros))
            .unwrap();
        let composed = composed.value().to_vec_f64().unwrap();
        assert!(
            worst(&full, &composed) < 1e-4,
            "{dev}: composed {}",
            worst(&full, &composed)
        );
        // Through the cache: 4 positions, 12 at once, then one at a time by Llama::decode.
        assert!(m.decode_supported());
        let cache = KvCache::new(&cfg, 2, &dev).unwrap();
        let v = cfg.vocab_size;
        let mut at = 0;
        for len in [4, 12, 1, 1, 1, 1] {
            let part: Vec<Vec<i32>> = rows.iter().map(|r| r[at..at + len].to_vec()).collect();
            let got = match len {
                1 => {
                    let one = Tensor::from_vec(part.concat(), &[2], &dev).unwrap();
                    m.decode(&one, &cache, None).unwrap().to_vec_f64().unwrap()
                }
                _ => {
                    let l = m.logits(
                        &Tape::no_grad(),
                        &ids(&part, &dev),
                        None,
                        Some(&cache),
                        None,
                    );
                    l.unwrap().value().to_vec_f64().unwrap()
                }
            };
            for b in 0..2 {
                for p in 0..len {
                    let (g, f) = ((b * len + p) * v, (b * T + at + p) * v);
                    let d = worst(&got[g..g + v], &full[f..f + v]);
                    assert!(d < 1e-4, "{dev}: row {b} position {}: {d}", at + p);
                }
            }
            at += len;
        }
        let mut open = cfg.clone();
        open.arch.sliding_window = None;
        let unwindowed = Llama::new(open, &dev, &mut Generator::new(0)).unwrap();
        for ((_, a), (_, b)) in unwindowed
            .named_parameters()
            .iter()
            .zip(m.named_parameters())
        {
            a.assign(b.value()).unwrap();
        }
        assert!(worst(&logits(&unwindowed, &x), &full) > 1e-3, "{dev}");
    }
}

/// Greedy generation through the KV cache (the decode kernels where the family allows them,
/// the cached forward elsewhere) picks what the full forward's argmax picks, for each family.
#[test]
fn each_family_generates_through_the_cache() {
    for family in FAMILIES {
        let cfg = config(family);
        for dev in test_devices().unwrap() {
            let m = random_model(&cfg, &dev, 7);
            // The fused decode kernels take Qwen2's q/k/v biases and Mistral's window; GPT-2
            // (LayerNorm, GELU, learned positions) decodes through the cached forward.
            assert_eq!(m.decode_supported(), family != Family::Gpt2, "{family:?}");
            let prompt: Vec<u32> = (0..4).map(|i| (5 * i + 2) as u32).collect();
            let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
            let out = generate(
                &m,
                std::slice::from_ref(&prompt),
                12,
                &mut s,
                None,
                |_, _| Ok(()),
            );
            let out = out.unwrap().remove(0);
            let mut all: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
            for &tok in &out {
                let l = logits(&m, &ids(std::slice::from_ref(&all), &dev));
                let last = &l[l.len() - cfg.vocab_size..];
                let best = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
                assert_eq!(tok as usize, best, "{dev} {family:?} after {all:?}");
                all.push(tok as i32);
            }
            assert_eq!(out.len(), 12);
        }
    }
}

/// LoRA by each family's module names: GPT-2's c_attn puts adapters on the queries, keys and
/// values (c_proj on both outputs); Qwen2's q_proj on the queries. Training moves only the
/// adapters; the merged model exports and reimports with the trained logits.
#[test]
fn lora_takes_each_familys_module_names() {
    let dev = Device::host();
    let cases = [
        (
            Family::Gpt2,
            vec!["c_attn", "c_proj"],
            vec!["q", "k", "v", "o", "down"],
        ),
        (
            Family::Qwen2,
            vec!["q_proj", "down_proj"],
            vec!["q", "down"],
        ),
        (
            Family::Mistral,
            vec!["all-linear"],
            vec!["q", "k", "v", "o", "gate", "up", "down"],
        ),
    ];
    for (family, targets, want) in cases {
        let cfg = config(family);
        let mut m = random_model(&cfg, &dev, 9);
        let lora = |t: &[&str]| LoraConfig {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: t.iter().map(|s| s.to_string()).collect(),
        };
        m.add_lora(&lora(&targets), &mut Generator::new(2)).unwrap();
        assert_eq!(m.lora_spec().unwrap().unwrap().targets, want, "{family:?}");
        let x = ids(&[seq(17, 40, 1)], &dev);
        let (inp, tgt) = (x.narrow(1, 0, 16).unwrap(), x.narrow(1, 1, 16).unwrap());
        let (inp, tgt) = (inp.contiguous().unwrap(), tgt.contiguous().unwrap());
        let mut opt = AdamW::new(m.trainable_parameters(), 1e-2);
        for _ in 0..3 {
            let tape = Tape::new();
            let loss = m.loss(&tape, &inp, &tgt).unwrap();
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        }
        let tuned = logits(&m, &x);
        m.merge_lora().unwrap();
        let dir = temp(&format!("lora-{family:?}"));
        m.save_hf(&dir).unwrap();
        let back = Llama::from_hf(&dir, &dev, None).unwrap();
        assert!(worst(&logits(&back, &x), &tuned) < 1e-4, "{family:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    // A target the family does not have, and one named twice through an alias.
    let mut gpt2 = random_model(&config(Family::Gpt2), &dev, 1);
    let e = gpt2.add_lora(
        &LoraConfig {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["up".into()],
        },
        &mut Generator::new(1),
    );
    assert!(e.unwrap_err().to_string().contains("no such projection"));
    let e = gpt2.add_lora(
        &LoraConfig {
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["q".into(), "c_attn".into()],
        },
        &mut Generator::new(1),
    );
    assert!(e.unwrap_err().to_string().contains("listed twice"));
}

/// Configs netcl cannot honour are errors naming the architecture or the key.
#[test]
fn bad_configs_are_errors_naming_the_key() {
    let dev = Device::host();
    let err = |v: &Value| {
        LlamaConfig::from_hf(v, "config.json")
            .unwrap_err()
            .to_string()
    };
    let qwen = config(Family::Qwen2).to_hf().unwrap();
    let mut v = qwen.clone();
    v["architectures"] = serde_json::json!(["Phi3ForCausalLM"]);
    let e = err(&v);
    assert!(
        e.contains("Phi3ForCausalLM") && e.contains("Qwen2ForCausalLM"),
        "{e}"
    );
    let mut v = qwen.clone();
    v.as_object_mut().unwrap().remove("architectures");
    v["model_type"] = "falcon".into();
    assert!(err(&v).contains("falcon"));
    // Qwen2's window on some layers only (transformers 4 and 5 spellings).
    let mut v = qwen.clone();
    v.as_object_mut().unwrap().remove("layer_types");
    v["use_sliding_window"] = true.into();
    v["sliding_window"] = 4.into();
    v["max_window_layers"] = 1.into();
    let e = err(&v);
    assert!(
        e.contains("use_sliding_window") && e.contains("mixed"),
        "{e}"
    );
    v["layer_types"] = serde_json::json!(["full_attention", "sliding_attention"]);
    assert!(err(&v).contains("layer_types"));
    // All layers windowed: read as one window.
    v["layer_types"] = serde_json::json!(["sliding_attention", "sliding_attention"]);
    let c = LlamaConfig::from_hf(&v, "config.json").unwrap();
    assert_eq!(c.arch.sliding_window, Some(4));
    for (key, value) in [
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
        ),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "dynamic", "factor": 4.0}),
        ),
        ("hidden_act", "gelu".into()),
    ] {
        let mut v = qwen.clone();
        v[key] = value.clone();
        let e = err(&v);
        assert!(e.contains(key) && e.contains("not supported"), "{key}: {e}");
    }
    // Linear RoPE scaling is read: positions divided by the factor.
    let mut v = qwen.clone();
    v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 2.0});
    let c = LlamaConfig::from_hf(&v, "config.json").unwrap();
    assert_eq!(c.arch.rope_linear, Some(2.0));
    assert_eq!(LlamaConfig::from_hf(&c.to_hf().unwrap(), "x").unwrap(), c);
    let gpt2 = config(Family::Gpt2).to_hf().unwrap();
    for (key, value) in [
        ("activation_function", Value::from("relu")),
        ("scale_attn_by_inverse_layer_idx", true.into()),
        ("add_cross_attention", true.into()),
    ] {
        let mut v = gpt2.clone();
        v[key] = value;
        let e = err(&v);
        assert!(e.contains(key), "{key}: {e}");
    }
    // GPT-2's hub layout without the `transformer.` prefix and with its mask buffers loads.
    let m = random_model(&config(Family::Gpt2), &dev, 4);
    let dir = temp("gpt2-hub");
    m.save_hf(&dir).unwrap();
    let mut t = load_safetensors(dir.join("model.safetensors")).unwrap();
    for (n, _) in t.iter_mut() {
        *n = n.trim_start_matches("transformer.").to_string();
    }
    t.push((
        "h.0.attn.bias".into(),
        Tensor::ones(&[1, 1, 32, 32], cfg_dtype(), &dev).unwrap(),
    ));
    let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
    netcl_nn::save_safetensors(dir.join("model.safetensors"), &refs, None).unwrap();
    let back = Llama::from_hf(&dir, &dev, None).unwrap();
    let x = ids(&[seq(9, 40, 3)], &dev);
    assert_eq!(logits(&back, &x), logits(&m, &x));
    // A c_attn that is not three blocks of n_embd: an error naming it and the shape.
    let w = t
        .iter()
        .position(|(n, _)| n == "h.1.attn.c_attn.weight")
        .unwrap();
    t[w].1 = Tensor::zeros(&[32, 95], cfg_dtype(), &dev).unwrap();
    let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
    netcl_nn::save_safetensors(dir.join("model.safetensors"), &refs, None).unwrap();
    let e = Llama::from_hf(&dir, &dev, None).err().unwrap().to_string();
    assert!(
        e.contains("c_attn.weight") && e.contains("[32, 95]; the config needs [32, 96]"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn cfg_dtype() -> netcl_ops::DType {
    netcl_ops::DType::F32
}

/// Every parameter's gradient (biases, LayerNorm's, the learned positions) against central
/// finite differences in f64, with 16 queries so that the fused attention (windowed for
/// Mistral) runs forward and backward.
#[test]
fn family_gradients_match_finite_differences_in_f64() {
    for family in FAMILIES {
        let mut cfg = LlamaConfig {
            dim: 8,
            n_heads: 2,
            n_kv_heads: if family == Family::Gpt2 { 2 } else { 1 },
            hidden_dim: 12,
            vocab_size: 11,
            max_seq_len: 20,
            dtype: netcl_ops::DType::F64,
            ..config(family)
        };
        cfg.arch.sliding_window = cfg.arch.sliding_window.map(|_| 3);
        for dev in test_devices().unwrap() {
            if !dev.info().fp64 {
                continue;
            }
            let m = random_model(&cfg, &dev, 11);
            let row = seq(17, 11, 4);
            let x = ids(&[row[..16].to_vec()], &dev);
            let y = ids(&[row[1..].to_vec()], &dev);
            let tape = Tape::new();
            tape.backward(&m.loss(&tape, &x, &y).unwrap()).unwrap();
            let loss_at = || m.loss(&Tape::no_grad(), &x, &y).unwrap().item().unwrap();
            for (name, p) in m.named_parameters() {
                let g = p.grad().unwrap().to_vec_f64().unwrap();
                let v = p.value().to_vec_f64().unwrap();
                for i in [0, v.len() / 2, v.len() - 1] {
                    let set = |d: f64| {
                        let mut w = v.clone();
                        w[i] += d;
                        p.assign(&Tensor::from_vec(w, p.shape(), &dev).unwrap())
                            .unwrap();
                    };
                    let h = 1e-5;
                    set(h);
                    let up = loss_at();
                    set(-h);
                    let down = loss_at();
                    set(0.0);
                    let fd = (up - down) / (2.0 * h);
                    assert!(
                        (fd - g[i]).abs() <= 1e-6 + 1e-4 * fd.abs(),
                        "{dev} {family:?} {name}[{i}]: backward {} vs finite difference {fd}",
                        g[i]
                    );
                }
            }
        }
    }
}
