//! Backward rules of the unary elementwise ops and casts: each derivative is one fused kernel over (x, y, dy).
use crate::tape::{record, Var};
use netcl_ops::{fused, DType, Expr, Result, Tensor, UnaryOp};
use std::f64::consts::PI;

/// The input gradient as an expression of x = input(0), y = input(1) (the output) and
/// g = input(2) (the output's gradient); None for ops whose derivative is zero almost everywhere.
fn unary_grad(op: UnaryOp) -> Option<Expr> {
    let (x, y, g) = (Expr::input(0), Expr::input(1), Expr::input(2));
    let sqrt_2_over_pi = (2.0 / PI).sqrt();
    Some(match op {
        UnaryOp::Neg => -g,
        UnaryOp::Abs => g * x.sign(),
        UnaryOp::Sign | UnaryOp::Floor => return None,
        UnaryOp::Exp => g * y,
        UnaryOp::Log => g / x,
        UnaryOp::Sqrt => g * 0.5 / y,
        UnaryOp::Rsqrt => g * -0.5 * y.clone() * y.clone() * y,
        UnaryOp::Sin => g * x.cos(),
        UnaryOp::Cos => -(g * x.sin()),
        UnaryOp::Tanh => g * (Expr::scalar(1.0) - y.square()),
        UnaryOp::Sigmoid => g * y.clone() * (Expr::scalar(1.0) - y),
        UnaryOp::Relu => Expr::select(x.gt(0.0), g, 0.0),
        UnaryOp::Gelu => {
            let cdf =
                (Expr::scalar(1.0) + (x.clone() * std::f64::consts::FRAC_1_SQRT_2).erf()) * 0.5;
            let pdf = (x.clone().square() * -0.5).exp() * (1.0 / (2.0 * PI).sqrt());
            g * (cdf + x * pdf)
        }
        UnaryOp::GeluTanh => {
            let x2 = x.clone().square();
            let t = ((x.clone() + x.clone() * x2.clone() * 0.044715) * sqrt_2_over_pi).tanh();
            let dt = (Expr::scalar(1.0) - t.clone().square())
                * sqrt_2_over_pi
                * (Expr::scalar(1.0) + x2 * (3.0 * 0.044715));
            g * ((Expr::scalar(1.0) + t) * 0.5 + x * dt * 0.5)
        }
        UnaryOp::Silu => {
            let s = x.clone().sigmoid();
            g * s.clone() * (Expr::scalar(1.0) + x * (Expr::scalar(1.0) - s))
        }
        UnaryOp::Square => g * x * 2.0,
        UnaryOp::Reciprocal => -(g * y.square()),
        UnaryOp::Erf => g * (x.square() * -1.0).exp() * (2.0 / PI.sqrt()),
    })
}

/// Record an elementwise op whose input gradient is `dx` over (x, y, dy).
fn pointwise(op: &'static str, x: &Var, y: Tensor, dx: Option<Expr>) -> Result<Var> {
    let xs = x.value().clone();
    let ys = y.clone();
    record(op, &[x], y, move |g, _| {
        Ok(vec![match dx {
            Some(e) => Some(fused(&[&xs, &ys, g], &[e])?.remove(0)),
            None => None,
        }])
    })
}

macro_rules! unary_vars {
    ($($fn:ident => $op:ident),* $(,)?) => {
        impl Var {
            $(
                #[doc = concat!("`", stringify!($fn), "` of every element (recorded).")]
                pub fn $fn(&self) -> Result<Var> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_vars!(
    neg => Neg, abs => Abs, sign => Sign, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    sin => Sin, cos => Cos, tanh => Tanh, sigmoid => Sigmoid, relu => Relu, gelu => Gelu,
    gelu_tanh => GeluTanh, silu => Silu, square => Square, reciprocal => Reciprocal,
    floor => Floor, erf => Erf,
);

impl Var {
    /// `op` of every element.
    pub fn unary(&self, op: UnaryOp) -> Result<Var> {
        let y = self.value().unary(op)?;
        pointwise(op.name(), self, y, unary_grad(op))
    }

    /// `x` where positive, `slope * x` elsewhere.
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
    pub fn clamp(&self, lo: f64, hi: f64) -> Result<Var> {
        let y = self.value().clamp(lo, hi)?;
        let x = Expr::input(0);
        let inside = x.clone().ge(lo) * x.le(hi);
        let dx = Expr::select(inside, Expr::input(2), 0.0);
        pointwise("clamp", self, y, Some(dx))
    }

    /// Every element to the power `p`.
    pub fn powf(&self, p: f64) -> Result<Var> {
        let y = self.value().powf(p)?;
        let dx = Expr::input(2) * Expr::input(0).pow(p - 1.0) * p;
        pointwise("powf", self, y, Some(dx))
    }

    /// `x * s`.
    pub fn mul_scalar(&self, s: f64) -> Result<Var> {
        let y = self.value().mul_scalar(s)?;
        pointwise("mul_scalar", self, y, Some(Expr::input(2) * s))
    }

    /// `x + s`.
    pub fn add_scalar(&self, s: f64) -> Result<Var> {
        let y = self.value().add_scalar(s)?;
        record("add_scalar", &[self], y, |g, _| Ok(vec![Some(g.clone())]))
    }

    /// `x - s`.
    pub fn sub_scalar(&self, s: f64) -> Result<Var> {
        self.add_scalar(-s)
    }

    /// `x / s`.
    pub fn div_scalar(&self, s: f64) -> Result<Var> {
        let y = self.value().div_scalar(s)?;
        pointwise("div_scalar", self, y, Some(Expr::input(2) / s))
    }

    /// The elements converted to `dtype`; the gradient is cast back to the input's dtype.
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
