//! Backward rules of the broadcasting binary ops, where/select and masked_fill: one fused kernel for both input gradients, then a sum over broadcast dims.
use crate::tape::{record, Var};
use netcl_ops::{fused, fused_into, BinaryOp, DType, Error, Expr, Result, Tensor};
use std::cmp::Ordering;

/// `g` summed over the dims that broadcasting expanded, giving a tensor of `shape`.
pub(crate) fn sum_to(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.ndim() - shape.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, &s) in shape.iter().enumerate() {
        if s == 1 && g.shape()[lead + i] != 1 {
            axes.push(lead + i);
        }
    }
    let summed = if axes.is_empty() {
        g.clone()
    } else {
        g.sum(&axes, true)?
    };
    summed.reshape(shape)
}

/// The gradients of `op` as expressions of the operands a and b (input(0) and input(1), widened
/// where they were promoted), y = input(2) and g = input(3).
fn binary_grads(op: BinaryOp, a: Expr, b: Expr) -> Option<(Expr, Expr)> {
    let (y, g) = (Expr::input(2), Expr::input(3));
    Some(match op {
        BinaryOp::Add => (g.clone(), g),
        BinaryOp::Sub => (g.clone(), -g),
        BinaryOp::Mul => (g.clone() * b, g * a),
        BinaryOp::Div => (g.clone() / b.clone(), -(g * y) / b),
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let wins = if op == BinaryOp::Maximum {
                a.clone().gt(b.clone())
            } else {
                a.clone().lt(b.clone())
            };
            let tie = a.eq(b);
            let half = g.clone() * 0.5;
            (
                Expr::select(
                    wins.clone(),
                    g.clone(),
                    Expr::select(tie.clone(), half.clone(), 0.0),
                ),
                Expr::select(wins, 0.0, Expr::select(tie, half, g)),
            )
        }
        BinaryOp::Pow => (
            g.clone() * b.clone() * a.clone().pow(b - 1.0),
            Expr::select(a.clone().eq(0.0), 0.0, g * y * a.log()),
        ),
        _ => return None,
    })
}

/// Record a binary op with gradients `(da, db)` over (a, b, y, g), reduced to each input's shape.
#[track_caller]
fn record_binary(
    op: &'static str,
    a: &Var,
    b: &Var,
    y: Tensor,
    grads: Option<(Expr, Expr)>,
) -> Result<Var> {
    // Keep only the values the derivatives read (add and sub keep none): inputs 0, 1, 2 of the
    // derivative expressions are a, b, y and input 3 is the output gradient.
    // Only the derivatives of tracked inputs count: `x * frozen_w` keeps w alone.
    let reads = |i: usize| {
        grads.as_ref().is_some_and(|(da, db)| {
            (a.is_tracked() && da.reads_input(i)) || (b.is_tracked() && db.reads_input(i))
        })
    };
    let (a_shape, b_shape) = (a.shape().to_vec(), b.shape().to_vec());
    let [av, bv, yv] = [
        reads(0).then(|| a.value().clone()),
        reads(1).then(|| b.value().clone()),
        reads(2).then(|| y.clone()),
    ];
    record(op, &[a, b], y, move |g, need| {
        let Some((da, db)) = grads else {
            return Ok(vec![None, None]);
        };
        // An unread slot is filled with g, which the expressions never read there.
        let (av, bv, yv) = (
            av.as_ref().unwrap_or(g),
            bv.as_ref().unwrap_or(g),
            yv.as_ref().unwrap_or(g),
        );
        // A gradient that is the output's gradient itself (add, the first of sub) is passed on
        // as it is, not copied; the rest come from one kernel.
        let wanted: Vec<Expr> = [(need[0], da), (need[1], db)]
            .into_iter()
            .filter_map(|(n, e)| n.then_some(e))
            .collect();
        let passed = |e: &Expr| *e == Expr::input(3) && g.is_contiguous();
        let computed: Vec<Expr> = wanted.iter().filter(|e| !passed(e)).cloned().collect();
        let mut outs = match computed.is_empty() {
            true => Vec::new(),
            false => fused(&[av, bv, yv, g], &computed)?,
        }
        .into_iter();
        let outs = wanted
            .iter()
            .map(|e| match passed(e) {
                true => Ok(g.clone()),
                false => outs
                    .next()
                    .ok_or_else(|| Error::invalid(op, "missing gradient")),
            })
            .collect::<Result<Vec<_>>>()?;
        reduced(outs, need, [&a_shape, &b_shape])
    })
}

/// The gradients of two broadcast operands from the kernel outputs `outs` (one per needed
/// operand, in order), each summed to its operand's shape.
fn reduced(outs: Vec<Tensor>, need: &[bool], shapes: [&[usize]; 2]) -> Result<Vec<Option<Tensor>>> {
    let mut outs = outs.into_iter();
    let mut grads = Vec::with_capacity(2);
    for (needed, shape) in need.iter().zip(shapes) {
        grads.push(match needed.then(|| outs.next()).flatten() {
            Some(t) => Some(sum_to(&t, shape)?),
            None => None,
        });
    }
    Ok(grads)
}

macro_rules! binary_vars {
    ($($fn:ident => $op:ident),* $(,)?) => {
        impl Var {
            $(
                #[doc = concat!("`", stringify!($fn), "` with NumPy broadcasting (recorded).")]
                #[track_caller]
                pub fn $fn(&self, other: &Var) -> Result<Var> {
                    self.binary(other, BinaryOp::$op)
                }
            )*
        }
    };
}

binary_vars!(
    add => Add, sub => Sub, mul => Mul, div => Div, maximum => Maximum, minimum => Minimum,
    pow => Pow,
);

/// The dtype a binary op of float operands `a` and `b` of different dtypes computes and returns
/// in, as PyTorch promotes: the wider one (f32 for bf16 with f16). None where they agree or one
/// is not a float.
fn promoted(a: DType, b: DType) -> Option<DType> {
    if a == b || !a.is_float() || !b.is_float() {
        return None;
    }
    Some(match a.size().cmp(&b.size()) {
        Ordering::Greater => a,
        Ordering::Less => b,
        Ordering::Equal => DType::F32,
    })
}

impl Var {
    /// `op(self, other)` elementwise with broadcasting. Comparisons give constant masks. Float
    /// operands of different dtypes are promoted to the wider one (in the kernel, without a
    /// copy), and each gradient comes back in its operand's dtype: under autocast, the residual
    /// stream (f32) plus a projection's output (bf16) is f32.
    #[track_caller]
    pub fn binary(&self, other: &Var, op: BinaryOp) -> Result<Var> {
        let Some(wide) = promoted(self.dtype(), other.dtype()) else {
            let y = self.value().binary(other.value(), op)?;
            let grads = binary_grads(op, Expr::input(0), Expr::input(1));
            return record_binary(op.name(), self, other, y, grads);
        };
        let widen = |i: usize, d: DType| match d == wide {
            true => Expr::input(i),
            false => Expr::input(i).cast(wide),
        };
        let (a, b) = (widen(0, self.dtype()), widen(1, other.dtype()));
        let y = fused(
            &[self.value(), other.value()],
            &[a.clone().binary(op, b.clone())],
        )?
        .remove(0);
        let narrow = |e: Expr, d: DType| match d == wide {
            true => e,
            false => e.cast(d),
        };
        let grads = binary_grads(op, a, b)
            .map(|(da, db)| (narrow(da, self.dtype()), narrow(db, other.dtype())));
        record_binary(op.name(), self, other, y, grads)
    }

    /// `a` where `cond` is non-zero, else `b` (cond is a constant mask; broadcasting).
    #[track_caller]
    pub fn select(cond: &Tensor, a: &Var, b: &Var) -> Result<Var> {
        let y = Tensor::select(cond, a.value(), b.value())?;
        let c = cond.clone();
        let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
        record("select", &[a, b], y, move |g, need| {
            let (m, g_in) = (Expr::input(0).ne(0.0), Expr::input(1));
            let mut out = vec![None, None];
            if need[0] {
                let t = fused(&[&c, g], &[Expr::select(m.clone(), g_in.clone(), 0.0)])?;
                out[0] = Some(sum_to(&t[0], &sa)?);
            }
            if need[1] {
                let t = fused(&[&c, g], &[Expr::select(m, 0.0, g_in)])?;
                out[1] = Some(sum_to(&t[0], &sb)?);
            }
            Ok(out)
        })
    }

    /// `value` where `mask` is non-zero, else the element (the gradient passes where it is zero).
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Var> {
        let y = self.value().masked_fill(mask, value)?;
        let (m, shape) = (mask.clone(), self.shape().to_vec());
        record("masked_fill", &[self], y, move |g, _| {
            let keep = Expr::select(Expr::input(0).ne(0.0), 0.0, Expr::input(1));
            let t = fused(&[&m, g], &[keep])?;
            Ok(vec![Some(sum_to(&t[0], &shape)?)])
        })
    }
}

/// d silu(x) / dx = s (1 + x (1 - s)), s = sigmoid(x).
fn dsilu(x: Expr) -> Expr {
    let s = x.clone().sigmoid();
    s.clone() * (Expr::scalar(1.0) + x * (Expr::scalar(1.0) - s))
}

impl Var {
    /// SwiGLU's gating, `silu(gate) * up`, as one kernel each way that keeps only `gate` and
    /// `up` for backward (silu then mul would also keep `silu(gate)`).
    #[track_caller]
    pub fn swiglu(gate: &Var, up: &Var) -> Result<Var> {
        let (g_in, u_in) = (Expr::input(0), Expr::input(1));
        let y = fused(
            &[gate.value(), up.value()],
            &[g_in.clone().silu() * u_in.clone()],
        )?
        .remove(0);
        let (gv, uv) = (gate.value().clone(), up.value().clone());
        let (g_shape, u_shape) = (gate.shape().to_vec(), up.shape().to_vec());
        record("swiglu", &[gate, up], y, move |dy, need| {
            let (dsilu, dy_in) = (dsilu(g_in.clone()), Expr::input(2));
            let mut exprs = Vec::new();
            if need[0] {
                exprs.push(dy_in.clone() * u_in * dsilu);
            }
            if need[1] {
                exprs.push(dy_in * g_in.silu());
            }
            let outs = fused(&[&gv, &uv, dy], &exprs)?;
            reduced(outs, need, [&g_shape, &u_shape])
        })
    }

    /// SwiGLU of the two halves of the last dim, `silu(x[..., :h]) * x[..., h:]`: the gate and
    /// up projections computed as one product (over their stacked weights) go in as they come
    /// out, and the gradient comes back as one tensor, both halves written by one kernel.
    #[track_caller]
    pub fn swiglu_halves(&self) -> Result<Var> {
        let nd = self.ndim();
        let two_h = self.shape().last().copied().unwrap_or(0);
        if nd == 0 || !two_h.is_multiple_of(2) {
            return Err(netcl_ops::Error::shape(
                "swiglu_halves",
                format!("{:?}: need a last dim of even size", self.shape()),
            ));
        }
        let h = two_h / 2;
        let x = self.value().clone();
        let (gate, up) = (x.narrow(nd - 1, 0, h)?, x.narrow(nd - 1, h, h)?);
        let (g_in, u_in) = (Expr::input(0), Expr::input(1));
        let y = fused(&[&gate, &up], &[g_in.clone().silu() * u_in.clone()])?.remove(0);
        record("swiglu_halves", &[self], y, move |dy, _| {
            // Both halves of the gradient from one read of gate, up and dy: a kernel with two
            // outputs, the halves of one new tensor.
            let (dsilu, dy_in) = (dsilu(g_in.clone()), Expr::input(2));
            let dx = Tensor::empty(x.shape(), x.dtype(), x.device())?;
            let (dgate, dup) = (dx.narrow(nd - 1, 0, h)?, dx.narrow(nd - 1, h, h)?);
            fused_into(
                &[&gate, &up, dy],
                &[
                    (dy_in.clone() * u_in * dsilu, &dgate),
                    (dy_in * g_in.silu(), &dup),
                ],
            )?;
            Ok(vec![Some(dx)])
        })
    }
}
