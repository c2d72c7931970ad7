//! LoRA fine-tuning of a Llama (and the families built from its blocks): adapters on the chosen projections (q, k, v, o, gate, up, down, or the family's Hugging Face module names), added all at once or not at all, saved with their rank, alpha and targets and loaded only into adapters of the same, all or nothing; merged into the weights for export.
use super::block::Block;
use super::config::Family;
use super::model::Llama;
use netcl_autograd::Parameter;
use netcl_nn::{save_safetensors, Linear, LoraAdapter, LoraConfig, Module, SafetensorsFile};
use netcl_ops::{Error, Generator, Result, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// The projections LoRA can target, by their Hugging Face short names.
const TARGETS: [&str; 7] = ["q", "k", "v", "o", "gate", "up", "down"];

/// The target naming all of them (PEFT's `target_modules="all-linear"`).
const ALL_LINEAR: &str = "all-linear";
/// Metadata keys of an adapter file.
const RANK: &str = "netcl.lora.rank";
const ALPHA: &str = "netcl.lora.alpha";
const TARGETS_KEY: &str = "netcl.lora.targets";

/// What a model's adapters are: rank, alpha and targets (in the order q, k, v, o, gate, up, down). An adapter file
/// records it, and loads only into adapters with the same.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<String>,
}

impl std::fmt::Display for LoraSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {}, alpha {}, targets {}",
            self.rank,
            self.alpha,
            self.targets.join(",")
        )
    }
}

/// The netcl targets a Hugging Face module name of `family` stands for (PEFT's
/// `target_modules`): Llama, Qwen2 and Mistral's `q_proj` ... `down_proj`; GPT-2's `c_attn`
/// (queries, keys and values: netcl keeps them apart and re-fuses them at export), `c_proj`
/// (the attention's output and the MLP's down projection, as PEFT matches both) and `c_fc`.
fn hf_targets(family: Family, name: &str) -> Option<&'static [&'static str]> {
    Some(match (family, name) {
        (Family::Gpt2, "c_attn") => &["q", "k", "v"],
        (Family::Gpt2, "c_proj") => &["o", "down"],
        (Family::Gpt2, "c_fc") => &["gate"],
        (Family::Gpt2, _) => return None,
        (_, "q_proj") => &["q"],
        (_, "k_proj") => &["k"],
        (_, "v_proj") => &["v"],
        (_, "o_proj") => &["o"],
        (_, "gate_proj") => &["gate"],
        (_, "up_proj") => &["up"],
        (_, "down_proj") => &["down"],
        _ => return None,
    })
}

impl Llama {
    /// The projections of every layer named `target` (none for `up` in a GELU MLP).
    fn projections_mut(&mut self, target: &str) -> Vec<&mut Linear> {
        fn pick<'a>(b: &'a mut Block, target: &str) -> Option<&'a mut Linear> {
            let (a, f) = (&mut b.attention, &mut b.feed_forward);
            match target {
                "q" => Some(&mut a.wq),
                "k" => Some(&mut a.wk),
                "v" => Some(&mut a.wv),
                "o" => Some(&mut a.wo),
                "gate" => Some(&mut f.w1),
                "up" => f.w3.as_mut(),
                _ => Some(&mut f.w2),
            }
        }
        self.layers
            .iter_mut()
            .filter_map(|b| pick(b, target))
            .collect()
    }

    /// The projections of every layer named `target`, read only.
    fn projections(&self, target: &str) -> Vec<&Linear> {
        fn pick<'a>(b: &'a Block, target: &str) -> Option<&'a Linear> {
            let (a, f) = (&b.attention, &b.feed_forward);
            match target {
                "q" => Some(&a.wq),
                "k" => Some(&a.wk),
                "v" => Some(&a.wv),
                "o" => Some(&a.wo),
                "gate" => Some(&f.w1),
                "up" => f.w3.as_ref(),
                _ => Some(&f.w2),
            }
        }
        self.layers.iter().filter_map(|b| pick(b, target)).collect()
    }

    /// The netcl targets `cfg.targets` names (netcl's short names, `all-linear`, or the
    /// family's module names), in the order given; unknown or repeated ones are errors.
    fn lora_targets(&self, cfg: &LoraConfig) -> Result<Vec<&'static str>> {
        let op = "Llama::add_lora";
        let family = self.config.arch.family;
        let mut out: Vec<&'static str> = Vec::new();
        for t in &cfg.targets {
            let names: Vec<&'static str> = match TARGETS.iter().find(|x| *x == t) {
                Some(x) => vec![*x],
                None if t == ALL_LINEAR => TARGETS
                    .into_iter()
                    .filter(|x| !self.projections(x).is_empty())
                    .collect(),
                None => hf_targets(family, t)
                    .ok_or_else(|| {
                        Error::invalid(
                            op,
                            format!(
                                "unknown target {t:?}; choose among {TARGETS:?}, {ALL_LINEAR:?} \
                                 or the {family:?} module names"
                            ),
                        )
                    })?
                    .to_vec(),
            };
            for n in names {
                if out.contains(&n) {
                    return Err(Error::invalid(
                        op,
                        format!("target {n:?} is listed twice (through {t:?})"),
                    ));
                }
                if self.projections(n).is_empty() {
                    return Err(Error::invalid(
                        op,
                        format!("target {n:?}: a {family:?} model has no such projection"),
                    ));
                }
                out.push(n);
            }
        }
        Ok(out)
    }

    /// The rank, alpha and targets of the model's adapters; `None` without any. Adapters that
    /// differ between projections, or cover a target in some layers only, are an error.
    pub fn lora_spec(&self) -> Result<Option<LoraSpec>> {
        let mut spec: Option<LoraSpec> = None;
        let mut targets = Vec::new();
        for t in TARGETS {
            let adapters: Vec<&LoraAdapter> = self
                .projections(t)
                .into_iter()
                .filter_map(|l| l.lora.as_ref())
                .collect();
            if adapters.is_empty() {
                continue;
            }
            if adapters.len() != self.layers.len() {
                return Err(Error::invalid(
                    "Llama::lora_spec",
                    format!(
                        "target {t} has adapters in {} of {} layers",
                        adapters.len(),
                        self.layers.len()
                    ),
                ));
            }
            targets.push(t.to_string());
            for a in adapters {
                let (rank, alpha) = (a.rank(), a.alpha);
                match &spec {
                    None => {
                        spec = Some(LoraSpec {
                            rank,
                            alpha,
                            targets: Vec::new(),
                        })
                    }
                    Some(s) if s.rank != rank || s.alpha != alpha => {
                        return Err(Error::invalid(
                            "Llama::lora_spec",
                            format!(
                                "adapters differ: rank {} alpha {} and rank {rank} alpha {alpha}",
                                s.rank, s.alpha
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(spec.map(|s| LoraSpec { targets, ..s }))
    }

    /// Adds LoRA adapters to `cfg.targets` in every layer and freezes every other parameter:
    /// an optimizer over [`Module::trainable_parameters`] then keeps state for the adapters only,
    /// and backward computes no gradient for the frozen weights. The target `all-linear` (as in
    /// PEFT) names every projection of the blocks (not the output head); the family's Hugging
    /// Face module names (`q_proj`, ..., GPT-2's `c_attn`, `c_proj`, `c_fc`) name theirs. All or nothing: every
    /// adapter is made before any is added (an error leaves the model and `gen` as they were),
    /// and a model that has adapters already is an error (trained adapters are never replaced).
    pub fn add_lora(&mut self, cfg: &LoraConfig, gen: &mut Generator) -> Result<()> {
        let op = "Llama::add_lora";
        let mut targets = self.lora_targets(cfg)?;
        // The order of TARGETS, as lora_spec reports them.
        targets.sort_by_key(|t| TARGETS.iter().position(|x| x == t));
        let has = self
            .named_parameters()
            .iter()
            .any(|(n, _)| n.contains(".lora_"));
        if has {
            let spec = self.lora_spec().map_or_else(
                |e| e.to_string(),
                |s| s.map(|s| s.to_string()).unwrap_or_default(),
            );
            return Err(Error::invalid(
                op,
                format!(
                    "the model has adapters already ({spec}): merge_lora first, or load_lora into \
                     them"
                ),
            ));
        }
        let mut g = gen.clone();
        let mut made = Vec::new();
        for &t in &targets {
            for lin in self.projections(t) {
                made.push(LoraAdapter::new(lin.weight.value(), cfg, &mut g)?);
            }
        }
        *gen = g;
        for p in self.parameters() {
            p.set_requires_grad(false);
        }
        let mut made = made.into_iter();
        for &t in &targets {
            for lin in self.projections_mut(t) {
                let adapter = made
                    .next()
                    .ok_or_else(|| Error::invalid(op, "fewer adapters made than projections"))?;
                lin.attach_lora(adapter);
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

    /// Writes the adapters alone as a safetensors file (a few MB for a large model), with their
    /// rank, alpha and targets in its metadata.
    pub fn save_lora(&self, path: impl AsRef<Path>) -> Result<()> {
        let spec = self.lora_spec()?.ok_or_else(|| {
            Error::invalid("Llama::save_lora", "the model has no adapters to save")
        })?;
        let named = self.lora_parameters();
        let values: Vec<(String, Tensor)> = named
            .into_iter()
            .map(|(n, p)| (n, p.value().clone()))
            .collect();
        let refs: Vec<(&str, &Tensor)> = values.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let meta = HashMap::from([
            (RANK.to_string(), spec.rank.to_string()),
            (ALPHA.to_string(), spec.alpha.to_string()),
            (TARGETS_KEY.to_string(), spec.targets.join(",")),
        ]);
        save_safetensors(path, &refs, Some(meta))
    }

    /// Loads adapters saved by [`Llama::save_lora`] into this model's adapters, which must have
    /// the rank, alpha and targets the file records; every name, shape and dtype must match.
    /// All or nothing: every tensor is read and checked before the first is written.
    pub fn load_lora(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let file = SafetensorsFile::open(path)?;
        let saved = file_spec(&file.metadata()?, &what)?;
        let mine = self.lora_spec()?.ok_or_else(|| {
            Error::invalid(
                "Llama::load_lora",
                format!("the model has no adapters: add_lora ({saved}) first"),
            )
        })?;
        if saved != mine {
            return Err(Error::format(
                &what,
                format!("adapters of {saved}; the model's are {mine}"),
            ));
        }
        let params: HashMap<String, Parameter> = self.lora_parameters().into_iter().collect();
        let names = file.names()?;
        if names.len() != params.len() {
            return Err(Error::format(
                &what,
                format!(
                    "{} adapter tensors, the model has {}",
                    names.len(),
                    params.len()
                ),
            ));
        }
        let mut staged = Vec::with_capacity(names.len());
        for name in names {
            let p = params.get(&name).ok_or_else(|| {
                Error::format(&what, format!("the model has no adapter '{name}'"))
            })?;
            let (dtype, shape) = file.info(&name)?;
            if shape != p.shape() || !dtype.is_float() {
                return Err(Error::format(
                    &what,
                    format!(
                        "'{name}' is {dtype} {shape:?}; the model's is {} {:?}",
                        p.dtype(),
                        p.shape()
                    ),
                ));
            }
            let t = file.tensor(&name, p.device())?.to_dtype(p.dtype())?;
            staged.push((p, t));
        }
        for (p, t) in staged {
            p.assign(&t)?;
        }
        Ok(())
    }
}

/// The rank, alpha and targets an adapter file records.
fn file_spec(meta: &HashMap<String, String>, what: &str) -> Result<LoraSpec> {
    let get = |k: &str| {
        meta.get(k).ok_or_else(|| {
            Error::format(
                what,
                format!(
                    "records no LoRA {k} (adapter files keep rank, alpha and targets since they \
                     must match the model's): save it again from its model"
                ),
            )
        })
    };
    let bad = |k: &str, v: &str| Error::format(what, format!("{k} {v:?} is not valid"));
    let rank = get(RANK)?;
    let alpha = get(ALPHA)?;
    Ok(LoraSpec {
        rank: rank.parse().map_err(|_| bad(RANK, rank))?,
        alpha: alpha.parse().map_err(|_| bad(ALPHA, alpha))?,
        targets: get(TARGETS_KEY)?.split(',').map(str::to_string).collect(),
    })
}
