//! Buffers a captured graph uses but does not own: a block of one going back to its pool either marks the graph stale (parameters, optimizer state: a replay then errors instead of writing into memory that now belongs to someone else) or passes the block to the graph (buffers the step made that outlived it, such as gradients: the graph keeps them, and they go back to the pool when the graph drops).
use crate::capture::Mem;
use crate::pool::Block;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

#[derive(Default)]
pub(crate) struct State {
    released: AtomicBool,
    adopted: Mutex<Vec<Block>>,
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
        {
            let mut t = table();
            for m in &self.mems {
                if let Some(entries) = t.get_mut(m) {
                    entries.retain(|e| !Arc::ptr_eq(&e.state, &self.state));
                    if entries.is_empty() {
                        t.remove(m);
                    }
                }
            }
        }
        WATCHES.fetch_sub(1, Ordering::SeqCst);
        // Adopted blocks go back to their pools now (outside the table's lock: dropping a block
        // looks it up).
        let adopted =
            std::mem::take(&mut *self.state.adopted.lock().unwrap_or_else(|p| p.into_inner()));
        drop(adopted);
    }
}

/// Called by a block going back to its pool (its buffer still inside): marks the stale watches
/// of it, and returns the block when a watch adopts it (the caller then hands it over with
/// [`adopt`]) instead of freeing it.
pub(crate) fn released(mem: Mem) -> Option<Arc<State>> {
    if WATCHES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let entries = table().remove(&mem)?;
    let mut adopter = None;
    for e in entries {
        if e.adopt {
            adopter.get_or_insert(e.state);
        } else {
            e.state.released.store(true, Ordering::Release);
        }
    }
    adopter
}

/// Hands `block` to the watch that adopted it.
pub(crate) fn adopt(state: &State, block: Block) {
    state
        .adopted
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(block);
}
