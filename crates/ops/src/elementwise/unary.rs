//! Unary elementwise ops through the fused-kernel generator: `Tensor::unary` (the named methods come from unary_table.rs), clamp, leaky_relu, powf and dtype casts.
use crate::base::tensor::Tensor;
use crate::fused::eval::map;
use crate::fused::expr::{Expr, UnaryOp};
use netcl_core_devices::{DType, Result};

impl Tensor {
    /// `op` of every element (into a new contiguous tensor of the same dtype).
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        map(op.name(), &[self], Expr::input(0).unary(op))
    }

    /// `x` where positive, `slope * x` elsewhere.
    pub fn leaky_relu(&self, slope: f64) -> Result<Tensor> {
        map("leaky_relu", &[self], Expr::input(0).leaky_relu(slope))
    }

    /// Every element limited to `[lo, hi]` (NaN stays NaN).
    pub fn clamp(&self, lo: f64, hi: f64) -> Result<Tensor> {
        map("clamp", &[self], Expr::input(0).clamp(lo, hi))
    }

    /// Every element to the power `p`.
    pub fn powf(&self, p: f64) -> Result<Tensor> {
        map("powf", &[self], Expr::input(0).pow(p))
    }

    /// The elements converted to `dtype` (a copy; the same tensor when the dtype already matches).
    /// Floats to f16/bf16 round to nearest even (f64 through f32); floats to integers truncate
    /// toward zero and saturate (NaN gives 0); integers to integers wrap.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        map("cast", &[self], Expr::input(0).cast(dtype))
    }
}
