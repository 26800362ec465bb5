/* kernels/cuda/sample_cuda.cu — the device part of sampling: see sample_cuda.h. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/sample_cuda.h"

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)

/* The fp32 order as unsigned ints: a < b exactly when key(a) < key(b), and
 * -0 maps to +0's key (they compare equal, as on the CPU). NaN never comes
 * here (the row is flagged and its result dropped). */
__device__ __forceinline__ uint32_t order_key(float f)
{
    const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* (key, id) as one integer: larger = earlier candidate (higher logit, then lower id). */
__device__ __forceinline__ uint64_t compose(uint32_t key, int i)
{
    return (uint64_t)key << 32 | (uint64_t)(0xFFFFFFFFu - (uint32_t)i);
}

/* better(a, b): a ranks before b (b.i < 0: nothing yet) */
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib)
{
    return ib < 0 || va > vb || (va == vb && ia < ib);
}

__global__ void __launch_bounds__(SMP_THREADS) k_sample(float *logits, int ld, const int *req, int stride,
                                                         int *out_ids, float *out_vals, int *out_bad)
{
    __shared__ unsigned hist[256];
    __shared__ uint64_t ck[SQ_SAMPLE_MAX_K];
    __shared__ unsigned s_prefix, s_mask, s_remaining, s_ng, s_tie_base;
    __shared__ unsigned wcnt[SMP_WARPS];
    __shared__ float wv[SMP_WARPS];
    __shared__ int wi[SMP_WARPS];
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int *p = req + (size_t)row * SQ_CUDA_SAMPLE_PARAM_INTS;
    const int V = p[0], k = p[1], n_pen = p[3];
    const float penalty = __int_as_float(p[2]);
    const int *pen = req + p[4];
    float *l = logits + (size_t)row * (size_t)ld;

    /* 1. a NaN or an Inf anywhere in the row (before the penalty, as the host checks) */
    int nf = 0;
    for (int i = tid; i < ld; i += SMP_THREADS) nf |= !isfinite(l[i]);
    nf = __syncthreads_or(nf);
    if (tid == 0) out_bad[row] = nf;
    if (nf) return;
    /* 2. the penalty, in place (distinct ids: no two threads write one) */
    if (penalty != 1.0f)
        for (int j = tid; j < n_pen; j += SMP_THREADS) {
            const float v = l[pen[j]];
            l[pen[j]] = v > 0 ? v / penalty : v * penalty;
        }
    __syncthreads();
    int *oi = out_ids + (size_t)row * stride;
    float *ov = out_vals + (size_t)row * stride;

    /* 3a. greedy: the argmax, ties to the lowest id */
    if (k == 0) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = tid; i < V; i += SMP_THREADS) {
            const float v = l[i];
            if (better(v, i, bv, bi)) bv = v, bi = i;
        }
        for (int o = 16; o; o >>= 1) {
            const float v2 = __shfl_down_sync(0xffffffffu, bv, o);
            const int i2 = __shfl_down_sync(0xffffffffu, bi, o);
            if (i2 >= 0 && better(v2, i2, bv, bi)) bv = v2, bi = i2;
        }
        if (lane == 0) wv[warp] = bv, wi[warp] = bi;
        __syncthreads();
        if (tid == 0) {
            bv = wv[0], bi = wi[0];
            for (int w = 1; w < SMP_WARPS; w++)
                if (wi[w] >= 0 && better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w];
            oi[0] = bi;
            ov[0] = bv;
        }
        return;
    }

    /* 3b. the key of the k-th best: four passes of 8 bits, from the top */
    if (tid == 0) s_prefix = 0, s_mask = 0, s_remaining = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += SMP_THREADS) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int i = tid; i < V; i += SMP_THREADS) {
            const uint32_t key = order_key(l[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned c = 0, rem = s_remaining;
            for (int b = 255; b >= 0; b--) {
                if (c + hist[b] >= rem) {
                    s_prefix = prefix | (uint32_t)b << shift;
                    s_mask = mask | 255u << shift;
                    s_remaining = rem - c;
                    break;
                }
                c += hist[b];
            }
        }
        __syncthreads();
    }
    const uint32_t T = s_prefix;
    const unsigned ties = s_remaining, greater = (unsigned)k - ties;
    /* 3c. gather: every key above T (any order: sorted below), and the lowest `ties` ids at T */
    if (tid == 0) s_ng = 0, s_tie_base = 0;
    __syncthreads();
    for (int base = 0; base < V; base += SMP_THREADS) {
        const int i = base + tid;
        const uint32_t key = i < V ? order_key(l[i]) : 0u;
        if (i < V && key > T) ck[atomicAdd(&s_ng, 1u)] = compose(key, i);
        const bool tie = i < V && key == T;
        const unsigned bal = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) wcnt[warp] = __popc(bal);
        __syncthreads();
        unsigned before_w = 0, total = 0;
        for (int w = 0; w < SMP_WARPS; w++) {
            if (w < warp) before_w += wcnt[w];
            total += wcnt[w];
        }
        const unsigned rank = s_tie_base + before_w + __popc(bal & ((1u << lane) - 1u));
        if (tie && rank < ties) ck[greater + rank] = compose(T, i);
        __syncthreads();
        if (tid == 0) s_tie_base += total;
        __syncthreads();
        if (s_tie_base >= ties && s_ng >= greater) break; /* all k found (uniform: shared values after a sync) */
    }
    /* 3d. bitonic sort of the k, padded to a power of two with 0 (below every real entry), descending */
    int P = 1;
    while (P < k) P <<= 1;
    for (int i = k + tid; i < P; i += SMP_THREADS) ck[i] = 0;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int half = size / 2; half > 0; half >>= 1) {
            for (int i = tid; i < P; i += SMP_THREADS) {
                const int j = i ^ half;
                if (j <= i) continue;
                const uint64_t a = ck[i], b = ck[j];
                const bool desc = (i & size) == 0;
                if (desc ? a < b : a > b) ck[i] = b, ck[j] = a;
            }
            __syncthreads();
        }
    for (int i = tid; i < k; i += SMP_THREADS) {
        const int id = (int)(0xFFFFFFFFu - (uint32_t)(ck[i] & 0xFFFFFFFFu));
        oi[i] = id;
        ov[i] = l[id];
    }
}

extern "C" void sq_cuda_sample_launch(void *stream, float *logits, int rows, int ld, const int *req, int stride,
                                      int *out_ids, float *out_vals, int *out_bad)
{
    if (rows < 1) return;
    k_sample<<<rows, SMP_THREADS, 0, (cudaStream_t)stream>>>(logits, ld, req, stride, out_ids, out_vals, out_bad);
}
