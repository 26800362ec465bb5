/* kernels/cuda/calib_cuda.cu — the all-experts calibration step of a MoE layer
 * on the GPU (calib_cuda.h says what and in which order). Three small kernels
 * (the activation, the gather of routed rows, the weighted add) around cuBLAS:
 * two SGEMMs for gate and up over all rows, hess_cuda_accumulate (cublasSsyrk)
 * for the Hessians, one SGEMM for the routed rows' down projection. Every
 * rounding in the kernels is explicit (no contraction the CPU does not do). */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

extern "C" {
#include "common/alloc.h"
}
#include "kernels/cuda/calib_cuda.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/hessian_cuda.h"

struct calib_cuda {
    calib_cuda_dims dm;
    cudaStream_t s, cs;     /* compute, copies of the weights */
    cudaEvent_t staged[2];  /* the last upload from staging buffer 0 / 1 */
    cublasHandle_t blas;
    void *mem;              /* one allocation for everything below */
    float *w;               /* slots × (gate, up, down), 3·d·inter each */
    float *hd;              /* slots × inter² */
    float *hx;              /* n_xacc × d² */
    float *xn, *g, *u, *y, *out; /* [max_rows, d | inter] */
    int *prow;              /* [max_rows · top_k] */
    float *pw;
    int rows;               /* of the current call */
};

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* the fixed buffers in allocation order: hx, xn, g, u, y, out, prow, pw */
static size_t fixed_bytes(const calib_cuda_dims *m, size_t *parts)
{
    const size_t d = (size_t)m->d, I = (size_t)m->inter, R = (size_t)m->max_rows, P = R * (size_t)m->top_k;
    const size_t b[8] = {up256((size_t)m->n_xacc * d * d * 4), up256(R * d * 4), up256(R * I * 4), up256(R * I * 4),
                         up256(R * d * 4), up256(R * d * 4), up256(P * 4), up256(P * 4)};
    size_t t = 0;
    for (int i = 0; i < 8; i++) {
        if (parts) parts[i] = b[i];
        t += b[i];
    }
    return t;
}

static size_t slot_bytes(const calib_cuda_dims *m)
{
    const size_t d = (size_t)m->d, I = (size_t)m->inter;
    return 3 * d * I * 4 + I * I * 4;
}

/* cuBLAS's own workspace and the context's handles are not in the allocation */
#define CALIB_CUDA_MARGIN ((size_t)64 << 20)

extern "C" void calib_cuda_plan(const calib_cuda_dims *dm, size_t *fixed, size_t *per_slot)
{
    *fixed = fixed_bytes(dm, NULL) + CALIB_CUDA_MARGIN;
    *per_slot = slot_bytes(dm);
}

extern "C" sparq_status calib_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    CUDA_RETURN_IF(cudaMemGetInfo(free_bytes, total_bytes), "calib: memory info");
    return SPARQ_OK;
}

extern "C" void calib_cuda_free(calib_cuda *c)
{
    if (!c) return;
    if (c->s) cudaStreamSynchronize(c->s);
    if (c->cs) cudaStreamSynchronize(c->cs);
    cudaFree(c->mem);
    if (c->blas) cublasDestroy(c->blas);
    for (int i = 0; i < 2; i++)
        if (c->staged[i]) cudaEventDestroy(c->staged[i]);
    if (c->s) cudaStreamDestroy(c->s);
    if (c->cs) cudaStreamDestroy(c->cs);
    sparq_free(c);
}

extern "C" sparq_status calib_cuda_create(const calib_cuda_dims *dm, calib_cuda **out)
{
    *out = NULL;
    RETURN_IF(dm->d <= 0 || dm->inter <= 0 || dm->slots <= 0 || dm->max_rows <= 0 || dm->top_k <= 0 ||
                  dm->n_xacc < 0 || dm->n_xacc > 2,
              SPARQ_E_ARG, "cuda calib: dims d %d inter %d slots %d rows %d top_k %d xacc %d", dm->d, dm->inter,
              dm->slots, dm->max_rows, dm->top_k, dm->n_xacc);
    calib_cuda *c = (calib_cuda *)sparq_calloc(1, sizeof *c);
    RETURN_IF(!c, SPARQ_E_NOMEM, "cuda calib: out of memory");
    c->dm = *dm;
    sparq_status st = SPARQ_OK;
    size_t part[8];
    const size_t fixed = fixed_bytes(dm, part), per = slot_bytes(dm);
    const size_t total = fixed + (size_t)dm->slots * per;
    cudaError_t e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->cs, cudaStreamNonBlocking);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&c->staged[i], cudaEventDisableTiming);
    if (e != cudaSuccess) st = cuda_status(e, "calib: streams");
    if (st == SPARQ_OK && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        st = sparq_err(SPARQ_E_STATE, "cuda calib: cublasCreate failed");
    }
    if (st == SPARQ_OK) {
        cublasSetStream(c->blas, c->s);
        cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* fp32 FMA, never TF32 */
        e = cudaMalloc(&c->mem, total);
        if (e != cudaSuccess) {
            c->mem = NULL;
            char what[160];
            snprintf(what, sizeof what, "calib: %.2f GB for %d experts of %d x %d", total / 1e9, dm->slots, dm->d,
                     dm->inter);
            st = cuda_status(e, what);
        }
    }
    if (st == SPARQ_OK) {
        char *p = (char *)c->mem;
        c->hx = (float *)p, p += part[0];
        c->xn = (float *)p, p += part[1];
        c->g = (float *)p, p += part[2];
        c->u = (float *)p, p += part[3];
        c->y = (float *)p, p += part[4];
        c->out = (float *)p, p += part[5];
        c->prow = (int *)p, p += part[6];
        c->pw = (float *)p, p += part[7];
        c->w = (float *)p;
        c->hd = c->w + (size_t)dm->slots * 3 * dm->d * dm->inter;
        e = cudaMemsetAsync(c->hx, 0, part[0], c->s);
        if (e == cudaSuccess)
            e = cudaMemsetAsync(c->hd, 0, (size_t)dm->slots * dm->inter * dm->inter * sizeof(float), c->s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
        if (e != cudaSuccess) st = cuda_status(e, "calib: zero the accumulators");
    }
    if (st != SPARQ_OK) {
        calib_cuda_free(c);
        return st;
    }
    *out = c;
    return SPARQ_OK;
}

extern "C" void *calib_cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess ? p : NULL;
}

extern "C" void calib_cuda_host_free(void *p)
{
    if (p) cudaFreeHost(p);
}

static float *slot_w(calib_cuda *c, int slot, int which)
{
    const size_t dI = (size_t)c->dm.d * c->dm.inter;
    return c->w + ((size_t)slot * 3 + which) * dI;
}

extern "C" sparq_status calib_cuda_load(calib_cuda *c, int slot, int stage, const float *wg, const float *wu,
                                        const float *wd)
{
    RETURN_IF(slot < 0 || slot >= c->dm.slots || stage < 0 || stage > 1, SPARQ_E_ARG, "cuda calib: slot %d stage %d",
              slot, stage);
    const size_t bytes = (size_t)c->dm.d * c->dm.inter * sizeof(float);
    const float *src[3] = {wg, wu, wd};
    for (int i = 0; i < 3; i++)
        CUDA_RETURN_IF(cudaMemcpyAsync(slot_w(c, slot, i), src[i], bytes, cudaMemcpyHostToDevice, c->cs),
                       "calib: upload expert slot %d", slot);
    CUDA_RETURN_IF(cudaEventRecord(c->staged[stage], c->cs), "calib: upload event");
    CUDA_RETURN_IF(cudaStreamWaitEvent(c->s, c->staged[stage], 0), "calib: wait for the upload");
    return SPARQ_OK;
}

extern "C" sparq_status calib_cuda_stage_wait(calib_cuda *c, int stage)
{
    RETURN_IF(stage < 0 || stage > 1, SPARQ_E_ARG, "cuda calib: stage %d", stage);
    CUDA_RETURN_IF(cudaEventSynchronize(c->staged[stage]), "calib: upload of stage %d", stage);
    return SPARQ_OK;
}

extern "C" sparq_status calib_cuda_begin(calib_cuda *c, const float *xn, int rows, const float *out, int n_pairs,
                                         const int *pair_rows, const float *pair_w, unsigned xacc_mask)
{
    const calib_cuda_dims *m = &c->dm;
    RETURN_IF(rows < 0 || rows > m->max_rows || n_pairs < 0 || n_pairs > rows * m->top_k, SPARQ_E_ARG,
              "cuda calib: %d rows (at most %d), %d routed pairs", rows, m->max_rows, n_pairs);
    c->rows = rows;
    if (rows == 0) return SPARQ_OK;
    const size_t xb = (size_t)rows * m->d * sizeof(float);
    CUDA_RETURN_IF(cudaMemcpyAsync(c->xn, xn, xb, cudaMemcpyHostToDevice, c->s), "calib: upload xn");
    CUDA_RETURN_IF(cudaMemcpyAsync(c->out, out, xb, cudaMemcpyHostToDevice, c->s), "calib: upload out");
    if (n_pairs) {
        CUDA_RETURN_IF(cudaMemcpyAsync(c->prow, pair_rows, (size_t)n_pairs * sizeof(int), cudaMemcpyHostToDevice, c->s),
                       "calib: upload the routing");
        CUDA_RETURN_IF(cudaMemcpyAsync(c->pw, pair_w, (size_t)n_pairs * sizeof(float), cudaMemcpyHostToDevice, c->s),
                       "calib: upload the routing");
    }
    for (int i = 0; i < m->n_xacc; i++)
        if (xacc_mask >> i & 1u)
            FORWARD_IF(hess_cuda_accumulate(c->blas, c->s, c->hx + (size_t)i * m->d * m->d, m->d, c->xn, rows));
    return SPARQ_OK;
}

/* g[i] = act(g[i], u[i]): sq_swiglu_limit's formula, every rounding as the CPU's */
__global__ void k_act(float *g, const float *u, size_t n, float limit)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float a = g[i], b = u[i];
        if (limit > 0) {
            a = a < limit ? a : limit;
            b = b < -limit ? -limit : b > limit ? limit : b;
        }
        g[i] = __fmul_rn(__fdiv_rn(a, __fadd_rn(1.0f, expf(-a))), b);
    }
}

/* dst[j] = src[rows[first + j]] for j < n, rows of `w` floats */
__global__ void k_gather(float *dst, const float *src, const int *rows, int first, int n, int w)
{
    const size_t tot = (size_t)n * w;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < tot; i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / w, c = i % w;
        dst[i] = src[(size_t)rows[first + j] * w + c];
    }
}

/* out[rows[first + j]] += wt[first + j] · y[j] (one fused multiply-add, as the CPU's AVX2 axpy); the rows of
 * one expert are distinct */
__global__ void k_add(float *out, const float *y, const int *rows, const float *wt, int first, int n, int d)
{
    const size_t tot = (size_t)n * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < tot; i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / d, c = i % d;
        float *o = out + (size_t)rows[first + j] * d + c;
        *o = __fmaf_rn(wt[first + j], y[i], *o);
    }
}

static int grid_for(size_t n)
{
    const size_t b = (n + 255) / 256;
    return (int)(b < 4096 ? (b ? b : 1) : 4096);
}

static sparq_status blas_ok(cublasStatus_t s, const char *what)
{
    RETURN_IF(s != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "cuda calib: %s: cuBLAS status %d", what, (int)s);
    return SPARQ_OK;
}

extern "C" sparq_status calib_cuda_expert(calib_cuda *c, int slot, int acc_down, int first, int n, float limit)
{
    const calib_cuda_dims *m = &c->dm;
    RETURN_IF(slot < 0 || slot >= m->slots || first < 0 || n < 0 || n > c->rows, SPARQ_E_ARG,
              "cuda calib: expert slot %d, pairs %d + %d of %d rows", slot, first, n, c->rows);
    const int R = c->rows, d = m->d, I = m->inter;
    if (R == 0) return SPARQ_OK;
    const float one = 1.0f, zero = 0.0f;
    /* row-major X [R, d] is column-major d×R; W [I, d] row-major is column-major d×I: G (column-major I×R,
     * row-major [R, I]) = Wᵀ·X */
    FORWARD_IF(blas_ok(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, I, R, d, &one, slot_w(c, slot, 0), d, c->xn, d,
                                   &zero, c->g, I), "gate"));
    FORWARD_IF(blas_ok(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, I, R, d, &one, slot_w(c, slot, 1), d, c->xn, d,
                                   &zero, c->u, I), "up"));
    const size_t na = (size_t)R * I;
    k_act<<<grid_for(na), 256, 0, c->s>>>(c->g, c->u, na, limit);
    CUDA_RETURN_IF(cudaGetLastError(), "calib: activation");
    if (acc_down) FORWARD_IF(hess_cuda_accumulate(c->blas, c->s, c->hd + (size_t)slot * I * I, I, c->g, R));
    if (n == 0) return SPARQ_OK;
    k_gather<<<grid_for((size_t)n * I), 256, 0, c->s>>>(c->u, c->g, c->prow, first, n, I);
    CUDA_RETURN_IF(cudaGetLastError(), "calib: gather");
    FORWARD_IF(blas_ok(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, n, I, &one, slot_w(c, slot, 2), I, c->u, I,
                                   &zero, c->y, d), "down"));
    k_add<<<grid_for((size_t)n * d), 256, 0, c->s>>>(c->out, c->y, c->prow, c->pw, first, n, d);
    CUDA_RETURN_IF(cudaGetLastError(), "calib: weighted add");
    return SPARQ_OK;
}

extern "C" sparq_status calib_cuda_end(calib_cuda *c, float *out)
{
    if (c->rows)
        CUDA_RETURN_IF(cudaMemcpyAsync(out, c->out, (size_t)c->rows * c->dm.d * sizeof(float), cudaMemcpyDeviceToHost,
                                       c->s),
                       "calib: download out");
    CUDA_RETURN_IF(cudaStreamSynchronize(c->s), "calib: the call");
    return SPARQ_OK;
}

extern "C" sparq_status calib_cuda_acc_get(calib_cuda *c, int which, float *host)
{
    const calib_cuda_dims *m = &c->dm;
    RETURN_IF(which >= m->slots || which < -m->n_xacc, SPARQ_E_ARG, "cuda calib: accumulator %d", which);
    const size_t k = which >= 0 ? (size_t)m->inter : (size_t)m->d;
    float *a = which >= 0 ? c->hd + (size_t)which * k * k : c->hx + (size_t)(-1 - which) * k * k;
    CUDA_RETURN_IF(cudaMemcpyAsync(host, a, k * k * sizeof(float), cudaMemcpyDeviceToHost, c->s),
                   "calib: download accumulator %d", which);
    CUDA_RETURN_IF(cudaMemsetAsync(a, 0, k * k * sizeof(float), c->s), "calib: zero accumulator %d", which);
    CUDA_RETURN_IF(cudaStreamSynchronize(c->s), "calib: accumulator %d", which);
    return SPARQ_OK;
}

static const calib_cuda_ops g_calib_ops = {calib_cuda_plan,       calib_cuda_mem_info,  calib_cuda_create,
                                           calib_cuda_free,       calib_cuda_host_alloc, calib_cuda_host_free,
                                           calib_cuda_load,       calib_cuda_stage_wait, calib_cuda_begin,
                                           calib_cuda_expert,     calib_cuda_end,        calib_cuda_acc_get};

extern "C" const calib_cuda_ops *calib_cuda_get_ops(void) { return &g_calib_ops; }
