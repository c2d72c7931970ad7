//! Host evaluation of fused elementwise plans: blocks of row-major positions on all cores, each node's values in one reused typed buffer (f32 arithmetic for f32/f16/bf16, f64 for f64 and exact integers).
use crate::base::layout::{contiguous_strides, numel};
use crate::base::tensor::{Storage, Tensor};
use crate::fused::expr::{BinaryOp, Class};
use crate::fused::plan::{cast_host, Kind, Plan};
use crate::HostData;
use half::{bf16, f16};
use netcl_core_devices::{Error, Result};
use rayon::prelude::*;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Elements per node buffer: a plan's buffers stay in the core's cache.
const BLOCK: usize = 1024;
/// Elements per parallel task; a smaller evaluation runs on the calling thread.
const TASK: usize = 16 * BLOCK;

/// One node's values over a block: f32 for the f32 arithmetic (f32, f16, bf16 nodes), else f64
/// (f64, and i32/u32 values, which are exact integers in f64).
enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Buf {
    fn new(c: Class, fill: f64) -> Buf {
        match c {
            Class::F32 => Buf::F32(vec![fill as f32; BLOCK]),
            _ => Buf::F64(vec![c.round(fill); BLOCK]),
        }
    }

    fn get(&self, j: usize) -> f64 {
        match self {
            Buf::F32(v) => v[j] as f64,
            Buf::F64(v) => v[j],
        }
    }

    /// Stores `x`, already a value of the buffer's arithmetic.
    fn set(&mut self, j: usize, x: f64) {
        match self {
            Buf::F32(v) => v[j] = x as f32,
            Buf::F64(v) => v[j] = x,
        }
    }
}

/// A host storage's elements, shared by the tasks of one evaluation. Tasks write disjoint
/// positions (a destination never overlaps itself) and an input aliasing a destination is read
/// only at the positions its own task writes, so no element is touched by two tasks.
#[derive(Clone, Copy)]
enum Ptr {
    F32(*mut f32),
    F64(*mut f64),
    F16(*mut f16),
    BF16(*mut bf16),
    I32(*mut i32),
    U32(*mut u32),
}

/// Where a block's elements lie in a storage: a run of `len` from `first` (a dense walk), one
/// position for all `len` (a broadcast value), or one position each.
#[derive(Clone, Copy)]
enum At<'a> {
    Run { first: usize, len: usize },
    Same { at: usize, len: usize },
    List(&'a [usize]),
}

// SAFETY: see `Ptr`: the storages outlive the evaluation (their locks are held) and tasks touch
// disjoint elements.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

impl Ptr {
    /// Elements that are only read through the pointer.
    fn of(data: &HostData) -> Ptr {
        match data {
            HostData::F32(v) => Ptr::F32(v.as_ptr() as *mut f32),
            HostData::F64(v) => Ptr::F64(v.as_ptr() as *mut f64),
            HostData::F16(v) => Ptr::F16(v.as_ptr() as *mut f16),
            HostData::BF16(v) => Ptr::BF16(v.as_ptr() as *mut bf16),
            HostData::I32(v) => Ptr::I32(v.as_ptr() as *mut i32),
            HostData::U32(v) => Ptr::U32(v.as_ptr() as *mut u32),
        }
    }

    /// Reads the elements at `at` into `buf`.
    ///
    /// # Safety
    /// Every position lies inside the storage.
    unsafe fn read(self, at: At<'_>, buf: &mut Buf) {
        macro_rules! each {
            ($v:ident, $p:ident, $conv:expr) => {
                match at {
                    At::Run { first, len } => {
                        let src = std::slice::from_raw_parts($p.add(first), len);
                        for (o, &$p) in $v[..len].iter_mut().zip(src) {
                            *o = $conv;
                        }
                    }
                    At::Same { at, len } => {
                        let $p = *$p.add(at);
                        $v[..len].fill($conv);
                    }
                    At::List(pos) => {
                        for (o, &q) in $v.iter_mut().zip(pos) {
                            let $p = *$p.add(q);
                            *o = $conv;
                        }
                    }
                }
            };
        }
        match (self, buf) {
            (Ptr::F32(p), Buf::F32(v)) => each!(v, p, p),
            (Ptr::F16(p), Buf::F32(v)) => each!(v, p, p.to_f32()),
            (Ptr::BF16(p), Buf::F32(v)) => each!(v, p, p.to_f32()),
            (Ptr::F64(p), Buf::F64(v)) => each!(v, p, p),
            (Ptr::I32(p), Buf::F64(v)) => each!(v, p, p as f64),
            (Ptr::U32(p), Buf::F64(v)) => each!(v, p, p as f64),
            // An input node has its tensor's dtype, so its buffer has its arithmetic.
            (p, b) => unreachable!(
                "input buffer of another arithmetic: {:?}",
                (p.tag(), b.tag())
            ),
        }
    }

    /// Writes `buf` to the elements at `at`, rounding to the storage's dtype.
    ///
    /// # Safety
    /// Every position lies inside the storage, which is written by this task only there.
    unsafe fn write(self, at: At<'_>, buf: &Buf) {
        macro_rules! each {
            ($v:ident, $p:ident, $conv:expr) => {
                match at {
                    At::Run { first, len } => {
                        let dst = std::slice::from_raw_parts_mut($p.add(first), len);
                        for (d, &x) in dst.iter_mut().zip(&$v[..len]) {
                            *d = $conv(x);
                        }
                    }
                    // Positions in order: the last value stays (a destination never overlaps
                    // itself, so this is a block of one).
                    At::Same { at, len } => *$p.add(at) = $conv($v[len - 1]),
                    At::List(pos) => {
                        for (&x, &q) in $v.iter().zip(pos) {
                            *$p.add(q) = $conv(x);
                        }
                    }
                }
            };
        }
        match (self, buf) {
            (Ptr::F32(p), Buf::F32(v)) => each!(v, p, |x| x),
            (Ptr::F16(p), Buf::F32(v)) => each!(v, p, f16::from_f32),
            (Ptr::BF16(p), Buf::F32(v)) => each!(v, p, bf16::from_f32),
            (Ptr::F64(p), Buf::F64(v)) => each!(v, p, |x| x),
            (Ptr::I32(p), Buf::F64(v)) => each!(v, p, |x: f64| x as i64 as i32),
            (Ptr::U32(p), Buf::F64(v)) => each!(v, p, |x: f64| x as i64 as u32),
            (p, b) => unreachable!(
                "output buffer of another arithmetic: {:?}",
                (p.tag(), b.tag())
            ),
        }
    }

    /// Elements written through the pointer (and read where an input aliases them).
    fn of_mut(data: &mut HostData) -> Ptr {
        match data {
            HostData::F32(v) => Ptr::F32(v.as_mut_ptr()),
            HostData::F64(v) => Ptr::F64(v.as_mut_ptr()),
            HostData::F16(v) => Ptr::F16(v.as_mut_ptr()),
            HostData::BF16(v) => Ptr::BF16(v.as_mut_ptr()),
            HostData::I32(v) => Ptr::I32(v.as_mut_ptr()),
            HostData::U32(v) => Ptr::U32(v.as_mut_ptr()),
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Ptr::F32(_) => "f32",
            Ptr::F64(_) => "f64",
            Ptr::F16(_) => "f16",
            Ptr::BF16(_) => "bf16",
            Ptr::I32(_) => "i32",
            Ptr::U32(_) => "u32",
        }
    }
}

impl Buf {
    fn tag(&self) -> &'static str {
        match self {
            Buf::F32(_) => "f32 buffer",
            Buf::F64(_) => "f64 buffer",
        }
    }
}

/// The storage positions of one operand over row-major indices of `shape`, a block at a time.
struct Walk<'a> {
    shape: &'a [usize],
    strides: &'a [usize],
    /// Row-major contiguous over the shape: position = base + index.
    dense: bool,
    /// One element for every index (a broadcast value).
    constant: bool,
    idx: Vec<usize>,
    pos: usize,
}

impl<'a> Walk<'a> {
    /// The walk starting at row-major index `start`.
    fn new(shape: &'a [usize], strides: &'a [usize], offset: usize, start: usize) -> Walk<'a> {
        let dense = contiguous_strides(shape)
            .iter()
            .zip(strides)
            .zip(shape)
            .all(|((c, s), &n)| n == 1 || c == s);
        let constant = strides.iter().zip(shape).all(|(&s, &n)| n == 1 || s == 0);
        let mut idx = vec![0; shape.len()];
        let (mut rest, mut pos) = (start, offset);
        for d in (0..shape.len()).rev() {
            idx[d] = rest % shape[d];
            rest /= shape[d];
            pos += idx[d] * strides[d];
        }
        if dense {
            pos = offset + start;
        }
        Walk {
            shape,
            strides,
            dense,
            constant: constant && !dense,
            idx,
            pos,
        }
    }

    /// The next `pos.len()` positions: a run for a dense walk, else filled into `pos`.
    fn next<'p>(&mut self, pos: &'p mut [usize]) -> At<'p> {
        let len = pos.len();
        if self.dense {
            self.pos += len;
            return At::Run {
                first: self.pos - len,
                len,
            };
        }
        if self.constant {
            return At::Same { at: self.pos, len };
        }
        self.fill(pos);
        At::List(pos)
    }

    /// The next `out.len()` positions of a strided walk.
    fn fill(&mut self, out: &mut [usize]) {
        let last = self.shape.len() - 1;
        let (n, s) = (self.shape[last], self.strides[last]);
        let mut k = 0;
        while k < out.len() {
            // A run along the last dim, then the carry into the outer ones.
            let take = (n - self.idx[last]).min(out.len() - k);
            for (j, o) in out[k..k + take].iter_mut().enumerate() {
                *o = self.pos + j * s;
            }
            k += take;
            self.idx[last] += take;
            self.pos += take * s;
            if self.idx[last] < n {
                continue;
            }
            for d in (0..=last).rev() {
                if d < last {
                    self.idx[d] += 1;
                    self.pos += self.strides[d];
                }
                if self.idx[d] < self.shape[d] {
                    break;
                }
                self.pos -= self.strides[d] * self.shape[d];
                self.idx[d] = 0;
            }
        }
    }
}

/// `o = x (op) y` in f32 for the ops whose f32 result is the f64 result rounded to f32 (the
/// f64 reference's double rounding is exact for +, -, *, /), else None.
#[inline(always)]
fn binary_f32(b: BinaryOp, x: &[f32], y: &[f32], o: &mut [f32]) -> Option<()> {
    macro_rules! each {
        ($f:expr) => {
            for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                *o = $f(x, y);
            }
        };
    }
    let b01 = |v: bool| if v { 1.0 } else { 0.0 };
    match b {
        BinaryOp::Add => each!(|x, y| x + y),
        BinaryOp::Sub => each!(|x, y| x - y),
        BinaryOp::Mul => each!(|x, y| x * y),
        BinaryOp::Div => each!(|x, y| x / y),
        BinaryOp::Maximum => each!(|x: f32, y| if x > y || x.is_nan() { x } else { y }),
        BinaryOp::Minimum => each!(|x: f32, y| if x < y || x.is_nan() { x } else { y }),
        BinaryOp::Eq => each!(|x, y| b01(x == y)),
        BinaryOp::Ne => each!(|x, y| b01(x != y)),
        BinaryOp::Lt => each!(|x, y| b01(x < y)),
        BinaryOp::Le => each!(|x, y| b01(x <= y)),
        BinaryOp::Gt => each!(|x, y| b01(x > y)),
        BinaryOp::Ge => each!(|x, y| b01(x >= y)),
        BinaryOp::Pow => return None,
    }
    Some(())
}

/// Evaluates every node of `plan` over the first `len` elements of the buffers (inputs and
/// scalars already in place), each in its node's arithmetic: compiled for AVX-512 and for AVX2 as
/// well, the widest this CPU has chosen at run time (the same IEEE operations without fused
/// multiply-adds: the same values).
fn eval_block(plan: &Plan, bufs: &mut [Buf], len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { eval_block_avx512(plan, bufs, len) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { eval_block_avx2(plan, bufs, len) };
        }
    }
    eval_block_any(plan, bufs, len)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn eval_block_avx512(plan: &Plan, bufs: &mut [Buf], len: usize) {
    eval_block_any(plan, bufs, len)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn eval_block_avx2(plan: &Plan, bufs: &mut [Buf], len: usize) {
    eval_block_any(plan, bufs, len)
}

#[inline(always)]
fn eval_block_any(plan: &Plan, bufs: &mut [Buf], len: usize) {
    for (i, (kind, d)) in plan.key.nodes.iter().enumerate() {
        let c = Class::of(*d);
        let (prev, rest) = bufs.split_at_mut(i);
        let out = &mut rest[0];
        match *kind {
            Kind::Input(_) | Kind::Scalar(_) => {}
            Kind::Unary(u, a) => {
                let fast = match (&prev[a], &mut *out) {
                    (Buf::F32(x), Buf::F32(o)) => {
                        u.host_f32(&x[..len], &mut o[..len]);
                        true
                    }
                    _ => false,
                };
                if !fast {
                    let x = &prev[a];
                    (0..len).for_each(|j| out.set(j, c.round(u.host(x.get(j)))));
                }
            }
            Kind::Binary(b, x, y) => {
                let fast = match (&prev[x], &prev[y], &mut *out) {
                    (Buf::F32(x), Buf::F32(y), Buf::F32(o)) => {
                        binary_f32(b, &x[..len], &y[..len], &mut o[..len])
                    }
                    _ => None,
                };
                if fast.is_none() {
                    let (x, y) = (&prev[x], &prev[y]);
                    (0..len).for_each(|j| out.set(j, c.round(b.host(c, x.get(j), y.get(j)))));
                }
            }
            Kind::Where(w, x, y) => {
                let fast = match (&prev[w], &prev[x], &prev[y], &mut *out) {
                    (Buf::F32(w), Buf::F32(x), Buf::F32(y), Buf::F32(o)) => {
                        let wxy = w[..len].iter().zip(&x[..len]).zip(&y[..len]);
                        for (o, ((&w, &x), &y)) in o[..len].iter_mut().zip(wxy) {
                            *o = if w != 0.0 { x } else { y };
                        }
                        true
                    }
                    _ => false,
                };
                if !fast {
                    let (w, x, y) = (&prev[w], &prev[x], &prev[y]);
                    (0..len).for_each(|j| {
                        out.set(j, if w.get(j) != 0.0 { x.get(j) } else { y.get(j) })
                    });
                }
            }
            Kind::Cast(a) => {
                let from = Class::of(plan.key.nodes[a].1);
                let x = &prev[a];
                (0..len).for_each(|j| out.set(j, cast_host(from, *d, x.get(j))));
            }
        }
    }
}

/// Host evaluation of `plan` over `inputs` (seen through `bstrides` as `shape`) into `outs`:
/// tasks of row-major positions in parallel, each a block at a time (read every input's block,
/// evaluate every node, write every output's block). Inputs alias destinations only element for
/// element, so a block's reads come before any write that could touch them.
pub(crate) fn run_host(
    op: &str,
    plan: &Plan,
    inputs: &[&Tensor],
    bstrides: &[Vec<usize>],
    shape: &[usize],
    outs: &[Tensor],
) -> Result<()> {
    fn lock<'t>(op: &str, t: &'t Tensor) -> Result<&'t RwLock<HostData>> {
        match &t.storage.data {
            Storage::Host(l) => Ok(l),
            Storage::Device(_) => Err(Error::device(
                op,
                "host evaluation of a tensor without host storage",
            )),
        }
    }
    // Each storage locked once: destinations for writing (disjoint views of one buffer share
    // its lock), other inputs for reading.
    let mut writes: Vec<RwLockWriteGuard<'_, HostData>> = Vec::new();
    let mut out_ptrs: Vec<Ptr> = Vec::with_capacity(outs.len());
    for (k, t) in outs.iter().enumerate() {
        let p = match (0..k).find(|&j| outs[j].shares_storage(t)) {
            Some(j) => out_ptrs[j],
            None => {
                // The pointer is into the locked data, which stays put when the guard moves.
                let mut guard = lock(op, t)?.write().unwrap_or_else(|p| p.into_inner());
                let p = Ptr::of_mut(&mut guard);
                writes.push(guard);
                p
            }
        };
        out_ptrs.push(p);
    }
    let mut reads: Vec<RwLockReadGuard<'_, HostData>> = Vec::new();
    let mut in_ptrs: Vec<Ptr> = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        let shared = outs
            .iter()
            .position(|o| o.shares_storage(t))
            .map(|k| out_ptrs[k])
            .or_else(|| {
                (0..i)
                    .find(|&j| inputs[j].shares_storage(t))
                    .map(|j| in_ptrs[j])
            });
        let p = match shared {
            Some(p) => p,
            None => {
                reads.push(lock(op, t)?.read().unwrap_or_else(|p| p.into_inner()));
                Ptr::of(reads.last().expect("just pushed"))
            }
        };
        in_ptrs.push(p);
    }
    let n = numel(shape);
    let task = |t: usize| {
        let (start, end) = (t * TASK, ((t + 1) * TASK).min(n));
        let nodes = &plan.key.nodes;
        let mut bufs: Vec<Buf> = nodes
            .iter()
            .map(|(k, d)| match k {
                Kind::Scalar(s) => Buf::new(Class::of(*d), plan.scalars[*s].0),
                _ => Buf::new(Class::of(*d), 0.0),
            })
            .collect();
        let input_node: Vec<(usize, usize)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(id, (k, _))| match k {
                Kind::Input(i) => Some((*i, id)),
                _ => None,
            })
            .collect();
        let mut in_walks: Vec<Walk> = input_node
            .iter()
            .map(|&(i, _)| Walk::new(shape, &bstrides[i], inputs[i].offset, start))
            .collect();
        let mut out_walks: Vec<Walk> = outs
            .iter()
            .map(|t| Walk::new(&t.shape, &t.strides, t.offset, start))
            .collect();
        let mut pos = vec![0usize; BLOCK];
        let mut at = start;
        while at < end {
            let len = BLOCK.min(end - at);
            let pos = &mut pos[..len];
            for (&(i, id), w) in input_node.iter().zip(&mut in_walks) {
                if w.constant && at > start {
                    // Still in its buffer: no later block is longer than the first.
                    continue;
                }
                // SAFETY: positions of a checked view of the input's storage.
                unsafe { in_ptrs[i].read(w.next(pos), &mut bufs[id]) };
            }
            eval_block(plan, &mut bufs, len);
            for ((&o, w), p) in plan.key.outputs.iter().zip(&mut out_walks).zip(&out_ptrs) {
                // SAFETY: this task's positions of a destination that does not overlap itself.
                unsafe { p.write(w.next(pos), &bufs[o]) };
            }
            at += len;
        }
    };
    let tasks = n.div_ceil(TASK);
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    drop(reads);
    drop(writes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{At, Walk};

    /// Storage positions of row-major indices `start..start + n` of `shape` at `strides`,
    /// one index at a time.
    fn naive(
        shape: &[usize],
        strides: &[usize],
        offset: usize,
        start: usize,
        n: usize,
    ) -> Vec<usize> {
        (start..start + n)
            .map(|mut i| {
                let mut pos = offset;
                for d in (0..shape.len()).rev() {
                    pos += (i % shape[d]) * strides[d];
                    i /= shape[d];
                }
                pos
            })
            .collect()
    }

    #[test]
    fn walks_give_every_view_position_in_blocks_of_any_size() {
        // Broadcast (stride 0), transposed, sliced and dense views; blocks that end inside rows.
        let views: [(&[usize], &[usize], usize); 6] = [
            (&[3, 5, 4], &[0, 1, 5], 2),
            (&[2, 1, 3], &[0, 7, 0], 4),
            (&[4, 7], &[1, 4], 0),
            (&[2, 3, 5], &[40, 10, 2], 3),
            (&[6, 1, 5], &[5, 9, 1], 1),
            (&[5], &[0], 7),
        ];
        for (shape, strides, offset) in views {
            let total: usize = shape.iter().product();
            for start in [0, 1, total / 2] {
                for block in [1, 3, 7, total] {
                    let mut w = Walk::new(shape, strides, offset, start);
                    let mut got = Vec::new();
                    let mut at = start;
                    while at < total {
                        let len = block.min(total - at);
                        let mut pos = vec![0; len];
                        match w.next(&mut pos) {
                            At::Run { first, len } => got.extend(first..first + len),
                            At::Same { at, len } => got.extend(std::iter::repeat_n(at, len)),
                            At::List(p) => got.extend_from_slice(p),
                        }
                        at += len;
                    }
                    let want = naive(shape, strides, offset, start, total - start);
                    assert_eq!(
                        got, want,
                        "{shape:?} at {strides:?} from {start} in blocks of {block}"
                    );
                }
            }
        }
    }
}
