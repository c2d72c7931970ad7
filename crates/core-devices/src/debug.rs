//! The debug mode: `NETCL_DEBUG=nan` (every recorded op's output and every backward gradient is checked for NaN/Inf), `NETCL_DEBUG=sync` (the queue is finished after each kernel launch), `NETCL_DEBUG=gemm` (each distinct GEMM plan printed once) and `NETCL_DEBUG=build` (each program built from source prints its build log: registers and spills on NVIDIA), or a scoped [`DebugGuard`].
//!
//! Off (the default), each hook costs one read of the process's [`Config`] and one relaxed
//! atomic load: the modes of the guards are only looked up while some guard is alive in the
//! process. The checks themselves live where the work is: `netcl-autograd` checks values when an
//! op is recorded and when a backward rule returns, `netcl-kernels` finishes the queue after a
//! launch (and runs the index-error check of `netcl-ops`).
use crate::error::Result;
use crate::Config;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Check op outputs and backward gradients for NaN and infinity.
const NAN: u8 = 1;
/// Finish the device queue after every kernel launch.
const SYNC: u8 = 2;
/// Print each distinct GEMM plan once, on stderr.
const GEMM: u8 = 4;
/// Print the build log of each program built from source, on stderr.
const BUILD: u8 = 8;

/// The process-wide debug modes ([`Config::debug`], `NETCL_DEBUG`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DebugModes {
    /// Check op outputs and backward gradients for NaN and infinity (`nan`).
    pub nan: bool,
    /// Finish the device queue after every kernel launch (`sync`).
    pub sync: bool,
    /// Print each distinct GEMM plan once, on stderr (`gemm`).
    pub gemm: bool,
    /// Print the build log of each program built from source, on stderr (`build`; on NVIDIA's
    /// OpenCL with `-cl-nv-verbose`: each kernel's registers, spills and local memory).
    pub build: bool,
}

impl DebugModes {
    /// `NETCL_DEBUG`'s form: `nan`, `sync`, `gemm`, `build`, `all` (nan and sync), `off`, or a
    /// comma-separated list; an unknown word is an error naming the value.
    pub fn parse(value: &str) -> std::result::Result<DebugModes, String> {
        let bits = parse(value)?;
        Ok(DebugModes {
            nan: bits & NAN != 0,
            sync: bits & SYNC != 0,
            gemm: bits & GEMM != 0,
            build: bits & BUILD != 0,
        })
    }

    fn bits(self) -> u8 {
        (self.nan as u8 * NAN)
            | (self.sync as u8 * SYNC)
            | (self.gemm as u8 * GEMM)
            | (self.build as u8 * BUILD)
    }
}
/// Live guards in the process (any thread): while 0, the thread-local modes are not read.
static GUARDS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The modes the guards alive on this thread turned on.
    static LOCAL: Cell<u8> = const { Cell::new(0) };
}

fn parse(value: &str) -> std::result::Result<u8, String> {
    let mut modes = 0;
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        modes |= match word {
            "nan" | "anomaly" => NAN,
            "sync" => SYNC,
            "gemm" => GEMM,
            "build" => BUILD,
            "all" => NAN | SYNC,
            "0" | "off" => 0,
            other => {
                return Err(format!(
                    "NETCL_DEBUG={value:?}: unknown mode {other:?}; use nan, sync, gemm, \
                     build, all (nan and sync) or a comma-separated list (nan,sync)"
                ))
            }
        };
    }
    Ok(modes)
}

fn env() -> Result<u8> {
    Ok(Config::get().debug.get()?.bits())
}

#[inline]
fn modes() -> Result<u8> {
    let env = env()?;
    if GUARDS.load(Ordering::Relaxed) == 0 {
        return Ok(env);
    }
    Ok(env | LOCAL.with(Cell::get))
}

/// Whether ops check their outputs (and backward its gradients) for NaN/Inf on this thread:
/// `NETCL_DEBUG=nan`, or a live [`DebugGuard::anomaly`]. An unknown `NETCL_DEBUG` is an error.
#[inline]
pub fn nan_checks() -> Result<bool> {
    Ok(modes()? & NAN != 0)
}

/// Whether each kernel launch on this thread waits for the kernel to finish (and reports its
/// device errors at once): `NETCL_DEBUG=sync`, or a live [`DebugGuard::sync`].
#[inline]
pub fn sync_launches() -> Result<bool> {
    Ok(modes()? & SYNC != 0)
}

/// Whether each distinct GEMM plan is printed once on stderr (`NETCL_DEBUG=gemm`, or a live
/// [`DebugGuard::gemm`] on this thread).
#[inline]
pub fn gemm_plans() -> Result<bool> {
    Ok(modes()? & GEMM != 0)
}

/// Whether programs built from source print their build logs on stderr (`NETCL_DEBUG=build`).
#[inline]
pub fn build_logs() -> Result<bool> {
    Ok(modes()? & BUILD != 0)
}

/// Turns debug modes on for the current thread while it lives (they nest; dropping one restores
/// what was on before). Not `Send`: the modes belong to the thread that made the guard.
#[must_use = "the modes are on only while the guard lives"]
pub struct DebugGuard {
    previous: u8,
    _thread: PhantomData<*const ()>,
}

impl DebugGuard {
    fn with(modes: u8) -> DebugGuard {
        GUARDS.fetch_add(1, Ordering::Relaxed);
        let previous = LOCAL.with(|l| l.replace(l.get() | modes));
        DebugGuard {
            previous,
            _thread: PhantomData,
        }
    }
    /// Anomaly detection (`NETCL_DEBUG=nan`): the first op whose output, or backward rule whose
    /// gradient, holds a NaN or an infinity returns
    /// [`Error::NonFinite`](crate::Error::NonFinite) naming the op, its inputs' shapes and where
    /// the value was created.
    pub fn anomaly() -> DebugGuard {
        DebugGuard::with(NAN)
    }
    /// Synchronous launches (`NETCL_DEBUG=sync`): each kernel launch waits for the kernel, so a
    /// device error (a failed kernel, an out-of-range index) is returned by the op that caused it.
    pub fn sync() -> DebugGuard {
        DebugGuard::with(SYNC)
    }
    /// GEMM plans (`NETCL_DEBUG=gemm`): each product whose plan (kernel, tile, split, staging)
    /// was not printed yet prints one line on stderr.
    pub fn gemm() -> DebugGuard {
        DebugGuard::with(GEMM)
    }
    /// Anomaly detection and synchronous launches.
    pub fn all() -> DebugGuard {
        DebugGuard::with(NAN | SYNC)
    }
}

impl Drop for DebugGuard {
    fn drop(&mut self) {
        LOCAL.with(|l| l.set(self.previous));
        GUARDS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `f` with anomaly detection on for this thread (PyTorch's `torch.autograd.detect_anomaly`):
/// see [`DebugGuard::anomaly`].
pub fn detect_anomaly<T>(f: impl FnOnce() -> T) -> T {
    let _guard = DebugGuard::anomaly();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_and_rejects_unknown_words() {
        assert_eq!(parse(""), Ok(0));
        assert_eq!(parse("nan"), Ok(NAN));
        assert_eq!(parse("sync, nan"), Ok(NAN | SYNC));
        assert_eq!(parse("all"), Ok(NAN | SYNC));
        assert_eq!(parse("gemm,nan"), Ok(GEMM | NAN));
        assert_eq!(parse("build"), Ok(BUILD));
        let e = parse("nan,fast").unwrap_err();
        assert!(e.contains("\"fast\"") && e.contains("nan,fast"), "{e}");
    }

    #[test]
    fn guards_nest_and_restore() {
        let outer = DebugGuard::sync();
        {
            let _inner = DebugGuard::anomaly();
            assert_eq!(LOCAL.with(Cell::get), NAN | SYNC);
        }
        assert_eq!(LOCAL.with(Cell::get), SYNC);
        drop(outer);
        assert_eq!(LOCAL.with(Cell::get), 0);
    }
}
