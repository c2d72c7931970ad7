//! Convert a Hugging Face directory (Llama, Qwen2, Mistral or GPT-2) through netcl: import (config.json + safetensors) and export it again, printing the logits' checksum for a few tokens (used to check that transformers loads netcl's export).
//!
//! `cargo run --release --example hf_convert -- IN_DIR OUT_DIR [ID ID ...]`
use netcl::cli::{parse, Parser};
use netcl::prelude::*;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The converter's command line.
#[derive(Parser)]
#[command(about = "Import a Hugging Face directory and export it again through netcl.")]
struct Args {
    /// The Hugging Face directory to read.
    input: String,
    /// Where to write the export.
    output: String,
    /// Token ids whose logits' checksum is printed.
    ids: Vec<i32>,
}

fn run() -> Result<()> {
    let argv = netcl::devices::utf8_args("hf_convert")?;
    let Some(Args { input, output, ids }) = parse::<Args>("hf_convert", argv)? else {
        return Ok(());
    };
    let dev = Device::best()?;
    let model = Llama::from_hf(&input, &dev, None)?;
    println!(
        "imported {input}: {} parameters on {dev}",
        model.num_parameters()
    );
    model.save_hf(&output)?;
    println!("exported {output}");
    if !ids.is_empty() {
        let t = Tensor::from_vec(ids.clone(), &[1, ids.len()], &dev)?;
        let logits = model.logits(&Tape::no_grad(), &t, None, None, None)?;
        let v = logits.value().to_vec_f64()?;
        println!("logits sum {:.6} first {:.6}", v.iter().sum::<f64>(), v[0]);
    }
    Ok(())
}
