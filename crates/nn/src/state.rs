//! Save and restore a model's parameters and buffers (and an optimizer's state) through the checkpoint format.
use crate::checkpoint::{self, Checkpoint, CheckpointInfo, SaveOptions};
use crate::module::{type_name, Module};
use netcl_ops::{fused_into, Error, Expr, Result, Tensor};
use netcl_optim::Optimizer;
use serde_json::Value;
use std::path::Path;

const MODEL: &str = "model.";
const OPTIM: &str = "optim.";

/// Save `model` (parameters and buffers as `model.<name>`), the optimizer's state (as
/// `optim.<name>`, hyper-parameters in the json) and `step` to `path.json` + its npz,
/// atomically. `extra` is stored as is (epoch, metrics, RNG seeds, ...).
pub fn save_checkpoint(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    step: u64,
    extra: Value,
) -> Result<Checkpoint> {
    save_checkpoint_with(path, model, optimizer, step, extra, &SaveOptions::default())
}

/// [`save_checkpoint`] with [`SaveOptions`], e.g. `keep_last: 3` to keep the last three saves
/// loadable (see [`checkpoint::checkpoints`]).
pub fn save_checkpoint_with(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    step: u64,
    extra: Value,
    options: &SaveOptions,
) -> Result<Checkpoint> {
    let mut tensors: Vec<(String, Tensor)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (format!("{MODEL}{n}"), p.value().clone()))
        .chain(
            model
                .named_buffers()
                .into_iter()
                .map(|(n, t)| (format!("{MODEL}{n}"), t)),
        )
        .collect();
    if let Some(opt) = optimizer {
        tensors.extend(
            opt.state_tensors()
                .into_iter()
                .map(|(n, t)| (format!("{OPTIM}{n}"), t)),
        );
    }
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let info = CheckpointInfo {
        model: model.describe(),
        optimizer: optimizer.map(|o| o.hyper_params()),
        step,
        extra,
    };
    checkpoint::save_with(path, &info, &refs, options)
}

/// Save only `optimizer`'s state (as [`save_checkpoint`] names it) and `step` to `path.json` +
/// its npz, atomically: what a rank of a sharded optimizer holds beside the model rank 0 saves.
pub fn save_optimizer(
    path: impl AsRef<Path>,
    optimizer: &dyn Optimizer,
    step: u64,
    extra: Value,
) -> Result<Checkpoint> {
    let tensors: Vec<(String, Tensor)> = (optimizer.state_tensors().into_iter())
        .map(|(n, t)| (format!("{OPTIM}{n}"), t))
        .collect();
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let info = CheckpointInfo {
        model: Value::String("optimizer state only".into()),
        optimizer: Some(optimizer.hyper_params()),
        step,
        extra,
    };
    checkpoint::save_with(path, &info, &refs, &SaveOptions::default())
}

/// Restore the optimizer state of a checkpoint ([`save_optimizer`]'s, or the optimizer part of
/// [`save_checkpoint`]'s) into `optimizer`, which checks names, shapes and its own settings
/// first and changes nothing on a mismatch. Returns the checkpoint's metadata.
pub fn load_optimizer(path: impl AsRef<Path>, optimizer: &mut dyn Optimizer) -> Result<Checkpoint> {
    let (state, meta) = read_optimizer(path)?;
    optimizer.load_state(&state.0, &state.1)?;
    Ok(meta)
}

/// The optimizer state of a checkpoint ([`save_optimizer`]'s, or the optimizer part of
/// [`save_checkpoint`]'s) as `load_state` takes it, (hyper-parameters, named state tensors) on the
/// host, without loading it anywhere; and the checkpoint's metadata.
pub fn read_optimizer(path: impl AsRef<Path>) -> Result<(OptimizerState, Checkpoint)> {
    let path = path.as_ref();
    let loaded = checkpoint::load(path)?;
    let hyper = loaded.meta().optimizer.clone().ok_or_else(|| {
        Error::format(
            path.display().to_string(),
            "the checkpoint holds no optimizer state",
        )
    })?;
    let tensors: Vec<(String, Tensor)> = (loaded.tensors().iter())
        .filter_map(|(n, t)| n.strip_prefix(OPTIM).map(|s| (s.to_string(), t.clone())))
        .collect();
    Ok(((hyper, tensors), loaded.meta().clone()))
}

/// An optimizer's saved state: its hyper-parameters and named state tensors.
pub type OptimizerState = (Value, Vec<(String, Tensor)>);

/// Restore what [`save_checkpoint`] wrote into `model` (and `optimizer`): every name, shape
/// and dtype is checked first, and a mismatch changes nothing and lists every difference.
/// Returns the checkpoint's metadata (step, extra, ...).
pub fn load_checkpoint(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&mut dyn Optimizer>,
) -> Result<Checkpoint> {
    let path = path.as_ref();
    let loaded = checkpoint::load(path)?;
    let params = model.named_parameters();
    let buffers = model.named_buffers();
    let mut expected: Vec<(String, Vec<usize>, netcl_ops::DType)> = params
        .iter()
        .map(|(n, p)| (format!("{MODEL}{n}"), p.shape().to_vec(), p.dtype()))
        .chain(
            buffers
                .iter()
                .map(|(n, t)| (format!("{MODEL}{n}"), t.shape().to_vec(), t.dtype())),
        )
        .collect();
    let optim_tensors: Vec<(String, Tensor)> = loaded
        .tensors()
        .iter()
        .filter_map(|(n, t)| n.strip_prefix(OPTIM).map(|s| (s.to_string(), t.clone())))
        .collect();
    // The optimizer's own names are checked by its load_state; keep them out of the model check.
    expected.extend(
        loaded
            .meta()
            .tensors
            .iter()
            .filter(|m| m.name.starts_with(OPTIM))
            .map(|m| (m.name.clone(), m.shape.clone(), m.dtype)),
    );
    loaded.check_against(&expected).map_err(|e| match e {
        Error::Format { what, msg } => Error::Format {
            what,
            msg: format!(
                "{msg} (this model is a {}: {})",
                type_name(model),
                model.describe()
            ),
        },
        other => other,
    })?;
    let meta = loaded.meta().clone();
    if let Some(opt) = optimizer {
        let hyper = meta.optimizer.as_ref().ok_or_else(|| {
            Error::format(
                path.display().to_string(),
                "the checkpoint holds no optimizer state",
            )
        })?;
        opt.load_state(hyper, &optim_tensors)?;
    }
    for (n, p) in &params {
        p.assign(loaded.require(&format!("{MODEL}{n}"))?)?;
    }
    for (n, t) in &buffers {
        let src = loaded
            .require(&format!("{MODEL}{n}"))?
            .to_device(t.device())?;
        fused_into(&[&src], &[(Expr::input(0), t)])?;
    }
    Ok(meta)
}
