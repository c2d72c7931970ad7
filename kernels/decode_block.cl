// decode_block.cl: a whole Llama block for one token per batch row in one persistent kernel, built after decode.cl (whose GEMV and attention tiles it runs as five stages).

#if !defined(DT_I32) && !defined(DT_U32)  // float dtypes only, as decode.cl

// decode_block's sizes: the four GEMVs' and the attention's, each stage's tiles (the work-groups
// its own launch would have) and where the block's intermediates lie in the scratch buffer.
typedef struct {
    GemvArgs st[4];   // q/k/v (norm, RoPE, cache write), wo (+ x), gate/up (norm, SwiGLU), down (+ h)
    uint att[8];      // decode_attention's sizes
    uint tiles[5];    // tickets of the five stages in order: runs of `per` consecutive tiles
    uint per[5];      // tiles a ticket runs (attention: 1)
    uint count[5];    // tiles of each stage (the work-groups of its own launch)
    uint groups[5];   // grid dim 0 of each GEMV stage (tile i: group i % groups, batch group i / groups)
    uint off_q, off_att, off_h, off_act;  // element offsets in scratch
    uint nsplit;      // attention splits per row and head
    uint off_part;    // ACC offset of the split records in work (after B H counters)
} BlockArgs;

#define STAGES 5
#define SYNC_EXITS (STAGES + 1)

// Lid 0's next tile: the counter's next value, once the stage before the tile's is complete
// (polled through a volatile read: the counters are written by atomics of other work-groups).
inline uint next_tile(__global int* sync, const uint* tiles, uint total) {
    uint t = (uint)atomic_inc(&sync[0]), s = 0, first = 0;
    while (s < STAGES && t >= first + tiles[s]) first += tiles[s++];
    if (t < total && s > 0) {
        __global volatile int* done = sync + s;
        while ((uint)*done < tiles[s - 1]) {}
    }
    return t;
}

// A Llama block for one token per batch row, the five launches of decode_gemv and decode_attention
// as stages of one: out = h + down(swiglu(norm(h))), h = x + wo(attention(rope(qkv(norm(x))))).
// Work-groups (as many as stay resident) take tickets in order from the counter sync[0], each a
// run of tiles of one stage; a ticket of stage s first waits until every ticket of stage s - 1 is
// done (sync[s] counts them). A ticket only waits on tickets handed out before it, whose
// work-groups are running, so any number of work-groups and any device (one group at a time
// included) finishes. The last work-group out
// sets the counters back to 0 for the next launch (launches on one queue run one after another).
// Attention runs in nsplit parts per row and head; the last part done (counted in work) combines
// them.
__kernel __attribute__((reqd_work_group_size(GEMV_GROUP, 1, 1)))
void decode_block(__global T* out,            /* (B, d) */
                  __global T* scratch,        /* q (B, H hd), attention (B, H hd), h (B, d), act (B, F) at off_* */
                  __global ACC* work,         /* B H split counters (as int), then B H nsplit split records */
                  __global const T* x,        /* (B, d) */
                  __global const T* g_att,    /* (d) attention RMSNorm weight */
                  __global const T* wq,       /* (H hd, d) */
                  __global const T* wk,       /* (Hkv hd, d) */
                  __global const T* wv,       /* (Hkv hd, d) */
                  __global const T* b_qkv,    /* (H hd + 2 Hkv hd) joined biases (st[0].has_bias) */
                  __global const T* wo,       /* (d, H hd) */
                  __global const T* b_o,      /* (d) (st[1].has_bias) */
                  __global const T* g_ffn,    /* (d) MLP RMSNorm weight */
                  __global const T* w1,       /* (F, d) gate */
                  __global const T* w3,       /* (F, d) up */
                  __global const T* b_13,     /* (2F) joined biases (st[2].has_bias) */
                  __global const T* w2,       /* (d, F) down */
                  __global const T* b_2,      /* (d) (st[3].has_bias) */
                  __global T* kc,             /* (B, Hkv, smax, hd) key cache */
                  __global T* vc,             /* (B, Hkv, smax, hd) value cache */
                  __global const int* pads,   /* (B) left padding (has_pads) */
                  __global const ACC* inv_freq,/* (hd / 2) RoPE frequencies (use_table) */
                  __global const int* step,   /* (1) the cache position written and attended to */
                  __global int* err,          /* (12) the device's error record (4), then counters (8): next
                                                 tile, tiles done per stage, groups out; 0 between launches */
                  BlockArgs a, ACC eps_att, ACC eps_ffn, ACC theta, ACC scale) {
    __local ACC4 lm[GEMV_LOCAL / 4];
    __local uint shared[2];  // the tile; whether this attention part is its head's last
    __local ACC* part = (__local ACC*)lm;
    __global int* sync = err + 4;
    __global int* heads_done = (__global int*)work;
    __global ACC* records = work + a.off_part;
    __global T* q = scratch + a.off_q;
    __global T* att = scratch + a.off_att;
    __global T* h = scratch + a.off_h;
    __global T* act = scratch + a.off_act;
    uint lid = get_local_id(0), total = 0, nsplit = a.nsplit, hd = a.att[2];
    uint heads = a.st[0].B * a.att[0];
    for (uint s = 0; s < STAGES; s++) total += a.tiles[s];
    if (lid == 0) shared[0] = next_tile(sync, a.tiles, total);
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    uint ticket = shared[0];
    while (ticket < total) {
        uint t = ticket, s = 0;
        while (t >= a.tiles[s]) t -= a.tiles[s++];
        // The first q/k/v tile zeroes the attention parts' counters (read from stage 1 on).
        if (s == 0 && t == 0)
            for (uint i = lid; i < heads; i += GEMV_GROUP) heads_done[i] = 0;
        if (s == 1) {
            // Part t % nsplit of row and head t / nsplit; the last part of its head combines.
            uint wg = t / nsplit;
            attention_tile(wg, t % nsplit, nsplit, true, records, part, att, q, kc, vc, pads, step,
                           err, a.att, scale);
            if (nsplit > 1) {
                mem_fence(CLK_GLOBAL_MEM_FENCE);
                barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
                if (lid == 0) shared[1] = (uint)atomic_inc(&heads_done[wg]) == nsplit - 1;
                barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
                if (shared[1]) attention_combine(wg, nsplit, hd, records, att);
            }
        } else for (uint j = t * a.per[s]; j < min((t + 1) * a.per[s], a.count[s]); j++) {
            GemvArgs ga = a.st[s == 0 ? 0 : s - 1];
            uint g0 = j % a.groups[s], g1 = j / a.groups[s];
            if (s == 0)
                gemv_tile(g0, g1, part, q, x, g_att, wq, wk, wv, x, b_qkv, kc, vc, pads, inv_freq, step,
                          err, ga, eps_att, theta);
            else if (s == 2)
                gemv_tile(g0, g1, part, h, att, g_att, wo, wo, wo, x, b_o, kc, vc, pads, inv_freq, step,
                          err, ga, eps_att, theta);
            else if (s == 3)
                gemv_tile(g0, g1, part, act, h, g_ffn, w1, w3, w1, h, b_13, kc, vc, pads, inv_freq,
                          step, err, ga, eps_ffn, theta);
            else
                gemv_tile(g0, g1, part, out, act, g_ffn, w2, w2, w2, h, b_2, kc, vc, pads, inv_freq,
                          step, err, ga, eps_ffn, theta);
            barrier(CLK_LOCAL_MEM_FENCE);  // the tile's last reads of part before the next's writes
        }
        // Every work-item's stores out to the device before the tile counts as done.
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (lid == 0) {
            atomic_inc(&sync[1 + s]);
            shared[0] = next_tile(sync, a.tiles, total);
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        ticket = shared[0];
    }
    if (lid == 0 && (uint)atomic_inc(&sync[SYNC_EXITS]) == get_num_groups(0) - 1)
        for (uint i = 0; i <= SYNC_EXITS; i++) atomic_xchg(&sync[i], 0);
}

#endif
