// elementwise.cl: binary elementwise ops, contiguous and strided/broadcast forms (kernels NAME_contig, NAME_strided).

#define BINARY_OP(NAME, EXPR)                                                                  \
__kernel void NAME##_contig(__global T* out,        /* (n) */                                  \
                            __global const T* a,    /* (n) */                                  \
                            __global const T* b,    /* (n) */                                  \
                            uint n) {                                                          \
    uint i = get_global_id(0);                                                                 \
    if (i >= n) return;                                                                        \
    ACC x = LOAD(a, i), y = LOAD(b, i);                                                        \
    STORE(out, i, (EXPR));                                                                     \
}                                                                                              \
__kernel void NAME##_strided(__global T* out,       /* layout operand 0, contiguous */        \
                             __global const T* a,   /* layout operand 1 */                    \
                             __global const T* b,   /* layout operand 2 */                    \
                             Layout l, uint n) {                                               \
    uint i = get_global_id(0);                                                                 \
    if (i >= n) return;                                                                        \
    uint3 o = layout_offsets(&l, i);                                                           \
    ACC x = LOAD(a, o.y), y = LOAD(b, o.z);                                                    \
    STORE(out, o.x, (EXPR));                                                                   \
}

BINARY_OP(add, x + y)
BINARY_OP(sub, x - y)
BINARY_OP(mul, x * y)
BINARY_OP(div, x / y)
