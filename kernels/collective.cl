// collective.cl: the device relay's reduction (netcl-distributed relay.rs): this rank's segment of a chunk combined with the other ranks' copies of it, in rank order.
//
// Built with -DDT_F32 -cl-fp32-correctly-rounded-divide-sqrt: the fold must give the bits of the
// host reduction (reduce.rs reduce_range): no contraction (common.cl turns FP_CONTRACT off), an
// exact division for the mean, NaN propagated by max and min.

#define OP_SUM 0
#define OP_MEAN 1
#define OP_MAX 2
#define OP_MIN 3
#define OP_WEIGHTED 4

__kernel void relay_reduce(__global float* own,           /* (len) at own_off: this rank's segment, in and out */
                           ulong own_off,
                           __global const float* others,  /* (n - 1, len) at others_off: the other ranks' copies, rank order */
                           ulong others_off,
                           __global const float* scales,  /* (n) each rank's weight (OP_WEIGHTED) */
                           uint len, uint n, uint rank, uint op) {
    uint i = get_global_id(0);
    if (i >= len) return;
    own += own_off;
    others += others_off;
    float acc = 0.0f;
    for (uint s = 0; s < n; ++s) {
        float x = s == rank ? own[i] : others[(s < rank ? s : s - 1) * len + i];
        if (op == OP_WEIGHTED) x = scales[s] * x;
        if (s == 0) {
            acc = x;
        } else if (op == OP_MAX) {
            if (isnan(x) || x > acc) acc = isnan(acc) ? acc : x;
        } else if (op == OP_MIN) {
            if (isnan(x) || x < acc) acc = isnan(acc) ? acc : x;
        } else {
            acc = acc + x;
        }
    }
    if (op == OP_MEAN) acc = acc / (float)n;
    own[i] = acc;
}
