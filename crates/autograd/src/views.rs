//! Backward rules of the view ops (reshape, permute, transpose, narrow, slice, broadcast, squeeze, unsqueeze, contiguous).
use crate::binary::sum_to;
use crate::parts::Part;
use crate::tape::{record, record_part, Var};
use netcl_ops::{fused_into, Expr, Result, Tensor};

/// A zero tensor shaped like the input with `g` written into the part `part` selects.
fn scatter_into_zeros(
    g: &Tensor,
    shape: &[usize],
    part: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let z = Tensor::zeros(shape, g.dtype(), g.device())?;
    fused_into(&[g], &[(Expr::input(0), &part(&z)?)])?;
    Ok(z)
}

/// `g` in a layout `reshape` accepts (reshape of a non-contiguous gradient needs a copy).
fn reshaped(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    match g.reshape(shape) {
        Ok(t) => Ok(t),
        Err(_) => g.contiguous()?.reshape(shape),
    }
}

impl Var {
    /// The same elements in a new shape.
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Result<Var> {
        let y = reshaped(self.value(), shape)?;
        let s = self.shape().to_vec();
        record("reshape", &[self], y, move |g, _| {
            Ok(vec![Some(reshaped(g, &s)?)])
        })
    }

    /// All dims from `start` on merged into one (Flatten).
    #[track_caller]
    pub fn flatten(&self, start: usize) -> Result<Var> {
        let s = self.shape();
        let start = start.min(s.len());
        let mut shape = s[..start].to_vec();
        shape.push(s[start..].iter().product());
        self.reshape(&shape)
    }

    #[track_caller]
    pub fn permute(&self, dims: &[usize]) -> Result<Var> {
        let y = self.value().permute(dims)?;
        let mut inverse = vec![0; dims.len()];
        for (i, &d) in dims.iter().enumerate() {
            inverse[d] = i;
        }
        record("permute", &[self], y, move |g, _| {
            Ok(vec![Some(g.permute(&inverse)?)])
        })
    }

    #[track_caller]
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Var> {
        let y = self.value().transpose(d0, d1)?;
        record("transpose", &[self], y, move |g, _| {
            Ok(vec![Some(g.transpose(d0, d1)?)])
        })
    }

    /// `len` entries of `dim` from `start`, a view; its gradient becomes a part of this Var's,
    /// gathered with those of its other views (one concat where they tile it).
    #[track_caller]
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Var> {
        let y = self.value().narrow(dim, start, len)?;
        record_part("narrow", self, y, Part { dim, start, len })
    }

    #[track_caller]
    pub fn slice(&self, dim: usize, start: usize, end: usize, step: usize) -> Result<Var> {
        let y = self.value().slice(dim, start, end, step)?;
        let s = self.shape().to_vec();
        record("slice", &[self], y, move |g, _| {
            Ok(vec![Some(scatter_into_zeros(g, &s, |z| {
                z.slice(dim, start, end, step)
            })?)])
        })
    }

    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Var> {
        let y = self.value().broadcast_to(shape)?;
        let s = self.shape().to_vec();
        record("broadcast_to", &[self], y, move |g, _| {
            Ok(vec![Some(sum_to(g, &s)?)])
        })
    }

    #[track_caller]
    pub fn squeeze(&self, dim: usize) -> Result<Var> {
        let y = self.value().squeeze(dim)?;
        record("squeeze", &[self], y, move |g, _| {
            Ok(vec![Some(g.unsqueeze(dim)?)])
        })
    }

    #[track_caller]
    pub fn unsqueeze(&self, dim: usize) -> Result<Var> {
        let y = self.value().unsqueeze(dim)?;
        record("unsqueeze", &[self], y, move |g, _| {
            Ok(vec![Some(g.squeeze(dim)?)])
        })
    }

    /// A contiguous copy when needed (the gradient passes through unchanged).
    #[track_caller]
    pub fn contiguous(&self) -> Result<Var> {
        if self.value().is_contiguous() {
            return Ok(self.clone());
        }
        let y = self.value().contiguous()?;
        record("contiguous", &[self], y, |g, _| Ok(vec![Some(g.clone())]))
    }
}
