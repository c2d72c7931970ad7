//! Group: N devices of one process, one worker thread per device (rank), each handed a `Comm` for collectives.
use crate::hub::{Abort, Hub, Slot};
#[cfg(feature = "mpi")]
use crate::mpi::Link;
/// Without MPI no group spans processes: no per-rank communicators.
#[cfg(not(feature = "mpi"))]
enum Link {}
use netcl_core_devices::{Device, Error, Result};
use netcl_core_memory::PinnedBuffer;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a rank waits in a collective for the others before the group is aborted.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Devices that run one program together: rank `r` is `devices[r]`. [`Group::run`] starts one
/// thread per rank and hands each a [`Comm`].
///
/// # Example
///
/// Every device present (the host, and each OpenCL device) sums its rank's tensor with the
/// others'; every rank gets the same bits.
///
/// ```
/// use netcl_core_devices::{DType, Device};
/// use netcl_distributed::{Group, ReduceOp};
/// use netcl_ops::Tensor;
///
/// let group = Group::new(Device::all())?;
/// let sums = group.run(|comm| {
///     // Rank r holds [r + 1, r + 1, r + 1] on its own device.
///     let t = Tensor::full(&[3], comm.rank() as f64 + 1.0, DType::F32, comm.device())?;
///     comm.all_reduce(&t, ReduceOp::Sum)?; // in place, on every rank
///     t.to_vec::<f32>()
/// })?;
/// let n = group.size() as f32;
/// for s in &sums {
///     assert_eq!(s, &vec![n * (n + 1.0) / 2.0; 3]);
/// }
/// # Ok::<(), netcl_core_devices::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Group {
    devices: Vec<Device>,
    timeout: Duration,
    /// Set for a group of one process of an MPI job (`MpiWorld::group`): its ranks are ranks of
    /// the job, which this communicator over every process joins.
    #[cfg(feature = "mpi")]
    across: Option<Arc<crate::mpi::Link>>,
}

impl Group {
    /// A group over `devices` (any mix of OpenCL devices and the host; each at most once).
    pub fn new(devices: Vec<Device>) -> Result<Group> {
        if devices.is_empty() {
            return Err(Error::invalid("Group::new", "no devices given"));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::invalid(
                    "Group::new",
                    format!("device {d} is listed twice: one rank per device"),
                ));
            }
        }
        Ok(Group {
            devices,
            timeout: DEFAULT_TIMEOUT,
            #[cfg(feature = "mpi")]
            across: None,
        })
    }

    /// This group as one process's part of the MPI job that `world` spans.
    #[cfg(feature = "mpi")]
    pub(crate) fn across(mut self, world: Arc<crate::mpi::Link>) -> Group {
        self.across = Some(world);
        self
    }

    /// Rank `rank`'s communicator over the group's `hub`: of the job too for a group that
    /// spans processes, through `links[rank]` (one MPI communicator per local rank).
    fn comm(&self, rank: usize, hub: &Arc<Hub>, links: &mut [Option<Link>]) -> Comm {
        let local = Comm::new(
            rank,
            self.devices.len(),
            self.devices[rank].clone(),
            hub.clone(),
        );
        #[cfg(feature = "mpi")]
        if let Some(link) = links.get_mut(rank).and_then(Option::take) {
            return crate::tier::tiered(local, link);
        }
        let _ = links;
        local
    }

    /// How long a rank waits for the others in a collective before every rank gets an error
    /// (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Group {
        self.timeout = timeout;
        self
    }

    pub fn size(&self) -> usize {
        self.devices.len()
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Runs `f` on every rank, each on its own thread, and returns the ranks' results in rank
    /// order. When a rank returns an error (or panics), the group is aborted: every rank
    /// waiting in, or later entering, a collective gets an error at once, and `run` returns the
    /// error of the rank that failed first. A rank that returns `Ok` while others still wait in
    /// a collective (or enter one later) fails them at once too, not after the timeout.
    pub fn run<T, F>(&self, f: F) -> Result<Vec<T>>
    where
        T: Send,
        F: Fn(&Comm) -> Result<T> + Sync,
    {
        let size = self.devices.len();
        let abort = Arc::new(Abort::default());
        let relay = self.devices.iter().all(Device::is_opencl);
        let hub = Arc::new(Hub::new(size, abort.clone(), self.timeout, relay));
        // Across processes: an MPI communicator per local rank (duplicated in rank order on
        // every process: a collective over the job).
        #[cfg(feature = "mpi")]
        let mut links: Vec<Option<Link>> = match &self.across {
            Some(world) => (0..size).map(|_| Some(world.dup())).collect(),
            None => Vec::new(),
        };
        #[cfg(not(feature = "mpi"))]
        let mut links: Vec<Option<Link>> = Vec::new();
        let comms: Vec<Comm> = (0..size)
            .map(|rank| self.comm(rank, &hub, &mut links))
            .collect();
        let first_failure: Mutex<Option<(usize, Error)>> = Mutex::new(None);
        let results: Vec<Option<T>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let (f, abort, first) = (&f, &abort, &first_failure);
                    std::thread::Builder::new()
                        .name(format!("netcl-rank-{rank}"))
                        .spawn_scoped(s, move || {
                            let out = catch_unwind(AssertUnwindSafe(|| f(&comm)))
                                .unwrap_or_else(|p| Err(panicked(rank, p)));
                            match out {
                                Ok(v) => {
                                    abort.returned(rank);
                                    Some(v)
                                }
                                Err(e) => {
                                    let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
                                    if first.is_none() && !abort.is_set() {
                                        abort.raise(format!("rank {rank} failed: {e}"));
                                        *first = Some((rank, e));
                                    } else if first.is_none() {
                                        *first = Some((rank, e));
                                    }
                                    None
                                }
                            }
                        })
                })
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| Error::invalid("Group::run", format!("spawning a rank thread: {e}")))
                .map(|hs| {
                    hs.into_iter()
                        .map(|h| h.join().ok().flatten())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            handles
        });
        if let Some((rank, e)) = first_failure
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
        {
            // The other processes of the job would wait for this one in MPI forever.
            #[cfg(feature = "mpi")]
            if let Some(world) = &self.across {
                crate::mpi::Net::abort(&**world, &format!("rank {rank} failed: {e}"));
            }
            return Err(match e {
                Error::Device { op, msg } if !msg.starts_with("rank") => Error::Device {
                    op,
                    msg: format!("rank {rank}: {msg}"),
                },
                e => e,
            });
        }
        if results.len() != size || results.iter().any(Option::is_none) {
            return Err(Error::invalid("Group::run", "a rank thread did not finish"));
        }
        Ok(results.into_iter().flatten().collect())
    }
}

fn panicked(rank: usize, p: Box<dyn std::any::Any + Send>) -> Error {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    Error::invalid("Group::run", format!("rank {rank} panicked: {msg}"))
}

/// One rank's handle on its group: its rank, the group size, its device, and the collectives
/// (see `collectives.rs`). Used by the rank's own thread.
pub struct Comm {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: Device,
    pub(crate) hub: Arc<Hub>,
    /// Two pinned staging buffers (chunks in flight) of an OpenCL rank, made on first use.
    pub(crate) staging: Mutex<Vec<PinnedBuffer>>,
    /// How many exchanges this rank made on `hub` (see `Hub::exchange`).
    seq: AtomicU64,
    /// Set for a communicator between processes: the collectives go through MPI.
    #[cfg(feature = "mpi")]
    pub(crate) mpi: Option<Arc<dyn crate::mpi::Net>>,
}

impl Comm {
    pub(crate) fn new(rank: usize, size: usize, device: Device, hub: Arc<Hub>) -> Comm {
        Comm {
            rank,
            size,
            device,
            hub,
            staging: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// Publish `slot` and read every rank's (see `Hub::exchange`).
    pub(crate) fn exchange(&self, op: &str, slot: Slot) -> Result<Vec<Slot>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.hub.exchange(op, self.rank, seq, slot)
    }

    pub(crate) fn sync(&self, op: &str) -> Result<()> {
        self.hub.barrier(op, self.rank)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    /// The device this rank computes on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A second communicator over the same ranks with its own rendezvous, for collectives that
    /// run on another thread of each rank (data-parallel training's gradient buckets) without
    /// mixing with this one's. Collective: every rank must call it.
    pub fn duplicate(&self) -> Result<Comm> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return m.duplicate(self);
        }
        let fresh = Arc::new(Hub::new(
            self.size,
            self.hub.abort.clone(),
            self.hub.timeout,
            self.hub.relay,
        ));
        // Rank 0's hub becomes everyone's: publish its address, read it, then hold a reference.
        let mine = Arc::into_raw(fresh.clone()) as usize;
        let slots = self.exchange(
            "Comm::duplicate",
            Slot {
                ptr: mine,
                ..Default::default()
            },
        );
        let result = slots.map(|slots| {
            let root = slots[0].ptr as *const Hub;
            // SAFETY: rank 0's pointer came from Arc::into_raw and stays valid until rank 0
            // releases it after the closing barrier below; increment before using it.
            unsafe {
                Arc::increment_strong_count(root);
                Arc::from_raw(root)
            }
        });
        let closing = self.hub.barrier("Comm::duplicate", self.rank);
        // Balance the into_raw above (each rank leaked one reference to its own hub), except on
        // rank 0 after a failed barrier: a late rank may still be about to take its reference.
        if closing.is_ok() || self.rank != 0 {
            // SAFETY: `mine` came from Arc::into_raw of this rank's own hub.
            drop(unsafe { Arc::from_raw(mine as *const Hub) });
        }
        drop(fresh);
        let hub = result?;
        closing?;
        Ok(Comm::new(self.rank, self.size, self.device.clone(), hub))
    }

    /// Marks the whole group failed (every rank's next or current collective returns an error).
    pub fn abort(&self, why: &str) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            m.abort(why);
        }
        self.hub
            .abort
            .raise(format!("rank {} aborted: {why}", self.rank));
    }

    /// `result`, having aborted the group when it is an error (so no rank waits for this one).
    pub(crate) fn or_abort<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.abort(&e.to_string());
        }
        result
    }
}
