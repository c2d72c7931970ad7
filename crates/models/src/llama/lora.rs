//! LoRA fine-tuning of a Llama: adapters on the chosen projections (q, k, v, o, gate, up, down), saved and loaded on their own, merged into the weights for export.
use super::model::Llama;
use netcl_autograd::Parameter;
use netcl_nn::{load_safetensors, save_safetensors, Linear, LoraConfig, Module};
use netcl_ops::{Error, Generator, Result, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// The projections LoRA can target, by their Hugging Face short names.
const TARGETS: [&str; 7] = ["q", "k", "v", "o", "gate", "up", "down"];

/// The target naming all of them (PEFT's `target_modules="all-linear"`).
const ALL_LINEAR: &str = "all-linear";

impl Llama {
    /// The projections of every layer named `target` ("q", ..., "down").
    fn projections_mut(&mut self, target: &str) -> Vec<&mut Linear> {
        self.layers
            .iter_mut()
            .map(|b| match target {
                "q" => &mut b.attention.wq,
                "k" => &mut b.attention.wk,
                "v" => &mut b.attention.wv,
                "o" => &mut b.attention.wo,
                "gate" => &mut b.feed_forward.w1,
                "up" => &mut b.feed_forward.w3,
                _ => &mut b.feed_forward.w2,
            })
            .collect()
    }

    /// Adds LoRA adapters to `cfg.targets` in every layer and freezes every other parameter:
    /// an optimizer over [`Module::trainable_parameters`] then keeps state for the adapters only,
    /// and backward computes no gradient for the frozen weights. The target `all-linear` (as in
    /// PEFT) names every projection of the blocks (not the output head).
    pub fn add_lora(&mut self, cfg: &LoraConfig, gen: &mut Generator) -> Result<()> {
        let known = |t: &str| TARGETS.contains(&t) || t == ALL_LINEAR;
        if let Some(bad) = cfg.targets.iter().find(|t| !known(t)) {
            return Err(Error::invalid(
                "Llama::add_lora",
                format!("unknown target {bad:?}; choose among {TARGETS:?} or {ALL_LINEAR:?}"),
            ));
        }
        let targets: Vec<&str> = match cfg.targets.iter().any(|t| t == ALL_LINEAR) {
            true => TARGETS.to_vec(),
            false => cfg.targets.iter().map(String::as_str).collect(),
        };
        for p in self.parameters() {
            p.set_requires_grad(false);
        }
        for t in targets {
            for lin in self.projections_mut(t) {
                lin.add_lora(cfg, gen)?;
            }
        }
        Ok(())
    }

    /// The adapters' parameters by name (`layers.0.attention.wq.lora_a`, ...).
    pub fn lora_parameters(&self) -> Vec<(String, Parameter)> {
        self.named_parameters()
            .into_iter()
            .filter(|(n, _)| n.contains(".lora_"))
            .collect()
    }

    /// Folds every adapter into its weight and unfreezes the model (then `save_hf` exports
    /// the fine-tuned weights).
    pub fn merge_lora(&mut self) -> Result<()> {
        for t in TARGETS {
            for lin in self.projections_mut(t) {
                lin.merge_lora()?;
            }
        }
        for p in self.parameters() {
            p.set_requires_grad(true);
        }
        Ok(())
    }

    /// Writes the adapters alone as a safetensors file (a few MB for a large model).
    pub fn save_lora(&self, path: impl AsRef<Path>) -> Result<()> {
        let named = self.lora_parameters();
        let values: Vec<(String, Tensor)> = named
            .into_iter()
            .map(|(n, p)| (n, p.value().clone()))
            .collect();
        let refs: Vec<(&str, &Tensor)> = values.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_safetensors(path, &refs, None)
    }

    /// Loads adapters saved by [`Llama::save_lora`] into this model's adapters (added with the
    /// same targets and rank); every name and shape must match.
    pub fn load_lora(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mine: HashMap<String, Parameter> = self.lora_parameters().into_iter().collect();
        let saved = load_safetensors(path)?;
        let what = path.display().to_string();
        if saved.len() != mine.len() {
            return Err(Error::format(
                &what,
                format!(
                    "{} adapter tensors, the model has {}",
                    saved.len(),
                    mine.len()
                ),
            ));
        }
        for (name, t) in saved {
            let p = mine.get(&name).ok_or_else(|| {
                Error::format(&what, format!("the model has no adapter '{name}'"))
            })?;
            if t.shape() != p.shape() {
                return Err(Error::format(
                    &what,
                    format!(
                        "'{name}' is {:?}; the model's is {:?}",
                        t.shape(),
                        p.shape()
                    ),
                ));
            }
            p.assign(&t)?;
        }
        Ok(())
    }
}
