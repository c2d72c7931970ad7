//! The OpenCL side of conv's own kernels (kernels/conv.cl): im2col, col2im and the channel bias; the products are matmul's.
use super::{AddChannelBias, Col2im, Geom, Im2col};
use crate::base::checks::u32_arg;
use crate::base::fastdiv::Div;
use crate::base::launch::{launch_1d, program_for, window_program};
use crate::base::layout::check_reach;
use crate::base::tensor::Tensor;
use crate::base::window::{View4, Window2};
use netcl_core_devices::{Device, DeviceKind, Result};
use netcl_kernels::sources::CONV;

/// `ConvGeom` of kernels/conv.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvGeom {
    win: Window2,
    groups: u32,
    cg: u32,
    col_stride: [u32; 4],
    /// L, K, groups, kh * kw, kw, wo, cg and the input's C, H, W as divisors.
    div: [Div; 10],
}

impl Geom {
    /// The kernels' geometry, with the strides of the columns (N, G, K, L).
    fn cl(&self, op: &str, col_stride: [usize; 4]) -> Result<ConvGeom> {
        let s = |what: &str, x: usize| u32_arg(op, what, x);
        let w = &self.win;
        let (groups, cg) = (
            s("groups", self.groups)?,
            s("channels per group", self.cg())?,
        );
        let sizes = [
            self.l(),
            self.k(),
            self.groups,
            w.kernel.0 * w.kernel.1,
            w.kernel.1,
            w.wo,
            self.cg(),
            w.c,
            w.h,
            w.w,
        ];
        let mut div = [Div::new(1); 10];
        for (d, x) in div.iter_mut().zip(sizes) {
            *d = Div::new(s("size", x)?);
        }
        Ok(ConvGeom {
            win: w.cl(op)?,
            groups,
            cg,
            div,
            col_stride: [
                s("stride", col_stride[0])?,
                s("stride", col_stride[1])?,
                s("stride", col_stride[2])?,
                s("stride", col_stride[3])?,
            ],
        })
    }
}

/// `im2col`: one work-item per column element, reading x through its view.
pub(super) fn im2col(desc: &Im2col, device: &Device) -> Result<Tensor> {
    let Im2col {
        op,
        x,
        g,
        batch_inner,
    } = desc;
    let (gr, k, l, n) = (g.groups, g.k(), g.l(), g.win.n);
    let (out, strides) = if *batch_inner {
        let t = Tensor::alloc(&[gr, k, n, l], x.dtype, device)?.permute(&[2, 0, 1, 3])?;
        let s = [t.strides[0], t.strides[1], t.strides[2], t.strides[3]];
        (t, s)
    } else {
        let t = Tensor::alloc(&[n, gr, k, l], x.dtype, device)?;
        (t, [gr * k * l, k * l, l, 1])
    };
    if out.numel() == 0 {
        return Ok(out);
    }
    let (v, cg) = (View4::of(op, x)?, g.cl(op, strides)?);
    let program = window_program(device, &CONV, x.dtype, g.win.kernel)?;
    // CPU devices take a row of columns a work-item (its index arithmetic once), GPUs an element
    // (adjacent work-items, adjacent columns).
    let (name, items) = match device.kind() == DeviceKind::Cpu {
        true => ("im2col_rows", out.numel() / g.win.wo),
        false => ("im2col", out.numel()),
    };
    launch_1d(&program, name, items, |kern| {
        kern.declare(((x.numel() + out.numel()) * x.dtype.size()) as u64, 0);
        kern.arg_mem(out.mem()?)?
            .arg_mem(x.mem()?)?
            .arg(&v)?
            .arg(&cg)?;
        Ok(())
    })?;
    Ok(out)
}

/// `col2im`: one work-item per input pixel gathering its taps in a fixed order; columns at an
/// offset are copied first (the kernel indexes them from 0).
pub(super) fn col2im(desc: &Col2im, device: &Device) -> Result<Tensor> {
    let Col2im { op, cols, g } = desc;
    let out = Tensor::alloc(&g.win.in_shape(), cols.dtype, device)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    check_reach(op, &cols.shape, &cols.strides, cols.offset)?;
    if cols.offset != 0 {
        let dense = Col2im {
            cols: cols.contiguous()?,
            ..desc.clone()
        };
        return col2im(&dense, device);
    }
    let s = [
        cols.strides[0],
        cols.strides[1],
        cols.strides[2],
        cols.strides[3],
    ];
    let (v, cg) = (View4::of(op, &out)?, g.cl(op, s)?);
    let program = window_program(device, &CONV, cols.dtype, g.win.kernel)?;
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

/// `add_channel_bias`, in place on y (fresh from the product).
pub(super) fn add_channel_bias(desc: &AddChannelBias, device: &Device) -> Result<Tensor> {
    let AddChannelBias { op, y, bias } = desc;
    let (c, p) = (y.shape[1], y.shape[2] * y.shape[3]);
    if y.numel() == 0 {
        return Ok(y.clone());
    }
    check_reach(op, &bias.shape, &bias.strides, bias.offset)?;
    let (bs, bo) = (
        u32_arg(op, "stride", bias.strides[0])?,
        u32_arg(op, "offset", bias.offset)?,
    );
    let program = program_for(device, &CONV, y.dtype)?;
    let (cu, pu) = (
        Div::new(u32_arg(op, "size", c)?),
        Div::new(u32_arg(op, "size", p)?),
    );
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
    Ok(y.clone())
}
