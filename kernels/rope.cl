// rope.cl: rotary position embeddings in the Llama layout x: (B, T, H, Dh), pairs (2i, 2i+1) interleaved as in llama2.c.

#if !defined(DT_I32) && !defined(DT_U32)  // float dtypes only (rope.rs rejects the others)

// One work-item per pair: a = (pos0 + t) / theta^(2i / Dh) (computed in ACC, as llama2.c does in float),
// y[2i] = x[2i] cos a - x[2i+1] sin a, y[2i+1] = x[2i] sin a + x[2i+1] cos a.
// sign = -1 rotates by -a: the inverse rotation, which is rope's backward (its transpose).
__kernel void rope(__global T* out,        /* layout operand 0: (B, T, H, Dh/2) pair starts of a contiguous (B, T, H, Dh) */
                   __global const T* x,    /* layout operand 1: (B, T, H, Dh/2) pair starts of x */
                   uint x_pair_stride,     /* x's stride of the Dh dim (the pair's second element) */
                   uint seq, uint heads, uint half_dim, uint pos0, ACC theta, ACC sign,
                   Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    uint p = i % half_dim;
    uint t = (i / (half_dim * heads)) % seq;
    ACC freq = (ACC)1 / pow(theta, (ACC)(2 * p) / (ACC)(2 * half_dim));
    ACC a = (ACC)(pos0 + t) * freq;
    ACC c = cos(a), s = sign * sin(a);
    ACC x0 = LOAD(x, o.y), x1 = LOAD(x, o.y + x_pair_stride);
    STORE(out, o.x, x0 * c - x1 * s);
    STORE(out, o.x + 1, x0 * s + x1 * c);
}

#endif
