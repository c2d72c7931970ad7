// random.cl: Philox4x32-10 streams: work-item j fills elements 4j..4j+3 from counter block base+j.

inline uint4 block_words(uint2 key, ulong base_lo, ulong base_hi, uint j) {
    ulong lo = base_lo + j;
    ulong hi = base_hi + (lo < base_lo ? 1 : 0);
    return philox4x32_10((uint4)((uint)lo, (uint)(lo >> 32), (uint)hi, (uint)(hi >> 32)), key);
}

#if defined(DT_F64)
#define UNIT(w) (((ACC)(w) + 0.5) * (1.0 / 4294967296.0))
#else
#define UNIT(w) (((ACC)((w) >> 9) + 0.5f) * (1.0f / 8388608.0f))
#endif

// Uniform on (low, high): low + (high - low) * u, u = rand_philox::u32_to_unit_f32 (f64: _f64).
__kernel void uniform(__global T* out,  /* (n) */
                      uint key0, uint key1, ulong base_lo, ulong base_hi,
                      ACC low, ACC high, uint n) {
    uint j = get_global_id(0);
    if (4 * j >= n) return;
    uint4 w = block_words((uint2)(key0, key1), base_lo, base_hi, j);
    uint words[4] = {w.x, w.y, w.z, w.w};
    for (uint k = 0; k < 4 && 4 * j + k < n; ++k) STORE(out, 4 * j + k, low + (high - low) * UNIT(words[k]));
}

// Normal(mean, std) by Box-Muller: words (w0,w1) give elements 4j, 4j+1; (w2,w3) give 4j+2, 4j+3.
__kernel void normal(__global T* out,  /* (n) */
                     uint key0, uint key1, ulong base_lo, ulong base_hi,
                     ACC mean, ACC std, uint n) {
    uint j = get_global_id(0);
    if (4 * j >= n) return;
    uint4 w = block_words((uint2)(key0, key1), base_lo, base_hi, j);
    const ACC two_pi = (ACC)6.283185307179586;
    ACC r0 = sqrt((ACC)-2 * log(UNIT(w.x))), t0 = two_pi * UNIT(w.y);
    ACC r1 = sqrt((ACC)-2 * log(UNIT(w.z))), t1 = two_pi * UNIT(w.w);
    ACC z[4] = {r0 * cos(t0), r0 * sin(t0), r1 * cos(t1), r1 * sin(t1)};
    for (uint k = 0; k < 4 && 4 * j + k < n; ++k) STORE(out, 4 * j + k, mean + std * z[k]);
}

// mask[k] = 1 when word k of block j of the stream is below `threshold`, else 0.
inline void bernoulli_block(uint* mask, uint key0, uint key1, ulong base_lo, ulong base_hi,
                            ulong threshold, uint j) {
    uint4 w = block_words((uint2)(key0, key1), base_lo, base_hi, j);
    uint words[4] = {w.x, w.y, w.z, w.w};
    for (uint k = 0; k < 4; ++k) mask[k] = (ulong)words[k] < threshold ? 1u : 0u;
}

// Bernoulli draws (dropout.rs): element i is 1 when word i of the stream is below `threshold`
// (= round(p * 2^32), a 64-bit value so that p = 1 keeps everything); integer compares are exact everywhere.
__kernel void bernoulli(__global T* out,  /* (n) */
                        uint key0, uint key1, ulong base_lo, ulong base_hi,
                        ulong threshold, uint n) {
    uint j = get_global_id(0);
    if (4 * j >= n) return;
    uint mask[4];
    bernoulli_block(mask, key0, key1, base_lo, base_hi, threshold, j);
    for (uint k = 0; k < 4 && 4 * j + k < n; ++k) STORE(out, 4 * j + k, (ACC)mask[k]);
}

// The same mask as 32-bit integers 1/0 (i32 and u32 masks; built in a float program since
// the kernels above need float math).
__kernel void bernoulli_int(__global uint* out,  /* (n) */
                            uint key0, uint key1, ulong base_lo, ulong base_hi,
                            ulong threshold, uint n) {
    uint j = get_global_id(0);
    if (4 * j >= n) return;
    uint mask[4];
    bernoulli_block(mask, key0, key1, base_lo, base_hi, threshold, j);
    for (uint k = 0; k < 4 && 4 * j + k < n; ++k) out[4 * j + k] = mask[k];
}

// Dropout of a strided x: mask as bernoulli(1 - p) over x's row-major order, y = mask ? x * scale : 0.
__kernel void dropout(__global T* y,        /* layout operand 0: (n), contiguous */
                      __global T* mask,     /* (n), contiguous */
                      __global const T* x,  /* layout operand 1 */
                      uint key0, uint key1, ulong base_lo, ulong base_hi,
                      ulong threshold, ACC scale, Layout l, uint n) {
    uint j = get_global_id(0);
    if (4 * j >= n) return;
    uint keep[4];
    bernoulli_block(keep, key0, key1, base_lo, base_hi, threshold, j);
    for (uint k = 0; k < 4 && 4 * j + k < n; ++k) {
        uint i = 4 * j + k;
        uint3 o = layout_offsets(&l, i);
        STORE(mask, i, (ACC)keep[k]);
        STORE(y, o.x, keep[k] ? (ACC)(LOAD(x, o.y) * scale) : (ACC)0);
    }
}
