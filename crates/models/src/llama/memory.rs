//! Llama::memory_estimate: the pool peak of one training step (forward, loss, backward, AdamW update), predicted by walking the step's allocations in order.
use super::block::{plain, Block};
use super::model::Llama;
use netcl_autograd::{loss_chunk_rows, Parameter};
use netcl_core_memory::{size_class, Pool};
use netcl_nn::{Linear, Module};
use netcl_ops::{has_tensor_cores, DType, TensorCoreKind};

// Note: the steps mirror the code of the block (block.rs), the loss (Llama::loss,
// autograd's linear_cross_entropy) and the tape; a change there that keeps other tensors
// for backward belongs here too (models/tests/scale.rs compares against the pool's counters).

/// Bytes held and the most held at once, each tensor counted as the device's pool rounds it.
struct Ledger {
    now: usize,
    peak: usize,
    /// The pool's sub-buffer alignment (None on the host, which counts exact bytes).
    align: Option<usize>,
}

impl Ledger {
    fn size(&self, bytes: usize) -> usize {
        match self.align {
            Some(a) if bytes > 0 => size_class(bytes, a),
            _ => bytes,
        }
    }
    fn alloc(&mut self, tensors: &[usize]) {
        for &b in tensors {
            self.now += self.size(b);
        }
        self.peak = self.peak.max(self.now);
    }
    fn free(&mut self, tensors: &[usize]) {
        for &b in tensors {
            self.now = self.now.saturating_sub(self.size(b));
        }
    }
    /// Tensors that live for a moment on top of what is held.
    fn spike(&mut self, tensors: &[usize]) {
        self.moment(tensors, &[]);
    }
    /// A moment where `plus` lives on top of what is held, less `minus` (already freed).
    fn moment(&mut self, plus: &[usize], minus: &[usize]) {
        let sum = |t: &[usize]| t.iter().map(|&b| self.size(b)).sum::<usize>();
        let at = (self.now + sum(plus)).saturating_sub(sum(minus));
        self.peak = self.peak.max(at);
    }
}

/// The shape of one step: rows `n = b t`, widths, and bytes per element of the residual stream
/// (`res`), of the products and the activations after them (`act`) and of the accumulator.
struct Shape {
    n: usize,
    b: usize,
    t: usize,
    d: usize,
    kv: usize,
    hid: usize,
    heads: usize,
    res: usize,
    act: usize,
    acc: usize,
    /// The autocast dtype products compute in, where it applies to f32 weights.
    cast: Option<DType>,
    /// 16-bit products whose f32 output (an f32 weight's gradient) goes through a 16-bit
    /// intermediate (devices without tensor-core GEMMs round, then widen).
    widen: bool,
}

impl Shape {
    /// A weight's copy in the product dtype that a product keeps for backward (autocast of an
    /// f32 weight), in bytes.
    fn copy(&self, p: &Parameter) -> usize {
        match self.cast {
            Some(dt) if p.dtype() != dt => p.numel() * dt.size(),
            _ => 0,
        }
    }
    /// The gradient `p` keeps (none when frozen).
    fn kept(&self, p: &Parameter) -> Vec<usize> {
        match p.requires_grad() {
            true => vec![p.numel() * p.dtype().size()],
            false => Vec::new(),
        }
    }
    /// The gradient of `p` and, where products widen, its 16-bit intermediate.
    fn grad(&self, p: &Parameter) -> Vec<usize> {
        if !p.requires_grad() {
            return Vec::new();
        }
        let mut v = vec![p.numel() * p.dtype().size()];
        if self.widen && self.cast.is_some_and(|dt| dt != p.dtype()) {
            v.push(p.numel() * 2);
        }
        v
    }
}

/// Whether a parameter trains.
fn trains(p: &Parameter) -> bool {
    p.requires_grad()
}

/// Whether a projection has a trainable part (its weight, bias or an adapter).
fn learns(lin: &Linear) -> bool {
    lin.named_parameters().iter().any(|(_, p)| trains(p))
}

/// What one block keeps from forward to backward (besides its input and output), and
/// what its backward holds for a moment at most, in tensor sizes (bytes).
struct BlockMemory {
    saved: Vec<usize>,
    /// The feed-forward backward's largest moment: tensors that live, and kept ones freed.
    plus: Vec<usize>,
    minus: Vec<usize>,
    /// Whether the block's output depends on a trainable parameter (or its input did).
    tracked: bool,
}

/// The block's memory with an input that is (`tracked`) or is not on the tape.
fn block_memory(blk: &Block, s: &Shape, tracked: bool) -> BlockMemory {
    let (n, d, kv, hid, a, r) = (s.n, s.d, s.kv, s.hid, s.act, s.res);
    let (at, ff) = (&blk.attention, &blk.feed_forward);
    let mut saved = Vec::new();
    // A product keeps its (16-bit) weight when its rule is recorded (its input or weight is
    // on the tape), its input when the weight trains, and an adapter its own input (or the
    // dropped input and the mask) and the rank-wide product.
    let product = |lin: &Linear, input_tracked: bool, input: usize, saved: &mut Vec<usize>| {
        if input_tracked || trains(&lin.weight) {
            saved.push(s.copy(&lin.weight));
        }
        if let Some(l) = &lin.lora {
            let rank = l.a.shape()[0];
            let la = if s.cast.is_some() {
                a
            } else {
                l.a.dtype().size()
            };
            saved.extend([n * rank * la, s.copy(&l.a), s.copy(&l.b)]);
            if l.dropout() > 0.0 {
                saved.extend([input, input]);
            }
        }
    };
    let keeps_input =
        |lin: &Linear| trains(&lin.weight) || lin.lora.as_ref().is_some_and(|l| l.dropout() == 0.0);
    let t_a = tracked || trains(blk.attention_norm.weight());
    if t_a {
        saved.push(n * s.acc); // the norm's statistics
    }
    let qkv = [&at.wq, &at.wk, &at.wv];
    if qkv.iter().any(|l| keeps_input(l)) {
        saved.push(n * d * a); // the norm's output, the projections' input
    }
    for lin in qkv {
        product(lin, t_a, n * d * a, &mut saved);
    }
    let t_o = t_a || qkv.iter().any(|l| learns(l));
    if t_o {
        // Queries and keys after RoPE, values, the output and its logsumexp (its output is
        // also wo's input, a view of it).
        saved.extend([
            n * d * a,
            n * kv * a,
            n * kv * a,
            n * d * a,
            s.b * s.heads * s.t * 4,
        ]);
    }
    product(&at.wo, t_o, n * d * a, &mut saved);
    let t_h = tracked || t_o || learns(&at.wo);
    let t_f = t_h || trains(blk.ffn_norm.weight());
    if t_f {
        saved.extend([n * d * r, n * s.acc]); // h, the norm's input, and its statistics
    }
    // A GELU MLP (no up projection) is counted as SwiGLU's gate twice: an estimate above its
    // own (the walk mirrors the SwiGLU block).
    let w3 = ff.w3.as_ref().unwrap_or(&ff.w1);
    let f_kept = keeps_input(&ff.w1) || keeps_input(w3);
    if f_kept {
        saved.push(n * d * a); // the norm's output
    }
    product(&ff.w1, t_f, n * d * a, &mut saved);
    product(w3, t_f, n * d * a, &mut saved);
    let t_g = t_f || learns(&ff.w1) || learns(w3);
    let (g, sw) = (n * 2 * hid * a, n * hid * a);
    if t_g {
        saved.push(g); // gate and up products, SwiGLU's input
    }
    let s_kept = keeps_input(&ff.w2);
    if s_kept {
        saved.push(sw); // SwiGLU's output
    }
    product(&ff.w2, t_g, sw, &mut saved);
    saved.retain(|&b| b > 0);
    // Backward of the feed-forward part: w2's product (the output gradient in the products'
    // dtype, dSwiGLU, dW2), SwiGLU's (its gradient as s is freed), and gate/up's.
    let du = if a != r { n * d * a } else { 0 };
    let dw2 = s.grad(&ff.w2.weight);
    let moments = [
        ([&[du, sw][..], &dw2].concat(), vec![]),
        (
            [&[sw, g][..], &dw2].concat(),
            vec![sw * usize::from(s_kept)],
        ),
        (
            [
                &[g, n * d * a][..],
                &dw2,
                &s.grad(&ff.w1.weight),
                &s.grad(&w3.weight),
            ]
            .concat(),
            vec![sw * usize::from(s_kept), g * usize::from(t_g)],
        ),
    ];
    let sum = |v: &[usize]| v.iter().sum::<usize>();
    let (plus, minus) = moments
        .into_iter()
        .max_by_key(|(p, m)| sum(p) as isize - sum(m) as isize)
        .unwrap_or_default();
    BlockMemory {
        saved,
        plus,
        minus,
        tracked: t_h || t_g || learns(&ff.w2),
    }
}

impl Llama {
    /// The pool peak (bytes) of one training step of a batch of `batch` sequences of `seq`
    /// tokens on the model's device: forward (under autocast to `autocast` when given), the
    /// loss as [`Llama::loss`] computes it (chunked by [`Llama::loss_chunk_rows`] or the
    /// automatic rule), backward, and an AdamW update (two moments per trainable parameter,
    /// in its dtype, already allocated), with every `checkpoint_every`-th block checkpointed
    /// (0: none). It walks the step's allocations in order (weights, optimizer state,
    /// activations each op keeps for backward, the logits and their gradient, each block's
    /// backward, the gradients) and rounds every tensor as the device's pool does. Steady
    /// state, as netcl-bench's `pool peak` after its warm-up steps; loss scaling and gradient
    /// clipping are not included.
    pub fn memory_estimate(
        &self,
        batch: usize,
        seq: usize,
        autocast: Option<DType>,
        checkpoint_every: usize,
    ) -> usize {
        let c = &self.config;
        let model_dt = c.dtype;
        // Autocast applies where the weights are f32 or already in its dtype.
        let cast = autocast.filter(|&dt| model_dt == DType::F32 || model_dt == dt);
        let act = cast.unwrap_or(model_dt);
        let dev = self.device();
        let widen = cast.is_some_and(|dt| {
            let kind = match dt {
                DType::F16 => TensorCoreKind::F16,
                _ => TensorCoreKind::Bf16,
            };
            dev.is_host() || !has_tensor_cores(dev, kind)
        });
        let s = Shape {
            n: batch * seq,
            b: batch,
            t: seq,
            d: c.dim,
            kv: c.n_kv_heads * c.head_dim(),
            hid: c.hidden_dim,
            heads: c.n_heads,
            res: model_dt.size(),
            act: act.size(),
            acc: netcl_ops::acc_dtype(model_dt).size(),
            cast: cast.filter(|&dt| dt != model_dt),
            widen,
        };
        let align = match dev.is_host() {
            true => None,
            false => Pool::of(dev).ok().map(|p| p.alignment()),
        };
        let mut m = Ledger {
            now: 0,
            peak: 0,
            align,
        };
        // Weights, AdamW's moments and its per-parameter counts.
        for p in self.parameters() {
            let bytes = p.numel() * p.dtype().size();
            m.alloc(&[bytes]);
            if p.requires_grad() {
                m.alloc(&[bytes, bytes, 4, 4, 4]);
            }
        }
        let (n, d, v) = (s.n, s.d, c.vocab_size);
        let ckpt = |i: usize| checkpoint_every > 0 && i.is_multiple_of(checkpoint_every);
        // Forward: the embedding's output, then each block's activations (a checkpointed
        // block's only for a moment) and its output (the next one's input).
        let out = n * d * s.res;
        m.alloc(&[out]);
        let mut tracked = trains(&self.tok_embeddings.weight);
        let blocks: Vec<BlockMemory> = self
            .layers
            .iter()
            .map(|b| {
                let bm = block_memory(b, &s, tracked);
                tracked = bm.tracked;
                bm
            })
            .collect();
        let qkv = n * (d + 2 * s.kv) * s.act;
        for (i, b) in blocks.iter().enumerate() {
            if ckpt(i) {
                m.spike(&[b.saved.as_slice(), &[qkv]].concat());
            } else {
                m.spike(&[qkv]);
                m.alloc(&b.saved);
            }
            m.alloc(&[out]);
        }
        // The head and the loss.
        let head = match &self.output {
            Some(o) if !plain(o) => None,
            Some(o) => Some(&o.weight),
            None => Some(&self.tok_embeddings.weight),
        };
        let head_w = head.unwrap_or(&self.tok_embeddings.weight);
        let hf = n * d * s.act;
        let w_copy = s.copy(head_w);
        let chunk = match head {
            Some(_) => self.loss_chunk_rows.or_else(|| loss_chunk_rows(n, v)),
            None => None,
        };
        m.alloc(&[hf, n * s.acc, n * 4]); // final norm output and statistics, logsumexp
        let dw = s.grad(head_w);
        match chunk {
            None => {
                let logits = n * v * s.act;
                m.alloc(&[w_copy, logits]);
                m.spike(&[logits]); // their gradient, while the logits are kept
                m.free(&[logits]);
                m.spike(&[&[logits, n * d * s.act][..], &dw].concat());
                m.free(&[w_copy]);
            }
            Some(rows) => {
                let logits = rows.min(n) * v * s.act;
                m.spike(&[w_copy, logits, rows.min(n) * 4]);
                m.alloc(&[w_copy]);
                let parts = n * d * s.act;
                // The last chunk: its logits and gradient, dX's parts, dW's part and the sum.
                m.spike(&[&[logits, logits, parts][..], &dw, &dw].concat());
                m.free(&[w_copy]);
                m.spike(&[parts, parts]);
            }
        }
        m.alloc(&s.kept(head_w));
        m.alloc(&s.kept(self.norm.weight()));
        // The final norm's output and input go; the gradient flows back through the residual
        // stream.
        m.free(&[hf, n * s.acc, n * 4, out]);
        m.alloc(&[out]);
        // Backward through the blocks, last first: a checkpointed block's activations come
        // back for its backward; each block's gradient products come and go; its parameters'
        // gradients stay.
        for (i, (blk, b)) in self.layers.iter().zip(&blocks).enumerate().rev() {
            // A checkpointed block's recomputation: its activations and output.
            let again = match ckpt(i) {
                true => [b.saved.as_slice(), &[out]].concat(),
                false => Vec::new(),
            };
            m.alloc(&again);
            m.moment(&b.plus, &b.minus);
            m.free(&again);
            m.free(&b.saved[..b.saved.len() * usize::from(!ckpt(i))]);
            m.free(&[out]); // the block's input
            for (_, p) in blk.named_parameters() {
                m.alloc(&s.kept(&p));
            }
        }
        // The embedding table's gradient; a tied table adds it to the head's (a third copy).
        let table = &self.tok_embeddings.weight;
        if trains(table) {
            let g = table.numel() * table.dtype().size();
            if head.is_some() && self.output.is_none() {
                m.spike(&[g, g]);
            } else {
                m.alloc(&[g]);
            }
        }
        m.peak
    }
}
