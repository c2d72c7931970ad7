//! Anomaly detection (`NETCL_DEBUG=nan`, `debug::detect_anomaly`): NaN/Inf checks of recorded op outputs and backward gradients, with the op, its inputs' shapes and the creation site.
use netcl_ops::{Error, Result, Tensor};
use std::panic::Location;

/// Where a value was created: the caller's line of the recorded op, carried down through
/// `#[track_caller]` (exact in release builds too, where inlining changes backtraces).
pub(crate) struct Site(&'static Location<'static>);

impl Site {
    /// The location of the outermost `#[track_caller]` call that led here: the caller's code.
    #[track_caller]
    pub(crate) fn here() -> Site {
        Site(Location::caller())
    }

    /// `file:line:col` of the call that recorded the op.
    fn describe(&self) -> String {
        self.0.to_string()
    }
}

/// The first NaN or infinity of `t`, as (position, value, how many elements are non-finite);
/// `None` for finite values and integer dtypes. One reduction and a scalar read on the device;
/// the whole tensor is read only when the sum is not finite.
fn first_non_finite(t: &Tensor) -> Result<Option<(Vec<usize>, f64, usize)>> {
    if !t.dtype().is_float() || t.numel() == 0 {
        return Ok(None);
    }
    let sum = t.sum_all()?.to_vec_f64()?;
    if sum.first().is_none_or(|s| s.is_finite()) {
        return Ok(None);
    }
    // NaN/Inf in the sum: an element is non-finite, or finite values overflowed the sum.
    let values = t.to_vec_f64()?;
    let count = values.iter().filter(|v| !v.is_finite()).count();
    let Some(flat) = values.iter().position(|v| !v.is_finite()) else {
        return Ok(None);
    };
    let mut index = vec![0; t.ndim()];
    let mut rest = flat;
    for (d, &n) in t.shape().iter().enumerate().rev() {
        index[d] = rest % n;
        rest /= n;
    }
    Ok(Some((index, values[flat], count)))
}

fn shapes(values: &[(&Tensor, &str)]) -> String {
    values
        .iter()
        .map(|(t, name)| format!("{name} {} {:?}", t.dtype(), t.shape()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A recorded op's output: an error naming `op`, its inputs and the caller's line if it holds a
/// NaN or an infinity (and which inputs already held one).
#[track_caller]
pub(crate) fn check_forward(op: &str, inputs: &[&Tensor], value: &Tensor) -> Result<()> {
    let Some((index, bad, count)) = first_non_finite(value)? else {
        return Ok(());
    };
    let mut already = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        if first_non_finite(t)?.is_some() {
            already.push(format!("input {i}"));
        }
    }
    let origin = if already.is_empty() {
        "its inputs are finite, so this op produced it".to_string()
    } else {
        format!(
            "{} already held NaN/Inf (it came from outside the recorded ops: a parameter, a \
             constant or an op on plain Tensors)",
            already.join(" and ")
        )
    };
    let names: Vec<String> = (0..inputs.len()).map(|i| format!("input {i}")).collect();
    let listed: Vec<(&Tensor, &str)> = inputs
        .iter()
        .zip(&names)
        .map(|(t, n)| (*t, n.as_str()))
        .collect();
    Err(Error::NonFinite {
        op: op.to_string(),
        msg: format!(
            "the output {} {:?} has {count} NaN/Inf element(s), the first {bad} at {index:?}; {origin}. \
             Inputs: {}. Created at {}",
            value.dtype(),
            value.shape(),
            shapes(&listed),
            Site::here().describe()
        ),
    })
}

/// A backward rule's gradient for input `input` of `op`: an error if it holds a NaN or an
/// infinity, naming the op's input and output shapes (`shapes`: what the node recorded), the
/// output gradient's state and where the op was recorded.
pub(crate) fn check_backward(
    op: &str,
    input: usize,
    grad: &Tensor,
    output_grad: &Tensor,
    inputs: &str,
    site: Option<&Site>,
) -> Result<()> {
    let Some((index, bad, count)) = first_non_finite(grad)? else {
        return Ok(());
    };
    let upstream = match first_non_finite(output_grad)? {
        None => "the output's gradient is finite, so this rule produced it",
        Some(_) => "the output's gradient already held NaN/Inf",
    };
    let site = site.map_or_else(
        || "unknown (the op was recorded with the debug mode off)".to_string(),
        Site::describe,
    );
    Err(Error::NonFinite {
        op: format!("backward of {op}"),
        msg: format!(
            "the gradient for input {input} ({} {:?}) has {count} NaN/Inf element(s), the first \
             {bad} at {index:?}; {upstream}. Inputs: {inputs}. The op was created at {site}",
            grad.dtype(),
            grad.shape()
        ),
    })
}
