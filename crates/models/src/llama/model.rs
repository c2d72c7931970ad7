//! The Llama model: token embedding (and learned positions for GPT-2), blocks, final norm and the output projection (tied or its own); logits, loss, and the Module impl.
use super::block::{plain, Block};
use super::cache::KvCache;
use super::config::LlamaConfig;
use super::norm::Norm;
use netcl_autograd::{checkpoint, Parameter, Tape, Var};
use netcl_nn::{Context, Embedding, Init, Linear, Module};
use netcl_ops::{Activation, DType, Device, Error, Generator, Result, RopePositions, Tensor};
use serde_json::Value;
use std::sync::Arc;

/// Position ids of a forward pass, for [`Module::forward_with`]'s context (default: 0, 1, ...,
/// or continuing after a cache's length).
pub struct Positions(pub RopePositions);

/// A Llama-architecture decoder (llama2.c / Meta / Hugging Face layout), and the families built
/// from the same blocks by the config's [`super::Arch`] (Qwen2, Mistral, GPT-2).
pub struct Llama {
    pub config: LlamaConfig,
    pub tok_embeddings: Embedding,
    /// Learned position embeddings [max_seq_len, dim] (GPT-2), added to the tokens'.
    pub pos_embeddings: Option<Embedding>,
    pub layers: Vec<Block>,
    pub norm: Norm,
    /// `None` with tied embeddings (the output reuses `tok_embeddings.weight`).
    pub output: Option<Linear>,
    /// Activation checkpointing in training passes: every `checkpoint_every`-th block (blocks
    /// 0, k, 2k, ...) keeps only its input from forward to backward and is recomputed in
    /// backward ([`netcl_autograd::checkpoint`]); 1 checkpoints every block, 0 none (the
    /// default). Gradients are the same bit for bit.
    pub checkpoint_every: usize,
    /// Rows per chunk of [`Llama::loss`]'s cross-entropy over the output head
    /// ([`Var::linear_cross_entropy`]); None (the default) chooses by size
    /// ([`netcl_autograd::loss_chunk_rows`]: whole logits up to 64M elements, chunks above).
    pub loss_chunk_rows: Option<usize>,
}

impl Llama {
    /// A model with Llama's initialisation (N(0, 0.02) weights, unit norms), drawn from `gen`.
    pub fn new(config: LlamaConfig, device: &Device, gen: &mut Generator) -> Result<Llama> {
        config.validate()?;
        let table = Init::Normal {
            mean: 0.0,
            std: 0.02,
        }
        .tensor(
            &[config.vocab_size, config.dim],
            config.dim,
            config.vocab_size,
            config.dtype,
            device,
            gen,
        )?;
        let layers = (0..config.n_layers)
            .map(|_| Block::new(&config, device, gen))
            .collect::<Result<Vec<_>>>()?;
        let output = if config.tied_embeddings {
            None
        } else {
            Some(Linear::with_init(
                config.dim,
                config.vocab_size,
                false,
                Init::Normal {
                    mean: 0.0,
                    std: 0.02,
                },
                config.dtype,
                device,
                gen,
            )?)
        };
        let norm = Norm::new(&config, device)?;
        let pos_embeddings = match config.arch.learned_positions {
            false => None,
            true => {
                let init = Init::Normal {
                    mean: 0.0,
                    std: 0.02,
                };
                let (n, d) = (config.max_seq_len, config.dim);
                let t = init.tensor(&[n, d], d, n, config.dtype, device, gen)?;
                Some(Embedding::from_weights(t)?)
            }
        };
        Ok(Llama {
            tok_embeddings: Embedding::from_weights(table)?,
            pos_embeddings,
            layers,
            norm,
            output,
            config,
            checkpoint_every: 0,
            loss_chunk_rows: None,
        })
    }

    /// Checkpoints every `every`-th block in training passes (see [`Llama::checkpoint_every`]).
    pub fn with_checkpointing(mut self, every: usize) -> Llama {
        self.checkpoint_every = every;
        self
    }

    /// Whether block `i` of a pass on `tape` is checkpointed (recording, no KV cache).
    fn checkpointed(&self, tape: &Tape, i: usize, cache: Option<&KvCache>) -> bool {
        let k = self.checkpoint_every;
        k > 0 && i.is_multiple_of(k) && cache.is_none() && tape.is_recording()
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.tok_embeddings.weight.device()
    }

    /// Logits `[B, T, vocab]` for token ids `[B, T]` (I32 on the model's device). Positions
    /// default to `0..T`, or to `cache.len()..` with a cache, whose keys and values are
    /// appended (and its length advanced). `mask` ([B, 1, 1, T, S], added to the attention
    /// scores) hides padding of batched prompts.
    pub fn logits(
        &self,
        tape: &Tape,
        ids: &Tensor,
        positions: Option<&RopePositions>,
        cache: Option<&KvCache>,
        mask: Option<&Tensor>,
    ) -> Result<Var> {
        let h = self.hidden(tape, ids, positions, cache, mask)?;
        match &self.output {
            Some(out) => out.forward(tape, &h),
            None => h.linear(
                &tape.param(&self.tok_embeddings.weight),
                None,
                Activation::None,
            ),
        }
    }

    /// The final norm's output `[B, T, dim]` (what the output head reads), as [`Llama::logits`].
    fn hidden(
        &self,
        tape: &Tape,
        ids: &Tensor,
        positions: Option<&RopePositions>,
        cache: Option<&KvCache>,
        mask: Option<&Tensor>,
    ) -> Result<Var> {
        let op = "Llama";
        if ids.ndim() != 2 || ids.dtype() != DType::I32 || ids.numel() == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "token ids are {} {:?}; need non-empty I32 [B, T]",
                    ids.dtype(),
                    ids.shape()
                ),
            ));
        }
        let t = ids.shape()[1];
        let start = cache.map_or(0, |c| c.len());
        if start + t > self.config.max_seq_len {
            return Err(Error::invalid(
                op,
                format!(
                    "{t} tokens after {start} cached positions exceed max_seq_len {}",
                    self.config.max_seq_len
                ),
            ));
        }
        if let Some(c) = cache {
            if c.batch() != ids.shape()[0] {
                return Err(Error::shape(
                    op,
                    format!("ids {:?} for a cache of batch {}", ids.shape(), c.batch()),
                ));
            }
        }
        let default = RopePositions::Offset(start);
        let positions = positions.unwrap_or(&default);
        let mut h = tape.param(&self.tok_embeddings.weight).embedding(ids)?;
        if let Some(pe) = &self.pos_embeddings {
            let at = match positions {
                RopePositions::Offset(s) => {
                    let (s, e) = (*s as f64, (s + t) as f64);
                    Tensor::arange(s, e, 1.0, DType::I32, ids.device())?
                }
                RopePositions::Ids(p) => p.clone(),
            };
            h = h.add(&tape.param(&pe.weight).embedding(&at)?)?;
        }
        for (i, block) in self.layers.iter().enumerate() {
            h = if self.checkpointed(tape, i, cache) {
                // The recomputation owns handles to the block's parameters and the pass's inputs.
                let (block, pos, mask) = (block.clone(), positions.clone(), mask.cloned());
                checkpoint(tape, &[h], move |tape, xs| {
                    block.forward(tape, &xs[0], &pos, None, mask.as_ref())
                })
            } else {
                block.forward(tape, &h, positions, cache.map(|c| (c, i)), mask)
            }
            .map_err(|e| netcl_nn::in_layer(e, &format!("layer {i} of Llama")))?;
        }
        if let Some(c) = cache {
            c.advance(t)?;
        }
        self.norm.forward_for_products(tape, &h)
    }

    /// Mean cross-entropy of next-token prediction: logits of `ids` [B, T] against `targets`
    /// [B, T]. The head's product and the loss run as one [`Var::linear_cross_entropy`] (in
    /// chunks of rows once the logits are large, see [`Llama::loss_chunk_rows`]) where the
    /// head is a plain weight (tied, or an output without bias or adapter).
    pub fn loss(&self, tape: &Tape, ids: &Tensor, targets: &Tensor) -> Result<Var> {
        if targets.shape() != ids.shape() {
            return Err(Error::shape(
                "Llama::loss",
                format!("targets {:?} for ids {:?}", targets.shape(), ids.shape()),
            ));
        }
        let h = self.hidden(tape, ids, None, None, None)?;
        match &self.output {
            Some(out) if !plain(out) => {
                let n = ids.numel();
                out.forward(tape, &h)?
                    .reshape(&[n, self.config.vocab_size])?
                    .cross_entropy(&targets.reshape(&[n])?, None)
            }
            out => {
                let w = out
                    .as_ref()
                    .map_or(&self.tok_embeddings.weight, |o| &o.weight);
                h.linear_cross_entropy(&tape.param(w), targets, None, self.loss_chunk_rows)
            }
        }
    }
}

impl Module for Llama {
    /// `x`: token ids [B, T] (a constant); the logits [B, T, vocab].
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        self.logits(tape, x.value(), None, None, None)
    }
    /// Reads [`Positions`] and an `Arc<KvCache>` from the context when present.
    fn forward_with(&self, tape: &Tape, x: &Var, ctx: &Context) -> Result<Var> {
        let positions = ctx.get::<Positions>().map(|p| &p.0);
        let cache = ctx.get::<Arc<KvCache>>().map(|c| c.as_ref());
        self.logits(tape, x.value(), positions, cache, None)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = vec![(
            "tok_embeddings.weight".to_string(),
            self.tok_embeddings.weight.clone(),
        )];
        if let Some(pe) = &self.pos_embeddings {
            v.push(("pos_embeddings.weight".to_string(), pe.weight.clone()));
        }
        for (i, b) in self.layers.iter().enumerate() {
            v.extend(
                b.named_parameters()
                    .into_iter()
                    .map(|(n, p)| (format!("layers.{i}.{n}"), p)),
            );
        }
        v.extend(
            self.norm
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (format!("norm.{n}"), p)),
        );
        if let Some(o) = &self.output {
            v.push(("output.weight".to_string(), o.weight.clone()));
        }
        v
    }
    fn set_training(&mut self, on: bool) {
        for b in &mut self.layers {
            let a = &mut b.attention;
            let f = &mut b.feed_forward;
            for lin in [
                &mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo, &mut f.w1, &mut f.w2,
            ] {
                lin.set_training(on);
            }
            if let Some(w3) = &mut f.w3 {
                w3.set_training(on);
            }
        }
    }
    fn describe(&self) -> Value {
        let mut v = serde_json::to_value(&self.config).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("type".into(), "Llama".into());
        }
        v
    }
}
