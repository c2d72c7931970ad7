//! Fused plans: expressions typed (scalars take their tensor's dtype), deduplicated into a node list with their scalar values, and the casts between arithmetics.
use crate::fused::expr::{BinaryOp, Class, Expr, UnaryOp};
use half::{bf16, f16};
use netcl_core_devices::{DType, Error, Result};
use std::collections::HashMap;
use std::hash::Hash;

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

pub(crate) fn cast_cl(from: Class, to: DType, a: &str) -> String {
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
