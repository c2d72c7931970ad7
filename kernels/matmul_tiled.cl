// matmul_tiled.cl: batched GEMM C = act(A·B + bias) with local-memory tiles, register blocking and an epilogue (the portable kernel; launched by ops/src/matmul/matmul_tiled.rs); tile sizes come from -D (the planner's tile).
// -DBM, -DBN: output tile per work-group; -DBK: depth of one tile step; -DWM, -DWN: outputs per work-item;
// -DALIGNED: M, N and K are multiples of the tile (no bounds checks); -DROW_SUMS: also A's row sums;
// The epilogue: with an activation, ops/src/matmul/source.rs puts a generated `inline ACC activate(ACC v)` (the op's
// OpenCL text from the unary-op table, crates/ops/src/fused/expr.rs) and `#define ACTIVATION` before this file; without,
// it is the identity.
#ifndef BM
#define BM 64
#define BN 64
#define BK 16
#define WM 4
#define WN 4
#endif
#define TX (BN / WN)  // work-items along n
#define TY (BM / WM)  // work-items along m
#define NT (TX * TY)
#define PAD 4          // keeps rows 16-byte aligned and spreads transposed stores over banks

#ifndef ACTIVATION
inline ACC activate(ACC v) { return v; }
#endif

// Work-items own register columns in groups of GW contiguous elements (vector-friendly local
// reads, coalesced stores); groups are strided by the work-group width.
#if WN % 4 == 0
#define GWN 4
#elif WN % 2 == 0
#define GWN 2
#else
#define GWN 1
#endif
#if WM % 4 == 0
#define GWM 4
#elif WM % 2 == 0
#define GWM 2
#else
#define GWM 1
#endif
#define ROW(i) (((i) / GWM) * (TY * GWM) + ty * GWM + (i) % GWM)  // row of register i in the tile
#define COL(j) (((j) / GWN) * (TX * GWN) + tx * GWN + (j) % GWN)  // column of register j
// Tile elements each work-item stages, one at a time; with -DA_K4 (A's K dim contiguous, its other strides, offset
// and K multiples of 4: f32 only) runs of 4 along K, one 16-byte load each, stored transposed (B likewise, -DB_K4).
#ifdef A_K4
#define A_PER (BM * BK / 4 / NT)
#else
#define A_PER ((BM * BK + NT - 1) / NT)
#endif
#define RS_PER ((BM + NT - 1) / NT)       // rows of A each work-item sums (-DROW_SUMS)
#if (defined(A_K4) && (BM * BK) % (4 * NT)) || (defined(B_K4) && (BN * BK) % (4 * NT))
#error "matmul_tiled.cl: -DA_K4 / -DB_K4 need the tile to split into whole runs of 4 per work-item"
#endif
#ifdef B_K4
#define B_PER (BN * BK / 4 / NT)
#else
#define B_PER ((BN * BK + NT - 1) / NT)
#endif

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void matmul_tiled(__global T* c,           /* (batch, M, ldc) contiguous per batch: c[m * ldc + c_col + n] */
            __global const T* a,     /* (batch, M, K): a[m * sam + k * sak] */
            __global const T* b,     /* (batch, K, N): b[k * sbk + n * sbn] */
            __global const T* bias,  /* (ldc), read at c_col + n when has_bias */
            Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
            uint M, uint N, uint K, uint sam, uint sak, uint sbk, uint sbn, uint has_bias,
            uint ldc, uint c_col,    /* this launch: columns c_col .. c_col + N of C (and B) */
            uint lower, int diag,    /* A zero past column m + diag (a hint; see lower_k_end) */
            __global T* rsum) {      /* (M): A's row sums over K (-DROW_SUMS, one batch) */
    __local ACC As[BK][BM + PAD] __attribute__((aligned(16)));
    __local ACC Bs[BK][BN + PAD] __attribute__((aligned(16)));
    const uint tx = get_local_id(0), ty = get_local_id(1);
    const uint tid = ty * TX + tx;
    const uint n0 = get_group_id(0) * BN, m0 = get_group_id(1) * BM;
    const uint3 o = layout_offsets(&batch, get_global_id(2));
    ACC acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = (ACC)0;
    // The next tile is loaded into registers while the current one is multiplied.
#ifdef A_K4
    float4 ra_next[A_PER];
#else
    ACC ra_next[A_PER];
#endif
#ifdef B_K4
    float4 rb_next[B_PER];
#else
    ACC rb_next[B_PER];
#endif

// Tile coordinates of staged element r: consecutive work-items walk the contiguous dim.
#ifdef A_K4
#define A_MK(r, mm, kk) uint e_ = tid + (r) * NT; uint mm = e_ / (BK / 4); uint kk = e_ % (BK / 4) * 4;
#define A_ZERO ((float4)0)
#define STAGE_A(r, mm, kk) As[kk][mm] = ra_next[r].x, As[kk + 1][mm] = ra_next[r].y, As[kk + 2][mm] = ra_next[r].z, As[kk + 3][mm] = ra_next[r].w;
#define LOAD_A(at) (*(__global const float4*)(a + (at)))
#else
#define A_MK(r, mm, kk) uint e_ = tid + (r) * NT; uint mm = sak == 1 ? e_ / BK : e_ % BM; uint kk = sak == 1 ? e_ % BK : e_ / BM;
#define A_ZERO ((ACC)0)
#define STAGE_A(r, mm, kk) As[kk][mm] = ra_next[r];
#define LOAD_A(at) LOAD(a, at)
#endif
#ifdef B_K4
#define B_NK(r, nn, kk) uint e_ = tid + (r) * NT; uint nn = e_ / (BK / 4); uint kk = e_ % (BK / 4) * 4;
#define B_ZERO ((float4)0)
#define STAGE_B(r, nn, kk) Bs[kk][nn] = rb_next[r].x, Bs[kk + 1][nn] = rb_next[r].y, Bs[kk + 2][nn] = rb_next[r].z, Bs[kk + 3][nn] = rb_next[r].w;
#define LOAD_B(at) (*(__global const float4*)(b + (at)))
#else
#define B_NK(r, nn, kk) uint e_ = tid + (r) * NT; uint nn = sbn == 1 ? e_ % BN : e_ / BK; uint kk = sbn == 1 ? e_ / BN : e_ % BK;
#define B_ZERO ((ACC)0)
#define STAGE_B(r, nn, kk) Bs[kk][nn] = rb_next[r];
#define LOAD_B(at) LOAD(b, at)
#endif
// Staged element r of this work-item sits at a fixed place in every tile: its offsets in A and B at
// k0 = 0 are computed once, and each step adds k0 times the K stride.
#if (BM * BK) % NT == 0 || defined(A_K4)
#define A_IN(r) 1
#else
#define A_IN(r) (tid + (r) * NT < BM * BK)
#endif
#if (BN * BK) % NT == 0 || defined(B_K4)
#define B_IN(r) 1
#else
#define B_IN(r) (tid + (r) * NT < BN * BK)
#endif
// Aligned: every staged element is in range; straight-line loads at the precomputed offsets.
// Otherwise: in range along M (A) or N (B) is bit r of a_ok / b_ok, and only the last, partial
// step of K checks K (a branch the aligned build leaves out: with it, aligned products on the H100
// ran 10% slower).
#ifdef ALIGNED
#define FETCH(k0)                                                                              \
    for (int r = 0; r < A_PER; ++r)                                                            \
        ra_next[r] = A_IN(r) ? LOAD_A(a_at[r] + (k0) * sak) : A_ZERO;                         \
    for (int r = 0; r < B_PER; ++r)                                                            \
        rb_next[r] = B_IN(r) ? LOAD_B(b_at[r] + (k0) * sbk) : B_ZERO;
#else
// Every check, recomputing the staged element's place (the last, partial step of K; and every
// step where a work-item stages more than 32 elements, beyond the bit masks).
#define FETCH_CHECKED(k0)                                                                      \
    for (int r = 0; r < A_PER; ++r) {                                                          \
        A_MK(r, mm, kk)                                                                        \
        bool in = A_IN(r) && m0 + mm < M && (k0) + kk < K;                                     \
        ra_next[r] = in ? LOAD_A(a_at[r] + (k0) * sak) : A_ZERO;                              \
    }                                                                                          \
    for (int r = 0; r < B_PER; ++r) {                                                          \
        B_NK(r, nn, kk)                                                                        \
        bool in = B_IN(r) && n0 + nn < N && (k0) + kk < K;                                     \
        rb_next[r] = in ? LOAD_B(b_at[r] + (k0) * sbk) : B_ZERO;                              \
    }
#if A_PER <= 32 && B_PER <= 32
#define MASKS
#define A_OK(r) ((a_ok >> (r)) & 1u)
#define B_OK(r) ((b_ok >> (r)) & 1u)
#define FETCH(k0)                                                                              \
    if ((k0) + BK <= K) {                                                                      \
        for (int r = 0; r < A_PER; ++r)                                                        \
            ra_next[r] = (A_IN(r) && A_OK(r)) ? LOAD_A(a_at[r] + (k0) * sak) : A_ZERO;        \
        for (int r = 0; r < B_PER; ++r)                                                        \
            rb_next[r] = (B_IN(r) && B_OK(r)) ? LOAD_B(b_at[r] + (k0) * sbk) : B_ZERO;        \
    } else {                                                                                   \
        FETCH_CHECKED(k0)                                                                      \
    }
#else
#define FETCH(k0) FETCH_CHECKED(k0)
#endif
#endif
#define STAGE()                                                                                \
    for (int r = 0; r < A_PER; ++r) {                                                          \
        A_MK(r, mm, kk)                                                                        \
        if (A_IN(r)) STAGE_A(r, mm, kk)                                                        \
    }                                                                                          \
    for (int r = 0; r < B_PER; ++r) {                                                          \
        B_NK(r, nn, kk)                                                                        \
        if (B_IN(r)) STAGE_B(r, nn, kk)                                                        \
    }

    uint a_at[A_PER], b_at[B_PER];
    for (int r = 0; r < A_PER; ++r) {
        A_MK(r, mm, kk)
        a_at[r] = o.y + (m0 + mm) * sam + kk * sak;
    }
    for (int r = 0; r < B_PER; ++r) {
        B_NK(r, nn, kk)
        b_at[r] = o.z + kk * sbk + (c_col + n0 + nn) * sbn;
    }
#ifdef MASKS
    uint a_ok = 0, b_ok = 0;
    for (int r = 0; r < A_PER; ++r) {
        A_MK(r, mm, kk)
        a_ok |= (uint)(m0 + mm < M) << r;
    }
    for (int r = 0; r < B_PER; ++r) {
        B_NK(r, nn, kk)
        b_ok |= (uint)(n0 + nn < N) << r;
    }
#endif
    const uint kend = lower_k_end(K, m0 + BM, lower, diag, BK);
#ifdef ROW_SUMS
    // A's row sums (a linear layer's bias gradient beside its weight gradient): the first column
    // of tiles adds up each staged A tile, work-item r taking rows r, r + NT, ... A build of its
    // own: the sums cost the other products 2% where they only sat behind a flag.
    const bool rs_on = n0 == 0 && c_col == 0 && get_group_id(2) == 0;  // one batch only
    ACC rs[RS_PER];
    for (int q = 0; q < RS_PER; ++q) rs[q] = (ACC)0;
#endif
    FETCH(0)
    for (uint k0 = 0; k0 < kend; k0 += BK) {
        STAGE()
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + BK < kend) {
            FETCH(k0 + BK)
        }
#ifdef ROW_SUMS
        if (rs_on)
            for (int q = 0; q < RS_PER; ++q)
                if (tid + q * NT < BM)
                    for (int kk = 0; kk < BK; ++kk) rs[q] += As[kk][tid + q * NT];
#endif
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            ACC ra[WM], rb[WN];
            for (int i = 0; i < WM; ++i) ra[i] = As[kk][ROW(i)];
            for (int j = 0; j < WN; ++j) rb[j] = Bs[kk][COL(j)];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] = mad(ra[i], rb[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < WM; ++i) {
        uint m = m0 + ROW(i);
        if (m >= M) continue;
        for (int j = 0; j < WN; ++j) {
            uint n = n0 + COL(j);
            if (n < N) {
                ACC v = acc[i][j];
                if (has_bias) v += LOAD(bias, c_col + n);
                STORE(c, o.x + m * ldc + c_col + n, activate(v));
            }
        }
    }
#ifdef ROW_SUMS
    if (rs_on)
        for (int q = 0; q < RS_PER; ++q)
            if (tid + q * NT < BM && m0 + tid + q * NT < M) STORE(rsum, m0 + tid + q * NT, rs[q]);
#endif
}
