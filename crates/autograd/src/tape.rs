//! Tape and Var: ops on Vars record a backward closure on the tape; `backward` runs them in reverse.
use crate::anomaly::{self, Site};
use crate::param::Parameter;
use crate::parts::{gather, Part};
use netcl_ops::{DType, Device, Error, Result, Tensor, VersionWatch};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Called with each parameter whose gradient is final (see [`Tape::backward_hooked`]).
pub type ParamHook<'a> = dyn FnMut(&Parameter) -> Result<()> + 'a;

/// What a backward rule gets: the gradient of the op's output, which inputs need a gradient, and
/// the gradients accumulated so far for its inputs (rules recorded with `record_folding` may take
/// one and return it summed with their own, in their kernel, where a plain rule's gradient costs
/// an add). It returns one gradient per input (`None` where not needed or identically zero).
pub(crate) type BackwardFn =
    Box<dyn FnOnce(&Tensor, &[bool], &mut [Option<Tensor>]) -> Result<Vec<Option<Tensor>>>>;

struct Node {
    op: &'static str,
    inputs: Vec<usize>,
    /// Which of the op's inputs have a node (the others are constants).
    tracked: Vec<bool>,
    backward: Option<BackwardFn>,
    /// Leaves: the parameter the gradient accumulates into (None for `Tape::leaf` inputs).
    param: Option<Parameter>,
    shape: Vec<usize>,
    dtype: DType,
    /// The versions of the op's input values and output when it was recorded: a backward rule
    /// may read any of them, so backward refuses to run if one was written in place since.
    watched: Vec<Watched>,
    /// Where the op was recorded, kept only while anomaly detection is on (`NETCL_DEBUG=nan`).
    site: Option<Site>,
    /// A narrow view of its one input: its gradient becomes a part of the input's (parts.rs).
    part: Option<Part>,
}

/// One value a node's backward rule may read: input `index` (None: the output) and its version.
struct Watched {
    index: Option<usize>,
    dtype: DType,
    shape: Vec<usize>,
    version: VersionWatch,
}

impl Watched {
    fn of(index: Option<usize>, t: &Tensor) -> Watched {
        Watched {
            index,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            version: t.watch_version(),
        }
    }
}

struct Inner {
    enabled: bool,
    generation: Cell<u64>,
    nodes: RefCell<Vec<Node>>,
    params: RefCell<HashMap<usize, usize>>,
    /// A probe (a tape that records nothing): the trainable parameters a pass asked for, in
    /// first-use order (checkpoint.rs learns which parameters a function reads this way).
    seen: Option<RefCell<Vec<Parameter>>>,
    /// Parameters become leaves whose gradients `backward` returns in its `Gradients` instead of
    /// adding them to the parameters (checkpoint.rs hands them to the outer tape).
    param_leaves: bool,
}

/// Records the ops applied to Vars so `backward` can compute gradients. Cheap to clone (a
/// handle). Build one per forward pass; `backward` frees everything it recorded.
#[derive(Clone)]
pub struct Tape(Rc<Inner>);

/// A tensor in a computation: its value, and (when recorded) its place on a tape.
#[derive(Clone)]
pub struct Var {
    value: Tensor,
    node: Option<NodeRef>,
}

#[derive(Clone)]
struct NodeRef {
    tape: Tape,
    generation: u64,
    id: usize,
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.node {
            Some(n) => write!(f, "Var#{}({:?})", n.id, self.value),
            None => write!(f, "Var(const {:?})", self.value),
        }
    }
}

/// The value, as [`Tensor`]'s `{}` prints it.
impl std::fmt::Display for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.value, f)
    }
}

impl From<Tensor> for Var {
    fn from(t: Tensor) -> Var {
        Var::constant(t)
    }
}

impl From<&Tensor> for Var {
    fn from(t: &Tensor) -> Var {
        Var::constant(t.clone())
    }
}

impl Var {
    /// A value no gradient flows into (inputs, targets, masks).
    pub fn constant(value: Tensor) -> Var {
        Var { value, node: None }
    }
    /// The value this Var holds (no copy).
    pub fn value(&self) -> &Tensor {
        &self.value
    }
    /// The value, consuming the Var.
    pub fn into_value(self) -> Tensor {
        self.value
    }
    /// The value's shape.
    pub fn shape(&self) -> &[usize] {
        self.value.shape()
    }
    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        self.value.dtype()
    }
    /// The device the value lives on.
    pub fn device(&self) -> &Device {
        self.value.device()
    }
    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.value.ndim()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.value.numel()
    }
    /// Whether a gradient can flow back from this Var (it was recorded on a tape).
    pub fn is_tracked(&self) -> bool {
        self.node.is_some()
    }
    /// The same value, cut off from the tape.
    pub fn detach(&self) -> Var {
        Var::constant(self.value.clone())
    }
    /// The first element as f64 (one device read: avoid inside a step loop's hot path).
    pub fn item(&self) -> Result<f64> {
        let v = self.value.to_vec_f64()?;
        v.first().copied().ok_or_else(|| {
            Error::shape(
                "Var::item",
                format!("value {:?} is empty", self.value.shape()),
            )
        })
    }
}

/// The gradients `backward` computed for the `Tape::leaf` Vars it reached.
pub struct Gradients {
    generation: u64,
    tape: Tape,
    grads: HashMap<usize, Tensor>,
}

impl std::fmt::Debug for Gradients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gradients({} leaves)", self.grads.len())
    }
}

impl Gradients {
    /// The gradient of the output with respect to `leaf` (None if it does not depend on it).
    pub fn get(&self, leaf: &Var) -> Option<&Tensor> {
        let n = leaf.node.as_ref()?;
        if !Rc::ptr_eq(&n.tape.0, &self.tape.0) || n.generation != self.generation {
            return None;
        }
        self.grads.get(&n.id)
    }
}

impl Default for Tape {
    fn default() -> Self {
        Tape::new()
    }
}

impl Tape {
    /// A tape that records.
    pub fn new() -> Tape {
        Tape::make(true)
    }
    /// A tape that records nothing: parameters come out as constants and no op keeps saved
    /// tensors (inference and evaluation).
    pub fn no_grad() -> Tape {
        Tape::make(false)
    }
    fn make(enabled: bool) -> Tape {
        Tape::make_with(enabled, false, false)
    }
    fn make_with(enabled: bool, probe: bool, param_leaves: bool) -> Tape {
        Tape(Rc::new(Inner {
            enabled,
            generation: Cell::new(0),
            nodes: RefCell::new(Vec::new()),
            params: RefCell::new(HashMap::new()),
            seen: probe.then(|| RefCell::new(Vec::new())),
            param_leaves,
        }))
    }
    /// A tape that records nothing but the trainable parameters a pass asks for
    /// ([`Tape::seen_params`]).
    pub(crate) fn probe() -> Tape {
        Tape::make_with(false, true, false)
    }
    /// A recording tape whose parameters are leaves: `backward` returns their gradients in its
    /// `Gradients` (look them up with the Var `param` gave) and leaves the parameters alone.
    pub(crate) fn with_param_leaves() -> Tape {
        Tape::make_with(true, false, true)
    }
    /// The trainable parameters a probe was asked for, in first-use order.
    pub(crate) fn seen_params(&self) -> Vec<Parameter> {
        self.0
            .seen
            .as_ref()
            .map_or_else(Vec::new, |s| s.borrow().clone())
    }
    /// False for [`Tape::no_grad`] tapes.
    pub fn is_recording(&self) -> bool {
        self.0.enabled
    }
    /// Number of ops and leaves recorded since the last backward.
    pub fn len(&self) -> usize {
        self.0.nodes.borrow().len()
    }
    /// Nothing recorded since the last backward.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&self, node: Node) -> NodeRef {
        let mut nodes = self.0.nodes.borrow_mut();
        nodes.push(node);
        NodeRef {
            tape: self.clone(),
            generation: self.0.generation.get(),
            id: nodes.len() - 1,
        }
    }

    fn leaf_node(value: &Tensor, param: Option<Parameter>) -> Node {
        Node {
            op: "leaf",
            inputs: Vec::new(),
            tracked: Vec::new(),
            backward: None,
            param,
            shape: value.shape().to_vec(),
            dtype: value.dtype(),
            watched: Vec::new(),
            site: None,
            part: None,
        }
    }

    /// The Var of a parameter on this tape (one leaf per parameter, however often it is used);
    /// a constant when the tape does not record or the parameter is frozen.
    pub fn param(&self, p: &Parameter) -> Var {
        if !self.0.enabled || !p.requires_grad() {
            if let Some(seen) = self.0.seen.as_ref().filter(|_| p.requires_grad()) {
                let mut seen = seen.borrow_mut();
                if !seen.iter().any(|q| q.id() == p.id()) {
                    seen.push(p.clone());
                }
            }
            return Var::constant(p.value().clone());
        }
        let existing = self.0.params.borrow().get(&p.id()).copied();
        let id = match existing {
            Some(id) => id,
            None => {
                let owner = (!self.0.param_leaves).then(|| p.clone());
                let r = self.push(Tape::leaf_node(p.value(), owner));
                self.0.params.borrow_mut().insert(p.id(), r.id);
                r.id
            }
        };
        Var {
            value: p.value().clone(),
            node: Some(NodeRef {
                tape: self.clone(),
                generation: self.0.generation.get(),
                id,
            }),
        }
    }

    /// A leaf whose gradient `backward` returns in its `Gradients` (for gradient checks and
    /// input gradients); a constant when the tape does not record. Only floating-point values
    /// have gradients: an integer `value` is an error (as in PyTorch).
    pub fn leaf(&self, value: &Tensor) -> Result<Var> {
        if !value.dtype().is_float() {
            return Err(Error::dtype(
                "Tape::leaf",
                format!(
                    "value is {} {:?}; only floating-point values can have gradients (cast it \
                     with to_dtype first)",
                    value.dtype(),
                    value.shape()
                ),
            ));
        }
        if !self.0.enabled {
            return Ok(Var::constant(value.clone()));
        }
        Ok(Var {
            value: value.clone(),
            node: Some(self.push(Tape::leaf_node(value, None))),
        })
    }

    /// Gradients of a scalar `output` (one element) into every parameter and leaf it depends on.
    /// Frees the recorded graph: Vars from this forward pass cannot be used in new ops afterwards.
    pub fn backward(&self, output: &Var) -> Result<Gradients> {
        if output.numel() != 1 {
            return Err(Error::shape(
                "Tape::backward",
                format!(
                    "output is {:?}; backward of a non-scalar needs a seed gradient (backward_with)",
                    output.shape()
                ),
            ));
        }
        let seed = Tensor::ones(output.shape(), output.dtype(), output.device())?;
        self.backward_with(output, &seed)
    }

    /// Gradients of `output` weighted by `seed` (same shape and dtype as the output).
    pub fn backward_with(&self, output: &Var, seed: &Tensor) -> Result<Gradients> {
        self.backward_inner(output, seed, None)
    }

    /// [`Tape::backward`] that hands each parameter to `on_ready` as soon as its gradient is
    /// final (the walk runs from the output back, so the last layer's parameters come first).
    /// The gradient is added to the parameter before the call (not after every rule has run, as
    /// in `backward`), so data-parallel training can start sending it while the rest of the
    /// backward pass is still being computed. An error from `on_ready` stops the pass.
    pub fn backward_hooked(
        &self,
        output: &Var,
        on_ready: &mut dyn FnMut(&Parameter) -> Result<()>,
    ) -> Result<Gradients> {
        if output.numel() != 1 {
            return Err(Error::shape(
                "Tape::backward_hooked",
                format!("output is {:?}; it must be a scalar", output.shape()),
            ));
        }
        let seed = Tensor::ones(output.shape(), output.dtype(), output.device())?;
        self.backward_inner(output, &seed, Some(on_ready))
    }

    fn backward_inner(
        &self,
        output: &Var,
        seed: &Tensor,
        mut on_ready: Option<&mut ParamHook<'_>>,
    ) -> Result<Gradients> {
        let op = "Tape::backward";
        if seed.shape() != output.shape() || seed.dtype() != output.dtype() {
            return Err(Error::shape(
                op,
                format!(
                    "seed is {} {:?}; the output is {} {:?}",
                    seed.dtype(),
                    seed.shape(),
                    output.dtype(),
                    output.shape()
                ),
            ));
        }
        let root = match &output.node {
            None => {
                return Err(Error::invalid(
                    op,
                    "the output was not recorded on a tape: no parameter or leaf reaches it (forward ran under Tape::no_grad, or every parameter is frozen)",
                ))
            }
            Some(n) => n,
        };
        self.check_owner(op, root)?;
        let _span = netcl_profiling::span_in("backward", "backward");
        let seed = seed.to_device(output.device())?;
        let generation = self.0.generation.get();
        // Take the graph out: the tape is empty (and reusable) whatever happens below.
        let mut nodes = std::mem::take(&mut *self.0.nodes.borrow_mut());
        self.0.params.borrow_mut().clear();
        self.0.generation.set(generation + 1);

        check_versions(&nodes, root.id)?;
        let check_grads = netcl_core_devices::debug::nan_checks()?;
        let mut grads: Vec<Option<Tensor>> = (0..nodes.len()).map(|_| None).collect();
        // Gradients of narrow views, per input, gathered when the input's turn comes.
        let mut parts: Vec<Vec<(Part, Tensor)>> = (0..nodes.len()).map(|_| Vec::new()).collect();
        grads[root.id] = Some(seed);
        let mut leaf_grads = HashMap::new();
        // Parameters' gradients are added only once every rule has run, so an error part-way
        // (out of memory, say) leaves every parameter's gradient as it was.
        let mut param_grads = Vec::new();
        for id in (0..=root.id).rev() {
            let pending = std::mem::take(&mut parts[id]);
            let Some(g) = gather(grads[id].take(), pending, &nodes[id].shape)? else {
                continue;
            };
            let node = &mut nodes[id];
            if let Some(part) = node.part {
                if node.tracked[0] {
                    parts[node.inputs[0]].push((part, g));
                }
                continue;
            }
            if let Some(p) = &node.param {
                match on_ready.as_mut() {
                    Some(hook) => {
                        p.accumulate_grad(&g)?;
                        hook(p)?;
                    }
                    None => param_grads.push((p.clone(), g)),
                }
                continue;
            }
            let Some(backward) = node.backward.take() else {
                leaf_grads.insert(id, g);
                continue;
            };
            let rule = netcl_profiling::span_in("backward", node.op);
            // The gradients so far of the inputs, for a folding rule to add into; what it
            // leaves goes back (a node may take the same input twice: the first slot has it).
            let mut acc: Vec<Option<Tensor>> = node
                .inputs
                .iter()
                .zip(&node.tracked)
                .map(|(&i, &t)| (t && !check_grads).then(|| grads[i].take()).flatten())
                .collect();
            let input_grads = backward(&g, &node.tracked, &mut acc);
            for (&i, a) in node.inputs.iter().zip(acc) {
                if let Some(a) = a {
                    grads[i] = Some(a);
                }
            }
            let input_grads = input_grads?;
            drop(rule);
            if check_grads {
                check_rule_grads(node, &input_grads, &g)?;
            }
            drop(g);
            if input_grads.len() != node.inputs.len() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "backward of {} returned {} gradients for {} inputs",
                        node.op,
                        input_grads.len(),
                        node.inputs.len()
                    ),
                ));
            }
            let (inputs, tracked, opname) = (node.inputs.clone(), node.tracked.clone(), node.op);
            for ((input, grad), tracked) in inputs.into_iter().zip(input_grads).zip(tracked) {
                let (Some(grad), true) = (grad, tracked) else {
                    continue;
                };
                let target = &nodes[input];
                if grad.shape() != target.shape.as_slice() || grad.dtype() != target.dtype {
                    return Err(Error::shape(
                        op,
                        format!(
                            "backward of {opname} gave a {} {:?} gradient for a {} {:?} input",
                            grad.dtype(),
                            grad.shape(),
                            target.dtype,
                            target.shape
                        ),
                    ));
                }
                grads[input] = Some(match grads[input].take() {
                    None => grad,
                    Some(acc) => acc.add(&grad)?,
                });
            }
        }
        let totals = param_grads
            .iter()
            .map(|(p, g)| p.accumulated(g))
            .collect::<Result<Vec<_>>>()?;
        for ((p, g), total) in param_grads.iter().zip(totals) {
            match total {
                Some(t) => p.put_grad(t),
                // A gradient buffer view: added in place, the one step that can still fail
                // (a kernel error) after other parameters were updated.
                None => p.add_into_view(g)?,
            }
        }
        Ok(Gradients {
            generation,
            tape: self.clone(),
            grads: leaf_grads,
        })
    }

    fn check_owner(&self, op: &str, n: &NodeRef) -> Result<()> {
        if !Rc::ptr_eq(&n.tape.0, &self.0) {
            return Err(Error::invalid(
                op,
                "the Var was recorded on a different tape",
            ));
        }
        if n.generation != self.0.generation.get() {
            return Err(Error::invalid(
                op,
                "the Var belongs to a graph that an earlier backward already consumed; run the forward pass again",
            ));
        }
        Ok(())
    }
}

/// Error if a value that a rule on the path from `root` may read was written in place after it
/// was recorded (PyTorch's version-counter check): its gradient would silently be wrong.
fn check_versions(nodes: &[Node], root: usize) -> Result<()> {
    let mut reached = vec![false; root + 1];
    reached[root] = true;
    for id in (0..=root).rev() {
        if !reached[id] {
            continue;
        }
        let node = &nodes[id];
        for (&input, &tracked) in node.inputs.iter().zip(&node.tracked) {
            if tracked {
                reached[input] = true;
            }
        }
        for w in &node.watched {
            let Some((then, now)) = w.version.changed() else {
                continue;
            };
            let what = match w.index {
                Some(i) => format!("input {i}"),
                None => "the output".to_string(),
            };
            return Err(Error::invalid(
                "Tape::backward",
                format!(
                    "{what} of {} ({} {:?}) was modified in place after the forward pass \
                     recorded it (version {then}, now {now}), e.g. by an optimizer step or \
                     Parameter::assign between forward and backward; its gradient would be wrong. \
                     Run the forward pass again (no gradient was changed)",
                    node.op, w.dtype, w.shape
                ),
            ));
        }
    }
    Ok(())
}

/// Anomaly detection: the gradients a node's rule returned, checked for NaN/Inf.
#[cold]
fn check_rule_grads(node: &Node, grads: &[Option<Tensor>], output_grad: &Tensor) -> Result<()> {
    let inputs = node
        .watched
        .iter()
        .filter_map(|w| {
            w.index
                .map(|i| format!("input {i} {} {:?}", w.dtype, w.shape))
        })
        .collect::<Vec<_>>()
        .join(", ");
    for (i, grad) in grads.iter().enumerate() {
        if let Some(grad) = grad.as_ref().filter(|_| node.tracked.get(i) == Some(&true)) {
            anomaly::check_backward(node.op, i, grad, output_grad, &inputs, node.site.as_ref())?;
        }
    }
    Ok(())
}

/// Record `value = op(inputs)` with its backward rule. When no input is tracked the result is a
/// constant and the rule (with whatever it saved) is dropped at once.
#[track_caller]
pub(crate) fn record(
    op: &'static str,
    inputs: &[&Var],
    value: Tensor,
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + 'static,
) -> Result<Var> {
    let rule = move |g: &Tensor, need: &[bool], _: &mut [Option<Tensor>]| backward(g, need);
    record_node(op, inputs, value, Box::new(rule), None)
}

/// Like [`record`], for a rule that may fold the gradient accumulated so far for an input into
/// its own: it gets those gradients (one slot per input, `None` where there is none yet) and,
/// where it takes one out of its slot, returns that input's total; what it leaves is added as
/// usual. Anomaly checks offer it none, so each rule's own gradient is what they check.
#[track_caller]
pub(crate) fn record_folding(
    op: &'static str,
    inputs: &[&Var],
    value: Tensor,
    backward: impl FnOnce(&Tensor, &[bool], &mut [Option<Tensor>]) -> Result<Vec<Option<Tensor>>>
        + 'static,
) -> Result<Var> {
    record_node(op, inputs, value, Box::new(backward), None)
}

/// Records `value`, the narrow view `part` of `input`: its gradient is gathered into the input's
/// with those of the input's other views (parts.rs), not scattered into zeros of its own.
#[track_caller]
pub(crate) fn record_part(op: &'static str, input: &Var, value: Tensor, part: Part) -> Result<Var> {
    let unused =
        |_: &Tensor, _: &[bool], _: &mut [Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            Err(Error::invalid(
                "Tape::backward",
                "a view's gradient is gathered by the tape",
            ))
        };
    record_node(op, &[input], value, Box::new(unused), Some(part))
}

#[track_caller]
fn record_node(
    op: &'static str,
    inputs: &[&Var],
    value: Tensor,
    backward: BackwardFn,
    part: Option<Part>,
) -> Result<Var> {
    let checked = netcl_core_devices::debug::nan_checks()?;
    if checked {
        let values: Vec<&Tensor> = inputs.iter().map(|v| &v.value).collect();
        anomaly::check_forward(op, &values, &value)?;
    }
    let mut tape: Option<&Tape> = None;
    for v in inputs {
        if let Some(n) = &v.node {
            match tape {
                None => tape = Some(&n.tape),
                Some(t) if !Rc::ptr_eq(&t.0, &n.tape.0) => {
                    return Err(Error::invalid(
                        op,
                        "inputs were recorded on different tapes",
                    ))
                }
                Some(_) => {}
            }
        }
    }
    let Some(tape) = tape else {
        return Ok(Var::constant(value));
    };
    let mut ids = Vec::with_capacity(inputs.len());
    let mut tracked = Vec::with_capacity(inputs.len());
    for v in inputs {
        match &v.node {
            Some(n) => {
                tape.check_owner(op, n)?;
                ids.push(n.id);
                tracked.push(true);
            }
            None => {
                ids.push(0);
                tracked.push(false);
            }
        }
    }
    let watched = inputs
        .iter()
        .enumerate()
        .map(|(i, v)| Watched::of(Some(i), &v.value))
        .chain(std::iter::once(Watched::of(None, &value)))
        .collect();
    let node = Node {
        op,
        inputs: ids,
        tracked,
        backward: Some(backward),
        param: None,
        shape: value.shape().to_vec(),
        dtype: value.dtype(),
        watched,
        site: if checked { Some(Site::here()) } else { None },
        part,
    };
    let r = tape.clone().push(node);
    Ok(Var {
        value,
        node: Some(r),
    })
}

/// Whether any of `inputs` is tracked (so a rule needs to save anything at all).
pub(crate) fn any_tracked(inputs: &[&Var]) -> bool {
    inputs.iter().any(|v| v.is_tracked())
}
