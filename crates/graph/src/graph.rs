//! `Graph`: capture a step on an OpenCL device, plan its buffers into shared slots, and replay it as pre-built kernels with all arguments set (or one command buffer where the device has cl_khr_command_buffer).
use crate::command_buffer::CommandBuffer;
use crate::desc::{BufRef, GraphDesc, Node, NodeArg, Role, Slot, SCHEMA_VERSION};
use crate::record::{self, aligned, Resolved};
use crate::replay::{CopyStep, Queues, Step};
use crate::schedule::Access;
use crate::{plan, prune};
use netcl_core_devices::opencl3::types::cl_mem;
use netcl_core_devices::{cl3, ClResultExt, Device, Error, Result};
use netcl_core_memory::capture::{self, Mem};
use netcl_core_memory::watch::Watch;
use netcl_core_memory::{size_class, Block, Pool};
use netcl_kernels::{BoundArg, BoundKernel, Program};
use netcl_ops::Tensor;
use std::sync::Arc;

/// What the closure given to [`Graph::capture`] declares: the step's input and output slots and
/// names for the tensors it uses (for [`Graph::save`]).
pub struct Capture {
    device: Device,
    inputs: Vec<(String, Tensor)>,
    outputs: Vec<(String, Tensor)>,
    named: Vec<(String, Tensor)>,
}

impl Capture {
    /// The device the step is captured on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Declares `t` (made before the capture, on its device) as the input slot `name`: each
    /// replay reads what [`Graph::set_input`] copied into it.
    pub fn input(&mut self, name: &str, t: &Tensor) -> Result<()> {
        self.check(name, t, "input")?;
        self.inputs.push((name.to_string(), t.clone()));
        Ok(())
    }

    /// Declares `t` as the output slot `name`: the graph keeps its storage, and each replay writes
    /// the new value there ([`Graph::output`]).
    pub fn output(&mut self, name: &str, t: &Tensor) -> Result<()> {
        self.check(name, t, "output")?;
        self.outputs.push((name.to_string(), t.clone()));
        Ok(())
    }

    /// Names the storage of `t` (a parameter, a gradient, optimizer state), so that a saved graph
    /// binds it by this name when loaded.
    pub fn name(&mut self, name: &str, t: &Tensor) -> Result<()> {
        self.check(name, t, "named tensor")?;
        self.named.push((name.to_string(), t.clone()));
        Ok(())
    }

    fn check(&self, name: &str, t: &Tensor, what: &str) -> Result<()> {
        let taken = self.inputs.iter().chain(&self.outputs).chain(&self.named);
        if taken.into_iter().any(|(n, _)| n == name) {
            return Err(Error::invalid(
                "Graph::capture",
                format!("the name {name:?} is declared twice"),
            ));
        }
        if t.device() != &self.device {
            return Err(Error::device(
                "Graph::capture",
                format!(
                    "{what} {name:?} is on {}; the graph captures on {}",
                    t.device(),
                    self.device
                ),
            ));
        }
        Ok(())
    }
}

/// Sizes of a graph and its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphStats {
    pub nodes: usize,
    pub kernels: usize,
    /// Buffers made and freed inside the step (planned into shared slots).
    pub internal_buffers: usize,
    /// Bytes of the slots they share: the planned memory of the step's own buffers.
    pub arena_bytes: usize,
    /// The most bytes the pool reserved for those buffers at once when the step ran eagerly
    /// (size classes; `arena_bytes` counts the slots the same way).
    pub eager_peak_bytes: usize,
    /// Buffers of the step that outlived it and are now kept by the graph alone.
    pub adopted: usize,
    /// Whether replays run as one cl_khr_command_buffer.
    pub command_buffer: bool,
    /// In-order queues a replay spreads its nodes over (1: the device's queue alone).
    pub queues: usize,
    /// Events one queue waits on from another per replay (start and end included).
    pub cross_waits: usize,
    /// Nodes of the recorded step left out: what they wrote reached nothing the step keeps (a
    /// loss that is neither returned nor an output, say).
    pub dead_nodes: usize,
}

/// A captured step: replays with one enqueue per node and nothing else.
pub struct Graph {
    pub(crate) desc: GraphDesc,
    device: Device,
    steps: Vec<Step>,
    /// What each step reads and writes (its schedule over several queues comes from this).
    access: Vec<Access>,
    command_buffer: Option<CommandBuffer>,
    /// Side queues and the schedule over them, when replays enqueue step by step on several.
    queues: Option<Queues>,
    inputs: Vec<(String, Tensor)>,
    outputs: Vec<(String, Tensor)>,
    /// Tensors whose storage the graph uses and keeps alive (slots, load-time allocations).
    _held: Vec<Tensor>,
    /// Taken first on drop: nothing is adopted or marked stale while the graph comes apart.
    watch: Option<Watch>,
    /// The blocks internal buffers share.
    _slots: Vec<Block>,
    /// The bytes of every `Write` node, copied from here on each replay.
    _constants: Option<Block>,
    /// The graph's kernels report bad indices into this thread's record: armed after a replay.
    uses_index_record: bool,
}

/// Ends this thread's recording however the closure leaves (error or panic).
struct EndCapture;
impl Drop for EndCapture {
    fn drop(&mut self) {
        capture::end();
    }
}

/// Bytes of the OpenCL buffer `mem`.
pub(crate) fn mem_size(mem: Mem) -> usize {
    cl3::memory::get_mem_object_info(mem as cl_mem, cl3::memory::CL_MEM_SIZE)
        .map(|v| v.to_size())
        .unwrap_or(0)
}

impl Graph {
    /// Runs `step` once on `device` (its work runs as usual) while recording every kernel launch,
    /// copy, host write, allocation and free there, and returns the graph with the step's result.
    ///
    /// Rules, as for CUDA graphs: run the step once eagerly before capturing, so optimizer state,
    /// gradient buffers and caches exist; feed data through input slots (`g.input`), not tensors
    /// made from host data inside the step (those bytes are replayed as constants); read nothing
    /// back inside the step (an error). The host device has no kernels to record: an error.
    pub fn capture<R>(
        device: &Device,
        step: impl FnOnce(&mut Capture) -> Result<R>,
    ) -> Result<(Graph, R)> {
        capture::begin(device)?;
        let end = EndCapture;
        let mut g = Capture {
            device: device.clone(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            named: Vec::new(),
        };
        let result = step(&mut g);
        let recording = capture::end();
        drop(end);
        let result = result?;
        let recording = recording.ok_or_else(|| {
            Error::invalid("Graph::capture", "the recording ended inside the step")
        })?;
        let align = aligned(Pool::of(device)?.alignment().max(256), 256);
        let mut resolved = record::resolve(recording, mem_size)?;
        let dead = prune::prune(&mut resolved);
        let graph = Graph::from_capture(device, resolved, g, align, dead)?;
        Ok((graph, result))
    }

    fn from_capture(
        device: &Device,
        mut r: Resolved,
        g: Capture,
        align: usize,
        dead_nodes: usize,
    ) -> Result<Graph> {
        let slots = plan::assign(&mut r.internals, &r.in_place, align);
        let mut desc = GraphDesc {
            schema_version: SCHEMA_VERSION,
            netcl_version: env!("CARGO_PKG_VERSION").to_string(),
            kernels_sha256: crate::desc::kernels_sha256().to_string(),
            device: device.to_string(),
            device_id: crate::desc::DeviceId::of(device),
            programs: r.program_descs,
            nodes: r.nodes,
            internals: r.internals,
            externals: r.externals,
            inputs: Vec::new(),
            outputs: Vec::new(),
            named: Vec::new(),
            // What the pool reserves for the slots (its size classes), as eager's peak counts.
            arena_bytes: {
                let pool_align = Pool::of(device)?.alignment();
                slots.iter().map(|&n| size_class(n, pool_align)).sum()
            },
            slots,
            eager_peak_bytes: r.eager_peak_bytes,
            align,
            dead_nodes,
        };
        let mut mems = r.external_mems;
        // Slots and named tensors: each an external (added when no node touched it).
        let mut slot = |name: &str, t: &Tensor, want: Option<Role>| -> Result<Slot> {
            let mem = t.mem()? as Mem;
            let i = match mems.iter().position(|&m| m == mem) {
                Some(i) => i,
                None => {
                    desc.externals.push(crate::desc::External {
                        name: None,
                        bytes: mem_size(mem),
                        role: Role::Bound,
                    });
                    mems.push(mem);
                    mems.len() - 1
                }
            };
            let ext = &mut desc.externals[i];
            if want.is_some_and(|w| w != ext.role) {
                return Err(Error::invalid(
                    "Graph::capture",
                    format!(
                        "input {name:?} was made inside the capture; make input tensors before it \
                         (the step only reads them)"
                    ),
                ));
            }
            ext.name.get_or_insert_with(|| name.to_string());
            Ok(Slot {
                name: name.to_string(),
                external: i,
                shape: t.shape().to_vec(),
                dtype: t.dtype().name().to_string(),
                offset: t.offset(),
            })
        };
        for (n, t) in &g.inputs {
            let s = slot(n, t, Some(Role::Bound))?;
            desc.inputs.push(s);
        }
        for (n, t) in &g.outputs {
            let s = slot(n, t, None)?;
            desc.outputs.push(s);
        }
        for (n, t) in &g.named {
            let s = slot(n, t, None)?;
            desc.named.push(s);
        }
        if let Some(m) = netcl_ops::existing_index_error_record(device) {
            if let Some(i) = mems.iter().position(|&x| x == m as Mem) {
                desc.externals[i]
                    .name
                    .get_or_insert_with(|| netcl_ops::INDEX_ERRORS_BUFFER.to_string());
            }
        }
        let held = g
            .inputs
            .iter()
            .chain(&g.outputs)
            .map(|(_, t)| t.clone())
            .collect();
        Graph::build(desc, device, r.programs, mems, held, g.inputs, g.outputs)
    }

    /// Makes the live objects of `desc`: slots, constants, kernels with all
    /// arguments set, the watch over the external buffers.
    pub(crate) fn build(
        desc: GraphDesc,
        device: &Device,
        programs: Vec<Arc<Program>>,
        external_mems: Vec<Mem>,
        held: Vec<Tensor>,
        inputs: Vec<(String, Tensor)>,
        outputs: Vec<(String, Tensor)>,
    ) -> Result<Graph> {
        let pool = Pool::of(device)?;
        // One pool block per slot; every internal buffer is its slot's whole block.
        let slots = desc
            .slots
            .iter()
            .map(|&n| pool.alloc(n))
            .collect::<Result<Vec<Block>>>()?;
        for b in &desc.internals {
            let fits = slots.get(b.slot).is_some_and(|s| s.len() >= b.bytes);
            if !fits {
                return Err(Error::invalid(
                    "Graph",
                    format!("a {}-byte buffer does not fit slot {}", b.bytes, b.slot),
                ));
            }
        }
        let mem_of = |b: BufRef| -> cl_mem {
            match b {
                BufRef::Internal(i) => slots[desc.internals[i].slot].mem(),
                BufRef::External(i) => external_mems[i] as cl_mem,
            }
        };
        // Constants: every Write node's bytes, back to back at aligned offsets.
        let mut bytes = Vec::new();
        let mut at = Vec::new();
        for n in &desc.nodes {
            if let Node::Write { data, .. } = n {
                at.push(bytes.len());
                bytes.extend_from_slice(data);
                bytes.resize(aligned(bytes.len(), 16), 0);
            }
        }
        let constants = match bytes.len() {
            0 => None,
            n => {
                let b = pool.alloc(n)?;
                netcl_core_memory::write(&b, 0, &bytes)?;
                Some(b)
            }
        };
        let mut steps = Vec::with_capacity(desc.nodes.len());
        let mut access = Vec::with_capacity(desc.nodes.len());
        let mut writes = at.into_iter();
        for n in &desc.nodes {
            access.push(node_access(n, &mem_of));
            steps.push(match n {
                Node::Launch {
                    program,
                    kernel,
                    args,
                    global,
                    local,
                    ..
                } => {
                    let p = programs.get(*program).ok_or_else(|| {
                        Error::invalid("Graph", format!("node names program {program}"))
                    })?;
                    let args: Vec<BoundArg> = args
                        .iter()
                        .map(|a| match a {
                            NodeArg::Buf(b) => BoundArg::Mem(mem_of(*b)),
                            NodeArg::Bytes(v) => BoundArg::Bytes(v.clone()),
                            NodeArg::Local(n) => BoundArg::Local(*n),
                        })
                        .collect();
                    Step::Kernel(BoundKernel::new(p, kernel, &args, global, local)?)
                }
                Node::Write { dst, offset, data } => Step::Copy(CopyStep {
                    src: constants.as_ref().map_or(0, |c| c.mem() as usize),
                    src_offset: writes.next().unwrap_or(0),
                    dst: mem_of(*dst) as usize,
                    dst_offset: *offset,
                    len: data.len(),
                }),
                Node::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    len,
                } => Step::Copy(CopyStep {
                    src: mem_of(*src) as usize,
                    src_offset: *src_offset,
                    dst: mem_of(*dst) as usize,
                    dst_offset: *dst_offset,
                    len: *len,
                }),
            });
        }
        let (bound, kept): (Vec<_>, Vec<_>) = external_mems
            .iter()
            .zip(&desc.externals)
            .partition(|(_, e)| e.role == Role::Bound);
        let mems = |v: Vec<(&Mem, _)>| v.into_iter().map(|(m, _)| *m).collect::<Vec<Mem>>();
        let (stale, kept) = (mems(bound), mems(kept));
        let uses_index_record = desc
            .externals
            .iter()
            .any(|e| e.name.as_deref() == Some(netcl_ops::INDEX_ERRORS_BUFFER));
        let command_buffer = CommandBuffer::record(device, &mut steps)?;
        let queues = match command_buffer {
            Some(_) => None,
            None => Queues::plan(device, &access, default_queues())?,
        };
        Ok(Graph {
            desc,
            device: device.clone(),
            steps,
            access,
            command_buffer,
            queues,
            inputs,
            outputs,
            _held: held,
            watch: Some(Watch::new(&stale, &kept)),
            _slots: slots,
            _constants: constants,
            uses_index_record,
        })
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The plan and its sizes.
    pub fn description(&self) -> &GraphDesc {
        &self.desc
    }

    pub fn stats(&self) -> GraphStats {
        GraphStats {
            nodes: self.desc.nodes.len(),
            kernels: self
                .desc
                .nodes
                .iter()
                .filter(|n| matches!(n, Node::Launch { .. }))
                .count(),
            internal_buffers: self.desc.internals.len(),
            arena_bytes: self.desc.arena_bytes,
            eager_peak_bytes: self.desc.eager_peak_bytes,
            adopted: self.watch.as_ref().map_or(0, Watch::adopted),
            command_buffer: self.command_buffer.is_some(),
            queues: self.queues.as_ref().map_or(1, |q| q.schedule().queues),
            cross_waits: self
                .queues
                .as_ref()
                .map_or(0, |q| q.schedule().cross_waits()),
            dead_nodes: self.desc.dead_nodes,
        }
    }

    /// Makes replays enqueue node by node over `queues` in-order queues (instead of a command
    /// buffer, where the device has one): nodes on independent branches run side by side, ordered
    /// by events where one needs another's result. 1 gives the device's queue alone.
    pub fn use_queues(&mut self, queues: usize) -> Result<()> {
        if queues == 0 {
            return Err(Error::invalid(
                "Graph::use_queues",
                "0 queues; 1 is the device's own queue",
            ));
        }
        self.drain()?;
        self.command_buffer = None;
        self.queues = None;
        self.queues = Queues::plan(&self.device, &self.access, queues)?;
        Ok(())
    }

    /// Waits for the replays in flight on every queue the graph uses: the device's queue first
    /// (finishing it submits the start marker the side queues may wait on), then the side queues.
    fn drain(&self) -> Result<()> {
        let finished = self
            .device
            .cl("Graph")?
            .queue
            .finish()
            .cl("clFinish (Graph)");
        if let Some(q) = &self.queues {
            q.finish();
        }
        finished
    }

    fn slot<'a>(slots: &'a [(String, Tensor)], name: &str, what: &str) -> Result<&'a Tensor> {
        slots
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                let names: Vec<&str> = slots.iter().map(|(n, _)| n.as_str()).collect();
                Error::invalid(
                    "Graph",
                    format!("no {what} slot {name:?}; the graph has {names:?}"),
                )
            })
    }

    /// The tensor of input slot `name`.
    pub fn input(&self, name: &str) -> Result<&Tensor> {
        Graph::slot(&self.inputs, name, "input")
    }

    /// The tensor of output slot `name`: after a replay, that replay's value.
    pub fn output(&self, name: &str) -> Result<&Tensor> {
        Graph::slot(&self.outputs, name, "output")
    }

    /// Copies `value` (same shape and dtype as captured, any device) into input slot `name`.
    pub fn set_input(&mut self, name: &str, value: &Tensor) -> Result<()> {
        let slot = self.input(name)?;
        if slot.shape() != value.shape() || slot.dtype() != value.dtype() {
            return Err(Error::shape(
                "Graph::set_input",
                format!(
                    "input {name:?} was captured as {} {:?}; given {} {:?}. A captured graph has \
                     fixed shapes: capture the step again for new shapes",
                    slot.dtype(),
                    slot.shape(),
                    value.dtype(),
                    value.shape()
                ),
            ));
        }
        slot.copy_(value)
    }

    /// Runs the captured step again: one enqueue per node (or one command buffer), no allocation,
    /// no argument setting. Errors when a buffer the graph uses but does not own was freed since
    /// the capture (a parameter or optimizer state replaced).
    pub fn replay(&mut self) -> Result<()> {
        if self.watch.as_ref().is_none_or(Watch::released) {
            return Err(Error::invalid(
                "Graph::replay",
                "a buffer the graph uses but does not own (a parameter, gradient buffer, \
                 optimizer state or a slot's storage) was freed after the capture, e.g. a model \
                 or optimizer replaced: capture the step again",
            ));
        }
        let queue = self.device.cl("Graph::replay")?.queue.get();
        // SAFETY (both enqueues below): the queues are the device's; every buffer is held by the
        // graph or watched (a freed one stops the replay above); copy ranges were recorded from
        // checked copies.
        match (&self.command_buffer, &self.queues) {
            (Some(cb), _) => cb.enqueue(queue)?,
            (None, Some(q)) => unsafe { q.enqueue(queue, &mut self.steps)? },
            (None, None) => {
                for s in &mut self.steps {
                    unsafe { s.enqueue(queue, &[], std::ptr::null_mut())? };
                }
            }
        }
        if self.uses_index_record {
            netcl_ops::index_error_record(&self.device)?;
        }
        for (_, t) in &self.outputs {
            t.mark_modified();
        }
        Ok(())
    }

    /// The bound kernels in replay order (inspection, and raw-enqueue baselines in benchmarks).
    pub fn kernels(&self) -> impl Iterator<Item = &BoundKernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Kernel(k) => Some(k),
            Step::Copy(_) => None,
        })
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph(on {}, {:?})", self.device, self.stats())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Copies read the constants and kernels use the slots: let the queue drain first, then
        // take the parts down in order (nothing adopted or marked stale meanwhile).
        let _ = self.drain();
        self.watch.take();
        self.queues.take();
        self.command_buffer.take();
        self.steps.clear();
        self._held.clear();
        self.inputs.clear();
        self.outputs.clear();
        self._slots.clear();
        self._constants.take();
    }
}

/// Queues a replay spreads over unless `Graph::use_queues` says otherwise:
/// [`Config::graph_queues`](netcl_core_devices::Config::graph_queues) (`NETCL_GRAPH_QUEUES`, else
/// 1). On NVIDIA's OpenCL an event one queue waits on from another costs more than the branches
/// gain (the replayed MLP step is slower on two queues; docs/performance.md, Training steps).
fn default_queues() -> usize {
    netcl_core_devices::Config::get().graph_queues
}

/// What `node` reads and writes, as `cl_mem` numbers (`mem_of` gives a buffer's).
fn node_access(node: &Node, mem_of: &dyn Fn(BufRef) -> cl_mem) -> Access {
    let (writes, reads) = crate::access::node_buffers(node);
    let mems = |v: Vec<BufRef>| v.into_iter().map(|b| mem_of(b) as usize).collect();
    Access {
        reads: mems(reads),
        writes: mems(writes),
    }
}
