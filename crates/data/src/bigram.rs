//! Bigram baseline for language models: add-k smoothed next-token counts on the train stream, validation loss in nats per token and bits per byte.
use netcl_core_devices::{Error, Result};
use std::collections::HashMap;

/// What [`bigram_baseline`] measured on the validation stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BigramReport {
    /// Mean negative log-likelihood per predicted token, in nats.
    pub loss: f64,
    /// Total nats / ln 2 / UTF-8 bytes of the validation text.
    pub bits_per_byte: f64,
    /// Validation tokens predicted (`val.len() - 1`).
    pub predictions: usize,
}

/// Add-k bigram model: `p(b | a) = (count(a, b) + k) / (count(a, ·) + k * vocab)`, counted over
/// consecutive pairs of `train`, evaluated on every consecutive pair of `val` (the first
/// validation token is context only). `val_bytes` is the UTF-8 size of the validation text.
/// A model needs `k > 0`, `vocab` above every id, 2+ tokens in each stream and `val_bytes > 0`.
pub fn bigram_baseline(
    train: &[u32],
    val: &[u32],
    vocab: usize,
    k: f64,
    val_bytes: usize,
) -> Result<BigramReport> {
    let op = "bigram_baseline";
    if !(k > 0.0 && k.is_finite()) {
        return Err(Error::invalid(op, format!("smoothing k = {k} must be > 0")));
    }
    if train.len() < 2 || val.len() < 2 || val_bytes == 0 {
        return Err(Error::invalid(
            op,
            format!(
                "need 2+ train and validation tokens and validation bytes, got {}, {} and {val_bytes}",
                train.len(),
                val.len()
            ),
        ));
    }
    for (name, s) in [("train", train), ("validation", val)] {
        if let Some((pos, id)) = s.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(Error::invalid(
                op,
                format!("{name} token {id} at position {pos} is outside the vocabulary of {vocab}"),
            ));
        }
    }
    let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
    let mut rows = vec![0u64; vocab];
    for w in train.windows(2) {
        *pairs.entry((w[0], w[1])).or_default() += 1;
        rows[w[0] as usize] += 1;
    }
    let kv = k * vocab as f64;
    let nats: f64 = val
        .windows(2)
        .map(|w| {
            let c = pairs.get(&(w[0], w[1])).copied().unwrap_or(0) as f64;
            -((c + k) / (rows[w[0] as usize] as f64 + kv)).ln()
        })
        .sum();
    let predictions = val.len() - 1;
    Ok(BigramReport {
        loss: nats / predictions as f64,
        bits_per_byte: nats / std::f64::consts::LN_2 / val_bytes as f64,
        predictions,
    })
}
