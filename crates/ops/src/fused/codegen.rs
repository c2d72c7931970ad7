//! Code generation for fused plans: the per-element body, the contiguous, strided and grouped kernel sources, scalar arguments, and the program cache.
use crate::fused::expr::Class;
use crate::fused::plan::{cast_cl, storage_cl, Kind, Plan, PlanKey};
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::{Kernel, KernelDecl, Param, Program, Source, Use};
use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

/// The generated kernels' names, used in the generated source and at launch.
pub(crate) const FUSED_CONTIG: &str = "fused_contig";
pub(crate) const FUSED_STRIDED: &str = "fused_strided";

/// Elements per work-item of `fused_contig` when every operand offset is a multiple of it (twice
/// as many where every operand is 16-bit).
pub(crate) const VEC: usize = 4;

/// The per-element statements of a plan: node values `t{id}` from `load(i)` (input i's value),
/// then `store(j, o)` (output j gets node o) per output.
fn body(
    key: &PlanKey,
    indent: &str,
    load: impl Fn(usize, DType) -> String,
    store: impl Fn(usize, usize, DType) -> String,
) -> String {
    let mut body = String::new();
    for (id, (kind, d)) in key.nodes.iter().enumerate() {
        let c = Class::of(*d);
        let v = |n: &usize| format!("t{n}");
        let class_of = |n: &usize| Class::of(key.nodes[*n].1);
        let rhs = match kind {
            Kind::Input(i) => load(*i, *d),
            Kind::Scalar(s) => format!("s{s}"),
            Kind::Unary(u, a) => u.cl(c, &v(a)),
            Kind::Binary(b, x, y) => b.cl(c, &v(x), &v(y)),
            Kind::Where(cond, x, y) => format!(
                "(({} != ({})0) ? {} : {})",
                v(cond),
                class_of(cond).cl(),
                v(x),
                v(y)
            ),
            Kind::Cast(a) => cast_cl(class_of(a), *d, &v(a)),
        };
        let _ = writeln!(body, "{indent}{} t{id} = {rhs};", c.cl());
    }
    for (j, &o) in key.outputs.iter().enumerate() {
        let _ = writeln!(body, "{indent}{}", store(j, o, key.nodes[o].1));
    }
    body
}

/// True when input `i` is one element broadcast over the shape in `uniform` (a bit per input).
pub(crate) fn is_uniform(uniform: u64, i: usize) -> bool {
    i < 64 && uniform >> i & 1 == 1
}

/// The element loop of a dense kernel, placed where `base` (the work-item's first element) and
/// `n` (elements in all) are defined and `base < n`: inputs in `uniform` read once, then
/// `FUSED_VEC` elements through 4-wide loads and stores when the work-item has all of them (only
/// compiled with `FUSED_VEC` 4 or 8: every load of the work-item issued before any compute or
/// store, so 8 keeps twice the bytes in flight), else one by one. Operand `j` (outputs first,
/// then inputs) is the buffer `ptr(j)` from element `off(j)`.
pub(crate) fn contig_elements(
    key: &PlanKey,
    uniform: u64,
    ptr: &dyn Fn(usize) -> String,
    off: &dyn Fn(usize) -> String,
) -> String {
    let no = key.outputs.len();
    let scalar = body(
        key,
        "        ",
        |i, d| {
            if is_uniform(uniform, i) {
                format!("u{i}")
            } else {
                format!("load_{}({}, {} + e)", d.name(), ptr(no + i), off(no + i))
            }
        },
        |j, o, d| format!("store_{}({}, {} + e, t{o});", d.name(), ptr(j), off(j)),
    );
    // Lane v of FUSED_VEC: inputs read from private arrays x{i}, outputs written to y{j}.
    let lane = body(
        key,
        "            ",
        |i, _| {
            if is_uniform(uniform, i) {
                format!("u{i}")
            } else {
                format!("x{i}[v]")
            }
        },
        |j, o, _| format!("y{j}[v] = t{o};"),
    );
    let mut vec_in = String::new();
    let mut uniform_in = String::new();
    for (i, d) in key.inputs.iter().enumerate() {
        let c = Class::of(*d).cl();
        let (p, o) = (ptr(no + i), off(no + i));
        if is_uniform(uniform, i) {
            let _ = writeln!(uniform_in, "    {c} u{i} = load_{}({p}, {o});", d.name());
            continue;
        }
        let _ = writeln!(
            vec_in,
            "        {c} x{i}[FUSED_VEC];\n        #pragma unroll\n        for (uint h = 0; h < \
             FUSED_VEC / 4; ++h) vstore4(load4_{}({p}, {o} + base + 4 * h), h, x{i});",
            d.name()
        );
    }
    let mut vec_out_decl = String::new();
    let mut vec_out = String::new();
    for (j, &o) in key.outputs.iter().enumerate() {
        let d = key.nodes[o].1;
        let _ = writeln!(
            vec_out_decl,
            "        {} y{j}[FUSED_VEC];",
            Class::of(d).cl()
        );
        let _ = writeln!(
            vec_out,
            "        #pragma unroll\n        for (uint h = 0; h < FUSED_VEC / 4; ++h) \
             store4_{}({}, {} + base + 4 * h, vload4(h, y{j}));",
            d.name(),
            ptr(j),
            off(j)
        );
    }
    format!(
        "{uniform_in}\
         #if FUSED_VEC >= 4\n\
         \x20   if (n - base >= FUSED_VEC) {{\n{vec_in}{vec_out_decl}\
         \x20       #pragma unroll\n        for (uint v = 0; v < FUSED_VEC; ++v) {{\n{lane}        }}\n{vec_out}\
         \x20       return;\n    }}\n\
         #endif\n\
         \x20   uint end = min(n, base + FUSED_VEC);\n\
         \x20   for (uint e = base; e < end; ++e) {{\n{scalar}    }}\n"
    )
}

/// The kernel parameters of a plan's scalars (`s0`, `s1`, ...), each followed by ", ".
pub(crate) fn scalar_params(scalars: &[(f64, Class)]) -> String {
    scalars
        .iter()
        .enumerate()
        .map(|(s, (_, c))| format!("{} s{s}, ", c.cl()))
        .collect()
}

/// OpenCL C for a plan, outputs first, then inputs. `fused_contig`: every operand dense over the
/// shape, or (inputs whose bit is set in `uniform`) one element read once; element offsets as
/// arguments; each work-item takes `FUSED_VEC` (a -D option, 1, 4 or 8) consecutive elements
/// (`contig_elements`; the caller only picks 4 or 8 when every dense offset is a multiple of it).
/// `fused_strided`: a layout of every operand; each work-item finds the offsets of its first
/// element and takes `FUSED_VEC` consecutive elements from there through the same element loop
/// (the caller only picks 4 or 8 when runs of as many lie side by side in every operand). The
/// per-element body is generated once and placed in each form.
fn generate(key: &PlanKey, scalars: &[(f64, Class)], uniform: u64) -> (String, Vec<KernelDecl>) {
    let (no, ni) = (key.outputs.len(), key.inputs.len());
    let k = no + ni;
    let operands = || {
        let outs = (0..no).map(|_| param("output", Use::Out));
        outs.chain((0..ni).map(|_| param("input", Use::In)))
    };
    let tail = |first: Vec<Param>| {
        let mut all: Vec<Param> = operands().chain(first).collect();
        all.extend(
            scalars
                .iter()
                .map(|(_, c)| param("scalar", Use::Value(c.cl()))),
        );
        all.push(param("n", Use::Value("uint")));
        all
    };
    let decls = vec![
        KernelDecl::leak(
            FUSED_CONTIG,
            tail(
                (0..k)
                    .map(|_| param("offset", Use::Value("uint")))
                    .collect(),
            ),
        ),
        KernelDecl::leak(
            FUSED_STRIDED,
            tail(vec![param("l", Use::Value("FusedLayout"))]),
        ),
    ];
    let mut params = String::new();
    for (j, &o) in key.outputs.iter().enumerate() {
        let _ = write!(params, "__global {}* o{j}, ", storage_cl(key.nodes[o].1));
    }
    for (j, d) in key.inputs.iter().enumerate() {
        let _ = write!(params, "__global const {}* i{j}, ", storage_cl(*d));
    }
    let scalar_params = scalar_params(scalars);
    let ptr = |j: usize| {
        if j < no {
            format!("o{j}")
        } else {
            format!("i{}", j - no)
        }
    };
    let contig = contig_elements(key, uniform, &ptr, &|j| format!("off{j}"));
    let strided = contig_elements(key, 0, &ptr, &|j| format!("off{j}"));
    let offsets: String = (0..k).map(|j| format!("uint off{j}, ")).collect();
    let start: String = (0..k)
        .map(|j| format!("    uint off{j} = l.offset[{j}];\n"))
        .collect();
    let step: String = (0..k)
        .map(|j| format!("        off{j} += idx * l.stride[{j}][d];\n"))
        .collect();
    // The element loop addresses element e as off + e: each offset less the first element's
    // index (uint arithmetic wraps, so the sum is the element's offset).
    let rebase: String = (0..k).map(|j| format!("    off{j} -= base;\n")).collect();
    let text = format!(
        "// Generated by netcl-ops fused.rs: {n} nodes, {no} outputs, {ni} inputs.\n\
         #ifndef FUSED_VEC\n#define FUSED_VEC 1\n#endif\n\
         typedef struct {{ uint ndim; uint shape[MAX_DIMS]; uint stride[{k}][MAX_DIMS]; uint offset[{k}]; Div div[MAX_DIMS]; }} FusedLayout;\n\
         // Outputs o*, inputs i* [n elements from off*]; n elements in all.\n\
         __kernel void {FUSED_CONTIG}({params}{offsets}{scalar_params}uint n) {{\n\
         \x20   uint base = get_global_id(0) * FUSED_VEC;\n    if (base >= n) return;\n{contig}}}\n\
         // Outputs o*, inputs i* [strided by l]; n elements in all.\n\
         __kernel void {FUSED_STRIDED}({params}FusedLayout l, {scalar_params}uint n) {{\n\
         \x20   uint base = get_global_id(0) * FUSED_VEC;\n    if (base >= n) return;\n{start}\
         \x20   uint r = base;\n    for (int d = (int)l.ndim - 1; d >= 0; --d) {{\n\
         \x20       uint q = divq(l.div[d], r);\n        uint idx = r - q * l.shape[d];\n        r = q;\n{step}    }}\n{rebase}{strided}}}\n",
        n = key.nodes.len()
    );
    (text, decls)
}

/// What a generated program holds besides its plan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Form {
    /// `fused_contig` and `fused_strided` over one operand set; the inputs in `uniform` (a bit
    /// per input) are read as one broadcast element by `fused_contig`.
    Single { uniform: u64 },
    /// `fused_groups` over `groups` operand sets; operand `j` (outputs first) lives in buffer
    /// slot `slots[j]` (see fused_groups.rs); the inputs in `uniform` are one element each.
    Groups {
        groups: usize,
        slots: Vec<usize>,
        uniform: u64,
    },
}

/// Programs per (device ordinal, elements per work-item of the dense kernels, form), then per
/// plan (looked up by reference: no key copy per launch).
type Cache = Mutex<HashMap<(usize, usize, Form), HashMap<PlanKey, Arc<Program>>>>;

/// The program for `plan` in `form` on `device` with `vec` elements per dense work-item (1 or
/// `VEC`), built on first use.
pub(crate) fn program(
    device: &Device,
    plan: &Plan,
    vec: usize,
    form: &Form,
) -> Result<Arc<Program>> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let slot = (device.ordinal(), vec, form.clone());
    let found = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&slot)
        .and_then(|m| m.get(&plan.key))
        .cloned();
    if let Some(p) = found {
        return Ok(p);
    }
    let (text, decls) = match form {
        Form::Single { uniform } => generate(&plan.key, &plan.scalars, *uniform),
        Form::Groups {
            groups,
            slots,
            uniform,
        } => generate_groups(&plan.key, &plan.scalars, *groups, slots, *uniform),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    // Generated sources live as long as the process's program cache that refers to them.
    let source = Source {
        name: Box::leak(format!("fused_{:016x}.cl", h.finish()).into_boxed_str()),
        text: Box::leak(text.into_boxed_str()),
        kernels: Box::leak(decls.into_boxed_slice()),
    };
    let f64_used = plan.key.nodes.iter().any(|(_, d)| *d == DType::F64);
    let fp64 = if f64_used { " -DNETCL_FP64" } else { "" };
    let options = format!("-DFUSED_VEC={vec}{fp64}");
    let p = Arc::new(netcl_kernels::build(
        device,
        &source,
        &options,
        netcl_kernels::binary_cache_dir(device).as_deref(),
    )?);
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(slot)
        .or_default()
        .insert(plan.key.clone(), p.clone());
    Ok(p)
}

/// Sets the scalars of a plan as the next kernel arguments, each in its arithmetic's type.
pub(crate) fn set_scalars(k: &mut Kernel, scalars: &[(f64, Class)]) -> Result<()> {
    for &(v, c) in scalars {
        match c {
            Class::F32 => k.arg(&(v as f32))?,
            Class::F64 => k.arg(&v)?,
            Class::I32 => k.arg(&(v as i64 as i32))?,
            Class::U32 => k.arg(&(v as i64 as u32))?,
        };
    }
    Ok(())
}

/// Arithmetic nodes of a plan (the flops per element it declares to the profiler).
pub(crate) fn arithmetic_nodes(key: &PlanKey) -> usize {
    let nodes = key.nodes.iter();
    nodes
        .filter(|(k, _)| !matches!(k, Kind::Input(_) | Kind::Scalar(_)))
        .count()
}
/// The operand whose buffer fills each slot (its first user).
pub(crate) fn slot_operands(slots: &[usize]) -> Vec<usize> {
    let mut first = Vec::new();
    for (j, &s) in slots.iter().enumerate() {
        if s == first.len() {
            first.push(j);
        }
    }
    first
}

/// The generated kernel's name, used in the generated source and at launch.
pub(crate) const FUSED_GROUPS: &str = "fused_groups";

/// OpenCL C of `fused_groups` for a plan over `groups` operand groups, operand `j` (outputs
/// first) in buffer slot `slots[j]`: group g's slot s is the argument `b{s}_{g}`. A work-item
/// finds its group in the start table, then runs `fused_contig`'s element code on that group's
/// buffers and offsets.
pub(crate) fn generate_groups(
    key: &PlanKey,
    scalars: &[(f64, Class)],
    groups: usize,
    slots: &[usize],
    uniform: u64,
) -> (String, Vec<KernelDecl>) {
    let no = key.outputs.len();
    let owners = slot_operands(slots);
    let nslots = owners.len();
    let mut decl: Vec<Param> = (0..groups * nslots)
        .map(|i| match slots[..no].contains(&(i % nslots)) {
            true => param("buffer", Use::Out),
            false => param("buffer", Use::In),
        })
        .collect();
    decl.push(param("t", Use::Value("FusedGroups")));
    decl.extend(
        scalars
            .iter()
            .map(|(_, c)| param("scalar", Use::Value(c.cl()))),
    );
    decl.push(param("items", Use::Value("uint")));
    let slot_type = |s: usize| {
        let j = owners[s];
        let written = slots[..no].contains(&s);
        let d = if j < no {
            key.nodes[key.outputs[j]].1
        } else {
            key.inputs[j - no]
        };
        let konst = if written { "" } else { "const " };
        format!("__global {konst}{}*", storage_cl(d))
    };
    let mut params = String::new();
    for g in 0..groups {
        for s in 0..nslots {
            let _ = write!(params, "{} b{s}_{g}, ", slot_type(s));
        }
    }
    let mut pick = String::new();
    for s in 0..nslots {
        let _ = writeln!(pick, "    {} p{s} = b{s}_0;", slot_type(s));
    }
    let _ = writeln!(pick, "    switch (g) {{");
    for g in 1..groups {
        let _ = write!(pick, "    case {g}:");
        for s in 0..nslots {
            let _ = write!(pick, " p{s} = b{s}_{g};");
        }
        let _ = writeln!(pick, " break;");
    }
    let _ = writeln!(pick, "    }}");
    for s in 0..nslots {
        let _ = writeln!(pick, "    uint off{s} = t.off[{s}][g];");
    }
    let contig = contig_elements(key, uniform, &|j| format!("p{}", slots[j]), &|j| {
        format!("off{}", slots[j])
    });
    let text = format!(
        "// Generated by netcl-ops fused/codegen.rs: {n} nodes, {no} outputs, {ni} inputs; {groups} groups of {nslots} buffers.\n\
         #ifndef FUSED_VEC\n#define FUSED_VEC 1\n#endif\n\
         typedef struct {{ uint start[{groups1}]; uint n[{groups}]; uint off[{nslots}][{groups}]; }} FusedGroups;\n\
         // Group g: buffers b*_g [t.n[g] elements from t.off[*][g]], work-items t.start[g] to\n\
         // t.start[g + 1]; items work-items in all.\n\
         __kernel void {FUSED_GROUPS}({params}FusedGroups t, {scalars}uint items) {{\n\
         \x20   uint gid = get_global_id(0);\n    if (gid >= items) return;\n\
         \x20   uint g = 0;\n\
         \x20   #pragma unroll\n    for (uint k = 1; k < {groups}; ++k) g += gid >= t.start[k] ? 1u : 0u;\n\
         {pick}\
         \x20   uint n = t.n[g];\n\
         \x20   uint base = (gid - t.start[g]) * FUSED_VEC;\n{contig}}}\n",
        n = key.nodes.len(),
        ni = key.inputs.len(),
        groups1 = groups + 1,
        scalars = scalar_params(scalars),
    );
    (text, vec![KernelDecl::leak(FUSED_GROUPS, decl)])
}

/// A generated kernel's argument (its declaration names it by role).
fn param(name: &'static str, usage: Use) -> Param {
    Param { name, usage }
}
