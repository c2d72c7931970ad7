//! Text pipeline end to end: load a corpus (argument, else fortunes, else the shipped text), train a byte-level BPE, report the bigram baseline and token-batch traffic.
//!
//! `cargo run -p netcl-data --example text_baseline -- [PATH] [VOCAB]`
use netcl_data::{
    bigram_baseline, encode_documents, utf8_bytes, TextCorpus, TokenBatcher, Tokenizer, ENDOFTEXT,
};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> netcl_ops::Result<()> {
    let mut args = netcl_core_devices::utf8_args("text_baseline")?.into_iter();
    let path = args.next().map(PathBuf::from);
    let vocab = match args.next() {
        Some(v) => v
            .parse()
            .map_err(|_| netcl_ops::Error::invalid("text_baseline", format!("vocab {v:?}")))?,
        None => 4096,
    };
    let t0 = Instant::now();
    let corpus = TextCorpus::load(path.as_deref())?;
    let split = corpus.split(10)?;
    println!(
        "{}: {} documents, {} bytes ({} train / {} validation documents)",
        corpus.source,
        corpus.len(),
        corpus.bytes(),
        split.train.len(),
        split.val.len()
    );
    let tok = Tokenizer::train_bpe(&split.train, vocab, &[ENDOFTEXT])?;
    let t1 = Instant::now();
    let train = encode_documents(&tok, &split.train)?;
    let val = encode_documents(&tok, &split.val)?;
    let val_bytes = utf8_bytes(&split.val);
    println!(
        "BPE vocab {} (corpus read and BPE trained in {:.2?}); encoded in {:.2?}: {} train / {} validation tokens ({:.2} bytes per token)",
        tok.vocab_size(),
        t1 - t0,
        t1.elapsed(),
        train.len(),
        val.len(),
        val_bytes as f64 / val.len() as f64
    );
    for k in [0.01, 0.1, 1.0] {
        let r = bigram_baseline(&train, &val, tok.vocab_size(), k, val_bytes)?;
        println!(
            "bigram add-{k}: {:.4} nats/token, {:.4} bits/byte",
            r.loss, r.bits_per_byte
        );
    }
    let device = netcl_ops::Device::best()?;
    let mut batcher = TokenBatcher::new(train, 32, 128, 0, &device)?;
    for _ in 0..20 {
        batcher.next_batch()?;
    }
    let s = batcher.stats();
    println!(
        "{device}: {} batches of [32, 128], {} bytes host->device per batch, {} host syncs in all",
        s.batches,
        s.h2d_bytes / s.batches,
        s.host_syncs
    );
    Ok(())
}
