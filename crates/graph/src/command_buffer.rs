//! Replay through cl_khr_command_buffer where the device has it (PoCL does; NVIDIA's OpenCL does not): the graph's kernels and copies are recorded once into a finalized command buffer, and a replay is one enqueue.
use crate::replay::Step;
use netcl_core_devices::opencl3::types::{
    cl_command_queue, cl_int, cl_kernel, cl_mem, cl_uint, cl_ulong,
};
use netcl_core_devices::{cl3, Device, Error, Result};
use std::ffi::{c_void, CString};
use std::ptr;

type CmdBuf = *mut c_void;
type SyncPoint = cl_uint;

type CreateFn =
    unsafe extern "C" fn(cl_uint, *const cl_command_queue, *const cl_ulong, *mut cl_int) -> CmdBuf;
type FinalizeFn = unsafe extern "C" fn(CmdBuf) -> cl_int;
type ReleaseFn = unsafe extern "C" fn(CmdBuf) -> cl_int;
type EnqueueFn = unsafe extern "C" fn(
    cl_uint,
    *mut cl_command_queue,
    CmdBuf,
    cl_uint,
    *const c_void,
    *mut c_void,
) -> cl_int;
type NdRangeFn = unsafe extern "C" fn(
    CmdBuf,
    cl_command_queue,
    *const cl_ulong,
    cl_kernel,
    cl_uint,
    *const usize,
    *const usize,
    *const usize,
    cl_uint,
    *const SyncPoint,
    *mut SyncPoint,
    *mut c_void,
) -> cl_int;
/// clCommandCopyBufferKHR before version 0.9.5 of the extension (no properties argument).
type CopyOldFn = unsafe extern "C" fn(
    CmdBuf,
    cl_command_queue,
    cl_mem,
    cl_mem,
    usize,
    usize,
    usize,
    cl_uint,
    *const SyncPoint,
    *mut SyncPoint,
    *mut c_void,
) -> cl_int;
/// clCommandCopyBufferKHR from version 0.9.5 (a properties argument after the queue).
type CopyNewFn = unsafe extern "C" fn(
    CmdBuf,
    cl_command_queue,
    *const cl_ulong,
    cl_mem,
    cl_mem,
    usize,
    usize,
    usize,
    cl_uint,
    *const SyncPoint,
    *mut SyncPoint,
    *mut c_void,
) -> cl_int;

/// A finalized command buffer holding a whole graph.
pub(crate) struct CommandBuffer {
    handle: CmdBuf,
    enqueue: EnqueueFn,
    release: ReleaseFn,
    /// The event of the last enqueue, when the buffer lacks simultaneous use: a command buffer
    /// still pending cannot be enqueued again, so the next replay waits for it.
    pending: std::cell::Cell<Option<netcl_core_devices::opencl3::event::Event>>,
    simultaneous: bool,
}

// SAFETY: the handle is used by the owning graph only (enqueue takes the queue of its device).
unsafe impl Send for CommandBuffer {}

const EXTENSION: &str = "cl_khr_command_buffer";
const CL_DEVICE_EXTENSIONS_WITH_VERSION: u32 = 0x1060;
const CL_DEVICE_PLATFORM: u32 = 0x1031;

/// The extension's version on `device` as (major, minor, patch), if it has the extension.
fn version(device: &Device) -> Option<(u32, u32, u32)> {
    if !device
        .info()
        .extensions
        .split_whitespace()
        .any(|e| e == EXTENSION)
    {
        return None;
    }
    let id = device.cl("command buffer").ok()?.id.id();
    let raw = cl3::device::get_device_data(id, CL_DEVICE_EXTENSIONS_WITH_VERSION).ok()?;
    // cl_name_version: a 32-bit version then a 64-byte name.
    raw.chunks_exact(68).find_map(|c| {
        let name = c[4..].split(|&b| b == 0).next()?;
        (name == EXTENSION.as_bytes()).then(|| {
            let v = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            (v >> 22, (v >> 12) & 0x3ff, v & 0xfff)
        })
    })
}

/// The address of extension function `name` on `device`'s platform.
fn function(device: &Device, name: &str) -> Option<*mut c_void> {
    let id = device.cl("command buffer").ok()?.id.id();
    let platform = cl3::device::get_device_info(id, CL_DEVICE_PLATFORM)
        .ok()?
        .to_ptr();
    let lib = cl3::load_library().as_ref().ok()?;
    let cname = CString::new(name).ok()?;
    let f = lib.clGetExtensionFunctionAddressForPlatform(platform as _, cname.as_ptr())?;
    (!f.is_null()).then_some(f)
}

fn failed(what: &str, code: cl_int) -> Error {
    Error::OpenCl {
        op: format!("{what} (graph command buffer)"),
        code,
    }
}

impl CommandBuffer {
    /// Records `steps` into a command buffer when `device` has cl_khr_command_buffer (and
    /// [`Config::graph_command_buffer`](netcl_core_devices::Config::graph_command_buffer) is on:
    /// `NETCL_GRAPH_COMMAND_BUFFER` is not 0); None otherwise, and replays enqueue step by step.
    pub(crate) fn record(device: &Device, steps: &mut [Step]) -> Result<Option<CommandBuffer>> {
        if !netcl_core_devices::Config::get().graph_command_buffer {
            return Ok(None);
        }
        let Some((major, minor, patch)) = version(device) else {
            return Ok(None);
        };
        let new_copy_abi = (major, minor, patch) >= (0, 9, 5);
        let (Some(create), Some(finalize), Some(release), Some(enqueue), Some(ndrange), Some(copy)) = (
            function(device, "clCreateCommandBufferKHR"),
            function(device, "clFinalizeCommandBufferKHR"),
            function(device, "clReleaseCommandBufferKHR"),
            function(device, "clEnqueueCommandBufferKHR"),
            function(device, "clCommandNDRangeKernelKHR"),
            function(device, "clCommandCopyBufferKHR"),
        ) else {
            return Ok(None);
        };
        // SAFETY: the addresses come from the platform for these names; the types are the
        // extension's signatures (copy's by the version the device reports).
        let (create, finalize, release, enqueue, ndrange): (
            CreateFn,
            FinalizeFn,
            ReleaseFn,
            EnqueueFn,
            NdRangeFn,
        ) = unsafe {
            (
                std::mem::transmute::<*mut c_void, CreateFn>(create),
                std::mem::transmute::<*mut c_void, FinalizeFn>(finalize),
                std::mem::transmute::<*mut c_void, ReleaseFn>(release),
                std::mem::transmute::<*mut c_void, EnqueueFn>(enqueue),
                std::mem::transmute::<*mut c_void, NdRangeFn>(ndrange),
            )
        };
        let queue = device.cl("command buffer")?.queue.get();
        // Simultaneous use (a replay enqueued while the last one runs) where the device allows it.
        const FLAGS: cl_ulong = 0x1293;
        const SIMULTANEOUS_USE: cl_ulong = 1;
        let props = [FLAGS, SIMULTANEOUS_USE, 0];
        let mut err: cl_int = 0;
        // SAFETY: one valid queue; a zero-terminated property list.
        let mut handle = unsafe { create(1, &queue, props.as_ptr(), &mut err) };
        let simultaneous = err == 0 && !handle.is_null();
        if !simultaneous {
            // SAFETY: as above, without properties.
            handle = unsafe { create(1, &queue, ptr::null(), &mut err) };
        }
        if err != 0 || handle.is_null() {
            return Err(failed("clCreateCommandBufferKHR", err));
        }
        let cb = CommandBuffer {
            handle,
            enqueue,
            release,
            pending: std::cell::Cell::new(None),
            simultaneous,
        };
        // Each command waits for the one before (in-order, whatever the implementation assumes).
        let mut last: Option<SyncPoint> = None;
        for s in steps.iter_mut() {
            let mut point: SyncPoint = 0;
            let (n_wait, wait) = match &last {
                Some(p) => (1, p as *const SyncPoint),
                None => (0, ptr::null()),
            };
            let status = match s {
                Step::Kernel(k) => {
                    let (dims, global, local) = k.ndrange();
                    // SAFETY: the kernel has all arguments set; the arrays have `dims` entries.
                    unsafe {
                        ndrange(
                            handle,
                            ptr::null_mut(),
                            ptr::null(),
                            k.cl_kernel(),
                            dims,
                            ptr::null(),
                            global.as_ptr(),
                            local.as_ptr(),
                            n_wait,
                            wait,
                            &mut point,
                            ptr::null_mut(),
                        )
                    }
                }
                Step::Copy(c) => {
                    let (src, dst) = (c.src as cl_mem, c.dst as cl_mem);
                    let (src_offset, dst_offset, len) = (c.src_offset, c.dst_offset, c.len);
                    // SAFETY: live buffers and ranges from checked copies; the ABI by version.
                    unsafe {
                        if new_copy_abi {
                            std::mem::transmute::<*mut c_void, CopyNewFn>(copy)(
                                handle,
                                ptr::null_mut(),
                                ptr::null(),
                                src,
                                dst,
                                src_offset,
                                dst_offset,
                                len,
                                n_wait,
                                wait,
                                &mut point,
                                ptr::null_mut(),
                            )
                        } else {
                            std::mem::transmute::<*mut c_void, CopyOldFn>(copy)(
                                handle,
                                ptr::null_mut(),
                                src,
                                dst,
                                src_offset,
                                dst_offset,
                                len,
                                n_wait,
                                wait,
                                &mut point,
                                ptr::null_mut(),
                            )
                        }
                    }
                }
            };
            if status != 0 {
                return Err(failed("recording a command", status));
            }
            last = Some(point);
        }
        // SAFETY: a valid command buffer, recorded above.
        let status = unsafe { finalize(handle) };
        if status != 0 {
            return Err(failed("clFinalizeCommandBufferKHR", status));
        }
        Ok(Some(cb))
    }

    /// Enqueues the whole graph on `queue` (the queue it was recorded for).
    pub(crate) fn enqueue(&self, queue: cl_command_queue) -> Result<()> {
        let _ = queue;
        if let Some(ev) = self.pending.take() {
            ev.wait()
                .map_err(|e| failed("waiting for the last replay", e.0))?;
        }
        let mut event: *mut c_void = ptr::null_mut();
        let event_out = if self.simultaneous {
            ptr::null_mut()
        } else {
            &mut event as *mut *mut c_void as *mut c_void
        };
        // SAFETY: a finalized command buffer; no queues passed means the recorded one.
        let status =
            unsafe { (self.enqueue)(0, ptr::null_mut(), self.handle, 0, ptr::null(), event_out) };
        if status != 0 {
            return Err(failed("clEnqueueCommandBufferKHR", status));
        }
        if !event.is_null() {
            self.pending
                .set(Some(netcl_core_devices::opencl3::event::Event::new(
                    event.cast(),
                )));
        }
        Ok(())
    }
}

impl Drop for CommandBuffer {
    fn drop(&mut self) {
        // SAFETY: the handle was created by this value and is released once.
        unsafe { (self.release)(self.handle) };
    }
}
