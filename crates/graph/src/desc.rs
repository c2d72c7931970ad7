//! The description of a captured graph: programs, nodes, buffers and the buffer plan, as plain data that `Graph::save` writes as JSON and `Graph::load` reads back.
use serde::{Deserialize, Serialize};

/// The format's version; `Graph::load` refuses other versions (2: sealed, with the netcl
/// version, its kernels' hash and the device).
pub const SCHEMA_VERSION: u32 = 2;

/// A buffer a node reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufRef {
    /// Made and freed inside the step: lives in one of the graph's slots.
    Internal(usize),
    /// Lives outside the step (parameters, gradients, optimizer state, slots, what the step made
    /// and kept).
    External(usize),
}

/// One kernel argument.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeArg {
    Buf(BufRef),
    /// A plain value's bytes, as hex.
    Bytes(#[serde(with = "hex")] Vec<u8>),
    /// Dynamic local memory of this many bytes.
    Local(usize),
}

/// One step of the graph, in queue order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Node {
    Launch {
        /// Index into [`GraphDesc::programs`].
        program: usize,
        kernel: String,
        args: Vec<NodeArg>,
        /// Work-items per dim (a multiple of `local`).
        global: Vec<usize>,
        local: Vec<usize>,
        /// Per argument: whether the kernel may write it (its declaration); empty counts every
        /// buffer as written.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        writes: Vec<bool>,
    },
    /// Constant bytes the step wrote from the host (replayed from a device copy of them).
    Write {
        dst: BufRef,
        offset: usize,
        #[serde(with = "hex")]
        data: Vec<u8>,
    },
    Copy {
        src: BufRef,
        src_offset: usize,
        dst: BufRef,
        dst_offset: usize,
        len: usize,
    },
}

impl Node {
    /// The buffers this node touches.
    pub fn buffers(&self) -> Vec<BufRef> {
        match self {
            Node::Launch { args, .. } => args
                .iter()
                .filter_map(|a| match a {
                    NodeArg::Buf(b) => Some(*b),
                    _ => None,
                })
                .collect(),
            Node::Write { dst, .. } => vec![*dst],
            Node::Copy { src, dst, .. } => vec![*src, *dst],
        }
    }

    /// The buffers this node touches, to renumber them.
    pub(crate) fn buffers_mut(&mut self) -> Vec<&mut BufRef> {
        match self {
            Node::Launch { args, .. } => args
                .iter_mut()
                .filter_map(|a| match a {
                    NodeArg::Buf(b) => Some(b),
                    _ => None,
                })
                .collect(),
            Node::Write { dst, .. } => vec![dst],
            Node::Copy { src, dst, .. } => vec![src, dst],
        }
    }
}

/// A program the nodes launch kernels of: its OpenCL C (without the common header) and options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgramDesc {
    pub name: String,
    pub text: String,
    pub options: String,
}

/// A buffer made and freed inside the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Internal {
    pub bytes: usize,
    /// First and last node that touch it.
    pub first: usize,
    pub last: usize,
    /// The slot (a buffer shared by internal buffers that are never alive together) it lives in.
    pub slot: usize,
}

/// What an external buffer is to the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Existed before the capture (parameters, gradient buffers, optimizer state, input slots).
    Bound,
    /// Made by the step and still alive at its end (outputs, gradients it allocated): the graph
    /// keeps it when its owner lets it go.
    Kept,
}

/// A buffer outside the plan (not one of the slots).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct External {
    /// The name it is bound by when the graph is loaded (a slot, a named tensor, a builtin).
    pub name: Option<String>,
    /// Bytes of its storage.
    pub bytes: usize,
    pub role: Role,
}

/// A named tensor of the graph: an input or output slot, or a named bound tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    pub name: String,
    /// The external buffer holding it.
    pub external: usize,
    pub shape: Vec<usize>,
    pub dtype: String,
    /// Offset of its first element in the storage (views of one buffer, e.g. gradients).
    pub offset: usize,
}

/// A device as a loaded graph must find it: its work sizes and local memory were chosen for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceId {
    pub platform: String,
    pub platform_version: String,
    pub name: String,
    pub driver_version: String,
}

impl DeviceId {
    pub fn of(device: &netcl_core_devices::Device) -> DeviceId {
        let info = device.info();
        DeviceId {
            platform: info.platform.clone(),
            platform_version: info.platform_version.clone(),
            name: info.name.clone(),
            driver_version: info.driver_version.clone(),
        }
    }
}

/// The SHA-256 of every file under kernels/ as this netcl embeds them (names and texts).
pub fn kernels_sha256() -> &'static str {
    use sha2::{Digest, Sha256};
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| {
        let mut h = Sha256::new();
        for s in netcl_kernels::sources::every() {
            h.update(s.name.as_bytes());
            h.update([0]);
            h.update(s.text.as_bytes());
            h.update([0]);
        }
        crate::seal::to_hex(&h.finalize())
    })
}

/// Everything a captured graph is, without the live OpenCL objects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphDesc {
    pub schema_version: u32,
    /// The netcl that captured it: its version and the SHA-256 of its kernels/ files (a graph
    /// loads only into a netcl with the same kernels).
    pub netcl_version: String,
    pub kernels_sha256: String,
    /// The device it was captured on (as displayed).
    pub device: String,
    /// The platform, device and driver it was captured on: the device loading it must match.
    pub device_id: DeviceId,
    pub programs: Vec<ProgramDesc>,
    pub nodes: Vec<Node>,
    pub internals: Vec<Internal>,
    pub externals: Vec<External>,
    pub inputs: Vec<Slot>,
    pub outputs: Vec<Slot>,
    /// Tensors named with `Capture::name`.
    pub named: Vec<Slot>,
    /// Sizes of the slots the internal buffers share.
    pub slots: Vec<usize>,
    /// Bytes the pool reserves for all slots (their size classes).
    pub arena_bytes: usize,
    /// The most bytes the pool reserved for internal buffers at once when the step ran eagerly.
    pub eager_peak_bytes: usize,
    /// Sizes are rounded up to multiples of this.
    pub align: usize,
    /// Nodes of the recorded step left out: what they wrote reached nothing the step keeps.
    #[serde(default)]
    pub dead_nodes: usize,
}

/// Bytes as a lowercase hex string in JSON.
mod hex {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::seal::to_hex(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        crate::seal::from_hex(&s)
            .ok_or_else(|| D::Error::custom(format!("not a hex string: {s:?}")))
    }
}
