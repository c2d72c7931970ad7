//! Tensor: Arc'd storage (pooled device block or host vector) with shape, strides, offset, dtype and device.
use crate::element::{Element, HostData};
use crate::launch::{launch_1d, program_for};
use crate::layout::{
    checked_numel, contiguous_strides, is_contiguous, numel, strided_positions, KernelLayout,
};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_core_memory::{Block, Pool};
use netcl_kernels::sources::COPY;
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// Where a tensor's elements live.
pub enum Storage {
    Host(RwLock<HostData>),
    Device(Block),
}

/// An n-dimensional array on one device. Clones and views share storage; storage returns to the
/// device's pool when the last tensor referring to it drops.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Vec<usize>,
    pub(crate) offset: usize,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, {})",
            self.shape, self.dtype, self.device
        )
    }
}

impl Tensor {
    /// A new contiguous tensor wrapping host data.
    pub(crate) fn from_host_data(data: HostData, shape: &[usize]) -> Tensor {
        Tensor {
            dtype: data.dtype(),
            storage: Arc::new(Storage::Host(RwLock::new(data))),
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: 0,
            device: Device::host(),
        }
    }

    /// A new, uninitialised contiguous tensor on `device`.
    pub(crate) fn alloc(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let n = checked_numel("alloc", shape, dtype.size())?;
        let storage = if device.is_host() {
            Storage::Host(RwLock::new(HostData::filled(dtype, n, 0.0)))
        } else {
            Storage::Device(Pool::of(device)?.alloc(n * dtype.size())?)
        };
        Ok(Tensor {
            storage: Arc::new(storage),
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: 0,
            dtype,
            device: device.clone(),
        })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }
    /// True when both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    pub(crate) fn block(&self) -> Option<&Block> {
        match &*self.storage {
            Storage::Device(b) => Some(b),
            Storage::Host(_) => None,
        }
    }

    pub(crate) fn host(&self) -> Option<RwLockReadGuard<'_, HostData>> {
        match &*self.storage {
            Storage::Host(d) => Some(d.read().unwrap_or_else(|p| p.into_inner())),
            Storage::Device(_) => None,
        }
    }

    /// The elements in row-major order as host data (copies from the device when needed).
    pub fn to_host_data(&self) -> Result<HostData> {
        let t = self.contiguous()?;
        let (start, n) = (t.offset, t.numel());
        if n == 0 {
            return Ok(HostData::filled(t.dtype, 0, 0.0));
        }
        if let Some(h) = t.host() {
            return Ok(with_host!(&*h, v => Element::wrap(v[start..start + n].to_vec())));
        }
        let block = t
            .block()
            .ok_or_else(|| Error::invalid("to_host", "storage is neither host nor device"))?;
        let size = t.dtype.size();
        let mut bytes = vec![0u8; n * size];
        netcl_core_memory::read(block, start * size, &mut bytes)?;
        Ok(HostData::from_bytes(t.dtype, &bytes))
    }

    /// The elements in row-major order. `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>("to_vec")?;
        let data = self.to_host_data()?;
        T::unwrap(&data)
            .cloned()
            .ok_or_else(|| Error::dtype("to_vec", "storage dtype mismatch"))
    }

    /// The elements in row-major order, converted to f64 whatever the dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.to_host_data()?.to_f64())
    }

    pub(crate) fn check_dtype<T: Element>(&self, op: &str) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::dtype(
                op,
                format!("tensor is {} but {} was requested", self.dtype, T::DTYPE),
            ));
        }
        Ok(())
    }

    /// This tensor on `device` (shares storage when already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if &self.device == device {
            return Ok(self.clone());
        }
        let _span = netcl_profiling::span("to_device");
        let data = self.to_host_data()?;
        Tensor::from_host_data_on(data, &self.shape, device)
    }

    pub(crate) fn from_host_data_on(
        data: HostData,
        shape: &[usize],
        device: &Device,
    ) -> Result<Tensor> {
        if device.is_host() {
            return Ok(Tensor::from_host_data(data, shape));
        }
        let t = Tensor::alloc(shape, data.dtype(), device)?;
        if let Some(b) = t.block() {
            netcl_core_memory::write(b, 0, data.as_bytes())?;
        }
        Ok(t)
    }

    /// A contiguous tensor with the same elements: this one when already contiguous, else a copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let _span = netcl_profiling::span("contiguous");
        if let Some(data) = self.host_view(&self.shape, &self.strides) {
            return Ok(Tensor::from_host_data(data, &self.shape));
        }
        let out = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let layout = KernelLayout::new(
            "contiguous",
            &self.shape,
            &[(&out.strides, 0), (&self.strides, self.offset)],
        )?;
        let program = program_for(&self.device, &COPY, self.dtype)?;
        launch_1d(&program, "strided_copy", self.numel(), |k| {
            k.declare((2 * self.numel() * self.dtype.size()) as u64, 0);
            k.arg_mem(out.mem()?)?.arg_mem(self.mem()?)?.arg(&layout)?;
            Ok(())
        })?;
        Ok(out)
    }

    /// For host storage: the elements seen through (`shape`, `strides`) from this tensor's offset,
    /// in row-major order. `None` for device storage.
    pub(crate) fn host_view(&self, shape: &[usize], strides: &[usize]) -> Option<HostData> {
        let h = self.host()?;
        Some(with_host!(&*h, v => Element::wrap(gather(v, shape, strides, self.offset))))
    }

    /// The OpenCL buffer holding this tensor's storage (elements start at `offset()`), for code
    /// that enqueues work on it itself (e.g. a BLAS library on the device's queue).
    pub fn mem(&self) -> Result<netcl_core_devices::opencl3::types::cl_mem> {
        self.block()
            .map(|b| b.mem())
            .ok_or_else(|| Error::device("kernel argument", "tensor is on the host"))
    }
}

/// Elements of a strided view in row-major order.
pub(crate) fn gather<T: Copy>(
    data: &[T],
    shape: &[usize],
    strides: &[usize],
    offset: usize,
) -> Vec<T> {
    strided_positions(shape, strides, offset)
        .map(|p| data[p])
        .collect()
}
