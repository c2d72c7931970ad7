//! Hugging Face interchange: a model directory (config.json + model.safetensors, or shards with model.safetensors.index.json) of a LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM or GPT2LMHeadModel read into a netcl Llama with its family's switches, and written back in that family's layout.
use super::config::LlamaConfig;
use super::hf_names::{exports, hf_name, ignored, pieces};
use super::model::Llama;
use super::stored::{check_stored, Stored};
use netcl_autograd::Parameter;
use netcl_nn::{save_safetensors, Module, SafetensorsFile};
use netcl_ops::files::read_regular;
use netcl_ops::{DType, Device, Error, Generator, Result, Tensor};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

fn shown(p: &Path) -> String {
    p.display().to_string()
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
    /// Reads a Hugging Face directory of a Llama, Qwen2, Mistral or GPT-2 model (by config.json's
    /// `architectures`; another is an error naming it): `config.json` and `model.safetensors` (or shards
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
        let family = cfg.arch.family;
        let files = weight_files(dir)?;
        // Every tensor of every file, by netcl's name, before anything is allocated.
        let mut stored: Vec<Stored> = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        for (file, f) in &files {
            for name in f.names()? {
                if ignored(family, &name) {
                    continue; // buffers (RoPE's, GPT-2's masks) that netcl computes
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
                let parts = pieces(&cfg, &name).ok_or_else(|| {
                    Error::format(
                        file,
                        format!("unknown tensor '{name}' for this {family:?} config"),
                    )
                })?;
                let (dtype, shape) = f.info(&name)?;
                // A tensor split into pieces (GPT-2's c_attn) must be exactly their rows.
                let total: usize = parts.iter().filter_map(|p| p.rows).map(|r| r.1).sum();
                let split_ok = parts[0].rows.is_none()
                    || parts[0].shape(&shape).is_some_and(|_| {
                        let t = if parts[0].transpose {
                            shape.last()
                        } else {
                            shape.first()
                        };
                        t == Some(&total)
                    });
                if !split_ok {
                    let want = match parts[0].transpose {
                        true => format!("[{}, {total}]", cfg.dim),
                        false => format!("[{total}]"),
                    };
                    return Err(Error::format(
                        file,
                        format!(
                            "tensor '{name}' is {shape:?}; the config needs {want} (queries, keys \
                             and values side by side)"
                        ),
                    ));
                }
                for p in parts {
                    let shape = p.shape(&shape).unwrap_or_else(|| shape.clone());
                    stored.push(Stored {
                        name: p.ours,
                        dtype,
                        shape,
                        file: file.clone(),
                    });
                }
            }
        }
        let hf = |n: &str| hf_name(family, n).unwrap_or_else(|| n.to_string());
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
                if ignored(family, &name)
                    || (name == "lm_head.weight" && model.config.tied_embeddings)
                {
                    continue; // checked above
                }
                for piece in pieces(&model.config, &name).unwrap_or_default() {
                    let Some(p) = params.get(&piece.ours) else {
                        continue;
                    };
                    p.assign(&piece.take(f.tensor(&name, device)?)?)?;
                }
            }
        }
        Ok((model, notes))
    }

    /// Writes the model as a Hugging Face directory of its family that transformers'
    /// `from_pretrained` loads (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`,
    /// `GPT2LMHeadModel`): `config.json` and `model.safetensors` (metadata `format: pt`).
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io(shown(dir), e))?;
        let config = self.config.to_hf()?;
        let named = self
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.value().clone()))
            .collect();
        let tensors = exports(&self.config, named)?;
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        save_safetensors(dir.join("model.safetensors"), &refs, Some(meta))?;
        let text = serde_json::to_string_pretty(&config)
            .map_err(|e| Error::format(shown(dir), format!("config.json: {e}")))?;
        let path = dir.join("config.json");
        std::fs::write(&path, text).map_err(|e| Error::io(shown(&path), e))
    }
}
