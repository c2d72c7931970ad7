//! Creating tensors: zeros, ones, full, arange, from_vec, from_ndarray, and back to ndarray.
mod opencl;
mod reference;
use crate::base::dispatch::dispatch;
use crate::base::element::Element;
use crate::base::layout::{checked_numel, numel};
use crate::base::tensor::Tensor;
use crate::fused::eval::fused_into;
use crate::fused::expr::Expr;
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use netcl_core_devices::{DType, Device, Error, Result};

/// A new tensor of `shape` and `dtype` with every element `value` (converted to `dtype`).
#[derive(Clone, Debug)]
struct Full {
    shape: Vec<usize>,
    value: f64,
    dtype: DType,
}

impl_op!(Full, Tensor, "full", full);

/// Every element of `out`, a dense tensor (contiguous from its storage's first element), set to
/// `value` in place.
#[derive(Clone, Debug)]
struct Fill {
    out: Tensor,
    value: f64,
}

impl_op!(Fill, (), "fill_", fill_);

/// The checked range `start + i * step` for i below `n`, a new 1-D tensor of `dtype`.
#[derive(Clone, Debug)]
struct Arange {
    start: f64,
    step: f64,
    n: usize,
    dtype: DType,
}

impl_op!(Arange, Tensor, "arange", arange);

/// `t` (any view) set to `value` in place by an elementwise expression (a 0-dim `value`
/// broadcast into it).
fn fill_by_expr(t: &Tensor, value: f64) -> Result<()> {
    let v = Tensor::full(&[], value, t.dtype, &t.device)?;
    fused_into(&[&v], &[(Expr::input(0), t)])
}

impl Tensor {
    /// A tensor of `shape` filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let op = Full {
            shape: shape.to_vec(),
            value,
            dtype,
        };
        dispatch(device, &op)
    }

    /// Sets every element of this tensor (a view is fine) to `value` in place: one `fill` kernel
    /// for a dense device tensor that starts at its storage's first element.
    pub fn fill_(&self, value: f64) -> Result<()> {
        if !(self.is_contiguous() && self.offset == 0) {
            return fill_by_expr(self, value);
        }
        let op = Fill {
            out: self.clone(),
            value,
        };
        dispatch(&self.device, &op)
    }

    /// Copies `src` (same shape and dtype, any device and layout) into this tensor in place, so
    /// every view of this storage sees the new values: one elementwise kernel on a device.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        if src.shape != self.shape || src.dtype != self.dtype {
            return Err(Error::shape(
                "copy_",
                format!(
                    "source {:?} {} into destination {:?} {}",
                    src.shape, src.dtype, self.shape, self.dtype
                ),
            ));
        }
        let src = if src.device == self.device {
            src.clone()
        } else {
            src.to_device(&self.device)?
        };
        fused_into(&[&src], &[(Expr::input(0), self)])
    }

    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// A new contiguous tensor whose elements are unspecified (PyTorch's `torch.empty`): pool
    /// memory as the last user left it on a device, zeros on the host. For code that writes
    /// every element before reading any, so that nothing is spent on a fill.
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::alloc(shape, dtype, device)
    }

    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// `start, start + step, ...` below `end` (above it for a negative step), as a 1-D tensor.
    /// Element i is `start + i * step` computed in the dtype's arithmetic type, identically on every device.
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::invalid(
                "arange",
                format!(
                    "start {start}, end {end}, step {step}: need finite values and a non-zero step"
                ),
            ));
        }
        let count = ((end - start) / step).ceil().max(0.0);
        if count > u32::MAX as f64 {
            return Err(Error::shape(
                "arange",
                format!("{count} elements exceed the 32-bit kernel index"),
            ));
        }
        let op = Arange {
            start,
            step,
            n: count as usize,
            dtype,
        };
        dispatch(device, &op)
    }

    /// A tensor of `shape` holding `data` (row-major) on `device`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        if data.len() != checked_numel("from_vec", shape, T::DTYPE.size())? {
            return Err(Error::shape(
                "from_vec",
                format!(
                    "{} elements do not fill shape {shape:?} ({} elements)",
                    data.len(),
                    numel(shape)
                ),
            ));
        }
        Tensor::from_host_data_on(T::wrap(data), shape, device)
    }

    /// A tensor with the contents and shape of an ndarray array (any layout) on `device`.
    pub fn from_ndarray<T: Element>(array: ArrayViewD<'_, T>, device: &Device) -> Result<Tensor> {
        let shape = array.shape().to_vec();
        Tensor::from_vec(array.iter().copied().collect(), &shape, device)
    }

    /// The elements as an ndarray array (copied to the host). `T` must match the dtype.
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
        let v = self.to_vec::<T>()?;
        ArrayD::from_shape_vec(IxDyn(&self.shape), v)
            .map_err(|e| Error::shape("to_ndarray", e.to_string()))
    }
}
