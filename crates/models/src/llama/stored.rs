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
        let a = &self.arch;
        let (q, h) = (self.n_heads * hd, self.hidden_dim);
        let mut v = vec![(
            "tok_embeddings.weight".to_string(),
            vec![self.vocab_size, d],
        )];
        if a.learned_positions {
            v.push(("pos_embeddings.weight".into(), vec![self.max_seq_len, d]));
        }
        // A norm's weight, and its bias for LayerNorm.
        let norm = |name: &str| {
            let mut n = vec![(format!("{name}.weight"), vec![d])];
            if a.layer_norm {
                n.push((format!("{name}.bias"), vec![d]));
            }
            n
        };
        // A projection's weight [out, inn], and its bias [out] where `bias`.
        let proj = |name: &str, out: usize, inn: usize, bias: bool| {
            let mut p = vec![(format!("{name}.weight"), vec![out, inn])];
            if bias {
                p.push((format!("{name}.bias"), vec![out]));
            }
            p
        };
        for i in 0..self.n_layers {
            let mut layer = norm("attention_norm");
            layer.extend(proj("attention.wq", q, d, a.qkv_bias));
            layer.extend(proj("attention.wk", kv, d, a.qkv_bias));
            layer.extend(proj("attention.wv", kv, d, a.qkv_bias));
            layer.extend(proj("attention.wo", d, q, a.out_bias));
            layer.extend(norm("ffn_norm"));
            layer.extend(proj("feed_forward.w1", h, d, a.mlp_bias));
            layer.extend(proj("feed_forward.w2", d, h, a.mlp_bias));
            if !a.gelu_mlp {
                layer.extend(proj("feed_forward.w3", h, d, a.mlp_bias));
            }
            v.extend(
                layer
                    .into_iter()
                    .map(|(n, s)| (format!("layers.{i}.{n}"), s)),
            );
        }
        v.extend(norm("norm"));
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
