//! Parameter: a trainable tensor whose storage optimizers update in place, with its accumulated gradient.
use netcl_ops::{fused_into, DType, Device, Error, Expr, Result, Tensor};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

struct Inner {
    id: usize,
    value: Tensor,
    grad: Mutex<GradSlot>,
    requires_grad: AtomicBool,
}

/// Where a parameter's gradient lives.
enum GradSlot {
    /// No gradient since the last `zero_grad`.
    Empty,
    /// A tensor of its own (replaced, never written in place).
    Owned(Tensor),
    /// A view into a [`GradBuffers`] buffer, written in place; `live` is false after `zero_grad`
    /// (the next gradient is copied in instead of added, so zeroing costs no kernel).
    View { view: Tensor, live: bool },
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
            grad: Mutex::new(GradSlot::Empty),
            requires_grad: AtomicBool::new(true),
        })))
    }

    /// A process-unique id (what tapes and optimizers key their state by).
    pub fn id(&self) -> usize {
        self.0.id
    }
    /// The current value (optimizers and [`Parameter::assign`] write into its storage).
    pub fn value(&self) -> &Tensor {
        &self.0.value
    }
    /// The value's shape.
    pub fn shape(&self) -> &[usize] {
        self.0.value.shape()
    }
    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        self.0.value.dtype()
    }
    /// The device the value lives on.
    pub fn device(&self) -> &Device {
        self.0.value.device()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.value.numel()
    }
    /// Whether the parameter trains (false once frozen with [`Parameter::set_requires_grad`]).
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }
    /// Freeze (false) or unfreeze the parameter; a frozen one is a constant on every tape.
    pub fn set_requires_grad(&self, on: bool) {
        self.0.requires_grad.store(on, Ordering::Relaxed)
    }

    fn slot(&self) -> MutexGuard<'_, GradSlot> {
        // A poisoned lock only means another thread panicked mid-assignment: the slot is still a
        // valid value, so keep using it.
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The gradient accumulated since the last `zero_grad`, if any backward pass reached it (a
    /// view into its [`GradBuffers`] buffer when it has one).
    pub fn grad(&self) -> Option<Tensor> {
        match &*self.slot() {
            GradSlot::Owned(t) => Some(t.clone()),
            GradSlot::View { view, live: true } => Some(view.clone()),
            _ => None,
        }
    }
    /// Replace the gradient (e.g. after an all-reduce); it must match the value's shape and dtype.
    /// With a [`GradBuffers`] view the values are copied into the view.
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            self.check_like("Parameter::set_grad", g, "grad")?;
        }
        let mut slot = self.slot();
        match (&mut *slot, grad) {
            (GradSlot::View { live, .. }, None) => *live = false,
            (GradSlot::View { view, live }, Some(g)) => {
                fused_into(&[&g], &[(Expr::input(0), &*view)])?;
                *live = true;
            }
            (slot, None) => *slot = GradSlot::Empty,
            (slot, Some(g)) => *slot = GradSlot::Owned(g),
        }
        Ok(())
    }
    /// Forget the gradient. No kernel runs: an owned gradient is dropped, a buffer view is marked
    /// stale and the next gradient overwrites it (use [`GradBuffers::zero`] to zero a whole buffer).
    pub fn zero_grad(&self) {
        let mut slot = self.slot();
        match &mut *slot {
            GradSlot::View { live, .. } => *live = false,
            s => *s = GradSlot::Empty,
        }
    }
    /// Add `g` to the gradient: in place into a buffer view, else into a new tensor (owned
    /// gradients are never updated in place, because backward rules may hand the same tensor to
    /// several inputs).
    pub fn accumulate_grad(&self, g: &Tensor) -> Result<()> {
        match self.accumulated(g)? {
            Some(next) => self.put_grad(next),
            None => self.add_into_view(g)?,
        }
        Ok(())
    }
    /// The owned gradient `accumulate_grad(g)` would leave, computed without changing anything
    /// (so a backward pass can compute every parameter's before it changes any); `None` for a
    /// buffer view, which [`Parameter::add_into_view`] updates at the end instead.
    pub(crate) fn accumulated(&self, g: &Tensor) -> Result<Option<Tensor>> {
        self.check_like("Parameter::accumulate_grad", g, "grad")?;
        let old = match &*self.slot() {
            GradSlot::View { .. } => return Ok(None),
            GradSlot::Owned(t) => Some(t.clone()),
            GradSlot::Empty => None,
        };
        Ok(Some(match old {
            None if g.is_contiguous() => g.clone(),
            None => g.contiguous()?,
            Some(old) => old.add(g)?,
        }))
    }
    /// Installs a gradient made by [`Parameter::accumulated`].
    pub(crate) fn put_grad(&self, g: Tensor) {
        *self.slot() = GradSlot::Owned(g);
    }
    /// Adds `g` into the buffer view in place (copies it when the view is stale).
    pub(crate) fn add_into_view(&self, g: &Tensor) -> Result<()> {
        let mut slot = self.slot();
        let GradSlot::View { view, live } = &mut *slot else {
            return Err(Error::invalid(
                "Parameter::add_into_view",
                "the parameter has no gradient buffer",
            ));
        };
        let expr = if *live {
            Expr::input(0) + Expr::input(1)
        } else {
            Expr::input(1)
        };
        fused_into(&[&*view, g], &[(expr, &*view)])?;
        *live = true;
        Ok(())
    }
    /// Makes `view` (same shape, dtype and device, contiguous) this parameter's gradient storage.
    fn attach_view(&self, view: Tensor) {
        let mut slot = self.slot();
        let live = match &*slot {
            GradSlot::Owned(old) => fused_into(&[old], &[(Expr::input(0), &view)]).is_ok(),
            GradSlot::View {
                view: old,
                live: true,
            } => fused_into(&[old], &[(Expr::input(0), &view)]).is_ok(),
            _ => false,
        };
        *slot = GradSlot::View { view, live };
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

/// One flat gradient buffer per (device, dtype) for a set of parameters: each parameter's
/// gradient becomes a contiguous view into its buffer and backward adds into it in place. A
/// model's whole gradient is then one tensor per device and dtype, for one transfer, one
/// all-reduce or one optimizer launch, and zeroing it is one fill. (Parameter order within a
/// buffer is the order given; a parameter listed twice is placed once.)
pub struct GradBuffers {
    buffers: Vec<Tensor>,
    params: Vec<Parameter>,
}

impl GradBuffers {
    /// Allocates the buffers (zeros) and attaches every parameter's view; a gradient the
    /// parameter already had is copied into its view.
    pub fn new(params: &[Parameter]) -> Result<GradBuffers> {
        let mut seen = std::collections::HashSet::new();
        let params: Vec<Parameter> = params
            .iter()
            .filter(|p| seen.insert(p.id()))
            .cloned()
            .collect();
        let mut groups: Vec<(Device, DType, Vec<&Parameter>)> = Vec::new();
        for p in &params {
            match groups
                .iter_mut()
                .find(|(d, t, _)| d == p.device() && *t == p.dtype())
            {
                Some((_, _, v)) => v.push(p),
                None => groups.push((p.device().clone(), p.dtype(), vec![p])),
            }
        }
        let mut buffers = Vec::with_capacity(groups.len());
        for (device, dtype, members) in groups {
            let total: usize = members.iter().map(|p| p.numel()).sum();
            let buf = Tensor::zeros(&[total], dtype, &device)?;
            let mut at = 0;
            for p in members {
                let view = buf.narrow(0, at, p.numel())?.reshape(p.shape())?;
                p.attach_view(view);
                at += p.numel();
            }
            buffers.push(buf);
        }
        Ok(GradBuffers { buffers, params })
    }

    /// The flat 1-D buffers, one per (device, dtype), in the order their first parameter came.
    pub fn buffers(&self) -> &[Tensor] {
        &self.buffers
    }

    /// Zeroes every buffer (one fill each) and marks every parameter's gradient live, so the
    /// whole buffer holds exactly the gradients of the next backward passes.
    pub fn zero(&self) -> Result<()> {
        for b in &self.buffers {
            b.fill_(0.0)?;
        }
        for p in &self.params {
            if let GradSlot::View { live, .. } = &mut *p.slot() {
                *live = true;
            }
        }
        Ok(())
    }
}
