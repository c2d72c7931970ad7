//! Generation: prefill of the prompts in one pass, then one token per step through the KV cache; greedy, temperature, top-k and top-p sampling with a seed.
use super::cache::KvCache;
use super::decode_graph::DecodeGraph;
use super::model::Llama;
use netcl_autograd::Tape;
use netcl_ops::{Error, Result, RopePositions, Tensor};

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The most likely token (ties: the lowest id).
    Greedy,
    /// softmax(logits / temperature), restricted to the `top_k` most likely tokens (0: all) and
    /// to the smallest set whose probability reaches `top_p` (1.0: all), then drawn.
    Random {
        temperature: f64,
        top_k: usize,
        top_p: f64,
    },
}

/// A [`Sampling`] rule with its own seeded random stream (SplitMix64): the same seed gives the
/// same tokens on every run and device.
pub struct Sampler {
    pub sampling: Sampling,
    state: u64,
    /// Ids at or past this are never chosen (a model whose embedding has rows past its
    /// tokenizer's vocabulary); None: every id of the model.
    allowed: Option<usize>,
}

impl Sampler {
    pub fn new(sampling: Sampling, seed: u64) -> Result<Sampler> {
        if let Sampling::Random {
            temperature, top_p, ..
        } = sampling
        {
            let valid = temperature.is_finite() && temperature > 0.0 && top_p > 0.0 && top_p <= 1.0;
            if !valid {
                return Err(Error::invalid(
                    "Sampler",
                    format!("temperature {temperature} must be > 0 and top_p {top_p} in (0, 1]"),
                ));
            }
        }
        Ok(Sampler {
            sampling,
            state: seed,
            allowed: None,
        })
    }

    /// This sampler choosing among ids below `n` only (`Tokenizer::vocab_size`, where a model
    /// pads its embedding past the tokenizer's vocabulary); an error for `n` = 0.
    pub fn restricted_to(mut self, n: usize) -> Result<Sampler> {
        if n == 0 {
            return Err(Error::invalid(
                "Sampler::restricted_to",
                "no id left to choose from (n = 0)",
            ));
        }
        self.allowed = Some(n);
        Ok(self)
    }

    /// A uniform number in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token for one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let argmax = || {
            let mut best = 0;
            for (i, &l) in logits.iter().enumerate() {
                if l > logits[best] {
                    best = i;
                }
            }
            best as u32
        };
        let Sampling::Random {
            temperature,
            top_k,
            top_p,
        } = self.sampling
        else {
            return argmax();
        };
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if top_k > 0 {
            order.truncate(top_k);
        }
        let Some(&first) = order.first() else {
            return argmax();
        };
        let m = logits[first] as f64;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] as f64 - m) / temperature).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut keep = probs.len();
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= top_p {
                keep = i + 1;
                break;
            }
        }
        let mass: f64 = probs[..keep].iter().sum();
        let mut r = self.uniform() * mass;
        for (i, p) in probs[..keep].iter().enumerate() {
            r -= p;
            if r < 0.0 {
                return order[i] as u32;
            }
        }
        order[keep - 1] as u32
    }
}

/// Additive attention mask [B, 1, 1, T, S] for rows left-padded by `pads`: query `q` (absolute
/// position `start + q`) sees key `j` when `j >= pad` (or `j` is itself, so a padding row still
/// has one finite score); `None` when nothing is padded.
fn pad_mask(pads: &[usize], start: usize, t: usize, model: &Llama) -> Result<Option<Tensor>> {
    if pads.iter().all(|&p| p == 0) {
        return Ok(None);
    }
    let s = start + t;
    let mut m = vec![0f32; pads.len() * t * s];
    for (b, &pad) in pads.iter().enumerate() {
        for q in 0..t {
            for j in 0..s {
                if j < pad && j != start + q {
                    m[(b * t + q) * s + j] = f32::NEG_INFINITY;
                }
            }
        }
    }
    let mask = Tensor::from_vec(m, &[pads.len(), 1, 1, t, s], model.device())?;
    Ok(Some(mask.to_dtype(model.config.dtype)?))
}

/// Generates up to `max_new` tokens after each of `prompts` (run together as one batch, shorter
/// prompts left-padded), calling `on_token(row, token)` as each token is chosen. A row stops at
/// `stop`; generation ends when every row stopped, after `max_new` tokens, or at max_seq_len.
/// Returns the new tokens of each row: empty rows for `max_new` 0 or prompts already at
/// max_seq_len; an empty prompt (or none) is an error.
pub fn generate(
    model: &Llama,
    prompts: &[Vec<u32>],
    max_new: usize,
    sampler: &mut Sampler,
    stop: Option<u32>,
    mut on_token: impl FnMut(usize, u32) -> Result<()>,
) -> Result<Vec<Vec<u32>>> {
    generate_until(model, prompts, max_new, sampler, stop, |r, t| {
        on_token(r, t).map(|_| false)
    })
}

/// [`generate`] where `on_token(row, token)` also says whether that row is finished (a stop
/// string completed, say): the row gets no more tokens and stops counting toward the end.
pub fn generate_until(
    model: &Llama,
    prompts: &[Vec<u32>],
    max_new: usize,
    sampler: &mut Sampler,
    stop: Option<u32>,
    mut on_token: impl FnMut(usize, u32) -> Result<bool>,
) -> Result<Vec<Vec<u32>>> {
    let cfg = &model.config;
    let op = "generate";
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if prompts.is_empty() {
        return Err(Error::invalid(op, "no prompt given"));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(Error::invalid(
            op,
            format!("prompt {i} has no tokens; every prompt needs at least one token"),
        ));
    }
    if longest > cfg.max_seq_len {
        return Err(Error::invalid(
            op,
            format!(
                "a prompt of {longest} tokens is longer than max_seq_len {}",
                cfg.max_seq_len
            ),
        ));
    }
    if let Some(&bad) = prompts
        .iter()
        .flatten()
        .find(|&&t| t as usize >= cfg.vocab_size)
    {
        return Err(Error::invalid(
            op,
            format!(
                "token {bad} is outside the vocabulary of {}",
                cfg.vocab_size
            ),
        ));
    }
    let (b, dev) = (prompts.len(), model.device());
    let pads: Vec<usize> = prompts.iter().map(|p| longest - p.len()).collect();
    let mut ids = Vec::with_capacity(b * longest);
    let mut pos = Vec::with_capacity(b * longest);
    for (p, &pad) in prompts.iter().zip(&pads) {
        ids.extend(std::iter::repeat_n(0, pad).chain(p.iter().map(|&t| t as i32)));
        pos.extend((0..longest).map(|t| t.saturating_sub(pad) as i32));
    }
    let cache = KvCache::new(cfg, b, dev)?;
    let tape = Tape::no_grad();
    let steps = max_new.min(cfg.max_seq_len - longest);
    let mut out = vec![Vec::new(); b];
    let mut done = vec![false; b];
    // After the prefill, one token per row goes through `Llama::decode` (one decode_block a layer)
    // where the model allows it. Greedy picks on the device and the next step is queued before
    // the picked ids are read back, so the device never waits for the host between tokens.
    let fast = model.decode_supported();
    let pad_ids = pads
        .iter()
        .any(|&p| p > 0)
        .then(|| Tensor::from_vec(pads.iter().map(|&p| p as i32).collect(), &[b], dev))
        .transpose()?;
    // On an OpenCL device the first decode step is captured and the later ones replay it
    // (`DecodeGraph`); `Config::decode_replay` off (NETCL_DECODE_REPLAY=0) runs every step
    // eagerly (for comparison).
    let replay = fast && dev.is_opencl() && netcl_ops::Config::get().decode_replay;
    let mut graph: Option<DecodeGraph> = None;
    // The last position's logits [B, vocab] after `input` ([B, T] ids on the device). A replayed
    // step's logits live in the graph's output, which the next step overwrites: everything that
    // reads them is queued (or done) before the next call.
    let mut logits_after = |input: &Tensor, first: bool| -> Result<Tensor> {
        if !first && fast {
            let ids = input.reshape(&[b])?;
            return match (&mut graph, replay) {
                (Some(g), _) => g.step(&ids, &cache),
                (None, true) => {
                    let (g, logits) = model.capture_decode(&ids, &cache, pad_ids.as_ref())?;
                    graph = Some(g);
                    Ok(logits)
                }
                (None, false) => model.decode(&ids, &cache, pad_ids.as_ref()),
            };
        }
        let t = input.shape()[1];
        let mask = pad_mask(&pads, cache.len(), t, model)?;
        let at = match first {
            true => Tensor::from_vec(pos.clone(), &[b, t], dev)?,
            false => {
                let p = pads.iter().map(|&pad| (cache.len() - pad) as i32).collect();
                Tensor::from_vec(p, &[b, 1], dev)?
            }
        };
        let at = RopePositions::Ids(at);
        let logits = model.logits(&tape, input, Some(&at), Some(&cache), mask.as_ref())?;
        let v = logits.value();
        v.narrow(1, t - 1, 1)?.reshape(&[b, cfg.vocab_size])
    };
    let mut last = logits_after(&Tensor::from_vec(ids, &[b, longest], dev)?, true)?;
    // The logits the sampler may choose among: the first `allowed` ids where it is restricted.
    let allowed = sampler
        .allowed
        .map_or(cfg.vocab_size, |n| n.min(cfg.vocab_size));
    for step in 0..steps {
        let more = step + 1 < steps;
        if allowed < cfg.vocab_size {
            last = last.narrow(1, 0, allowed)?;
        }
        // The tokens, the same ids on the device (greedy), and the next logits when queued.
        let (next, picked, queued) = match sampler.sampling {
            Sampling::Greedy => {
                let picked = last.argmax(&[1], false)?.reshape(&[b, 1])?;
                let read = picked.read_async()?;
                let queued = (more && fast)
                    .then(|| logits_after(&picked, false))
                    .transpose()?;
                (read.wait::<i32>()?, Some(picked), queued)
            }
            Sampling::Random { .. } => {
                let rows = last.to_dtype(netcl_ops::DType::F32)?.to_vec::<f32>()?;
                let v = allowed;
                let next = (0..b)
                    .map(|r| sampler.sample(&rows[r * v..(r + 1) * v]) as i32)
                    .collect();
                (next, None, None)
            }
        };
        for (r, &tok) in next.iter().enumerate() {
            if !done[r] {
                out[r].push(tok as u32);
                let finished = on_token(r, tok as u32)?;
                done[r] = finished || stop == Some(tok as u32);
            }
        }
        if done.iter().all(|&d| d) || !more {
            break;
        }
        last = match (queued, picked) {
            (Some(logits), _) => logits,
            (None, Some(ids)) => logits_after(&ids, false)?,
            (None, None) => logits_after(&Tensor::from_vec(next, &[b, 1], dev)?, false)?,
        };
    }
    Ok(out)
}

/// Stop strings for [`generate_until`]: a row is finished once the text of its new tokens
/// contains one of them (checked over a window of the latest tokens, as long in tokens as the
/// longest stop string is in bytes, plus a few for pieces that decode to nothing).
pub struct StopStrings {
    stops: Vec<String>,
    rows: Vec<Vec<u32>>,
}

impl StopStrings {
    /// `stops` (empty ones are ignored) for a batch of `rows`.
    pub fn new(stops: Vec<String>, rows: usize) -> StopStrings {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            rows: vec![Vec::new(); rows],
        }
    }

    /// Records `token` as `row`'s next; whether the row's text now holds a stop string.
    /// `decode` turns ids into text (a tokenizer's decode).
    pub fn push(
        &mut self,
        row: usize,
        token: u32,
        decode: impl Fn(&[u32]) -> Result<String>,
    ) -> Result<bool> {
        let Some(ids) = self.rows.get_mut(row) else {
            return Err(Error::invalid(
                "StopStrings::push",
                format!("row {row} of a batch of {}", self.rows.len()),
            ));
        };
        ids.push(token);
        if self.stops.is_empty() {
            return Ok(false);
        }
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let window = &ids[ids.len().saturating_sub(longest + 4)..];
        let text = decode(window)?;
        Ok(self.stops.iter().any(|s| text.contains(s.as_str())))
    }

    /// `text` up to the first stop string it holds (all of it when it holds none).
    pub fn trim<'a>(&self, text: &'a str) -> &'a str {
        let cut = self
            .stops
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min();
        &text[..cut.unwrap_or(text.len())]
    }
}

#[cfg(test)]
mod stop_tests {
    use super::*;

    #[test]
    fn stop_strings_across_tokens() -> Result<()> {
        // Token i decodes to the i-th piece.
        let pieces = ["Hel", "lo", " wor", "ld", "\n\n", "Q:", ""];
        let decode = |ids: &[u32]| -> Result<String> {
            Ok(ids.iter().map(|&i| pieces[i as usize]).collect())
        };
        let mut s = StopStrings::new(vec!["\nQ:".into(), String::new()], 2);
        let seq = [0u32, 1, 2, 3, 6, 6, 6, 6, 6, 4, 5];
        let hits: Vec<bool> = seq
            .iter()
            .map(|&t| s.push(0, t, decode))
            .collect::<Result<_>>()?;
        assert_eq!(hits.iter().position(|&h| h), Some(10));
        assert!(!s.push(1, 5, decode)?, "rows are apart");
        assert_eq!(s.trim("Hello world\n\nQ: more"), "Hello world\n");
        assert_eq!(s.trim("no stop"), "no stop");
        assert!(s.push(2, 0, decode).is_err());
        Ok(())
    }
}
