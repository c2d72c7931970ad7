//! The word counts BPE training merges over, counted in bounded memory: text in pieces, and when the distinct words outgrow a budget (binary data, where every word is new) the rarest are dropped.
use crate::tokenizer::TEXT_CHUNK;
use ahash::AHashMap;
use compact_str::CompactString;
use netcl_core_devices::{Error, Result};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

/// Bytes of distinct words (their text plus a map entry's overhead) counted at most: training
/// holds about a hundred bytes per such byte, so this bounds it to some hundreds of MiB.
pub const WORD_BUDGET: usize = 4 << 20;

/// A map entry's bytes besides its word's text.
const ENTRY: usize = 48;

/// The words of `texts` (GPT-2's byte-level pre-tokenization, as `tokenizers` trains) with their
/// counts, and how many times words were dropped to stay within `budget`: each time the
/// distinct words pass it, those seen at most k times go (k = 1, 2, ... until half the budget
/// is left), so frequent words, the ones BPE merges, are kept.
pub(crate) fn word_counts<S: AsRef<str>>(
    pre: &ByteLevel,
    texts: &[S],
    budget: usize,
) -> Result<(AHashMap<CompactString, u64>, usize)> {
    let mut counts: AHashMap<CompactString, u64> = AHashMap::new();
    let (mut volume, mut dropped) = (0usize, 0usize);
    for text in texts {
        for piece in crate::tokenizer::pieces(text.as_ref(), TEXT_CHUNK, false) {
            let mut split = PreTokenizedString::from(piece);
            pre.pre_tokenize(&mut split)
                .map_err(|e| Error::format("BPE training", e.to_string()))?;
            for (word, _, _) in split.get_splits(OffsetReferential::Original, OffsetType::Byte) {
                let n = counts.entry(CompactString::from(word)).or_insert_with(|| {
                    volume += word.len() + ENTRY;
                    0
                });
                *n += 1;
            }
            if volume > budget {
                let before = counts.len();
                let mut k = 1;
                while volume > budget / 2 && !counts.is_empty() {
                    counts.retain(|_, n| *n > k);
                    volume = counts.keys().map(|w| w.len() + ENTRY).sum();
                    k += 1;
                }
                dropped += before - counts.len();
            }
        }
    }
    Ok((counts, dropped))
}
