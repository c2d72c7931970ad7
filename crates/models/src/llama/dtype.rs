//! A Llama's weights in another float dtype (a checkpoint trained in f32 generating with bf16 weights, say).
use super::config::LlamaConfig;
use super::model::Llama;
use netcl_nn::Module;
use netcl_ops::{DType, Error, Generator, Result};
use std::collections::HashMap;

impl Llama {
    /// The same model with its weights in `dtype` (rounded to nearest): a new model on the same
    /// device, this one left as it is. Float dtypes only; a model with LoRA adapters is an error
    /// (merge them first: `Llama::merge_lora`), as the new model would not hold them.
    pub fn to_dtype(&self, dtype: DType) -> Result<Llama> {
        let op = "Llama::to_dtype";
        if !dtype.is_float() {
            return Err(Error::invalid(
                op,
                format!("{dtype} is not a float dtype: use f32, f16, bf16 or f64"),
            ));
        }
        let cfg = LlamaConfig {
            dtype,
            ..self.config.clone()
        };
        let out = Llama::new(cfg, self.device(), &mut Generator::new(0))?;
        let mut mine: HashMap<String, _> = self.named_parameters().into_iter().collect();
        for (name, p) in out.named_parameters() {
            let src = mine.remove(&name).ok_or_else(|| {
                Error::invalid(op, format!("the model has no parameter '{name}'"))
            })?;
            p.value().copy_(&src.value().to_dtype(dtype)?)?;
        }
        if let Some(extra) = mine.keys().min() {
            return Err(Error::invalid(
                op,
                format!(
                    "parameter '{extra}' (of {} beyond the model's own, e.g. LoRA adapters) has no \
                     place in the converted model: merge or drop the adapters first",
                    mine.len()
                ),
            ));
        }
        Ok(out)
    }
}
