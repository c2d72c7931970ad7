//! Fused elementwise kernels: expressions typed and compiled into one OpenCL kernel (cached by structure), or evaluated on the host.
use crate::base::dispatch::{dispatch, Op};
use crate::base::launch::{launch_1d, launch_1d_over};
use crate::base::layout::{broadcast_shapes, broadcast_strides, merged_dims, numel};
use crate::base::tensor::Tensor;
use crate::fused::expr::{BinaryOp, Class, Expr, UnaryOp};
use crate::fused::host_eval;
use half::{bf16, f16};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::{Kernel, Program, Source};
use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Input(usize),
    Scalar(usize),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Where(usize, usize, usize),
    Cast(usize),
}

/// What determines a generated program: the typed node list, the outputs and the input dtypes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub(crate) nodes: Vec<(Kind, DType)>,
    pub(crate) outputs: Vec<usize>,
    pub(crate) inputs: Vec<DType>,
}

/// Typed, deduplicated expressions (children before parents) with their scalar values.
pub(crate) struct Plan {
    pub(crate) key: PlanKey,
    pub(crate) scalars: Vec<(f64, Class)>,
}

/// True when the expression has no tensor operand (its dtype comes from where it is used).
fn weak(e: &Expr) -> bool {
    match e {
        Expr::Input(_) => false,
        Expr::Scalar(_) => true,
        Expr::Unary(_, a) | Expr::Cast(_, a) => weak(a),
        Expr::Binary(_, a, b) => weak(a) && weak(b),
        Expr::Where(c, a, b) => weak(c) && weak(a) && weak(b),
    }
}

struct Lowering<'a> {
    op: &'a str,
    inputs: &'a [DType],
    key: PlanKey,
    scalars: Vec<(f64, Class)>,
    seen: HashMap<(Kind, DType), usize>,
}

impl Lowering<'_> {
    fn push(&mut self, kind: Kind, dtype: DType) -> usize {
        if let Some(&i) = self.seen.get(&(kind, dtype)) {
            return i;
        }
        self.key.nodes.push((kind, dtype));
        let i = self.key.nodes.len() - 1;
        if !matches!(kind, Kind::Scalar(_)) {
            self.seen.insert((kind, dtype), i);
        }
        i
    }

    fn dtype(&self, node: usize) -> DType {
        self.key.nodes[node].1
    }

    /// Two operands of one dtype: a weak side takes the other side's dtype.
    fn pair(&mut self, a: &Expr, b: &Expr, hint: Option<DType>) -> Result<(usize, usize)> {
        let (ia, ib) = if weak(a) && !weak(b) {
            let ib = self.lower(b, hint)?;
            (self.lower(a, Some(self.dtype(ib)))?, ib)
        } else {
            let ia = self.lower(a, hint)?;
            (ia, self.lower(b, Some(self.dtype(ia)))?)
        };
        let (da, db) = (self.dtype(ia), self.dtype(ib));
        if da != db {
            return Err(Error::dtype(
                self.op,
                format!("operands are {da} and {db}; cast one of them first"),
            ));
        }
        Ok((ia, ib))
    }

    fn lower(&mut self, e: &Expr, hint: Option<DType>) -> Result<usize> {
        let op = self.op;
        Ok(match e {
            Expr::Input(i) => {
                let d = *self.inputs.get(*i).ok_or_else(|| {
                    Error::invalid(
                        op,
                        format!("input {i} used but {} inputs given", self.inputs.len()),
                    )
                })?;
                self.push(Kind::Input(*i), d)
            }
            Expr::Scalar(v) => {
                let d = hint.ok_or_else(|| {
                    Error::invalid(op, "an expression of scalars only has no dtype")
                })?;
                self.scalars.push((*v, Class::of(d)));
                self.push(Kind::Scalar(self.scalars.len() - 1), d)
            }
            Expr::Unary(u, a) => {
                let ia = self.lower(a, hint)?;
                let d = self.dtype(ia);
                if u.float_only() && !d.is_float() {
                    return Err(Error::dtype(
                        op,
                        format!("{} needs a float tensor, got {d}", u.name()),
                    ));
                }
                self.push(Kind::Unary(*u, ia), d)
            }
            Expr::Binary(b, x, y) => {
                let (ix, iy) = self.pair(x, y, hint)?;
                let d = self.dtype(ix);
                if b.float_only() && !d.is_float() {
                    return Err(Error::dtype(
                        op,
                        format!("{} needs float tensors, got {d}", b.name()),
                    ));
                }
                self.push(Kind::Binary(*b, ix, iy), d)
            }
            Expr::Where(c, x, y) => {
                let (ix, iy) = self.pair(x, y, hint)?;
                let ic = self.lower(c, Some(self.dtype(ix)))?;
                self.push(Kind::Where(ic, ix, iy), self.dtype(ix))
            }
            Expr::Cast(to, a) => {
                let ia = self.lower(a, Some(*to))?;
                if self.dtype(ia) == *to {
                    ia
                } else {
                    self.push(Kind::Cast(ia), *to)
                }
            }
        })
    }
}

pub(crate) fn plan(op: &str, inputs: &[DType], outputs: &[&Expr]) -> Result<Plan> {
    let mut l = Lowering {
        op,
        inputs,
        key: PlanKey {
            nodes: Vec::new(),
            outputs: Vec::new(),
            inputs: inputs.to_vec(),
        },
        scalars: Vec::new(),
        seen: HashMap::new(),
    };
    for e in outputs {
        let i = l.lower(e, None)?;
        l.key.outputs.push(i);
    }
    Ok(Plan {
        key: l.key,
        scalars: l.scalars,
    })
}

pub(crate) fn storage_cl(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::BF16 => "ushort",
        DType::I32 => "int",
        DType::U32 => "uint",
    }
}

fn cast_cl(from: Class, to: DType, a: &str) -> String {
    match to {
        DType::F32 => format!("((float){a})"),
        DType::F16 => format!("round_f16((float){a})"),
        DType::BF16 => format!("round_bf16((float){a})"),
        DType::F64 => format!("((double){a})"),
        // NaN checked explicitly: NVIDIA's saturating conversion of a double NaN gives INT_MIN.
        DType::I32 if from.is_float() => format!("(isnan({a}) ? 0 : convert_int_sat_rtz({a}))"),
        DType::U32 if from.is_float() => format!("(isnan({a}) ? 0u : convert_uint_sat_rtz({a}))"),
        DType::I32 => format!("((int){a})"),
        DType::U32 => format!("((uint){a})"),
    }
}

/// Host conversion matching `cast_cl`: f16/bf16 round through f32; float to integer truncates
/// and saturates (NaN gives 0); integer to integer wraps.
pub(crate) fn cast_host(from: Class, to: DType, x: f64) -> f64 {
    let sat = |lo: f64, hi: f64| {
        if x.is_nan() {
            0.0
        } else {
            x.trunc().clamp(lo, hi)
        }
    };
    match to {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::BF16 => bf16::from_f32(x as f32).to_f64(),
        DType::F64 => x,
        DType::I32 if from.is_float() => sat(i32::MIN as f64, i32::MAX as f64),
        DType::U32 if from.is_float() => sat(0.0, u32::MAX as f64),
        DType::I32 | DType::U32 => Class::of(to).round(x),
    }
}

/// The generated kernels' names, used in the generated source and at launch.
const FUSED_CONTIG: &str = "fused_contig";
const FUSED_STRIDED: &str = "fused_strided";

/// Elements per work-item of `fused_contig` when every operand offset is a multiple of it.
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
/// `FUSED_VEC` elements through 4-wide loads and stores when the work-item has all 4 (only
/// compiled with `FUSED_VEC == 4`), else one by one. Operand `j` (outputs first, then inputs)
/// is the buffer `ptr(j)` from element `off(j)`.
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
    // Lane v of 4: inputs read from private arrays x{i}, outputs written to y{j}.
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
            "        {c} x{i}[4];\n        vstore4(load4_{}({p}, {o} + base), 0, x{i});",
            d.name()
        );
    }
    let mut vec_out_decl = String::new();
    let mut vec_out = String::new();
    for (j, &o) in key.outputs.iter().enumerate() {
        let d = key.nodes[o].1;
        let _ = writeln!(vec_out_decl, "        {} y{j}[4];", Class::of(d).cl());
        let _ = writeln!(
            vec_out,
            "        store4_{}({}, {} + base, vload4(0, y{j}));",
            d.name(),
            ptr(j),
            off(j)
        );
    }
    format!(
        "{uniform_in}\
         #if FUSED_VEC == 4\n\
         \x20   if (n - base >= 4) {{\n{vec_in}{vec_out_decl}\
         \x20       #pragma unroll\n        for (uint v = 0; v < 4; ++v) {{\n{lane}        }}\n{vec_out}\
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
/// arguments; each work-item takes `FUSED_VEC` (a -D option, 1 or 4) consecutive elements
/// (`contig_elements`; the caller only picks 4 when every dense offset is a multiple of 4).
/// `fused_strided`: a layout of every operand, one element per work-item. The per-element body
/// is generated once and placed in each form.
fn generate(key: &PlanKey, scalars: &[(f64, Class)], uniform: u64) -> String {
    let (no, ni) = (key.outputs.len(), key.inputs.len());
    let k = no + ni;
    let mut params = String::new();
    for (j, &o) in key.outputs.iter().enumerate() {
        let _ = write!(params, "__global {}* o{j}, ", storage_cl(key.nodes[o].1));
    }
    for (j, d) in key.inputs.iter().enumerate() {
        let _ = write!(params, "__global const {}* i{j}, ", storage_cl(*d));
    }
    let scalar_params = scalar_params(scalars);
    let scalar_strided = body(
        key,
        "    ",
        |i, d| format!("load_{}(i{i}, off{})", d.name(), no + i),
        |j, o, d| format!("store_{}(o{j}, off{j}, t{o});", d.name()),
    );
    let ptr = |j: usize| {
        if j < no {
            format!("o{j}")
        } else {
            format!("i{}", j - no)
        }
    };
    let contig = contig_elements(key, uniform, &ptr, &|j| format!("off{j}"));
    let offsets: String = (0..k).map(|j| format!("uint off{j}, ")).collect();
    let start: String = (0..k)
        .map(|j| format!("    uint off{j} = l.offset[{j}];\n"))
        .collect();
    let step: String = (0..k)
        .map(|j| format!("        off{j} += idx * l.stride[{j}][d];\n"))
        .collect();
    format!(
        "// Generated by netcl-ops fused.rs: {n} nodes, {no} outputs, {ni} inputs.\n\
         #ifndef FUSED_VEC\n#define FUSED_VEC 1\n#endif\n\
         typedef struct {{ uint ndim; uint shape[MAX_DIMS]; uint stride[{k}][MAX_DIMS]; uint offset[{k}]; }} FusedLayout;\n\
         // Outputs o*, inputs i* [n elements from off*]; n elements in all.\n\
         __kernel void {FUSED_CONTIG}({params}{offsets}{scalar_params}uint n) {{\n\
         \x20   uint base = get_global_id(0) * FUSED_VEC;\n    if (base >= n) return;\n{contig}}}\n\
         // Outputs o*, inputs i* [strided by l]; n elements in all.\n\
         __kernel void {FUSED_STRIDED}({params}FusedLayout l, {scalar_params}uint n) {{\n\
         \x20   uint gid = get_global_id(0);\n    if (gid >= n) return;\n{start}\
         \x20   uint r = gid;\n    for (int d = (int)l.ndim - 1; d >= 0; --d) {{\n\
         \x20       uint e = l.shape[d];\n        uint idx = r % e;\n        r /= e;\n{step}    }}\n{scalar_strided}}}\n",
        n = key.nodes.len()
    )
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
    let text = match form {
        Form::Single { uniform } => generate(&plan.key, &plan.scalars, *uniform),
        Form::Groups {
            groups,
            slots,
            uniform,
        } => crate::fused::groups::generate(&plan.key, &plan.scalars, *groups, slots, *uniform),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    // Generated sources live as long as the process's program cache that refers to them.
    let source = Source {
        name: Box::leak(format!("fused_{:016x}.cl", h.finish()).into_boxed_str()),
        text: Box::leak(text.into_boxed_str()),
    };
    let f64_used = plan.key.nodes.iter().any(|(_, d)| *d == DType::F64);
    let fp64 = if f64_used { " -DNETCL_FP64" } else { "" };
    let options = format!("-DFUSED_VEC={vec}{fp64}");
    let p = Arc::new(netcl_kernels::build(
        device,
        &source,
        &options,
        netcl_kernels::cache_dir().as_deref(),
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

/// Evaluate `outputs` elementwise over `inputs` (broadcast together) in one kernel; each output
/// is written to its destination when one is given, else to a new contiguous tensor. `op` names
/// the operation in errors.
pub(crate) fn run(
    op: &'static str,
    inputs: &[&Tensor],
    outputs: &[(&Expr, Option<&Tensor>)],
) -> Result<Vec<Tensor>> {
    let device = inputs
        .first()
        .map(|t| t.device.clone())
        .ok_or_else(|| Error::invalid(op, "no input tensors"))?;
    let dests: Vec<&Tensor> = outputs.iter().filter_map(|(_, d)| *d).collect();
    for t in inputs.iter().chain(&dests) {
        if t.device != device {
            return Err(Error::device(
                op,
                format!("operands on {} and {}", device, t.device),
            ));
        }
    }
    let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
    let exprs: Vec<&Expr> = outputs.iter().map(|(e, _)| *e).collect();
    let plan = plan(op, &dtypes, &exprs)?;
    let describe = || {
        inputs
            .iter()
            .map(|t| format!("{:?}", t.shape))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut shape: Vec<usize> = Vec::new();
    for t in inputs.iter().chain(&dests) {
        shape = broadcast_shapes(op, &shape, &t.shape)
            .map_err(|_| Error::shape(op, format!("shapes {} do not broadcast", describe())))?;
    }
    let mut out_tensors = Vec::with_capacity(outputs.len());
    for ((_, dest), &node) in outputs.iter().zip(&plan.key.outputs) {
        let dtype = plan.key.nodes[node].1;
        let t = match dest {
            Some(d) => {
                if d.shape != shape || d.dtype != dtype {
                    return Err(Error::shape(
                        op,
                        format!(
                            "destination is {} {:?} but the result is {dtype} {shape:?} (inputs {})",
                            d.dtype,
                            d.shape,
                            describe()
                        ),
                    ));
                }
                if d.shape
                    .iter()
                    .zip(&d.strides)
                    .any(|(&n, &s)| n > 1 && s == 0)
                {
                    return Err(Error::invalid(
                        op,
                        format!("destination {:?} overlaps itself (broadcast view)", d.shape),
                    ));
                }
                (*d).clone()
            }
            None => Tensor::alloc(&shape, dtype, &device)?,
        };
        out_tensors.push(t);
    }
    let bstrides: Vec<Vec<usize>> = inputs
        .iter()
        .map(|t| broadcast_strides(op, &t.shape, &t.strides, &shape))
        .collect::<Result<_>>()?;
    // An input may alias a destination only element for element (in-place updates).
    for (i, t) in inputs.iter().enumerate() {
        for d in &dests {
            if t.shares_storage(d) && (bstrides[i] != d.strides || t.offset != d.offset) {
                return Err(Error::invalid(
                    op,
                    format!(
                        "input {i} {:?} overlaps destination {:?} at other elements",
                        t.shape, d.shape
                    ),
                ));
            }
        }
    }
    for (a, d) in dests.iter().enumerate() {
        if dests[a + 1..].iter().any(|e| e.shares_storage(d)) {
            return Err(Error::invalid(op, "two destinations share storage"));
        }
    }
    let n = numel(&shape);
    if n == 0 {
        return Ok(out_tensors);
    }
    for d in &dests {
        d.mark_modified();
    }
    let eval = FusedEval {
        op,
        plan: &plan,
        inputs,
        bstrides: &bstrides,
        shape: &shape,
        outputs: &out_tensors,
    };
    dispatch(&device, &eval)?;
    Ok(out_tensors)
}

/// A planned elementwise evaluation: `plan` over `inputs` broadcast to `shape` (their strides
/// over it in `bstrides`) into `outputs` (contiguous new tensors or checked destinations).
struct FusedEval<'a> {
    op: &'static str,
    plan: &'a Plan,
    inputs: &'a [&'a Tensor],
    bstrides: &'a [Vec<usize>],
    shape: &'a [usize],
    outputs: &'a [Tensor],
}

impl std::fmt::Debug for FusedEval<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedEval")
            .field("op", &self.op)
            .field("plan", &self.plan.key)
            .field("shape", &self.shape)
            .field("bstrides", &self.bstrides)
            .finish_non_exhaustive()
    }
}

impl Op for FusedEval<'_> {
    type Output = ();
    const NAME: &'static str = "fused";
    fn name(&self) -> &'static str {
        self.op
    }
    fn reference(&self) -> Result<()> {
        let e = self;
        host_eval::run_host(e.op, e.plan, e.inputs, e.bstrides, e.shape, e.outputs)
    }
    fn opencl(&self, device: &Device) -> Result<()> {
        launch(self, device)
    }
}

/// The plan's kernel on an OpenCL device: the contiguous form (4 elements per work-item where
/// aligned) when every operand is dense, else the strided form.
fn launch(e: &FusedEval<'_>, device: &Device) -> Result<()> {
    let FusedEval {
        op,
        plan,
        inputs,
        bstrides,
        shape,
        outputs: out_tensors,
    } = *e;
    let n = numel(shape);
    // Each input read once and each output written once; a flop per arithmetic node per element.
    let bytes: usize = inputs
        .iter()
        .map(|t| t.numel() * t.dtype.size())
        .sum::<usize>()
        + out_tensors
            .iter()
            .map(|t| n * t.dtype.size())
            .sum::<usize>();
    let work = (bytes as u64, (n * arithmetic_nodes(&plan.key)) as u64);
    // Single-element inputs (scalar tensors broadcast) are read once per work-item.
    let uniform = inputs
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, t)| t.numel() == 1)
        .fold(0u64, |m, (i, _)| m | 1 << i);
    let dense = out_tensors.iter().all(|t| t.is_contiguous())
        && inputs
            .iter()
            .enumerate()
            .all(|(i, t)| is_uniform(uniform, i) || (t.shape == shape && t.is_contiguous()));
    let mut operands: Vec<(&[usize], usize)> = out_tensors
        .iter()
        .map(|t| (&t.strides[..], t.offset))
        .collect();
    operands.extend(bstrides.iter().zip(inputs).map(|(s, t)| (&s[..], t.offset)));
    let dims = merged_dims(op, shape, &operands)?;
    let set_buffers = |k: &mut Kernel| -> Result<()> {
        for t in out_tensors.iter().chain(inputs.iter().copied()) {
            k.arg_mem(t.mem()?)?;
        }
        Ok(())
    };
    if dense {
        // 4 elements per work-item when every dense operand's 4-element groups are aligned.
        let no = out_tensors.len();
        let aligned = |j: usize, off: usize| {
            off.is_multiple_of(VEC) || (j >= no && is_uniform(uniform, j - no))
        };
        let vec = if operands
            .iter()
            .enumerate()
            .all(|(j, (_, off))| aligned(j, *off))
        {
            VEC
        } else {
            1
        };
        let program = program(device, plan, vec, &Form::Single { uniform })?;
        launch_1d_over(&program, FUSED_CONTIG, n.div_ceil(vec), n, |k| {
            k.declare(work.0, work.1);
            set_buffers(k)?;
            for (_, off) in &operands {
                k.arg(&(*off as u32))?;
            }
            set_scalars(k, &plan.scalars)
        })?;
    } else {
        let k = operands.len();
        let mut words = vec![0u32; 1 + crate::base::layout::MAX_DIMS * (1 + k) + k];
        words[0] = dims.len() as u32;
        for (d, (extent, strides)) in dims.iter().enumerate() {
            words[1 + d] = *extent;
            for (j, s) in strides.iter().enumerate() {
                words[1 + crate::base::layout::MAX_DIMS * (1 + j) + d] = *s;
            }
        }
        for (j, (_, off)) in operands.iter().enumerate() {
            words[1 + crate::base::layout::MAX_DIMS * (1 + k) + j] = *off as u32;
        }
        let program = program(device, plan, 1, &Form::Single { uniform: 0 })?;
        launch_1d(&program, FUSED_STRIDED, n, |k| {
            k.declare(work.0, work.1);
            set_buffers(k)?;
            k.arg_bytes(bytemuck::cast_slice(&words))?;
            set_scalars(k, &plan.scalars)
        })?;
    }
    Ok(())
}

/// Evaluate the expressions `outputs` elementwise over `inputs` (NumPy broadcasting, any strides)
/// in one kernel, returning one new contiguous tensor per expression. The kernel is generated
/// from the expressions' structure and cached, so changing scalar values reuses it.
pub fn fused(inputs: &[&Tensor], outputs: &[Expr]) -> Result<Vec<Tensor>> {
    let outs: Vec<(&Expr, Option<&Tensor>)> = outputs.iter().map(|e| (e, None)).collect();
    run("fused", inputs, &outs)
}

/// Like `fused`, writing each expression into its destination tensor (which has the broadcast
/// shape and the expression's dtype). Inputs may be destinations (in-place updates such as
/// optimizer steps) when they view the same elements.
pub fn fused_into(inputs: &[&Tensor], outputs: &[(Expr, &Tensor)]) -> Result<()> {
    let outs: Vec<(&Expr, Option<&Tensor>)> = outputs.iter().map(|(e, d)| (e, Some(*d))).collect();
    run("fused_into", inputs, &outs).map(|_| ())
}

/// One expression over `inputs` into a new tensor; the building block of the named elementwise ops.
pub(crate) fn map(op: &'static str, inputs: &[&Tensor], expr: Expr) -> Result<Tensor> {
    let mut v = run(op, inputs, &[(&expr, None)])?;
    Ok(v.remove(0))
}
