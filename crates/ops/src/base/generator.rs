//! Philox stream state shared by the random and dropout families: a seeded generator and the host's words of a draw.
//!
//! Stream convention: key = splitmix64(seed) (as `rand_philox::Philox::from_u64_seed`); element
//! `i` of a draw takes word `i % 4` of counter block `base + i / 4`, and each draw advances the
//! generator by `ceil(n / 4)` blocks.
//!
//! Draws can be logged and replayed (`record_draws`, `replay_draws`): activation checkpointing
//! recomputes a function in backward with the very masks its forward drew.
use netcl_core_devices::{Error, Result};
use rand_philox::{philox4x32_10, splitmix64};
use std::cell::RefCell;
use std::collections::VecDeque;

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
    /// Reserve a draw of `n` values: its key and first counter block. Inside
    /// [`replay_draws`] the draw is the next logged one and the generator does not move; inside
    /// [`record_draws`] it is also logged.
    pub(crate) fn draw(&mut self, n: usize) -> Result<([u32; 2], u128)> {
        let blocks = n.div_ceil(4) as u128;
        DRAWS.with(|d| {
            let mut frames = d.borrow_mut();
            // The innermost replay supplies the draw; recordings above it log it.
            let replay = frames.iter().rposition(|f| matches!(f, Frame::Replay(_)));
            let draw = match replay {
                Some(i) => {
                    let Frame::Replay(q) = &mut frames[i] else {
                        unreachable!("rposition found a replay frame")
                    };
                    match q.pop_front() {
                        Some(d) if d.blocks == blocks => d,
                        got => return Err(replay_mismatch(blocks, got.as_ref())),
                    }
                }
                None => Draw {
                    key: self.key,
                    base: self.take(n),
                    blocks,
                },
            };
            let above = replay.map_or(0, |i| i + 1);
            for f in &mut frames[above..] {
                if let Frame::Record(log) = f {
                    log.push(draw.clone());
                }
            }
            Ok((draw.key, draw.base))
        })
    }
}

/// One draw: the stream's key, its first counter block and its length in blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Draw {
    key: [u32; 2],
    base: u128,
    blocks: u128,
}

/// The random draws a function made, in order (see [`record_draws`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrawLog(Vec<Draw>);

impl DrawLog {
    /// Number of draws logged.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// No draw was logged.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

enum Frame {
    Record(Vec<Draw>),
    Replay(VecDeque<Draw>),
}

thread_local! {
    static DRAWS: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// Pops this thread's innermost frame when a region ends, also on early return or panic.
struct PopFrame;

impl Drop for PopFrame {
    fn drop(&mut self) {
        DRAWS.with(|d| d.borrow_mut().pop());
    }
}

fn replay_mismatch(blocks: u128, got: Option<&Draw>) -> Error {
    Error::invalid(
        "replay_draws",
        match got {
            Some(d) => format!(
                "a random draw of {blocks} counter blocks where the recorded run drew {}: the \
                 replayed function must make the same draws in the same order",
                d.blocks
            ),
            None => format!(
                "a random draw of {blocks} counter blocks after the recorded run's last draw: \
                 the replayed function must make the same draws in the same order"
            ),
        },
    )
}

/// Runs `f` on this thread and returns with its result the random draws it made (dropout
/// masks, `Tensor::rand`...), from any generator, in order. The generators advance as usual.
pub fn record_draws<R>(f: impl FnOnce() -> R) -> (R, DrawLog) {
    DRAWS.with(|d| d.borrow_mut().push(Frame::Record(Vec::new())));
    let guard = PopFrame;
    let r = f();
    let log = DRAWS.with(|d| match d.borrow_mut().last_mut() {
        Some(Frame::Record(log)) => std::mem::take(log),
        _ => Vec::new(),
    });
    drop(guard);
    (r, DrawLog(log))
}

/// Runs `f` with its random draws taken from `log` instead of the generators (which do not
/// advance): the same masks as the run that recorded it, bit for bit. `f` must draw what was
/// logged, in order: a draw of another size, one more than logged, or one fewer is an error.
pub fn replay_draws<R>(log: &DrawLog, f: impl FnOnce() -> Result<R>) -> Result<R> {
    DRAWS.with(|d| {
        d.borrow_mut()
            .push(Frame::Replay(log.0.iter().cloned().collect()))
    });
    let guard = PopFrame;
    let r = f()?;
    let left = DRAWS.with(|d| match d.borrow().last() {
        Some(Frame::Replay(q)) => q.len(),
        _ => 0,
    });
    drop(guard);
    if left > 0 {
        return Err(Error::invalid(
            "replay_draws",
            format!(
                "the replayed function made {} of the {} recorded random draws",
                log.len() - left,
                log.len()
            ),
        ));
    }
    Ok(r)
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
