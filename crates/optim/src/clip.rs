//! Gradient clipping by total L2 norm (PyTorch's `clip_grad_norm_`): norms reduced on the devices, one fused scaling kernel per gradient.
use crate::Optimizer;
use netcl_autograd::Parameter;
use netcl_ops::{fused, DType, Device, Error, Expr, Result, Tensor};

/// Most tensors one fused sum reads (keeps the kernel's argument list small on every device).
const SUM_FAN_IN: usize = 16;

/// PyTorch's guard against division by zero in the clip factor.
const CLIP_EPS: f64 = 1e-6;

/// The dtype squares are summed in: f64 for f64 gradients, f32 for every other float dtype.
fn acc_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Per-gradient sums of squares (0-dim tensors) of the gradients on one device.
struct DeviceSums {
    device: Device,
    acc: DType,
    sums: Vec<Tensor>,
}

fn check_max_norm(op: &str, max_norm: f64) -> Result<()> {
    if max_norm >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("max_norm must be >= 0, got {max_norm}"),
        ))
    }
}

/// The parameters that have a gradient, with it.
type Grads = Vec<(Parameter, Tensor)>;

/// The gradients present, with their sums of squares grouped by device.
fn squared_sums(params: &[Parameter]) -> Result<(Grads, Vec<DeviceSums>)> {
    let grads: Vec<(Parameter, Tensor)> = params
        .iter()
        .filter_map(|p| Some((p.clone(), p.grad()?)))
        .collect();
    let mut groups: Vec<DeviceSums> = Vec::new();
    for (_, g) in &grads {
        let acc = acc_dtype(g.dtype());
        // g: (n...) -> squares (n...) in the accumulation dtype -> sum: ()
        let sq = fused(&[g], &[Expr::input(0).cast(acc).square()])?.remove(0);
        let sum = sq.sum_all()?;
        match groups.iter_mut().find(|s| s.device == *g.device()) {
            Some(s) => {
                if acc == DType::F64 {
                    s.acc = DType::F64;
                }
                s.sums.push(sum);
            }
            None => groups.push(DeviceSums {
                device: g.device().clone(),
                acc,
                sums: vec![sum],
            }),
        }
    }
    Ok((grads, groups))
}

/// The sum of the 0-dim `terms` (one device) in `acc`, with `finish` applied to the total, using
/// fused kernels of at most `SUM_FAN_IN` inputs. A single term with no `finish` is returned as is.
fn sum_terms(terms: &[Tensor], acc: DType, finish: Option<fn(Expr) -> Expr>) -> Result<Tensor> {
    if terms.len() > SUM_FAN_IN {
        let partial = terms
            .chunks(SUM_FAN_IN)
            .map(|c| sum_terms(c, acc, None))
            .collect::<Result<Vec<_>>>()?;
        return sum_terms(&partial, acc, finish);
    }
    if let ([t], None) = (terms, finish) {
        if t.dtype() == acc {
            return Ok(t.clone());
        }
    }
    let total = (1..terms.len()).fold(Expr::input(0).cast(acc), |e, i| {
        e + Expr::input(i).cast(acc)
    });
    let total = match finish {
        Some(f) => f(total),
        None => total,
    };
    let refs: Vec<&Tensor> = terms.iter().collect();
    // terms: k tensors of shape () -> ()
    Ok(fused(&refs, &[total])?.remove(0))
}

/// The total L2 norm of all gradients (parameters without a gradient count as zero), read back
/// once per device.
pub fn grad_norm(params: &[Parameter]) -> Result<f64> {
    let (_, groups) = squared_sums(params)?;
    Ok(squared_total(&groups)?.sqrt())
}

fn squared_total(groups: &[DeviceSums]) -> Result<f64> {
    let mut total_sq = 0.0;
    for g in groups {
        let t = sum_terms(&g.sums, g.acc, None)?;
        total_sq += t.to_vec_f64()?.first().copied().unwrap_or(0.0);
    }
    Ok(total_sq)
}

/// Scale all gradients by `min(1, max_norm / (total_norm + 1e-6))` when that factor is below 1
/// (or NaN, as in PyTorch), and return the total L2 norm of the gradients before clipping.
///
/// Norms are reduced on each device and the total is read back once per device. Clipped
/// gradients are new tensors (one fused kernel each) set with `Parameter::set_grad`: gradient
/// tensors may be shared between parameters or with the caller, so they are never scaled in
/// place. Parameters without a gradient are skipped.
pub fn clip_grad_norm(params: &[Parameter], max_norm: f64) -> Result<f64> {
    clip_over_ranks("clip_grad_norm", params, max_norm, |_| Ok(()))
}

/// [`clip_grad_norm`] of an optimizer's parameters, the norm taken over every rank that steps
/// it together ([`Optimizer::sum_over_ranks`]): a sharded optimizer's ranks each hold the
/// gradients of their shard only, so clip those with this, not with `clip_grad_norm`. Collective
/// for a sharded optimizer.
pub fn clip_grad_norm_of(optimizer: &dyn Optimizer, max_norm: f64) -> Result<f64> {
    clip_over_ranks("clip_grad_norm_of", optimizer.params(), max_norm, |v| {
        optimizer.sum_over_ranks(v)
    })
}

fn clip_over_ranks(
    op: &str,
    params: &[Parameter],
    max_norm: f64,
    sum_over_ranks: impl FnOnce(&mut [f64]) -> Result<()>,
) -> Result<f64> {
    check_max_norm(op, max_norm)?;
    let (grads, groups) = squared_sums(params)?;
    let mut total_sq = [squared_total(&groups)?];
    sum_over_ranks(&mut total_sq)?;
    let total = total_sq[0].sqrt();
    let coef = max_norm / (total + CLIP_EPS);
    // A NaN factor (NaN norm) scales too, making the gradients NaN as in PyTorch.
    if coef < 1.0 || coef.is_nan() {
        for (p, g) in &grads {
            // g: (n...) -> (n...)
            let scaled = fused(&[g], &[Expr::input(0) * coef])?.remove(0);
            p.set_grad(Some(scaled))?;
        }
    }
    Ok(total)
}

/// `clip_grad_norm` without reading anything back: the total norm stays on the device as a
/// 0-dim tensor (f64 when any gradient is f64, else f32), and every gradient is replaced by
/// `grad * min(1, max_norm / (norm + 1e-6))` with the factor computed inside its scaling
/// kernel. All gradients must be on one device. Returns `None` (and does nothing) when no
/// parameter has a gradient.
pub fn clip_grad_norm_on_device(params: &[Parameter], max_norm: f64) -> Result<Option<Tensor>> {
    let op = "clip_grad_norm_on_device";
    check_max_norm(op, max_norm)?;
    let (grads, groups) = squared_sums(params)?;
    let group = match groups.as_slice() {
        [] => return Ok(None),
        [g] => g,
        [a, b, ..] => {
            return Err(Error::device(
                op,
                format!(
                "gradients are on {} and {}; use clip_grad_norm, which reads one norm per device",
                a.device, b.device
            ),
            ))
        }
    };
    let norm = sum_terms(&group.sums, group.acc, Some(Expr::sqrt))?;
    for (p, g) in &grads {
        let coef = (max_norm / (Expr::input(1) + CLIP_EPS))
            .min(1.0)
            .cast(g.dtype());
        // g: (n...), norm: () -> (n...)
        let scaled = fused(&[g, &norm], &[Expr::input(0) * coef])?.remove(0);
        p.set_grad(Some(scaled))?;
    }
    Ok(Some(norm))
}
