//! SGD with momentum, dampening, Nesterov and L2 weight decay (PyTorch's `torch.optim.SGD` update); one multi-tensor fused kernel updates all parameters.
use crate::device_state::{DeviceLr, UpdateTypes};
use crate::groups::{Groups, ParamGroup};
use crate::optimizer::{check_distinct, check_non_negative, require, Optimizer};
use crate::state::{adopt, fail_on, match_tensors, state_name, Hyper};
use netcl_autograd::Parameter;
use netcl_ops::{fused_into_groups, DType, Expr, FusedGroup, Result, Tensor};
use serde_json::{json, Value};

const NAME: &str = "sgd";
const KINDS: [&str; 1] = ["momentum"];

/// Stochastic gradient descent, step for step as PyTorch's:
///
/// ```text
/// d = grad + weight_decay * p                      (when weight_decay != 0)
/// buf = d  on the parameter's first step with momentum, else  momentum * buf + (1 - dampening) * d
/// d = nesterov ? d + momentum * buf : buf          (when momentum != 0)
/// p = p - lr * d
/// ```
///
/// Build with `Sgd::new(params, lr)` and the chained setters. State: one momentum buffer per
/// parameter (`"sgd.momentum.<index>"`), on the parameter's device in its dtype, created at the
/// parameter's first step with a gradient while momentum is non-zero.
pub struct Sgd {
    params: Vec<Parameter>,
    lr: f64,
    momentum: f64,
    dampening: f64,
    nesterov: bool,
    weight_decay: f64,
    groups: Groups,
    buffers: Vec<Option<Tensor>>,
    steps: usize,
    /// Each group's learning rate on the devices its parameters live on.
    device_lr: DeviceLr,
}

impl Sgd {
    /// Plain SGD (no momentum, no weight decay) over `params` with learning rate `lr`.
    pub fn new(params: Vec<Parameter>, lr: f64) -> Sgd {
        let buffers = vec![None; params.len()];
        let groups = Groups::new(params.len());
        Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            groups,
            buffers,
            steps: 0,
            device_lr: DeviceLr::default(),
        }
    }
    /// Momentum factor (0: plain SGD).
    pub fn momentum(mut self, momentum: f64) -> Sgd {
        self.momentum = momentum;
        self
    }
    /// Dampening of the momentum buffer's update (PyTorch's `dampening`).
    pub fn dampening(mut self, dampening: f64) -> Sgd {
        self.dampening = dampening;
        self
    }
    /// Nesterov momentum (needs momentum > 0 and dampening 0).
    pub fn nesterov(mut self, on: bool) -> Sgd {
        self.nesterov = on;
        self
    }
    /// L2 penalty: `weight_decay * p` is added to the gradient.
    pub fn weight_decay(mut self, weight_decay: f64) -> Sgd {
        self.weight_decay = weight_decay;
        self
    }

    /// Appends `params` as a parameter group with its own learning-rate scale and weight decay
    /// (PyTorch's `param_groups`; see [`ParamGroup`]).
    pub fn add_group(mut self, params: Vec<Parameter>, group: ParamGroup) -> Sgd {
        self.groups.add(params.len(), group);
        self.buffers.extend(params.iter().map(|_| None));
        self.params.extend(params);
        self
    }

    /// How many `step` calls have completed.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Settings PyTorch accepts; checked before every step and when loading (`op`).
    fn check(&self, op: &str) -> Result<()> {
        check_non_negative(op, "lr", self.lr)?;
        check_non_negative(op, "momentum", self.momentum)?;
        check_non_negative(op, "weight_decay", self.weight_decay)?;
        self.groups.check(op)?;
        require(op, self.dampening.is_finite(), || {
            format!("dampening must be finite, got {}", self.dampening)
        })?;
        require(
            op,
            !self.nesterov || (self.momentum > 0.0 && self.dampening == 0.0),
            || {
                format!(
                    "nesterov needs momentum > 0 and dampening 0, got momentum {} and dampening {}",
                    self.momentum, self.dampening
                )
            },
        )?;
        check_distinct(op, &self.params)
    }

    /// The update of input 0 (p) with input 1 (grad), with momentum input 2 (buf), then the
    /// learning rate (one element, on the device): the new buf (with momentum) and the new p, in
    /// parameter group `group`. `first` selects the buffer's initialisation.
    fn update(&self, first: bool, group: usize, dtype: DType) -> (Option<Expr>, Expr) {
        let (_, wd) = self.groups.settings(group, self.lr, self.weight_decay);
        let ty = UpdateTypes::new(dtype);
        let (p, g) = (ty.input(0), ty.input(1));
        let d = if wd != 0.0 { g + p.clone() * wd } else { g };
        if self.momentum == 0.0 {
            return (None, ty.narrow(p - d * Expr::input(2)));
        }
        let lr = Expr::input(3);
        let buf = ty.input(2);
        let decayed = buf * self.momentum + d.clone() * (1.0 - self.dampening);
        let first = Expr::scalar(if first { 1.0 } else { 0.0 });
        let new_buf = Expr::select(first, d.clone(), decayed);
        let dir = if self.nesterov {
            d + new_buf.clone() * self.momentum
        } else {
            new_buf.clone()
        };
        (Some(ty.narrow(new_buf)), ty.narrow(p - dir * lr))
    }
}

impl Optimizer for Sgd {
    /// Updates every parameter that has a gradient through `fused_into_groups`: one call per
    /// form of the update and parameter group (each one kernel launch per device and dtype for
    /// up to `FUSED_MAX_GROUPS` parameters).
    fn step(&mut self) -> Result<()> {
        self.check("sgd.step")?;
        let grads: Vec<(usize, Tensor)> = (self.params.iter().enumerate())
            .filter_map(|(i, p)| Some((i, p.grad()?)))
            .collect();
        // Without momentum one form of the update; with it, one for the parameters whose buffer
        // starts now and one for those that have one.
        type Member<'a> = (usize, &'a Tensor, Option<Tensor>, Tensor);
        let mut starting: Vec<Member> = Vec::new();
        let mut running: Vec<Member> = Vec::new();
        for (i, g) in &grads {
            let p = &self.params[*i];
            let group = self.groups.of(*i);
            let (lr, _) = self.groups.settings(group, self.lr, self.weight_decay);
            let lr = self.device_lr.get(group, p.device(), p.dtype(), lr)?;
            match &self.buffers[*i] {
                _ if self.momentum == 0.0 => running.push((*i, g, None, lr)),
                Some(b) => running.push((*i, g, Some(b.clone()), lr)),
                None => {
                    let buf = Tensor::zeros(p.shape(), p.dtype(), p.device())?;
                    starting.push((*i, g, Some(buf), lr));
                }
            }
        }
        let group = |m: &Member| (self.groups.of(m.0), self.params[m.0].dtype().name());
        let mut forms = Vec::new();
        for (first, mut members) in [(true, starting), (false, running)] {
            members.sort_by_key(group);
            for same in members.chunk_by(|a, b| group(a) == group(b)) {
                forms.push((first, same.to_vec()));
            }
        }
        for (first, members) in forms {
            let dtype = self.params[members[0].0].dtype();
            let (new_buf, new_p) = self.update(first, group(&members[0]).0, dtype);
            let exprs: Vec<Expr> = new_buf.into_iter().chain([new_p]).collect();
            // p: (n...) updated in place; grad: (n...); buf: (n...) updated in place; lr: (1).
            let groups: Vec<FusedGroup> = members
                .iter()
                .map(|(i, g, buf, lr)| {
                    let p = self.params[*i].value();
                    FusedGroup {
                        inputs: [p, *g].into_iter().chain(buf).chain([lr]).collect(),
                        outputs: buf.iter().chain([p]).collect(),
                    }
                })
                .collect();
            fused_into_groups(&exprs, &groups)?;
            for (i, _, buf, _) in members {
                self.buffers[i] = buf;
            }
        }
        self.steps += 1;
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.lr
    }
    /// Also writes the new rate to the device tensors the update reads (so a replayed graph of
    /// the step uses it).
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
        let (groups, wd) = (&self.groups, self.weight_decay);
        self.device_lr.refresh(|g| groups.settings(g, lr, wd).0);
    }
    fn params(&self) -> &[Parameter] {
        &self.params
    }

    fn step_tensors(&self) -> Vec<(String, Tensor)> {
        let mut v = self.state_tensors();
        v.extend(self.device_lr.named(NAME));
        v
    }

    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        self.buffers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((state_name(NAME, KINDS[0], i), b.clone()?)))
            .collect()
    }

    /// Keys: name ("sgd"), num_params, lr, momentum, dampening, nesterov, weight_decay, groups
    /// (added parameter groups: lr_scale, weight_decay or null, params), step.
    fn hyper_params(&self) -> Value {
        json!({
            "name": NAME,
            "num_params": self.params.len(),
            "lr": self.lr,
            "momentum": self.momentum,
            "dampening": self.dampening,
            "nesterov": self.nesterov,
            "weight_decay": self.weight_decay,
            "groups": self.groups.to_json(),
            "step": self.steps,
        })
    }

    fn load_state(&mut self, hyper: &Value, tensors: &[(String, Tensor)]) -> Result<()> {
        let h = Hyper::new(NAME, hyper, self.params.len())?;
        let mut next = Sgd::new(self.params.clone(), h.f64("lr")?)
            .momentum(h.f64("momentum")?)
            .dampening(h.f64("dampening")?)
            .nesterov(h.bool("nesterov")?)
            .weight_decay(h.f64("weight_decay")?);
        next.steps = h.usize("step")?;
        next.groups = self.groups.load(&h)?;
        next.check(h.op())?;
        let matched = match_tensors(NAME, &KINDS, &self.params, tensors);
        fail_on(h.op(), &matched.problems)?;
        for (i, t) in matched.slots[0].iter().enumerate() {
            if let Some(t) = t {
                next.buffers[i] = Some(adopt(t, &self.params[i])?);
            }
        }
        *self = next;
        Ok(())
    }
}
