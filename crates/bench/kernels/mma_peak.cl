// mma_peak.cl (netcl-bench --suite mma_peak): the tensor cores' mma.sync throughput with the
// operands in registers and nothing read from memory: the ceiling any OpenCL GEMM built on
// mma.sync can reach. Built with -DTC_BF16 (or -DTC_F16, -DTC_TF32) and the dtype's options;
// MMA comes from common.cl's tensor-core section.
#define CHAINS 8  // independent accumulators per warp (hides the mma latency)

__kernel void mma_peak(__global float* out, /* (global size): one sum per work-item */
                       uint iters) {
    uint lid = get_local_id(0);
    // Operand words from the work-item id, so nothing is a compile-time constant; the values
    // are small 16-bit numbers whose products stay finite.
    uint a[4] = {0x3c003c00u ^ (lid & 7u), 0x3c003c00u, 0x3c003c00u ^ (lid & 3u), 0x3c003c00u};
    uint b0 = 0x00003c00u | (lid & 1u), b1 = 0x3c000000u;
    float acc[CHAINS][4];
    for (int c = 0; c < CHAINS; c++)
        for (int q = 0; q < 4; q++) acc[c][q] = 0.0f;
    for (uint i = 0; i < iters; i++) {
#pragma unroll
        for (int c = 0; c < CHAINS; c++) MMA(acc[c], a, b0, b1);
    }
    float s = 0.0f;
    for (int c = 0; c < CHAINS; c++) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[get_global_id(0)] = s;
}
