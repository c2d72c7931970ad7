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
use crate::base::acc::arg_acc;
use crate::base::checks::{check_float, u32_arg};
use crate::base::element::HostData;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::check_reach;
use crate::base::layout::KernelLayout;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::ROPE;

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

/// Element offsets of pair `p`'s two elements within a head of `dh` elements (head-dim stride 1).
fn pair_elements(style: RopeStyle, p: usize, dh: usize) -> (usize, usize) {
    match style {
        RopeStyle::Interleaved => (2 * p, 2 * p + 1),
        RopeStyle::Halves => (p, p + dh / 2),
    }
}

/// Host RoPE with the kernel's arithmetic; `x` row-major `[B, T, H, Dh]`, `pos[b * T + t]`.
fn host_rope(
    x: &[f64],
    shape: &[usize],
    style: RopeStyle,
    pos: &[u32],
    freqs: (f64, Option<&[f64]>),
    sign: f64,
    dtype: DType,
) -> Result<HostData> {
    let (theta, table) = freqs;
    let (t_len, heads, dh) = (shape[1], shape[2], shape[3]);
    let half = dh / 2;
    let mut y = vec![0.0f64; x.len()];
    for pair in 0..x.len() / 2 {
        let p = pair % half;
        let bt = pair / (half * heads);
        let pos = pos[bt % pos.len().max(1)];
        let head = (pair / half) * dh;
        let (e0, e1) = pair_elements(style, p, dh);
        let (x0, x1) = (x[head + e0], x[head + e1]);
        let (y0, y1) = if dtype == DType::F64 {
            let freq = table.map_or_else(|| 1.0 / theta.powf((2 * p) as f64 / dh as f64), |t| t[p]);
            let a = pos as f64 * freq;
            let (c, s) = (a.cos(), sign * a.sin());
            (x0 * c - x1 * s, x0 * s + x1 * c)
        } else {
            let freq = table.map_or_else(
                || 1.0f32 / (theta as f32).powf((2 * p) as f32 / dh as f32),
                |t| t[p] as f32,
            );
            let a = pos as f32 * freq;
            let (c, s) = (a.cos(), sign as f32 * a.sin());
            let (x0, x1) = (x0 as f32, x1 as f32);
            ((x0 * c - x1 * s) as f64, (x0 * s + x1 * c) as f64)
        };
        y[head + e0] = y0;
        y[head + e1] = y1;
    }
    let _ = t_len;
    HostData::try_from_fn(dtype, y.len(), |i| y[i])
}

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
        op: &str,
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
        if let Some(x) = self.host_view(&self.shape, &self.strides) {
            let pos: Vec<u32> = match &ids {
                Some(ids) => ids.to_vec::<i32>()?.iter().map(|&p| p as u32).collect(),
                None => (0..self.shape[1])
                    .map(|t| (pos_offset + t) as u32)
                    .collect(),
            };
            let x = x.to_f64();
            let tv = table.as_ref().map(|t| t.to_vec_f64()).transpose()?;
            let f = (theta, tv.as_deref());
            let data = host_rope(&x, &self.shape, style, &pos, f, sign, self.dtype)?;
            return Ok(Tensor::from_host_data(data, &self.shape));
        }
        let out = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let n = self.numel() / 2;
        if n == 0 {
            return Ok(out);
        }
        check_reach(op, &self.shape, &self.strides, self.offset)?;
        let (b, t, h, dh) = (self.shape[0], self.shape[1], self.shape[2], self.shape[3]);
        let pairs = [b, t, h, dh / 2];
        // Pair p starts at element p * step of the head; its partner is `second` elements on.
        let (step, second) = match style {
            RopeStyle::Interleaved => (2, 1),
            RopeStyle::Halves => (1, dh / 2),
        };
        let out_strides = [t * h * dh, h * dh, dh, step];
        let x_strides = [
            self.strides[0],
            self.strides[1],
            self.strides[2],
            self.strides[3] * step,
        ];
        let layout =
            KernelLayout::new(op, &pairs, &[(&out_strides, 0), (&x_strides, self.offset)])?;
        let pos_rows = ids.as_ref().map_or(0, |ids| ids.numel() / t);
        let args = [
            u32_arg(op, "stride", self.strides[3] * second)?,
            u32_arg(op, "stride", second)?,
            u32_arg(op, "size", t)?,
            u32_arg(op, "size", h)?,
            u32_arg(op, "size", dh / 2)?,
            u32_arg(op, "offset", pos_offset)?,
            u32::from(ids.is_some()),
            u32::from(pos_rows > 1),
        ];
        // Without ids the kernel never reads `pos`: any buffer of the device will do.
        let pos_mem = match &ids {
            Some(ids) => ids.mem()?,
            None => out.mem()?,
        };
        let table_mem = match &table {
            Some(t) => t.mem()?,
            None => out.mem()?,
        };
        let program = program_for(&self.device, &ROPE, self.dtype)?;
        launch_1d(&program, "rope", n, |k| {
            k.arg_mem(out.mem()?)?
                .arg_mem(self.mem()?)?
                .arg_mem(pos_mem)?
                .arg_mem(table_mem)?
                .arg(&u32::from(table.is_some()))?;
            for a in &args {
                k.arg(a)?;
            }
            arg_acc(k, self.dtype, theta)?;
            arg_acc(k, self.dtype, sign)?;
            k.arg(&layout)?;
            Ok(())
        })?;
        Ok(out)
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
