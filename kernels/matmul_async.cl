// matmul_async.cl: f32 GEMM C = act(A·B + bias) whose tiles go global -> local memory through a cp.async pipeline (sm_80+ PTX).
// Launched by ops/src/matmul/matmul_async.rs where its probe (build + an exact-result check) passed; same arguments as
// matmul_tiled.cl's kernel.
// A work-group computes a TM x TN tile of C (128 x 128 by default; the planner also takes 64 x 64 for small products),
// WM x WN outputs a work-item (in groups of 4 x 4, 4 * TY rows and 4 * TX columns apart, as matmul_tiled.cl's tiles), over K in
// steps of TK (8 or 16), with STAGES steps of both operands in flight and one barrier per step (cuBLAS' SIMT kernels,
// `cutlass_80_simt_sgemm_128x128_8x5` and `sm80_xmma_gemm_f32f32_..._tilesize64x64x8_stage3`, pipeline the same way; the
// staging registers and the second barrier of matmul_tiled.cl go away).
// Both operands' tiles sit in local memory by K, as [k][m] (A) and [k][n] (B), read 4 floats at a time, rows padded
// by 4 floats (transposed stores hit 32 banks; an XOR swizzle without the padding made the reads' offsets computed
// per step and cost 14% at 4096^3 on the H100). An operand reaches them as it lies in memory:
//   -DA_VEC: A's M dim is contiguous, its other strides multiples of 4: 16-byte copies;
//   -DA_KFAST: A's K dim is contiguous: 4-byte copies, consecutive work-items along K (transposed on the way);
//   neither: 4-byte copies, consecutive work-items along M.
// B likewise (-DB_VEC, -DB_KFAST). Out-of-range elements are zero-filled by the copy itself (cp.async's source size),
// so ragged edges cost no branch in the inner loop. -DALIGNED: M, N multiples of the tile, K of TK. -DROW_SUMS: also
// A's row sums.
#ifndef STAGES  // the host's defaults (the tuning data's)
#define STAGES 2
#endif
#ifndef TK
#define TK 16
#endif
#ifndef TM  // the tile and the block of outputs a work-item computes (multiples of 4)
#define TM 128
#endif
#ifndef TN
#define TN 128
#endif
#ifndef WM
#define WM 8
#endif
#ifndef WN
#define WN 8
#endif
#define TX (TN / WN)  // work-items along N
#define TY (TM / WM)  // along M
#define NT (TX * TY)
// Output row of a work-item's register i, column of register j.
#define ROW(i) ((i) / 4 * 4 * TY + ty * 4 + (i) % 4)
#define COL(j) ((j) / 4 * 4 * TX + tx * 4 + (j) % 4)
#define LROWA (TM + 4)  // local row strides in floats
#define LROWB (TN + 4)
#if TM * TK % (4 * NT) || TN * TK % (4 * NT) || WM % 4 || WN % 4 || (defined(ROW_SUMS) && NT < TM)
#error "matmul_async.cl: the tile must split into whole copies of 16 bytes a work-item (and NT >= TM for row sums)"
#endif

#ifndef ACTIVATION
inline ACC activate(ACC v) { return v; }
#endif

// `bytes` (0..16) of src to the local address dst, the rest of `size` zero-filled; .cg (L2 only) takes 16 bytes.
inline void cp16(uint dst, __global const float* src, uint bytes) {
    __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
inline void cp4(uint dst, __global const float* src, uint bytes) {
    __asm__ volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
inline void cp_commit(void) { __asm__ volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most STAGES - 2 groups of this work-item's copies are in flight (an immediate in the PTX).
#if STAGES == 2
#define PENDING "0"
#elif STAGES == 3
#define PENDING "1"
#elif STAGES == 4
#define PENDING "2"
#elif STAGES == 5
#define PENDING "3"
#else
#error "STAGES must be 2 to 5"
#endif
inline void cp_wait_pending(void) { __asm__ volatile("cp.async.wait_group " PENDING ";" ::: "memory"); }
inline void cp_wait_all(void) { __asm__ volatile("cp.async.wait_group 0;" ::: "memory"); }

#ifdef ALIGNED
#define INSIDE(x, X) 1
#else
#define INSIDE(x, X) ((x) < (X))
#endif

// Where A's (B's) tile keeps (k, row), in floats.
#define TROWA(k, row) ((k) * LROWA + (row))
#define TROWB(k, row) ((k) * LROWB + (row))
#define STAGE_A (TK * LROWA)
#define STAGE_B (TK * LROWB)
// Per operand: copies per work-item and step; copy r's row and k (E: its index in the tile).
#define E(r) (tid + (r) * NT)
// A_WIDTH: elements per copy along M; A_COPY: the copy.
#if defined(A_VEC)
#define A_COPIES (TM * TK / 4 / NT)
#define A_ROW(r) (E(r) % (TM / 4) * 4)
#define A_K(r) (E(r) / (TM / 4))
#define A_WIDTH 4u
#define A_COPY cp16
#elif defined(A_KFAST)
#define A_COPIES (TM * TK / NT)
#define A_ROW(r) (E(r) / TK)
#define A_K(r) (E(r) % TK)
#else
#define A_COPIES (TM * TK / NT)
#define A_ROW(r) (E(r) % TM)
#define A_K(r) (E(r) / TM)
#endif
#ifndef A_VEC
#define A_WIDTH 1u
#define A_COPY cp4
#endif
#if defined(B_VEC)
#define B_COPIES (TN * TK / 4 / NT)
#define B_ROW(r) (E(r) % (TN / 4) * 4)
#define B_K(r) (E(r) / (TN / 4))
#define B_WIDTH 4u
#define B_COPY cp16
#elif defined(B_KFAST)
#define B_COPIES (TN * TK / NT)
#define B_ROW(r) (E(r) / TK)
#define B_K(r) (E(r) % TK)
#else
#define B_COPIES (TN * TK / NT)
#define B_ROW(r) (E(r) % TN)
#define B_K(r) (E(r) / TN)
#endif
#ifndef B_VEC
#define B_WIDTH 1u
#define B_COPY cp4
#endif

// Bytes in range of a copy of `width` elements from row `row` of `rows`.
inline uint bytes_in(uint row, uint rows, uint width) { return row < rows ? min(rows - row, width) * 4 : 0; }
#ifdef ALIGNED
#define UNALIGNED(x)
#else
#define UNALIGNED(x) x
#endif

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void matmul_async(__global T* c,           /* (batch, M, ldc) contiguous per batch: c[m * ldc + c_col + n] */
                   __global const T* a,     /* (batch, M, K): a[m * sam + k * sak] */
                   __global const T* b,     /* (batch, K, N): b[k * sbk + n * sbn] */
                   __global const T* bias,  /* (ldc), read at c_col + n when has_bias */
                   Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
                   uint M, uint N, uint K, uint sam, uint sak, uint sbk, uint sbn, uint has_bias,
                   uint ldc, uint c_col,    /* this launch: columns c_col .. c_col + N of C (and B) */
                   uint lower, int diag,    /* A zero past column m + diag (a hint; see lower_k_end) */
                   __global T* rsum) {      /* (M): A's row sums over K (-DROW_SUMS, one batch) */
    __local float As[STAGES * STAGE_A] __attribute__((aligned(16)));
    __local float Bs[STAGES * STAGE_B] __attribute__((aligned(16)));
    const uint tid = get_local_id(0);
    const uint tx = tid % TX, ty = tid / TX;
    const uint n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    const uint3 o = layout_offsets(&batch, get_global_id(2));
    const uint as0 = (uint)(size_t)As, bs0 = (uint)(size_t)Bs;

    // Each copy's source offset at k = 0, its local byte offset, and (unaligned) its bytes in range along M / N.
    uint a_at[A_COPIES], a_dst[A_COPIES], b_at[B_COPIES], b_dst[B_COPIES];
#ifndef ALIGNED
    uint a_ok[A_COPIES], b_ok[B_COPIES];
#endif
    for (int r = 0; r < A_COPIES; ++r) {
        a_at[r] = o.y + (m0 + A_ROW(r)) * sam + A_K(r) * sak;
        a_dst[r] = TROWA(A_K(r), A_ROW(r)) * 4;
        UNALIGNED(a_ok[r] = bytes_in(m0 + A_ROW(r), M, A_WIDTH); if (!a_ok[r]) a_at[r] = o.y;)
    }
    for (int r = 0; r < B_COPIES; ++r) {
        b_at[r] = o.z + B_K(r) * sbk + (c_col + n0 + B_ROW(r)) * sbn;
        b_dst[r] = TROWB(B_K(r), B_ROW(r)) * 4;
        UNALIGNED(b_ok[r] = bytes_in(n0 + B_ROW(r), N, B_WIDTH); if (!b_ok[r]) b_at[r] = o.z;)
    }

// Step t's tiles (K from t * TK) into stage s. Bytes of copy r in range at step k0: its bytes along M or N while
// its k is inside K (a copy past the edges reads nothing and zero-fills).
#if defined(ALIGNED)
#define A_BYTES(r, k0) (A_WIDTH * 4)
#define B_BYTES(r, k0) (B_WIDTH * 4)
#else
#define A_BYTES(r, k0) ((k0) + A_K(r) < K ? a_ok[r] : 0u)
#define B_BYTES(r, k0) ((k0) + B_K(r) < K ? b_ok[r] : 0u)
#endif
#define FETCH(s, k0)                                                                             \
    for (int r = 0; r < A_COPIES; ++r) {                                                         \
        uint n_ = A_BYTES(r, k0);                                                                \
        A_COPY(as0 + (s) * (STAGE_A * 4) + a_dst[r], a + (n_ ? a_at[r] + (k0) * sak : a_at[r]), n_); \
    }                                                                                            \
    for (int r = 0; r < B_COPIES; ++r) {                                                         \
        uint n_ = B_BYTES(r, k0);                                                                \
        B_COPY(bs0 + (s) * (STAGE_B * 4) + b_dst[r], b + (n_ ? b_at[r] + (k0) * sbk : b_at[r]), n_); \
    }

    float acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = 0.0f;

    const uint steps = (lower_k_end(K, m0 + TM, lower, diag, TK) + TK - 1) / TK;
    for (uint t = 0; t < STAGES - 1; ++t) {
        if (t < steps) {
            FETCH(t, t * TK)
        }
        cp_commit();
    }
    uint rs = 0, ws = STAGES - 1;  // the stage read this step, the stage written
#ifdef ROW_SUMS
    // A's row sums (as matmul_tiled.cl's): the first column of tiles, work-item r < TM adding row r.
    const bool rs_on = n0 == 0 && c_col == 0 && get_group_id(2) == 0 && tid < TM;  // one batch only
    float rsv = 0.0f;
#endif
    for (uint t = 0; t < steps; ++t) {
        // Step t's copies (this work-item's) are done; the barrier makes everyone's visible and
        // tells that stage ws, read in step t - 1, is free.
        cp_wait_pending();
        barrier(CLK_LOCAL_MEM_FENCE);
        uint next = t + STAGES - 1;
        if (next < steps) {
            FETCH(ws, next * TK)
        }
        cp_commit();
        __local const float* ap = As + rs * STAGE_A;
        __local const float* bp = Bs + rs * STAGE_B;
#ifdef ROW_SUMS
        if (rs_on)
            for (int kk = 0; kk < TK; ++kk) rsv += ap[TROWA(kk, tid)];
#endif
        #pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            float ra[WM], rb[WN];
            #pragma unroll
            for (int g = 0; g < WM / 4; ++g) {
                float4 v = *(__local const float4*)(ap + TROWA(kk, ROW(4 * g)));
                ra[4 * g] = v.x, ra[4 * g + 1] = v.y, ra[4 * g + 2] = v.z, ra[4 * g + 3] = v.w;
            }
            #pragma unroll
            for (int g = 0; g < WN / 4; ++g) {
                float4 v = *(__local const float4*)(bp + TROWB(kk, COL(4 * g)));
                rb[4 * g] = v.x, rb[4 * g + 1] = v.y, rb[4 * g + 2] = v.z, rb[4 * g + 3] = v.w;
            }
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] = mad(ra[i], rb[j], acc[i][j]);
        }
        rs = rs + 1 == STAGES ? 0 : rs + 1;
        ws = ws + 1 == STAGES ? 0 : ws + 1;
    }
    cp_wait_all();

    for (int i = 0; i < WM; ++i) {
        uint m = m0 + ROW(i);
        if (!INSIDE(m, M)) continue;
        for (int j = 0; j < WN; ++j) {
            uint n = n0 + COL(j);
            if (INSIDE(n, N)) {
                float v = acc[i][j];
                if (has_bias) v += bias[c_col + n];
                c[o.x + m * ldc + c_col + n] = activate(v);
            }
        }
    }
#ifdef ROW_SUMS
    if (rs_on && INSIDE(m0 + tid, M)) rsum[m0 + tid] = rsv;
#endif
}
