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
use crate::element::HostData;
use crate::index::{same_device, small};
use crate::launch::{launch_1d, program_for};
use crate::layout::check_reach;
use crate::tensor::Tensor;
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::CONV;

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

/// `View4` of kernels/conv.cl and kernels/pool.cl.
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
            offset: small(op, t.offset)?,
        };
        for d in 0..4 {
            v.shape[d] = small(op, t.shape[d])?;
            v.stride[d] = small(op, t.strides[d])?;
        }
        Ok(v)
    }
}

/// `ConvGeom` of kernels/conv.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvGeom {
    groups: u32,
    cg: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    ho: u32,
    wo: u32,
    col_stride: [u32; 4],
}

/// A validated convolution: input (N, C, H, W), weight (Cout, C/G, kh, kw), output (Ho, Wo).
#[derive(Clone, Copy, Debug)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    cout: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    p: Conv2dParams,
}

impl Geom {
    fn groups(&self) -> usize {
        self.p.groups
    }
    fn cg(&self) -> usize {
        self.c / self.p.groups
    }
    fn coutg(&self) -> usize {
        self.cout / self.p.groups
    }
    /// Rows of one group's columns.
    fn k(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    fn l(&self) -> usize {
        self.ho * self.wo
    }
    /// A 1x1 kernel at stride 1 without padding: the columns are the input itself.
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.p.stride == (1, 1) && self.p.padding == (0, 0)
    }
    fn cl(&self, op: &str, col_stride: [usize; 4]) -> Result<ConvGeom> {
        let s = |x: usize| small(op, x);
        let p = &self.p;
        Ok(ConvGeom {
            groups: s(p.groups)?,
            cg: s(self.cg())?,
            kh: s(self.kh)?,
            kw: s(self.kw)?,
            sh: s(p.stride.0)?,
            sw: s(p.stride.1)?,
            ph: s(p.padding.0)?,
            pw: s(p.padding.1)?,
            dh: s(p.dilation.0)?,
            dw: s(p.dilation.1)?,
            ho: s(self.ho)?,
            wo: s(self.wo)?,
            col_stride: [
                s(col_stride[0])?,
                s(col_stride[1])?,
                s(col_stride[2])?,
                s(col_stride[3])?,
            ],
        })
    }
}

/// Output extent of a sliding window: error when the dilated kernel exceeds the padded input.
pub(crate) fn window_out(
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
    let pairs = [("stride", p.stride), ("dilation", p.dilation)];
    if let Some((name, v)) = pairs.iter().find(|(_, v)| v.0 == 0 || v.1 == 0) {
        return Err(Error::invalid(op, format!("{name} {v:?} must be positive")));
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
    let (kh, kw) = (w_shape[2], w_shape[3]);
    if kh == 0 || kw == 0 {
        return Err(Error::shape(
            op,
            format!("weight {w_shape:?} has an empty kernel"),
        ));
    }
    let what = format!("input {x_shape:?}, weight {w_shape:?}");
    let ho = window_out(
        op,
        &what,
        x_shape[2],
        kh,
        p.stride.0,
        p.padding.0,
        p.dilation.0,
    )?;
    let wo = window_out(
        op,
        &what,
        x_shape[3],
        kw,
        p.stride.1,
        p.padding.1,
        p.dilation.1,
    )?;
    Ok(Geom {
        n: x_shape[0],
        c,
        h: x_shape[2],
        w: x_shape[3],
        cout,
        kh,
        kw,
        ho,
        wo,
        p,
    })
}

/// Error unless every tensor is a float tensor of the first one's dtype on its device.
pub(crate) fn same_float(op: &str, ts: &[&Tensor]) -> Result<()> {
    let first = ts[0];
    for t in ts {
        same_device(op, first, t)?;
        if t.dtype != first.dtype || !t.dtype.is_float() {
            return Err(Error::dtype(
                op,
                format!(
                    "operands {}",
                    ts.iter()
                        .map(|t| format!("{} {:?}", t.dtype, t.shape))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The elements of a host tensor as f64 in row-major order.
pub(crate) fn host_f64(op: &str, t: &Tensor) -> Result<Vec<f64>> {
    t.host_view(&t.shape, &t.strides)
        .map(|h| h.to_f64())
        .ok_or_else(|| Error::device(op, "host tensor without host storage"))
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
    let (gr, k, l, n) = (g.groups(), g.k(), g.l(), g.n);
    if x.device.is_host() {
        let xv = host_f64(op, x)?;
        let mut cols = vec![0.0; n * gr * k * l];
        let p = &g.p;
        for (i, col) in cols.iter_mut().enumerate() {
            let (li, rest) = (i % l, i / l);
            let (kk, rest) = (rest % k, rest / k);
            let (gi, b) = (rest % gr, rest / gr);
            let (ci, kr) = (kk / (g.kh * g.kw), kk % (g.kh * g.kw));
            let (ki, kj) = (kr / g.kw, kr % g.kw);
            let (oh, ow) = (li / g.wo, li % g.wo);
            let hh = (oh * p.stride.0 + ki * p.dilation.0) as isize - p.padding.0 as isize;
            let ww = (ow * p.stride.1 + kj * p.dilation.1) as isize - p.padding.1 as isize;
            if hh >= 0 && ww >= 0 && (hh as usize) < g.h && (ww as usize) < g.w {
                let c = gi * g.cg() + ci;
                *col = xv[((b * g.c + c) * g.h + hh as usize) * g.w + ww as usize];
            }
        }
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
    let shape = [g.n, g.c, g.h, g.w];
    if cols.device.is_host() {
        let cv = host_f64(op, cols)?;
        let (gr, k, l) = (g.groups(), g.k(), g.l());
        let p = &g.p;
        let dx = HostData::from_fn(cols.dtype, g.n * g.c * g.h * g.w, |i| {
            let (w, h) = (i % g.w, (i / g.w) % g.h);
            let (c, b) = ((i / (g.w * g.h)) % g.c, i / (g.w * g.h * g.c));
            let (gi, ci) = (c / g.cg(), c % g.cg());
            let mut acc = 0.0;
            for ki in 0..g.kh {
                let th = (h + p.padding.0) as isize - (ki * p.dilation.0) as isize;
                if th < 0
                    || !(th as usize).is_multiple_of(p.stride.0)
                    || th as usize / p.stride.0 >= g.ho
                {
                    continue;
                }
                let oh = th as usize / p.stride.0;
                for kj in 0..g.kw {
                    let tw = (w + p.padding.1) as isize - (kj * p.dilation.1) as isize;
                    if tw < 0
                        || !(tw as usize).is_multiple_of(p.stride.1)
                        || tw as usize / p.stride.1 >= g.wo
                    {
                        continue;
                    }
                    let ow = tw as usize / p.stride.1;
                    let kk = (ci * g.kh + ki) * g.kw + kj;
                    acc += cv[((b * gr + gi) * k + kk) * l + oh * g.wo + ow];
                }
            }
            acc
        });
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
        let w3 = weight.reshape(&[g.groups(), g.coutg(), g.k()])?;
        let cols = if g.pointwise() {
            group_view(self, g.groups())?
        } else {
            im2col(op, self, &g, false)?
        };
        let y = w3.matmul(&cols)?.reshape(&[g.n, g.cout, g.ho, g.wo])?;
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
        check_grad_y(op, grad_y, &g)?;
        let w3 = weight.reshape(&[g.groups(), g.coutg(), g.k()])?;
        let gy = group_view(grad_y, g.groups())?;
        let cols = w3.transpose(1, 2)?.matmul(&gy)?;
        if g.pointwise() {
            return cols.reshape(&[g.n, g.c, g.h, g.w]);
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
        check_grad_y(op, grad_y, &g)?;
        let nl = g.n * g.l();
        let gy = grad_y
            .permute(&[1, 0, 2, 3])?
            .reshape(&[g.groups(), g.coutg(), nl])?;
        let cols =
            im2col(op, x, &g, true)?
                .permute(&[1, 2, 0, 3])?
                .reshape(&[g.groups(), g.k(), nl])?;
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

fn check_grad_y(op: &str, grad_y: &Tensor, g: &Geom) -> Result<()> {
    let want = [g.n, g.cout, g.ho, g.wo];
    if grad_y.shape != want {
        return Err(Error::shape(
            op,
            format!(
                "grad_y {:?} must be {want:?} for input ({}, {}, {}, {}) and weight ({}, {}, {}, {})",
                grad_y.shape,
                g.n,
                g.c,
                g.h,
                g.w,
                g.cout,
                g.cg(),
                g.kh,
                g.kw
            ),
        ));
    }
    Ok(())
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
    let (bs, bo) = (small(op, bias.strides[0])?, small(op, bias.offset)?);
    let program = program_for(&y.device, &CONV, y.dtype)?;
    let (cu, pu) = (small(op, c)?, small(op, p)?);
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
