//! Normalisation layers: LayerNorm, RMSNorm, and BatchNorm2d with running statistics.
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{DType, Device, Error, Result, Tensor};
use serde_json::{json, Value};

fn filled(shape: &[usize], v: f64, device: &Device) -> Result<Parameter> {
    Parameter::new(Tensor::full(shape, v, DType::F32, device)?)
}

/// Layer normalisation over the trailing `shape` dims with affine weight (1) and bias (0). A
/// clone shares the parameters.
#[derive(Clone)]
pub struct LayerNorm {
    pub weight: Parameter,
    pub bias: Parameter,
    pub eps: f64,
}

impl LayerNorm {
    /// f32 weight 1 and bias 0 over `shape`, eps 1e-5 (PyTorch's default).
    pub fn new(shape: &[usize], device: &Device) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: filled(shape, 1.0, device)?,
            bias: filled(shape, 0.0, device)?,
            eps: 1e-5,
        })
    }
    /// The given weight and bias (same shape, dtype and device) and `eps`.
    pub fn from_weights(weight: Tensor, bias: Tensor, eps: f64) -> Result<LayerNorm> {
        if bias.shape() != weight.shape()
            || bias.dtype() != weight.dtype()
            || bias.device() != weight.device()
        {
            return Err(Error::shape(
                "LayerNorm::from_weights",
                format!(
                    "bias {} {:?} on {} does not match weight {} {:?} on {}",
                    bias.dtype(),
                    bias.shape(),
                    bias.device(),
                    weight.dtype(),
                    weight.shape(),
                    weight.device()
                ),
            ));
        }
        Ok(LayerNorm {
            weight: Parameter::new(weight)?,
            bias: Parameter::new(bias)?,
            eps: check_eps("LayerNorm", eps)?,
        })
    }
    /// The same layer with epsilon `eps`.
    pub fn with_eps(self, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            eps: check_eps("LayerNorm", eps)?,
            ..self
        })
    }
}

/// `eps` when it is finite and positive; an error naming `layer` otherwise.
fn check_eps(layer: &str, eps: f64) -> Result<f64> {
    if eps.is_finite() && eps > 0.0 {
        Ok(eps)
    } else {
        Err(Error::invalid(
            layer,
            format!("eps {eps} must be finite and positive"),
        ))
    }
}

impl Module for LayerNorm {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let (w, b) = (tape.param(&self.weight), tape.param(&self.bias));
        x.layer_norm(self.weight.shape(), Some(&w), Some(&b), self.eps)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
    fn describe(&self) -> Value {
        json!({"type": "LayerNorm", "shape": self.weight.shape(), "eps": self.eps})
    }
}

/// RMS normalisation over the trailing `shape` dims with a weight (1). A clone shares the weight.
#[derive(Clone)]
pub struct RmsNorm {
    pub weight: Parameter,
    pub eps: f64,
}

impl RmsNorm {
    /// f32 weight 1 over `shape`, eps 1e-6 (Llama configs use 1e-5 or 1e-6: see [`RmsNorm::with_eps`]).
    pub fn new(shape: &[usize], device: &Device) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: filled(shape, 1.0, device)?,
            eps: 1e-6,
        })
    }
    /// The given weight and `eps`.
    pub fn from_weight(weight: Tensor, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: Parameter::new(weight)?,
            eps: check_eps("RmsNorm", eps)?,
        })
    }
    /// The same layer with epsilon `eps`.
    pub fn with_eps(self, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            eps: check_eps("RmsNorm", eps)?,
            ..self
        })
    }
    /// The layer's output where only matrix products read it (a Llama block's norms): under
    /// autocast, a norm computing in f32 (an f32 weight, an input of at most 32 bits) writes it
    /// in the compute dtype from its own kernel, which the products would cast it to anyway (the
    /// same values, no cast kernel either way); else as `forward`.
    pub fn forward_for_products(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let f32_norm = self.weight.dtype() == DType::F32 && x.dtype().size() <= 4;
        x.rms_norm_to(
            self.weight.shape(),
            Some(&tape.param(&self.weight)),
            self.eps,
            netcl_autograd::autocast_dtype().filter(|_| f32_norm),
        )
    }
}

impl Module for RmsNorm {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        x.rms_norm(
            self.weight.shape(),
            Some(&tape.param(&self.weight)),
            self.eps,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("weight".into(), self.weight.clone())]
    }
    fn describe(&self) -> Value {
        json!({"type": "RMSNorm", "shape": self.weight.shape(), "eps": self.eps})
    }
}

/// Batch normalisation of (N, C, H, W) (or (N, C)): batch statistics and running-average
/// updates in training mode, the running statistics in evaluation mode.
pub struct BatchNorm2d {
    pub weight: Parameter,
    pub bias: Parameter,
    pub running_mean: Tensor,
    pub running_var: Tensor,
    pub momentum: f64,
    pub eps: f64,
    training: bool,
}

impl BatchNorm2d {
    pub fn new(channels: usize, device: &Device) -> Result<BatchNorm2d> {
        Ok(BatchNorm2d {
            weight: filled(&[channels], 1.0, device)?,
            bias: filled(&[channels], 0.0, device)?,
            running_mean: Tensor::zeros(&[channels], DType::F32, device)?,
            running_var: Tensor::ones(&[channels], DType::F32, device)?,
            momentum: 0.1,
            eps: 1e-5,
            training: true,
        })
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let (w, b) = (tape.param(&self.weight), tape.param(&self.bias));
        if self.training {
            x.batch_norm_train(
                Some(&w),
                Some(&b),
                Some(&self.running_mean),
                Some(&self.running_var),
                self.momentum,
                self.eps,
            )
        } else {
            x.batch_norm_eval(
                &self.running_mean,
                &self.running_var,
                Some(&w),
                Some(&b),
                self.eps,
            )
        }
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".into(), self.running_mean.clone()),
            ("running_var".into(), self.running_var.clone()),
        ]
    }
    fn set_training(&mut self, on: bool) {
        self.training = on;
    }
    fn describe(&self) -> Value {
        json!({"type": "BatchNorm2d", "channels": self.weight.numel(), "momentum": self.momentum, "eps": self.eps})
    }
}
