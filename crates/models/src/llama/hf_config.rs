//! Hugging Face config.json of each family (Llama, Qwen2, Mistral, GPT-2) read into a LlamaConfig with its Arch switches, and written back; anything netcl cannot honour is an error naming the key.
use super::config::{Arch, Family, LlamaConfig, RopeScaling};
use netcl_ops::{DType, Error, Result, RopeStyle};
use serde_json::{json, Value};

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

/// The family config.json describes, by its `architectures` (first entry) or else its
/// `model_type`; neither: Llama (older netcl exports and hand-written configs). Anything else
/// is an error naming it.
pub fn family_of(v: &Value, what: &str) -> Result<Family> {
    let arch = v
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    let model_type = v.get("model_type").and_then(Value::as_str);
    let known: Vec<&str> = Family::ALL.iter().map(|f| f.names().1).collect();
    let found = match (arch, model_type) {
        (Some(a), _) => Family::ALL.into_iter().find(|f| f.names().1 == a),
        (None, Some(t)) => Family::ALL.into_iter().find(|f| f.names().0 == t),
        (None, None) => Some(Family::Llama),
    };
    found.ok_or_else(|| {
        let name = arch.map_or_else(
            || format!("model_type {:?}", model_type.unwrap_or("?")),
            |a| format!("architecture {a:?}"),
        );
        Error::format(
            what,
            format!("{name} is not supported: netcl reads {}", known.join(", ")),
        )
    })
}

/// Key access with errors naming the file and key.
struct Keys<'a> {
    v: &'a Value,
    what: &'a str,
}

impl Keys<'_> {
    fn err(&self, msg: String) -> Error {
        Error::format(self.what, msg)
    }
    fn int(&self, key: &str) -> Result<usize> {
        self.v
            .get(key)
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .ok_or_else(|| self.err(format!("missing or non-integer \"{key}\"")))
    }
    fn opt_int(&self, key: &str) -> Option<usize> {
        self.v.get(key).and_then(Value::as_u64).map(|x| x as usize)
    }
    fn float(&self, key: &str, default: f64) -> f64 {
        self.v.get(key).and_then(Value::as_f64).unwrap_or(default)
    }
    fn flag(&self, key: &str, default: bool) -> bool {
        self.v.get(key).and_then(Value::as_bool).unwrap_or(default)
    }
    fn str(&self, key: &str) -> Option<&str> {
        self.v.get(key).and_then(Value::as_str)
    }
    /// Error unless `key` is absent, null or one of `allowed`.
    fn only(&self, key: &str, allowed: &[&str]) -> Result<()> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(()),
            Some(other) => Err(self.err(format!(
                "\"{key}\": {other} is not supported (netcl takes {allowed:?})"
            ))),
        }
    }
    /// Error unless the boolean `key` is absent or `want`.
    fn must(&self, key: &str, want: bool) -> Result<()> {
        match self.v.get(key).and_then(Value::as_bool) {
            Some(b) if b != want => Err(self.err(format!(
                "\"{key}\": {b} is not supported (netcl needs {want})"
            ))),
            _ => Ok(()),
        }
    }
}

/// RoPE's scaling (transformers 4's rope_scaling, 5's rope_parameters): none, "llama3" or
/// "linear"; others are an error naming them. Returns (theta, llama3, linear factor).
fn rope(k: &Keys) -> Result<(f64, Option<RopeScaling>, Option<f64>)> {
    let v = k.v;
    let params = v.get("rope_parameters").filter(|p| p.is_object());
    let scaling = v.get("rope_scaling").filter(|s| !s.is_null()).or_else(|| {
        params.filter(|p| {
            p.get("rope_type")
                .and_then(Value::as_str)
                .is_some_and(|t| t != "default")
        })
    });
    let theta = v
        .get("rope_theta")
        .or_else(|| params.and_then(|p| p.get("rope_theta")))
        .and_then(Value::as_f64)
        .unwrap_or(10000.0);
    let Some(s) = scaling else {
        return Ok((theta, None, None));
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str);
    let f = |key: &str| {
        s.get(key).and_then(Value::as_f64).ok_or_else(|| {
            k.err(format!(
                "rope_scaling {} lacks \"{key}\"",
                kind.unwrap_or("?")
            ))
        })
    };
    match kind {
        Some("llama3") => Ok((
            theta,
            Some(RopeScaling {
                factor: f("factor")?,
                low_freq_factor: f("low_freq_factor")?,
                high_freq_factor: f("high_freq_factor")?,
                original_max_position_embeddings: f("original_max_position_embeddings")? as usize,
            }),
            None,
        )),
        Some("linear") => Ok((theta, None, Some(f("factor")?))),
        Some("default") => Ok((theta, None, None)),
        other => Err(k.err(format!(
            "rope_scaling {:?} is not supported (none, \"default\", \"llama3\" and \"linear\" are)",
            other.unwrap_or("?")
        ))),
    }
}

/// The stored dtype config.json names (`torch_dtype`, or transformers 5's `dtype`).
fn dtype(k: &Keys) -> Result<DType> {
    match k.str("torch_dtype").or_else(|| k.str("dtype")) {
        None => Ok(DType::F32),
        Some(t) => {
            dtype_from_torch(t).ok_or_else(|| k.err(format!("torch_dtype {t:?} is not supported")))
        }
    }
}

/// Qwen2's sliding window: used only where `use_sliding_window`, and then on the layers from
/// `max_window_layers` on (transformers 5 lists them in `layer_types`). netcl runs one window for
/// every layer or none: mixed layers are an error naming the keys.
fn qwen2_window(k: &Keys, layers: usize) -> Result<Option<usize>> {
    let types: Option<Vec<&str>> =
        k.v.get("layer_types")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect());
    let sliding = match (&types, k.flag("use_sliding_window", false)) {
        (Some(t), _) => t.iter().filter(|x| **x == "sliding_attention").count(),
        (None, false) => 0,
        (None, true) => layers.saturating_sub(k.opt_int("max_window_layers").unwrap_or(layers)),
    };
    if sliding == 0 {
        return Ok(None);
    }
    if sliding != layers {
        return Err(k.err(format!(
            "\"use_sliding_window\" with \"max_window_layers\"/\"layer_types\" windows {sliding} of \
             {layers} layers: mixed sliding and full attention layers are not supported"
        )));
    }
    k.opt_int("sliding_window")
        .map(Some)
        .ok_or_else(|| k.err("\"use_sliding_window\" without an integer \"sliding_window\"".into()))
}

impl LlamaConfig {
    /// The config of a Hugging Face `config.json` (`what` names the file in errors): Llama, Qwen2,
    /// Mistral or GPT-2 by its architecture ([`family_of`]). RoPE pairs split halves, as
    /// transformers rotates them. A feature netcl does not implement (another RoPE scaling than
    /// llama3 or linear, another activation, Qwen2's windows on some layers only, ...) is an error
    /// naming the key.
    pub fn from_hf(v: &Value, what: &str) -> Result<LlamaConfig> {
        let family = family_of(v, what)?;
        let k = Keys { v, what };
        let cfg = match family {
            Family::Gpt2 => gpt2(&k)?,
            _ => llama_like(&k, family)?,
        };
        cfg.validate().map_err(|e| k.err(e.to_string()))?;
        Ok(cfg)
    }

    /// A Hugging Face `config.json` for this config, in its family's layout. Only the
    /// split-halves RoPE exists there: an interleaved config is an error.
    pub fn to_hf(&self) -> Result<Value> {
        if self.rope_style != RopeStyle::Halves && !self.arch.learned_positions {
            return Err(Error::invalid(
                "LlamaConfig::to_hf",
                "Hugging Face Llama rotates split halves; this model uses interleaved pairs",
            ));
        }
        let a = &self.arch;
        let (model_type, arch) = a.family.names();
        if a.family == Family::Gpt2 {
            return Ok(json!({
                "architectures": [arch],
                "model_type": model_type,
                "vocab_size": self.vocab_size,
                "n_positions": self.max_seq_len,
                "n_embd": self.dim,
                "n_layer": self.n_layers,
                "n_head": self.n_heads,
                "n_inner": self.hidden_dim,
                "activation_function": "gelu_new",
                "layer_norm_epsilon": self.norm_eps,
                "tie_word_embeddings": self.tied_embeddings,
                "scale_attn_weights": true,
                "torch_dtype": torch_name(self.dtype),
            }));
        }
        let rope_scaling = match (&self.rope_scaling, a.rope_linear) {
            (Some(r), _) => json!({
                "rope_type": "llama3",
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings,
            }),
            (None, Some(f)) => json!({"rope_type": "linear", "factor": f}),
            (None, None) => Value::Null,
        };
        let mut v = json!({
            "architectures": [arch],
            "model_type": model_type,
            "hidden_size": self.dim,
            "intermediate_size": self.hidden_dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim(),
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tied_embeddings,
            "torch_dtype": torch_name(self.dtype),
            "hidden_act": "silu",
        });
        let m = v
            .as_object_mut()
            .ok_or_else(|| Error::invalid("to_hf", "not an object"))?;
        let w = a.sliding_window;
        match a.family {
            Family::Qwen2 => {
                m.insert("use_sliding_window".into(), w.is_some().into());
                m.insert("sliding_window".into(), w.into());
                m.insert("max_window_layers".into(), 0.into());
                let kind = if w.is_some() {
                    "sliding_attention"
                } else {
                    "full_attention"
                };
                m.insert("layer_types".into(), vec![kind; self.n_layers].into());
            }
            Family::Mistral => {
                m.insert("sliding_window".into(), w.into());
            }
            _ => {
                m.insert("attention_bias".into(), a.qkv_bias.into());
                m.insert("mlp_bias".into(), a.mlp_bias.into());
            }
        }
        Ok(v)
    }
}

/// Llama, Qwen2 and Mistral: the same fields, each family's biases and window.
fn llama_like(k: &Keys, family: Family) -> Result<LlamaConfig> {
    let (theta, rope_scaling, rope_linear) = rope(k)?;
    let heads = k.int("num_attention_heads")?;
    let dim = k.int("hidden_size")?;
    if let Some(hd) = k.opt_int("head_dim") {
        if hd * heads != dim {
            return Err(k.err(format!(
                "head_dim {hd} x {heads} heads != hidden_size {dim}: not supported"
            )));
        }
    }
    k.only("hidden_act", &["silu"])?;
    let layers = k.int("num_hidden_layers")?;
    let mut arch = Arch {
        rope_linear,
        ..Arch::of(family)
    };
    match family {
        Family::Qwen2 => arch.sliding_window = qwen2_window(k, layers)?,
        Family::Mistral => arch.sliding_window = k.opt_int("sliding_window"),
        _ => {
            // Llama's attention_bias puts biases on q, k, v and o.
            let bias = k.flag("attention_bias", false);
            (arch.qkv_bias, arch.out_bias) = (bias, bias);
            arch.mlp_bias = k.flag("mlp_bias", false);
        }
    }
    Ok(LlamaConfig {
        dim,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: k.opt_int("num_key_value_heads").unwrap_or(heads),
        vocab_size: k.int("vocab_size")?,
        hidden_dim: k.int("intermediate_size")?,
        norm_eps: k.float("rms_norm_eps", 1e-6),
        rope_theta: theta,
        rope_style: RopeStyle::Halves,
        max_seq_len: k.int("max_position_embeddings")?,
        tied_embeddings: k.flag("tie_word_embeddings", false),
        dtype: dtype(k)?,
        rope_scaling,
        arch,
    })
}

/// GPT-2: LayerNorm, GELU (tanh) MLP, learned positions, every projection with a bias, one
/// key/value head per query head, tied head by default.
fn gpt2(k: &Keys) -> Result<LlamaConfig> {
    k.only("activation_function", &["gelu_new", "gelu_pytorch_tanh"])?;
    k.must("scale_attn_weights", true)?;
    k.must("scale_attn_by_inverse_layer_idx", false)?;
    k.must("add_cross_attention", false)?;
    let dim = k.int("n_embd")?;
    let heads = k.int("n_head")?;
    Ok(LlamaConfig {
        dim,
        n_layers: k.int("n_layer")?,
        n_heads: heads,
        n_kv_heads: heads,
        vocab_size: k.int("vocab_size")?,
        hidden_dim: k.opt_int("n_inner").unwrap_or(4 * dim),
        norm_eps: k.float("layer_norm_epsilon", 1e-5),
        rope_theta: 10000.0,
        rope_style: RopeStyle::Halves,
        max_seq_len: k.int("n_positions")?,
        tied_embeddings: k.flag("tie_word_embeddings", true),
        dtype: dtype(k)?,
        rope_scaling: None,
        arch: Arch::of(Family::Gpt2),
    })
}
