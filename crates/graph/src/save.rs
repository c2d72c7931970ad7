//! `Graph::save` / `Graph::load`: the op list, topology and plan as sealed JSON with a schema version; a load checks the seal, the netcl and device it was made by and the whole plan before it compiles or allocates anything, then binds the outside buffers by name to the tensors the loading process passes.
use crate::desc::{DeviceId, GraphDesc, Role, Slot, SCHEMA_VERSION};
use crate::graph::{mem_size, Graph};
use crate::{seal, validate};
use netcl_core_devices::{Device, Error, Result};
use netcl_core_memory::capture::Mem;
use netcl_kernels::{sources, Source};
use netcl_ops::{DType, Tensor};
use std::path::Path;

/// The first line of a graph file: `netcl-graph <schema version> <seal>`, then the JSON.
const MAGIC: &str = "netcl-graph";

impl GraphDesc {
    /// Writes this description as a graph file (what [`Graph::save`] writes): its JSON under a
    /// first line with the schema version and the seal of this installation's key
    /// ([`crate::key_path`], made at the first save), through a temporary file and a rename.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let json = serde_json::to_vec(self).map_err(|e| Error::format("graph", e.to_string()))?;
        let mut bytes = format!("{MAGIC} {SCHEMA_VERSION} {}\n", seal::seal(&json)?).into_bytes();
        bytes.extend_from_slice(&json);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, bytes).map_err(|e| Error::io(tmp.display().to_string(), e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path.display().to_string(), e))
    }

    /// Reads a graph file: a regular file whose first line names this schema version and whose
    /// seal matches its JSON under this installation's key. Nothing in it is checked further.
    pub fn read(path: impl AsRef<Path>) -> Result<GraphDesc> {
        let path = path.as_ref();
        let what = format!("graph {}", path.display());
        let bytes = netcl_core_devices::files::read_regular(path, u32::MAX as u64, "a graph file")?;
        let (head, json) = match bytes.iter().position(|&b| b == b'\n') {
            Some(i) => (&bytes[..i], &bytes[i + 1..]),
            None => (&bytes[..], &[][..]),
        };
        let head = std::str::from_utf8(head).unwrap_or_default();
        let Some(rest) = head.strip_prefix(MAGIC).and_then(|r| r.strip_prefix(' ')) else {
            // Version 1 files were plain, unsealed JSON.
            let version = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["schema_version"].as_u64());
            return Err(Error::format(
                what,
                match version {
                    Some(v) => format!(
                        "schema version {v} without a seal; this netcl reads sealed version \
                         {SCHEMA_VERSION}: capture the step and save it again"
                    ),
                    None => format!("not a netcl graph file (no `{MAGIC}` first line)"),
                },
            ));
        };
        let (version, mac) = rest.split_once(' ').unwrap_or((rest, ""));
        if version != SCHEMA_VERSION.to_string() {
            return Err(Error::format(
                what,
                format!("schema version {version}; this netcl reads version {SCHEMA_VERSION}"),
            ));
        }
        seal::check(json, mac, &what)?;
        let desc: GraphDesc =
            serde_json::from_slice(json).map_err(|e| Error::format(&what, e.to_string()))?;
        if desc.schema_version != SCHEMA_VERSION {
            return Err(Error::format(
                what,
                format!(
                    "schema version {} in a version {SCHEMA_VERSION} file",
                    desc.schema_version
                ),
            ));
        }
        Ok(desc)
    }
}

impl Graph {
    /// Writes the graph (programs, nodes, buffers, plan, slots) as a sealed graph file at `path`
    /// (see [`GraphDesc::save`]; a crash leaves the old file or the new one). Every buffer
    /// that existed before the capture must have a name (a slot, `Capture::name`, or netcl's
    /// own), since a loading process binds them by name.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        if let Some((i, e)) = self
            .desc
            .externals
            .iter()
            .enumerate()
            .find(|(_, e)| e.role == Role::Bound && e.name.is_none())
        {
            return Err(Error::invalid(
                "Graph::save",
                format!(
                    "outside buffer #{i} ({} B) has no name: name the tensors the step uses \
                     (parameters, gradients, optimizer state) with Capture::name",
                    e.bytes
                ),
            ));
        }
        self.desc.save(path)
    }

    /// Reads a graph saved by [`Graph::save`] and builds it on `device`, binding each named
    /// outside buffer to the tensor of that name in `bindings` (same storage size and layout as
    /// at the capture: the same model and optimizer after one eager step). Output slots not in
    /// `bindings` get new tensors.
    ///
    /// Before anything is compiled or allocated: the seal (the file is as this installation
    /// saved it), the netcl version and kernels, the device, every index, size and work size of
    /// the plan, and every binding are checked; any mismatch is an error saying which.
    pub fn load(
        path: impl AsRef<Path>,
        device: &Device,
        bindings: &[(&str, &Tensor)],
    ) -> Result<Graph> {
        let path = path.as_ref();
        let what = format!("graph {}", path.display());
        let desc = GraphDesc::read(path)?;
        check_origin(&desc, device, &what)?;
        validate::validate(&desc, device, &what)?;
        let bound = |name: &str| bindings.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        for s in desc.inputs.iter().chain(&desc.named) {
            if let Some(t) = bound(&s.name) {
                check_binding(s, t, device)?;
            }
        }
        // What each outside buffer will be, all checked before the first build or allocation.
        let mut plan = Vec::with_capacity(desc.externals.len());
        for (i, e) in desc.externals.iter().enumerate() {
            let name = e.name.as_deref();
            plan.push(match (name.and_then(bound), name) {
                (Some(t), _) => {
                    let m = t.mem()? as Mem;
                    if mem_size(m) < e.bytes {
                        return Err(Error::shape(
                            "Graph::load",
                            format!(
                                "{:?} has {} B of storage; the graph was captured with {} B",
                                name.unwrap_or_default(),
                                mem_size(m),
                                e.bytes
                            ),
                        ));
                    }
                    Outside::Bound(t)
                }
                (None, Some(netcl_ops::INDEX_ERRORS_BUFFER)) => Outside::IndexRecord,
                (None, _) if e.role == Role::Kept => {
                    match desc.outputs.iter().find(|s| s.external == i) {
                        Some(s) if s.offset == 0 => {
                            Outside::New(s.shape.clone(), DType::parse(&s.dtype)?)
                        }
                        _ => Outside::New(vec![e.bytes.div_ceil(4)], DType::U32),
                    }
                }
                (None, _) => {
                    return Err(Error::invalid(
                        "Graph::load",
                        format!(
                            "outside buffer {} ({} B) is not bound: pass a tensor of that name",
                            name.map_or(format!("#{i}"), |n| format!("{n:?}")),
                            e.bytes
                        ),
                    ))
                }
            });
        }
        for s in desc.inputs.iter().chain(&desc.outputs) {
            let made = matches!(plan[s.external], Outside::New(..));
            if bound(&s.name).is_none() && !made {
                return Err(Error::invalid(
                    "Graph::load",
                    format!("slot {:?} is not bound", s.name),
                ));
            }
        }
        let programs = desc
            .programs
            .iter()
            .map(|p| {
                // netcl's own files by their static text (validated equal); others as they came.
                let source = match sources::every().find(|s| s.name == p.name) {
                    Some(own) => *own,
                    None => Source {
                        name: Box::leak(p.name.clone().into_boxed_str()),
                        text: Box::leak(p.text.clone().into_boxed_str()),
                        // Replayed through bound kernels only: never launched eagerly.
                        kernels: &[],
                    },
                };
                netcl_kernels::program(device, &source, &p.options)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut held = Vec::new();
        let mut mems: Vec<Mem> = Vec::with_capacity(plan.len());
        for (o, e) in plan.into_iter().zip(&desc.externals) {
            let mem = match o {
                Outside::Bound(t) => {
                    held.push(t.clone());
                    t.mem()? as Mem
                }
                Outside::IndexRecord => netcl_ops::index_error_record(device)? as Mem,
                Outside::New(shape, dtype) => {
                    let t = Tensor::zeros(&shape, dtype, device)?;
                    let m = t.mem()? as Mem;
                    if mem_size(m) < e.bytes {
                        return Err(Error::invalid(
                            "Graph::load",
                            format!("a new {} B buffer for one of {} B", mem_size(m), e.bytes),
                        ));
                    }
                    held.push(t);
                    m
                }
            };
            mems.push(mem);
        }
        let slots = |list: &[Slot]| -> Vec<(String, Tensor)> {
            list.iter()
                .filter_map(|s| {
                    let t = match bound(&s.name) {
                        Some(t) => t.clone(),
                        None => held
                            .iter()
                            .find(|t| t.mem().ok() == Some(mems[s.external] as _))?
                            .clone(),
                    };
                    Some((s.name.clone(), t))
                })
                .collect()
        };
        let inputs = slots(&desc.inputs);
        let outputs = slots(&desc.outputs);
        Graph::build(desc, device, programs, mems, held, inputs, outputs)
    }
}

/// What a loaded graph's outside buffer becomes.
enum Outside<'a> {
    Bound(&'a Tensor),
    IndexRecord,
    New(Vec<usize>, DType),
}

/// The graph was made by a netcl with these kernels, for a device like `device`.
fn check_origin(desc: &GraphDesc, device: &Device, what: &str) -> Result<()> {
    let kernels = crate::desc::kernels_sha256();
    if desc.netcl_version != env!("CARGO_PKG_VERSION") || desc.kernels_sha256 != kernels {
        return Err(Error::format(
            what,
            format!(
                "made by netcl {} with other kernels (sha256 {:.12}); this is netcl {} (kernels \
                 {kernels:.12}): capture the step and save it again",
                desc.netcl_version,
                desc.kernels_sha256,
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    let here = DeviceId::of(device);
    if desc.device_id != here {
        let show =
            |d: &DeviceId| format!("{} on {} (driver {})", d.name, d.platform, d.driver_version);
        return Err(Error::device(
            "Graph::load",
            format!(
                "{what} was captured on {}; {device} is {}: its work sizes and local memory were \
                 chosen for that device, capture the step on this one",
                show(&desc.device_id),
                show(&here)
            ),
        ));
    }
    Ok(())
}

/// A bound tensor must match the slot it binds: device, shape, dtype and offset in its storage.
fn check_binding(s: &Slot, t: &Tensor, device: &Device) -> Result<()> {
    if t.device() != device {
        return Err(Error::device(
            "Graph::load",
            format!("{:?} is on {}; loading on {device}", s.name, t.device()),
        ));
    }
    if t.shape() != s.shape.as_slice() || t.dtype().name() != s.dtype || t.offset() != s.offset {
        return Err(Error::shape(
            "Graph::load",
            format!(
                "{:?} is {} {:?} at offset {}; the graph was captured with {} {:?} at offset {}",
                s.name,
                t.dtype(),
                t.shape(),
                t.offset(),
                s.dtype,
                s.shape,
                s.offset
            ),
        ));
    }
    Ok(())
}
