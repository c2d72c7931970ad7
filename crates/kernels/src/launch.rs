//! Checked kernel launches: per-thread kernel objects, arguments, work-group and local-memory checks.
use crate::decl::{value_bytes, KernelDecl, Use};
use crate::program::Program;
use netcl_core_devices::opencl3::kernel::Kernel as ClKernel;
use netcl_core_devices::opencl3::types::{cl_command_queue, cl_event, cl_kernel, cl_mem};
use netcl_core_devices::{cl3, ClResultExt, Device, Error, Result};
use netcl_core_memory::capture;
use netcl_profiling::{Launch, Probe, Work};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ptr;
use std::sync::{Arc, Mutex};

struct Entry {
    kernel: ClKernel,
    name: String,
    /// How the kernel uses each argument (its source's declaration).
    decl: &'static KernelDecl,
    num_args: u32,
    work_group_size: usize,
    local_mem: u64,
    /// The local memory a launch may use: the device's, or what an sm_90a program declared.
    local_limit: u64,
    launches: u64,
}

thread_local! {
    // cl_kernel argument state is not thread-safe: every thread gets its own kernel objects.
    // A live `Kernel` takes its entry out of this map and puts it back on drop, so two handles
    // never share (and overwrite) one kernel's arguments.
    static KERNELS: RefCell<ThreadKernels> = RefCell::new(ThreadKernels::default());
}

/// One thread's kernel objects. When the thread exits they are not released there but handed
/// to [`RETIRED`], released by the next `Kernel::new` on a live thread: a driver's own
/// per-thread state may already be destroyed while this thread's destructors run (Oclgrind's
/// API call stack is; clReleaseKernel then wrote into freed memory, corrupting the heap).
#[derive(Default)]
struct ThreadKernels(HashMap<(u64, String), Entry>);

impl std::ops::Deref for ThreadKernels {
    type Target = HashMap<(u64, String), Entry>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ThreadKernels {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for ThreadKernels {
    fn drop(&mut self) {
        let mut retired = RETIRED.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.0.len() as u64;
        retired.extend(self.0.drain().map(|(_, e)| e.kernel));
        RETIRED_COUNT.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Kernel objects of exited threads, to be released from a live one.
static RETIRED: Mutex<Vec<ClKernel>> = Mutex::new(Vec::new());

/// How many kernel objects exiting threads have handed over so far (each released later by a
/// live thread's `Kernel::new`, never in the exiting thread's destructors).
pub fn retired_kernels() -> u64 {
    RETIRED_COUNT.load(std::sync::atomic::Ordering::Relaxed)
}

static RETIRED_COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Releases the kernel objects exited threads left (outside the lock).
fn release_retired() {
    let retired = std::mem::take(&mut *RETIRED.lock().unwrap_or_else(|p| p.into_inner()));
    drop(retired);
}

/// How many times this thread has launched kernels named `name` (of any program) through
/// [`Kernel::launch`], counting launches over empty grids; lets tests check which kernel an op chose.
pub fn thread_launches(name: &str) -> u64 {
    KERNELS.with(|k| {
        k.borrow()
            .values()
            .filter(|e| e.name == name)
            .map(|e| e.launches)
            .sum()
    })
}

/// How many kernels this thread has launched through [`Kernel::launch`] (all names).
pub fn thread_launches_total() -> u64 {
    KERNELS.with(|k| k.borrow().values().map(|e| e.launches).sum())
}

/// One launch of a kernel: set its arguments in order, then `launch`.
pub struct Kernel {
    entry: Option<Entry>,
    program: Arc<Program>,
    next_arg: u32,
    dynamic_local: u64,
    /// What the next launch declares to the profiler.
    work: Option<Work>,
    /// The arguments set so far, while this thread captures a graph on the kernel's device.
    recorded: Option<Vec<capture::Arg>>,
    /// Argument pairs of the next launch that may share a buffer (see `allow_in_place`).
    in_place: Vec<(usize, usize)>,
}

/// The local memory `program`'s kernels may use: the device's, or for sm_90a programs, which
/// declare more than OpenCL's limit in their PTX (program.rs), what they declared (the driver
/// checks it at enqueue).
pub(crate) fn local_limit(program: &Program) -> u64 {
    let device = program.device.info().local_mem_bytes;
    crate::program::sm90a_shared(&program.options).map_or(device, |s| device.max(s as u64 + 1024))
}

impl Kernel {
    /// The kernel `name` of `program`, as this thread's own kernel object.
    pub fn new(program: &Arc<Program>, name: &str) -> Result<Kernel> {
        if name.contains('\0') {
            return Err(Error::invalid(
                "Kernel::new",
                format!("kernel name {name:?} contains a NUL byte"),
            ));
        }
        let decl = program.source.declaration(name).ok_or_else(|| Error::Launch {
            kernel: name.to_string(),
            msg: format!(
                "{} declares no such kernel (each kernel is declared once: crates/kernels/src/decls.rs for kernels/*.cl)",
                program.source.name
            ),
        })?;
        let key = (program.id, name.to_string());
        release_retired();
        let cached = KERNELS.with(|k| k.borrow_mut().remove(&key));
        let entry = match cached {
            Some(e) => e,
            None => {
                let cl = program.device.cl(name)?;
                let kernel = ClKernel::create(&program.inner, name).map_err(|e| Error::Launch {
                    kernel: name.to_string(),
                    msg: format!(
                        "not found in kernels/{} ({})",
                        program.source.name,
                        netcl_core_devices::cl_code_name(e.0)
                    ),
                })?;
                let dev = cl.id.id();
                let num_args = kernel.num_args().cl("clGetKernelInfo")?;
                if num_args as usize != decl.params.len() {
                    return Err(Error::Launch {
                        kernel: name.to_string(),
                        msg: format!(
                            "declared with {} arguments, but kernels/{} defines it with {num_args}",
                            decl.params.len(),
                            program.source.name
                        ),
                    });
                }
                Entry {
                    decl,
                    num_args,
                    work_group_size: kernel
                        .get_work_group_size(dev)
                        .cl("CL_KERNEL_WORK_GROUP_SIZE")?,
                    local_mem: kernel
                        .get_local_mem_size(dev)
                        .cl("CL_KERNEL_LOCAL_MEM_SIZE")?,
                    local_limit: local_limit(program),
                    kernel,
                    name: name.to_string(),
                    launches: 0,
                }
            }
        };
        Ok(Kernel {
            entry: Some(entry),
            program: program.clone(),
            next_arg: 0,
            dynamic_local: 0,
            work: None,
            recorded: capture::capturing(&program.device).then(Vec::new),
            in_place: Vec::new(),
        })
    }

    fn entry(&self) -> &Entry {
        self.entry
            .as_ref()
            .expect("a live Kernel holds its entry until drop")
    }

    pub fn name(&self) -> &str {
        &self.entry().name
    }

    /// The largest work-group this kernel can run with on its device.
    pub fn max_work_group_size(&self) -> usize {
        // sm_90a programs state their size in the PTX, which the driver's query does not see.
        if let Some(n) = crate::program::sm90a_threads(&self.program.options) {
            return n;
        }
        self.entry()
            .work_group_size
            .min(self.program.device.info().max_work_group_size)
    }

    /// The index of the next argument, once its declaration takes what is being set (`what`,
    /// for the error: "a buffer", "a value of 4 bytes", "local memory").
    fn next_index(&mut self, what: &str, fits: impl FnOnce(Use) -> bool) -> Result<u32> {
        let i = self.next_arg;
        let Some(param) = self.entry().decl.params.get(i as usize) else {
            return Err(Error::Launch {
                kernel: self.entry().name.clone(),
                msg: format!("more than its {} arguments given", self.entry().num_args),
            });
        };
        if !fits(param.usage) {
            return Err(Error::Launch {
                kernel: self.entry().name.clone(),
                msg: format!(
                    "argument {i} ({}) is declared {:?}, but {what} was given",
                    param.name, param.usage
                ),
            });
        }
        self.next_arg += 1;
        Ok(i)
    }

    /// The next argument is a value of `bytes` bytes.
    fn next_value(&mut self, bytes: usize) -> Result<u32> {
        self.next_index(&format!("a value of {bytes} bytes"), |u| match u {
            Use::Value(ty) => value_bytes(ty).is_none_or(|b| b == bytes),
            _ => false,
        })
    }

    /// Set the next argument to a plain value (a scalar, or a `#[repr(C)]` struct matching the kernel's).
    pub fn arg<T: Copy>(&mut self, value: &T) -> Result<&mut Self> {
        let i = self.next_value(size_of::<T>())?;
        // SAFETY: the index is within num_args and the value is plain data of the size passed.
        unsafe { self.entry().kernel.set_arg(i, value) }.map_err(|e| self.arg_error(i, e.0))?;
        if let Some(r) = &mut self.recorded {
            // SAFETY: `value` is plain data of `size_of::<T>()` bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>())
            };
            r.push(capture::Arg::Bytes(bytes.to_vec()));
        }
        Ok(self)
    }

    /// Set the next argument to raw bytes (a struct whose size is only known at run time, e.g. a
    /// generated kernel's layout; the bytes must match the kernel's struct layout).
    pub fn arg_bytes(&mut self, bytes: &[u8]) -> Result<&mut Self> {
        let i = self.next_value(bytes.len())?;
        // SAFETY: the index is within num_args; the pointer and size describe `bytes`.
        unsafe {
            cl3::kernel::set_kernel_arg(
                self.entry().kernel.get(),
                i,
                bytes.len(),
                bytes.as_ptr().cast(),
            )
        }
        .map_err(|e| self.arg_error(i, e))?;
        if let Some(r) = &mut self.recorded {
            r.push(capture::Arg::Bytes(bytes.to_vec()));
        }
        Ok(self)
    }

    /// Set the next argument to a buffer.
    pub fn arg_mem(&mut self, mem: cl_mem) -> Result<&mut Self> {
        let i = self.next_index("a buffer", |u| matches!(u, Use::In | Use::Out))?;
        // SAFETY: the index is within num_args and a cl_mem is what a buffer argument takes.
        unsafe { self.entry().kernel.set_arg(i, &mem) }.map_err(|e| self.arg_error(i, e.0))?;
        if let Some(r) = &mut self.recorded {
            r.push(capture::Arg::Mem(mem as capture::Mem));
        }
        Ok(self)
    }

    /// Set the next argument to `bytes` of dynamic local memory (checked at launch).
    pub fn arg_local(&mut self, bytes: usize) -> Result<&mut Self> {
        let i = self.next_index("local memory", |u| u == Use::Local)?;
        // SAFETY: a local-memory argument takes a size and no value.
        unsafe { self.entry().kernel.set_arg_local_buffer(i, bytes) }
            .map_err(|e| self.arg_error(i, e.0))?;
        self.dynamic_local += bytes as u64;
        if let Some(r) = &mut self.recorded {
            r.push(capture::Arg::Local(bytes));
        }
        Ok(self)
    }

    fn arg_error(&self, i: u32, code: i32) -> Error {
        Error::Launch {
            kernel: self.entry().name.clone(),
            msg: format!(
                "argument {i}: {} ({code})",
                netcl_core_devices::cl_code_name(code)
            ),
        }
    }

    /// Declare the work of the next launch for the profiler: bytes read and written in global
    /// memory, floating-point operations (free when the profiler is off).
    pub fn declare(&mut self, bytes: u64, flops: u64) -> &mut Self {
        self.work = Some(Work { bytes, flops });
        self
    }

    /// Declare that output argument `output` and input argument `input` of the next launch may
    /// be one buffer: the kernel reads each input element only in the work-item that writes the
    /// same output element, before writing it. A captured graph's planner uses it to run such a
    /// kernel in place when the input dies there. Kept only while capturing (an eager launch
    /// allocates nothing for it).
    pub fn allow_in_place(&mut self, output: usize, input: usize) -> &mut Self {
        if self.recorded.is_some() {
            self.in_place.push((output, input));
        }
        self
    }

    /// The OpenCL kernel object (arguments as set so far), for code that enqueues it itself.
    pub fn cl_kernel(&self) -> cl_kernel {
        self.entry().kernel.get()
    }

    /// Enqueue over `global` work-items (1 to 3 dims) in work-groups of `local`. Each global size is
    /// rounded up to a multiple of its local size, so kernels bounds-check their index. Everything
    /// is checked before the enqueue; nothing is enqueued on error, and the arguments are reset.
    pub fn launch(&mut self, global: &[usize], local: &[usize]) -> Result<()> {
        let work = self.work.take();
        let in_place = std::mem::take(&mut self.in_place);
        let result = self.try_launch(global, local, work, in_place);
        self.next_arg = 0;
        self.dynamic_local = 0;
        if let Some(r) = &mut self.recorded {
            r.clear();
        }
        if let (Ok(()), Some(e)) = (&result, self.entry.as_mut()) {
            e.launches += 1;
        }
        result
    }

    fn try_launch(
        &self,
        global: &[usize],
        local: &[usize],
        work: Option<Work>,
        in_place: Vec<(usize, usize)>,
    ) -> Result<()> {
        let probe = Probe::begin();
        let fail = |msg: String| {
            Err(Error::Launch {
                kernel: self.entry().name.clone(),
                msg,
            })
        };
        let device: &Device = &self.program.device;
        let info = device.info();
        if global.is_empty() || global.len() > 3 || local.len() != global.len() {
            return fail(format!(
                "global {global:?} and local {local:?} must both have 1 to 3 dims"
            ));
        }
        if self.next_arg != self.entry().num_args {
            return fail(format!(
                "{} of its {} arguments set",
                self.next_arg,
                self.entry().num_args
            ));
        }
        if global.contains(&0) {
            return Ok(());
        }
        let group: usize = local.iter().product();
        if local.contains(&0) || group > self.max_work_group_size() {
            return fail(format!(
                "work-group {local:?} ({group} items) exceeds the limit of {} on {device}",
                self.max_work_group_size()
            ));
        }
        for (d, &l) in local.iter().enumerate() {
            if info.max_work_item_sizes.get(d).is_some_and(|&m| l > m) {
                return fail(format!(
                    "local size {l} in dim {d} exceeds {} on {device}",
                    info.max_work_item_sizes[d]
                ));
            }
        }
        let limit = self.entry().local_limit;
        let local_mem = self.entry().local_mem + self.dynamic_local;
        if local_mem > limit {
            return fail(format!(
                "needs {local_mem} B of local memory; {device} has {limit} B"
            ));
        }
        let mut rounded = [1usize; 3];
        for d in 0..global.len() {
            rounded[d] = global[d].div_ceil(local[d]) * local[d];
        }
        let cl = device.cl(&self.entry().name)?;
        // An event only when the profiler is on: it keeps it and reads its device times.
        let mut event: cl_event = ptr::null_mut();
        let event_out = if probe.is_some() {
            &mut event as *mut cl_event
        } else {
            ptr::null_mut()
        };
        let dims = global.len();
        // SAFETY: all arguments are set, sizes are checked, and the arrays outlive the call.
        unsafe {
            enqueue(
                cl.queue.get(),
                self.entry().kernel.get(),
                &rounded[..dims],
                local,
                &[],
                event_out,
            )
        }
        .map_err(|code| Error::Launch {
            kernel: self.entry().name.clone(),
            msg: format!(
                "clEnqueueNDRangeKernel: {} ({code})",
                netcl_core_devices::cl_code_name(code)
            ),
        })?;
        if let Some(args) = &self.recorded {
            capture::record(device, || {
                capture::Event::Launch(capture::LaunchRecord {
                    program: self.program.clone(),
                    kernel: self.entry().name.clone(),
                    args: args.clone(),
                    global: rounded[..dims].to_vec(),
                    local: local.to_vec(),
                    work: work.map(|w| (w.bytes, w.flops)),
                    in_place,
                    writes: self.entry().decl.writes(),
                })
            });
        }
        if let Some(probe) = probe {
            let launch = Launch {
                kernel: &self.entry().name,
                device,
                global: &rounded[..dims],
                local,
                work,
            };
            // SAFETY: `event` is the enqueue's new event (or null); its reference passes over.
            unsafe { probe.finish(launch, event) };
        }
        if netcl_core_devices::debug::sync_launches()? {
            self.finish_now(device)?;
        }
        Ok(())
    }

    /// `NETCL_DEBUG=sync`: waits for the kernel just enqueued, so a failure on the device is
    /// reported by this launch (naming the kernel), then runs the after-sync check (`netcl-ops`'
    /// index-error record).
    #[cold]
    fn finish_now(&self, device: &Device) -> Result<()> {
        let cl = device.cl(&self.entry().name)?;
        cl.queue.finish().map_err(|e| Error::Launch {
            kernel: self.entry().name.clone(),
            msg: format!(
                "the kernel failed on {device}: clFinish returned {} ({}) right after the launch \
                 (NETCL_DEBUG=sync)",
                netcl_core_devices::cl_code_name(e.0),
                e.0
            ),
        })?;
        match AFTER_SYNC.get() {
            Some(check) => check(device),
            None => Ok(()),
        }
    }
}

/// What runs after a synchronised launch (`NETCL_DEBUG=sync`), set once by a higher layer.
static AFTER_SYNC: std::sync::OnceLock<fn(&Device) -> Result<()>> = std::sync::OnceLock::new();

/// Sets the check that runs after every synchronised launch (`NETCL_DEBUG=sync`): `netcl-ops`
/// reads the device's index-error record there, so an out-of-range index is reported by the op
/// whose kernel found it. Only the first call sets it.
pub fn set_after_sync_check(check: fn(&Device) -> Result<()>) {
    let _ = AFTER_SYNC.set(check);
}

/// `clEnqueueNDRangeKernel` after the events of `wait`, writing the command's event to `event`
/// unless it is null (cl3's wrapper always asks for one).
///
/// # Safety
/// `queue` and `kernel` are valid, the kernel's arguments are set, `global` and `local` have
/// the same 1 to 3 dims, `wait` holds valid events, `event` is null or writable.
pub(crate) unsafe fn enqueue(
    queue: cl_command_queue,
    kernel: cl_kernel,
    global: &[usize],
    local: &[usize],
    wait: &[cl_event],
    event: *mut cl_event,
) -> std::result::Result<(), i32> {
    use cl3::error_codes::{DLOPEN_FUNCTION_NOT_AVAILABLE, DLOPEN_RUNTIME_LOAD_FAILED};
    let lib = cl3::load_library()
        .as_ref()
        .map_err(|_| DLOPEN_RUNTIME_LOAD_FAILED)?;
    let status = lib
        .clEnqueueNDRangeKernel(
            queue,
            kernel,
            global.len() as u32,
            ptr::null(),
            global.as_ptr(),
            local.as_ptr(),
            wait.len() as u32,
            if wait.is_empty() {
                ptr::null()
            } else {
                wait.as_ptr()
            },
            event,
        )
        .ok_or(DLOPEN_FUNCTION_NOT_AVAILABLE)?;
    if status == 0 {
        Ok(())
    } else {
        Err(status)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            let key = (self.program.id, entry.name.clone());
            let mut entry = Some(entry);
            let _ = KERNELS.try_with(|k| {
                if let Some(e) = entry.take() {
                    k.borrow_mut().insert(key, e);
                }
            });
            // During thread teardown the map may already be gone: the kernel is then retired.
            if let Some(e) = entry {
                RETIRED
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(e.kernel);
                RETIRED_COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}
