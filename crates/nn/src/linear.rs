//! Linear layer: y = x·Wᵀ + b as one GEMM with the bias (and a following ReLU) in its epilogue.
use crate::init::Init;
use crate::lora::{LoraAdapter, LoraConfig};
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Activation, DType, Device, Error, Generator, Result, Tensor};
use serde_json::{json, Value};

/// A fully connected layer `y = x Wᵀ + b` over the last dim: weight `[out, in]`, optional bias
/// `[out]`. One GEMM with the bias in its epilogue; inside a `Sequential` a following ReLU runs
/// in the same kernel (and its backward masks by the output). Optionally carries a LoRA adapter
/// ([`Linear::add_lora`]). A clone is a handle: it shares the parameters (and an adapter's
/// dropout generator) with the original.
#[derive(Clone)]
pub struct Linear {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    /// A LoRA adapter added to the output (see [`Linear::add_lora`]).
    pub lora: Option<LoraAdapter>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// f32 layer with PyTorch's default initialisation and a bias.
    pub fn new(inn: usize, out: usize, device: &Device, gen: &mut Generator) -> Result<Linear> {
        Linear::with_init(inn, out, true, Init::Default, DType::F32, device, gen)
    }

    /// f32 layer without a bias (as in Llama's projections), PyTorch's default initialisation.
    pub fn no_bias(inn: usize, out: usize, device: &Device, gen: &mut Generator) -> Result<Linear> {
        Linear::with_init(inn, out, false, Init::Default, DType::F32, device, gen)
    }

    /// A layer holding the given `weight` `[out, in]` and optional `bias` `[out]` (same dtype and
    /// device), e.g. weights imported from another framework.
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let op = "Linear::from_weights";
        let [out_features, in_features] = *weight.shape() else {
            return Err(Error::shape(
                op,
                format!("weight {:?} must be [out, in]", weight.shape()),
            ));
        };
        if let Some(b) = &bias {
            if b.shape() != [out_features]
                || b.dtype() != weight.dtype()
                || b.device() != weight.device()
            {
                return Err(Error::shape(
                    op,
                    format!(
                        "bias {} {:?} on {} does not fit weight {} {:?} on {} (need [{out_features}])",
                        b.dtype(),
                        b.shape(),
                        b.device(),
                        weight.dtype(),
                        weight.shape(),
                        weight.device()
                    ),
                ));
            }
        }
        Ok(Linear {
            weight: Parameter::new(weight)?,
            bias: bias.map(Parameter::new).transpose()?,
            lora: None,
            in_features,
            out_features,
        })
    }

    /// A layer with the weight drawn by `init` (the bias, when present, by PyTorch's default).
    pub fn with_init(
        in_features: usize,
        out_features: usize,
        bias: bool,
        init: Init,
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Linear> {
        let w = init.tensor(
            &[out_features, in_features],
            in_features,
            out_features,
            dtype,
            device,
            gen,
        )?;
        let b = if bias {
            let t = Init::Default.tensor(
                &[out_features],
                in_features,
                out_features,
                dtype,
                device,
                gen,
            )?;
            Some(Parameter::new(t)?)
        } else {
            None
        };
        Ok(Linear {
            weight: Parameter::new(w)?,
            bias: b,
            lora: None,
            in_features,
            out_features,
        })
    }

    #[track_caller]
    fn run(&self, tape: &Tape, x: &Var, act: Activation) -> Result<Var> {
        let b = self.bias.as_ref().map(|b| tape.param(b));
        let y = x.linear(&tape.param(&self.weight), b.as_ref(), act)?;
        match &self.lora {
            Some(l) => y.add(&l.forward(tape, x)?),
            None => Ok(y),
        }
    }

    /// Adds a LoRA adapter and freezes the weight and bias (no gradient, so no optimizer state
    /// and no gradient memory for them): only the adapter trains. A layer that has one already is
    /// an error (its trained adapter is not replaced: `merge_lora` first).
    pub fn add_lora(&mut self, cfg: &LoraConfig, gen: &mut Generator) -> Result<()> {
        if let Some(l) = &self.lora {
            return Err(Error::invalid(
                "Linear::add_lora",
                format!(
                    "the layer has an adapter already (rank {}, alpha {}): merge_lora first",
                    l.rank(),
                    l.alpha
                ),
            ));
        }
        let adapter = LoraAdapter::new(self.weight.value(), cfg, gen)?;
        self.attach_lora(adapter);
        Ok(())
    }

    /// Puts `adapter` (made for this weight) on the layer, in place of any, and freezes the
    /// weight and bias.
    pub fn attach_lora(&mut self, adapter: LoraAdapter) {
        self.lora = Some(adapter);
        self.weight.set_requires_grad(false);
        if let Some(b) = &self.bias {
            b.set_requires_grad(false);
        }
    }

    /// Folds the adapter into the weight (`W += scale·B·A`) and removes it; the weight trains again.
    pub fn merge_lora(&mut self) -> Result<()> {
        if let Some(l) = self.lora.take() {
            // Summed in the adapter's precision, rounded once to the weight's dtype.
            let (w, delta) = (self.weight.value(), l.delta()?);
            let merged = w
                .to_dtype(delta.dtype())?
                .add(&delta)?
                .to_dtype(w.dtype())?;
            self.weight.assign(&merged)?;
            self.weight.set_requires_grad(true);
            if let Some(b) = &self.bias {
                b.set_requires_grad(true);
            }
        }
        Ok(())
    }
}

impl Module for Linear {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        self.run(tape, x, Activation::None)
    }
    fn forward_fused(&self, tape: &Tape, x: &Var, act: Activation) -> Option<Result<Var>> {
        match matches!(act, Activation::Relu) && self.lora.is_none() {
            true => Some(self.run(tape, x, act)),
            false => None,
        }
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        if let Some(l) = &self.lora {
            v.push(("lora_a".to_string(), l.a.clone()));
            v.push(("lora_b".to_string(), l.b.clone()));
        }
        v
    }
    fn set_training(&mut self, on: bool) {
        if let Some(l) = &mut self.lora {
            l.set_training(on);
        }
    }
    fn describe(&self) -> Value {
        json!({"type": "Linear", "in": self.in_features, "out": self.out_features, "bias": self.bias.is_some()})
    }
}
