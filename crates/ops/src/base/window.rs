//! 2-D sliding windows shared by conv and pooling: validated geometry over NCHW, tap arithmetic for the host paths, and `Window2` of kernels/common.cl.
use crate::base::checks::u32_arg;
use crate::base::fastdiv::Div;
use crate::base::layout::check_reach;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};
use rayon::prelude::*;

/// `View4` of kernels/common.cl: a strided 4-D operand of the conv and pooling kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct View4 {
    shape: [u32; 4],
    stride: [u32; 4],
    offset: u32,
}

impl View4 {
    /// The view of a 4-D tensor, checked to fit the kernels' 32-bit indices.
    pub(crate) fn of(op: &str, t: &Tensor) -> Result<View4> {
        check_reach(op, &t.shape, &t.strides, t.offset)?;
        let mut v = View4 {
            shape: [0; 4],
            stride: [0; 4],
            offset: u32_arg(op, "offset", t.offset)?,
        };
        for d in 0..4 {
            v.shape[d] = u32_arg(op, "size", t.shape[d])?;
            v.stride[d] = u32_arg(op, "stride", t.strides[d])?;
        }
        Ok(v)
    }
}

/// A window sliding over the (H, W) planes of N images of C channels, giving (Ho, Wo) planes.
/// Pairs are (height, width).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub ho: usize,
    pub wo: usize,
}

/// `Window2` of kernels/common.cl: per axis (0 height, 1 width) kernel, stride, padding,
/// dilation and output extents.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window2 {
    k: [u32; 2],
    s: [u32; 2],
    p: [u32; 2],
    d: [u32; 2],
    out: [u32; 2],
    sd: [Div; 2],
}

/// Output extent of a sliding window: error when the dilated kernel exceeds the padded input.
fn window_out(
    op: &str,
    what: &str,
    size: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dil: usize,
) -> Result<usize> {
    let eff = dil * (k - 1) + 1;
    if size + 2 * pad < eff {
        return Err(Error::shape(
            op,
            format!(
                "{what}: kernel {k} (dilation {dil}, extent {eff}) is larger than the padded input {size} + 2 * {pad}"
            ),
        ));
    }
    Ok((size + 2 * pad - eff) / stride + 1)
}

impl Window {
    /// The window over input `x_shape` (N, C, H, W); kernel, stride and dilation must be
    /// positive and the dilated kernel must fit the padded input. Errors name `op` and `what`
    /// (the operands).
    pub fn new(
        op: &str,
        what: &str,
        x_shape: &[usize],
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
    ) -> Result<Window> {
        let pairs = [
            ("kernel", kernel),
            ("stride", stride),
            ("dilation", dilation),
        ];
        if let Some((name, v)) = pairs.iter().find(|(_, v)| v.0 == 0 || v.1 == 0) {
            return Err(Error::invalid(
                op,
                format!("{name} {v:?} must be positive ({what})"),
            ));
        }
        let out = |a: usize, k: usize, s: usize, p: usize, d: usize| {
            window_out(op, what, x_shape[a], k, s, p, d)
        };
        Ok(Window {
            n: x_shape[0],
            c: x_shape[1],
            h: x_shape[2],
            w: x_shape[3],
            ho: out(2, kernel.0, stride.0, padding.0, dilation.0)?,
            wo: out(3, kernel.1, stride.1, padding.1, dilation.1)?,
            kernel,
            stride,
            padding,
            dilation,
        })
    }

    /// Pooling's `ceil_mode`: output extents `ceil((size + 2p - extent) / s) + 1`, less one when
    /// the last window would start beyond the input and its left padding (PyTorch's rule).
    pub fn round_up(&mut self) {
        let up = |size: usize, k: usize, s: usize, p: usize, d: usize| {
            let span = size + 2 * p - (d * (k - 1) + 1);
            let out = span.div_ceil(s) + 1;
            if (out - 1) * s >= size + p {
                out - 1
            } else {
                out
            }
        };
        self.ho = up(
            self.h,
            self.kernel.0,
            self.stride.0,
            self.padding.0,
            self.dilation.0,
        );
        self.wo = up(
            self.w,
            self.kernel.1,
            self.stride.1,
            self.padding.1,
            self.dilation.1,
        );
    }

    pub fn in_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }

    /// The output shape with `channels` channels.
    pub fn out_shape(&self, channels: usize) -> [usize; 4] {
        [self.n, channels, self.ho, self.wo]
    }

    fn axis(&self, a: usize) -> (usize, usize, usize, usize, usize) {
        match a {
            0 => (
                self.h,
                self.stride.0,
                self.padding.0,
                self.dilation.0,
                self.ho,
            ),
            _ => (
                self.w,
                self.stride.1,
                self.padding.1,
                self.dilation.1,
                self.wo,
            ),
        }
    }

    /// The input index along axis `a` (0 rows, 1 columns) of tap `k` of output `o`, if it lies
    /// inside the input (not in the padding).
    pub fn tap_in(&self, a: usize, o: usize, k: usize) -> Option<usize> {
        let (size, s, p, d, _) = self.axis(a);
        (o * s + k * d).checked_sub(p).filter(|&x| x < size)
    }

    /// The output index along axis `a` whose window puts tap `k` on input `x`, if any.
    pub fn tap_out(&self, a: usize, x: usize, k: usize) -> Option<usize> {
        let (_, s, p, d, out) = self.axis(a);
        (x + p)
            .checked_sub(k * d)
            .filter(|t| t.is_multiple_of(s) && t / s < out)
            .map(|t| t / s)
    }

    /// Whether the windows tile the input exactly (kernel = stride, no padding or dilation, out *
    /// stride = in): every input pixel lies in one window.
    pub fn tiles_input(&self) -> bool {
        self.kernel == self.stride
            && self.padding == (0, 0)
            && self.dilation == (1, 1)
            && self.ho * self.stride.0 == self.h
            && self.wo * self.stride.1 == self.w
    }

    /// [`covering`](Self::covering) of every input pixel of a plane, at `h * w_extent + w`:
    /// computed once for all planes of a host pass.
    pub fn coverings(&self) -> Vec<Vec<(usize, usize, usize, usize)>> {
        (0..self.h * self.w)
            .map(|p| self.covering(p / self.w, p % self.w))
            .collect()
    }

    /// The taps (ki, kj, oh, ow) whose window puts them on input (h, w), ki then kj ascending.
    pub fn covering(&self, h: usize, w: usize) -> Vec<(usize, usize, usize, usize)> {
        let mut v = Vec::new();
        for ki in 0..self.kernel.0 {
            let Some(oh) = self.tap_out(0, h, ki) else {
                continue;
            };
            for kj in 0..self.kernel.1 {
                if let Some(ow) = self.tap_out(1, w, kj) {
                    v.push((ki, kj, oh, ow));
                }
            }
        }
        v
    }

    /// Host paths: `f(plane, oh, ow)` for every output pixel in row-major order, plane being
    /// b * C + c (planes on all cores; each value is computed alone, so the result is the same).
    pub fn per_output<T: Send + Copy + Default>(
        &self,
        f: impl Fn(usize, usize, usize) -> T + Sync,
    ) -> Vec<T> {
        per_pixel(self.n * self.c, (self.ho, self.wo), f)
    }

    /// Host paths: `f(plane, h, w)` for every input pixel in row-major order (planes on all
    /// cores).
    pub fn per_input<T: Send + Copy + Default>(
        &self,
        f: impl Fn(usize, usize, usize) -> T + Sync,
    ) -> Vec<T> {
        per_pixel(self.n * self.c, (self.h, self.w), f)
    }

    /// Row-major index of output pixel (oh, ow) of `plane`.
    pub fn out_at(&self, plane: usize, oh: usize, ow: usize) -> usize {
        (plane * self.ho + oh) * self.wo + ow
    }

    /// Host paths: the sum of input rows `hs..he`, columns `ws..we` of `plane` in `x` (row-major
    /// input values), rows then columns ascending.
    pub fn plane_sum(
        &self,
        x: &[f64],
        plane: usize,
        (hs, he): (usize, usize),
        (ws, we): (usize, usize),
    ) -> f64 {
        let base = plane * self.h * self.w;
        (hs..he)
            .flat_map(|h| (ws..we).map(move |w| base + h * self.w + w))
            .map(|i| x[i])
            .sum()
    }

    /// The kernels' `Window2`, checked to fit 32 bits.
    pub fn cl(&self, op: &str) -> Result<Window2> {
        let pair = |what: &str, v: (usize, usize)| -> Result<[u32; 2]> {
            Ok([u32_arg(op, what, v.0)?, u32_arg(op, what, v.1)?])
        };
        let s = pair("stride", self.stride)?;
        Ok(Window2 {
            k: pair("kernel", self.kernel)?,
            s,
            sd: [Div::new(s[0]), Div::new(s[1])],
            p: pair("padding", self.padding)?,
            d: pair("dilation", self.dilation)?,
            out: pair("output size", (self.ho, self.wo))?,
        })
    }

    /// Error unless `grad_y` has the output shape with `channels` channels; `what` names the
    /// forward's operands.
    pub fn check_grad_y(
        &self,
        op: &str,
        grad_y: &Tensor,
        channels: usize,
        what: &str,
    ) -> Result<()> {
        let want = self.out_shape(channels);
        if grad_y.shape != want {
            return Err(Error::shape(
                op,
                format!("grad_y {:?} must be {want:?} for {what}", grad_y.shape),
            ));
        }
        Ok(())
    }
}

/// `f(plane, row, col)` over `planes` planes of `rows` x `cols` pixels, row-major, a plane a task.
fn per_pixel<T: Send + Copy + Default>(
    planes: usize,
    (rows, cols): (usize, usize),
    f: impl Fn(usize, usize, usize) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); planes * rows * cols];
    out.par_chunks_mut((rows * cols).max(1))
        .enumerate()
        .for_each(|(p, plane)| {
            for (r, line) in plane.chunks_mut(cols.max(1)).enumerate() {
                for (c, o) in line.iter_mut().enumerate() {
                    *o = f(p, r, c);
                }
            }
        });
    out
}
