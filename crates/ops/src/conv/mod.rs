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
//! The host runs the same algorithm (host im2col/col2im in f64, host matmul).
use crate::base::checks::{same_float, u32_arg};
use crate::base::element::HostData;
use crate::base::host::host_f64;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::check_reach;
use crate::base::tensor::Tensor;
use crate::base::window::{View4, Window, Window2};
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::CONV;
use rayon::prelude::*;

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

/// `ConvGeom` of kernels/conv.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvGeom {
    win: Window2,
    groups: u32,
    cg: u32,
    col_stride: [u32; 4],
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
    fn cl(&self, op: &str, col_stride: [usize; 4]) -> Result<ConvGeom> {
        let s = |what: &str, x: usize| u32_arg(op, what, x);
        Ok(ConvGeom {
            win: self.win.cl(op)?,
            groups: s("groups", self.groups)?,
            cg: s("channels per group", self.cg())?,
            col_stride: [
                s("stride", col_stride[0])?,
                s("stride", col_stride[1])?,
                s("stride", col_stride[2])?,
                s("stride", col_stride[3])?,
            ],
        })
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

/// Columns of `x` as an (N, G, K, L) tensor; stored (G, K, N, L) when `batch_inner`, else
/// (N, G, K, L).
fn im2col(op: &str, x: &Tensor, g: &Geom, batch_inner: bool) -> Result<Tensor> {
    let (gr, k, l, n) = (g.groups, g.k(), g.l(), g.win.n);
    let w = &g.win;
    if x.device.is_host() {
        let xv = host_f64(op, x)?;
        let mut cols = vec![0.0; n * gr * k * l];
        let taps = w.kernel.0 * w.kernel.1;
        cols.par_iter_mut().enumerate().for_each(|(i, col)| {
            let (li, rest) = (i % l, i / l);
            let (kk, rest) = (rest % k, rest / k);
            let (gi, b) = (rest % gr, rest / gr);
            let (ci, kr) = (kk / taps, kk % taps);
            let (ki, kj) = (kr / w.kernel.1, kr % w.kernel.1);
            let (oh, ow) = (li / w.wo, li % w.wo);
            if let (Some(hh), Some(ww)) = (w.tap_in(0, oh, ki), w.tap_in(1, ow, kj)) {
                let c = gi * g.cg() + ci;
                *col = xv[((b * w.c + c) * w.h + hh) * w.w + ww];
            }
        });
        let t = Tensor::from_host_data(
            HostData::from_fn(x.dtype, cols.len(), |i| cols[i]),
            &[n, gr, k, l],
        );
        return Ok(t);
    }
    let (out, strides) = if batch_inner {
        let t = Tensor::alloc(&[gr, k, n, l], x.dtype, &x.device)?.permute(&[2, 0, 1, 3])?;
        let s = [t.strides[0], t.strides[1], t.strides[2], t.strides[3]];
        (t, s)
    } else {
        let t = Tensor::alloc(&[n, gr, k, l], x.dtype, &x.device)?;
        (t, [gr * k * l, k * l, l, 1])
    };
    if out.numel() == 0 {
        return Ok(out);
    }
    let (v, cg) = (View4::of(op, x)?, g.cl(op, strides)?);
    let program = program_for(&x.device, &CONV, x.dtype)?;
    launch_1d(&program, "im2col", out.numel(), |kern| {
        kern.declare(((x.numel() + out.numel()) * x.dtype.size()) as u64, 0);
        kern.arg_mem(out.mem()?)?
            .arg_mem(x.mem()?)?
            .arg(&v)?
            .arg(&cg)?;
        Ok(())
    })?;
    Ok(out)
}

/// The input gradient (N, C, H, W) from column gradients `cols` (N, G, K, L), any strides.
fn col2im(op: &str, cols: &Tensor, g: &Geom) -> Result<Tensor> {
    let w = &g.win;
    let shape = w.in_shape();
    if cols.device.is_host() {
        let cv = host_f64(op, cols)?;
        let (gr, k, l) = (g.groups, g.k(), g.l());
        let dx = w.per_input(|plane, h, x| {
            let (b, c) = (plane / w.c, plane % w.c);
            let (gi, ci) = (c / g.cg(), c % g.cg());
            let taps = w.covering(h, x).into_iter();
            taps.map(|(ki, kj, oh, ow)| {
                let kk = (ci * w.kernel.0 + ki) * w.kernel.1 + kj;
                cv[((b * gr + gi) * k + kk) * l + oh * w.wo + ow]
            })
            .sum()
        });
        let dx = HostData::from_fn(cols.dtype, dx.len(), |i| dx[i]);
        return Ok(Tensor::from_host_data(dx, &shape));
    }
    let out = Tensor::alloc(&shape, cols.dtype, &cols.device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    check_reach(op, &cols.shape, &cols.strides, cols.offset)?;
    if cols.offset != 0 {
        return col2im(op, &cols.contiguous()?, g);
    }
    let s = [
        cols.strides[0],
        cols.strides[1],
        cols.strides[2],
        cols.strides[3],
    ];
    let (v, cg) = (View4::of(op, &out)?, g.cl(op, s)?);
    let program = program_for(&cols.device, &CONV, cols.dtype)?;
    launch_1d(&program, "col2im", out.numel(), |kern| {
        let bytes = (cols.numel() + out.numel()) * cols.dtype.size();
        kern.declare(bytes as u64, cols.numel() as u64);
        kern.arg_mem(out.mem()?)?
            .arg_mem(cols.mem()?)?
            .arg(&v)?
            .arg(&cg)?;
        Ok(())
    })?;
    Ok(out)
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
            Some(b) => add_channel_bias(op, y, b),
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
        col2im(op, &cols, &g)
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

/// `y` (fresh, contiguous (N, C, Ho, Wo)) plus `bias[c]` on every channel, in place on devices.
fn add_channel_bias(op: &str, y: Tensor, bias: &Tensor) -> Result<Tensor> {
    let (c, p) = (y.shape[1], y.shape[2] * y.shape[3]);
    if y.device.is_host() {
        let (yv, bv) = (host_f64(op, &y)?, bias.to_vec_f64()?);
        let data = HostData::from_fn(y.dtype, yv.len(), |i| yv[i] + bv[(i / p) % c]);
        return Ok(Tensor::from_host_data(data, &y.shape));
    }
    if y.numel() == 0 {
        return Ok(y);
    }
    check_reach(op, &bias.shape, &bias.strides, bias.offset)?;
    let (bs, bo) = (
        u32_arg(op, "stride", bias.strides[0])?,
        u32_arg(op, "offset", bias.offset)?,
    );
    let program = program_for(&y.device, &CONV, y.dtype)?;
    let (cu, pu) = (u32_arg(op, "size", c)?, u32_arg(op, "size", p)?);
    launch_1d(&program, "add_channel_bias", y.numel(), |k| {
        k.declare((2 * y.numel() * y.dtype.size()) as u64, y.numel() as u64);
        k.arg_mem(y.mem()?)?
            .arg_mem(bias.mem()?)?
            .arg(&bs)?
            .arg(&bo)?
            .arg(&cu)?
            .arg(&pu)?;
        Ok(())
    })?;
    Ok(y)
}
