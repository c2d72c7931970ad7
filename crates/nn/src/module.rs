//! The Module trait, Sequential, and the error context that names the layer an error came from.
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Activation, Error, Result, Tensor};
use serde_json::{json, Value};
use std::any::Any;

/// What a forward pass may need besides its input: position ids, an attention mask, a KV cache,
/// further inputs. Values are kept by type (one of each; types that need mutation during a
/// forward, such as a cache, carry their own lock). [`Sequential`] hands the same context to
/// every layer, so a layer deep in a model finds what the caller put in.
#[derive(Default)]
pub struct Context {
    items: Vec<Box<dyn Any + Send + Sync>>,
}

impl Context {
    /// An empty context.
    pub fn new() -> Context {
        Context::default()
    }
    /// The context with `value` added (replacing a value of the same type).
    pub fn with<T: Any + Send + Sync>(mut self, value: T) -> Context {
        self.insert(value);
        self
    }
    /// Adds `value`, replacing a value of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.items.retain(|v| !v.is::<T>());
        self.items.push(Box::new(value));
    }
    /// The value of type `T`, if the caller gave one.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.items.iter().find_map(|v| v.downcast_ref::<T>())
    }
    /// The value of type `T`, or an error naming `op` and what is missing.
    pub fn require<T: Any>(&self, op: &str) -> Result<&T> {
        self.get::<T>().ok_or_else(|| {
            Error::invalid(
                op,
                format!("the forward context has no {}", std::any::type_name::<T>()),
            )
        })
    }
}

/// A layer or model: a forward pass over Vars, its parameters, buffers and train/eval mode.
/// Modules are `Send + Sync`, so a model can be built on, moved to, or replicated on a worker
/// thread per device (tapes and Vars stay on the thread that records them).
pub trait Module: Send + Sync {
    /// The output for input `x`, recorded on `tape` (use `Tape::no_grad()` for inference).
    /// `#[track_caller]` (every impl inherits it): the debug mode names the caller's line.
    #[track_caller]
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var>;
    /// `forward` with a [`Context`] (positions, masks, caches, further inputs). Layers that need
    /// none keep this default, which ignores it.
    #[track_caller]
    fn forward_with(&self, tape: &Tape, x: &Var, _ctx: &Context) -> Result<Var> {
        self.forward(tape, x)
    }
    /// Parameters with dotted names relative to this module (`"weight"`, `"0.bias"`, ...).
    fn named_parameters(&self) -> Vec<(String, Parameter)>;
    /// Non-trainable state saved with the parameters (BatchNorm's running statistics).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// The parameters without their names, in `named_parameters` order.
    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }
    /// The parameters that train (not frozen): what an optimizer should get.
    fn trainable_parameters(&self) -> Vec<Parameter> {
        self.parameters()
            .into_iter()
            .filter(|p| p.requires_grad())
            .collect()
    }
    /// Total number of trainable elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }
    /// Training mode (dropout active, batch statistics) or evaluation mode.
    fn set_training(&mut self, _on: bool) {}
    /// Training mode: `set_training(true)`.
    fn train(&mut self) {
        self.set_training(true)
    }
    /// Evaluation mode: `set_training(false)`.
    fn eval(&mut self) {
        self.set_training(false)
    }
    /// The module tree with its hyper-parameters, e.g. `{"type": "Linear", "in": 784, ...}`
    /// (checkpoints store it).
    fn describe(&self) -> Value;
    /// The activation this module applies, when it is a plain activation a preceding layer can
    /// fuse into its own kernel.
    fn as_activation(&self) -> Option<Activation> {
        None
    }
    /// `forward` followed by `act` in one kernel, where the module supports that.
    #[track_caller]
    fn forward_fused(&self, _tape: &Tape, _x: &Var, _act: Activation) -> Option<Result<Var>> {
        None
    }
}

/// The module's type name from its description.
pub fn type_name(m: &dyn Module) -> String {
    m.describe()["type"]
        .as_str()
        .unwrap_or("Module")
        .to_string()
}

/// `e` with `ctx` (which layer) prefixed to the operation it names.
pub fn in_layer(e: Error, ctx: &str) -> Error {
    match e {
        Error::Shape { op, msg } => Error::Shape {
            op: format!("{ctx}: {op}"),
            msg,
        },
        Error::DType { op, msg } => Error::DType {
            op: format!("{ctx}: {op}"),
            msg,
        },
        Error::Device { op, msg } => Error::Device {
            op: format!("{ctx}: {op}"),
            msg,
        },
        Error::Invalid { op, msg } => Error::Invalid {
            op: format!("{ctx}: {op}"),
            msg,
        },
        other => other,
    }
}

/// Layers applied in order. A Linear followed by ReLU runs as one kernel with the
/// activation in its epilogue.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// No layers yet: add them with [`Sequential::with`] or [`Sequential::push`].
    pub fn new() -> Sequential {
        Sequential::default()
    }
    /// Append a layer (builder style).
    pub fn with(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
    /// Appends a boxed layer.
    pub fn push(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }
    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    /// No layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
    /// Layer `i` (its parameters are named `"{i}.…"`).
    pub fn layer(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|l| l.as_ref())
    }
}

impl Module for Sequential {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        self.forward_with(tape, x, &Context::default())
    }
    fn forward_with(&self, tape: &Tape, x: &Var, ctx: &Context) -> Result<Var> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            let layer = &self.layers[i];
            let next_act = self.layers.get(i + 1).and_then(|l| l.as_activation());
            let at = i;
            let where_ = || format!("layer {at} ({}) of Sequential", type_name(layer.as_ref()));
            // No closure around the layer call: it would end the caller's `#[track_caller]` site.
            let fused = match next_act {
                Some(act) => layer.forward_fused(tape, &h, act),
                None => None,
            };
            h = match fused {
                Some(r) => {
                    i += 1;
                    r
                }
                None => layer.forward_with(tape, &h, ctx),
            }
            .map_err(|e| in_layer(e, &where_()))?;
            i += 1;
        }
        Ok(h)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        prefixed(&self.layers, |l| l.named_parameters())
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        prefixed(&self.layers, |l| l.named_buffers())
    }
    fn set_training(&mut self, on: bool) {
        for l in &mut self.layers {
            l.set_training(on);
        }
    }
    fn describe(&self) -> Value {
        let layers: Vec<Value> = self.layers.iter().map(|l| l.describe()).collect();
        json!({"type": "Sequential", "layers": layers})
    }
}

/// Each layer's named items with its index prefixed (`"2.weight"`).
fn prefixed<T>(
    layers: &[Box<dyn Module>],
    f: impl Fn(&dyn Module) -> Vec<(String, T)>,
) -> Vec<(String, T)> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            f(l.as_ref())
                .into_iter()
                .map(move |(n, t)| (format!("{i}.{n}"), t))
        })
        .collect()
}
