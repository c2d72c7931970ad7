//! The Llama examples end to end at tiny settings on every device, in bf16 autocast (llama_train also in f16 with loss scaling, with per-block checkpointing, and with a sharded optimizer that resumes): training runs, saves, and what it saved loads back (llama_generate with bf16 weights); hf_finetune (llama_finetune's new name) with LoRA on all linear layers over a bf16 base, and on Qwen2, Mistral and GPT-2 directories.
use netcl::data::ENDOFTEXT;
use netcl::devices::test_devices;
use netcl::distributed::shard_path;
use netcl::models::{Arch, Family, Llama, LlamaConfig};
use netcl::nn::checkpoint::json_path;
use netcl::ops::RopeStyle;
use netcl::prelude::*;
use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "../examples/llama_train.rs"]
mod llama_train;

#[allow(dead_code)]
#[path = "../examples/hf_finetune.rs"]
mod hf_finetune;

#[allow(dead_code)]
#[path = "../examples/llama_generate.rs"]
mod llama_generate;

/// The shipped text (20 KB): small enough to train a tokenizer on in a moment.
fn text() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/assets/text/notes.txt")
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("examples-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// The flags in `fixed` (split at spaces) followed by the pairs in `more` (paths, specs).
fn args(fixed: &str, more: &[(&str, &str)]) -> Vec<String> {
    let tail = more.iter().flat_map(|(f, v)| [*f, *v]);
    fixed
        .split_whitespace()
        .chain(tail)
        .map(String::from)
        .collect()
}

#[test]
fn llama_train_runs_in_bf16_and_f16() {
    let data = text();
    for dev in test_devices().unwrap() {
        let precisions: &[&str] = if dev.is_host() {
            &["bf16", "f16"]
        } else {
            &["bf16"]
        };
        for &precision in precisions {
            let out = scratch(&format!(
                "train-{precision}-{}",
                dev.spec().replace(':', "_")
            ));
            let spec = dev.spec();
            let run = args(
                "--vocab 300 --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --context 16 \
                 --batch 4 --steps 4 --eval-every 2 --checkpoint 1",
                &[
                    ("--data", data.to_str().unwrap()),
                    ("--precision", precision),
                    ("--devices", &spec),
                    ("--out", out.to_str().unwrap()),
                ],
            );
            llama_train::run(run).unwrap_or_else(|e| panic!("{dev} {precision}: {e}"));
            // The saved checkpoint holds the run's validation loss and, for f16, the scaler.
            let meta: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap())
                    .unwrap();
            let extra = &meta["extra"];
            let val = extra["val_loss"].as_f64().unwrap();
            assert!(
                val.is_finite() && val > 0.0,
                "{dev} {precision}: val loss {val}"
            );
            assert_eq!(
                extra["grad_scaler"].is_object(),
                precision == "f16",
                "{dev} {precision}: {extra}"
            );
            if precision == "bf16" && dev.is_host() {
                // The trained f32 weights generate in bf16 (on the best device), greedy.
                let gen = args(
                    "-n 4 --temperature 0 --dtype bf16",
                    &[("--checkpoint", out.to_str().unwrap()), ("-p", "The ")],
                );
                let new = llama_generate::run(gen).unwrap();
                assert_eq!(new.len(), 1);
                assert!(new[0].len() <= 4 && !new[0].is_empty(), "{new:?}");
                let bad = args(
                    "-n 1 --dtype i32",
                    &[("--checkpoint", out.to_str().unwrap())],
                );
                let e = llama_generate::run(bad).unwrap_err().to_string();
                assert!(e.contains("--dtype i32"), "{e}");
            }
        }
    }
}

/// The OpenCL devices the tests run on (at least one: CI requires it).
fn opencl_test_devices() -> Vec<Device> {
    let all = test_devices().unwrap().into_iter();
    all.filter(Device::is_opencl).collect()
}

/// Data parallel under bf16 autocast with bf16 gradient communication: over every OpenCL
/// device (the relay), and over the host beside one (a mix: split by measured speed).
#[test]
fn llama_train_data_parallel_in_bf16() {
    let cl = opencl_test_devices();
    let mut specs = vec![format!("host,{}", cl[0].spec())];
    if cl.len() >= 2 {
        specs.push(cl.iter().map(Device::spec).collect::<Vec<_>>().join(","));
    }
    for devices in specs {
        let out = scratch(&format!("train-ddp-{}", devices.replace([':', ','], "_")));
        let run = args(
            "--vocab 300 --dim 32 --layers 2 --heads 4 --kv-heads 2 --hidden 64 --context 16 \
             --batch 6 --steps 6 --eval-every 3 --precision bf16 --grad-comm bf16",
            &[
                ("--data", text().to_str().unwrap()),
                ("--devices", &devices),
                ("--out", out.to_str().unwrap()),
            ],
        );
        llama_train::run(run).unwrap_or_else(|e| panic!("{devices}: {e}"));
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap()).unwrap();
        let val = meta["extra"]["val_loss"].as_f64().unwrap();
        assert!(val.is_finite() && val > 0.0, "{devices}: val loss {val}");
    }
}

/// ZeRO-1 in llama_train: trains, saves a shard per rank beside the checkpoint, and resumes
/// from them (over every OpenCL device, else the host beside one), then on one device.
#[test]
fn llama_train_shards_adamw_and_resumes() {
    let cl = opencl_test_devices();
    let devices = match cl.len() {
        1 => format!("host,{}", cl[0].spec()),
        _ => cl.iter().map(Device::spec).collect::<Vec<_>>().join(","),
    };
    let out = scratch("train-zero");
    let run_on = |devices: &str, steps: &str, resume: bool| {
        let mut a = args(
            "--vocab 300 --dim 32 --layers 2 --heads 4 --hidden 64 --context 16 --batch 6 \
             --eval-every 3 --zero",
            &[
                ("--data", text().to_str().unwrap()),
                ("--devices", devices),
                ("--out", out.to_str().unwrap()),
                ("--steps", steps),
            ],
        );
        if resume {
            a.push("--resume".into());
        }
        llama_train::run(a).unwrap_or_else(|e| panic!("{devices}: {e}"));
    };
    let run = |steps: &str, resume: bool| run_on(&devices, steps, resume);
    run("6", false);
    let ckpt = out.join("checkpoint");
    let shard = |step| json_path(shard_path(&ckpt, 1, step)).exists();
    assert!(
        shard(6) && !shard(3),
        "{devices}: rank 1 keeps the shard of step 6 only"
    );
    run("9", true);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(meta["step"], 9, "{devices}");
    assert!(shard(9) && !shard(6), "{devices}");
    // One device takes every shard's state.
    run_on(&cl[0].spec(), "11", true);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(meta["step"], 11, "{devices}, then one device");
}

#[test]
fn llama_finetune_trains_lora_over_a_bf16_base() {
    // A Hugging Face directory made here: a tiny model and a tokenizer of the shipped text.
    let corpus = TextCorpus::from_path(text()).unwrap();
    let tok = Tokenizer::train_bpe(corpus.documents(), 300, &[ENDOFTEXT]).unwrap();
    for dev in test_devices().unwrap() {
        let tag = dev.spec().replace(':', "_");
        let model_dir = scratch(&format!("hf-{tag}"));
        let cfg = LlamaConfig {
            rope_style: RopeStyle::Halves,
            max_seq_len: 64,
            ..LlamaConfig::tiny(tok.vocab_size())
        };
        Llama::new(cfg, &dev, &mut Generator::new(3))
            .unwrap()
            .save_hf(&model_dir)
            .unwrap();
        tok.save(model_dir.join("tokenizer.json")).unwrap();
        let out = scratch(&format!("finetune-{tag}"));
        let spec = dev.spec();
        let run = args(
            "--lora 4 --lora-targets all-linear --precision bf16 --checkpoint 1 --steps 3 \
             --batch 2 --context 16",
            &[
                ("--model", model_dir.to_str().unwrap()),
                ("--data", text().to_str().unwrap()),
                ("--device", &spec),
                ("--out", out.to_str().unwrap()),
            ],
        );
        hf_finetune::run(run).unwrap_or_else(|e| panic!("{dev}: {e}"));
        // The adapters were saved in f32 and the merged export keeps the bf16 base.
        let adapters = netcl::nn::load_safetensors(out.join("adapters.safetensors")).unwrap();
        assert_eq!(
            adapters.len(),
            2 * 7 * 2,
            "{dev}: A and B of 7 projections in 2 layers"
        );
        assert!(
            adapters.iter().all(|(_, t)| t.dtype() == DType::F32),
            "{dev}"
        );
        let merged = Llama::from_hf(&out, &dev, None).unwrap();
        assert_eq!(merged.config.dtype, DType::BF16, "{dev}");
    }
}

/// hf_finetune takes a Qwen2 (LoRA by its module names, bf16 base), a Mistral (sliding window,
/// full fine-tuning) and a GPT-2 directory (LoRA on c_attn and c_fc) and exports each in its
/// family's layout.
#[test]
fn hf_finetune_takes_every_family() {
    let corpus = TextCorpus::from_path(text()).unwrap();
    let tok = Tokenizer::train_bpe(corpus.documents(), 300, &[ENDOFTEXT]).unwrap();
    let cases = [
        (
            Family::Qwen2,
            "--lora 2 --lora-targets q_proj,v_proj --precision bf16",
            2 * 2 * 2,
        ),
        (Family::Mistral, "--precision f32", 0),
        (
            Family::Gpt2,
            "--lora 2 --lora-targets c_attn,c_fc --precision bf16",
            2 * 4 * 2,
        ),
    ];
    for dev in test_devices().unwrap() {
        let tag = dev.spec().replace(':', "_");
        for (family, flags, adapters) in cases {
            let mut arch = Arch::of(family);
            if family == Family::Mistral {
                arch.sliding_window = Some(6);
            }
            let cfg = LlamaConfig {
                rope_style: RopeStyle::Halves,
                max_seq_len: 64,
                n_kv_heads: if family == Family::Gpt2 { 4 } else { 2 },
                arch,
                ..LlamaConfig::tiny(tok.vocab_size())
            };
            let model_dir = scratch(&format!("hf-{family:?}-{tag}"));
            Llama::new(cfg, &dev, &mut Generator::new(3))
                .unwrap()
                .save_hf(&model_dir)
                .unwrap();
            tok.save(model_dir.join("tokenizer.json")).unwrap();
            let out = scratch(&format!("finetune-{family:?}-{tag}"));
            let spec = dev.spec();
            let flags = format!("{flags} --steps 2 --batch 2 --context 20");
            let run = args(
                &flags,
                &[
                    ("--model", model_dir.to_str().unwrap()),
                    ("--data", text().to_str().unwrap()),
                    ("--device", &spec),
                    ("--out", out.to_str().unwrap()),
                ],
            );
            hf_finetune::run(run).unwrap_or_else(|e| panic!("{dev} {family:?}: {e}"));
            if adapters > 0 {
                let a = netcl::nn::load_safetensors(out.join("adapters.safetensors")).unwrap();
                assert_eq!(a.len(), adapters, "{dev} {family:?}");
            }
            let merged = Llama::from_hf(&out, &dev, None).unwrap();
            assert_eq!(merged.config.arch.family, family, "{dev}");
        }
    }
}
