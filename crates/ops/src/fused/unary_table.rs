//! The elementwise unary ops, one table row each (OpenCL text, host function, gradient, flags); their enum, methods and matmul epilogue are generated from it.
//!
//! A row reads
//!
//! ```text
//! /// Doc of the op.
//! method Variant [flags] {
//!     cl(c, a) = <OpenCL C of the op applied to the variable `a`, in arithmetic `c: Class`>;
//!     host(x) = <the f64 host reference>;
//!     grad(x, y, g) = <Option<Expr>: the input gradient from x = input(0), y = f(x) = input(1)
//!                      and the output's gradient g = input(2); None where it is 0 almost everywhere>;
//! }
//! ```
//!
//! Flags: `ints` (also defined on i32/u32; otherwise float only) and `epilogue` (the matmul
//! epilogue may apply it: `Activation::Variant`). From the rows come `UnaryOp::Variant` (named
//! `"method"`), `Expr::method`, `Tensor::method`, `Var::method` (netcl-autograd, through the
//! exported `unary_ops!`), the backward rule `UnaryOp::grad` and the epilogue's OpenCL function
//! (`matmul.rs` generates `activate` from `UnaryOp::cl`). A new op is one row here.
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use crate::fused::expr::{erf, lit, Class, Expr};
use netcl_core_devices::Result;
use std::f64::consts::{FRAC_1_SQRT_2, PI};

/// Calls the macro `$m` with every row of the unary-op table (see `unary_table.rs` in
/// netcl-ops for the row syntax). Exported so that other crates (netcl-autograd's `Var`
/// methods) generate their per-op items from the same rows.
#[macro_export]
macro_rules! unary_ops {
    ($m:ident) => {
        $m! {
            /// `-x`.
            neg Neg [ints] {
                cl(c, a) = format!("(-{a})");
                host(x) = -x;
                grad(x, y, g) = Some(-g);
            }
            /// `|x|`.
            abs Abs [ints] {
                cl(c, a) = match c {
                    Class::F32 | Class::F64 => format!("fabs({a})"),
                    Class::I32 => format!("((int)abs({a}))"),
                    Class::U32 => a.to_string(),
                };
                host(x) = x.abs();
                grad(x, y, g) = Some(g * x.sign());
            }
            /// 1, -1 or 0 (and NaN) by the sign of `x`.
            sign Sign [ints] {
                cl(c, a) = format!(
                    "({a} > {zero} ? {one} : ({a} < {zero} ? -{one} : {a}))",
                    zero = lit(c, 0.0),
                    one = lit(c, 1.0)
                );
                host(x) = if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                };
                grad(x, y, g) = None;
            }
            /// `e^x`.
            exp Exp [] {
                cl(c, a) = format!("exp({a})");
                host(x) = x.exp();
                grad(x, y, g) = Some(g * y);
            }
            /// `e^x - 1`, exact for tiny `x` (where `exp(x) - 1` loses its digits).
            expm1 Expm1 [] {
                cl(c, a) = format!("expm1({a})");
                host(x) = x.exp_m1();
                grad(x, y, g) = Some(g * x.exp());
            }
            /// The natural logarithm.
            log Log [] {
                cl(c, a) = format!("log({a})");
                host(x) = x.ln();
                grad(x, y, g) = Some(g / x);
            }
            /// The square root.
            sqrt Sqrt [] {
                cl(c, a) = format!("sqrt({a})");
                host(x) = x.sqrt();
                grad(x, y, g) = Some(g * 0.5 / y);
            }
            /// `1 / sqrt(x)`.
            rsqrt Rsqrt [] {
                cl(c, a) = format!("rsqrt({a})");
                host(x) = 1.0 / x.sqrt();
                grad(x, y, g) = Some(g * -0.5 * y.clone() * y.clone() * y);
            }
            /// The sine.
            sin Sin [] {
                cl(c, a) = format!("sin({a})");
                host(x) = x.sin();
                grad(x, y, g) = Some(g * x.cos());
            }
            /// The cosine.
            cos Cos [] {
                cl(c, a) = format!("cos({a})");
                host(x) = x.cos();
                grad(x, y, g) = Some(-(g * x.sin()));
            }
            /// The hyperbolic tangent.
            tanh Tanh [] {
                cl(c, a) = format!("tanh({a})");
                host(x) = x.tanh();
                grad(x, y, g) = Some(g * (Expr::scalar(1.0) - y.square()));
            }
            /// `1 / (1 + e^-x)`.
            sigmoid Sigmoid [] {
                cl(c, a) = format!("({one} / ({one} + exp(-{a})))", one = lit(c, 1.0));
                host(x) = 1.0 / (1.0 + (-x).exp());
                grad(x, y, g) = Some(g * y.clone() * (Expr::scalar(1.0) - y));
            }
            /// `max(x, 0)`.
            relu Relu [ints epilogue] {
                cl(c, a) = format!("({a} < {zero} ? {zero} : {a})", zero = lit(c, 0.0));
                host(x) = if x < 0.0 { 0.0 } else { x };
                grad(x, y, g) = Some(Expr::select(x.gt(0.0), g, 0.0));
            }
            /// GELU with the exact erf: `x Φ(x)`.
            gelu Gelu [epilogue] {
                cl(c, a) = format!(
                    "({} * {a} * ({} + erf({a} * {})))",
                    lit(c, 0.5),
                    lit(c, 1.0),
                    lit(c, FRAC_1_SQRT_2)
                );
                host(x) = 0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2));
                grad(x, y, g) = {
                    let cdf = (Expr::scalar(1.0) + (x.clone() * FRAC_1_SQRT_2).erf()) * 0.5;
                    let pdf = (x.clone().square() * -0.5).exp() * (1.0 / (2.0 * PI).sqrt());
                    Some(g * (cdf + x * pdf))
                };
            }
            /// GELU's tanh approximation.
            gelu_tanh GeluTanh [epilogue] {
                cl(c, a) = format!(
                    "({} * {a} * ({} + tanh({} * ({a} + {} * {a} * {a} * {a}))))",
                    lit(c, 0.5),
                    lit(c, 1.0),
                    lit(c, (2.0 / PI).sqrt()),
                    lit(c, 0.044715)
                );
                host(x) = {
                    let k = (2.0 / PI).sqrt();
                    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
                };
                grad(x, y, g) = {
                    let k = (2.0 / PI).sqrt();
                    let x2 = x.clone().square();
                    let t = ((x.clone() + x.clone() * x2.clone() * 0.044715) * k).tanh();
                    let dt = (Expr::scalar(1.0) - t.clone().square())
                        * k
                        * (Expr::scalar(1.0) + x2 * (3.0 * 0.044715));
                    Some(g * ((Expr::scalar(1.0) + t) * 0.5 + x * dt * 0.5))
                };
            }
            /// SiLU (swish): `x sigmoid(x)`.
            silu Silu [epilogue] {
                cl(c, a) = format!("({a} / ({} + exp(-{a})))", lit(c, 1.0));
                host(x) = x / (1.0 + (-x).exp());
                grad(x, y, g) = {
                    let s = x.clone().sigmoid();
                    Some(g * s.clone() * (Expr::scalar(1.0) + x * (Expr::scalar(1.0) - s)))
                };
            }
            /// `x * x`.
            square Square [ints] {
                cl(c, a) = format!("({a} * {a})");
                host(x) = x * x;
                grad(x, y, g) = Some(g * x * 2.0);
            }
            /// `1 / x`.
            reciprocal Reciprocal [] {
                cl(c, a) = format!("({} / {a})", lit(c, 1.0));
                host(x) = 1.0 / x;
                grad(x, y, g) = Some(-(g * y.square()));
            }
            /// Rounded toward minus infinity.
            floor Floor [] {
                cl(c, a) = format!("floor({a})");
                host(x) = x.floor();
                grad(x, y, g) = None;
            }
            /// The error function.
            erf Erf [] {
                cl(c, a) = format!("erf({a})");
                host(x) = erf(x);
                grad(x, y, g) = Some(g * (x.square() * -1.0).exp() * (2.0 / PI.sqrt()));
            }
            /// `ln(1 + e^x)`, and `x` where `x > 20` (PyTorch's default threshold); `exp` never
            /// overflows below the threshold and `log1p` keeps tiny `e^x` exact.
            softplus Softplus [epilogue] {
                cl(c, a) = format!("({a} > {} ? {a} : log1p(exp({a})))", lit(c, 20.0));
                host(x) = if x > 20.0 { x } else { x.exp().ln_1p() };
                grad(x, y, g) = Some(g * x.sigmoid());
            }
            /// Mish: `x tanh(softplus(x))`.
            mish Mish [epilogue] {
                cl(c, a) = format!("({a} * tanh({}))", UnaryOp::Softplus.cl(c, a));
                host(x) = x * UnaryOp::Softplus.host(x).tanh();
                grad(x, y, g) = {
                    let t = x.clone().softplus().tanh();
                    let dt = (Expr::scalar(1.0) - t.clone().square()) * x.clone().sigmoid();
                    Some(g * (t + x * dt))
                };
            }
        }
    };
}

/// Whether the flag list `[...]` holds the flag.
macro_rules! flag {
    ($f:ident []) => {
        false
    };
    (ints [ints $($rest:ident)*]) => {
        true
    };
    (epilogue [epilogue $($rest:ident)*]) => {
        true
    };
    ($f:ident [$other:ident $($rest:ident)*]) => {
        flag!($f [$($rest)*])
    };
}

/// The items after the flag list when it holds the flag, else nothing.
macro_rules! if_flag {
    ($f:ident [] $($item:tt)*) => {};
    (epilogue [epilogue $($rest:ident)*] $($item:tt)*) => {
        $($item)*
    };
    ($f:ident [$other:ident $($rest:ident)*] $($item:tt)*) => {
        if_flag!($f [$($rest)*] $($item)*);
    };
}

/// Accepts the known flags only (a misspelt flag is a compile error).
macro_rules! known_flag {
    (ints) => {};
    (epilogue) => {};
}

/// Everything netcl-ops generates from the rows.
macro_rules! unary_items {
    ($(
        $(#[$doc:meta])*
        $fn:ident $op:ident [$($flag:ident)*] {
            cl($c:ident, $a:ident) = $cl:expr;
            host($x:ident) = $host:expr;
            grad($gx:ident, $gy:ident, $gg:ident) = $grad:expr;
        }
    )*) => {
        $($(known_flag!($flag);)*)*

        /// Elementwise functions of one operand (one row each of the table in `unary_table.rs`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp {
            $($(#[$doc])* $op,)*
        }

        // Every binding of a row is declared by the row; a row need not use all of them.
        #[allow(unused_variables)]
        impl UnaryOp {
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$op),*];

            /// The op's name (used in errors and kernel names); also its method's name.
            pub fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$op => stringify!($fn),)*
                }
            }

            /// Whether the op needs a float operand.
            pub(crate) fn float_only(self) -> bool {
                match self {
                    $(UnaryOp::$op => !flag!(ints [$($flag)*]),)*
                }
            }

            /// Whether a matmul epilogue may apply the op (`Activation`).
            pub fn epilogue(self) -> bool {
                match self {
                    $(UnaryOp::$op => flag!(epilogue [$($flag)*]),)*
                }
            }

            /// OpenCL C for the op applied to the variable `a` of arithmetic `c`.
            pub(crate) fn cl(self, c: Class, a: &str) -> String {
                match self {
                    $(UnaryOp::$op => {
                        let ($c, $a) = (c, a);
                        $cl
                    })*
                }
            }

            /// The host reference (before rounding to the arithmetic of the dtype).
            pub(crate) fn host(self, x: f64) -> f64 {
                match self {
                    $(UnaryOp::$op => {
                        let $x = x;
                        $host
                    })*
                }
            }

            /// `host` over f32 values, each rounded back to f32: the op chosen once for the
            /// whole slice, so the loop is the op's alone (and vectorises where it can).
            #[inline(always)]
            pub(crate) fn host_f32(self, x: &[f32], o: &mut [f32]) {
                match self {
                    $(UnaryOp::$op => {
                        for (o, &v) in o.iter_mut().zip(x) {
                            let $x = v as f64;
                            *o = ($host) as f32;
                        }
                    })*
                }
            }

            /// The input gradient as an expression of x = `Expr::input(0)`, y = `Expr::input(1)`
            /// (the output) and g = `Expr::input(2)` (the output's gradient); None for ops whose
            /// derivative is zero almost everywhere.
            pub fn grad(self) -> Option<Expr> {
                let (x, y, g) = (Expr::input(0), Expr::input(1), Expr::input(2));
                match self {
                    $(UnaryOp::$op => {
                        let ($gx, $gy, $gg) = (x, y, g);
                        $grad
                    })*
                }
            }
        }

        // `Expr::neg` is also `-expr` (ops::Neg).
        #[allow(clippy::should_implement_trait)]
        impl Expr {
            $(
                $(#[$doc])*
                pub fn $fn(self) -> Expr {
                    self.unary(UnaryOp::$op)
                }
            )*
        }

        impl Tensor {
            $(
                #[doc = concat!("`", stringify!($fn), "` of every element: ")]
                $(#[$doc])*
                pub fn $fn(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }

        #[allow(non_upper_case_globals)]
        impl Activation {
            $(
                if_flag!(epilogue [$($flag)*]
                    #[doc = concat!("The `", stringify!($fn), "` epilogue.")]
                    pub const $op: Activation = Activation(Some(UnaryOp::$op));
                );
            )*
        }
    };
}

crate::unary_ops!(unary_items);
