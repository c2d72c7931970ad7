//! Fine-tune a Hugging Face model (Llama, Qwen2, Mistral or GPT-2) on a text file: import (config.json, safetensors, tokenizer.json), full or LoRA fine-tuning with AdamW, a generation before and after, export of the (merged) model in its family's layout that transformers loads.
//!
//! `cargo run --release --example hf_finetune -- --model DIR [--data PATH] [--lora RANK] [--steps N] [--out DIR]`
//! (`--example llama_finetune`, its former name, runs the same.)
//! Flags: `--help` lists them with their defaults. The last line is `final train_loss=X.XXXX`.
use netcl::cli::{parse, Parser};
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

/// The fine-tuning run's command line.
#[derive(Parser)]
#[command(about = "Fine-tune a Hugging Face Llama, Qwen2, Mistral or GPT-2 on a text file.")]
struct Args {
    /// A LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM or GPT2LMHeadModel directory
    /// with tokenizer.json.
    #[arg(long = "model")]
    model_dir: PathBuf,
    /// Text file or folder (default: the fortunes corpus, else the shipped text).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where the fine-tuned model is written.
    #[arg(long, default_value = "runs/finetune")]
    out: PathBuf,
    /// LoRA of this rank (alpha = 2 x rank); without it every weight trains.
    #[arg(long)]
    lora: Option<usize>,
    /// LoRA targets: q,k,v,o,gate,up,down, all-linear, or the family's module names
    /// (q_proj,...,down_proj; GPT-2's c_attn,c_proj,c_fc).
    #[arg(long = "lora-targets", default_value = "q,v")]
    targets: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Tokens per sequence (at most the model's max_seq_len).
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Learning rate (default 1e-4 full, 1e-3 LoRA).
    #[arg(long)]
    lr: Option<f64>,
    /// The prompt of the generations before and after.
    #[arg(long, default_value = "What's Oxygen?")]
    prompt: String,
    /// Device spec (default: the best device).
    #[arg(long)]
    device: Option<String>,
    /// f32, or bf16/f16 products under autocast (f16 with loss scaling); LoRA keeps the frozen
    /// base in that dtype and its adapters and their state in f32.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Recompute every K-th block in backward instead of keeping its activations (0: none).
    #[arg(long, default_value_t = 0)]
    checkpoint: usize,
}

/// The whole run with command-line `args` (without the program name).
pub fn run(args: Vec<String>) -> Result<()> {
    let Some(Args {
        model_dir,
        data,
        out,
        lora,
        targets,
        steps,
        batch,
        context,
        lr,
        prompt,
        device,
        precision,
        checkpoint,
    }) = parse::<Args>("hf_finetune", args)?
    else {
        return Ok(());
    };
    let device = device.map(|d| Device::parse(&d)).transpose()?;
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
