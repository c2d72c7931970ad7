// matmul_cpu.cl (launched by ops/src/matmul/matmul_cpu.rs): batched GEMM C = act(A·B + bias) for CPU OpenCL devices (PoCL): no local memory and no barriers (which a CPU driver emulates), each work-item a register block of explicit vectors that the compiler maps to SIMD registers.
// -DVN: vector width in elements (16 for f32, 8 for f64); -DRM, -DNV: rows and vectors of columns
// per work-item of matmul_cpu_nn; -DRMT, -DRN: rows and columns per work-item of matmul_cpu_nt;
// f32 and f64 only (T == ACC). The epilogue as in matmul_tiled.cl: with an activation, source.rs puts a
// generated `inline ACC activate(ACC v)` and `#define ACTIVATION` before this file.
#ifndef ACTIVATION
inline ACC activate(ACC v) { return v; }
#endif
#define VLOAD_(n) vload##n
#define VLOAD(n) VLOAD_(n)
#define VSTORE_(n) vstore##n
#define VSTORE(n) VSTORE_(n)
#if defined(DT_F32) && VN == 16
typedef float16 V;
#elif defined(DT_F64) && VN == 8
typedef double8 V;
#else
#error "matmul_cpu.cl takes f32 with VN=16 or f64 with VN=8"
#endif

// One output row segment of VN columns: bias, activation and store, the last segment bounded by N.
inline void store_row(__global T* c, uint at, V v, uint cols, __global const T* bias, uint n,
                      uint has_bias) {
    T tmp[VN];
    VSTORE(VN)(v, 0, tmp);
    for (uint e = 0; e < cols; ++e) c[at + e] = activate(tmp[e] + (has_bias ? bias[n + e] : (T)0));
}

// B (K, N) copied into panels of W = NV·VN columns, each panel K rows of W contiguous elements,
// zero past N: bp[((z * panels + p) * K + k) * W + e] = b[k * sbk + (p * W + e) * sbn]. The product
// then streams each panel sequentially (B's own rows are often 4 KiB apart, which maps a column
// strip onto a few cache sets).
__kernel void matmul_cpu_pack(__global T* bp,         /* (batch, panels, K, W) */
                              __global const T* b,    /* (batch, K, N): b[k * sbk + n * sbn] */
                              Layout batch,           /* batch dims: operand 2 = b */
                              uint K, uint N, uint sbk, uint sbn, uint panels) {
    const uint k = get_global_id(0), p = get_global_id(1), z = get_global_id(2);
    if (k >= K) return;
    const uint3 o = layout_offsets(&batch, z);
    __global T* dst = bp + ((z * panels + p) * K + k) * (NV * VN);
    __global const T* src = b + o.z + k * sbk;
    if (sbn == 1 && (p + 1) * (NV * VN) <= N) {  // a whole panel row of contiguous columns
        #pragma unroll
        for (int j = 0; j < NV; ++j) VSTORE(VN)(VLOAD(VN)(j, src + p * (NV * VN)), j, dst);
        return;
    }
    for (uint e = 0, n = p * (NV * VN); e < NV * VN; ++e, ++n) dst[e] = n < N ? src[n * sbn] : (T)0;
}

// Each work-item owns RM rows x W = NV·VN columns (panel p); per k it broadcasts RM elements of A
// against NV vectors of the panel's row k. B is either packed (matmul_cpu_pack: panel stride
// K·W, row stride W, batch stride bz, padded with zeros) or B itself with contiguous columns (panel
// stride W, row stride sbk, bz = 0: batch offsets from the layout; the last panel bounded by N).
__kernel void matmul_cpu_nn(__global T* c,           /* (batch, M, N) contiguous per batch */
                            __global const T* a,     /* (batch, M, K): a[m * sam + k * sak] */
                            __global const T* b,     /* packed (batch, panels, K, W), or (batch, K, N) with b[k * sbk + n] */
                            __global const T* bias,  /* (N), read when has_bias */
                            Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b (unpacked) */
                            uint M, uint N, uint K, uint sam, uint sak, uint sbk, uint spanel, uint bz,
                            uint has_bias) {
    const uint m0 = get_global_id(0) * RM, p = get_global_id(1), n0 = p * (NV * VN);
    if (n0 >= N || m0 >= M) return;
    const uint3 o = layout_offsets(&batch, get_global_id(2));
    __global const T* ap[RM];
    #pragma unroll
    for (int i = 0; i < RM; ++i) ap[i] = a + o.y + min(m0 + i, M - 1) * sam;  // clamped rows are not stored
    __global const T* bp = b + (bz ? get_global_id(2) * bz : o.z) + p * spanel;
    V acc[RM][NV];
    #pragma unroll
    for (int i = 0; i < RM; ++i)
        #pragma unroll
        for (int j = 0; j < NV; ++j) acc[i][j] = (V)0;
    const bool whole = bz || n0 + NV * VN <= N;  // else the last columns of an unpacked B
    for (uint k = 0; k < K; ++k, bp += sbk) {
        V bv[NV];
        if (whole) {
            #pragma unroll
            for (int j = 0; j < NV; ++j) bv[j] = VLOAD(VN)(j, bp);
        } else {  // B's row read element by element, zero past N
            T row[NV * VN];
            for (uint e = 0; e < NV * VN; ++e) row[e] = n0 + e < N ? bp[e] : (T)0;
            #pragma unroll
            for (int j = 0; j < NV; ++j) bv[j] = VLOAD(VN)(j, row);
        }
        #pragma unroll
        for (int i = 0; i < RM; ++i) {
            const V av = (V)(ap[i][k * sak]);
            #pragma unroll
            for (int j = 0; j < NV; ++j) acc[i][j] = fma(av, bv[j], acc[i][j]);
        }
    }
    #pragma unroll
    for (int i = 0; i < RM; ++i) {
        if (m0 + i >= M) break;
        #pragma unroll
        for (int j = 0; j < NV; ++j) {
            const uint n = n0 + j * VN;
            if (n >= N) break;
            store_row(c, o.x + (m0 + i) * N + n, acc[i][j], min((uint)VN, N - n), bias, n, has_bias);
        }
    }
}

// A's and B's K contiguous (a[m * sam + k], b[k + n * sbn]: a row-major weight used as Bᵀ): each
// work-item owns RMT x RN outputs, each a vector of partial sums over K that is summed at the end.
__kernel void matmul_cpu_nt(__global T* c,           /* (batch, M, N) contiguous per batch */
                            __global const T* a,     /* (batch, M, K): a[m * sam + k] */
                            __global const T* b,     /* (batch, K, N): b[k + n * sbn] */
                            __global const T* bias,  /* (N), read when has_bias */
                            Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
                            uint M, uint N, uint K, uint sam, uint sbn, uint has_bias) {
    const uint m0 = get_global_id(0) * RMT, n0 = get_global_id(1) * RN;
    if (n0 >= N || m0 >= M) return;
    const uint3 o = layout_offsets(&batch, get_global_id(2));
    __global const T* ap[RMT];
    __global const T* bp[RN];
    #pragma unroll
    for (int i = 0; i < RMT; ++i) ap[i] = a + o.y + min(m0 + i, M - 1) * sam;  // clamped: not stored
    #pragma unroll
    for (int j = 0; j < RN; ++j) bp[j] = b + o.z + min(n0 + j, N - 1) * sbn;
    V acc[RMT][RN];
    #pragma unroll
    for (int i = 0; i < RMT; ++i)
        #pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = (V)0;
    const uint kv = K / VN;
    for (uint q = 0; q < kv; ++q) {
        V av[RMT], bv[RN];
        #pragma unroll
        for (int i = 0; i < RMT; ++i) av[i] = VLOAD(VN)(q, ap[i]);
        #pragma unroll
        for (int j = 0; j < RN; ++j) bv[j] = VLOAD(VN)(q, bp[j]);
        #pragma unroll
        for (int i = 0; i < RMT; ++i)
            #pragma unroll
            for (int j = 0; j < RN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    #pragma unroll
    for (int i = 0; i < RMT; ++i) {
        const uint m = m0 + i;
        if (m >= M) break;
        #pragma unroll
        for (int j = 0; j < RN; ++j) {
            const uint n = n0 + j;
            if (n >= N) break;
            T tmp[VN];
            VSTORE(VN)(acc[i][j], 0, tmp);
            ACC s = 0;
            #pragma unroll
            for (int e = 0; e < VN; ++e) s += tmp[e];
            for (uint k = kv * VN; k < K; ++k) s = fma(ap[i][k], bp[j][k], s);
            if (has_bias) s += bias[n];
            c[o.x + m * N + n] = activate(s);
        }
    }
}
