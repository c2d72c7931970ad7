//! The one error type of netcl: every fallible call in every crate returns `Result<T, Error>`.
use std::fmt;

/// netcl's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in netcl, each variant naming the operation and the values involved.
#[derive(Debug)]
pub enum Error {
    /// An OpenCL call failed; `op` names what netcl was doing, `code` is the OpenCL status.
    OpenCl { op: String, code: i32 },
    /// The requested device does not exist; `available` lists the ones that do.
    DeviceNotFound {
        requested: String,
        available: Vec<String>,
    },
    /// The pool could not serve `requested` bytes even after releasing its cache.
    OutOfMemory {
        device: String,
        requested: usize,
        stats: String,
    },
    /// An OpenCL program failed to build.
    KernelBuild {
        file: String,
        options: String,
        log: String,
    },
    /// A launch configuration the device cannot run (work-group size, local memory, ...).
    Launch { kernel: String, msg: String },
    /// Shapes that do not fit the operation.
    Shape { op: String, msg: String },
    /// A dtype the operation does not accept.
    DType { op: String, msg: String },
    /// Operands on different devices, or a device that cannot run the operation.
    Device { op: String, msg: String },
    /// Any other invalid argument (axis out of range, bad environment variable, ...).
    Invalid { op: String, msg: String },
    /// A file could not be read or written.
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A file or buffer whose contents are corrupt or do not match what was expected.
    Format { what: String, msg: String },
    /// The debug mode (`NETCL_DEBUG=nan`, `debug::detect_anomaly`) found a NaN or an infinity:
    /// `op` produced it (`backward of op` for a gradient); `msg` names its inputs' shapes, the
    /// first bad element and where the value was created.
    NonFinite { op: String, msg: String },
}

impl Error {
    pub fn opencl(op: impl Into<String>, code: i32) -> Self {
        Error::OpenCl {
            op: op.into(),
            code,
        }
    }
    pub fn shape(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Shape {
            op: op.into(),
            msg: msg.into(),
        }
    }
    pub fn dtype(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::DType {
            op: op.into(),
            msg: msg.into(),
        }
    }
    pub fn device(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Device {
            op: op.into(),
            msg: msg.into(),
        }
    }
    pub fn invalid(op: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Invalid {
            op: op.into(),
            msg: msg.into(),
        }
    }
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    pub fn format(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Format {
            what: what.into(),
            msg: msg.into(),
        }
    }
    /// True for the OpenCL status codes that mean the device (or host) ran out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::OutOfMemory { .. } => true,
            Error::OpenCl { code, .. } => is_oom_code(*code),
            _ => false,
        }
    }
}

/// CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES, CL_OUT_OF_HOST_MEMORY.
pub fn is_oom_code(code: i32) -> bool {
    matches!(code, -6..=-4)
}

/// The symbolic name of an OpenCL status code.
pub fn cl_code_name(code: i32) -> &'static str {
    match code {
        -1 => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -3 => "CL_COMPILER_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        -11 => "CL_BUILD_PROGRAM_FAILURE",
        -13 => "CL_MISALIGNED_SUB_BUFFER_OFFSET",
        -30 => "CL_INVALID_VALUE",
        -33 => "CL_INVALID_DEVICE",
        -34 => "CL_INVALID_CONTEXT",
        -36 => "CL_INVALID_COMMAND_QUEUE",
        -38 => "CL_INVALID_MEM_OBJECT",
        -42 => "CL_INVALID_BINARY",
        -43 => "CL_INVALID_BUILD_OPTIONS",
        -44 => "CL_INVALID_PROGRAM",
        -45 => "CL_INVALID_PROGRAM_EXECUTABLE",
        -46 => "CL_INVALID_KERNEL_NAME",
        -48 => "CL_INVALID_KERNEL",
        -49 => "CL_INVALID_ARG_INDEX",
        -50 => "CL_INVALID_ARG_VALUE",
        -51 => "CL_INVALID_ARG_SIZE",
        -52 => "CL_INVALID_KERNEL_ARGS",
        -54 => "CL_INVALID_WORK_GROUP_SIZE",
        -55 => "CL_INVALID_WORK_ITEM_SIZE",
        -56 => "CL_INVALID_GLOBAL_OFFSET",
        -61 => "CL_INVALID_BUFFER_SIZE",
        -63 => "CL_INVALID_GLOBAL_WORK_SIZE",
        -1001 => "CL_PLATFORM_NOT_FOUND_KHR (an OpenCL loader but no driver)",
        -2000 => "no OpenCL loader library (libOpenCL.so) found",
        _ => "unknown OpenCL status",
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OpenCl { op, code } => write!(f, "{op}: OpenCL error {code} ({})", cl_code_name(*code)),
            Error::DeviceNotFound { requested, available } => write!(
                f,
                "device '{requested}' does not exist; available: {}",
                available.join(", ")
            ),
            Error::OutOfMemory { device, requested, stats } => write!(
                f,
                "out of memory on {device}: could not allocate {requested} bytes even after releasing the cache ({stats})"
            ),
            Error::KernelBuild { file, options, log } => {
                write!(f, "building kernels/{file} with options '{options}' failed:\n{log}")
            }
            Error::Launch { kernel, msg } => write!(f, "cannot launch kernel {kernel}: {msg}"),
            Error::Shape { op, msg } => write!(f, "{op}: shape error: {msg}"),
            Error::DType { op, msg } => write!(f, "{op}: dtype error: {msg}"),
            Error::Device { op, msg } => write!(f, "{op}: device error: {msg}"),
            Error::Invalid { op, msg } => write!(f, "{op}: {msg}"),
            Error::Io { path, source } => write!(f, "{path}: {source}"),
            Error::Format { what, msg } => write!(f, "{what}: {msg}"),
            Error::NonFinite { op, msg } => write!(f, "{op}: non-finite value: {msg}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Attach an operation name to a raw OpenCL status.
pub trait ClResultExt<T> {
    fn cl(self, op: &str) -> Result<T>;
}

impl<T> ClResultExt<T> for std::result::Result<T, opencl3::error_codes::ClError> {
    fn cl(self, op: &str) -> Result<T> {
        self.map_err(|e| Error::opencl(op, e.0))
    }
}

impl<T> ClResultExt<T> for std::result::Result<T, i32> {
    fn cl(self, op: &str) -> Result<T> {
        self.map_err(|code| Error::opencl(op, code))
    }
}
