// matmul_tc.cl: batched GEMM C = act(A·B + bias) on NVIDIA tensor cores through inline PTX mma.sync (sm_80+ PTX).
// Built only for devices whose probe (crates/ops/src/matmul/tc.rs) gave exact results.
// -DTC_TF32 (f32 storage, TF32 inputs, m16n8k8), -DTC_BF16 or -DTC_F16 (16-bit storage, m16n8k16); f32 accumulation.
// Operands K-contiguous, or (16-bit only) -DA_MN: A stored (K, M) with M contiguous, -DB_KN: B stored
// (K, N) with N contiguous (row-major B), read through ldmatrix.trans; M resp. N a multiple of 8.
// -DC_F32: C and the bias are f32 (16-bit products written without rounding to 16 bits).
// -DALIGNED: M and N are multiples of the tile (no row checks). -DTC_KERNEL: the kernel's name.
// The epilogue's `activate` comes as in matmul.cl (a generated `#define ACTIVATION` + function in front).
//
// A work-group of WG (WARPS_M x WARPS_N warps) computes a TBM x TBN tile; a warp WMI x WNJ mma
// tiles. Both operands are staged in local memory as 32-bit words along K (one TF32 element, or
// two 16-bit elements with the lower K index in the low half, as mma wants them), rows of SROW
// words. Fragments come out through ldmatrix (four 8 x 8 matrices of 16-bit elements an
// instruction; a TF32 element is two of them), whose eight 16-byte rows a phase hit distinct banks.
#ifndef TC_KERNEL
#error "matmul_tc.cl needs -DTC_KERNEL=<kernel name> (set by matmul_tc.rs)"
#endif
// Warp grid WARPS_M x WARPS_N; a warp computes WMI x WNJ mma tiles (16 x 8 each).
#ifndef WARPS_M
#define WARPS_M 2
#define WARPS_N 2
#define WMI 4
#define WNJ 8
#endif
#if WNJ % 2
#error "WNJ must be even: B fragments come two mma tiles per ldmatrix"
#endif
#define TBM (WARPS_M * WMI * 16)
#define TBN (WARPS_N * WNJ * 8)
#define WG (32 * WARPS_M * WARPS_N)
#if defined(TC_TF32)
#define EPW 1
#else
#define EPW 2
#endif
// -DASYNC: tiles go global -> local memory through cp.async (no registers), STAGES deep; else
// through registers (the next tile is fetched while the current one is multiplied).
#ifdef ASYNC
#define STAGES 2
#else
#define STAGES 1
#endif
#ifndef KW
#define KW 32           // words of K per tile step
#endif
#define TBK (KW * EPW)  // elements of K per tile step
#define SROW (KW + 4)   // local row stride in words (K-contiguous tiles)
#if (defined(A_MN) || defined(B_KN)) && defined(TC_TF32)
#error "M/N-contiguous operands take 16-bit elements (ldmatrix.trans)"
#endif
// A tile in local memory: TBM rows of K words, or (A_MN) TBK rows of TBM elements; B likewise.
#ifdef A_MN
#define A_ROW (TBM / 2 + 4)
#define A_WORDS (TBK * A_ROW)
#else
#define A_WORDS (TBM * SROW)
#endif
#ifdef B_KN
#define B_ROW (TBN / 2 + 4)
#define B_WORDS (TBK * B_ROW)
#else
#define B_WORDS (TBN * SROW)
#endif
#ifdef C_F32
typedef float OT;
#define OLOAD(p, i) ((p)[i])
#define OSTORE(p, i, v) ((p)[i] = (v))
#else
typedef T OT;
#define OLOAD(p, i) LOAD(p, i)
#define OSTORE(p, i, v) STORE(p, i, v)
#endif

#ifndef ACTIVATION
inline ACC activate(ACC v) { return v; }
#endif

#if defined(TC_TF32)
// f32 bits rounded to TF32 (10 mantissa bits; nearest, ties away from zero, as cvt.rna, which
// compiles to a slow sequence). A NaN whose payload lies only in the low 13 bits would become
// an infinity; canonical NaNs stay NaNs.
#ifdef TF32_TRUNC
#define TF32(u) (u)
#else
#define TF32(u) (((u) + 0x1000u) & 0xffffe000u)
#endif
#else
#define TF32(u) (u)
#endif
// MMA, LDMATRIX_X4 and LDMATRIX_X4_T come from common.cl's tensor-core section.

// Operand rows are K-contiguous and 16-byte aligned, with K a multiple of 4 words (matmul_tc.rs
// copies an operand that is not): every fetch is one 16-byte copy of 4 words.
#define VPR (KW / 4)            // 16-byte vectors per tile row
#define A_VEC (TBM * VPR / WG)  // vectors each work-item stages per operand and step
#define B_VEC (TBN * VPR / WG)
#ifdef ALIGNED
#define IN(r, R) 1
#else
#define IN(r, R) ((r) < (R))
#endif
#define VEC(p, i) (*(__global const uint4*)((__global const uchar*)(p) + (i) * sizeof(T)))

#ifdef ASYNC
// 16 bytes global -> local without registers; zero-filled when !valid (nothing read).
inline void copy16(__local uint* dst, __global const T* src, uint valid) {
    __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((uint)(size_t)dst), "l"(src),
                     "r"(valid ? 16u : 0u)
                     : "memory");
}
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void TC_KERNEL(__global OT* c,          /* (batch, M, N) contiguous per batch: c[m * N + n] */
               __global const T* a,     /* (batch, M, K): a[m * sam + k]; A_MN: a[k * sam + m] */
               __global const T* b,     /* (batch, N, K): b[n * sbn + k]; B_KN: b[k * sbn + n] */
               __global const OT* bias, /* (N), read when has_bias */
               Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
               uint M, uint N, uint K, uint sam, uint sbn, uint has_bias) {
    // As[stage][m * SROW + w]: A's rows as words along K; Bs likewise B's columns.
    __local uint As[STAGES][A_WORDS] __attribute__((aligned(16)));
    __local uint Bs[STAGES][B_WORDS] __attribute__((aligned(16)));
    const uint tid = get_local_id(0), lane = tid % 32, warp = tid / 32;
    const uint g = lane / 4, t = lane % 4;
    const uint wm = (warp / WARPS_N) * (WMI * 16), wn = (warp % WARPS_N) * (WNJ * 8);
    const uint n0 = get_group_id(0) * TBN, m0 = get_group_id(1) * TBM;
    const uint3 o = layout_offsets(&batch, get_global_id(2));
    float acc[WMI][WNJ][4];
#pragma unroll
    for (int i = 0; i < WMI; ++i)
#pragma unroll
        for (int j = 0; j < WNJ; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

// Vector s of a work-item: tile row e / VPR, words 4 (e % VPR) .. + 3 (l: its local word, gi: its
// first element, ok: inside the matrix); M/N-contiguous: k row e / (TBM / 8), elements 8 (e % ..).
#ifdef A_MN
#define A_AT(s, k0) uint e = tid + (s) * WG, r = m0 + (e % (TBM / 8)) * 8, k = (k0) + e / (TBM / 8); \
    uint l = (e / (TBM / 8)) * A_ROW + (e % (TBM / 8)) * 4; uint ok = IN(r, M) && k < K; uint gi = o.y + k * sam + r;
#else
#define A_AT(s, k0) uint e = tid + (s) * WG, r = m0 + e / VPR, k = (k0) + (e % VPR) * 4 * EPW; \
    uint l = (e / VPR) * SROW + (e % VPR) * 4; uint ok = IN(r, M) && k < K; uint gi = o.y + r * sam + k;
#endif
#ifdef B_KN
#define B_AT(s, k0) uint e = tid + (s) * WG, r = n0 + (e % (TBN / 8)) * 8, k = (k0) + e / (TBN / 8); \
    uint l = (e / (TBN / 8)) * B_ROW + (e % (TBN / 8)) * 4; uint ok = IN(r, N) && k < K; uint gi = o.z + k * sbn + r;
#else
#define B_AT(s, k0) uint e = tid + (s) * WG, r = n0 + e / VPR, k = (k0) + (e % VPR) * 4 * EPW; \
    uint l = (e / VPR) * SROW + (e % VPR) * 4; uint ok = IN(r, N) && k < K; uint gi = o.z + r * sbn + k;
#endif

#ifdef ASYNC
#define ISSUE(st, k0)                                                                  \
    _Pragma("unroll") for (int s = 0; s < A_VEC; ++s) {                                \
        A_AT(s, k0) copy16(&As[st][l], ok ? a + gi : a, ok);                           \
    }                                                                                  \
    _Pragma("unroll") for (int s = 0; s < B_VEC; ++s) {                                \
        B_AT(s, k0) copy16(&Bs[st][l], ok ? b + gi : b, ok);                           \
    }                                                                                  \
    __asm__ volatile("cp.async.commit_group;" ::: "memory");
    ISSUE(0, 0)
    for (uint k0 = 0; k0 < K; k0 += TBK) {
        const uint st = (k0 / TBK) % STAGES;
        if (k0 + TBK < K) {
            ISSUE((st + 1) % STAGES, k0 + TBK)
            __asm__ volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            __asm__ volatile("cp.async.wait_group 0;" ::: "memory");
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#else
    uint4 ra[A_VEC], rb[B_VEC];
#define FETCH(k0)                                                                      \
    _Pragma("unroll") for (int s = 0; s < A_VEC; ++s) {                                \
        A_AT(s, k0) ra[s] = ok ? VEC(a, gi) : (uint4)(0);                              \
    }                                                                                  \
    _Pragma("unroll") for (int s = 0; s < B_VEC; ++s) {                                \
        B_AT(s, k0) rb[s] = ok ? VEC(b, gi) : (uint4)(0);                              \
    }
    FETCH(0)
    for (uint k0 = 0; k0 < K; k0 += TBK) {
        const uint st = 0;
#pragma unroll
        for (int s = 0; s < A_VEC; ++s) {
            A_AT(s, 0)
            *(__local uint4*)&As[0][l] = ra[s];
        }
#pragma unroll
        for (int s = 0; s < B_VEC; ++s) {
            B_AT(s, 0)
            *(__local uint4*)&Bs[0][l] = rb[s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + TBK < K) {
            FETCH(k0 + TBK)
        }
#endif
#pragma unroll
        for (uint kw = 0; kw < KW; kw += 8) {
            uint af[WMI][4], bf[WNJ][2];
            // Four 8 x 8 matrices of 16-bit elements (8 x 4 words) per instruction, lane l giving
            // the address of row l % 8 of matrix l / 8: A's (rows +0/+8, words +0/+4) in the
            // order of mma's a0..a3; B's (columns j, j + 1) x (words +0/+4).
// M/N-contiguous tiles: the same matrices from rows along K (element k 2 kw ..), transposed.
#pragma unroll
            for (int i = 0; i < WMI; ++i) {
#ifdef A_MN
                uint kr = 2 * kw + 8 * (lane / 16) + lane % 8;
                LDMATRIX_X4_T(af[i], &As[st][kr * A_ROW + (wm + i * 16 + 8 * ((lane / 8) % 2)) / 2]);
#else
                uint r = wm + i * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                LDMATRIX_X4(af[i], &As[st][r * SROW + kw + 4 * (lane / 16)]);
#endif
#pragma unroll
                for (int q = 0; q < 4; ++q) af[i][q] = TF32(af[i][q]);
            }
#pragma unroll
            for (int j = 0; j < WNJ; j += 2) {
                uint x[4];
#ifdef B_KN
                uint kr = 2 * kw + 8 * ((lane / 8) % 2) + lane % 8;
                LDMATRIX_X4_T(x, &Bs[st][kr * B_ROW + (wn + (j + lane / 16) * 8) / 2]);
#else
                uint r = wn + j * 8 + (lane % 8) + 8 * (lane / 16);
                LDMATRIX_X4(x, &Bs[st][r * SROW + kw + 4 * ((lane / 8) % 2)]);
#endif
                bf[j][0] = TF32(x[0]);
                bf[j][1] = TF32(x[1]);
                bf[j + 1][0] = TF32(x[2]);
                bf[j + 1][1] = TF32(x[3]);
            }
#pragma unroll
            for (int i = 0; i < WMI; ++i)
#pragma unroll
                for (int j = 0; j < WNJ; ++j) MMA(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    // acc[i][j] = {(g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)} of mma tile (i, j).
#pragma unroll
    for (int i = 0; i < WMI; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint m = m0 + wm + i * 16 + g + h * 8;
            if (m >= M) continue;
#pragma unroll
            for (int j = 0; j < WNJ; ++j) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    uint n = n0 + wn + j * 8 + 2 * t + q;
                    if (n < N) {
                        ACC v = acc[i][j][2 * h + q];
                        if (has_bias) v += OLOAD(bias, n);
                        OSTORE(c, o.x + m * N + n, activate(v));
                    }
                }
            }
        }
    }
}
