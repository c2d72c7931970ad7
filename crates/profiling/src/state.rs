//! On or off: `NETCL_PROFILE=1` (read once) or live `Profiler` sessions; the hot-path check is one relaxed atomic load.
use crate::collect::{collector, Mark};
use crate::Profile;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

const UNREAD: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static SESSIONS: Mutex<usize> = Mutex::new(0);
static ENV: OnceLock<bool> = OnceLock::new();

/// Whether [`Config::profile`](netcl_core_devices::Config::profile) is on (`NETCL_PROFILE=1`;
/// read once per process).
pub fn env_enabled() -> bool {
    *ENV.get_or_init(|| netcl_core_devices::Config::get().profile)
}

/// Whether the profiler records now. Costs one relaxed atomic load once initialised.
#[inline]
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => init(),
    }
}

#[cold]
fn init() -> bool {
    let sessions = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
    update(*sessions)
}

/// Set the state from the environment and the number of live sessions (called with SESSIONS held).
fn update(sessions: usize) -> bool {
    let on = env_enabled() || sessions > 0;
    STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
    on
}

/// A profiling session: records every kernel launch and host span from `start` until `stop`
/// (or drop). Sessions may overlap; each gets what happened during its own lifetime. With
/// `NETCL_PROFILE=1` the profiler is on for the whole process anyway and sessions only select
/// a window of it.
#[must_use = "the session ends when the Profiler is dropped"]
pub struct Profiler {
    mark: Mark,
    live: bool,
}

impl Profiler {
    /// Turn the profiler on (if it is not already) and start collecting.
    pub fn start() -> Profiler {
        let mut sessions = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
        *sessions += 1;
        update(*sessions);
        let mark = collector().mark();
        Profiler { mark, live: true }
    }

    /// What this session has recorded so far (waits for the kernels launched so far to finish,
    /// to read their device times); the session goes on.
    pub fn snapshot(&self) -> Profile {
        collector().profile_since(self.mark)
    }

    /// End the session and return what it recorded (waits for its kernels to finish). The
    /// profiler turns off unless another session is live or `NETCL_PROFILE=1`.
    pub fn stop(mut self) -> Profile {
        let profile = self.snapshot();
        self.end();
        profile
    }

    fn end(&mut self) {
        if !self.live {
            return;
        }
        self.live = false;
        let mut sessions = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
        *sessions = sessions.saturating_sub(1);
        if !update(*sessions) {
            collector().clear();
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        self.end();
    }
}
