//! Activation checkpointing: `checkpoint` runs a function without keeping its activations and recomputes it in backward (as torch.utils.checkpoint), replaying its random draws and autocast policy.
use crate::autocast::{autocast_dtype, with_autocast};
use crate::tape::{record, Tape, Var};
use netcl_ops::{record_draws, replay_draws, Error, Result, Tensor};

/// `f(tape, inputs)` without keeping its activations: the forward runs on a tape that records
/// nothing (each intermediate is freed as soon as `f` no longer needs it) and one node holding
/// only `inputs` and the trainable parameters `f` read is recorded on `tape`. Its backward runs
/// `f` again on a recording tape, under the autocast policy and with the random draws
/// (dropout masks) of the forward, and backpropagates the output's gradient through that graph;
/// the gradients of `inputs` and of the parameters are then those without checkpointing, bit
/// for bit on the same device (the same kernels on the same values). Memory: one function's
/// activations at a time during backward instead of all of them from forward to backward, for
/// one more forward of `f`.
///
/// `f` must compute the same thing each time it is called: the same ops on the same values
/// (a recomputed output of another shape or dtype, or other random draws, is an error). It
/// may read parameters (`tape.param`) and constants it captured, not tracked Vars of the outer
/// tape (those are an error: pass them as inputs). On a tape that does not record, `f` simply
/// runs. Nesting is allowed.
pub fn checkpoint<F>(tape: &Tape, inputs: &[Var], f: F) -> Result<Var>
where
    F: Fn(&Tape, &[Var]) -> Result<Var> + 'static,
{
    if !tape.is_recording() {
        return f(tape, inputs);
    }
    let probe = Tape::probe();
    let detached: Vec<Var> = inputs.iter().map(Var::detach).collect();
    let cast = autocast_dtype();
    let (y, draws) = record_draws(|| f(&probe, &detached));
    let y = y?;
    // The parameters f read become inputs of the node: their gradients come back through the
    // outer tape (hooks, gradient buffers and the all-or-nothing update included).
    let params = probe.seen_params();
    let mut vars: Vec<Var> = inputs.to_vec();
    vars.extend(params.iter().map(|p| tape.param(p)));
    let refs: Vec<&Var> = vars.iter().collect();
    let values: Vec<Tensor> = inputs.iter().map(|v| v.value().clone()).collect();
    let (shape, dtype) = (y.shape().to_vec(), y.dtype());
    record("checkpoint", &refs, y.into_value(), move |g, need| {
        let inner = Tape::with_param_leaves();
        let xs = values
            .iter()
            .zip(need)
            .map(|(v, &needed)| match needed {
                true => inner.leaf(v),
                false => Ok(Var::constant(v.clone())),
            })
            .collect::<Result<Vec<_>>>()?;
        let ps: Vec<Var> = params.iter().map(|p| inner.param(p)).collect();
        let y = with_autocast(cast, || replay_draws(&draws, || f(&inner, &xs)))?;
        if y.shape() != shape.as_slice() || y.dtype() != dtype {
            return Err(Error::invalid(
                "checkpoint",
                format!(
                    "the recomputed output is {} {:?}, the forward's was {dtype} {shape:?}: the \
                     function must compute the same thing each time",
                    y.dtype(),
                    y.shape()
                ),
            ));
        }
        if !y.is_tracked() {
            return Ok(vec![None; xs.len() + ps.len()]);
        }
        let grads = inner.backward_with(&y, g)?;
        Ok(xs
            .iter()
            .chain(&ps)
            .map(|v| grads.get(v).cloned())
            .collect())
    })
}
