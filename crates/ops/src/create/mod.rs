//! Creating tensors: zeros, ones, full, arange, from_vec, from_ndarray, and back to ndarray.
use crate::base::acc::arg_acc;
use crate::base::element::{Element, HostData};
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::{checked_numel, numel};
use crate::base::tensor::Tensor;
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::COPY;

impl Tensor {
    /// A tensor of `shape` filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if device.is_host() {
            return Ok(Tensor::from_host_data(
                HostData::try_filled(dtype, checked_numel("full", shape, dtype.size())?, value)?,
                shape,
            ));
        }
        let out = Tensor::alloc(shape, dtype, device)?;
        let program = program_for(device, &COPY, dtype)?;
        launch_1d(&program, "fill", out.numel(), |k| {
            k.arg_mem(out.mem()?)?;
            arg_acc(k, dtype, value)
        })?;
        Ok(out)
    }

    /// Sets every element of this tensor (a view is fine) to `value` in place: one `fill` kernel
    /// for a dense device tensor that starts at its storage's first element.
    pub fn fill_(&self, value: f64) -> Result<()> {
        if self.device.is_host() || !(self.is_contiguous() && self.offset == 0) {
            let v = Tensor::full(&[], value, self.dtype, &self.device)?;
            return crate::fused::plan::fused_into(
                &[&v],
                &[(crate::fused::expr::Expr::input(0), self)],
            );
        }
        self.mark_modified();
        if self.numel() == 0 {
            return Ok(());
        }
        let program = program_for(&self.device, &COPY, self.dtype)?;
        launch_1d(&program, "fill", self.numel(), |k| {
            k.arg_mem(self.mem()?)?;
            arg_acc(k, self.dtype, value)
        })
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
        crate::fused::plan::fused_into(&[&src], &[(crate::fused::expr::Expr::input(0), self)])
    }

    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
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
        let n = count as usize;
        if device.is_host() {
            let data = match dtype {
                DType::F64 => HostData::from_fn(dtype, n, |i| start + i as f64 * step),
                DType::I32 => HostData::from_fn(dtype, n, |i| {
                    (start as i64 as i32).wrapping_add((i as i32).wrapping_mul(step as i64 as i32))
                        as f64
                }),
                DType::U32 => HostData::from_fn(dtype, n, |i| {
                    (start as i64 as u32).wrapping_add((i as u32).wrapping_mul(step as i64 as u32))
                        as f64
                }),
                _ => {
                    HostData::from_fn(dtype, n, |i| (start as f32 + i as f32 * step as f32) as f64)
                }
            };
            return Ok(Tensor::from_host_data(data, &[n]));
        }
        let out = Tensor::alloc(&[n], dtype, device)?;
        let program = program_for(device, &COPY, dtype)?;
        launch_1d(&program, "arange", n, |k| {
            k.arg_mem(out.mem()?)?;
            arg_acc(k, dtype, start)?;
            arg_acc(k, dtype, step)
        })?;
        Ok(out)
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
