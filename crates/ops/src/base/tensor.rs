//! Tensor: Arc'd storage (pooled device block or host vector) with shape, strides, offset, dtype and device.
use crate::base::copy::strided_copy;
use crate::base::dispatch::{backend, dispatch, Backend, Op};
use crate::base::element::{Element, HostData};
use crate::base::layout::{
    checked_numel, contiguous_strides, is_contiguous, numel, strided_positions, strided_runs,
    KernelLayout,
};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_core_memory::{host_charge, host_give, host_release, host_vec, Block, HostBuf, Pool};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, Weak};

/// Where a tensor's elements live.
pub enum Storage {
    Host(RwLock<HostData>),
    Device(Block),
}

/// A storage and its version counter, which every in-place write bumps (the tape compares it to
/// detect values changed between forward and backward, as PyTorch's version counter does).
pub(crate) struct Stored {
    pub(crate) data: Storage,
    version: AtomicU64,
    /// Bytes counted in the host budget (host storage only).
    host_bytes: usize,
}

impl Stored {
    pub(crate) fn new(data: Storage) -> Arc<Stored> {
        let host_bytes = match &data {
            Storage::Host(d) => d.read().map(|d| d.as_bytes().len()).unwrap_or(0),
            Storage::Device(_) => 0,
        };
        host_charge(host_bytes);
        Arc::new(Stored {
            data,
            version: AtomicU64::new(0),
            host_bytes,
        })
    }
}

/// A storage's version at one moment (what autograd keeps for each value a backward rule may
/// read), holding no memory.
#[derive(Clone, Debug)]
pub struct VersionWatch {
    storage: Weak<Stored>,
    version: u64,
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Stored(version {})",
            self.version.load(Ordering::Relaxed)
        )
    }
}

impl VersionWatch {
    /// `(version then, version now)` when the storage still lives and was written in place since.
    pub fn changed(&self) -> Option<(u64, u64)> {
        let now = self.storage.upgrade()?.version.load(Ordering::Acquire);
        (now != self.version).then_some((self.version, now))
    }
}

impl Drop for Stored {
    fn drop(&mut self) {
        host_release(self.host_bytes);
        if let Storage::Host(l) = &mut self.data {
            // The allocation serves the next host tensor of its size.
            let data = l.get_mut().unwrap_or_else(|p| p.into_inner());
            with_host!(std::mem::replace(data, HostData::F32(Vec::new())), v => host_give(v))
        }
    }
}

/// An n-dimensional array on one device. Clones and views share storage; storage returns to the
/// device's pool when the last tensor referring to it drops.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Stored>,
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
            storage: Stored::new(Storage::Host(RwLock::new(data))),
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: 0,
            device: Device::host(),
        }
    }

    /// A new, uninitialised contiguous tensor on `device`.
    pub(crate) fn alloc(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let n = checked_numel("alloc", shape, dtype.size())?;
        let storage = match backend(device) {
            Backend::Host => Storage::Host(RwLock::new(HostData::try_filled(dtype, n, 0.0)?)),
            Backend::OpenCl => Storage::Device(Pool::of(device)?.alloc(n * dtype.size())?),
        };
        Ok(Tensor {
            storage: Stored::new(storage),
            strides: contiguous_strides(shape),
            shape: shape.to_vec(),
            offset: 0,
            dtype,
            device: device.clone(),
        })
    }

    /// The shape (empty for a 0-dim tensor).
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
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device the storage lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// Row-major and dense (strides of a fresh tensor of this shape).
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }
    /// How many in-place writes (`fused_into`, optimizer steps, `Parameter::assign`, ...) its
    /// storage has had; views share their storage's counter.
    pub fn version(&self) -> u64 {
        self.storage.version.load(Ordering::Acquire)
    }
    /// Records an in-place write into this tensor's storage (done by every op that writes into an
    /// existing tensor; call it where your own code writes into one by other means).
    pub fn mark_modified(&self) {
        self.storage.version.fetch_add(1, Ordering::AcqRel);
    }
    /// Remembers this storage's current version without keeping the storage alive; see
    /// [`VersionWatch::changed`].
    pub fn watch_version(&self) -> VersionWatch {
        VersionWatch {
            storage: Arc::downgrade(&self.storage),
            version: self.version(),
        }
    }
    /// A key for this tensor's storage, equal for all views of it while it lives.
    pub fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.storage) as *const () as usize
    }
    /// True when both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    pub(crate) fn block(&self) -> Option<&Block> {
        match &self.storage.data {
            Storage::Device(b) => Some(b),
            Storage::Host(_) => None,
        }
    }

    pub(crate) fn host(&self) -> Option<RwLockReadGuard<'_, HostData>> {
        match &self.storage.data {
            Storage::Host(d) => Some(d.read().unwrap_or_else(|p| p.into_inner())),
            Storage::Device(_) => None,
        }
    }

    /// The elements in row-major order as host data (copies from the device when needed).
    pub fn to_host_data(&self) -> Result<HostData> {
        let t = self.contiguous()?;
        let (start, n) = (t.offset, t.numel());
        if n == 0 {
            return HostData::try_filled(t.dtype, 0, 0.0);
        }
        if let Some(h) = t.host() {
            return Ok(with_host!(&*h, v => Element::wrap({
                let mut out = host_vec(n)?;
                out.extend_from_slice(&v[start..start + n]);
                out
            })));
        }
        let block = t
            .block()
            .ok_or_else(|| Error::invalid("to_host", "storage is neither host nor device"))?;
        let size = t.dtype.size();
        // Read straight into the typed storage: one host copy of the tensor, allocated fallibly.
        let mut data = HostData::try_filled(t.dtype, n, 0.0)?;
        netcl_core_memory::read(block, start * size, data.as_bytes_mut())?;
        crate::base::device_errors::check(t.device())?;
        Ok(data)
    }

    /// The elements in row-major order. `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>("to_vec")?;
        T::into_vec(self.to_host_data()?)
            .ok_or_else(|| Error::dtype("to_vec", "storage dtype mismatch"))
    }

    /// The elements in row-major order, converted to f64 whatever the dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.to_host_data()?.to_f64()?.into_vec())
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
        if backend(device) == Backend::Host {
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
        dispatch(&self.device, &Contiguous(self.clone()))
    }

    /// One `strided_copy` of the view (`shape`, `src` strides and offset) of this tensor into
    /// `out` at (`dst` strides and offset). A view of more dims than kernels take, even after
    /// merging, is copied as one launch per index of its first dim.
    fn copy_view_into(
        &self,
        out: &Tensor,
        shape: &[usize],
        dst: (&[usize], usize),
        src: (&[usize], usize),
    ) -> Result<()> {
        if shape.len() > crate::base::layout::MAX_DIMS
            && KernelLayout::new("contiguous", shape, &[dst, src]).is_err()
        {
            for j in 0..shape[0] {
                let dst = (&dst.0[1..], dst.1 + j * dst.0[0]);
                let src = (&src.0[1..], src.1 + j * src.0[0]);
                self.copy_view_into(out, &shape[1..], dst, src)?;
            }
            return Ok(());
        }
        strided_copy("contiguous", (out, dst), (self, src), shape)
    }

    /// For host storage: the elements seen through (`shape`, `strides`) from this tensor's offset,
    /// in row-major order, allocated fallibly within the host budget. An error for device storage.
    pub(crate) fn host_view(&self, shape: &[usize], strides: &[usize]) -> Result<HostData> {
        let h = self.host().ok_or_else(not_on_host)?;
        Ok(with_host!(&*h, v => Element::wrap(gather(v, shape, strides, self.offset)?)))
    }

    /// [`Tensor::host_view`] as f64, straight from the storage into a counted buffer.
    pub(crate) fn host_view_f64(&self, shape: &[usize], strides: &[usize]) -> Result<HostBuf<f64>> {
        let h = self.host().ok_or_else(not_on_host)?;
        let n = checked_numel("host view", shape, 8)?;
        with_host!(&*h, v => HostBuf::collect(
            n,
            strided_positions(shape, strides, self.offset).map(|p| v[p].to_f64()),
        ))
    }

    /// Record that the command of `event`, enqueued on another queue than the device's compute
    /// queue (its copy queue, say), reads or writes this tensor's memory: when the last handle
    /// drops, the pool reuses the memory only after that command has completed (PyTorch's
    /// `record_stream`). Host tensors have nothing to record.
    pub fn record_use(&self, event: &netcl_core_devices::opencl3::event::Event) -> Result<()> {
        self.block().map_or(Ok(()), |b| b.record_use(event))
    }

    /// The OpenCL buffer holding this tensor's storage (elements start at `offset()`), for code
    /// that enqueues work on it itself (e.g. a BLAS library on the device's queue).
    pub fn mem(&self) -> Result<netcl_core_devices::opencl3::types::cl_mem> {
        self.block()
            .map(|b| b.mem())
            .ok_or_else(|| Error::device("kernel argument", "tensor is on the host"))
    }
}

/// The error of host code handed a tensor without host storage.
pub(crate) fn not_on_host() -> Error {
    Error::device("host view", "host tensor without host storage")
}

/// Elements of a strided view in row-major order, allocated fallibly within the host budget.
pub(crate) fn gather<T: Copy>(
    data: &[T],
    shape: &[usize],
    strides: &[usize],
    offset: usize,
) -> Result<Vec<T>> {
    let n = checked_numel("host view", shape, std::mem::size_of::<T>())?;
    let mut v = host_vec(n)?;
    // A run along the last dim at a time (a slice copy where it is contiguous).
    for (at, len, step) in strided_runs(shape, strides, offset) {
        match step {
            1 => v.extend_from_slice(&data[at..at + len]),
            s => v.extend((0..len).map(|j| data[at + j * s])),
        }
    }
    Ok(v)
}

/// A copy of a strided view into a new contiguous tensor.
#[derive(Clone, Debug)]
struct Contiguous(Tensor);

impl Op for Contiguous {
    type Output = Tensor;
    const NAME: &'static str = "contiguous";
    fn opencl(&self, device: &Device) -> Result<Tensor> {
        let t = &self.0;
        let out = Tensor::alloc(&t.shape, t.dtype, device)?;
        if crate::base::transpose::transpose_into(t, &out)? {
            return Ok(out);
        }
        let src = (t.strides.as_slice(), t.offset);
        t.copy_view_into(&out, &t.shape, (&out.strides, 0), src)?;
        Ok(out)
    }
    fn reference(&self) -> Result<Tensor> {
        let t = &self.0;
        let data = t.host_view(&t.shape, &t.strides)?;
        Ok(Tensor::from_host_data(data, &t.shape))
    }
}
