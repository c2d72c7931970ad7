//! The same `Comm` collectives between processes through MPI (feature `mpi`): one process per device or node, host buffers through MPI.
//!
//! Launch with `mpirun -np N prog` (a hostfile for several nodes) or `srun`. Reductions stay
//! deterministic and bit-identical to the in-process group: each rank sends segment s of its data
//! to rank s (MPI_Alltoallv), rank s folds the N copies in rank order, and MPI_Allgatherv brings
//! every reduced segment to every rank. MPI has no timeout: a rank that fails calls MPI_Abort,
//! which ends every process of the job with an error.
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

fn counts(len: usize, size: usize) -> (Vec<i32>, Vec<i32>) {
    (0..size)
        .map(|s| {
            let r = split_range(len, size, s);
            (r.len() as i32, r.start as i32)
        })
        .unzip()
}

impl Link {
    pub(crate) fn duplicate(&self, comm: &Comm) -> Comm {
        from_link(Link(self.0.duplicate()), comm.device.clone())
    }

    pub(crate) fn abort(&self, why: &str) -> ! {
        eprintln!("netcl: rank {} aborts the MPI job: {why}", self.0.rank());
        self.0.abort(1)
    }

    pub(crate) fn barrier(&self) {
        self.0.barrier()
    }

    /// In-place reduction of host memory, folded in rank order (see the module comment).
    pub(crate) fn all_reduce_host(&self, data: &mut [f32], op: ReduceOp, scale: f32) -> Result<()> {
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

    pub(crate) fn broadcast_host(&self, data: &mut [f32], root: usize) {
        self.0.process_at_rank(root as i32).broadcast_into(data)
    }

    /// Every rank's rows: (rows per rank, all data in rank order); `row` elements per row.
    pub(crate) fn all_gather_rows(
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

/// The collectives of `Comm` over MPI (called by the `Comm` methods when it has a link).
impl Link {
    pub(crate) fn all_reduce(
        &self,
        comm: &Comm,
        t: &Tensor,
        op: ReduceOp,
        scale: f32,
    ) -> Result<()> {
        check_f32("all_reduce", t)?;
        let mut data = t.to_vec::<f32>()?;
        self.all_reduce_host(&mut data, op, scale)?;
        let _ = comm;
        write_tensor(t, &data)
    }

    pub(crate) fn broadcast(&self, comm: &Comm, t: &Tensor, root: usize) -> Result<()> {
        check_f32("broadcast", t)?;
        let mut data = t.to_vec::<f32>()?;
        self.broadcast_host(&mut data, root);
        if comm.rank != root {
            write_tensor(t, &data)?;
        }
        Ok(())
    }

    pub(crate) fn reduce(&self, comm: &Comm, t: &Tensor, root: usize, op: ReduceOp) -> Result<()> {
        check_f32("reduce", t)?;
        let mut data = t.to_vec::<f32>()?;
        self.all_reduce_host(&mut data, op, 1.0)?;
        if comm.rank == root {
            write_tensor(t, &data)?;
        }
        Ok(())
    }

    pub(crate) fn gather(
        &self,
        comm: &Comm,
        t: &Tensor,
        root: Option<usize>,
    ) -> Result<Option<Tensor>> {
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

    pub(crate) fn scatter(&self, comm: &Comm, src: Option<&Tensor>, root: usize) -> Result<Tensor> {
        let mine = match (comm.rank == root, src) {
            (true, Some(t)) if !t.shape().is_empty() => {
                check_f32("scatter", t)?;
                Some(t)
            }
            _ => None,
        };
        // The root's shape first (ndim, then dims; ndim 0: no tensor), then its data.
        let mut ndim = [mine.map_or(0u64, |t| t.ndim() as u64)];
        self.0
            .process_at_rank(root as i32)
            .broadcast_into(&mut ndim[..]);
        if ndim[0] == 0 {
            return Err(Error::invalid(
                "scatter",
                format!("root {root} must pass a tensor of at least one dimension"),
            ));
        }
        let mut dims: Vec<u64> = mine.map_or(vec![0; ndim[0] as usize], |t| {
            t.shape().iter().map(|&d| d as u64).collect()
        });
        self.0
            .process_at_rank(root as i32)
            .broadcast_into(&mut dims[..]);
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let mut data = match mine {
            Some(t) => t.to_vec::<f32>()?,
            None => vec![0f32; shape.iter().product()],
        };
        self.broadcast_host(&mut data, root);
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

    pub(crate) fn reduce_scatter(&self, comm: &Comm, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
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
