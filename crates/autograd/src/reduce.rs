//! Backward rules of the reductions (sum, mean, max, min, var, logsumexp) over any axes or all of them.
use crate::tape::{record, Var};
use netcl_ops::{fused, Error, Expr, Result, Tensor};

/// Sorted, de-duplicated axes, checked against `ndim`.
fn norm_axes(op: &str, axes: &[usize], ndim: usize) -> Result<Vec<usize>> {
    let mut a = axes.to_vec();
    a.sort_unstable();
    a.dedup();
    if let Some(&bad) = a.iter().find(|&&d| d >= ndim) {
        return Err(Error::invalid(
            op,
            format!("axis {bad} out of range for {ndim} dims"),
        ));
    }
    Ok(a)
}

/// `t` (a reduction's result) with the reduced axes present as size 1, so it broadcasts over
/// the input.
fn keep(t: &Tensor, in_shape: &[usize], axes: &[usize]) -> Result<Tensor> {
    let shape: Vec<usize> = in_shape
        .iter()
        .enumerate()
        .map(|(i, &s)| if axes.contains(&i) { 1 } else { s })
        .collect();
    t.reshape(&shape)
}

/// Which reduction, with what its rule needs.
#[derive(Clone, Copy)]
enum Kind {
    Sum,
    Mean,
    Extreme(bool),
    Var(f64),
    LogSumExp,
}

impl Var {
    #[track_caller]
    fn reduce_var(
        &self,
        op: &'static str,
        axes: &[usize],
        keepdim: bool,
        kind: Kind,
    ) -> Result<Var> {
        let x = self.value();
        let axes = norm_axes(op, axes, x.ndim())?;
        let y = match kind {
            Kind::Sum => x.sum(&axes, keepdim)?,
            Kind::Mean => x.mean(&axes, keepdim)?,
            Kind::Extreme(true) => x.max(&axes, keepdim)?,
            Kind::Extreme(false) => x.min(&axes, keepdim)?,
            Kind::Var(c) => x.var(&axes, c, keepdim)?,
            Kind::LogSumExp => x.logsumexp(&axes, keepdim)?,
        };
        let (xs, ys) = (x.clone(), y.clone());
        let count: usize = axes.iter().map(|&a| x.shape()[a]).product();
        record(op, &[self], y, move |g, _| {
            let shape = xs.shape().to_vec();
            let gk = keep(g, &shape, &axes)?;
            let yk = keep(&ys, &shape, &axes)?;
            let (xi, yi, gi) = (Expr::input(0), Expr::input(1), Expr::input(2));
            let dx = match kind {
                Kind::Sum => gk.broadcast_to(&shape)?.contiguous()?,
                // One kernel over the broadcast view: scale and expand together.
                Kind::Mean => fused(
                    &[&gk.broadcast_to(&shape)?],
                    &[Expr::input(0) * (1.0 / count as f64)],
                )?
                .remove(0),
                Kind::Extreme(_) => {
                    // Ties share the gradient evenly.
                    let hit = fused(&[&xs, &yk], &[xi.eq(yi).cast(xs.dtype())])?.remove(0);
                    let ties = hit.sum(&axes, true)?;
                    fused(
                        &[&hit, &ties, &gk],
                        &[Expr::input(0) * Expr::input(2) / Expr::input(1)],
                    )?
                    .remove(0)
                }
                Kind::Var(c) => {
                    let mean = xs.mean(&axes, true)?;
                    let k = 2.0 / (count as f64 - c);
                    fused(&[&xs, &mean, &gk], &[(xi - yi) * gi * k])?.remove(0)
                }
                Kind::LogSumExp => fused(&[&xs, &yk, &gk], &[(xi - yi).exp() * gi])?.remove(0),
            };
            Ok(vec![Some(dx)])
        })
    }

    fn all_axes(&self) -> Vec<usize> {
        (0..self.ndim()).collect()
    }
}

macro_rules! reduce_vars {
    ($($fn:ident, $all:ident => $kind:expr;)*) => {
        impl Var {
            $(
                #[doc = concat!("`", stringify!($fn), "` over `axes` (recorded).")]
                #[track_caller]
                pub fn $fn(&self, axes: &[usize], keepdim: bool) -> Result<Var> {
                    self.reduce_var(stringify!($fn), axes, keepdim, $kind)
                }
                #[doc = concat!("`", stringify!($fn), "` over all elements, as a 0-dim Var.")]
                #[track_caller]
                pub fn $all(&self) -> Result<Var> {
                    self.reduce_var(stringify!($all), &self.all_axes(), false, $kind)
                }
            )*
        }
    };
}

reduce_vars!(
    sum, sum_all => Kind::Sum;
    mean, mean_all => Kind::Mean;
    max, max_all => Kind::Extreme(true);
    min, min_all => Kind::Extreme(false);
    logsumexp, logsumexp_all => Kind::LogSumExp;
);

impl Var {
    /// Variance over `axes` with `correction` (1 for the unbiased estimate).
    #[track_caller]
    pub fn var(&self, axes: &[usize], correction: f64, keepdim: bool) -> Result<Var> {
        self.reduce_var("var", axes, keepdim, Kind::Var(correction))
    }
}
