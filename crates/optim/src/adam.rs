//! Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay) with PyTorch's update and bias correction; one multi-tensor fused kernel updates all parameters.
use crate::device_state::{bias_correction, count_of, new_count, DeviceLr, UpdateTypes};
use crate::groups::{Groups, ParamGroup};
use crate::optimizer::{check_distinct, check_non_negative, require, Optimizer};
use crate::state::{adopt, fail_on, match_tensors, state_name, Hyper};
use netcl_autograd::Parameter;
use netcl_ops::{fused_into_groups, DType, Expr, FusedGroup, Result, Tensor};
use serde_json::{json, Value};

/// State tensor kinds: the moments, and with amsgrad the running maximum of `v`.
const KINDS: [&str; 3] = ["m", "v", "max_v"];

/// Where the weight decay goes.
#[derive(Clone, Copy, PartialEq)]
enum Decay {
    /// Adam: `grad += weight_decay * p`.
    L2,
    /// AdamW: `p *= 1 - lr * weight_decay` before the Adam update.
    Decoupled,
}

/// First and second moments of one parameter, the largest second moment so far (amsgrad) and
/// the number of updates it has had (on the host, and on the device for the update kernel).
#[derive(Clone)]
struct Moments {
    m: Tensor,
    v: Tensor,
    max_v: Option<Tensor>,
    step: usize,
    /// `step` as a one-element tensor on the parameter's device.
    t: Tensor,
    /// This step's `-lr / (1 - beta1^t)` and `sqrt(1 - beta2^t)`, one element each, computed
    /// from `t` once per step (not in every work-item of the update).
    step_size: Tensor,
    bc2_sqrt: Tensor,
}

/// The optimizer behind `Adam` and `AdamW`.
#[derive(Clone)]
struct AdamCore {
    name: &'static str,
    decay: Decay,
    params: Vec<Parameter>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    groups: Groups,
    state: Vec<Option<Moments>>,
    steps: usize,
    /// Each group's learning rate on the devices its parameters live on.
    device_lr: DeviceLr,
}

/// `start + weight * (end - start)` as PyTorch's `lerp` computes it (the other form for weights
/// of 0.5 and more, which keeps `weight = 1` exact).
fn lerp(start: Expr, end: Expr, weight: f64) -> Expr {
    if weight.abs() < 0.5 {
        start.clone() + (end - start) * weight
    } else {
        end.clone() - (end - start) * (1.0 - weight)
    }
}

impl AdamCore {
    fn new(name: &'static str, decay: Decay, params: Vec<Parameter>, lr: f64, wd: f64) -> Self {
        let state = vec![None; params.len()];
        let groups = Groups::new(params.len());
        AdamCore {
            name,
            decay,
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: wd,
            amsgrad: false,
            groups,
            state,
            steps: 0,
            device_lr: DeviceLr::default(),
        }
    }

    /// Settings PyTorch accepts; checked before every step and when loading (`op`).
    fn check(&self, op: &str) -> Result<()> {
        check_non_negative(op, "lr", self.lr)?;
        check_non_negative(op, "eps", self.eps)?;
        check_non_negative(op, "weight_decay", self.weight_decay)?;
        self.groups.check(op)?;
        let (b1, b2) = self.betas;
        require(
            op,
            (0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2),
            || format!("betas must lie in [0, 1), got ({b1}, {b2})"),
        )?;
        check_distinct(op, &self.params)
    }

    /// The state kinds this configuration keeps.
    fn kinds(&self) -> &'static [&'static str] {
        if self.amsgrad {
            &KINDS
        } else {
            &KINDS[..2]
        }
    }

    /// Appends `params` as a group with its own settings (see [`ParamGroup`]).
    fn add_group(&mut self, params: Vec<Parameter>, group: ParamGroup) {
        self.groups.add(params.len(), group);
        self.state.extend(params.iter().map(|_| None));
        self.params.extend(params);
    }

    /// The update of input 0 (p) with input 1 (grad), input 2 (m), input 3 (v), with amsgrad
    /// input 4 (max_v), then the update number `t` (from 1) and the learning rate (one element
    /// each, on the device) in parameter group `group`: outputs the new m, v, max_v (amsgrad)
    /// and p. Only group settings fixed for the optimizer's life are scalars.
    fn update(&self, group: usize, dtype: DType) -> Vec<Expr> {
        let (_, wd) = self.groups.settings(group, self.lr, self.weight_decay);
        let (b1, b2) = self.betas;
        let ty = UpdateTypes::new(dtype);
        let (p, g, m, v) = (ty.input(0), ty.input(1), ty.input(2), ty.input(3));
        let next = 4 + usize::from(self.amsgrad);
        let (neg_step, bc2_sqrt, lr) = (
            Expr::input(next),
            Expr::input(next + 1),
            Expr::input(next + 2),
        );
        let g = if self.decay == Decay::L2 && wd != 0.0 {
            g + p.clone() * wd
        } else {
            g
        };
        let p = if self.decay == Decay::Decoupled && wd != 0.0 {
            p * (1.0 - lr.clone() * wd)
        } else {
            p
        };
        let new_m = lerp(m, g.clone(), 1.0 - b1);
        let new_v = v * b2 + (1.0 - b2) * g.clone() * g;
        let new_max = self.amsgrad.then(|| ty.input(4).max(new_v.clone()));
        let second = new_max.clone().unwrap_or_else(|| new_v.clone());
        let denom = second.sqrt() / bc2_sqrt + self.eps;
        let new_p = p + neg_step * new_m.clone() / denom;
        [new_m, new_v]
            .into_iter()
            .chain(new_max)
            .chain([new_p])
            .map(|e| ty.narrow(e))
            .collect()
    }

    /// Counts the step of every member on the device and computes its step size and second
    /// bias correction there from the new count and the group's rate: one launch for all.
    fn advance(&self, members: &[(usize, Tensor, Moments, Tensor)]) -> Result<()> {
        let (b1, b2) = self.betas;
        let t = Expr::input(0) + 1.0;
        let exprs = [
            t.clone(),
            -(Expr::input(1) / bias_correction(t.clone(), b1)),
            bias_correction(t, b2).sqrt(),
        ];
        // t (1) in place, lr (1) -> t, step_size, bc2_sqrt (1 each).
        let groups: Vec<FusedGroup> = members
            .iter()
            .map(|(_, _, s, lr)| FusedGroup {
                inputs: vec![&s.t, lr],
                outputs: vec![&s.t, &s.step_size, &s.bc2_sqrt],
            })
            .collect();
        fused_into_groups(&exprs, &groups)
    }

    /// Updates every parameter that has a gradient: its step count goes up by one on the
    /// device (one launch for all), then one `fused_into_groups` call per parameter group
    /// (normally one), which is one kernel launch per device and dtype for up to
    /// `FUSED_MAX_GROUPS` parameters. The same kernels with the same arguments every step.
    fn step(&mut self) -> Result<()> {
        self.check(&format!("{}.step", self.name))?;
        // (parameter index, gradient, state before the step, learning rate), by group.
        let mut members: Vec<(usize, Tensor, Moments, Tensor)> = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            let s = match &self.state[i] {
                Some(s) => s.clone(),
                None => Moments {
                    m: Tensor::zeros(p.shape(), p.dtype(), p.device())?,
                    v: Tensor::zeros(p.shape(), p.dtype(), p.device())?,
                    max_v: None,
                    step: 0,
                    t: new_count(p.dtype(), p.device())?,
                    step_size: new_count(p.dtype(), p.device())?,
                    bc2_sqrt: new_count(p.dtype(), p.device())?,
                },
            };
            // amsgrad switched on after updates starts the maximum at 0 (max(0, v) = v).
            let max_v = match (self.amsgrad, s.max_v) {
                (false, _) => None,
                (true, Some(x)) => Some(x),
                (true, None) => Some(Tensor::zeros(p.shape(), p.dtype(), p.device())?),
            };
            let group = self.groups.of(i);
            let (lr, _) = self.groups.settings(group, self.lr, self.weight_decay);
            let lr = self.device_lr.get(group, p.device(), p.dtype(), lr)?;
            members.push((i, g, Moments { max_v, ..s }, lr));
        }
        self.advance(&members)?;
        let key = |(i, ..): &(usize, Tensor, Moments, Tensor)| {
            (self.groups.of(*i), self.params[*i].dtype().name())
        };
        members.sort_by_key(key);
        for same in members.chunk_by(|a, b| key(a) == key(b)) {
            let dtype = self.params[same[0].0].dtype();
            let exprs = self.update(key(&same[0]).0, dtype);
            // p, grad, m, v, max_v: (n...), t, lr: (1) per parameter; p, m, v, max_v in place.
            let groups: Vec<FusedGroup> = same
                .iter()
                .map(|(i, g, s, lr)| {
                    let p = self.params[*i].value();
                    FusedGroup {
                        inputs: [p, g, &s.m, &s.v]
                            .into_iter()
                            .chain(&s.max_v)
                            .chain([&s.step_size, &s.bc2_sqrt, lr])
                            .collect(),
                        outputs: [&s.m, &s.v]
                            .into_iter()
                            .chain(&s.max_v)
                            .chain([p])
                            .collect(),
                    }
                })
                .collect();
            fused_into_groups(&exprs, &groups)?;
        }
        for (i, _, s, _) in members {
            self.state[i] = Some(Moments {
                step: s.step + 1,
                ..s
            });
        }
        self.steps += 1;
        Ok(())
    }

    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, s) in self.state.iter().enumerate() {
            if let Some(s) = s {
                out.push((state_name(self.name, KINDS[0], i), s.m.clone()));
                out.push((state_name(self.name, KINDS[1], i), s.v.clone()));
                if let Some(x) = s.max_v.as_ref().filter(|_| self.amsgrad) {
                    out.push((state_name(self.name, KINDS[2], i), x.clone()));
                }
            }
        }
        out
    }

    fn hyper_params(&self) -> Value {
        let param_steps: Vec<usize> = self
            .state
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.step))
            .collect();
        json!({
            "name": self.name,
            "num_params": self.params.len(),
            "lr": self.lr,
            "betas": [self.betas.0, self.betas.1],
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "amsgrad": self.amsgrad,
            "groups": self.groups.to_json(),
            "step": self.steps,
            "param_steps": param_steps,
        })
    }

    fn load_state(&mut self, hyper: &Value, tensors: &[(String, Tensor)]) -> Result<()> {
        let n = self.params.len();
        let h = Hyper::new(self.name, hyper, n)?;
        let mut next = AdamCore::new(
            self.name,
            self.decay,
            self.params.clone(),
            h.f64("lr")?,
            h.f64("weight_decay")?,
        );
        next.betas = h.f64_pair("betas")?;
        next.eps = h.f64("eps")?;
        // Checkpoints from before amsgrad existed have no key: it was off.
        next.amsgrad = h.bool_or("amsgrad", false)?;
        next.groups = self.groups.load(&h)?;
        next.steps = h.usize("step")?;
        let param_steps = h.usize_list("param_steps", n)?;
        next.check(h.op())?;
        let kinds = next.kinds();
        let mut matched = match_tensors(self.name, kinds, &self.params, tensors);
        // A parameter has moments exactly when it has been updated.
        for (i, &t) in param_steps.iter().enumerate() {
            for (k, kind) in kinds.iter().enumerate() {
                let name = state_name(self.name, kind, i);
                match (t > 0, matched.slots[k][i].is_some()) {
                    (true, false) => matched.problems.push(format!(
                        "tensor {name:?} is missing (param_steps[{i}] = {t})"
                    )),
                    (false, true) => matched.problems.push(format!(
                        "tensor {name:?} is given but param_steps[{i}] = 0 (no update yet)"
                    )),
                    _ => {}
                }
            }
        }
        fail_on(h.op(), &matched.problems)?;
        for (i, &t) in param_steps.iter().enumerate() {
            if let (Some(m), Some(v)) = (matched.slots[0][i], matched.slots[1][i]) {
                let p = &self.params[i];
                let max_v = matched.slots.get(2).and_then(|s| s[i]);
                next.state[i] = Some(Moments {
                    m: adopt(m, p)?,
                    v: adopt(v, p)?,
                    max_v: max_v.map(|x| adopt(x, p)).transpose()?,
                    step: t,
                    t: count_of(t, p.dtype(), p.device())?,
                    step_size: new_count(p.dtype(), p.device())?,
                    bc2_sqrt: new_count(p.dtype(), p.device())?,
                });
            }
        }
        *self = next;
        Ok(())
    }
}

/// Defines a public optimizer type over `AdamCore` with its builder and `Optimizer` impl.
macro_rules! adam_type {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $decay:expr, $wd:expr) => {
        $(#[$doc])*
        pub struct $ty(AdamCore);

        impl $ty {
            #[doc = concat!("`", stringify!($ty), "` over `params` with learning rate `lr`, betas (0.9, 0.999), eps 1e-8 and weight decay ", stringify!($wd), ".")]
            pub fn new(params: Vec<Parameter>, lr: f64) -> $ty {
                $ty(AdamCore::new($name, $decay, params, lr, $wd))
            }
            /// Decay rates of the first and second moment estimates.
            pub fn betas(mut self, beta1: f64, beta2: f64) -> $ty {
                self.0.betas = (beta1, beta2);
                self
            }
            /// Added to the denominator for numerical stability.
            pub fn eps(mut self, eps: f64) -> $ty {
                self.0.eps = eps;
                self
            }
            /// Weight decay (L2 for Adam, decoupled for AdamW).
            pub fn weight_decay(mut self, weight_decay: f64) -> $ty {
                self.0.weight_decay = weight_decay;
                self
            }
            /// The AMSGrad variant: the update divides by the largest second moment seen so
            /// far (state `max_v`, saved and loaded with m and v) instead of the current one.
            pub fn amsgrad(mut self, on: bool) -> $ty {
                self.0.amsgrad = on;
                self
            }
            /// Appends `params` as a parameter group with its own learning-rate scale and
            /// weight decay (PyTorch's `param_groups`; see [`ParamGroup`]).
            pub fn add_group(mut self, params: Vec<Parameter>, group: ParamGroup) -> $ty {
                self.0.add_group(params, group);
                self
            }
            /// How many `step` calls have completed.
            pub fn steps(&self) -> usize {
                self.0.steps
            }
            /// How many updates parameter `index` has had (0 before its first gradient).
            pub fn param_steps(&self, index: usize) -> usize {
                self.0.state.get(index).and_then(|s| s.as_ref()).map_or(0, |s| s.step)
            }
        }

        impl Optimizer for $ty {
            fn step(&mut self) -> Result<()> {
                self.0.step()
            }
            fn lr(&self) -> f64 {
                self.0.lr
            }
            /// Also writes the new rate to the device tensors the update reads (so a replayed
            /// graph of the step uses it).
            fn set_lr(&mut self, lr: f64) {
                let core = &mut self.0;
                core.lr = lr;
                let (groups, wd) = (&core.groups, core.weight_decay);
                core.device_lr.refresh(|g| groups.settings(g, lr, wd).0);
            }
            fn params(&self) -> &[Parameter] {
                &self.0.params
            }
            fn state_tensors(&self) -> Vec<(String, Tensor)> {
                self.0.state_tensors()
            }
            fn step_tensors(&self) -> Vec<(String, Tensor)> {
                let core = &self.0;
                let counts = core.state.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (i, s)));
                let counts = counts.flat_map(|(i, s)| {
                    [("t", &s.t), ("step_size", &s.step_size), ("bc2_sqrt", &s.bc2_sqrt)]
                        .map(|(kind, t)| (state_name(core.name, kind, i), t.clone()))
                });
                core.state_tensors()
                    .into_iter()
                    .chain(counts)
                    .chain(core.device_lr.named(core.name))
                    .collect()
            }
            #[doc = concat!("Keys: name (\"", $name, "\"), num_params, lr, betas ([beta1, beta2]), eps, weight_decay, amsgrad, groups (added parameter groups: lr_scale, weight_decay or null, params), step (completed `step` calls), param_steps (updates per parameter; 0 = no state).")]
            fn hyper_params(&self) -> Value {
                self.0.hyper_params()
            }
            fn load_state(&mut self, hyper: &Value, tensors: &[(String, Tensor)]) -> Result<()> {
                self.0.load_state(hyper, tensors)
            }
        }
    };
}

adam_type!(
    /// Adam as PyTorch's `torch.optim.Adam`, per parameter at its update number `t`:
    ///
    /// ```text
    /// g = grad + weight_decay * p                      (L2, when weight_decay != 0)
    /// m = lerp(m, g, 1 - beta1);   v = beta2 * v + (1 - beta2) * g * g
    /// max_v = max(max_v, v);  v' = max_v  (amsgrad; else v' = v)
    /// p = p - lr / (1 - beta1^t) * m / (sqrt(v') / sqrt(1 - beta2^t) + eps)
    /// ```
    ///
    /// State: `"adam.m.<index>"`, `"adam.v.<index>"` and with amsgrad `"adam.max_v.<index>"`,
    /// zeros before the parameter's first update, on its device in its dtype; update counts per
    /// parameter in `hyper_params`.
    Adam,
    "adam",
    Decay::L2,
    0.0
);

adam_type!(
    /// AdamW as PyTorch's `torch.optim.AdamW`: `p = p * (1 - lr * weight_decay)`, then the Adam
    /// update with the raw gradient. Default weight decay 0.01. State: `"adamw.m.<index>"`,
    /// `"adamw.v.<index>"` and with amsgrad `"adamw.max_v.<index>"`.
    AdamW,
    "adamw",
    Decay::Decoupled,
    0.01
);
