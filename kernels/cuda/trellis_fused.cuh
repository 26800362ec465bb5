/* kernels/cuda/trellis_fused.cuh — lab version v3 of the trellis GEMM: the
 * whole y = x·W (1..16 rows) in ONE launch. Included by trellis.cu only.
 *
 * Grid: one 256-thread block per (column block of 256 outputs, k split of
 * `chunk` k tiles, chunk a multiple of 8 so each split holds whole 128-input
 * Hadamard blocks). Each block
 *  1. issues the loads of its first trellis words, then computes
 *     u = fp16(had128(x ⊙ suh)) for its k range into shared memory (one warp
 *     per 128-input block and row, 4 values a lane: strides 1..16 by shuffles,
 *     32 and 64 in registers);
 *  2. runs v2's loop (8 warps × 2 tile columns, 4 k tiles per step) with the
 *     next step's ring words loaded before the current step is decoded
 *     (register double buffering: the load latency hides behind the decode),
 *     and A fragments read from shared memory;
 *  3. adds its partial sums into t with fp32 atomics, then counts itself done
 *     on the column block's counter; the last block of a column block applies
 *     had128 ⊙ svh to t, writes y, and zeroes t and the counter for the next
 *     call (threadfence-reduction pattern). */
#ifndef SPARQ_KERNELS_CUDA_TRELLIS_FUSED_CUH
#define SPARQ_KERNELS_CUDA_TRELLIS_FUSED_CUH

#include "kernels/cuda/trellis_decode.cuh"

namespace trellis_dev {

#define FUSED_WARPS 8
#define FUSED_COLS 256 /* outputs per column block: 8 warps × 2 tile columns × 16 */

/* Shared memory bytes for a chunk (k tiles) and rows: rows × (chunk·8 + 4)
 * half2 words (the +4 pads rows onto different banks). */
__host__ __device__ inline size_t fused_smem_bytes(int chunk, int rows)
{
    return (size_t)rows * (chunk * 8 + 4) * 4;
}

/* MODE bits: 1 = the input is silu(x) ⊙ x2 (SwiGLU of a gate and an up row)
 * instead of x; 2 = the output is added, times yscale, into y with atomics
 * (scatter-add of a routed expert) instead of stored. */
enum { FUSED_IN_SWIGLU = 1, FUSED_OUT_ADD = 2 };

template <int MODE>
__device__ __forceinline__ void fused_finish(float *__restrict__ t, unsigned *__restrict__ counters,
                                             const __half *__restrict__ svh, float *__restrict__ y, float yscale,
                                             int n, int rows, int bc, int splits, int &s_last);
template <int K, int U, int MODE, int D>
__device__ __forceinline__ void fused_body_int(const uint32_t *__restrict__ trellis, const float *__restrict__ x,
                                               const float *__restrict__ x2, const __half *__restrict__ suh,
                                               const __half *__restrict__ svh, float *__restrict__ t,
                                               unsigned *__restrict__ counters, float *__restrict__ y, float yscale,
                                               int k, int n, int chunk);

template <int K, int CB, int U, int MODE, int D = 0>
__device__ __forceinline__ void fused_body(const uint32_t *__restrict__ trellis, const float *__restrict__ x,
                                           const float *__restrict__ x2, const __half *__restrict__ suh,
                                           const __half *__restrict__ svh, float *__restrict__ t,
                                           unsigned *__restrict__ counters, float *__restrict__ y, float yscale,
                                           int k, int n, int rows, int chunk)
{
    if constexpr ((D & DEC_INT) != 0) { /* mul1, one row (MoE lab v20) */
        (void)rows;
        fused_body_int<K, U, MODE, D>(trellis, x, x2, suh, svh, t, counters, y, yscale, k, n, chunk);
        return;
    }
    constexpr int NW = 2, TW = 8 * K, NWD = lane_nwords<K, D>();
    extern __shared__ uint32_t u_s[]; /* rows × (chunk·8 + 4) half2 */
    __shared__ int s_last;
    (void)x2;
    (void)yscale;
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW;
    const int nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const int bc = blockIdx.x % nbc, split = blockIdx.x / nbc;
    const int splits = (ktiles + chunk - 1) / chunk;
    const int kt0 = split * chunk, kt1 = min(kt0 + chunk, ktiles);
    const int grp = bc * FUSED_WARPS + wib;
    const bool active = grp < ngroups;
    const int ustride = chunk * 8 + 4; /* half2 words per row */

    const lane_ring lr = lane_ring_make(K, lane);
    uint32_t sel0 = 0, sel1 = 0;
    if constexpr ((D & DEC_IMMA) != 0) imma_sel_make(lane, sel0, sel1);
    const uint32_t one = blockDim.x / 256; /* 1, unknown to the compiler (DEC_FMA) */
    const size_t row_stride = (size_t)ntiles * TW;
    const uint32_t *p = trellis + (size_t)kt0 * row_stride + (size_t)(active ? grp : 0) * NW * TW;

    uint32_t wn[U][NW][NWD];
    auto load_step = [&](int kt) { words_load<K, NW, U>(p + (size_t)(kt - kt0) * row_stride, row_stride, lr, wn); };
    if (active) load_step(kt0);
    /* DEC_PDL (MoE down, v14+): x and x2 come from the previous launch, which
     * may still run; the first trellis words above are already in flight */
    if constexpr ((D & DEC_PDL) != 0) griddep_wait();

    /* 1. input transform of this block's k range into shared memory */
    {
        const int nhb = (kt1 - kt0) / 8;
        __half *uh = reinterpret_cast<__half *>(u_s);
        for (int pr = wib; pr < rows * nhb; pr += FUSED_WARPS) {
            const int r = pr / nhb, hb = pr % nhb;
            const size_t base = (size_t)kt0 * 16 + (size_t)hb * 128;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const size_t i = (size_t)r * k + base + lane + 32 * j;
                float in = x[i];
                if constexpr (MODE & FUSED_IN_SWIGLU) in = in / (1.0f + __expf(-in)) * x2[i];
                v[j] = in * __half2float(suh[base + lane + 32 * j]);
            }
            had128_warp(v, lane);
#pragma unroll
            for (int j = 0; j < 4; j++) uh[(size_t)r * 2 * ustride + hb * 128 + lane + 32 * j] = __float2half_rn(v[j]);
        }
    }
    __syncthreads();

    /* 2. main loop */
    const int g = lane >> 2, c = lane & 3;
    const bool lo_ok = g < rows, hi_ok = g + 8 < rows;
    float acc[NW][2][4];
    acc_zero<NW>(acc);
    if (active) {
        const uint32_t *ua = u_s + g * ustride + c, *ub = u_s + (g + 8) * ustride + c;
        for (int kt = kt0; kt < kt1; kt += U) {
            uint32_t w[U][NW][NWD];
            words_copy<NW, U, NWD>(w, wn);
            if (kt + U < kt1) load_step(kt + U);
#pragma unroll
            for (int s = 0; s < U; s++) {
                uint32_t a[4];
                afrag_load(ua, ub, kt - kt0 + s, lo_ok, hi_ok, a);
                tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a, acc, sel0, sel1, one);
            }
        }
        /* 3. partial sums */
        acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
    }
    fused_finish<MODE>(t, counters, svh, y, yscale, n, rows, bc, splits, s_last);
}

/* Steps 3–4 of fused_body (and fused_body_int) after the partial sums are in
 * t: count this block done on its column block's counter; the last block
 * applies had128 ⊙ svh to t, writes (or adds) y, and zeroes t and the counter. */
template <int MODE>
__device__ __forceinline__ void fused_finish(float *__restrict__ t, unsigned *__restrict__ counters,
                                             const __half *__restrict__ svh, float *__restrict__ y, float yscale,
                                             int n, int rows, int bc, int splits, int &s_last)
{
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(counters + bc, 1u) == (unsigned)(splits - 1);
    __syncthreads();
    if (!s_last) return;

    /* 4. the last block of this column block: output transform */
    __threadfence();
    const int cb0 = bc * FUSED_COLS;
    const int nhb = min(FUSED_COLS, n - cb0) / 128;
    for (int pr = wib; pr < rows * nhb; pr += FUSED_WARPS) {
        const int r = pr / nhb, hb = pr % nhb;
        float *tr = t + (size_t)r * n + cb0 + hb * 128;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[j] = __ldcg(tr + lane + 32 * j);
            __stcg(tr + lane + 32 * j, 0.0f);
        }
        had128_warp(v, lane);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int col = cb0 + hb * 128 + lane + 32 * j;
            if constexpr (MODE & FUSED_OUT_ADD)
                atomicAdd(y + (size_t)r * n + col, yscale * v[j] * __half2float(svh[col]));
            else
                y[(size_t)r * n + col] = v[j] * __half2float(svh[col]);
        }
    }
    if (threadIdx.x == 0) counters[bc] = 0;
}

/* The integer mul1 arithmetic (trellis.cu, "integer mul1 GEMM") in the
 * fused block body, for one row (the MoE launches): step 1 quantises each
 * 128-input block of this block's k range to q (hi/lo s8 halves packed as
 * the B words of lanes 0..7: column 0 = hi, 1 = lo, 4 inputs a word) in
 * shared memory with A·s_β, 510·Σq per half block and Σu; step 2 runs
 * k_gemm_int's tile (8 hashes, 2 IMMA) on v3's loop, converting the int32
 * sums once per 4 k tiles; each block adds D·Σu of its k range to its
 * partial sums. chunk ≤ 512 (MOE_INT_MAXB blocks of 128 inputs). */
#define MOE_INT_MAXB 64
template <int K, int U, int MODE, int D>
__device__ __forceinline__ void fused_body_int(const uint32_t *__restrict__ trellis, const float *__restrict__ x,
                                               const float *__restrict__ x2, const __half *__restrict__ suh,
                                               const __half *__restrict__ svh, float *__restrict__ t,
                                               unsigned *__restrict__ counters, float *__restrict__ y, float yscale,
                                               int k, int n, int chunk)
{
    constexpr int NW = 2, TW = 8 * K, NWD = lane_nwords<K, DEC_2W>(), DD = DEC_2W | (D & DEC_FMA);
    extern __shared__ uint32_t u_s[]; /* chunk × 8 packed B words */
    __shared__ float s_sc[MOE_INT_MAXB], s_us[MOE_INT_MAXB];
    __shared__ int s_ch[2 * MOE_INT_MAXB];
    __shared__ float s_usum;
    __shared__ int s_last;
    (void)x2;
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW;
    const int nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const int bc = blockIdx.x % nbc, split = blockIdx.x / nbc;
    const int splits = (ktiles + chunk - 1) / chunk;
    const int kt0 = split * chunk, kt1 = min(kt0 + chunk, ktiles);
    const int grp = bc * FUSED_WARPS + wib;
    const bool active = grp < ngroups;
    const lane_ring lr = lane_ring_make(K, lane);
    const uint32_t one = blockDim.x / 256; /* 1, unknown to the compiler (DEC_FMA) */
    const size_t row_stride = (size_t)ntiles * TW;
    const uint32_t *p = trellis + (size_t)kt0 * row_stride + (size_t)(active ? grp : 0) * NW * TW;
    uint32_t wn[U][NW][NWD];
    auto load_step = [&](int kt) {
        words_load<K, NW, U, NWD>(p + (size_t)(kt - kt0) * row_stride, row_stride, lr, wn);
    };
    if (active) load_step(kt0);
    if constexpr ((D & DEC_PDL) != 0) griddep_wait();

    /* 1. quantised input of this block's k range */
    const int nhb = (kt1 - kt0) / 8;
    uint8_t *b8 = reinterpret_cast<uint8_t *>(u_s);
    for (int hb = wib; hb < nhb; hb += FUSED_WARPS) {
        const size_t base = (size_t)kt0 * 16 + (size_t)hb * 128;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float in = x[base + lane + 32 * j];
            if constexpr (MODE & FUSED_IN_SWIGLU) in = in / (1.0f + __expf(-in)) * x2[base + lane + 32 * j];
            v[j] = in * __half2float(suh[base + lane + 32 * j]);
        }
        had128_warp(v, lane);
        int q[4], kq[8];
        float sc, su;
        warp_quant128(v, lane, q, sc, su, kq);
        if (lane == 0) {
            s_sc[hb] = sc;
            s_us[hb] = su;
            s_ch[2 * hb] = 510 * ((kq[0] + kq[1]) + (kq[2] + kq[3]));
            s_ch[2 * hb + 1] = 510 * ((kq[4] + kq[5]) + (kq[6] + kq[7]));
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = lane + 32 * j, pp = i & 15, c = (pp & 7) >> 1, word = 2 * (pp >> 3) + (pp & 1);
            const int ktl = hb * 8 + (i >> 4), hi = (q[j] + 128) >> 8, lo = q[j] - 256 * hi;
            b8[(ktl * 8 + c) * 4 + word] = (uint8_t)hi;
            b8[(ktl * 8 + 4 + c) * 4 + word] = (uint8_t)lo;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float su = 0.0f;
        for (int hb = 0; hb < nhb; hb++) su += s_us[hb];
        s_usum = su;
    }
    __syncthreads();

    /* 2. main loop: lane (g, c) sums outputs g, g+8 of its tiles for batch
     * column c (only c = 0, the one row, is kept) */
    const int g = lane >> 2, c = lane & 3;
    if (active) {
        float f[NW][2] = {};
        for (int kt = kt0; kt < kt1; kt += U) {
            uint32_t w[U][NW][NWD];
            words_copy<NW, U, NWD>(w, wn);
            if (kt + U < kt1) load_step(kt + U);
            uint32_t acc[NW][2][4] = {};
#pragma unroll
            for (int s = 0; s < U; s++) {
                const uint32_t packed = lane < 8 ? u_s[(kt - kt0 + s) * 8 + lane] : 0u;
                uint32_t b[4];
#pragma unroll
                for (int e = 0; e < 4; e++) b[e] = __byte_perm(packed, 0u, 0x1111u * e);
#pragma unroll
                for (int j = 0; j < NW; j++) {
                    uint32_t xh[8];
                    lane_hash_w<K, DD, NWD>(w[s][j], lr.r, one, xh);
                    tile_imma(xh, b, acc[j][0], acc[j][1]);
                }
            }
            const int hb = (kt - kt0) >> 3;
            const float sc = s_sc[hb];
            const uint32_t cq = (uint32_t)s_ch[2 * hb + (((kt - kt0) >> 2) & 1)];
#pragma unroll
            for (int j = 0; j < NW; j++) {
                const int i0 = (int)(((acc[j][0][0] + acc[j][1][0]) << 8) + acc[j][0][1] + acc[j][1][1] - cq);
                const int i1 = (int)(((acc[j][0][2] + acc[j][1][2]) << 8) + acc[j][0][3] + acc[j][1][3] - cq);
                f[j][0] = fmaf(sc, (float)i0, f[j][0]);
                f[j][1] = fmaf(sc, (float)i1, f[j][1]);
            }
        }
        /* 3. partial sums (+ D·Σu of this k range, once per output) */
        if (c == 0) {
            const float du = INT_D * s_usum;
            const int col0 = 16 * grp * NW;
#pragma unroll
            for (int j = 0; j < NW; j++) {
                atomicAdd(t + col0 + 16 * j + g, f[j][0] + du);
                atomicAdd(t + col0 + 16 * j + g + 8, f[j][1] + du);
            }
        }
    }
    fused_finish<MODE>(t, counters, svh, y, yscale, n, 1, bc, splits, s_last);
}

/* D: lab options of the decode (trellis_decode.cuh); 0 = v3, DEC_2W |
 * DEC_IMMA = v9 (v3 with v7's decode; the loads are double-buffered in both),
 * + DEC_FMA = v11. */
template <int K, int CB, int U, int D = 0>
__global__ void __launch_bounds__(256) k_gemm_fused(const uint32_t *__restrict__ trellis,
                                                    const float *__restrict__ x, const __half *__restrict__ suh,
                                                    const __half *__restrict__ svh, float *__restrict__ t,
                                                    unsigned *__restrict__ counters, float *__restrict__ y, int k,
                                                    int n, int rows, int chunk)
{
    fused_body<K, CB, U, 0, D>(trellis, x, nullptr, suh, svh, t, counters, y, 1.0f, k, n, rows, chunk);
}

/* --- fused MoE decode layer (lab v5, v13..v16) ---------------------------------------
 * Two launches for all routed (token, expert) pairs of a layer, routing read
 * on the device (no host round trip):
 *   k_moe_gate_up: blockIdx.y = 2·pair + {0 gate, 1 up}: gu[2·pair + w] = x[token]·W_w[e]
 *   k_moe_down:    blockIdx.y = pair: out[token] += weight · (silu(g) ⊙ u)·W_down[e]
 * Each (pair, linear) is one batch-1 v3 GEMV with its own t slice and counters.
 * D: the decode options of fused_body (0 = v5's round-1 decode, DEC_2W |
 * DEC_IMMA = v9's, + DEC_FMA = v11's); DEC_PDL: gate/up lets the down launch
 * start at once (griddep_launch), and down loads its first trellis words
 * before it waits for gate/up (griddep_wait in fused_body). Only down waits:
 * gate/up is launched plainly, so it never overlaps the previous layer's
 * down (which still reads gu). */

/* Device tables of one projection's per-expert tensors. */
struct moe_proj {
    const uint32_t *const *tr;
    const __half *const *suh;
    const __half *const *svh;
};

template <int K, int CB, int U, int D = 0>
__global__ void __launch_bounds__(256) k_moe_gate_up(moe_proj gate, moe_proj up, const int *__restrict__ ids,
                                                     const float *__restrict__ x, float *__restrict__ gu,
                                                     float *__restrict__ t, unsigned *__restrict__ counters,
                                                     int hidden, int inter, int top_k, int chunk)
{
    const int job = blockIdx.y, pair = job >> 1, token = pair / top_k, e = ids[pair];
    const moe_proj &pr = (job & 1) ? up : gate;
    const int nbc = (inter + FUSED_COLS - 1) / FUSED_COLS;
    if constexpr ((D & DEC_PDL) != 0) griddep_launch();
    fused_body<K, CB, U, 0, D & ~DEC_PDL>(pr.tr[e], x + (size_t)token * hidden, nullptr, pr.suh[e], pr.svh[e],
                            t + (size_t)job * inter, counters + (size_t)job * nbc, gu + (size_t)job * inter, 1.0f,
                            hidden, inter, 1, chunk);
}

template <int K, int CB, int U, int D = 0>
__global__ void __launch_bounds__(256) k_moe_down(moe_proj down, const int *__restrict__ ids,
                                                  const float *__restrict__ weights, const float *__restrict__ gu,
                                                  float *__restrict__ out, float *__restrict__ t,
                                                  unsigned *__restrict__ counters, int hidden, int inter, int top_k,
                                                  int chunk)
{
    const int pair = blockIdx.y, token = pair / top_k, e = ids[pair];
    const int nbc = (hidden + FUSED_COLS - 1) / FUSED_COLS;
    fused_body<K, CB, U, FUSED_IN_SWIGLU | FUSED_OUT_ADD, D>(
        down.tr[e], gu + (size_t)2 * pair * inter, gu + (size_t)(2 * pair + 1) * inter, down.suh[e], down.svh[e],
        t + (size_t)pair * hidden, counters + (size_t)pair * nbc, out + (size_t)token * hidden, weights[pair], inter,
        hidden, 1, chunk);
}

} // namespace trellis_dev

#endif
