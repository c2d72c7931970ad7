//! The vocabulary of rotary position embeddings (pairing style, positions, frequencies), shared by the rope family and the one-token decode kernels; the rope module documents them.
use crate::base::tensor::Tensor;

/// Which elements of the head dim form a rotated pair (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// `(2i, 2i + 1)`: llama2.c and Meta's reference code.
    Interleaved,
    /// `(i, i + Dh/2)`: Hugging Face transformers (`rotate_half`).
    Halves,
}

impl RopeStyle {
    /// `"interleaved"` or `"halves"` (as configs and checkpoints write it).
    pub fn name(self) -> &'static str {
        match self {
            RopeStyle::Interleaved => "interleaved",
            RopeStyle::Halves => "halves",
        }
    }
}

/// The position of each time step (see the module docs).
#[derive(Clone, Debug)]
pub enum RopePositions {
    /// `offset + t` for every batch row (a KV-cache decoder's next positions: `Offset(len)`).
    Offset(usize),
    /// Explicit I32 position ids `[T]` (shared by every batch row) or `[B, T]`.
    Ids(Tensor),
}

/// The rotation frequency of each pair: `theta^(-2i / Dh)`, or a table of Dh/2 inverse
/// frequencies (`[Dh/2]`, in x's accumulator dtype (f32, or f64 for f64 x), on x's device) for
/// scaled RoPE variants such as Llama 3's.
#[derive(Clone, Debug)]
pub enum RopeFreqs {
    Theta(f64),
    Table(Tensor),
}
