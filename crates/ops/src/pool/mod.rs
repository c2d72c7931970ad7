//! 2-D pooling over NCHW: max (with PyTorch's flat H*W indices), average, adaptive average, and their gathering, atomic-free backwards.
//!
//! One kernel per op on OpenCL devices (`max_pool2d`, `max_pool2d_backward`, `avg_pool2d`,
//! `avg_pool2d_backward`, `adaptive_avg_pool2d`, `adaptive_avg_pool2d_backward` in
//! kernels/pool.cl). Every input may be a strided view; outputs are contiguous. Backwards are one
//! work-item per input pixel summing, in a fixed order, the output gradients of the windows that
//! cover it: correct for overlapping windows and bit-identical from run to run. `ceil_mode` as
//! PyTorch's (a partial last window; averages divide by its size clipped to the padded input).
mod opencl;
mod reference;
use crate::base::checks::{need_i32, same_device, same_float};
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use crate::base::window::Window;
use netcl_core_devices::{Error, Result};

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

/// A validated pooling window; `include_pad`: averages divide by the padded window size.
#[derive(Clone, Copy, Debug)]
struct Geom {
    win: Window,
    include_pad: bool,
}

impl Geom {
    fn out_shape(&self) -> [usize; 4] {
        self.win.out_shape(self.win.c)
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

fn need_no_dilation(op: &str, p: &Pool2dParams) -> Result<()> {
    if p.dilation != (1, 1) {
        return Err(Error::invalid(
            op,
            format!("dilation {:?} is not supported (only (1, 1))", p.dilation),
        ));
    }
    Ok(())
}

/// A checked max pooling of float `x` (N, C, H, W, any view): values and I32 indices, both
/// (N, C, Ho, Wo).
#[derive(Clone, Debug)]
struct MaxPool2d {
    x: Tensor,
    g: Geom,
}

impl_op!(MaxPool2d, (Tensor, Tensor), "max_pool2d", max_pool2d);

/// A checked max pooling gradient: `grad_y` and I32 `indices` (N, C, Ho, Wo) on one device to
/// dx (N, C, H, W) in grad_y's dtype.
#[derive(Clone, Debug)]
struct MaxPool2dBackward {
    grad_y: Tensor,
    indices: Tensor,
    g: Geom,
}

impl_op!(
    MaxPool2dBackward,
    Tensor,
    "max_pool2d_backward",
    max_pool2d_backward
);

/// Which average: forwards map (N, C, H, W) to (N, C, Ho, Wo), gradients the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Avg {
    Pool,
    PoolBackward,
    Adaptive,
    AdaptiveBackward,
}

impl Avg {
    /// The op's name, also its kernel's in kernels/pool.cl.
    fn name(self) -> &'static str {
        match self {
            Avg::Pool => "avg_pool2d",
            Avg::PoolBackward => "avg_pool2d_backward",
            Avg::Adaptive => "adaptive_avg_pool2d",
            Avg::AdaptiveBackward => "adaptive_avg_pool2d_backward",
        }
    }
}

/// A checked average pooling (`kind`) of float `src` (any view) over the windows of `g`; the
/// output is contiguous in src's dtype.
#[derive(Clone, Debug)]
struct AvgPool {
    kind: Avg,
    src: Tensor,
    g: Geom,
}

impl AvgPool {
    fn out_shape(&self) -> [usize; 4] {
        match self.kind {
            Avg::Pool | Avg::Adaptive => self.g.out_shape(),
            Avg::PoolBackward | Avg::AdaptiveBackward => self.g.win.in_shape(),
        }
    }
}

impl_op!(AvgPool, Tensor, "avg_pool2d", avg_pool, |d| d.kind.name());

/// Dispatches the average `kind` of `src` over `g`.
fn avg(kind: Avg, src: &Tensor, g: Geom) -> Result<Tensor> {
    let desc = AvgPool {
        kind,
        src: src.clone(),
        g,
    };
    dispatch(&src.device, &desc)
}

impl Tensor {
    /// Max pooling: (N, C, H, W) -> (values, indices), both (N, C, Ho, Wo); each index is the flat
    /// `h * W + w` of the maximum in its input plane (I32, as PyTorch's). The first maximum wins;
    /// NaN propagates.
    pub fn max_pool2d(&self, params: Pool2dParams) -> Result<(Tensor, Tensor)> {
        let op = "max_pool2d";
        same_float(op, &[self])?;
        let g = geometry(op, &self.shape, params, false)?;
        let desc = MaxPool2d { x: self.clone(), g };
        dispatch(&self.device, &desc)
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
        let desc = MaxPool2dBackward {
            grad_y: grad_y.clone(),
            indices: indices.clone(),
            g,
        };
        dispatch(&grad_y.device, &desc)
    }

    /// Average pooling (no dilation): the divisor is the window size clipped to the padded
    /// input when `count_include_pad`, else the number of in-range taps (PyTorch's rule).
    pub fn avg_pool2d(&self, params: Pool2dParams, count_include_pad: bool) -> Result<Tensor> {
        let op = Avg::Pool.name();
        same_float(op, &[self])?;
        need_no_dilation(op, &params)?;
        let g = geometry(op, &self.shape, params, count_include_pad)?;
        avg(Avg::Pool, self, g)
    }

    /// The gradient of `avg_pool2d` for an input of `input_shape`.
    pub fn avg_pool2d_backward(
        grad_y: &Tensor,
        input_shape: &[usize],
        params: Pool2dParams,
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let op = Avg::PoolBackward.name();
        same_float(op, &[grad_y])?;
        need_no_dilation(op, &params)?;
        let g = geometry(op, input_shape, params, count_include_pad)?;
        g.check_grad_y(op, grad_y)?;
        avg(Avg::PoolBackward, grad_y, g)
    }

    /// Adaptive average pooling to (oh, ow): output (i, j) averages rows
    /// [floor(i H / oh), ceil((i + 1) H / oh)) and the same for columns.
    pub fn adaptive_avg_pool2d(&self, output: (usize, usize)) -> Result<Tensor> {
        let op = Avg::Adaptive.name();
        same_float(op, &[self])?;
        let g = adaptive_geometry(op, &self.shape, output)?;
        avg(Avg::Adaptive, self, g)
    }

    /// The gradient of `adaptive_avg_pool2d` for an input of `input_shape`.
    pub fn adaptive_avg_pool2d_backward(grad_y: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
        let op = Avg::AdaptiveBackward.name();
        same_float(op, &[grad_y])?;
        if grad_y.ndim() != 4 {
            return Err(Error::shape(
                op,
                format!("grad_y {:?} must be (N, C, oh, ow)", grad_y.shape),
            ));
        }
        let g = adaptive_geometry(op, input_shape, (grad_y.shape[2], grad_y.shape[3]))?;
        g.check_grad_y(op, grad_y)?;
        avg(Avg::AdaptiveBackward, grad_y, g)
    }
}
