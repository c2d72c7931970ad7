// common.cl: prepended to every netcl program: dtype macros (-DDT_*), strided layouts, Philox4x32-10.
#pragma OPENCL FP_CONTRACT OFF

#if defined(DT_F32)
typedef float T;
typedef float ACC;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#elif defined(DT_F64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
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
inline ushort bf16_from_float(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
    return (ushort)(u >> 16);
}
#define LOAD(p, i) as_float(((uint)(p)[i]) << 16)
#define STORE(p, i, v) ((p)[i] = bf16_from_float(v))
#elif defined(DT_I32)
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

// Up to three strided operands over one shape; operand 0 is usually the output.
// Strides and offsets count elements; a stride of 0 broadcasts. Mirrors ops::layout::KernelLayout.
#define MAX_DIMS 8
typedef struct {
    uint ndim;
    uint shape[MAX_DIMS];
    uint stride[3][MAX_DIMS];
    uint offset[3];
} Layout;

// Element offsets of the linear (row-major) index i in operands 0..2.
inline uint3 layout_offsets(const Layout* l, uint i) {
    uint3 o = (uint3)(l->offset[0], l->offset[1], l->offset[2]);
    for (int d = (int)l->ndim - 1; d >= 0; --d) {
        uint n = l->shape[d];
        uint idx = i % n;
        i /= n;
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
