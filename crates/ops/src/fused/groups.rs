//! Multi-tensor fused updates: one expression list over many independent groups of operands (an optimizer's parameters) in one kernel launch per device, dtype and buffer layout.
use crate::base::checks::u32_arg;
use crate::base::dispatch::{backend, Backend};
use crate::base::launch::launch_1d_over;
use crate::base::tensor::Tensor;
use crate::fused::codegen::{
    arithmetic_nodes, is_uniform, program, set_scalars, slot_operands, Form, FUSED_GROUPS, VEC,
};
use crate::fused::eval::{disjoint, run};
use crate::fused::expr::{Class, Expr};
use crate::fused::plan::{plan, Plan};
use netcl_core_devices::{DType, Device, Error, Result};
use std::collections::HashMap;

const OP: &str = "fused_into_groups";

/// The most groups one `fused_into_groups` launch takes; more are split over several launches.
/// Fewer when the groups' buffers and scalars would not fit the device's argument bytes: with
/// the minimum of 1024 and a few scalars, 16 groups of up to 4 buffers (Adam), 8 of 5 (Adam
/// with amsgrad).
pub const FUSED_MAX_GROUPS: usize = 16;

/// Bytes of kernel arguments kept free for the alignment of arguments.
const ARG_MARGIN: usize = 32;

/// The operands of one group of [`fused_into_groups`]: `Expr::input(i)` reads `inputs[i]`, and
/// expression `j` is written to `outputs[j]`.
#[derive(Clone, Debug)]
pub struct FusedGroup<'a> {
    pub inputs: Vec<&'a Tensor>,
    pub outputs: Vec<&'a Tensor>,
}

/// Does what `fused_into(&group.inputs, exprs zipped with group.outputs)` does for every group,
/// in as few kernels as it can: groups on one OpenCL device whose operands are all contiguous
/// and of one shape (inputs may be destinations, in place), with the same input dtypes and the
/// same pattern of operands sharing a buffer, run together, up to [`FUSED_MAX_GROUPS`] a launch.
/// Every element is computed by the same generated code as `fused_into`'s, so the results are
/// bit for bit the same. Other groups (host tensors, strided or broadcast operands, empty
/// tensors) run one by one through `fused_into`, which checks them when they run; the batched
/// groups are checked before anything runs.
///
/// The groups must be independent: no destination of one group may share an element with any
/// tensor of another group (an error otherwise, since they run in one kernel); views of one
/// storage that do not meet (parameters that are row blocks of one tensor) are independent.
pub fn fused_into_groups(exprs: &[Expr], groups: &[FusedGroup<'_>]) -> Result<()> {
    let _span = netcl_profiling::span(OP);
    for (gi, g) in groups.iter().enumerate() {
        if g.outputs.len() != exprs.len() {
            return Err(Error::invalid(
                OP,
                format!(
                    "group {gi} has {} destinations for {} expressions",
                    g.outputs.len(),
                    exprs.len()
                ),
            ));
        }
    }
    if exprs.is_empty() {
        return Ok(());
    }
    check_independent(groups)?;
    for d in groups.iter().flat_map(|g| g.outputs.iter()) {
        d.mark_modified();
    }
    let mut plans: Vec<Plan> = Vec::new();
    let mut batches: Vec<Batch> = Vec::new();
    let mut alone = Vec::new();
    let mut dense_groups = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        match dense(exprs, g, gi, &mut plans)? {
            Some(d) => dense_groups.push((gi, d)),
            None => alone.push(gi),
        }
    }
    // One-element groups last: they join a batch whatever its broadcast inputs (reading one
    // element at its offset is the same either way).
    dense_groups.sort_by_key(|(_, d)| d.n == 1);
    for (gi, d) in dense_groups {
        let device = groups[gi].outputs[0].device();
        let same = |b: &&mut Batch| {
            b.device == *device
                && b.plan == d.plan
                && b.slots == d.slots
                && b.vec == d.vec
                && (b.uniform == d.uniform || d.n == 1)
        };
        match batches.iter_mut().find(same) {
            Some(b) => b.members.push((gi, d.n)),
            None => batches.push(Batch {
                device: device.clone(),
                plan: d.plan,
                slots: d.slots,
                vec: d.vec,
                uniform: d.uniform,
                members: vec![(gi, d.n)],
            }),
        }
    }
    for gi in alone {
        one(exprs, &groups[gi])?;
    }
    for b in &batches {
        let plan = &plans[b.plan];
        for chunk in b
            .members
            .chunks(per_launch(&b.device, plan, b.slot_count()))
        {
            if let [(gi, _)] = chunk {
                one(exprs, &groups[*gi])?;
            } else {
                launch(plan, b, chunk, groups)?;
            }
        }
    }
    Ok(())
}

/// `fused_into` of one group.
fn one(exprs: &[Expr], g: &FusedGroup<'_>) -> Result<()> {
    let outs: Vec<(&Expr, Option<&Tensor>)> = exprs
        .iter()
        .zip(&g.outputs)
        .map(|(e, d)| (e, Some(*d)))
        .collect();
    run(OP, &g.inputs, &outs).map(|_| ())
}

/// Identity of a tensor's storage.
fn storage_id(t: &Tensor) -> usize {
    t.storage_id()
}

/// No destination of one group shares an element with a tensor of another group (views of one
/// storage that do not meet, parameters allocated as rows of one tensor say, are independent).
fn check_independent(groups: &[FusedGroup<'_>]) -> Result<()> {
    let mut written: HashMap<usize, Vec<(usize, &Tensor)>> = HashMap::new();
    for (gi, g) in groups.iter().enumerate() {
        for d in &g.outputs {
            written.entry(storage_id(d)).or_default().push((gi, d));
        }
    }
    for (gi, g) in groups.iter().enumerate() {
        for t in g.outputs.iter().chain(&g.inputs) {
            let dests = written.get(&storage_id(t)).into_iter().flatten();
            let clash = dests
                .filter(|(w, d)| *w != gi && !disjoint(d, t))
                .map(|(w, _)| w);
            if let Some(w) = clash.min() {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "group {gi}'s tensor {:?} shares elements with a destination of group {w}; \
                         groups run in one kernel and must be independent",
                        t.shape
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Groups that run in one launch: same device, plan, buffer slots and elements per work-item.
struct Batch {
    device: Device,
    plan: usize,
    slots: Vec<usize>,
    vec: usize,
    uniform: u64,
    /// (group index, elements)
    members: Vec<(usize, usize)>,
}

impl Batch {
    fn slot_count(&self) -> usize {
        self.slots.iter().max().map_or(0, |m| m + 1)
    }
}

/// How a group fits the batched kernel.
struct Dense {
    /// Index into the plans of this call (one per input dtype list).
    plan: usize,
    /// Buffer slot of each operand (outputs first): operands viewing the same elements of one
    /// storage (an in-place input and its destination) share a slot.
    slots: Vec<usize>,
    n: usize,
    /// `VEC` when every slot's offset is a multiple of it, else 1.
    vec: usize,
    /// Single-element inputs (a bit per input), read once per work-item as `fused_into` does.
    uniform: u64,
}

/// The group's place in a batch, `None` when it runs alone (host device, operands on several
/// devices, strided or broadcast, or no elements). Errors for destinations of the wrong dtype
/// and operands that share storage at other elements, as `fused_into` would give.
fn dense(
    exprs: &[Expr],
    g: &FusedGroup<'_>,
    gi: usize,
    plans: &mut Vec<Plan>,
) -> Result<Option<Dense>> {
    let first = g.outputs[0];
    let operands: Vec<&Tensor> = g.outputs.iter().chain(&g.inputs).copied().collect();
    let no = g.outputs.len();
    // Single-element inputs broadcast over larger outputs (none when the outputs have one
    // element: every operand is then read element for element).
    let uniform = g
        .inputs
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, t)| t.numel() == 1 && first.numel() > 1)
        .fold(0u64, |m, (i, _)| m | 1 << i);
    let fits = |(j, t): (usize, &&Tensor)| {
        t.device == first.device
            && t.is_contiguous()
            && (t.shape == first.shape || (j >= no && is_uniform(uniform, j - no)))
    };
    if backend(&first.device) == Backend::Host
        || first.numel() == 0
        || !operands.iter().enumerate().all(fits)
    {
        return Ok(None);
    }
    let dtypes: Vec<DType> = g.inputs.iter().map(|t| t.dtype).collect();
    let index = match plans.iter().position(|p| p.key.inputs == dtypes) {
        Some(i) => i,
        None => {
            let refs: Vec<&Expr> = exprs.iter().collect();
            plans.push(plan(OP, &dtypes, &refs)?);
            plans.len() - 1
        }
    };
    let key = &plans[index].key;
    for (j, d) in g.outputs.iter().enumerate() {
        let want = key.nodes[key.outputs[j]].1;
        if d.dtype != want {
            return Err(Error::dtype(
                OP,
                format!(
                    "group {gi}: destination {j} is {} {:?} but expression {j} gives {want}",
                    d.dtype, d.shape
                ),
            ));
        }
    }
    let mut slots: Vec<usize> = Vec::with_capacity(operands.len());
    let mut count = 0;
    for (j, t) in operands.iter().enumerate() {
        let same = |u: &&Tensor| storage_id(u) == storage_id(t);
        let shared = operands[..j].iter().position(same);
        if j >= no && is_uniform(uniform, j - no) && shared.is_some_and(|k| k < no) {
            // A broadcast element that is also written: the group runs alone, in order.
            return Ok(None);
        }
        let slot = match shared {
            Some(k) if operands[k].offset == t.offset && operands[k].dtype == t.dtype => {
                if j < no {
                    return Err(Error::invalid(
                        OP,
                        format!("group {gi}: destinations {k} and {j} share storage"),
                    ));
                }
                slots[k]
            }
            // Two inputs may read one storage anywhere; a destination only element for element.
            Some(k) if k < no || j < no => {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "group {gi}: operand {j} {:?} overlaps operand {k} (a destination) at other elements",
                        t.shape
                    ),
                ))
            }
            _ => {
                count += 1;
                count - 1
            }
        };
        slots.push(slot);
    }
    let aligned = operands
        .iter()
        .enumerate()
        .all(|(j, t)| t.offset.is_multiple_of(VEC) || (j >= no && is_uniform(uniform, j - no)));
    Ok(Some(Dense {
        plan: index,
        slots,
        n: first.numel(),
        vec: if aligned { VEC } else { 1 },
        uniform,
    }))
}

/// Groups per launch on `device` for a plan over `slots` buffers: `FUSED_MAX_GROUPS`, halved
/// until the arguments (a pointer and an offset per buffer, a start and a length per group; the
/// scalars; the item count) fit the device's argument bytes less `ARG_MARGIN`. 1 means every
/// group runs alone.
fn per_launch(device: &Device, plan: &Plan, slots: usize) -> usize {
    let budget = device.info().max_parameter_bytes.saturating_sub(ARG_MARGIN);
    let per_group = 8 * slots + 4 * (slots + 2);
    let scalars: usize = plan
        .scalars
        .iter()
        .map(|(_, c)| if *c == Class::F64 { 8 } else { 4 })
        .sum();
    let fixed = 4 + scalars + 4;
    let mut k = FUSED_MAX_GROUPS;
    while k > 1 && k * per_group + fixed > budget {
        k /= 2;
    }
    k
}

/// Operand `j` of a group: destinations first, then inputs.
fn operand<'a>(g: &FusedGroup<'a>, j: usize) -> &'a Tensor {
    match j.checked_sub(g.outputs.len()) {
        None => g.outputs[j],
        Some(i) => g.inputs[i],
    }
}

/// One `fused_groups` launch over `chunk` (2 to `per_launch` groups of batch `b`), in the
/// program for the next power of two of groups; the groups past the chunk are empty.
fn launch(
    plan: &Plan,
    b: &Batch,
    chunk: &[(usize, usize)],
    groups: &[FusedGroup<'_>],
) -> Result<()> {
    let k = chunk.len().next_power_of_two();
    let form = Form::Groups {
        groups: k,
        slots: b.slots.clone(),
        uniform: b.uniform,
    };
    let program = program(&b.device, plan, b.vec, &form)?;
    let owners = slot_operands(&b.slots);
    // FusedGroups: start[k + 1], n[k], off[slots][k].
    let mut words = vec![0u32; 2 * k + 1 + owners.len() * k];
    let mut items = 0usize;
    let mut bytes = 0usize;
    let mut elements = 0usize;
    for (g, &(gi, n)) in chunk.iter().enumerate() {
        words[g] = u32_arg(OP, "work-items", items)?;
        items += n.div_ceil(b.vec);
        elements += n;
        words[k + 1 + g] = u32_arg(OP, "elements", n)?;
        for (s, &j) in owners.iter().enumerate() {
            let t = operand(&groups[gi], j);
            words[2 * k + 1 + s * k + g] = u32_arg(OP, "element offset", t.offset + n)? - n as u32;
        }
        let all = groups[gi].outputs.iter().chain(&groups[gi].inputs);
        bytes += all.map(|t| t.numel() * t.dtype.size()).sum::<usize>();
    }
    let end = u32_arg(OP, "work-items", items)?;
    for w in &mut words[chunk.len()..=k] {
        *w = end;
    }
    let work = (
        bytes as u64,
        (elements * arithmetic_nodes(&plan.key)) as u64,
    );
    launch_1d_over(&program, FUSED_GROUPS, items, items, |kern| {
        kern.declare(work.0, work.1);
        for g in 0..k {
            // Groups past the chunk take the last group's buffers (and no work-items).
            let (gi, _) = chunk[g.min(chunk.len() - 1)];
            for &j in &owners {
                kern.arg_mem(operand(&groups[gi], j).mem()?)?;
            }
        }
        kern.arg_bytes(bytemuck::cast_slice(&words))?;
        set_scalars(kern, &plan.scalars)
    })
}
