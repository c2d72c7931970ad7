// conv.cl: 2-D convolution helpers: im2col, gathering col2im (no atomics), per-channel bias add and bias gradient.

// Convolution geometry: the window, groups of cg input channels each, and the columns' strides.
typedef struct {
    Window2 win;
    uint groups;
    uint cg;              // input channels per group
    uint col_stride[4];   // columns (N, G, K, L), K = cg * kh * kw, L = ho * wo: element strides
    Div dl, dk, dgroups;  // L, K and groups as divisors
    Div dkk, dkw, dwo;    // kh * kw, kw and wo
    Div dcg, dc, dh, dw;  // cg and the input's C, H, W
} ConvGeom;

// x[b, c, h, w] through v, 0 outside the image (the padding).
inline ACC padded_at(__global const T* x, const View4* v, uint b, uint c, int h, int w) {
    if (h < 0 || w < 0 || (uint)h >= v->shape[2] || (uint)w >= v->shape[3]) return (ACC)0;
    return LOAD(x, v->offset + b * v->stride[0] + c * v->stride[1] + (uint)h * v->stride[2] +
                       (uint)w * v->stride[3]);
}

// cols[n, g, k, l] = x[n, g * cg + ci, oh * sh - ph + ki * dh, ow * sw - pw + kj * dw] (0 in the
// padding), k = (ci * kh + ki) * kw + kj, l = oh * wo + ow. One work-item per column element.
__kernel void im2col(__global T* cols,        /* (N, G, K, L) through g.col_stride */
                     __global const T* x,     /* x: (N, C, H, W) through v */
                     View4 v, ConvGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint rest = divq(g.dl, i), li = i - rest * g.dl.d;
    uint bg = divq(g.dk, rest), k = rest - bg * g.dk.d;
    uint b = divq(g.dgroups, bg), gi = bg - b * g.dgroups.d;
    uint ci = divq(g.dkk, k), kr = k - ci * g.dkk.d;
    uint ki = divq(g.dkw, kr), kj = kr - ki * g.dkw.d;
    uint oh = divq(g.dwo, li), ow = li - oh * g.dwo.d;
    uint o = b * g.col_stride[0] + gi * g.col_stride[1] + k * g.col_stride[2] + li * g.col_stride[3];
    STORE(cols, o, padded_at(x, &v, b, gi * g.cg + ci, win_in(&g.win, 0, oh, ki),
                             win_in(&g.win, 1, ow, kj)));
}

// im2col for CPU devices: one work-item per row (n, g, k, oh) of wo columns, its index
// arithmetic once per row and its stores (and at stride 1 its loads) contiguous.
__kernel void im2col_rows(__global T* cols,        /* (N, G, K, L) through g.col_stride */
                          __global const T* x,     /* x: (N, C, H, W) through v */
                          View4 v, ConvGeom g, uint rows /* N * G * K * ho */) {
    uint r = get_global_id(0);
    if (r >= rows) return;
    const uint ho = g.win.out[0], wo = g.win.out[1];
    uint rest = r / ho, oh = r - rest * ho;
    uint bg = divq(g.dk, rest), k = rest - bg * g.dk.d;
    uint b = divq(g.dgroups, bg), gi = bg - b * g.dgroups.d;
    uint ci = divq(g.dkk, k), kr = k - ci * g.dkk.d;
    uint ki = divq(g.dkw, kr), kj = kr - ki * g.dkw.d;
    int h = win_in(&g.win, 0, oh, ki);
    uint o = b * g.col_stride[0] + gi * g.col_stride[1] + k * g.col_stride[2] +
             oh * wo * g.col_stride[3];
    if (g.win.s[1] == 1 && v.stride[3] == 1 && g.col_stride[3] == 1) {
        // Stride 1 along W: zeros, a contiguous copy of the row's in-range taps, zeros.
        int w0 = win_in(&g.win, 1, 0, kj), wi = (int)v.shape[3];
        bool row_in = h >= 0 && (uint)h < v.shape[2];
        int lo = row_in ? clamp(-w0, 0, (int)wo) : (int)wo;
        int hi = row_in ? clamp(wi - w0, lo, (int)wo) : (int)wo;
        uint src = v.offset + b * v.stride[0] + (gi * g.cg + ci) * v.stride[1] +
                   (row_in ? (uint)h * v.stride[2] : 0);
        for (int ow = 0; ow < lo; ++ow) STORE(cols, o + ow, (ACC)0);
        for (int ow = lo; ow < hi; ++ow) STORE(cols, o + ow, LOAD(x, src + w0 + ow));
        for (int ow = hi; ow < (int)wo; ++ow) STORE(cols, o + ow, (ACC)0);
        return;
    }
    for (uint ow = 0; ow < wo; ++ow)
        STORE(cols, o + ow * g.col_stride[3],
              padded_at(x, &v, b, gi * g.cg + ci, h, win_in(&g.win, 1, ow, kj)));
}

// dx[b, c, h, w] = sum over (ki, kj) ascending of cols[b, g, k, oh * wo + ow] for the output
// pixel (oh, ow) whose window puts tap (ki, kj) on (h, w). A gather per input pixel: fixed
// order, no atomics, bit-identical reruns.
__kernel void col2im(__global T* dx,          /* dx: (N, C, H, W), contiguous, shape v.shape */
                     __global const T* cols,  /* (N, G, K, L) through g.col_stride */
                     View4 v, ConvGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint4 at = nchw_index(i, g.dc, g.dh, g.dw);
    uint b = at.x, c = at.y, h = at.z, w = at.w;
    uint gi = divq(g.dcg, c), ci = c - gi * g.cg;
    uint base = b * g.col_stride[0] + gi * g.col_stride[1];
    ACC acc = (ACC)0;
    UNROLL_TAPS
    for (uint ki = 0; ki < TAPS0(g.win); ++ki) {
        int oh = win_out(&g.win, 0, h, ki);
        if (oh < 0) continue;
        UNROLL_TAPS
        for (uint kj = 0; kj < TAPS1(g.win); ++kj) {
            int ow = win_out(&g.win, 1, w, kj);
            if (ow < 0) continue;
            uint k = (ci * TAPS0(g.win) + ki) * TAPS1(g.win) + kj;
            acc += LOAD(cols, base + k * g.col_stride[2] + ((uint)oh * g.win.out[1] + (uint)ow) * g.col_stride[3]);
        }
    }
    STORE(dx, i, acc);
}

// y[b, c, p] += bias[c], in place on a contiguous (N, C, P) tensor.
__kernel void add_channel_bias(__global T* y,           /* y: (N, C, P), contiguous */
                               __global const T* bias,  /* bias: (C) at boff + c * bstride */
                               uint bstride, uint boff, Div c, Div p, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint bc = divq(p, i), ch = bc - divq(c, bc) * c.d;
    STORE(y, i, LOAD(y, i) + LOAD(bias, boff + ch * bstride));
}
