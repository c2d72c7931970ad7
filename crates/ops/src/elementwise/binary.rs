//! Binary elementwise ops with NumPy broadcasting over any strides: arithmetic, maximum/minimum, pow, comparisons, where, scalar forms.
use crate::base::tensor::Tensor;
use crate::fused::eval::map;
use crate::fused::expr::{BinaryOp, Expr};
use netcl_core_devices::Result;

macro_rules! binary_methods {
    ($($fn:ident, $scalar_fn:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("`", stringify!($fn), "(self, other)` elementwise, broadcasting both.")]
                pub fn $fn(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(other, BinaryOp::$op)
                }
                #[doc = concat!("`", stringify!($fn), "(self, value)` elementwise.")]
                pub fn $scalar_fn(&self, value: f64) -> Result<Tensor> {
                    self.binary_scalar(BinaryOp::$op, value)
                }
            )*
        }
    };
}

binary_methods! {
    add, add_scalar => Add;
    sub, sub_scalar => Sub;
    mul, mul_scalar => Mul;
    div, div_scalar => Div;
    maximum, maximum_scalar => Maximum;
    minimum, minimum_scalar => Minimum;
    pow, pow_scalar => Pow;
    eq, eq_scalar => Eq;
    ne, ne_scalar => Ne;
    lt, lt_scalar => Lt;
    le, le_scalar => Le;
    gt, gt_scalar => Gt;
    ge, ge_scalar => Ge;
}

impl Tensor {
    /// `op(self, other)` elementwise, broadcasting both to a common shape (same dtype and device).
    /// Comparisons give 1 where true and 0 elsewhere, in the operands' dtype.
    pub fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        map(
            op.name(),
            &[self, other],
            Expr::input(0).binary(op, Expr::input(1)),
        )
    }

    /// `op(self, value)` elementwise; `value` is converted to this tensor's arithmetic.
    pub fn binary_scalar(&self, op: BinaryOp, value: f64) -> Result<Tensor> {
        map(op.name(), &[self], Expr::input(0).binary(op, value))
    }

    /// `cond != 0 ? a : b` elementwise, broadcasting all three (`cond` of any dtype).
    pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        map(
            "where",
            &[cond, a, b],
            Expr::select(Expr::input(0), Expr::input(1), Expr::input(2)),
        )
    }

    /// This tensor with `value` where `mask != 0` (mask broadcasts to this shape).
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        let out = map(
            "masked_fill",
            &[mask, self],
            Expr::select(Expr::input(0), value, Expr::input(1)),
        )?;
        if out.shape != self.shape {
            return Err(netcl_core_devices::Error::shape(
                "masked_fill",
                format!(
                    "mask {:?} does not broadcast to the tensor's {:?}",
                    mask.shape, self.shape
                ),
            ));
        }
        Ok(out)
    }
}
