//! The parameters a Llama config makes, by name and shape, without allocating them; imports (Hugging Face, netcl checkpoints) check the tensors a file holds against them before building the model.
use super::config::LlamaConfig;
use netcl_ops::{DType, Error, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A tensor as a file stores it: netcl's name, dtype, shape and the file (for errors).
pub(crate) struct Stored {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub file: String,
}

impl LlamaConfig {
    /// netcl's name and the shape of every parameter `Llama::new` makes for this config.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (d, hd) = (self.dim, self.head_dim());
        let kv = self.n_kv_heads * hd;
        let mut v = vec![(
            "tok_embeddings.weight".to_string(),
            vec![self.vocab_size, d],
        )];
        for i in 0..self.n_layers {
            for (n, s) in [
                ("attention_norm.weight", vec![d]),
                ("attention.wq.weight", vec![self.n_heads * hd, d]),
                ("attention.wk.weight", vec![kv, d]),
                ("attention.wv.weight", vec![kv, d]),
                ("attention.wo.weight", vec![d, self.n_heads * hd]),
                ("ffn_norm.weight", vec![d]),
                ("feed_forward.w1.weight", vec![self.hidden_dim, d]),
                ("feed_forward.w2.weight", vec![d, self.hidden_dim]),
                ("feed_forward.w3.weight", vec![self.hidden_dim, d]),
            ] {
                v.push((format!("layers.{i}.{n}"), s));
            }
        }
        v.push(("norm.weight".to_string(), vec![d]));
        if !self.tied_embeddings {
            v.push(("output.weight".to_string(), vec![self.vocab_size, d]));
        }
        v
    }
}

/// The layer index of a parameter name `layers.<i>.…`.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("layers.")?
        .split_once('.')?
        .0
        .parse()
        .ok()
}

/// `stored` holds exactly the parameters of `cfg`, each with its shape and a float dtype: checked
/// before anything is allocated (the number of layers first, so a config asking for 10^9 layers
/// fails at once). `what` names the source (directory, checkpoint) and `shown` turns a netcl
/// name into the file's own for messages.
pub(crate) fn check_stored(
    cfg: &LlamaConfig,
    stored: &[Stored],
    what: &str,
    shown: impl Fn(&str) -> String,
) -> Result<()> {
    let layers: BTreeSet<usize> = stored.iter().filter_map(|s| layer_of(&s.name)).collect();
    let held = layers.last().map_or(0, |l| l + 1);
    if held != cfg.n_layers || layers.len() != held {
        return Err(Error::format(
            what,
            format!(
                "the config has {} layers; the weights hold {} (indices {:?}..)",
                cfg.n_layers,
                layers.len(),
                layers.iter().take(4).collect::<Vec<_>>()
            ),
        ));
    }
    let want: BTreeMap<String, Vec<usize>> = cfg.parameter_shapes().into_iter().collect();
    for s in stored {
        let Some(shape) = want.get(&s.name) else {
            return Err(Error::format(
                &s.file,
                format!(
                    "tensor '{}' is not a parameter of this config",
                    shown(&s.name)
                ),
            ));
        };
        if &s.shape != shape {
            return Err(Error::format(
                &s.file,
                format!(
                    "tensor '{}' is {:?}; the config needs {shape:?}",
                    shown(&s.name),
                    s.shape
                ),
            ));
        }
        if !s.dtype.is_float() {
            return Err(Error::format(
                &s.file,
                format!(
                    "tensor '{}' is {}: integer weights are not read (quantized checkpoints \
                     need dequantizing first)",
                    shown(&s.name),
                    s.dtype
                ),
            ));
        }
    }
    let names: BTreeSet<&str> = stored.iter().map(|s| s.name.as_str()).collect();
    let missing: Vec<String> = want
        .keys()
        .filter(|n| !names.contains(n.as_str()))
        .map(|n| shown(n))
        .collect();
    if !missing.is_empty() {
        return Err(Error::format(
            what,
            format!("missing tensors: {}", missing.join(", ")),
        ));
    }
    Ok(())
}
