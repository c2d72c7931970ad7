//! Rotary position embeddings (RoPE) as in Llama / llama2.c, and their backward.
//!
//! Layout: `x` is `[B, T, H, Dh]` (batch, time, heads, head dim; Llama's `xq.view(B, T, H, Dh)`),
//! any strides. Pairing: interleaved, elements `(2i, 2i + 1)` of the head dim form pair `i`
//! (llama2.c and Meta's complex view; not the half-split pairing of Hugging Face). Position of
//! time step `t` is `pos_offset + t`, the angle `a = pos / theta^(2i / Dh)` computed in the
//! accumulator type (f32 for f32/f16/bf16, f64 for f64), and
//! `y[2i] = x[2i] cos a - x[2i+1] sin a`, `y[2i+1] = x[2i] sin a + x[2i+1] cos a`.
//! The backward is the inverse rotation (the transpose): `rope_backward(g)` rotates by `-a`.
use crate::checks::{check_float, u32_arg};
use crate::create::arg_acc;
use crate::element::HostData;
use crate::launch::{launch_1d, program_for};
use crate::layout::check_reach;
use crate::layout::KernelLayout;
use crate::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::ROPE;

/// Host RoPE with the kernel's arithmetic; `x` row-major `[B, T, H, Dh]`.
fn host_rope(
    x: &[f64],
    shape: &[usize],
    pos0: usize,
    theta: f64,
    sign: f64,
    dtype: DType,
) -> HostData {
    let (t_len, heads, dh) = (shape[1], shape[2], shape[3]);
    let half = dh / 2;
    let mut y = vec![0.0f64; x.len()];
    for pair in 0..x.len() / 2 {
        let p = pair % half;
        let t = (pair / (half * heads)) % t_len;
        let pos = (pos0 + t) as u32;
        let (x0, x1) = (x[2 * pair], x[2 * pair + 1]);
        let (y0, y1) = if dtype == DType::F64 {
            let freq = 1.0 / theta.powf((2 * p) as f64 / dh as f64);
            let a = pos as f64 * freq;
            let (c, s) = (a.cos(), sign * a.sin());
            (x0 * c - x1 * s, x0 * s + x1 * c)
        } else {
            let freq = 1.0f32 / (theta as f32).powf((2 * p) as f32 / dh as f32);
            let a = pos as f32 * freq;
            let (c, s) = (a.cos(), sign as f32 * a.sin());
            let (x0, x1) = (x0 as f32, x1 as f32);
            ((x0 * c - x1 * s) as f64, (x0 * s + x1 * c) as f64)
        };
        y[2 * pair] = y0;
        y[2 * pair + 1] = y1;
    }
    HostData::from_fn(dtype, y.len(), |i| y[i])
}

impl Tensor {
    /// Rotary position embedding of `x: [B, T, H, Dh]` (even `Dh`, float dtype) for positions
    /// `pos_offset + t`, with frequency base `theta` (Llama: 10000). See the module docs for the
    /// layout and pairing. Contiguous result; one kernel.
    pub fn rope(&self, pos_offset: usize, theta: f64) -> Result<Tensor> {
        self.rope_impl("rope", pos_offset, theta, 1.0)
    }

    /// The backward of [`Tensor::rope`]: the gradient w.r.t. its input given `self`, the gradient
    /// w.r.t. its output (the inverse rotation). One kernel.
    pub fn rope_backward(&self, pos_offset: usize, theta: f64) -> Result<Tensor> {
        self.rope_impl("rope_backward", pos_offset, theta, -1.0)
    }

    fn rope_impl(&self, op: &str, pos_offset: usize, theta: f64, sign: f64) -> Result<Tensor> {
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
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::invalid(
                op,
                format!(
                    "theta {theta} must be finite and positive (shape {:?})",
                    self.shape
                ),
            ));
        }
        let last_pos = pos_offset.checked_add(self.shape[1]);
        if last_pos.is_none_or(|p| p > u32::MAX as usize) {
            return Err(Error::invalid(
                op,
                format!(
                    "positions {pos_offset}.. of shape {:?} exceed 32 bits",
                    self.shape
                ),
            ));
        }
        if let Some(x) = self.host_view(&self.shape, &self.strides) {
            let data = host_rope(
                &x.to_f64(),
                &self.shape,
                pos_offset,
                theta,
                sign,
                self.dtype,
            );
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
        let out_strides = [t * h * dh, h * dh, dh, 2];
        let x_strides = [
            self.strides[0],
            self.strides[1],
            self.strides[2],
            self.strides[3] * 2,
        ];
        let layout =
            KernelLayout::new(op, &pairs, &[(&out_strides, 0), (&x_strides, self.offset)])?;
        let args = [
            u32_arg(op, "stride", self.strides[3])?,
            u32_arg(op, "size", t)?,
            u32_arg(op, "size", h)?,
            u32_arg(op, "size", dh / 2)?,
            u32_arg(op, "offset", pos_offset)?,
        ];
        let program = program_for(&self.device, &ROPE, self.dtype)?;
        launch_1d(&program, "rope", n, |k| {
            k.arg_mem(out.mem()?)?.arg_mem(self.mem()?)?;
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
}
