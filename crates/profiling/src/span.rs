//! Host spans (`span("matmul")` guards, nested per thread) and the per-thread work declaration the next kernel launch takes.
use crate::clock::{now_ns, thread_id};
use crate::collect::collector;
use crate::profile::{SpanRecord, Work};
use crate::state::enabled;
use std::cell::{Cell, RefCell};

thread_local! {
    /// Names of the spans open on this thread, innermost last.
    static OPEN: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
    static DECLARED: Cell<Option<Work>> = const { Cell::new(None) };
}

/// A host time range, recorded when dropped (if the profiler is still on). Inert and free
/// (one relaxed atomic load) when the profiler is off.
#[must_use = "a span covers the time until it is dropped"]
pub struct Span {
    open: Option<Open>,
}

struct Open {
    name: &'static str,
    category: &'static str,
    depth: u32,
    start_ns: u64,
}

/// A span named `name` in category `op`: `let _s = netcl_profiling::span("matmul");`.
#[inline]
pub fn span(name: &'static str) -> Span {
    span_in("op", name)
}

/// A span with a category (`op`, `backward`, `step`, ...), shown in the trace.
#[inline]
pub fn span_in(category: &'static str, name: &'static str) -> Span {
    if !enabled() {
        return Span { open: None };
    }
    open(category, name)
}

#[cold]
fn open(category: &'static str, name: &'static str) -> Span {
    let depth = OPEN
        .try_with(|o| {
            let mut o = o.borrow_mut();
            o.push(name);
            o.len() as u32 - 1
        })
        .unwrap_or(0);
    Span {
        open: Some(Open {
            name,
            category,
            depth,
            start_ns: now_ns(),
        }),
    }
}

impl Span {
    /// Whether this span is being recorded.
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(o) = self.open.take() else { return };
        let end_ns = now_ns();
        let _ = OPEN.try_with(|s| {
            let mut s = s.borrow_mut();
            s.truncate(o.depth as usize);
        });
        if enabled() {
            crate::exit::arm();
            let record = SpanRecord {
                name: o.name,
                category: o.category,
                thread: thread_id(),
                depth: o.depth,
                start_ns: o.start_ns,
                end_ns,
            };
            collector().push_span(record);
        }
    }
}

/// The innermost span open on this thread.
pub(crate) fn current_op() -> Option<&'static str> {
    OPEN.try_with(|o| o.borrow().last().copied()).ok().flatten()
}

/// Declare the work of the next kernel launched on this thread (for code that cannot reach the
/// `Kernel`; a launch's own `Kernel::declare` takes precedence). Nothing is stored when the
/// profiler is off.
#[inline]
pub fn declare(bytes: u64, flops: u64) {
    if enabled() {
        let _ = DECLARED.try_with(|d| d.set(Some(Work { bytes, flops })));
    }
}

/// Take this thread's pending declaration.
pub(crate) fn take_declared() -> Option<Work> {
    DECLARED.try_with(|d| d.take()).ok().flatten()
}
