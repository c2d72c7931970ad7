//! The OpenCL side of pooling: one kernel of kernels/pool.cl per op, one work-item per output element.
use super::{AvgPool, Geom, MaxPool2d, MaxPool2dBackward};
use crate::base::checks::u32_arg;
use crate::base::fastdiv::Div;
use crate::base::launch::{launch_1d, window_program};
use crate::base::tensor::Tensor;
use crate::base::window::{View4, Window2};
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::POOL;
use netcl_kernels::Kernel;

/// `PoolGeom` of kernels/pool.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolGeom {
    win: Window2,
    h: u32,
    w: u32,
    include_pad: u32,
    /// Channels, input and output extents as divisors.
    div: [Div; 5],
}

impl Geom {
    fn cl(&self, op: &str) -> Result<PoolGeom> {
        let w = &self.win;
        let [c, h, wi, ho, wo] = [w.c, w.h, w.w, w.ho, w.wo].map(|x| u32_arg(op, "size", x));
        let (h, wi) = (h?, wi?);
        Ok(PoolGeom {
            win: w.cl(op)?,
            h,
            w: wi,
            include_pad: self.include_pad as u32,
            div: [c?, h, wi, ho?, wo?].map(Div::new),
        })
    }
}

/// Launches pooling kernel `name` of `op` over `n` work-items with buffers `mems`, views `views`
/// and the geometry `g`.
fn launch(
    (op, name): (&str, &str),
    t: &Tensor,
    n: usize,
    mems: &[&Tensor],
    views: &[View4],
    g: &Geom,
) -> Result<()> {
    let program = window_program(&t.device, &POOL, t.dtype, g.win.kernel)?;
    let g = g.cl(op)?;
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

/// max_pool2d: values and I32 indices (N, C, Ho, Wo) from x read through its view.
pub(super) fn max_pool2d(desc: &MaxPool2d, device: &Device) -> Result<(Tensor, Tensor)> {
    let op = "max_pool2d";
    let MaxPool2d { x, g } = desc;
    let out = g.out_shape();
    let y = Tensor::alloc(&out, x.dtype, device)?;
    let idx = Tensor::alloc(&out, DType::I32, device)?;
    if y.numel() > 0 {
        let v = View4::of(op, x)?;
        launch((op, op), x, y.numel(), &[&y, &idx, x], &[v], g)?;
    }
    Ok((y, idx))
}

/// max_pool2d_backward: dx (N, C, H, W) from grad_y and the indices, both read through their views;
/// a work-item per input pixel, or per window where the windows tile the input.
pub(super) fn max_pool2d_backward(desc: &MaxPool2dBackward, device: &Device) -> Result<Tensor> {
    let op = "max_pool2d_backward";
    let MaxPool2dBackward { grad_y, indices, g } = desc;
    let dx = Tensor::alloc(&g.win.in_shape(), grad_y.dtype, device)?;
    if dx.numel() > 0 {
        let (gv, iv) = (View4::of(op, grad_y)?, View4::of(op, indices)?);
        let mems = [&dx, grad_y, indices];
        let (name, n) = match g.win.tiles_input() {
            true => ("max_pool2d_backward_tiled", grad_y.numel()),
            false => (op, dx.numel()),
        };
        launch((op, name), grad_y, n, &mems, &[gv, iv], g)?;
    }
    Ok(dx)
}

/// An average pooling or its gradient: its kernel over a new contiguous output from `src` (read
/// through its view), one work-item per output element; nothing is launched for an empty output.
pub(super) fn avg_pool(desc: &AvgPool, device: &Device) -> Result<Tensor> {
    let AvgPool { kind, src, g } = desc;
    let op = kind.name();
    let out = Tensor::alloc(&desc.out_shape(), src.dtype, device)?;
    if out.numel() > 0 {
        let v = View4::of(op, src)?;
        launch((op, op), src, out.numel(), &[&out, src], &[v], g)?;
    }
    Ok(out)
}
