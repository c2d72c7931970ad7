// attention.cl: fused scaled dot-product attention (online softmax, never materialising the scores): forward, backward dq (with delta), backward dk and dv; causal or not, grouped-query heads.
//
// Shapes: q (B, H, Tq, D), k and v (B, Hkv, Tk, D) at any element strides over (b, h, t) with
// unit stride over d; query head h reads key/value head h / (H / Hkv). o is written at the
// strides the geometry gives; dq (B, H, Tq, D) and dk, dv (B, Hkv, Tk, D) are stored t-major,
// as dense (B, T, H, D). lse and delta are ACC (B, H, Tq), contiguous. Causal: query i sees keys j <= i + offset (offset = Tk - Tq); a query
// that sees no key gets output 0, lse -inf and no gradient. Arithmetic in f32 (f64 for f64).
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
} AttnGeom;

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
    uint kend = visible(&g, min(qb * BQ + BQ - 1, g.tq - 1));
    for (uint j0 = 0; j0 < kend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_kv_tile(ks, vs, k, v, &g, b, hk, j0, lid, BQ);
        barrier(CLK_LOCAL_MEM_FENCE);
        uint jn = mine > j0 ? min((uint)BK, mine - j0) : 0;
        for (uint jj = 0; jj < jn; jj++) {
            ACC4 s4 = (ACC4)(0);
            #pragma unroll
            for (uint c = 0; c < D4; c++) s4 = fma(qr[c], ks[jj][c], s4);
            ACC s = hsum(s4);
            if (s > m) {
                ACC r = exp(m - s);
                l *= r;
                #pragma unroll
                for (uint c = 0; c < D4; c++) acc[c] *= r;
                m = s;
            }
            ACC p = exp(s - m);
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
    uint kend = visible(&g, min(qb * BQ + BQ - 1, g.tq - 1));
    for (uint j0 = 0; j0 < kend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_kv_tile(ks, vs, k, v, &g, b, hk, j0, lid, BQ);
        barrier(CLK_LOCAL_MEM_FENCE);
        uint jn = mine > j0 ? min((uint)BK, mine - j0) : 0;
        for (uint jj = 0; jj < jn; jj++) {
            ACC4 s4 = (ACC4)(0), dp4 = (ACC4)(0);
            #pragma unroll
            for (uint c = 0; c < D4; c++) {
                s4 = fma(qr[c], ks[jj][c], s4);
                dp4 = fma(dor[c], vs[jj][c], dp4);
            }
            ACC s = hsum(s4), dp = hsum(dp4);
            ACC ds = exp(s - li) * (dp - dl);
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
    for (uint r = 0; r < rep; r++) {
        uint h = hk * rep + r, bh = b * g->heads + h;
        for (uint i0 = i_lo - i_lo % BQT; i0 < g->tq; i0 += BQT) {
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
            uint ii1 = min((uint)BQT, g->tq - i0);
            for (uint ii = ii0; ii < ii1; ii++) {
                ACC4 s4 = (ACC4)(0);
                #pragma unroll
                for (uint c = 0; c < D4; c++) s4 = fma(qs[ii][c], kr[c], s4);
                ACC p = ls[ii] == (-INFINITY) ? 0 : exp(hsum(s4) - ls[ii]);
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
