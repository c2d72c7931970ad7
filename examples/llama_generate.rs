//! Generate text with a trained Llama: prefill of the prompt in one pass, then one token per step through the device KV cache, streamed to stdout.
//!
//! `cargo run --release --example llama_generate -- -p "What's Oxygen?" -n 32`
//! Flags: `--help` lists them with their defaults. `-n 0` prints the prompts alone; an empty
//! prompt is an error.
use netcl::cli::{parse, Parser};
use netcl::prelude::*;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let argv = netcl::devices::utf8_args("llama_generate");
    if let Err(e) = argv.and_then(|a| run(a).map(|_| ())) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The generator's command line.
#[derive(Parser)]
#[command(about = "Generate text with a Llama trained by llama_train.")]
struct Args {
    /// A prompt (repeat for a batch of prompts; default "What's Oxygen?").
    #[arg(short = 'p', long = "prompt")]
    prompts: Vec<String>,
    /// New tokens per prompt (0 prints the prompts alone).
    #[arg(short = 'n', default_value_t = 32)]
    n: usize,
    /// The run directory: its checkpoint and tokenizer.json, as llama_train writes them.
    #[arg(long = "checkpoint", default_value = "runs/llama")]
    dir: PathBuf,
    /// Sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: usize,
    /// Sample within the smallest set of this probability.
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f64,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A stop string (repeatable): a row ends at the first, which is not printed; rows also end
    /// at the tokenizer's end-of-text.
    #[arg(long = "stop")]
    stops: Vec<String>,
    /// The weights' dtype while generating: f32, bf16 or f16 (default: the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
}

/// Generates for the command line `argv` (without the program name); the new tokens of each
/// prompt (empty for `--help`).
pub fn run(argv: Vec<String>) -> Result<Vec<Vec<u32>>> {
    let Some(Args {
        mut prompts,
        n,
        dir,
        temperature,
        top_k,
        top_p,
        seed,
        stops,
        dtype,
    }) = parse::<Args>("llama_generate", argv)?
    else {
        return Ok(Vec::new());
    };
    if prompts.is_empty() {
        prompts.push("What's Oxygen?".into());
    }
    let dev = Device::best()?;
    let ckpt = dir.join("checkpoint");
    // The config is checked against the checkpoint's tensors before the model is built.
    let (mut model, meta) = Llama::from_checkpoint(&ckpt, &dev)?;
    if let Some(d) = dtype {
        let d = DType::parse(&d)
            .ok()
            .filter(|d| [DType::F32, DType::BF16, DType::F16].contains(d))
            .ok_or_else(|| {
                Error::invalid(
                    "llama_generate",
                    format!("--dtype {d}: use f32, bf16 or f16"),
                )
            })?;
        model = model.to_dtype(d)?;
    }
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| tokenizer.encode(p))
        .collect::<Result<_>>()?;
    let sampling = if temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::Random {
            temperature,
            top_k,
            top_p,
        }
    };
    // Ids past the tokenizer's vocabulary (a padded embedding) are never chosen.
    let mut sampler = Sampler::new(sampling, seed)?.restricted_to(tokenizer.vocab_size())?;
    eprintln!(
        "{dev}: {} parameters in {}, step {}",
        model.num_parameters(),
        model.config.dtype,
        meta.step
    );
    // With stop strings a row's text is printed once it is cut, not streamed.
    let one = prompts.len() == 1 && stops.is_empty();
    let mut stop = StopStrings::new(stops, prompts.len());
    let decode = |ids: &[u32]| tokenizer.decode(ids);
    if one {
        print!("{}", prompts[0]);
    }
    let start = Instant::now();
    let mut count = 0;
    let out = generate_until(
        &model,
        &ids,
        n,
        &mut sampler,
        tokenizer.eos_id(),
        |row, tok| {
            count += 1;
            if one {
                print!("{}", tokenizer.decode(&[tok])?);
                let _ = std::io::stdout().flush();
            }
            stop.push(row, tok, decode)
        },
    )?;
    let secs = start.elapsed().as_secs_f64();
    println!();
    if !one {
        for (p, o) in prompts.iter().zip(&out) {
            println!("{p}{}", stop.trim(&tokenizer.decode(o)?));
        }
    }
    eprintln!(
        "{count} tokens in {secs:.2}s ({:.1} tokens/s, prefill included)",
        count as f64 / secs
    );
    Ok(out)
}
