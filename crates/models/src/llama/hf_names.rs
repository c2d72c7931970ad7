//! Hugging Face tensor names of each family against netcl's parameter names: Llama, Qwen2 and Mistral share one layout (with biases where set); GPT-2's Conv1D weights are transposed and its fused c_attn split into queries, keys and values at import and joined again at export.
use super::config::{Family, LlamaConfig};
use netcl_ops::{Error, Result, Tensor};

/// Where (part of) a file's tensor goes: netcl's parameter `ours`, read transposed (a Conv1D
/// weight, stored [in, out]) and then as rows `start..start + len` of dim 0 (a piece of c_attn).
pub(crate) struct Piece {
    pub ours: String,
    pub transpose: bool,
    pub rows: Option<(usize, usize)>,
}

impl Piece {
    fn whole(ours: String, transpose: bool) -> Piece {
        Piece {
            ours,
            transpose,
            rows: None,
        }
    }

    /// The shape this piece has, from the file's `shape`: None when the file's tensor is not
    /// the one the pieces split (then the whole shape is reported against the config's).
    pub fn shape(&self, shape: &[usize]) -> Option<Vec<usize>> {
        let mut s = shape.to_vec();
        if self.transpose {
            if s.len() != 2 {
                return None;
            }
            s.reverse();
        }
        if let Some((_, len)) = self.rows {
            *s.first_mut()? = len;
        }
        Some(s)
    }

    /// The piece of `t`, the file's tensor.
    pub fn take(&self, t: Tensor) -> Result<Tensor> {
        let t = if self.transpose {
            t.transpose(0, 1)?
        } else {
            t
        };
        match self.rows {
            Some((start, len)) => t.narrow(0, start, len)?.contiguous(),
            None => t.contiguous(),
        }
    }
}

/// Llama's module names (also Qwen2's and Mistral's) against netcl's, inside a layer.
const LLAMA_LAYER: [(&str, &str); 9] = [
    ("input_layernorm", "attention_norm"),
    ("self_attn.q_proj", "attention.wq"),
    ("self_attn.k_proj", "attention.wk"),
    ("self_attn.v_proj", "attention.wv"),
    ("self_attn.o_proj", "attention.wo"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "feed_forward.w1"),
    ("mlp.down_proj", "feed_forward.w2"),
    ("mlp.up_proj", "feed_forward.w3"),
];

/// GPT-2's single modules inside a layer (c_attn is split apart), and whether the weight is a
/// Conv1D's.
const GPT2_LAYER: [(&str, &str, bool); 5] = [
    ("ln_1", "attention_norm", false),
    ("attn.c_proj", "attention.wo", true),
    ("ln_2", "ffn_norm", false),
    ("mlp.c_fc", "feed_forward.w1", true),
    ("mlp.c_proj", "feed_forward.w2", true),
];

/// Top-level names of each layout (file name, netcl name).
fn top(family: Family) -> &'static [(&'static str, &'static str)] {
    match family {
        Family::Gpt2 => &[
            ("wte.weight", "tok_embeddings.weight"),
            ("wpe.weight", "pos_embeddings.weight"),
            ("ln_f.weight", "norm.weight"),
            ("ln_f.bias", "norm.bias"),
        ],
        _ => &[
            ("model.embed_tokens.weight", "tok_embeddings.weight"),
            ("model.norm.weight", "norm.weight"),
        ],
    }
}

/// Tensors a file may hold that netcl has no parameter for and does not need: RoPE's buffer of
/// older exports, GPT-2's causal-mask buffers.
pub(crate) fn ignored(family: Family, hf: &str) -> bool {
    hf.ends_with("rotary_emb.inv_freq")
        || (family == Family::Gpt2 && (hf.ends_with(".attn.bias") || hf.ends_with("masked_bias")))
}

/// The layer index and the rest of `name` after `prefix` (`<prefix><i>.<rest>`).
fn layer<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let (i, tail) = name.strip_prefix(prefix)?.split_once('.')?;
    Some((i.parse().ok()?, tail))
}

/// Where the file's tensor `hf` goes in a model of `cfg` (None: netcl has no such tensor).
pub(crate) fn pieces(cfg: &LlamaConfig, hf: &str) -> Option<Vec<Piece>> {
    let family = cfg.arch.family;
    if hf == "lm_head.weight" {
        return Some(vec![Piece::whole("output.weight".into(), false)]);
    }
    let name = match family {
        // Hub checkpoints of GPT-2 name tensors with or without the `transformer.` prefix.
        Family::Gpt2 => hf.strip_prefix("transformer.").unwrap_or(hf),
        _ => hf,
    };
    if let Some((_, ours)) = top(family).iter().find(|(h, _)| *h == name) {
        return Some(vec![Piece::whole(ours.to_string(), false)]);
    }
    let prefix = if family == Family::Gpt2 {
        "h."
    } else {
        "model.layers."
    };
    let (i, tail) = layer(name, prefix)?;
    let (module, kind) = tail.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let ours = |m: &str| format!("layers.{i}.{m}.{kind}");
    if family != Family::Gpt2 {
        let (_, m) = LLAMA_LAYER.iter().find(|(h, _)| *h == module)?;
        return Some(vec![Piece::whole(ours(m), false)]);
    }
    if module == "attn.c_attn" {
        let (d, kv) = (cfg.dim, cfg.n_kv_heads * cfg.head_dim());
        let parts = [("attention.wq", 0, d), ("attention.wk", d, kv)];
        let parts = parts.into_iter().chain([("attention.wv", d + kv, kv)]);
        return Some(
            parts
                .map(|(m, start, len)| Piece {
                    ours: ours(m),
                    transpose: kind == "weight",
                    rows: Some((start, len)),
                })
                .collect(),
        );
    }
    let (_, m, conv) = GPT2_LAYER.iter().find(|(h, _, _)| *h == module)?;
    Some(vec![Piece::whole(ours(m), *conv && kind == "weight")])
}

/// The file's name of netcl's parameter `ours` (for messages; GPT-2's queries, keys and values
/// name c_attn).
pub(crate) fn hf_name(family: Family, ours: &str) -> Option<String> {
    if ours == "output.weight" {
        return Some("lm_head.weight".into());
    }
    let gpt2 = family == Family::Gpt2;
    let prefix = if gpt2 { "transformer." } else { "" };
    if let Some((h, _)) = top(family).iter().find(|(_, o)| *o == ours) {
        return Some(format!("{prefix}{h}"));
    }
    let (i, tail) = layer(ours, "layers.")?;
    let (module, kind) = tail.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None; // LoRA adapters: merged before an export
    }
    if !gpt2 {
        let (h, _) = LLAMA_LAYER.iter().find(|(_, o)| *o == module)?;
        return Some(format!("model.layers.{i}.{h}.{kind}"));
    }
    let h = match module {
        "attention.wq" | "attention.wk" | "attention.wv" => "attn.c_attn",
        m => GPT2_LAYER.iter().find(|(_, o, _)| *o == m)?.0,
    };
    Some(format!("transformer.h.{i}.{h}.{kind}"))
}

/// The tensors a Hugging Face file of `cfg`'s family holds for netcl's `named` parameters: renamed,
/// and for GPT-2 with the Conv1D weights transposed and each layer's queries, keys and values
/// joined into c_attn.
pub(crate) fn exports(
    cfg: &LlamaConfig,
    named: Vec<(String, Tensor)>,
) -> Result<Vec<(String, Tensor)>> {
    let family = cfg.arch.family;
    let no_name = |n: &str| {
        Error::invalid(
            "Llama::save_hf",
            format!("no Hugging Face {family:?} name for '{n}'"),
        )
    };
    let mut out: Vec<(String, Tensor)> = Vec::with_capacity(named.len());
    // c_attn's weight or bias: the queries', keys' and values' parts as they come (in that order).
    let mut qkv: std::collections::HashMap<String, Vec<Tensor>> = Default::default();
    for (n, t) in named {
        let hf = hf_name(family, &n).ok_or_else(|| no_name(&n))?;
        if family != Family::Gpt2 {
            out.push((hf, t));
            continue;
        }
        if hf.contains(".attn.c_attn.") {
            let parts = qkv.entry(hf.clone()).or_default();
            parts.push(t);
            if parts.len() < 3 {
                continue;
            }
            let parts = qkv.remove(&hf).unwrap_or_default();
            let refs: Vec<&Tensor> = parts.iter().collect();
            let joined = Tensor::concat(&refs, 0)?;
            let joined = match joined.ndim() {
                2 => joined.transpose(0, 1)?.contiguous()?,
                _ => joined,
            };
            out.push((hf, joined));
            continue;
        }
        let conv = pieces(cfg, &hf).is_some_and(|p| p[0].transpose);
        out.push((
            hf,
            if conv {
                t.transpose(0, 1)?.contiguous()?
            } else {
                t
            },
        ));
    }
    if let Some(h) = qkv.keys().next() {
        return Err(no_name(h));
    }
    Ok(out)
}
