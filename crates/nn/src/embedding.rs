//! Embedding layer: rows of a (num_embeddings, dim) table for integer ids.
use crate::init::Init;
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{DType, Device, Error, Generator, Result, Tensor};
use serde_json::{json, Value};

/// A lookup table as a layer: integer ids of any shape (I32) in, the rows of its
/// `[num_embeddings, dim]` weight out (shape `[..., dim]`). Its backward sums each row's
/// gradients in a fixed order (no float atomics), so reruns are bit-identical.
pub struct Embedding {
    pub weight: Parameter,
}

impl Embedding {
    /// f32 table initialised N(0, 1) as PyTorch does.
    pub fn new(
        num_embeddings: usize,
        dim: usize,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Embedding> {
        let init = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let w = init.tensor(
            &[num_embeddings, dim],
            dim,
            num_embeddings,
            DType::F32,
            device,
            gen,
        )?;
        Ok(Embedding {
            weight: Parameter::new(w)?,
        })
    }

    /// A table holding the given `weight` `[num_embeddings, dim]`.
    pub fn from_weights(weight: Tensor) -> Result<Embedding> {
        if weight.ndim() != 2 {
            return Err(Error::shape(
                "Embedding::from_weights",
                format!("weight {:?} must be [num_embeddings, dim]", weight.shape()),
            ));
        }
        Ok(Embedding {
            weight: Parameter::new(weight)?,
        })
    }
}

impl Module for Embedding {
    /// `x` holds I32 ids (a constant); the result is (..., dim).
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        tape.param(&self.weight).embedding(x.value())
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
    fn describe(&self) -> Value {
        let s = self.weight.shape();
        json!({"type": "Embedding", "num_embeddings": s[0], "dim": s[1]})
    }
}
