//! Checkpoint support shared by the optimizers: state tensor names, reading hyper-parameters back from JSON, and checked matching of saved state tensors to parameters.
use netcl_autograd::Parameter;
use netcl_ops::{fused, Error, Expr, Result, Tensor};
use serde_json::Value;

/// The name of state tensor `kind` of parameter `index`: `"<opt>.<kind>.<index>"`.
pub(crate) fn state_name(opt: &str, kind: &str, index: usize) -> String {
    format!("{opt}.{kind}.{index}")
}

/// Typed reads of the hyper-parameter JSON of optimizer `opt`; errors name the key.
pub(crate) struct Hyper<'a> {
    op: String,
    value: &'a Value,
}

impl<'a> Hyper<'a> {
    /// Checks that `value` is an object saved by optimizer `opt` over `num_params` parameters.
    pub(crate) fn new(opt: &str, value: &'a Value, num_params: usize) -> Result<Hyper<'a>> {
        let op = format!("{opt}.load_state");
        if !value.is_object() {
            return Err(Error::format(
                op,
                format!("hyper-parameters must be a JSON object, got {value}"),
            ));
        }
        let h = Hyper { op, value };
        let name = h.get("name")?.as_str().unwrap_or_default();
        if name != opt {
            return Err(Error::format(
                &h.op,
                format!(
                    "the saved state is of optimizer {}, not {opt:?}",
                    h.get("name")?
                ),
            ));
        }
        let n = h.usize("num_params")?;
        if n != num_params {
            return Err(Error::format(
                &h.op,
                format!("the saved state covers {n} parameters; this optimizer has {num_params}"),
            ));
        }
        Ok(h)
    }

    pub(crate) fn op(&self) -> &str {
        &self.op
    }

    fn get(&self, key: &str) -> Result<&'a Value> {
        self.value
            .get(key)
            .ok_or_else(|| Error::format(&self.op, format!("hyper-parameter {key:?} is missing")))
    }

    /// `key`'s value, if present.
    pub(crate) fn raw(&self, key: &str) -> Option<&'a Value> {
        self.value.get(key)
    }

    pub(crate) fn wrong(&self, key: &str, want: &str, got: &Value) -> Error {
        Error::format(
            &self.op,
            format!("hyper-parameter {key:?} must be {want}, got {got}"),
        )
    }

    pub(crate) fn f64(&self, key: &str) -> Result<f64> {
        let v = self.get(key)?;
        v.as_f64().ok_or_else(|| self.wrong(key, "a number", v))
    }

    pub(crate) fn bool(&self, key: &str) -> Result<bool> {
        let v = self.get(key)?;
        v.as_bool()
            .ok_or_else(|| self.wrong(key, "true or false", v))
    }

    /// `key`'s boolean, or `default` when the key is absent (settings added after a format).
    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.value.get(key) {
            None => Ok(default),
            Some(_) => self.bool(key),
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.wrong(key, "a non-negative integer", v))
    }

    pub(crate) fn f64_pair(&self, key: &str) -> Result<(f64, f64)> {
        let v = self.get(key)?;
        match v.as_array().map(|a| a.as_slice()) {
            Some([a, b]) => match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) => Ok((a, b)),
                _ => Err(self.wrong(key, "two numbers", v)),
            },
            _ => Err(self.wrong(key, "two numbers", v)),
        }
    }

    /// A list of `len` non-negative integers.
    pub(crate) fn usize_list(&self, key: &str, len: usize) -> Result<Vec<usize>> {
        let v = self.get(key)?;
        let want = format!("a list of {len} non-negative integers");
        let list = v.as_array().ok_or_else(|| self.wrong(key, &want, v))?;
        if list.len() != len {
            return Err(self.wrong(key, &want, v));
        }
        list.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong(key, &want, v))
            })
            .collect()
    }
}

/// Saved state tensors sorted by kind and parameter: `slots[k][i]` is tensor `kinds[k]` of
/// parameter `i`. Mismatches are collected in `problems` rather than returned one at a time.
pub(crate) struct Matched<'a> {
    pub(crate) slots: Vec<Vec<Option<&'a Tensor>>>,
    pub(crate) problems: Vec<String>,
}

/// Sort `tensors` named `"<opt>.<kind>.<index>"` into slots, noting unknown names, indices past
/// the parameter list, duplicates, non-float dtypes and shapes that differ from the parameter's.
pub(crate) fn match_tensors<'a>(
    opt: &str,
    kinds: &[&str],
    params: &[Parameter],
    tensors: &'a [(String, Tensor)],
) -> Matched<'a> {
    let mut m = Matched {
        slots: vec![vec![None; params.len()]; kinds.len()],
        problems: Vec::new(),
    };
    let expected = kinds
        .iter()
        .map(|k| format!("\"{opt}.{k}.<index>\""))
        .collect::<Vec<_>>()
        .join(" or ");
    for (name, t) in tensors {
        let parsed = name
            .strip_prefix(opt)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|r| r.split_once('.'))
            .and_then(|(kind, idx)| {
                let k = kinds.iter().position(|&x| x == kind)?;
                // Only canonical decimal indices ("3", not "03" or "+3") name a parameter.
                let i: usize = idx.parse().ok()?;
                (i.to_string() == idx).then_some((k, i))
            });
        let Some((k, i)) = parsed else {
            m.problems
                .push(format!("unexpected tensor {name:?} (expected {expected})"));
            continue;
        };
        let Some(p) = params.get(i) else {
            m.problems.push(format!(
                "tensor {name:?} is for parameter {i} but the optimizer has {} parameters",
                params.len()
            ));
            continue;
        };
        if t.shape() != p.shape() {
            m.problems.push(format!(
                "tensor {name:?} has shape {:?} but parameter {i} has shape {:?}",
                t.shape(),
                p.shape()
            ));
            continue;
        }
        if !t.dtype().is_float() {
            m.problems.push(format!(
                "tensor {name:?} is {}; optimizer state is floating point",
                t.dtype()
            ));
            continue;
        }
        if m.slots[k][i].replace(t).is_some() {
            m.problems.push(format!("tensor {name:?} is given twice"));
        }
    }
    m
}

/// An error listing every problem, or `Ok` when there is none.
pub(crate) fn fail_on(op: &str, problems: &[String]) -> Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    Err(Error::format(
        op,
        format!(
            "the saved state does not match this optimizer ({} problem{}): {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("; ")
        ),
    ))
}

/// A fresh copy of `t` on `p`'s device in `p`'s dtype (never sharing the caller's storage, since
/// state is updated in place).
pub(crate) fn adopt(t: &Tensor, p: &Parameter) -> Result<Tensor> {
    let t = t.to_device(p.device())?;
    let mut out = fused(&[&t], &[Expr::input(0).cast(p.dtype())])?;
    Ok(out.remove(0))
}
