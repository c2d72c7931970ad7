//! Fine-tune a Hugging Face model (Llama, Qwen2, Mistral or GPT-2) on a text file: import (config.json, safetensors, tokenizer.json), full or LoRA fine-tuning with AdamW, a generation before and after, export of the (merged) model in its family's layout that transformers loads.
//!
//! `cargo run --release --example hf_finetune -- --model DIR [--data PATH] [--lora RANK] [--steps N] [--out DIR]`
//! (`--example llama_finetune`, its former name, runs the same.)
//! Flags: --model DIR (a LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM or GPT2LMHeadModel
//! directory with tokenizer.json), --data PATH (text file or folder; default the fortunes corpus,
//! else the shipped text), --lora RANK (LoRA with alpha = 2 * rank; without it every weight
//! trains), --lora-targets LIST (q,v; or any of q,k,v,o,gate,up,down, all-linear, or the family's
//! module names: q_proj,...,down_proj; GPT-2's c_attn,c_proj,c_fc), --steps N (100), --batch N
//! (8), --context N (128), --lr X (1e-4 full,
//! 1e-3 LoRA), --prompt TEXT, --out DIR (runs/finetune), --device SPEC (the best device),
//! --precision f32|bf16|f16 (f32; bf16/f16 run the products under autocast, f16 with loss
//! scaling; full fine-tuning keeps f32 master weights, LoRA keeps the frozen base in that
//! dtype and its adapters and their AdamW state in f32), --checkpoint K (0; recompute every
//! K-th block in backward). The last line is `final train_loss=X.XXXX`.
use netcl::data::encode_documents;
use netcl::nn::LoraConfig;
use netcl::prelude::*;
use std::path::PathBuf;
use std::time::Instant;

#[allow(dead_code)] // llama_finetune.rs calls main_named; the test calls run
fn main() {
    main_named("hf_finetune")
}

/// The whole program under the name `program` (for its messages).
pub fn main_named(program: &str) {
    if let Err(e) = netcl::devices::utf8_args(program).and_then(run) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn sample(model: &Llama, tok: &Tokenizer, prompt: &str) -> Result<String> {
    let ids = tok.encode(prompt)?;
    // Ids past the tokenizer's vocabulary (a padded embedding) are never chosen.
    let mut s = Sampler::new(Sampling::Greedy, 0)?.restricted_to(tok.vocab_size())?;
    let out = generate(
        model,
        std::slice::from_ref(&ids),
        32,
        &mut s,
        tok.eos_id(),
        |_, _| Ok(()),
    )?;
    Ok(format!("{prompt}{}", tok.decode(&out[0])?))
}

/// The whole run with command-line `args` (without the program name).
pub fn run(args: Vec<String>) -> Result<()> {
    let (mut model_dir, mut data, mut out) = (None, None, PathBuf::from("runs/finetune"));
    let (mut lora, mut steps, mut batch, mut context, mut lr) =
        (None, 100usize, 8usize, 128usize, None);
    let mut prompt = "What's Oxygen?".to_string();
    let (mut targets, mut device, mut precision, mut checkpoint) =
        ("q,v".to_string(), None, Precision::F32, 0usize);
    let mut it = args.into_iter();
    let bad = |f: &str, v: &str| Error::invalid("hf_finetune", format!("{f} {v:?} is not valid"));
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| bad(&flag, "<missing>"))?;
        let n = || v.parse::<usize>().map_err(|_| bad(&flag, &v));
        match flag.as_str() {
            "--model" => model_dir = Some(PathBuf::from(&v)),
            "--data" => data = Some(PathBuf::from(&v)),
            "--out" => out = PathBuf::from(&v),
            "--lora" => lora = Some(n()?),
            "--steps" => steps = n()?,
            "--batch" => batch = n()?,
            "--context" => context = n()?,
            "--lr" => lr = Some(v.parse::<f64>().map_err(|_| bad(&flag, &v))?),
            "--prompt" => prompt = v.clone(),
            "--lora-targets" => targets = v.clone(),
            "--device" => device = Some(Device::parse(&v)?),
            "--precision" => precision = Precision::parse(&v)?,
            "--checkpoint" => checkpoint = n()?,
            _ => {
                return Err(Error::invalid(
                    "hf_finetune",
                    format!("unknown flag {flag}"),
                ))
            }
        }
    }
    let model_dir =
        model_dir.ok_or_else(|| Error::invalid("hf_finetune", "--model DIR is required"))?;
    let dev = match device {
        Some(d) => d,
        None => Device::best()?,
    };
    println!("device: {dev} ({})", dev.info().name);
    // Full fine-tuning updates f32 master weights; LoRA's frozen base is stored in the
    // precision's dtype (bf16 halves its memory), its adapters in f32.
    let base = if lora.is_some() {
        precision.dtype()
    } else {
        DType::F32
    };
    let mut model = Llama::from_hf(&model_dir, &dev, Some(base))?.with_checkpointing(checkpoint);
    let tokenizer = Tokenizer::from_file(model_dir.join("tokenizer.json"))?;
    let context = context.min(model.config.max_seq_len);
    let corpus = TextCorpus::load(data.as_deref())?;
    let split = corpus.split(10)?;
    let tokens = encode_documents(&tokenizer, &split.train)?;
    println!(
        "model: {} ({:?}), {} parameters from {}; data: {} ({} train tokens)",
        model.config.arch.family.names().1,
        model.config.arch,
        model.num_parameters(),
        model_dir.display(),
        corpus.source,
        tokens.len()
    );
    println!(
        "before: {}",
        sample(&model, &tokenizer, &prompt)?.replace('\n', " ")
    );

    let lr = match lora {
        Some(rank) => {
            let cfg = LoraConfig {
                rank,
                alpha: 2.0 * rank as f64,
                dropout: 0.05,
                targets: targets.split(',').map(|t| t.trim().to_string()).collect(),
            };
            model.add_lora(&cfg, &mut Generator::new(1))?;
            lr.unwrap_or(1e-3)
        }
        None => lr.unwrap_or(1e-4),
    };
    let trainable = model.trainable_parameters();
    let n_train: usize = trainable.iter().map(|p| p.numel()).sum();
    println!(
        "training {n_train} parameters ({}, precision {precision}, base {base})",
        if lora.is_some() { "LoRA" } else { "full" }
    );
    let mut opt = AdamW::new(trainable, lr).weight_decay(0.0);
    // f16 scales the loss so that small gradients do not flush to zero.
    let mut scaler = precision.scaler();
    let mut batches = TokenBatcher::new(tokens, batch, context, 7, &dev)?;
    let start = Instant::now();
    let mut last = f64::NAN;
    for step in 1..=steps {
        let b = batches.next_batch()?;
        let tape = Tape::new();
        let loss = precision.forward(|| model.loss(&tape, &b.inputs, &b.targets))?;
        match &mut scaler {
            Some(s) => {
                tape.backward(&s.scale(&loss)?)?;
                // Skipped (and the scale halved) when a gradient overflowed.
                s.step(&mut opt)?;
            }
            None => {
                tape.backward(&loss)?;
                opt.step()?;
            }
        }
        opt.zero_grad();
        if step % 10 == 0 || step == steps {
            last = loss.item()?;
            println!(
                "step {step}/{steps} loss {last:.4} ({:.1}s)",
                start.elapsed().as_secs_f64()
            );
        }
    }
    model.eval();
    println!(
        "after: {}",
        sample(&model, &tokenizer, &prompt)?.replace('\n', " ")
    );
    std::fs::create_dir_all(&out).map_err(|e| Error::io(out.display().to_string(), e))?;
    if lora.is_some() {
        model.save_lora(out.join("adapters.safetensors"))?;
        model.merge_lora()?;
    }
    model.save_hf(&out)?;
    tokenizer.save(out.join("tokenizer.json"))?;
    println!(
        "saved {} (transformers' {}.from_pretrained loads it)",
        out.display(),
        model.config.arch.family.names().1
    );
    println!("final train_loss={last:.4}");
    Ok(())
}
