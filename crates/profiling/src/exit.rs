//! `NETCL_PROFILE=1`: at process exit, the summary goes to stderr and the trace to `$NETCL_PROFILE_DIR/trace.json`.
use crate::collect::{collector, Mark};
use crate::state::env_enabled;
use std::path::PathBuf;
use std::sync::Once;

static ARMED: Once = Once::new();

extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

/// Register the exit report (env mode only). Called at the first record, so after OpenCL is
/// loaded: handlers run in reverse order, so the report runs before the driver's own teardown.
pub(crate) fn arm() {
    if env_enabled() {
        ARMED.call_once(|| {
            // SAFETY: registering a plain extern "C" function without arguments.
            unsafe {
                atexit(at_exit);
            }
        });
    }
}

/// Where the env-mode trace goes: `trace.json` in
/// [`Config::profile_dir`](netcl_core_devices::Config::profile_dir) (`$NETCL_PROFILE_DIR`,
/// default `./netcl-profile`).
pub fn env_trace_path() -> PathBuf {
    netcl_core_devices::Config::get()
        .profile_dir
        .join("trace.json")
}

extern "C" fn at_exit() {
    // Never unwind into C.
    let _ = std::panic::catch_unwind(report);
}

fn report() {
    use std::io::Write;
    let profile = collector().profile_since(Mark::ZERO);
    let path = env_trace_path();
    let written = match profile.write_trace(&path) {
        Ok(()) => format!("trace written to {}", path.display()),
        Err(e) => format!("trace not written: {e}"),
    };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{}netcl profile (NETCL_PROFILE=1): {written}",
        profile.summary_table()
    );
}
