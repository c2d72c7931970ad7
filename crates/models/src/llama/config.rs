//! LlamaConfig: the shape of a Llama model (llama2.c's and Hugging Face's fields) and the switches that make it another family's (Qwen2, Mistral, GPT-2), checked once.
use netcl_ops::{DType, Error, Result, RopeStyle};
use serde::{Deserialize, Serialize};

/// The shape of a Llama model. `hidden_dim` is the SwiGLU width; `n_kv_heads < n_heads` is
/// grouped-query attention (each key/value head serves `n_heads / n_kv_heads` query heads).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab_size: usize,
    pub hidden_dim: usize,
    pub norm_eps: f64,
    pub rope_theta: f64,
    /// "interleaved" (llama2.c) or "halves" (Hugging Face).
    #[serde(with = "style_name")]
    pub rope_style: RopeStyle,
    pub max_seq_len: usize,
    /// The output projection shares the token embedding's table.
    pub tied_embeddings: bool,
    /// Storage dtype of the weights and activations (f32, f16, bf16, f64).
    #[serde(with = "dtype_name")]
    pub dtype: DType,
    /// Llama 3's frequency scaling of RoPE (none: plain RoPE).
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// What sets another family's blocks apart (all off: Llama's).
    #[serde(default)]
    pub arch: Arch,
}

/// The Hugging Face family a model is read as and written back as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    #[default]
    Llama,
    Qwen2,
    Mistral,
    Gpt2,
}

impl Family {
    /// transformers' `model_type` and architecture (`LlamaForCausalLM`, ...).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Family::Llama => ("llama", "LlamaForCausalLM"),
            Family::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
            Family::Mistral => ("mistral", "MistralForCausalLM"),
            Family::Gpt2 => ("gpt2", "GPT2LMHeadModel"),
        }
    }
    pub const ALL: [Family; 4] = [Family::Llama, Family::Qwen2, Family::Mistral, Family::Gpt2];
}

/// The switches of the shared blocks that make a Llama another family's model: Qwen2 is Llama
/// with `qkv_bias`; Mistral Llama with a `sliding_window`; GPT-2 Llama with every bias,
/// `layer_norm`, `gelu_mlp` and `learned_positions` (and no RoPE).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Arch {
    pub family: Family,
    /// Biases on the query, key and value projections.
    pub qkv_bias: bool,
    /// A bias on the attention's output projection.
    pub out_bias: bool,
    /// Biases on the feed-forward projections.
    pub mlp_bias: bool,
    /// Causal attention over at most this many of the latest keys (each query included).
    pub sliding_window: Option<usize>,
    /// LayerNorm with a bias (mean removed) instead of RMSNorm.
    pub layer_norm: bool,
    /// A two-projection MLP with GELU's tanh approximation instead of SwiGLU (no `up`).
    pub gelu_mlp: bool,
    /// A learned table of `max_seq_len` position embeddings instead of RoPE.
    pub learned_positions: bool,
    /// RoPE's "linear" scaling: positions divided by this factor.
    pub rope_linear: Option<f64>,
}

impl Arch {
    /// The switches `family` always has (Qwen2's q/k/v biases; GPT-2's biases, LayerNorm, GELU
    /// MLP and learned positions); a window, Llama's optional biases and RoPE scaling are left off.
    pub fn of(family: Family) -> Arch {
        let gpt2 = family == Family::Gpt2;
        Arch {
            family,
            qkv_bias: gpt2 || family == Family::Qwen2,
            out_bias: gpt2,
            mlp_bias: gpt2,
            layer_norm: gpt2,
            gelu_mlp: gpt2,
            learned_positions: gpt2,
            ..Arch::default()
        }
    }
}

/// Llama 3's RoPE scaling (Hugging Face `rope_type: "llama3"`): long wavelengths are divided by
/// `factor`, short ones kept, and those between blended smoothly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

impl RopeScaling {
    /// The `head_dim / 2` inverse frequencies for base `theta` (transformers'
    /// `_compute_llama3_parameters`).
    pub fn inv_freq(&self, theta: f64, head_dim: usize) -> Vec<f64> {
        let old = self.original_max_position_embeddings as f64;
        let (low_wavelen, high_wavelen) = (old / self.low_freq_factor, old / self.high_freq_factor);
        (0..head_dim / 2)
            .map(|i| {
                let f = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / self.factor
                } else {
                    let smooth = (old / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    (1.0 - smooth) * f / self.factor + smooth * f
                }
            })
            .collect()
    }
}

mod style_name {
    use netcl_ops::RopeStyle;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(s: &RopeStyle, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RopeStyle, D::Error> {
        match String::deserialize(d)?.as_str() {
            "interleaved" => Ok(RopeStyle::Interleaved),
            "halves" => Ok(RopeStyle::Halves),
            other => Err(serde::de::Error::custom(format!(
                "rope_style {other:?}: use \"interleaved\" or \"halves\""
            ))),
        }
    }
}

mod dtype_name {
    use netcl_ops::DType;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        DType::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl LlamaConfig {
    /// The llama2.c "stories15M" shape: dim 288, 6 layers, 6 heads, hidden 768, context 256.
    pub fn llama_15m(vocab_size: usize) -> LlamaConfig {
        LlamaConfig {
            dim: 288,
            n_layers: 6,
            n_heads: 6,
            n_kv_heads: 6,
            vocab_size,
            hidden_dim: 768,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_style: RopeStyle::Interleaved,
            max_seq_len: 256,
            tied_embeddings: true,
            dtype: DType::F32,
            rope_scaling: None,
            arch: Arch::default(),
        }
    }

    /// The "stories110M" shape: dim 768, 12 layers, 12 heads, hidden 2048, context 1024.
    pub fn llama_110m(vocab_size: usize) -> LlamaConfig {
        LlamaConfig {
            dim: 768,
            n_layers: 12,
            n_heads: 12,
            n_kv_heads: 12,
            hidden_dim: 2048,
            max_seq_len: 1024,
            ..LlamaConfig::llama_15m(vocab_size)
        }
    }

    /// A tiny model for tests: dim 16, 2 layers, 4 query and 2 key/value heads.
    pub fn tiny(vocab_size: usize) -> LlamaConfig {
        LlamaConfig {
            dim: 16,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            hidden_dim: 40,
            max_seq_len: 32,
            ..LlamaConfig::llama_15m(vocab_size)
        }
    }

    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads.max(1)
    }

    /// Every mismatch in one error naming the values.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        for (name, v) in [
            ("dim", self.dim),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("vocab_size", self.vocab_size),
            ("hidden_dim", self.hidden_dim),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                problems.push(format!("{name} is 0"));
            }
        }
        if self.n_heads > 0 && !self.dim.is_multiple_of(self.n_heads) {
            problems.push(format!(
                "dim {} is not a multiple of n_heads {}",
                self.dim, self.n_heads
            ));
        }
        if self.n_kv_heads > 0 && !self.n_heads.is_multiple_of(self.n_kv_heads) {
            problems.push(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.n_heads > 0 && !self.head_dim().is_multiple_of(2) && !self.arch.learned_positions {
            problems.push(format!(
                "head dim {} is odd (RoPE rotates pairs)",
                self.head_dim()
            ));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            problems.push(format!("norm_eps {} must be positive", self.norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            problems.push(format!("rope_theta {} must be positive", self.rope_theta));
        }
        if let Some(r) = &self.rope_scaling {
            if !(r.factor > 0.0
                && r.low_freq_factor > 0.0
                && r.high_freq_factor > r.low_freq_factor)
                || r.original_max_position_embeddings == 0
            {
                problems.push(format!("rope_scaling {r:?} needs factor > 0 and high_freq_factor > low_freq_factor > 0"));
            }
        }
        if let Some(f) = self.arch.rope_linear {
            if !(f.is_finite() && f > 0.0) || self.rope_scaling.is_some() {
                problems.push(format!(
                    "linear RoPE factor {f} must be positive, without llama3 scaling"
                ));
            }
        }
        if self.arch.sliding_window == Some(0) {
            problems.push("sliding_window is 0".into());
        }
        if !self.dtype.is_float() {
            problems.push(format!("dtype {} is not a float dtype", self.dtype));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid("LlamaConfig", problems.join("; ")))
        }
    }

    /// Trainable parameters of a model of this shape.
    pub fn num_parameters(&self) -> usize {
        self.parameter_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// The pair frequencies of RoPE where they are not plain `theta` powers (llama3 or linear
    /// scaling), `head_dim / 2` of them.
    pub fn rope_table(&self) -> Option<Vec<f64>> {
        let hd = self.head_dim();
        if let Some(r) = &self.rope_scaling {
            return Some(r.inv_freq(self.rope_theta, hd));
        }
        let f = self.arch.rope_linear?;
        Some(
            (0..hd / 2)
                .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / hd as f64) / f)
                .collect(),
        )
    }
}
