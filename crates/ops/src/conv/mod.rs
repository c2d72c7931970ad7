//! 2-D convolution (NCHW, groups, stride, padding, dilation) via im2col + batched matmul, and its input, weight and bias gradients.
//!
//! Layouts: the columns of an image are `(G, K, L)` with `K = Cin/G * kh * kw` (row
//! `k = (ci * kh + ki) * kw + kj`) and `L = Ho * Wo`; the weight is viewed as `(G, Cout/G, K)`.
//!
//! Kernels enqueued on OpenCL devices:
//! - `conv2d`: `im2col` + `matmul` (+ `add_channel_bias` with a bias). A 1x1 kernel with stride 1
//!   and no padding skips `im2col`: the input viewed as `(N, G, Cin/G, H*W)` is the right operand
//!   (a `strided_copy` first when its H and W dims do not merge).
//! - `conv2d_backward_input`: `matmul` (weight transposed, no copy) + `col2im`, which gathers per
//!   input pixel in a fixed order (no atomics). The 1x1/stride 1/no padding case is the matmul
//!   alone.
//! - `conv2d_backward_weight`: `strided_copy` of grad_y to `(Cout, N, Ho, Wo)` (skipped when that
//!   is already contiguous) + `im2col` writing `(G, K, N, L)` + one `matmul` whose inner dim
//!   `N * L` sums over the batch: deterministic.
//! - `conv2d_backward_bias`: the sum over N, Ho, Wo (the reduction ops).
//!
//! The host runs the same algorithm (host im2col/col2im in f64, host matmul): `im2col`, `col2im` and
//! the channel bias are ops (descriptions below, kernels in opencl.rs, host versions in
//! reference.rs); the products are matmul's.
mod opencl;
mod reference;
use crate::base::checks::same_float;
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use crate::base::window::Window;
use netcl_core_devices::{Error, Result};

/// Geometry of `conv2d`: (height, width) pairs, and the number of channel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    /// Input and output channels split into this many independent groups (Cin for depthwise).
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

/// A validated convolution: the window of a weight (Cout, C/G, kh, kw) over the input
/// (N, C, H, W).
#[derive(Clone, Copy, Debug)]
struct Geom {
    win: Window,
    cout: usize,
    groups: usize,
}

impl Geom {
    fn cg(&self) -> usize {
        self.win.c / self.groups
    }
    fn coutg(&self) -> usize {
        self.cout / self.groups
    }
    /// Rows of one group's columns.
    fn k(&self) -> usize {
        self.cg() * self.win.kernel.0 * self.win.kernel.1
    }
    fn l(&self) -> usize {
        self.win.ho * self.win.wo
    }
    /// A 1x1 kernel at stride 1 without padding: the columns are the input itself.
    fn pointwise(&self) -> bool {
        let w = &self.win;
        w.kernel == (1, 1) && w.stride == (1, 1) && w.padding == (0, 0)
    }
    /// The forward's operands, for errors.
    fn operands(&self) -> String {
        let w = &self.win;
        format!(
            "input {:?} and weight [{}, {}, {}, {}]",
            w.in_shape(),
            self.cout,
            self.cg(),
            w.kernel.0,
            w.kernel.1
        )
    }
}

/// Checks the operands and parameters; `x_shape` is the input shape, `w_shape` the weight's.
fn geometry(op: &str, x_shape: &[usize], w_shape: &[usize], p: Conv2dParams) -> Result<Geom> {
    if x_shape.len() != 4 || w_shape.len() != 4 {
        return Err(Error::shape(
            op,
            format!(
                "input {x_shape:?} must be (N, C, H, W) and weight {w_shape:?} (Cout, Cin/groups, kh, kw)"
            ),
        ));
    }
    let (c, cout) = (x_shape[1], w_shape[0]);
    let g = p.groups;
    if g == 0 || c % g != 0 || cout % g != 0 {
        return Err(Error::shape(
            op,
            format!(
                "groups {g} must divide the input channels of {x_shape:?} and the output channels of weight {w_shape:?}"
            ),
        ));
    }
    if w_shape[1] * g != c {
        return Err(Error::shape(
            op,
            format!(
                "weight {w_shape:?} has {} input channels per group but input {x_shape:?} with {g} groups has {}",
                w_shape[1],
                c / g
            ),
        ));
    }
    let what = format!("input {x_shape:?}, weight {w_shape:?}");
    let kernel = (w_shape[2], w_shape[3]);
    let win = Window::new(op, &what, x_shape, kernel, p.stride, p.padding, p.dilation)?;
    Ok(Geom {
        win,
        cout,
        groups: g,
    })
}

/// `t` (N, C, H, W) viewed as (N, G, C/G, H*W) without a copy when H and W merge, else through a
/// contiguous copy.
fn group_view(t: &Tensor, groups: usize) -> Result<Tensor> {
    let (n, c, h, w) = (t.shape[0], t.shape[1], t.shape[2], t.shape[3]);
    let [sn, sc, sh, sw] = [t.strides[0], t.strides[1], t.strides[2], t.strides[3]];
    let hw = if w == 1 {
        Some(sh)
    } else if h == 1 || sh == w * sw {
        Some(sw)
    } else {
        None
    };
    let Some(shw) = hw else {
        return group_view(&t.contiguous()?, groups);
    };
    let cg = c / groups;
    Ok(Tensor {
        storage: t.storage.clone(),
        shape: vec![n, groups, cg, h * w],
        strides: vec![sn, cg * sc, sc, shw],
        offset: t.offset,
        dtype: t.dtype,
        device: t.device.clone(),
    })
}

/// The columns of `x` (N, C, H, W, any view) for convolution `g`: an (N, G, K, L) tensor, stored
/// (G, K, N, L) on devices when `batch_inner` (the weight gradient's layout), else contiguous.
/// `op` names the public op in errors.
#[derive(Clone, Debug)]
struct Im2col {
    op: &'static str,
    x: Tensor,
    g: Geom,
    batch_inner: bool,
}

impl_op!(Im2col, Tensor, "im2col", im2col);

/// The input gradient (N, C, H, W) of convolution `g` from column gradients `cols`
/// (N, G, K, L, any strides).
#[derive(Clone, Debug)]
struct Col2im {
    op: &'static str,
    cols: Tensor,
    g: Geom,
}

impl_op!(Col2im, Tensor, "col2im", col2im);

/// `y` (fresh from the product, contiguous (N, C, Ho, Wo)) plus `bias[c]` (C, any stride) on
/// every channel: in place on devices (y is returned), a new tensor on the host.
#[derive(Clone, Debug)]
struct AddChannelBias {
    op: &'static str,
    y: Tensor,
    bias: Tensor,
}

impl_op!(AddChannelBias, Tensor, "add_channel_bias", add_channel_bias);

/// Columns of `x` as an (N, G, K, L) tensor; stored (G, K, N, L) when `batch_inner`, else
/// (N, G, K, L).
fn im2col(op: &'static str, x: &Tensor, g: &Geom, batch_inner: bool) -> Result<Tensor> {
    let desc = Im2col {
        op,
        x: x.clone(),
        g: *g,
        batch_inner,
    };
    dispatch(&x.device, &desc)
}

impl Tensor {
    /// 2-D convolution (cross-correlation, as PyTorch): input (N, Cin, H, W), weight
    /// (Cout, Cin/groups, kh, kw), bias (Cout) -> (N, Cout, Ho, Wo) with
    /// `Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1`.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        let op = "conv2d";
        let _span = netcl_profiling::span(op);
        let mut operands = vec![self, weight];
        operands.extend(bias);
        same_float(op, &operands)?;
        let g = geometry(op, &self.shape, &weight.shape, params)?;
        if let Some(b) = bias {
            if b.shape != [g.cout] {
                return Err(Error::shape(
                    op,
                    format!(
                        "bias {:?} must be ({}) for weight {:?}",
                        b.shape, g.cout, weight.shape
                    ),
                ));
            }
        }
        let w3 = weight.reshape(&[g.groups, g.coutg(), g.k()])?;
        let cols = if g.pointwise() {
            group_view(self, g.groups)?
        } else {
            im2col(op, self, &g, false)?
        };
        let y = w3.matmul(&cols)?.reshape(&g.win.out_shape(g.cout))?;
        match bias {
            Some(b) => {
                let desc = AddChannelBias {
                    op,
                    y,
                    bias: b.clone(),
                };
                dispatch(&desc.y.device, &desc)
            }
            None => Ok(y),
        }
    }

    /// The gradient of `conv2d` with respect to its input (of `input_shape`).
    pub fn conv2d_backward_input(
        grad_y: &Tensor,
        weight: &Tensor,
        input_shape: &[usize],
        params: Conv2dParams,
    ) -> Result<Tensor> {
        let op = "conv2d_backward_input";
        let _span = netcl_profiling::span(op);
        same_float(op, &[grad_y, weight])?;
        let g = geometry(op, input_shape, &weight.shape, params)?;
        g.win.check_grad_y(op, grad_y, g.cout, &g.operands())?;
        let w3 = weight.reshape(&[g.groups, g.coutg(), g.k()])?;
        let gy = group_view(grad_y, g.groups)?;
        let cols = w3.transpose(1, 2)?.matmul(&gy)?;
        if g.pointwise() {
            return cols.reshape(&g.win.in_shape());
        }
        let desc = Col2im { op, cols, g };
        dispatch(&desc.cols.device, &desc)
    }

    /// The gradient of `conv2d` with respect to its weight (of `weight_shape`), summed over the
    /// batch inside one matmul.
    pub fn conv2d_backward_weight(
        grad_y: &Tensor,
        x: &Tensor,
        weight_shape: &[usize],
        params: Conv2dParams,
    ) -> Result<Tensor> {
        let op = "conv2d_backward_weight";
        let _span = netcl_profiling::span(op);
        same_float(op, &[grad_y, x])?;
        let g = geometry(op, &x.shape, weight_shape, params)?;
        g.win.check_grad_y(op, grad_y, g.cout, &g.operands())?;
        let nl = g.win.n * g.l();
        let gy = grad_y
            .permute(&[1, 0, 2, 3])?
            .reshape(&[g.groups, g.coutg(), nl])?;
        let cols =
            im2col(op, x, &g, true)?
                .permute(&[1, 2, 0, 3])?
                .reshape(&[g.groups, g.k(), nl])?;
        gy.matmul(&cols.transpose(1, 2)?)?.reshape(weight_shape)
    }

    /// The gradient of `conv2d`'s bias: `grad_y` (N, Cout, Ho, Wo) summed over N, Ho, Wo.
    pub fn conv2d_backward_bias(grad_y: &Tensor) -> Result<Tensor> {
        let op = "conv2d_backward_bias";
        let _span = netcl_profiling::span(op);
        same_float(op, &[grad_y])?;
        if grad_y.ndim() != 4 {
            return Err(Error::shape(
                op,
                format!("grad_y {:?} must be (N, Cout, Ho, Wo)", grad_y.shape),
            ));
        }
        // The reduction kernels split each channel's sum over many work-groups.
        grad_y.sum(&[0, 2, 3], false)
    }
}
