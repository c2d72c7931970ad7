// pool.cl: 2-D max / average / adaptive-average pooling over NCHW and their deterministic (gathering) backwards.

// Pooling geometry: the window over an input plane (h, w) giving an output plane (out[0], out[1]).
typedef struct {
    Window2 win;
    uint h, w;
    uint include_pad;  // avg pooling: divide by the padded window size
    Div dc, dh, dw, dho, dwo;  // channels, input and output extents as divisors
} PoolGeom;

inline uint at4(const View4* v, uint b, uint c, uint h, uint w) {
    return v->offset + b * v->stride[0] + c * v->stride[1] + h * v->stride[2] + w * v->stride[3];
}

// y[b, c, oh, ow] = max over the window's in-range taps (first maximum; NaN wins and stays),
// idx = its h * W + w in the input plane (-1 when no tap is in range).
__kernel void max_pool2d(__global T* y,          /* y: (N, C, Ho, Wo), contiguous */
                         __global int* idx,      /* idx: (N, C, Ho, Wo), contiguous */
                         __global const T* x,    /* x: (N, C, H, W) through v */
                         View4 v, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint ho = g.win.out[0], wo = g.win.out[1];
    uint4 at = nchw_index(i, g.dc, g.dho, g.dwo);
    uint b = at.x, c = at.y, oh = at.z, ow = at.w;
    // -inf where no tap is in range (the first tap in range always replaces it).
    ACC best = (ACC)(-INFINITY);
    int bi = -1;
    UNROLL_TAPS
    for (uint ki = 0; ki < TAPS0(g.win); ++ki) {
        int h = win_in(&g.win, 0, oh, ki);
        if (h < 0 || (uint)h >= g.h) continue;
        UNROLL_TAPS
        for (uint kj = 0; kj < TAPS1(g.win); ++kj) {
            int w = win_in(&g.win, 1, ow, kj);
            if (w < 0 || (uint)w >= g.w) continue;
            ACC val = LOAD(x, at4(&v, b, c, (uint)h, (uint)w));
            if (bi < 0 || (!isnan(best) && (val > best || isnan(val)))) {
                best = val;
                bi = h * (int)g.w + w;
            }
        }
    }
    STORE(y, i, best);
    idx[i] = bi;
}

// dx[b, c, h, w] = sum over the windows (ki, kj ascending) that contain (h, w) and whose index
// names it, of gy. Gathers per input pixel: correct for overlapping windows, no atomics.
__kernel void max_pool2d_backward(__global T* dx,          /* dx: (N, C, H, W), contiguous */
                                  __global const T* gy,    /* gy: (N, C, Ho, Wo) through gv */
                                  __global const int* idx, /* idx: (N, C, Ho, Wo) through iv */
                                  View4 gv, View4 iv, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint4 at = nchw_index(i, g.dc, g.dh, g.dw);
    uint b = at.x, c = at.y, h = at.z, w = at.w;
    int me = (int)(h * g.w + w);
    ACC acc = (ACC)0;
    UNROLL_TAPS
    for (uint ki = 0; ki < TAPS0(g.win); ++ki) {
        int oh = win_out(&g.win, 0, h, ki);
        if (oh < 0) continue;
        UNROLL_TAPS
        for (uint kj = 0; kj < TAPS1(g.win); ++kj) {
            int ow = win_out(&g.win, 1, w, kj);
            if (ow < 0) continue;
            // Both loads at once (not the gradient after the index): one memory latency a tap.
            ACC tap = LOAD(gy, at4(&gv, b, c, oh, ow));
            if (idx[at4(&iv, b, c, oh, ow)] == me) acc += tap;
        }
    }
    STORE(dx, i, acc);
}

// max_pool2d_backward where the windows tile the input exactly (kernel = stride, no padding or
// dilation, out * stride = in, so every pixel lies in one window): one work-item per window writes
// its k0 x k1 pixels, 0 + gy at the window's maximum and 0 elsewhere (the gather's values, in a
// quarter of the work-items for 2 x 2 windows).
__kernel void max_pool2d_backward_tiled(__global T* dx,          /* dx: (N, C, H, W), contiguous */
                                        __global const T* gy,    /* gy: (N, C, Ho, Wo) through gv */
                                        __global const int* idx, /* idx: (N, C, Ho, Wo) through iv */
                                        View4 gv, View4 iv, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint4 at = nchw_index(i, g.dc, g.dho, g.dwo);
    uint b = at.x, c = at.y, oh = at.z, ow = at.w;
    ACC v = (ACC)0 + LOAD(gy, at4(&gv, b, c, oh, ow));
    int m = idx[at4(&iv, b, c, oh, ow)];
    uint k0 = TAPS0(g.win), k1 = TAPS1(g.win);
    uint plane = (b * g.dc.d + c) * g.h * g.w;
    for (uint ki = 0; ki < k0; ++ki) {
        uint h = oh * k0 + ki;
        for (uint kj = 0; kj < k1; ++kj) {
            uint at_hw = h * g.w + ow * k1 + kj;
            STORE(dx, plane + at_hw, (int)at_hw == m ? v : (ACC)0);
        }
    }
}

// Divisor of the average over output pixel (oh, ow), as PyTorch's avg_pool2d; with ceil_mode a
// partial last window counts its taps up to the padded edge.
inline ACC avg_divisor(const PoolGeom* g, uint oh, uint ow, int* hs, int* he, int* ws, int* we) {
    *hs = win_in(&g->win, 0, oh, 0);
    *ws = win_in(&g->win, 1, ow, 0);
    *he = min(*hs + (int)g->win.k[0], (int)(g->h + g->win.p[0]));
    *we = min(*ws + (int)g->win.k[1], (int)(g->w + g->win.p[1]));
    int pool = (*he - *hs) * (*we - *ws);
    *hs = max(*hs, 0);
    *ws = max(*ws, 0);
    *he = min(*he, (int)g->h);
    *we = min(*we, (int)g->w);
    return (ACC)(g->include_pad ? pool : (*he - *hs) * (*we - *ws));
}

// y[b, c, oh, ow] = sum of the window's in-range taps (row-major) / divisor.
__kernel void avg_pool2d(__global T* y,        /* y: (N, C, Ho, Wo), contiguous */
                         __global const T* x,  /* x: (N, C, H, W) through v */
                         View4 v, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint ho = g.win.out[0], wo = g.win.out[1];
    uint4 at = nchw_index(i, g.dc, g.dho, g.dwo);
    uint b = at.x, c = at.y, oh = at.z, ow = at.w;
    int hs, he, ws, we;
    ACC div = avg_divisor(&g, oh, ow, &hs, &he, &ws, &we);
    ACC acc = (ACC)0;
    for (int h = hs; h < he; ++h)
        for (int w = ws; w < we; ++w) acc += LOAD(x, at4(&v, b, c, (uint)h, (uint)w));
    STORE(y, i, acc / div);
}

// dx[b, c, h, w] = sum over the windows (ki, kj ascending) containing (h, w) of gy / divisor.
__kernel void avg_pool2d_backward(__global T* dx,        /* dx: (N, C, H, W), contiguous */
                                  __global const T* gy,  /* gy: (N, C, Ho, Wo) through gv */
                                  View4 gv, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint4 at = nchw_index(i, g.dc, g.dh, g.dw);
    uint b = at.x, c = at.y, h = at.z, w = at.w;
    ACC acc = (ACC)0;
    UNROLL_TAPS
    for (uint ki = 0; ki < TAPS0(g.win); ++ki) {
        int oh = win_out(&g.win, 0, h, ki);
        if (oh < 0) continue;
        UNROLL_TAPS
        for (uint kj = 0; kj < TAPS1(g.win); ++kj) {
            int ow = win_out(&g.win, 1, w, kj);
            if (ow < 0) continue;
            int hs, he, ws, we;
            ACC div = avg_divisor(&g, oh, ow, &hs, &he, &ws, &we);
            acc += LOAD(gy, at4(&gv, b, c, oh, ow)) / div;
        }
    }
    STORE(dx, i, acc);
}

// Adaptive windows: [floor(o * in / out), ceil((o + 1) * in / out)).
inline uint ad_start(uint o, uint in, uint out) { return (o * in) / out; }
inline uint ad_end(uint o, uint in, uint out) { return ((o + 1) * in + out - 1) / out; }

// y[b, c, oh, ow] = mean of x over the adaptive window of (oh, ow).
__kernel void adaptive_avg_pool2d(__global T* y,        /* y: (N, C, Ho, Wo), contiguous */
                                  __global const T* x,  /* x: (N, C, H, W) through v */
                                  View4 v, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint ho = g.win.out[0], wo = g.win.out[1];
    uint4 at = nchw_index(i, g.dc, g.dho, g.dwo);
    uint b = at.x, c = at.y, oh = at.z, ow = at.w;
    uint hs = ad_start(oh, g.h, ho), he = ad_end(oh, g.h, ho);
    uint ws = ad_start(ow, g.w, wo), we = ad_end(ow, g.w, wo);
    ACC acc = (ACC)0;
    for (uint h = hs; h < he; ++h)
        for (uint w = ws; w < we; ++w) acc += LOAD(x, at4(&v, b, c, h, w));
    STORE(y, i, acc / (ACC)((he - hs) * (we - ws)));
}

// dx[b, c, h, w] = sum over the adaptive windows (oh, ow ascending) containing (h, w) of gy / size.
__kernel void adaptive_avg_pool2d_backward(__global T* dx,        /* dx: (N, C, H, W), contiguous */
                                           __global const T* gy,  /* gy: (N, C, Ho, Wo) through gv */
                                           View4 gv, PoolGeom g, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint4 at = nchw_index(i, g.dc, g.dh, g.dw);
    uint b = at.x, c = at.y, h = at.z, w = at.w;
    uint ho = g.win.out[0], wo = g.win.out[1];
    ACC acc = (ACC)0;
    for (uint oh = 0; oh < ho; ++oh) {
        uint hs = ad_start(oh, g.h, ho), he = ad_end(oh, g.h, ho);
        if (hs > h) break;
        if (h >= he) continue;
        for (uint ow = 0; ow < wo; ++ow) {
            uint ws = ad_start(ow, g.w, wo), we = ad_end(ow, g.w, wo);
            if (ws > w) break;
            if (w >= we) continue;
            acc += LOAD(gy, at4(&gv, b, c, oh, ow)) / (ACC)((he - hs) * (we - ws));
        }
    }
    STORE(dx, i, acc);
}
