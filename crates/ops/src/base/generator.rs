//! Philox stream state shared by the random and dropout families: a seeded generator and the host's words of a draw.
//!
//! Stream convention: key = splitmix64(seed) (as `rand_philox::Philox::from_u64_seed`); element
//! `i` of a draw takes word `i % 4` of counter block `base + i / 4`, and each draw advances the
//! generator by `ceil(n / 4)` blocks.
use rand_philox::{philox4x32_10, splitmix64};

/// A seeded position in a Philox stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generator {
    key: [u32; 2],
    counter: u128,
}

impl Generator {
    pub fn new(seed: u64) -> Generator {
        let k = splitmix64(seed);
        Generator {
            key: [k as u32, (k >> 32) as u32],
            counter: 0,
        }
    }

    /// The next counter block to be used.
    pub fn counter(&self) -> u128 {
        self.counter
    }

    fn take(&mut self, n: usize) -> u128 {
        let base = self.counter;
        self.counter = self.counter.wrapping_add(n.div_ceil(4) as u128);
        base
    }
}

/// The four words of counter block `c` under `key`.
fn block(key: [u32; 2], c: u128) -> [u32; 4] {
    philox4x32_10(
        [
            c as u32,
            (c >> 32) as u32,
            (c >> 64) as u32,
            (c >> 96) as u32,
        ],
        key,
    )
}

impl Generator {
    /// The Philox key (for kernels drawing from this stream).
    pub(crate) fn key_words(&self) -> [u32; 2] {
        self.key
    }

    /// Reserve the counter blocks of a draw of `n` values; returns the first block.
    pub(crate) fn take_blocks(&mut self, n: usize) -> u128 {
        self.take(n)
    }
}

/// The Philox words of a draw starting at counter block `base` under `key` (host side), read
/// by index a block at a time: no buffer of the whole draw.
pub(crate) struct Words {
    key: [u32; 2],
    base: u128,
    /// The block held, as an index into the draw, and its words.
    at: Option<usize>,
    words: [u32; 4],
}

impl Words {
    pub(crate) fn new(key: [u32; 2], base: u128) -> Words {
        Words {
            key,
            base,
            at: None,
            words: [0; 4],
        }
    }

    /// Word `i` of the draw.
    pub(crate) fn get(&mut self, i: usize) -> u32 {
        let j = i / 4;
        if self.at != Some(j) {
            self.words = block(self.key, self.base.wrapping_add(j as u128));
            self.at = Some(j);
        }
        self.words[i % 4]
    }
}
