//! One Llama block: RMSNorm, grouped-query attention with RoPE and a causal mask (optionally through a KV cache), SwiGLU feed-forward, residuals; the config's switches give other families' blocks (biases, a sliding window, LayerNorm, a GELU MLP, no RoPE).
use super::cache::KvCache;
use super::config::LlamaConfig;
use super::norm::Norm;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_nn::{Init, Linear, Module};
use netcl_ops::{Activation, Device, Generator, Result, RopeFreqs, RopePositions, Tensor};

/// Llama's weight initialisation (llama2.c, Hugging Face): N(0, 0.02).
const INIT: Init = Init::Normal {
    mean: 0.0,
    std: 0.02,
};

fn proj(
    (inn, out, bias): (usize, usize, bool),
    cfg: &LlamaConfig,
    dev: &Device,
    g: &mut Generator,
) -> Result<Linear> {
    Linear::from_weights(weight(inn, out, cfg, dev, g)?, zeros(out, bias, cfg, dev)?)
}

/// A bias of `out` zeros where `on` (transformers initialises biases to 0 too).
fn zeros(out: usize, on: bool, cfg: &LlamaConfig, dev: &Device) -> Result<Option<Tensor>> {
    on.then(|| Tensor::zeros(&[out], cfg.dtype, dev))
        .transpose()
}

/// Biases of the sizes `outs` where `on`: pieces of one tensor of zeros, side by side (so that
/// the decode kernels read the stacked projections' biases as one view, `Tensor::joined`).
fn joint_zeros(
    outs: &[usize],
    on: bool,
    cfg: &LlamaConfig,
    dev: &Device,
) -> Result<Vec<Option<Tensor>>> {
    let Some(all) = zeros(outs.iter().sum(), on, cfg, dev)? else {
        return Ok(vec![None; outs.len()]);
    };
    let mut at = 0;
    outs.iter()
        .map(|&n| {
            at += n;
            all.narrow(0, at - n, n).map(Some)
        })
        .collect()
}

/// Projections of one input whose weights are rows of one tensor ([sum of outputs, inn]), from
/// row `start`, `out` rows each: the stacked products below (queries, keys and values; gate and
/// up) then read the weights where they lie instead of concatenating them every step
/// (`Var::concat` joins them as a view). Loading or updating a weight writes in place and keeps
/// them joined; a weight replaced by other storage is concatenated as before.
struct Joint(Tensor);

impl Joint {
    /// The weights drawn one by one, in the model's order (the same initial values for a seed
    /// as separate projections), then copied into one tensor.
    fn of(weights: &[&Tensor]) -> Result<Joint> {
        Ok(Joint(Tensor::concat(weights, 0)?))
    }

    fn proj(&self, start: usize, out: usize, bias: Option<Tensor>) -> Result<Linear> {
        Linear::from_weights(self.0.narrow(0, start, out)?, bias)
    }
}

/// A projection's weight [out, inn], drawn from `g`.
fn weight(
    inn: usize,
    out: usize,
    cfg: &LlamaConfig,
    dev: &Device,
    g: &mut Generator,
) -> Result<Tensor> {
    INIT.tensor(&[out, inn], inn, out, cfg.dtype, dev, g)
}

/// A projection without bias or LoRA adapter: its weight alone is the product (what the fused
/// gate/up product and the decode kernels take).
pub(super) fn plain(lin: &Linear) -> bool {
    lin.bias.is_none() && lin.lora.is_none()
}

/// The parameters of `parts`, each name prefixed by its part's.
fn named(parts: &[(&str, &dyn Module)]) -> Vec<(String, Parameter)> {
    parts
        .iter()
        .flat_map(|(prefix, m)| {
            m.named_parameters()
                .into_iter()
                .map(move |(n, p)| (format!("{prefix}.{n}"), p))
        })
        .collect()
}

/// Grouped-query self-attention: `n_heads` query heads share `n_kv_heads` key/value heads. A
/// clone shares the parameters.
#[derive(Clone)]
pub struct Attention {
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    cfg: LlamaConfig,
    /// The pair frequencies: the base, or Llama 3's scaled table (on the device).
    pub(super) freqs: RopeFreqs,
}

impl Attention {
    pub fn new(cfg: &LlamaConfig, dev: &Device, g: &mut Generator) -> Result<Attention> {
        let (d, kv) = (cfg.dim, cfg.n_kv_heads * cfg.head_dim());
        let freqs = match cfg.rope_table() {
            None => RopeFreqs::Theta(cfg.rope_theta),
            Some(table) => {
                let t = Tensor::from_vec(table, &[cfg.head_dim() / 2], dev)?;
                RopeFreqs::Table(t.to_dtype(netcl_ops::acc_dtype(cfg.dtype))?)
            }
        };
        let wq = weight(d, d, cfg, dev, g)?;
        let wk = weight(d, kv, cfg, dev, g)?;
        let wv = weight(d, kv, cfg, dev, g)?;
        let qkv = Joint::of(&[&wq, &wk, &wv])?;
        let [bq, bk, bv]: [Option<Tensor>; 3] =
            joint_zeros(&[d, kv, kv], cfg.arch.qkv_bias, cfg, dev)?
                .try_into()
                .map_err(|_| netcl_ops::Error::invalid("Attention::new", "three biases"))?;
        Ok(Attention {
            wq: qkv.proj(0, d, bq)?,
            wk: qkv.proj(d, kv, bk)?,
            wv: qkv.proj(d + kv, kv, bv)?,
            wo: proj((d, d, cfg.arch.out_bias), cfg, dev, g)?,
            cfg: cfg.clone(),
            freqs,
        })
    }

    /// x: [B, T, D] at `positions`; with a cache, this layer's keys and values are written at
    /// `cache.len()` and attention runs over everything cached. `mask` is added to the scores
    /// ([B, 1, 1, T, S], padding of batched prompts).
    pub fn forward(
        &self,
        tape: &Tape,
        x: &Var,
        positions: &RopePositions,
        cache: Option<(&KvCache, usize)>,
        mask: Option<&Tensor>,
    ) -> Result<Var> {
        let c = &self.cfg;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (h, hkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim());
        let rope = |v: Var| match c.arch.learned_positions {
            true => Ok(v), // positions were added to the embeddings
            false => v.rope_with_freqs(c.rope_style, positions.clone(), self.freqs.clone()),
        };
        // [B, T, heads, hd] each. Without a cache and without adapters, one product over the
        // three weights stacked per step (and their biases, where all three have one: Qwen2,
        // GPT-2), its heads split as views: one GEMM each way instead of three, one input
        // gradient without sums (the views' gradients are gathered into one by the tape). The
        // values are copied out of the product (attention keeps them for backward; a view would
        // keep all of it), the queries and keys go through RoPE.
        let qkv = [&self.wq, &self.wk, &self.wv];
        let biased = qkv.iter().all(|l| l.bias.is_some() && l.lora.is_none());
        let stacked = biased || qkv.into_iter().all(plain);
        let (q, k, v) = if cache.is_none() && stacked {
            let w = qkv.map(|l| tape.param(&l.weight));
            let w = Var::concat(&[&w[0], &w[1], &w[2]], 0)?;
            let bias = qkv
                .iter()
                .filter_map(|l| l.bias.as_ref().map(|b| tape.param(b)))
                .collect::<Vec<_>>();
            let bias = match bias.as_slice() {
                [bq, bk, bv] => Some(Var::concat(&[bq, bk, bv], 0)?),
                _ => None,
            };
            let y = x.linear(&w, bias.as_ref(), Activation::None)?;
            let heads = y.reshape(&[b, t, h + 2 * hkv, hd])?;
            (
                heads.narrow(2, 0, h)?,
                heads.narrow(2, h, hkv)?,
                heads.narrow(2, h + hkv, hkv)?.contiguous()?,
            )
        } else {
            (
                self.wq.forward(tape, x)?.reshape(&[b, t, h, hd])?,
                self.wk.forward(tape, x)?.reshape(&[b, t, hkv, hd])?,
                self.wv.forward(tape, x)?.reshape(&[b, t, hkv, hd])?,
            )
        };
        let (q, k) = (rope(q)?, rope(k)?);
        // [B, Hkv, S, hd]: this step's keys and values, or all the cache holds after them.
        let (k, v) = (k.transpose(1, 2)?, v.transpose(1, 2)?);
        let (k, v) = match cache {
            Some((cache, layer)) => {
                let (ka, va) = cache.append(layer, k.value(), v.value())?;
                (Var::constant(ka), Var::constant(va))
            }
            None => (k, v),
        };
        // Queries meet the cache's dtype (under autocast the projections are 16-bit).
        let q = q.transpose(1, 2)?.to_dtype(k.dtype())?;
        let fused = Var::attention_is_fused(&q, &k, &v, mask);
        let window = c.arch.sliding_window;
        // [B, H, T, hd]: the fused kernel reads the grouped heads as they are; otherwise query
        // head j * rep + r meets key/value head j through a broadcast.
        let o = if fused {
            Var::flash_attention_window(&q, &k, &v, window, None)?
        } else {
            let (s, rep) = (k.shape()[2], h / hkv);
            let q = q.reshape(&[b, hkv, rep, t, hd])?;
            let wide = [b, hkv, rep, s, hd];
            let k = k.unsqueeze(2)?.broadcast_to(&wide)?;
            let v = v.unsqueeze(2)?.broadcast_to(&wide)?;
            Var::attention_masked(&q, &k, &v, mask, (true, window), None)?
                .reshape(&[b, h, t, hd])?
        };
        let o = o.transpose(1, 2)?.reshape(&[b, t, c.dim])?;
        self.wo.forward(tape, &o)
    }

    pub fn named_parameters(&self) -> Vec<(String, Parameter)> {
        named(&[
            ("wq", &self.wq),
            ("wk", &self.wk),
            ("wv", &self.wv),
            ("wo", &self.wo),
        ])
    }
}

/// SwiGLU: `w2(silu(w1 x) * w3 x)`; with `gelu_mlp` (no `w3`), `w2(gelu_tanh(w1 x))`. A clone
/// shares the parameters.
#[derive(Clone)]
pub struct FeedForward {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Option<Linear>,
}

impl FeedForward {
    pub fn new(cfg: &LlamaConfig, dev: &Device, g: &mut Generator) -> Result<FeedForward> {
        let (d, h, bias) = (cfg.dim, cfg.hidden_dim, cfg.arch.mlp_bias);
        if cfg.arch.gelu_mlp {
            return Ok(FeedForward {
                w1: proj((d, h, bias), cfg, dev, g)?,
                w2: proj((h, d, bias), cfg, dev, g)?,
                w3: None,
            });
        }
        let w1 = weight(d, h, cfg, dev, g)?;
        let w2 = proj((h, d, bias), cfg, dev, g)?;
        let w3 = weight(d, h, cfg, dev, g)?;
        let gate_up = Joint::of(&[&w1, &w3])?;
        let [b1, b3]: [Option<Tensor>; 2] = joint_zeros(&[h, h], bias, cfg, dev)?
            .try_into()
            .map_err(|_| netcl_ops::Error::invalid("FeedForward::new", "two biases"))?;
        Ok(FeedForward {
            w1: gate_up.proj(0, h, b1)?,
            w2,
            w3: Some(gate_up.proj(h, h, b3)?),
        })
    }

    /// The projections: w1, w2 and w3 where there is one.
    pub fn linears(&self) -> Vec<&Linear> {
        [Some(&self.w1), Some(&self.w2), self.w3.as_ref()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// With plain gate and up projections (no bias, no LoRA adapter), both run as one product
    /// over their weights stacked per step, and SwiGLU splits its output: one GEMM each way
    /// instead of two, and one input gradient without a sum.
    pub fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let h = match &self.w3 {
            None => self.w1.forward(tape, x)?.gelu_tanh()?,
            Some(w3) if plain(&self.w1) && plain(w3) => {
                let (w1, w3) = (tape.param(&self.w1.weight), tape.param(&w3.weight));
                let w = Var::concat(&[&w1, &w3], 0)?;
                x.linear(&w, None, Activation::None)?.swiglu_halves()?
            }
            Some(w3) => Var::swiglu(&self.w1.forward(tape, x)?, &w3.forward(tape, x)?)?,
        };
        self.w2.forward(tape, &h)
    }

    pub fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut parts: Vec<(&str, &dyn Module)> = vec![("w1", &self.w1), ("w2", &self.w2)];
        if let Some(w3) = &self.w3 {
            parts.push(("w3", w3));
        }
        named(&parts)
    }
}

/// `h = x + attention(norm(x))`, `out = h + feed_forward(norm(h))`. A clone shares the parameters
/// (what a checkpointed block's recomputation holds).
#[derive(Clone)]
pub struct Block {
    pub attention_norm: Norm,
    pub attention: Attention,
    pub ffn_norm: Norm,
    pub feed_forward: FeedForward,
}

impl Block {
    pub fn new(cfg: &LlamaConfig, dev: &Device, g: &mut Generator) -> Result<Block> {
        Ok(Block {
            attention_norm: Norm::new(cfg, dev)?,
            attention: Attention::new(cfg, dev, g)?,
            ffn_norm: Norm::new(cfg, dev)?,
            feed_forward: FeedForward::new(cfg, dev, g)?,
        })
    }

    pub fn forward(
        &self,
        tape: &Tape,
        x: &Var,
        positions: &RopePositions,
        cache: Option<(&KvCache, usize)>,
        mask: Option<&Tensor>,
    ) -> Result<Var> {
        let a = self.attention_norm.forward_for_products(tape, x)?;
        let h = x.add(&self.attention.forward(tape, &a, positions, cache, mask)?)?;
        let f = self.ffn_norm.forward_for_products(tape, &h)?;
        h.add(&self.feed_forward.forward(tape, &f)?)
    }

    pub fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let prefixed = |prefix: &str, v: Vec<(String, Parameter)>| {
            v.into_iter()
                .map(|(n, p)| (format!("{prefix}.{n}"), p))
                .collect::<Vec<_>>()
        };
        let mut v = named(&[("attention_norm", &self.attention_norm)]);
        v.extend(prefixed("attention", self.attention.named_parameters()));
        v.extend(named(&[("ffn_norm", &self.ffn_norm)]));
        v.extend(prefixed(
            "feed_forward",
            self.feed_forward.named_parameters(),
        ));
        v
    }
}
