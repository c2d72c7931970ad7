// copy.cl: strided copies (contiguous() of any view), fills and ranges.

__kernel void strided_copy(__global T* out,        /* layout operand 0 */
                           __global const T* src,  /* layout operand 1 */
                           Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    STORE(out, o.x, LOAD(src, o.y));
}

__kernel void fill(__global T* out,  /* (n) */
                   ACC value, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    STORE(out, i, value);
}

__kernel void arange(__global T* out,  /* (n) */
                     ACC start, ACC step, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    STORE(out, i, start + (ACC)i * step);
}
