/* kernels/cuda/trellis.cu — the EXL3 trellis kernels behind the C API of
 * trellis_cuda.h, and the lab versions next to them (kernels/cuda/lab/
 * README.md; trellis_cuda_gemm runs v10, the balanced kernel below with the
 * lab options of trellis_decode.cuh and programmatic dependent launch;
 * trellis_cuda_moe_forward runs MoE lab v17, trellis_fused.cuh's block body
 * in two launches with one-wave grids).
 *
 * A GEMM y = x·W (1..16 rows) is three launches on one stream:
 *  1. input:  u = fp16(had128(x ⊙ suh)), one 128-thread block per 128
 *             inputs and row;
 *  2. main:   t += u·Q, one warp per (NW adjacent tile columns, k-split):
 *             per k tile each lane loads its three ring words per column,
 *             decodes 8 values in registers (trellis_decode.cuh) straight
 *             into mma.m16n8k16 B fragments, and issues two mma.sync per
 *             tile with u as the A operand (batch rows = mma rows, so 1..16
 *             rows cost the same decode); partial sums go to t with fp32
 *             atomics;
 *  3. output: y = had128(t) ⊙ svh, and t is zeroed again for the next call.
 * The decode dominates: per weight about four (v10) to five (v2) integer/fp16
 * instructions, so at K ≤ 4 the main kernel is bound by the integer issue
 * rate, not by memory.
 *
 * Decode-only (trellis_cuda_decode_inner) uses the same lane decode and
 * scatters each lane's 8 values into the 16×16 tile. */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_cuda_lab.h"
#include "kernels/cuda/trellis_decode.cuh"
#include "kernels/cuda/trellis_fused.cuh"

using namespace trellis_dev;

/* --- errors ------------------------------------------------------------------ */

static sparq_status cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return SPARQ_OK;
    return sparq_err(e == cudaErrorMemoryAllocation ? SPARQ_E_NOMEM : SPARQ_E_STATE, "cuda: %s: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CUDA_RETURN_IF(expr, ...)                                                  \
    do {                                                                           \
        cudaError_t e_ = (expr);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            char what_[256];                                                       \
            snprintf(what_, sizeof what_, __VA_ARGS__);                            \
            return cuda_status(e_, what_);                                         \
        }                                                                          \
    } while (0)

/* --- kernels ------------------------------------------------------------------- */

/* u[r·k + i] = fp16(had128(x ⊙ suh)); grid (k/128, rows), 128 threads.
 * PDL: let the main kernel start at once (it waits for u itself). */
template <bool PDL = false>
__global__ void __launch_bounds__(128) k_input(const float *__restrict__ x, const __half *__restrict__ suh,
                                               __half *__restrict__ u, int k)
{
    __shared__ float sm[128];
    if constexpr (PDL) griddep_launch();
    const size_t i = (size_t)blockIdx.x * 128 + threadIdx.x, r = blockIdx.y;
    float v = x[r * k + i] * __half2float(suh[i]);
    v = had128_block(v, sm);
    u[r * k + i] = __float2half_rn(v);
}

/* y[r·n + j] = had128(t)[j] ⊙ svh[j], then t = 0; grid (n/128, rows).
 * PDL: launched early, waits for the main kernel before reading t. */
template <bool PDL = false>
__global__ void __launch_bounds__(128) k_output(float *__restrict__ t, const __half *__restrict__ svh,
                                                float *__restrict__ y, int n)
{
    __shared__ float sm[128];
    if constexpr (PDL) griddep_wait();
    const size_t j = (size_t)blockIdx.x * 128 + threadIdx.x, r = blockIdx.y;
    float v = t[r * n + j];
    t[r * n + j] = 0.0f;
    v = had128_block(v, sm);
    y[r * n + j] = v * __half2float(svh[j]);
}

/* Q → fp16 (k×n row-major), one warp per tile, 8 tiles per 256-thread block;
 * D = the lab decode options (trellis_decode.cuh), 0 for the real one. */
template <int K, int CB, int D = 0>
__global__ void __launch_bounds__(256) k_decode(const uint32_t *__restrict__ trellis, __half *__restrict__ q,
                                                int k, int n)
{
    const int lane = threadIdx.x & 31;
    const size_t tile = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int ntiles = n >> 4;
    if (tile >= (size_t)(k >> 4) * ntiles) return;
    const size_t kt = tile / ntiles, nt = tile % ntiles;
    const lane_ring lr = lane_ring_make(K, lane);
    const uint32_t *p = trellis + tile * (8 * K);
    constexpr int NWD = lane_nwords<K, D>();
    uint32_t w[NWD], v[4], sel0 = 0, sel1 = 0;
    w[0] = __ldg(p + lr.o0);
    w[1] = __ldg(p + lr.o1);
    if constexpr (NWD == 3) w[NWD - 1] = __ldg(p + lr.o2);
    if constexpr ((D & DEC_IMMA) != 0) imma_sel_make(lane, sel0, sel1);
    lane_decode_w<K, CB, D, NWD>(w, lr.r, sel0, sel1, 1u, v);
    const int g = lane >> 2, c = lane & 3;
    __half *base = q + (16 * kt) * n + 16 * nt + g;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int row = 2 * c + (i & 1) + 8 * ((i >> 1) & 1), col = 8 * (i >> 2);
        const uint32_t pair = v[i >> 1];
        const uint16_t bits = (i & 1) ? (uint16_t)(pair >> 16) : (uint16_t)(pair & 0xFFFF);
        base[(size_t)row * n + col] = __ushort_as_half(bits);
    }
}

/* t += u·Q for one (group of NW tile columns, k split) per warp; u is fp16
 * rows×k read as half2 words. chunk (k tiles per warp) is a multiple of U. */
template <int K, int CB, int NW, int U>
__global__ void __launch_bounds__(256) k_gemm(const uint32_t *__restrict__ trellis,
                                              const uint32_t *__restrict__ u2, float *__restrict__ t, int k,
                                              int n, int rows, int chunk)
{
    constexpr int TW = 8 * K; /* 32-bit words per tile */
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW;
    const int grp = warp % ngroups, split = warp / ngroups;
    const int kt0 = split * chunk;
    if (kt0 >= ktiles) return;
    const int kt1 = min(kt0 + chunk, ktiles);
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const uint32_t *p = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool lo_ok = g < rows, hi_ok = g + 8 < rows;
    const uint32_t *ua = u2 + (((size_t)g * k) >> 1) + c;
    const uint32_t *ub = u2 + (((size_t)(g + 8) * k) >> 1) + c;
    float acc[NW][2][4];
    acc_zero<NW>(acc);
    for (int kt = kt0; kt < kt1; kt += U) {
        uint32_t w[U][NW][3], a[U][4];
        words_load<K, NW, U>(p + (size_t)(kt - kt0) * row_stride, row_stride, lr, w);
#pragma unroll
        for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
        for (int s = 0; s < U; s++) tiles_mma<K, CB, NW>(w[s], lr.r, a[s], acc);
    }
    acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
}

/* v4 ("balanced"): v2's loop, but a grid of exactly the resident warps, each
 * taking an equal share of the flattened work (tile-column group major, then
 * steps of 4 k tiles), flushing its accumulators with atomics whenever it
 * crosses into the next column group: no partial last wave. TPB threads per
 * block, MINB = blocks per SM the register budget is set for
 * (__launch_bounds__). D = the lab options of v6+ (trellis_decode.cuh:
 * DEC_2W two ring words per lane at K ≤ 4, DEC_IMMA tensor-core byte sums for
 * mul1, DEC_PF next step's words loaded before the current step's decode,
 * DEC_FMA masks on the FMA pipe; one = 1, see lane_state_d); D = 0 is v4. */
template <int K, int CB, int MINB, int TPB, int D = 0>
__global__ void __launch_bounds__(TPB, MINB) k_gemm_bal(const uint32_t *__restrict__ trellis,
                                                        const uint32_t *__restrict__ u2, float *__restrict__ t,
                                                        int k, int n, int rows, int total_warps, uint32_t one)
{
    constexpr int NW = (D & DEC_NW4) ? 4 : 2, U = (D & DEC_NW4) ? 2 : 4, TW = 8 * K, NWD = lane_nwords<K, D>();
    if constexpr ((D & DEC_PDL) != 0) griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW, spg = ktiles / U;
    const long long total = (long long)ngroups * spg;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool lo_ok = g < rows, hi_ok = g + 8 < rows;
    const uint32_t *ua = u2 + (((size_t)g * k) >> 1) + c;
    const uint32_t *ub = u2 + (((size_t)(g + 8) * k) >> 1) + c;
    uint32_t sel0 = 0, sel1 = 0;
    if constexpr ((D & DEC_IMMA) != 0) imma_sel_make(lane, sel0, sel1);
    bool waited = (D & DEC_PDL) == 0; /* PDL: u is read only after griddep_wait */
    while (q < q1) {
        const int grp = (int)(q / spg);
        const long long qend = min(q1, (long long)(grp + 1) * spg);
        const uint32_t *p = trellis + (size_t)grp * NW * TW;
        float acc[NW][2][4];
        acc_zero<NW>(acc);
        uint32_t w[U][NW][NWD];
        if constexpr ((D & DEC_PF) != 0)
            words_load<K, NW, U, NWD>(p + (size_t)(q - (long long)grp * spg) * U * row_stride, row_stride, lr, w);
        if (!waited) {
            griddep_wait();
            waited = true;
        }
        for (; q < qend; q++) {
            const int kt = (int)(q - (long long)grp * spg) * U;
            uint32_t a[U][4];
            if constexpr ((D & DEC_PF) != 0) {
                uint32_t wn[U][NW][NWD];
                /* the next step's words (the last step reloads its own: no branch) */
                const int ktn = q + 1 < qend ? kt + U : kt;
                words_load<K, NW, U, NWD>(p + (size_t)ktn * row_stride, row_stride, lr, wn);
#pragma unroll
                for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
                for (int s = 0; s < U; s++) tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a[s], acc, sel0, sel1, one);
                words_copy<NW, U, NWD>(w, wn);
            } else {
                words_load<K, NW, U, NWD>(p + (size_t)kt * row_stride, row_stride, lr, w);
#pragma unroll
                for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
                for (int s = 0; s < U; s++) tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a[s], acc, sel0, sel1, one);
            }
        }
        acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
    }
}

/* --- dispatch ----------------------------------------------------------------------
 * Kernels are templates on K (1..8) and the codebook; with_k_cb turns the
 * run-time pair into compile-time constants once for every kernel family. */

template <int V>
using ic = std::integral_constant<int, V>;

template <int K, typename F>
static auto with_cb(int cb, F &&f) -> decltype(f(ic<1>{}, ic<0>{}))
{
    switch (cb) {
    case CB_3INST: return f(ic<K>{}, ic<CB_3INST>{});
    case CB_MCG: return f(ic<K>{}, ic<CB_MCG>{});
    case CB_MUL1: return f(ic<K>{}, ic<CB_MUL1>{});
    default: return {};
    }
}

/* f(ic<K>, ic<CB>) for run-time K and cb; a value-initialised result (NULL) if
 * either is out of range. */
template <typename F>
static auto with_k_cb(int K, int cb, F &&f) -> decltype(f(ic<1>{}, ic<0>{}))
{
    switch (K) {
    case 1: return with_cb<1>(cb, f);
    case 2: return with_cb<2>(cb, f);
    case 3: return with_cb<3>(cb, f);
    case 4: return with_cb<4>(cb, f);
    case 5: return with_cb<5>(cb, f);
    case 6: return with_cb<6>(cb, f);
    case 7: return with_cb<7>(cb, f);
    case 8: return with_cb<8>(cb, f);
    default: return {};
    }
}

typedef void (*gemm_fn)(const uint32_t *, const uint32_t *, float *, int, int, int, int);
typedef void (*bal_fn)(const uint32_t *, const uint32_t *, float *, int, int, int, int, uint32_t);
typedef void (*decode_fn)(const uint32_t *, __half *, int, int);
typedef void (*fused_fn)(const uint32_t *, const float *, const __half *, const __half *, float *, unsigned *,
                         float *, int, int, int, int);
typedef void (*moe_gu_fn)(moe_proj, moe_proj, const int *, const float *, float *, float *, unsigned *, int, int,
                          int, int);
typedef void (*moe_down_fn)(moe_proj, const int *, const float *, const float *, float *, float *, unsigned *, int,
                            int, int, int);

/* v2 shapes: (2,4) and (1,8) for every K and codebook, the other lab shapes
 * for mul1 at K = 2..4 only (compile time). */
static gemm_fn gemm_pick(int K, int cb, int nw, int unroll)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> gemm_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if (nw == 2 && unroll == 4) return k_gemm<KK, CC, 2, 4>;
        if (nw == 1 && unroll == 8) return k_gemm<KK, CC, 1, 8>;
        if constexpr (CC == CB_MUL1 && KK >= 2 && KK <= 4) {
            if (nw == 1 && unroll == 4) return k_gemm<KK, CC, 1, 4>;
            if (nw == 2 && unroll == 8) return k_gemm<KK, CC, 2, 8>;
            if (nw == 4 && unroll == 4) return k_gemm<KK, CC, 4, 4>;
        }
        return NULL;
    });
}

/* v4: minb 2 (256 threads) everywhere; 3 (256 threads), 5, 6 (128 threads) for
 * mul1 at K = 2..4 only. */
static bal_fn bal_pick(int K, int cb, int minb)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> bal_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if (minb == 2) return k_gemm_bal<KK, CC, 2, 256>;
        if constexpr (CC == CB_MUL1 && KK >= 2 && KK <= 4) {
            if (minb == 3) return k_gemm_bal<KK, CC, 3, 256>;
            if (minb == 5) return k_gemm_bal<KK, CC, 5, 128>;
            if (minb == 6) return k_gemm_bal<KK, CC, 6, 128>;
        }
        return NULL;
    });
}

/* Lab versions v6..v8, v10, v12: the balanced kernel with the lab options D
 * (trellis_decode.cuh), every K and codebook; -1 for another version. */
static int lab_version_opts(int version)
{
    switch (version) {
    case 6: return DEC_2W | DEC_PF;
    case 7: return DEC_2W | DEC_PF | DEC_IMMA;
    case 8: return DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA;
    case 10: return DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA | DEC_PDL;
    case 12: return DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA | DEC_PDL | DEC_NW4;
    default: return -1;
    }
}

static bal_fn lab_pick(int K, int cb, int version)
{
    const int d = lab_version_opts(version);
    return with_k_cb(K, cb, [&](auto k, auto c) -> bal_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        constexpr int V8 = DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA;
        switch (d) {
        case DEC_2W | DEC_PF: return k_gemm_bal<KK, CC, 2, 256, DEC_2W | DEC_PF>;
        case DEC_2W | DEC_PF | DEC_IMMA: return k_gemm_bal<KK, CC, 2, 256, DEC_2W | DEC_PF | DEC_IMMA>;
        case V8: return k_gemm_bal<KK, CC, 2, 256, V8>;
        case V8 | DEC_PDL: return k_gemm_bal<KK, CC, 2, 256, V8 | DEC_PDL>;
        case V8 | DEC_PDL | DEC_NW4: return k_gemm_bal<KK, CC, 2, 256, V8 | DEC_PDL | DEC_NW4>;
        default: return NULL;
        }
    });
}

/* v3 (version 3), v9 (v3 with v7's decode) or v11 (v3 with v8's decode). */
static fused_fn fused_pick(int K, int cb, int version = 3)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> fused_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if (version == 9) return k_gemm_fused<KK, CC, 4, DEC_2W | DEC_IMMA>;
        if (version == 11) return k_gemm_fused<KK, CC, 4, DEC_2W | DEC_IMMA | DEC_FMA>;
        return version == 3 ? k_gemm_fused<KK, CC, 4> : NULL;
    });
}

/* The real decode (version 0), or the decode of lab version 6..9. */
static decode_fn decode_pick(int K, int cb, int version = 0)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> decode_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        switch (version) {
        case 0: return k_decode<KK, CC>;
        case 6: return k_decode<KK, CC, DEC_2W>;
        case 7:
        case 9: return k_decode<KK, CC, DEC_2W | DEC_IMMA>;
        case 8:
        case 10:
        case 11:
        case 12: return k_decode<KK, CC, DEC_2W | DEC_IMMA | DEC_FMA>;
        default: return NULL;
        }
    });
}

/* MoE lab versions (kernels/cuda/lab/README.md): 5 = round 1 (v3's body),
 * 13 = v9's decode, 14 = 13 + programmatic dependent launch of the down
 * launch, 15 = v11's decode + PDL, 16 = 5 + PDL, 17 / 18 = 14 with the
 * chunk fitted to one / two waves of resident blocks (moe_chunk_fit), 19 =
 * 16 with 17's chunk; -1 for another version. */
static int moe_version_opts(int version)
{
    switch (version) {
    case 5: return 0;
    case 13: return DEC_2W | DEC_IMMA;
    case 14: return DEC_2W | DEC_IMMA | DEC_PDL;
    case 15: return DEC_2W | DEC_IMMA | DEC_FMA | DEC_PDL;
    case 16: return DEC_PDL;
    case 17:
    case 18: return DEC_2W | DEC_IMMA | DEC_PDL;
    case 19: return DEC_PDL;
    default: return -1;
    }
}

/* The version trellis_cuda_moe_forward runs, and its options (instantiated
 * for every K and codebook; the other versions for mul1 at K = 2..4 only). */
#define MOE_DEFAULT_VERSION 17
#define MOE_DEFAULT_D (DEC_2W | DEC_IMMA | DEC_PDL)

template <int KK, int CC, int D>
static void moe_pick_d(moe_gu_fn *gu, moe_down_fn *down)
{
    if constexpr (D == MOE_DEFAULT_D || (CC == CB_MUL1 && KK >= 2 && KK <= 4)) {
        *gu = k_moe_gate_up<KK, CC, 4, D>;
        *down = k_moe_down<KK, CC, 4, D>;
    }
}

static void moe_pick(int K, int cb, int version, moe_gu_fn *gu, moe_down_fn *down)
{
    *gu = NULL;
    *down = NULL;
    const int d = moe_version_opts(version);
    with_k_cb(K, cb, [&](auto k, auto c) -> int {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        switch (d) {
        case 0: moe_pick_d<KK, CC, 0>(gu, down); break;
        case DEC_2W | DEC_IMMA: moe_pick_d<KK, CC, DEC_2W | DEC_IMMA>(gu, down); break;
        case DEC_2W | DEC_IMMA | DEC_PDL: moe_pick_d<KK, CC, DEC_2W | DEC_IMMA | DEC_PDL>(gu, down); break;
        case DEC_2W | DEC_IMMA | DEC_FMA | DEC_PDL:
            moe_pick_d<KK, CC, DEC_2W | DEC_IMMA | DEC_FMA | DEC_PDL>(gu, down);
            break;
        case DEC_PDL: moe_pick_d<KK, CC, DEC_PDL>(gu, down); break;
        default: break;
        }
        return 0;
    });
}

/* --- handles ---------------------------------------------------------------------- */

struct trellis_cuda_linear {
    int k, n, K, cb;
    char name[96];
    uint32_t *trellis; /* (k/16)·(n/16) tiles of 8K words */
    __half *suh, *svh;
    __half *q;                /* decoded Q for the prefill path, or NULL */
    cublasHandle_t cublas;    /* created by the first prefill, or NULL */
};

struct trellis_cuda_ws {
    int max_k, max_n;
    __half *u; /* 16 × max_k */
    float *t;  /* 16 × max_n, zero between calls */
    unsigned *counters; /* one per 256 outputs (v3), zero between calls */
};

static int sm_count(void)
{
    static int cached = 0;
    if (!cached) {
        int dev = 0, n = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0)
            cached = n;
        else
            cached = 132;
    }
    return cached;
}

extern "C" {

int trellis_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

sparq_status trellis_cuda_alloc(void **dev, size_t bytes)
{
    RETURN_IF(!dev, SPARQ_E_ARG, "cuda alloc: no output pointer");
    *dev = NULL;
    CUDA_RETURN_IF(cudaMalloc(dev, bytes ? bytes : 1), "cudaMalloc of %zu bytes", bytes);
    return SPARQ_OK;
}

void trellis_cuda_free(void *dev)
{
    if (dev) cudaFree(dev);
}

sparq_status trellis_cuda_upload(void *dev, const void *host, size_t bytes)
{
    CUDA_RETURN_IF(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "upload of %zu bytes", bytes);
    return SPARQ_OK;
}

sparq_status trellis_cuda_download(void *host, const void *dev, size_t bytes)
{
    CUDA_RETURN_IF(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "download of %zu bytes", bytes);
    return SPARQ_OK;
}

sparq_status trellis_cuda_sync(void *stream)
{
    CUDA_RETURN_IF(cudaStreamSynchronize((cudaStream_t)stream), "stream synchronize");
    CUDA_RETURN_IF(cudaGetLastError(), "kernel error");
    return SPARQ_OK;
}

void trellis_cuda_linear_free(trellis_cuda_linear *lin)
{
    if (!lin) return;
    cudaFree(lin->trellis);
    cudaFree(lin->suh);
    cudaFree(lin->svh);
    cudaFree(lin->q);
    if (lin->cublas) cublasDestroy(lin->cublas);
    free(lin);
}

sparq_status trellis_cuda_linear_upload(const trellis_linear *host, const char *name, trellis_cuda_linear **out)
{
    RETURN_IF(!out, SPARQ_E_ARG, "cuda linear upload: no output handle");
    *out = NULL;
    FORWARD_IF(trellis_linear_check(host, name));
    trellis_cuda_linear *lin = (trellis_cuda_linear *)calloc(1, sizeof *lin);
    RETURN_IF(!lin, SPARQ_E_NOMEM, "%s: no memory for a CUDA linear handle", name ? name : "linear");
    lin->k = host->k;
    lin->n = host->n;
    lin->K = host->K;
    lin->cb = (int)host->cb;
    snprintf(lin->name, sizeof lin->name, "%s", name ? name : "linear");
    const size_t tbytes = (size_t)host->k / 16 * (host->n / 16) * 32 * host->K;
    sparq_status st = SPARQ_OK;
    cudaError_t e = cudaMalloc((void **)&lin->trellis, tbytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&lin->suh, (size_t)host->k * 2);
    if (e == cudaSuccess) e = cudaMalloc((void **)&lin->svh, (size_t)host->n * 2);
    if (e == cudaSuccess) e = cudaMemcpy(lin->trellis, host->trellis, tbytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(lin->suh, host->suh, (size_t)host->k * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(lin->svh, host->svh, (size_t)host->n * 2, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        char what[160];
        snprintf(what, sizeof what, "%s: upload of a %dx%d K=%d linear", lin->name, lin->k, lin->n, lin->K);
        st = cuda_status(e, what);
        trellis_cuda_linear_free(lin);
        return st;
    }
    *out = lin;
    return SPARQ_OK;
}

void trellis_cuda_linear_shape(const trellis_cuda_linear *lin, int *k, int *n, int *K)
{
    if (k) *k = lin ? lin->k : 0;
    if (n) *n = lin ? lin->n : 0;
    if (K) *K = lin ? lin->K : 0;
}

sparq_status trellis_cuda_ws_create(int max_k, int max_n, trellis_cuda_ws **out)
{
    RETURN_IF(!out, SPARQ_E_ARG, "cuda workspace: no output handle");
    *out = NULL;
    RETURN_IF(max_k <= 0 || max_n <= 0, SPARQ_E_ARG, "cuda workspace: bad size %d x %d", max_k, max_n);
    trellis_cuda_ws *ws = (trellis_cuda_ws *)calloc(1, sizeof *ws);
    RETURN_IF(!ws, SPARQ_E_NOMEM, "cuda workspace: no host memory");
    ws->max_k = max_k;
    ws->max_n = max_n;
    const size_t ub = (size_t)TRELLIS_GEMM_MAX_ROWS * max_k * 2, tb = (size_t)TRELLIS_GEMM_MAX_ROWS * max_n * 4;
    cudaError_t e = cudaMalloc((void **)&ws->u, ub);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->t, tb);
    if (e == cudaSuccess) e = cudaMemset(ws->u, 0, ub);
    if (e == cudaSuccess) e = cudaMemset(ws->t, 0, tb);
    const size_t cbytes = (size_t)(max_n + FUSED_COLS - 1) / FUSED_COLS * sizeof(unsigned);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->counters, cbytes);
    if (e == cudaSuccess) e = cudaMemset(ws->counters, 0, cbytes);
    if (e != cudaSuccess) {
        trellis_cuda_ws_free(ws);
        return cuda_status(e, "workspace allocation");
    }
    *out = ws;
    return SPARQ_OK;
}

void trellis_cuda_ws_free(trellis_cuda_ws *ws)
{
    if (!ws) return;
    cudaFree(ws->u);
    cudaFree(ws->t);
    cudaFree(ws->counters);
    free(ws);
}

sparq_status trellis_cuda_decode_inner(const trellis_cuda_linear *lin, uint16_t *q, void *stream)
{
    return trellis_cuda_decode_lab(lin, q, stream, 0);
}

sparq_status trellis_cuda_decode_lab(const trellis_cuda_linear *lin, uint16_t *q, void *stream, int version)
{
    RETURN_IF(!lin || !q, SPARQ_E_ARG, "cuda decode: missing linear or output");
    decode_fn fn = decode_pick(lin->K, lin->cb, version);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA decode for K=%d codebook %d (lab version %d)", lin->name,
              lin->K, lin->cb, version);
    const size_t tiles = (size_t)(lin->k / 16) * (lin->n / 16);
    fn<<<(unsigned)((tiles + 7) / 8), 256, 0, (cudaStream_t)stream>>>(lin->trellis, (__half *)q, lin->k, lin->n);
    CUDA_RETURN_IF(cudaGetLastError(), "%s: decode launch", lin->name);
    return SPARQ_OK;
}

/* The checks every GEMM entry point makes before launching. */
static sparq_status gemm_args_check(const trellis_cuda_linear *lin, const float *x, int rows, const float *y,
                                    const trellis_cuda_ws *ws)
{
    RETURN_IF(!lin || !x || !y || !ws, SPARQ_E_ARG, "cuda gemm: missing linear, input, output or workspace");
    RETURN_IF(rows < 1 || rows > TRELLIS_GEMM_MAX_ROWS, SPARQ_E_ARG, "%s: cuda gemm of %d rows, expected 1..%d",
              lin->name, rows, TRELLIS_GEMM_MAX_ROWS);
    RETURN_IF(lin->k > ws->max_k || lin->n > ws->max_n, SPARQ_E_ARG,
              "%s: %dx%d linear does not fit a %dx%d cuda workspace", lin->name, lin->k, lin->n, ws->max_k,
              ws->max_n);
    return SPARQ_OK;
}

/* Default kernel shape: see kernels/cuda/lab/README.md for how it was chosen. */
#define GEMM_DEFAULT_NW 2
#define GEMM_DEFAULT_UNROLL 4

sparq_status trellis_cuda_gemm_lab(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int nw, int unroll, int chunk,
                                   unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    if (nw <= 0) nw = GEMM_DEFAULT_NW;
    if (unroll <= 0) unroll = GEMM_DEFAULT_UNROLL;
    gemm_fn fn = gemm_pick(lin->K, lin->cb, nw, unroll);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm kernel for K=%d codebook %d (nw %d, unroll %d)",
              lin->name, lin->K, lin->cb, nw, unroll);
    cudaStream_t s = (cudaStream_t)stream;
    const int ktiles = lin->k / 16, ngroups = lin->n / 16 / nw;
    if (chunk <= 0) {
        const int target = sm_count() * 32; /* warps */
        int splits = (target + ngroups - 1) / ngroups;
        if (splits < 1) splits = 1;
        chunk = (ktiles + splits - 1) / splits;
    }
    chunk = (chunk + unroll - 1) / unroll * unroll;
    const int splits = (ktiles + chunk - 1) / chunk;
    const long warps = (long)ngroups * splits;
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        fn<<<(unsigned)((warps + 7) / 8), 256, 0, s>>>(lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k,
                                                        lin->n, rows, chunk);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: gemm launch (%ld warps, chunk %d)", lin->name, warps, chunk);
    }
    if (parts & TRELLIS_CUDA_PART_OUTPUT) {
        k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(ws->t, lin->svh, y, lin->n);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: output transform launch", lin->name);
    }
    return SPARQ_OK;
}

/* Largest k split of v3 (k tiles): bounds its shared memory to
 * 16 rows × (64·8 + 4) · 4 B = 33 KB, under the 48 KB static limit. */
#define FUSED_MAX_CHUNK 64

static sparq_status gemm_fused_run(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int chunk, int version)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    fused_fn fn = fused_pick(lin->K, lin->cb, version);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm kernel for K=%d codebook %d", lin->name, lin->K, lin->cb);
    const int ktiles = lin->k / 16, nbc = (lin->n + FUSED_COLS - 1) / FUSED_COLS;
    if (chunk <= 0) {
        const int target = sm_count() * 4; /* blocks of 8 warps: ~32 warps per SM */
        const int splits = (target + nbc - 1) / nbc;
        chunk = (ktiles + splits - 1) / splits;
    }
    chunk = (chunk + 7) / 8 * 8;
    if (chunk > FUSED_MAX_CHUNK) chunk = FUSED_MAX_CHUNK;
    const int splits = (ktiles + chunk - 1) / chunk;
    const size_t smem = fused_smem_bytes(chunk, rows);
    fn<<<(unsigned)(nbc * splits), 256, smem, (cudaStream_t)stream>>>(
        lin->trellis, x, lin->suh, lin->svh, ws->t, ws->counters, y, lin->k, lin->n, rows, chunk);
    CUDA_RETURN_IF(cudaGetLastError(), "%s: fused gemm launch (%d blocks, chunk %d)", lin->name, nbc * splits,
                   chunk);
    return SPARQ_OK;
}

sparq_status trellis_cuda_gemm_v3(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                  trellis_cuda_ws *ws, void *stream, int chunk)
{
    return gemm_fused_run(lin, x, rows, y, ws, stream, chunk, 3);
}

/* The three launches of v4 and v6+ around a balanced main kernel fn (TPB
 * threads per block): grid = the resident warps, at most one per work item. */
static sparq_status gemm_bal_launch(const trellis_cuda_linear *lin, bal_fn fn, int tpb, const float *x, int rows,
                                    float *y, trellis_cuda_ws *ws, void *stream, unsigned parts, bool pdl = false)
{
    const int wpb = tpb / 32;
    int per_sm = 0;
    CUDA_RETURN_IF(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, tpb, 0), "%s: occupancy query",
                   lin->name);
    if (per_sm < 1) per_sm = 1;
    /* no more warps than work items (steps of 4 k tiles × column pairs) */
    const long long items = (long long)(lin->n / 32) * (lin->k / 64);
    long long warps = (long long)per_sm * sm_count() * wpb;
    if (warps > items) warps = items;
    const int blocks = (int)((warps + wpb - 1) / wpb);
    warps = (long long)blocks * wpb;
    cudaStream_t s = (cudaStream_t)stream;
    if (pdl) {
        /* main and output may start before their predecessor ends (they wait
         * with griddepcontrol.wait before reading its results) */
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        if (parts & TRELLIS_CUDA_PART_INPUT) {
            k_input<true><<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
            CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
        }
        if (parts & TRELLIS_CUDA_PART_MAIN) {
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(tpb);
            CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fn, lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k, lin->n,
                                              rows, (int)warps, 1u),
                           "%s: balanced gemm launch (%d blocks, PDL)", lin->name, blocks);
        }
        if (parts & TRELLIS_CUDA_PART_OUTPUT) {
            cfg.gridDim = dim3(lin->n / 128, rows);
            cfg.blockDim = dim3(128);
            CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_output<true>, ws->t, (const __half *)lin->svh, y, lin->n),
                           "%s: output transform launch (PDL)", lin->name);
        }
        return SPARQ_OK;
    }
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        fn<<<blocks, tpb, 0, s>>>(lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k, lin->n, rows, (int)warps, 1u);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: balanced gemm launch (%d blocks)", lin->name, blocks);
    }
    if (parts & TRELLIS_CUDA_PART_OUTPUT) {
        k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(ws->t, lin->svh, y, lin->n);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: output transform launch", lin->name);
    }
    return SPARQ_OK;
}

sparq_status trellis_cuda_gemm_bal(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int minb, unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    if (minb <= 0) minb = 2;
    bal_fn fn = bal_pick(lin->K, lin->cb, minb);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no balanced CUDA gemm for K=%d codebook %d (%d blocks/SM)", lin->name,
              lin->K, lin->cb, minb);
    return gemm_bal_launch(lin, fn, minb >= 5 ? 128 : 256, x, rows, y, ws, stream, parts);
}

sparq_status trellis_cuda_gemm_labv(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                    trellis_cuda_ws *ws, void *stream, int version, unsigned parts)
{
    if (version == 9 || version == 11) return gemm_fused_run(lin, x, rows, y, ws, stream, 0, version);
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    bal_fn fn = lab_pick(lin->K, lin->cb, version);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm lab version %d for K=%d codebook %d", lin->name, version,
              lin->K, lin->cb);
    return gemm_bal_launch(lin, fn, 256, x, rows, y, ws, stream, parts, (lab_version_opts(version) & DEC_PDL) != 0);
}

/* trellis_cuda_gemm runs lab version v10 (kernels/cuda/lab/README.md; run 9
 * in docs/benchmarks-cuda.md): three launches overlapped by programmatic
 * dependent launch, a balanced main grid and v8's decode. It was the fastest
 * version on 17 of the 18 benchmark rows (v3 was 0.56 µs faster on 2304×5120
 * K=2) and faster than the previous default (v3 / v4) on the same 17. */
sparq_status trellis_cuda_gemm(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                               trellis_cuda_ws *ws, void *stream)
{
    RETURN_IF(!lin, SPARQ_E_ARG, "cuda gemm: no linear");
    return trellis_cuda_gemm_labv(lin, x, rows, y, ws, stream, 10, TRELLIS_CUDA_PART_ALL);
}

sparq_status trellis_cuda_gemm_prefill(trellis_cuda_linear *lin, const float *x, int rows, float *y, void *stream)
{
    RETURN_IF(!lin || !x || !y || rows < 1, SPARQ_E_ARG, "cuda prefill: bad arguments (%d rows)", rows);
    cudaStream_t s = (cudaStream_t)stream;
    if (!lin->q) {
        CUDA_RETURN_IF(cudaMalloc((void **)&lin->q, (size_t)lin->k * lin->n * 2), "%s: decoded copy (%dx%d fp16)",
                       lin->name, lin->k, lin->n);
        sparq_status st = trellis_cuda_decode_inner(lin, (uint16_t *)lin->q, stream);
        if (st != SPARQ_OK) {
            cudaFree(lin->q);
            lin->q = NULL;
            return st;
        }
    }
    if (!lin->cublas)
        RETURN_IF(cublasCreate(&lin->cublas) != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasCreate failed",
                  lin->name);
    cublasSetStream(lin->cublas, s);
    __half *u = NULL;
    float *t = NULL;
    CUDA_RETURN_IF(cudaMallocAsync((void **)&u, (size_t)rows * lin->k * 2, s), "%s: prefill input buffer", lin->name);
    cudaError_t e = cudaMallocAsync((void **)&t, (size_t)rows * lin->n * 4, s);
    if (e != cudaSuccess) {
        cudaFreeAsync(u, s);
        return cuda_status(e, "prefill output buffer");
    }
    k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, u, lin->k);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t cs =
        cublasGemmEx(lin->cublas, CUBLAS_OP_N, CUBLAS_OP_N, lin->n, rows, lin->k, &one, lin->q, CUDA_R_16F, lin->n,
                     u, CUDA_R_16F, lin->k, &zero, t, CUDA_R_32F, lin->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(t, lin->svh, y, lin->n);
    e = cudaGetLastError();
    cudaFreeAsync(u, s);
    cudaFreeAsync(t, s);
    RETURN_IF(cs != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasGemmEx failed (status %d)", lin->name, (int)cs);
    return cuda_status(e, "prefill launch");
}

/* --- fused MoE decode layer ------------------------------------------------------------ */

struct trellis_cuda_moe {
    int n_experts, hidden, inter, K, cb, max_tokens, top_k;
    moe_proj proj[3];   /* gate, up, down: device pointer tables */
    void *tables;       /* one device allocation behind the nine tables */
    float *gu;          /* pairs × 2 × inter */
    float *t_gu;        /* pairs × 2 × inter, zero between calls */
    float *t_down;      /* pairs × hidden, zero between calls */
    unsigned *c_gu, *c_down;
    /* moe_chunk_fit's answers by [version − 17][launch: 0 gate/up, 1 down]
     * [tokens] (0 = not asked yet): the occupancy query runs once */
    int chunk_fit[3][2][TRELLIS_GEMM_MAX_ROWS + 1];
};

/* k tiles per block for n_jobs fused GEMVs of shape (k, n): about 4 blocks of
 * 8 warps per SM in all, a multiple of 8, at most FUSED_MAX_CHUNK. */
static int fused_chunk(int k, int n, int n_jobs)
{
    const int ktiles = k / 16, nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const long long per_split = (long long)nbc * n_jobs;
    long long splits = (sm_count() * 4LL + per_split - 1) / per_split;
    if (splits < 1) splits = 1;
    int chunk = (int)((ktiles + splits - 1) / splits);
    chunk = (chunk + 7) / 8 * 8;
    return chunk > FUSED_MAX_CHUNK ? FUSED_MAX_CHUNK : chunk;
}

/* MoE lab v17 (the default), v18, v19: k tiles per block fitted to the
 * resident blocks of the kernel fn (occupancy query: `cap` blocks at once on
 * the whole GPU), so the last wave is not a sliver (round 1's fused_chunk gave 540 blocks = 2.05
 * waves for DeepSeek's gate/up). max_waves 1 (v17): the most splits whose
 * blocks all fit at once; 2 (v18): the split count that fills the slots of
 * ≤ 2 waves best (ties: more blocks). Rows are 1..16 tokens' worth of one
 * row each, so shared memory stays small: chunk ≤ MOE_MAX_CHUNK. */
#define MOE_MAX_CHUNK 512
static int moe_chunk_fit(const void *fn, int k, int n, int n_jobs, int max_waves)
{
    const int ktiles = k / 16, nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const long long per_split = (long long)nbc * n_jobs;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, fused_smem_bytes(MOE_MAX_CHUNK, 1)) !=
            cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        per_sm = 1;
    }
    const long long cap = (long long)per_sm * sm_count();
    int best = ((ktiles + 7) / 8) * 8;
    double best_fill = -1.0;
    long long best_blocks = 0;
    for (int chunk = 8; chunk <= ktiles + 7 && chunk <= MOE_MAX_CHUNK; chunk += 8) {
        const long long blocks = per_split * ((ktiles + chunk - 1) / chunk);
        const long long waves = (blocks + cap - 1) / cap;
        if (waves > max_waves) continue;
        const double fill = (double)blocks / (double)(waves * cap);
        if (fill > best_fill + 1e-9 || (fill > best_fill - 1e-9 && blocks > best_blocks)) {
            best_fill = fill;
            best_blocks = blocks;
            best = chunk;
        }
    }
    if (best > MOE_MAX_CHUNK) best = MOE_MAX_CHUNK;
    return best;
}

void trellis_cuda_moe_free(trellis_cuda_moe *m)
{
    if (!m) return;
    cudaFree(m->tables);
    cudaFree(m->gu);
    cudaFree(m->t_gu);
    cudaFree(m->t_down);
    cudaFree(m->c_gu);
    cudaFree(m->c_down);
    free(m);
}

sparq_status trellis_cuda_moe_create(trellis_cuda_linear *const *gate, trellis_cuda_linear *const *up,
                                     trellis_cuda_linear *const *down, int n_experts, int max_tokens, int top_k,
                                     trellis_cuda_moe **out)
{
    RETURN_IF(!out || !gate || !up || !down, SPARQ_E_ARG, "cuda moe: missing expert tables or output");
    *out = NULL;
    RETURN_IF(n_experts < 1 || max_tokens < 1 || max_tokens > TRELLIS_GEMM_MAX_ROWS || top_k < 1 ||
                  top_k > n_experts,
              SPARQ_E_ARG, "cuda moe: %d experts, %d tokens, top-%d (tokens 1..%d, top-k ≤ experts)", n_experts,
              max_tokens, top_k, TRELLIS_GEMM_MAX_ROWS);
    const trellis_cuda_linear *g0 = gate[0];
    RETURN_IF(!g0, SPARQ_E_ARG, "cuda moe: expert 0 has no gate projection");
    const int hidden = g0->k, inter = g0->n;
    for (int e = 0; e < n_experts; e++) {
        const trellis_cuda_linear *l[3] = {gate[e], up[e], down[e]};
        for (int j = 0; j < 3; j++) {
            RETURN_IF(!l[j], SPARQ_E_ARG, "cuda moe: expert %d lacks its %s projection", e,
                      j == 0 ? "gate" : j == 1 ? "up" : "down");
            const int wk = j == 2 ? inter : hidden, wn = j == 2 ? hidden : inter;
            RETURN_IF(l[j]->k != wk || l[j]->n != wn || l[j]->K != g0->K || l[j]->cb != g0->cb, SPARQ_E_SHAPE,
                      "cuda moe: %s is %dx%d K=%d codebook %d, expected %dx%d K=%d codebook %d like %s",
                      l[j]->name, l[j]->k, l[j]->n, l[j]->K, l[j]->cb, wk, wn, g0->K, g0->cb, g0->name);
        }
    }
    trellis_cuda_moe *m = (trellis_cuda_moe *)calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "cuda moe: no host memory");
    m->n_experts = n_experts;
    m->hidden = hidden;
    m->inter = inter;
    m->K = g0->K;
    m->cb = g0->cb;
    m->max_tokens = max_tokens;
    m->top_k = top_k;
    const size_t E = (size_t)n_experts, pairs = (size_t)max_tokens * top_k;
    const size_t nbc_gu = (inter + FUSED_COLS - 1) / FUSED_COLS, nbc_d = (hidden + FUSED_COLS - 1) / FUSED_COLS;
    void **host = (void **)calloc(9 * E, sizeof(void *));
    if (!host) {
        free(m);
        return sparq_err(SPARQ_E_NOMEM, "cuda moe: no host memory for %d expert tables", n_experts);
    }
    for (size_t e = 0; e < E; e++) {
        const trellis_cuda_linear *l[3] = {gate[e], up[e], down[e]};
        for (int j = 0; j < 3; j++) {
            host[(3 * j + 0) * E + e] = l[j]->trellis;
            host[(3 * j + 1) * E + e] = l[j]->suh;
            host[(3 * j + 2) * E + e] = l[j]->svh;
        }
    }
    cudaError_t err = cudaMalloc(&m->tables, 9 * E * sizeof(void *));
    if (err == cudaSuccess) err = cudaMemcpy(m->tables, host, 9 * E * sizeof(void *), cudaMemcpyHostToDevice);
    free(host);
    if (err == cudaSuccess) err = cudaMalloc((void **)&m->gu, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMalloc((void **)&m->t_gu, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMalloc((void **)&m->t_down, pairs * hidden * 4);
    if (err == cudaSuccess) err = cudaMalloc((void **)&m->c_gu, pairs * 2 * nbc_gu * 4);
    if (err == cudaSuccess) err = cudaMalloc((void **)&m->c_down, pairs * nbc_d * 4);
    if (err == cudaSuccess) err = cudaMemset(m->t_gu, 0, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMemset(m->t_down, 0, pairs * hidden * 4);
    if (err == cudaSuccess) err = cudaMemset(m->c_gu, 0, pairs * 2 * nbc_gu * 4);
    if (err == cudaSuccess) err = cudaMemset(m->c_down, 0, pairs * nbc_d * 4);
    if (err != cudaSuccess) {
        trellis_cuda_moe_free(m);
        return cuda_status(err, "moe workspace allocation");
    }
    void **t = (void **)m->tables;
    for (int j = 0; j < 3; j++)
        m->proj[j] = moe_proj{(const uint32_t *const *)(t + (3 * j + 0) * E),
                              (const __half *const *)(t + (3 * j + 1) * E), (const __half *const *)(t + (3 * j + 2) * E)};
    *out = m;
    return SPARQ_OK;
}

sparq_status trellis_cuda_moe_forward_lab(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                          const float *weights, float *out, void *stream, int version)
{
    RETURN_IF(!m || !x || !ids || !weights || !out, SPARQ_E_ARG, "cuda moe forward: missing argument");
    RETURN_IF(tokens < 1 || tokens > m->max_tokens, SPARQ_E_ARG, "cuda moe forward: %d tokens, created for 1..%d",
              tokens, m->max_tokens);
    moe_gu_fn gu;
    moe_down_fn dn;
    moe_pick(m->K, m->cb, version, &gu, &dn);
    RETURN_IF(!gu || !dn, SPARQ_E_UNSUPPORTED, "cuda moe: no kernel for K=%d codebook %d (MoE lab version %d)", m->K,
              m->cb, version);
    const bool pdl = (moe_version_opts(version) & DEC_PDL) != 0;
    cudaStream_t s = (cudaStream_t)stream;
    const int pairs = tokens * m->top_k;
    int c1 = fused_chunk(m->hidden, m->inter, 2 * pairs), c2 = fused_chunk(m->inter, m->hidden, pairs);
    if (version >= 17) { /* 17, 19: one wave; 18: two */
        const int waves = version == 18 ? 2 : 1;
        int *f = m->chunk_fit[version - 17][0] + tokens, *fd = m->chunk_fit[version - 17][1] + tokens;
        if (!*f) {
            *f = moe_chunk_fit((const void *)gu, m->hidden, m->inter, 2 * pairs, waves);
            *fd = moe_chunk_fit((const void *)dn, m->inter, m->hidden, pairs, waves);
        }
        c1 = *f;
        c2 = *fd;
    }
    const int nbc1 = (m->inter + FUSED_COLS - 1) / FUSED_COLS, nbc2 = (m->hidden + FUSED_COLS - 1) / FUSED_COLS;
    const int sp1 = (m->hidden / 16 + c1 - 1) / c1, sp2 = (m->inter / 16 + c2 - 1) / c2;
    gu<<<dim3(nbc1 * sp1, 2 * pairs), 256, fused_smem_bytes(c1, 1), s>>>(
        m->proj[0], m->proj[1], ids, x, m->gu, m->t_gu, m->c_gu, m->hidden, m->inter, m->top_k, c1);
    CUDA_RETURN_IF(cudaGetLastError(), "moe gate/up launch (%d pairs)", pairs);
    if (pdl) {
        /* down may start while gate/up runs: it waits (griddepcontrol.wait)
         * before reading gu */
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(nbc2 * sp2, pairs);
        cfg.blockDim = dim3(256);
        cfg.dynamicSmemBytes = fused_smem_bytes(c2, 1);
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, dn, m->proj[2], ids, weights, (const float *)m->gu, out, m->t_down,
                                          m->c_down, m->hidden, m->inter, m->top_k, c2),
                       "moe down launch (%d pairs, PDL)", pairs);
        return SPARQ_OK;
    }
    dn<<<dim3(nbc2 * sp2, pairs), 256, fused_smem_bytes(c2, 1), s>>>(m->proj[2], ids, weights, m->gu, out, m->t_down,
                                                                     m->c_down, m->hidden, m->inter, m->top_k, c2);
    CUDA_RETURN_IF(cudaGetLastError(), "moe down launch (%d pairs)", pairs);
    return SPARQ_OK;
}

/* trellis_cuda_moe_forward runs MoE lab version MOE_DEFAULT_VERSION = v17
 * (kernels/cuda/lab/README.md, docs/benchmarks-cuda.md): v9's decode, the
 * down launch overlapped by PDL, k tiles per block fitted to one wave of
 * resident blocks; 1.38× one v10 GEMV of the same weights on DeepSeek's
 * shapes (round 1's v5 in the same run: 1.47×), 1.80× on Qwen3's (v5:
 * 1.92×); run 13 in docs/benchmarks-cuda.md. */
sparq_status trellis_cuda_moe_forward(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                      const float *weights, float *out, void *stream)
{
    return trellis_cuda_moe_forward_lab(m, x, tokens, ids, weights, out, stream, MOE_DEFAULT_VERSION);
}

} /* extern "C" */
