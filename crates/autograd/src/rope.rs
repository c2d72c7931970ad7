//! Backward rule of the rotary position embedding (the inverse rotation).
use crate::tape::{record, Var};
use netcl_ops::{Result, RopeFreqs, RopePositions, RopeStyle};

impl Var {
    /// Rotary position embedding of x: (B, T, H, Dh) for positions `pos_offset + t`, interleaved pairs.
    #[track_caller]
    pub fn rope(&self, pos_offset: usize, theta: f64) -> Result<Var> {
        self.rope_with(
            RopeStyle::Interleaved,
            RopePositions::Offset(pos_offset),
            theta,
        )
    }

    /// Rotary position embedding in either pairing `style`, at `positions` (see `Tensor::rope_with`).
    #[track_caller]
    pub fn rope_with(&self, style: RopeStyle, positions: RopePositions, theta: f64) -> Result<Var> {
        self.rope_with_freqs(style, positions, RopeFreqs::Theta(theta))
    }

    /// Rotary position embedding with the pair frequencies `freqs` (see `Tensor::rope_with_freqs`).
    #[track_caller]
    pub fn rope_with_freqs(
        &self,
        style: RopeStyle,
        positions: RopePositions,
        freqs: RopeFreqs,
    ) -> Result<Var> {
        let y = self.value().rope_with_freqs(style, &positions, &freqs)?;
        record("rope", &[self], y, move |g, _| {
            Ok(vec![Some(
                g.rope_backward_with_freqs(style, &positions, &freqs)?,
            )])
        })
    }
}
