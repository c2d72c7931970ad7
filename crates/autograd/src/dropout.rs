//! Backward rule of dropout (the saved keep-mask, scaled).
use crate::tape::{record, Var};
use netcl_ops::{fused, Expr, Generator, Result};

impl Var {
    /// Dropout with drop probability `p` (identity when `p == 0`); the mask comes from `gen`.
    #[track_caller]
    pub fn dropout(&self, p: f64, gen: &mut Generator) -> Result<Var> {
        if p == 0.0 {
            return Ok(self.clone());
        }
        let (y, mask) = self.value().dropout(p, gen)?;
        let scale = if p >= 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
        record("dropout", &[self], y, move |g, _| {
            let e = Expr::input(0) * Expr::input(1) * scale;
            Ok(vec![Some(fused(&[g, &mask], &[e])?.remove(0))])
        })
    }
}
