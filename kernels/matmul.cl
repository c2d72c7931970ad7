// matmul.cl: batched GEMM C = act(A·B + bias) with local-memory tiles, register blocking and an epilogue; tile sizes come from -D (tuning table).
// -DBM, -DBN: output tile per work-group; -DBK: depth of one tile step; -DWM, -DWN: outputs per work-item;
// -DACT: 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh), 4 silu.
#ifndef BM
#define BM 64
#define BN 64
#define BK 16
#define WM 4
#define WN 4
#endif
#ifndef ACT
#define ACT 0
#endif
#define TX (BN / WN)  // work-items along n
#define TY (BM / WM)  // work-items along m
#define NT (TX * TY)
#define PAD 4          // keeps rows 16-byte aligned and spreads transposed stores over banks

inline ACC activate(ACC v) {
#if ACT == 1
    return v < (ACC)0 ? (ACC)0 : v;
#elif ACT == 2
    return (ACC)0.5 * v * ((ACC)1 + erf(v * (ACC)0.70710678118654752440));
#elif ACT == 3
    return (ACC)0.5 * v * ((ACC)1 + tanh((ACC)0.79788456080286535588 * (v + (ACC)0.044715 * v * v * v)));
#elif ACT == 4
    return v / ((ACC)1 + exp(-v));
#else
    return v;
#endif
}

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void matmul(__global T* c,           /* (batch, M, N) contiguous per batch: c[m * N + n] */
            __global const T* a,     /* (batch, M, K): a[m * sam + k * sak] */
            __global const T* b,     /* (batch, K, N): b[k * sbk + n * sbn] */
            __global const T* bias,  /* (N), read when has_bias */
            Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
            uint M, uint N, uint K, uint sam, uint sak, uint sbk, uint sbn, uint has_bias) {
    __local ACC As[BK][BM + PAD];
    __local ACC Bs[BK][BN + PAD];
    const uint tx = get_local_id(0), ty = get_local_id(1);
    const uint tid = ty * TX + tx;
    const uint n0 = get_group_id(0) * BN, m0 = get_group_id(1) * BM;
    const uint3 o = layout_offsets(&batch, get_global_id(2));
    ACC acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = (ACC)0;

    for (uint k0 = 0; k0 < K; k0 += BK) {
        // Consecutive work-items walk whichever dim of A (and of B) is contiguous in memory.
        for (uint e = tid; e < BM * BK; e += NT) {
            uint mm = sak == 1 ? e / BK : e % BM;
            uint kk = sak == 1 ? e % BK : e / BM;
            uint gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? LOAD(a, o.y + gm * sam + gk * sak) : (ACC)0;
        }
        for (uint e = tid; e < BN * BK; e += NT) {
            uint nn = sbn == 1 ? e % BN : e / BK;
            uint kk = sbn == 1 ? e / BN : e % BK;
            uint gn = n0 + nn, gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < K) ? LOAD(b, o.z + gk * sbk + gn * sbn) : (ACC)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < BK; ++kk) {
            ACC ra[WM], rb[WN];
            for (int i = 0; i < WM; ++i) ra[i] = As[kk][ty * WM + i];
            for (int j = 0; j < WN; ++j) rb[j] = Bs[kk][tx * WN + j];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] = mad(ra[i], rb[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < WM; ++i) {
        uint m = m0 + ty * WM + i;
        if (m >= M) break;
        for (int j = 0; j < WN; ++j) {
            uint n = n0 + tx * WN + j;
            if (n < N) {
                ACC v = acc[i][j];
                if (has_bias) v += LOAD(bias, n);
                STORE(c, o.x + m * N + n, activate(v));
            }
        }
    }
}
