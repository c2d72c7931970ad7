//! Buffers a captured graph uses but does not own: a block of one going back to its pool either marks the graph stale (parameters, optimizer state: a replay then errors instead of writing into memory that now belongs to someone else) or passes the buffer to the graph (buffers the step made that outlived it, such as gradients: the graph keeps them).
use crate::capture::Mem;
use netcl_core_devices::opencl3::memory::Buffer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

#[derive(Default)]
struct State {
    released: AtomicBool,
    adopted: Mutex<Vec<Buffer<u8>>>,
}

struct Entry {
    state: Arc<State>,
    adopt: bool,
}

fn table() -> MutexGuard<'static, HashMap<Mem, Vec<Entry>>> {
    static TABLE: OnceLock<Mutex<HashMap<Mem, Vec<Entry>>>> = OnceLock::new();
    TABLE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Live watches: lets every block release skip the table (one atomic load) when there are none.
static WATCHES: AtomicUsize = AtomicUsize::new(0);

/// The buffers one graph watches; dropping it stops watching them (and frees adopted buffers).
pub struct Watch {
    mems: Vec<Mem>,
    state: Arc<State>,
}

impl Watch {
    /// Watches `stale` (a release marks the watch released) and `adopt` (a release hands the
    /// buffer to this watch, which keeps it until dropped).
    pub fn new(stale: &[Mem], adopt: &[Mem]) -> Watch {
        let state = Arc::new(State::default());
        let mut t = table();
        for (mems, adopt) in [(stale, false), (adopt, true)] {
            for &m in mems {
                t.entry(m).or_default().push(Entry {
                    state: state.clone(),
                    adopt,
                });
            }
        }
        WATCHES.fetch_add(1, Ordering::SeqCst);
        Watch {
            mems: stale.iter().chain(adopt).copied().collect(),
            state,
        }
    }

    /// True once the block of a watched `stale` buffer went back to its pool.
    pub fn released(&self) -> bool {
        self.state.released.load(Ordering::Acquire)
    }

    /// How many buffers this watch adopted.
    pub fn adopted(&self) -> usize {
        self.state
            .adopted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut t = table();
        for m in &self.mems {
            if let Some(entries) = t.get_mut(m) {
                entries.retain(|e| !Arc::ptr_eq(&e.state, &self.state));
                if entries.is_empty() {
                    t.remove(m);
                }
            }
        }
        WATCHES.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Called with the buffer of a block going back to its pool: marks the stale watches of it, and
/// returns the buffer unless a watch adopts it.
pub(crate) fn released(mem: Mem, buf: Buffer<u8>) -> Option<Buffer<u8>> {
    if WATCHES.load(Ordering::Relaxed) == 0 {
        return Some(buf);
    }
    let Some(entries) = table().remove(&mem) else {
        return Some(buf);
    };
    let mut buf = Some(buf);
    for e in entries {
        if e.adopt {
            if let Some(b) = buf.take() {
                e.state
                    .adopted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(b);
            }
        } else {
            e.state.released.store(true, Ordering::Release);
        }
    }
    buf
}
