//! Backward rules of the unary elementwise ops (from netcl-ops' unary-op table) and casts: each derivative is one fused kernel over (x, y, dy).
use crate::tape::{record, Var};
use netcl_ops::{fused, DType, Expr, Result, Tensor, UnaryOp};

/// Record an elementwise op whose input gradient is `dx` over (x, y, dy).
/// Only the values `dx` reads are kept (silu keeps x, exp keeps y).
#[track_caller]
fn pointwise(op: &'static str, x: &Var, y: Tensor, dx: Option<Expr>) -> Result<Var> {
    let reads = |i: usize| dx.as_ref().is_some_and(|e| e.reads_input(i));
    let xs = reads(0).then(|| x.value().clone());
    let ys = reads(1).then(|| y.clone());
    record(op, &[x], y, move |g, _| {
        Ok(vec![match dx {
            // An unread slot is filled with g, which the expression never reads there.
            Some(e) => {
                let (xs, ys) = (xs.as_ref().unwrap_or(g), ys.as_ref().unwrap_or(g));
                Some(fused(&[xs, ys, g], &[e])?.remove(0))
            }
            None => None,
        }])
    })
}

/// `Var` methods of every row of netcl-ops' unary-op table.
macro_rules! unary_vars {
    ($(
        $(#[$doc:meta])*
        $fn:ident $op:ident [$($flag:ident)*] { $($row:tt)* }
    )*) => {
        impl Var {
            $(
                #[doc = concat!("`", stringify!($fn), "` of every element (recorded): ")]
                $(#[$doc])*
                #[track_caller]
                pub fn $fn(&self) -> Result<Var> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

netcl_ops::unary_ops!(unary_vars);

impl Var {
    /// `op` of every element.
    #[track_caller]
    pub fn unary(&self, op: UnaryOp) -> Result<Var> {
        let y = self.value().unary(op)?;
        pointwise(op.name(), self, y, op.grad())
    }

    /// `x` where positive, `slope * x` elsewhere.
    #[track_caller]
    pub fn leaky_relu(&self, slope: f64) -> Result<Var> {
        let y = self.value().leaky_relu(slope)?;
        let dx = Expr::select(
            Expr::input(0).gt(0.0),
            Expr::input(2),
            Expr::input(2) * slope,
        );
        pointwise("leaky_relu", self, y, Some(dx))
    }

    /// Elements limited to `[lo, hi]`; the gradient passes where `lo <= x <= hi`.
    #[track_caller]
    pub fn clamp(&self, lo: f64, hi: f64) -> Result<Var> {
        let y = self.value().clamp(lo, hi)?;
        let x = Expr::input(0);
        let inside = x.clone().ge(lo) * x.le(hi);
        let dx = Expr::select(inside, Expr::input(2), 0.0);
        pointwise("clamp", self, y, Some(dx))
    }

    /// Every element to the power `p`.
    #[track_caller]
    pub fn powf(&self, p: f64) -> Result<Var> {
        let y = self.value().powf(p)?;
        let dx = Expr::input(2) * Expr::input(0).pow(p - 1.0) * p;
        pointwise("powf", self, y, Some(dx))
    }

    /// `x * s`.
    #[track_caller]
    pub fn mul_scalar(&self, s: f64) -> Result<Var> {
        let y = self.value().mul_scalar(s)?;
        pointwise("mul_scalar", self, y, Some(Expr::input(2) * s))
    }

    /// `x + s`.
    #[track_caller]
    pub fn add_scalar(&self, s: f64) -> Result<Var> {
        let y = self.value().add_scalar(s)?;
        record("add_scalar", &[self], y, |g, _| Ok(vec![Some(g.clone())]))
    }

    /// `x - s`.
    #[track_caller]
    pub fn sub_scalar(&self, s: f64) -> Result<Var> {
        self.add_scalar(-s)
    }

    /// `x / s`.
    #[track_caller]
    pub fn div_scalar(&self, s: f64) -> Result<Var> {
        let y = self.value().div_scalar(s)?;
        pointwise("div_scalar", self, y, Some(Expr::input(2) / s))
    }

    /// The elements converted to `dtype`; the gradient is cast back to the input's dtype.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Var> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let from = self.dtype();
        let y = self.value().to_dtype(dtype)?;
        record("cast", &[self], y, move |g: &Tensor, _| {
            Ok(vec![Some(g.to_dtype(from)?)])
        })
    }
}
