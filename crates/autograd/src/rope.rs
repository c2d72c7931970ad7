//! Backward rule of the rotary position embedding (the inverse rotation).
use crate::tape::{record, Var};
use netcl_ops::Result;

impl Var {
    /// Rotary position embedding of x: (B, T, H, Dh) for positions `pos_offset + t`.
    pub fn rope(&self, pos_offset: usize, theta: f64) -> Result<Var> {
        let y = self.value().rope(pos_offset, theta)?;
        record("rope", &[self], y, move |g, _| {
            Ok(vec![Some(g.rope_backward(pos_offset, theta)?)])
        })
    }
}
