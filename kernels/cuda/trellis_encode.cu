/* kernels/cuda/trellis_encode.cu — the batched tail-biting Viterbi encoder
 * (trellis_encode.h): quantize/viterbi.c's two passes over
 * trellis_viterbi_step's scalar loop, one thread block per tile in flight.
 *
 * Block layout. A node e is the low 16−K bits of a state; the 2^K states
 * entering e are s = (j << (16−K)) | e, all leaving the predecessor node
 * s >> K = (j << (16−2K)) | (e >> K). So the 2^K nodes of a group
 * g = e >> K share their 2^K predecessors: a thread owns R = min(2^K, 8)
 * consecutive nodes of one group, loads each predecessor cost once and
 * evaluates it against its R nodes (2^K·R branches per chunk), then stores R
 * costs (one vector store) and R back-pointer bytes (one 2/4/8-byte store).
 * Costs are double-buffered (in shared memory where 2·4·2^(16−K) bytes fit,
 * else in the workspace), which needs one __syncthreads per step.
 *
 * Arithmetic, as trellis_viterbi_step (kernels/cpu/trellis.c) exactly:
 *   d = cb[s] − target; dd = d·d; if weight ≠ 1: dd = dd·weight; c = cost + dd;
 *   if c < best: best = c, arg = j     (j ascending, best starting at +∞)
 * with __fsub_rn / __fmul_rn / __fadd_rn so nvcc contracts nothing into an
 * FMA. For mul1 the value of s depends only on the byte sum b of s·0x83DCD12D
 * (≤ 1020), so dd is tabulated per step for the 1024 b (ddtab, double-
 * buffered) from the host's table of values (built from trellis_cb_value) and a
 * branch costs an IMAD-free add, one dp4a and one shared load. 3inst / mcg
 * compute the value: the fp16 add of the masked halves (one rounding of the
 * exact sum, as trellis_cb_value_f16).
 *
 * Tail-biting (viterbi.c): pass 1 over positions 128..255, 0..127 from zero
 * costs; the end node is the first index of the minimum cost (a block
 * reduction that keeps exactly the serial scan's winner, NaN included); one
 * warp traces back 128 steps to the wrap node N (trace_back_warp). Pass 2 over 0..255 from N
 * alone (others +∞), ends in N, and the trace-back gives the 256 states; the
 * tile's error is pass 2's final cost at N. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/trellis_encode.h"
#include "kernels/cpu/trellis_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/alloc.h" /* a C header without its own extern "C" */
}

namespace {

using trellis_dev::CB_3INST;
using trellis_dev::CB_MCG;
using trellis_dev::CB_MUL1;
/* mul1 with its value computed, not looked up (no table): the byte sum as the
 * fp16 bits of 1024 + b (dp4a into 0x6400), then one __hfma by the codebook's
 * scale and bias, which is trellis_cb_value_f16's single rounding of the exact
 * (1024 + b)·scale + bias. Internal to this file. */
constexpr int CB_MUL1_ARITH = 3;

/* The shape of the search at K bits. */
template <int K>
struct vshape {
    static constexpr int SHIFT = 16 - K;
    static constexpr int NODES = 1 << SHIFT;
    static constexpr int G = 1 << K;                   /* nodes per group = predecessors per node */
    static constexpr int R = G < 8 ? G : 8;            /* nodes per chunk (one thread's work) */
    static constexpr int CHUNKS = NODES / R;
    static constexpr int THREADS = CHUNKS < 256 ? CHUNKS : 256; /* 32..256, a multiple of 32 */
    static constexpr int PSHIFT = 16 - 2 * K;          /* predecessor = (j << PSHIFT) | group */
};

inline int threads_of(int K)
{
    const int nodes = 1 << (16 - K), g = 1 << K, r = g < 8 ? g : 8, chunks = nodes / r;
    return chunks < 256 ? chunks : 256;
}

/* Dynamic shared memory of a block, in the order the kernel carves it. */
inline size_t smem_bytes(int K, int cb, bool gcost)
{
    size_t b = 0;
    if (!gcost) b += 2 * ((size_t)1 << (16 - K)) * sizeof(float); /* cost0, cost1 */
    if (cb == CB_MUL1) b += 3 * 1024 * sizeof(float);            /* tab, ddtab[2] */
    b += 2 * 256 * sizeof(float);                                /* targets, weights */
    b += 256 * sizeof(uint16_t);                                 /* traced states */
    b += 2 * 32 * sizeof(float) + 16;                            /* reduction, wrap node */
    return b;
}

template <int CB>
__host__ __device__ constexpr uint32_t cb_mul()
{
    return CB == CB_MUL1 || CB == CB_MUL1_ARITH ? TRELLIS_MUL1_MUL : CB == CB_MCG ? TRELLIS_MCG_MUL : TRELLIS_3INST_MUL;
}
template <int CB>
__host__ __device__ constexpr uint32_t cb_add()
{
    return CB == CB_3INST ? TRELLIS_3INST_ADD : 0u;
}

/* 3inst / mcg value of the hashed state x, as trellis_cb_value. */
__device__ __forceinline__ float lop_value(uint32_t x)
{
    const uint32_t y = (x & TRELLIS_LOP_MASK) ^ TRELLIS_LOP_XOR;
    /* hadd rounds the exact sum once, as the CPU's exact fp32 sum rounded to fp16 */
    return __half2float(__hadd(__ushort_as_half((unsigned short)(y & 0xFFFFu)),
                               __ushort_as_half((unsigned short)(y >> 16))));
}

/* mul1's value of the hashed state x, computed (CB_MUL1_ARITH). */
__device__ __forceinline__ float mul1_value(uint32_t x)
{
    const uint32_t h = __dp4a(x, 0x01010101u, 0x6400u); /* 1024 + b as fp16 bits (b ≤ 1020) */
    return __half2float(__hfma(__ushort_as_half((unsigned short)h), __ushort_as_half((unsigned short)TRELLIS_MUL1_SCALE_F16),
                               __ushort_as_half((unsigned short)TRELLIS_MUL1_BIAS_F16)));
}

/* The branch metric, in trellis_viterbi_step's roundings. */
__device__ __forceinline__ float branch_dd(float v, float target, float weight)
{
    const float d = __fsub_rn(v, target);
    float dd = __fmul_rn(d, d);
    if (weight != 1.0f) dd = __fmul_rn(dd, weight);
    return dd;
}

/* Codebook value of a 16-bit state (tab: mul1's values by byte sum). */
template <int CB>
__device__ __forceinline__ float state_value(uint32_t s, const float *tab)
{
    const uint32_t x = s * cb_mul<CB>() + cb_add<CB>();
    if constexpr (CB == CB_MUL1) return tab[__dp4a(x, 0x01010101u, 0u)];
    else if constexpr (CB == CB_MUL1_ARITH) return mul1_value(x);
    else return lop_value(x);
}

/* A float from the shared-memory window at byte address a (ld.shared with a
 * 32-bit register address: the lane kernel folds its table's base into the
 * dp4a that makes the offset, so a lookup is dp4a + one load, no add).
 * volatile: the table is written before the kernel's first barrier, and a
 * load with no side effects could be hoisted above it. */
__device__ __forceinline__ float lds_f32(uint32_t a)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
    return v;
}

/* The chunk's R costs (one vector store) and, if keep, its R back-pointer
 * bytes (one 2/4/8-byte store). */
template <int R>
__device__ __forceinline__ void store_chunk(float *cost, uint8_t *back, int e0, const float *best, const int *arg,
                                            bool keep)
{
    if constexpr (R == 8) {
        reinterpret_cast<float4 *>(cost + e0)[0] = make_float4(best[0], best[1], best[2], best[3]);
        reinterpret_cast<float4 *>(cost + e0)[1] = make_float4(best[4], best[5], best[6], best[7]);
        const uint32_t lo = (uint32_t)arg[0] | (uint32_t)arg[1] << 8 | (uint32_t)arg[2] << 16 | (uint32_t)arg[3] << 24;
        const uint32_t hi = (uint32_t)arg[4] | (uint32_t)arg[5] << 8 | (uint32_t)arg[6] << 16 | (uint32_t)arg[7] << 24;
        if (keep) *reinterpret_cast<uint2 *>(back + e0) = make_uint2(lo, hi);
    } else if constexpr (R == 4) {
        *reinterpret_cast<float4 *>(cost + e0) = make_float4(best[0], best[1], best[2], best[3]);
        if (keep)
            *reinterpret_cast<uint32_t *>(back + e0) =
                (uint32_t)arg[0] | (uint32_t)arg[1] << 8 | (uint32_t)arg[2] << 16 | (uint32_t)arg[3] << 24;
    } else {
        *reinterpret_cast<float2 *>(cost + e0) = make_float2(best[0], best[1]);
        if (keep) *reinterpret_cast<uint16_t *>(back + e0) = (uint16_t)((uint32_t)arg[0] | (uint32_t)arg[1] << 8);
    }
}

/* One chunk of one step: nodes e0..e0+R−1 (one group). The branch metric:
 * LANE (mul1, K ≥ 3, the lane kernel below): the value from the lane's own
 * table tab (bytes, at b·128), then d² (·weight when WEIGHTED; ·1 is exact,
 * the CPU's skip) computed here; else mul1's d² from the step's table tab
 * by byte sum, or 3inst / mcg's value computed. KEEP: track and store the
 * back-pointers (pass 1 needs only those its trace reads); without, the
 * minimum alone (one fminf a branch where the argmin took a compare and two
 * selects). */
template <int K, int CB, bool LANE = false, bool WEIGHTED = true, bool KEEP = true>
__device__ __forceinline__ void step_chunk(int c, const float *cin, float *cout, uint8_t *bk, const void *tab,
                                           float target, float weight)
{
    using S = vshape<K>;
    constexpr int R = S::R;
    constexpr uint32_t M = cb_mul<CB>(), JINC = cb_mul<CB>() << S::SHIFT;
    const int e0 = c * R, g = e0 >> K;
    uint32_t lane_base = 0; /* LANE: the lane's table column in the shared window */
    if constexpr (LANE) lane_base = (uint32_t)__cvta_generic_to_shared(tab);
    uint32_t base[R];
    float best[R];
    int arg[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        base[r] = (uint32_t)(e0 + r) * M + cb_add<CB>(); /* hash of s = (j << SHIFT) | e at j = 0 */
        best[r] = INFINITY;
        arg[r] = 0;
    }
#pragma unroll(S::G <= 8 ? S::G : 4)
    for (int j = 0; j < S::G; j++) {
        const float ci = cin[(j << S::PSHIFT) | g];
        const uint32_t off = (uint32_t)j * JINC;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t x = base[r] + off;
            float dd;
            if constexpr (LANE) { /* the byte sum b of the hashed state, times 128 (one row of 32 lanes) */
                const float v = lds_f32(__dp4a(x, 0x80808080u, lane_base));
                const float d = __fsub_rn(v, target);
                dd = __fmul_rn(d, d);
                if constexpr (WEIGHTED) dd = __fmul_rn(dd, weight);
            } else if constexpr (CB == CB_MUL1) dd = static_cast<const float *>(tab)[__dp4a(x, 0x01010101u, 0u)];
            else if constexpr (CB == CB_MUL1_ARITH) dd = branch_dd(mul1_value(x), target, weight);
            else dd = branch_dd(lop_value(x), target, weight);
            const float cc = __fadd_rn(ci, dd);
            if (!KEEP || (S::G <= 8 && j == 0)) {
                /* the minimum alone: the serial scan's value (neither fminf nor the strict <
                 * takes a NaN, and no cost is −0: the first step adds to +0); at j = 0 (a fully
                 * unrolled loop) the scan's argument stays 0 whatever it compares */
                best[r] = fminf(best[r], cc);
            } else {
                if (cc < best[r]) {
                    best[r] = cc;
                    arg[r] = j;
                }
            }
        }
    }
    store_chunk<R>(cout, bk, e0, best, arg, KEEP);
}

/* 256 steps over positions (i + roll) & 255 from the costs in cin; returns
 * the buffer holding the final costs (visible to the whole block). back gets
 * step i's choices at back[i·NODES + e]. */
template <int K, int CB>
__device__ __forceinline__ float *forward(float *cin, float *cout, uint8_t *back, const float *sx, const float *sw,
                                          const float *tab, float *ddt, int roll)
{
    using S = vshape<K>;
    const int tid = threadIdx.x;
    for (int i = 0; i < 256; i++) {
        const int p = (i + roll) & 255;
        const float target = sx[p], weight = sw[p];
        float *dt = ddt + (i & 1) * 1024;
        if constexpr (CB == CB_MUL1)
            for (int b = tid; b < 1024; b += S::THREADS) dt[b] = branch_dd(tab[b], target, weight);
        /* publishes dt and the previous step's costs; every read of this
         * step's cout (the step before's cin) is behind it too */
        __syncthreads();
        uint8_t *bk = back + (size_t)i * S::NODES;
        if (roll == 0 || i >= 128)
            for (int c = tid; c < S::CHUNKS; c += S::THREADS) step_chunk<K, CB>(c, cin, cout, bk, dt, target, weight);
        else
            for (int c = tid; c < S::CHUNKS; c += S::THREADS)
                step_chunk<K, CB, false, true, false>(c, cin, cout, bk, dt, target, weight);
        float *t = cin;
        cin = cout;
        cout = t;
    }
    __syncthreads();
    return cin;
}

/* (v, i) < (ov, oi) in the order of the serial argmin scan. */
__device__ __forceinline__ bool cand_less(float v, int i, float ov, int oi)
{
    return v < ov || (v == ov && i < oi);
}

/* The barrier of one tile's T threads: the block's when a block runs one
 * tile (G = 1), the warp's when a tile has one warp, else named barrier g + 1
 * over the group's T threads (bar.sync orders shared memory like
 * __syncthreads, among the threads it counts). */
template <int T, int G>
__device__ __forceinline__ void tile_sync(int g)
{
    if constexpr (G == 1) __syncthreads();
    else if constexpr (T == 32) __syncwarp();
    else asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(T) : "memory");
}

/* The serial scan's `for i: if (fin[i] < fin[e]) e = i` from e = 0: the
 * first index of the minimum over the non-NaN costs, or 0 if fin[0] is NaN
 * (a NaN at e blocks every update), by the T threads (tid 0..T−1) of tile
 * group g. Result in *out (shared), visible to the group. */
template <int NODES, int T, int G>
__device__ __forceinline__ void tile_argmin(const float *fin, float *rv, int *ri, int *out, int tid, int g)
{
    const int lane = tid & 31, warp = tid >> 5;
    float cv = INFINITY;
    int ci = 0x7FFFFFFF; /* no candidate yet: loses every tie */
    for (int e = tid; e < NODES; e += T) {
        const float v = fin[e];
        if (v == v && cand_less(v, e, cv, ci)) {
            cv = v;
            ci = e;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_down_sync(0xFFFFFFFFu, cv, o);
        const int oi = __shfl_down_sync(0xFFFFFFFFu, ci, o);
        if (cand_less(ov, oi, cv, ci)) {
            cv = ov;
            ci = oi;
        }
    }
    if (lane == 0) {
        rv[warp] = cv;
        ri[warp] = ci;
    }
    tile_sync<T, G>(g);
    if (tid == 0) {
        for (int w = 1; w < T / 32; w++)
            if (cand_less(rv[w], ri[w], cv, ci)) {
                cv = rv[w];
                ci = ri[w];
            }
        *out = isnan(fin[0]) ? 0 : ci;
    }
    tile_sync<T, G>(g);
}

/* The trace-back from node e after step `from` down to step `to`: the node
 * before step `to`, and, if sst is set, the states of those steps — the
 * serial `st = back[i][e] << SHIFT | e; e = st >> K` — by one warp (all 32
 * lanes call it; every lane returns the node, lane 0 writes sst). The
 * chain's loads are dependent, one L2 round trip
 * a step, and the SM's other threads wait at the barrier after it (at K ≤ 3
 * a SM runs one tile). So each round trip resolves D + 1 steps: besides the
 * step's own back-pointer, the lanes load the back-pointers of every node the
 * next D steps can reach (2^(K·d) of them at depth d, at most 64: two a lane),
 * then D + 1 shuffles pick the chain through them. The same states as the
 * serial loop, in a third of the round trips at K = 3. */
template <int K>
__device__ __forceinline__ uint32_t trace_back_warp(const uint8_t *back, uint32_t e, int from, int to, uint16_t *sst,
                                                    int lane)
{
    using S = vshape<K>;
    constexpr int D = K >= 7 ? 0 : K == 1 ? 4 : 6 / K; /* lookahead: 2^(K·D) ≤ 64 candidates */
    constexpr uint32_t GM = (1u << K) - 1;
    for (int i = from; i >= to;) {
        const int dn = i - to < D ? i - to : D; /* the trip's extra steps */
        uint32_t v[D + 1][2];
#pragma unroll
        for (int d = 0; d <= D; d++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t q = (uint32_t)(lane + 32 * h); /* the choices b_i .. b_(i−d+1), b_i highest */
                v[d][h] = 0;
                if (d > dn || q >= (1u << (K * d))) continue;
                uint32_t node = e;
#pragma unroll
                for (int t = d - 1; t >= 0; t--) node = ((((q >> (K * t)) & GM) << S::SHIFT) | node) >> K;
                v[d][h] = back[(size_t)(i - d) * S::NODES + node];
            }
        uint32_t q = 0;
#pragma unroll
        for (int d = 0; d <= D; d++) {
            if (d > dn) break;
            const uint32_t b = __shfl_sync(0xFFFFFFFFu, q >= 32 ? v[d][1] : v[d][0], (int)(q & 31));
            const uint32_t st = (b << S::SHIFT) | e;
            if (sst && lane == 0) sst[i - d] = (uint16_t)st;
            e = st >> K;
            q = (q << K) | b;
        }
        i -= dn + 1;
    }
    return e;
}

/* One block per tile slot (blockIdx.x), looping over tiles. back_ws and
 * cost_ws are written and read back by the block: no __restrict__, so no
 * load of them can become a non-coherent (read-only cache) load. */
template <int K, int CB, bool GCOST>
__global__ void __launch_bounds__(vshape<K>::THREADS)
    k_viterbi(const float *__restrict__ x, const float *__restrict__ w, size_t n_tiles, uint16_t *__restrict__ states,
              float *__restrict__ decoded, float *__restrict__ err, uint8_t *back_ws, float *cost_ws,
              const float *__restrict__ mul1_tab, int nslots)
{
    (void)nslots; /* one tile a block: the grid is the slot count */
    using S = vshape<K>;
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    float *cost0, *cost1;
    if constexpr (GCOST) {
        cost0 = cost_ws + (size_t)blockIdx.x * 2 * S::NODES;
        cost1 = cost0 + S::NODES;
    } else {
        cost0 = sm;
        cost1 = sm + S::NODES;
        sm += 2 * S::NODES;
    }
    float *tab = sm, *ddt = sm + 1024;
    if constexpr (CB == CB_MUL1) sm += 3 * 1024;
    float *sx = sm, *sw = sm + 256;
    uint16_t *sst = reinterpret_cast<uint16_t *>(sm + 512);
    float *rv = sm + 512 + 128;
    int *ri = reinterpret_cast<int *>(rv + 32);
    int *swrap = ri + 32;
    uint8_t *back = back_ws + (size_t)blockIdx.x * 256 * S::NODES;
    const int tid = threadIdx.x;

    if constexpr (CB == CB_MUL1)
        for (int b = tid; b < 1024; b += S::THREADS) tab[b] = mul1_tab[b];
    for (size_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        for (int p = tid; p < 256; p += S::THREADS) {
            sx[p] = x[t * 256 + p];
            sw[p] = w ? w[t * 256 + p] : 1.0f;
        }
        for (int e = tid; e < S::NODES; e += S::THREADS) cost0[e] = 0.0f;
        /* the first step reads sx[128] before its own barrier (for the dd table):
         * every thread's loads of this tile must be visible first */
        __syncthreads();

        /* pass 1: rotated by 128, free start, trace back to the wrap point */
        const float *fin = forward<K, CB>(cost0, cost1, back, sx, sw, tab, ddt, 128);
        tile_argmin<S::NODES, S::THREADS, 1>(fin, rv, ri, swrap, tid, 0);
        if (tid < 32) { /* positions 127..0 */
            const uint32_t e = trace_back_warp<K>(back, (uint32_t)*swrap, 255, 128, nullptr, tid);
            __syncwarp();
            if (tid == 0) *swrap = (int)e;
        }
        __syncthreads();
        const int wrap = *swrap;

        /* pass 2: positions 0..255 from the wrap node alone (fin is cost0:
         * 256 steps swap the buffers back; its readers are behind the syncs) */
        for (int e = tid; e < S::NODES; e += S::THREADS) cost0[e] = e == wrap ? 0.0f : INFINITY;
        fin = forward<K, CB>(cost0, cost1, back, sx, sw, tab, ddt, 0);
        if (tid < 32) {
            if (err && tid == 0) err[t] = fin[wrap];
            trace_back_warp<K>(back, (uint32_t)wrap, 255, 0, sst, tid);
        }
        __syncthreads();
        for (int p = tid; p < 256; p += S::THREADS) {
            const uint32_t st = sst[p];
            states[t * 256 + p] = (uint16_t)st;
            if (decoded) decoded[t * 256 + p] = state_value<CB>(st, tab);
        }
        __syncthreads(); /* sx, sw, sst and cost0 are reused by the next tile */
    }
}

/* --- mul1 at K ≥ 3: the codebook in a per-lane table ------------------------------
 *
 * The kernel above looks each branch's d² up in a 1024-entry table by the
 * byte sum b: 32 lanes at random b hit ~3.3 distinct words a bank, so the
 * shared-memory pipe, not issue, bounds it (~54 k tiles/s on an H200 at
 * every K ≥ 3, trellis_encode_bench). Here every lane has its own copy of
 * mul1's 1024 values, vt[b·32 + lane] (128 KB), so lane l always reads bank l
 * and every lookup is one wavefront; one __dp4a forms the byte address
 * b·128 + 4·lane from the hashed state. d, d² and the weight are then computed
 * per branch in the roundings of trellis_viterbi_step (the table held exactly
 * those numbers). The table leaves room for the node costs of one tile at
 * K = 3 (64 KB), so a block runs G = 2^(K−3) tiles (8 at K = 7, 16 at K = 8)
 * of T = 2^(13−K) threads (one chunk a thread; 512 threads of two chunks at
 * K = 3), each tile with its own barrier. */
template <int K>
struct lshape {
    using S = vshape<K>;
    /* a thread's chunks a step: 2 at K = 3 (at 1024 threads its 64 registers spill), else 1 */
    static constexpr int T = K == 3 ? S::CHUNKS / 2 : S::CHUNKS;    /* 512 at K = 3, 4 .. 32 at K = 8 */
    static constexpr int G = K <= 6 ? 1 << (K - 3) : K == 7 ? 8 : 16; /* tiles a block */
    static constexpr int THREADS = T * G;
    static constexpr int GROUP_FLOATS = 2 * S::NODES + 708;         /* costs, sx, sw, states, reduction */
};
constexpr int LANE_TAB_FLOATS = 1024 * 32;

/* lshape's figures for a run-time K (3..8) */
inline int lane_groups(int K) { return K <= 6 ? 1 << (K - 3) : K == 7 ? 8 : 16; }
inline int lane_threads(int K) { return (1 << (13 - K)) / (K == 3 ? 2 : 1) * lane_groups(K); }
inline size_t lane_smem_bytes(int K)
{
    return ((size_t)LANE_TAB_FLOATS + (size_t)lane_groups(K) * (2 * (1 << (16 - K)) + 708)) * sizeof(float);
}

/* forward() for the lane kernel: 256 steps of tile group g; pass 1 (roll 128)
 * keeps only the back-pointers its trace reads (steps 128..255). */
template <int K, bool WEIGHTED>
__device__ __forceinline__ float *forward_lane(float *cin, float *cout, uint8_t *back, const float *sx,
                                               const float *sw, const char *vt, int roll, int tid, int g)
{
    using S = vshape<K>;
    using L = lshape<K>;
    for (int i = 0; i < 256; i++) {
        const int p = (i + roll) & 255;
        const float target = sx[p], weight = WEIGHTED ? sw[p] : 1.0f;
        tile_sync<L::T, L::G>(g); /* the previous step's costs, and every read of cout, are behind it */
        uint8_t *bk = back + (size_t)i * S::NODES;
        if (roll == 0 || i >= 128)
            for (int c = tid; c < S::CHUNKS; c += L::T)
                step_chunk<K, CB_MUL1, true, WEIGHTED>(c, cin, cout, bk, vt, target, weight);
        else
            for (int c = tid; c < S::CHUNKS; c += L::T)
                step_chunk<K, CB_MUL1, true, WEIGHTED, false>(c, cin, cout, bk, vt, target, weight);
        float *t = cin;
        cin = cout;
        cout = t;
    }
    tile_sync<L::T, L::G>(g);
    return cin;
}

/* G tile groups a block; group g of block b is slot b·G + g (< nslots), looping
 * over tiles t ≡ slot (mod nslots). Same passes and trace-backs as k_viterbi. */
template <int K, bool WEIGHTED>
__global__ void __launch_bounds__(lshape<K>::THREADS, 1)
    k_viterbi_lane(const float *__restrict__ x, const float *__restrict__ w, size_t n_tiles,
                   uint16_t *__restrict__ states, float *__restrict__ decoded, float *__restrict__ err,
                   uint8_t *back_ws, float *cost_ws, const float *__restrict__ mul1_tab, int nslots)
{
    (void)cost_ws;
    using S = vshape<K>;
    using L = lshape<K>;
    extern __shared__ float4 smem4[];
    float *vt = reinterpret_cast<float *>(smem4);
    const int g = threadIdx.x / L::T, tid = threadIdx.x % L::T, lane = threadIdx.x & 31;
    float *gs = vt + LANE_TAB_FLOATS + (size_t)g * L::GROUP_FLOATS;
    float *cost0 = gs, *cost1 = gs + S::NODES;
    float *sx = gs + 2 * S::NODES, *sw = sx + 256;
    uint16_t *sst = reinterpret_cast<uint16_t *>(sw + 256);
    float *rv = sw + 256 + 128;
    int *ri = reinterpret_cast<int *>(rv + 32);
    int *swrap = ri + 32;
    const int slot = blockIdx.x * L::G + g;
    uint8_t *back = back_ws + (size_t)slot * 256 * S::NODES;

    for (int i = threadIdx.x; i < LANE_TAB_FLOATS; i += L::THREADS) vt[i] = mul1_tab[i >> 5];
    __syncthreads();
    const char *vl = reinterpret_cast<const char *>(vt) + 4 * lane;
    if (slot >= nslots) return; /* past the workspace: no barrier of the block follows */
    for (size_t t = (size_t)slot; t < n_tiles; t += (size_t)nslots) {
        for (int p = tid; p < 256; p += L::T) {
            sx[p] = x[t * 256 + p];
            if constexpr (WEIGHTED) sw[p] = w[t * 256 + p];
        }
        for (int e = tid; e < S::NODES; e += L::T) cost0[e] = 0.0f;
        tile_sync<L::T, L::G>(g);

        const float *fin = forward_lane<K, WEIGHTED>(cost0, cost1, back, sx, sw, vl, 128, tid, g);
        tile_argmin<S::NODES, L::T, L::G>(fin, rv, ri, swrap, tid, g);
        if (tid < 32) { /* positions 127..0 */
            const uint32_t e = trace_back_warp<K>(back, (uint32_t)*swrap, 255, 128, nullptr, tid);
            __syncwarp();
            if (tid == 0) *swrap = (int)e;
        }
        tile_sync<L::T, L::G>(g);
        const int wrap = *swrap;

        for (int e = tid; e < S::NODES; e += L::T) cost0[e] = e == wrap ? 0.0f : INFINITY;
        fin = forward_lane<K, WEIGHTED>(cost0, cost1, back, sx, sw, vl, 0, tid, g);
        if (tid < 32) {
            if (err && tid == 0) err[t] = fin[wrap];
            trace_back_warp<K>(back, (uint32_t)wrap, 255, 0, sst, tid);
        }
        tile_sync<L::T, L::G>(g);
        for (int p = tid; p < 256; p += L::T) {
            const uint32_t st = sst[p];
            states[t * 256 + p] = (uint16_t)st;
            if (decoded)
                decoded[t * 256 + p] =
                    *reinterpret_cast<const float *>(vl + __dp4a(st * TRELLIS_MUL1_MUL, 0x80808080u, 0u));
        }
        tile_sync<L::T, L::G>(g); /* sx, sw, sst and cost0 are reused by the next tile */
    }
}

template <int CB>
__global__ void k_cb_values(float *out, const float *__restrict__ mul1_tab)
{
    __shared__ float tab[1024];
    if constexpr (CB == CB_MUL1)
        for (int b = threadIdx.x; b < 1024; b += blockDim.x) tab[b] = mul1_tab[b];
    __syncthreads();
    const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < 65536) out[s] = state_value<CB>(s, tab);
}

typedef void (*viterbi_fn)(const float *, const float *, size_t, uint16_t *, float *, float *, uint8_t *, float *,
                           const float *, int);

viterbi_fn pick_kernel(int K, int cb, bool gcost)
{
    if (cb == CB_MUL1_ARITH)
        return with_k_cb(K, CB_MUL1, [gcost](auto k, auto) -> viterbi_fn {
            return gcost ? k_viterbi<decltype(k)::value, CB_MUL1_ARITH, true>
                         : k_viterbi<decltype(k)::value, CB_MUL1_ARITH, false>;
        });
    return with_k_cb(K, cb, [gcost](auto k, auto c) -> viterbi_fn {
        return gcost ? k_viterbi<decltype(k)::value, decltype(c)::value, true>
                     : k_viterbi<decltype(k)::value, decltype(c)::value, false>;
    });
}

/* The lane kernel for K (3..8), weighted or not. */
viterbi_fn pick_lane_kernel(int K, bool weighted)
{
    return with_k_cb(K, CB_MUL1, [weighted](auto k, auto) -> viterbi_fn {
        constexpr int KK = decltype(k)::value;
        if constexpr (KK >= 3) return weighted ? k_viterbi_lane<KK, true> : k_viterbi_lane<KK, false>;
        else return nullptr;
    });
}

/* mul1's values by byte sum b of s·0x83DCD12D (1024 entries, unused ones 0),
 * from the CPU's codebook. */
void mul1_by_bytesum(float *tab)
{
    memset(tab, 0, 1024 * sizeof(float));
    for (uint32_t s = 0; s < 65536; s++) {
        const uint32_t x = s * TRELLIS_MUL1_MUL;
        const uint32_t b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
        tab[b] = trellis_cb_value(TRELLIS_CB_MUL1, s);
    }
}

/* How mul1 gets its values, SPARQ_VITERBI_MUL1 (for benchmarks: every variant gives the
 * same states): 0 by default — the lane table where it fits (K ≥ 3 with 200 KB of shared
 * memory a block), else computed at K ≥ 2 (H200: 61 k tiles/s at K = 2 against the table's
 * 42 k; 77 k at K = 3 against 54 k), the per-step d² table at K = 1 (its costs live in global
 * memory; the computed value there is not measured); 1 "table", the per-step d² table at
 * every K; 2 "arith", computed at every K. */
int mul1_variant(void)
{
    const char *v = getenv("SPARQ_VITERBI_MUL1");
    return !v ? 0 : !strcmp(v, "table") ? 1 : !strcmp(v, "arith") ? 2 : 0;
}

/* Whether the node costs go to global memory on the current device, and
 * whether the lane kernel (mul1, K ≥ 3) fits its shared memory. */
cudaError_t costs_global(int K, int cb, bool *gcost, bool *lane = nullptr)
{
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    *gcost = smem_bytes(K, cb, false) > (size_t)optin;
    if (lane) *lane = cb == CB_MUL1 && K >= 3 && lane_smem_bytes(K) <= (size_t)optin && mul1_variant() == 0;
    return e;
}

} // namespace

/* Waves of tiles a launch takes at most (trellis_cuda_encode_tiles). */
#define ENC_WAVES 4

struct trellis_cuda_enc {
    int K, cb;
    bool gcost;
    int group;           /* tiles a block: 1, or lane_groups(K) for the lane kernel */
    int slots, threads;
    size_t smem;
    viterbi_fn fn, fn_w; /* unweighted and weighted (the same for k_viterbi) */
    uint8_t *back; /* slots × 256 × 2^(16−K) */
    float *cost;   /* slots × 2 × 2^(16−K) when gcost */
    float *tab;    /* mul1 values by byte sum (1024) */
};

static size_t slot_bytes(int K, bool gcost)
{
    const size_t nodes = (size_t)1 << (16 - K);
    return 256 * nodes + (gcost ? 2 * nodes * sizeof(float) : 0);
}

extern "C" size_t trellis_cuda_enc_slot_bytes(int K, trellis_codebook cb)
{
    if (K < 1 || K > TRELLIS_K_MAX) return 0;
    bool gcost = true;
    if (costs_global(K, (int)cb, &gcost) != cudaSuccess) gcost = true;
    return slot_bytes(K, gcost);
}

extern "C" void trellis_cuda_enc_free(trellis_cuda_enc *enc)
{
    if (!enc) return;
    cudaFree(enc->back);
    cudaFree(enc->cost);
    cudaFree(enc->tab);
    sparq_free(enc);
}

extern "C" sparq_status trellis_cuda_enc_create(int K, trellis_codebook cb, size_t workspace_bytes,
                                                trellis_cuda_enc **out)
{
    *out = NULL;
    RETURN_IF(K < 1 || K > TRELLIS_K_MAX, SPARQ_E_ARG, "cuda viterbi: %d bits per weight, expected 1..8", K);
    RETURN_IF((unsigned)cb >= TRELLIS_CB_COUNT_, SPARQ_E_ARG, "cuda viterbi: unknown codebook %d", (int)cb);
    bool gcost = true, lane = false;
    CUDA_RETURN_IF(costs_global(K, (int)cb, &gcost, &lane), "viterbi: device attributes");
    const int var = mul1_variant();
    /* the kernel's codebook: mul1 computed where no lane table and not forced to the table */
    const int kcb = cb == TRELLIS_CB_MUL1 && !lane && (var == 2 || (var == 0 && K >= 2)) ? CB_MUL1_ARITH : (int)cb;
    if (kcb != (int)cb) CUDA_RETURN_IF(costs_global(K, kcb, &gcost), "viterbi: device attributes");
    if (workspace_bytes == 0) {
        size_t free_b = 0, total_b = 0;
        CUDA_RETURN_IF(cudaMemGetInfo(&free_b, &total_b), "viterbi: memory info");
        workspace_bytes = free_b / 4 < ((size_t)4 << 30) ? free_b / 4 : ((size_t)4 << 30);
    }
    const size_t sb = slot_bytes(K, gcost);
    RETURN_IF(workspace_bytes < sb, SPARQ_E_NOMEM,
              "cuda viterbi: a workspace of %zu bytes cannot hold one K=%d tile (%zu bytes)", workspace_bytes, K, sb);

    trellis_cuda_enc *enc = (trellis_cuda_enc *)sparq_calloc(1, sizeof *enc);
    if (!enc) return sparq_err(SPARQ_E_NOMEM, "cuda viterbi: no memory for the encoder");
    enc->K = K;
    enc->cb = (int)cb;
    enc->gcost = gcost;
    if (lane) {
        enc->group = lane_groups(K);
        enc->threads = lane_threads(K);
        enc->smem = lane_smem_bytes(K);
        enc->fn = pick_lane_kernel(K, false);
        enc->fn_w = pick_lane_kernel(K, true);
    } else {
        enc->group = 1;
        enc->threads = threads_of(K);
        enc->smem = smem_bytes(K, kcb, gcost);
        enc->fn = enc->fn_w = pick_kernel(K, kcb, gcost);
    }
    sparq_status rc = SPARQ_OK;
    int per_sm = 0;
    cudaError_t e = cudaSuccess;
    for (viterbi_fn f : {enc->fn, enc->fn_w})
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute((const void *)f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)enc->smem);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)enc->fn, enc->threads, enc->smem);
    if (e != cudaSuccess) rc = cuda_status(e, "viterbi: kernel attributes");
    if (rc == SPARQ_OK) {
        long long slots = (long long)(per_sm < 1 ? 1 : per_sm) * sm_count() * enc->group;
        const size_t fit = workspace_bytes / sb;
        if ((size_t)slots > fit) slots = (long long)fit;
        enc->slots = (int)slots;
        e = cudaMalloc((void **)&enc->back, (size_t)enc->slots * 256 * ((size_t)1 << (16 - K)));
        if (e == cudaSuccess && gcost)
            e = cudaMalloc((void **)&enc->cost, (size_t)enc->slots * 2 * ((size_t)1 << (16 - K)) * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&enc->tab, 1024 * sizeof(float));
        if (e != cudaSuccess) rc = cuda_status(e, "viterbi: workspace");
    }
    if (rc == SPARQ_OK) {
        float tab[1024];
        mul1_by_bytesum(tab);
        e = cudaMemcpy(enc->tab, tab, sizeof tab, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cuda_status(e, "viterbi: codebook upload");
    }
    if (rc != SPARQ_OK) {
        trellis_cuda_enc_free(enc);
        return rc;
    }
    *out = enc;
    return SPARQ_OK;
}

extern "C" int trellis_cuda_enc_slots(const trellis_cuda_enc *enc) { return enc->slots; }
extern "C" int trellis_cuda_enc_costs_in_shared(const trellis_cuda_enc *enc) { return !enc->gcost; }

extern "C" sparq_status trellis_cuda_encode_tiles(trellis_cuda_enc *enc, const float *x, const float *weight,
                                                  size_t n_tiles, uint16_t *states, float *decoded, float *err,
                                                  void *stream)
{
    if (n_tiles == 0) return SPARQ_OK;
    RETURN_IF(!x || !states, SPARQ_E_ARG, "cuda viterbi: no input or no output for %zu tiles", n_tiles);
    /* Launches of at most ENC_WAVES waves of the slots: a persistent grid holds every SM
     * until its last tile, so work on other streams (quantize --device cuda's CPU stage:
     * Hessian preparation, the scale search) gets SMs only between launches; a wave of
     * tiles is ~1.6 ms on an H200 at K = 3, so ~6 ms. Each tile is independent of the
     * others: splitting changes no result. */
    const size_t per_launch = (size_t)enc->slots * ENC_WAVES;
    for (size_t t0 = 0; t0 < n_tiles; t0 += per_launch) {
        const size_t n = n_tiles - t0 < per_launch ? n_tiles - t0 : per_launch;
        /* slots in use: one per tile up to the workspace's; a block holds enc->group of them */
        const int used = (size_t)enc->slots < n ? enc->slots : (int)n;
        const unsigned grid = (unsigned)((used + enc->group - 1) / enc->group);
        (weight ? enc->fn_w : enc->fn)<<<grid, enc->threads, enc->smem, (cudaStream_t)stream>>>(
            x + t0 * 256, weight ? weight + t0 * 256 : NULL, n, states + t0 * 256, decoded ? decoded + t0 * 256 : NULL,
            err ? err + t0 : NULL, enc->back, enc->cost, enc->tab, used);
        CUDA_RETURN_IF(cudaGetLastError(), "viterbi K=%d %s: launch of %zu tiles", enc->K,
                       trellis_cb_name((trellis_codebook)enc->cb), n);
    }
    return SPARQ_OK;
}

extern "C" sparq_status trellis_cuda_encode_tiles_host(trellis_cuda_enc *enc, const float *x, const float *weight,
                                                       size_t n_tiles, uint16_t *states, float *decoded, float *err,
                                                       double *sq_err)
{
    if (sq_err) *sq_err = 0;
    if (n_tiles == 0) return SPARQ_OK;
    /* chunks of several waves of the grid, so copies are a small part */
    size_t chunk = (size_t)enc->slots * 4;
    if (chunk < 4096) chunk = 4096;
    if (chunk > n_tiles) chunk = n_tiles;
    float *dx = NULL, *dw = NULL, *ddec = NULL, *derr = NULL;
    uint16_t *dst = NULL;
    float *herr = (float *)sparq_malloc(chunk * sizeof(float));
    sparq_status rc = herr ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "cuda viterbi: no memory for %zu errors", chunk);
    cudaError_t e = cudaSuccess;
    if (rc == SPARQ_OK) {
        e = cudaMalloc((void **)&dx, chunk * 256 * sizeof(float));
        if (e == cudaSuccess && weight) e = cudaMalloc((void **)&dw, chunk * 256 * sizeof(float));
        if (e == cudaSuccess && decoded) e = cudaMalloc((void **)&ddec, chunk * 256 * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&derr, chunk * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&dst, chunk * 256 * sizeof(uint16_t));
        if (e != cudaSuccess) rc = cuda_status(e, "viterbi: buffers");
    }
    double total = 0;
    for (size_t t0 = 0; rc == SPARQ_OK && t0 < n_tiles; t0 += chunk) {
        const size_t n = n_tiles - t0 < chunk ? n_tiles - t0 : chunk;
        e = cudaMemcpy(dx, x + t0 * 256, n * 256 * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess && weight)
            e = cudaMemcpy(dw, weight + t0 * 256, n * 256 * sizeof(float), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            rc = cuda_status(e, "viterbi: upload");
            break;
        }
        rc = trellis_cuda_encode_tiles(enc, dx, dw, n, dst, ddec, derr, NULL);
        if (rc != SPARQ_OK) break;
        e = cudaMemcpy(states + t0 * 256, dst, n * 256 * sizeof(uint16_t), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess && decoded)
            e = cudaMemcpy(decoded + t0 * 256, ddec, n * 256 * sizeof(float), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(herr, derr, n * sizeof(float), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            rc = cuda_status(e, "viterbi: encode or download");
            break;
        }
        for (size_t i = 0; i < n; i++) total += herr[i];
        if (err) memcpy(err + t0, herr, n * sizeof(float));
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(ddec);
    cudaFree(derr);
    cudaFree(dst);
    sparq_free(herr);
    if (rc == SPARQ_OK && sq_err) *sq_err = total;
    return rc;
}

extern "C" sparq_status trellis_cuda_enc_cb_values(trellis_codebook cb, float *out)
{
    RETURN_IF((unsigned)cb >= TRELLIS_CB_COUNT_, SPARQ_E_ARG, "cuda viterbi: unknown codebook %d", (int)cb);
    float tab[1024], *dtab = NULL;
    mul1_by_bytesum(tab);
    CUDA_RETURN_IF(cudaMalloc((void **)&dtab, sizeof tab), "viterbi: codebook table");
    cudaError_t e = cudaMemcpy(dtab, tab, sizeof tab, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        switch (cb) {
        case TRELLIS_CB_3INST: k_cb_values<CB_3INST><<<256, 256>>>(out, dtab); break;
        case TRELLIS_CB_MCG: k_cb_values<CB_MCG><<<256, 256>>>(out, dtab); break;
        default: k_cb_values<CB_MUL1><<<256, 256>>>(out, dtab); break;
        }
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaFree(dtab);
    CUDA_RETURN_IF(e, "viterbi: codebook values of %s", trellis_cb_name(cb));
    return SPARQ_OK;
}
