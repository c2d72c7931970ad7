// copy.cl: strided copies (contiguous() of any view), fills and ranges.

__kernel void strided_copy(__global T* out,        /* layout operand 0 */
                           __global const T* src,  /* layout operand 1 */
                           Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    STORE(out, o.x, LOAD(src, o.y));
}

// strided_copy in words of four elements (the bits as they are): the layout counts words, and
// every row of the innermost dim is dense and starts at a multiple of four elements.
#if defined(DT_F64)
typedef ulong4 WORD4;
#elif defined(DT_F16) || defined(DT_BF16)
typedef ushort4 WORD4;
#else
typedef uint4 WORD4;
#endif
__kernel void strided_copy_words(__global WORD4* out,        /* layout operand 0, in words */
                                 __global const WORD4* src,  /* layout operand 1, in words */
                                 Layout l, uint n) {
    uint i = get_global_id(0);
    if (i >= n) return;
    uint3 o = layout_offsets(&l, i);
    out[o.x] = src[o.y];
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

// contiguous() of a transposed view, through 32 x 32 tiles in local memory so that both the reads
// and the writes are coalesced (a plain strided copy reads or writes with a stride): the view's
// element (b, r, c) is src[off + b * sb + r + c * ld]; out is (batch, rows, cols), contiguous.
#define TT 32
#define TT_ROWS 8
__kernel __attribute__((reqd_work_group_size(TT, TT_ROWS, 1)))
void transpose_copy(__global T* out,        /* (batch, rows, cols) contiguous */
                    __global const T* src,  /* element (b, r, c) at off + b * sb + r + c * ld */
                    uint rows, uint cols, uint ld, uint sb, uint off) {
    __local ACC tile[TT][TT + 1];
    uint b = get_group_id(2), r0 = get_group_id(1) * TT, c0 = get_group_id(0) * TT;
    uint lx = get_local_id(0), ly = get_local_id(1);
    size_t base = off + (size_t)b * sb;
    for (uint j = ly; j < TT; j += TT_ROWS) {
        uint r = r0 + lx, c = c0 + j;
        if (r < rows && c < cols) tile[j][lx] = LOAD(src, base + r + (size_t)c * ld);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint j = ly; j < TT; j += TT_ROWS) {
        uint r = r0 + j, c = c0 + lx;
        if (r < rows && c < cols) STORE(out, ((size_t)b * rows + r) * cols + c, tile[lx][j]);
    }
}
