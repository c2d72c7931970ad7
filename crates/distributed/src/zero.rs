//! ZeRO stage 1: each rank keeps the optimizer state of its own share of the parameters, steps only those, and the ranks then exchange the updated parameters.
use crate::ddp::DataParallel;
use crate::group::Comm;
use crate::reduce::ReduceOp;
use netcl_autograd::Parameter;
use netcl_core_devices::{Error, Result};
use netcl_ops::{fused_into_groups, Expr, FusedGroup, Tensor};
use netcl_optim::Optimizer;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ops::Range;

/// An optimizer sharded across the ranks of a [`DataParallel`] group (ZeRO-1, as
/// DeepSpeed's stage 1 or PyTorch's `ZeroRedundancyOptimizer`): the trainable parameters are
/// cut into one contiguous run per rank (in the gradient buffer's order, balanced by element
/// count) and each rank's inner optimizer holds the state (AdamW's two moments: 8 bytes a
/// parameter) of its run only.
///
/// `step` runs the inner optimizer on this rank's parameters, then every rank receives the
/// others' updated parameters: the rank writes its own into its run of the (no longer needed)
/// gradient buffer and the runs are gathered ([`Comm::all_gather_runs`]), so no memory beyond
/// the gradients is used. Gradients are cleared by `step`.
/// Every rank must call `step` (collective). Equal to the unsharded optimizer: the update of
/// each element is the same kernel on the same values.
///
/// Gradients: once a `DataParallel` has a sharded optimizer, its backward reduce-scatters
/// (between OpenCL ranks the relay copies back only this rank's run of the reduced gradients;
/// the other paths reduce everything) and drops the gradients of the parameters this rank does
/// not own, which were not reduced. So clip with
/// [`clip_grad_norm_of`](netcl_optim::clip_grad_norm_of)`(&opt, max)` (the norm over every
/// rank's shard), not with `clip_grad_norm` over the parameters; `GradScaler` agrees on
/// overflows across ranks by itself.
///
/// Checkpoints: `state_tensors` names this rank's state by the parameter's position among all
/// (in the gradient buffer's order, whatever order `make` gave the inner optimizer) and
/// `hyper_params` records the shard; [`DataParallel::save_checkpoint`] saves every rank's shard
/// beside rank 0's checkpoint and [`DataParallel::load_checkpoint`] gives each rank its own back,
/// or, on a group of another size, every rank the state of the parameters it now owns.
pub struct ShardedOptimizer<'c, O: Optimizer> {
    comm: &'c Comm,
    inner: O,
    /// Every trainable parameter and its first element in `flat` (in the buffer's order).
    layout: Vec<(Parameter, usize)>,
    all: Vec<Parameter>,
    /// Positions in `layout` this rank owns.
    owned: Range<usize>,
    /// The elements of `flat` each rank's parameters fill.
    runs: Vec<Range<usize>>,
    /// The layout position of each of the inner optimizer's parameters (its own order, which
    /// `make` chose: parameter groups may reorder them).
    global_of: Vec<usize>,
    flat: Tensor,
}

/// The runs of `layout` (first elements, in order, of a buffer of `total` elements) each of
/// `ranks` owns: parameter i goes to the rank whose equal share of `total` holds its first
/// element, so the runs are contiguous and within one parameter of balanced.
pub fn shard_owners(starts: &[usize], total: usize, ranks: usize) -> Vec<Range<usize>> {
    let owner = |at: usize| (at * ranks / total.max(1)).min(ranks - 1);
    (0..ranks)
        .map(|r| {
            let first = starts
                .iter()
                .position(|&s| owner(s) >= r)
                .unwrap_or(starts.len());
            let end = starts
                .iter()
                .position(|&s| owner(s) > r)
                .unwrap_or(starts.len());
            first..end.max(first)
        })
        .collect()
}

impl<'c> DataParallel<'c> {
    /// Shard an optimizer across the ranks (ZeRO-1): `make` builds this rank's inner optimizer
    /// over the parameters it owns (forming parameter groups as it likes). Collective in use:
    /// every rank calls `step`. See [`ShardedOptimizer`].
    pub fn shard_optimizer<O: Optimizer>(
        &mut self,
        make: impl FnOnce(Vec<Parameter>) -> Result<O>,
    ) -> Result<ShardedOptimizer<'c, O>> {
        let layout = self.layout().to_vec();
        let starts: Vec<usize> = layout.iter().map(|(_, s)| *s).collect();
        let owners = shard_owners(&starts, self.flat().numel(), self.comm().size());
        let owned = owners[self.comm().rank()].clone();
        let mine: Vec<Parameter> = layout[owned.clone()]
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        let inner = make(mine.clone())?;
        if let Some(p) = inner
            .params()
            .iter()
            .find(|p| !mine.iter().any(|m| m.id() == p.id()))
        {
            return Err(Error::invalid(
                "DataParallel::shard_optimizer",
                format!(
                    "the optimizer built for rank {} holds parameter {:?}, which that rank does not own",
                    self.comm().rank(),
                    p.shape()
                ),
            ));
        }
        let global_of = (inner.params().iter())
            .map(|p| {
                (owned.clone())
                    .find(|&g| layout[g].0.id() == p.id())
                    .unwrap_or(owned.start)
            })
            .collect();
        let all = layout.iter().map(|(p, _)| p.clone()).collect();
        let runs: Vec<Range<usize>> = (owners.iter())
            .map(|o| match o.is_empty() {
                true => 0..0,
                false => {
                    let (p, at) = &layout[o.end - 1];
                    layout[o.start].1..at + p.numel()
                }
            })
            .collect();
        let others = (layout.iter().enumerate())
            .filter(|(i, _)| !owned.contains(i))
            .map(|(_, (p, _))| p.clone())
            .collect();
        self.sharded = Some((runs[self.comm().rank()].clone(), others));
        Ok(ShardedOptimizer {
            comm: self.comm(),
            inner,
            layout,
            all,
            owned,
            runs,
            global_of,
            flat: self.flat().clone(),
        })
    }
}

impl<O: Optimizer> ShardedOptimizer<'_, O> {
    /// The inner optimizer (this rank's shard).
    pub fn inner(&self) -> &O {
        &self.inner
    }
    /// Positions (in the gradient buffer's order) of the parameters this rank steps.
    pub fn owned(&self) -> Range<usize> {
        self.owned.clone()
    }

    /// Each parameter in `which` with its view in the flat buffer: `(parameter, view)`.
    fn views(&self, which: impl Iterator<Item = usize>) -> Result<Vec<(Tensor, Tensor)>> {
        which
            .map(|i| {
                let (p, at) = &self.layout[i];
                let view = self.flat.narrow(0, *at, p.numel())?.reshape(p.shape())?;
                Ok((p.value().clone(), view))
            })
            .collect()
    }

    /// Every rank's updated parameters to every rank, through the gradient buffer: each rank
    /// writes its own into its run of the buffer, the runs are gathered, and each rank copies
    /// the others' out.
    fn exchange_parameters(&self) -> Result<()> {
        let copy = |pairs: Vec<(Tensor, Tensor)>, to_flat: bool| -> Result<()> {
            let groups: Vec<FusedGroup> = pairs
                .iter()
                .map(|(p, v)| match to_flat {
                    true => FusedGroup {
                        inputs: vec![p],
                        outputs: vec![v],
                    },
                    false => FusedGroup {
                        inputs: vec![v],
                        outputs: vec![p],
                    },
                })
                .collect();
            if groups.is_empty() {
                return Ok(());
            }
            fused_into_groups(&[Expr::input(0)], &groups)
        };
        copy(self.views(self.owned.clone())?, true)?;
        self.comm.all_gather_runs(&self.flat, &self.runs)?;
        let others = (0..self.layout.len()).filter(|i| !self.owned.contains(i));
        copy(self.views(others)?, false)
    }

    /// This rank's shard as checkpoints record it: its place in the group, the run of parameters
    /// it owns and each inner parameter's position among all.
    fn shard(&self) -> Value {
        json!({
            "rank": self.comm.rank(),
            "ranks": self.comm.size(),
            "owned": [self.owned.start, self.owned.end],
            "global": self.global_of,
        })
    }

    /// The inner optimizer's state from `tensors` named by global positions (others ignored).
    fn load_local(&mut self, inner: &Value, tensors: &[(String, Tensor)]) -> Result<()> {
        let local: Vec<(String, Tensor)> = tensors
            .iter()
            .filter_map(|(n, t)| {
                let (head, g) = n.rsplit_once('.')?;
                let g = g.parse::<usize>().ok()?;
                let i = self.global_of.iter().position(|&x| x == g)?;
                Some((format!("{head}.{i}"), t.clone()))
            })
            .collect();
        self.inner.load_state(inner, &local)
    }

    /// `inner`'s state name `"<opt>.<kind>.<local>"` with the local position made global (the
    /// parameter's position in the gradient buffer's order).
    fn global_name(&self, name: &str) -> String {
        let global = |i: &str| i.parse::<usize>().ok().and_then(|i| self.global_of.get(i));
        match name.rsplit_once('.') {
            Some((head, i)) => match global(i) {
                Some(g) => format!("{head}.{g}"),
                None => name.to_string(),
            },
            None => name.to_string(),
        }
    }
}

impl<O: Optimizer> Optimizer for ShardedOptimizer<'_, O> {
    /// This rank's shard steps, then the parameters are exchanged (collective); every
    /// parameter's gradient is cleared (the buffer carried the parameters).
    fn step(&mut self) -> Result<()> {
        self.comm.or_abort(self.inner.step())?;
        self.exchange_parameters()?;
        for p in &self.all {
            p.zero_grad();
        }
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.inner.lr()
    }
    fn sum_over_ranks(&self, values: &mut [f64]) -> Result<()> {
        let mut v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
        self.comm.all_reduce_host(&mut v, ReduceOp::Sum, 1.0)?;
        for (x, y) in values.iter_mut().zip(v) {
            *x = f64::from(y);
        }
        Ok(())
    }
    fn set_lr(&mut self, lr: f64) {
        self.inner.set_lr(lr)
    }
    /// Every parameter of the group (what gradient clipping and loss scaling look at), not
    /// only this rank's shard.
    fn params(&self) -> &[Parameter] {
        &self.all
    }
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        (self.inner.state_tensors().into_iter())
            .map(|(n, t)| (self.global_name(&n), t))
            .collect()
    }
    fn hyper_params(&self) -> Value {
        json!({
            "sharded": self.shard(),
            "inner": self.inner.hyper_params(),
        })
    }
    /// Loads a shard saved by the same rank of a group of the same size.
    fn load_state(&mut self, hyper: &Value, tensors: &[(String, Tensor)]) -> Result<()> {
        let op = "ShardedOptimizer::load_state";
        let (s, want) = (&hyper["sharded"], self.shard());
        if *s != want {
            return Err(Error::invalid(
                op,
                format!("the state is of shard {s}; this rank's shard is {want}"),
            ));
        }
        self.load_local(&hyper["inner"], tensors)
    }
    /// Takes this rank's parameters' state out of every saved rank's: the inner optimizer's
    /// settings from rank 0's part (the others must agree), each parameter's own entries
    /// (`param_steps`, as netcl's optimizers keep them) from the part that held it, the
    /// parameter groups as this rank's inner optimizer forms them.
    fn load_state_parts(&mut self, parts: &[(Value, Vec<(String, Tensor)>)]) -> Result<()> {
        let op = "ShardedOptimizer::load_state_parts";
        let mut steps: HashMap<usize, Value> = HashMap::new();
        let mut common: Option<Value> = None;
        for (r, (hyper, _)) in parts.iter().enumerate() {
            let global = (hyper["sharded"]["global"].as_array())
                .map(|a| a.iter().filter_map(Value::as_u64).map(|g| g as usize).collect::<Vec<_>>())
                .ok_or_else(|| {
                    Error::invalid(
                        op,
                        format!(
                            "part {r} does not list its parameters' positions (saved by an older netcl); \
                             resume it on {} ranks",
                            parts.len()
                        ),
                    )
                })?;
            let mut inner = hyper["inner"].clone();
            if let Some(list) = inner.get("param_steps").and_then(Value::as_array) {
                steps.extend(global.iter().zip(list).map(|(&g, v)| (g, v.clone())));
            }
            for key in ["num_params", "param_steps", "groups"] {
                inner.as_object_mut().map(|o| o.remove(key));
            }
            match &common {
                None => common = Some(inner),
                Some(c) if *c != inner => {
                    return Err(Error::invalid(
                        op,
                        format!("part {r}'s settings {inner} differ from part 0's {c}"),
                    ))
                }
                Some(_) => {}
            }
        }
        let mut merged = common.unwrap_or_default();
        let own = self.inner.hyper_params();
        merged["num_params"] = json!(self.global_of.len());
        merged["groups"] = own["groups"].clone();
        if !steps.is_empty() {
            let mine: Option<Vec<Value>> = self
                .global_of
                .iter()
                .map(|g| steps.get(g).cloned())
                .collect();
            merged["param_steps"] = Value::Array(mine.ok_or_else(|| {
                Error::invalid(
                    op,
                    "the saved parts do not hold every parameter of this shard",
                )
            })?);
        }
        let tensors: Vec<(String, Tensor)> =
            parts.iter().flat_map(|p| p.1.iter().cloned()).collect();
        self.load_local(&merged, &tensors)
    }
}

#[cfg(test)]
mod tests {
    use super::shard_owners;

    #[test]
    fn owners_are_contiguous_and_cover_every_parameter() {
        // Parameter sizes 10, 90, 5, 5, 40, 50 in a buffer of 200.
        let starts = [0, 10, 100, 105, 110, 150];
        assert_eq!(shard_owners(&starts, 200, 2), vec![0..2, 2..6]);
        assert_eq!(shard_owners(&starts, 200, 4), vec![0..2, 2..2, 2..5, 5..6]);
        assert_eq!(shard_owners(&starts, 200, 1), vec![0..6]);
        // More ranks than parameters: some own nothing.
        assert_eq!(shard_owners(&[0], 8, 3), vec![0..1, 1..1, 1..1]);
        assert_eq!(shard_owners(&[], 0, 2), vec![0..0, 0..0]);
    }
}
