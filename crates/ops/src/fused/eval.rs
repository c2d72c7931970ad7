//! Running a fused plan: operand checks, broadcasting and destinations, then the dispatch to the generated kernel or the host evaluation; `fused`, `fused_into` and `map`.
use crate::base::dispatch::{dispatch, Op};
use crate::base::fastdiv::Div;
use crate::base::launch::launch_1d_over;
use crate::base::layout::{broadcast_shapes, broadcast_strides, merged_dims, numel, runs_of};
use crate::base::tensor::Tensor;
use crate::fused::codegen::{
    arithmetic_nodes, is_uniform, program, set_scalars, Form, FUSED_CONTIG, FUSED_STRIDED, VEC,
};
use crate::fused::expr::Expr;
use crate::fused::host_eval;
use crate::fused::plan::{plan, Plan};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::Kernel;

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
        if dests[a + 1..]
            .iter()
            .any(|e| e.shares_storage(d) && !disjoint(d, e))
        {
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

/// The plan's kernel on an OpenCL device: the contiguous form (4 or 8 elements per work-item
/// where aligned) when every operand is dense, else the strided form.
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
    // A work-item reads every input element it needs, then writes the outputs' elements at the
    // same index: an output and an input laid out alike (strides, offset, element size) may be
    // one buffer (a captured graph runs the kernel in place where the input dies there).
    let allow_in_place = |k: &mut Kernel| {
        let no = out_tensors.len();
        for (j, o) in out_tensors.iter().enumerate() {
            for (i, t) in inputs.iter().enumerate() {
                if operands[j] == operands[no + i] && t.dtype.size() == o.dtype.size() {
                    k.allow_in_place(j, no + i);
                }
            }
        }
    };
    let set_buffers = |k: &mut Kernel| -> Result<()> {
        for t in out_tensors.iter().chain(inputs.iter().copied()) {
            k.arg_mem(t.mem()?)?;
        }
        Ok(())
    };
    // Elements a vector work-item takes: 8 where every operand read or written element by element
    // is 16-bit (4 of them are 8 bytes a load, too few in flight to keep the memory busy), else 4.
    let no = out_tensors.len();
    let narrow = out_tensors.iter().all(|t| t.dtype.size() <= 2)
        && (inputs.iter().enumerate()).all(|(i, t)| is_uniform(uniform, i) || t.dtype.size() <= 2);
    let widths = [if narrow { 2 * VEC } else { VEC }, VEC];
    if dense {
        // The widest vector whose groups are aligned in every dense operand, else 1.
        let aligned = |w: usize| {
            (operands.iter().enumerate()).all(|(j, (_, off))| {
                off.is_multiple_of(w) || (j >= no && is_uniform(uniform, j - no))
            })
        };
        let vec = widths.into_iter().find(|&w| aligned(w)).unwrap_or(1);
        let program = program(device, plan, vec, &Form::Single { uniform })?;
        launch_1d_over(&program, FUSED_CONTIG, n.div_ceil(vec), n, |k| {
            k.declare(work.0, work.1);
            allow_in_place(k);
            set_buffers(k)?;
            for (_, off) in &operands {
                k.arg(&(*off as u32))?;
            }
            set_scalars(k, &plan.scalars)
        })?;
    } else {
        let k = operands.len();
        let max = crate::base::layout::MAX_DIMS;
        // FusedLayout: ndim, shape, strides per operand, offsets, the extents as divisors.
        let divs = 1 + max * (1 + k) + k;
        let mut words = vec![0u32; divs + 4 * max];
        words[0] = dims.len() as u32;
        for d in 0..max {
            let extent = dims.get(d).map_or(1, |(e, _)| *e);
            words[divs + 4 * d..divs + 4 * d + 4].copy_from_slice(&Div::new(extent).words());
        }
        for (d, (extent, strides)) in dims.iter().enumerate() {
            words[1 + d] = *extent;
            for (j, s) in strides.iter().enumerate() {
                words[1 + max * (1 + j) + d] = *s;
            }
        }
        for (j, (_, off)) in operands.iter().enumerate() {
            words[1 + max * (1 + k) + j] = *off as u32;
        }
        // The widest vector whose runs lie side by side in every operand, else 1.
        let offsets: Vec<usize> = operands.iter().map(|(_, off)| *off).collect();
        let vec = (widths.into_iter())
            .find(|&w| runs_of(w as u32, &dims, &offsets))
            .unwrap_or(1);
        let program = program(device, plan, vec, &Form::Single { uniform: 0 })?;
        launch_1d_over(&program, FUSED_STRIDED, n.div_ceil(vec), n, |k| {
            k.declare(work.0, work.1);
            allow_in_place(k);
            set_buffers(k)?;
            k.arg_bytes(bytemuck::cast_slice(&words))?;
            set_scalars(k, &plan.scalars)
        })?;
    }
    Ok(())
}

/// Whether views `a` and `b` of one buffer share no element: their element ranges do not meet,
/// or they have one shape and the same strides with a contiguous last dim whose runs interleave
/// without touching (the two halves of a last dim).
pub(crate) fn disjoint(a: &Tensor, b: &Tensor) -> bool {
    let reach = |t: &Tensor| {
        let far: usize = (t.shape.iter().zip(&t.strides))
            .map(|(n, s)| n.saturating_sub(1) * s)
            .sum();
        t.offset + far
    };
    if reach(a) < b.offset || reach(b) < a.offset {
        return true;
    }
    let nd = a.shape.len();
    if nd == 0 || a.shape != b.shape || a.strides != b.strides || a.strides[nd - 1] != 1 {
        return false;
    }
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    // Every element of a view lies at its offset + a multiple of g + its last-dim index.
    let g = (a.strides.iter().zip(&a.shape).take(nd - 1))
        .filter(|(_, &n)| n > 1)
        .fold(0, |g, (&s, _)| gcd(g, s));
    let (n, delta) = (a.shape[nd - 1], a.offset.abs_diff(b.offset));
    g > 0 && n <= delta % g && delta % g <= g - n
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
