//! Reading a tensor without waiting: the copy is queued behind the work enqueued so far, and the caller enqueues more before collecting it.
use crate::base::device_errors::{check_async, PendingCheck};
use crate::base::element::{Element, HostData};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};
use netcl_core_memory::Pending;

/// A read of a tensor's elements in flight ([`Tensor::read_async`]).
#[must_use = "the elements arrive only through wait (dropping it waits for the copy)"]
pub struct TensorRead {
    /// The tensor read (kept alive until the copy is done).
    tensor: Tensor,
    copy: Option<Pending<Vec<u8>>>,
    /// The device's error record, read behind the copy (so `wait` does not block on later work).
    check: Option<PendingCheck>,
}

impl Tensor {
    /// Starts copying the elements (row-major) to the host and returns at once: the device's
    /// queue runs the copy after the work enqueued so far and before any enqueued later, so a
    /// caller can queue the next step's kernels and then [`TensorRead::wait`] (a decoder
    /// reading token ids while the next token is being computed). Views are first made
    /// contiguous (one kernel); host tensors are read at `wait`.
    pub fn read_async(&self) -> Result<TensorRead> {
        let t = self.contiguous()?;
        let copy = match t.block() {
            Some(block) if t.numel() > 0 => {
                let size = t.dtype.size();
                Some(netcl_core_memory::read_async(
                    block,
                    t.offset * size,
                    t.numel() * size,
                )?)
            }
            _ => None,
        };
        let check = match copy {
            Some(_) => Some(check_async(t.device())?),
            None => None,
        };
        Ok(TensorRead {
            tensor: t,
            copy,
            check,
        })
    }
}

impl TensorRead {
    /// Waits for the copy and returns the elements; `T` must match the dtype.
    pub fn wait<T: Element>(self) -> Result<Vec<T>> {
        let TensorRead {
            tensor,
            copy,
            check,
        } = self;
        tensor.check_dtype::<T>("TensorRead::wait")?;
        let data = match copy {
            Some(copy) => {
                let bytes = copy.wait()?;
                if let Some(check) = check {
                    check.finish()?;
                }
                HostData::from_bytes(tensor.dtype, &bytes)?
            }
            None => tensor.to_host_data()?,
        };
        T::into_vec(data).ok_or_else(|| Error::dtype("TensorRead::wait", "storage dtype mismatch"))
    }
}
