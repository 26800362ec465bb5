/* kernels/cuda/moe_fused.cuh — moe_fused, the MoE decode layer for 3inst and
 * mcg layers (moe_decode.cu runs it; mul1 layers run the integer moe_int
 * path instead): two launches of one fused fp16 block body (lab MoE v17).
 * Included by moe_decode.cu only.
 *
 * The block body (fused_body) is one GEMV: one 256-thread block per (column
 * block of 256 outputs, k split of `chunk` k tiles, chunk a multiple of 8 so
 * each split holds whole 128-input Hadamard blocks). Each block
 *  1. issues the loads of its first trellis words, then computes
 *     u = fp16(had128(x ⊙ suh)) for its k range into shared memory (one warp
 *     per 128-input block and row, 4 values a lane: strides 1..16 by shuffles,
 *     32 and 64 in registers);
 *  2. runs the fp16 tile loop (8 warps × 2 tile columns, 4 k tiles per step,
 *     two ring words a lane at K ≤ 4, mul1 byte sums on the tensor core) with
 *     the next step's ring words loaded before the current step is decoded
 *     and A fragments read from shared memory;
 *  3. adds its partial sums into t with fp32 atomics, then counts itself done
 *     on the column block's counter; the last block of a column block applies
 *     had128 ⊙ svh to t, writes y, and zeroes t and the counter for the next
 *     call (threadfence-reduction pattern).
 * What bounds it: per (pair, projection) a block recomputes its slice of the
 * input transform and two tokens routed to one expert read its weights twice;
 * the decode itself is bound by integer issue as gemm_tc's. The k tiles per
 * block are fitted to one wave of resident blocks (moe_decode.cu,
 * moe_chunk_fit), which is what made v17 the default. */
#ifndef SPARQ_KERNELS_CUDA_MOE_FUSED_CUH
#define SPARQ_KERNELS_CUDA_MOE_FUSED_CUH

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

/* MODE bits: FUSED_IN_SWIGLU = the input is silu(x) ⊙ x2 (SwiGLU of a gate
 * and an up row) instead of x; FUSED_OUT_ADD = the output is added, times
 * yscale, into y with atomics (scatter-add of a routed expert) instead of
 * stored; FUSED_WAIT = x comes from the previous launch (PDL): wait for it
 * once the first trellis words are requested. */
enum { FUSED_IN_SWIGLU = 1, FUSED_OUT_ADD = 2, FUSED_WAIT = 4 };

template <int MODE>
__device__ __forceinline__ void fused_finish(float *__restrict__ t, unsigned *__restrict__ counters,
                                             const __half *__restrict__ svh, float *__restrict__ y, float yscale,
                                             int n, int rows, int bc, int splits, int &s_last);

template <int K, int CB, int MODE>
__device__ __forceinline__ void fused_body(const uint32_t *__restrict__ trellis, const float *__restrict__ x,
                                           const float *__restrict__ x2, const __half *__restrict__ suh,
                                           const __half *__restrict__ svh, float *__restrict__ t,
                                           unsigned *__restrict__ counters, float *__restrict__ y, float yscale,
                                           int k, int n, int rows, int chunk)
{
    constexpr int D = DEC_2W | DEC_IMMA, NW = 2, U = 4, TW = 8 * K, NWD = lane_nwords<K, D>();
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
    imma_sel_make(lane, sel0, sel1);
    const size_t row_stride = (size_t)ntiles * TW;
    const uint32_t *p = trellis + (size_t)kt0 * row_stride + (size_t)(active ? grp : 0) * NW * TW;

    uint32_t wn[U][NW][NWD];
    auto load_step = [&](int kt) { words_load<K, NW, U>(p + (size_t)(kt - kt0) * row_stride, row_stride, lr, wn); };
    if (active) load_step(kt0);
    /* FUSED_WAIT (the down launch): x and x2 come from the previous launch,
     * which may still run; the first trellis words above are already in flight */
    if constexpr ((MODE & FUSED_WAIT) != 0) griddep_wait();

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
                tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a, acc, sel0, sel1);
            }
        }
        /* 3. partial sums */
        acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
    }
    fused_finish<MODE>(t, counters, svh, y, yscale, n, rows, bc, splits, s_last);
}

/* Steps 3–4 of fused_body after the partial sums are in
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

/* --- the two launches ----------------------------------------------------------------
 * For all routed (token, expert) pairs of a layer, routing read on the device
 * (no host round trip):
 *   k_moe_fused_gate_up: blockIdx.y = 2·pair + {0 gate, 1 up}: gu[2·pair + w] = x[token]·W_w[e]
 *   k_moe_fused_down:    blockIdx.y = pair: out[token] += weight · (silu(g) ⊙ u)·W_down[e]
 * Each (pair, linear) is one batch-1 GEMV of fused_body with its own t slice
 * and counters. gate/up lets the down launch start at once (griddep_launch),
 * and down loads its first trellis words before it waits for gate/up
 * (FUSED_WAIT). Only down waits: gate/up is launched plainly, so it never
 * overlaps the previous layer's down (which still reads gu). */

/* Device tables of one projection's per-expert tensors. */
struct moe_proj {
    const uint32_t *const *tr;
    const __half *const *suh;
    const __half *const *svh;
};

/* sel (the expert split; NULL: every pair): blockIdx.y counts slots, slot s
 * being pair sel[1 + s] of sel[0] (moe_decode.cu, k_moe_select); gu, t and
 * the counters are indexed by slot. */
template <int K, int CB>
__global__ void __launch_bounds__(256) k_moe_fused_gate_up(moe_proj gate, moe_proj up, const int *__restrict__ ids,
                                                     const int *__restrict__ sel, const float *__restrict__ x,
                                                     float *__restrict__ gu, float *__restrict__ t,
                                                     unsigned *__restrict__ counters, int hidden, int inter,
                                                     int top_k, int chunk)
{
    const int job = blockIdx.y;
    if (sel && job >> 1 >= sel[0]) return; /* a plain launch: nothing to wait for */
    const int pair = sel ? sel[1 + (job >> 1)] : job >> 1, token = pair / top_k, e = ids[pair];
    const moe_proj &pr = (job & 1) ? up : gate;
    const int nbc = (inter + FUSED_COLS - 1) / FUSED_COLS;
    griddep_launch();
    fused_body<K, CB, 0>(pr.tr[e], x + (size_t)token * hidden, nullptr, pr.suh[e], pr.svh[e], t + (size_t)job * inter,
                         counters + (size_t)job * nbc, gu + (size_t)job * inter, 1.0f, hidden, inter, 1, chunk);
}

template <int K, int CB>
__global__ void __launch_bounds__(256) k_moe_fused_down(moe_proj down, const int *__restrict__ ids,
                                                  const int *__restrict__ sel, const float *__restrict__ weights,
                                                  const float *__restrict__ gu, float *__restrict__ out,
                                                  float *__restrict__ t, unsigned *__restrict__ counters, int hidden,
                                                  int inter, int top_k, int chunk)
{
    const int slot = blockIdx.y;
    if (sel && slot >= sel[0]) {
        griddep_wait();
        return;
    }
    const int pair = sel ? sel[1 + slot] : slot, token = pair / top_k, e = ids[pair];
    const int nbc = (hidden + FUSED_COLS - 1) / FUSED_COLS;
    fused_body<K, CB, FUSED_IN_SWIGLU | FUSED_OUT_ADD | FUSED_WAIT>(
        down.tr[e], gu + (size_t)2 * slot * inter, gu + (size_t)(2 * slot + 1) * inter, down.suh[e], down.svh[e],
        t + (size_t)slot * hidden, counters + (size_t)slot * nbc, out + (size_t)token * hidden, weights[pair], inter,
        hidden, 1, chunk);
}

} // namespace trellis_dev

#endif
