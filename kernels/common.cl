// common.cl: prepended to every netcl program: dtype macros (-DDT_*), strided layouts, Philox4x32-10.
#pragma OPENCL FP_CONTRACT OFF

#if defined(DT_F64) || defined(NETCL_FP64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define NETCL_HAS_F64
#endif

// bf16 is the upper half of an f32; stores round to nearest even.
inline ushort bf16_from_float(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
    return (ushort)(u >> 16);
}

#if defined(DT_F32)
typedef float T;
typedef float ACC;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#elif defined(DT_F64)
typedef double T;
typedef double ACC;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#elif defined(DT_F16)
// No cl_khr_fp16 needed: half is only a storage type, loaded and stored through vload/vstore.
#define T half
typedef float ACC;
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, v) vstore_half_rte((v), (i), (p))
#elif defined(DT_BF16)
typedef ushort T;
typedef float ACC;
#define LOAD(p, i) as_float(((uint)(p)[i]) << 16)
#define STORE(p, i, v) ((p)[i] = bf16_from_float(v))
#endif

// Four consecutive elements at once: LOAD4(p, i) reads elements 4i..4i+3 into an ACC4 (p + 4i
// must be aligned to 4 elements; buffers are, so a multiple of 4 as element offset suffices).
#if defined(DT_F32)
typedef float4 ACC4;
#define LOAD4(p, i) (((__global const float4*)(p))[i])
#define STORE4(p, i, v) (((__global float4*)(p))[i] = (v))
#elif defined(DT_F64)
typedef double4 ACC4;
#define LOAD4(p, i) (((__global const double4*)(p))[i])
#define STORE4(p, i, v) (((__global double4*)(p))[i] = (v))
#elif defined(DT_F16)
typedef float4 ACC4;
#define LOAD4(p, i) vload_half4((i), (p))
#define STORE4(p, i, v) vstore_half4_rte((v), (i), (p))
#elif defined(DT_BF16)
typedef float4 ACC4;
#define LOAD4(p, i) as_float4(convert_uint4(((__global const ushort4*)(p))[i]) << 16)
#define STORE4(p, i, v) (((__global ushort4*)(p))[i] = bf16_from_float4(v))
inline ushort4 bf16_from_float4(float4 v) {
    return (ushort4)(bf16_from_float(v.x), bf16_from_float(v.y), bf16_from_float(v.z), bf16_from_float(v.w));
}
#endif

#if defined(DT_I32)
typedef int T;
typedef int ACC;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#elif defined(DT_U32)
typedef uint T;
typedef uint ACC;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#endif

// A strided 4-D operand: (N, C, H, W) with element strides and offset.
typedef struct {
    uint shape[4];
    uint stride[4];
    uint offset;
} View4;

// A divisor with its magic numbers (crates/ops/src/base/fastdiv.rs makes them): divq(f, n) is
// n / f.d for every uint n, a multiply-high, an add and two shifts instead of a division's
// twenty-odd instructions (which bound the index arithmetic of conv and pooling kernels).
typedef struct {
    uint d, m, s1, s2;
} Div;

inline uint divq(Div f, uint n) {
#ifdef NETCL_CPU
    // PoCL calls its library mul_hi (not inlined), which keeps a work-group's items from running
    // as vectors; the 64-bit product vectorises. GPUs keep mul_hi (one instruction).
    uint t = (uint)(((ulong)n * f.m) >> 32);
#else
    uint t = mul_hi(n, f.m);
#endif
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

// Coordinates (b, c, h, w) of the row-major index i of an (N, C, H, W) tensor.
inline uint4 nchw_index(uint i, Div C, Div H, Div W) {
    uint q = divq(W, i), r = divq(H, q), b = divq(C, r);
    return (uint4)(b, r - b * C.d, q - r * H.d, i - q * W.d);
}

// A 2-D sliding window (conv, pooling), per axis a (0: height, 1: width): kernel extent k, stride s,
// padding p, dilation d and output extent out. Mirrors ops::window::Window2.
typedef struct {
    uint k[2];
    uint s[2];
    uint p[2];
    uint d[2];
    uint out[2];
    Div sd[2];  // the strides as divisors
} Window2;

// A window's tap counts: build-time constants where the program was built for one kernel size
// (-DWIN_K0/-DWIN_K1, CPU devices: the tap loops unroll, so work-items can run as vector lanes),
// else the window's own.
#ifdef WIN_K0
#define TAPS0(win) WIN_K0
#define TAPS1(win) WIN_K1
#define UNROLL_TAPS _Pragma("unroll")
#else
#define UNROLL_TAPS
#define TAPS0(win) (win).k[0]
#define TAPS1(win) (win).k[1]
#endif

// Input index along axis a of tap k of output o (negative, or past the input, in the padding).
inline int win_in(const Window2* g, int a, uint o, uint k) {
    return (int)(o * g->s[a] + k * g->d[a]) - (int)g->p[a];
}

// Output index along axis a whose window puts tap k on input x, or -1 when none does.
inline int win_out(const Window2* g, int a, uint x, uint k) {
    int t = (int)(x + g->p[a]) - (int)(k * g->d[a]);
    if (t < 0) return -1;
    uint o = divq(g->sd[a], (uint)t);
    if (o * g->s[a] != (uint)t || o >= g->out[a]) return -1;
    return (int)o;
}

// Defines `type name(type x, __local type* sh, uint team)`: the merge of x over each team of `team`
// consecutive work-items (a power of two dividing the work-group) by a tree of JOIN(a, b) in a
// fixed order; every work-item gets its team's result. sh holds a slot per work-item. Every
// work-item of the group must call it (it has barriers).
#define TEAM_REDUCE_FN(name, type, JOIN)                                    \
    inline type name(type x, __local type* sh, uint team) {                 \
        uint lid = get_local_id(0);                                         \
        sh[lid] = x;                                                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                       \
        for (uint k = team / 2; k > 0; k >>= 1) {                           \
            if (lid % team < k) sh[lid] = JOIN(sh[lid], sh[lid + k]);       \
            barrier(CLK_LOCAL_MEM_FENCE);                                   \
        }                                                                   \
        type r = sh[lid - lid % team];                                      \
        barrier(CLK_LOCAL_MEM_FENCE);                                       \
        return r;                                                           \
    }
#define NETCL_ADD(a, b) ((a) + (b))

#if defined(DT_F32) || defined(DT_F64) || defined(DT_F16) || defined(DT_BF16)
#if defined(DT_F64)
typedef double2 ACC2;
#else
typedef float2 ACC2;
#endif
// Two sums at once (e.g. of dy and dy * xhat) over a team of work-items.
TEAM_REDUCE_FN(sum2_team, ACC2, NETCL_ADD)

// Welford statistics (layer/batch norm, var): per-item accumulation, Chan's merge in a fixed order.
// Running count, mean and sum of squared deviations.
typedef struct { ACC n; ACC mean; ACC m2; } wf_t;

inline wf_t wf_add(wf_t s, ACC x) {
    s.n += (ACC)1;
    ACC d = x - s.mean;
    s.mean += d / s.n;
    s.m2 += d * (x - s.mean);
    return s;
}

inline wf_t wf_join(wf_t a, wf_t b) {
    if (b.n == (ACC)0) return a;
    if (a.n == (ACC)0) return b;
    wf_t s;
    s.n = a.n + b.n;
    ACC d = b.mean - a.mean;
    s.mean = a.mean + d * (b.n / s.n);
    s.m2 = a.m2 + b.m2 + d * d * (a.n * (b.n / s.n));
    return s;
}
#endif


#ifdef ROW_NV
// Register-resident rows (the *_rows kernels): a team of `team` consecutive work-items (a power of
// two dividing the work-group) holds one contiguous row of n elements in registers, ROW_NV units
// per work-item, a unit being ROW_V consecutive elements (4 when n and the row's start are
// multiples of 4, else 1). Unit j of lane l is unit l + j * team of the row, so for each j a
// team reads consecutive memory. Each element is read once and written once. Work-items past
// the last row hold no units but take part in every barrier.
#if ROW_V == 4
typedef ACC4 row_t;
#define ROW_LOAD(p, base, u) LOAD4(p, (base) / 4 + (u))
#define ROW_STORE(p, base, u, v) STORE4(p, (base) / 4 + (u), v)
inline ACC row_hsum(row_t v) { return (v.x + v.y) + (v.z + v.w); }
inline ACC row_hmax(row_t v) { return fmax(fmax(v.x, v.y), fmax(v.z, v.w)); }
// 1 at the element of unit u whose index in the row is t, 0 elsewhere.
inline row_t row_hot(uint u, int t) {
    int k = t - (int)(4 * u);
    return (row_t)(k == 0 ? (ACC)1 : (ACC)0, k == 1 ? (ACC)1 : (ACC)0,
                   k == 2 ? (ACC)1 : (ACC)0, k == 3 ? (ACC)1 : (ACC)0);
}
#else
typedef ACC row_t;
#define ROW_LOAD(p, base, u) LOAD(p, (base) + (u))
#define ROW_STORE(p, base, u, v) STORE(p, (base) + (u), v)
inline ACC row_hsum(row_t v) { return v; }
inline ACC row_hmax(row_t v) { return v; }
inline row_t row_hot(uint u, int t) { return (int)u == t ? (ACC)1 : (ACC)0; }
#endif

// This work-item's row and place in its team.
typedef struct {
    uint row;    // the row its team holds
    uint lane;   // its index in the team
    uint team;   // work-items per row
    uint units;  // units in the row (n / ROW_V); 0 past the last row
} rowpos_t;

inline rowpos_t row_pos(uint n, uint rows, uint team) {
    rowpos_t r;
    uint lid = get_local_id(0);
    r.row = get_group_id(0) * (get_local_size(0) / team) + lid / team;
    r.lane = lid % team;
    r.team = team;
    r.units = r.row < rows ? n / ROW_V : 0;
    return r;
}

// Unit j (< ROW_NV) of this work-item: its index in the row, and whether the row has it.
#define ROW_UNIT(r, j) ((r).lane + (j) * (r).team)
#define ROW_HAS(r, j) (ROW_UNIT(r, j) < (r).units)

// load(v, p, base, r): v[j] = unit j of the row starting at element `base` of p (0 where the row
// has none); store(p, base, v, r) writes the units back; for storage TY through the unit macros
// LD(p, base, u) and ST(p, base, u, v). row_load / row_store are T's (kernels with another
// storage for some operand make their own).
#define ROW_IO(load, store, TY, LD, ST)                                                        \
    inline void load(row_t* v, __global const TY* p, uint base, rowpos_t r) {                 \
        _Pragma("unroll") for (uint j = 0; j < ROW_NV; ++j)                                    \
            v[j] = ROW_HAS(r, j) ? LD(p, base, ROW_UNIT(r, j)) : (row_t)0;                     \
    }                                                                                          \
    inline void store(__global TY* p, uint base, const row_t* v, rowpos_t r) {                \
        _Pragma("unroll") for (uint j = 0; j < ROW_NV; ++j)                                    \
            if (ROW_HAS(r, j)) ST(p, base, ROW_UNIT(r, j), v[j]);                              \
    }
ROW_IO(row_load, row_store, T, ROW_LOAD, ROW_STORE)
#endif

// Typed loads and stores into each dtype's compute type (float for f32/f16/bf16), for kernels
// that mix dtypes (generated fused kernels, casts, index tensors).
inline float load_f32(__global const float* p, uint i) { return p[i]; }
inline float load_f16(__global const half* p, uint i) { return vload_half(i, p); }
inline float load_bf16(__global const ushort* p, uint i) { return as_float(((uint)p[i]) << 16); }
inline int load_i32(__global const int* p, uint i) { return p[i]; }
inline uint load_u32(__global const uint* p, uint i) { return p[i]; }
inline void store_f32(__global float* p, uint i, float v) { p[i] = v; }
inline void store_f16(__global half* p, uint i, float v) { vstore_half_rte(v, i, p); }
inline void store_bf16(__global ushort* p, uint i, float v) { p[i] = bf16_from_float(v); }
inline void store_i32(__global int* p, uint i, int v) { p[i] = v; }
inline void store_u32(__global uint* p, uint i, uint v) { p[i] = v; }
#ifdef NETCL_HAS_F64
inline double load_f64(__global const double* p, uint i) { return p[i]; }
inline void store_f64(__global double* p, uint i, double v) { p[i] = v; }
#endif
// Four consecutive elements from element i (a multiple of 4, so 32-bit loads are 16-byte
// aligned in a pool buffer), for the vectorized fused kernels.
inline float4 load4_f32(__global const float* p, uint i) { return *(__global const float4*)(p + i); }
inline float4 load4_f16(__global const half* p, uint i) { return vload_half4(0, p + i); }
inline float4 load4_bf16(__global const ushort* p, uint i) {
    return as_float4(convert_uint4(*(__global const ushort4*)(p + i)) << 16);
}
inline int4 load4_i32(__global const int* p, uint i) { return *(__global const int4*)(p + i); }
inline uint4 load4_u32(__global const uint* p, uint i) { return *(__global const uint4*)(p + i); }
inline void store4_f32(__global float* p, uint i, float4 v) { *(__global float4*)(p + i) = v; }
inline void store4_f16(__global half* p, uint i, float4 v) { vstore_half4_rte(v, 0, p + i); }
inline void store4_bf16(__global ushort* p, uint i, float4 v) {
    *(__global ushort4*)(p + i) =
        (ushort4)(bf16_from_float(v.x), bf16_from_float(v.y), bf16_from_float(v.z), bf16_from_float(v.w));
}
inline void store4_i32(__global int* p, uint i, int4 v) { *(__global int4*)(p + i) = v; }
inline void store4_u32(__global uint* p, uint i, uint4 v) { *(__global uint4*)(p + i) = v; }
#ifdef NETCL_HAS_F64
inline double4 load4_f64(__global const double* p, uint i) { return *(__global const double4*)(p + i); }
inline void store4_f64(__global double* p, uint i, double4 v) { *(__global double4*)(p + i) = v; }
#endif
// A float rounded to the nearest f16 / bf16 value (computation stays in float).
inline float round_f16(float v) {
    ushort bits;  // half variables need cl_khr_fp16; a half pointer to 16 bits does not
    vstore_half_rte(v, 0, (__private half*)&bits);
    return vload_half(0, (__private const half*)&bits);
}
inline float round_bf16(float v) { return as_float(((uint)bf16_from_float(v)) << 16); }

// Up to three strided operands over one shape; operand 0 is usually the output.
// Strides and offsets count elements; a stride of 0 broadcasts. Mirrors ops::layout::KernelLayout.
#define MAX_DIMS 8
typedef struct {
    uint ndim;
    uint shape[MAX_DIMS];
    uint stride[3][MAX_DIMS];
    uint offset[3];
    Div div[MAX_DIMS];  // the extents as divisors
} Layout;

// Element offsets of the linear (row-major) index i in operands 0..2.
inline uint3 layout_offsets(const Layout* l, uint i) {
    uint3 o = (uint3)(l->offset[0], l->offset[1], l->offset[2]);
    for (int d = (int)l->ndim - 1; d >= 0; --d) {
        uint q = divq(l->div[d], i);
        uint idx = i - q * l->shape[d];
        i = q;
        o.x += idx * l->stride[0][d];
        o.y += idx * l->stride[1][d];
        o.z += idx * l->stride[2][d];
    }
    return o;
}

// Philox4x32-10 (Random123), bit-identical to rand_philox::philox4x32_10.
inline uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k.x += 0x9E3779B9u; k.y += 0xBB67AE85u; }
        uint lo0 = c.x * 0xD2511F53u, hi0 = mul_hi(c.x, 0xD2511F53u);
        uint lo1 = c.z * 0xCD9E8D57u, hi1 = mul_hi(c.z, 0xCD9E8D57u);
        c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// Where a GEMM tile's K loop may stop when A is zero past column m + diag (`lower`, a hint from
// the host: a causal attention's scores' gradients): one past the last column the tile's rows
// (up to m_end) may see, rounded up to the tile step; K otherwise.
inline uint lower_k_end(uint K, uint m_end, uint lower, int diag, uint step) {
    if (!lower) return K;
    int last = (int)m_end + diag;
    return last <= 0 ? 0u : min(K, ((uint)last + step - 1) / step * step);
}

// Records the first bad index a kernel meets in its device's error record (ops/device_errors.rs):
// err = {op code, position, value, bound}; the host reads it at the next read from the device.
inline void report_index(__global int* err, int code, uint pos, int value, uint bound) {
    if (atomic_cmpxchg(err, 0, code) == 0) {
        err[1] = (int)pos;
        err[2] = value;
        err[3] = (int)bound;
    }
}

// Tensor-core helpers (inline NVIDIA PTX, sm_80+) for programs built with -DTC_TF32, -DTC_BF16 or
// -DTC_F16 (matmul_tc.cl, attention_tc.cl; only where ops/src/matmul/matmul_tc.rs's probe passed).
#if defined(TC_TF32) || defined(TC_BF16) || defined(TC_F16)
#if defined(TC_TF32)
#define MMA_OP "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
#elif defined(TC_BF16)
#define MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define CVT_PAIR "cvt.rn.bf16x2.f32"
#else
#define MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define CVT_PAIR "cvt.rn.f16x2.f32"
#endif

// d (4 f32) += a (4 words, 16 x K) x b (the words b0, b1: K x 8).
#define MMA(d, a, b0, b1)                                                               \
    __asm__(MMA_OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"             \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

// Four 8 x 8 b16 matrices from local memory into r[0..3] (ldmatrix; p: this lane's row address).
#define LDMATRIX_X4(r, p)                                                                      \
    __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"           \
                     : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                  \
                     : "r"((uint)(size_t)(p)))
// The same, each matrix transposed (for tiles whose rows run along the product's K).
#define LDMATRIX_X4_T(r, p)                                                                    \
    __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"     \
                     : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                  \
                     : "r"((uint)(size_t)(p)))

#ifdef CVT_PAIR
// Two f32 rounded to the 16-bit format in one word (lo in the low half, as mma wants it).
inline uint pack2(float lo, float hi) {
    uint r;
    __asm__(CVT_PAIR " %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

// The GEMMs' output C and bias (matmul_tc.cl, matmul_wg.cl): f32 under -DC_F32 (16-bit products
// written without rounding to 16 bits), else the storage type.
#ifdef C_F32
typedef float OT;
#define OLOAD(p, i) ((p)[i])
#define OSTORE(p, i, v) ((p)[i] = (v))
#else
typedef T OT;
#define OLOAD(p, i) LOAD(p, i)
#define OSTORE(p, i, v) STORE(p, i, v)
#if defined(TC_BF16) || defined(TC_F16)
// Columns n and n + 1 at an even element e: both rounded by one cvt (common.cl's pack2, lower
// column in the low half) and written as one 32-bit word, where the portable STORE spends a
// dozen integer operations and a 16-bit store on each.
inline void store_pair(__global OT* c, uint e, float lo, float hi) {
    ((__global uint*)c)[e / 2] = pack2(lo, hi);
}
#define PAIRED
#endif
#endif
#endif
