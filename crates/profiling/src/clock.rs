//! The profiler's clock (nanoseconds since the process's first use of the profiler) and small per-thread ids with names.
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds on the profiler's host clock (monotonic; 0 is the first call in this process).
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
static THREAD_NAMES: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

thread_local! {
    static THREAD: u32 = {
        let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        let current = std::thread::current();
        let name = match current.name() {
            Some(n) => format!("{n} (thread {id})"),
            None => format!("thread {id}"),
        };
        THREAD_NAMES.lock().unwrap_or_else(|p| p.into_inner()).push((id, name));
        id
    };
}

/// This thread's profiler id (1, 2, ... in order of first use).
pub(crate) fn thread_id() -> u32 {
    THREAD.try_with(|t| *t).unwrap_or(0)
}

/// Every thread seen so far: (id, name).
pub(crate) fn thread_names() -> Vec<(u32, String)> {
    THREAD_NAMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}
