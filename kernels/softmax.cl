// softmax.cl: softmax, log_softmax and fused cross-entropy (forward, mean, backward) over rows of strided views.
//
// Contiguous rows of up to 8192 elements stay in registers (*_rows kernels, -DROW_V/-DROW_NV, see
// common.cl): max, then sum of exp(x - max), each merged over the row's team (backward: the sum of
// dy * y or of dy); one read per input element and one write per output. Other rows are reduced
// with an online (max, sum of exp(x - max)) state: one read pass for the statistics, one
// read-and-write pass for the output. Fixed reduction order: results are
// bit-reproducible.

#define SM_GROUP 256

// Online softmax state: running max m and s = sum exp(x - m). s == 0 marks an empty state.
typedef struct { ACC m; ACC s; } ms_t;

inline ms_t ms_empty(void) { ms_t r; r.m = -(ACC)INFINITY; r.s = 0; return r; }

inline ms_t ms_add(ms_t a, ACC x) {
    if (x == -(ACC)INFINITY) return a;  // contributes exp(-inf) = 0
    if (x > a.m) { a.s = a.s * exp(a.m - x) + (ACC)1; a.m = x; }
    else a.s += exp(x - a.m);
    return a;
}

inline ms_t ms_join(ms_t a, ms_t b) {
    if (b.s == (ACC)0) return a;
    if (a.s == (ACC)0) return b;
    ms_t r;
    r.m = fmax(a.m, b.m);
    r.s = a.s * exp(a.m - r.m) + b.s * exp(b.m - r.m);
    return r;
}

// Merge of the states of a team of work-items (the whole work-group: get_local_size(0)).
TEAM_REDUCE_FN(ms_team, ms_t, ms_join)

inline ACC sm_value(ACC x, ms_t st, int log_out) {
    return log_out ? (x - st.m) - log(st.s) : exp(x - st.m) / st.s;
}

// One work-group per row. Row o starts at layout_offsets(lk, o): .x in x, .y in out.
__kernel void softmax_wg(__global T* out,        /* contiguous, row elements os apart */
                         __global const T* x,    /* strided, row elements xs apart */
                         Layout lk, uint n, uint xs, uint os, int log_out) {
    __local ms_t sh[SM_GROUP];
    uint o = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint3 base = layout_offsets(&lk, o);
    ms_t s = ms_empty();
    for (uint j = lid; j < n; j += L) s = ms_add(s, LOAD(x, base.x + j * xs));
    s = ms_team(s, sh, L);
    for (uint j = lid; j < n; j += L)
        STORE(out, base.y + j * os, sm_value(LOAD(x, base.x + j * xs), s, log_out));
}

// One work-item per row: for short rows, or rows whose elements are far apart (adjacent work-items
// then read adjacent rows).
__kernel void softmax_col(__global T* out,        /* contiguous, row elements os apart */
                          __global const T* x,    /* strided, row elements xs apart */
                          Layout lk, uint n, uint xs, uint os, int log_out, uint rows) {
    uint o = get_global_id(0);
    if (o >= rows) return;
    uint3 base = layout_offsets(&lk, o);
    ms_t s = ms_empty();
    for (uint j = 0; j < n; ++j) s = ms_add(s, LOAD(x, base.x + j * xs));
    for (uint j = 0; j < n; ++j)
        STORE(out, base.y + j * os, sm_value(LOAD(x, base.x + j * xs), s, log_out));
}

// Cross-entropy operands: logits (n, c) with element (i, j) at xoff + i*xr + j*xc, targets (n) with
// element i at toff + i*ts; rows whose target equals `ignore` are ignored when use_ignore.
// Mirrors ops::softmax::CeLayout.
typedef struct {
    uint n, c;
    uint xoff, xr, xc;
    uint toff, ts;
    int use_ignore, ignore;
} CeLayout;

// Target of row i, and whether the row is ignored or its target lies outside [0, c).
inline int ce_target(const CeLayout* a, __global const int* tgt, uint i, int* ignored, int* bad) {
    int t = tgt[a->toff + i * a->ts];
    *ignored = a->use_ignore && t == a->ignore;
    *bad = t < 0 || (uint)t >= a->c;
    return t;
}

// Loss of row i with logsumexp l: l - x[target]; 0 for ignored rows, NaN for a bad target.
inline void ce_write(__global ACC* loss, __global ACC* lse, __global const T* x,
                     __global const int* tgt, const CeLayout* a, uint i, ACC l,
                     __global int* err, int code) {
    int ignored, bad;
    int t = ce_target(a, tgt, i, &ignored, &bad);
    if (bad && !ignored) report_index(err, code, i, t, a->c);
    loss[i] = ignored ? (ACC)0 : bad ? (ACC)NAN : l - LOAD(x, a->xoff + i * a->xr + (uint)t * a->xc);
    lse[i] = l;
}

// Arguments shared by cross_entropy_bwd and cross_entropy_bwd_rows.
#define CE_BWD_ARGS                                                                              \
    __global T* dx,            /* (N, C) contiguous */                                          \
    __global const T* x,       /* (N, C) through a */                                           \
    __global const int* tgt,   /* (N) through a */                                              \
    __global const ACC* lse,   /* (N): element i at loff + i*ls */                              \
    __global const ACC* grad,  /* element i at goff + i*gs (gs 0 broadcasts) */                 \
    __global const ACC* count, /* (1) at coff, when use_count */                                \
    CeLayout a, uint loff, uint ls, uint goff, uint gs, uint coff, int use_count

// Row i of the backward: its target, whether it is ignored, its lse and upstream scale
// grad[i] / count (NaN for a target outside [0, C)).
typedef struct { int t; int ignored; ACC lse; ACC g; } ce_bwd_t;

inline ce_bwd_t ce_bwd_row(__global const int* tgt, __global const ACC* lse, __global const ACC* grad,
                           __global const ACC* count, const CeLayout* a, uint loff, uint ls,
                           uint goff, uint gs, uint coff, int use_count, uint i) {
    int bad;
    ce_bwd_t r;
    r.t = ce_target(a, tgt, i, &r.ignored, &bad);
    r.lse = lse[loff + i * ls];
    r.g = grad[goff + i * gs];
    if (use_count) r.g = r.g / count[coff];
    if (bad) r.g = (ACC)NAN;
    return r;
}

// Per-row cross-entropy from logits and integer targets, one work-group per row:
// lse = logsumexp(row), loss = lse - x[target]; 0 for ignored rows, NaN for a target outside [0, C).
// vec: contiguous rows of a multiple of 4 logits starting 4-aligned, read 4 at a time.
__kernel void cross_entropy_fwd(__global ACC* loss,        /* (N) */
                                __global ACC* lse,         /* (N) */
                                __global const T* x,       /* (N, C) through a */
                                __global const int* tgt,   /* (N) through a */
                                CeLayout a,
                                __global int* err,         /* (4): the device's error record */
                                int code, int vec) {
    __local ms_t sh[SM_GROUP];
    uint i = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint row = a.xoff + i * a.xr;
    ms_t s = ms_empty();
    if (vec) {
        for (uint j = lid; j < a.c / 4; j += L) {
            ACC4 v = LOAD4(x + row, j);
            s = ms_add(ms_add(ms_add(ms_add(s, v.x), v.y), v.z), v.w);
        }
    } else {
        for (uint j = lid; j < a.c; j += L) s = ms_add(s, LOAD(x, row + j * a.xc));
    }
    s = ms_team(s, sh, L);
    if (lid == 0) ce_write(loss, lse, x, tgt, &a, i, s.m + log(s.s), err, code);
}

#ifdef ROW_NV
TEAM_REDUCE_FN(team_max, ACC, fmax)
TEAM_REDUCE_FN(team_sum, ACC, NETCL_ADD)

// Statistics of a register-resident row (common.cl): its max m (NaN is passed over here and
// poisons s instead) and s = sum exp(x - m); with keep_exp, v is replaced by exp(v - m).
// A row of only -inf, or with NaN or +inf, gets s = NaN.
inline ms_t row_ms(row_t* v, int keep_exp, rowpos_t r, __local ACC* sh) {
    ACC m = -(ACC)INFINITY;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j)
        if (ROW_HAS(r, j)) m = fmax(m, row_hmax(v[j]));
    ms_t st;
    st.m = team_max(m, sh, r.team);
    ACC s = 0;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        if (ROW_HAS(r, j)) {
            row_t q = exp(v[j] - st.m);
            s += row_hsum(q);
            if (keep_exp) v[j] = q;
        }
    }
    st.s = team_sum(s, sh, r.team);
    return st;
}

// softmax / log_softmax of contiguous rows held in registers (common.cl): row o starts at
// layout_offsets(lk, o) (.x in x, .y in out); one element read and one written.
__kernel void softmax_rows(__global T* out,       /* row o at layout_offsets(lk, o).y, contiguous */
                           __global const T* x,   /* row o at layout_offsets(lk, o).x, contiguous */
                           Layout lk, uint n, uint rows, uint team, int log_out) {
    __local ACC sh[SM_GROUP];
    rowpos_t r = row_pos(n, rows, team);
    uint3 base = layout_offsets(&lk, min(r.row, rows - 1));
    row_t v[ROW_NV];
    row_load(v, x, base.x, r);
    ms_t st = row_ms(v, !log_out, r, sh);
    ACC shift = st.m + log(st.s), scale = (ACC)1 / st.s;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) v[j] = log_out ? v[j] - shift : v[j] * scale;
    row_store(out, base.y, v, r);
}

// cross_entropy_fwd for rows of contiguous logits (a.xc == 1) held in registers.
__kernel void cross_entropy_rows(__global ACC* loss,       /* (N) */
                                 __global ACC* lse,        /* (N) */
                                 __global const T* x,      /* (N, C) through a, xc == 1 */
                                 __global const int* tgt,  /* (N) through a */
                                 CeLayout a,
                                 __global int* err,        /* (4): the device's error record */
                                 int code, uint team) {
    __local ACC sh[SM_GROUP];
    rowpos_t r = row_pos(a.c, a.n, team);
    row_t v[ROW_NV];
    row_load(v, x, a.xoff + min(r.row, a.n - 1) * a.xr, r);
    ms_t st = row_ms(v, 0, r, sh);
    if (r.lane == 0 && r.row < a.n) ce_write(loss, lse, x, tgt, &a, r.row, st.m + log(st.s), err, code);
}

// Gradient of softmax_rows from its output y and the upstream dy, both held in registers:
// dx = y * (dy - sum(dy * y)), or for log_softmax dx = dy - exp(y) * sum(dy). Row o starts at
// layout_offsets(lk, o): .x in y, .y in dy, .z in dx; each element read once and written once.
__kernel void softmax_bwd_rows(__global T* dx,        /* row o at layout_offsets(lk, o).z, contiguous */
                               __global const T* y,   /* row o at layout_offsets(lk, o).x, contiguous */
                               __global const T* dy,  /* row o at layout_offsets(lk, o).y, contiguous */
                               Layout lk, uint n, uint rows, uint team, int log_out) {
    __local ACC sh[SM_GROUP];
    rowpos_t r = row_pos(n, rows, team);
    uint3 base = layout_offsets(&lk, min(r.row, rows - 1));
    row_t p[ROW_NV], g[ROW_NV];
    row_load(p, y, base.x, r);
    row_load(g, dy, base.y, r);
    ACC s = 0;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        if (ROW_HAS(r, j)) {
            if (log_out) { p[j] = exp(p[j]); s += row_hsum(g[j]); }
            else s += row_hsum(g[j] * p[j]);
        }
    }
    s = team_sum(s, sh, r.team);
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) g[j] = log_out ? g[j] - p[j] * s : p[j] * (g[j] - s);
    row_store(dx, base.z, g, r);
}

// cross_entropy_bwd for rows of contiguous logits (a.xc == 1) of up to 8192 classes: a team per
// row, each logit read once; each work-item reads its row's target, lse and scale once.
__kernel void cross_entropy_bwd_rows(CE_BWD_ARGS, uint team) {
    rowpos_t r = row_pos(a.c, a.n, team);
    uint i = min(r.row, a.n - 1);
    row_t v[ROW_NV];
    row_load(v, x, a.xoff + i * a.xr, r);
    ce_bwd_t b = ce_bwd_row(tgt, lse, grad, count, &a, loff, ls, goff, gs, coff, use_count, i);
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        row_t d = (exp(v[j] - b.lse) - row_hot(ROW_UNIT(r, j), b.t)) * b.g;
        v[j] = b.ignored ? (row_t)0 : d;
    }
    row_store(dx, i * a.c, v, r);
}
#endif

// Mean of the per-row losses over rows that are not ignored, and that count; one work-group.
__kernel void cross_entropy_mean(__global ACC* mean,       /* (1) */
                                 __global ACC* count,      /* (1) */
                                 __global const ACC* loss, /* (N) */
                                 __global const int* tgt,  /* (N) through a */
                                 CeLayout a) {
    __local ACC2 sh[SM_GROUP];
    uint lid = get_local_id(0), L = get_local_size(0);
    ACC2 s = (ACC2)(0, 0);
    for (uint i = lid; i < a.n; i += L) {
        int ignored, bad;
        ce_target(&a, tgt, i, &ignored, &bad);
        if (!ignored) s += (ACC2)(loss[i], (ACC)1);
    }
    s = sum2_team(s, sh, L);
    if (lid == 0) { mean[0] = s.x / s.y; count[0] = s.y; }
}

// dlogits = (softmax(x) - onehot(target)) * grad[i] / count, one work-item per element (four
// with vec: contiguous rows of a multiple of 4 logits starting 4-aligned); 0 for ignored rows,
// NaN for rows whose target is outside [0, C).
__kernel void cross_entropy_bwd(CE_BWD_ARGS, int vec, uint n) {
    uint k = get_global_id(0);
    if (k >= n) return;
    if (vec) {
        uint e = 4 * k, i = e / a.c, j = e % a.c;
        ce_bwd_t b = ce_bwd_row(tgt, lse, grad, count, &a, loff, ls, goff, gs, coff, use_count, i);
        ACC4 p = exp(LOAD4(x + a.xoff + i * a.xr, j / 4) - b.lse);
        int4 hot = (int4)(j, j + 1, j + 2, j + 3) == (int4)(b.t);
        ACC4 d = (p - (hot.x ? (ACC4)(1, 0, 0, 0) : hot.y ? (ACC4)(0, 1, 0, 0) : hot.z ? (ACC4)(0, 0, 1, 0)
                       : hot.w ? (ACC4)(0, 0, 0, 1) : (ACC4)(0))) * b.g;
        STORE4(dx, k, b.ignored ? (ACC4)(0) : d);
        return;
    }
    uint i = k / a.c, j = k % a.c;
    ce_bwd_t b = ce_bwd_row(tgt, lse, grad, count, &a, loff, ls, goff, gs, coff, use_count, i);
    ACC p = exp(LOAD(x, a.xoff + i * a.xr + j * a.xc) - b.lse);
    ACC d = (p - (j == (uint)b.t ? (ACC)1 : (ACC)0)) * b.g;
    STORE(dx, k, b.ignored ? (ACC)0 : d);
}
