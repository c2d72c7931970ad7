// softmax.cl: softmax, log_softmax and fused cross-entropy (forward, mean, backward) over rows of strided views.
//
// Rows are reduced with an online (max, sum of exp(x - max)) state: one read pass for the statistics,
// one read-and-write pass for the output. Fixed reduction order: results are bit-reproducible.

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

// Tree merge of every work-item's state in local memory (power-of-two work-groups).
inline ms_t ms_group(ms_t s, __local ACC* shm, __local ACC* shs) {
    uint lid = get_local_id(0);
    shm[lid] = s.m;
    shs[lid] = s.s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint k = get_local_size(0) / 2; k > 0; k >>= 1) {
        if (lid < k) {
            ms_t a, b;
            a.m = shm[lid]; a.s = shs[lid];
            b.m = shm[lid + k]; b.s = shs[lid + k];
            a = ms_join(a, b);
            shm[lid] = a.m; shs[lid] = a.s;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    ms_t r;
    r.m = shm[0]; r.s = shs[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline ACC sm_value(ACC x, ms_t st, int log_out) {
    return log_out ? (x - st.m) - log(st.s) : exp(x - st.m) / st.s;
}

// One work-group per row. Row o starts at layout_offsets(lk, o): .x in x, .y in out.
__kernel void softmax_wg(__global T* out,        /* contiguous, row elements os apart */
                         __global const T* x,    /* strided, row elements xs apart */
                         Layout lk, uint n, uint xs, uint os, int log_out) {
    __local ACC shm[SM_GROUP], shs[SM_GROUP];
    uint o = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint3 base = layout_offsets(&lk, o);
    ms_t s = ms_empty();
    for (uint j = lid; j < n; j += L) s = ms_add(s, LOAD(x, base.x + j * xs));
    s = ms_group(s, shm, shs);
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

// Per-row cross-entropy from logits and integer targets, one work-group per row:
// lse = logsumexp(row), loss = lse - x[target]; 0 for ignored rows, NaN for a target outside [0, C).
__kernel void cross_entropy_fwd(__global ACC* loss,        /* (N) */
                                __global ACC* lse,         /* (N) */
                                __global const T* x,       /* (N, C): element (i, j) at xoff + i*xr + j*xc */
                                __global const int* tgt,   /* (N): element i at toff + i*ts */
                                uint C, uint xoff, uint xr, uint xc, uint toff, uint ts,
                                int use_ignore, int ignore) {
    __local ACC shm[SM_GROUP], shs[SM_GROUP];
    uint i = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    uint row = xoff + i * xr;
    ms_t s = ms_empty();
    for (uint j = lid; j < C; j += L) s = ms_add(s, LOAD(x, row + j * xc));
    s = ms_group(s, shm, shs);
    if (lid == 0) {
        ACC l = s.m + log(s.s);
        int t = tgt[toff + i * ts];
        ACC v;
        if (use_ignore && t == ignore) v = 0;
        else if (t < 0 || (uint)t >= C) v = (ACC)NAN;
        else v = l - LOAD(x, row + (uint)t * xc);
        loss[i] = v;
        lse[i] = l;
    }
}

// Mean of the per-row losses over rows that are not ignored, and that count; one work-group.
__kernel void cross_entropy_mean(__global ACC* mean,       /* (1) */
                                 __global ACC* count,      /* (1) */
                                 __global const ACC* loss, /* (N) */
                                 __global const int* tgt,  /* (N): element i at toff + i*ts */
                                 uint N, uint toff, uint ts, int use_ignore, int ignore) {
    __local ACC shm[SM_GROUP], shs[SM_GROUP];
    uint lid = get_local_id(0), L = get_local_size(0);
    ACC sum = 0, cnt = 0;
    for (uint i = lid; i < N; i += L) {
        if (!(use_ignore && tgt[toff + i * ts] == ignore)) { sum += loss[i]; cnt += (ACC)1; }
    }
    shm[lid] = sum;
    shs[lid] = cnt;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint k = L / 2; k > 0; k >>= 1) {
        if (lid < k) { shm[lid] += shm[lid + k]; shs[lid] += shs[lid + k]; }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) { mean[0] = shm[0] / shs[0]; count[0] = shs[0]; }
}

// dlogits = (softmax(x) - onehot(target)) * grad[i] / count, one work-item per element; 0 for
// ignored rows, NaN for rows whose target is outside [0, C).
__kernel void cross_entropy_bwd(__global T* dx,            /* (N, C) contiguous */
                                __global const T* x,       /* (N, C): element (i, j) at xoff + i*xr + j*xc */
                                __global const int* tgt,   /* (N): element i at toff + i*ts */
                                __global const ACC* lse,   /* (N): element i at loff + i*ls */
                                __global const ACC* grad,  /* element i at goff + i*gs (gs 0 broadcasts) */
                                __global const ACC* count, /* (1) at coff, when use_count */
                                uint C, uint xoff, uint xr, uint xc, uint toff, uint ts, uint loff, uint ls,
                                uint goff, uint gs, uint coff, int use_count, int use_ignore, int ignore, uint n) {
    uint k = get_global_id(0);
    if (k >= n) return;
    uint i = k / C, j = k % C;
    int t = tgt[toff + i * ts];
    ACC d;
    if (use_ignore && t == ignore) d = 0;
    else if (t < 0 || (uint)t >= C) d = (ACC)NAN;
    else {
        ACC g = grad[goff + i * gs];
        if (use_count) g = g / count[coff];
        ACC p = exp(LOAD(x, xoff + i * xr + j * xc) - lse[loff + i * ls]);
        d = (p - (j == (uint)t ? (ACC)1 : (ACC)0)) * g;
    }
    STORE(dx, k, d);
}
