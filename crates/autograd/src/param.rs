//! Parameter: a trainable tensor whose storage optimizers update in place, with its accumulated gradient.
use netcl_ops::{fused_into, DType, Device, Error, Expr, Result, Tensor};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

struct Inner {
    id: usize,
    value: Tensor,
    grad: Mutex<Option<Tensor>>,
    requires_grad: AtomicBool,
}

/// A trainable tensor. Clones share the same storage and gradient slot; the value tensor keeps its
/// identity for the parameter's life (optimizers and checkpoint loads write into its storage).
#[derive(Clone)]
pub struct Parameter(Arc<Inner>);

impl std::fmt::Debug for Parameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Parameter#{}({:?})", self.0.id, self.0.value)
    }
}

impl Parameter {
    /// A parameter holding `value` (made contiguous, so updates and gradients share one layout).
    pub fn new(value: Tensor) -> Result<Parameter> {
        if !value.dtype().is_float() {
            return Err(Error::dtype(
                "Parameter::new",
                format!(
                    "value is {} {:?}; parameters must be floating point",
                    value.dtype(),
                    value.shape()
                ),
            ));
        }
        let value = if value.is_contiguous() {
            value
        } else {
            value.contiguous()?
        };
        Ok(Parameter(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            value,
            grad: Mutex::new(None),
            requires_grad: AtomicBool::new(true),
        })))
    }

    /// A process-unique id (what tapes and optimizers key their state by).
    pub fn id(&self) -> usize {
        self.0.id
    }
    pub fn value(&self) -> &Tensor {
        &self.0.value
    }
    pub fn shape(&self) -> &[usize] {
        self.0.value.shape()
    }
    pub fn dtype(&self) -> DType {
        self.0.value.dtype()
    }
    pub fn device(&self) -> &Device {
        self.0.value.device()
    }
    pub fn numel(&self) -> usize {
        self.0.value.numel()
    }
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }
    /// Freeze (false) or unfreeze the parameter; a frozen one is a constant on every tape.
    pub fn set_requires_grad(&self, on: bool) {
        self.0.requires_grad.store(on, Ordering::Relaxed)
    }

    fn slot(&self) -> MutexGuard<'_, Option<Tensor>> {
        // A poisoned lock only means another thread panicked mid-assignment of an Option: the
        // value is still a valid Option, so keep using it.
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The gradient accumulated since the last `zero_grad`, if any backward pass reached it.
    pub fn grad(&self) -> Option<Tensor> {
        self.slot().clone()
    }
    /// Replace the gradient (e.g. after an all-reduce); it must match the value's shape and dtype.
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            self.check_like("Parameter::set_grad", g, "grad")?;
        }
        *self.slot() = grad;
        Ok(())
    }
    /// Drop the gradient (no kernel; the next backward writes a fresh one).
    pub fn zero_grad(&self) {
        *self.slot() = None;
    }
    /// Add `g` to the gradient. Gradients are never updated in place, because backward rules may
    /// hand the same tensor to several inputs.
    pub fn accumulate_grad(&self, g: &Tensor) -> Result<()> {
        let next = self.accumulated(g)?;
        *self.slot() = Some(next);
        Ok(())
    }
    /// The gradient `accumulate_grad(g)` would leave, computed without changing anything (so a
    /// backward pass can compute every parameter's before it changes any).
    pub(crate) fn accumulated(&self, g: &Tensor) -> Result<Tensor> {
        self.check_like("Parameter::accumulate_grad", g, "grad")?;
        match self.grad() {
            None if g.is_contiguous() => Ok(g.clone()),
            None => g.contiguous(),
            Some(old) => old.add(g),
        }
    }
    /// Installs a gradient made by [`Parameter::accumulated`].
    pub(crate) fn put_grad(&self, g: Tensor) {
        *self.slot() = Some(g);
    }
    /// Copy `src` (any device, same shape; cast to the parameter's dtype) into the value's storage.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        let op = "Parameter::assign";
        if src.shape() != self.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "source is {:?}; the parameter is {:?}",
                    src.shape(),
                    self.shape()
                ),
            ));
        }
        let src = src.to_device(self.device())?;
        let expr = Expr::input(0).cast(self.dtype());
        fused_into(&[&src], &[(expr, self.value())])
    }

    fn check_like(&self, op: &str, t: &Tensor, what: &str) -> Result<()> {
        if t.shape() != self.shape() || t.dtype() != self.dtype() {
            return Err(Error::shape(
                op,
                format!(
                    "{what} is {} {:?}; the parameter is {} {:?}",
                    t.dtype(),
                    t.shape(),
                    self.dtype(),
                    self.shape()
                ),
            ));
        }
        if t.device() != self.device() {
            return Err(Error::device(
                op,
                format!(
                    "{what} is on {}; the parameter is on {}",
                    t.device(),
                    self.device()
                ),
            ));
        }
        Ok(())
    }
}
