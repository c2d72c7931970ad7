//! Elementwise expressions: the tree users build, which `fused` compiles into one kernel (and the host evaluates).
pub use crate::fused::unary_table::UnaryOp;
use netcl_core_devices::DType;
use std::ops;

/// An elementwise expression over the inputs of a fused kernel. Build it from `Expr::input(i)`,
/// scalars, operators (`+ - * /`, unary `-`) and methods; scalars take the dtype of the tensor
/// expression they meet.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Input(usize),
    Scalar(f64),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `cond != 0 ? a : b`
    Where(Box<Expr>, Box<Expr>, Box<Expr>),
    Cast(DType, Box<Expr>),
}

/// The arithmetic of a dtype inside kernels: f16 and bf16 compute in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Class {
    F32,
    F64,
    I32,
    U32,
}

impl Class {
    pub(crate) fn of(dtype: DType) -> Class {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Class::F32,
            DType::F64 => Class::F64,
            DType::I32 => Class::I32,
            DType::U32 => Class::U32,
        }
    }
    /// The OpenCL C type.
    pub(crate) fn cl(self) -> &'static str {
        match self {
            Class::F32 => "float",
            Class::F64 => "double",
            Class::I32 => "int",
            Class::U32 => "uint",
        }
    }
    pub(crate) fn is_float(self) -> bool {
        matches!(self, Class::F32 | Class::F64)
    }
    /// `x` rounded to a value of this arithmetic (integers wrap modulo 2^32).
    pub(crate) fn round(self, x: f64) -> f64 {
        match self {
            Class::F32 => x as f32 as f64,
            Class::F64 => x,
            Class::I32 => wrap_i64(x) as i32 as f64,
            Class::U32 => wrap_i64(x) as u32 as f64,
        }
    }
}

/// An integral f64 as i64 (values of integer expressions are exact integers).
fn wrap_i64(x: f64) -> i64 {
    x as i64
}

macro_rules! ops_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $str:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            /// The op's name (used in errors and kernel names).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $str),* }
            }
        }
    };
}

ops_enum!(
    /// Elementwise functions of two operands; comparisons give 1 or 0 in the operands' dtype.
    BinaryOp {
        Add => "add", Sub => "sub", Mul => "mul", Div => "div", Maximum => "maximum",
        Minimum => "minimum", Pow => "pow", Eq => "eq", Ne => "ne", Lt => "lt", Le => "le",
        Gt => "gt", Ge => "ge",
    }
);

/// A typed constant in OpenCL C.
pub(crate) fn lit(class: Class, v: f64) -> String {
    format!("(({}){v:?})", class.cl())
}

impl BinaryOp {
    pub(crate) fn float_only(self) -> bool {
        self == BinaryOp::Pow
    }

    pub(crate) fn cl(self, c: Class, a: &str, b: &str) -> String {
        let cmp = |op: &str| format!("(({a} {op} {b}) ? {} : {})", lit(c, 1.0), lit(c, 0.0));
        match self {
            BinaryOp::Add => format!("({a} + {b})"),
            BinaryOp::Sub => format!("({a} - {b})"),
            BinaryOp::Mul => format!("({a} * {b})"),
            BinaryOp::Div if c.is_float() => format!("({a} / {b})"),
            // Integer division by zero gives 0 on every device (as the host does), and INT_MIN / -1
            // wraps to INT_MIN: C leaves both undefined.
            BinaryOp::Div if c == Class::I32 => {
                format!("(({b}) == 0 ? 0 : ({b}) == -1 ? (int)(0u - (uint)({a})) : ({a}) / ({b}))")
            }
            BinaryOp::Div => format!("(({b}) == 0 ? 0 : ({a}) / ({b}))"),
            BinaryOp::Pow => format!("pow({a}, {b})"),
            // NaN in either operand propagates (as in PyTorch).
            BinaryOp::Maximum if c.is_float() => format!("(({a} > {b} || isnan({a})) ? {a} : {b})"),
            BinaryOp::Minimum if c.is_float() => format!("(({a} < {b} || isnan({a})) ? {a} : {b})"),
            BinaryOp::Maximum => format!("max({a}, {b})"),
            BinaryOp::Minimum => format!("min({a}, {b})"),
            BinaryOp::Eq => cmp("=="),
            BinaryOp::Ne => cmp("!="),
            BinaryOp::Lt => cmp("<"),
            BinaryOp::Le => cmp("<="),
            BinaryOp::Gt => cmp(">"),
            BinaryOp::Ge => cmp(">="),
        }
    }

    /// The host reference in arithmetic `c` (integers exactly, in i64, before wrapping).
    pub(crate) fn host(self, c: Class, x: f64, y: f64) -> f64 {
        let b = |v: bool| if v { 1.0 } else { 0.0 };
        if !c.is_float() {
            let (i, j) = (wrap_i64(x), wrap_i64(y));
            let r = match self {
                BinaryOp::Add => i.wrapping_add(j),
                BinaryOp::Sub => i.wrapping_sub(j),
                BinaryOp::Mul => i.wrapping_mul(j),
                // Division by zero gives 0, as on every device.
                BinaryOp::Div => i.checked_div(j).unwrap_or(0),
                BinaryOp::Maximum => i.max(j),
                BinaryOp::Minimum => i.min(j),
                _ => return self.host_float(x, y, b),
            };
            return r as f64;
        }
        self.host_float(x, y, b)
    }

    fn host_float(self, x: f64, y: f64, b: impl Fn(bool) -> f64) -> f64 {
        match self {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Pow => x.powf(y),
            BinaryOp::Maximum => {
                if x > y || x.is_nan() {
                    x
                } else {
                    y
                }
            }
            BinaryOp::Minimum => {
                if x < y || x.is_nan() {
                    x
                } else {
                    y
                }
            }
            BinaryOp::Eq => b(x == y),
            BinaryOp::Ne => b(x != y),
            BinaryOp::Lt => b(x < y),
            BinaryOp::Le => b(x <= y),
            BinaryOp::Gt => b(x > y),
            BinaryOp::Ge => b(x >= y),
        }
    }
}

/// The error function, to f64 precision (libm's port of musl's erf).
pub(crate) fn erf(x: f64) -> f64 {
    libm::erf(x)
}

impl Expr {
    /// Whether the expression reads input `i`.
    pub fn reads_input(&self, i: usize) -> bool {
        match self {
            Expr::Input(j) => *j == i,
            Expr::Scalar(_) => false,
            Expr::Unary(_, a) | Expr::Cast(_, a) => a.reads_input(i),
            Expr::Binary(_, a, b) => a.reads_input(i) || b.reads_input(i),
            Expr::Where(c, a, b) => c.reads_input(i) || a.reads_input(i) || b.reads_input(i),
        }
    }
    pub fn input(i: usize) -> Expr {
        Expr::Input(i)
    }
    pub fn scalar(v: f64) -> Expr {
        Expr::Scalar(v)
    }
    pub fn unary(self, op: UnaryOp) -> Expr {
        Expr::Unary(op, Box::new(self))
    }
    pub fn binary(self, op: BinaryOp, other: impl Into<Expr>) -> Expr {
        Expr::Binary(op, Box::new(self), Box::new(other.into()))
    }
    /// `cond != 0 ? a : b`, elementwise.
    pub fn select(cond: Expr, a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
        Expr::Where(Box::new(cond), Box::new(a.into()), Box::new(b.into()))
    }
    pub fn cast(self, dtype: DType) -> Expr {
        Expr::Cast(dtype, Box::new(self))
    }
    pub fn max(self, o: impl Into<Expr>) -> Expr {
        self.binary(BinaryOp::Maximum, o)
    }
    pub fn min(self, o: impl Into<Expr>) -> Expr {
        self.binary(BinaryOp::Minimum, o)
    }
    pub fn pow(self, o: impl Into<Expr>) -> Expr {
        self.binary(BinaryOp::Pow, o)
    }
    /// `x` limited to `[lo, hi]`.
    pub fn clamp(self, lo: f64, hi: f64) -> Expr {
        self.max(lo).min(hi)
    }
    /// `x` where positive, `slope * x` elsewhere.
    pub fn leaky_relu(self, slope: f64) -> Expr {
        let x = self;
        Expr::select(x.clone().binary(BinaryOp::Gt, 0.0), x.clone(), x * slope)
    }
}

macro_rules! expr_compare {
    ($($fn:ident => $op:ident),* $(,)?) => {
        impl Expr { $(pub fn $fn(self, o: impl Into<Expr>) -> Expr { self.binary(BinaryOp::$op, o) })* }
    };
}
expr_compare!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

impl From<f64> for Expr {
    fn from(v: f64) -> Expr {
        Expr::Scalar(v)
    }
}

macro_rules! expr_operator {
    ($trait:ident, $fn:ident, $op:ident) => {
        impl<R: Into<Expr>> ops::$trait<R> for Expr {
            type Output = Expr;
            fn $fn(self, rhs: R) -> Expr {
                self.binary(BinaryOp::$op, rhs)
            }
        }
        impl ops::$trait<Expr> for f64 {
            type Output = Expr;
            fn $fn(self, rhs: Expr) -> Expr {
                Expr::Scalar(self).binary(BinaryOp::$op, rhs)
            }
        }
    };
}
expr_operator!(Add, add, Add);
expr_operator!(Sub, sub, Sub);
expr_operator!(Mul, mul, Mul);
expr_operator!(Div, div, Div);

impl ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        self.unary(UnaryOp::Neg)
    }
}
