/* kernels/cuda/ldlq_cuda.cu — the batched block-LDLQ recursion
 * (ldlq_cuda.h): per 16-row strip, one kernel copies every weight's strip of
 * wr into its target, one batched SGEMM adds L[later, strip]ᵀ·err[later],
 * one kernel gathers the targets into stream-order tiles (and their diag(D)
 * weights), the encoder runs every tile of the strip, one kernel writes the
 * error rows (wr − decoded; and wq when asked) and packs each tile's states
 * into its 16K trellis words exactly as trellis_tile_pack. Then per weight
 * the proxy: SGEMM Hr·E and Hr·W, sums of products per block in double,
 * added on the host in block order (deterministic). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/hessian_cuda.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "kernels/cuda/trellis_encode.h"

#include <string.h>

extern "C" {
#include "common/alloc.h"
}

namespace {

/* t[i] (16×n) = w[i] rows b..b+15, for every item i (grid-stride over items × 16n). */
__global__ void k_strip_copy(float *const *t, const float *const *w, int n_items, int n, int b)
{
    const size_t per = (size_t)16 * n, total = per * n_items;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        const size_t i = x / per, o = x % per;
        t[i][o] = w[i][(size_t)b * n + o];
    }
}

/* The batched SGEMM's operands for strip b (items with a Hessian only). */
__global__ void k_gemm_ptrs(const float **a, const float **bm, float **c, float *const *err, const float *const *l,
                            float *const *t, int n_nz, int n, int k, int b)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_nz) return;
    a[i] = err[i] + (size_t)(b + 16) * n;
    bm[i] = l[i] + (size_t)(b + 16) * k + b;
    c[i] = t[i];
}

/* tiles[(i·tn + tj)·256 + p] = t[i][row(p)·n + tj·16 + col(p)]; tw likewise = d[i][b + row(p)]. */
__global__ void k_gather(float *tiles, float *tw, float *const *t, const float *const *d, int n_items, int n, int b)
{
    const int tn = n / 16;
    const size_t total = (size_t)n_items * tn * 256;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(x & 255);
        const size_t tile = x >> 8;
        const int i = (int)(tile / tn), tj = (int)(tile % tn);
        const int r = trellis_pos_row(p), col = tj * 16 + trellis_pos_col(p);
        tiles[x] = t[i][(size_t)r * n + col];
        if (tw) tw[x] = d[i] ? d[i][b + r] : 1.0f;
    }
}

/* err[i] rows b.. = w[i] − decoded (and wq[i] = decoded when wq is given). */
__global__ void k_scatter(float *const *err, float *const *wq, const float *const *w, const float *dec, int n_items,
                          int n, int b)
{
    const int tn = n / 16;
    const size_t total = (size_t)n_items * tn * 256;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(x & 255);
        const size_t tile = x >> 8;
        const int i = (int)(tile / tn), tj = (int)(tile % tn);
        const size_t o = (size_t)(b + trellis_pos_row(p)) * n + tj * 16 + trellis_pos_col(p);
        const float v = dec[x];
        err[i][o] = __fsub_rn(w[i][o], v);
        if (wq) wq[i][o] = v;
    }
}

/* trellis_tile_pack for every tile of the strip: 256·K bits MSB-first in 32-bit
 * words stored as two little-endian int16. One thread per 32-bit word: word j
 * holds the bits 32j..32j+31 of the stream. */
__global__ void k_pack(uint16_t *const *trellis, const uint16_t *states, int n_items, int tn, int ti, int K)
{
    const int nw = 8 * K;
    const size_t total = (size_t)n_items * tn * nw;
    const uint32_t mask = (1u << K) - 1;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        const int j = (int)(x % nw);
        const size_t tile = x / nw;
        const int i = (int)(tile / tn), tj = (int)(tile % tn);
        const uint16_t *st = states + tile * 256;
        uint32_t word = 0;
        for (int bit = 32 * j; bit < 32 * j + 32; bit++) {
            const int p = bit / K, bb = bit % K;
            const uint32_t v = st[p] & mask;
            if (v & (1u << (K - 1 - bb))) word |= 1u << (31 - (bit & 31));
        }
        uint16_t *out = trellis[i] + ((size_t)ti * tn + tj) * (size_t)(16 * K);
        out[2 * j] = (uint16_t)(word & 0xFFFF);
        out[2 * j + 1] = (uint16_t)(word >> 16);
    }
}

/* Per-block partial sums of a[x]·b[x] in double (block order fixed). */
#define DOT_BLOCKS 1024
__global__ void k_dot(const float *a, const float *b, size_t n, double *partial)
{
    double s = 0.0;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < n; x += (size_t)gridDim.x * blockDim.x)
        s += (double)a[x] * (double)b[x];
    __shared__ double red[256];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

inline unsigned grid_for(size_t total)
{
    size_t g = (total + 255) / 256;
    const size_t cap = (size_t)sm_count() * 16;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

inline sparq_status cublas_status(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return SPARQ_OK;
    return sparq_err(s == CUBLAS_STATUS_ALLOC_FAILED ? SPARQ_E_NOMEM : SPARQ_E_STATE, "cublas: %s: status %d", what,
                     (int)s);
}

} // namespace

struct ldlq_cuda {
    cudaStream_t stream;
    cublasHandle_t blas;
    size_t enc_ws;
    trellis_cuda_enc *enc;
    int enc_K, enc_cb;
};

extern "C" sparq_status ldlq_cuda_create(size_t enc_workspace, ldlq_cuda **out)
{
    *out = NULL;
    ldlq_cuda *c = (ldlq_cuda *)sparq_calloc(1, sizeof *c);
    RETURN_IF(!c, SPARQ_E_NOMEM, "cuda ldlq: out of memory");
    c->enc_ws = enc_workspace;
    c->enc_K = -1;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        sparq_free(c);
        return cuda_status(e, "ldlq: stream");
    }
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(c->stream);
        sparq_free(c);
        return sparq_err(SPARQ_E_STATE, "cuda ldlq: cublasCreate failed");
    }
    cublasSetStream(c->blas, c->stream);
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* fp32 FMA, never TF32 */
    *out = c;
    return SPARQ_OK;
}

extern "C" void ldlq_cuda_free(ldlq_cuda *c)
{
    if (!c) return;
    trellis_cuda_enc_free(c->enc);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    sparq_free(c);
}

extern "C" sparq_status ldlq_cuda_mem_info(ldlq_cuda *c, size_t *free_bytes, size_t *total_bytes)
{
    (void)c;
    CUDA_RETURN_IF(cudaMemGetInfo(free_bytes, total_bytes), "ldlq: memory info");
    return SPARQ_OK;
}

static sparq_status get_enc(ldlq_cuda *c, int K, trellis_codebook cb)
{
    if (c->enc && c->enc_K == K && c->enc_cb == (int)cb) return SPARQ_OK;
    trellis_cuda_enc_free(c->enc);
    c->enc = NULL;
    c->enc_K = -1;
    FORWARD_IF(trellis_cuda_enc_create(K, cb, c->enc_ws, &c->enc));
    c->enc_K = K, c->enc_cb = (int)cb;
    return SPARQ_OK;
}

extern "C" sparq_status ldlq_cuda_encoder_bytes(ldlq_cuda *c, int K, trellis_codebook cb, size_t *bytes)
{
    FORWARD_IF(get_enc(c, K, cb));
    *bytes = (size_t)trellis_cuda_enc_slots(c->enc) * trellis_cuda_enc_slot_bytes(K, cb);
    return SPARQ_OK;
}

extern "C" sparq_status ldlq_cuda_encode_host(ldlq_cuda *c, int K, trellis_codebook cb, const float *x, size_t n_tiles,
                                              uint16_t *states, float *decoded)
{
    FORWARD_IF(get_enc(c, K, cb));
    return trellis_cuda_encode_tiles_host(c->enc, x, NULL, n_tiles, states, decoded, NULL, NULL);
}

/* Device bytes of one batch, in the order run_batch carves them (each piece
 * rounded up to 64 bytes: the 64·16 at the end). */
static size_t batch_bytes(const ldlq_cuda_shape *s, int n_hess, int n_items, int want_wq)
{
    const size_t k = (size_t)s->k, n = (size_t)s->n, kn = k * n, tiles = kn / 256;
    const size_t hess = (size_t)n_hess * (2 * k * k + k) * sizeof(float);
    const size_t w = (size_t)n_items * kn * sizeof(float) * (want_wq ? 3 : 2);             /* wr, err (, wq) */
    const size_t strip = (size_t)n_items * 16 * n * (sizeof(float) * 4 + sizeof(uint16_t)); /* t, tiles, tw, dec, states */
    const size_t trellis = (size_t)n_items * tiles * 16 * s->K * sizeof(uint16_t);
    const size_t ptrs = (size_t)n_items * 12 * sizeof(void *), proxy = kn * sizeof(float) + DOT_BLOCKS * 8;
    return hess + w + strip + trellis + ptrs + proxy + 64 * 16;
}

extern "C" size_t ldlq_cuda_batch_bytes(const ldlq_cuda_shape *s, int n_hess, int n_items, int want_wq)
{
    return batch_bytes(s, n_hess, n_items, want_wq);
}

/* Carves aligned pieces out of one allocation. */
struct carver {
    char *p;
    template <typename T>
    T *take(size_t count)
    {
        T *r = (T *)p;
        p += (count * sizeof(T) + 63) / 64 * 64;
        return r;
    }
};

static sparq_status proxy_of(ldlq_cuda *c, const float *hr, const float *x, int k, int n, float *tmp,
                             double *partial, double *host_partial, double *out)
{
    const size_t kn = (size_t)k * n;
    const float *y = x;
    if (hr) {
        const float one = 1.0f, zero = 0.0f;
        /* row-major tmp = Hr·X  ⇔  column-major tmpᵀ = Xᵀ·Hrᵀ (Hr's buffer read column-major is Hrᵀ) */
        FORWARD_IF(cublas_status(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, k, k, &one, x, n, hr, k, &zero,
                                             tmp, n), "proxy gemm"));
        y = tmp;
    }
    k_dot<<<DOT_BLOCKS, 256, 0, c->stream>>>(x, y, kn, partial);
    CUDA_RETURN_IF(cudaGetLastError(), "ldlq: proxy sums");
    CUDA_RETURN_IF(cudaMemcpyAsync(host_partial, partial, DOT_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost,
                                   c->stream), "ldlq: proxy download");
    CUDA_RETURN_IF(cudaStreamSynchronize(c->stream), "ldlq: proxy");
    double s = 0.0;
    for (int i = 0; i < DOT_BLOCKS; i++) s += host_partial[i];
    *out = s;
    return SPARQ_OK;
}

static sparq_status run_batch(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                              int n_host, ldlq_cuda_item *items, int n_items, const char *name, char *base)
{
    const int k = s->k, n = s->n, K = s->K, tk = k / 16, tn = n / 16;
    const size_t kn = (size_t)k * n, kk = (size_t)k * k, words = (size_t)tk * tn * 16 * K;
    int want_wq = 0;
    for (int i = 0; i < n_items; i++) want_wq |= items[i].wq != NULL;
    const size_t total = batch_bytes(s, n_host, n_items, want_wq);
    carver cv = {base};
    float *hbuf = cv.take<float>((size_t)n_host * (2 * kk + k));
    float *wbuf = cv.take<float>((size_t)n_items * kn);
    float *ebuf = cv.take<float>((size_t)n_items * kn);
    float *qbuf = want_wq ? cv.take<float>((size_t)n_items * kn) : NULL;
    float *tbuf = cv.take<float>((size_t)n_items * 16 * n);
    float *tiles = cv.take<float>((size_t)n_items * 16 * n);
    float *tw = cv.take<float>((size_t)n_items * 16 * n);
    float *dec = cv.take<float>((size_t)n_items * 16 * n);
    uint16_t *states = cv.take<uint16_t>((size_t)n_items * 16 * n);
    uint16_t *trel = cv.take<uint16_t>((size_t)n_items * words);
    void **ptrs = cv.take<void *>((size_t)n_items * 12);
    float *tmp = cv.take<float>(kn);
    double *partial = cv.take<double>(DOT_BLOCKS);
    if ((size_t)(cv.p - base) > total) return sparq_err(SPARQ_E_STATE, "%s: ldlq batch layout overflow", name);

    /* Uploads: the Hessians, then each weight. */
    const float **hr_dev = (const float **)sparq_calloc((size_t)n_hess, sizeof *hr_dev);
    void **hp = (void **)sparq_calloc((size_t)n_items * 12, sizeof *hp);
    double *hpart = (double *)sparq_malloc(DOT_BLOCKS * sizeof(double));
    sparq_status st = hr_dev && hp && hpart ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    /* device Hessians are read in place; host ones get a slot of hbuf each, in order */
    const float **l_dev = (const float **)sparq_calloc((size_t)n_hess, sizeof *l_dev);
    const float **d_dev = (const float **)sparq_calloc((size_t)n_hess, sizeof *d_dev);
    if (st == SPARQ_OK && (!l_dev || !d_dev)) st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    for (int h = 0, slot = 0; h < n_hess && st == SPARQ_OK; h++) {
        if (!hs[h].hr) continue;
        if (hs[h].device) {
            hr_dev[h] = hs[h].hr, l_dev[h] = hs[h].l, d_dev[h] = hs[h].d;
            continue;
        }
        float *dh = hbuf + (size_t)slot++ * (2 * kk + k);
        st = cuda_status(cudaMemcpyAsync(dh, hs[h].hr, kk * 4, cudaMemcpyHostToDevice, c->stream), "upload Hr");
        if (st == SPARQ_OK)
            st = cuda_status(cudaMemcpyAsync(dh + kk, hs[h].l, kk * 4, cudaMemcpyHostToDevice, c->stream), "upload L");
        if (st == SPARQ_OK)
            st = cuda_status(cudaMemcpyAsync(dh + 2 * kk, hs[h].d, (size_t)k * 4, cudaMemcpyHostToDevice, c->stream),
                             "upload D");
        hr_dev[h] = dh, l_dev[h] = dh + kk, d_dev[h] = dh + 2 * kk;
    }
    /* host pointer tables: [0] t, [1] w, [2] err, [3] wq, [4] d (per item, NULL for identity),
     * [5] trellis; then for the items with a Hessian: [6] err, [7] L, [8] t; [9..11] the GEMM's A, B, C */
    void **P[12];
    for (int a = 0; a < 12; a++) P[a] = hp + (size_t)a * n_items;
    int n_nz = 0;
    for (int i = 0; i < n_items && st == SPARQ_OK; i++) {
        const ldlq_cuda_item *it = &items[i];
        if (it->hess < 0 || it->hess >= n_hess) {
            st = sparq_err(SPARQ_E_ARG, "item %d: Hessian %d of %d", i, it->hess, n_hess);
            break;
        }
        const bool ident = !hs[it->hess].hr;
        P[0][i] = tbuf + (size_t)i * 16 * n;
        P[1][i] = wbuf + (size_t)i * kn;
        P[2][i] = ebuf + (size_t)i * kn;
        P[3][i] = qbuf ? qbuf + (size_t)i * kn : NULL;
        P[4][i] = ident ? NULL : (void *)d_dev[it->hess];
        P[5][i] = trel + (size_t)i * words;
        if (!ident) {
            P[6][n_nz] = P[2][i];
            P[7][n_nz] = (void *)l_dev[it->hess];
            P[8][n_nz] = P[0][i];
            n_nz++;
        }
        st = cuda_status(cudaMemcpyAsync(P[1][i], it->wr, kn * 4, cudaMemcpyHostToDevice, c->stream), "upload W");
    }
    void **D[12];
    for (int a = 0; a < 12; a++) D[a] = ptrs + (size_t)a * n_items;
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpyAsync(ptrs, hp, (size_t)n_items * 12 * sizeof(void *), cudaMemcpyHostToDevice,
                                         c->stream), "upload pointers");
    if (st == SPARQ_OK) st = get_enc(c, K, s->cb);

    const int weighted = s->weighted;
    const size_t strip_vals = (size_t)n_items * 16 * n;
    const float one = 1.0f;
    for (int ti = tk - 1; ti >= 0 && st == SPARQ_OK; ti--) {
        const int b = ti * 16, rest = k - b - 16;
        k_strip_copy<<<grid_for(strip_vals), 256, 0, c->stream>>>((float *const *)D[0], (const float *const *)D[1],
                                                                  n_items, n, b);
        if (rest > 0 && n_nz > 0) {
            k_gemm_ptrs<<<(n_nz + 127) / 128, 128, 0, c->stream>>>(
                (const float **)D[9], (const float **)D[10], (float **)D[11], (float *const *)D[6],
                (const float *const *)D[7], (float *const *)D[8], n_nz, n, k, b);
            st = cublas_status(cublasSgemmBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, n, 16, rest, &one,
                                                  (const float *const *)D[9], n, (const float *const *)D[10], k, &one,
                                                  (float *const *)D[11], n, n_nz),
                               "ldlq feedback gemm");
            if (st != SPARQ_OK) break;
        }
        k_gather<<<grid_for(strip_vals), 256, 0, c->stream>>>(tiles, weighted ? tw : NULL, (float *const *)D[0],
                                                              (const float *const *)D[4], n_items, n, b);
        st = trellis_cuda_encode_tiles(c->enc, tiles, weighted ? tw : NULL, (size_t)n_items * tn, states, dec, NULL,
                                       c->stream);
        if (st != SPARQ_OK) break;
        k_scatter<<<grid_for(strip_vals), 256, 0, c->stream>>>((float *const *)D[2], qbuf ? (float *const *)D[3] : NULL,
                                                               (const float *const *)D[1], dec, n_items, n, b);
        k_pack<<<grid_for((size_t)n_items * tn * 8 * K), 256, 0, c->stream>>>((uint16_t *const *)D[5], states,
                                                                              n_items, tn, ti, K);
        st = cuda_status(cudaGetLastError(), "ldlq strip kernels");
    }
    /* Downloads and the proxy. */
    for (int i = 0; i < n_items && st == SPARQ_OK; i++) {
        ldlq_cuda_item *it = &items[i];
        st = cuda_status(cudaMemcpyAsync(it->trellis, P[5][i], words * 2, cudaMemcpyDeviceToHost, c->stream),
                         "download trellis");
        if (st == SPARQ_OK && it->wq)
            st = cuda_status(cudaMemcpyAsync(it->wq, P[3][i], kn * 4, cudaMemcpyDeviceToHost, c->stream),
                             "download wq");
        double num = 0, den = 0;
        const float *hr = hr_dev[it->hess];
        if (st == SPARQ_OK) st = proxy_of(c, hr, (const float *)P[2][i], k, n, tmp, partial, hpart, &num);
        if (st == SPARQ_OK) st = proxy_of(c, hr, (const float *)P[1][i], k, n, tmp, partial, hpart, &den);
        it->proxy_err = num / (den > 1e-30 ? den : 1e-30);
    }
    if (st == SPARQ_OK) st = cuda_status(cudaStreamSynchronize(c->stream), "ldlq batch");
    else cudaStreamSynchronize(c->stream);
    sparq_free(hr_dev);
    sparq_free(l_dev);
    sparq_free(d_dev);
    sparq_free(hp);
    sparq_free(hpart);
    return st == SPARQ_OK ? st : sparq_err_context(st, "%s", name);
}

extern "C" sparq_status ldlq_cuda_batch(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                                        ldlq_cuda_item *items, int n_items, const char *name)
{
    if (n_items == 0) return SPARQ_OK;
    RETURN_IF(s->k <= 0 || s->k % 128 || s->n <= 0 || s->n % 128, SPARQ_E_SHAPE,
              "%s: %d x %d is not a multiple of 128 both ways", name, s->k, s->n);
    RETURN_IF(s->K < 1 || s->K > TRELLIS_K_MAX, SPARQ_E_ARG, "%s: K = %d is outside 1..8", name, s->K);
    int want_wq = 0, n_host = 0;
    for (int i = 0; i < n_items; i++) want_wq |= items[i].wq != NULL;
    for (int h = 0; h < n_hess; h++) n_host += hs[h].hr && !hs[h].device;
    const size_t bytes = ldlq_cuda_batch_bytes(s, n_host, n_items, want_wq);
    char *base = NULL;
    cudaError_t e = cudaMalloc((void **)&base, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return sparq_err(SPARQ_E_NOMEM, "%s: cuda ldlq: cannot allocate %.1f MB for %d weights of %d x %d", name,
                         bytes / 1e6, n_items, s->k, s->n);
    }
    sparq_status st = run_batch(c, s, hs, n_hess, n_host, items, n_items, name, base);
    cudaFree(base);
    return st;
}

struct ldlq_cuda_dhess {
    hess_cuda h;
};

extern "C" size_t ldlq_cuda_hess_bytes(int k) { return hess_cuda_bytes(k) + (size_t)k * k * sizeof(float); }

extern "C" sparq_status ldlq_cuda_hess_prepare(ldlq_cuda *c, const float *h, int k, float sigma_reg, uint64_t seed,
                                               const char *name, ldlq_cuda_dhess **out, float *su, float *h_diag,
                                               int *identity, float *damping)
{
    *out = NULL;
    ldlq_cuda_dhess *d = (ldlq_cuda_dhess *)sparq_calloc(1, sizeof *d);
    RETURN_IF(!d, SPARQ_E_NOMEM, "%s: out of memory", name);
    float *dh = NULL;
    sparq_status st = SPARQ_OK;
    if (h) {
        st = cuda_status(cudaMalloc((void **)&dh, (size_t)k * k * sizeof(float)), "Hessian upload buffer");
        if (st == SPARQ_OK)
            st = cuda_status(cudaMemcpyAsync(dh, h, (size_t)k * k * sizeof(float), cudaMemcpyHostToDevice, c->stream),
                             "Hessian upload");
    }
    if (st == SPARQ_OK) st = hess_cuda_prepare(c->blas, c->stream, dh, k, sigma_reg, seed, name, &d->h);
    cudaFree(dh);
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpy(su, d->h.su, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost), "signs");
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpy(h_diag, d->h.h_diag, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost), "diag");
    if (st != SPARQ_OK) {
        hess_cuda_free(&d->h);
        sparq_free(d);
        return st;
    }
    *identity = d->h.identity;
    *damping = d->h.damping;
    *out = d;
    return SPARQ_OK;
}

extern "C" void ldlq_cuda_hess_free(ldlq_cuda_dhess *d)
{
    if (!d) return;
    hess_cuda_free(&d->h);
    sparq_free(d);
}

extern "C" ldlq_cuda_hess ldlq_cuda_hess_of(const ldlq_cuda_dhess *d)
{
    if (d->h.identity) return ldlq_cuda_hess{NULL, NULL, NULL, 1};
    return ldlq_cuda_hess{d->h.hr, d->h.l, d->h.d_diag, 1};
}

static const ldlq_cuda_ops g_ops = {ldlq_cuda_create,      ldlq_cuda_free,        ldlq_cuda_mem_info,
                                    ldlq_cuda_batch_bytes, ldlq_cuda_encoder_bytes, ldlq_cuda_encode_host,
                                    ldlq_cuda_batch,       ldlq_cuda_hess_prepare, ldlq_cuda_hess_free,
                                    ldlq_cuda_hess_of,     ldlq_cuda_hess_bytes};

extern "C" const ldlq_cuda_ops *ldlq_cuda_get_ops(void) { return &g_ops; }
