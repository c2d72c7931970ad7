//! Checks of a loaded graph description before anything is compiled or allocated: every index in range, every copy and tensor inside its buffer, each launch's arguments against its kernel's signature, work sizes within the device's limits, netcl's own programs unchanged.
use crate::desc::{BufRef, GraphDesc, Node, NodeArg, Slot};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::signature::{param, signatures, ParamKind as Param};
use netcl_kernels::sources;

/// Work-items of one launch at most: netcl's kernels index with 32 bits.
const MAX_WORK_ITEMS: usize = 1 << 32;

impl GraphDesc {
    /// The checks [`crate::Graph::load`] makes of a file's plan for `device` (every index in
    /// range, copies and tensors inside their buffers, launches against their kernels'
    /// signatures and the device's work-size limits, netcl's own programs unchanged).
    pub fn validate(&self, device: &Device) -> Result<()> {
        validate(self, device, "graph")
    }
}

/// `Ok` when `desc` is a plan this netcl could have made for `device`; else an error (naming
/// `what`, the file) that says which part is wrong.
pub(crate) fn validate(desc: &GraphDesc, device: &Device, what: &str) -> Result<()> {
    let bad = |msg: String| Error::format(what, msg);
    let info = device.info();
    let max_alloc = usize::try_from(info.max_alloc_bytes).unwrap_or(usize::MAX);
    for (i, p) in desc.programs.iter().enumerate() {
        if [&p.name, &p.text, &p.options]
            .iter()
            .any(|s| s.contains('\0'))
        {
            return Err(bad(format!("program {i} ({:?}) holds a NUL byte", p.name)));
        }
        // A program under the name of one of netcl's files must be that file.
        if let Some(own) = sources::every().find(|s| s.name == p.name) {
            if own.text != p.text {
                return Err(bad(format!(
                    "program {i} is named {:?} but its text differs from this netcl's \
                     kernels/{}",
                    p.name, own.name
                )));
            }
        }
    }
    if !desc.align.is_power_of_two() {
        return Err(bad(format!(
            "alignment {} is not a power of two",
            desc.align
        )));
    }
    let mut total = 0usize;
    for (i, &n) in desc.slots.iter().enumerate() {
        if n == 0 || n > max_alloc {
            return Err(bad(format!(
                "slot {i} of {n} B (the device allocates 1 to {max_alloc} B at once)"
            )));
        }
        total = total.saturating_add(n);
    }
    if total as u64 > info.global_mem_bytes {
        return Err(bad(format!(
            "the slots take {total} B; {device} has {} B",
            info.global_mem_bytes
        )));
    }
    for (i, b) in desc.internals.iter().enumerate() {
        let slot = desc.slots.get(b.slot).copied();
        if slot.is_none_or(|s| s < b.bytes) || b.first > b.last || b.last >= desc.nodes.len() {
            return Err(bad(format!(
                "internal buffer {i} ({} B in slot {}, nodes {}..={}): {} slots, {} nodes",
                b.bytes,
                b.slot,
                b.first,
                b.last,
                desc.slots.len(),
                desc.nodes.len()
            )));
        }
    }
    for (i, e) in desc.externals.iter().enumerate() {
        if e.bytes == 0 || e.bytes > max_alloc {
            return Err(bad(format!("outside buffer {i} of {} B", e.bytes)));
        }
    }
    let bytes_of = |at: usize, b: BufRef| -> Result<usize> {
        let n = match b {
            BufRef::Internal(i) => desc.internals.get(i).map(|b| b.bytes),
            BufRef::External(i) => desc.externals.get(i).map(|e| e.bytes),
        };
        n.ok_or_else(|| {
            bad(format!(
                "node {at} names {b:?}; the graph has {} internal and {} outside buffers",
                desc.internals.len(),
                desc.externals.len()
            ))
        })
    };
    let inside = |at: usize, b: BufRef, offset: usize, len: usize| -> Result<()> {
        let size = bytes_of(at, b)?;
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= size => Ok(()),
            _ => Err(bad(format!(
                "node {at} touches bytes {offset}..+{len} of {b:?}, which has {size} B"
            ))),
        }
    };
    for (at, n) in desc.nodes.iter().enumerate() {
        match n {
            Node::Launch { .. } => launch(desc, at, n, device, &bytes_of, &bad)?,
            Node::Write { dst, offset, data } => inside(at, *dst, *offset, data.len())?,
            Node::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                inside(at, *src, *src_offset, *len)?;
                inside(at, *dst, *dst_offset, *len)?;
            }
        }
    }
    let slots = desc.inputs.iter().chain(&desc.outputs).chain(&desc.named);
    for (k, s) in slots.clone().enumerate() {
        if slots.clone().take(k).any(|o| o.name == s.name) {
            return Err(bad(format!("the name {:?} is given twice", s.name)));
        }
        tensor_fits(desc, s).map_err(|msg| bad(format!("tensor {:?}: {msg}", s.name)))?;
    }
    Ok(())
}

/// A slot's tensor lies inside its outside buffer.
fn tensor_fits(desc: &GraphDesc, s: &Slot) -> std::result::Result<(), String> {
    let e = desc
        .externals
        .get(s.external)
        .ok_or_else(|| format!("outside buffer {} of {}", s.external, desc.externals.len()))?;
    let dtype = DType::parse(&s.dtype).map_err(|e| e.to_string())?;
    let end = s
        .shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_add(s.offset))
        .and_then(|n| n.checked_mul(dtype.size()));
    match end {
        Some(end) if end <= e.bytes => Ok(()),
        _ => Err(format!(
            "{} {:?} at offset {} does not fit its buffer of {} B",
            s.dtype, s.shape, s.offset, e.bytes
        )),
    }
}

/// A launch node: its program and kernel exist, its arguments are what the kernel's signature
/// declares (buffers in range, values of the declared size, local memory within the device's),
/// and its work sizes are within the device's limits.
fn launch(
    desc: &GraphDesc,
    at: usize,
    n: &Node,
    device: &Device,
    bytes_of: &dyn Fn(usize, BufRef) -> Result<usize>,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    let Node::Launch {
        program,
        kernel,
        args,
        global,
        local,
        writes,
    } = n
    else {
        return Ok(());
    };
    let info = device.info();
    let p = desc.programs.get(*program).ok_or_else(|| {
        bad(format!(
            "node {at} launches program {program}; the graph has {}",
            desc.programs.len()
        ))
    })?;
    let k = format!("node {at} ({kernel} of {})", p.name);
    let mut local_bytes = 0usize;
    for a in args {
        match a {
            NodeArg::Buf(b) => drop(bytes_of(at, *b)?),
            NodeArg::Bytes(v) if v.is_empty() || v.len() > info.max_parameter_bytes => {
                return Err(bad(format!("{k}: a value argument of {} B", v.len())))
            }
            NodeArg::Local(n) => local_bytes = local_bytes.saturating_add(*n),
            NodeArg::Bytes(_) => {}
        }
    }
    if local_bytes as u64 > info.local_mem_bytes {
        return Err(bad(format!(
            "{k}: {local_bytes} B of local memory; {device} has {}",
            info.local_mem_bytes
        )));
    }
    let found = signatures(&p.text, &p.options, kernel);
    if found.is_empty() {
        return Err(bad(format!("{k}: the program declares no such kernel")));
    }
    let fits = |params: &Vec<String>| {
        params.len() == args.len()
            && params.iter().zip(args).all(|(p, a)| match (param(p), a) {
                (Param::Buffer, NodeArg::Buf(_)) | (Param::Local, NodeArg::Local(_)) => true,
                (Param::Value(size), NodeArg::Bytes(v)) => size.is_none_or(|s| s == v.len()),
                _ => false,
            })
    };
    if !found.iter().any(fits) {
        return Err(bad(format!(
            "{k}: its {} arguments do not match the kernel's parameters ({})",
            args.len(),
            found[0].join(",")
        )));
    }
    // What the node says it writes orders a replay over several queues: one per argument, and
    // for netcl's own kernels what their declarations say.
    if !writes.is_empty() && writes.len() != args.len() {
        return Err(bad(format!(
            "{k}: {} write flags for {} arguments",
            writes.len(),
            args.len()
        )));
    }
    let own = sources::every().find(|s| s.name == p.name);
    if let Some(d) = own.and_then(|s| s.declaration(kernel)) {
        if !writes.is_empty() && *writes != d.writes() {
            return Err(bad(format!(
                "{k}: write flags {writes:?} differ from the kernel's declaration {:?}",
                d.writes()
            )));
        }
    }
    work_sizes(global, local, device).map_err(|msg| bad(format!("{k}: {msg}")))
}

/// Global and local sizes: 1 to 3 dims, global a multiple of local, local within the device's
/// work-group limits, at most [`MAX_WORK_ITEMS`] work-items.
fn work_sizes(
    global: &[usize],
    local: &[usize],
    device: &Device,
) -> std::result::Result<(), String> {
    let info = device.info();
    let sizes = format!("global {global:?}, local {local:?}");
    if global.is_empty() || global.len() > 3 || local.len() != global.len() {
        return Err(format!("{sizes}: 1 to 3 dims, the same for both"));
    }
    for (d, (&g, &l)) in global.iter().zip(local).enumerate() {
        let item_max = info.max_work_item_sizes.get(d).copied().unwrap_or(1);
        if l == 0 || g == 0 || g % l != 0 || l > item_max {
            return Err(format!(
                "{sizes}: dim {d} needs a local size of 1 to {item_max} that divides the global"
            ));
        }
    }
    let group: usize = local.iter().product();
    if group > info.max_work_group_size {
        return Err(format!(
            "{sizes}: work-groups of {group} items; {device} runs at most {}",
            info.max_work_group_size
        ));
    }
    let items = global.iter().try_fold(1usize, |n, &g| n.checked_mul(g));
    if items.is_none_or(|n| n > MAX_WORK_ITEMS) {
        return Err(format!("{sizes}: more than 2^32 work-items"));
    }
    Ok(())
}
