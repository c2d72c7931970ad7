// rope.cl: rotary position embeddings in the Llama layout x: (B, T, H, Dh), pairs interleaved (llama2.c) or split halves (Hugging Face).

#if !defined(DT_I32) && !defined(DT_U32)  // float dtypes only (rope.rs rejects the others)

#define ROPE_HEADS 4

// One work-item per (b, t, pair index) for all H heads, which share the angle: a = pos * inv_freq[i]
// with a table, else pos / theta^(2i / Dh) (computed in ACC, as llama2.c does in float),
// y0 = x0 cos a - x1 sin a, y1 = x0 sin a + x1 cos a for the pair (x0, x1) = x[first], x[first + second].
// pos = pos0 + t, or ids[t] / ids[b * T + t] with use_ids (per_row: ids are [B, T]).
// sign = -1 rotates by -a: the inverse rotation, which is rope's backward (its transpose).
__kernel void rope(__global T* out,              /* layout operand 0: (B, T, Dh/2) pair starts of head 0 of a contiguous (B, T, H, Dh) */
                   __global const T* x,          /* layout operand 1: (B, T, Dh/2) pair starts of head 0 of x */
                   __global const int* ids,      /* (T) or (B, T) position ids, read only with use_ids */
                   __global const ACC* inv_freq, /* (Dh/2) pair frequencies, read only with use_table */
                   uint use_table,
                   uint x_second,                /* x's offset from a pair's first element to its second */
                   uint out_second,              /* the same in out: 1 (interleaved) or Dh/2 (halves) */
                   uint x_head, uint out_head,   /* strides between heads in x and out */
                   uint seq, uint heads, uint half_dim, uint pos0, uint use_ids, uint per_row,
                   ACC theta, ACC sign, Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    uint p = i % half_dim;
    uint bt = i / half_dim;
    uint t = bt % seq;
    uint pos = use_ids ? (uint)ids[per_row ? bt : t] : pos0 + t;
    ACC freq = use_table ? inv_freq[p] : (ACC)1 / pow(theta, (ACC)(2 * p) / (ACC)(2 * half_dim));
    ACC a = (ACC)pos * freq;
    ACC c = cos(a), s = sign * sin(a);
    // Heads in groups of ROPE_HEADS: every load of a group before its stores, so the loads are in
    // flight together (out may be x itself: each element is read before it is written).
    for (uint h0 = 0; h0 < heads; h0 += ROPE_HEADS) {
        ACC x0[ROPE_HEADS], x1[ROPE_HEADS];
#pragma unroll
        for (uint j = 0; j < ROPE_HEADS; j++) {
            uint at = o.y + (h0 + j) * x_head;
            bool in = h0 + j < heads;
            x0[j] = in ? LOAD(x, at) : (ACC)0;
            x1[j] = in ? LOAD(x, at + x_second) : (ACC)0;
        }
#pragma unroll
        for (uint j = 0; j < ROPE_HEADS; j++) {
            if (h0 + j >= heads) break;
            uint at = o.x + (h0 + j) * out_head;
            STORE(out, at, x0[j] * c - x1[j] * s);
            STORE(out, at + out_second, x0[j] * s + x1[j] * c);
        }
    }
}

#endif
