// matmul_parts.cl: the sum of a split-K product's S partial products (launched by ops/src/matmul/matmul_parts.rs) (each over a chunk of K), with the epilogue:
// c[i] = act(sum_p parts[p * MN + i] + bias[i % N]). A work-group of PARTS_GROUP takes
// W = PARTS_GROUP / TEAM consecutive outputs in TEAM slices: slice t sums p = t, t + TEAM, ... in
// order (TEAM 1: all parts in order), and the slices' sums meet in a fixed tree, so many parts
// over few outputs (a convolution's weight gradient) keep the device busy.
#ifndef ACTIVATION  // the epilogue's activation, generated in front of this file (matmul/source.rs)
inline ACC activate(ACC v) { return v; }
#endif
#define PARTS_GROUP 256
// -DPARTS_F32: the parts are f32 (tensor cores' sums of 16-bit operands), the output T.
#ifdef PARTS_F32
typedef float PT;
#define PLOAD(p, i) ((ACC)(p)[i])
#else
typedef T PT;
#define PLOAD(p, i) LOAD(p, i)
#endif
__kernel __attribute__((reqd_work_group_size(PARTS_GROUP, 1, 1)))
void matmul_parts(__global T* c,            /* (M, N) contiguous */
                  __global const PT* parts, /* (S, M, N) contiguous */
                  __global const T* bias,   /* (N), read when has_bias */
                  uint S, uint N, uint has_bias, uint MN, uint TEAM) {
    __local ACC sh[PARTS_GROUP];
    uint lid = get_local_id(0), W = PARTS_GROUP / TEAM;
    uint i = get_group_id(0) * W + lid % W, t = lid / W;
    ACC v = (ACC)0;
    if (i < MN && t < S) {
        v = PLOAD(parts, t * MN + i);
        uint p = t + TEAM;
        // Four loads in flight, added in order.
        for (; p + 3 * TEAM < S; p += 4 * TEAM) {
            ACC a0 = PLOAD(parts, p * MN + i), a1 = PLOAD(parts, (p + TEAM) * MN + i);
            ACC a2 = PLOAD(parts, (p + 2 * TEAM) * MN + i), a3 = PLOAD(parts, (p + 3 * TEAM) * MN + i);
            v += a0;
            v += a1;
            v += a2;
            v += a3;
        }
        for (; p < S; p += TEAM) v += PLOAD(parts, p * MN + i);
    }
    if (TEAM > 1) {
        sh[lid] = v;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint h = TEAM / 2; h > 0; h >>= 1) {
            if (t < h) sh[lid] += sh[lid + h * W];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        v = sh[lid];
    }
    if (t != 0 || i >= MN) return;
    if (has_bias) v += LOAD(bias, i % N);
    STORE(c, i, activate(v));
}
