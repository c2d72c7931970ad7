// norm.cl: layer_norm, rms_norm (forward, input and parameter gradients) and batch_norm (training, eval).
//
// Row statistics use Welford per work-item and Chan's merge in a fixed tree order: bit-reproducible.
// Contiguous rows of up to 8192 elements take norm_rows and norm_bwd_rows (-DROW_V/-DROW_NV, see
// common.cl): the row stays in registers, one read per input element and one write per output.

#define NORM_GROUP 256

// y's storage, and dy's in the backward: x's, or with -DY_BF16 / -DY_F16 16 bits for an f32 x (a
// norm feeding products under autocast writes their dtype: no cast between).
#if defined(Y_BF16)
typedef ushort YT;
#define Y_LOAD(p, i) load_bf16(p, i)
#define Y_STORE(p, i, v) store_bf16(p, i, v)
#define Y_LOAD4(p, i) load4_bf16(p, 4 * (i))
#define Y_STORE4(p, i, v) store4_bf16(p, 4 * (i), v)
#elif defined(Y_F16)
#define YT half
#define Y_LOAD(p, i) load_f16(p, i)
#define Y_STORE(p, i, v) store_f16(p, i, v)
#define Y_LOAD4(p, i) load4_f16(p, 4 * (i))
#define Y_STORE4(p, i, v) store4_f16(p, 4 * (i), v)
#else
#define YT T
#define Y_LOAD LOAD
#define Y_STORE STORE
#define Y_LOAD4 LOAD4
#define Y_STORE4 STORE4
#endif

// Merges of Welford states over a team of work-items (common.cl).
TEAM_REDUCE_FN(wf_team, wf_t, wf_join)

inline uint norm_offset(const Layout* lr, uint r) {
    if (lr->ndim == 1) return r * lr->stride[0][0];
    return layout_offsets(lr, r).x;
}

// layer_norm (rms == 0) or rms_norm (rms != 0) of row o, one work-group per row:
// y = (x - mean) * rstd * w + b with rstd = 1 / sqrt(var + eps) (rms: mean 0, var = mean(x^2)).
__kernel void norm_fwd(__global YT* y,           /* (rows, n) contiguous */
                       __global ACC* mean,       /* (rows), written when save and rms == 0 */
                       __global ACC* rstd,       /* (rows), written when save */
                       __global const T* x,      /* strided: row o at layout_offsets(lk, o).x, element r at + norm_offset(lr, r) */
                       __global const T* w,      /* (n) when has_w */
                       __global const T* b,      /* (n) when has_b */
                       Layout lk, Layout lr, uint n, ACC eps, int rms, int has_w, int has_b, int save) {
    __local wf_t sh[NORM_GROUP];
    uint o = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint base = layout_offsets(&lk, o).x;
    wf_t s;
    s.n = 0; s.mean = 0; s.m2 = 0;
    for (uint r = lid; r < n; r += L) {
        ACC v = LOAD(x, base + norm_offset(&lr, r));
        if (rms) { s.n += (ACC)1; s.m2 += v * v; }  // a plain sum of squares (merged as with mean 0)
        else s = wf_add(s, v);
    }
    s = wf_team(s, sh, L);
    ACC mu = rms ? (ACC)0 : s.mean;
    ACC var = s.m2 / (ACC)n;
    ACC rs = (ACC)1 / sqrt(var + eps);
    for (uint r = lid; r < n; r += L) {
        ACC v = (LOAD(x, base + norm_offset(&lr, r)) - mu) * rs;
        if (has_w) v *= LOAD(w, r);
        if (has_b) v += LOAD(b, r);
        Y_STORE(y, o * n + r, v);
    }
    if (lid == 0 && save) {
        if (!rms) mean[o] = mu;
        rstd[o] = rs;
    }
}

#ifdef ROW_NV
// Rows of y (dy) in YT: common.cl's row_load / row_store for its storage.
#if ROW_V == 4
#define Y_ROW_LOAD(p, base, u) Y_LOAD4(p, (base) / 4 + (u))
#define Y_ROW_STORE(p, base, u, v) Y_STORE4(p, (base) / 4 + (u), v)
#else
#define Y_ROW_LOAD(p, base, u) Y_LOAD(p, (base) + (u))
#define Y_ROW_STORE(p, base, u, v) Y_STORE(p, (base) + (u), v)
#endif
ROW_IO(y_row_load, y_row_store, YT, Y_ROW_LOAD, Y_ROW_STORE)

// norm_fwd for contiguous rows held in registers (common.cl): one read and one write per element.
__kernel void norm_rows(__global YT* y,           /* (rows, n) contiguous */
                        __global ACC* mean,       /* (rows), written when save and rms == 0 */
                        __global ACC* rstd,       /* (rows), written when save */
                        __global const T* x,      /* row o at layout_offsets(lk, o).x, contiguous */
                        __global const T* w,      /* (n) when has_w */
                        __global const T* b,      /* (n) when has_b */
                        Layout lk, uint n, uint rows, uint team, ACC eps, int rms, int has_w, int has_b,
                        int save) {
    __local wf_t sh[NORM_GROUP];
    rowpos_t r = row_pos(n, rows, team);
    uint base = layout_offsets(&lk, min(r.row, rows - 1)).x;
    row_t v[ROW_NV];
    row_load(v, x, base, r);
    // This work-item's count, mean and squared deviations (two passes over registers; rms: mean
    // 0 and the sum of squares), then Chan's merge over the team.
    wf_t s;
    s.n = 0; s.mean = 0; s.m2 = 0;
    ACC sum = 0;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        if (ROW_HAS(r, j)) { s.n += (ACC)ROW_V; sum += row_hsum(v[j]); }
    }
    if (!rms && s.n > (ACC)0) s.mean = sum / s.n;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        if (ROW_HAS(r, j)) { row_t d = v[j] - s.mean; s.m2 += row_hsum(d * d); }
    }
    s = wf_team(s, sh, team);
    ACC mu = rms ? (ACC)0 : s.mean;
    ACC rs = (ACC)1 / sqrt(s.m2 / (ACC)n + eps);
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        if (ROW_HAS(r, j)) {
            uint u = ROW_UNIT(r, j);
            row_t h = (v[j] - mu) * rs;
            if (has_w) h *= ROW_LOAD(w, 0, u);
            if (has_b) h += ROW_LOAD(b, 0, u);
            v[j] = h;
        }
    }
    y_row_store(y, r.row * n, v, r);
    if (r.lane == 0 && r.row < rows && save) {
        if (!rms) mean[r.row] = mu;
        rstd[r.row] = rs;
    }
}
#endif

// Input gradient, one work-group per row: with xhat = (x - mean) * rstd and g = dy * w,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); rms_norm drops the mean(g) term.
__kernel void norm_bwd_x(__global T* dx,          /* (rows, n) */
                         __global const YT* dy,   /* (rows, n) */
                         __global const T* x,     /* (rows, n) */
                         __global const ACC* mean, /* (rows), read when rms == 0 */
                         __global const ACC* rstd, /* (rows) */
                         __global const T* w,     /* (n) when has_w */
                         uint n, int rms, int has_w) {
    __local ACC2 sh[NORM_GROUP];
    uint o = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint row = o * n;
    ACC mu = rms ? (ACC)0 : mean[o], rs = rstd[o];
    ACC sg = 0, sgx = 0;
    for (uint r = lid; r < n; r += L) {
        ACC g = Y_LOAD(dy, row + r);
        if (has_w) g *= LOAD(w, r);
        ACC xh = (LOAD(x, row + r) - mu) * rs;
        sg += g;
        sgx += g * xh;
    }
    ACC2 t = sum2_team((ACC2)(sg, sgx), sh, L);
    ACC mg = rms ? (ACC)0 : t.x / (ACC)n, mgx = t.y / (ACC)n;
    for (uint r = lid; r < n; r += L) {
        ACC g = Y_LOAD(dy, row + r);
        if (has_w) g *= LOAD(w, r);
        ACC xh = (LOAD(x, row + r) - mu) * rs;
        STORE(dx, row + r, rs * (g - mg - xh * mgx));
    }
}

#ifdef ROW_NV
// norm_bwd_x for contiguous rows held in registers (common.cl): x and dy read once, dx written
// once. Row o starts at layout_offsets(lk, o): .x in dx, .y in x, .z in dy. With has_plus, dx
// also gets plus added (the gradient its input had from elsewhere: no separate sum).
__kernel void norm_bwd_rows(__global T* dx,           /* (rows, n) contiguous */
                            __global const YT* dy,    /* row o at layout_offsets(lk, o).z, contiguous */
                            __global const T* x,      /* row o at layout_offsets(lk, o).y, contiguous */
                            __global const ACC* mean, /* (rows), read when rms == 0 */
                            __global const ACC* rstd, /* (rows) */
                            __global const T* w,      /* (n) when has_w */
                            __global const T* plus,   /* (rows, n) contiguous like dx, when has_plus */
                            Layout lk, uint n, uint rows, uint team, int rms, int has_w, int has_plus) {
    __local ACC2 sh[NORM_GROUP];
    rowpos_t r = row_pos(n, rows, team);
    uint o = min(r.row, rows - 1);
    uint3 base = layout_offsets(&lk, o);
    row_t g[ROW_NV], h[ROW_NV];
    row_load(h, x, base.y, r);
    y_row_load(g, dy, base.z, r);
    ACC mu = rms ? (ACC)0 : mean[o], rs = rstd[o];
    // g = dy * w and h = xhat in place, with this work-item's sums of g and g * xhat.
    ACC sg = 0, sgx = 0;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) {
        if (ROW_HAS(r, j)) {
            if (has_w) g[j] *= ROW_LOAD(w, 0, ROW_UNIT(r, j));
            h[j] = (h[j] - mu) * rs;
            sg += row_hsum(g[j]);
            sgx += row_hsum(g[j] * h[j]);
        }
    }
    ACC2 t = sum2_team((ACC2)(sg, sgx), sh, team);
    ACC mg = rms ? (ACC)0 : t.x / (ACC)n, mgx = t.y / (ACC)n;
#pragma unroll
    for (uint j = 0; j < ROW_NV; ++j) g[j] = rs * (g[j] - mg - h[j] * mgx);
    if (has_plus) {
        row_load(h, plus, base.x, r);
#pragma unroll
        for (uint j = 0; j < ROW_NV; ++j) g[j] += h[j];
    }
    row_store(dx, base.x, g, r);
}
#endif

// Parameter gradients, pass 1: work-item (c, j) sums dy * xhat and dy over rows
// [c * chunk, (c + 1) * chunk) of column j.
__kernel void norm_bwd_params_part(__global ACC* pw,        /* (nchunks, n) */
                                   __global ACC* pb,        /* (nchunks, n) */
                                   __global const YT* dy,   /* (rows, n) */
                                   __global const T* x,     /* (rows, n) */
                                   __global const ACC* mean, /* (rows), read when rms == 0 */
                                   __global const ACC* rstd, /* (rows) */
                                   uint rows, uint n, uint chunk, int rms, uint total) {
    uint k = get_global_id(0);
    if (k >= total) return;
    uint c = k / n, j = k % n;
    uint r1 = min(rows, (c + 1) * chunk);
    ACC aw = 0, ab = 0;
    for (uint i = c * chunk; i < r1; ++i) {
        ACC g = Y_LOAD(dy, i * n + j);
        ACC mu = rms ? (ACC)0 : mean[i];
        aw += g * (LOAD(x, i * n + j) - mu) * rstd[i];
        ab += g;
    }
    pw[k] = aw;
    pb[k] = ab;
}

// Parameter gradients, pass 2: one work-group per column j sums its chunks (strided over the
// work-items, then a tree in a fixed order; one work-item per column left most of a GPU idle).
__kernel void norm_bwd_params_sum(__global T* dw,          /* (n) */
                                  __global T* db,          /* (n), written when has_b */
                                  __global const ACC* pw,  /* (nchunks, n) */
                                  __global const ACC* pb,  /* (nchunks, n) */
                                  uint nchunks, int has_b, uint n) {
    __local ACC2 sh[NORM_GROUP];
    uint j = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    ACC2 s = (ACC2)((ACC)0);
    for (uint c = lid; c < nchunks; c += L) s += (ACC2)(pw[c * n + j], pb[c * n + j]);
    s = sum2_team(s, sh, L);
    if (lid != 0) return;
    STORE(dw, j, s.x);
    if (has_b) STORE(db, j, s.y);
}

// batch_norm in training mode, one work-group per channel c: batch statistics over (N, spatial),
// y = (x - mean) * invstd * w + b, saved mean/invstd, and running stats (unbiased var) updated
// with momentum when has_running.
__kernel void bn_train(__global T* y,             /* contiguous like x */
                       __global ACC* save_mean,   /* (C) */
                       __global ACC* save_invstd, /* (C) */
                       __global ACC* run_mean,    /* (C) when has_running */
                       __global ACC* run_var,     /* (C) when has_running */
                       __global const T* x,       /* strided: channel c at layout_offsets(lk, c) (.x in y, .y in x) */
                       __global const T* w,       /* (C) when has_w */
                       __global const T* b,       /* (C) when has_b */
                       Layout lk, Layout lr,      /* lr: (N, spatial) offsets, .x in y, .y in x */
                       uint cnt, ACC eps, ACC momentum, int has_w, int has_b, int has_running) {
    __local wf_t sh[NORM_GROUP];
    uint c = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint3 base = layout_offsets(&lk, c);
    wf_t s;
    s.n = 0; s.mean = 0; s.m2 = 0;
    for (uint r = lid; r < cnt; r += L) s = wf_add(s, LOAD(x, base.y + layout_offsets(&lr, r).y));
    s = wf_team(s, sh, L);
    ACC var = s.m2 / (ACC)cnt;
    ACC is = (ACC)1 / sqrt(var + eps);
    ACC scale = has_w ? LOAD(w, c) * is : is;
    ACC shift = (has_b ? LOAD(b, c) : (ACC)0) - s.mean * scale;
    for (uint r = lid; r < cnt; r += L) {
        uint3 off = layout_offsets(&lr, r);
        STORE(y, base.x + off.x, LOAD(x, base.y + off.y) * scale + shift);
    }
    if (lid == 0) {
        save_mean[c] = s.mean;
        save_invstd[c] = is;
        if (has_running) {
            run_mean[c] = ((ACC)1 - momentum) * run_mean[c] + momentum * s.mean;
            run_var[c] = ((ACC)1 - momentum) * run_var[c] + momentum * (s.m2 / (ACC)(cnt - 1));
        }
    }
}

// batch_norm in eval mode, one work-item per element: y = (x - rm[c]) / sqrt(rv[c] + eps) * w + b.
__kernel void bn_eval(__global T* y,              /* layout operand 0 (contiguous) */
                      __global const T* x,        /* layout operand 1 */
                      __global const ACC* rm,     /* (C) */
                      __global const ACC* rv,     /* (C) */
                      __global const T* w,        /* (C) when has_w */
                      __global const T* b,        /* (C) when has_b */
                      Layout l, uint C, uint inner, ACC eps, int has_w, int has_b, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint c = (i / inner) % C;
    uint3 o = layout_offsets(&l, i);
    ACC is = (ACC)1 / sqrt(rv[c] + eps);
    ACC scale = has_w ? LOAD(w, c) * is : is;
    ACC shift = (has_b ? LOAD(b, c) : (ACC)0) - rm[c] * scale;
    STORE(y, o.x, LOAD(x, o.y) * scale + shift);
}

// batch_norm backward (training statistics), in two kernels over work-groups (c, p) of C x P:
// slice p covers elements [p * chunk, (p + 1) * chunk) of channel c's cnt (N, spatial) elements.
// Element r of channel c lies at layout_offsets(lk, c) + layout_offsets(lr, r): .x in dx, .y in
// x, .z in dy.

// Pass 1: partial sums of dy and dy * xhat (xhat = (x - mean) * invstd) over one slice.
__kernel void bn_bwd_part(__global ACC* part,          /* (C, P, 2): sum dy, sum dy * xhat */
                          __global const T* x,         /* strided, .y of the layouts */
                          __global const T* dy,        /* strided, .z of the layouts */
                          __global const ACC* mean,    /* (C) */
                          __global const ACC* invstd,  /* (C) */
                          Layout lk, Layout lr, uint cnt, uint chunk, uint P) {
    __local ACC2 sh[NORM_GROUP];
    uint g = get_group_id(0), c = g / P, p = g % P, lid = get_local_id(0), L = get_local_size(0);
    uint3 base = layout_offsets(&lk, c);
    ACC mu = mean[c], is = invstd[c];
    ACC2 s = (ACC2)(0, 0);
    uint r1 = min(cnt, (p + 1) * chunk);
    for (uint r = p * chunk + lid; r < r1; r += L) {
        uint3 o = layout_offsets(&lr, r);
        ACC d = LOAD(dy, base.z + o.z);
        s += (ACC2)(d, d * (LOAD(x, base.y + o.y) - mu) * is);
    }
    s = sum2_team(s, sh, L);
    if (lid == 0) vstore2(s, g, part);
}

// Pass 2: channel totals from the P partials (merged in the same fixed order by every work-group
// of the channel), then dx = w * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) over the
// slice; work-group (c, 0) also writes dweight[c] = sum dy * xhat and dbias[c] = sum dy.
__kernel void bn_bwd_dx(__global T* dx,               /* contiguous like x, .x of the layouts */
                        __global T* dw,               /* (C) when has_w */
                        __global T* db,               /* (C) */
                        __global const ACC* part,     /* (C, P, 2) from bn_bwd_part */
                        __global const T* x,          /* strided, .y of the layouts */
                        __global const T* dy,         /* strided, .z of the layouts */
                        __global const ACC* mean,     /* (C) */
                        __global const ACC* invstd,   /* (C) */
                        __global const T* w,          /* (C) when has_w */
                        Layout lk, Layout lr, uint cnt, uint chunk, uint P, int has_w) {
    __local ACC2 sh[NORM_GROUP];
    uint g = get_group_id(0), c = g / P, p = g % P, lid = get_local_id(0), L = get_local_size(0);
    ACC2 t = (ACC2)(0, 0);
    for (uint q = lid; q < P; q += L) t += vload2(c * P + q, part);
    t = sum2_team(t, sh, L);
    if (p == 0 && lid == 0) {
        if (has_w) STORE(dw, c, t.y);
        STORE(db, c, t.x);
    }
    uint3 base = layout_offsets(&lk, c);
    ACC mu = mean[c], is = invstd[c];
    ACC k = has_w ? LOAD(w, c) * is : is;
    ACC mdy = t.x / (ACC)cnt, mdyx = t.y / (ACC)cnt;
    uint r1 = min(cnt, (p + 1) * chunk);
    for (uint r = p * chunk + lid; r < r1; r += L) {
        uint3 o = layout_offsets(&lr, r);
        ACC xh = (LOAD(x, base.y + o.y) - mu) * is;
        STORE(dx, base.x + o.x, k * (LOAD(dy, base.z + o.z) - mdy - xh * mdyx));
    }
}
