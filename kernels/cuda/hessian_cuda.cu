/* kernels/cuda/hessian_cuda.cu — hessian_cuda.h: the quantizer's Hessian
 * accumulation and ldlq_hessian_prepare on the GPU.
 *
 * The steps of hess_cuda_prepare, as quantize/ldlq.c does them:
 *  1. k_nonfinite (any element not finite: a grid-stride scan, one atomicOr
 *     per warp that saw one) and k_diag_sum (one block: the diagonal staged
 *     through shared memory, then summed by one thread in double in index
 *     order, the CPU's loop, so diag_mean is the same double). The host reads
 *     both and decides identity and the damping exactly as the CPU.
 *  2. Per attempt (damp = sigma_reg·4^attempt, add = (float)(damp·diag_mean)):
 *     k_rotate, one 128×128 tile per block in shared memory: x·su_r·su_c,
 *     + add on the diagonal (h_diag = h_rr + add), the 7 row butterfly stages
 *     of trellis_had128 and ·1/√128, then the 7 column stages and ·1/√128 —
 *     per element the same fp32 operations as hadamard_right then
 *     hadamard_left (every rounding explicit: __fadd_rn & co., no FMA), so
 *     Hr is the CPU's bit for bit. It writes Hr twice: hr, and l for the
 *     in-place factorisation.
 *  3. Cholesky of l (see chol_blocked): right-looking, panels of nb columns;
 *     the diagonal block by k_chol_diag (≤ 128 columns in shared memory, one
 *     column step at a time; a pivot that is not positive and finite writes
 *     its column to info and stops; later diagonal kernels see info and do
 *     nothing), the panel by cublasStrsm, the trailing lower triangle by
 *     cublasSsyrk. One host read of info per attempt decides the retry.
 *  4. Block LDL: k_ldl_blocks copies each 16×16 diagonal block DL (lower,
 *     zeros above) to scratch and writes d_diag = its row norms² in double
 *     (the CPU's order); k_ldl_apply then writes all of L: rows below a
 *     block solve x·DL = c by back substitution (L = C·DL⁻¹), the block's
 *     own rows become the identity, rows above it zeros.
 *
 * Layout: cuBLAS is column-major, the arrays are row-major; a row-major
 * lower triangle is a column-major upper one, so the row-major factor
 * A = C·Cᵀ is cuBLAS's A = UᵀU with U = Cᵀ (LAPACK's 'U', as ldlq.c calls
 * spotrf). Panel: X·C11ᵀ = A21 (row-major) is C11·Xᵀ = A21ᵀ, Strsm(LEFT,
 * UPPER, TRANS) on the column-major view; trailing: A22 −= X·Xᵀ is Ssyrk(UPPER,
 * TRANS) with the panel as a jb×rest column-major matrix.
 *
 * Panel width. The diagonal kernel is serial in its columns (two barriers
 * each), so its cost grows with nb while the cuBLAS calls get more efficient
 * with a deeper inner dimension (ssyrk with k = 64 runs well below its peak)
 * and fewer calls (3 launches per panel). 128 is the middle: k = 5120 takes 40
 * panels. hess_cuda_cholesky takes nb so that the test can time 64/128/256. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/hessian_cuda.h"

#include <math.h>
#include <string.h>

extern "C" {
#include "common/alloc.h"
#include "quantize/ldlq.h" /* LDLQ_SIGMA_REG, ldlq_random_signs; C headers without extern "C" */
}

namespace {

/* trellis.c's HAD_SCALE, the same float. */
constexpr float HAD_SCALE_F = 0.08838834764831845f;
constexpr int TILE = 128;       /* Hadamard block */
constexpr int ROT_THREADS = 512;
constexpr int ROT_LD = TILE + 1; /* shared row stride: column butterflies hit distinct banks */
constexpr int CHOL_DIAG_MAX = 128;
constexpr int CHOL_THREADS_X = 32, CHOL_THREADS_Y = 16;
constexpr int DIAG_CHUNK = 4096; /* floats of the diagonal staged at once */

/* Device scratch that the host reads back. */
struct hess_stats {
    double diag_sum;
    int nonfinite;
    int info;
};

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The layout of one hess_cuda allocation: offsets in bytes. */
struct hess_layout {
    size_t su, h_diag, d_diag, stats, dl, hr, l, total;
};

hess_layout layout_for(int k)
{
    hess_layout L;
    const size_t kv = align256((size_t)k * sizeof(float));
    const size_t kk = align256((size_t)k * k * sizeof(float));
    size_t o = 0;
    L.su = o, o += kv;
    L.h_diag = o, o += kv;
    L.d_diag = o, o += kv;
    L.stats = o, o += align256(sizeof(hess_stats));
    L.dl = o, o += align256((size_t)(k / 16) * 256 * sizeof(float));
    L.hr = o, o += kk;
    L.l = o, o += kk;
    L.total = o;
    return L;
}

/* --- kernels ----------------------------------------------------------------------- */

__global__ void k_nonfinite(const float *__restrict__ h, size_t n, int *flag)
{
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(h[i]);
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(flag, 1);
}

/* One block: Σ h[i][i] in double, i ascending, as ldlq.c. */
__global__ void k_diag_sum(const float *__restrict__ h, int k, double *out)
{
    __shared__ float d[DIAG_CHUNK];
    double s = 0.0;
    for (int base = 0; base < k; base += DIAG_CHUNK) {
        const int m = k - base < DIAG_CHUNK ? k - base : DIAG_CHUNK;
        for (int i = threadIdx.x; i < m; i += blockDim.x) d[i] = h[(size_t)(base + i) * k + base + i];
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 0; i < m; i++) s = __dadd_rn(s, (double)d[i]);
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = s;
}

__global__ void k_fill(float *p, int n, float v)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

/* One 128×128 tile (blockIdx.y, blockIdx.x) of Hr = Had·(S·H·S + add·I)·Had. */
__global__ void __launch_bounds__(ROT_THREADS) k_rotate(const float *__restrict__ h, int k,
                                                        const float *__restrict__ su, float add,
                                                        float *__restrict__ hr, float *__restrict__ l,
                                                        float *__restrict__ h_diag)
{
    extern __shared__ float s[]; /* TILE × ROT_LD */
    const int r0 = blockIdx.y * TILE, c0 = blockIdx.x * TILE;
    const bool diag = r0 == c0;
    for (int e = threadIdx.x; e < TILE * TILE; e += ROT_THREADS) {
        const int r = e / TILE, c = e % TILE;
        const float x = h[(size_t)(r0 + r) * k + c0 + c];
        float v = __fmul_rn(__fmul_rn(x, su[r0 + r]), su[c0 + c]);
        if (diag && r == c) {
            v = __fadd_rn(v, add);
            h_diag[r0 + r] = __fadd_rn(x, add);
        }
        s[r * ROT_LD + c] = v;
    }
    __syncthreads();
    /* rows: v ← v·H, trellis_had128's stages h = 1, 2, …, 64 */
    for (int lh = 0; lh < 7; lh++) {
        const int hh = 1 << lh;
        for (int p = threadIdx.x; p < TILE * TILE / 2; p += ROT_THREADS) {
            const int r = p >> 6, q = p & 63;
            const int j = ((q >> lh) << (lh + 1)) | (q & (hh - 1));
            float *row = s + r * ROT_LD;
            const float a = row[j], c = row[j + hh];
            row[j] = __fadd_rn(a, c);
            row[j + hh] = __fsub_rn(a, c);
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < TILE * TILE; e += ROT_THREADS) {
        float *p = s + (e / TILE) * ROT_LD + e % TILE;
        *p = __fmul_rn(*p, HAD_SCALE_F);
    }
    __syncthreads();
    /* columns: m ← H·m, trellis_had128_left's stages */
    for (int lh = 0; lh < 7; lh++) {
        const int hh = 1 << lh;
        for (int p = threadIdx.x; p < TILE * TILE / 2; p += ROT_THREADS) {
            const int c = p & (TILE - 1), q = p >> 7;
            const int j = ((q >> lh) << (lh + 1)) | (q & (hh - 1));
            const float a = s[j * ROT_LD + c], b = s[(j + hh) * ROT_LD + c];
            s[j * ROT_LD + c] = __fadd_rn(a, b);
            s[(j + hh) * ROT_LD + c] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < TILE * TILE; e += ROT_THREADS) {
        const int r = e / TILE, c = e % TILE;
        const float v = __fmul_rn(s[r * ROT_LD + c], HAD_SCALE_F);
        const size_t g = (size_t)(r0 + r) * k + c0 + c;
        hr[g] = v;
        l[g] = v;
    }
}

/* Unblocked Cholesky of the n×n (n ≤ 128) diagonal block at a (row-major,
 * leading dimension ld, lower triangle), whose first column is column `off`
 * of the whole matrix. Does nothing if *info is already set. */
__global__ void __launch_bounds__(CHOL_THREADS_X *CHOL_THREADS_Y) k_chol_diag(float *a, int ld, int n, int off,
                                                                             int *info)
{
    extern __shared__ float s[]; /* n × (n + 1) */
    __shared__ int fail;
    __shared__ float piv;
    if (*(volatile int *)info != 0) return; /* uniform across the block */
    const int sl = n + 1, tx = threadIdx.x, ty = threadIdx.y, tid = ty * CHOL_THREADS_X + tx;
    const int nt = CHOL_THREADS_X * CHOL_THREADS_Y;
    for (int e = tid; e < n * n; e += nt) {
        const int r = e / n, c = e % n;
        s[r * sl + c] = c <= r ? a[(size_t)r * ld + c] : 0.0f;
    }
    if (tid == 0) fail = 0;
    __syncthreads();
    for (int j = 0; j < n; j++) {
        if (tid == 0) {
            const float d = s[j * sl + j];
            if (!(d > 0.0f) || !isfinite(d)) {
                fail = 1;
                atomicCAS(info, 0, off + j + 1);
            } else {
                piv = sqrtf(d);
                s[j * sl + j] = piv;
            }
        }
        __syncthreads();
        if (fail) return;
        const float p = piv;
        for (int i = j + 1 + tid; i < n; i += nt) s[i * sl + j] = __fdiv_rn(s[i * sl + j], p);
        __syncthreads();
        for (int i = j + 1 + ty; i < n; i += CHOL_THREADS_Y) {
            const float lij = s[i * sl + j];
            for (int c = j + 1 + tx; c <= i; c += CHOL_THREADS_X)
                s[i * sl + c] = fmaf(-lij, s[c * sl + j], s[i * sl + c]);
        }
        __syncthreads();
    }
    for (int e = tid; e < n * n; e += nt) {
        const int r = e / n, c = e % n;
        if (c <= r) a[(size_t)r * ld + c] = s[r * sl + c];
    }
}

/* Per 16×16 diagonal block b of the factor: dl[b] = its lower triangle
 * (zeros above), d_diag[16b + r] = Σ_{c ≤ r} C[16b+r][16b+c]² in double. */
__global__ void k_ldl_blocks(const float *__restrict__ l, int k, float *__restrict__ dl, float *__restrict__ d_diag)
{
    __shared__ float t[256];
    const int b = blockIdx.x * 16, r = threadIdx.x / 16, c = threadIdx.x % 16;
    const float v = c <= r ? l[(size_t)(b + r) * k + b + c] : 0.0f;
    t[threadIdx.x] = v;
    dl[(size_t)blockIdx.x * 256 + threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x < 16) {
        double s = 0.0;
        for (int cc = 0; cc <= (int)threadIdx.x; cc++) {
            const double x = t[threadIdx.x * 16 + cc];
            s = __dadd_rn(s, __dmul_rn(x, x));
        }
        d_diag[b + threadIdx.x] = (float)s;
    }
}

/* L's 16 columns of block blockIdx.y for the rows of this block. */
__global__ void k_ldl_apply(float *__restrict__ l, int k, const float *__restrict__ dl)
{
    __shared__ float t[256];
    const int bj = blockIdx.y, b = bj * 16;
    t[threadIdx.x] = dl[(size_t)bj * 256 + threadIdx.x]; /* blockDim.x == 256 */
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    float4 *row = reinterpret_cast<float4 *>(l + (size_t)i * k + b);
    float x[16];
    if (i < b + 16) {
        for (int c = 0; c < 16; c++) x[c] = (i - b == c) ? 1.0f : 0.0f;
    } else {
        for (int q = 0; q < 4; q++) {
            const float4 v = row[q];
            x[4 * q] = v.x, x[4 * q + 1] = v.y, x[4 * q + 2] = v.z, x[4 * q + 3] = v.w;
        }
        /* x·DL = c, DL lower: column 15 first */
#pragma unroll
        for (int c = 15; c >= 0; c--) {
            float v = x[c];
#pragma unroll
            for (int r = c + 1; r < 16; r++) v = fmaf(-x[r], t[r * 16 + c], v);
            x[c] = __fdiv_rn(v, t[c * 16 + c]);
        }
    }
    for (int q = 0; q < 4; q++) row[q] = make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
}

/* qz_hess_finish on a 32×32 tile pair: h[r][c] = h[r][c]·inv (c ≥ r), mirrored. */
__global__ void k_finish(float *h, int k, float inv)
{
    __shared__ float t[32][33];
    const int ti = blockIdx.y, tj = blockIdx.x;
    if (tj < ti) return;
    const int r0 = ti * 32, c0 = tj * 32, tx = threadIdx.x;
    for (int ty = threadIdx.y; ty < 32; ty += blockDim.y) t[ty][tx] = h[(size_t)(r0 + ty) * k + c0 + tx];
    __syncthreads();
    if (ti == tj) {
        for (int ty = threadIdx.y; ty < 32; ty += blockDim.y) {
            const float v = tx >= ty ? t[ty][tx] : t[tx][ty];
            h[(size_t)(r0 + ty) * k + c0 + tx] = __fmul_rn(v, inv);
        }
        return;
    }
    for (int ty = threadIdx.y; ty < 32; ty += blockDim.y) {
        h[(size_t)(r0 + ty) * k + c0 + tx] = __fmul_rn(t[ty][tx], inv);
        h[(size_t)(c0 + ty) * k + r0 + tx] = __fmul_rn(t[tx][ty], inv);
    }
}

/* --- cuBLAS ---------------------------------------------------------------------- */

sparq_status blas_status(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return SPARQ_OK;
    return sparq_err(s == CUBLAS_STATUS_ALLOC_FAILED ? SPARQ_E_NOMEM : SPARQ_E_STATE, "cuda: %s failed (cuBLAS status %d)",
                     what, (int)s);
}

/* The caller's handle set to our stream, host scalars and the default math
 * mode (fp32, no TF32) for the call, and put back as it was. */
struct blas_scope {
    cublasHandle_t h = nullptr;
    cudaStream_t old_stream = nullptr;
    cublasPointerMode_t old_pm = CUBLAS_POINTER_MODE_HOST;
    cublasMath_t old_math = CUBLAS_DEFAULT_MATH;
    bool active = false;

    sparq_status enter(void *handle, cudaStream_t s)
    {
        RETURN_IF(!handle, SPARQ_E_ARG, "cuda hessian: no cuBLAS handle given");
        h = (cublasHandle_t)handle;
        FORWARD_IF(blas_status(cublasGetStream(h, &old_stream), "cublasGetStream"));
        FORWARD_IF(blas_status(cublasGetPointerMode(h, &old_pm), "cublasGetPointerMode"));
        FORWARD_IF(blas_status(cublasGetMathMode(h, &old_math), "cublasGetMathMode"));
        active = true;
        FORWARD_IF(blas_status(cublasSetStream(h, s), "cublasSetStream"));
        FORWARD_IF(blas_status(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode"));
        FORWARD_IF(blas_status(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
        return SPARQ_OK;
    }
    ~blas_scope()
    {
        if (!active) return;
        cublasSetStream(h, old_stream);
        cublasSetPointerMode(h, old_pm);
        cublasSetMathMode(h, old_math);
    }
};

sparq_status kernels_setup(void)
{
    /* per device (the attribute is); idempotent: a race only sets it twice */
    static unsigned char done[64];
    int dev = 0;
    CUDA_RETURN_IF(cudaGetDevice(&dev), "hessian: current device");
    if (dev >= 0 && dev < 64 && done[dev]) return SPARQ_OK;
    const int bytes = CHOL_DIAG_MAX * (CHOL_DIAG_MAX + 1) * (int)sizeof(float);
    CUDA_RETURN_IF(cudaFuncSetAttribute(k_chol_diag, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                   "cholesky: %d bytes of shared memory for the diagonal block", bytes);
    const int rot = TILE * ROT_LD * (int)sizeof(float);
    CUDA_RETURN_IF(cudaFuncSetAttribute(k_rotate, cudaFuncAttributeMaxDynamicSharedMemorySize, rot),
                   "hessian rotation: %d bytes of shared memory", rot);
    if (dev >= 0 && dev < 64) done[dev] = 1;
    return SPARQ_OK;
}

/* Cholesky of the n×n block at a (leading dimension ld; column `off` of the
 * whole matrix), panels of nb; info: device int. Queued on the handle's stream. */
sparq_status chol_blocked(cublasHandle_t h, cudaStream_t s, float *a, int ld, int n, int off, int nb, int *info)
{
    const float one = 1.0f, minus_one = -1.0f;
    for (int j = 0; j < n; j += nb) {
        const int jb = n - j < nb ? n - j : nb, rest = n - j - jb;
        float *d = a + (size_t)j * ld + j;
        if (jb <= CHOL_DIAG_MAX) {
            const size_t smem = (size_t)jb * (jb + 1) * sizeof(float);
            k_chol_diag<<<1, dim3(CHOL_THREADS_X, CHOL_THREADS_Y), smem, s>>>(d, ld, jb, off + j, info);
            CUDA_RETURN_IF(cudaGetLastError(), "cholesky: diagonal block at column %d (%d wide)", off + j, jb);
        } else {
            FORWARD_IF(chol_blocked(h, s, d, ld, jb, off + j, CHOL_DIAG_MAX, info));
        }
        if (rest == 0) break;
        float *p = d + (size_t)jb * ld; /* rows j+jb.., columns j..j+jb */
        FORWARD_IF(blas_status(cublasStrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T,
                                           CUBLAS_DIAG_NON_UNIT, jb, rest, &one, d, ld, p, ld),
                               "cholesky: cublasStrsm"));
        FORWARD_IF(blas_status(cublasSsyrk(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, rest, jb, &minus_one, p, ld, &one,
                                           p + jb, ld),
                               "cholesky: cublasSsyrk"));
    }
    return SPARQ_OK;
}

sparq_status check_nb(int *nb)
{
    if (*nb == 0) *nb = HESS_CUDA_CHOL_NB;
    RETURN_IF(*nb != 64 && *nb != 128 && *nb != 256, SPARQ_E_ARG, "cholesky: panel width %d, expected 64, 128 or 256",
              *nb);
    return SPARQ_OK;
}

} // namespace

/* --- API ------------------------------------------------------------------------ */

extern "C" sparq_status hess_cuda_blas_create(void **cublas)
{
    *cublas = NULL;
    cublasHandle_t h = nullptr;
    FORWARD_IF(blas_status(cublasCreate(&h), "cublasCreate"));
    *cublas = h;
    return SPARQ_OK;
}

extern "C" void hess_cuda_blas_destroy(void *cublas)
{
    if (cublas) cublasDestroy((cublasHandle_t)cublas);
}

extern "C" size_t hess_cuda_bytes(int k)
{
    return k > 0 ? layout_for(k).total : 0;
}

extern "C" sparq_status hess_cuda_accumulate(void *cublas, void *stream, float *h, int k, const float *x, int rows)
{
    RETURN_IF(k <= 0 || rows < 0, SPARQ_E_ARG, "cuda hessian: accumulate %d rows of %d", rows, k);
    if (rows == 0) return SPARQ_OK;
    blas_scope bs;
    FORWARD_IF(bs.enter(cublas, (cudaStream_t)stream));
    const float one = 1.0f;
    /* row-major x (rows×k) is the column-major k×rows A; xᵀx = A·Aᵀ; the
     * column-major lower triangle is the row-major upper one */
    return blas_status(cublasSsyrk(bs.h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, k, rows, &one, x, k, &one, h, k),
                       "cuda hessian: cublasSsyrk");
}

extern "C" sparq_status hess_cuda_finish(void *stream, float *h, int k, uint64_t count)
{
    RETURN_IF(k <= 0 || k % 32, SPARQ_E_SHAPE, "cuda hessian: size %d is not a multiple of 32", k);
    const float inv = count ? 1.0f / (float)count : 0.0f; /* qz_hess_finish's */
    k_finish<<<dim3(k / 32, k / 32), dim3(32, 8), 0, (cudaStream_t)stream>>>(h, k, inv);
    CUDA_RETURN_IF(cudaGetLastError(), "hessian finish (%d x %d)", k, k);
    return SPARQ_OK;
}

extern "C" sparq_status hess_cuda_cholesky(void *cublas, void *stream, float *a, int n, int nb, int *info)
{
    *info = 0;
    RETURN_IF(n <= 0, SPARQ_E_ARG, "cholesky: size %d", n);
    FORWARD_IF(check_nb(&nb));
    FORWARD_IF(kernels_setup());
    cudaStream_t s = (cudaStream_t)stream;
    blas_scope bs;
    FORWARD_IF(bs.enter(cublas, s));
    int *dinfo = nullptr;
    CUDA_RETURN_IF(cudaMalloc(&dinfo, sizeof *dinfo), "cholesky: info word");
    sparq_status st = cuda_status(cudaMemsetAsync(dinfo, 0, sizeof *dinfo, s), "cholesky: info word");
    if (st == SPARQ_OK) st = chol_blocked(bs.h, s, a, n, n, 0, nb, dinfo);
    if (st == SPARQ_OK) st = cuda_status(cudaMemcpyAsync(info, dinfo, sizeof *info, cudaMemcpyDeviceToHost, s), "cholesky: info");
    if (st == SPARQ_OK) st = cuda_status(cudaStreamSynchronize(s), "cholesky");
    cudaFree(dinfo);
    return st;
}

extern "C" void hess_cuda_free(hess_cuda *hs)
{
    if (!hs) return;
    if (hs->mem && hs->owns_mem) cudaFree(hs->mem);
    memset(hs, 0, sizeof *hs);
}

namespace {

sparq_status prepare(cublasHandle_t cb, cudaStream_t s, const float *h, int k, float sigma_reg, uint64_t seed,
                     const char *name, char *mem, hess_cuda *hs)
{
    const hess_layout L = layout_for(k);
    if (!mem) {
        CUDA_RETURN_IF(cudaMalloc(&mem, L.total), "%s: %zu bytes for a %d x %d Hessian", name, L.total, k, k);
        hs->owns_mem = 1;
    }
    hs->mem = mem;
    hs->k = k;
    hs->su = (float *)(mem + L.su);
    hs->h_diag = (float *)(mem + L.h_diag);
    hess_stats *stats = (hess_stats *)(mem + L.stats);
    float *dl = (float *)(mem + L.dl);

    float *su = (float *)sparq_malloc((size_t)k * sizeof(float));
    RETURN_IF(!su, SPARQ_E_NOMEM, "%s: out of memory for the input signs", name);
    ldlq_random_signs(su, k, seed);
    const cudaError_t ce = cudaMemcpyAsync(hs->su, su, (size_t)k * sizeof(float), cudaMemcpyHostToDevice, s);
    const cudaError_t ce2 = ce == cudaSuccess ? cudaStreamSynchronize(s) : ce; /* su is host memory we free now */
    sparq_free(su);
    CUDA_RETURN_IF(ce2, "%s: input signs", name);

    hess_stats hst = {0.0, 0, 0};
    if (h) {
        CUDA_RETURN_IF(cudaMemsetAsync(stats, 0, sizeof *stats, s), "%s: Hessian statistics", name);
        const size_t n = (size_t)k * k;
        const int blocks = (int)((n + 255) / 256 < (size_t)sm_count() * 8 ? (n + 255) / 256 : (size_t)sm_count() * 8);
        k_nonfinite<<<blocks, 256, 0, s>>>(h, n, &stats->nonfinite);
        k_diag_sum<<<1, 1024, 0, s>>>(h, k, &stats->diag_sum);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: Hessian statistics", name);
        CUDA_RETURN_IF(cudaMemcpyAsync(&hst, stats, sizeof hst, cudaMemcpyDeviceToHost, s), "%s: Hessian statistics",
                       name);
        CUDA_RETURN_IF(cudaStreamSynchronize(s), "%s: Hessian statistics", name);
    }
    const double diag_mean = hst.diag_sum / k;
    if (!h || hst.nonfinite || !(diag_mean > 1e-20)) {
        hs->identity = 1;
        k_fill<<<(k + 255) / 256, 256, 0, s>>>(hs->h_diag, k, 1.0f);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: identity Hessian", name);
        CUDA_RETURN_IF(cudaStreamSynchronize(s), "%s: identity Hessian", name);
        return SPARQ_OK;
    }

    hs->hr = (float *)(mem + L.hr);
    hs->l = (float *)(mem + L.l);
    hs->d_diag = (float *)(mem + L.d_diag);
    const int tiles = k / TILE;
    float damp = sigma_reg;
    for (int attempt = 0; attempt < 9; attempt++, damp *= 4.0f) {
        const float add = (float)(damp * diag_mean); /* ldlq.c's expression */
        k_rotate<<<dim3(tiles, tiles), ROT_THREADS, TILE * ROT_LD * sizeof(float), s>>>(h, k, hs->su, add, hs->hr,
                                                                                       hs->l, hs->h_diag);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: Hessian rotation", name);
        CUDA_RETURN_IF(cudaMemsetAsync(&stats->info, 0, sizeof(int), s), "%s: Cholesky", name);
        const sparq_status cst = chol_blocked(cb, s, hs->l, k, k, 0, HESS_CUDA_CHOL_NB, &stats->info);
        if (cst != SPARQ_OK) return sparq_err_context(cst, "%s", name);
        int info = 0;
        CUDA_RETURN_IF(cudaMemcpyAsync(&info, &stats->info, sizeof info, cudaMemcpyDeviceToHost, s), "%s: Cholesky",
                       name);
        CUDA_RETURN_IF(cudaStreamSynchronize(s), "%s: Cholesky (%d x %d)", name, k, k);
        if (info != 0) continue;
        k_ldl_blocks<<<k / 16, 256, 0, s>>>(hs->l, k, dl, hs->d_diag);
        k_ldl_apply<<<dim3((k + 255) / 256, k / 16), 256, 0, s>>>(hs->l, k, dl);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: block LDL", name);
        CUDA_RETURN_IF(cudaStreamSynchronize(s), "%s: block LDL (%d x %d)", name, k, k);
        hs->damping = damp;
        return SPARQ_OK;
    }
    return sparq_err(SPARQ_E_FORMAT, "%s: Hessian is not positive definite even with damping %.3g x mean(diag)", name,
                     (double)(damp / 4.0f));
}

} // namespace

extern "C" sparq_status hess_cuda_prepare_into(void *cublas, void *stream, const float *h, int k, float sigma_reg,
                                               uint64_t seed, const char *name, void *mem, size_t mem_bytes,
                                               hess_cuda *out)
{
    memset(out, 0, sizeof *out);
    if (!name) name = "hessian";
    RETURN_IF(k <= 0 || k % 128 != 0, SPARQ_E_SHAPE, "%s: input size %d is not a multiple of 128", name, k);
    RETURN_IF(mem && (mem_bytes < hess_cuda_bytes(k) || (uintptr_t)mem % 256), SPARQ_E_ARG,
              "%s: %zu bytes of device memory at %p for a %d x %d Hessian, which needs %zu, 256-byte aligned", name,
              mem_bytes, mem, k, k, hess_cuda_bytes(k));
    if (sigma_reg <= 0.0f) sigma_reg = LDLQ_SIGMA_REG;
    FORWARD_IF(kernels_setup());
    cudaStream_t s = (cudaStream_t)stream;
    blas_scope bs;
    FORWARD_IF(bs.enter(cublas, s));
    const sparq_status st = prepare(bs.h, s, h, k, sigma_reg, seed, name, (char *)mem, out);
    if (st != SPARQ_OK) hess_cuda_free(out);
    return st;
}

extern "C" sparq_status hess_cuda_prepare(void *cublas, void *stream, const float *h, int k, float sigma_reg,
                                          uint64_t seed, const char *name, hess_cuda *out)
{
    return hess_cuda_prepare_into(cublas, stream, h, k, sigma_reg, seed, name, NULL, 0, out);
}
