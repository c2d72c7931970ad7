// attention_tc.cl: fused attention (forward, backward dq and dk/dv) for bf16/f16 on NVIDIA tensor cores through inline PTX mma.sync (sm_80+ PTX); built only where matmul_tc's probe passed.
//
// The same contract as attention.cl (shapes, strides, causal rule, lse/delta, outputs), for
// 16-bit storage with f32 accumulation; the probabilities and their gradients enter the second
// product of each pair rounded to the storage format, as in FlashAttention-2. Every view's offset
// and strides are multiples of 8 elements (rows are read as 16-byte vectors; the host checks).
// Built with -DHEAD_DIM=D (16 to 128 in steps of 16), -DTC_BF16 or -DTC_F16 (the products'
// format) and the storage's -DDT_*: the same 16-bit format, or f32 (read and written as f32,
// rounded to the products' format on the way into local memory: autocast without casts around
// the kernels).
//
// A work-group is four warps and owns 64 rows of one side (queries in the forward and dq
// kernels, keys in the dk/dv kernel), 16 per warp (32 in the forward up to head dim 64), whose
// operand fragments stay in registers (but the dk/dv kernel's value rows above head dim 64); the
// other side streams through local memory in tiles of SN_F, SN_Q or SN_KV rows. Fragments come
// out of local memory through ldmatrix (.trans where the tile's rows are the product's K dim). m16n8k16 tiles: a thread holds rows g and g + 8
// (g = lane / 4) and columns 2t, 2t + 1 (t = lane % 4) of each.
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#if HEAD_DIM % 16 || HEAD_DIM > 128
#error "attention_tc.cl takes head dims 16 to 128 in steps of 16"
#endif
#define DK (HEAD_DIM / 16)  // k steps of 16 over the head dim
#define DN (HEAD_DIM / 8)   // n tiles of 8 over the head dim
#define RS (HEAD_DIM / 2 + 4)  // local row stride in 32-bit words (16-byte rows fall on distinct banks)
#define WG 128
// Row tiles of 16 each warp of the forward owns (MT_F; one in the backward kernels): two share
// every fragment read from the streamed tiles (half the local-memory reads per product) at twice
// the accumulators. The host passes it and launches 64 * MT_F rows to a forward work-group.
#ifndef MT_F
#define MT_F 1
#endif
#define ROWS 64  // the rows a backward work-group owns
// Rows of the streamed side a dk/dv step takes (SN_KV): above head dim 64 the accumulators are
// twice as wide, so its score tiles (and the rows fetched ahead) shrink to stay in registers,
// and it reads its value rows' fragments from local memory.
#if HEAD_DIM > 64
#define SN_KV 32
#define VF_LOCAL
#else
#define SN_KV 64
#endif
#if !defined(TC_BF16) && !defined(TC_F16)
#error "attention_tc.cl needs -DTC_BF16 or -DTC_F16"
#endif
// MMA, LDMATRIX_X4(_T) and pack2 come from common.cl's tensor-core section.
#if defined(DT_F32)
#define IO_F32
#elif !(defined(DT_BF16) && defined(TC_BF16)) && !(defined(DT_F16) && defined(TC_F16))
#error "attention_tc.cl stores f32 or the products' 16-bit format"
#endif
// Keys a forward step takes (SN_F): 64 where 16-bit tiles arrive through cp.async, 32 where f32
// storage is rounded on its way through registers (whose copies in flight take the registers).
#ifndef SN_F
#ifdef IO_F32
#define SN_F 32
#else
#define SN_F 64
#endif
#endif

// Same layout as attention.cl's AttnGeom (ops/src/flash_attention/opencl.rs fills it).
typedef struct {
    uint batch, heads, kv_heads, tq, tk;
    uint causal;
    int offset;  // tk - tq
    uint q_off, q_sb, q_sh, q_st;
    uint k_off, k_sb, k_sh, k_st;
    uint v_off, v_sb, v_sh, v_st;
    uint o_off, o_sb, o_sh, o_st;  // o (forward), or do (backward)
    uint x_off, x_sb, x_sh, x_st;  // o in the backward
    int window;  // sliding window (0: none); never set here: the host keeps windows off this file
} AttnGeom;

inline float shfl_xor(float v, uint m) {
    float r;
    __asm__ volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(m));
    return r;
}

// 2^x in one MUFU.EX2 (native_exp2 adds a range fix-up around it for results below f32's normal
// range, which only flush to 0 here).
inline float exp2_ftz(float x) {
    float r;
    __asm__("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// Max and sum over the four lanes holding a row.
inline float quad_max(float v) {
    v = fmax(v, shfl_xor(v, 1));
    return fmax(v, shfl_xor(v, 2));
}
inline float quad_sum(float v) {
    v += shfl_xor(v, 1);
    return v + shfl_xor(v, 2);
}

// Number of keys query i may see.
inline uint visible(const AttnGeom* g, uint i) {
    if (!g->causal) return g->tk;
    int last = (int)i + g->offset;
    return last < 0 ? 0u : min((uint)(last + 1), g->tk);
}

// A tile's rows travel in chunks of 8 elements (one 16-byte row piece of local memory), at most
// PER(rows) per work-item: loaded into registers a tile ahead (the loads fly while the current
// tile is multiplied), then stored into local memory. f32 storage stays f32 in registers (rounded
// at the store, so that nothing waits on the loads early).
#define CHUNKS(rows) ((rows) * (HEAD_DIM / 8))
#define PER(rows) ((CHUNKS(rows) + WG - 1) / WG)
#ifdef IO_F32
#define CHUNK float8
inline CHUNK load_chunk(__global const T* p, uint at) {
    __global const float4* f = (__global const float4*)p + at / 4;
    return (float8)(f[0], f[1]);
}
inline uint4 packed(float8 x) {
    return (uint4)(pack2(x.s0, x.s1), pack2(x.s2, x.s3), pack2(x.s4, x.s5), pack2(x.s6, x.s7));
}
#else
#define CHUNK uint4
inline CHUNK load_chunk(__global const T* p, uint at) { return ((__global const uint4*)p)[at / 8]; }
inline uint4 packed(uint4 x) { return x; }
#endif

// Rows r0 .. r0 + rows - 1 of a (n, HEAD_DIM) view (row i at base + i * st) into registers r;
// zeros past n. `rows` is a constant at every call (the loops unroll).
inline void fetch_tile(CHUNK* r, __global const T* p, uint base, uint st, uint r0, uint n, uint lid,
                       const uint rows) {
#pragma unroll
    for (uint i = 0; i < PER(rows); ++i) {
        uint e = lid + i * WG, row = e / (HEAD_DIM / 8), c = e % (HEAD_DIM / 8);
        if (CHUNKS(rows) % WG == 0 || e < CHUNKS(rows))
            r[i] = r0 + row < n ? load_chunk(p, base + (r0 + row) * st + 8 * c) : (CHUNK)(0);
    }
}

// The fetched rows into local tile t.
inline void stage_tile(__local uint* t, const CHUNK* r, uint lid, const uint rows) {
#pragma unroll
    for (uint i = 0; i < PER(rows); ++i) {
        uint e = lid + i * WG, row = e / (HEAD_DIM / 8), c = e % (HEAD_DIM / 8);
        if (CHUNKS(rows) % WG == 0 || e < CHUNKS(rows))
            *(__local uint4*)&t[row * RS + c * 4] = packed(r[i]);
    }
}

#ifndef IO_F32
// Rows r0 .. r0 + rows - 1 of a (n, HEAD_DIM) view into local tile t through cp.async (16-byte
// copies, zeros past n), as one group of copies in flight: cp_wait_all() lands it.
inline void copy_tile(__local uint* t, __global const T* p, uint base, uint st, uint r0, uint n,
                      uint lid, const uint rows) {
#pragma unroll
    for (uint i = 0; i < PER(rows); ++i) {
        uint e = lid + i * WG, row = e / (HEAD_DIM / 8), c = e % (HEAD_DIM / 8);
        if (CHUNKS(rows) % WG == 0 || e < CHUNKS(rows)) {
            bool in = r0 + row < n;
            __global const T* src = p + (in ? base + (r0 + row) * st + 8 * c : base);
            __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                             ::"r"((uint)(size_t)&t[row * RS + c * 4]), "l"(src), "r"(in ? 16u : 0u)
                             : "memory");
        }
    }
    __asm__ volatile("cp.async.commit_group;" ::: "memory");
}
inline void cp_wait_all(void) { __asm__ volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif

// Rows r0 .. r0 + rows - 1 (at most 128) straight into t.
inline void load_tile(__local uint* t, __global const T* p, uint base, uint st, uint r0, uint n,
                      uint lid, const uint rows) {
    CHUNK r[PER(128)];
    fetch_tile(r, p, base, st, r0, n, lid, rows);
    stage_tile(t, r, lid, rows);
}

// A fragment kk (16 rows from row0; head-dim columns 16 kk .. 16 kk + 15) of a tile into a.
#define LOAD_A(a, tile, row0, kk)                                                              \
    LDMATRIX_X4(a, &(tile)[((row0) + lane % 8 + 8 * ((lane / 8) % 2)) * RS + (kk) * 8 + 4 * (lane / 16)])

// All A fragments (16 rows from row0, all of HEAD_DIM as K) of a tile.
#define FRAG_A(f, tile, row0)                                                                  \
    _Pragma("unroll") for (int kk = 0; kk < DK; ++kk) LOAD_A(f[kk], tile, row0, kk)

// a = f[kk]: an A fragment held in registers (for SCORES' GET_A).
#define COPY_A(a, f, kk) _Pragma("unroll") for (int w_ = 0; w_ < 4; ++w_) a[w_] = f[kk][w_]

// s[mt] (16 x n) = a[mt] (16 x HEAD_DIM) x tileᵀ for each of the warp's mts row tiles: the
// tile's first n rows are the columns, each of its fragments read once for all mts; GET_A(a, mt,
// kk) puts row tile mt's A fragment kk into a (COPY_A from registers, or LOAD_A from local memory).
#define SCORES(s, mts, n, tile, GET_A)                                                             _Pragma("unroll") for (int mt = 0; mt < (mts); ++mt)                                               _Pragma("unroll") for (int j = 0; j < (n) / 8; ++j)                                                _Pragma("unroll") for (int q = 0; q < 4; ++q) s[mt][j][q] = 0.0f;                      _Pragma("unroll") for (int kk = 0; kk < DK; ++kk) {                                                uint a_[mts][4];                                                                               _Pragma("unroll") for (int mt = 0; mt < (mts); ++mt) { GET_A(a_[mt], mt, kk); }                _Pragma("unroll") for (int j = 0; j < (n) / 8; j += 2) {                                           uint x[4];                                                                                     LDMATRIX_X4(x, &tile[(j * 8 + lane % 8 + 8 * (lane / 16)) * RS + kk * 8 + 4 * ((lane / 8) % 2)]);             _Pragma("unroll") for (int mt = 0; mt < (mts); ++mt) {                                             MMA(s[mt][j], a_[mt], x[0], x[1]);                                                             MMA(s[mt][j + 1], a_[mt], x[2], x[3]);                                                     }                                                                                          }                                                                                          }

// acc[mt] (16 x HEAD_DIM) += p[mt] (16 x n, f32 in C layout, rounded here) x tile (n x HEAD_DIM)
// for each of mts row tiles.
#define ACCUMULATE(acc, p, mts, n, tile)                                                           _Pragma("unroll") for (int kc = 0; kc < (n) / 16; ++kc) {                                          uint pa[mts][4];                                                                               _Pragma("unroll") for (int mt = 0; mt < (mts); ++mt) {                                             pa[mt][0] = pack2(p[mt][2 * kc][0], p[mt][2 * kc][1]);                                         pa[mt][1] = pack2(p[mt][2 * kc][2], p[mt][2 * kc][3]);                                         pa[mt][2] = pack2(p[mt][2 * kc + 1][0], p[mt][2 * kc + 1][1]);                                 pa[mt][3] = pack2(p[mt][2 * kc + 1][2], p[mt][2 * kc + 1][3]);                             }                                                                                              _Pragma("unroll") for (int dn = 0; dn < DN; dn += 2) {                                             uint x[4];                                                                                     LDMATRIX_X4_T(x, &tile[(kc * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * RS + (dn + lane / 16) * 4]);             _Pragma("unroll") for (int mt = 0; mt < (mts); ++mt) {                                             MMA(acc[mt][dn], pa[mt], x[0], x[1]);                                                          MMA(acc[mt][dn + 1], pa[mt], x[2], x[3]);                                                  }                                                                                          }                                                                                          }

#define ZERO(acc, mts)                                                                             _Pragma("unroll") for (int mt = 0; mt < (mts); ++mt)                                               _Pragma("unroll") for (int dn = 0; dn < DN; ++dn)                                                  _Pragma("unroll") for (int q = 0; q < 4; ++q) acc[mt][dn][q] = 0.0f;

// Elements i and i + 1 (i even) of p.
#ifdef IO_F32
#define STORE_PAIR(p, i, x, y) (((__global float2*)(p))[(i) / 2] = (float2)((x), (y)))
#else
#define STORE_PAIR(p, i, x, y) (((__global uint*)(p))[(i) / 2] = pack2((x), (y)))
#endif

// Writes rows (16 x HEAD_DIM of a warp, times mul) at p + at(row): rows r0 + g and r0 + g + 8 if below n.
#define STORE_ROWS(p, acc, r0, n, mul, AT)                                                     \
    _Pragma("unroll") for (int h2 = 0; h2 < 2; ++h2) {                                         \
        uint row = (r0) + g + 8 * h2;                                                          \
        if (row < (n)) {                                                                       \
            uint at = AT;                                                                      \
            _Pragma("unroll") for (int dn = 0; dn < DN; ++dn)                                  \
                STORE_PAIR(p, at + dn * 8 + 2 * t, acc[dn][2 * h2] * mul[h2],                  \
                           acc[dn][2 * h2 + 1] * mul[h2]);                                     \
        }                                                                                      \
    }

// Local memory: the owned rows' tiles are read into registers first; the streamed tiles then
// take the same memory (the dk/dv kernel keeps its value rows in the second half where VF_LOCAL).
#define ROWS_F (64 * MT_F)
#define FWD_WORDS ((ROWS_F > 2 * SN_F ? ROWS_F : 2 * SN_F) * RS)
#if FWD_WORDS * 4 > 48 * 1024
#error "the forward's tiles exceed 48 KiB of local memory"
#endif

// o: (B, H, Tq, D) at o_*; lse: (B, H, Tq). Groups: B * H * ceil(Tq / ROWS_F), 128 items.
// Each step's keys land before its scores and its values before its probabilities' product;
// the values are copied while the scores are computed, the next keys while the probabilities
// are (as FlashAttention-2 orders them).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_fwd_tc(__global T* o, __global float* lse, __global const T* q,
                      __global const T* k, __global const T* v, AttnGeom G, float scale) {
    __local uint sm[FWD_WORDS] __attribute__((aligned(16)));
    const uint lid = get_local_id(0), lane = lid % 32, warp = lid / 32, g = lane / 4, t = lane % 4;
    // The last query blocks see the most keys: they start first, so the short ones fill the tail.
    const uint nqb = (G.tq + ROWS_F - 1) / ROWS_F, grp = get_group_id(0), qb = nqb - 1 - grp % nqb;
    const uint bh = grp / nqb;
    const uint h = bh % G.heads, b = bh / G.heads, hk = h / (G.heads / G.kv_heads);
    const uint i0 = qb * ROWS_F, w0 = i0 + warp * 16 * MT_F;
    const uint kbase = G.k_off + b * G.k_sb + hk * G.k_sh, vbase = G.v_off + b * G.v_sb + hk * G.v_sh;
    __local uint *const ks = sm, *const vs = sm + SN_F * RS;
#ifdef IO_F32
    // f32 storage: a tile is loaded into registers when issued and rounded into its local
    // tile when it lands (keys and values are never in flight together).
    CHUNK fl[PER(SN_F)];
#define ISSUE(tile, p, base, st, r0, n) fetch_tile(fl, p, base, st, r0, n, lid, SN_F)
#define LAND(tile) stage_tile(tile, fl, lid, SN_F)
#else
#define ISSUE(tile, p, base, st, r0, n) copy_tile(tile, p, base, st, r0, n, lid, SN_F)
#define LAND(tile) cp_wait_all()
#endif
    load_tile(sm, q, G.q_off + b * G.q_sb + h * G.q_sh, G.q_st, i0, G.tq, lid, ROWS_F);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[MT_F][DK][4];
#pragma unroll
    for (int mt = 0; mt < MT_F; ++mt) FRAG_A(qf[mt], sm, warp * 16 * MT_F + 16 * mt);
#define QF(a, mt, kk) COPY_A(a, qf[mt], kk)
    const float c = scale * M_LOG2E_F;  // scores in base-2 units
    float acc[MT_F][DN][4], m[MT_F][2], l[MT_F][2];
    uint vis[MT_F][2];
    ZERO(acc, MT_F);
#pragma unroll
    for (int mt = 0; mt < MT_F; ++mt)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            m[mt][h2] = -INFINITY;
            l[mt][h2] = 0.0f;
            vis[mt][h2] = visible(&G, min(w0 + 16 * mt + g + 8 * h2, G.tq - 1));
        }
    const uint kend = visible(&G, min(i0 + ROWS_F - 1, G.tq - 1));
    const uint kfull = visible(&G, i0);  // keys every query of the group sees
    barrier(CLK_LOCAL_MEM_FENCE);  // the query tile's fragments are read: the keys take its memory
    if (kend > 0) ISSUE(ks, k, kbase, G.k_st, 0, G.tk);
    for (uint j0 = 0; j0 < kend; j0 += SN_F) {
        LAND(ks);
        barrier(CLK_LOCAL_MEM_FENCE);  // the keys are in; every warp is done with the last values
        ISSUE(vs, v, vbase, G.v_st, j0, G.tk);
        float s[MT_F][SN_F / 8][4];
        SCORES(s, MT_F, SN_F, ks, QF);
        // Masks only on the causal edge: a branch of its own, so the steps inside it run none
        // of the compares.
        if (j0 + SN_F > kfull) {
#pragma unroll
            for (int mt = 0; mt < MT_F; ++mt)
#pragma unroll
                for (int q4 = 0; q4 < 4; ++q4)
#pragma unroll
                    for (int j = 0; j < SN_F / 8; ++j)
                        if (j0 + j * 8 + 2 * t + q4 % 2 >= vis[mt][q4 / 2]) s[mt][j][q4] = -INFINITY;
        }
        float alpha[MT_F][2];
#pragma unroll
        for (int mt = 0; mt < MT_F; ++mt)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                // The maximum of the unscaled scores (c > 0: the host says so), scaled once; each
                // probability one fma and one exp2. Maximum and sum as trees over the row's pairs:
                // short dependency chains.
                float tr[SN_F / 8];
#pragma unroll
                for (int j = 0; j < SN_F / 8; ++j) tr[j] = fmax(s[mt][j][2 * h2], s[mt][j][2 * h2 + 1]);
#pragma unroll
                for (int w = SN_F / 16; w >= 1; w /= 2)
#pragma unroll
                    for (int j = 0; j < w; ++j) tr[j] = fmax(tr[j], tr[j + w]);
                float mx = tr[0];
                float mn = fmax(m[mt][h2], quad_max(mx) * c);
                float base = mn == -INFINITY ? 0.0f : mn;
                alpha[mt][h2] = exp2_ftz(m[mt][h2] - base);
#pragma unroll
                for (int j = 0; j < SN_F / 8; ++j) {
                    float p0 = exp2_ftz(fma(s[mt][j][2 * h2], c, -base));
                    float p1 = exp2_ftz(fma(s[mt][j][2 * h2 + 1], c, -base));
                    s[mt][j][2 * h2] = p0;
                    s[mt][j][2 * h2 + 1] = p1;
                    tr[j] = p0 + p1;
                }
#pragma unroll
                for (int w = SN_F / 16; w >= 1; w /= 2)
#pragma unroll
                    for (int j = 0; j < w; ++j) tr[j] += tr[j + w];
                float sum = tr[0];
                l[mt][h2] = l[mt][h2] * alpha[mt][h2] + sum;
                m[mt][h2] = mn;
            }
        LAND(vs);
        barrier(CLK_LOCAL_MEM_FENCE);  // the values are in; every warp is done with the keys
        if (j0 + SN_F < kend) ISSUE(ks, k, kbase, G.k_st, j0 + SN_F, G.tk);
#pragma unroll
        for (int mt = 0; mt < MT_F; ++mt)
#pragma unroll
            for (int dn = 0; dn < DN; ++dn)
#pragma unroll
                for (int q4 = 0; q4 < 4; ++q4) acc[mt][dn][q4] *= alpha[mt][q4 / 2];
        ACCUMULATE(acc, s, MT_F, SN_F, vs);
    }
#undef ISSUE
#undef LAND
#undef QF
#pragma unroll
    for (int mt = 0; mt < MT_F; ++mt) {
        float inv[2];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            float lt = quad_sum(l[mt][h2]);
            inv[h2] = lt > 0.0f ? 1.0f / lt : 0.0f;
            uint row = w0 + 16 * mt + g + 8 * h2;
            if (t == 0 && row < G.tq)
                lse[bh * G.tq + row] = lt > 0.0f ? (m[mt][h2] + log2(lt)) * M_LN2_F : -INFINITY;
        }
        STORE_ROWS(o, acc[mt], w0 + 16 * mt, G.tq, inv, G.o_off + b * G.o_sb + h * G.o_sh + row * G.o_st);
    }
}

// delta[r] = rowsum(do * o) of rows i0 .. i0 + 63 into dls (and the global delta); lse into ls
// in base-2 units. Two work-items per row.
inline void row_stats(__local float* ls, __local float* dls, __global float* delta,
                      __global const float* lse, __global const T* dout, __global const T* o,
                      const AttnGeom* G, uint b, uint h, uint bh, uint i0, uint lid) {
    uint r = lid / 2, i = i0 + r;
    float sum = 0.0f;
    if (i < G->tq) {
        uint dat = G->o_off + b * G->o_sb + h * G->o_sh + i * G->o_st;
        uint oat = G->x_off + b * G->x_sb + h * G->x_sh + i * G->x_st;
        for (uint e = lid % 2; e < HEAD_DIM; e += 2) sum += LOAD(dout, dat + e) * LOAD(o, oat + e);
    }
    sum += shfl_xor(sum, 1);
    if (lid % 2 == 0) {
        dls[r] = sum;
        ls[r] = i < G->tq ? lse[bh * G->tq + i] * M_LOG2E_F : -INFINITY;
        if (i < G->tq) delta[bh * G->tq + i] = sum;
    }
}

// Keys and values a dq step takes (SN_Q), double-buffered (64 was slower at head dim 64).
#define SN_Q 32
#define DQ_WORDS ((2 * ROWS > 4 * SN_Q ? 2 * ROWS : 4 * SN_Q) * RS)
#if DQ_WORDS * 4 + 8 * ROWS > 48 * 1024
#error "the dq kernel's tiles exceed 48 KiB of local memory"
#endif

// dq: (B, H, Tq, D) stored as dense (B, Tq, H, D); delta: (B, H, Tq), written here
// (rowsum(do * o)) for attention_bwd_dkdv_tc; do at o_*, o at x_*. Groups: B * H *
// ceil(Tq / 64), 128 items. Each step's keys and values were copied during the step before.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_bwd_dq_tc(__global T* dq, __global float* delta, __global const T* q,
                         __global const T* k, __global const T* v, __global const T* dout,
                         __global const T* o, __global const float* lse, AttnGeom G, float scale) {
    __local uint sm[DQ_WORDS] __attribute__((aligned(16)));
    __local float ls[ROWS], dls[ROWS];
    const uint lid = get_local_id(0), lane = lid % 32, warp = lid / 32, g = lane / 4, t = lane % 4;
    // The last query blocks see the most keys: they start first, so the short ones fill the tail.
    const uint nqb = (G.tq + ROWS - 1) / ROWS, grp = get_group_id(0), qb = nqb - 1 - grp % nqb;
    const uint bh = grp / nqb;
    const uint h = bh % G.heads, b = bh / G.heads, hk = h / (G.heads / G.kv_heads);
    const uint i0 = qb * ROWS, w0 = i0 + warp * 16;
    const uint kbase = G.k_off + b * G.k_sb + hk * G.k_sh, vbase = G.v_off + b * G.v_sb + hk * G.v_sh;
    load_tile(sm, q, G.q_off + b * G.q_sb + h * G.q_sh, G.q_st, i0, G.tq, lid, ROWS);
    load_tile(sm + ROWS * RS, dout, G.o_off + b * G.o_sb + h * G.o_sh, G.o_st, i0, G.tq, lid, ROWS);
    row_stats(ls, dls, delta, lse, dout, o, &G, b, h, bh, i0, lid);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[1][DK][4], df[1][DK][4];
    FRAG_A(qf[0], sm, warp * 16);
    FRAG_A(df[0], sm + ROWS * RS, warp * 16);
    float li[2], dl[2];
    uint vis[2];
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
        uint r = warp * 16 + g + 8 * h2;
        li[h2] = ls[r];
        dl[h2] = dls[r];
        vis[h2] = li[h2] == -INFINITY ? 0u : visible(&G, min(i0 + r, G.tq - 1));
    }
#define QF(a, mt, kk) COPY_A(a, qf[mt], kk)
#define DF(a, mt, kk) COPY_A(a, df[mt], kk)
    const float c = scale * M_LOG2E_F;
    float acc[1][DN][4];
    ZERO(acc, 1);
    const uint kend = visible(&G, min(i0 + ROWS - 1, G.tq - 1));
    const uint kfull = visible(&G, i0);
    // Buffer n's keys at sm + 2n SN_Q rows, its values right after.
#define KS(n) (sm + (2 * (n)) * SN_Q * RS)
#define VS(n) (sm + (2 * (n) + 1) * SN_Q * RS)
#ifdef IO_F32
    CHUNK kfl[PER(SN_Q)], vfl[PER(SN_Q)];
#define ISSUE(n, j)                                                                            \
    {                                                                                          \
        fetch_tile(kfl, k, kbase, G.k_st, j, G.tk, lid, SN_Q);                                 \
        fetch_tile(vfl, v, vbase, G.v_st, j, G.tk, lid, SN_Q);                                 \
    }
#define LAND(n)                                                                                \
    {                                                                                          \
        stage_tile(KS(n), kfl, lid, SN_Q);                                                     \
        stage_tile(VS(n), vfl, lid, SN_Q);                                                     \
    }
#else
#define ISSUE(n, j)                                                                            \
    {                                                                                          \
        copy_tile(KS(n), k, kbase, G.k_st, j, G.tk, lid, SN_Q);                                \
        copy_tile(VS(n), v, vbase, G.v_st, j, G.tk, lid, SN_Q);                                \
    }
#define LAND(n) { cp_wait_all(); }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);  // the owned rows' fragments are read: the stream takes the memory
    if (kend > 0) ISSUE(0, 0)
    // One step on buffer N from key J0; two steps an iteration, so each step's buffer addresses
    // are constants.
#define DQ_STEP(N, J0)                                                                          \
    {                                                                                           \
        const uint n = (N), j0 = (J0);                                                          \
        LAND(n)                                                                                 \
        barrier(CLK_LOCAL_MEM_FENCE); /* buffer n is in; every warp is done with n ^ 1 */       \
        if (j0 + SN_Q < kend) ISSUE(n ^ 1, j0 + SN_Q)                                           \
        __local uint *const ks = KS(n), *const vs = VS(n);                                      \
        float s[1][SN_Q / 8][4], dp[1][SN_Q / 8][4];                                            \
        SCORES(s, 1, SN_Q, ks, QF);                                                             \
        SCORES(dp, 1, SN_Q, vs, DF);                                                            \
        _Pragma("unroll") for (int j = 0; j < SN_Q / 8; ++j)                                    \
        _Pragma("unroll") for (int q4 = 0; q4 < 4; ++q4)                                        \
            s[0][j][q4] = exp2_ftz(s[0][j][q4] * c - li[q4 / 2]) * (dp[0][j][q4] - dl[q4 / 2]); \
        /* masks on the causal edge and in rows that see no key (vis 0): a branch of their own */ \
        if (j0 + SN_Q > kfull || vis[0] == 0 || vis[1] == 0) {                                  \
            _Pragma("unroll") for (int j = 0; j < SN_Q / 8; ++j)                                \
            _Pragma("unroll") for (int q4 = 0; q4 < 4; ++q4)                                    \
                if (j0 + j * 8 + 2 * t + q4 % 2 >= vis[q4 / 2]) s[0][j][q4] = 0.0f;             \
        }                                                                                       \
        ACCUMULATE(acc, s, 1, SN_Q, ks);                                                        \
    }
    for (uint jj = 0; jj < kend; jj += 2 * SN_Q) {
        DQ_STEP(0, jj)
        if (jj + SN_Q < kend) DQ_STEP(1, jj + SN_Q)
    }
#undef DQ_STEP
#undef ISSUE
#undef LAND
#undef KS
#undef VS
#undef QF
#undef DF
    float mul[2] = {scale, scale};
    STORE_ROWS(dq, acc[0], w0, G.tq, mul, ((b * G.tq + row) * G.heads + h) * HEAD_DIM);
}

// dk/dv's streamed tiles: with 16-bit storage up to head dim 64, double-buffered through
// cp.async (one barrier a step); else fetched into registers a step ahead (f32 storage is
// rounded on the way; above head dim 64 the value rows keep local memory the second buffer needs).
#if HEAD_DIM <= 64 && !defined(IO_F32)
#define DKDV_ASYNC
#define DKDV_WORDS ((2 * ROWS > 4 * SN_KV ? 2 * ROWS : 4 * SN_KV) * RS)
#else
#define DKDV_WORDS (2 * ROWS * RS)
#endif
#if DKDV_WORDS * 4 + 16 * SN_KV > 48 * 1024
#error "the dk/dv kernel's tiles exceed 48 KiB of local memory"
#endif

// dk, dv: (B, Hkv, Tk, D) stored as dense (B, Tk, Hkv, D), summed over the H / Hkv query heads
// of each key head; do at o_*; lse and delta as the dq kernel left them. Groups: B * Hkv *
// ceil(Tk / 64), 128 items.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_bwd_dkdv_tc(__global T* dk, __global T* dv, __global const T* q,
                           __global const T* k, __global const T* v, __global const T* dout,
                           __global const float* lse, __global const float* delta, AttnGeom G,
                           float scale) {
    __local uint sm[DKDV_WORDS] __attribute__((aligned(16)));
    // Each step's lse (as the forward left it: natural log) and delta of its queries.
    __local float lsb[2][SN_KV], dlsb[2][SN_KV];
#ifndef DKDV_ASYNC
    // Streamed query and output-gradient tiles; the block's values stay at vb where VF_LOCAL.
    __local uint *const qs = sm, *const ds = sm + SN_KV * RS;
    __local float *const ls = lsb[0], *const dls = dlsb[0];
#endif
    __local uint *const vb = sm + ROWS * RS;
    const uint lid = get_local_id(0), lane = lid % 32, warp = lid / 32, g = lane / 4, t = lane % 4;
    // The first key blocks see the most queries: they start first (then every (batch, key head)
    // pair's next block), so the short ones fill the tail.
    const uint nbh = G.batch * G.kv_heads, grp = get_group_id(0), kbk = grp / nbh, bhk = grp % nbh;
    const uint hk = bhk % G.kv_heads, b = bhk / G.kv_heads, group = G.heads / G.kv_heads;
    const uint j0 = kbk * ROWS, w0 = j0 + warp * 16;
    // The block's keys and values as A fragments.
    load_tile(sm, k, G.k_off + b * G.k_sb + hk * G.k_sh, G.k_st, j0, G.tk, lid, ROWS);
    load_tile(vb, v, G.v_off + b * G.v_sb + hk * G.v_sh, G.v_st, j0, G.tk, lid, ROWS);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint kf[1][DK][4];
    FRAG_A(kf[0], sm, warp * 16);
#define KF(a, mt, kk) COPY_A(a, kf[mt], kk)
#ifdef VF_LOCAL
#define VF(a, mt, kk) LOAD_A(a, vb, warp * 16, kk)
#else
    uint vf[1][DK][4];
    FRAG_A(vf[0], vb, warp * 16);
#define VF(a, mt, kk) COPY_A(a, vf[mt], kk)
#endif
    const float c = scale * M_LOG2E_F;
    float adk[1][DN][4], adv[1][DN][4];
    ZERO(adk, 1);
    ZERO(adv, 1);
    // Causal: query i sees key j iff j <= i + offset; the first query to see key j0.
    const int first = G.causal ? (int)j0 - G.offset : 0;
    const uint istart = first <= 0 ? 0u : ((uint)first / SN_KV) * SN_KV;
    // Queries from which on every query sees every key of the warp's rows (no masking).
    const int all = G.causal ? (int)min(w0 + 15, G.tk - 1) - G.offset : 0;
    // Steps over (query head of the group, query tile from istart).
    const uint tiles = istart < G.tq ? (G.tq - istart + SN_KV - 1) / SN_KV : 0, steps = group * tiles;
#define STEP_HEAD(n) (hk * group + (n) / tiles)
#define STEP_ROW(n) (istart + ((n) % tiles) * SN_KV)
#ifdef DKDV_ASYNC
#define QS(x) (sm + (2 * (x)) * SN_KV * RS)
#define DS(x) (sm + (2 * (x) + 1) * SN_KV * RS)
    // Step n's tiles and row statistics into buffer x (zeros past Tq) as one group of copies.
#define ISSUE(x, n)                                                                            \
    {                                                                                          \
        const uint h_ = STEP_HEAD(n), i0_ = STEP_ROW(n), bh_ = b * G.heads + h_;               \
        copy_tile(QS(x), q, G.q_off + b * G.q_sb + h_ * G.q_sh, G.q_st, i0_, G.tq, lid, SN_KV); \
        copy_tile(DS(x), dout, G.o_off + b * G.o_sb + h_ * G.o_sh, G.o_st, i0_, G.tq, lid, SN_KV); \
        if (lid < SN_KV) {                                                                     \
            const uint i_ = i0_ + lid, in = i_ < G.tq ? 4u : 0u, at = bh_ * G.tq + (in ? i_ : 0u); \
            __asm__ volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"                    \
                             ::"r"((uint)(size_t)&lsb[x][lid]), "l"(lse + at), "r"(in) : "memory"); \
            __asm__ volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"                    \
                             ::"r"((uint)(size_t)&dlsb[x][lid]), "l"(delta + at), "r"(in) : "memory"); \
        }                                                                                      \
        __asm__ volatile("cp.async.commit_group;" ::: "memory");                               \
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // the block's fragments are read: the stream takes the memory
    if (steps > 0) ISSUE(0, 0)
#else
    CHUNK qr[PER(SN_KV)], dr[PER(SN_KV)];
    float lq_r = 0.0f, dl_r = 0.0f;
#define FETCH_STEP(n)                                                                          \
    {                                                                                          \
        const uint h_ = STEP_HEAD(n), i0_ = STEP_ROW(n);                                       \
        fetch_tile(qr, q, G.q_off + b * G.q_sb + h_ * G.q_sh, G.q_st, i0_, G.tq, lid, SN_KV);  \
        fetch_tile(dr, dout, G.o_off + b * G.o_sb + h_ * G.o_sh, G.o_st, i0_, G.tq, lid, SN_KV); \
        if (lid < SN_KV) {                                                                     \
            const uint i_ = i0_ + lid, bh_ = b * G.heads + h_;                                 \
            lq_r = i_ < G.tq ? lse[bh_ * G.tq + i_] : 0.0f;                                    \
            dl_r = i_ < G.tq ? delta[bh_ * G.tq + i_] : 0.0f;                                  \
        }                                                                                      \
    }
    if (steps > 0) FETCH_STEP(0)
#endif
    for (uint n = 0; n < steps; ++n) {
        const uint i0 = STEP_ROW(n);
#ifdef DKDV_ASYNC
        const uint x = n & 1;
        cp_wait_all();
        barrier(CLK_LOCAL_MEM_FENCE);  // buffer x is in; every warp is done with buffer x ^ 1
        if (n + 1 < steps) ISSUE(x ^ 1, n + 1)
        __local uint *const qs = QS(x), *const ds = DS(x);
        __local float *const ls = lsb[x], *const dls = dlsb[x];
#else
        barrier(CLK_LOCAL_MEM_FENCE);
        stage_tile(qs, qr, lid, SN_KV);
        stage_tile(ds, dr, lid, SN_KV);
        if (lid < SN_KV) {
            ls[lid] = lq_r;
            dls[lid] = dl_r;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n + 1 < steps) FETCH_STEP(n + 1)
#endif
        // Transposed scores: rows are the warp's keys, columns the tile's queries.
        float s[1][SN_KV / 8][4], dp[1][SN_KV / 8][4];
        SCORES(s, 1, SN_KV, qs, KF);
        // Off the edge every query of the tile exists, sees every key of the warp's rows and has
        // a finite lse.
        const bool edge = (int)i0 < all || i0 + SN_KV > G.tq;
        if (edge) {
#pragma unroll
            for (int j = 0; j < SN_KV / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    uint col = j * 8 + 2 * t + e, i = i0 + col;
                    float lq = ls[col] * M_LOG2E_F;
#pragma unroll
                    for (int h2 = 0; h2 < 2; ++h2) {
                        int key = (int)(w0 + g + 8 * h2);
                        bool on = i < G.tq && lq != -INFINITY && (!G.causal || key <= (int)i + G.offset);
                        s[0][j][2 * h2 + e] = on ? exp2_ftz(fma(s[0][j][2 * h2 + e], c, -lq)) : 0.0f;
                    }
                }
        } else {
#pragma unroll
            for (int j = 0; j < SN_KV / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float lq = ls[j * 8 + 2 * t + e] * M_LOG2E_F;
#pragma unroll
                    for (int h2 = 0; h2 < 2; ++h2)
                        s[0][j][2 * h2 + e] = exp2_ftz(fma(s[0][j][2 * h2 + e], c, -lq));
                }
        }
        ACCUMULATE(adv, s, 1, SN_KV, ds);
        SCORES(dp, 1, SN_KV, ds, VF);
#pragma unroll
        for (int j = 0; j < SN_KV / 8; ++j)
#pragma unroll
            for (int q4 = 0; q4 < 4; ++q4) s[0][j][q4] *= dp[0][j][q4] - dls[j * 8 + 2 * t + q4 % 2];
        ACCUMULATE(adk, s, 1, SN_KV, qs);
    }
#undef ISSUE
#undef FETCH_STEP
#undef STEP_HEAD
#undef STEP_ROW
#undef QS
#undef DS
#undef KF
#undef VF
    float one[2] = {1.0f, 1.0f}, mul[2] = {scale, scale};
    STORE_ROWS(dk, adk[0], w0, G.tk, mul, ((b * G.tk + row) * G.kv_heads + hk) * HEAD_DIM);
    STORE_ROWS(dv, adv[0], w0, G.tk, one, ((b * G.tk + row) * G.kv_heads + hk) * HEAD_DIM);
}
