/* kernels/cuda/gemm_prefill.cu — trellis_cuda_gemm_prefill, y = x·W for any
 * number of rows (prompt processing, or more than 16 rows), and its shared
 * workspace.
 *
 * Each call decodes the linear's Q to fp16 into the workspace's scratch
 * (trellis_cuda_decode_inner), then per chunk of at most max_rows rows runs
 * the fp16 input transform, cublasGemmEx (fp16 in, fp32 accumulate and out)
 * and the output transform. Nothing is kept per linear: one workspace (one
 * cuBLAS handle with a workspace of our own, one decode scratch of the
 * largest k·n, input/output buffers of max_rows rows) serves every linear of
 * a stream, so its bytes are planned once (trellis_cuda_prefill_ws_bytes).
 * What bounds it: cuBLAS's fp16 GEMM (compute-bound at prompt sizes), plus
 * the decode, one pass over the trellis words per call (lab v1 measured
 * 138.6 µs on 4096×14336 at K=3), which a long chunk amortises. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp16_io.cuh"

using namespace trellis_dev;

/* cuBLAS's own workspace, handed to it so its memory is ours and planned
 * (cublasSetWorkspace; 32 MiB is what it takes on Hopper by default). */
#define PREFILL_CUBLAS_WS ((size_t)32 << 20)

struct trellis_cuda_prefill_ws {
    size_t max_kn;
    int max_k, max_n, max_rows;
    cublasHandle_t cublas;
    __half *q;    /* max_kn fp16: the decoded Q of the linear being run */
    __half *u;    /* max_rows × max_k fp16 */
    float *t;     /* max_rows × max_n fp32 */
    void *blasws; /* PREFILL_CUBLAS_WS bytes */
};

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

extern "C" size_t trellis_cuda_prefill_ws_bytes(size_t max_kn, int max_k, int max_n, int max_rows)
{
    return align256(max_kn * 2) + align256((size_t)max_rows * max_k * 2) + align256((size_t)max_rows * max_n * 4) +
           PREFILL_CUBLAS_WS;
}

extern "C" void trellis_cuda_prefill_ws_free(trellis_cuda_prefill_ws *p)
{
    if (!p) return;
    if (p->cublas) cublasDestroy(p->cublas);
    cudaFree(p->q); /* one allocation: q, u, t, blasws */
    free(p);
}

extern "C" sparq_status trellis_cuda_prefill_ws_create(size_t max_kn, int max_k, int max_n, int max_rows,
                                                       trellis_cuda_prefill_ws **out)
{
    RETURN_IF(!out, SPARQ_E_ARG, "cuda prefill workspace: no output handle");
    *out = NULL;
    RETURN_IF(max_kn == 0 || max_k <= 0 || max_n <= 0 || max_rows <= 0, SPARQ_E_ARG,
              "cuda prefill workspace: bad size (k·n %zu, k %d, n %d, rows %d)", max_kn, max_k, max_n, max_rows);
    trellis_cuda_prefill_ws *p = (trellis_cuda_prefill_ws *)calloc(1, sizeof *p);
    RETURN_IF(!p, SPARQ_E_NOMEM, "cuda prefill workspace: no host memory");
    p->max_kn = max_kn, p->max_k = max_k, p->max_n = max_n, p->max_rows = max_rows;
    char *base = NULL;
    cudaError_t e = cudaMalloc((void **)&base, trellis_cuda_prefill_ws_bytes(max_kn, max_k, max_n, max_rows));
    if (e != cudaSuccess) {
        free(p);
        return cuda_status(e, "cuda prefill workspace");
    }
    p->q = (__half *)base;
    base += align256(max_kn * 2);
    p->u = (__half *)base;
    base += align256((size_t)max_rows * max_k * 2);
    p->t = (float *)base;
    base += align256((size_t)max_rows * max_n * 4);
    p->blasws = base;
    if (cublasCreate(&p->cublas) != CUBLAS_STATUS_SUCCESS) {
        p->cublas = NULL;
        trellis_cuda_prefill_ws_free(p);
        return sparq_err(SPARQ_E_STATE, "cuda prefill workspace: cublasCreate failed");
    }
    if (cublasSetWorkspace(p->cublas, p->blasws, PREFILL_CUBLAS_WS) != CUBLAS_STATUS_SUCCESS) {
        trellis_cuda_prefill_ws_free(p);
        return sparq_err(SPARQ_E_STATE, "cuda prefill workspace: cublasSetWorkspace failed");
    }
    *out = p;
    return SPARQ_OK;
}

extern "C" sparq_status trellis_cuda_gemm_prefill(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                                  trellis_cuda_prefill_ws *p, void *stream)
{
    RETURN_IF(!lin || !x || !y || rows < 1 || !p, SPARQ_E_ARG, "cuda prefill: bad arguments (%d rows)", rows);
    RETURN_IF((size_t)lin->k * lin->n > p->max_kn || lin->k > p->max_k || lin->n > p->max_n, SPARQ_E_SHAPE,
              "%s: %dx%d is larger than the prefill workspace (k·n %zu, k %d, n %d)", lin->name, lin->k, lin->n,
              p->max_kn, p->max_k, p->max_n);
    cudaStream_t s = (cudaStream_t)stream;
    FORWARD_IF(trellis_cuda_decode_inner(lin, (uint16_t *)p->q, stream));
    cublasSetStream(p->cublas, s);
    const float one = 1.0f, zero = 0.0f;
    for (int r0 = 0; r0 < rows; r0 += p->max_rows) {
        const int n = rows - r0 < p->max_rows ? rows - r0 : p->max_rows;
        k_input<<<dim3(lin->k / 128, n), 128, 0, s>>>(x + (size_t)r0 * lin->k, lin->suh, p->u, lin->k);
        const cublasStatus_t cs =
            cublasGemmEx(p->cublas, CUBLAS_OP_N, CUBLAS_OP_N, lin->n, n, lin->k, &one, p->q, CUDA_R_16F, lin->n, p->u,
                         CUDA_R_16F, lin->k, &zero, p->t, CUDA_R_32F, lin->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        RETURN_IF(cs != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasGemmEx failed (status %d)", lin->name, (int)cs);
        k_output<<<dim3(lin->n / 128, n), 128, 0, s>>>(p->t, lin->svh, y + (size_t)r0 * lin->n, lin->n);
    }
    return cuda_status(cudaGetLastError(), "prefill launch");
}
