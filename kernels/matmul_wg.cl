// matmul_wg.cl: batched GEMM C = act(A·B + bias) on Hopper tensor cores through wgmma (sm_90a PTX):
// 16-bit operands (-DTC_BF16 or -DTC_F16) or f32 ones read as TF32 (-DTC_TF32), f32 accumulation. Built from source as sm_90 PTX with
// the sm_90a instructions behind `//sm90a: ` and reloaded as sm_90a (netcl-kernels' program.rs,
// -DSM90A); only where ops/src/matmul/matmul_wg.rs's probe gave exact results.
// Operands K-contiguous, or (16-bit only) -DA_MN: A stored (K, M) with M contiguous, -DB_KN: B
// stored (K, N) with N contiguous (row-major B); M resp. N then a multiple of 8. K a multiple of
// 16 bytes (the planner pads).
// -DC_F32: C and the bias are f32. -DTBN=64|128|256: the tile's columns; -DSTAGES: the ring's depth.
// raster = g > 0: tiles are taken in bands of g rows of tiles, column by column, so the tiles in
// flight at once read fewer distinct rows of A and columns of B (a wide B is not read again for
// every row of tiles).
//
// Work-group w computes tile w of all batches' tiles; with -DPERSISTENT (launched with a few
// work-groups per compute unit, G in all) tiles w, w + G, w + 2G, ..., the first K steps of its next
// tile requested before the epilogue of the current one is stored, so the pipeline's fill hides
// behind the stores. (Without it the code has no tile loop: the loop costs the wide tile's
// registers.)
// The generated `wgmma(d, da, db)` (matmul_wg.rs) and the epilogue's `activate` come in front.
//
// A work-group of two warpgroups computes a 128 x TBN tile, warpgroup w its rows 64 w .. 64 w + 63
// (one wgmma per 32 bytes of K, both operands read from local memory by the tensor cores). Tiles
// of 128 bytes of K go global -> local through cp.async in a ring of STAGES, stored in the 128-byte
// swizzled layouts wgmma reads (`wg_at`); STAGES - 2 tiles are in flight while one is multiplied
// and the previous one's wgmmas finish. With -DWS (384 work-items, not with -DPERSISTENT) a third
// warpgroup does all the copying and the stages are handed over through mbarriers instead of
// work-group barriers.
#ifndef TBN
#define TBN 256
#endif
#ifndef STAGES
#define STAGES 4
#endif
#define TBM 128
#define EPC (16 / (uint)sizeof(T))  // elements a 16-byte chunk
#define TBK (8 * EPC)                // elements of K a step: one 128-byte line
// Two computing warpgroups, and with -DWS a third that only loads (warp specialisation).
#ifdef WS
#define THREADS 384
#define LOADERS 128
#else
#define THREADS 256
#define LOADERS 256
#endif
#define A_BYTES (TBM * 128)          // 16 KiB
#define B_BYTES (TBN * 128)
#define STAGE_BYTES (A_BYTES + B_BYTES)
// Local memory: the stages, 1024-byte aligned at run time (the swizzle's period): one array of
// SM90A_STUB bytes (set by program.rs) that program.rs resizes in the PTX to SM90A_SHARED (matmul_wg.rs's
// shared_bytes), as OpenCL C caps local arrays at 48 KiB.

// OT, OLOAD, OSTORE, store_pair and PAIRED come from common.cl.

#ifdef PAIRED
// x[r] of lane q (r, q < 4: the lanes of `mask`, one quad) becomes x[q] of lane r: two butterfly
// rounds of exchanges within the quad.
inline void quad_transpose(uint* x, uint q, uint mask) {
#pragma unroll
    for (uint s = 1; s < 4; s <<= 1)
#pragma unroll
        for (uint r = 0; r < 4; ++r) {
            if (r & s) continue;
            const bool up = (q & s) != 0;
            const uint a = x[r], b = x[r | s];
            uint v;
            __asm__ volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, %3;"
                             : "=r"(v) : "r"(up ? a : b), "r"(s), "r"(mask));
            x[r] = up ? v : a;
            x[r | s] = up ? b : v;
        }
}
#endif
#ifndef ACTIVATION
inline ACC activate(ACC v) { return v; }
#endif

// Byte offset of 16-byte chunk (row r, chunk c) in wgmma's 128-byte swizzled layout: K-major tiles
// are rows of 128 bytes (one row of M or N, TBK of K); M/N-major tiles (A_MN, B_KN) blocks of 64 of
// M (N) by 64 of K, each 8 KiB of 128-byte K rows. Chunk bits 4..6 xor row bits 7..9.
inline uint swz(uint pre) { return pre ^ (((pre >> 7) & 7u) << 4); }
// K-major: row r (M or N) and chunk c (EPC elements of K).
inline uint k_at(uint r, uint c) { return swz(r * 128 + c * 16); }
// M/N-major: K row k and chunk c (8 elements of M or N).
inline uint mn_at(uint k, uint c) { return swz((c / 8) * 8192 + k * 128 + (c % 8) * 16); }

// A shared-memory matrix descriptor (start address, leading and stride byte offsets, 128-byte
// swizzle).
inline ulong desc(uint addr, uint lbo, uint sbo) {
    return (ulong)((addr & 0x3ffffu) >> 4) | ((ulong)(lbo >> 4) << 16) | ((ulong)(sbo >> 4) << 32) |
           (1ul << 62);
}
#ifdef A_MN
#define A_DESC(base, kk) desc((base) + (kk) * 2048, 8192, 1024)
#else
#define A_DESC(base, kk) desc((base) + (kk) * 32, 16, 1024)
#endif
#ifdef B_KN
#define B_DESC(base, kk) desc((base) + (kk) * 2048, 8192, 1024)
#else
#define B_DESC(base, kk) desc((base) + (kk) * 32, 16, 1024)
#endif

// 16 bytes global -> local without registers; zero-filled when !valid (nothing read).
inline void copy16(uint dst, __global const T* src, uint valid) {
    __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16u : 0u)
                     : "memory");
}
#ifdef WS
#elif STAGES == 3
#define WAIT_COPIES() __asm__ volatile("cp.async.wait_group 0;" ::: "memory")
#elif STAGES == 4
#define WAIT_COPIES() __asm__ volatile("cp.async.wait_group 1;" ::: "memory")
#elif STAGES == 5
#define WAIT_COPIES() __asm__ volatile("cp.async.wait_group 2;" ::: "memory")
#else
#error "STAGES takes 3 to 5"
#endif
#ifdef WS
// The loaders keep STAGES - 2 steps' copies in flight beyond the one they wait for (wait_group
// takes a constant).
#if STAGES == 3
#define WAIT_BEHIND() __asm__ volatile("cp.async.wait_group 1;" ::: "memory")
#elif STAGES == 4
#define WAIT_BEHIND() __asm__ volatile("cp.async.wait_group 2;" ::: "memory")
#elif STAGES == 5
#define WAIT_BEHIND() __asm__ volatile("cp.async.wait_group 3;" ::: "memory")
#elif STAGES == 6
#define WAIT_BEHIND() __asm__ volatile("cp.async.wait_group 4;" ::: "memory")
#else
#error "STAGES takes 3 to 6"
#endif
#define BEHIND (STAGES - 2)
// mbarriers in local memory (byte address `bar`): `count` arrivals complete a phase.
inline void mbar_init(uint bar, uint count) {
    __asm__ volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
inline void mbar_arrive(uint bar) {
    __asm__ volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
// Returns once the phase of parity `parity` has completed.
inline void mbar_wait(uint bar, uint parity) {
    uint done = 0;
    while (!done) {
        __asm__ volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done)
                         : "r"(bar), "r"(parity)
                         : "memory");
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void matmul_wg(__global OT* c,          /* (batch, M, N) contiguous per batch: c[m * N + n] */
               __global const T* a,     /* (batch, M, K): a[m * sam + k]; A_MN: a[k * sam + m] */
               __global const T* b,     /* (batch, N, K): b[n * sbn + k]; B_KN: b[k * sbn + n] */
               __global const OT* bias, /* (N), read when has_bias */
               Layout batch,            /* batch dims: operand 0 = c, 1 = a, 2 = b */
               uint M, uint N, uint K, uint sam, uint sbn, uint has_bias,
               uint batches,            /* the batch dims' element count */
               uint raster) {           /* rows of tiles a band (0: row by row) */
    __local uchar smem_stub[SM90A_STUB];
    const uint base = ((uint)(size_t)smem_stub + 1023u) & ~1023u;
    const uint tid = get_local_id(0), wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
    const uint steps = (K + TBK - 1) / TBK;
    const uint cols = (N + TBN - 1) / TBN, rows = (M + TBM - 1) / TBM, per_batch = cols * rows;
    const uint total = per_batch * batches;
#ifdef PERSISTENT
    const uint stride = get_num_groups(0);
#endif
    float d[TBN / 2];

    // Tile t's rows m0.., columns n0.. and operand offsets o.
#define TILE_AT(t, m0_, n0_, o_)                                                                \
    {                                                                                           \
        const uint bt = (t) / per_batch, id = (t) % per_batch;                                  \
        uint tile_m = id / cols, tile_n = id % cols;                                            \
        if (raster > 0) {                                                                       \
            const uint band = raster * cols, first = id / band * raster;                        \
            const uint height = min(raster, rows - first);                                      \
            tile_m = first + id % band % height;                                                \
            tile_n = id % band / height;                                                        \
        }                                                                                       \
        m0_ = tile_m * TBM;                                                                     \
        n0_ = tile_n * TBN;                                                                     \
        o_ = layout_offsets(&batch, bt);                                                        \
    }

    // Stage st's tiles at base + st * STAGE_BYTES (A) and + A_BYTES (B); tile step s of K of the
    // output tile at (im0, in0) with operand offsets io.
#define ISSUE(st, s)                                                                            \
    {                                                                                           \
        const uint k0 = (s) * TBK, sa = base + (st) * STAGE_BYTES, sb = sa + A_BYTES;           \
        _Pragma("unroll") for (uint i = 0; i < A_BYTES / 16 / LOADERS; ++i) {                   \
            const uint e = loader + i * LOADERS;                                                \
            A_CHUNK                                                                             \
        }                                                                                       \
        _Pragma("unroll") for (uint i = 0; i < B_BYTES / 16 / LOADERS; ++i) {                   \
            const uint e = loader + i * LOADERS;                                                \
            B_CHUNK                                                                             \
        }                                                                                       \
    }
#ifdef A_MN
    // Chunk e: K row e / 16, chunk e % 16 (8 of M).
#define A_CHUNK                                                                                 \
    const uint k = k0 + e / 16, r = im0 + (e % 16) * 8, ok = k < K && r < M;                    \
    copy16(sa + mn_at(e / 16, e % 16), ok ? a + io.y + k * sam + r : a, ok);
#else
    // Chunk e: row e / 8 (of M), chunk e % 8 (EPC of K).
#define A_CHUNK                                                                                 \
    const uint r = im0 + e / 8, k = k0 + (e % 8) * EPC, ok = r < M && k < K;                    \
    copy16(sa + k_at(e / 8, e % 8), ok ? a + io.y + r * sam + k : a, ok);
#endif
#ifdef B_KN
#define B_CHUNK                                                                                 \
    const uint k = k0 + e / (TBN / 8), r = in0 + (e % (TBN / 8)) * 8, ok = k < K && r < N;      \
    copy16(sb + mn_at(e / (TBN / 8), e % (TBN / 8)), ok ? b + io.z + k * sbn + r : b, ok);
#else
#define B_CHUNK                                                                                 \
    const uint r = in0 + e / 8, k = k0 + (e % 8) * EPC, ok = r < N && k < K;                    \
    copy16(sb + k_at(e / 8, e % 8), ok ? b + io.z + r * sbn + k : b, ok);
#endif
#define COMMIT() __asm__ volatile("cp.async.commit_group;" ::: "memory")
#ifdef A_MN
#define WG_A(sa) ((sa) + wg * 8192)  // this warpgroup's 64 of M: the second 8 KiB block
#else
#define WG_A(sa) ((sa) + wg * 64 * 128)
#endif
    // This warpgroup's wgmmas of stage st, issued; once they are, those of the step before are
    // waited for.
#define MULTIPLY(st)                                                                            \
    {                                                                                           \
        const uint sa = base + (st) * STAGE_BYTES, sb = sa + A_BYTES, wa = WG_A(sa);           \
        __asm__ volatile("//sm90a: wgmma.fence.sync.aligned;\n" ::: "memory");                 \
        _Pragma("unroll") for (uint kk = 0; kk < 4; ++kk) wgmma(d, A_DESC(wa, kk), B_DESC(sb, kk)); \
        __asm__ volatile("//sm90a: wgmma.commit_group.sync.aligned;\n" ::: "memory");          \
        __asm__ volatile("//sm90a: wgmma.wait_group.sync.aligned 1;\n" ::: "memory");          \
    }
    // The first STAGES - 2 steps of K of the tile at (im0, in0, io), one commit group each.
#define PROLOGUE()                                                                              \
    for (uint s = 0; s + 2 < STAGES; ++s) {                                                     \
        if (s < steps) ISSUE(s, s)                                                              \
        COMMIT();                                                                               \
    }

    uint t = get_group_id(0), im0 = 0, in0 = 0;
    uint3 io = (uint3)(0, 0, 0);
#ifdef WS
    // Warp specialisation: the loading warpgroup fills the ring, the two warpgroups multiply; mbarriers
    // after the ring hand each stage over: full[s] (its copies landed and were made visible to the
    // tensor cores' proxy, LOADERS arrivals) and empty[s] (the wgmmas reading it are done, 256).
    const uint bars = base + STAGES * STAGE_BYTES;
#define FULL(s) (bars + 8 * (s))
#define EMPTY(s) (bars + 8 * (STAGES + (s)))
    if (tid == 0) {
        for (uint s = 0; s < STAGES; ++s) {
            mbar_init(FULL(s), LOADERS);
            mbar_init(EMPTY(s), 256);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t < total) TILE_AT(t, im0, in0, io)
    // The loading warpgroup never reaches the epilogue (its rows are not the tile's).
    if (wg == 2) {
        if (t >= total) return;
        const uint loader = tid - 256;
        // Step s's stage is free once the wgmmas of s - STAGES are done; a loader arrives on
        // full[s] after its copies of s + BEHIND are requested and its copies of s have landed.
        for (uint step = 0; step < steps; ++step) {
            const uint st = step % STAGES;
            if (step >= STAGES) mbar_wait(EMPTY(st), (step / STAGES - 1) & 1);
            ISSUE(st, step)
            COMMIT();
            if (step >= BEHIND) {
                WAIT_BEHIND();
                __asm__ volatile("fence.proxy.async.shared::cta;" ::: "memory");
                mbar_arrive(FULL((step - BEHIND) % STAGES));
            }
        }
        __asm__ volatile("cp.async.wait_group 0;" ::: "memory");
        __asm__ volatile("fence.proxy.async.shared::cta;" ::: "memory");
        for (uint s = steps > BEHIND ? steps - BEHIND : 0; s < steps; ++s) mbar_arrive(FULL(s % STAGES));
        return;
    }
    if (t < total) {
        const uint m0 = im0, n0 = in0;
        const uint3 o = io;
#pragma unroll
        for (int i = 0; i < TBN / 2; ++i) d[i] = 0.0f;
        for (uint step = 0; step < steps; ++step) {
            const uint st = step % STAGES;
            mbar_wait(FULL(st), (step / STAGES) & 1);
            MULTIPLY(st)
            // The wgmmas of step - 1 are done: its stage may be refilled.
            if (step > 0) mbar_arrive(EMPTY((step - 1) % STAGES));
        }
        __asm__ volatile("//sm90a: wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#else
    const uint loader = tid;
    if (t < total) {
        TILE_AT(t, im0, in0, io)
        PROLOGUE()
    }
#ifdef PERSISTENT
    for (; t < total; t += stride) {
#else
    if (t < total) {
#endif
        // This tile's place (its first steps are in flight already).
        const uint m0 = im0, n0 = in0;
        const uint3 o = io;
#pragma unroll
        for (int i = 0; i < TBN / 2; ++i) d[i] = 0.0f;
        for (uint step = 0; step < steps; ++step) {
            // This work-item's copies of `step` landed; made visible to the tensor cores' (async)
            // proxy; after the barrier everyone's have, and every warpgroup's wgmmas of step - 2
            // are done.
            WAIT_COPIES();
            __asm__ volatile("fence.proxy.async.shared::cta;" ::: "memory");
            barrier(CLK_LOCAL_MEM_FENCE);
            {
                const uint ahead = step + STAGES - 2;
                if (ahead < steps) ISSUE(ahead % STAGES, ahead)
                COMMIT();
            }
            MULTIPLY(step % STAGES)
        }
        __asm__ volatile("//sm90a: wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
#ifdef PERSISTENT
        // Every warpgroup's reads of the ring are done: the next tile's first steps may land.
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t + stride < total) {
            TILE_AT(t + stride, im0, in0, io)
            PROLOGUE()
        }
#endif

        // d[4 j + q]: rows g (q < 2) or g + 8, columns 8 j + 2 t + q % 2 of the warp's 16 rows.
        const uint g = lane / 4, q = lane % 4, quad = 0xfu << (lane & 28);
        const bool wide = N % 8 == 0 && o.x % 8 == 0;
#pragma unroll
        for (uint h = 0; h < 2; ++h) {
            const uint m = m0 + wg * 64 + warp * 16 + g + h * 8;
            if (m >= M) continue;
#pragma unroll
            for (uint j4 = 0; j4 < TBN / 8; j4 += 4) {
#ifdef PAIRED
                // Four whole, 16-byte aligned column blocks: the quad's packed pairs transposed
                // (lane q then holds block j4 + q), one 16-byte store a lane instead of four.
                if (wide && n0 + j4 * 8 + 32 <= N) {
                    uint x[4];
#pragma unroll
                    for (uint jj = 0; jj < 4; ++jj) {
                        const uint n = n0 + (j4 + jj) * 8 + 2 * q;
                        ACC lo = d[4 * (j4 + jj) + 2 * h], hi = d[4 * (j4 + jj) + 2 * h + 1];
                        if (has_bias) {
                            lo += OLOAD(bias, n);
                            hi += OLOAD(bias, n + 1);
                        }
                        x[jj] = pack2(activate(lo), activate(hi));
                    }
                    quad_transpose(x, q, quad);
                    *(__global uint4*)(c + o.x + m * N + n0 + (j4 + q) * 8) =
                        (uint4)(x[0], x[1], x[2], x[3]);
                    continue;
                }
#endif
#pragma unroll
                for (uint jj = 0; jj < 4; ++jj) {
                    const uint j = j4 + jj, n = n0 + j * 8 + 2 * q, e = o.x + m * N + n;
                    ACC lo = d[4 * j + 2 * h], hi = d[4 * j + 2 * h + 1];
                    if (has_bias) {
                        if (n < N) lo += OLOAD(bias, n);
                        if (n + 1 < N) hi += OLOAD(bias, n + 1);
                    }
                    // Columns n and n + 1 as one 4-byte (two 16-bit) or 8-byte (two f32) store.
                    if (n + 1 < N && e % 2 == 0) {
#ifdef PAIRED
                        store_pair(c, e, activate(lo), activate(hi));
#else
                        *(__global float2*)(c + e) = (float2)(activate(lo), activate(hi));
#endif
                        continue;
                    }
                    if (n < N) OSTORE(c, e, activate(lo));
                    if (n + 1 < N) OSTORE(c, e + 1, activate(hi));
                }
            }
        }
    }
}
