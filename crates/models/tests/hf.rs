//! Hugging Face interchange against transformers' own numbers (fixtures/hf_tiny, made by make_fixture.py): logits, 5 AdamW losses, export round trip, the tokenizer, and bad directories.
use netcl_autograd::Tape;
use netcl_core_devices::test_devices;
use netcl_data::Tokenizer;
use netcl_models::{Llama, LlamaConfig};
use netcl_nn::{load_safetensors, save_safetensors, Module};
use netcl_ops::{DType, Device, Tensor};
use netcl_optim::{AdamW, Optimizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_tiny")
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(fixture().join("expected.json")).unwrap()).unwrap()
}

fn ids(v: &Value, dev: &Device) -> Tensor {
    let rows: Vec<Vec<i32>> = serde_json::from_value(v["ids"].clone()).unwrap();
    let (b, t) = (rows.len(), rows[0].len());
    Tensor::from_vec(rows.concat(), &[b, t], dev).unwrap()
}

fn logits(model: &Llama, ids: &Tensor) -> Vec<f64> {
    let l = model
        .logits(&Tape::no_grad(), ids, None, None, None)
        .unwrap();
    l.value().to_vec_f64().unwrap()
}

#[test]
fn imported_logits_and_adamw_losses_match_transformers() {
    let want = expected();
    let ref_logits: Vec<f64> = serde_json::from_value(want["logits"].clone()).unwrap();
    let ref_losses: Vec<f64> = serde_json::from_value(want["losses"].clone()).unwrap();
    for dev in test_devices().unwrap() {
        let model = Llama::from_hf(fixture(), &dev, None).unwrap();
        assert_eq!(model.config.n_kv_heads, 2);
        let x = ids(&want, &dev);
        let got = logits(&model, &x);
        assert_eq!(got.len(), ref_logits.len());
        for (i, (g, w)) in got.iter().zip(&ref_logits).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{dev}: logit {i}: {g} vs transformers {w}"
            );
        }
        // 5 AdamW steps of next-token loss, as make_fixture.py takes them.
        let t = x.shape()[1];
        let (inp, tgt) = (
            x.narrow(1, 0, t - 1).unwrap().contiguous().unwrap(),
            x.narrow(1, 1, t - 1).unwrap().contiguous().unwrap(),
        );
        let mut opt = AdamW::new(model.parameters(), 1e-3).weight_decay(0.01);
        for (step, w) in ref_losses.iter().enumerate() {
            let tape = Tape::new();
            let loss = model.loss(&tape, &inp, &tgt).unwrap();
            let l = loss.item().unwrap();
            assert!(
                (l - w).abs() <= 1e-4 * w.abs(),
                "{dev}: step {step}: loss {l} vs transformers {w}"
            );
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        }
    }
}

#[test]
fn an_export_reloads_with_identical_logits_and_tensors() {
    let want = expected();
    let dir = std::env::temp_dir().join(format!("netcl-hf-export-{}", std::process::id()));
    for dev in test_devices().unwrap() {
        let model = Llama::from_hf(fixture(), &dev, None).unwrap();
        model.save_hf(&dir).unwrap();
        let back = Llama::from_hf(&dir, &dev, None).unwrap();
        let x = ids(&want, &dev);
        assert_eq!(logits(&model, &x), logits(&back, &x), "{dev}");
        // The same tensors under the same names as the original file.
        let a = load_safetensors(fixture().join("model.safetensors")).unwrap();
        let b = load_safetensors(dir.join("model.safetensors")).unwrap();
        assert_eq!(a.len(), b.len());
        for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            assert_eq!(
                ta.to_host_data().unwrap(),
                tb.to_host_data().unwrap(),
                "{na}"
            );
        }
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(LlamaConfig::from_hf(&cfg, "export").unwrap(), model.config);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_fixture_tokenizer_encodes_the_fixture_ids() {
    let want = expected();
    let rows: Vec<Vec<u32>> = serde_json::from_value(want["ids"].clone()).unwrap();
    let tok = Tokenizer::from_file(fixture().join("tokenizer.json")).unwrap();
    let text = [
        "The quick brown fox jumps over the lazy dog.",
        "What's Oxygen? A gas that we breathe.",
    ];
    for (row, t) in rows.iter().zip(text) {
        let enc = tok.encode(t).unwrap();
        assert_eq!(&enc[..row.len()], &row[..]);
        assert_eq!(tok.decode(&enc).unwrap(), t);
    }
}

#[test]
fn bad_directories_are_errors_naming_the_file_and_tensor() {
    let dev = Device::host();
    let base = std::env::temp_dir().join(format!("netcl-hf-bad-{}", std::process::id()));
    let fresh = |name: &str| {
        let d = base.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(fixture().join("config.json"), d.join("config.json")).unwrap();
        d
    };
    let tensors = load_safetensors(fixture().join("model.safetensors")).unwrap();
    let write = |d: &Path, t: &[(String, Tensor)]| {
        let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(d.join("model.safetensors"), &refs, None).unwrap();
    };
    let err = |d: &Path| Llama::from_hf(d, &dev, None).err().unwrap().to_string();

    let d = fresh("missing");
    write(&d, &tensors[1..]);
    let e = err(&d);
    assert!(
        e.contains("missing tensors") && e.contains(&tensors[0].0),
        "{e}"
    );

    let d = fresh("misshapen");
    let mut t = tensors.clone();
    let w = t
        .iter()
        .position(|(n, _)| n.ends_with("q_proj.weight"))
        .unwrap();
    t[w].1 = Tensor::zeros(&[64, 32], t[w].1.dtype(), &dev).unwrap();
    write(&d, &t);
    let e = err(&d);
    assert!(
        e.contains(&t[w].0) && e.contains("[64, 32]") && e.contains("model.safetensors"),
        "{e}"
    );

    let d = fresh("unknown");
    let mut t = tensors.clone();
    t.push((
        "model.layers.0.self_attn.q_norm.weight".into(),
        Tensor::zeros(&[16], t[0].1.dtype(), &dev).unwrap(),
    ));
    write(&d, &t);
    assert!(err(&d).contains("unknown tensor 'model.layers.0.self_attn.q_norm.weight'"));

    let d = fresh("truncated");
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let e = err(&d);
    assert!(e.contains("model.safetensors"), "{e}");

    let cfg: Value =
        serde_json::from_slice(&std::fs::read(fixture().join("config.json")).unwrap()).unwrap();
    let mut scaled = cfg.clone();
    scaled["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 8.0});
    let e = LlamaConfig::from_hf(&scaled, "config.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("yarn") && e.contains("config.json"), "{e}");
    scaled["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    let e = LlamaConfig::from_hf(&scaled, "config.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("low_freq_factor"), "{e}");
    let mut int8 = cfg.clone();
    int8["dtype"] = "int8".into();
    assert!(LlamaConfig::from_hf(&int8, "config.json")
        .unwrap_err()
        .to_string()
        .contains("int8"));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn sharded_checkpoints_and_dtype_conversion_load() {
    let want = expected();
    let dir = std::env::temp_dir().join(format!("netcl-hf-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    let tensors = load_safetensors(fixture().join("model.safetensors")).unwrap();
    let half = tensors.len() / 2;
    let mut map = serde_json::Map::new();
    for (i, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let refs: Vec<(&str, &Tensor)> = part.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(dir.join(&file), &refs, None).unwrap();
        for (n, _) in part {
            map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let dev = Device::host();
    let x = ids(&want, &dev);
    let whole = Llama::from_hf(fixture(), &dev, None).unwrap();
    let sharded = Llama::from_hf(&dir, &dev, None).unwrap();
    assert_eq!(logits(&whole, &x), logits(&sharded, &x));
    // Converted on request: bf16 storage, logits within bf16 rounding.
    let bf = Llama::from_hf(&dir, &dev, Some(netcl_ops::DType::BF16)).unwrap();
    assert_eq!(bf.config.dtype, netcl_ops::DType::BF16);
    let (a, b) = (logits(&whole, &x), logits(&bf, &x));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max);
    assert!(worst < 0.05, "bf16 logits differ by {worst}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    let dir = fixture().with_file_name("hf_tiny_llama3");
    let want: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let ref_logits: Vec<f64> = serde_json::from_value(want["logits"].clone()).unwrap();
    for dev in test_devices().unwrap() {
        let model = Llama::from_hf(&dir, &dev, None).unwrap();
        let scaling = model
            .config
            .rope_scaling
            .clone()
            .expect("llama3 scaling read");
        assert_eq!(scaling.factor, 8.0);
        let got = logits(&model, &ids(&want, &dev));
        assert_eq!(got.len(), ref_logits.len());
        for (i, (g, w)) in got.iter().zip(&ref_logits).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{dev}: logit {i}: {g} vs transformers {w}"
            );
        }
        // The same weights with plain RoPE give other logits: the scaling is what matches.
        let plain = std::env::temp_dir().join(format!("netcl-hf-plain-{}", std::process::id()));
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::copy(
            dir.join("model.safetensors"),
            plain.join("model.safetensors"),
        )
        .unwrap();
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        cfg["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 10000.0});
        std::fs::write(plain.join("config.json"), cfg.to_string()).unwrap();
        let unscaled = logits(
            &Llama::from_hf(&plain, &dev, None).unwrap(),
            &ids(&want, &dev),
        );
        let worst = unscaled
            .iter()
            .zip(&ref_logits)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f64::max);
        assert!(
            worst > 1e-3,
            "{dev}: plain RoPE is {worst} from the scaled logits"
        );
        let _ = std::fs::remove_dir_all(&plain);
        // The export writes the scaling back.
        let out = std::env::temp_dir().join(format!("netcl-hf-l3-{}", std::process::id()));
        model.save_hf(&out).unwrap();
        let back = Llama::from_hf(&out, &dev, None).unwrap();
        assert_eq!(back.config, model.config);
        assert_eq!(logits(&back, &ids(&want, &dev)), got);
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Imports check what a directory or checkpoint says against what it holds before anything is
/// built: a config asking for more than the weights, shards outside the directory, integer or
/// duplicated tensors and FIFOs are errors (at once), float conversions are said.
#[test]
fn imports_refuse_what_they_cannot_honour() {
    let dev = Device::host();
    let base = std::env::temp_dir().join(format!("netcl-hf-honour-{}", std::process::id()));
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(fixture().join("config.json")).unwrap()).unwrap();
    let tensors = load_safetensors(fixture().join("model.safetensors")).unwrap();
    let fresh = |name: &str, cfg: &Value| {
        let d = base.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        d
    };
    let save = |path: &Path, t: &[(String, Tensor)]| {
        let refs: Vec<(&str, &Tensor)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(path, &refs, None).unwrap();
    };
    let shards = |d: &Path, map: Value| {
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    };
    let err = |d: &Path| {
        let started = std::time::Instant::now();
        let e = Llama::from_hf(d, &dev, None).err().unwrap().to_string();
        assert!(started.elapsed().as_secs() < 10, "{e}");
        e
    };

    // A config asking for far more than the weights hold fails before anything is allocated.
    for (key, value, want) in [
        (
            "num_hidden_layers",
            1_000_000_000u64,
            "the config has 1000000000 layers",
        ),
        ("intermediate_size", 1 << 40, "1099511627776]"),
        ("vocab_size", 1 << 40, "the config needs [1099511627776"),
    ] {
        let mut c = cfg.clone();
        c[key] = value.into();
        let d = fresh(key, &c);
        std::fs::copy(
            fixture().join("model.safetensors"),
            d.join("model.safetensors"),
        )
        .unwrap();
        let e = err(&d);
        assert!(e.contains(want), "{key}: {e}");
    }

    // Shards named outside the directory: `..`, an absolute path, a symlink leaving it.
    let outside = base.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    save(&outside.join("stolen.safetensors"), &tensors);
    let d = fresh("escape", &cfg);
    let abs = outside.join("stolen.safetensors").display().to_string();
    std::os::unix::fs::symlink(
        outside.join("stolen.safetensors"),
        d.join("link.safetensors"),
    )
    .unwrap();
    for (shard, want) in [
        ("../outside/stolen.safetensors", "leaves the directory"),
        (abs.as_str(), "leaves the directory"),
        ("link.safetensors", "which resolves to"),
    ] {
        let map: serde_json::Map<String, Value> = tensors
            .iter()
            .map(|(n, _)| (n.clone(), shard.into()))
            .collect();
        shards(&d, map.into());
        let e = err(&d);
        assert!(e.contains(want) && e.contains(shard), "{shard}: {e}");
    }

    // An integer weight is refused; a float one of another dtype is converted and said.
    let q = tensors
        .iter()
        .position(|(n, _)| n.ends_with("0.self_attn.q_proj.weight"));
    let q = q.unwrap();
    for (dtype, want) in [
        (DType::I32, Some("is i32: integer weights are not read")),
        (DType::F64, None),
    ] {
        let d = fresh(dtype.name(), &cfg);
        let mut t = tensors.clone();
        t[q].1 = t[q].1.to_dtype(dtype).unwrap();
        save(&d.join("model.safetensors"), &t);
        match want {
            Some(w) => {
                let e = err(&d);
                assert!(e.contains(w) && e.contains(&t[q].0), "{e}");
            }
            None => {
                let (m, notes) = Llama::from_hf_with_notes(&d, &dev, None).unwrap();
                assert_eq!(m.config.dtype, DType::F32);
                assert_eq!(notes.len(), 1, "{notes:?}");
                assert!(notes[0].contains("1 f64 tensor(s) converted to the model's f32"));
                // Asked for: no note.
                let (_, asked) = Llama::from_hf_with_notes(&d, &dev, Some(DType::F32)).unwrap();
                assert!(asked.is_empty(), "{asked:?}");
            }
        }
    }

    // The same tensor in two shards: refused, not last-wins.
    let d = fresh("twice", &cfg);
    save(&d.join("a.safetensors"), &tensors);
    save(&d.join("b.safetensors"), &tensors[..1]);
    let mut map: serde_json::Map<String, Value> = tensors
        .iter()
        .map(|(n, _)| (n.clone(), "a.safetensors".into()))
        .collect();
    map.insert("extra".into(), "b.safetensors".into());
    shards(&d, map.into());
    let e = err(&d);
    assert!(
        e.contains(&format!("tensor '{}' is in", tensors[0].0)),
        "{e}"
    );

    // FIFOs as a shard or as the config: refused, not read forever.
    let d = fresh("fifo", &cfg);
    let made = std::process::Command::new("mkfifo")
        .arg(d.join("model.safetensors"))
        .status();
    if made.is_ok_and(|s| s.success()) {
        assert!(err(&d).contains("not a regular file"));
        std::fs::remove_file(d.join("config.json")).unwrap();
        std::process::Command::new("mkfifo")
            .arg(d.join("config.json"))
            .status()
            .unwrap();
        assert!(err(&d).contains("not a regular file"));
    }

    // A netcl checkpoint whose json asks for a million layers: an error before the model exists.
    let small = LlamaConfig {
        vocab_size: 32,
        dim: 16,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 2,
        hidden_dim: 32,
        max_seq_len: 8,
        ..LlamaConfig::llama_15m(0)
    };
    // The shapes imports check against are those the model makes (tied or not).
    for tied in [true, false] {
        let c = LlamaConfig {
            tied_embeddings: tied,
            ..small.clone()
        };
        let made = Llama::new(c.clone(), &dev, &mut netcl_ops::Generator::new(1)).unwrap();
        let mut made: Vec<(String, Vec<usize>)> = made
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.shape().to_vec()))
            .collect();
        let mut want = c.parameter_shapes();
        made.sort();
        want.sort();
        assert_eq!(made, want);
    }
    let m = Llama::new(small, &dev, &mut netcl_ops::Generator::new(1)).unwrap();
    let ckpt = base.join("ckpt");
    netcl_nn::save_checkpoint(&ckpt, &m, None, 3, Value::Null).unwrap();
    let (back, meta) = Llama::from_checkpoint(&ckpt, &dev).unwrap();
    assert_eq!((back.config.n_layers, meta.step), (1, 3));
    let json = ckpt.with_extension("json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v["model"]["n_layers"] = 1_000_000.into();
    std::fs::write(&json, v.to_string()).unwrap();
    let started = std::time::Instant::now();
    let e = Llama::from_checkpoint(&ckpt, &dev)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("the config has 1000000 layers"), "{e}");
    assert!(started.elapsed().as_secs() < 10);
    let _ = std::fs::remove_dir_all(&base);
}
