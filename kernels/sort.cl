// sort.cl: stable sort of i32 keys: a bitonic network on (key, position) pairs, chunks and small strides in local memory.

// Every pair is distinct (positions differ), so the order is total: the network's result is the
// one stable order, whatever the chunk size, device or run. Padding past n has key INT_MAX and
// position >= n, so it sorts after every real pair.

// True when pair (ka, pa) comes after pair (kb, pb).
inline bool pair_after(int ka, int pa, int kb, int pb) {
    return ka > kb || (ka == kb && pa > pb);
}

// First element of compare-exchange t of a pass with stride j (a power of two): pairs are
// (i, i + j) for every i whose bit j is clear.
inline uint pass_first(uint t, uint j) {
    return ((t & ~(j - 1u)) << 1) | (t & (j - 1u));
}

// Compare-exchange t of pass (stage k, stride j) on a chunk in local memory starting at global
// element `base`: ascending where bit k of the global index is clear, descending elsewhere.
inline void local_exchange(__local int* lk, __local int* lp, uint t, uint j, uint k, uint base) {
    uint i = pass_first(t, j), l = i + j;
    int ka = lk[i], kb = lk[l], pa = lp[i], pb = lp[l];
    if (pair_after(ka, pa, kb, pb) == (((base + i) & k) == 0u)) {
        lk[i] = kb;
        lk[l] = ka;
        lp[i] = pb;
        lp[l] = pa;
    }
}

// Each work-group holds one chunk of c = 4 * local size pairs in local memory (two
// compare-exchanges per work-item and pass). stage 0: loads keys from x (padding past n) with
// their positions and runs stages 2..c of the network (chunks alternate ascending and descending,
// so pairs of chunks are bitonic). stage k > c: loads the chunk from keys/pos and runs the passes
// of stage k with strides c/2..1 (the larger strides ran in sort_merge).
__kernel void sort_chunks(__global int* keys,       /* (p): the keys in network order */
                          __global int* pos,        /* (p): their positions */
                          __global const int* x,    /* (n) with x_stride from x_offset, read at stage 0 */
                          uint x_offset, uint x_stride, uint n,
                          uint stage,
                          __local int* lk,          /* (c) */
                          __local int* lp) {        /* (c) */
    uint lid = get_local_id(0), g = get_local_size(0), c = 4u * g;
    uint base = get_group_id(0) * c;
    for (uint u = lid; u < c; u += g) {
        uint e = base + u;
        if (stage == 0u) {
            lk[u] = e < n ? x[x_offset + e * x_stride] : INT_MAX;
            lp[u] = (int)e;
        } else {
            lk[u] = keys[e];
            lp[u] = pos[e];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint k = stage == 0u ? 2u : stage, last = stage == 0u ? c : stage;
    for (;;) {
        for (uint j = min(k, c) >> 1; j > 0u; j >>= 1) {
            local_exchange(lk, lp, lid, j, k, base);
            local_exchange(lk, lp, lid + g, j, k, base);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (k >= last) break;  // k doubles up to last (<= 2^31) without overflowing
        k <<= 1;
    }
    for (uint u = lid; u < c; u += g) {
        keys[base + u] = lk[u];
        pos[base + u] = lp[u];
    }
}

// One pass of stage k with a stride j of at least a chunk: compare-exchange t of `pairs` (p / 2)
// on the arrays in global memory.
__kernel void sort_merge(__global int* keys,  /* (p) */
                         __global int* pos,   /* (p) */
                         uint k, uint j,
                         uint pairs) {
    uint t = get_global_id(0);
    if (t >= pairs) return;
    uint i = pass_first(t, j), l = i + j;
    int ka = keys[i], kb = keys[l], pa = pos[i], pb = pos[l];
    if (pair_after(ka, pa, kb, pb) == ((i & k) == 0u)) {
        keys[i] = kb;
        keys[l] = ka;
        pos[i] = pb;
        pos[l] = pa;
    }
}
