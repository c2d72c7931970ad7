//! 2-D pooling over NCHW: max (with PyTorch's flat H*W indices), average, adaptive average, and their gathering, atomic-free backwards.
//!
//! One kernel per op on OpenCL devices (`max_pool2d`, `max_pool2d_backward`, `avg_pool2d`,
//! `avg_pool2d_backward`, `adaptive_avg_pool2d`, `adaptive_avg_pool2d_backward` in
//! kernels/pool.cl). Every input may be a strided view; outputs are contiguous. Backwards are one
//! work-item per input pixel summing, in a fixed order, the output gradients of the windows that
//! cover it: correct for overlapping windows and bit-identical from run to run. `ceil_mode` as
//! PyTorch's (a partial last window; averages divide by its size clipped to the padded input).
use crate::base::checks::{need_i32, same_device, same_float, u32_arg};
use crate::base::element::HostData;
use crate::base::host::host_f64;
use crate::base::launch::{launch_1d, program_for};
use crate::base::tensor::Tensor;
use crate::base::window::{View4, Window, Window2};
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::POOL;
use netcl_kernels::Kernel;

/// Window of a pooling op: (height, width) pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    /// Implicit padding on both sides; at most half the (dilated) kernel extent, as PyTorch.
    pub padding: (usize, usize),
    /// Max pooling only; average pooling needs (1, 1).
    pub dilation: (usize, usize),
    /// Output extents round up instead of down (PyTorch's `ceil_mode`): a last, partial window
    /// is kept when it starts inside the input or its left padding.
    pub ceil_mode: bool,
}

impl Pool2dParams {
    /// `kernel` with stride = kernel, no padding, no dilation (PyTorch's defaults).
    pub fn new(kernel: (usize, usize)) -> Pool2dParams {
        Pool2dParams {
            kernel,
            stride: kernel,
            padding: (0, 0),
            dilation: (1, 1),
            ceil_mode: false,
        }
    }

    /// These parameters with `stride`.
    pub fn stride(self, stride: (usize, usize)) -> Pool2dParams {
        Pool2dParams { stride, ..self }
    }

    /// These parameters with implicit `padding` on both sides.
    pub fn padding(self, padding: (usize, usize)) -> Pool2dParams {
        Pool2dParams { padding, ..self }
    }

    /// These parameters with `dilation` (max pooling only).
    pub fn dilation(self, dilation: (usize, usize)) -> Pool2dParams {
        Pool2dParams { dilation, ..self }
    }

    /// These parameters with output extents rounded up (`true`) or down.
    pub fn ceil_mode(self, ceil_mode: bool) -> Pool2dParams {
        Pool2dParams { ceil_mode, ..self }
    }
}

/// `PoolGeom` of kernels/pool.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolGeom {
    win: Window2,
    h: u32,
    w: u32,
    include_pad: u32,
}

/// A validated pooling window; `include_pad`: averages divide by the padded window size.
#[derive(Clone, Copy, Debug)]
struct Geom {
    win: Window,
    include_pad: bool,
}

impl Geom {
    fn cl(&self, op: &str) -> Result<PoolGeom> {
        Ok(PoolGeom {
            win: self.win.cl(op)?,
            h: u32_arg(op, "height", self.win.h)?,
            w: u32_arg(op, "width", self.win.w)?,
            include_pad: self.include_pad as u32,
        })
    }
    fn out_shape(&self) -> [usize; 4] {
        self.win.out_shape(self.win.c)
    }
    /// Clipped window [hs, he) x [ws, we) of output (oh, ow) and the average's divisor.
    fn avg_window(&self, oh: usize, ow: usize) -> (usize, usize, usize, usize, f64) {
        let g = &self.win;
        let hs = (oh * g.stride.0) as isize - g.padding.0 as isize;
        let ws = (ow * g.stride.1) as isize - g.padding.1 as isize;
        let he = (hs + g.kernel.0 as isize).min((g.h + g.padding.0) as isize);
        let we = (ws + g.kernel.1 as isize).min((g.w + g.padding.1) as isize);
        let pool = (he - hs) * (we - ws);
        let (hs, ws) = (hs.max(0) as usize, ws.max(0) as usize);
        let (he, we) = (
            (he as usize).min(g.h).max(hs),
            (we as usize).min(g.w).max(ws),
        );
        let div = if self.include_pad {
            pool as f64
        } else {
            ((he - hs) * (we - ws)) as f64
        };
        (hs, he, ws, we, div)
    }
    /// Error unless `grad_y` has the output shape.
    fn check_grad_y(&self, op: &str, grad_y: &Tensor) -> Result<()> {
        let what = format!("input {:?}", self.win.in_shape());
        self.win.check_grad_y(op, grad_y, self.win.c, &what)
    }
}

fn need_nchw(op: &str, x_shape: &[usize]) -> Result<()> {
    if x_shape.len() != 4 || x_shape[2] == 0 || x_shape[3] == 0 {
        return Err(Error::shape(
            op,
            format!("input {x_shape:?} must be (N, C, H, W) with H, W > 0"),
        ));
    }
    Ok(())
}

fn geometry(op: &str, x_shape: &[usize], p: Pool2dParams, include_pad: bool) -> Result<Geom> {
    need_nchw(op, x_shape)?;
    let what = format!("input {x_shape:?}, kernel {:?}", p.kernel);
    let mut win = Window::new(
        op, &what, x_shape, p.kernel, p.stride, p.padding, p.dilation,
    )?;
    if p.ceil_mode {
        win.round_up();
    }
    let eff = (
        p.dilation.0 * (p.kernel.0 - 1) + 1,
        p.dilation.1 * (p.kernel.1 - 1) + 1,
    );
    if 2 * p.padding.0 > eff.0 || 2 * p.padding.1 > eff.1 {
        return Err(Error::invalid(
            op,
            format!(
                "padding {:?} exceeds half the kernel extent {eff:?} (input {x_shape:?})",
                p.padding
            ),
        ));
    }
    Ok(Geom { win, include_pad })
}

fn need_no_dilation(op: &str, p: &Pool2dParams) -> Result<()> {
    if p.dilation != (1, 1) {
        return Err(Error::invalid(
            op,
            format!("dilation {:?} is not supported (only (1, 1))", p.dilation),
        ));
    }
    Ok(())
}

/// Launches pooling kernel `name` over `n` work-items with buffers `mems`, views `views` and `g`.
fn launch(
    t: &Tensor,
    name: &str,
    n: usize,
    mems: &[&Tensor],
    views: &[View4],
    g: PoolGeom,
) -> Result<()> {
    let program = program_for(&t.device, &POOL, t.dtype)?;
    launch_1d(&program, name, n, |k: &mut Kernel| {
        for m in mems {
            k.arg_mem(m.mem()?)?;
        }
        for v in views {
            k.arg(v)?;
        }
        k.arg(&g)?;
        Ok(())
    })
}

/// Kernel `op` over a new contiguous tensor of `shape` from `src` (read through its view), one
/// work-item per output element; nothing is launched for an empty output.
fn launch_from(src: &Tensor, op: &str, shape: &[usize], g: &Geom) -> Result<Tensor> {
    let out = Tensor::alloc(shape, src.dtype, &src.device)?;
    if out.numel() > 0 {
        let v = View4::of(op, src)?;
        launch(src, op, out.numel(), &[&out, src], &[v], g.cl(op)?)?;
    }
    Ok(out)
}

fn host_tensor(dtype: DType, v: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_host_data(HostData::from_fn(dtype, v.len(), |i| v[i]), shape)
}

/// Adaptive window [floor(o * size / out), ceil((o + 1) * size / out)).
fn adaptive(o: usize, size: usize, out: usize) -> (usize, usize) {
    (o * size / out, ((o + 1) * size).div_ceil(out))
}

impl Tensor {
    /// Max pooling: (N, C, H, W) -> (values, indices), both (N, C, Ho, Wo); each index is the flat
    /// `h * W + w` of the maximum in its input plane (I32, as PyTorch's). The first maximum wins;
    /// NaN propagates.
    pub fn max_pool2d(&self, params: Pool2dParams) -> Result<(Tensor, Tensor)> {
        let op = "max_pool2d";
        same_float(op, &[self])?;
        let g = geometry(op, &self.shape, params, false)?;
        let out = g.out_shape();
        if self.device.is_host() {
            let xv = host_f64(op, self)?;
            let gw = &g.win;
            // First maximum over the in-range taps (NaN wins and stays), and its index h * W + w.
            let best = gw.per_output(|plane, oh, ow| {
                let mut best: Option<(f64, usize)> = None;
                for ki in 0..gw.kernel.0 {
                    let Some(h) = gw.tap_in(0, oh, ki) else {
                        continue;
                    };
                    for kj in 0..gw.kernel.1 {
                        let Some(w) = gw.tap_in(1, ow, kj) else {
                            continue;
                        };
                        let at = h * gw.w + w;
                        let v = xv[plane * gw.h * gw.w + at];
                        if best.is_none_or(|(b, _)| !b.is_nan() && (v > b || v.is_nan())) {
                            best = Some((v, at));
                        }
                    }
                }
                best
            });
            let y = best
                .iter()
                .map(|b| b.map_or(f64::NEG_INFINITY, |b| b.0))
                .collect();
            let idx = best.iter().map(|b| b.map_or(-1, |b| b.1 as i32)).collect();
            let idx = Tensor::from_host_data(HostData::I32(idx), &out);
            return Ok((host_tensor(self.dtype, y, &out), idx));
        }
        let y = Tensor::alloc(&out, self.dtype, &self.device)?;
        let idx = Tensor::alloc(&out, DType::I32, &self.device)?;
        if y.numel() > 0 {
            let v = View4::of(op, self)?;
            launch(self, op, y.numel(), &[&y, &idx, self], &[v], g.cl(op)?)?;
        }
        Ok((y, idx))
    }

    /// The gradient of `max_pool2d` for an input of `input_shape`: each input pixel gathers the
    /// gradients of the windows covering it whose index names it.
    pub fn max_pool2d_backward(
        grad_y: &Tensor,
        indices: &Tensor,
        input_shape: &[usize],
        params: Pool2dParams,
    ) -> Result<Tensor> {
        let op = "max_pool2d_backward";
        same_float(op, &[grad_y])?;
        same_device(op, grad_y, indices)?;
        need_i32(op, indices)?;
        let g = geometry(op, input_shape, params, false)?;
        g.check_grad_y(op, grad_y)?;
        if indices.shape != grad_y.shape {
            return Err(Error::shape(
                op,
                format!(
                    "indices {:?} must match grad_y {:?}",
                    indices.shape, grad_y.shape
                ),
            ));
        }
        let shape = g.win.in_shape();
        if grad_y.device.is_host() {
            let gy = host_f64(op, grad_y)?;
            let idx = indices.to_vec::<i32>()?;
            let gw = &g.win;
            let dx = gw.per_input(|plane, h, w| {
                let me = (h * gw.w + w) as i32;
                let outs = gw
                    .covering(h, w)
                    .into_iter()
                    .map(|(_, _, oh, ow)| gw.out_at(plane, oh, ow));
                outs.filter(|&o| idx[o] == me).map(|o| gy[o]).sum()
            });
            return Ok(host_tensor(grad_y.dtype, dx, &shape));
        }
        let dx = Tensor::alloc(&shape, grad_y.dtype, &grad_y.device)?;
        if dx.numel() > 0 {
            let (gv, iv) = (View4::of(op, grad_y)?, View4::of(op, indices)?);
            let mems = [&dx, grad_y, indices];
            launch(grad_y, op, dx.numel(), &mems, &[gv, iv], g.cl(op)?)?;
        }
        Ok(dx)
    }

    /// Average pooling (no dilation): the divisor is the window size clipped to the padded
    /// input when `count_include_pad`, else the number of in-range taps (PyTorch's rule).
    pub fn avg_pool2d(&self, params: Pool2dParams, count_include_pad: bool) -> Result<Tensor> {
        let op = "avg_pool2d";
        same_float(op, &[self])?;
        need_no_dilation(op, &params)?;
        let g = geometry(op, &self.shape, params, count_include_pad)?;
        let out = g.out_shape();
        if self.device.is_host() {
            let xv = host_f64(op, self)?;
            let y = g.win.per_output(|plane, oh, ow| {
                let (hs, he, ws, we, div) = g.avg_window(oh, ow);
                g.win.plane_sum(&xv, plane, (hs, he), (ws, we)) / div
            });
            return Ok(host_tensor(self.dtype, y, &out));
        }
        launch_from(self, op, &out, &g)
    }

    /// The gradient of `avg_pool2d` for an input of `input_shape`.
    pub fn avg_pool2d_backward(
        grad_y: &Tensor,
        input_shape: &[usize],
        params: Pool2dParams,
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let op = "avg_pool2d_backward";
        same_float(op, &[grad_y])?;
        need_no_dilation(op, &params)?;
        let g = geometry(op, input_shape, params, count_include_pad)?;
        g.check_grad_y(op, grad_y)?;
        let shape = g.win.in_shape();
        if grad_y.device.is_host() {
            let gy = host_f64(op, grad_y)?;
            let gw = &g.win;
            let dx = gw.per_input(|plane, h, w| {
                let taps = gw.covering(h, w).into_iter();
                taps.map(|(_, _, oh, ow)| gy[gw.out_at(plane, oh, ow)] / g.avg_window(oh, ow).4)
                    .sum()
            });
            return Ok(host_tensor(grad_y.dtype, dx, &shape));
        }
        launch_from(grad_y, op, &shape, &g)
    }

    /// Adaptive average pooling to (oh, ow): output (i, j) averages rows
    /// [floor(i H / oh), ceil((i + 1) H / oh)) and the same for columns.
    pub fn adaptive_avg_pool2d(&self, output: (usize, usize)) -> Result<Tensor> {
        let op = "adaptive_avg_pool2d";
        same_float(op, &[self])?;
        let g = adaptive_geometry(op, &self.shape, output)?;
        let out = g.out_shape();
        if self.device.is_host() {
            let xv = host_f64(op, self)?;
            let gw = &g.win;
            let y = gw.per_output(|plane, oh, ow| {
                let (rows, cols) = (adaptive(oh, gw.h, gw.ho), adaptive(ow, gw.w, gw.wo));
                let size = (rows.1 - rows.0) * (cols.1 - cols.0);
                gw.plane_sum(&xv, plane, rows, cols) / size as f64
            });
            return Ok(host_tensor(self.dtype, y, &out));
        }
        launch_from(self, op, &out, &g)
    }

    /// The gradient of `adaptive_avg_pool2d` for an input of `input_shape`.
    pub fn adaptive_avg_pool2d_backward(grad_y: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
        let op = "adaptive_avg_pool2d_backward";
        same_float(op, &[grad_y])?;
        if grad_y.ndim() != 4 {
            return Err(Error::shape(
                op,
                format!("grad_y {:?} must be (N, C, oh, ow)", grad_y.shape),
            ));
        }
        let g = adaptive_geometry(op, input_shape, (grad_y.shape[2], grad_y.shape[3]))?;
        g.check_grad_y(op, grad_y)?;
        let shape = g.win.in_shape();
        if grad_y.device.is_host() {
            let gy = host_f64(op, grad_y)?;
            let gw = &g.win;
            let dx = gw.per_input(|plane, h, w| {
                let mut d = 0.0;
                for oh in 0..gw.ho {
                    let (hs, he) = adaptive(oh, gw.h, gw.ho);
                    if hs > h {
                        break;
                    }
                    if h >= he {
                        continue;
                    }
                    for ow in 0..gw.wo {
                        let (ws, we) = adaptive(ow, gw.w, gw.wo);
                        if ws > w {
                            break;
                        }
                        if w >= we {
                            continue;
                        }
                        d += gy[gw.out_at(plane, oh, ow)] / ((he - hs) * (we - ws)) as f64;
                    }
                }
                d
            });
            return Ok(host_tensor(grad_y.dtype, dx, &shape));
        }
        launch_from(grad_y, op, &shape, &g)
    }
}

fn adaptive_geometry(op: &str, x_shape: &[usize], output: (usize, usize)) -> Result<Geom> {
    need_nchw(op, x_shape)?;
    if output.0 == 0 || output.1 == 0 {
        return Err(Error::invalid(
            op,
            format!("output size {output:?} must be positive (input {x_shape:?})"),
        ));
    }
    let mut win = Window::new(op, "", x_shape, (1, 1), (1, 1), (0, 0), (1, 1))?;
    (win.ho, win.wo) = output;
    Ok(Geom {
        win,
        include_pad: false,
    })
}
