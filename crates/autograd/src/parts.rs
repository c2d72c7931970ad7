//! Gradients of narrow views: each view's gradient is kept as a part of its input's, and the parts are gathered once the input's turn comes (one concat where they tile it), instead of a zero tensor per view summed in full.
use netcl_ops::{fused, fused_into, Expr, Result, Tensor};

/// Where a narrow view lies in its input: `len` entries of `dim` from `start`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Part {
    pub dim: usize,
    pub start: usize,
    pub len: usize,
}

/// The gradient of a value of `shape` from its gradient through other ops (`full`) and those of
/// narrow views of it (`parts`): the parts in order along one dim when they tile the value and
/// nothing else reached it, else their sum into a copy of `full` (or zeros).
pub(crate) fn gather(
    full: Option<Tensor>,
    mut parts: Vec<(Part, Tensor)>,
    shape: &[usize],
) -> Result<Option<Tensor>> {
    if parts.is_empty() {
        return Ok(full);
    }
    parts.sort_by_key(|(p, _)| (p.dim, p.start));
    let dim = parts[0].0.dim;
    let mut end = 0;
    let tiles = full.is_none()
        && parts.iter().all(|(p, _)| {
            let next = p.dim == dim && p.start == end;
            end = p.start + p.len;
            next
        })
        && end == shape[dim];
    if tiles {
        let pieces: Vec<&Tensor> = parts.iter().map(|(_, g)| g).collect();
        return Ok(Some(Tensor::concat(&pieces, dim)?));
    }
    let first = &parts[0].1;
    let out = match full {
        Some(f) => fused(&[&f], &[Expr::input(0)])?.remove(0),
        None => Tensor::zeros(shape, first.dtype(), first.device())?,
    };
    for (p, g) in &parts {
        let view = out.narrow(p.dim, p.start, p.len)?;
        fused_into(&[&view, g], &[(Expr::input(0) + Expr::input(1), &view)])?;
    }
    Ok(Some(out))
}
