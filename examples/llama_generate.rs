//! Generate text with a trained Llama: prefill of the prompt in one pass, then one token per step through the device KV cache, streamed to stdout.
//!
//! `cargo run --release --example llama_generate -- -p "What's Oxygen?" -n 32`
//! Flags: -p TEXT (repeat for a batch of prompts), -n N (new tokens, 32), --checkpoint DIR
//! (runs/llama: its checkpoint and tokenizer.json, as llama_train writes them), --temperature X
//! (0.8; 0 is greedy), --top-k N (40; 0 is all), --top-p X (0.95), --seed N (1), --stop TEXT
//! (repeatable: a row ends at the first stop string, which is not printed; rows also end at the
//! tokenizer's end-of-text). `-n 0` prints the prompts alone; an empty prompt is an error.
use netcl::prelude::*;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let (mut prompts, mut n, mut dir) = (Vec::new(), 32usize, PathBuf::from("runs/llama"));
    let (mut temperature, mut top_k, mut top_p, mut seed) = (0.8f64, 40usize, 0.95f64, 1u64);
    let mut stops = Vec::new();
    let mut it = netcl::devices::utf8_args("llama_generate")?.into_iter();
    let bad =
        |f: &str, v: &str| Error::invalid("llama_generate", format!("{f} {v:?} is not valid"));
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| bad(&flag, "<missing>"))?;
        match flag.as_str() {
            "-p" | "--prompt" => prompts.push(v),
            "-n" => n = v.parse().map_err(|_| bad(&flag, &v))?,
            "--checkpoint" => dir = v.into(),
            "--temperature" => temperature = v.parse().map_err(|_| bad(&flag, &v))?,
            "--top-k" => top_k = v.parse().map_err(|_| bad(&flag, &v))?,
            "--top-p" => top_p = v.parse().map_err(|_| bad(&flag, &v))?,
            "--seed" => seed = v.parse().map_err(|_| bad(&flag, &v))?,
            "--stop" => stops.push(v),
            _ => {
                return Err(Error::invalid(
                    "llama_generate",
                    format!("unknown flag {flag}"),
                ))
            }
        }
    }
    if prompts.is_empty() {
        prompts.push("What's Oxygen?".into());
    }
    let dev = Device::best()?;
    let ckpt = dir.join("checkpoint");
    // The config is checked against the checkpoint's tensors before the model is built.
    let (model, meta) = Llama::from_checkpoint(&ckpt, &dev)?;
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
        "{dev}: {} parameters, step {}",
        model.num_parameters(),
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
    Ok(())
}
