//! 2-D pooling over NCHW: max (with PyTorch's flat H*W indices), average, adaptive average, and their gathering, atomic-free backwards.
//!
//! One kernel per op on OpenCL devices (`max_pool2d`, `max_pool2d_backward`, `avg_pool2d`,
//! `avg_pool2d_backward`, `adaptive_avg_pool2d`, `adaptive_avg_pool2d_backward` in
//! kernels/pool.cl). Every input may be a strided view; outputs are contiguous. Backwards are one
//! work-item per input pixel summing, in a fixed order, the output gradients of the windows that
//! cover it: correct for overlapping windows and bit-identical from run to run. No ceil mode.
use crate::conv::{host_f64, same_float, window_out, View4};
use crate::element::HostData;
use crate::index::{need_i32, same_device, small};
use crate::launch::{launch_1d, program_for};
use crate::tensor::Tensor;
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
}

impl Pool2dParams {
    /// `kernel` with stride = kernel, no padding, no dilation (PyTorch's defaults).
    pub fn new(kernel: (usize, usize)) -> Pool2dParams {
        Pool2dParams {
            kernel,
            stride: kernel,
            padding: (0, 0),
            dilation: (1, 1),
        }
    }
}

/// `PoolGeom` of kernels/pool.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolGeom {
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    h: u32,
    w: u32,
    ho: u32,
    wo: u32,
    include_pad: u32,
}

/// A validated pooling window over input planes (h, w) giving (ho, wo); `nc` = N * C planes.
#[derive(Clone, Copy, Debug)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    p: Pool2dParams,
    include_pad: bool,
}

impl Geom {
    fn cl(&self, op: &str) -> Result<PoolGeom> {
        let s = |x: usize| small(op, x);
        let p = &self.p;
        Ok(PoolGeom {
            kh: s(p.kernel.0)?,
            kw: s(p.kernel.1)?,
            sh: s(p.stride.0)?,
            sw: s(p.stride.1)?,
            ph: s(p.padding.0)?,
            pw: s(p.padding.1)?,
            dh: s(p.dilation.0)?,
            dw: s(p.dilation.1)?,
            h: s(self.h)?,
            w: s(self.w)?,
            ho: s(self.ho)?,
            wo: s(self.wo)?,
            include_pad: self.include_pad as u32,
        })
    }
    fn in_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }
    fn out_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.ho, self.wo]
    }
    /// Clipped window [hs, he) x [ws, we) of output (oh, ow) and the average's divisor.
    fn avg_window(&self, oh: usize, ow: usize) -> (usize, usize, usize, usize, f64) {
        let p = &self.p;
        let hs = (oh * p.stride.0) as isize - p.padding.0 as isize;
        let ws = (ow * p.stride.1) as isize - p.padding.1 as isize;
        let he = (hs + p.kernel.0 as isize).min((self.h + p.padding.0) as isize);
        let we = (ws + p.kernel.1 as isize).min((self.w + p.padding.1) as isize);
        let pool = (he - hs) * (we - ws);
        let (hs, ws) = (hs.max(0) as usize, ws.max(0) as usize);
        let (he, we) = (
            (he as usize).min(self.h).max(hs),
            (we as usize).min(self.w).max(ws),
        );
        let div = if self.include_pad {
            pool as f64
        } else {
            ((he - hs) * (we - ws)) as f64
        };
        (hs, he, ws, we, div)
    }
    /// Output pixels (oh, ow) whose window puts a tap on input (h, w), ki then kj ascending.
    fn covering(&self, h: usize, w: usize) -> Vec<(usize, usize)> {
        let p = &self.p;
        let mut v = Vec::new();
        let tap = |x: usize, pad: usize, k: usize, d: usize, s: usize, out: usize| {
            let t = (x + pad) as isize - (k * d) as isize;
            (t >= 0 && (t as usize).is_multiple_of(s) && (t as usize) / s < out)
                .then(|| t as usize / s)
        };
        for ki in 0..p.kernel.0 {
            let Some(oh) = tap(h, p.padding.0, ki, p.dilation.0, p.stride.0, self.ho) else {
                continue;
            };
            for kj in 0..p.kernel.1 {
                if let Some(ow) = tap(w, p.padding.1, kj, p.dilation.1, p.stride.1, self.wo) {
                    v.push((oh, ow));
                }
            }
        }
        v
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
    let pairs = [
        ("kernel", p.kernel),
        ("stride", p.stride),
        ("dilation", p.dilation),
    ];
    if let Some((name, v)) = pairs.iter().find(|(_, v)| v.0 == 0 || v.1 == 0) {
        return Err(Error::invalid(
            op,
            format!("{name} {v:?} must be positive (input {x_shape:?})"),
        ));
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
    let what = format!("input {x_shape:?}, kernel {:?}", p.kernel);
    let (k, s, pd, d) = (p.kernel, p.stride, p.padding, p.dilation);
    Ok(Geom {
        n: x_shape[0],
        c: x_shape[1],
        h: x_shape[2],
        w: x_shape[3],
        ho: window_out(op, &what, x_shape[2], k.0, s.0, pd.0, d.0)?,
        wo: window_out(op, &what, x_shape[3], k.1, s.1, pd.1, d.1)?,
        p,
        include_pad,
    })
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

fn check_grad_y(op: &str, grad_y: &Tensor, g: &Geom) -> Result<()> {
    if grad_y.shape != g.out_shape() {
        return Err(Error::shape(
            op,
            format!(
                "grad_y {:?} must be {:?} for input {:?}",
                grad_y.shape,
                g.out_shape(),
                g.in_shape()
            ),
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
            let (mut y, mut idx) = (Vec::new(), Vec::new());
            let p = &g.p;
            for plane in 0..g.n * g.c {
                let x = &xv[plane * g.h * g.w..(plane + 1) * g.h * g.w];
                for oh in 0..g.ho {
                    for ow in 0..g.wo {
                        let mut best: Option<(f64, usize)> = None;
                        for ki in 0..p.kernel.0 {
                            let h = (oh * p.stride.0 + ki * p.dilation.0) as isize
                                - p.padding.0 as isize;
                            if h < 0 || h as usize >= g.h {
                                continue;
                            }
                            for kj in 0..p.kernel.1 {
                                let w = (ow * p.stride.1 + kj * p.dilation.1) as isize
                                    - p.padding.1 as isize;
                                if w < 0 || w as usize >= g.w {
                                    continue;
                                }
                                let at = h as usize * g.w + w as usize;
                                let v = x[at];
                                let take = match best {
                                    None => true,
                                    Some((b, _)) => !b.is_nan() && (v > b || v.is_nan()),
                                };
                                if take {
                                    best = Some((v, at));
                                }
                            }
                        }
                        y.push(best.map_or(f64::NEG_INFINITY, |b| b.0));
                        idx.push(best.map_or(-1, |b| b.1 as i32));
                    }
                }
            }
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
        check_grad_y(op, grad_y, &g)?;
        if indices.shape != grad_y.shape {
            return Err(Error::shape(
                op,
                format!(
                    "indices {:?} must match grad_y {:?}",
                    indices.shape, grad_y.shape
                ),
            ));
        }
        let shape = g.in_shape();
        if grad_y.device.is_host() {
            let gy = host_f64(op, grad_y)?;
            let idx = indices.to_vec::<i32>()?;
            let mut dx = vec![0.0; shape.iter().product()];
            for (i, d) in dx.iter_mut().enumerate() {
                let (w, h, plane) = (i % g.w, (i / g.w) % g.h, i / (g.w * g.h));
                for (oh, ow) in g.covering(h, w) {
                    let o = (plane * g.ho + oh) * g.wo + ow;
                    if idx[o] == (h * g.w + w) as i32 {
                        *d += gy[o];
                    }
                }
            }
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
            let mut y = Vec::new();
            for plane in 0..g.n * g.c {
                let x = &xv[plane * g.h * g.w..(plane + 1) * g.h * g.w];
                for oh in 0..g.ho {
                    for ow in 0..g.wo {
                        let (hs, he, ws, we, div) = g.avg_window(oh, ow);
                        let s: f64 = (hs..he)
                            .flat_map(|h| (ws..we).map(move |w| h * g.w + w))
                            .map(|i| x[i])
                            .sum();
                        y.push(s / div);
                    }
                }
            }
            return Ok(host_tensor(self.dtype, y, &out));
        }
        let y = Tensor::alloc(&out, self.dtype, &self.device)?;
        if y.numel() > 0 {
            let v = View4::of(op, self)?;
            launch(self, op, y.numel(), &[&y, self], &[v], g.cl(op)?)?;
        }
        Ok(y)
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
        check_grad_y(op, grad_y, &g)?;
        let shape = g.in_shape();
        if grad_y.device.is_host() {
            let gy = host_f64(op, grad_y)?;
            let mut dx = vec![0.0; shape.iter().product()];
            for (i, d) in dx.iter_mut().enumerate() {
                let (w, h, plane) = (i % g.w, (i / g.w) % g.h, i / (g.w * g.h));
                for (oh, ow) in g.covering(h, w) {
                    *d += gy[(plane * g.ho + oh) * g.wo + ow] / g.avg_window(oh, ow).4;
                }
            }
            return Ok(host_tensor(grad_y.dtype, dx, &shape));
        }
        let dx = Tensor::alloc(&shape, grad_y.dtype, &grad_y.device)?;
        if dx.numel() > 0 {
            let gv = View4::of(op, grad_y)?;
            launch(grad_y, op, dx.numel(), &[&dx, grad_y], &[gv], g.cl(op)?)?;
        }
        Ok(dx)
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
            let mut y = Vec::new();
            for plane in 0..g.n * g.c {
                let x = &xv[plane * g.h * g.w..(plane + 1) * g.h * g.w];
                for oh in 0..g.ho {
                    let (hs, he) = adaptive(oh, g.h, g.ho);
                    for ow in 0..g.wo {
                        let (ws, we) = adaptive(ow, g.w, g.wo);
                        let s: f64 = (hs..he)
                            .flat_map(|h| (ws..we).map(move |w| h * g.w + w))
                            .map(|i| x[i])
                            .sum();
                        y.push(s / ((he - hs) * (we - ws)) as f64);
                    }
                }
            }
            return Ok(host_tensor(self.dtype, y, &out));
        }
        let y = Tensor::alloc(&out, self.dtype, &self.device)?;
        if y.numel() > 0 {
            let v = View4::of(op, self)?;
            launch(self, op, y.numel(), &[&y, self], &[v], g.cl(op)?)?;
        }
        Ok(y)
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
        check_grad_y(op, grad_y, &g)?;
        let shape = g.in_shape();
        if grad_y.device.is_host() {
            let gy = host_f64(op, grad_y)?;
            let mut dx = vec![0.0; shape.iter().product()];
            for (i, d) in dx.iter_mut().enumerate() {
                let (w, h, plane) = (i % g.w, (i / g.w) % g.h, i / (g.w * g.h));
                for oh in 0..g.ho {
                    let (hs, he) = adaptive(oh, g.h, g.ho);
                    if hs > h {
                        break;
                    }
                    if h >= he {
                        continue;
                    }
                    for ow in 0..g.wo {
                        let (ws, we) = adaptive(ow, g.w, g.wo);
                        if ws > w {
                            break;
                        }
                        if w >= we {
                            continue;
                        }
                        *d += gy[(plane * g.ho + oh) * g.wo + ow] / ((he - hs) * (we - ws)) as f64;
                    }
                }
            }
            return Ok(host_tensor(grad_y.dtype, dx, &shape));
        }
        let dx = Tensor::alloc(&shape, grad_y.dtype, &grad_y.device)?;
        if dx.numel() > 0 {
            let gv = View4::of(op, grad_y)?;
            launch(grad_y, op, dx.numel(), &[&dx, grad_y], &[gv], g.cl(op)?)?;
        }
        Ok(dx)
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
    Ok(Geom {
        n: x_shape[0],
        c: x_shape[1],
        h: x_shape[2],
        w: x_shape[3],
        ho: output.0,
        wo: output.1,
        p: Pool2dParams::new((1, 1)),
        include_pad: false,
    })
}
