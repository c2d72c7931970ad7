//! Parameter groups (PyTorch's `param_groups`): a learning-rate scale and weight decay per group of an optimizer's parameters, saved and checked with its state.
use crate::optimizer::{check_non_negative, require};
use crate::state::Hyper;
use netcl_ops::Result;
use serde_json::{json, Value};

/// Settings of a group of parameters added with an optimizer's `add_group`: its learning rate is
/// the optimizer's times `lr_scale` (so schedules that set the optimizer's rate move every group
/// together), and `weight_decay`, when set, replaces the optimizer's. The common use: no weight
/// decay on biases and norm weights,
///
/// ```ignore
/// AdamW::new(matrices, 3e-4).weight_decay(0.1).add_group(vectors, ParamGroup::new().weight_decay(0.0))
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamGroup {
    pub lr_scale: f64,
    pub weight_decay: Option<f64>,
}

impl Default for ParamGroup {
    fn default() -> Self {
        ParamGroup {
            lr_scale: 1.0,
            weight_decay: None,
        }
    }
}

impl ParamGroup {
    /// The optimizer's own settings (scale 1, its weight decay).
    pub fn new() -> ParamGroup {
        ParamGroup::default()
    }
    pub fn lr_scale(self, lr_scale: f64) -> ParamGroup {
        ParamGroup { lr_scale, ..self }
    }
    pub fn weight_decay(self, weight_decay: f64) -> ParamGroup {
        ParamGroup {
            weight_decay: Some(weight_decay),
            ..self
        }
    }
}

/// The group of each parameter: 0 is the optimizer's own settings, `g > 0` is `added[g - 1]`.
#[derive(Clone, Debug)]
pub(crate) struct Groups {
    added: Vec<ParamGroup>,
    of: Vec<usize>,
}

impl Groups {
    /// `n` parameters, all with the optimizer's own settings.
    pub(crate) fn new(n: usize) -> Groups {
        Groups {
            added: Vec::new(),
            of: vec![0; n],
        }
    }

    /// A new group of the next `count` parameters.
    pub(crate) fn add(&mut self, count: usize, group: ParamGroup) {
        self.added.push(group);
        self.of.extend(std::iter::repeat_n(self.added.len(), count));
    }

    /// The group of parameter `i`.
    pub(crate) fn of(&self, i: usize) -> usize {
        self.of[i]
    }

    /// Learning rate and weight decay of group `g` under the optimizer's `lr` and `weight_decay`.
    pub(crate) fn settings(&self, g: usize, lr: f64, weight_decay: f64) -> (f64, f64) {
        match g.checked_sub(1).map(|k| self.added[k]) {
            None => (lr, weight_decay),
            Some(p) => (lr * p.lr_scale, p.weight_decay.unwrap_or(weight_decay)),
        }
    }

    /// Every group's scale and decay finite and non-negative (errors name `op` and the group).
    pub(crate) fn check(&self, op: &str) -> Result<()> {
        for (k, g) in self.added.iter().enumerate() {
            let name = |what: &str| format!("group {} {what}", k + 1);
            check_non_negative(op, &name("lr_scale"), g.lr_scale)?;
            if let Some(wd) = g.weight_decay {
                check_non_negative(op, &name("weight_decay"), wd)?;
            }
        }
        Ok(())
    }

    /// The added groups, `[{"lr_scale", "weight_decay" (null: the optimizer's), "params": count}]`.
    pub(crate) fn to_json(&self) -> Value {
        let groups: Vec<Value> = (self.added.iter().enumerate())
            .map(|(k, g)| {
                let count = self.of.iter().filter(|&&x| x == k + 1).count();
                json!({"lr_scale": g.lr_scale, "weight_decay": g.weight_decay, "params": count})
            })
            .collect();
        Value::Array(groups)
    }

    /// The saved groups (key `"groups"`, absent in checkpoints from before groups: none added),
    /// which must split the parameters as `self` does; the saved settings are taken.
    pub(crate) fn load(&self, h: &Hyper) -> Result<Groups> {
        let empty = Vec::new();
        let saved = match h.raw("groups") {
            None => &empty,
            Some(v) => v
                .as_array()
                .ok_or_else(|| h.wrong("groups", "a list of groups", v))?,
        };
        let want = "a list of {\"lr_scale\", \"weight_decay\", \"params\"} objects";
        let mut next = Groups::new(self.of.len() - self.of.iter().filter(|&&g| g > 0).count());
        for v in saved {
            let num = |key: &str| v.get(key).and_then(Value::as_f64);
            let (Some(lr_scale), Some(count)) =
                (num("lr_scale"), v.get("params").and_then(Value::as_u64))
            else {
                return Err(h.wrong("groups", want, v));
            };
            let weight_decay = match v.get("weight_decay") {
                Some(Value::Null) | None => None,
                Some(x) => Some(x.as_f64().ok_or_else(|| h.wrong("groups", want, v))?),
            };
            next.add(
                count as usize,
                ParamGroup {
                    lr_scale,
                    weight_decay,
                },
            );
        }
        require(h.op(), next.of == self.of, || {
            format!(
                "the saved parameter groups (sizes {:?} after {} ungrouped) do not match this optimizer's (sizes {:?} after {})",
                next.sizes(),
                next.of.iter().filter(|&&g| g == 0).count(),
                self.sizes(),
                self.of.iter().filter(|&&g| g == 0).count()
            )
        })?;
        Ok(next)
    }

    fn sizes(&self) -> Vec<usize> {
        (1..=self.added.len())
            .map(|g| self.of.iter().filter(|&&x| x == g).count())
            .collect()
    }
}
