/* kernels/cuda/attn_prefill.cu — flash attention for prefill chunks: see
 * attn_prefill.h.
 *
 * Block (tile of AP_BQ query rows, query head h), AP_THREADS threads as a
 * 16 × 16 grid: thread (ty, tx) owns query rows ty + 16i (i < 4) — the same
 * rows in the scores and in the output, so a row's running max m and sum l
 * never leave the 16 lanes that share them — and key columns tx + 16j of a
 * score tile, output columns 64c + 4tx .. +3. Per key tile of AP_BK keys:
 * K into shared memory; S = scale · Q Kᵀ (4 × 4 a thread, float4 loads along
 * the head: Q's rows are broadcast, K's 16 rows a warp hit distinct banks);
 * masked scores to −∞; the tile's row max and exp-sum with 16-lane shuffles;
 * O and l rescaled by e^(m_old − m_new); P to shared memory; V into K's
 * buffer (keys no row uses as zeros: a gap between two sequences' rows of the
 * cache may hold anything, and 0 × NaN would leak); O += P V. The output is
 * O / l (0 for a row with no keys, as the CPU op). fp32 throughout; compared
 * with the CPU's exact two-pass softmax it differs in rounding only
 * (tests/gpu/test_backend_cuda.c, test_attention_prefill).
 *
 * What bounds it: fp32 FMA issue (2 × 64 × 64 × hd FMAs a key tile against
 * ~0.4 shared-memory wavefronts an FMA instruction), two blocks an SM at
 * ≤ 128 registers. The one-block-a-(row, head) kernel it replaces for > 16
 * rows read every key row once per query row, with a thread per key
 * (uncoalesced), and held a row's scores in shared memory (≤ 51 k keys). */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attn_prefill.h"

#define AP_BQ 64       /* query rows a block */
#define AP_BK 64       /* keys a tile */
#define AP_THREADS 256 /* 16 × 16 */

static __device__ __forceinline__ float4 ld4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ void st4(float *p, float4 x) { *(float4 *)p = x; }
static __device__ __forceinline__ float comp(const float4 &a, int u)
{
    return u == 0 ? a.x : u == 1 ? a.y : u == 2 ? a.z : a.w;
}

/* 16-lane reductions (the lanes of one ty: xor masks below 16 stay in a half warp) */
static __device__ __forceinline__ float max16(float x)
{
#pragma unroll
    for (int o = 8; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
static __device__ __forceinline__ float sum16(float x)
{
#pragma unroll
    for (int o = 8; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <int HD>
static constexpr size_t ap_smem_bytes()
{
    return ((size_t)(AP_BQ + AP_BK) * (HD + 4) + (size_t)AP_BQ * (AP_BK + 4)) * sizeof(float);
}

/* rows [AP_BQ or AP_BK][HD] of a [*, ld] array from row `first`, rows at or past `end` (or marked
 * unused) as zeros, into shared memory with row stride HD + 4 */
template <int HD>
static __device__ __forceinline__ void load_tile(float *dst, const float *src, size_t ld, int first, int end,
                                                 const int *used)
{
    for (int i = threadIdx.x; i < AP_BK * HD / 4; i += AP_THREADS) {
        const int row = i / (HD / 4), c = (i % (HD / 4)) * 4, t = first + row;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < end && (!used || used[row])) x = ld4(src + (size_t)t * ld + c);
        st4(dst + row * (HD + 4) + c, x);
    }
}

template <int HD>
__global__ void __launch_bounds__(AP_THREADS, 2)
    k_attn_prefill(const float *__restrict__ q, int rows, int n_heads, int n_kv, const float *__restrict__ k,
                   const float *__restrict__ v, const int *__restrict__ kv_first, const int *__restrict__ kv_len,
                   float scale, float *__restrict__ out)
{
    constexpr int LD = HD + 4, PLD = AP_BK + 4, NC = HD / 64;
    extern __shared__ float4 ap_sm4[];
    float *qs = (float *)ap_sm4;  /* [AP_BQ][LD] */
    float *kv = qs + AP_BQ * LD;  /* [AP_BK][LD]: the K tile, then the V tile */
    float *ps = kv + AP_BK * LD;  /* [AP_BQ][PLD] */
    __shared__ int rf[AP_BQ], re[AP_BQ], used[AP_BK], span[2][2];

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int h = blockIdx.x % n_heads, r0 = (blockIdx.x / n_heads) * AP_BQ, g = h / (n_heads / n_kv);
    const size_t qd = (size_t)n_heads * HD, kvd = (size_t)n_kv * HD;

    if (tid < AP_BQ) { /* warps 0 and 1: the rows' key ranges, and each warp's span over its rows with keys */
        const int r = r0 + tid;
        const int f = r < rows ? kv_first[r] : 0, e = r < rows ? f + kv_len[r] : 0;
        rf[tid] = f, re[tid] = e; /* a row past the end, or with no keys: f == e */
        const int lo = __reduce_min_sync(0xffffffffu, e > f ? f : INT_MAX);
        const int hi = __reduce_max_sync(0xffffffffu, e > f ? e : INT_MIN);
        if (tid % 32 == 0) span[tid / 32][0] = lo, span[tid / 32][1] = hi;
    }
    /* Q's rows for head h (rows past the end as zeros) */
    for (int i = tid; i < AP_BQ * HD / 4; i += AP_THREADS) {
        const int row = i / (HD / 4), c = (i % (HD / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + row < rows) x = ld4(q + (size_t)(r0 + row) * qd + (size_t)h * HD + c);
        st4(qs + row * LD + c, x);
    }
    __syncthreads();
    const int lo = min(span[0][0], span[1][0]), hi = max(span[0][1], span[1][1]); /* none: lo > hi */

    int fr[4], er[4];
    float m[4], l[4];
    float4 o[4][NC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        fr[i] = rf[ty + 16 * i], er[i] = re[ty + 16 * i];
        m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; c++) o[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    for (int t0 = lo; t0 < hi; t0 += AP_BK) {
        bool any = false;
#pragma unroll
        for (int i = 0; i < 4; i++) any |= fr[i] < t0 + AP_BK && er[i] > t0;
        /* also the barrier after the previous tile's reads of kv, ps and used */
        if (!__syncthreads_or(any)) continue;
        if (tid < AP_BK) used[tid] = 0;
        load_tile<HD>(kv, k + (size_t)g * HD, kvd, t0, hi, NULL);
        __syncthreads();

        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = 0.f;
#pragma unroll 1 /* 2 or 4 spill at hd 128 (128 registers) */
        for (int d = 0; d < HD; d += 4) {
            float4 a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = ld4(qs + (ty + 16 * i) * LD + d);
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = ld4(kv + (tx + 16 * j) * LD + d);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float x = s[i][j];
                    x = fmaf(a[i].x, b[j].x, x);
                    x = fmaf(a[i].y, b[j].y, x);
                    x = fmaf(a[i].z, b[j].z, x);
                    s[i][j] = fmaf(a[i].w, b[j].w, x);
                }
        }
        /* mask, then the online softmax's step for each of the thread's rows */
        bool col_used[4] = {false, false, false, false};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int t = t0 + tx + 16 * j;
                const bool ok = t >= fr[i] && t < er[i];
                col_used[j] |= ok;
                s[i][j] = ok ? s[i][j] * scale : -INFINITY;
                mt = fmaxf(mt, s[i][j]);
            }
            const float mn = fmaxf(m[i], max16(mt));
            float alpha = 1.f, sum = 0.f;
            if (mn != -INFINITY) { /* else no key of this row yet: p = 0, nothing to rescale */
                alpha = expf(m[i] - mn); /* m = −∞ (first keys): 0, and O, l are 0 */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    s[i][j] = expf(s[i][j] - mn);
                    sum += s[i][j];
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = 0.f;
            }
            l[i] = fmaf(l[i], alpha, sum16(sum));
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < NC; c++) o[i][c].x *= alpha, o[i][c].y *= alpha, o[i][c].z *= alpha, o[i][c].w *= alpha;
#pragma unroll
            for (int j = 0; j < 4; j++) ps[(ty + 16 * i) * PLD + tx + 16 * j] = s[i][j];
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (col_used[j]) used[tx + 16 * j] = 1;
        __syncthreads(); /* P and used written, the K tile read */
        load_tile<HD>(kv, v + (size_t)g * HD, kvd, t0, hi, used);
        __syncthreads();

#pragma unroll 2
        for (int kk = 0; kk < AP_BK; kk += 4) {
            float4 p4[4];
#pragma unroll
            for (int i = 0; i < 4; i++) p4[i] = ld4(ps + (ty + 16 * i) * PLD + kk);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float4 vv[NC];
#pragma unroll
                for (int c = 0; c < NC; c++) vv[c] = ld4(kv + (kk + u) * LD + 64 * c + 4 * tx);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float p = comp(p4[i], u);
#pragma unroll
                    for (int c = 0; c < NC; c++) {
                        o[i][c].x = fmaf(p, vv[c].x, o[i][c].x);
                        o[i][c].y = fmaf(p, vv[c].y, o[i][c].y);
                        o[i][c].z = fmaf(p, vv[c].z, o[i][c].z);
                        o[i][c].w = fmaf(p, vv[c].w, o[i][c].w);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + ty + 16 * i;
        if (r >= rows) continue;
        const float inv = l[i] > 0.f ? 1.0f / l[i] : 0.f;
        float *orow = out + (size_t)r * qd + (size_t)h * HD;
#pragma unroll
        for (int c = 0; c < NC; c++)
            st4(orow + 64 * c + 4 * tx, make_float4(o[i][c].x * inv, o[i][c].y * inv, o[i][c].z * inv, o[i][c].w * inv));
    }
}

extern "C" bool sq_cuda_attn_prefill_ok(int n_heads, int n_kv, int hd, const void *q, const void *k, const void *v,
                                        const void *out)
{
    const uintptr_t a = (uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out;
    return (hd == 64 || hd == 128) && n_kv > 0 && n_heads >= n_kv && n_heads % n_kv == 0 && a % 16 == 0;
}

extern "C" sparq_status sq_cuda_attn_prefill_init(void)
{
    cudaError_t e = cudaFuncSetAttribute(k_attn_prefill<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)ap_smem_bytes<64>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k_attn_prefill<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)ap_smem_bytes<128>());
    if (e != cudaSuccess)
        return sparq_err(SPARQ_E_STATE, "cuda: prefill attention shared memory: %s", cudaGetErrorString(e));
    return SPARQ_OK;
}

extern "C" void sq_cuda_attn_prefill(void *stream, const float *q, int rows, int n_heads, int n_kv, int hd,
                                     const float *k, const float *v, const int *kv_first, const int *kv_len,
                                     float scale, float *out)
{
    const unsigned blocks = (unsigned)((rows + AP_BQ - 1) / AP_BQ * n_heads);
    cudaStream_t s = (cudaStream_t)stream;
    if (hd == 64)
        k_attn_prefill<64><<<blocks, AP_THREADS, ap_smem_bytes<64>(), s>>>(q, rows, n_heads, n_kv, k, v, kv_first,
                                                                          kv_len, scale, out);
    else
        k_attn_prefill<128><<<blocks, AP_THREADS, ap_smem_bytes<128>(), s>>>(q, rows, n_heads, n_kv, k, v, kv_first,
                                                                            kv_len, scale, out);
}
