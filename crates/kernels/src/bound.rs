//! Kernel objects whose arguments are set once, for replaying a captured graph: each replay is one clEnqueueNDRangeKernel per node, with no argument setting and no checks.
use crate::program::Program;
use netcl_core_devices::opencl3::kernel::Kernel as ClKernel;
use netcl_core_devices::opencl3::types::{cl_command_queue, cl_event, cl_kernel, cl_mem};
use netcl_core_devices::{cl3, ClResultExt, Error, Result};
use std::sync::Arc;

/// One argument of a bound kernel.
#[derive(Clone, Debug)]
pub enum BoundArg {
    Mem(cl_mem),
    Bytes(Vec<u8>),
    Local(usize),
}

/// A kernel object of its own (not shared with eager launches) with all arguments set.
pub struct BoundKernel {
    kernel: ClKernel,
    /// Keeps the program (and its context) alive as long as the kernel.
    _program: Arc<Program>,
    name: String,
    global: [usize; 3],
    local: [usize; 3],
    dims: u32,
}

// SAFETY: the kernel object is owned by this value alone; its arguments are only set in `new`,
// and enqueueing a kernel from one thread at a time is what `&mut self` in `enqueue` enforces.
unsafe impl Send for BoundKernel {}

impl BoundKernel {
    /// Creates `name` of `program` with `args` set, to run over `global` in groups of `local`
    /// (1 to 3 dims, `global` already a multiple of `local`).
    pub fn new(
        program: &Arc<Program>,
        name: &str,
        args: &[BoundArg],
        global: &[usize],
        local: &[usize],
    ) -> Result<BoundKernel> {
        let fail = |msg: String| Error::Launch {
            kernel: name.to_string(),
            msg,
        };
        let kernel = ClKernel::create(&program.inner, name).map_err(|e| {
            fail(format!(
                "not found in {} ({})",
                program.source.name,
                netcl_core_devices::cl_code_name(e.0)
            ))
        })?;
        let n = kernel.num_args().cl("clGetKernelInfo")?;
        if n as usize != args.len() {
            return Err(fail(format!(
                "{} arguments recorded, the kernel takes {n}",
                args.len()
            )));
        }
        let dims = global.len();
        if dims == 0 || dims > 3 || local.len() != dims {
            return Err(fail(format!("global {global:?} / local {local:?}")));
        }
        check_group(&kernel, program, args, local).map_err(fail)?;
        for (i, a) in args.iter().enumerate() {
            let i = i as u32;
            // SAFETY: index within num_args; values are what the recorded launch passed.
            let r = unsafe {
                match a {
                    BoundArg::Mem(m) => kernel.set_arg(i, m),
                    BoundArg::Bytes(b) => {
                        cl3::kernel::set_kernel_arg(kernel.get(), i, b.len(), b.as_ptr().cast())
                            .map_err(netcl_core_devices::opencl3::error_codes::ClError)
                    }
                    BoundArg::Local(bytes) => kernel.set_arg_local_buffer(i, *bytes),
                }
            };
            r.map_err(|e| {
                fail(format!(
                    "argument {i}: {}",
                    netcl_core_devices::cl_code_name(e.0)
                ))
            })?;
        }
        let mut g = [1usize; 3];
        let mut l = [1usize; 3];
        g[..dims].copy_from_slice(global);
        l[..dims].copy_from_slice(local);
        Ok(BoundKernel {
            kernel,
            _program: program.clone(),
            name: name.to_string(),
            global: g,
            local: l,
            dims: dims as u32,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw kernel object (for recording it into a command buffer).
    pub fn cl_kernel(&self) -> cl_kernel {
        self.kernel.get()
    }

    /// Work dims, global and local sizes as the enqueue passes them.
    pub fn ndrange(&self) -> (u32, &[usize], &[usize]) {
        let d = self.dims as usize;
        (self.dims, &self.global[..d], &self.local[..d])
    }

    /// Enqueues the kernel on `queue` after the events of `wait` (none: the whole host cost of a
    /// replayed node), writing its own event to `event` unless that is null (a replay spread over
    /// several queues).
    ///
    /// # Safety
    /// `queue` belongs to the kernel's context, and every buffer argument is alive; `wait` holds
    /// valid events of the same context; `event` is null or writable (the caller then owns the
    /// event and releases it).
    pub unsafe fn enqueue(
        &mut self,
        queue: cl_command_queue,
        wait: &[cl_event],
        event: *mut cl_event,
    ) -> Result<()> {
        let (_, global, local) = self.ndrange();
        // SAFETY: the caller's contract; all arguments were set in `new`.
        unsafe { crate::launch::enqueue(queue, self.kernel.get(), global, local, wait, event) }
            .map_err(|status| Error::Launch {
                kernel: self.name.clone(),
                msg: format!(
                    "clEnqueueNDRangeKernel in a graph replay: {} ({status})",
                    netcl_core_devices::cl_code_name(status)
                ),
            })
    }
}

/// What the compiled kernel allows, checked before its first enqueue (a graph file may ask for
/// anything): the work-group size it was compiled for (`reqd_work_group_size`) or at most its
/// limit, and its static plus dynamic local memory within the device's.
fn check_group(
    kernel: &ClKernel,
    program: &Program,
    args: &[BoundArg],
    local: &[usize],
) -> std::result::Result<(), String> {
    let device = program
        .device
        .cl("BoundKernel")
        .map_err(|e| e.to_string())?
        .id
        .id();
    let query = |e: netcl_core_devices::opencl3::error_codes::ClError| {
        format!(
            "clGetKernelWorkGroupInfo: {}",
            netcl_core_devices::cl_code_name(e.0)
        )
    };
    let required = kernel.get_compile_work_group_size(device).map_err(query)?;
    let mut want = [1usize; 3];
    want[..local.len()].copy_from_slice(local);
    if required.iter().any(|&r| r != 0) && required.as_slice() != want.as_slice() {
        return Err(format!(
            "local {local:?}; the kernel was compiled for work-groups of {required:?}"
        ));
    }
    let limit = kernel.get_work_group_size(device).map_err(query)?;
    let group: usize = local.iter().product();
    if group > limit {
        return Err(format!(
            "local {local:?}: {group} work-items; the kernel takes at most {limit}"
        ));
    }
    let dynamic: u64 = args
        .iter()
        .map(|a| match a {
            BoundArg::Local(n) => *n as u64,
            _ => 0,
        })
        .sum();
    let local_mem = kernel.get_local_mem_size(device).map_err(query)? + dynamic;
    let cap = crate::launch::local_limit(program);
    if local_mem > cap {
        return Err(format!(
            "needs {local_mem} B of local memory; the device has {cap} B"
        ));
    }
    Ok(())
}
