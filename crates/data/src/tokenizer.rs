//! Byte-level BPE tokenizer (GPT-2 style) on HuggingFace's `tokenizers` crate: train, load/save tokenizer.json, encode, decode; long texts in bounded pieces.
use crate::bpe_words::WORD_BUDGET;
use netcl_core_devices::files::read_regular;
use netcl_core_devices::{Error, Result};
use std::path::Path;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

/// The end-of-text token GPT-2 uses; [`Tokenizer::train_bpe`] callers usually pass it as a special token.
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// A tokenizer.json tokenizer, in practice a byte-level BPE one: every UTF-8 string encodes (no
/// unknown token: the 256 byte symbols are in the vocabulary) and decodes back to itself.
///
/// Trained ones split text with GPT-2's regex (`ByteLevel` pre-tokenizer, no prefix space),
/// map bytes to printable symbols, and learn merges with `tokenizers`' BPE trainer, which is
/// deterministic for a fixed input. Files from elsewhere (`from_file`) keep their own pipeline.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: Option<u32>,
    /// Largest id + 1.
    vocab: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokenizer(vocab {}, eos {:?})",
            self.vocab_size(),
            self.eos
        )
    }
}

fn tk_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::format(what, e.to_string())
}

/// The most bytes of text encoded, or trained on, as one piece: `tokenizers` holds per token
/// many times the text's bytes (and BPE works per word), so longer texts go through in pieces.
pub const TEXT_CHUNK: usize = 1 << 16;

/// The length of the first piece of `text` (at most `max` bytes, at least one character): cut
/// where a non-whitespace character meets whitespace, which byte-level pre-tokenization never
/// joins into one token, so the pieces' tokens are the whole text's; with `lines`, after a line
/// break instead. A stretch of `max` bytes without such a place is cut at a character boundary.
fn cut(text: &str, max: usize, lines: bool) -> usize {
    if text.len() <= max {
        return text.len();
    }
    let mut limit = max;
    while !text.is_char_boundary(limit) {
        limit -= 1;
    }
    let head = &text[..limit];
    let at = if lines {
        head.rfind('\n').map(|i| i + 1)
    } else {
        head.char_indices().rev().find_map(|(i, c)| {
            let before = head[..i].chars().next_back();
            (c.is_whitespace() && before.is_some_and(|b| !b.is_whitespace())).then_some(i)
        })
    };
    match at {
        Some(i) if i > 0 => i,
        _ if limit > 0 => limit,
        _ => text.chars().next().map_or(text.len(), char::len_utf8),
    }
}

/// `text` in pieces of at most `max` bytes (see [`cut`]).
pub(crate) fn pieces(text: &str, max: usize, lines: bool) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (piece, after) = rest.split_at(cut(rest, max, lines));
        rest = after;
        Some(piece)
    })
}

/// The first of these tokens in the vocabulary is the end-of-sequence token.
const EOS_CANDIDATES: [&str; 4] = [ENDOFTEXT, "</s>", "<eos>", "<|end_of_text|>"];

impl Tokenizer {
    fn wrap(inner: tokenizers::Tokenizer) -> Tokenizer {
        let eos = EOS_CANDIDATES.iter().find_map(|t| inner.token_to_id(t));
        let vocab = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        Tokenizer { inner, eos, vocab }
    }

    /// Train a byte-level BPE of `vocab_size` tokens (256 byte symbols + `special` tokens + merges)
    /// on `texts`. The first special token is the end-of-sequence token ([`Self::eos_id`]) unless
    /// one of `<|endoftext|>`, `</s>`, `<eos>` is among them. Special tokens get the first ids.
    pub fn train_bpe<S: AsRef<str> + Sync>(
        texts: &[S],
        vocab_size: usize,
        special: &[&str],
    ) -> Result<Tokenizer> {
        let op = "Tokenizer::train_bpe";
        let min = 256 + special.len();
        if vocab_size < min {
            return Err(Error::invalid(
                op,
                format!(
                    "vocab_size {vocab_size} is below the {min} tokens of the byte alphabet and {} special tokens",
                    special.len()
                ),
            ));
        }
        if vocab_size > u32::MAX as usize {
            return Err(Error::invalid(
                op,
                format!("vocab_size {vocab_size} too big"),
            ));
        }
        if let Some(s) = special.iter().find(|s| s.is_empty()) {
            return Err(Error::invalid(op, format!("empty special token {s:?}")));
        }
        let byte_level = ByteLevel::new(false, false, true);
        let trainer = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .min_frequency(0)
            .special_tokens(
                special
                    .iter()
                    .map(|s| AddedToken::from(s.to_string(), true))
                    .collect(),
            )
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        // The words counted here in bounded memory, then merged as `tokenizers` trains.
        let (counts, dropped) = crate::bpe_words::word_counts(&byte_level, texts, WORD_BUDGET)?;
        if dropped > 0 {
            eprintln!(
                "netcl: BPE training dropped {dropped} rare words to keep its word counts \
                 within {WORD_BUDGET} bytes"
            );
        }
        let mut model = BPE::default();
        let added = trainer
            .do_train(&counts, &mut model)
            .map_err(|e| tk_err("BPE training", e))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        inner
            .with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(byte_level));
        inner
            .add_special_tokens(added)
            .map_err(|e| tk_err("BPE training", e))?;
        let mut tok = Tokenizer::wrap(inner);
        if tok.eos.is_none() {
            tok.eos = special.first().and_then(|s| tok.inner.token_to_id(s));
        }
        Ok(tok)
    }

    /// Train on the contents of `files` (read as UTF-8, invalid bytes replaced); see [`Self::train_bpe`].
    pub fn train_bpe_files<P: AsRef<Path>>(
        files: &[P],
        vocab_size: usize,
        special: &[&str],
    ) -> Result<Tokenizer> {
        let mut budget = crate::text_corpus::corpus_limit()?;
        let texts = files
            .iter()
            .map(|p| {
                let p = p.as_ref();
                let b = read_regular(p, budget, "NETCL_CORPUS_LIMIT")?;
                budget -= b.len() as u64;
                Ok(String::from_utf8_lossy(&b).into_owned())
            })
            .collect::<Result<Vec<String>>>()?;
        Tokenizer::train_bpe(&texts, vocab_size, special)
    }

    /// Load a tokenizer.json (the file `save` writes, or a HuggingFace model's).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let bytes = read_regular(path, 1 << 30, "a tokenizer file")?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| tk_err(&format!("tokenizer file {what}"), e))?;
        Ok(Tokenizer::wrap(inner))
    }

    /// Write the tokenizer as tokenizer.json (pretty-printed).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let json = self
            .inner
            .to_string(true)
            .map_err(|e| tk_err(&format!("tokenizer file {what}"), e))?;
        std::fs::write(path, json).map_err(|e| Error::io(what, e))
    }

    /// Token ids of `text` (special tokens written in the text, e.g. `<|endoftext|>`, become their id).
    /// Texts over [`TEXT_CHUNK`] bytes are encoded in pieces (memory stays bounded by a piece):
    /// for byte-level BPE without a normalizer (netcl's own) the ids are those of the whole
    /// text, except inside a run of [`TEXT_CHUNK`] bytes without whitespace; other tokenizers
    /// are cut after line breaks, where tokens may differ from a one-piece encoding.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with_progress(text, |_, _| {})
    }

    /// [`Self::encode`], calling `progress(bytes done, bytes in all)` after each piece.
    pub fn encode_with_progress(
        &self,
        text: &str,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut done = 0;
        for piece in pieces(text, TEXT_CHUNK, !self.exact_pieces()) {
            let enc = self
                .inner
                .encode_fast(piece, false)
                .map_err(|e| tk_err("Tokenizer::encode", e))?;
            ids.extend_from_slice(enc.get_ids());
            done += piece.len();
            progress(done, text.len());
        }
        Ok(ids)
    }

    /// Whether cutting between a non-whitespace and a whitespace character leaves the tokens
    /// unchanged: byte-level pre-tokenization with GPT-2's regex, no prefix space, no normalizer.
    fn exact_pieces(&self) -> bool {
        use tokenizers::PreTokenizerWrapper;
        self.inner.get_normalizer().is_none()
            && matches!(
                self.inner.get_pre_tokenizer(),
                Some(PreTokenizerWrapper::ByteLevel(b)) if !b.add_prefix_space && b.use_regex
            )
    }

    /// The text of `ids` (special tokens included). Ids that end inside a multi-byte character
    /// decode to U+FFFD. Ids without a token (a model's embedding padded past the tokenizer's
    /// vocabulary, as Qwen2.5's 151,936 rows for 151,665 tokens) are skipped, as Hugging Face's
    /// tokenizers do; `unknown_ids` counts them.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let v = self.vocab_size();
        let known: Vec<u32> = ids.iter().copied().filter(|&i| (i as usize) < v).collect();
        self.inner
            .decode(&known, false)
            .map_err(|e| tk_err("Tokenizer::decode", e))
    }

    /// How many of `ids` have no token (`decode` skips them).
    pub fn unknown_ids(&self, ids: &[u32]) -> usize {
        ids.iter()
            .filter(|&&i| i as usize >= self.vocab_size())
            .count()
    }

    /// Largest id + 1, special tokens included: the embedding table's row count.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The end-of-sequence token id, if the vocabulary has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The id of `token` (a vocabulary entry as stored, e.g. `Ġthe` for " the" in byte-level BPE).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The underlying `tokenizers` tokenizer, for everything this wrapper does not expose.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
