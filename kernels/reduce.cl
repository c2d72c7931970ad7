// reduce.cl: reductions of strided views over any axes (sum, mean, max, min, argmax, argmin, var, logsumexp).
//
// Every op NAME has three kernels sharing one accumulator state type:
//   NAME_wg:    one work-group per (output, split) with a tree merge in local memory;
//   NAME_merge: one work-group per output, merging the per-split partial states of NAME_wg;
//   NAME_col:   one work-item per output walking its reduced elements in order.
// Element (o, r) of the input lies at layout_offsets(lk, o).x + red_offset(lr, r): lk walks the kept dims
// (with the input offset), lr the reduced dims. Reduction order is fixed, so results are bit-reproducible.

#define RED_GROUP 256

#if defined(DT_I32)
#define ACC_LOWEST INT_MIN
#define ACC_HIGHEST INT_MAX
#define ISNAN(x) 0
#elif defined(DT_U32)
#define ACC_LOWEST 0u
#define ACC_HIGHEST UINT_MAX
#define ISNAN(x) 0
#else
#define RED_FLOAT 1
#define ACC_LOWEST (-(ACC)INFINITY)
#define ACC_HIGHEST ((ACC)INFINITY)
#define ISNAN(x) isnan(x)
#endif

// Offset of reduced element r (one merged dim is the common, fast case).
inline uint red_offset(const Layout* lr, uint r) {
    if (lr->ndim == 1) return r * lr->stride[0][0];
    return layout_offsets(lr, r).x;
}

// ---- sum ----
typedef ACC sum_st;
inline sum_st sum_init(void) { return (ACC)0; }
inline sum_st sum_accum(sum_st s, ACC x, uint r) { return s + x; }
inline sum_st sum_join(sum_st a, sum_st b) { return a + b; }
#define sum_final(out, o, s, n, p) STORE(out, o, s)

// ---- max / min (NaN propagates) ----
typedef ACC max_st;
inline max_st max_init(void) { return ACC_LOWEST; }
inline max_st max_accum(max_st s, ACC x, uint r) { return (ISNAN(x) || x > s) ? x : s; }
inline max_st max_join(max_st a, max_st b) { return max_accum(a, b, 0); }
#define max_final(out, o, s, n, p) STORE(out, o, s)

typedef ACC min_st;
inline min_st min_init(void) { return ACC_HIGHEST; }
inline min_st min_accum(min_st s, ACC x, uint r) { return (ISNAN(x) || x < s) ? x : s; }
inline min_st min_join(min_st a, min_st b) { return min_accum(a, b, 0); }
#define min_final(out, o, s, n, p) STORE(out, o, s)

// ---- argmax / argmin: value and reduced index; NaN counts as the extreme, ties take the first index ----
typedef struct { ACC v; uint i; } arg_st;
#define ARG_EMPTY 0xffffffffu
// True when candidate b beats the current a (GT is > for argmax, < for argmin).
#define ARG_BEATS(a, b, GT)                                                                      \
    ((b).i != ARG_EMPTY &&                                                                       \
     ((a).i == ARG_EMPTY ||                                                                      \
      (ISNAN((a).v) ? (ISNAN((b).v) && (b).i < (a).i)                                            \
                    : (ISNAN((b).v) || (b).v GT (a).v || ((b).v == (a).v && (b).i < (a).i)))))
inline arg_st arg_init(void) { arg_st s; s.v = (ACC)0; s.i = ARG_EMPTY; return s; }
typedef arg_st argmax_st;
inline argmax_st argmax_init(void) { return arg_init(); }
inline argmax_st argmax_join(argmax_st a, argmax_st b) { return ARG_BEATS(a, b, >) ? b : a; }
inline argmax_st argmax_accum(argmax_st s, ACC x, uint r) { arg_st b; b.v = x; b.i = r; return argmax_join(s, b); }
#define argmax_final(out, o, s, n, p) ((out)[o] = (int)(s).i)
typedef arg_st argmin_st;
inline argmin_st argmin_init(void) { return arg_init(); }
inline argmin_st argmin_join(argmin_st a, argmin_st b) { return ARG_BEATS(a, b, <) ? b : a; }
inline argmin_st argmin_accum(argmin_st s, ACC x, uint r) { arg_st b; b.v = x; b.i = r; return argmin_join(s, b); }
#define argmin_final(out, o, s, n, p) ((out)[o] = (int)(s).i)

#ifdef RED_FLOAT
// ---- mean ----
typedef ACC mean_st;
inline mean_st mean_init(void) { return (ACC)0; }
inline mean_st mean_accum(mean_st s, ACC x, uint r) { return s + x; }
inline mean_st mean_join(mean_st a, mean_st b) { return a + b; }
#define mean_final(out, o, s, n, p) STORE(out, o, (s) / (ACC)(n))

// ---- var: Welford per work-item, Chan's merge across; p is the correction (1 = unbiased) ----
typedef wf_t var_st;
inline var_st var_init(void) { var_st s; s.n = 0; s.mean = 0; s.m2 = 0; return s; }
inline var_st var_accum(var_st s, ACC x, uint r) { return wf_add(s, x); }
inline var_st var_join(var_st a, var_st b) { return wf_join(a, b); }
#define var_final(out, o, st, cnt, p) STORE(out, o, (st).m2 / fmax((st).n - (p), (ACC)0))

// ---- logsumexp: running max and sum of exp(x - max) ----
typedef struct { ACC m; ACC s; } lse_st;
typedef lse_st logsumexp_st;
inline lse_st logsumexp_init(void) { lse_st s; s.m = ACC_LOWEST; s.s = 0; return s; }
inline lse_st logsumexp_join(lse_st a, lse_st b) {
    ACC m = fmax(a.m, b.m);
    if (ISNAN(a.m) || ISNAN(b.m)) m = a.m + b.m;
    if (isinf(m)) { lse_st r; r.m = m; r.s = 1; return r; }  // all -inf (or empty), or a +inf present
    lse_st r;
    r.m = m;
    r.s = a.s * exp(a.m - m) + b.s * exp(b.m - m);
    return r;
}
inline lse_st logsumexp_accum(lse_st s, ACC x, uint r) { lse_st b; b.m = x; b.s = 1; return logsumexp_join(s, b); }
// Empty or all -inf gives -inf; a +inf gives +inf.
#define logsumexp_final(out, o, st, n, p) STORE(out, o, isinf((st).m) ? (st).m : (st).m + log((st).s))
#endif

#define REDUCE_KERNELS(NAME, OUT_T)                                                              \
TEAM_REDUCE_FN(NAME##_team, NAME##_st, NAME##_join)                                              \
__kernel void NAME##_wg(__global OUT_T* out,            /* (nout) when nsplit == 1 */           \
                        __global NAME##_st* part,       /* (nout, nsplit) when nsplit > 1 */    \
                        __global const T* x,            /* strided: lk over kept, lr over reduced dims */ \
                        Layout lk, Layout lr, uint nred, uint chunk, uint nsplit, ACC p) {      \
    __local NAME##_st sh[RED_GROUP];                                                             \
    uint g = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);                      \
    uint o = g / nsplit, sp = g % nsplit;                                                        \
    uint base = layout_offsets(&lk, o).x;                                                        \
    uint r0 = sp * chunk, r1 = min(nred, r0 + chunk);                                            \
    NAME##_st s = NAME##_init();                                                                 \
    if (lr.ndim <= 1) {                                                                          \
        uint st = lr.ndim == 1 ? lr.stride[0][0] : 0;                                            \
        for (uint r = r0 + lid; r < r1; r += L) s = NAME##_accum(s, LOAD(x, base + r * st), r);  \
    } else {                                                                                     \
        /* Four loads in flight (their offsets cost a walk of lr each), combined in order. */     \
        uint r = r0 + lid;                                                                       \
        for (; r + 3 * L < r1; r += 4 * L) {                                                     \
            ACC a0 = LOAD(x, base + layout_offsets(&lr, r).x);                                   \
            ACC a1 = LOAD(x, base + layout_offsets(&lr, r + L).x);                               \
            ACC a2 = LOAD(x, base + layout_offsets(&lr, r + 2 * L).x);                           \
            ACC a3 = LOAD(x, base + layout_offsets(&lr, r + 3 * L).x);                           \
            s = NAME##_accum(s, a0, r);                                                          \
            s = NAME##_accum(s, a1, r + L);                                                      \
            s = NAME##_accum(s, a2, r + 2 * L);                                                  \
            s = NAME##_accum(s, a3, r + 3 * L);                                                  \
        }                                                                                        \
        for (; r < r1; r += L) s = NAME##_accum(s, LOAD(x, base + layout_offsets(&lr, r).x), r); \
    }                                                                                            \
    s = NAME##_team(s, sh, L);                                                                   \
    if (lid == 0) {                                                                              \
        if (nsplit == 1) NAME##_final(out, o, s, nred, p);                                       \
        else part[g] = s;                                                                        \
    }                                                                                            \
}                                                                                                \
__kernel void NAME##_merge(__global OUT_T* out,          /* (nout) */                            \
                           __global const NAME##_st* part, /* (nout, nsplit) */                  \
                           uint nsplit, uint nred, ACC p) {                                      \
    __local NAME##_st sh[RED_GROUP];                                                             \
    uint o = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);                      \
    NAME##_st s = NAME##_init();                                                                 \
    for (uint k = lid; k < nsplit; k += L) s = NAME##_join(s, part[o * nsplit + k]);            \
    s = NAME##_team(s, sh, L);                                                                   \
    if (lid == 0) NAME##_final(out, o, s, nred, p);                                              \
}                                                                                                \
__kernel void NAME##_col(__global OUT_T* out,            /* (nout) */                            \
                         __global const T* x,            /* strided: lk over kept, lr over reduced dims */ \
                         Layout lk, Layout lr, uint nred, ACC p, uint nout) {                    \
    uint o = get_global_id(0);                                                                   \
    if (o >= nout) return;                                                                       \
    uint base = layout_offsets(&lk, o).x;                                                        \
    NAME##_st s = NAME##_init();                                                                 \
    if (lr.ndim <= 1) {                                                                          \
        uint st = lr.ndim == 1 ? lr.stride[0][0] : 0;                                            \
        for (uint r = 0; r < nred; ++r) s = NAME##_accum(s, LOAD(x, base + r * st), r);          \
    } else {                                                                                     \
        for (uint r = 0; r < nred; ++r)                                                          \
            s = NAME##_accum(s, LOAD(x, base + layout_offsets(&lr, r).x), r);                    \
    }                                                                                            \
    NAME##_final(out, o, s, nred, p);                                                            \
}

REDUCE_KERNELS(sum, T)
REDUCE_KERNELS(max, T)
REDUCE_KERNELS(min, T)
REDUCE_KERNELS(argmax, int)
REDUCE_KERNELS(argmin, int)
#ifdef RED_FLOAT
REDUCE_KERNELS(mean, T)
REDUCE_KERNELS(var, T)
REDUCE_KERNELS(logsumexp, T)
#endif
