//! The same `Comm` collectives between processes through MPI (feature `mpi`): one process per device or node, or several devices per process (`MpiWorld::group`), host buffers through MPI.
//!
//! Launch with `mpirun -np N prog` (a hostfile for several nodes) or `srun`. Reductions stay
//! deterministic and bit-identical on every rank: between processes each rank sends segment s
//! of its data to rank s (MPI_Alltoallv), rank s folds the N copies in rank order, and
//! MPI_Allgatherv brings every reduced segment to every rank; a process of several devices first
//! folds its ranks' data through its hub (tier.rs). MPI has no timeout: a rank that fails calls
//! MPI_Abort, which ends every process of the job with an error.
use crate::group::Comm;
use crate::hub::{Abort, Hub, Slot};
use crate::reduce::{reduce_range, split_range, ReduceOp};
use crate::staging::{check_f32, write_tensor};
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use netcl_core_devices::{Device, Error, Result};
use netcl_ops::Tensor;
use std::sync::Arc;

/// An MPI communicator usable from several threads (MPI is initialised with
/// MPI_THREAD_MULTIPLE).
pub(crate) struct Link(SimpleCommunicator);
// SAFETY: MPI_THREAD_MULTIPLE (checked in MpiWorld::init) allows calls from any thread; each
// Link is used by one thread at a time (its Comm's).
unsafe impl Send for Link {}
unsafe impl Sync for Link {}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MPI rank {} of {}", self.0.rank(), self.0.size())
    }
}

/// This process's MPI environment: initialise once, make [`Comm`]s, drop last.
pub struct MpiWorld {
    universe: Universe,
    local_rank: usize,
}

impl MpiWorld {
    /// MPI_Init_thread with MPI_THREAD_MULTIPLE (data-parallel training reduces gradients on a
    /// second thread); an error when MPI is already initialised or offers less.
    pub fn init() -> Result<MpiWorld> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| Error::invalid("MpiWorld::init", "MPI is already initialised"))?;
        if threading != mpi::Threading::Multiple {
            return Err(Error::invalid(
                "MpiWorld::init",
                format!("the MPI library offers {threading:?}; netcl needs Multiple"),
            ));
        }
        let local_rank = universe.world().split_shared(0).rank() as usize;
        Ok(MpiWorld {
            universe,
            local_rank,
        })
    }

    pub fn rank(&self) -> usize {
        self.universe.world().rank() as usize
    }
    pub fn size(&self) -> usize {
        self.universe.world().size() as usize
    }
    /// This process's rank among the processes of its node (which device it should take).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The device for this process: OpenCL device `local_rank % count`, else the host.
    pub fn local_device(&self) -> Device {
        let cl = Device::opencl_devices();
        if cl.is_empty() {
            Device::host()
        } else {
            cl[self.local_rank % cl.len()].clone()
        }
    }

    /// A communicator over every process of the job (its own duplicate of MPI_COMM_WORLD), this
    /// process computing on `device`. Drop it before the `MpiWorld`.
    pub fn comm(&self, device: Device) -> Comm {
        let world = self.universe.world();
        from_link(Link(world.duplicate()), device)
    }

    /// A group of this process's `devices` whose [`Group::run`](crate::Group::run) ranks are
    /// ranks of the whole job: with P processes of L devices each, process p's device l is rank
    /// p L + l of P L. Every process must pass the same number of devices (an error on every
    /// process names the counts otherwise). Collective over the job, as is each `run` of the
    /// group (every process runs it the same number of times). Drop it before the `MpiWorld`.
    pub fn group(&self, devices: Vec<Device>) -> Result<crate::Group> {
        let world = self.universe.world();
        let mut counts = vec![0u64; self.size()];
        world.all_gather_into(&(devices.len() as u64), &mut counts[..]);
        if counts.iter().any(|&c| c != counts[0]) {
            return Err(Error::invalid(
                "MpiWorld::group",
                format!("processes pass different numbers of devices {counts:?}: each the same"),
            ));
        }
        let group = crate::Group::new(devices)?;
        Ok(group.across(Arc::new(Link(world.duplicate()))))
    }
}

fn from_link(link: Link, device: Device) -> Comm {
    let (rank, size) = (link.0.rank() as usize, link.0.size() as usize);
    let mut c = Comm::new(
        rank,
        size,
        device,
        Arc::new(Hub::new(
            1,
            Arc::new(Abort::default()),
            crate::DEFAULT_TIMEOUT,
            false,
        )),
    );
    c.mpi = Some(Arc::new(link));
    c
}

/// What `Comm`'s collectives need between processes: host-memory primitives (`Link`: MPI, a
/// process per rank; `Tier`: several devices per process) and the collectives made of them.
pub(crate) trait Net: Send + Sync {
    /// In-place reduction of host memory across every rank, bit-identical on all of them.
    fn all_reduce_host(&self, data: &mut [f32], op: ReduceOp, scale: f32) -> Result<()>;
    /// Rank `root`'s `data` into every rank's (the same length on every rank).
    fn broadcast_host(&self, data: &mut [f32], root: usize) -> Result<()>;
    /// [`Net::broadcast_host`] of sizes.
    fn broadcast_sizes(&self, data: &mut [u64], root: usize) -> Result<()>;
    /// Every rank's rows: (rows per rank, all data in rank order); `row` elements per row.
    fn all_gather_rows(
        &self,
        data: &[f32],
        rows: usize,
        row: usize,
    ) -> Result<(Vec<usize>, Vec<f32>)>;
    fn barrier(&self) -> Result<()>;
    /// A communicator over the same ranks for another thread of each (collective).
    fn duplicate(&self, comm: &Comm) -> Result<Comm>;
    /// Ends every process of the job.
    fn abort(&self, why: &str) -> !;

    fn all_reduce(&self, comm: &Comm, t: &Tensor, op: ReduceOp, scale: f32) -> Result<()> {
        check_f32("all_reduce", t)?;
        let mut data = t.to_vec::<f32>()?;
        self.all_reduce_host(&mut data, op, scale)?;
        let _ = comm;
        write_tensor(t, &data)
    }

    fn broadcast(&self, comm: &Comm, t: &Tensor, root: usize) -> Result<()> {
        check_f32("broadcast", t)?;
        let mut data = t.to_vec::<f32>()?;
        self.broadcast_host(&mut data, root)?;
        if comm.rank != root {
            write_tensor(t, &data)?;
        }
        Ok(())
    }

    fn reduce(&self, comm: &Comm, t: &Tensor, root: usize, op: ReduceOp) -> Result<()> {
        check_f32("reduce", t)?;
        let mut data = t.to_vec::<f32>()?;
        self.all_reduce_host(&mut data, op, 1.0)?;
        if comm.rank == root {
            write_tensor(t, &data)?;
        }
        Ok(())
    }

    fn gather(&self, comm: &Comm, t: &Tensor, root: Option<usize>) -> Result<Option<Tensor>> {
        check_f32("all_gather", t)?;
        let shape = if t.shape().is_empty() {
            vec![1]
        } else {
            t.shape().to_vec()
        };
        let row: usize = shape[1..].iter().product();
        let (rows, all) = self.all_gather_rows(&t.to_vec::<f32>()?, shape[0], row)?;
        if root.is_some_and(|r| r != comm.rank) {
            return Ok(None);
        }
        let mut out = shape;
        out[0] = rows.iter().sum();
        Tensor::from_vec(all, &out, &comm.device).map(Some)
    }

    fn scatter(&self, comm: &Comm, src: Option<&Tensor>, root: usize) -> Result<Tensor> {
        let mine = match (comm.rank == root, src) {
            (true, Some(t)) if !t.shape().is_empty() => {
                check_f32("scatter", t)?;
                Some(t)
            }
            _ => None,
        };
        // The root's shape first (ndim, then dims; ndim 0: no tensor), then its data.
        let mut ndim = [mine.map_or(0u64, |t| t.ndim() as u64)];
        self.broadcast_sizes(&mut ndim[..], root)?;
        if ndim[0] == 0 {
            return Err(Error::invalid(
                "scatter",
                format!("root {root} must pass a tensor of at least one dimension"),
            ));
        }
        let mut dims: Vec<u64> = mine.map_or(vec![0; ndim[0] as usize], |t| {
            t.shape().iter().map(|&d| d as u64).collect()
        });
        self.broadcast_sizes(&mut dims[..], root)?;
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let mut data = match mine {
            Some(t) => t.to_vec::<f32>()?,
            None => vec![0f32; shape.iter().product()],
        };
        self.broadcast_host(&mut data, root)?;
        let row: usize = shape[1..].iter().product();
        let rows = split_range(shape[0], comm.size, comm.rank);
        let mut out = shape;
        out[0] = rows.len();
        Tensor::from_vec(
            data[rows.start * row..rows.end * row].to_vec(),
            &out,
            &comm.device,
        )
    }

    fn reduce_scatter(&self, comm: &Comm, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        check_f32("reduce_scatter", t)?;
        if t.shape().is_empty() {
            return Err(Error::invalid(
                "reduce_scatter",
                "the tensor needs at least one dimension",
            ));
        }
        let mut data = t.to_vec::<f32>()?;
        self.all_reduce_host(&mut data, op, 1.0)?;
        let row: usize = t.shape()[1..].iter().product();
        let rows = split_range(t.shape()[0], comm.size, comm.rank);
        let mut shape = t.shape().to_vec();
        shape[0] = rows.len();
        Tensor::from_vec(
            data[rows.start * row..rows.end * row].to_vec(),
            &shape,
            &comm.device,
        )
    }
}

fn counts(len: usize, size: usize) -> (Vec<i32>, Vec<i32>) {
    (0..size)
        .map(|s| {
            let r = split_range(len, size, s);
            (r.len() as i32, r.start as i32)
        })
        .unzip()
}

impl Link {
    /// A second communicator over the same processes (collective over them).
    pub(crate) fn dup(&self) -> Link {
        Link(self.0.duplicate())
    }

    /// Every process's `data` (the same length on each), in process order.
    pub(crate) fn all_gather_sizes(&self, data: &[u64]) -> Vec<u64> {
        let mut all = vec![0u64; data.len() * self.0.size() as usize];
        self.0.all_gather_into(data, &mut all[..]);
        all
    }

    /// This process's index among the link's.
    pub(crate) fn rank(&self) -> usize {
        self.0.rank() as usize
    }

    pub(crate) fn size(&self) -> usize {
        self.0.size() as usize
    }

    /// Process `root`'s `data` into every process's.
    fn broadcast_any<T: Equivalence>(&self, data: &mut [T], root: usize) -> Result<()> {
        self.0.process_at_rank(root as i32).broadcast_into(data);
        Ok(())
    }
}

impl Net for Link {
    fn duplicate(&self, comm: &Comm) -> Result<Comm> {
        Ok(from_link(self.dup(), comm.device.clone()))
    }

    fn abort(&self, why: &str) -> ! {
        eprintln!("netcl: rank {} aborts the MPI job: {why}", self.0.rank());
        self.0.abort(1)
    }

    fn barrier(&self) -> Result<()> {
        self.0.barrier();
        Ok(())
    }

    /// In-place reduction of host memory, folded in rank order (see the module comment).
    fn all_reduce_host(&self, data: &mut [f32], op: ReduceOp, scale: f32) -> Result<()> {
        let size = self.0.size() as usize;
        let rank = self.0.rank() as usize;
        let mut lens = vec![0u64; size];
        self.0.all_gather_into(&(data.len() as u64), &mut lens[..]);
        if lens.iter().any(|&l| l != data.len() as u64) {
            return Err(Error::shape(
                "all_reduce",
                format!("ranks hold different lengths {lens:?}"),
            ));
        }
        let mut scales = vec![0f32; size];
        self.0.all_gather_into(&scale, &mut scales[..]);
        if data.is_empty() {
            return Ok(());
        }
        let (cnt, dsp) = counts(data.len(), size);
        let mine = split_range(data.len(), size, rank);
        // Every rank's copy of my segment, one after another in rank order.
        let mut gathered = vec![0f32; mine.len() * size];
        let recv_counts = vec![mine.len() as i32; size];
        let recv_displs: Vec<i32> = (0..size).map(|r| (r * mine.len()) as i32).collect();
        {
            let send = Partition::new(&data[..], &cnt[..], &dsp[..]);
            let mut recv = PartitionMut::new(&mut gathered[..], &recv_counts[..], &recv_displs[..]);
            self.0.all_to_all_varcount_into(&send, &mut recv);
        }
        let slots: Vec<Slot> = (0..size)
            .map(|r| Slot {
                ptr: gathered[r * mine.len()..].as_ptr() as usize,
                len: mine.len(),
                scale: scales[r],
                shape: Vec::new(),
            })
            .collect();
        // SAFETY: each slot points into `gathered`, which lives and is unchanged until after this.
        let reduced = unsafe { reduce_range(&slots, op, 0, mine.len()) };
        let mut recv = PartitionMut::new(data, &cnt[..], &dsp[..]);
        self.0.all_gather_varcount_into(&reduced[..], &mut recv);
        Ok(())
    }

    fn broadcast_host(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.broadcast_any(data, root)
    }

    fn broadcast_sizes(&self, data: &mut [u64], root: usize) -> Result<()> {
        self.broadcast_any(data, root)
    }

    fn all_gather_rows(
        &self,
        data: &[f32],
        rows: usize,
        row: usize,
    ) -> Result<(Vec<usize>, Vec<f32>)> {
        let size = self.0.size() as usize;
        let mut info = vec![0u64; 2 * size];
        self.0
            .all_gather_into(&[rows as u64, row as u64][..], &mut info[..]);
        if (0..size).any(|r| info[2 * r + 1] != row as u64) {
            return Err(Error::shape(
                "all_gather",
                "ranks hold rows of different shapes",
            ));
        }
        let rows: Vec<usize> = (0..size).map(|r| info[2 * r] as usize).collect();
        let lens: Vec<i32> = rows.iter().map(|&n| (n * row) as i32).collect();
        let displs: Vec<i32> = lens
            .iter()
            .scan(0, |at, &l| {
                let d = *at;
                *at += l;
                Some(d)
            })
            .collect();
        let mut all = vec![0f32; lens.iter().map(|&l| l as usize).sum()];
        self.0.all_gather_varcount_into(
            data,
            &mut PartitionMut::new(&mut all[..], &lens[..], &displs[..]),
        );
        Ok((rows, all))
    }
}
