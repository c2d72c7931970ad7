// decode.cl: one-token decoding of a Llama-style model: a GEMV over up to three weight matrices with the input's RMSNorm fused in and an epilogue (residual add, SwiGLU, or RoPE with the KV-cache write), and attention of one query per batch row over the cache.
//
// A decode step reads every weight once and does little else, so what it costs is kernel launches:
// with these two kernels a Llama layer takes five (norm+QKV+RoPE+cache, attention, wo+residual,
// norm+w1/w3+SwiGLU, w2+residual); decode_block.cl runs the same tiles as stages of one launch.

#if !defined(DT_I32) && !defined(DT_U32)  // float dtypes only (decode/mod.rs rejects the others)

#define GEMV_GROUP 256 // work-items per work-group: teams of `team` (32..256) work-items, one unit each
#define GEMV_MAXB 4    // batch rows per work-group (grid dim 1 covers the others)

#define EPI_PLAIN 0    // unit u: rows 2u, 2u + 1 of w0; y[b, r] = dot (+ res[b, r])
#define EPI_SWIGLU 1   // unit u: row u of w0 and of w1; y[b, u] = silu(dot0) * dot1
#define EPI_QKV 2      // unit u: a RoPE pair of q (w0) or k (w1) rows, or two rows of v (w2)

// The sizes and switches of a decode_gemv launch (decode/opencl.rs: GemvArgs), one argument.
typedef struct {
    uint K, B, n0, n1;         // x (B, K); w0 (n0, K); w1 (n1, K)
    uint units, mode, team;    // units in the grid; EPI_*; work-items per unit
    uint has_norm, has_res;
    uint hd, smax;             // QKV: head dim, cache length
    uint has_pads, halves, use_table;
    int code;                  // QKV: op code for the error record
    uint w_off[3];             // element offsets of w0, w1, w2
    uint has_bias;             // bias added to the products (PLAIN: n0; SWIGLU: 2 n0; QKV: n0 + n1 + n2)
} GemvArgs;

// The cache position of this step's token, read from the device (so a replayed step needs no new
// arguments): pos[0] when in [0, smax), else reported in the error record and -1.
inline int decode_position(__global const int* pos, uint smax, __global int* err, int code) {
    int at = pos[0];
    if (at >= 0 && (uint)at < smax) return at;
    report_index(err, code, 0, at, smax);  // the first report is kept
    return -1;
}

// The two rows of unit u: matrix (0..2) and row of each; *second is 0 when the unit has one row.
inline void gemv_rows(uint u, uint mode, uint n0, uint n1, uint hd, uint halves,
                      uint* m, uint* r0, uint* r1, uint* second) {
    *second = 1;
    if (mode == EPI_PLAIN) {
        *m = 0; *r0 = 2 * u; *r1 = 2 * u + 1; *second = (2 * u + 1 < n0);
        if (!*second) *r1 = *r0;
    } else if (mode == EPI_SWIGLU) {
        *m = 0; *r0 = u; *r1 = u;  // row u of w0 and row u of w1
    } else {
        uint pairs = hd / 2, p = u;
        *m = 0;
        if (p >= n0 / 2) { p -= n0 / 2; *m = 1; }
        if (*m == 1 && p >= n1 / 2) { p -= n1 / 2; *m = 2; }
        uint head = p / pairs, i = p % pairs;
        uint e0 = (halves && *m < 2) ? i : 2 * i;
        uint e1 = (halves && *m < 2) ? i + pairs : 2 * i + 1;
        *r0 = head * hd + e0; *r1 = head * hd + e1;
    }
}

// y = epilogue(W · rmsnorm(x)) for B rows of x: GEMV_GROUP / team units per work-group, a team of
// `team` work-items per unit reading the unit's two weight rows once for up to GEMV_MAXB batch rows
// (the host picks `team` so that each work-item makes about four vector loads per row: enough
// loads in flight to keep the memory busy). The RMSNorm's sum of squares comes from the same
// loads of x: y = (W · (x * g)) * rstd. Team sums: a tree in local memory, in a fixed order.
#define GEMV_ARGS_DECL                                                                             \
    __global T *y, __global const T *x, __global const T *g, __global const T *w0,               \
        __global const T *w1, __global const T *w2, __global const T *res, __global const T *bias, \
        __global T *kc, __global T *vc, __global const int *pads, __global const ACC *inv_freq,    \
        __global const int *step, __global int *err, GemvArgs a, ACC eps, ACC theta
#define GEMV_ARGS y, x, g, w0, w1, w2, res, bias, kc, vc, pads, inv_freq, step, err, a, eps, theta
#define GEMV_LOCAL (3 * GEMV_MAXB * GEMV_GROUP)  // ACC elements of local memory a tile uses

// The RMSNorm's factor for a row whose sum of squares over K is sq (1 without a norm).
inline ACC gemv_rstd(ACC sq, GemvArgs a, ACC eps) {
    return a.has_norm ? (ACC)1 / sqrt(sq / (ACC)a.K + eps) : (ACC)1;
}

// Unit u's epilogue for batch row `row`: its two dots v0, v1 (over x * g where has_norm) times
// the row's norm factor rs, biased and stored as the mode says.
inline void gemv_store(uint u, uint row, ACC v0, ACC v1, ACC rs, GEMV_ARGS_DECL) {
    uint m = 0, r0 = 0, r1 = 0, second = 0, n0 = a.n0, n1 = a.n1, hd = a.hd, mode = a.mode;
    gemv_rows(u, mode, n0, n1, hd, a.halves, &m, &r0, &r1, &second);
    v0 *= rs;
    v1 *= rs;
    if (a.has_bias) {
        // Row r0 of matrix m and row r1 of matrix m (SwiGLU: of w1), in the joined biases.
        uint off0 = m == 0 ? 0u : (m == 1 ? n0 : n0 + n1);
        uint off1 = mode == EPI_SWIGLU ? n0 : off0;
        v0 += LOAD(bias, off0 + r0);
        v1 += LOAD(bias, off1 + r1);
    }
    if (mode == EPI_PLAIN) {
        size_t o = (size_t)row * n0;
        STORE(y, o + r0, v0 + (a.has_res ? LOAD(res, o + r0) : (ACC)0));
        if (second) STORE(y, o + r1, v1 + (a.has_res ? LOAD(res, o + r1) : (ACC)0));
    } else if (mode == EPI_SWIGLU) {
        STORE(y, (size_t)row * n0 + r0, v0 / ((ACC)1 + exp(-v0)) * v1);
    } else {
        int at = decode_position(step, a.smax, err, a.code);
        if (at < 0) return;
        uint pairs = hd / 2;
        if (m < 2) {
            // RoPE as rope.cl computes it: a = pos * inv_freq, or pos / theta^(2i / hd).
            uint i = (a.halves ? r0 : r0 / 2) % pairs;
            uint pos = (uint)at - (a.has_pads ? (uint)pads[row] : 0u);
            ACC freq = a.use_table ? inv_freq[i] : (ACC)1 / pow(theta, (ACC)(2 * i) / (ACC)(2 * pairs));
            ACC angle = (ACC)pos * freq;
            ACC cs = cos(angle), sn = sin(angle);
            ACC x0 = v0, x1 = v1;
            v0 = x0 * cs - x1 * sn;
            v1 = x0 * sn + x1 * cs;
        }
        if (m == 0) {
            STORE(y, (size_t)row * n0 + r0, v0);
            STORE(y, (size_t)row * n0 + r1, v1);
        } else {
            // (head, position at) of this row's cache: heads = n1 / hd (keys and values alike).
            uint head = r0 / hd;
            size_t o = (((size_t)row * (n1 / hd) + head) * a.smax + (uint)at) * hd;
            __global T* cache = m == 1 ? kc : vc;
            STORE(cache, o + r0 % hd, v0);
            STORE(cache, o + r1 % hd, v1);
        }
    }
}

// Tile (g0, g1) of decode_gemv: its work-group g0 of grid dim 0 and batch group g1.
inline void gemv_tile(uint g0, uint g1, __local ACC* part, GEMV_ARGS_DECL) {
    uint K = a.K, B = a.B, n0 = a.n0, n1 = a.n1, units = a.units, team = a.team, hd = a.hd;
    uint mode = a.mode, halves = a.halves, has_norm = a.has_norm;
    uint lid = get_local_id(0), t = lid % team, base = lid - t;
    uint u = (g0 * GEMV_GROUP + lid) / team;
    uint b0 = g1 * GEMV_MAXB;
    uint nb = min((uint)GEMV_MAXB, B - b0);
    uint m = 0, r0 = 0, r1 = 0, second = 0;
    bool active = u < units;
    if (active) gemv_rows(u, mode, n0, n1, hd, halves, &m, &r0, &r1, &second);
    w0 += a.w_off[0]; w1 += a.w_off[1]; w2 += a.w_off[2];
    __global const T* w = m == 0 ? w0 : (m == 1 ? w1 : w2);
    __global const T* wa = w + (size_t)r0 * K;
    __global const T* wb = (mode == EPI_SWIGLU ? w1 : w) + (size_t)r1 * K;
    ACC d0[GEMV_MAXB], d1[GEMV_MAXB], ss[GEMV_MAXB];
    for (uint b = 0; b < GEMV_MAXB; b++) { d0[b] = 0; d1[b] = 0; ss[b] = 0; }
    if (active && (K & 3) == 0) {
        __global const T* xb = x + (size_t)b0 * K;
        #pragma unroll 4
        for (uint k = t; k < K / 4; k += team) {
            ACC4 wr = LOAD4(wa, k), c = LOAD4(wb, k);
            ACC4 s = has_norm ? LOAD4(g, k) : (ACC4)((ACC)1);
            for (uint b = 0; b < GEMV_MAXB; b++) {
                if (b < nb) {
                    ACC4 v = LOAD4(xb + b * K, k);
                    ss[b] += dot(v, v);
                    v *= s;
                    d0[b] += dot(wr, v);
                    d1[b] += dot(c, v);
                }
            }
        }
    } else if (active) {
        for (uint k = t; k < K; k += team) {
            ACC wr = LOAD(wa, k), c = LOAD(wb, k);
            ACC s = has_norm ? LOAD(g, k) : (ACC)1;
            for (uint b = 0; b < GEMV_MAXB; b++) {
                if (b < nb) {
                    ACC v = LOAD(x, (b0 + b) * K + k);
                    ss[b] += v * v;
                    v *= s;
                    d0[b] += wr * v;
                    d1[b] += c * v;
                }
            }
        }
    }
    for (uint b = 0; b < GEMV_MAXB; b++) {
        part[(3 * b) * GEMV_GROUP + lid] = d0[b];
        part[(3 * b + 1) * GEMV_GROUP + lid] = d1[b];
        part[(3 * b + 2) * GEMV_GROUP + lid] = ss[b];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint off = team / 2; off > 0; off >>= 1) {
        if (t < off)
            for (uint j = 0; j < 3 * nb; j++) part[j * GEMV_GROUP + lid] += part[j * GEMV_GROUP + lid + off];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (!active || t >= nb) return;
    // Work-item t of the team finishes batch row b0 + t.
    uint b = t;
    ACC rs = gemv_rstd(part[(3 * b + 2) * GEMV_GROUP + base], a, eps);
    gemv_store(u, b0 + b, part[(3 * b) * GEMV_GROUP + base], part[(3 * b + 1) * GEMV_GROUP + base],
               rs, GEMV_ARGS);
}

__kernel __attribute__((reqd_work_group_size(GEMV_GROUP, 1, 1)))
void decode_gemv(__global T* y,               /* PLAIN, SWIGLU: (B, n0 or N); QKV: (B, n0) rotated queries */
                 __global const T* x,         /* (B, K) */
                 __global const T* g,         /* (K) RMSNorm weight, read when has_norm */
                 __global const T* w0,        /* (n0, K) */
                 __global const T* w1,        /* (n1, K): SWIGLU's up rows, QKV's key rows */
                 __global const T* w2,        /* (n2, K): QKV's value rows */
                 __global const T* res,       /* (B, n0) added in PLAIN when has_res */
                 __global const T* bias,      /* (n0 [+ n1 [+ n2]]) biases of w0, w1, w2 in turn (has_bias) */
                 __global T* kc,              /* QKV: (B, n1 / hd, smax, hd) key cache, written at position at */
                 __global T* vc,              /* QKV: (B, n2 / hd, smax, hd) value cache, written at position at */
                 __global const int* pads,    /* (B) left padding: row b's RoPE position is at - pads[b] (has_pads) */
                 __global const ACC* inv_freq,/* (hd / 2) pair frequencies when use_table */
                 __global const int* step,    /* QKV: (1) the cache position written */
                 __global int* err,           /* QKV: (4) the device's error record */
                 GemvArgs a, ACC eps, ACC theta) {
    __local ACC part[GEMV_LOCAL];
    gemv_tile(get_group_id(0), get_group_id(1), part, GEMV_ARGS);
}

#if (defined(TC_BF16) && defined(DT_BF16)) || (defined(TC_F16) && defined(DT_F16))
// Batches of more than GEMV_MAXB rows on tensor cores (mma.sync; only where the host's probe
// passed): decode_gemv's work-groups each read every weight for their 4 rows, this reads each
// weight once for 32 rows. The rows' sums of squares come first; x * g * rstd, rounded to the
// 16-bit format (as the composed norm rounds its output), is then staged a chunk of K at a time;
// each warp multiplies 8 units' 16 weight rows, loaded 16 bytes a work-item straight into B
// fragments, by the chunk's two 16-row tiles; gemv_store finishes.
// -DGT_KSPLIT=4 (where few work-groups would fill the device): the warps of a work-group share 8
// units and take every fourth 32-K group each, their sums added in warp order at the end.
#define GT_WARPS 4             // warps of a work-group
#ifndef GT_KSPLIT
#define GT_KSPLIT 1            // warps sharing a unit's K (1, 2 or 4)
#endif
#define GT_UNITS (8 * GT_WARPS / GT_KSPLIT) // units of a work-group: 8 a warp (one mma n tile)
#define GT_KG (GT_KC / 32 / GT_KSPLIT)      // 32-K groups of a chunk a warp takes
#define GT_ROWS 32             // batch rows of a work-group: two 16-row mma tiles
#define GT_KC 256              // K of a staged chunk
#define GT_XW (GT_KC / 2 + 4)  // words a staged row takes (padded: ldmatrix's 8 rows on distinct banks)

// The staged word of the chunk's K pair p: a work-item's 16-byte weight load holds K 8t .. 8t + 7
// of a 32-K group, which mma's m16n8k16 B fragment of lane (g, t) wants as K 2t, 2t + 1 and
// 2t + 8, 2t + 9 of two k16 steps: the input is staged in that order (a permutation of K that
// both operands share).
inline uint gt_word(uint p) {
    uint c = p / 16, t = (p % 16) / 4, r = p % 4;  // 32-K group, loading work-item, pair of its 4
    return c * 16 + (r / 2) * 8 + (r % 2) * 4 + t;
}

// A word's two 16-bit values as f32 (low half first).
inline float2 gt_unpack2(uint w) {
#ifdef TC_BF16
    return (float2)(as_float(w << 16), as_float(w & 0xffff0000u));
#else
    float lo, hi;
    __asm__("{.reg .b16 lo16, hi16; mov.b32 {lo16, hi16}, %2; cvt.f32.f16 %0, lo16; cvt.f32.f16 %1, hi16;}"
            : "=f"(lo), "=f"(hi)
            : "r"(w));
    return (float2)(lo, hi);
#endif
}

// The sum of squares of 8 16-bit values.
inline float gt_sq8(uint4 w) {
    float2 a = gt_unpack2(w.x), b = gt_unpack2(w.y), c = gt_unpack2(w.z), d = gt_unpack2(w.w);
    return ((dot(a, a) + dot(b, b)) + dot(c, c)) + dot(d, d);
}

// A word of x times the norm factor s (and the word of g where has_norm), rounded back.
inline uint gt_scale2(uint xw, uint gw, float s, uint has_norm) {
    float2 v = gt_unpack2(xw) * s;
    if (has_norm) v *= gt_unpack2(gw);
    return pack2(v.x, v.y);
}

#define GT_XV (GT_KC / 32)  // uint4 of a chunk a work-item stages
// The staging work-item's GT_XV uint4 of x (and g) for the chunk at K k0 (zeros past K).
#define GT_LOAD_INPUT(k0)                                                  \
    _Pragma("unroll") for (uint i = 0; i < GT_XV; ++i) {                   \
        uint j = (k0) / 8 + sq4 + 4 * i;                                   \
        bool in = j < K / 8;                                               \
        xv[i] = in && srow_in ? xr[j] : (uint4)(0);                        \
        gv[i] = in && a.has_norm ? g4[j] : (uint4)(0);                     \
    }

__kernel __attribute__((reqd_work_group_size(32 * GT_WARPS, 1, 1)))
void decode_gemv_tc(__global T* y,               /* PLAIN, SWIGLU: (B, n0); QKV: (B, n0) rotated queries */
                    __global const T* x,         /* (B, K), K a multiple of 32 */
                    __global const T* g,         /* (K) RMSNorm weight, read when has_norm */
                    __global const T* w0,        /* (n0, K), each row 16-byte aligned */
                    __global const T* w1,        /* (n1, K): SWIGLU's up rows, QKV's key rows */
                    __global const T* w2,        /* (n2, K): QKV's value rows */
                    __global const T* res,       /* (B, n0) added in PLAIN when has_res */
                    __global const T* bias,      /* (n0 [+ n1 [+ n2]]) biases (has_bias) */
                    __global T* kc,              /* QKV: (B, n1 / hd, smax, hd) key cache */
                    __global T* vc,              /* QKV: (B, n2 / hd, smax, hd) value cache */
                    __global const int* pads,    /* (B) left padding (has_pads) */
                    __global const ACC* inv_freq,/* (hd / 2) pair frequencies when use_table */
                    __global const int* step,    /* QKV: (1) the cache position written */
                    __global int* err,           /* QKV: (4) the device's error record */
                    GemvArgs a, ACC eps, ACC theta) {
    // The chunk: (GT_ROWS, GT_KC) 16-bit, K permuted (gt_word); ldmatrix rows 16-byte aligned.
    __local uint xs[GT_ROWS * GT_XW] __attribute__((aligned(16)));
    __local ACC ssp[32 * GT_WARPS];     // sums of squares: row lid / 4, a quarter of K each
    uint K = a.K, B = a.B, units = a.units, mode = a.mode;
    uint lid = get_local_id(0), warp = lid / 32, lane = lid % 32, gq = lane / 4, t = lane % 4;
    uint kw = warp % GT_KSPLIT;  // this warp's share of K: groups kw, kw + GT_KSPLIT, ...
    uint ugs = (units + GT_UNITS - 1) / GT_UNITS, wg = get_group_id(0);
    uint u0 = (wg % ugs) * GT_UNITS + (warp / GT_KSPLIT) * 8, b0 = (wg / ugs) * GT_ROWS;
    // This work-item's B-fragment rows: unit u0 + gq's two weight rows.
    uint u = u0 + gq, m = 0, r0 = 0, r1 = 0, second = 0;
    bool active = u < units;
    if (active) gemv_rows(u, mode, a.n0, a.n1, a.hd, a.halves, &m, &r0, &r1, &second);
    __global const T* wm = m == 0 ? w0 + a.w_off[0] : (m == 1 ? w1 + a.w_off[1] : w2 + a.w_off[2]);
    __global const uint4* wa = (__global const uint4*)(wm + (size_t)r0 * K);
    __global const uint4* wb =
        (__global const uint4*)((mode == EPI_SWIGLU ? w1 + a.w_off[1] : wm) + (size_t)r1 * K);
    // The staging rows: work-item lid stages row lid / 4's 8 K (lid % 4 + 4 i) * 8 .. + 7 of a
    // chunk, i < GT_XV (32-K group i as loading work-item lid % 4), loaded a chunk ahead.
    uint srow = lid / 4, sq4 = lid % 4;
    bool srow_in = b0 + srow < B;
    __global const uint4* xr = (__global const uint4*)(x + (size_t)(srow_in ? b0 + srow : 0) * K);
    __global const uint4* g4 = (__global const uint4*)g;
    ACC ssq = 0;
    if (a.has_norm && srow_in) {
        uint n = K / 32, q = 0;  // uint4 this work-item sums, four loads in flight at a time
        for (; q + 4 <= n; q += 4) {
            uint4 v0 = xr[sq4 + 4 * q], v1 = xr[sq4 + 4 * q + 4], v2 = xr[sq4 + 4 * q + 8],
                  v3 = xr[sq4 + 4 * q + 12];
            ssq += ((gt_sq8(v0) + gt_sq8(v1)) + gt_sq8(v2)) + gt_sq8(v3);
        }
        for (; q < n; ++q) ssq += gt_sq8(xr[sq4 + 4 * q]);
    }
    ssp[lid] = ssq;
    uint4 xv[GT_XV], gv[GT_XV];
    __local uint* srow_xs = xs + srow * GT_XW;  // this work-item's staged row
    GT_LOAD_INPUT(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    // The staged row's norm factor.
    ACC srs = gemv_rstd(((ssp[4 * srow] + ssp[4 * srow + 1]) + ssp[4 * srow + 2]) + ssp[4 * srow + 3], a, eps);
    float acc[2][2][4];  // (m tile, n tile: r0 or r1 rows, fragment)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i / 8][(i / 4) % 2][i % 4] = 0.0f;
    for (uint k0 = 0; k0 < K; k0 += GT_KC) {
        uint groups = min((uint)GT_KC, K - k0) / 32;
        // The chunk's weights first: their loads are in flight while the input is staged.
        uint4 wq[GT_KG][2];
#pragma unroll
        for (uint cc = 0; cc < GT_KG; ++cc) {
            uint c = cc * GT_KSPLIT + kw;
            bool in = active && c < groups;
            wq[cc][0] = in ? wa[(k0 + 32 * c) / 8 + t] : (uint4)(0);
            wq[cc][1] = in ? wb[(k0 + 32 * c) / 8 + t] : (uint4)(0);
        }
        // x * rstd * g rounded to 16 bits; the words in gt_word's order.
#pragma unroll
        for (uint i = 0; i < GT_XV; ++i) {
            uint p = 4 * (sq4 + 4 * i);  // the chunk's K pair of the uint4's first word
            srow_xs[gt_word(p)] = gt_scale2(xv[i].x, gv[i].x, srs, a.has_norm);
            srow_xs[gt_word(p + 1)] = gt_scale2(xv[i].y, gv[i].y, srs, a.has_norm);
            srow_xs[gt_word(p + 2)] = gt_scale2(xv[i].z, gv[i].z, srs, a.has_norm);
            srow_xs[gt_word(p + 3)] = gt_scale2(xv[i].w, gv[i].w, srs, a.has_norm);
        }
        GT_LOAD_INPUT(k0 + GT_KC);  // the next chunk's input, in flight during this one's products
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (uint cc = 0; cc < GT_KG; ++cc) {
            uint c = cc * GT_KSPLIT + kw;
            if (c < groups) {
#pragma unroll
                for (uint s = 0; s < 2; ++s) {
                    uint af[2][4];
#pragma unroll
                    for (uint mt = 0; mt < 2; ++mt)
                        LDMATRIX_X4(af[mt], &xs[(mt * 16 + lane % 16) * GT_XW + (2 * c + s) * 8 + (lane / 16) * 4]);
                    uint a0 = s ? wq[cc][0].z : wq[cc][0].x, a1 = s ? wq[cc][0].w : wq[cc][0].y;
                    uint b0_ = s ? wq[cc][1].z : wq[cc][1].x, b1_ = s ? wq[cc][1].w : wq[cc][1].y;
#pragma unroll
                    for (uint mt = 0; mt < 2; ++mt) {
                        MMA(acc[mt][0], af[mt], a0, a1);
                        MMA(acc[mt][1], af[mt], b0_, b1_);
                    }
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // every warp is done with the chunk
    }
#if GT_KSPLIT > 1
    // The other warps' sums through the chunk's memory (free after the last barrier), added to
    // the first warp's of each unit group in warp order.
    if (kw != 0) {
#pragma unroll
        for (int i = 0; i < 16; ++i) xs[i * 32 * GT_WARPS + lid] = as_uint(acc[i / 8][(i / 4) % 2][i % 4]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (kw != 0) return;
    for (uint w = 1; w < GT_KSPLIT; ++w) {
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[i / 8][(i / 4) % 2][i % 4] += as_float(xs[i * 32 * GT_WARPS + lid + 32 * w]);
    }
#endif
    // Fragment (mt, hi, j): batch row mt * 16 + gq + 8 hi, unit u0 + 2t + j.
#pragma unroll
    for (uint mt = 0; mt < 2; ++mt)
#pragma unroll
        for (uint hi = 0; hi < 2; ++hi) {
            uint r = mt * 16 + gq + 8 * hi;  // normalised in staging
#pragma unroll
            for (uint j = 0; j < 2; ++j) {
                uint uj = u0 + 2 * t + j;
                if (uj < units && b0 + r < B)
                    gemv_store(uj, b0 + r, acc[mt][0][2 * hi + j], acc[mt][1][2 * hi + j], (ACC)1,
                               GEMV_ARGS);
            }
        }
}
#endif

#define ATT_GROUP 256
#define ATT_MAX_HD 256

// One query per (batch row, head) over keys pads[b] .. pos[0] of the cache: one work-group each.
// Keys are scored a chunk of ATT_GROUP at a time (one per work-item); then groups of hd / 4
// work-items (hd when hd is not a multiple of 4) each take every group-th key of the chunk and
// accumulate four dims of its value row per work-item (online softmax across chunks); the
// groups' sums are added at the end in group order.
#define ATT_ARGS_DECL                                                                        \
    __global T *o, __global const T *q, __global const T *kc, __global const T *vc,         \
        __global const int *pads, __global const int *step, __global int *err, const uint *a, \
        ACC scale
#define ATT_PART_STRIDE(hd) (((hd) + 2 + 31) / 32 * 32)  // ACC words of a split's record, whole lines
#define ATT_LOCAL (7 * ATT_GROUP + ATT_MAX_HD)  // ACC elements of local memory a tile uses

// Tile `wg` (batch row wg / H, head wg % H) of decode_attention; `a`: its eight sizes. With
// nsplit > 1 the tile takes split `split` of the row's keys (nsplit about equal parts) and writes
// its running max, sum and unnormalized values into its record of `part` instead of o. A tile
// with `active` 0 passes the same barriers and writes nothing.
inline void attention_tile(uint wg, uint split, uint nsplit, bool active, __global ACC* part,
                           __local ACC* lm, ATT_ARGS_DECL) {
    uint H = a[0], Hkv = a[1], hd = a[2], smax = a[3], has_pads = a[4];
    int at = decode_position(step, smax, err, (int)a[5]);
    uint len = at < 0 ? 0u : (uint)at + 1;
    __local ACC4* sums = (__local ACC4*)lm;  // (ATT_GROUP)
    __local ACC* p = lm + 4 * ATT_GROUP;     // (ATT_GROUP)
    __local ACC* red = p + ATT_GROUP;        // (ATT_GROUP)
    __local ACC* ls = red + ATT_GROUP;       // (ATT_GROUP)
    __local ACC* qs = ls + ATT_GROUP;        // (ATT_MAX_HD)
    uint lid = get_local_id(0);
    uint b = wg / H, h = wg % H, kvh = h / (H / Hkv);
    uint start = has_pads ? (uint)pads[b] : 0u;
    uint window = a[6];  // sliding window: only keys len - window .. len - 1
    if (window && len > window) start = max(start, len - window);
    if (nsplit > 1 && start < len) {
        uint each = (len - start + nsplit - 1) / nsplit;
        start = min(len, start + split * each);
        len = min(len, start + each);
    }
    if (!active) start = len;
    size_t head = ((size_t)b * Hkv + kvh) * smax * hd;
    __global const T* kh = kc + head;
    __global const T* vh = vc + head;
    for (uint d = lid; d < hd; d += ATT_GROUP) qs[d] = LOAD(q, ((size_t)b * H + h) * hd + d) * scale;
    bool vec = (hd & 3) == 0;
    uint per_row = vec ? hd / 4 : hd;
    uint groups = ATT_GROUP / per_row, grp = lid / per_row, col = lid % per_row;
    bool out = grp < groups;
    ACC mx = -INFINITY, l = 0;
    ACC4 acc = (ACC4)((ACC)0);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint c0 = start; c0 < len; c0 += ATT_GROUP) {
        uint j = c0 + lid;
        ACC s = -INFINITY;
        if (j < len) {
            s = 0;
            __global const T* kr = kh + (size_t)j * hd;
            if (vec) {
                #pragma unroll 16
                for (uint d = 0; d < hd / 4; d++) {
                    ACC4 kv = LOAD4(kr, d);
                    s += qs[4 * d] * kv.x + qs[4 * d + 1] * kv.y + qs[4 * d + 2] * kv.z + qs[4 * d + 3] * kv.w;
                }
            } else {
                for (uint d = 0; d < hd; d++) s += qs[d] * LOAD(kr, d);
            }
        }
        red[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint off = ATT_GROUP / 2; off > 0; off >>= 1) {
            if (lid < off) red[lid] = fmax(red[lid], red[lid + off]);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        ACC mn = fmax(mx, red[0]);  // finite: key c0 < len is in the chunk
        ACC alpha = exp(mx - mn);
        p[lid] = exp(s - mn);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (out) {
            l *= alpha;
            acc *= alpha;
            uint n = min((uint)ATT_GROUP, len - c0);
            #pragma unroll 8
            for (uint jj = grp; jj < n; jj += groups) {
                ACC pj = p[jj];
                l += pj;
                __global const T* vr = vh + (size_t)(c0 + jj) * hd;
                if (vec) acc += pj * LOAD4(vr, col);
                else acc.x += pj * LOAD(vr, col);
            }
        }
        mx = mn;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    sums[lid] = acc;
    if (out && col == 0) ls[grp] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (grp != 0 || !active) return;
    ACC total = 0;
    ACC4 v = (ACC4)((ACC)0);
    for (uint gi = 0; gi < groups; gi++) {
        total += ls[gi];
        v += sums[gi * per_row + col];
    }
    if (nsplit > 1) {
        __global ACC* r = part + ((size_t)wg * nsplit + split) * ATT_PART_STRIDE(hd);
        if (col == 0) { r[0] = mx; r[1] = total; }
        uint w = vec ? 4 : 1;
        for (uint e = 0; e < w; e++) r[2 + col * w + e] = e == 0 ? v.x : (e == 1 ? v.y : (e == 2 ? v.z : v.w));
        return;
    }
    v = total > (ACC)0 ? v / total : (ACC4)((ACC)0);
    size_t oi = ((size_t)b * H + h) * hd;
    if (vec) STORE4(o + oi, col, v);
    else STORE(o, oi + col, v.x);
}

// Row and head wg's output from its nsplit records: each split's sums rescaled to the largest max.
// Read through volatile pointers: other work-groups wrote them during this launch.
inline void attention_combine(uint wg, uint nsplit, uint hd, __global const ACC* part, __global T* o) {
    __global const volatile ACC* r = part + (size_t)wg * nsplit * ATT_PART_STRIDE(hd);
    for (uint d = get_local_id(0); d < hd; d += ATT_GROUP) {
        ACC m = -INFINITY, total = 0, v = 0;
        for (uint c = 0; c < nsplit; c++) m = fmax(m, r[c * ATT_PART_STRIDE(hd)]);
        for (uint c = 0; c < nsplit; c++) {
            __global const volatile ACC* rc = r + c * ATT_PART_STRIDE(hd);
            ACC mc = rc[0];
            if (mc == -INFINITY) continue;  // a split without keys
            ACC w = exp(mc - m);
            total += w * rc[1];
            v += w * rc[2 + d];
        }
        STORE(o, (size_t)wg * hd + d, total > (ACC)0 ? v / total : (ACC)0);
    }
}

__kernel __attribute__((reqd_work_group_size(ATT_GROUP, 1, 1)))
void decode_attention(__global T* o,            /* (B, H * hd) */
                      __global const T* q,      /* (B, H * hd) */
                      __global const T* kc,     /* (B, Hkv, smax, hd) */
                      __global const T* vc,     /* (B, Hkv, smax, hd) */
                      __global const int* pads, /* (B) keys before pads[b] are hidden (has_pads) */
                      __global const int* step, /* (1) this token's position: keys 0..pos[0] */
                      __global int* err,        /* (4) the device's error record */
                      uint8 sizes,              /* H, Hkv, hd, smax, has_pads, error code, window (0: none) */
                      ACC scale) {
    __local ACC4 lm[ATT_LOCAL / 4];
    uint a[8] = {sizes.s0, sizes.s1, sizes.s2, sizes.s3, sizes.s4, sizes.s5, sizes.s6, sizes.s7};
    attention_tile(get_group_id(0), 0, 1, true, 0, (__local ACC*)lm, o, q, kc, vc, pads, step, err, a,
                   scale);
}

#endif
