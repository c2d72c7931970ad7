//! A Llama from a netcl checkpoint alone: its config from the checkpoint's json, checked against the tensors the json lists before the model is built.
use super::config::LlamaConfig;
use super::model::Llama;
use super::stored::{check_stored, Stored};
use netcl_nn::checkpoint::{read_meta, Checkpoint};
use netcl_nn::load_checkpoint;
use netcl_ops::{Device, Error, Generator, Result};
use std::path::Path;

/// The prefix of the model's tensors in a checkpoint (the optimizer's are `optim.`).
const MODEL: &str = "model.";

impl Llama {
    /// The model a checkpoint at `path` (`save_checkpoint` of a Llama) holds, on `device`, and
    /// its metadata. The config in its json must match the tensors it lists (the number of
    /// layers, every shape, float dtypes) before anything is allocated: a json asking for a
    /// million layers is an error at once, not a model built and then refused.
    pub fn from_checkpoint(path: impl AsRef<Path>, device: &Device) -> Result<(Llama, Checkpoint)> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let meta = read_meta(path)?;
        let cfg: LlamaConfig = serde_json::from_value(meta.model.clone())
            .map_err(|e| Error::format(&what, format!("not a Llama checkpoint: {e}")))?;
        cfg.validate()
            .map_err(|e| Error::format(&what, e.to_string()))?;
        let stored: Vec<Stored> = meta
            .tensors
            .iter()
            .filter_map(|t| {
                Some(Stored {
                    name: t.name.strip_prefix(MODEL)?.to_string(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    file: what.clone(),
                })
            })
            .collect();
        check_stored(&cfg, &stored, &what, |n| format!("{MODEL}{n}"))?;
        let model = Llama::new(cfg, device, &mut Generator::new(0))?;
        let meta = load_checkpoint(path, &model, None)?;
        Ok((model, meta))
    }
}
