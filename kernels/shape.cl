// shape.cl: shape ops that are not plain strided copies: one_hot, constant pad, triangular masks and triu/tril.

// out[.., c] = (ids[..] == c): one row of `classes` per id; an id out of range gives a row of zeros.
__kernel void one_hot(__global T* out,          /* (n) = (ids.., classes), contiguous */
                      __global const int* ids,  /* layout operand 1 over out's shape (class dim stride 0) */
                      uint classes, Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    STORE(out, i, (ids[o.y] == (int)(i % classes)) ? (ACC)1 : (ACC)0);
}

// Walk of a constant pad: output shape, padding before each dim, and the strided input.
typedef struct {
    uint ndim;
    uint shape[MAX_DIMS];     // output shape
    uint before[MAX_DIMS];    // padding before the input in each dim
    uint in_shape[MAX_DIMS];  // input shape
    uint x_stride[MAX_DIMS];
    uint x_offset;
    Div div[MAX_DIMS];        // the output shape as divisors
} PadLayout;

// out = x surrounded by `value`, one work-item per output element.
__kernel void pad_constant(__global T* out,        /* (n): contiguous, shape l.shape */
                           __global const T* x,    /* l.in_shape with l.x_stride */
                           PadLayout l, ACC value, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint rem = i, xo = l.x_offset;
    int inside = 1;
    for (int d = (int)l.ndim - 1; d >= 0; --d) {
        uint q = divq(l.div[d], rem), c = rem - q * l.shape[d];
        rem = q;
        if (c < l.before[d] || c - l.before[d] >= l.in_shape[d]) {
            inside = 0;
        } else {
            xo += (c - l.before[d]) * l.x_stride[d];
        }
    }
    STORE(out, i, inside ? LOAD(x, xo) : value);
}

// Whether (row, col) is kept by triu (upper = 1: col - row >= diagonal) or tril (col - row <= diagonal).
inline int tri_keep(uint row, uint col, int diagonal, uint upper) {
    long d = (long)col - (long)row;
    return upper ? (d >= (long)diagonal) : (d <= (long)diagonal);
}

// triu/tril of a batch of matrices: out = kept ? x : fill.
__kernel void tri_select(__global T* out,        /* layout operand 0: (.., rows, cols), contiguous */
                         __global const T* x,    /* layout operand 1 */
                         uint rows, uint cols, int diagonal, uint upper, ACC fill,
                         Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    uint col = i % cols, row = (i / cols) % rows;
    STORE(out, o.x, tri_keep(row, col, diagonal, upper) ? LOAD(x, o.y) : fill);
}

// A (rows, cols) mask: `inside` where triu/tril keeps the element, `outside` elsewhere.
__kernel void tri_mask(__global T* out,  /* (rows, cols), contiguous */
                       uint cols, int diagonal, uint upper, ACC inside, ACC outside, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    STORE(out, i, tri_keep(i / cols, i % cols, diagonal, upper) ? inside : outside);
}
