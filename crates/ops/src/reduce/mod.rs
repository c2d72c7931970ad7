//! Reductions over any set of axes of strided views: sum, mean, max, min, argmax, argmin, var, logsumexp.
mod opencl;
mod reference;
use crate::base::axis::AxisSplit;
use crate::base::dispatch::dispatch;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// A reduction. Its name is the kernel prefix (`sum_wg`, `sum_merge`, `sum_col`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceOp {
    Sum,
    /// Empty reductions give NaN.
    Mean,
    /// NaN propagates; an empty reduction is an error.
    Max,
    Min,
    /// Index (I32) of the first maximum within the reduced elements, counted row-major over the
    /// reduced axes in increasing axis order; NaN counts as the maximum. Empty is an error.
    ArgMax,
    ArgMin,
    /// Variance `sum((x - mean)^2) / max(n - correction, 0)` (correction 1 = unbiased); NaN when
    /// the denominator is 0.
    Var {
        correction: f64,
    },
    /// `log(sum(exp(x)))` computed around the maximum; empty gives -inf.
    LogSumExp,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
            ReduceOp::Var { .. } => "var",
            ReduceOp::LogSumExp => "logsumexp",
        }
    }

    /// The dtype of the result for input `dtype`.
    pub fn out_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I32,
            _ => dtype,
        }
    }

    fn float_only(self) -> bool {
        matches!(
            self,
            ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::LogSumExp
        )
    }

    fn needs_elements(self) -> bool {
        matches!(
            self,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
        )
    }

    /// The op's scalar kernel parameter (the correction of var).
    fn param(self) -> f64 {
        match self {
            ReduceOp::Var { correction } => correction,
            _ => 0.0,
        }
    }
}

/// `axes` of a tensor of `shape` as a mask; errors name `op`, the axes and the shape.
pub(crate) fn axis_mask(op: &str, shape: &[usize], axes: &[usize]) -> Result<Vec<bool>> {
    let mut mask = vec![false; shape.len()];
    for &a in axes {
        if a >= shape.len() {
            return Err(Error::invalid(
                op,
                format!("axis {a} out of range for shape {shape:?} (axes {axes:?})"),
            ));
        }
        if std::mem::replace(&mut mask[a], true) {
            return Err(Error::invalid(
                op,
                format!("axis {a} repeated in axes {axes:?} of shape {shape:?}"),
            ));
        }
    }
    Ok(mask)
}

/// A checked reduction `op` of `x` over the axes in `mask`: a new tensor of `out_shape` (the
/// kept dims, with the reduced ones as 1 under keepdim) in `op`'s output dtype.
#[derive(Clone, Debug)]
struct Reduce {
    x: Tensor,
    op: ReduceOp,
    mask: Vec<bool>,
    out_shape: Vec<usize>,
}

impl_op!(Reduce, Tensor, "reduce", reduce, |d| d.op.name());

impl Tensor {
    /// Reduce over `axes` (each at most once; `&[]` reduces nothing). With `keepdim` the reduced
    /// dims stay as size 1, otherwise they are removed. Any strided view is read in place.
    /// Device kernels: one (two when a few outputs each reduce many elements).
    pub fn reduce(&self, op: ReduceOp, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        let mask = axis_mask(name, &self.shape, axes)?;
        if op.float_only() && !self.dtype.is_float() {
            return Err(Error::dtype(
                name,
                format!(
                    "{} {:?}: {name} needs a float dtype",
                    self.dtype, self.shape
                ),
            ));
        }
        let split = AxisSplit::new(self, &mask);
        let nred = split.nred();
        if op.needs_elements() && split.red_shape.contains(&0) {
            return Err(Error::shape(
                name,
                format!(
                    "{name} over empty axes {axes:?} of shape {:?} has no elements",
                    self.shape
                ),
            ));
        }
        if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && nred > i32::MAX as usize {
            return Err(Error::shape(
                name,
                format!("{nred} reduced elements exceed the I32 index range"),
            ));
        }
        let out_shape: Vec<usize> = if keepdim {
            (0..self.ndim())
                .map(|d| if mask[d] { 1 } else { self.shape[d] })
                .collect()
        } else {
            split.kept_shape.clone()
        };
        let desc = Reduce {
            x: self.clone(),
            op,
            mask,
            out_shape,
        };
        dispatch(&self.device, &desc)
    }

    /// Reduce over every axis to a 0-dim tensor.
    pub fn reduce_all(&self, op: ReduceOp) -> Result<Tensor> {
        let axes: Vec<usize> = (0..self.ndim()).collect();
        self.reduce(op, &axes, false)
    }

    pub fn sum(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    pub fn mean(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, axes, keepdim)
    }
    pub fn max(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }
    pub fn min(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }
    /// I32 indices of the first maxima (see [`ReduceOp::ArgMax`]).
    pub fn argmax(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, axes, keepdim)
    }
    pub fn argmin(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, axes, keepdim)
    }
    /// Variance with `correction` (1.0 = unbiased, 0.0 = population).
    pub fn var(&self, axes: &[usize], correction: f64, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Var { correction }, axes, keepdim)
    }
    pub fn logsumexp(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::LogSumExp, axes, keepdim)
    }

    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Sum)
    }
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Mean)
    }
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Max)
    }
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Min)
    }
    /// The row-major flat index of the first maximum, as a 0-dim I32 tensor.
    pub fn argmax_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::ArgMax)
    }
    pub fn argmin_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::ArgMin)
    }
    pub fn var_all(&self, correction: f64) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Var { correction })
    }
    pub fn logsumexp_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::LogSumExp)
    }
}
