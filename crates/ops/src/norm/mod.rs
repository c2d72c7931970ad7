//! Layer and RMS normalisation over trailing dims (forward, inference forward and backward).
mod opencl;
mod reference;
use crate::base::axis::AxisSplit;
use crate::base::checks::{check_device, check_dtype, check_float};
use crate::base::dispatch::dispatch;
use crate::base::layout::numel;
use crate::base::norm_params::{check_eps, check_param, check_stat, NormGrads};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// Rows and row length of `x` normalised over its trailing `normalized_shape`.
fn norm_rows(op: &str, x: &Tensor, normalized_shape: &[usize]) -> Result<(Vec<usize>, usize)> {
    check_float(op, x, "input")?;
    let k = normalized_shape.len();
    if k == 0 || k > x.ndim() || x.shape[x.ndim() - k..] != *normalized_shape {
        return Err(Error::shape(
            op,
            format!(
                "normalized shape {normalized_shape:?} is not the trailing dims of input {:?}",
                x.shape
            ),
        ));
    }
    Ok((x.shape[..x.ndim() - k].to_vec(), numel(normalized_shape)))
}

/// The statistics a norm forward saves for its backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stats {
    /// None (inference: nothing is allocated for a backward).
    None,
    /// The reciprocal standard deviation (rms_norm's backward).
    Rstd,
    /// Mean and reciprocal standard deviation (layer_norm's backward).
    MeanRstd,
}

/// y and the statistics asked for.
type NormOut = (Tensor, Option<Tensor>, Option<Tensor>);

/// A checked norm forward (`op`: layer_norm, or rms_norm when `rms`) of float `x` (any view)
/// over its trailing dims: `lead` rows of `n` elements (`split`: the lead dims kept, the others
/// reduced); weight and bias of the normalised shape in x's dtype. y is contiguous in `out`
/// (x's dtype, or 16 bits for an f32 x: [`y_dtype_ok`]), the statistics shaped `lead` in
/// [`acc_dtype`](crate::acc_dtype).
#[derive(Clone, Debug)]
struct NormForward {
    op: &'static str,
    x: Tensor,
    out: DType,
    rms: bool,
    lead: Vec<usize>,
    n: usize,
    split: AxisSplit,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
    stats: Stats,
}

impl_op!(NormForward, NormOut, "layer_norm", forward, |d| d.op);

/// Whether a norm of an `x` input may write (and take the gradient of) a `y` output: the same
/// dtype, or bf16/f16 of an f32 input.
fn y_dtype_ok(x: DType, y: DType) -> bool {
    x == y || (x == DType::F32 && matches!(y, DType::BF16 | DType::F16))
}

/// A checked norm backward (`op`: layer_norm_backward with `mean`, rms_norm_backward without)
/// for input `x` and `dy` (x's shape and device, y's dtype, any views), `lead` rows of `n`
/// elements; dweight when `weight` is given, dbias when `want_bias`.
#[derive(Clone, Debug)]
struct NormBackward {
    op: &'static str,
    x: Tensor,
    dy: Tensor,
    mean: Option<Tensor>,
    rstd: Tensor,
    normalized_shape: Vec<usize>,
    lead: Vec<usize>,
    n: usize,
    weight: Option<Tensor>,
    want_bias: bool,
    /// Added to dx (x's shape and dtype): the input's gradient from elsewhere.
    plus: Option<Tensor>,
}

impl_op!(
    NormBackward,
    NormGrads,
    "layer_norm_backward",
    backward,
    |d| d.op
);

impl Tensor {
    #[allow(clippy::too_many_arguments)]
    fn norm_forward(
        &self,
        op: &'static str,
        rms: bool,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        stats: Stats,
        out: DType,
    ) -> Result<NormOut> {
        let (lead, n) = norm_rows(op, self, normalized_shape)?;
        check_param(op, self, weight, "weight", normalized_shape)?;
        check_param(op, self, bias, "bias", normalized_shape)?;
        check_eps(op, eps)?;
        if !y_dtype_ok(self.dtype, out) {
            return Err(Error::dtype(
                op,
                format!(
                    "cannot write a {out} output of a {} input {:?} (its dtype, or bf16/f16 of f32)",
                    self.dtype, self.shape
                ),
            ));
        }
        let mask: Vec<bool> = (0..self.ndim()).map(|d| d >= lead.len()).collect();
        let desc = NormForward {
            op,
            x: self.clone(),
            out,
            rms,
            split: AxisSplit::new(self, &mask),
            lead,
            n,
            weight: weight.cloned(),
            bias: bias.cloned(),
            eps,
            stats,
        };
        dispatch(&self.device, &desc)
    }

    /// Layer normalisation over the trailing `normalized_shape` dims (any strided input):
    /// `y = (x - mean) / sqrt(var + eps) * weight + bias` with the biased variance. Returns
    /// (y contiguous in x's dtype, mean, rstd), the statistics shaped like the leading dims, in
    /// [`acc_dtype`](crate::acc_dtype). weight/bias: x's dtype, shape
    /// `normalized_shape`. One kernel.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        self.layer_norm_to(normalized_shape, weight, bias, eps, self.dtype)
    }

    /// [`Tensor::layer_norm`] writing y in `out`: x's dtype, or bf16/f16 of an f32 x (rounded
    /// once from the f32 result: what a cast after the norm gives, in the same kernel).
    pub fn layer_norm_to(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        out: DType,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (y, mean, rstd) = self.norm_forward(
            "layer_norm",
            false,
            normalized_shape,
            weight,
            bias,
            eps,
            Stats::MeanRstd,
            out,
        )?;
        let missing = || Error::invalid("layer_norm", "statistics were not computed");
        Ok((y, mean.ok_or_else(missing)?, rstd.ok_or_else(missing)?))
    }

    /// [`Tensor::layer_norm`]'s output alone: no statistics are allocated (inference).
    pub fn layer_norm_inference(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let ns = normalized_shape;
        Ok(self
            .norm_forward(
                "layer_norm",
                false,
                ns,
                weight,
                bias,
                eps,
                Stats::None,
                self.dtype,
            )?
            .0)
    }

    /// [`Tensor::rms_norm`]'s output alone: no statistics are allocated (inference).
    pub fn rms_norm_inference(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let ns = normalized_shape;
        Ok(self
            .norm_forward(
                "rms_norm",
                true,
                ns,
                weight,
                None,
                eps,
                Stats::None,
                self.dtype,
            )?
            .0)
    }

    /// RMS normalisation over the trailing `normalized_shape` dims:
    /// `y = x / sqrt(mean(x^2) + eps) * weight`. Returns (y, rstd) as [`Tensor::layer_norm`]. One kernel.
    pub fn rms_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        self.rms_norm_to(normalized_shape, weight, eps, self.dtype)
    }

    /// [`Tensor::rms_norm`] writing y in `out`, as [`Tensor::layer_norm_to`].
    pub fn rms_norm_to(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: f64,
        out: DType,
    ) -> Result<(Tensor, Tensor)> {
        let (y, _, rstd) = self.norm_forward(
            "rms_norm",
            true,
            normalized_shape,
            weight,
            None,
            eps,
            Stats::Rstd,
            out,
        )?;
        let rstd =
            rstd.ok_or_else(|| Error::invalid("rms_norm", "statistics were not computed"))?;
        Ok((y, rstd))
    }

    /// [`Tensor::layer_norm_backward`] (with `mean`) or [`Tensor::rms_norm_backward`] (without),
    /// whose dx comes back with `plus` added when given (x's shape and dtype: the gradient x has
    /// from its other uses, such as a residual connection), in the same kernel where rows are
    /// contiguous. `dy` is in y's dtype (x's, or 16 bits after [`Tensor::rms_norm_to`]); the
    /// gradients are in x's.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_backward_plus(
        &self,
        dy: &Tensor,
        mean: Option<&Tensor>,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        want_bias: bool,
        plus: Option<&Tensor>,
    ) -> Result<NormGrads> {
        let op = match mean {
            Some(_) => "layer_norm_backward",
            None => "rms_norm_backward",
        };
        let (lead, n) = norm_rows(op, self, normalized_shape)?;
        for (t, what) in [(Some(dy), "dy"), (plus, "plus")] {
            let Some(t) = t else { continue };
            check_device(op, self, t, what)?;
            match what {
                "dy" if y_dtype_ok(self.dtype, t.dtype) => {}
                _ => check_dtype(op, t, what, self.dtype)?,
            }
            if t.shape != self.shape {
                return Err(Error::shape(
                    op,
                    format!("{what} {:?} does not match input {:?}", t.shape, self.shape),
                ));
            }
        }
        if let Some(m) = mean {
            check_stat(op, self, m, "mean", &lead)?;
        }
        check_stat(op, self, rstd, "rstd", &lead)?;
        check_param(op, self, weight, "weight", normalized_shape)?;
        let desc = NormBackward {
            op,
            x: self.clone(),
            dy: dy.clone(),
            mean: mean.cloned(),
            rstd: rstd.clone(),
            normalized_shape: normalized_shape.to_vec(),
            lead,
            n,
            weight: weight.cloned(),
            want_bias,
            plus: plus.cloned(),
        };
        dispatch(&self.device, &desc)
    }

    /// Gradients of [`Tensor::layer_norm`] for input `self` given `dy` and the forward's `mean` and
    /// `rstd`: dx always, dweight when `weight` is given, dbias when `bias` is true. Kernels: one
    /// for dx, two more for the parameter gradients (column sums in row chunks, then over chunks).
    pub fn layer_norm_backward(
        &self,
        dy: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: bool,
    ) -> Result<NormGrads> {
        self.norm_backward_plus(dy, Some(mean), rstd, normalized_shape, weight, bias, None)
    }

    /// Gradients of [`Tensor::rms_norm`] (dx, and dweight when `weight` is given); kernels as
    /// [`Tensor::layer_norm_backward`].
    pub fn rms_norm_backward(
        &self,
        dy: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
    ) -> Result<NormGrads> {
        self.norm_backward_plus(dy, None, rstd, normalized_shape, weight, false, None)
    }
}
