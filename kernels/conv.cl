// conv.cl: 2-D convolution helpers: im2col, gathering col2im (no atomics), per-channel bias add and bias gradient.

// Convolution geometry; the channels of one group are cg, the columns of one image l = ho * wo.
typedef struct {
    uint groups;
    uint cg;              // input channels per group
    uint kh, kw;
    uint sh, sw;
    uint ph, pw;
    uint dh, dw;
    uint ho, wo;
    uint col_stride[4];   // columns (N, G, K, L), K = cg * kh * kw, L = ho * wo: element strides
} ConvGeom;

// cols[n, g, k, l] = x[n, g * cg + ci, oh * sh - ph + ki * dh, ow * sw - pw + kj * dw] (0 in the
// padding), k = (ci * kh + ki) * kw + kj, l = oh * wo + ow. One work-item per column element.
__kernel void im2col(__global T* cols,        /* (N, G, K, L) through g.col_stride */
                     __global const T* x,     /* x: (N, C, H, W) through v */
                     View4 v, ConvGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint l = g.ho * g.wo, kk = g.kh * g.kw;
    uint K = g.cg * kk;
    uint li = i % l, rest = i / l;
    uint k = rest % K;
    rest /= K;
    uint gi = rest % g.groups, b = rest / g.groups;
    uint ci = k / kk, kr = k % kk, ki = kr / g.kw, kj = kr % g.kw;
    uint oh = li / g.wo, ow = li % g.wo;
    int h = (int)(oh * g.sh + ki * g.dh) - (int)g.ph;
    int w = (int)(ow * g.sw + kj * g.dw) - (int)g.pw;
    uint o = b * g.col_stride[0] + gi * g.col_stride[1] + k * g.col_stride[2] + li * g.col_stride[3];
    ACC val = (ACC)0;
    if (h >= 0 && w >= 0 && (uint)h < v.shape[2] && (uint)w < v.shape[3]) {
        uint c = gi * g.cg + ci;
        val = LOAD(x, v.offset + b * v.stride[0] + c * v.stride[1] + (uint)h * v.stride[2] +
                          (uint)w * v.stride[3]);
    }
    STORE(cols, o, val);
}

// dx[b, c, h, w] = sum over (ki, kj) ascending of cols[b, g, k, oh * wo + ow] for the output
// pixel (oh, ow) whose window puts tap (ki, kj) on (h, w). A gather per input pixel: fixed
// order, no atomics, bit-identical reruns.
__kernel void col2im(__global T* dx,          /* dx: (N, C, H, W), contiguous, shape v.shape */
                     __global const T* cols,  /* (N, G, K, L) through g.col_stride */
                     View4 v, ConvGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint W = v.shape[3], H = v.shape[2], C = v.shape[1];
    uint w = i % W, h = (i / W) % H, c = (i / (W * H)) % C, b = i / (W * H * C);
    uint gi = c / g.cg, ci = c % g.cg;
    uint base = b * g.col_stride[0] + gi * g.col_stride[1];
    ACC acc = (ACC)0;
    for (uint ki = 0; ki < g.kh; ++ki) {
        int th = (int)(h + g.ph) - (int)(ki * g.dh);
        if (th < 0 || (uint)th % g.sh != 0) continue;
        uint oh = (uint)th / g.sh;
        if (oh >= g.ho) continue;
        for (uint kj = 0; kj < g.kw; ++kj) {
            int tw = (int)(w + g.pw) - (int)(kj * g.dw);
            if (tw < 0 || (uint)tw % g.sw != 0) continue;
            uint ow = (uint)tw / g.sw;
            if (ow >= g.wo) continue;
            uint k = (ci * g.kh + ki) * g.kw + kj;
            acc += LOAD(cols, base + k * g.col_stride[2] + (oh * g.wo + ow) * g.col_stride[3]);
        }
    }
    STORE(dx, i, acc);
}

// y[b, c, p] += bias[c], in place on a contiguous (N, C, P) tensor.
__kernel void add_channel_bias(__global T* y,           /* y: (N, C, P), contiguous */
                               __global const T* bias,  /* bias: (C) at boff + c * bstride */
                               uint bstride, uint boff, uint c, uint p, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint ch = (i / p) % c;
    STORE(y, i, LOAD(y, i) + LOAD(bias, boff + ch * bstride));
}
