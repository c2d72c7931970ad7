// index.cl: indexing by I32 index tensors: gathers (embedding, index_select, gather) and deterministic scatter-adds.

// out[o.x] = src[o.y + idx[o.z] * stride] when the index is in [0, bound), else 0: an index out
// of range never reads outside the source. Serves embedding, index_select and gather, which
// differ only in the layout the host builds.
__kernel void gather_rows(__global T* out,          /* layout operand 0: (n), contiguous */
                          __global const T* src,    /* layout operand 1: source with the indexed dim's stride 0 */
                          __global const int* idx,  /* layout operand 2: the index of each output element */
                          uint stride,              /* source stride of the indexed dim */
                          uint bound,               /* source size of the indexed dim */
                          Layout l,
                          __global int* err,        /* (4): the device's error record */
                          int code,                 /* op code for the error record */
                          uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    int r = idx[o.z];
    if (r >= 0 && (uint)r < bound) {
        STORE(out, o.x, LOAD(src, o.y + (uint)r * stride));
    } else {
        STORE(out, o.x, (ACC)0);
        report_index(err, code, o.z, r, bound);
    }
}

// Walk of a scatter-add: the output (= x) shape, and the index/src extent scanned per output element.
typedef struct {
    uint ndim;
    uint dim;                   // the indexed dim
    uint zero_init;             // 1: start from 0 instead of reading x
    uint shape[MAX_DIMS];       // output shape (contiguous output)
    uint x_stride[MAX_DIMS];
    uint idx_shape[MAX_DIMS];   // extent of idx (and of src) that is scattered
    uint idx_stride[MAX_DIMS];
    uint src_stride[MAX_DIMS];
    uint x_offset;
    uint idx_offset;
    uint src_offset;
    Div div[MAX_DIMS];          // the output shape as divisors
} ScatterLayout;

// out[c] = x[c] + sum over j ascending of src[c with dim = j] where idx[c with dim = j] == c[dim].
// One work-item per output element scanning idx along the dim: no atomics, so the sum order (and
// the result) is the same on every run and device. Indices out of range match no element.
__kernel void scatter_add(__global T* out,          /* (n): contiguous, shape l.shape */
                          __global const T* x,      /* l.shape with l.x_stride (unread when zero_init) */
                          __global const int* idx,  /* l.idx_shape with l.idx_stride */
                          __global const T* src,    /* l.idx_shape with l.src_stride */
                          ScatterLayout l,
                          __global int* err,        /* (4): the device's error record */
                          int code,                 /* op code for the error record */
                          uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint rem = i, xo = l.x_offset, io = l.idx_offset, so = l.src_offset, target = 0;
    int inside = 1;
    for (int d = (int)l.ndim - 1; d >= 0; --d) {
        uint q = divq(l.div[d], rem), c = rem - q * l.shape[d];
        rem = q;
        xo += c * l.x_stride[d];
        if ((uint)d == l.dim) {
            target = c;
        } else if (c < l.idx_shape[d]) {
            io += c * l.idx_stride[d];
            so += c * l.src_stride[d];
        } else {
            inside = 0;
        }
    }
    ACC acc = l.zero_init ? (ACC)0 : LOAD(x, xo);
    if (inside) {
        uint m = l.idx_shape[l.dim], is = l.idx_stride[l.dim], ss = l.src_stride[l.dim];
        uint bound = l.shape[l.dim];
        for (uint j = 0; j < m; ++j) {
            int v = idx[io + j * is];
            if (v == (int)target) acc += LOAD(src, so + j * ss);
            else if (v < 0 || (uint)v >= bound) report_index(err, code, io + j * is, v, bound);
        }
    }
    STORE(out, i, acc);
}

// Where sorted_row_add reads: rows of D elements of x (V, D) and of src (N, D), each with a row
// and a column stride.
typedef struct {
    uint d;              // row length D
    uint nkeys;          // N: sorted keys, one per src row
    uint zero_init;      // 1: rows start from 0 instead of x
    uint x_stride[2];
    uint x_offset;
    uint src_stride[2];
    uint src_offset;
} RowAddLayout;

// Sorted keys below v (le = 0) or at most v (le = 1): a binary search.
inline uint keys_before(__global const int* keys, uint n, int v, int le) {
    uint lo = 0u, hi = n;
    while (lo < hi) {
        uint mid = lo + (hi - lo) / 2u;
        int k = keys[mid];
        if (k < v || (le && k == v)) lo = mid + 1u;
        else hi = mid;
    }
    return lo;
}

// out[v, c] = x[v, c] (or 0) + sum of src[perm[r], c] over the run of sorted keys equal to v,
// r ascending: with a stable sort that is ascending src row, the order of scatter_add, so the
// result is bit-identical to it and to the host. No atomics; keys outside [0, V) match no row.
// One work-item per output; the runs of the (at most local size) rows a work-group covers are
// searched once each, by one work-item, and shared in local memory.
__kernel void sorted_row_add(__global T* out,            /* (V, D): contiguous */
                             __global const T* x,        /* (V, D) with l.x_stride (unread when zero_init) */
                             __global const T* src,      /* (N, D) with l.src_stride */
                             __global const int* keys,   /* (N): the row indices, sorted */
                             __global const int* perm,   /* (N): src row of each sorted key */
                             __local uint* runs,         /* (2 * local size): [start, end) per row */
                             RowAddLayout l, uint n) {   /* n = V * D */
    uint lid = get_local_id(0), g = get_local_size(0), first = get_group_id(0) * g;
    uint row0 = first / l.d, rows = (min(first + g, n) - 1u) / l.d - row0 + 1u;
    if (lid < rows) {
        uint v = row0 + lid, start = l.nkeys, end = l.nkeys;
        if (v <= (uint)INT_MAX) {
            start = keys_before(keys, l.nkeys, (int)v, 0);
            end = keys_before(keys, l.nkeys, (int)v, 1);
        }
        runs[2u * lid] = start;
        runs[2u * lid + 1u] = end;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint i = first + lid;
    if (i >= n) return;
    uint v = i / l.d, c = i % l.d;
    ACC acc = l.zero_init ? (ACC)0 : LOAD(x, l.x_offset + v * l.x_stride[0] + c * l.x_stride[1]);
    uint end = runs[2u * (v - row0) + 1u];
    for (uint r = runs[2u * (v - row0)]; r < end; ++r) {
        acc += LOAD(src, l.src_offset + (uint)perm[r] * l.src_stride[0] + c * l.src_stride[1]);
    }
    STORE(out, i, acc);
}
