//! CLBlast as the OpenCL GEMM peer: `libclblast` opened at run time (no build-time dependency) and `CLBlastSgemm` enqueued on netcl's own queue and buffers.
use libloading::Library;
use netcl_core_devices::cl3;
use netcl_core_devices::opencl3::types::{cl_command_queue, cl_event, cl_mem};
use netcl_core_devices::{DType, Error, Result};
use netcl_ops::Tensor;
use std::ffi::c_int;
use std::ptr;

/// `CLBlastLayoutRowMajor` and `CLBlastTransposeNo` from clblast_c.h.
const ROW_MAJOR: c_int = 101;
const TRANSPOSE_NO: c_int = 111;

/// `CLBlastSgemm` from clblast_c.h: layout, a/b transpose, m, n, k, alpha, (a, a_offset, a_ld),
/// (b, b_offset, b_ld), beta, (c, c_offset, c_ld), queue*, event*; returns a CLBlastStatusCode.
type SgemmFn = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    usize,
    usize,
    usize,
    f32,
    cl_mem,
    usize,
    usize,
    cl_mem,
    usize,
    usize,
    f32,
    cl_mem,
    usize,
    usize,
    *mut cl_command_queue,
    *mut cl_event,
) -> c_int;

/// An opened CLBlast library.
pub struct ClBlast {
    sgemm: SgemmFn,
    /// Where it was opened from (a path or a name the dynamic loader resolved).
    pub source: String,
    /// Keeps `sgemm` valid: the library stays loaded as long as this value lives.
    _lib: Library,
}

impl ClBlast {
    /// Opens `$NETCL_CLBLAST` (a path) when set, else `libclblast.so.1` / `libclblast.so` from the
    /// default library path. The error says what was tried and why it failed.
    pub fn load() -> Result<ClBlast> {
        let candidates: Vec<String> = match std::env::var("NETCL_CLBLAST") {
            Ok(p) if !p.is_empty() => vec![p],
            _ => vec!["libclblast.so.1".into(), "libclblast.so".into()],
        };
        let mut why = Vec::new();
        for name in &candidates {
            // SAFETY: opening CLBlast runs only its (and libOpenCL's) static initialisers.
            match unsafe { Library::new(name) } {
                Ok(lib) => {
                    // SAFETY: the symbol has the C signature `SgemmFn` declared in clblast_c.h.
                    let sgemm = unsafe { lib.get::<SgemmFn>(b"CLBlastSgemm\0") }
                        .map(|s| *s)
                        .map_err(|e| Error::device("CLBlast", format!("{name}: {}", full(&e))))?;
                    return Ok(ClBlast {
                        sgemm,
                        source: name.clone(),
                        _lib: lib,
                    });
                }
                Err(e) => why.push(format!("{name}: {}", full(&e))),
            }
        }
        Err(Error::device(
            "CLBlast",
            format!("library not found ({})", why.join("; ")),
        ))
    }

    /// `c = a x b` with CLBlastSgemm (row-major, no transposes) on the tensors' own device queue.
    /// `a` is [m, k], `b` is [k, n], `c` is [m, n]; all f32, contiguous, on one OpenCL device.
    pub fn sgemm(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
        let op = "CLBlastSgemm";
        for (t, what) in [(a, "a"), (b, "b"), (c, "c")] {
            if t.dtype() != DType::F32 || t.ndim() != 2 || !t.is_contiguous() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "{what} must be a contiguous 2-D f32 tensor, got {:?} {}",
                        t.shape(),
                        t.dtype()
                    ),
                ));
            }
            if t.device() != a.device() {
                return Err(Error::device(
                    op,
                    format!("{what} is on {}, a on {}", t.device(), a.device()),
                ));
            }
        }
        let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
        if b.shape()[0] != k || c.shape() != [m, n] {
            return Err(Error::shape(
                op,
                format!(
                    "a {:?} x b {:?} -> c {:?} do not fit",
                    a.shape(),
                    b.shape(),
                    c.shape()
                ),
            ));
        }
        let mut queue = a.device().cl(op)?.queue.get();
        let mut event: cl_event = ptr::null_mut();
        // SAFETY: the buffers hold at least offset + m*k, k*n and m*n f32 (checked shapes of
        // contiguous tensors), the queue belongs to their device, and the tensors live until the
        // caller synchronises (they are borrowed here and the queue is in order).
        let status = unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                TRANSPOSE_NO,
                TRANSPOSE_NO,
                m,
                n,
                k,
                1.0,
                a.mem()?,
                a.offset(),
                k,
                b.mem()?,
                b.offset(),
                n,
                0.0,
                c.mem()?,
                c.offset(),
                n,
                &mut queue,
                &mut event,
            )
        };
        if !event.is_null() {
            // SAFETY: CLBlast handed us a reference to the new event; releasing does not wait.
            let _ = unsafe { cl3::event::release_event(event) };
        }
        if status != 0 {
            return Err(Error::device(
                op,
                format!("CLBlastStatusCode {status} for m={m} n={n} k={k}"),
            ));
        }
        Ok(())
    }
}

/// libloading's message with the loader's own reason (its `source`).
fn full(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

/// Largest |x - y| over the two result tensors, and the largest |y| (for a relative bound).
pub fn max_abs_diff(x: &Tensor, y: &Tensor) -> Result<(f64, f64)> {
    let (xv, yv) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    if xv.len() != yv.len() {
        return Err(Error::shape(
            "max_abs_diff",
            format!("{:?} vs {:?}", x.shape(), y.shape()),
        ));
    }
    let diff = xv
        .iter()
        .zip(&yv)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    let scale = yv.iter().map(|v| (*v as f64).abs()).fold(0.0, f64::max);
    Ok((diff, scale))
}
