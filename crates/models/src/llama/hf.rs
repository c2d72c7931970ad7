//! Hugging Face interchange: a `LlamaForCausalLM` directory (config.json + model.safetensors, or shards with model.safetensors.index.json) read into a netcl Llama, and a netcl Llama written back in that layout.
use super::config::{LlamaConfig, RopeScaling};
use super::model::Llama;
use super::stored::{check_stored, Stored};
use netcl_autograd::Parameter;
use netcl_nn::{save_safetensors, Module, SafetensorsFile};
use netcl_ops::files::read_regular;
use netcl_ops::{DType, Device, Error, Generator, Result, RopeStyle, Tensor};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// netcl's name of a Hugging Face tensor name (None for names netcl has no tensor for).
fn netcl_name(hf: &str) -> Option<String> {
    if hf == "model.embed_tokens.weight" {
        return Some("tok_embeddings.weight".into());
    }
    if hf == "model.norm.weight" {
        return Some("norm.weight".into());
    }
    if hf == "lm_head.weight" {
        return Some("output.weight".into());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (i, tail) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let ours = match tail {
        "input_layernorm.weight" => "attention_norm.weight",
        "self_attn.q_proj.weight" => "attention.wq.weight",
        "self_attn.k_proj.weight" => "attention.wk.weight",
        "self_attn.v_proj.weight" => "attention.wv.weight",
        "self_attn.o_proj.weight" => "attention.wo.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "mlp.gate_proj.weight" => "feed_forward.w1.weight",
        "mlp.down_proj.weight" => "feed_forward.w2.weight",
        "mlp.up_proj.weight" => "feed_forward.w3.weight",
        _ => return None,
    };
    Some(format!("layers.{i}.{ours}"))
}

/// The Hugging Face name of a netcl tensor name (the inverse of [`netcl_name`]).
fn hf_name(ours: &str) -> Option<String> {
    match ours {
        "tok_embeddings.weight" => return Some("model.embed_tokens.weight".into()),
        "norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = ours.strip_prefix("layers.")?;
    let (i, tail) = rest.split_once('.')?;
    let hf = match tail {
        "attention_norm.weight" => "input_layernorm.weight",
        "attention.wq.weight" => "self_attn.q_proj.weight",
        "attention.wk.weight" => "self_attn.k_proj.weight",
        "attention.wv.weight" => "self_attn.v_proj.weight",
        "attention.wo.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "feed_forward.w1.weight" => "mlp.gate_proj.weight",
        "feed_forward.w2.weight" => "mlp.down_proj.weight",
        "feed_forward.w3.weight" => "mlp.up_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{i}.{hf}"))
}

fn dtype_from_torch(name: &str) -> Option<DType> {
    match name {
        "float32" => Some(DType::F32),
        "float16" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        "float64" => Some(DType::F64),
        _ => None,
    }
}

fn torch_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        _ => "float32",
    }
}

impl LlamaConfig {
    /// The config of a Hugging Face `config.json` (`LlamaConfig` fields; `what` names the file in
    /// errors). RoPE pairs split halves, as transformers rotates them. `rope_scaling` may be none or
    /// "llama3"; others are an error naming them.
    pub fn from_hf(v: &Value, what: &str) -> Result<LlamaConfig> {
        let err = |msg: String| Error::format(what, msg);
        let int = |key: &str| -> Result<usize> {
            v.get(key)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| err(format!("missing or non-integer \"{key}\"")))
        };
        // transformers 4 writes rope_theta and rope_scaling; 5 writes rope_parameters with a
        // rope_type ("default": plain RoPE).
        let params = v.get("rope_parameters").filter(|p| p.is_object());
        let scaling = v.get("rope_scaling").filter(|s| !s.is_null()).or_else(|| {
            params.filter(|p| {
                p.get("rope_type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t != "default")
            })
        });
        let rope_scaling = match scaling {
            None => None,
            Some(s) => {
                let kind = s
                    .get("rope_type")
                    .or_else(|| s.get("type"))
                    .and_then(Value::as_str);
                if kind != Some("llama3") {
                    return Err(err(format!(
                        "rope_scaling {:?} is not supported (none and \"llama3\" are)",
                        kind.unwrap_or("?")
                    )));
                }
                let f = |k: &str| {
                    s.get(k)
                        .and_then(Value::as_f64)
                        .ok_or_else(|| err(format!("rope_scaling llama3 lacks \"{k}\"")))
                };
                Some(RopeScaling {
                    factor: f("factor")?,
                    low_freq_factor: f("low_freq_factor")?,
                    high_freq_factor: f("high_freq_factor")?,
                    original_max_position_embeddings: f("original_max_position_embeddings")?
                        as usize,
                })
            }
        };
        let theta = v
            .get("rope_theta")
            .or_else(|| params.and_then(|p| p.get("rope_theta")))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        let heads = int("num_attention_heads")?;
        let dim = int("hidden_size")?;
        if let Some(hd) = v.get("head_dim").and_then(Value::as_u64) {
            if hd as usize * heads != dim {
                return Err(err(format!(
                    "head_dim {hd} x {heads} heads != hidden_size {dim}: not supported"
                )));
            }
        }
        let dtype = match v
            .get("torch_dtype")
            .or_else(|| v.get("dtype"))
            .and_then(Value::as_str)
        {
            None => DType::F32,
            Some(t) => dtype_from_torch(t)
                .ok_or_else(|| err(format!("torch_dtype {t:?} is not supported")))?,
        };
        let cfg = LlamaConfig {
            dim,
            n_layers: int("num_hidden_layers")?,
            n_heads: heads,
            n_kv_heads: v
                .get("num_key_value_heads")
                .and_then(Value::as_u64)
                .map_or(heads, |x| x as usize),
            vocab_size: int("vocab_size")?,
            hidden_dim: int("intermediate_size")?,
            norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta: theta,
            rope_style: RopeStyle::Halves,
            max_seq_len: int("max_position_embeddings")?,
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            dtype,
            rope_scaling,
        };
        cfg.validate().map_err(|e| err(e.to_string()))?;
        Ok(cfg)
    }

    /// A Hugging Face `config.json` for this config (`LlamaForCausalLM`). Only the split-halves
    /// RoPE exists there: an interleaved config is an error.
    pub fn to_hf(&self) -> Result<Value> {
        if self.rope_style != RopeStyle::Halves {
            return Err(Error::invalid(
                "LlamaConfig::to_hf",
                "Hugging Face Llama rotates split halves; this model uses interleaved pairs",
            ));
        }
        Ok(json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.dim,
            "intermediate_size": self.hidden_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.as_ref().map(|r| json!({
                "rope_type": "llama3",
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings,
            })),
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tied_embeddings,
            "torch_dtype": torch_name(self.dtype),
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
        }))
    }
}

/// The safetensors files of a Hugging Face directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` lists, each a regular file inside `dir`.
fn weight_files(dir: &Path) -> Result<Vec<(String, SafetensorsFile)>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![(shown(&single), SafetensorsFile::open(&single)?)]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = read_regular(&index, INDEX_LIMIT, "a shard index")?;
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::format(shown(&index), format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::format(shown(&index), "no \"weight_map\" object"))?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    files.sort();
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let p = inside(dir, &f, &index)?;
            Ok((shown(&p), SafetensorsFile::open(&p)?))
        })
        .collect()
}

/// The most bytes of config.json and a shard index read.
const INDEX_LIMIT: u64 = 64 << 20;

/// `dir/rel` for a shard named in the index: a relative path of plain components that stays
/// inside `dir` once symlinks are resolved; anything else is an error naming the index.
fn inside(dir: &Path, rel: &str, index: &Path) -> Result<PathBuf> {
    let leaves = |why: String| {
        Error::format(
            shown(index),
            format!("weight_map names {rel:?}, {why}: shards must lie in the model directory"),
        )
    };
    let p = Path::new(rel);
    if p.is_absolute() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(leaves("a path that leaves the directory".into()));
    }
    let full = dir.join(p);
    let real = full
        .canonicalize()
        .map_err(|e| Error::io(shown(&full), e))?;
    let base = dir.canonicalize().map_err(|e| Error::io(shown(dir), e))?;
    if !real.starts_with(&base) {
        return Err(leaves(format!("which resolves to {}", shown(&real))));
    }
    Ok(full)
}

impl Llama {
    /// Reads a Hugging Face Llama directory: `config.json` and `model.safetensors` (or shards
    /// listed in `model.safetensors.index.json`), memory-mapped and moved to `device` tensor by
    /// tensor, kept in their stored dtype unless `dtype` asks for another. Before the model is
    /// built, the files are checked against the config: every tensor present once with its
    /// shape and a float dtype, none missing or unknown, shards regular files inside `dir`; an
    /// error names the file and the tensor. A float tensor stored in another dtype than the
    /// model's (and not converted on request) is converted with a note on stderr
    /// ([`Llama::from_hf_with_notes`] returns the notes instead).
    pub fn from_hf(dir: impl AsRef<Path>, device: &Device, dtype: Option<DType>) -> Result<Llama> {
        let (model, notes) = Llama::from_hf_with_notes(dir, device, dtype)?;
        for n in notes {
            eprintln!("netcl: {n}");
        }
        Ok(model)
    }

    /// [`Llama::from_hf`], returning what it converted without being asked (one note per file
    /// and dtype pair) instead of printing it.
    pub fn from_hf_with_notes(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: Option<DType>,
    ) -> Result<(Llama, Vec<String>)> {
        let dir = dir.as_ref();
        let cfg_path = dir.join("config.json");
        let text = read_regular(&cfg_path, INDEX_LIMIT, "a config")?;
        let v: Value = serde_json::from_slice(&text)
            .map_err(|e| Error::format(shown(&cfg_path), format!("not valid JSON: {e}")))?;
        let mut cfg = LlamaConfig::from_hf(&v, &shown(&cfg_path))?;
        let files = weight_files(dir)?;
        // Every tensor of every file, by netcl's name, before anything is allocated.
        let mut stored: Vec<Stored> = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        for (file, f) in &files {
            for name in f.names()? {
                if name.ends_with("rotary_emb.inv_freq") {
                    continue; // a buffer older exports carry; netcl computes the frequencies
                }
                if let Some(first) = seen.insert(name.clone(), file.clone()) {
                    return Err(Error::format(
                        shown(dir),
                        format!("tensor '{name}' is in {first} and in {file}: which is meant?"),
                    ));
                }
                if name == "lm_head.weight" && cfg.tied_embeddings {
                    continue; // tied: the embedding table is the output projection
                }
                let ours = netcl_name(&name).ok_or_else(|| {
                    Error::format(
                        file,
                        format!("unknown tensor '{name}' for this Llama config"),
                    )
                })?;
                let (dtype, shape) = f.info(&name)?;
                stored.push(Stored {
                    name: ours,
                    dtype,
                    shape,
                    file: file.clone(),
                });
            }
        }
        let hf = |n: &str| hf_name(n).unwrap_or_else(|| n.to_string());
        check_stored(&cfg, &stored, &shown(dir), hf)?;
        let embedding = stored.iter().find(|s| s.name == "tok_embeddings.weight");
        // Keep the stored dtype (of the embedding table), whatever config.json says.
        cfg.dtype = dtype.or(embedding.map(|s| s.dtype)).unwrap_or(cfg.dtype);
        let mut converted: BTreeMap<(String, &str), usize> = BTreeMap::new();
        if dtype.is_none() {
            for s in stored.iter().filter(|s| s.dtype != cfg.dtype) {
                *converted
                    .entry((s.file.clone(), s.dtype.name()))
                    .or_default() += 1;
            }
        }
        let notes = converted
            .into_iter()
            .map(|((file, from), n)| {
                format!(
                    "{file}: {n} {from} tensor(s) converted to the model's {}",
                    cfg.dtype
                )
            })
            .collect();
        let model = Llama::new(cfg, device, &mut Generator::new(0))?;
        let params: HashMap<String, Parameter> = model.named_parameters().into_iter().collect();
        for (_, f) in &files {
            for name in f.names()? {
                let Some(p) = netcl_name(&name).and_then(|n| params.get(&n)) else {
                    continue; // inv_freq, or lm_head of tied embeddings: checked above
                };
                if name == "lm_head.weight" && model.config.tied_embeddings {
                    continue;
                }
                p.assign(&f.tensor(&name, device)?)?;
            }
        }
        Ok((model, notes))
    }

    /// Writes the model as a Hugging Face directory that `LlamaForCausalLM.from_pretrained` loads:
    /// `config.json` and `model.safetensors` (metadata `format: pt`).
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io(shown(dir), e))?;
        let config = self.config.to_hf()?;
        let named = self.named_parameters();
        let mut tensors: Vec<(String, Tensor)> = Vec::with_capacity(named.len());
        for (n, p) in named {
            let hf = hf_name(&n).ok_or_else(|| {
                Error::invalid("Llama::save_hf", format!("no Hugging Face name for '{n}'"))
            })?;
            tensors.push((hf, p.value().clone()));
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        save_safetensors(dir.join("model.safetensors"), &refs, Some(meta))?;
        let text = serde_json::to_string_pretty(&config)
            .map_err(|e| Error::format(shown(dir), format!("config.json: {e}")))?;
        let path = dir.join("config.json");
        std::fs::write(&path, text).map_err(|e| Error::io(shown(&path), e))
    }
}
