//! The declarations of the kernels in kernels/*.cl, one list per file in the file's order: each kernel's arguments as its signature names them, `In` for buffers it only reads, `Out` for buffers it may write, `V(type)` for values, `Local` for local memory (checked against the .cl signatures by a test).
use crate::decl::KernelDecl;
use crate::decl::Use::{In, Local, Out, Value as V};
use crate::kernels;

/// kernels/copy.cl
pub const COPY: &[KernelDecl] = kernels![
    strided_copy(out: Out, src: In, l: V("Layout"), n: V("uint")),
    strided_copy_words(out: Out, src: In, l: V("Layout"), n: V("uint")),
    fill(out: Out, value: V("ACC"), n: V("uint")),
    arange(out: Out, start: V("ACC"), step: V("ACC"), n: V("uint")),
    transpose_copy(out: Out, src: In, rows: V("uint"), cols: V("uint"), ld: V("uint"), sb: V("uint"), off: V("uint")),
];

/// kernels/random.cl
pub const RANDOM: &[KernelDecl] = kernels![
    uniform(out: Out, key0: V("uint"), key1: V("uint"), base_lo: V("ulong"), base_hi: V("ulong"), low: V("ACC"), high: V("ACC"), n: V("uint")),
    normal(out: Out, key0: V("uint"), key1: V("uint"), base_lo: V("ulong"), base_hi: V("ulong"), mean: V("ACC"), std: V("ACC"), n: V("uint")),
    bernoulli(out: Out, key0: V("uint"), key1: V("uint"), base_lo: V("ulong"), base_hi: V("ulong"), threshold: V("ulong"), n: V("uint")),
    bernoulli_int(out: Out, key0: V("uint"), key1: V("uint"), base_lo: V("ulong"), base_hi: V("ulong"), threshold: V("ulong"), n: V("uint")),
    dropout(y: Out, mask: Out, x: In, key0: V("uint"), key1: V("uint"), base_lo: V("ulong"), base_hi: V("ulong"), threshold: V("ulong"), scale: V("ACC"), l: V("Layout"), n: V("uint")),
];

/// kernels/matmul_tiled.cl
pub const MATMUL_TILED: &[KernelDecl] = kernels![
    matmul_tiled(c: Out, a: In, b: In, bias: In, batch: V("Layout"), M: V("uint"), N: V("uint"), K: V("uint"), sam: V("uint"), sak: V("uint"), sbk: V("uint"), sbn: V("uint"), has_bias: V("uint"), ldc: V("uint"), c_col: V("uint"), lower: V("uint"), diag: V("int"), rsum: Out),
];

/// kernels/matmul_gemv.cl
pub const MATMUL_GEMV: &[KernelDecl] = kernels![
    matmul_gemv4(c: Out, f: In, g: In, bias: In, rsum: Out, R: V("uint"), J: V("uint"), K: V("uint"), sfr: V("uint"), sfk: V("uint"), sgk: V("uint"), sgj: V("uint"), f_off: V("uint"), g_off: V("uint"), scr: V("uint"), scj: V("uint"), team: V("uint"), kmajor: V("uint"), has_bias: V("uint"), bias_r: V("uint")),
    matmul_gemv16(c: Out, f: In, g: In, bias: In, rsum: Out, R: V("uint"), J: V("uint"), K: V("uint"), sfr: V("uint"), sfk: V("uint"), sgk: V("uint"), sgj: V("uint"), f_off: V("uint"), g_off: V("uint"), scr: V("uint"), scj: V("uint"), team: V("uint"), kmajor: V("uint"), has_bias: V("uint"), bias_r: V("uint")),
];

/// kernels/matmul_parts.cl
pub const MATMUL_PARTS: &[KernelDecl] = kernels![
    matmul_parts(c: Out, parts: In, bias: In, S: V("uint"), N: V("uint"), has_bias: V("uint"), MN: V("uint"), TEAM: V("uint")),
];

/// kernels/matmul_tc.cl
pub const MATMUL_TC: &[KernelDecl] = kernels![
    matmul_tc(c: Out, a: In, b: In, bias: In, batch: V("Layout"), M: V("uint"), N: V("uint"), K: V("uint"), sam: V("uint"), sbn: V("uint"), has_bias: V("uint")),
];

/// kernels/matmul_wg.cl
pub const MATMUL_WG: &[KernelDecl] = kernels![
    matmul_wg(c: Out, a: In, b: In, bias: In, batch: V("Layout"), M: V("uint"), N: V("uint"), K: V("uint"), sam: V("uint"), sbn: V("uint"), has_bias: V("uint"), batches: V("uint"), raster: V("uint")),
];

/// kernels/matmul_async.cl
pub const MATMUL_ASYNC: &[KernelDecl] = kernels![
    matmul_async(c: Out, a: In, b: In, bias: In, batch: V("Layout"), M: V("uint"), N: V("uint"), K: V("uint"), sam: V("uint"), sak: V("uint"), sbk: V("uint"), sbn: V("uint"), has_bias: V("uint"), ldc: V("uint"), c_col: V("uint"), lower: V("uint"), diag: V("int"), rsum: Out),
];

/// kernels/matmul_cpu.cl
pub const MATMUL_CPU: &[KernelDecl] = kernels![
    matmul_cpu_pack(bp: Out, b: In, batch: V("Layout"), K: V("uint"), N: V("uint"), sbk: V("uint"), sbn: V("uint"), panels: V("uint")),
    matmul_cpu_nn(c: Out, a: In, b: In, bias: In, batch: V("Layout"), M: V("uint"), N: V("uint"), K: V("uint"), sam: V("uint"), sak: V("uint"), sbk: V("uint"), spanel: V("uint"), bz: V("uint"), has_bias: V("uint")),
    matmul_cpu_nt(c: Out, a: In, b: In, bias: In, batch: V("Layout"), M: V("uint"), N: V("uint"), K: V("uint"), sam: V("uint"), sbn: V("uint"), has_bias: V("uint")),
];

/// kernels/index.cl
pub const INDEX: &[KernelDecl] = kernels![
    gather_rows(out: Out, src: In, idx: In, stride: V("uint"), bound: V("uint"), l: V("Layout"), err: Out, code: V("int"), n: V("uint")),
    scatter_add(out: Out, x: In, idx: In, src: In, l: V("ScatterLayout"), err: Out, code: V("int"), n: V("uint")),
    sorted_row_add(out: Out, x: In, src: In, keys: In, perm: In, runs: Local, l: V("RowAddLayout"), n: V("uint")),
];

/// kernels/shape.cl
pub const SHAPE: &[KernelDecl] = kernels![
    one_hot(out: Out, ids: In, classes: V("uint"), l: V("Layout"), n: V("uint")),
    pad_constant(out: Out, x: In, l: V("PadLayout"), value: V("ACC"), n: V("uint")),
    tri_select(out: Out, x: In, rows: V("uint"), cols: V("uint"), diagonal: V("int"), upper: V("uint"), fill: V("ACC"), l: V("Layout"), n: V("uint")),
    tri_mask(out: Out, cols: V("uint"), diagonal: V("int"), upper: V("uint"), inside: V("ACC"), outside: V("ACC"), n: V("uint")),
];

/// kernels/rope.cl
pub const ROPE: &[KernelDecl] = kernels![
    rope(out: Out, x: In, ids: In, inv_freq: In, use_table: V("uint"), x_second: V("uint"), out_second: V("uint"), x_head: V("uint"), out_head: V("uint"), seq: V("uint"), heads: V("uint"), half_dim: V("uint"), pos0: V("uint"), use_ids: V("uint"), per_row: V("uint"), theta: V("ACC"), sign: V("ACC"), l: V("Layout"), n: V("uint")),
];

/// kernels/reduce.cl: `NAME##_suffix` families, one kernel per reduction (`sum_wg`, `max_wg`, ...).
pub const REDUCE: &[KernelDecl] = kernels![
    "NAME##_wg"(out: Out, part: Out, x: In, lk: V("Layout"), lr: V("Layout"), nred: V("uint"), chunk: V("uint"), nsplit: V("uint"), p: V("ACC")),
    "NAME##_merge"(out: Out, part: In, nsplit: V("uint"), nred: V("uint"), p: V("ACC")),
    "NAME##_col"(out: Out, x: In, lk: V("Layout"), lr: V("Layout"), nred: V("uint"), p: V("ACC"), nout: V("uint")),
];

/// kernels/softmax.cl
pub const SOFTMAX: &[KernelDecl] = kernels![
    softmax_wg(out: Out, x: In, lk: V("Layout"), n: V("uint"), xs: V("uint"), os: V("uint"), log_out: V("int")),
    softmax_col(out: Out, x: In, lk: V("Layout"), n: V("uint"), xs: V("uint"), os: V("uint"), log_out: V("int"), rows: V("uint")),
    cross_entropy_fwd(loss: Out, lse: Out, x: In, tgt: In, a: V("CeLayout"), err: Out, code: V("int"), vec: V("int")),
    softmax_rows(out: Out, x: In, lk: V("Layout"), n: V("uint"), rows: V("uint"), team: V("uint"), log_out: V("int")),
    cross_entropy_rows(loss: Out, lse: Out, x: In, tgt: In, a: V("CeLayout"), err: Out, code: V("int"), team: V("uint")),
    softmax_bwd_rows(dx: Out, y: In, dy: In, lk: V("Layout"), n: V("uint"), rows: V("uint"), team: V("uint"), log_out: V("int")),
    cross_entropy_bwd_rows(dx: Out, x: In, tgt: In, lse: In, grad: In, count: In, a: V("CeLayout"), loff: V("uint"), ls: V("uint"), goff: V("uint"), gs: V("uint"), coff: V("uint"), use_count: V("int"), team: V("uint")),
    cross_entropy_mean(mean: Out, count: Out, loss: In, tgt: In, a: V("CeLayout")),
    cross_entropy_bwd(dx: Out, x: In, tgt: In, lse: In, grad: In, count: In, a: V("CeLayout"), loff: V("uint"), ls: V("uint"), goff: V("uint"), gs: V("uint"), coff: V("uint"), use_count: V("int"), vec: V("int"), n: V("uint")),
];

/// kernels/norm.cl
pub const NORM: &[KernelDecl] = kernels![
    norm_fwd(y: Out, mean: Out, rstd: Out, x: In, w: In, b: In, lk: V("Layout"), lr: V("Layout"), n: V("uint"), eps: V("ACC"), rms: V("int"), has_w: V("int"), has_b: V("int"), save: V("int")),
    norm_rows(y: Out, mean: Out, rstd: Out, x: In, w: In, b: In, lk: V("Layout"), n: V("uint"), rows: V("uint"), team: V("uint"), eps: V("ACC"), rms: V("int"), has_w: V("int"), has_b: V("int"), save: V("int")),
    norm_bwd_x(dx: Out, dy: In, x: In, mean: In, rstd: In, w: In, n: V("uint"), rms: V("int"), has_w: V("int")),
    norm_bwd_rows(dx: Out, dy: In, x: In, mean: In, rstd: In, w: In, plus: In, lk: V("Layout"), n: V("uint"), rows: V("uint"), team: V("uint"), rms: V("int"), has_w: V("int"), has_plus: V("int")),
    norm_bwd_params_part(pw: Out, pb: Out, dy: In, x: In, mean: In, rstd: In, rows: V("uint"), n: V("uint"), chunk: V("uint"), rms: V("int"), total: V("uint")),
    norm_bwd_params_sum(dw: Out, db: Out, pw: In, pb: In, nchunks: V("uint"), has_b: V("int"), n: V("uint")),
    bn_train(y: Out, save_mean: Out, save_invstd: Out, run_mean: Out, run_var: Out, x: In, w: In, b: In, lk: V("Layout"), lr: V("Layout"), cnt: V("uint"), eps: V("ACC"), momentum: V("ACC"), has_w: V("int"), has_b: V("int"), has_running: V("int")),
    bn_eval(y: Out, x: In, rm: In, rv: In, w: In, b: In, l: V("Layout"), C: V("uint"), inner: V("uint"), eps: V("ACC"), has_w: V("int"), has_b: V("int"), n: V("uint")),
    bn_bwd_part(part: Out, x: In, dy: In, mean: In, invstd: In, lk: V("Layout"), lr: V("Layout"), cnt: V("uint"), chunk: V("uint"), P: V("uint")),
    bn_bwd_dx(dx: Out, dw: Out, db: Out, part: In, x: In, dy: In, mean: In, invstd: In, w: In, lk: V("Layout"), lr: V("Layout"), cnt: V("uint"), chunk: V("uint"), P: V("uint"), has_w: V("int")),
];

/// kernels/conv.cl
pub const CONV: &[KernelDecl] = kernels![
    im2col(cols: Out, x: In, v: V("View4"), g: V("ConvGeom"), n: V("uint")),
    im2col_rows(cols: Out, x: In, v: V("View4"), g: V("ConvGeom"), rows: V("uint")),
    col2im(dx: Out, cols: In, v: V("View4"), g: V("ConvGeom"), n: V("uint")),
    add_channel_bias(y: Out, bias: In, bstride: V("uint"), boff: V("uint"), c: V("Div"), p: V("Div"), n: V("uint")),
];

/// kernels/pool.cl
pub const POOL: &[KernelDecl] = kernels![
    max_pool2d(y: Out, idx: Out, x: In, v: V("View4"), g: V("PoolGeom"), n: V("uint")),
    max_pool2d_backward(dx: Out, gy: In, idx: In, gv: V("View4"), iv: V("View4"), g: V("PoolGeom"), n: V("uint")),
    max_pool2d_backward_tiled(dx: Out, gy: In, idx: In, gv: V("View4"), iv: V("View4"), g: V("PoolGeom"), n: V("uint")),
    avg_pool2d(y: Out, x: In, v: V("View4"), g: V("PoolGeom"), n: V("uint")),
    avg_pool2d_backward(dx: Out, gy: In, gv: V("View4"), g: V("PoolGeom"), n: V("uint")),
    adaptive_avg_pool2d(y: Out, x: In, v: V("View4"), g: V("PoolGeom"), n: V("uint")),
    adaptive_avg_pool2d_backward(dx: Out, gy: In, gv: V("View4"), g: V("PoolGeom"), n: V("uint")),
];

/// kernels/sort.cl
pub const SORT: &[KernelDecl] = kernels![
    sort_chunks(keys: Out, pos: Out, x: In, x_offset: V("uint"), x_stride: V("uint"), n: V("uint"), stage: V("uint"), lk: Local, lp: Local),
    sort_merge(keys: Out, pos: Out, k: V("uint"), j: V("uint"), pairs: V("uint")),
];

/// kernels/attention.cl
pub const ATTENTION: &[KernelDecl] = kernels![
    attention_fwd(o: Out, lse: Out, q: In, k: In, v: In, g: V("AttnGeom"), scale: V("ACC")),
    attention_bwd_dq(dq: Out, delta: Out, q: In, k: In, v: In, dout: In, o: In, lse: In, g: V("AttnGeom"), scale: V("ACC")),
    attention_bwd_dk(dk: Out, q: In, k: In, v: In, dout: In, lse: In, delta: In, g: V("AttnGeom"), scale: V("ACC")),
    attention_bwd_dv(dv: Out, q: In, k: In, v: In, dout: In, lse: In, delta: In, g: V("AttnGeom"), scale: V("ACC")),
    attention_fwd_blocked(o: Out, lse: Out, q: In, k: In, v: In, g: V("AttnGeom"), scale: V("ACC")),
    attention_bwd_dkdv(dk: Out, dv: Out, q: In, k: In, v: In, dout: In, lse: In, delta: In, dsg: Out, want_ds: V("uint"), g: V("AttnGeom"), scale: V("ACC")),
    attention_bwd_delta(delta: Out, dout: In, o: In, g: V("AttnGeom"), scale: V("ACC")),
    attention_bwd_dq_blocked(dq: Out, delta: Out, q: In, k: In, v: In, dout: In, o: In, lse: In, g: V("AttnGeom"), scale: V("ACC")),
];

/// kernels/attention_tc.cl
pub const ATTENTION_TC: &[KernelDecl] = kernels![
    attention_fwd_tc(o: Out, lse: Out, q: In, k: In, v: In, G: V("AttnGeom"), scale: V("float")),
    attention_bwd_dq_tc(dq: Out, delta: Out, q: In, k: In, v: In, dout: In, o: In, lse: In, G: V("AttnGeom"), scale: V("float")),
    attention_bwd_dkdv_tc(dk: Out, dv: Out, q: In, k: In, v: In, dout: In, lse: In, delta: In, G: V("AttnGeom"), scale: V("float")),
];

/// kernels/decode.cl
pub const DECODE: &[KernelDecl] = kernels![
    decode_gemv(y: Out, x: In, g: In, w0: In, w1: In, w2: In, res: In, bias: In, kc: Out, vc: Out, pads: In, inv_freq: In, step: In, err: Out, a: V("GemvArgs"), eps: V("ACC"), theta: V("ACC")),
    decode_gemv_tc(y: Out, x: In, g: In, w0: In, w1: In, w2: In, res: In, bias: In, kc: Out, vc: Out, pads: In, inv_freq: In, step: In, err: Out, a: V("GemvArgs"), eps: V("ACC"), theta: V("ACC")),
    decode_attention(o: Out, q: In, kc: In, vc: In, pads: In, step: In, err: Out, sizes: V("uint8"), scale: V("ACC")),
];

/// kernels/decode_block.cl
pub const DECODE_BLOCK: &[KernelDecl] = kernels![
    decode_block(out: Out, scratch: Out, work: Out, x: In, g_att: In, wq: In, wk: In, wv: In, b_qkv: In, wo: In, b_o: In, g_ffn: In, w1: In, w3: In, b_13: In, w2: In, b_2: In, kc: Out, vc: Out, pads: In, inv_freq: In, step: In, err: Out, a: V("BlockArgs"), eps_att: V("ACC"), eps_ffn: V("ACC"), theta: V("ACC"), scale: V("ACC")),
];
