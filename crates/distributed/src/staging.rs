//! Raw non-blocking copies between a device buffer and host memory on a chosen queue, ordered by event wait lists, and tensor <-> host f32 helpers.
use netcl_core_devices::opencl3::command_queue::CommandQueue;
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::opencl3::types::{cl_event, cl_mem};
use netcl_core_devices::{cl3, ClResultExt, DType, Device, Error, Result};
use netcl_core_memory::{enqueue_read, enqueue_write};
use netcl_ops::{fused_into, Expr, Tensor};

/// Which of a device's in-order queues a copy goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    Compute,
    Copy,
    Relay,
}

pub(crate) fn queue(device: &Device, q: Queue) -> Result<&CommandQueue> {
    let cl = device.cl("collective staging")?;
    Ok(match q {
        Queue::Compute => &cl.queue,
        Queue::Copy => &cl.copy_queue,
        Queue::Relay => &cl.relay_queue,
    })
}

fn wait_list(wait: &[&Event]) -> Vec<cl_event> {
    wait.iter().map(|e| e.get()).collect()
}

/// Start reading `len` bytes of `mem` at `offset` into `dst`, after the `wait` events.
/// SAFETY: `dst` must stay valid, and unread, until the returned event completes.
pub(crate) unsafe fn read(
    device: &Device,
    q: Queue,
    mem: cl_mem,
    offset: usize,
    dst: *mut u8,
    len: usize,
    wait: &[&Event],
) -> Result<Event> {
    enqueue_read(
        queue(device, q)?,
        mem,
        offset,
        dst,
        len,
        false,
        &wait_list(wait),
    )
}

/// Start writing `len` bytes from `src` into `mem` at `offset`, after the `wait` events.
/// SAFETY: `src` must stay valid and unchanged until the returned event completes.
pub(crate) unsafe fn write(
    device: &Device,
    q: Queue,
    mem: cl_mem,
    offset: usize,
    src: *const u8,
    len: usize,
    wait: &[&Event],
) -> Result<Event> {
    enqueue_write(
        queue(device, q)?,
        mem,
        offset,
        src,
        len,
        false,
        &wait_list(wait),
    )
}

/// An event that completes once everything enqueued on `q` so far (and the `wait` events) has.
pub(crate) fn marker(device: &Device, q: Queue, wait: &[&Event]) -> Result<Event> {
    let list = wait_list(wait);
    // SAFETY: the wait list holds live events for the duration of the call.
    let ev = unsafe {
        cl3::command_queue::enqueue_marker_with_wait_list(
            queue(device, q)?.get(),
            list.len() as u32,
            if list.is_empty() {
                std::ptr::null()
            } else {
                list.as_ptr()
            },
        )
    }
    .cl("clEnqueueMarkerWithWaitList")?;
    Ok(Event::new(ev))
}

/// A marker after everything enqueued so far on the compute queue, with that queue flushed so
/// the driver starts the work now rather than when it next looks at the queue.
pub(crate) fn compute_done(device: &Device) -> Result<Event> {
    let ev = marker(device, Queue::Compute, &[])?;
    queue(device, Queue::Compute)?.flush().cl("clFlush")?;
    Ok(ev)
}

/// Checks that `t` is a contiguous f32 tensor (what the collectives move and reduce).
pub(crate) fn check_f32(op: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::dtype(
            op,
            format!(
                "tensor is {} {:?}; collectives take f32",
                t.dtype(),
                t.shape()
            ),
        ));
    }
    if !t.is_contiguous() {
        return Err(Error::invalid(
            op,
            format!(
                "tensor {:?} is a strided view; collectives take contiguous tensors (call contiguous())",
                t.shape()
            ),
        ));
    }
    Ok(())
}

/// Overwrites the elements of the contiguous f32 tensor `t` with `data` (same length).
pub(crate) fn write_tensor(t: &Tensor, data: &[f32]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if t.device().is_host() {
        let src = Tensor::from_vec(data.to_vec(), t.shape(), t.device())?;
        return fused_into(&[&src], &[(Expr::input(0), t)]);
    }
    let bytes = std::mem::size_of_val(data);
    // SAFETY: `data` outlives the wait below.
    let ev = unsafe {
        write(
            t.device(),
            Queue::Compute,
            t.mem()?,
            t.offset() * 4,
            data.as_ptr().cast(),
            bytes,
            &[],
        )?
    };
    ev.wait().cl("clWaitForEvents")?;
    t.mark_modified();
    Ok(())
}
