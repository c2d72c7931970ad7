//! The norm of a block and of the model's output: RMSNorm (Llama, Qwen2, Mistral) or LayerNorm with a bias (GPT-2), one type for both.
use super::config::LlamaConfig;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_nn::{LayerNorm, Module, RmsNorm};
use netcl_ops::{Device, Result, Tensor};

/// RMSNorm or LayerNorm over the model's width. A clone shares the parameters.
#[derive(Clone)]
pub enum Norm {
    Rms(RmsNorm),
    Layer(LayerNorm),
}

impl Norm {
    /// Weight 1 (and bias 0) over `cfg.dim`, the config's kind and eps.
    pub fn new(cfg: &LlamaConfig, dev: &Device) -> Result<Norm> {
        let ones = Tensor::ones(&[cfg.dim], cfg.dtype, dev)?;
        Ok(match cfg.arch.layer_norm {
            false => Norm::Rms(RmsNorm::from_weight(ones, cfg.norm_eps)?),
            true => {
                let zeros = Tensor::zeros(&[cfg.dim], cfg.dtype, dev)?;
                Norm::Layer(LayerNorm::from_weights(ones, zeros, cfg.norm_eps)?)
            }
        })
    }

    /// The RMSNorm, where this is one (what the fused decode kernels fold in).
    pub fn rms(&self) -> Option<&RmsNorm> {
        match self {
            Norm::Rms(n) => Some(n),
            Norm::Layer(_) => None,
        }
    }

    /// The output where only matrix products read it ([`RmsNorm::forward_for_products`]).
    pub fn forward_for_products(&self, tape: &Tape, x: &Var) -> Result<Var> {
        match self {
            Norm::Rms(n) => n.forward_for_products(tape, x),
            Norm::Layer(n) => n.forward(tape, x),
        }
    }

    pub fn weight(&self) -> &Parameter {
        match self {
            Norm::Rms(n) => &n.weight,
            Norm::Layer(n) => &n.weight,
        }
    }
}

impl Module for Norm {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        self.forward_for_products(tape, x)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        match self {
            Norm::Rms(n) => n.named_parameters(),
            Norm::Layer(n) => n.named_parameters(),
        }
    }
    fn describe(&self) -> serde_json::Value {
        match self {
            Norm::Rms(n) => n.describe(),
            Norm::Layer(n) => n.describe(),
        }
    }
}
