//! Rotary position embeddings (RoPE) in both conventions (llama2.c's interleaved pairs, Hugging Face's split halves), and their backward.
//!
//! Layout: `x` is `[B, T, H, Dh]` (batch, time, heads, head dim; Llama's `xq.view(B, T, H, Dh)`),
//! any strides. Pair `i < Dh/2` is elements `(2i, 2i + 1)` with [`RopeStyle::Interleaved`]
//! (llama2.c, Meta's complex view) or `(i, i + Dh/2)` with [`RopeStyle::Halves`] (Hugging Face's
//! `rotate_half`). The position of time step `t` in batch row `b` is `offset + t`
//! ([`RopePositions::Offset`]) or `ids[t]` / `ids[b, t]` ([`RopePositions::Ids`]: an I32 tensor
//! `[T]` or `[B, T]` on x's device). The angle `a = pos / theta^(2i / Dh)` is computed in the
//! accumulator type (f32 for f32/f16/bf16, f64 for f64), and with the pair `(x0, x1)`:
//! `y0 = x0 cos a - x1 sin a`, `y1 = x0 sin a + x1 cos a`.
//! The backward is the inverse rotation (the transpose): `rope_backward` rotates by `-a`.
mod opencl;
mod reference;
use crate::base::checks::check_float;
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

pub use crate::base::rope_types::{RopeFreqs, RopePositions, RopeStyle};

/// A checked RoPE (`sign` 1) or its backward (`sign` -1, op `rope_backward`) of `x` [B, T, H, Dh]:
/// positions `pos_offset + t`, or the contiguous I32 `ids` [T] / [B, T]; frequencies from the
/// base `theta`, or the contiguous `table` [Dh/2] (theta 1). A new contiguous tensor of x's shape.
#[derive(Clone, Debug)]
struct Rope {
    op: &'static str,
    x: Tensor,
    style: RopeStyle,
    pos_offset: usize,
    ids: Option<Tensor>,
    theta: f64,
    table: Option<Tensor>,
    sign: f64,
}

impl_op!(Rope, Tensor, "rope", rope, |d| d.op);

impl Tensor {
    /// Rotary position embedding of `x: [B, T, H, Dh]` (even `Dh`, float dtype) for positions
    /// `pos_offset + t`, interleaved pairs, with frequency base `theta` (Llama: 10000). See the
    /// module docs; [`Tensor::rope_with`] takes the other convention and position ids. One kernel.
    pub fn rope(&self, pos_offset: usize, theta: f64) -> Result<Tensor> {
        self.rope_with(
            RopeStyle::Interleaved,
            &RopePositions::Offset(pos_offset),
            theta,
        )
    }

    /// The backward of [`Tensor::rope`]: the gradient w.r.t. its input given `self`, the gradient
    /// w.r.t. its output (the inverse rotation). One kernel.
    pub fn rope_backward(&self, pos_offset: usize, theta: f64) -> Result<Tensor> {
        self.rope_backward_with(
            RopeStyle::Interleaved,
            &RopePositions::Offset(pos_offset),
            theta,
        )
    }

    /// Rotary position embedding in either pairing `style`, at `positions`. One kernel.
    pub fn rope_with(
        &self,
        style: RopeStyle,
        positions: &RopePositions,
        theta: f64,
    ) -> Result<Tensor> {
        self.rope_with_freqs(style, positions, &RopeFreqs::Theta(theta))
    }

    /// The backward of [`Tensor::rope_with`] (the inverse rotation of the gradient `self`).
    pub fn rope_backward_with(
        &self,
        style: RopeStyle,
        positions: &RopePositions,
        theta: f64,
    ) -> Result<Tensor> {
        self.rope_backward_with_freqs(style, positions, &RopeFreqs::Theta(theta))
    }

    /// Rotary position embedding with the pair frequencies `freqs` (a base or a table). One kernel.
    pub fn rope_with_freqs(
        &self,
        style: RopeStyle,
        positions: &RopePositions,
        freqs: &RopeFreqs,
    ) -> Result<Tensor> {
        self.rope_impl("rope", style, positions, freqs, 1.0)
    }

    /// The backward of [`Tensor::rope_with_freqs`].
    pub fn rope_backward_with_freqs(
        &self,
        style: RopeStyle,
        positions: &RopePositions,
        freqs: &RopeFreqs,
    ) -> Result<Tensor> {
        self.rope_impl("rope_backward", style, positions, freqs, -1.0)
    }

    fn rope_impl(
        &self,
        op: &'static str,
        style: RopeStyle,
        positions: &RopePositions,
        freqs: &RopeFreqs,
        sign: f64,
    ) -> Result<Tensor> {
        if self.ndim() != 4 || !self.shape[3].is_multiple_of(2) {
            return Err(Error::shape(
                op,
                format!(
                    "x must be [B, T, H, Dh] with an even Dh, got {:?}",
                    self.shape
                ),
            ));
        }
        check_float(op, self, "input")?;
        let (theta, table) = self.rope_table(op, freqs)?;
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::invalid(
                op,
                format!(
                    "theta {theta} must be finite and positive (shape {:?})",
                    self.shape
                ),
            ));
        }
        let (pos_offset, ids) = self.rope_positions(op, positions)?;
        let desc = Rope {
            op,
            x: self.clone(),
            style,
            pos_offset,
            ids,
            theta,
            table,
            sign,
        };
        dispatch(&self.device, &desc)
    }

    /// The base (1 with a table) and the checked contiguous frequency table, if any.
    fn rope_table(&self, op: &str, freqs: &RopeFreqs) -> Result<(f64, Option<Tensor>)> {
        match freqs {
            RopeFreqs::Theta(t) => Ok((*t, None)),
            RopeFreqs::Table(t) => {
                let acc = crate::base::acc::acc_dtype(self.dtype);
                let half = self.shape[3] / 2;
                if t.shape() != [half] || t.dtype() != acc || t.device() != self.device() {
                    return Err(Error::shape(
                        op,
                        format!(
                            "frequency table is {} {:?} on {}; x {:?} needs {acc} [{half}] on {}",
                            t.dtype(),
                            t.shape(),
                            t.device(),
                            self.shape,
                            self.device()
                        ),
                    ));
                }
                Ok((1.0, Some(t.contiguous()?)))
            }
        }
    }

    /// The offset, or the checked contiguous I32 ids `[T]` / `[B, T]` on this tensor's device.
    fn rope_positions(
        &self,
        op: &str,
        positions: &RopePositions,
    ) -> Result<(usize, Option<Tensor>)> {
        let (b, t) = (self.shape[0], self.shape[1]);
        match positions {
            RopePositions::Offset(o) => {
                if o.checked_add(t).is_none_or(|p| p > u32::MAX as usize) {
                    return Err(Error::invalid(
                        op,
                        format!("positions {o}.. of shape {:?} exceed 32 bits", self.shape),
                    ));
                }
                Ok((*o, None))
            }
            RopePositions::Ids(ids) => {
                if ids.dtype() != DType::I32 {
                    return Err(Error::dtype(
                        op,
                        format!("position ids are {}; they must be i32", ids.dtype()),
                    ));
                }
                if ids.shape() != [t] && ids.shape() != [b, t] {
                    return Err(Error::shape(
                        op,
                        format!(
                            "position ids {:?} must be [T] or [B, T] for x {:?}",
                            ids.shape(),
                            self.shape
                        ),
                    ));
                }
                if ids.device() != self.device() {
                    return Err(Error::device(
                        op,
                        format!(
                            "position ids are on {}, x on {}",
                            ids.device(),
                            self.device()
                        ),
                    ));
                }
                Ok((0, Some(ids.contiguous()?)))
            }
        }
    }
}
