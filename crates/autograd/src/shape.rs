//! Backward rules of concat, stack, split and pad.
use crate::tape::{record, Var};
use netcl_ops::{Error, Result, Tensor};

impl Var {
    /// Concatenation along `dim`; each input's gradient is its slice of the output gradient.
    /// Values that already lie side by side in one storage ([`Tensor::joined`]: parameters
    /// allocated as rows of one tensor, say) are joined as a view, without a copy, as PyTorch's
    /// views share storage: writing into the result in place writes into the inputs, and an
    /// in-place write to an input between forward and backward is the tape's version error
    /// where the result was saved for backward.
    #[track_caller]
    pub fn concat(vars: &[&Var], dim: usize) -> Result<Var> {
        let values: Vec<&Tensor> = vars.iter().map(|v| v.value()).collect();
        let y = match Tensor::joined(&values, dim) {
            Some(view) => view,
            None => Tensor::concat(&values, dim)?,
        };
        let sizes: Vec<usize> = vars
            .iter()
            .map(|v| v.shape().get(dim).copied().unwrap_or(0))
            .collect();
        record("concat", vars, y, move |g, need| {
            let parts = g.split_sizes(&sizes, dim)?;
            Ok(parts
                .into_iter()
                .zip(need)
                .map(|(p, &n)| n.then_some(p))
                .collect())
        })
    }

    /// Stacking along a new `dim`.
    #[track_caller]
    pub fn stack(vars: &[&Var], dim: usize) -> Result<Var> {
        // A loop, not a closure: the recorded site stays the caller's (`#[track_caller]`).
        let mut expanded = Vec::with_capacity(vars.len());
        for v in vars {
            expanded.push(v.unsqueeze(dim)?);
        }
        let refs: Vec<&Var> = expanded.iter().collect();
        Var::concat(&refs, dim)
    }

    /// Consecutive pieces of the given sizes along `dim` (views, each recorded).
    #[track_caller]
    pub fn split_sizes(&self, sizes: &[usize], dim: usize) -> Result<Vec<Var>> {
        let total: usize = sizes.iter().sum();
        if dim >= self.ndim() || total != self.shape()[dim] {
            return Err(Error::shape(
                "split",
                format!("sizes {sizes:?} along dim {dim} of {:?}", self.shape()),
            ));
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &s in sizes {
            out.push(self.narrow(dim, start, s)?);
            start += s;
        }
        Ok(out)
    }

    /// Chunks of `size` along `dim` (the last may be shorter), as the op library splits them.
    #[track_caller]
    pub fn split(&self, size: usize, dim: usize) -> Result<Vec<Var>> {
        let sizes: Vec<usize> = self
            .value()
            .split(size, dim)?
            .iter()
            .map(|t| t.shape()[dim])
            .collect();
        self.split_sizes(&sizes, dim)
    }

    /// Padding with a constant (`pads[0]` is the last dim, as torch.nn.functional.pad).
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Result<Var> {
        let y = self.value().pad(pads, value)?;
        let shape = self.shape().to_vec();
        let pads = pads.to_vec();
        record("pad", &[self], y, move |g, _| {
            let mut gx = g.clone();
            for (i, &(before, _)) in pads.iter().enumerate() {
                let dim = shape.len() - 1 - i;
                gx = gx.narrow(dim, before, shape[dim])?;
            }
            Ok(vec![Some(gx)])
        })
    }
}
