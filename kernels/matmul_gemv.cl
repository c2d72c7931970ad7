// matmul_gemv.cl: skinny products (launched by ops/src/matmul/matmul_gemv.rs): R <= 16 "few" rows F (R, K) against the "many" operand G (K, J),
// c[r * scr + j * scj] = act(sum_k F[r, k] G[k, j] + bias), the bias indexed by r (bias_r) or j.
// A product with M <= 16 takes F = A, G = B; one with N <= 16 takes F = Bᵀ, G = Aᵀ (a classifier
// head, a LoRA down-projection). Each column j of G has `team` work-items (a power of two up to
// the group) summing a slice of K each, R sums a work-item, and G is read once:
// - kmajor (G's K contiguous: a row-major weight W (J, K) as G = Wᵀ): a team is adjacent
//   work-items, so a step reads team contiguous elements of K;
// - else (G's columns contiguous: activations (K, J)): the group's GEMV_GROUP / team columns are
//   adjacent work-items, each team member a row of them.
// Then a tree sum of each team's partial sums in local memory. Two kernels: at most 4 rows
// (matmul_gemv4, one-token decoding) and 16 (matmul_gemv16); rows past R re-read row R - 1 and are
// summed too (no branch in the loops, so every row's loads are in flight at once) but never stored.
#ifndef ACTIVATION  // the epilogue's activation, generated in front of this file (matmul/source.rs)
inline ACC activate(ACC v) { return v; }
#endif
#define GEMV_GROUP 256
#define SKINNY_MAX 16
// -DROW_SUMS: also F's row sums over K (rows of A: a narrow layer's bias gradient), from the first
// group's work-items, into rsum (R); otherwise rsum is not touched.
#ifdef ROW_SUMS
#define RS_ONLY(x) x
#else
#define RS_ONLY(x)
#endif
// Each team's sums of v[r] (rmax per work-item) into its first member's part[r][lid].
#define TEAM_SUM(v)                                                                                \
    _Pragma("unroll") for (uint r = 0; r < rmax; ++r) part[r][lid] = v[r];                         \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                  \
    for (uint s = team / 2; s > 0; s >>= 1) {                                                      \
        if (lane < s)                                                                              \
            _Pragma("unroll") for (uint r = 0; r < rmax; ++r) part[r][lid] +=                      \
                part[r][lid + s * apart];                                                          \
        barrier(CLK_LOCAL_MEM_FENCE);                                                              \
    }
#define SKINNY_ARGS \
    c, f, g, bias, rsum, R, J, K, sfr, sfk, sgk, sgj, f_off, g_off, scr, scj, team, kmajor, has_bias, bias_r
// The kernels' body for at most `rmax` rows (a constant once inlined), part: (rmax, GEMV_GROUP).
inline void skinny(const uint rmax, __local ACC (*part)[GEMV_GROUP], __global T* c, __global const T* f,
                   __global const T* g, __global const T* bias, __global T* rsum, uint R, uint J, uint K,
                   uint sfr, uint sfk, uint sgk, uint sgj, uint f_off, uint g_off, uint scr, uint scj,
                   uint team, uint kmajor, uint has_bias, uint bias_r) {
    const uint lid = get_local_id(0), cols = GEMV_GROUP / team;
    const uint lane = kmajor ? lid % team : lid / cols;
    const uint j = get_group_id(0) * cols + (kmajor ? lid / team : lid % cols);
    const uint apart = kmajor ? 1 : cols;  // how far apart a team's members sit
    ACC acc[SKINNY_MAX];
    RS_ONLY(ACC fs[SKINNY_MAX];)
    uint row[SKINNY_MAX];
#pragma unroll
    for (uint r = 0; r < rmax; ++r) {
        acc[r] = (ACC)0;
        RS_ONLY(fs[r] = (ACC)0;)
        row[r] = f_off + min(r, R - 1) * sfr;
    }
    if (j < J) {
#pragma unroll 2
        for (uint k = lane; k < K; k += team) {
            ACC x = LOAD(g, g_off + k * sgk + j * sgj);
#pragma unroll
            for (uint r = 0; r < rmax; ++r) {
                ACC w = LOAD(f, row[r] + k * sfk);
                acc[r] += w * x;
                RS_ONLY(fs[r] += w;)
            }
        }
    }
    TEAM_SUM(acc)
    if (lane == 0 && j < J) {
        for (uint r = 0; r < R; ++r) {
            ACC v = part[r][lid];
            if (has_bias) v += LOAD(bias, bias_r ? r : j);
            STORE(c, r * scr + j * scj, activate(v));
        }
    }
#ifdef ROW_SUMS
    if (get_group_id(0) == 0) {  // column 0's team covers all of K
        barrier(CLK_LOCAL_MEM_FENCE);
        TEAM_SUM(fs)
        if (lid == 0)
            for (uint r = 0; r < R; ++r) STORE(rsum, r, part[r][0]);
    }
#endif
}
// The two kernels' parameters (written out, so that netcl-graph reads which ones they write):
__kernel __attribute__((reqd_work_group_size(GEMV_GROUP, 1, 1)))
void matmul_gemv4(__global T* c,          /* c[r * scr + j * scj] */
                 __global const T* f,    /* (R, K): f[f_off + r * sfr + k * sfk] */
                 __global const T* g,    /* (K, J): g[g_off + k * sgk + j * sgj] */
                 __global const T* bias, /* (R) when bias_r, else (J); read when has_bias */
                 __global T* rsum,       /* (R): F's row sums (-DROW_SUMS) */
                 uint R, uint J, uint K, uint sfr, uint sfk, uint sgk, uint sgj, uint f_off, uint g_off,
                 uint scr, uint scj, uint team, uint kmajor, uint has_bias, uint bias_r) {
    __local ACC part[4][GEMV_GROUP];
    skinny(4, part, SKINNY_ARGS);
}
// Not for f64: its 32 KiB of partial sums would be all the local memory OpenCL promises.
#ifndef DT_F64
__kernel __attribute__((reqd_work_group_size(GEMV_GROUP, 1, 1)))
void matmul_gemv16(__global T* c, __global const T* f, __global const T* g, __global const T* bias,
                   __global T* rsum, uint R, uint J, uint K, uint sfr, uint sfk, uint sgk, uint sgj,
                   uint f_off, uint g_off, uint scr, uint scj, uint team, uint kmajor, uint has_bias,
                   uint bias_r) {
    __local ACC part[SKINNY_MAX][GEMV_GROUP];
    skinny(SKINNY_MAX, part, SKINNY_ARGS);
}
#endif
