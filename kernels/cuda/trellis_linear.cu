/* kernels/cuda/trellis_linear.cu — the linear and workspace handles of
 * trellis_cuda.h (device memory, upload, workspace), the decode of Q to fp16
 * (trellis_cuda_decode_inner) and trellis_cuda_gemm's dispatcher, which picks
 * one product kernel per (codebook, rows, size) (trellis_cuda_gemm_choice):
 *
 *   mul1, 1 row, ≥ GEMV_INT_W16_ITEMS items a resident warp → gemv_int_c8_w16
 *        (K = 2..4; gemv_int_c8_w8 at other K)
 *   mul1, 2..4 rows, ≥ GEMV_INT_W8_ITEMS items a resident warp → gemv_int_c8_w8
 *   mul1, 1..4 rows, below those                              → gemv_int_c2
 *   5..16 rows, or 3inst / mcg                                → gemm_tc
 *
 * (gemv_int.cu, gemm_tc.cu; docs/cuda.md says what bounds each). The prefill
 * path (any rows, decode once + cuBLAS) is gemm_prefill.cu, the fused MoE
 * layer moe_decode.cu. */
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"

using namespace trellis_dev;

/* k_decode: Q → fp16 (k×n row-major), one warp per tile, 8 tiles per 256-thread
 * block: each lane loads its three ring words, decodes its 8 values as the
 * GEMM kernels do (dp4a byte sums for mul1) and scatters them into the tile.
 * Bound by memory (it writes 2 bytes a weight). */
template <int K, int CB>
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
    uint32_t w[3], v[4];
    w[0] = __ldg(p + lr.o0);
    w[1] = __ldg(p + lr.o1);
    w[2] = __ldg(p + lr.o2);
    lane_decode_w<K, CB, 0, 3>(w, lr.r, 0u, 0u, 1u, v);
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

typedef void (*decode_fn)(const uint32_t *, __half *, int, int);

/* The dispatcher's thresholds (docs/benchmarks-cuda.md round 8, runs 74–78,
 * 25 shapes): work items = 8 tile columns × one k tile, per resident warp at
 * 16 warps a SM. At one row gemv_int_c8_w16 is the fastest of the integer
 * kernels on 13 of the 17 shapes from 5.8 items a warp up and within
 * 0.2–0.5 µs on the other four; at 4.8 items gemv_int_c2 and it each won one
 * of three shapes. At 2..4 rows gemv_int_c8_w8 from 8 items is the fastest or
 * within 0.3 µs on all eight shapes measured. Below, gemv_int_c2's 4× more
 * items spread better (4096×4096 and smaller). 5 rows already cost the
 * integer loop more than gemm_tc (one more IMMA pair per group of 4 rows). */
#define GEMV_INT_W16_ITEMS 5
#define GEMV_INT_W8_ITEMS 8

extern "C" {

int trellis_cuda_sm_count(void)
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

sparq_status trellis_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    CUDA_RETURN_IF(cudaMemGetInfo(free_bytes, total_bytes), "device memory info");
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
    if (lin->owns) {
        cudaFree(lin->trellis);
        cudaFree(lin->suh);
        cudaFree(lin->svh);
    }
    free(lin);
}

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }
static size_t trellis_bytes(const trellis_linear *h) { return (size_t)h->k / 16 * (h->n / 16) * 32 * h->K; }

size_t trellis_cuda_linear_bytes(const trellis_linear *host)
{
    return up256(trellis_bytes(host)) + up256((size_t)host->k * 2) + up256((size_t)host->n * 2);
}

/* Upload into dev (trellis_cuda_linear_bytes) or, dev NULL, into allocations of its own. */
static sparq_status upload(const trellis_linear *host, const char *name, void *dev, trellis_cuda_linear **out)
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
    lin->owns = dev == NULL;
    snprintf(lin->name, sizeof lin->name, "%s", name ? name : "linear");
    const size_t tbytes = trellis_bytes(host);
    sparq_status st = SPARQ_OK;
    cudaError_t e = cudaSuccess;
    if (dev) {
        lin->trellis = (uint32_t *)dev;
        lin->suh = (__half *)((char *)dev + up256(tbytes));
        lin->svh = (__half *)((char *)dev + up256(tbytes) + up256((size_t)host->k * 2));
    } else {
        e = cudaMalloc((void **)&lin->trellis, tbytes);
        if (e == cudaSuccess) e = cudaMalloc((void **)&lin->suh, (size_t)host->k * 2);
        if (e == cudaSuccess) e = cudaMalloc((void **)&lin->svh, (size_t)host->n * 2);
    }
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

sparq_status trellis_cuda_linear_upload(const trellis_linear *host, const char *name, trellis_cuda_linear **out)
{
    return upload(host, name, NULL, out);
}

sparq_status trellis_cuda_linear_upload_into(const trellis_linear *host, const char *name, void *dev,
                                             trellis_cuda_linear **out)
{
    RETURN_IF(!dev, SPARQ_E_ARG, "%s: upload into no memory", name ? name : "linear");
    return upload(host, name, dev, out);
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
    /* one set per linear of a group (trellis_cuda_gemv_group); the single GEMV uses the first */
    const size_t nbk = (size_t)(max_k + 127) / 128, R = GEMV_INT_MAX_ROWS, G = TRELLIS_CUDA_GROUP_MAX;
    const size_t bqb = (size_t)(max_k / 16) * 32 * 16; /* one row group of B words */
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->bq, G * bqb);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->sa, G * R * nbk * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->usb, G * R * nbk * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->ch, G * R * 2 * nbk * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->pc, G * R * 9 * nbk * sizeof(int));
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
    cudaFree(ws->bq);
    cudaFree(ws->sa);
    cudaFree(ws->usb);
    cudaFree(ws->ch);
    cudaFree(ws->pc);
    free(ws);
}

sparq_status trellis_cuda_decode_inner(const trellis_cuda_linear *lin, uint16_t *q, void *stream)
{
    RETURN_IF(!lin || !q, SPARQ_E_ARG, "cuda decode: missing linear or output");
    const decode_fn fn = with_k_cb(lin->K, lin->cb, [](auto k, auto c) -> decode_fn {
        return k_decode<decltype(k)::value, decltype(c)::value>;
    });
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA decode for K=%d codebook %d", lin->name, lin->K, lin->cb);
    const size_t tiles = (size_t)(lin->k / 16) * (lin->n / 16);
    fn<<<(unsigned)((tiles + 7) / 8), 256, 0, (cudaStream_t)stream>>>(lin->trellis, (__half *)q, lin->k, lin->n);
    CUDA_RETURN_IF(cudaGetLastError(), "%s: decode launch", lin->name);
    return SPARQ_OK;
}

} /* extern "C" */

sparq_status gemm_args_check(const trellis_cuda_linear *lin, const float *x, int rows, const float *y,
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

extern "C" {

trellis_cuda_gemm_kernel trellis_cuda_gemm_choice(const trellis_cuda_linear *lin, int rows)
{
    if (!lin || lin->cb != CB_MUL1 || rows > GEMV_INT_MAX_ROWS) return TRELLIS_CUDA_GEMM_TC;
    const long long items = (long long)(lin->n / 128) * (lin->k / 16), warps = (long long)sm_count() * 16;
    if (rows == 1) {
        if (items < GEMV_INT_W16_ITEMS * warps) return TRELLIS_CUDA_GEMV_INT_C2;
        /* the 16-warp kernel exists for K = 2..4 (measured there); the 8-warp
         * one, the same loop, for every K */
        return lin->K >= 2 && lin->K <= 4 ? TRELLIS_CUDA_GEMV_INT_C8_W16 : TRELLIS_CUDA_GEMV_INT_C8_W8;
    }
    return items >= GEMV_INT_W8_ITEMS * warps ? TRELLIS_CUDA_GEMV_INT_C8_W8 : TRELLIS_CUDA_GEMV_INT_C2;
}

const char *trellis_cuda_gemm_kernel_name(trellis_cuda_gemm_kernel kernel)
{
    switch (kernel) {
    case TRELLIS_CUDA_GEMV_INT_C8_W16: return "gemv_int_c8_w16";
    case TRELLIS_CUDA_GEMV_INT_C8_W8: return "gemv_int_c8_w8";
    case TRELLIS_CUDA_GEMV_INT_C2: return "gemv_int_c2";
    case TRELLIS_CUDA_GEMM_TC: return "gemm_tc";
    default: return "?";
    }
}

sparq_status trellis_cuda_gemm_run(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, trellis_cuda_gemm_kernel kernel,
                                   unsigned parts)
{
    switch (kernel) {
    case TRELLIS_CUDA_GEMM_TC: return gemm_tc_launch(lin, x, rows, y, ws, stream, parts);
    case TRELLIS_CUDA_GEMV_INT_C8_W16:
    case TRELLIS_CUDA_GEMV_INT_C8_W8:
    case TRELLIS_CUDA_GEMV_INT_C2: return gemv_int_launch(lin, x, rows, y, ws, stream, kernel, parts);
    default: return sparq_err(SPARQ_E_ARG, "cuda gemm: unknown kernel %d", (int)kernel);
    }
}

sparq_status trellis_cuda_gemm(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                               trellis_cuda_ws *ws, void *stream)
{
    RETURN_IF(!lin, SPARQ_E_ARG, "cuda gemm: no linear");
    return trellis_cuda_gemm_run(lin, x, rows, y, ws, stream, trellis_cuda_gemm_choice(lin, rows),
                                 TRELLIS_CUDA_PART_ALL);
}

} /* extern "C" */
