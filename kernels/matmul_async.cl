// matmul_async.cl: f32 GEMM C = act(A·B + bias) whose tiles go global -> local memory through a cp.async pipeline (sm_80+ PTX).
// Built only where matmul/pipe.rs's probe (build + an exact-result check) passed; same arguments as matmul.cl's kernel.
// A work-group of 256 work-items computes a 128 x 128 tile of C, 8 x 8 outputs each (in 4 x 4 groups 64 apart, as
// matmul.cl's 128 x 128 tile), over K in steps of TK (8 or 16), with STAGES steps of both operands in flight and one
// barrier per step (cuBLAS' SIMT kernels, `cutlass_80_simt_sgemm_128x128_8x5`, pipeline the same way; the staging
// registers and the second barrier of matmul.cl go away).
// Both operands' tiles sit in local memory by K, as [k][m] (A) and [k][n] (B), read 4 floats at a time, rows padded
// by 4 floats (transposed stores hit 32 banks; an XOR swizzle without the padding made the reads' offsets computed
// per step and cost 14% at 4096^3 on the H100). An operand reaches them as it lies in memory:
//   -DA_VEC: A's M dim is contiguous, its other strides multiples of 4: 16-byte copies;
//   -DA_KFAST: A's K dim is contiguous: 4-byte copies, consecutive work-items along K (transposed on the way);
//   neither: 4-byte copies, consecutive work-items along M.
// B likewise (-DB_VEC, -DB_KFAST). Out-of-range elements are zero-filled by the copy itself (cp.async's source size),
// so ragged edges cost no branch in the inner loop. -DALIGNED: M, N multiples of 128, K of TK. -DROW_SUMS: also
// A's row sums.
#ifndef STAGES  // the host's defaults (pipe.rs)
#define STAGES 2
#endif
#ifndef TK
#define TK 16
#endif
#ifndef MATMUL_KERNEL
#error "matmul_async.cl needs -DMATMUL_KERNEL=<kernel name> (set by matmul/pipe.rs)"
#endif
#define TM 128
#define TN 128
#define NT 256
#define LROW (TM + 4)  // local row stride in floats

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

// Where a tile keeps (k, row), in floats.
#define TROW(k, row) ((k) * LROW + (row))
#define STAGE_FLOATS (TK * LROW)
// Per operand: copies per work-item and step; copy r's row and k (E: its index in the tile).
#define VEC_COPIES (TM * TK / 4 / NT)
#define NARROW_COPIES (TM * TK / NT)
#define E(r) (tid + (r) * NT)
// A_WIDTH: elements per copy along M; A_COPY: the copy.
#if defined(A_VEC)
#define A_COPIES VEC_COPIES
#define A_ROW(r) (E(r) % 32 * 4)
#define A_K(r) (E(r) / 32)
#define A_WIDTH 4u
#define A_COPY cp16
#elif defined(A_KFAST)
#define A_COPIES NARROW_COPIES
#define A_ROW(r) (E(r) / TK)
#define A_K(r) (E(r) % TK)
#else
#define A_COPIES NARROW_COPIES
#define A_ROW(r) (E(r) % TM)
#define A_K(r) (E(r) / TM)
#endif
#ifndef A_VEC
#define A_WIDTH 1u
#define A_COPY cp4
#endif
#if defined(B_VEC)
#define B_COPIES VEC_COPIES
#define B_ROW(r) (E(r) % 32 * 4)
#define B_K(r) (E(r) / 32)
#define B_WIDTH 4u
#define B_COPY cp16
#elif defined(B_KFAST)
#define B_COPIES NARROW_COPIES
#define B_ROW(r) (E(r) / TK)
#define B_K(r) (E(r) % TK)
#else
#define B_COPIES NARROW_COPIES
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
void MATMUL_KERNEL(__global T* c,           /* (batch, M, ldc) contiguous per batch: c[m * ldc + c_col + n] */
                   __global const T* a,     /* (batch, M, K): a[m * sam + k * sak] */
                   __global const T* b,     /* (batch, K, N): b[k * sbk + n * sbn] */
                   __global const T* bias,  /* (ldc), read at c_col + n when has_bias */
                   Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
                   uint M, uint N, uint K, uint sam, uint sak, uint sbk, uint sbn, uint has_bias,
                   uint ldc, uint c_col,    /* this launch: columns c_col .. c_col + N of C (and B) */
                   uint lower, int diag,    /* A zero past column m + diag (a hint; see lower_k_end) */
                   __global T* rsum) {      /* (M): A's row sums over K (-DROW_SUMS, one batch) */
    __local float As[STAGES * STAGE_FLOATS] __attribute__((aligned(16)));
    __local float Bs[STAGES * STAGE_FLOATS] __attribute__((aligned(16)));
    const uint tid = get_local_id(0);
    const uint tx = tid % 16, ty = tid / 16;
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
        a_dst[r] = TROW(A_K(r), A_ROW(r)) * 4;
        UNALIGNED(a_ok[r] = bytes_in(m0 + A_ROW(r), M, A_WIDTH); if (!a_ok[r]) a_at[r] = o.y;)
    }
    for (int r = 0; r < B_COPIES; ++r) {
        b_at[r] = o.z + B_K(r) * sbk + (c_col + n0 + B_ROW(r)) * sbn;
        b_dst[r] = TROW(B_K(r), B_ROW(r)) * 4;
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
        A_COPY(as0 + (s) * (STAGE_FLOATS * 4) + a_dst[r], a + (n_ ? a_at[r] + (k0) * sak : a_at[r]), n_); \
    }                                                                                            \
    for (int r = 0; r < B_COPIES; ++r) {                                                         \
        uint n_ = B_BYTES(r, k0);                                                                \
        B_COPY(bs0 + (s) * (STAGE_FLOATS * 4) + b_dst[r], b + (n_ ? b_at[r] + (k0) * sbk : b_at[r]), n_); \
    }

    float acc[8][8];
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    const uint steps = (lower_k_end(K, m0 + TM, lower, diag, TK) + TK - 1) / TK;
    for (uint t = 0; t < STAGES - 1; ++t) {
        if (t < steps) {
            FETCH(t, t * TK)
        }
        cp_commit();
    }
    uint rs = 0, ws = STAGES - 1;  // the stage read this step, the stage written
#ifdef ROW_SUMS
    // A's row sums (as matmul.cl's): the first column of tiles, work-item r < TM adding row r.
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
        __local const float* ap = As + rs * STAGE_FLOATS;
        __local const float* bp = Bs + rs * STAGE_FLOATS;
#ifdef ROW_SUMS
        if (rs_on)
            for (int kk = 0; kk < TK; ++kk) rsv += ap[TROW(kk, tid)];
#endif
        #pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            float4 a0 = *(__local const float4*)(ap + TROW(kk, ty * 4));
            float4 a1 = *(__local const float4*)(ap + TROW(kk, 64 + ty * 4));
            float4 b0 = *(__local const float4*)(bp + TROW(kk, tx * 4));
            float4 b1 = *(__local const float4*)(bp + TROW(kk, 64 + tx * 4));
            float ra[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float rb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            for (int i = 0; i < 8; ++i)
                for (int j = 0; j < 8; ++j) acc[i][j] = mad(ra[i], rb[j], acc[i][j]);
        }
        rs = rs + 1 == STAGES ? 0 : rs + 1;
        ws = ws + 1 == STAGES ? 0 : ws + 1;
    }
    cp_wait_all();

    for (int i = 0; i < 8; ++i) {
        uint m = m0 + (i / 4) * 64 + ty * 4 + i % 4;
        if (!INSIDE(m, M)) continue;
        for (int j = 0; j < 8; ++j) {
            uint n = n0 + (j / 4) * 64 + tx * 4 + j % 4;
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
