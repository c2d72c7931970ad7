//! `Graph::save` / `Graph::load`: the op list, topology and plan as JSON with a schema version; a loaded graph binds its outside buffers by name to the tensors the loading process passes.
use crate::desc::{GraphDesc, Role, Slot, SCHEMA_VERSION};
use crate::graph::{mem_size, Graph};
use netcl_core_devices::{Device, Error, Result};
use netcl_core_memory::capture::Mem;
use netcl_kernels::Source;
use netcl_ops::{DType, Tensor};
use std::path::Path;

impl Graph {
    /// Writes the graph (programs, nodes, buffers, plan, slots) as JSON to `path` (through a
    /// temporary file and a rename, so a crash leaves the old file or the new one). Every buffer
    /// that existed before the capture must have a name (a slot, `Capture::name`, or netcl's
    /// own), since a loading process binds them by name.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
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
        let json =
            serde_json::to_vec(&self.desc).map_err(|e| Error::format("graph", e.to_string()))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json).map_err(|e| Error::io(tmp.display().to_string(), e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path.display().to_string(), e))
    }

    /// Reads a graph saved by [`Graph::save`] and builds it on `device`, binding each named
    /// outside buffer to the tensor of that name in `bindings` (same storage size and layout as
    /// at the capture: the same model and optimizer after one eager step). Output slots not in
    /// `bindings` get new tensors.
    pub fn load(
        path: impl AsRef<Path>,
        device: &Device,
        bindings: &[(&str, &Tensor)],
    ) -> Result<Graph> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let what = format!("graph {}", path.display());
        let desc: GraphDesc =
            serde_json::from_slice(&bytes).map_err(|e| Error::format(&what, e.to_string()))?;
        if desc.schema_version != SCHEMA_VERSION {
            return Err(Error::format(
                what,
                format!(
                    "schema version {}; this netcl reads version {SCHEMA_VERSION}",
                    desc.schema_version
                ),
            ));
        }
        let programs = desc
            .programs
            .iter()
            .map(|p| {
                let source = Source {
                    name: Box::leak(p.name.clone().into_boxed_str()),
                    text: Box::leak(p.text.clone().into_boxed_str()),
                };
                netcl_kernels::program(device, &source, &p.options)
            })
            .collect::<Result<Vec<_>>>()?;
        let bound = |name: &str| bindings.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        for s in desc.inputs.iter().chain(&desc.named) {
            if let Some(t) = bound(&s.name) {
                check_binding(s, t, device)?;
            }
        }
        let mut held = Vec::new();
        let mut mems: Vec<Mem> = Vec::with_capacity(desc.externals.len());
        for (i, e) in desc.externals.iter().enumerate() {
            let name = e.name.as_deref();
            let mem = match (name.and_then(bound), name) {
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
                    held.push(t.clone());
                    m
                }
                (None, Some(netcl_ops::INDEX_ERRORS_BUFFER)) => {
                    netcl_ops::index_error_record(device)? as Mem
                }
                (None, _) if e.role == Role::Kept => {
                    let slot = desc.outputs.iter().find(|s| s.external == i);
                    let t = match slot {
                        Some(s) if s.offset == 0 => {
                            Tensor::zeros(&s.shape, DType::parse(&s.dtype)?, device)?
                        }
                        _ => Tensor::zeros(&[e.bytes.div_ceil(4)], DType::U32, device)?,
                    };
                    held.push(t.clone());
                    t.mem()? as Mem
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
            };
            mems.push(mem);
        }
        let slots = |list: &[Slot]| -> Result<Vec<(String, Tensor)>> {
            list.iter()
                .map(|s| {
                    let t = match bound(&s.name) {
                        Some(t) => t.clone(),
                        None => held
                            .iter()
                            .find(|t| t.mem().ok() == Some(mems[s.external] as _))
                            .cloned()
                            .ok_or_else(|| {
                                Error::invalid(
                                    "Graph::load",
                                    format!("slot {:?} is not bound", s.name),
                                )
                            })?,
                    };
                    Ok((s.name.clone(), t))
                })
                .collect()
        };
        let inputs = slots(&desc.inputs)?;
        let outputs = slots(&desc.outputs)?;
        Graph::build(desc, device, programs, mems, held, inputs, outputs)
    }
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
