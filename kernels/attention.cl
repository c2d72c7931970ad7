// attention.cl: fused scaled dot-product attention (online softmax, never materialising the scores): forward, backward dq (with delta), backward dk and dv; causal or not, grouped-query heads.
//
// Shapes: q (B, H, Tq, D), k and v (B, Hkv, Tk, D) at any element strides over (b, h, t) with
// unit stride over d; query head h reads key/value head h / (H / Hkv). o is written at the
// strides the geometry gives; dq (B, H, Tq, D) and dk, dv (B, Hkv, Tk, D) are stored t-major,
// as dense (B, T, H, D). lse and delta are ACC (B, H, Tq), contiguous. Causal: query i sees keys j <= i + offset (offset = Tk - Tq); a query
// that sees no key gets output 0, lse -inf and no gradient. A sliding window W (causal only) hides
// keys j <= i + offset - W as well: each query sees at most its last W keys (Mistral's window). Arithmetic in f32 (f64 for f64).
// Built with -DHEAD_DIM=D (a multiple of 4).

// Tile sizes come from the host (ops/src/flash_attention/opencl.rs), which sizes them to the local
// memory; the defaults here only let the file build on its own.
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define D4 (HEAD_DIM / 4)
#ifndef BQ
#define BQ 64  // queries per work-group of the forward and dq kernels (one per work-item)
#endif
#ifndef BK
#define BK 32  // keys per local tile of the forward and dq kernels
#endif
#ifndef BKV
#define BKV 32  // keys per work-group of the dk/dv kernel (one per work-item)
#endif
#ifndef BQT
#define BQT 32  // queries per local tile of the dk/dv kernel
#endif

typedef struct {
    uint batch, heads, kv_heads, tq, tk;
    uint causal;
    int offset;  // tk - tq
    uint q_off, q_sb, q_sh, q_st;  // element offset and strides over (b, h, t) of q
    uint k_off, k_sb, k_sh, k_st;
    uint v_off, v_sb, v_sh, v_st;
    uint o_off, o_sb, o_sh, o_st;  // o (forward), or do (backward)
    uint x_off, x_sb, x_sh, x_st;  // o in the backward
    int window;  // sliding window W of causal attention (0: none)
} AttnGeom;

// e^x of the softmax's probabilities: through exp2 in f32 (one multiply and the hardware's 2^x on
// NVIDIA, about 1e-6 relative error from the multiply's rounding), exp itself in f64.
#if defined(DT_F64)
#define EXPF(x) exp(x)
#else
#define EXPF(x) exp2((x) * M_LOG2E_F)
#endif

inline ACC4 load4(__global const T* p, uint at, uint c) {
#if defined(DT_F64) || defined(DT_F32)
    return vload4(c, p + at);
#else
    return (ACC4)(LOAD(p, at + 4 * c), LOAD(p, at + 4 * c + 1), LOAD(p, at + 4 * c + 2), LOAD(p, at + 4 * c + 3));
#endif
}

inline void store4(__global T* p, uint at, uint c, ACC4 v) {
#if defined(DT_F64) || defined(DT_F32)
    vstore4(v, c, p + at);
#else
    STORE(p, at + 4 * c, v.x);
    STORE(p, at + 4 * c + 1, v.y);
    STORE(p, at + 4 * c + 2, v.z);
    STORE(p, at + 4 * c + 3, v.w);
#endif
}

// Dot products accumulate four lanes apart (four independent fma chains), summed at the end.
inline ACC hsum(ACC4 a) { return (a.x + a.y) + (a.z + a.w); }

// Number of keys query i may see.
inline uint visible(const AttnGeom* g, uint i) {
    if (!g->causal) return g->tk;
    int last = (int)i + g->offset;  // last visible key
    return last < 0 ? 0u : min((uint)(last + 1), g->tk);
}

// The first key query i may see (0 without a window).
inline uint first_visible(const AttnGeom* g, uint i) {
    if (!g->window) return 0;
    int first = (int)i + g->offset - g->window + 1;
    return first < 0 ? 0u : (uint)first;
}

// The queries [0, end) that may see key j end before this (tq without a window).
inline uint queries_end(const AttnGeom* g, uint j) {
    if (!g->window) return g->tq;
    int end = (int)j - g->offset + g->window;
    return end < 0 ? 0u : min((uint)end, g->tq);
}

// Loads keys [j0, j0 + BK) of (b, hk) into ks and vs (zeros past tk), by the n work-items.
inline void load_kv_tile(__local ACC4 (*ks)[D4], __local ACC4 (*vs)[D4], __global const T* k,
                         __global const T* v, const AttnGeom* g, uint b, uint hk, uint j0,
                         uint lid, uint n) {
    for (uint e = lid; e < BK * D4; e += n) {
        uint jj = e / D4, c = e % D4, j = j0 + jj;
        ACC4 kv = (ACC4)(0), vv = (ACC4)(0);
        if (j < g->tk) {
            kv = load4(k, g->k_off + b * g->k_sb + hk * g->k_sh + j * g->k_st, c);
            vv = load4(v, g->v_off + b * g->v_sb + hk * g->v_sh + j * g->v_st, c);
        }
        ks[jj][c] = kv;
        vs[jj][c] = vv;
    }
}

// o: (B, H, Tq, D) at o_*; lse: (B, H, Tq); q, k, v as above. Groups: B * H * ceil(Tq / BQ), BQ items.
__kernel void attention_fwd(__global T* o, __global ACC* lse, __global const T* q,
                            __global const T* k, __global const T* v, AttnGeom g, ACC scale) {
    __local ACC4 ks[BK][D4];
    __local ACC4 vs[BK][D4];
    uint nqb = (g.tq + BQ - 1) / BQ;
    uint grp = get_group_id(0), qb = grp % nqb, bh = grp / nqb;
    uint h = bh % g.heads, b = bh / g.heads, hk = h / (g.heads / g.kv_heads);
    uint lid = get_local_id(0), i = qb * BQ + lid;
    bool active = i < g.tq;
    uint iq = min(i, g.tq - 1);
    uint qat = g.q_off + b * g.q_sb + h * g.q_sh + iq * g.q_st;
    ACC4 qr[D4], acc[D4];
    #pragma unroll
    for (uint c = 0; c < D4; c++) {
        qr[c] = load4(q, qat, c) * scale;
        acc[c] = (ACC4)(0);
    }
    ACC m = (-INFINITY), l = 0;
    uint mine = active ? visible(&g, i) : 0;
    uint lo = active ? first_visible(&g, i) : 0;
    uint kend = visible(&g, min(qb * BQ + BQ - 1, g.tq - 1));
    uint kstart = first_visible(&g, qb * BQ) / BK * BK;
    for (uint j0 = kstart; j0 < kend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_kv_tile(ks, vs, k, v, &g, b, hk, j0, lid, BQ);
        barrier(CLK_LOCAL_MEM_FENCE);
        uint jn = mine > j0 ? min((uint)BK, mine - j0) : 0;
        // Keys of the tile before this query's window (signed: Oclgrind lacks usub.sat).
        int skip = (int)lo - (int)j0;
        for (uint jj = skip < 0 ? 0u : (uint)skip; jj < jn; jj++) {
            ACC4 s4 = (ACC4)(0);
            #pragma unroll
            for (uint c = 0; c < D4; c++) s4 = fma(qr[c], ks[jj][c], s4);
            ACC s = hsum(s4);
            if (s > m) {
                ACC r = EXPF(m - s);
                l *= r;
                #pragma unroll
                for (uint c = 0; c < D4; c++) acc[c] *= r;
                m = s;
            }
            ACC p = EXPF(s - m);
            l += p;
            #pragma unroll
            for (uint c = 0; c < D4; c++) acc[c] = fma((ACC4)(p), vs[jj][c], acc[c]);
        }
    }
    if (!active) return;
    ACC inv = l > 0 ? 1 / l : 0;
    uint oat = g.o_off + b * g.o_sb + h * g.o_sh + i * g.o_st;
    #pragma unroll
    for (uint c = 0; c < D4; c++) store4(o, oat, c, acc[c] * inv);
    lse[bh * g.tq + i] = l > 0 ? m + log(l) : (-INFINITY);
}

// dq: (B, H, Tq, D) stored as dense (B, Tq, H, D); delta: (B, H, Tq), written here
// (rowsum(do * o)) for the dk/dv kernel; do at o_*, o at x_*. Groups as attention_fwd.
__kernel void attention_bwd_dq(__global T* dq, __global ACC* delta, __global const T* q,
                               __global const T* k, __global const T* v, __global const T* dout,
                               __global const T* o, __global const ACC* lse, AttnGeom g,
                               ACC scale) {
    __local ACC4 ks[BK][D4];
    __local ACC4 vs[BK][D4];
    uint nqb = (g.tq + BQ - 1) / BQ;
    uint grp = get_group_id(0), qb = grp % nqb, bh = grp / nqb;
    uint h = bh % g.heads, b = bh / g.heads, hk = h / (g.heads / g.kv_heads);
    uint lid = get_local_id(0), i = qb * BQ + lid;
    bool active = i < g.tq;
    uint iq = min(i, g.tq - 1);
    uint qat = g.q_off + b * g.q_sb + h * g.q_sh + iq * g.q_st;
    uint dat = g.o_off + b * g.o_sb + h * g.o_sh + iq * g.o_st;
    uint oat = g.x_off + b * g.x_sb + h * g.x_sh + iq * g.x_st;
    ACC4 qr[D4], dor[D4], acc[D4];
    ACC4 dl4 = (ACC4)(0);
    #pragma unroll
    for (uint c = 0; c < D4; c++) {
        qr[c] = load4(q, qat, c) * scale;
        dor[c] = load4(dout, dat, c);
        dl4 = fma(dor[c], load4(o, oat, c), dl4);
        acc[c] = (ACC4)(0);
    }
    ACC dl = hsum(dl4);
    ACC li = lse[bh * g.tq + iq];
    uint mine = active ? visible(&g, i) : 0;
    uint lo = active ? first_visible(&g, i) : 0;
    uint kend = visible(&g, min(qb * BQ + BQ - 1, g.tq - 1));
    uint kstart = first_visible(&g, qb * BQ) / BK * BK;
    for (uint j0 = kstart; j0 < kend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_kv_tile(ks, vs, k, v, &g, b, hk, j0, lid, BQ);
        barrier(CLK_LOCAL_MEM_FENCE);
        uint jn = mine > j0 ? min((uint)BK, mine - j0) : 0;
        // Keys of the tile before this query's window (signed: Oclgrind lacks usub.sat).
        int skip = (int)lo - (int)j0;
        for (uint jj = skip < 0 ? 0u : (uint)skip; jj < jn; jj++) {
            ACC4 s4 = (ACC4)(0), dp4 = (ACC4)(0);
            #pragma unroll
            for (uint c = 0; c < D4; c++) {
                s4 = fma(qr[c], ks[jj][c], s4);
                dp4 = fma(dor[c], vs[jj][c], dp4);
            }
            ACC s = hsum(s4), dp = hsum(dp4);
            ACC ds = EXPF(s - li) * (dp - dl);
            #pragma unroll
            for (uint c = 0; c < D4; c++) acc[c] = fma((ACC4)(ds), ks[jj][c], acc[c]);
        }
    }
    if (!active) return;
    delta[bh * g.tq + i] = dl;
    uint at = ((b * g.tq + i) * g.heads + h) * HEAD_DIM;
    #pragma unroll
    for (uint c = 0; c < D4; c++) store4(dq, at, c, acc[c] * scale);
}

// The gradient of one key's row, summed over the H / Hkv query heads of its group: dk (want_dk)
// or dv. One work-item per key, its rows in registers; the queries stream through local tiles.
// dk needs k and v (the probability and its gradient), dv only k: two kernels keep each one's
// registers at three rows (dk) or two (dv), where one kernel for both would need four.
inline void bwd_kv(__global T* out, __global const T* q, __global const T* k,
                   __global const T* v, __global const T* dout, __global const ACC* lse,
                   __global const ACC* delta, const AttnGeom* g, ACC scale, const bool want_dk,
                   __local ACC4 (*qs)[D4], __local ACC4 (*dos)[D4], __local ACC* ls,
                   __local ACC* dls) {
    uint nkb = (g->tk + BKV - 1) / BKV;
    uint grp = get_group_id(0), kb = grp % nkb, bhk = grp / nkb;
    uint hk = bhk % g->kv_heads, b = bhk / g->kv_heads, rep = g->heads / g->kv_heads;
    uint lid = get_local_id(0), j = kb * BKV + lid;
    bool active = j < g->tk;
    uint jk = min(j, g->tk - 1);
    uint kat = g->k_off + b * g->k_sb + hk * g->k_sh + jk * g->k_st;
    uint vat = g->v_off + b * g->v_sb + hk * g->v_sh + jk * g->v_st;
    ACC4 kr[D4], vr[D4], acc[D4];
    #pragma unroll
    for (uint c = 0; c < D4; c++) {
        kr[c] = load4(k, kat, c);
        vr[c] = want_dk ? load4(v, vat, c) : (ACC4)(0);
        acc[c] = (ACC4)(0);
    }
    // The first query that sees key j, and the first that sees any key of this block.
    int first_i = g->causal ? (int)j - g->offset : 0;
    int first_blk = g->causal ? (int)(kb * BKV) - g->offset : 0;
    uint i_lo = first_blk < 0 ? 0u : (uint)first_blk;
    uint mine = first_i < 0 ? 0u : (uint)first_i;
    // With a window, the queries past the last that sees key j (or any key of this block).
    uint i_end = queries_end(g, j), i_hi = queries_end(g, kb * BKV + BKV - 1);
    for (uint r = 0; r < rep; r++) {
        uint h = hk * rep + r, bh = b * g->heads + h;
        for (uint i0 = i_lo - i_lo % BQT; i0 < i_hi; i0 += BQT) {
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint e = lid; e < BQT * D4; e += BKV) {
                uint ii = e / D4, c = e % D4, i = i0 + ii;
                ACC4 qv = (ACC4)(0), dv4 = (ACC4)(0);
                if (i < g->tq) {
                    qv = load4(q, g->q_off + b * g->q_sb + h * g->q_sh + i * g->q_st, c) * scale;
                    dv4 = load4(dout, g->o_off + b * g->o_sb + h * g->o_sh + i * g->o_st, c);
                }
                qs[ii][c] = qv;
                dos[ii][c] = dv4;
            }
            for (uint ii = lid; ii < BQT; ii += BKV) {
                uint i = i0 + ii;
                ls[ii] = i < g->tq ? lse[bh * g->tq + i] : (-INFINITY);
                dls[ii] = i < g->tq && want_dk ? delta[bh * g->tq + i] : 0;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (!active) continue;
            uint ii0 = mine > i0 ? min((uint)BQT, mine - i0) : 0;
            uint ii1 = i_end > i0 ? min((uint)BQT, i_end - i0) : 0;
            for (uint ii = ii0; ii < ii1; ii++) {
                ACC4 s4 = (ACC4)(0);
                #pragma unroll
                for (uint c = 0; c < D4; c++) s4 = fma(qs[ii][c], kr[c], s4);
                ACC p = ls[ii] == (-INFINITY) ? 0 : EXPF(hsum(s4) - ls[ii]);
                if (want_dk) {
                    ACC4 dp4 = (ACC4)(0);
                    #pragma unroll
                    for (uint c = 0; c < D4; c++) dp4 = fma(dos[ii][c], vr[c], dp4);
                    ACC ds = p * (hsum(dp4) - dls[ii]);
                    #pragma unroll
                    for (uint c = 0; c < D4; c++) acc[c] = fma((ACC4)(ds), qs[ii][c], acc[c]);
                } else {
                    #pragma unroll
                    for (uint c = 0; c < D4; c++) acc[c] = fma((ACC4)(p), dos[ii][c], acc[c]);
                }
            }
        }
    }
    if (!active) return;
    uint at = ((b * g->tk + j) * g->kv_heads + hk) * HEAD_DIM;
    #pragma unroll
    for (uint c = 0; c < D4; c++) store4(out, at, c, acc[c]);
}

// dk: (B, Hkv, Tk, D) stored as dense (B, Tk, Hkv, D); delta from attention_bwd_dq; do at o_*.
// Groups: B * Hkv * ceil(Tk / BKV), BKV items.
__kernel void attention_bwd_dk(__global T* dk, __global const T* q, __global const T* k,
                               __global const T* v, __global const T* dout,
                               __global const ACC* lse, __global const ACC* delta, AttnGeom g,
                               ACC scale) {
    __local ACC4 qs[BQT][D4], dos[BQT][D4];
    __local ACC ls[BQT], dls[BQT];
    bwd_kv(dk, q, k, v, dout, lse, delta, &g, scale, true, qs, dos, ls, dls);
}

// dv: as dk (v and delta unused).
__kernel void attention_bwd_dv(__global T* dv, __global const T* q, __global const T* k,
                               __global const T* v, __global const T* dout,
                               __global const ACC* lse, __global const ACC* delta, AttnGeom g,
                               ACC scale) {
    __local ACC4 qs[BQT][D4], dos[BQT][D4];
    __local ACC ls[BQT], dls[BQT];
    bwd_kv(dv, q, k, v, dout, lse, delta, &g, scale, false, qs, dos, ls, dls);
}

#if HEAD_DIM <= 64
// The register-blocked backward, for head dims up to 64 (the host picks it where its tiles fit the
// local memory): a work-group of TG work-items holds a block of TB keys (dk and dv together) or TB
// queries (dq) and streams the other side through local memory in blocks of TB. The TB x TB scores
// and their gradients are small GEMMs with a 2 x 4 tile (queries x keys) per work-item; the products
// with the queries, the output gradients or the keys, 4 x 4 tiles (rows x dims). Each local value
// read feeds 5 to 8 multiply-adds, where the streaming kernels above read one per 4.
#define TB 32         // rows per block (queries or keys)
#define TG 128        // work-items per group
#define DP4 (D4 + 1)  // a local row in ACC4, padded: rows kc + 8u of a 2 x 4 tile fall in different banks
#define TP (TB + 4)   // a local row of the probability tiles, in ACC

// Rows [r0, r0 + TB) of one (batch, head) of an operand, row r at base + r * st (zeros from n on),
// times mul, into t.
inline void load_rows(__local ACC4 (*t)[DP4], __global const T* p, uint base, uint st, uint r0,
                      uint n, ACC mul, uint lid) {
    for (uint e = lid; e < TB * D4; e += TG) {
        uint rr = e / D4, c = e % D4, r = r0 + rr;
        t[rr][c] = r < n ? load4(p, base + r * st, c) * mul : (ACC4)(0);
    }
}

// Keys and values [j0, j0 + TB) of (b, kv head hk) into ks and vs.
inline void load_kv_rows(__local ACC4 (*ks)[DP4], __local ACC4 (*vs)[DP4], __global const T* k,
                         __global const T* v, const AttnGeom* g, uint b, uint hk, uint j0,
                         uint lid) {
    load_rows(ks, k, g->k_off + b * g->k_sb + hk * g->k_sh, g->k_st, j0, g->tk, (ACC)1, lid);
    load_rows(vs, v, g->v_off + b * g->v_sb + hk * g->v_sh, g->v_st, j0, g->tk, (ACC)1, lid);
}

// The 2 x 4 tile of work-item lid: s = q·k, and with want_dp dp = do·v, for queries qr + 16v
// (v < 2) of qs and ds, keys kc + 8u (u < 4) of ks and vs, with qr = lid / 8, kc = lid % 8
// (without want_dp, ds and vs are not read).
inline void score_tile(__local ACC4 (*qs)[DP4], __local ACC4 (*ds)[DP4], __local ACC4 (*ks)[DP4],
                       __local ACC4 (*vs)[DP4], uint lid, const bool want_dp, ACC s[2][4],
                       ACC dp[2][4]) {
    uint qr = lid / 8, kc = lid % 8;
    ACC4 s4[2][4], d4[2][4];
    for (uint w = 0; w < 2; w++)
        for (uint u = 0; u < 4; u++) { s4[w][u] = (ACC4)(0); d4[w][u] = (ACC4)(0); }
    #pragma unroll
    for (uint c = 0; c < D4; c++) {
        ACC4 kk[4], vv[4];
        for (uint u = 0; u < 4; u++) {
            kk[u] = ks[kc + 8 * u][c];
            if (want_dp) vv[u] = vs[kc + 8 * u][c];
        }
        for (uint w = 0; w < 2; w++) {
            ACC4 qv = qs[qr + 16 * w][c];
            for (uint u = 0; u < 4; u++) s4[w][u] = fma(qv, kk[u], s4[w][u]);
            if (!want_dp) continue;
            ACC4 dv = ds[qr + 16 * w][c];
            for (uint u = 0; u < 4; u++) d4[w][u] = fma(dv, vv[u], d4[w][u]);
        }
    }
    for (uint w = 0; w < 2; w++)
        for (uint u = 0; u < 4; u++) { s[w][u] = hsum(s4[w][u]); dp[w][u] = hsum(d4[w][u]); }
}

// acc[u] += p.u * v for the four rows u of a 4 x 4 update tile.
inline void rank1_4(ACC4 acc[4], ACC4 p, ACC4 v) {
    acc[0] = fma((ACC4)(p.x), v, acc[0]);
    acc[1] = fma((ACC4)(p.y), v, acc[1]);
    acc[2] = fma((ACC4)(p.z), v, acc[2]);
    acc[3] = fma((ACC4)(p.w), v, acc[3]);
}

// Whether query i sees key j (both in range).
inline bool sees(const AttnGeom* g, uint i, uint j) {
    return i < g->tq && j < g->tk && (!g->causal || (int)j <= (int)i + g->offset) &&
           (!g->window || (int)j > (int)i + g->offset - g->window);
}

// Whether every query of [i0, i0 + TB) sees every key of [j0, j0 + TB): such blocks skip `sees`.
inline bool sees_all(const AttnGeom* g, uint i0, uint j0) {
    return i0 + TB <= g->tq && j0 + TB <= g->tk && (!g->causal || (int)(j0 + TB - 1) <= (int)i0 + g->offset) &&
           (!g->window || (int)j0 > (int)(i0 + TB - 1) + g->offset - g->window);
}

// The forward over a block of TB queries (online softmax over blocks of TB keys): the 2 x 4 score
// tile per work-item as in the backward, each row's block maximum through local memory, the
// probabilities into local memory transposed, and the output as a 4 x 4 tile (queries x dims) per
// work-item. Both roles keep the running maximum of their own rows (computed alike from the same
// values). o at o_*; lse (B, H, Tq). Groups: B * H * ceil(Tq / TB), TG items.
__kernel __attribute__((reqd_work_group_size(TG, 1, 1)))
void attention_fwd_blocked(__global T* o, __global ACC* lse, __global const T* q,
                           __global const T* k, __global const T* v, AttnGeom g, ACC scale) {
    __local ACC4 ks[TB][DP4], vs[TB][DP4], qs[TB][DP4];
    __local ACC pt[TB][TP];
    __local ACC red[TB][9];
    uint nqb = (g.tq + TB - 1) / TB;
    uint grp = get_group_id(0), qb = grp % nqb, bh = grp / nqb;
    uint h = bh % g.heads, b = bh / g.heads, hk = h / (g.heads / g.kv_heads);
    uint lid = get_local_id(0), i0 = qb * TB;
    load_rows(qs, q, g.q_off + b * g.q_sb + h * g.q_sh, g.q_st, i0, g.tq, scale, lid);
    uint qr = lid / 8, kc = lid % 8;  // the score tile's queries qr + 16w and keys kc + 8u
    uint qg = lid % 8, dg = lid / 8;  // the output's queries 4 qg + u and dims 4 dg .. 4 dg + 3
    ACC ms[2] = {-INFINITY, -INFINITY};  // running maxima of the score rows
    ACC mo[4], lo[4];                     // and of the output rows, with their sums
    ACC4 acc[4];
    for (uint u = 0; u < 4; u++) { mo[u] = -INFINITY; lo[u] = 0; acc[u] = (ACC4)(0); }
    uint kend = visible(&g, min(i0 + TB - 1, g.tq - 1));
    for (uint j0 = first_visible(&g, i0) / TB * TB; j0 < kend; j0 += TB) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_kv_rows(ks, vs, k, v, &g, b, hk, j0, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
        ACC s[2][4], unused[2][4];
        score_tile(qs, qs, ks, ks, lid, false, s, unused);
        bool full = sees_all(&g, i0, j0);
        for (uint w = 0; w < 2; w++) {
            uint rr = qr + 16 * w;
            ACC mx = -INFINITY;
            for (uint u = 0; u < 4; u++) {
                if (!full && !sees(&g, i0 + rr, j0 + kc + 8 * u)) s[w][u] = -INFINITY;
                mx = fmax(mx, s[w][u]);
            }
            red[rr][kc] = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint w = 0; w < 2; w++) {
            uint rr = qr + 16 * w;
            for (uint e = 0; e < 8; e++) ms[w] = fmax(ms[w], red[rr][e]);
            for (uint u = 0; u < 4; u++)
                pt[kc + 8 * u][rr] = s[w][u] == (-INFINITY) ? 0 : EXPF(s[w][u] - ms[w]);
        }
        ACC alpha[4];
        for (uint u = 0; u < 4; u++) {
            uint rr = 4 * qg + u;
            ACC mn = mo[u];
            for (uint e = 0; e < 8; e++) mn = fmax(mn, red[rr][e]);
            alpha[u] = mo[u] == (-INFINITY) ? 0 : EXPF(mo[u] - mn);
            mo[u] = mn;
            lo[u] *= alpha[u];
            acc[u] *= alpha[u];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        uint cn = min((uint)TB, kend - j0);
        for (uint cc = 0; cc < cn; cc++) {
            ACC4 p = vload4(0, &pt[cc][4 * qg]);
            lo[0] += p.x; lo[1] += p.y; lo[2] += p.z; lo[3] += p.w;
            if (dg < D4) {
                rank1_4(acc, p, vs[cc][dg]);
            }
        }
    }
    for (uint u = 0; u < 4; u++) {
        uint i = i0 + 4 * qg + u;
        if (i >= g.tq) break;
        ACC inv = lo[u] > 0 ? 1 / lo[u] : 0;
        if (dg < D4) store4(o, g.o_off + b * g.o_sb + h * g.o_sh + i * g.o_st, dg, acc[u] * inv);
        if (dg == 0) lse[bh * g.tq + i] = lo[u] > 0 ? mo[u] + log(lo[u]) : (-INFINITY);
    }
}

// dk and dv of a block of TB keys, summed over the H / Hkv query heads of their group. Stored as
// dense (B, Tk, Hkv, D). Groups: B * Hkv * ceil(Tk / TB), TG items. delta from
// attention_bwd_dq_blocked or attention_bwd_delta. With want_ds, also the scores' gradients times
// the scale, dsg (B, H, Tq, Tk) contiguous (zeros where a query does not see a key), for dq = dsg k
// as one batched GEMM (flash_attention/opencl.rs).
__kernel __attribute__((reqd_work_group_size(TG, 1, 1)))
void attention_bwd_dkdv(__global T* dk, __global T* dv, __global const T* q, __global const T* k,
                        __global const T* v, __global const T* dout, __global const ACC* lse,
                        __global const ACC* delta, __global ACC* dsg, uint want_ds, AttnGeom g,
                        ACC scale) {
    __local ACC4 ks[TB][DP4], vs[TB][DP4], qs[TB][DP4], ds[TB][DP4];
    __local ACC pm[TB][TP], sm[TB][TP];
    __local ACC ls[TB], dls[TB];
    uint nkb = (g.tk + TB - 1) / TB;
    uint grp = get_group_id(0), kb = grp % nkb, bhk = grp / nkb;
    uint hk = bhk % g.kv_heads, b = bhk / g.kv_heads, rep = g.heads / g.kv_heads;
    uint lid = get_local_id(0), j0 = kb * TB;
    load_kv_rows(ks, vs, k, v, &g, b, hk, j0, lid);
    uint qr = lid / 8, kc = lid % 8;  // the score tile's queries and keys
    uint kg = lid % 8, dg = lid / 8;  // the update's keys kg * 4 + u and dims 4 dg .. 4 dg + 3
    ACC4 adk[4], adv[4];
    for (uint u = 0; u < 4; u++) { adk[u] = (ACC4)(0); adv[u] = (ACC4)(0); }
    // The first block of queries that sees key j0.
    int first = g.causal ? (int)j0 - g.offset : 0;
    uint i_start = first <= 0 ? 0u : (uint)first / TB * TB;
    for (uint r = 0; r < rep; r++) {
        uint h = hk * rep + r, bh = b * g.heads + h;
        if (want_ds) {
            // The blocks of queries that see none of these keys.
            for (uint e = lid; e < i_start * TB; e += TG) {
                uint i = e / TB, j = j0 + e % TB;
                if (i < g.tq && j < g.tk) dsg[((size_t)bh * g.tq + i) * g.tk + j] = 0;
            }
        }
        for (uint i0 = i_start; i0 < g.tq; i0 += TB) {
            barrier(CLK_LOCAL_MEM_FENCE);
            load_rows(qs, q, g.q_off + b * g.q_sb + h * g.q_sh, g.q_st, i0, g.tq, scale, lid);
            load_rows(ds, dout, g.o_off + b * g.o_sb + h * g.o_sh, g.o_st, i0, g.tq, (ACC)1, lid);
            if (lid < TB) {
                uint i = i0 + lid;
                ls[lid] = i < g.tq ? lse[bh * g.tq + i] : (-INFINITY);
                dls[lid] = i < g.tq ? delta[bh * g.tq + i] : 0;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            ACC s[2][4], dp[2][4];
            score_tile(qs, ds, ks, vs, lid, true, s, dp);
            bool full = sees_all(&g, i0, j0);
            for (uint w = 0; w < 2; w++) {
                uint rr = qr + 16 * w;
                ACC li = ls[rr], dl = dls[rr];
                for (uint u = 0; u < 4; u++) {
                    uint cc = kc + 8 * u;
                    bool on = (full || sees(&g, i0 + rr, j0 + cc)) && li != (-INFINITY);
                    ACC p = on ? EXPF(s[w][u] - li) : 0;
                    pm[rr][cc] = p;
                    sm[rr][cc] = p * (dp[w][u] - dl);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (want_ds) {
                for (uint e = lid; e < TB * TB; e += TG) {
                    uint rr = e / TB, cc = e % TB, i = i0 + rr, j = j0 + cc;
                    if (i < g.tq && j < g.tk) dsg[((size_t)bh * g.tq + i) * g.tk + j] = sm[rr][cc] * scale;
                }
            }
            if (dg < D4) {
                uint rn = min((uint)TB, g.tq - i0);
                for (uint rr = 0; rr < rn; rr++) {
                    ACC4 p = vload4(0, &pm[rr][4 * kg]), dsr = vload4(0, &sm[rr][4 * kg]);
                    ACC4 o = ds[rr][dg], qv = qs[rr][dg];
                    rank1_4(adv, p, o);
                    rank1_4(adk, dsr, qv);
                }
            }
        }
    }
    if (dg >= D4) return;
    for (uint u = 0; u < 4; u++) {
        uint j = j0 + 4 * kg + u;
        if (j >= g.tk) break;
        uint at = ((b * g.tk + j) * g.kv_heads + hk) * HEAD_DIM;
        store4(dk, at, dg, adk[u]);
        store4(dv, at, dg, adv[u]);
    }
}

// delta = rowsum(do * o) of queries [i0, i0 + TB) of (b, h), four work-items per query: each
// work-item's partial sum into part[lid]; after a barrier, delta_sum(part, r) is query i0 + r's.
inline void delta_part(__local ACC* part, __global const T* dout, __global const T* o,
                       const AttnGeom* g, uint b, uint h, uint i0, uint lid) {
    uint i = i0 + lid / 4;
    ACC4 acc = (ACC4)(0);
    if (i < g->tq) {
        uint dat = g->o_off + b * g->o_sb + h * g->o_sh + i * g->o_st;
        uint oat = g->x_off + b * g->x_sb + h * g->x_sh + i * g->x_st;
        for (uint c = lid % 4; c < D4; c += 4) acc = fma(load4(dout, dat, c), load4(o, oat, c), acc);
    }
    part[lid] = hsum(acc);
}

inline ACC delta_sum(__local const ACC* part, uint r) {
    return (part[4 * r] + part[4 * r + 1]) + (part[4 * r + 2] + part[4 * r + 3]);
}

// delta = rowsum(do * o) alone, for attention_bwd_dkdv where dq comes from its ds: four work-items
// per query. Groups: B * H * ceil(Tq / TB), TG items.
__kernel __attribute__((reqd_work_group_size(TG, 1, 1)))
void attention_bwd_delta(__global ACC* delta, __global const T* dout, __global const T* o,
                         AttnGeom g, ACC scale) {
    __local ACC part[TG];
    uint nqb = (g.tq + TB - 1) / TB;
    uint grp = get_group_id(0), qb = grp % nqb, bh = grp / nqb;
    uint h = bh % g.heads, b = bh / g.heads;
    uint lid = get_local_id(0), i0 = qb * TB;
    delta_part(part, dout, o, &g, b, h, i0, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < TB && i0 + lid < g.tq) delta[bh * g.tq + i0 + lid] = delta_sum(part, lid);
}

// dq of a block of TB queries, and delta = rowsum(do * o) for attention_bwd_dkdv. dq stored as dense
// (B, Tq, H, D). Groups: B * H * ceil(Tq / TB), TG items.
__kernel __attribute__((reqd_work_group_size(TG, 1, 1)))
void attention_bwd_dq_blocked(__global T* dq, __global ACC* delta, __global const T* q,
                              __global const T* k, __global const T* v, __global const T* dout,
                              __global const T* o, __global const ACC* lse, AttnGeom g, ACC scale) {
    __local ACC4 ks[TB][DP4], vs[TB][DP4], qs[TB][DP4], ds[TB][DP4];
    __local ACC st[TB][TP];
    __local ACC ls[TB], dls[TB], part[TG];
    uint nqb = (g.tq + TB - 1) / TB;
    uint grp = get_group_id(0), qb = grp % nqb, bh = grp / nqb;
    uint h = bh % g.heads, b = bh / g.heads, hk = h / (g.heads / g.kv_heads);
    uint lid = get_local_id(0), i0 = qb * TB;
    load_rows(qs, q, g.q_off + b * g.q_sb + h * g.q_sh, g.q_st, i0, g.tq, scale, lid);
    load_rows(ds, dout, g.o_off + b * g.o_sb + h * g.o_sh, g.o_st, i0, g.tq, (ACC)1, lid);
    delta_part(part, dout, o, &g, b, h, i0, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < TB) {
        uint i = i0 + lid;
        ACC dl = delta_sum(part, lid);
        ls[lid] = i < g.tq ? lse[bh * g.tq + i] : (-INFINITY);
        dls[lid] = dl;
        if (i < g.tq) delta[bh * g.tq + i] = dl;
    }
    uint qr = lid / 8, kc = lid % 8;  // the score tile's queries and keys
    uint qg = lid % 8, dg = lid / 8;  // the update's queries qg * 4 + u and dims 4 dg .. 4 dg + 3
    ACC4 adq[4];
    for (uint u = 0; u < 4; u++) adq[u] = (ACC4)(0);
    uint kend = visible(&g, min(i0 + TB - 1, g.tq - 1));
    for (uint j0 = first_visible(&g, i0) / TB * TB; j0 < kend; j0 += TB) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_kv_rows(ks, vs, k, v, &g, b, hk, j0, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
        ACC s[2][4], dp[2][4];
        score_tile(qs, ds, ks, vs, lid, true, s, dp);
        bool full = sees_all(&g, i0, j0);
        for (uint w = 0; w < 2; w++) {
            uint rr = qr + 16 * w;
            ACC li = ls[rr], dl = dls[rr];
            for (uint u = 0; u < 4; u++) {
                uint cc = kc + 8 * u;
                bool on = (full || sees(&g, i0 + rr, j0 + cc)) && li != (-INFINITY);
                st[cc][rr] = on ? EXPF(s[w][u] - li) * (dp[w][u] - dl) : 0;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (dg < D4) {
            uint cn = min((uint)TB, kend - j0);
            for (uint cc = 0; cc < cn; cc++) {
                ACC4 d = vload4(0, &st[cc][4 * qg]), kv = ks[cc][dg];
                rank1_4(adq, d, kv);
            }
        }
    }
    if (dg >= D4) return;
    for (uint u = 0; u < 4; u++) {
        uint i = i0 + 4 * qg + u;
        if (i >= g.tq) break;
        store4(dq, ((b * g.tq + i) * g.heads + h) * HEAD_DIM, dg, adq[u] * scale);
    }
}
#endif
