//! LoRA: a low-rank adapter on a Linear layer (y = x·Wᵀ + b + scale · dropout(x)·Aᵀ·Bᵀ, W frozen), trained alone, saved alone, and merged into W.
use crate::dropout::Dropout;
use crate::init::Init;
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{acc_dtype, Activation, Error, Generator, Result, Tensor};

/// Settings of LoRA adapters (Hu et al. 2021; the defaults of Hugging Face PEFT's `LoraConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank r of the update `B·A`.
    pub rank: usize,
    /// The update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// Dropout on the adapter's input (training mode only).
    pub dropout: f64,
    /// Which projections get an adapter (a model's own names, e.g. "q", "v" for a Llama).
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> LoraConfig {
        LoraConfig {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec!["q".into(), "v".into()],
        }
    }
}

/// The trainable part of a LoRA layer: `A` `[rank, in]` (PyTorch's default Linear init, as PEFT
/// does) and `B` `[out, rank]` (zeros, so a new adapter changes nothing), in f32 over an f32,
/// bf16 or f16 weight (a 16-bit frozen base keeps f32 adapters and so f32 optimizer state), in
/// f64 over an f64 one. A clone shares the
/// parameters and the dropout generator.
#[derive(Clone)]
pub struct LoraAdapter {
    pub a: Parameter,
    pub b: Parameter,
    pub scale: f64,
    /// The `alpha` it was made with (`scale = alpha / rank`).
    pub alpha: f64,
    dropout: Option<Dropout>,
}

impl LoraAdapter {
    /// An adapter for a weight `[out, in]` (on `weight`'s device, in its accumulator dtype).
    pub fn new(weight: &Tensor, cfg: &LoraConfig, gen: &mut Generator) -> Result<LoraAdapter> {
        let [out, inn] = *weight.shape() else {
            return Err(Error::shape(
                "LoRA",
                format!("weight {:?} is not [out, in]", weight.shape()),
            ));
        };
        if cfg.rank == 0 || cfg.rank > inn.min(out) || !(cfg.alpha.is_finite() && cfg.alpha > 0.0) {
            return Err(Error::invalid(
                "LoRA",
                format!(
                    "rank {} must be in 1..={} and alpha {} positive for a [{out}, {inn}] weight",
                    cfg.rank,
                    inn.min(out),
                    cfg.alpha
                ),
            ));
        }
        let (dt, dev) = (acc_dtype(weight.dtype()), weight.device());
        let a = Init::Default.tensor(&[cfg.rank, inn], inn, cfg.rank, dt, dev, gen)?;
        let dropout = (cfg.dropout > 0.0)
            .then(|| Dropout::new(cfg.dropout, gen.counter() as u64 ^ 0x4C6F_5241))
            .transpose()?;
        Ok(LoraAdapter {
            a: Parameter::new(a)?,
            b: Parameter::new(Tensor::zeros(&[out, cfg.rank], dt, dev)?)?,
            scale: cfg.alpha / cfg.rank as f64,
            alpha: cfg.alpha,
            dropout,
        })
    }

    /// The rank r (rows of `A`).
    pub fn rank(&self) -> usize {
        self.a.shape()[0]
    }

    /// `scale · dropout(x)·Aᵀ·Bᵀ` for x `(..., in)`, in x's dtype (or the autocast dtype).
    pub fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let x = match &self.dropout {
            Some(d) => d.forward(tape, x)?,
            None => x.clone(),
        };
        // A 16-bit x meets the f32 adapter in f32 and the result goes back to x's dtype, unless
        // autocast to x's dtype casts the adapter for the products anyway.
        let (from, to) = (x.dtype(), self.a.dtype());
        let widen = from != to && netcl_autograd::autocast_dtype() != Some(from);
        let x = if widen { x.to_dtype(to)? } else { x };
        // The scale goes on the rank-wide h, not on the output (nor its gradient).
        let h = x
            .linear(&tape.param(&self.a), None, Activation::None)?
            .mul_scalar(self.scale)?;
        let y = h.linear(&tape.param(&self.b), None, Activation::None)?;
        if widen {
            y.to_dtype(from)
        } else {
            Ok(y)
        }
    }

    /// The drop probability on the adapter's input (0: none).
    pub fn dropout(&self) -> f64 {
        self.dropout.as_ref().map_or(0.0, |d| d.p)
    }

    /// The weight update `scale · B·A` `[out, in]`, in the adapter's dtype.
    pub fn delta(&self) -> Result<Tensor> {
        self.b
            .value()
            .matmul(self.a.value())?
            .mul_scalar(self.scale)
    }

    pub fn set_training(&mut self, on: bool) {
        if let Some(d) = &mut self.dropout {
            d.set_training(on);
        }
    }
}
