// matmul_tc.cl: batched GEMM C = act(A·B + bias) on NVIDIA tensor cores through inline PTX mma.sync (sm_80+ PTX).
// Built only for devices whose probe (crates/ops/src/matmul/matmul_tc.rs) gave exact results.
// -DTC_TF32 (f32 storage, TF32 inputs, m16n8k8), -DTC_BF16 or -DTC_F16 (16-bit storage, m16n8k16); f32 accumulation.
// Operands K-contiguous, or (16-bit only) -DA_MN: A stored (K, M) with M contiguous, -DB_KN: B stored
// (K, N) with N contiguous (row-major B), read through ldmatrix.trans; M resp. N a multiple of 8.
// -DC_F32: C and the bias are f32 (16-bit products written without rounding to 16 bits).
// -DALIGNED: M and N are multiples of the tile (no row checks).
// The epilogue's `activate` comes as in matmul_tiled.cl (a generated `#define ACTIVATION` + function in front).
//
// A work-group of WG (WARPS_M x WARPS_N warps) computes a TBM x TBN tile; a warp WMI x WNJ mma
// tiles. Both operands are staged in local memory as 32-bit words along K (one TF32 element, or
// two 16-bit elements with the lower K index in the low half, as mma wants them), or (A_MN, B_KN)
// as rows along K of 16-bit M (N) elements (layouts below). Fragments come out through ldmatrix
// (four 8 x 8 matrices of 16-bit elements an instruction; a TF32 element is two of them).
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
// -DASYNC=S: tiles go global -> local memory through cp.async (no registers) in an S-stage ring
// (S - 1 steps in flight while one is multiplied, one barrier a step); else through registers
// (the next tile is fetched while the current one is multiplied).
#ifdef ASYNC
#define STAGES ASYNC
#if STAGES < 2 || STAGES > 5
#error "ASYNC takes 2 to 5 stages"
#endif
#else
#define STAGES 1
#endif
#ifndef KW
#define KW 32           // words of K per tile step
#endif
#define TBK (KW * EPW)  // elements of K per tile step
#if (defined(A_MN) || defined(B_KN)) && defined(TC_TF32)
#error "M/N-contiguous operands take 16-bit elements (ldmatrix.trans)"
#endif
// Local tiles are rows of 16-byte chunks: KW / 4 chunks along K, padded by one chunk (a row
// stride of KW + 4 words puts eight consecutive rows' same chunk in distinct bank groups), or
// (A_MN, B_KN) TBM / 8 (TBN / 8) chunks along M (N), padded likewise, or with -DMN_SWIZZLE
// unpadded and swizzled (swz below). Measured on the H100 (docs/performance.md): padding is
// faster for K-contiguous tiles; the swizzle with 16 words of K for products whose A is
// M-contiguous (weight gradients).
#define KCH (KW / 4)
#define SROW (KW + 4)
#ifdef MN_SWIZZLE
#define MN_LOC(r, c, ch) swz(r, c, ch)
#define MN_WORDS(rows) ((rows) * KW)
#else
#define MN_LOC(r, c, ch) ((r) * ((ch) * 4 + 4) + (c) * 4)
#define MN_WORDS(rows) (TBK * ((rows) / 2 + 4))
#endif
#define K_LOC(r, c) ((r) * SROW + (c) * 4)
#ifdef A_MN
#define A_CH (TBM / 8)
#define A_LOC(r, c) MN_LOC(r, c, A_CH)
#define A_WORDS MN_WORDS(TBM)
#else
#define A_LOC(r, c) K_LOC(r, c)
#define A_WORDS (TBM * SROW)
#endif
#ifdef B_KN
#define B_CH (TBN / 8)
#define B_LOC(r, c) MN_LOC(r, c, B_CH)
#define B_WORDS MN_WORDS(TBN)
#else
#define B_LOC(r, c) K_LOC(r, c)
#define B_WORDS (TBN * SROW)
#endif
// OT, OLOAD, OSTORE, store_pair and PAIRED (the output's type and stores) come from common.cl.
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
#define A_VEC (TBM * KCH / WG)  // 16-byte vectors each work-item stages per operand and step
#define B_VEC (TBN * KCH / WG)
#ifdef ALIGNED
#define IN(r, R) 1
#else
#define IN(r, R) ((r) < (R))
#endif
#define VEC(p, i) (*(__global const uint4*)((__global const uchar*)(p) + (i) * sizeof(T)))

#ifdef MN_SWIZZLE
// Word offset of chunk c of row r in an unpadded local tile of ch chunks a row (ch a power of
// two, which TcTile::check requires): rows of 128 bytes or more xor c with r % 8, shorter ones with the row's index among the
// 128-byte lines' rows, so that any eight consecutive rows' chunk c lie in distinct bank groups.
inline uint swz(uint r, uint c, uint ch) {
    uint x = ch >= 8 ? r % 8 : (r * ch / 8) % ch;
    return (r * ch + (c ^ x)) * 4;
}
#endif

#ifdef ASYNC
// 16 bytes global -> local without registers; zero-filled when !valid (nothing read).
inline void copy16(__local uint* dst, __global const T* src, uint valid) {
    __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((uint)(size_t)dst), "l"(src),
                     "r"(valid ? 16u : 0u)
                     : "memory");
}
// Waits until at most STAGES - 2 groups of this work-item's copies are pending (its own copies
// of the step about to be multiplied have landed).
#if STAGES == 2
#define WAIT_STAGE() __asm__ volatile("cp.async.wait_group 0;" ::: "memory")
#elif STAGES == 3
#define WAIT_STAGE() __asm__ volatile("cp.async.wait_group 1;" ::: "memory")
#elif STAGES == 4
#define WAIT_STAGE() __asm__ volatile("cp.async.wait_group 2;" ::: "memory")
#else
#define WAIT_STAGE() __asm__ volatile("cp.async.wait_group 3;" ::: "memory")
#endif
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void matmul_tc(__global OT* c,          /* (batch, M, N) contiguous per batch: c[m * N + n] */
               __global const T* a,     /* (batch, M, K): a[m * sam + k]; A_MN: a[k * sam + m] */
               __global const T* b,     /* (batch, N, K): b[n * sbn + k]; B_KN: b[k * sbn + n] */
               __global const OT* bias, /* (N), read when has_bias */
               Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
               uint M, uint N, uint K, uint sam, uint sbn, uint has_bias) {
    // As[stage][A_LOC(row, chunk)]: A's tile (rows along M, or A_MN along K); Bs likewise B's.
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

// Vector s of a work-item e: tile row e / KCH, its chunk e % KCH (4 words of K) (l: its local
// word, gi: its first element, ok: inside the matrix); M/N-contiguous: k row e / A_CH, its chunk
// e % A_CH (8 elements of M).
#ifdef A_MN
#define A_AT(s, k0) uint e = tid + (s) * WG, r = m0 + (e % A_CH) * 8, k = (k0) + e / A_CH; \
    uint l = A_LOC(e / A_CH, e % A_CH); uint ok = IN(r, M) && k < K; uint gi = o.y + k * sam + r;
#else
#define A_AT(s, k0) uint e = tid + (s) * WG, r = m0 + e / KCH, k = (k0) + (e % KCH) * 4 * EPW; \
    uint l = A_LOC(e / KCH, e % KCH); uint ok = IN(r, M) && k < K; uint gi = o.y + r * sam + k;
#endif
#ifdef B_KN
#define B_AT(s, k0) uint e = tid + (s) * WG, r = n0 + (e % B_CH) * 8, k = (k0) + e / B_CH; \
    uint l = B_LOC(e / B_CH, e % B_CH); uint ok = IN(r, N) && k < K; uint gi = o.z + k * sbn + r;
#else
#define B_AT(s, k0) uint e = tid + (s) * WG, r = n0 + e / KCH, k = (k0) + (e % KCH) * 4 * EPW; \
    uint l = B_LOC(e / KCH, e % KCH); uint ok = IN(r, N) && k < K; uint gi = o.z + r * sbn + k;
#endif

    const uint steps = (K + TBK - 1) / TBK;
#ifdef ASYNC
#define ISSUE(st, k0)                                                                  \
    _Pragma("unroll") for (int s = 0; s < A_VEC; ++s) {                                \
        A_AT(s, k0) copy16(&As[st][l], ok ? a + gi : a, ok);                           \
    }                                                                                  \
    _Pragma("unroll") for (int s = 0; s < B_VEC; ++s) {                                \
        B_AT(s, k0) copy16(&Bs[st][l], ok ? b + gi : b, ok);                           \
    }
#define COMMIT() __asm__ volatile("cp.async.commit_group;" ::: "memory")
    // Steps 0 .. STAGES - 2 in flight; each step waits for its own group, then (after the
    // barrier that also ends every warp's reads of the stage it refills) issues STAGES - 1 ahead.
    for (uint p = 0; p + 1 < STAGES; ++p) {
        if (p < steps) {
            ISSUE(p, p * TBK)
        }
        COMMIT();
    }
    for (uint step = 0; step < steps; ++step) {
        const uint st = step % STAGES;
        WAIT_STAGE();
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const uint ahead = step + STAGES - 1;
            if (ahead < steps) {
                ISSUE(ahead % STAGES, ahead * TBK)
            }
            COMMIT();
        }
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
    for (uint step = 0; step < steps; ++step) {
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
        if (step + 1 < steps) {
            FETCH((step + 1) * TBK)
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
                LDMATRIX_X4_T(af[i], &As[st][A_LOC(kr, (wm + i * 16) / 8 + (lane / 8) % 2)]);
#else
                uint r = wm + i * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                LDMATRIX_X4(af[i], &As[st][A_LOC(r, kw / 4 + lane / 16)]);
#endif
#pragma unroll
                for (int q = 0; q < 4; ++q) af[i][q] = TF32(af[i][q]);
            }
#pragma unroll
            for (int j = 0; j < WNJ; j += 2) {
                uint x[4];
#ifdef B_KN
                uint kr = 2 * kw + 8 * ((lane / 8) % 2) + lane % 8;
                LDMATRIX_X4_T(x, &Bs[st][B_LOC(kr, (wn + j * 8) / 8 + lane / 16)]);
#else
                uint r = wn + j * 8 + (lane % 8) + 8 * (lane / 16);
                LDMATRIX_X4(x, &Bs[st][B_LOC(r, kw / 4 + (lane / 8) % 2)]);
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
#ifndef ASYNC
        barrier(CLK_LOCAL_MEM_FENCE);  // the next step overwrites the tile
#endif
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
#ifdef PAIRED
                uint n = n0 + wn + j * 8 + 2 * t, e = o.x + m * N + n;
                if (n + 1 < N && e % 2 == 0) {
                    ACC lo = acc[i][j][2 * h], hi = acc[i][j][2 * h + 1];
                    if (has_bias) {
                        lo += OLOAD(bias, n);
                        hi += OLOAD(bias, n + 1);
                    }
                    store_pair(c, e, activate(lo), activate(hi));
                    continue;
                }
#endif
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
