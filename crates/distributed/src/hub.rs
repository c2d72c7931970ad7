//! Hub: the rendezvous of the ranks of one process (barriers with a timeout and an abort flag, and an exchange of host pointers).
use crate::relay::RelayBuffers;
use netcl_core_devices::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Shared by every hub of one group: set once a rank fails, so every rank blocked in (or later
/// entering) a collective returns an error instead of waiting for it. It also records the first
/// rank whose closure returned: a collective waiting for that rank can never complete.
#[derive(Default)]
pub(crate) struct Abort {
    set: AtomicBool,
    why: Mutex<Option<String>>,
    returned: Mutex<Option<usize>>,
}

impl Abort {
    pub(crate) fn raise(&self, why: String) {
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            *w = Some(why);
        }
        self.set.store(true, Ordering::Release);
    }
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }
    /// Rank `rank`'s closure has returned: it will enter no more collectives.
    pub(crate) fn returned(&self, rank: usize) {
        let mut r = self.returned.lock().unwrap_or_else(|p| p.into_inner());
        r.get_or_insert(rank);
    }
    /// A rank waiting in `op` for a rank that has returned: aborts the group (the others
    /// waiting fail too) and returns the error; `Ok` while every rank is still running.
    pub(crate) fn check_returned(&self, op: &str, rank: usize) -> Result<()> {
        let Some(gone) = *self.returned.lock().unwrap_or_else(|p| p.into_inner()) else {
            return Ok(());
        };
        let why = format!(
            "{op}: rank {rank} waits for rank {gone}, whose closure has already returned (every \
             rank must make the same collectives)"
        );
        self.raise(why.clone());
        Err(Error::device(op, why))
    }
    pub(crate) fn error(&self, op: &str, rank: usize) -> Error {
        let why = self.why.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Error::device(
            op,
            format!(
                "rank {rank}: the group was aborted ({})",
                why.unwrap_or_default()
            ),
        )
    }
}

/// What one rank published for the collective in progress: a host pointer, an element count, a
/// scale (the weight of its contribution) and a shape.
#[derive(Clone, Default)]
pub(crate) struct Slot {
    pub ptr: usize,
    pub len: usize,
    pub scale: f32,
    pub shape: Vec<usize>,
}

impl Slot {
    /// The slot offering `data` (read by the other ranks until the exchange's closing sync) with
    /// its tensor's `shape`.
    pub fn of<T>(data: &[T], shape: Vec<usize>) -> Slot {
        Slot {
            ptr: data.as_ptr() as usize,
            len: data.len(),
            shape,
            ..Default::default()
        }
    }
}

struct State {
    arrived: usize,
    generation: u64,
    /// Two sets, used alternately by consecutive exchanges: a rank one exchange ahead writes the
    /// other set while a late rank still reads this one.
    slots: [Vec<Slot>; 2],
}

/// The stages of a chunk in the device relay (relay.rs) whose completion a rank publishes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stage {
    /// Its chunk is in its pinned slot.
    Down = 0,
    /// Its own segment, reduced, is in its pinned slot.
    Reduced = 1,
    /// It has copied everything it needed out of every rank's slot.
    Freed = 2,
}

/// The meeting point of `size` ranks. Collectives follow one pattern: publish a slot, barrier,
/// read the others' memory, barrier (so nobody changes or frees its memory while it is read).
pub(crate) struct Hub {
    size: usize,
    state: Mutex<State>,
    cv: Condvar,
    pub(crate) abort: Arc<Abort>,
    pub(crate) timeout: Duration,
    /// Whether every rank is an OpenCL device, so all_reduce goes through the device relay.
    pub(crate) relay: bool,
    /// Each rank's relay slots (relay.rs), made at its first relay session.
    relay_buffers: Mutex<Vec<Option<Arc<RelayBuffers>>>>,
    /// Per rank, how many relay chunks have passed each [`Stage`] on this hub (counted over the
    /// hub's life: every rank relays the same sequence of chunks), with a version that every
    /// publication increments.
    progress: Mutex<(u64, Vec<[u64; 3]>)>,
    progress_cv: Condvar,
}

/// How often a blocked rank looks at the abort flag.
const POLL: Duration = Duration::from_millis(20);

impl Hub {
    pub(crate) fn new(size: usize, abort: Arc<Abort>, timeout: Duration, relay: bool) -> Hub {
        Hub {
            size,
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                slots: [vec![Slot::default(); size], vec![Slot::default(); size]],
            }),
            cv: Condvar::new(),
            abort,
            timeout,
            relay,
            relay_buffers: Mutex::new(vec![None; size]),
            progress: Mutex::new((0, vec![[0; 3]; size])),
            progress_cv: Condvar::new(),
        }
    }

    pub(crate) fn relay_buffers(&self) -> MutexGuard<'_, Vec<Option<Arc<RelayBuffers>>>> {
        self.relay_buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn progress(&self) -> MutexGuard<'_, (u64, Vec<[u64; 3]>)> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank` has passed `stage` with `count` chunks.
    pub(crate) fn publish(&self, rank: usize, stage: Stage, count: u64) {
        let mut p = self.progress();
        p.0 += 1;
        p.1[rank][stage as usize] = count;
        self.progress_cv.notify_all();
    }

    /// How many chunks every rank has passed `stage` with (the smallest count).
    pub(crate) fn passed(&self, stage: Stage) -> u64 {
        let p = self.progress();
        p.1.iter().map(|c| c[stage as usize]).min().unwrap_or(0)
    }

    /// Wake the waiters of [`Hub::wait_progress`] (a rank's own work finished).
    pub(crate) fn poke(&self) {
        self.progress().0 += 1;
        self.progress_cv.notify_all();
    }

    /// This rank's own count at `stage`.
    pub(crate) fn own(&self, rank: usize, stage: Stage) -> u64 {
        self.progress().1[rank][stage as usize]
    }

    /// The version of the progress counters (changes with every publication).
    pub(crate) fn progress_version(&self) -> u64 {
        self.progress().0
    }

    /// Sleep until a publication after `version`, or at most `max`.
    pub(crate) fn wait_progress(&self, version: u64, max: Duration) {
        let p = self.progress();
        if p.0 == version {
            drop(self.progress_cv.wait_timeout(p, max));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until every rank has arrived; an error (naming `op`) when the group is aborted or the
    /// others do not come within the timeout (which then aborts the group).
    pub(crate) fn barrier(&self, op: &str, rank: usize) -> Result<()> {
        if self.abort.is_set() {
            return Err(self.abort.error(op, rank));
        }
        let mut st = self.lock();
        let gen = st.generation;
        st.arrived += 1;
        if st.arrived == self.size {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let start = Instant::now();
        while st.generation == gen {
            if self.abort.is_set() {
                return Err(self.abort.error(op, rank));
            }
            self.abort.check_returned(op, rank)?;
            if start.elapsed() > self.timeout {
                let why = format!(
                    "{op}: rank {rank} waited {:.1} s for {} other rank(s)",
                    start.elapsed().as_secs_f64(),
                    self.size - st.arrived
                );
                drop(st);
                self.abort.raise(why.clone());
                return Err(Error::device(op, why));
            }
            st = self
                .cv
                .wait_timeout(st, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Publish `slot` and wait for every rank's; returns all slots in rank order. `seq` counts
    /// this rank's exchanges on this hub (the same sequence on every rank).
    pub(crate) fn exchange(
        &self,
        op: &str,
        rank: usize,
        seq: u64,
        slot: Slot,
    ) -> Result<Vec<Slot>> {
        let set = (seq % 2) as usize;
        self.lock().slots[set][rank] = slot;
        self.barrier(op, rank)?;
        Ok(self.lock().slots[set].clone())
    }
}
