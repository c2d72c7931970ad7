//! Backward rules of matmul (batched, broadcast, 1-D operands) and the fused linear layer (x·Wᵀ + b, optional ReLU); both follow the autocast policy.
use crate::autocast::product_dtype;
use crate::binary::sum_to;
use crate::tape::{record, Var};
use netcl_ops::{Activation, DType, Error, Expr, MatmulOptions, MatmulVectors, Result, Tensor};

/// The last two dims swapped (a view; matmul reads it without a copy).
pub(crate) fn t(x: &Tensor) -> Result<Tensor> {
    let n = x.ndim();
    x.transpose(n - 2, n - 1)
}

impl Var {
    /// Matrix product with NumPy matmul semantics: batched over broadcast leading dims; a 1-D
    /// operand is a row (left) or column (right) vector whose dim is dropped from the result.
    #[track_caller]
    pub fn matmul(&self, other: &Var) -> Result<Var> {
        let vectors = MatmulVectors::of(self.shape(), other.shape())?;
        let a = match vectors.left() {
            Some(d) => self.unsqueeze(d)?,
            None => self.clone(),
        };
        let b = match vectors.right() {
            Some(d) => other.unsqueeze(d)?,
            None => other.clone(),
        };
        let mut y = a.matmul_nd(&b)?;
        for d in vectors.dropped(y.ndim()) {
            y = y.squeeze(d)?;
        }
        Ok(y)
    }

    #[track_caller]
    fn matmul_nd(&self, other: &Var) -> Result<Var> {
        let cast = Cast(product_dtype(&[self.dtype(), other.dtype()]));
        let (av, bv) = (cast.low(self.value())?, cast.low(other.value())?);
        let y = av.matmul_with(&bv, MatmulOptions::default())?;
        // Each operand is kept only for the other's gradient: a frozen weight's product keeps
        // no activation alive (PyTorch saves the same way).
        let (a_shape, b_shape) = (self.shape().to_vec(), other.shape().to_vec());
        let (a_dtype, b_dtype) = (self.dtype(), other.dtype());
        let a = other.is_tracked().then_some(av);
        let b = self.is_tracked().then_some(bv);
        record("matmul", &[self, other], y, move |g, need| {
            let da = match (&b, need[0]) {
                (Some(b), true) => Some(sum_to(
                    &g.matmul_with(&t(b)?, cast.writing(a_dtype))?,
                    &a_shape,
                )?),
                _ => None,
            };
            let db = match (&a, need[1]) {
                (Some(a), true) => Some(sum_to(
                    &t(a)?.matmul_with(g, cast.writing(b_dtype))?,
                    &b_shape,
                )?),
                _ => None,
            };
            Ok(vec![da, db])
        })
    }

    /// `act(x · weightᵀ + bias)` as one GEMM with the bias and activation in its epilogue.
    /// x: (..., in), weight: (out, in), bias: (out). Supported activations here are None and Relu
    /// (their gradients follow from the output); compose others after a plain linear.
    #[track_caller]
    pub fn linear(&self, weight: &Var, bias: Option<&Var>, activation: Activation) -> Result<Var> {
        let op = "linear";
        if !matches!(activation, Activation::None | Activation::Relu) {
            return Err(Error::invalid(
                op,
                format!("activation {activation:?} cannot be fused into a recorded linear; apply it as its own op"),
            ));
        }
        if weight.ndim() != 2
            || self.ndim() == 0
            || self.shape()[self.ndim() - 1] != weight.shape()[1]
        {
            return Err(Error::shape(
                op,
                format!(
                    "input {:?} and weight {:?}: need x (..., in) and weight (out, in)",
                    self.shape(),
                    weight.shape()
                ),
            ));
        }
        // Autocast: the products read 16-bit copies of x, the weight (and bias) and write the
        // output in 16 bits; the output's gradient arrives in 16 bits, and each input's gradient
        // is written in that input's dtype (f32 for the master weights).
        let mut dtypes = vec![self.dtype(), weight.dtype()];
        dtypes.extend(bias.map(|b| b.dtype()));
        let cast = Cast(product_dtype(&dtypes));
        let (x_dtype, w_dtype) = (self.dtype(), weight.dtype());
        let b_dtype = bias.map(|b| b.dtype());
        let x_shape = self.shape().to_vec();
        let (inn, out) = (weight.shape()[1], weight.shape()[0]);
        let rows = x_shape[..x_shape.len() - 1].iter().product::<usize>();
        let x2 = if self.value().is_contiguous() {
            self.value().clone()
        } else {
            self.value().contiguous()?
        };
        let x2 = cast.low(&x2.reshape(&[rows, inn])?)?;
        let w = cast.low(weight.value())?;
        let b = bias.map(|b| cast.low(b.value())).transpose()?;
        let opts = MatmulOptions {
            bias: b.as_ref(),
            activation,
            ..Default::default()
        };
        let y2 = x2.matmul_with(&t(&w)?, opts)?;
        let mut y_shape = x_shape.clone();
        let last = y_shape.len() - 1;
        y_shape[last] = out;
        let y = y2.reshape(&y_shape)?;
        // Kept for backward only where a gradient reads it: the output under ReLU (its
        // derivative), the input for the weight's gradient (none when the weight is frozen).
        let saved_y = matches!(activation, Activation::Relu).then(|| y2.clone());
        let x2 = weight.is_tracked().then_some(x2);
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        record(op, &inputs, y, move |g, need| {
            let g2 = g.reshape(&[rows, out])?;
            let gz = match &saved_y {
                Some(saved_y) => netcl_ops::fused(
                    &[saved_y, &g2],
                    &[Expr::select(Expr::input(0).gt(0.0), Expr::input(1), 0.0)],
                )?
                .remove(0),
                None => g2,
            };
            let dx = if need[0] {
                Some(
                    gz.matmul_with(&w, cast.writing(x_dtype))?
                        .reshape(&x_shape)?,
                )
            } else {
                None
            };
            // The bias's gradient, the column sums of gz, are the row sums of gzᵀ: added up by
            // the weight gradient's kernel where it can (one kernel fewer).
            let need_db = b_dtype.is_some() && need[2];
            let (dw, db) = match (&x2, need[1]) {
                (Some(x2), true) if need_db => {
                    let (dw, db) = t(&gz)?.matmul_with_row_sums(x2, cast.writing(w_dtype))?;
                    (Some(dw), Some(db))
                }
                (Some(x2), true) => (Some(t(&gz)?.matmul_with(x2, cast.writing(w_dtype))?), None),
                _ => (None, None),
            };
            let mut grads = vec![dx, dw];
            if let Some(b_dtype) = b_dtype {
                grads.push(match (need_db, db) {
                    (true, Some(db)) => Some(db.to_dtype(b_dtype)?),
                    (true, None) => Some(gz.sum(&[0], false)?.to_dtype(b_dtype)?),
                    (false, _) => None,
                });
            }
            Ok(grads)
        })
    }
}

/// The autocast dtype of one product, if any: its operands are read as copies in that dtype, the
/// product is written in it, and so is its output's gradient.
#[derive(Clone, Copy)]
pub(crate) struct Cast(pub(crate) Option<DType>);

impl Cast {
    /// `t` in the product's dtype.
    pub(crate) fn low(self, t: &Tensor) -> Result<Tensor> {
        match self.0 {
            Some(dt) => t.to_dtype(dt),
            None => Ok(t.clone()),
        }
    }

    /// Options writing a gradient product in `dtype` (its input's) under autocast.
    pub(crate) fn writing(self, dtype: DType) -> MatmulOptions<'static> {
        MatmulOptions {
            out_dtype: self.0.filter(|&dt| dt != dtype).map(|_| dtype),
            ..Default::default()
        }
    }
}
