//! Backward rules of layer_norm, rms_norm and training-mode batch_norm (the ops' fused backward kernels).
use crate::tape::{any_tracked, record, record_folding, Var};
use netcl_ops::{DType, NormGrads, Result, Tensor};

/// The gradients in the order of the recorded inputs (x, weight?, bias?).
fn norm_grads(g: NormGrads, has_weight: bool, has_bias: bool) -> Vec<Option<Tensor>> {
    let mut out = vec![Some(g.dx)];
    if has_weight {
        out.push(g.dweight);
    }
    if has_bias {
        out.push(g.dbias);
    }
    out
}

/// `x` widened to its affine parameters' dtype where that is wider: a 16-bit activation (under
/// autocast) normalised with f32 weights computes and returns f32, as PyTorch's autocast runs
/// norms.
#[track_caller]
fn widened(x: &Var, params: [Option<&Var>; 2]) -> Result<Var> {
    match params.into_iter().flatten().map(|p| p.dtype()).next() {
        Some(d) if d.is_float() && x.dtype().is_float() && d.size() > x.dtype().size() => {
            x.to_dtype(d)
        }
        _ => Ok(x.clone()),
    }
}

fn inputs<'a>(x: &'a Var, weight: Option<&'a Var>, bias: Option<&'a Var>) -> Vec<&'a Var> {
    let mut v = vec![x];
    v.extend(weight);
    v.extend(bias);
    v
}

impl Var {
    /// Layer normalisation over the trailing `normalized_shape` dims, with optional affine
    /// weight and bias of that shape.
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Result<Var> {
        self.layer_norm_to(normalized_shape, weight, bias, eps, None)
    }

    /// [`Var::layer_norm`] writing its output in `out` (None: the dtype it computes in): bf16 or
    /// f16 of an f32 norm, rounded once in the norm's kernel, where only products read the output
    /// (they would cast it anyway under autocast); its gradient then arrives in `out`.
    #[track_caller]
    pub fn layer_norm_to(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
        out: Option<DType>,
    ) -> Result<Var> {
        let x = &widened(self, [weight, bias])?;
        let (w, b) = (weight.map(|w| w.value()), bias.map(|b| b.value()));
        let out = out.unwrap_or(x.dtype());
        let all = inputs(x, weight, bias);
        if !any_tracked(&all) {
            // Inference: no statistics, unless the output's dtype differs (the one kernel that
            // writes it keeps them; a cast after the norm would be a second kernel).
            let y = match out == x.dtype() {
                true => x
                    .value()
                    .layer_norm_inference(normalized_shape, w, b, eps)?,
                false => x.value().layer_norm_to(normalized_shape, w, b, eps, out)?.0,
            };
            return Ok(Var::constant(y));
        }
        let (y, mean, rstd) = x.value().layer_norm_to(normalized_shape, w, b, eps, out)?;
        let x = x.value().clone();
        let w = weight.map(|w| w.value().clone());
        let ns = normalized_shape.to_vec();
        let has_bias = bias.is_some();
        // The gradient x has so far (the residual stream's) is added to dx in the same kernel.
        record_folding("layer_norm", &all, y, move |g, _, acc| {
            let plus = acc[0].take();
            let (m, wr) = (Some(&mean), w.as_ref());
            let grads = x.norm_backward_plus(g, m, &rstd, &ns, wr, has_bias, plus.as_ref())?;
            Ok(norm_grads(grads, w.is_some(), has_bias))
        })
    }

    /// RMS normalisation over the trailing `normalized_shape` dims, with an optional weight.
    #[track_caller]
    pub fn rms_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Var>,
        eps: f64,
    ) -> Result<Var> {
        self.rms_norm_to(normalized_shape, weight, eps, None)
    }

    /// [`Var::rms_norm`] writing its output in `out`, as [`Var::layer_norm_to`].
    #[track_caller]
    pub fn rms_norm_to(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Var>,
        eps: f64,
        out: Option<DType>,
    ) -> Result<Var> {
        let xv = &widened(self, [weight, None])?;
        let w = weight.map(|w| w.value());
        let out = out.unwrap_or(xv.dtype());
        if !any_tracked(&inputs(xv, weight, None)) {
            // Inference, as in layer_norm_to.
            let y = match out == xv.dtype() {
                true => xv.value().rms_norm_inference(normalized_shape, w, eps)?,
                false => xv.value().rms_norm_to(normalized_shape, w, eps, out)?.0,
            };
            return Ok(Var::constant(y));
        }
        let (y, rstd) = xv.value().rms_norm_to(normalized_shape, w, eps, out)?;
        let x = xv.value().clone();
        let w = weight.map(|w| w.value().clone());
        let ns = normalized_shape.to_vec();
        record_folding(
            "rms_norm",
            &inputs(xv, weight, None),
            y,
            move |g, _, acc| {
                let plus = acc[0].take();
                let wr = w.as_ref();
                let grads = x.norm_backward_plus(g, None, &rstd, &ns, wr, false, plus.as_ref())?;
                Ok(norm_grads(grads, w.is_some(), false))
            },
        )
    }

    /// Training-mode batch normalisation of (N, C, ...) over every dim but 1, with optional
    /// affine weight/bias (C) and running statistics updated in place with `momentum`.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn batch_norm_train(
        &self,
        weight: Option<&Var>,
        bias: Option<&Var>,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        momentum: f64,
        eps: f64,
    ) -> Result<Var> {
        let bn = self.value().batch_norm_train(
            weight.map(|w| w.value()),
            bias.map(|b| b.value()),
            running_mean,
            running_var,
            momentum,
            eps,
        )?;
        let x = self.value().clone();
        let w = weight.map(|w| w.value().clone());
        let has_bias = bias.is_some();
        let (mean, invstd) = (bn.save_mean, bn.save_invstd);
        record(
            "batch_norm",
            &inputs(self, weight, bias),
            bn.y,
            move |g, _| {
                let grads = x.batch_norm_backward(g, &mean, &invstd, w.as_ref())?;
                Ok(norm_grads(grads, w.is_some(), has_bias))
            },
        )
    }

    /// Eval-mode batch normalisation with fixed running statistics (gradients flow to x and the
    /// affine parameters through ordinary elementwise ops).
    #[track_caller]
    pub fn batch_norm_eval(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Result<Var> {
        if !any_tracked(&inputs(self, weight, bias)) {
            let y = self.value().batch_norm_eval(
                running_mean,
                running_var,
                weight.map(|w| w.value()),
                bias.map(|b| b.value()),
                eps,
            )?;
            return Ok(Var::constant(y));
        }
        let c = running_mean.numel();
        let mut bshape = vec![1; self.ndim()];
        if self.ndim() > 1 {
            bshape[1] = c;
        }
        let invstd = running_var.add_scalar(eps)?.rsqrt()?.reshape(&bshape)?;
        let mean = running_mean.reshape(&bshape)?;
        let mut y = self
            .sub(&Var::constant(mean))?
            .mul(&Var::constant(invstd))?;
        if let Some(w) = weight {
            y = y.mul(&w.reshape(&bshape)?)?;
        }
        if let Some(b) = bias {
            y = y.add(&b.reshape(&bshape)?)?;
        }
        Ok(y)
    }
}
