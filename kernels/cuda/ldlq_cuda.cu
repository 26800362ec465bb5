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

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* A batch encoder for one (K, codebook): pins counts the batches in flight that use it. */
struct enc_slot {
    trellis_cuda_enc *enc;
    int K, cb, pins;
};
#define BATCH_ENCODERS 4

/* Streams: a batch's uploads and downloads go on `copy`, its recursion and proxies on
 * `stream` (cuBLAS handle `blas`); the Hessian preparation has `prep` and `pblas`; the
 * scale search's encodes `estream` with their own encoder and buffers behind `elock`.
 * So a batch in flight never waits for a preparation or an encode, nor they for it. */
struct ldlq_cuda {
    cudaStream_t stream, copy, prep, estream, rstream;
    cublasHandle_t blas, pblas;
    size_t enc_ws;             /* every encoder's workspace (fixed at create) */
    enc_slot benc[BATCH_ENCODERS];
    int in_flight;             /* batches submitted and not yet waited */
    int pools;                 /* stream-ordered allocation (cudaMallocAsync) available */
    int dev;                   /* the device: every entry point sets it (use_dev) */
    /* batches enqueue one after another, in submission order (tickets): they share the
     * stream, the cuBLAS handle and, at one K, the encoder */
    pthread_mutex_t qlock;
    pthread_cond_t qturn;
    unsigned long tickets, serving;
    pthread_mutex_t elock;     /* encode_host: the search encoder and its buffers */
    trellis_cuda_enc *senc;
    int senc_K, senc_cb;
    float *ex, *edec;
    uint16_t *est;
    size_t ecap;               /* tiles the three buffers hold */
    pthread_mutex_t rlock;     /* the regularisation's calls (ldlq_cuda_reg_*), one at a time on rstream */
};

/* A batch in flight (ldlq_cuda_batch_submit .. _wait). */
struct ldlq_cuda_pending {
    ldlq_cuda *c;
    char name[320];
    ldlq_cuda_shape s;
    ldlq_cuda_item *items;     /* the caller's, written by wait */
    int n_items, want_wq;
    size_t words, kn;
    char *base;                /* the batch's one device allocation */
    void **hp;                 /* the host copy of the device pointer tables */
    double *dpart;             /* device: per item the proxy's numerator and denominator block sums */
    enc_slot *enc;             /* pinned */
    cudaEvent_t ev[4];         /* uploads start / end (copy), recursion start / end (stream) */
    int n_ev;
    /* The enqueueing runs on its own thread: a batch is thousands of launches (V4.1's
     * gate: 320 strips of ~10), more than the launch queue holds, so the thread that
     * launches blocks until the GPU has run most of them; on the caller's thread that
     * made submit as long as the batch, and the pipeline hid nothing (H200, 2026-12-03). */
    pthread_t thread;
    int has_thread;
    unsigned long ticket;      /* its turn to enqueue */
    const ldlq_cuda_hess *hs;  /* a copy of the caller's array, for the thread */
    int n_hess, n_host;
    sparq_status enq_st;       /* the thread's status and message */
    char enq_msg[512];
};

static double host_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Device memory in stream order where the device has memory pools (so that freeing
 * waits for nothing else on the device), else cudaMalloc / cudaFree. */
static cudaError_t dev_alloc(ldlq_cuda *c, void **p, size_t bytes, cudaStream_t s)
{
    *p = NULL;
    const cudaError_t e = c->pools ? cudaMallocAsync(p, bytes, s) : cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
    }
    return e;
}

static void dev_free(ldlq_cuda *c, void *p, cudaStream_t s)
{
    if (!p) return;
    if (c->pools) cudaFreeAsync(p, s);
    else cudaFree(p);
}

/* Every entry point runs on its context's device, whichever host thread calls it (the
 * contexts of `--devices` are driven from one thread each, the scale search's encodes
 * from the pool's threads). */
static sparq_status use_dev(const ldlq_cuda *c)
{
    CUDA_RETURN_IF(cudaSetDevice(c->dev), "ldlq: CUDA device %d", c->dev);
    return SPARQ_OK;
}

extern "C" void ldlq_cuda_free(ldlq_cuda *c)
{
    if (!c) return;
    cudaSetDevice(c->dev);
    /* batches still in flight (a caller's error) finish before their memory goes */
    cudaStream_t ss[5] = {c->stream, c->copy, c->prep, c->estream, c->rstream};
    for (int i = 0; i < 5; i++)
        if (ss[i]) cudaStreamSynchronize(ss[i]);
    for (int i = 0; i < BATCH_ENCODERS; i++) trellis_cuda_enc_free(c->benc[i].enc);
    trellis_cuda_enc_free(c->senc);
    dev_free(c, c->ex, c->estream);
    dev_free(c, c->edec, c->estream);
    dev_free(c, c->est, c->estream);
    if (c->estream) cudaStreamSynchronize(c->estream);
    if (c->blas) cublasDestroy(c->blas);
    if (c->pblas) cublasDestroy(c->pblas);
    for (int i = 0; i < 5; i++)
        if (ss[i]) cudaStreamDestroy(ss[i]);
    pthread_mutex_destroy(&c->elock);
    pthread_mutex_destroy(&c->rlock);
    pthread_mutex_destroy(&c->qlock);
    pthread_cond_destroy(&c->qturn);
    sparq_free(c);
}

extern "C" sparq_status ldlq_cuda_create(int device, size_t enc_workspace, ldlq_cuda **out)
{
    *out = NULL;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) {
        cudaGetLastError();
        n_dev = 0;
    }
    RETURN_IF(device < 0 || device >= n_dev, SPARQ_E_ARG, "CUDA device %d does not exist (%d device%s)", device, n_dev,
              n_dev == 1 ? "" : "s");
    CUDA_RETURN_IF(cudaSetDevice(device), "ldlq: CUDA device %d", device);
    ldlq_cuda *c = (ldlq_cuda *)sparq_calloc(1, sizeof *c);
    RETURN_IF(!c, SPARQ_E_NOMEM, "cuda ldlq: out of memory");
    c->dev = device;
    pthread_mutex_init(&c->elock, NULL);
    pthread_mutex_init(&c->rlock, NULL);
    pthread_mutex_init(&c->qlock, NULL);
    pthread_cond_init(&c->qturn, NULL);
    c->senc_K = -1;
    sparq_status st = SPARQ_OK;
    if (enc_workspace == 0) { /* fixed now, so that encoders made later do not depend on what is in flight */
        size_t fr = 0, tot = 0;
        st = cuda_status(cudaMemGetInfo(&fr, &tot), "ldlq: memory info");
        enc_workspace = fr / 4 < ((size_t)4 << 30) ? fr / 4 : ((size_t)4 << 30);
        if (enc_workspace == 0) enc_workspace = 1;
    }
    c->enc_ws = enc_workspace;
    /* the CPU stage's GPU work (Hessian preparation, the scale search's encodes) at the
     * highest priority: the recursion's Viterbi launches fill every SM, so that work gets
     * SMs only where a launch ends, and priority makes it go first there */
    int lo_prio = 0, hi_prio = 0;
    if (st == SPARQ_OK) st = cuda_status(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio), "ldlq: stream priorities");
    cudaStream_t *ss[5] = {&c->stream, &c->copy, &c->prep, &c->estream, &c->rstream};
    const int prio[5] = {lo_prio, lo_prio, hi_prio, hi_prio, hi_prio};
    for (int i = 0; i < 5 && st == SPARQ_OK; i++)
        st = cuda_status(cudaStreamCreateWithPriority(ss[i], cudaStreamNonBlocking, prio[i]), "ldlq: stream");
    cublasHandle_t *hh[2] = {&c->blas, &c->pblas};
    cudaStream_t hs[2] = {c->stream, c->prep};
    for (int i = 0; i < 2 && st == SPARQ_OK; i++) {
        if (cublasCreate(hh[i]) != CUBLAS_STATUS_SUCCESS) {
            *hh[i] = nullptr;
            st = sparq_err(SPARQ_E_STATE, "cuda ldlq: cublasCreate failed");
            break;
        }
        cublasSetStream(*hh[i], hs[i]);
        cublasSetMathMode(*hh[i], CUBLAS_DEFAULT_MATH); /* fp32 FMA, never TF32 */
    }
    int pools = 0;
    if (st == SPARQ_OK && cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess)
        c->pools = pools != 0;
    cudaGetLastError();
    if (st != SPARQ_OK) {
        ldlq_cuda_free(c);
        return st;
    }
    *out = c;
    return SPARQ_OK;
}

extern "C" sparq_status ldlq_cuda_mem_info(ldlq_cuda *c, size_t *free_bytes, size_t *total_bytes)
{
    FORWARD_IF(use_dev(c));
    CUDA_RETURN_IF(cudaMemGetInfo(free_bytes, total_bytes), "ldlq: memory info");
    return SPARQ_OK;
}

/* The batch encoder for K / cb, made if needed. Encoders of another K or codebook that
 * no batch in flight uses are freed (cudaFree: only while nothing is in flight, so that
 * it waits for nothing), and one in use is never rebuilt. */
static sparq_status batch_enc(ldlq_cuda *c, int K, trellis_codebook cb, enc_slot **out)
{
    *out = NULL;
    enc_slot *hit = NULL, *empty = NULL;
    for (int i = 0; i < BATCH_ENCODERS; i++) {
        enc_slot *e = &c->benc[i];
        if (e->enc && e->K == K && e->cb == (int)cb) hit = e;
        else if (e->enc && e->pins == 0 && c->in_flight == 0) {
            trellis_cuda_enc_free(e->enc);
            memset(e, 0, sizeof *e);
        }
        if (!e->enc && !empty) empty = e;
    }
    if (!hit) {
        RETURN_IF(!empty, SPARQ_E_STATE, "cuda ldlq: %d encoders of other bit widths are in use by batches in flight",
                  BATCH_ENCODERS);
        FORWARD_IF(trellis_cuda_enc_create(K, cb, c->enc_ws, &empty->enc));
        empty->K = K, empty->cb = (int)cb, empty->pins = 0;
        hit = empty;
    }
    *out = hit;
    return SPARQ_OK;
}

/* The scale search's encoder for K / cb (under elock). */
static sparq_status search_enc(ldlq_cuda *c, int K, trellis_codebook cb)
{
    if (c->senc && c->senc_K == K && c->senc_cb == (int)cb) return SPARQ_OK;
    trellis_cuda_enc_free(c->senc);
    c->senc = NULL;
    c->senc_K = -1;
    const size_t ws = c->enc_ws < ((size_t)1 << 30) ? c->enc_ws : ((size_t)1 << 30);
    FORWARD_IF(trellis_cuda_enc_create(K, cb, ws, &c->senc));
    c->senc_K = K, c->senc_cb = (int)cb;
    return SPARQ_OK;
}

static size_t enc_bytes_of(const trellis_cuda_enc *e, int K, trellis_codebook cb)
{
    return e ? (size_t)trellis_cuda_enc_slots(e) * trellis_cuda_enc_slot_bytes(K, cb) : 0;
}

extern "C" sparq_status ldlq_cuda_encoder_bytes(ldlq_cuda *c, int K, trellis_codebook cb, size_t *bytes)
{
    enc_slot *e = NULL;
    FORWARD_IF(use_dev(c));
    FORWARD_IF(batch_enc(c, K, cb, &e));
    pthread_mutex_lock(&c->elock);
    const sparq_status st = search_enc(c, K, cb);
    const size_t sb = st == SPARQ_OK ? enc_bytes_of(c->senc, K, cb) : 0;
    pthread_mutex_unlock(&c->elock);
    FORWARD_IF(st);
    *bytes = enc_bytes_of(e->enc, K, cb) + sb;
    return SPARQ_OK;
}

/* As trellis_cuda_encode_tiles_host (the same chunks, so the same tiles per launch), on
 * the context's own stream and buffers. */
static sparq_status encode_host_locked(ldlq_cuda *c, int K, trellis_codebook cb, const float *x, size_t n_tiles,
                                       uint16_t *states, float *decoded)
{
    FORWARD_IF(search_enc(c, K, cb));
    size_t chunk = (size_t)trellis_cuda_enc_slots(c->senc) * 4;
    if (chunk < 4096) chunk = 4096;
    if (chunk > n_tiles) chunk = n_tiles;
    if (chunk > c->ecap) {
        dev_free(c, c->ex, c->estream), dev_free(c, c->edec, c->estream), dev_free(c, c->est, c->estream);
        c->ex = c->edec = NULL, c->est = NULL, c->ecap = 0;
        cudaError_t e = dev_alloc(c, (void **)&c->ex, chunk * 256 * sizeof(float), c->estream);
        if (e == cudaSuccess) e = dev_alloc(c, (void **)&c->edec, chunk * 256 * sizeof(float), c->estream);
        if (e == cudaSuccess) e = dev_alloc(c, (void **)&c->est, chunk * 256 * sizeof(uint16_t), c->estream);
        if (e != cudaSuccess) {
            dev_free(c, c->ex, c->estream), dev_free(c, c->edec, c->estream), dev_free(c, c->est, c->estream);
            c->ex = c->edec = NULL, c->est = NULL;
            return cuda_status(e, "viterbi: search buffers");
        }
        c->ecap = chunk;
    }
    const cudaStream_t s = c->estream;
    for (size_t t0 = 0; t0 < n_tiles; t0 += chunk) {
        const size_t n = n_tiles - t0 < chunk ? n_tiles - t0 : chunk;
        CUDA_RETURN_IF(cudaMemcpyAsync(c->ex, x + t0 * 256, n * 256 * sizeof(float), cudaMemcpyHostToDevice, s),
                       "viterbi: upload");
        FORWARD_IF(trellis_cuda_encode_tiles(c->senc, c->ex, NULL, n, c->est, decoded ? c->edec : NULL, NULL, s));
        CUDA_RETURN_IF(cudaMemcpyAsync(states + t0 * 256, c->est, n * 256 * sizeof(uint16_t), cudaMemcpyDeviceToHost,
                                       s), "viterbi: download");
        if (decoded)
            CUDA_RETURN_IF(cudaMemcpyAsync(decoded + t0 * 256, c->edec, n * 256 * sizeof(float),
                                           cudaMemcpyDeviceToHost, s), "viterbi: download");
        CUDA_RETURN_IF(cudaStreamSynchronize(s), "viterbi: encode");
    }
    return SPARQ_OK;
}

extern "C" sparq_status ldlq_cuda_encode_host(ldlq_cuda *c, int K, trellis_codebook cb, const float *x, size_t n_tiles,
                                              uint16_t *states, float *decoded)
{
    if (n_tiles == 0) return SPARQ_OK;
    FORWARD_IF(use_dev(c));
    pthread_mutex_lock(&c->elock);
    const sparq_status st = encode_host_locked(c, K, cb, x, n_tiles, states, decoded);
    if (st != SPARQ_OK) cudaStreamSynchronize(c->estream); /* nothing of this call left in flight */
    pthread_mutex_unlock(&c->elock);
    return st;
}

/* Device bytes of one batch, in the order enqueue carves them (each piece
 * rounded up to 64 bytes: the 64·16 at the end). */
static size_t batch_bytes(const ldlq_cuda_shape *s, int n_hess, int n_items, int want_wq)
{
    const size_t k = (size_t)s->k, n = (size_t)s->n, kn = k * n, tiles = kn / 256;
    const size_t hess = (size_t)n_hess * (2 * k * k + k) * sizeof(float);
    const int copies = (want_wq ? 3 : 2) - (s->wr_device ? 1 : 0); /* wr (unless on the device), err (, wq) */
    const size_t w = (size_t)n_items * kn * sizeof(float) * copies;
    const size_t strip = (size_t)n_items * 16 * n * (sizeof(float) * 4 + sizeof(uint16_t)); /* t, tiles, tw, dec, states */
    const size_t trellis = (size_t)n_items * tiles * 16 * s->K * sizeof(uint16_t);
    const size_t ptrs = (size_t)n_items * 12 * sizeof(void *);
    const size_t proxy = kn * sizeof(float) + (size_t)n_items * 2 * DOT_BLOCKS * sizeof(double);
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

/* Queues the block sums of x·(Hr·x) (x·x for the identity) into partial[0..DOT_BLOCKS). */
static sparq_status proxy_enqueue(ldlq_cuda *c, const float *hr, const float *x, int k, int n, float *tmp,
                                  double *partial)
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
    return SPARQ_OK;
}

/* Everything of batch p after its allocation: the uploads on the copy stream, then on the
 * batch stream (after them) the recursion and the proxies' block sums. Nothing waits. */
static sparq_status enqueue(ldlq_cuda_pending *p, const ldlq_cuda_hess *hs, int n_hess, int n_host)
{
    ldlq_cuda *c = p->c;
    const ldlq_cuda_shape *s = &p->s;
    ldlq_cuda_item *items = p->items;
    const int n_items = p->n_items;
    const int k = s->k, n = s->n, K = s->K, tk = k / 16, tn = n / 16;
    const size_t kn = p->kn, kk = (size_t)k * k, words = p->words;
    const size_t total = batch_bytes(s, n_host, n_items, p->want_wq);
    char *base = p->base;
    carver cv = {base};
    float *hbuf = cv.take<float>((size_t)n_host * (2 * kk + k));
    float *wbuf = s->wr_device ? NULL : cv.take<float>((size_t)n_items * kn);
    float *ebuf = cv.take<float>((size_t)n_items * kn);
    float *qbuf = p->want_wq ? cv.take<float>((size_t)n_items * kn) : NULL;
    float *tbuf = cv.take<float>((size_t)n_items * 16 * n);
    float *tiles = cv.take<float>((size_t)n_items * 16 * n);
    float *tw = cv.take<float>((size_t)n_items * 16 * n);
    float *dec = cv.take<float>((size_t)n_items * 16 * n);
    uint16_t *states = cv.take<uint16_t>((size_t)n_items * 16 * n);
    uint16_t *trel = cv.take<uint16_t>((size_t)n_items * words);
    void **ptrs = cv.take<void *>((size_t)n_items * 12);
    float *tmp = cv.take<float>(kn);
    p->dpart = cv.take<double>((size_t)n_items * 2 * DOT_BLOCKS);
    if ((size_t)(cv.p - base) > total) return sparq_err(SPARQ_E_STATE, "ldlq batch layout overflow");

    for (int i = 0; i < 4; i++) {
        CUDA_RETURN_IF(cudaEventCreate(&p->ev[i]), "ldlq: event");
        p->n_ev = i + 1;
    }
    CUDA_RETURN_IF(cudaEventRecord(p->ev[0], c->copy), "ldlq: event");

    /* Uploads: the Hessians, then each weight. Device Hessians are read in place; host
     * ones get a slot of hbuf each, in order. */
    const float **hr_dev = (const float **)sparq_calloc((size_t)n_hess, sizeof *hr_dev);
    const float **l_dev = (const float **)sparq_calloc((size_t)n_hess, sizeof *l_dev);
    const float **d_dev = (const float **)sparq_calloc((size_t)n_hess, sizeof *d_dev);
    p->hp = (void **)sparq_calloc((size_t)n_items * 12, sizeof *p->hp);
    sparq_status st = hr_dev && l_dev && d_dev && p->hp ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    const cudaStream_t cs = c->copy;
    for (int h = 0, slot = 0; h < n_hess && st == SPARQ_OK; h++) {
        if (!hs[h].hr) continue;
        if (hs[h].device) {
            hr_dev[h] = hs[h].hr, l_dev[h] = hs[h].l, d_dev[h] = hs[h].d;
            continue;
        }
        float *dh = hbuf + (size_t)slot++ * (2 * kk + k);
        st = cuda_status(cudaMemcpyAsync(dh, hs[h].hr, kk * 4, cudaMemcpyHostToDevice, cs), "upload Hr");
        if (st == SPARQ_OK)
            st = cuda_status(cudaMemcpyAsync(dh + kk, hs[h].l, kk * 4, cudaMemcpyHostToDevice, cs), "upload L");
        if (st == SPARQ_OK)
            st = cuda_status(cudaMemcpyAsync(dh + 2 * kk, hs[h].d, (size_t)k * 4, cudaMemcpyHostToDevice, cs),
                             "upload D");
        hr_dev[h] = dh, l_dev[h] = dh + kk, d_dev[h] = dh + 2 * kk;
    }
    /* host pointer tables: [0] t, [1] w, [2] err, [3] wq, [4] d (per item, NULL for identity),
     * [5] trellis; then for the items with a Hessian: [6] err, [7] L, [8] t; [9..11] the GEMM's A, B, C */
    void **P[12];
    for (int a = 0; a < 12; a++) P[a] = p->hp ? p->hp + (size_t)a * n_items : NULL;
    int n_nz = 0;
    for (int i = 0; i < n_items && st == SPARQ_OK; i++) {
        const ldlq_cuda_item *it = &items[i];
        const bool ident = !hs[it->hess].hr;
        P[0][i] = tbuf + (size_t)i * 16 * n;
        P[1][i] = wbuf ? wbuf + (size_t)i * kn : (void *)it->wr;
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
        if (wbuf) st = cuda_status(cudaMemcpyAsync(P[1][i], it->wr, kn * 4, cudaMemcpyHostToDevice, cs), "upload W");
    }
    void **D[12];
    for (int a = 0; a < 12; a++) D[a] = ptrs + (size_t)a * n_items;
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpyAsync(ptrs, p->hp, (size_t)n_items * 12 * sizeof(void *), cudaMemcpyHostToDevice,
                                         cs), "upload pointers");
    if (st == SPARQ_OK) st = cuda_status(cudaEventRecord(p->ev[1], cs), "ldlq: event");
    if (st == SPARQ_OK) st = cuda_status(cudaStreamWaitEvent(c->stream, p->ev[1], 0), "ldlq: stream order");
    if (st == SPARQ_OK) st = cuda_status(cudaEventRecord(p->ev[2], c->stream), "ldlq: event");

    trellis_cuda_enc *enc = p->enc->enc;
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
        st = trellis_cuda_encode_tiles(enc, tiles, weighted ? tw : NULL, (size_t)n_items * tn, states, dec, NULL,
                                       c->stream);
        if (st != SPARQ_OK) break;
        k_scatter<<<grid_for(strip_vals), 256, 0, c->stream>>>((float *const *)D[2], qbuf ? (float *const *)D[3] : NULL,
                                                               (const float *const *)D[1], dec, n_items, n, b);
        k_pack<<<grid_for((size_t)n_items * tn * 8 * K), 256, 0, c->stream>>>((uint16_t *const *)D[5], states,
                                                                              n_items, tn, ti, K);
        st = cuda_status(cudaGetLastError(), "ldlq strip kernels");
    }
    /* The proxies' block sums, numerator and denominator per item; added up by wait. */
    for (int i = 0; i < n_items && st == SPARQ_OK; i++) {
        const float *hr = hr_dev[items[i].hess];
        double *part = p->dpart + (size_t)i * 2 * DOT_BLOCKS;
        st = proxy_enqueue(c, hr, (const float *)P[2][i], k, n, tmp, part);
        if (st == SPARQ_OK) st = proxy_enqueue(c, hr, (const float *)P[1][i], k, n, tmp, part + DOT_BLOCKS);
    }
    if (st == SPARQ_OK) st = cuda_status(cudaEventRecord(p->ev[3], c->stream), "ldlq: event");
    sparq_free(hr_dev);
    sparq_free(l_dev);
    sparq_free(d_dev);
    return st;
}

/* Frees what p holds on the host and the device (all its work finished or never queued). */
static void pending_free(ldlq_cuda_pending *p)
{
    if (!p) return;
    ldlq_cuda *c = p->c;
    dev_free(c, p->base, c->copy);
    for (int i = 0; i < p->n_ev; i++) cudaEventDestroy(p->ev[i]);
    if (p->enc) p->enc->pins--;
    sparq_free((void *)p->hs);
    sparq_free(p->hp);
    sparq_free(p);
}

/* The submitter thread: enqueue() on the context's device, its message kept. */
static void *enqueue_thread(void *arg)
{
    ldlq_cuda_pending *p = (ldlq_cuda_pending *)arg;
    ldlq_cuda *c = p->c;
    pthread_mutex_lock(&c->qlock);
    while (c->serving != p->ticket) pthread_cond_wait(&c->qturn, &c->qlock);
    pthread_mutex_unlock(&c->qlock);
    sparq_status st = cuda_status(cudaSetDevice(c->dev), "ldlq: device");
    if (st == SPARQ_OK) st = enqueue(p, p->hs, p->n_hess, p->n_host);
    if (st != SPARQ_OK) snprintf(p->enq_msg, sizeof p->enq_msg, "%s", sparq_errmsg());
    p->enq_st = st;
    pthread_mutex_lock(&c->qlock);
    c->serving++;
    pthread_cond_broadcast(&c->qturn);
    pthread_mutex_unlock(&c->qlock);
    return NULL;
}

/* Join the submitter thread; its status, with its message set on this thread. */
static sparq_status join_enqueue(ldlq_cuda_pending *p)
{
    if (!p->has_thread) return p->enq_st;
    pthread_join(p->thread, NULL);
    p->has_thread = 0;
    return p->enq_st == SPARQ_OK ? SPARQ_OK : sparq_err(p->enq_st, "%s", p->enq_msg);
}

extern "C" sparq_status ldlq_cuda_batch_submit(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs,
                                               int n_hess, ldlq_cuda_item *items, int n_items, const char *name,
                                               ldlq_cuda_pending **out)
{
    *out = NULL;
    if (!name) name = "ldlq batch";
    if (n_items == 0) return SPARQ_OK;
    RETURN_IF(s->k <= 0 || s->k % 128 || s->n <= 0 || s->n % 128, SPARQ_E_SHAPE,
              "%s: %d x %d is not a multiple of 128 both ways", name, s->k, s->n);
    RETURN_IF(s->K < 1 || s->K > TRELLIS_K_MAX, SPARQ_E_ARG, "%s: K = %d is outside 1..8", name, s->K);
    int want_wq = 0, n_host = 0;
    for (int i = 0; i < n_items; i++) {
        RETURN_IF(items[i].hess < 0 || items[i].hess >= n_hess, SPARQ_E_ARG, "%s: item %d: Hessian %d of %d", name, i,
                  items[i].hess, n_hess);
        RETURN_IF(!items[i].wr, SPARQ_E_ARG, "%s: item %d has no weight", name, i);
        want_wq |= items[i].wq != NULL;
    }
    for (int h = 0; h < n_hess; h++) n_host += hs[h].hr && !hs[h].device;
    FORWARD_IF(use_dev(c));
    ldlq_cuda_pending *p = (ldlq_cuda_pending *)sparq_calloc(1, sizeof *p);
    RETURN_IF(!p, SPARQ_E_NOMEM, "%s: out of memory", name);
    p->c = c;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->s = *s;
    p->items = items;
    p->n_items = n_items;
    p->want_wq = want_wq;
    p->kn = (size_t)s->k * s->n;
    p->words = (size_t)(s->k / 16) * (s->n / 16) * 16 * s->K;
    sparq_status st = batch_enc(c, s->K, s->cb, &p->enc);
    if (st == SPARQ_OK) p->enc->pins++;
    else p->enc = NULL;
    const size_t bytes = batch_bytes(s, n_host, n_items, want_wq);
    if (st == SPARQ_OK) {
        const cudaError_t e = dev_alloc(c, (void **)&p->base, bytes, c->copy);
        if (e != cudaSuccess)
            st = sparq_err(SPARQ_E_NOMEM, "cuda ldlq: cannot allocate %.1f MB for %d weights of %d x %d (%s)",
                           bytes / 1e6, n_items, s->k, s->n, cudaGetErrorString(e));
    }
    if (st == SPARQ_OK) {
        ldlq_cuda_hess *hc = (ldlq_cuda_hess *)sparq_malloc((size_t)(n_hess > 0 ? n_hess : 1) * sizeof *hc);
        if (!hc) st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
        else if (n_hess > 0) memcpy(hc, hs, (size_t)n_hess * sizeof *hc);
        p->hs = hc, p->n_hess = n_hess, p->n_host = n_host;
    }
    if (st == SPARQ_OK) { /* enqueue on a thread of its own (see ldlq_cuda_pending.thread) */
        p->ticket = c->tickets++;
        if (pthread_create(&p->thread, NULL, enqueue_thread, p) == 0) p->has_thread = 1;
        else enqueue_thread(p); /* no thread: here, in its turn */
        st = p->has_thread ? SPARQ_OK : join_enqueue(p);
    }
    if (st != SPARQ_OK) { /* what was queued finishes before the memory goes */
        cudaStreamSynchronize(c->copy);
        cudaStreamSynchronize(c->stream);
        pending_free(p);
        return sparq_err_context(st, "%s", name);
    }
    c->in_flight++;
    *out = p;
    return SPARQ_OK;
}

extern "C" sparq_status ldlq_cuda_batch_wait(ldlq_cuda_pending *p, double *gpu_seconds)
{
    if (gpu_seconds) *gpu_seconds = 0;
    if (!p) return SPARQ_OK;
    ldlq_cuda *c = p->c;
    cudaSetDevice(c->dev); /* an error here shows in the first call below */
    sparq_status st = join_enqueue(p);
    if (st != SPARQ_OK) { /* what was queued finishes before the memory goes */
        cudaStreamSynchronize(c->copy);
        cudaStreamSynchronize(c->stream);
        char name[320];
        snprintf(name, sizeof name, "%s", p->name);
        c->in_flight--;
        pending_free(p);
        return sparq_err_context(st, "%s", name);
    }
    st = cuda_status(cudaEventSynchronize(p->ev[3]), "ldlq batch");
    const double t0 = host_now();
    double *hpart = (double *)sparq_malloc((size_t)p->n_items * 2 * DOT_BLOCKS * sizeof(double));
    if (st == SPARQ_OK && !hpart) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    /* downloads on the copy stream: the batch stream may hold a later batch already */
    void **trel = p->hp + (size_t)5 * p->n_items, **wq = p->hp + (size_t)3 * p->n_items;
    for (int i = 0; i < p->n_items && st == SPARQ_OK; i++) {
        ldlq_cuda_item *it = &p->items[i];
        st = cuda_status(cudaMemcpyAsync(it->trellis, trel[i], p->words * 2, cudaMemcpyDeviceToHost, c->copy),
                         "download trellis");
        if (st == SPARQ_OK && it->wq)
            st = cuda_status(cudaMemcpyAsync(it->wq, wq[i], p->kn * 4, cudaMemcpyDeviceToHost, c->copy),
                             "download wq");
    }
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpyAsync(hpart, p->dpart, (size_t)p->n_items * 2 * DOT_BLOCKS * sizeof(double),
                                         cudaMemcpyDeviceToHost, c->copy), "download proxy sums");
    if (st == SPARQ_OK) st = cuda_status(cudaStreamSynchronize(c->copy), "ldlq downloads");
    else cudaStreamSynchronize(c->copy);
    for (int i = 0; i < p->n_items && st == SPARQ_OK; i++) {
        /* in block order, as ever: the proxy is the same double whatever the batch */
        const double *part = hpart + (size_t)i * 2 * DOT_BLOCKS;
        double num = 0, den = 0;
        for (int b = 0; b < DOT_BLOCKS; b++) num += part[b];
        for (int b = 0; b < DOT_BLOCKS; b++) den += part[DOT_BLOCKS + b];
        p->items[i].proxy_err = num / (den > 1e-30 ? den : 1e-30);
    }
    float up_ms = 0, run_ms = 0;
    if (st == SPARQ_OK && gpu_seconds && cudaEventElapsedTime(&up_ms, p->ev[0], p->ev[1]) == cudaSuccess &&
        cudaEventElapsedTime(&run_ms, p->ev[2], p->ev[3]) == cudaSuccess)
        *gpu_seconds = (up_ms + run_ms) / 1e3 + (host_now() - t0);
    cudaGetLastError();
    sparq_free(hpart);
    char name[320];
    snprintf(name, sizeof name, "%s", p->name);
    c->in_flight--;
    pending_free(p);
    return st == SPARQ_OK ? st : sparq_err_context(st, "%s", name);
}

extern "C" sparq_status ldlq_cuda_batch(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                                        ldlq_cuda_item *items, int n_items, const char *name)
{
    ldlq_cuda_pending *p = NULL;
    FORWARD_IF(ldlq_cuda_batch_submit(c, s, hs, n_hess, items, n_items, name, &p));
    return ldlq_cuda_batch_wait(p, NULL);
}

struct ldlq_cuda_dhess {
    hess_cuda h;
    ldlq_cuda *c;
    void *mem; /* the allocation h lives in (h.mem: its 256-byte aligned start) */
};

/* The prepared arrays, 256 bytes of alignment slack, and the upload buffer of h. */
extern "C" size_t ldlq_cuda_hess_bytes(int k) { return hess_cuda_bytes(k) + 256 + (size_t)k * k * sizeof(float); }

extern "C" sparq_status ldlq_cuda_hess_prepare(ldlq_cuda *c, const float *h, int k, float sigma_reg, uint64_t seed,
                                               const char *name, ldlq_cuda_dhess **out, float *su, float *h_diag,
                                               int *identity, float *damping)
{
    *out = NULL;
    if (!name) name = "hessian";
    RETURN_IF(k <= 0 || k % 128 != 0, SPARQ_E_SHAPE, "%s: input size %d is not a multiple of 128", name, k);
    FORWARD_IF(use_dev(c));
    ldlq_cuda_dhess *d = (ldlq_cuda_dhess *)sparq_calloc(1, sizeof *d);
    RETURN_IF(!d, SPARQ_E_NOMEM, "%s: out of memory", name);
    d->c = c;
    const cudaStream_t s = c->prep;
    const size_t hb = hess_cuda_bytes(k);
    float *dh = NULL;
    sparq_status st = cuda_status(dev_alloc(c, &d->mem, hb + 256, s), "Hessian memory");
    if (st == SPARQ_OK && h) {
        st = cuda_status(dev_alloc(c, (void **)&dh, (size_t)k * k * sizeof(float), s), "Hessian upload buffer");
        if (st == SPARQ_OK)
            st = cuda_status(cudaMemcpyAsync(dh, h, (size_t)k * k * sizeof(float), cudaMemcpyHostToDevice, s),
                             "Hessian upload");
    }
    void *aligned = d->mem ? (void *)(((uintptr_t)d->mem + 255) & ~(uintptr_t)255) : NULL;
    if (st == SPARQ_OK) st = hess_cuda_prepare_into(c->pblas, s, dh, k, sigma_reg, seed, name, aligned, hb, &d->h);
    dev_free(c, dh, s);
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpyAsync(su, d->h.su, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost, s), "signs");
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpyAsync(h_diag, d->h.h_diag, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost, s),
                         "diag");
    if (st == SPARQ_OK) st = cuda_status(cudaStreamSynchronize(s), "Hessian preparation");
    if (st != SPARQ_OK) {
        cudaStreamSynchronize(s);
        ldlq_cuda_hess_free(d);
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
    cudaSetDevice(d->c->dev);
    hess_cuda_free(&d->h); /* caller memory: only clears it */
    dev_free(d->c, d->mem, d->c->prep);
    sparq_free(d);
}

extern "C" ldlq_cuda_hess ldlq_cuda_hess_of(const ldlq_cuda_dhess *d)
{
    if (d->h.identity) return ldlq_cuda_hess{NULL, NULL, NULL, 1};
    return ldlq_cuda_hess{d->h.hr, d->h.l, d->h.d_diag, 1};
}

/* --- the regularisation's matrix work (ldlq_cuda_reg_*; quantize/ldlq.h's ldlq_reg_engine) --------- */

namespace {

#define REG_HAD_SCALE 0.08838834764831845f /* 1/sqrt(128): kernels/cpu/trellis.c's HAD_SCALE */

/* out[c] = Σ_r m[r][c]², r ascending: one thread per column (adjacent threads, adjacent columns). */
__global__ void k_reg_col_sumsq(const float *m, int k, int n, double *out)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    double s = 0.0;
    for (int r = 0; r < k; r++) {
        const double x = m[(size_t)r * n + c];
        s = __dadd_rn(s, __dmul_rn(x, x));
    }
    out[c] = s;
}

/* out[r] = Σ_c m[r][c]², c ascending: 32 rows a block, read through shared memory 32 columns
 * at a time (coalesced), each row added by one thread in column order. */
__global__ void k_reg_row_sumsq(const float *m, int k, int n, double *out)
{
    __shared__ float t[32][33];
    const int r0 = blockIdx.x * 32, tx = threadIdx.x, ty = threadIdx.y; /* 32 × 8 */
    double s = 0.0;
    for (int c0 = 0; c0 < n; c0 += 32) {
        for (int rr = ty; rr < 32; rr += 8)
            t[rr][tx] = r0 + rr < k && c0 + tx < n ? m[(size_t)(r0 + rr) * n + c0 + tx] : 0.0f;
        __syncthreads();
        if (ty == 0)
            for (int q = 0; q < 32 && c0 + q < n; q++) {
                const double x = t[tx][q];
                s = __dadd_rn(s, __dmul_rn(x, x));
            }
        __syncthreads();
    }
    if (ty == 0 && r0 + tx < k) out[r0 + tx] = s;
}

/* out[ti·tn + tj] = Σ over tile (ti, tj) of m², its rows then columns ascending: a thread a tile. */
__global__ void k_reg_tile_sumsq(const float *m, int k, int n, double *out)
{
    const int tn = n / 16;
    const size_t tiles = (size_t)(k / 16) * tn;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < tiles; x += (size_t)gridDim.x * blockDim.x) {
        const float *b = m + (x / tn) * 16 * (size_t)n + (x % tn) * 16;
        double s = 0.0;
        for (int r = 0; r < 16; r++)
            for (int q = 0; q < 16; q++) {
                const double v = b[(size_t)r * n + q];
                s = __dadd_rn(s, __dmul_rn(v, v));
            }
        out[x] = s;
    }
}

/* The 128-point butterflies of trellis_had128 on v[0..128) in shared memory, `lanes` threads
 * (lane 0..lanes) sharing the 64 pairs of each stage; then × 1/√128. */
__device__ void had128_smem(float *v, int stride, int lane, int lanes)
{
    for (int h = 1; h < 128; h <<= 1) {
        for (int p = lane; p < 64; p += lanes) {
            const int j = (p / h) * 2 * h + p % h;
            const float a = v[j * stride], c = v[(j + h) * stride];
            v[j * stride] = __fadd_rn(a, c);
            v[(j + h) * stride] = __fsub_rn(a, c);
        }
        __syncthreads();
    }
    for (int j = lane; j < 128; j += lanes) v[j * stride] = __fmul_rn(v[j * stride], REG_HAD_SCALE);
    __syncthreads();
}

/* m[r][c] /= s[c], then every 128-block of every row ← block·H: a block of 128 threads per
 * (row, 128-block), one element each (and one pair each for the first 64 in the stages). */
__global__ void k_reg_had_right(float *m, int k, int n, const float *sc)
{
    __shared__ float v[128];
    const int nb = n / 128;
    const size_t seg = blockIdx.x; /* row · nb + block */
    const int r = (int)(seg / nb), c0 = (int)(seg % nb) * 128, t = threadIdx.x;
    float *row = m + (size_t)r * n + c0;
    v[t] = __fdiv_rn(row[t], sc[c0 + t]);
    __syncthreads();
    had128_smem(v, 1, t, 128);
    row[t] = v[t];
}

/* m[r][c] *= s[r], then every column's 128-blocks ← H·block: a block per (128 rows, 32 columns)
 * in shared memory, 256 threads (8 per column) sharing each stage's 64 pairs of a column. */
__global__ void k_reg_had_left(float *m, int k, int n, const float *sc)
{
    __shared__ float v[128 * 33];
    const int r0 = blockIdx.y * 128, c0 = blockIdx.x * 32, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    for (int r = ty; r < 128; r += 8) {
        const size_t o = (size_t)(r0 + r) * n + c0 + tx;
        v[r * 33 + tx] = c0 + tx < n ? __fmul_rn(m[o], sc[r0 + r]) : 0.0f;
    }
    __syncthreads();
    had128_smem(v + tx, 33, ty, 8);
    for (int r = ty; r < 128; r += 8)
        if (c0 + tx < n) m[(size_t)(r0 + r) * n + c0 + tx] = v[r * 33 + tx];
}

/* out[i·256 + p] = m's tile idx[i] at stream position p (trellis_pos_row / _col). */
__global__ void k_reg_tiles(const float *m, int n, const int *idx, size_t count, float *out)
{
    const int tn = n / 16;
    const size_t total = count * 256;
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total; x += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(x & 255), t = idx[x >> 8];
        const int r = (t / tn) * 16 + trellis_pos_row(p), c = (t % tn) * 16 + trellis_pos_col(p);
        out[x] = m[(size_t)r * n + c];
    }
}

__global__ void k_reg_scale(float *m, size_t kn, float g)
{
    for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < kn; x += (size_t)gridDim.x * blockDim.x)
        m[x] = __fmul_rn(m[x], g);
}

} // namespace

/* A regularised weight in device memory. */
struct reg_mat {
    float *d;
    int k, n;
};

extern "C" size_t ldlq_cuda_reg_bytes(int k, int n) { return (size_t)k * n * sizeof(float) + 256; }

extern "C" const float *ldlq_cuda_reg_device(const void *m) { return ((const reg_mat *)m)->d; }

/* One call of the engine: on the context's device and stream, one at a time. `scratch` is a
 * device buffer of `bytes` (freed at the end, in stream order), the call's work queued by fn;
 * the stream is synchronised before the lock goes, so the caller's results are there. */
template <typename F>
static sparq_status reg_call(ldlq_cuda *c, size_t bytes, const char *what, F fn)
{
    pthread_mutex_lock(&c->rlock);
    sparq_status st = use_dev(c);
    void *scratch = NULL;
    if (st == SPARQ_OK && bytes) {
        const cudaError_t e = dev_alloc(c, &scratch, bytes, c->rstream);
        if (e != cudaSuccess)
            st = sparq_err(SPARQ_E_NOMEM, "cuda regularisation: cannot allocate %.1f MB for %s (%s)", bytes / 1e6,
                           what, cudaGetErrorString(e));
    }
    if (st == SPARQ_OK) st = fn(c->rstream, scratch);
    if (st == SPARQ_OK) st = cuda_status(cudaGetLastError(), what);
    dev_free(c, scratch, c->rstream);
    const sparq_status s2 = cuda_status(cudaStreamSynchronize(c->rstream), what);
    pthread_mutex_unlock(&c->rlock);
    return st != SPARQ_OK ? st : s2;
}

extern "C" sparq_status ldlq_cuda_reg_load(void *cv, const float *w, int k, int n, void **out)
{
    ldlq_cuda *c = (ldlq_cuda *)cv;
    *out = NULL;
    RETURN_IF(k <= 0 || n <= 0 || k % 128 || n % 128, SPARQ_E_SHAPE, "cuda regularisation: %d x %d is not a "
              "multiple of 128 both ways", k, n);
    reg_mat *x = (reg_mat *)sparq_calloc(1, sizeof *x);
    RETURN_IF(!x, SPARQ_E_NOMEM, "out of memory");
    x->k = k, x->n = n;
    const size_t bytes = (size_t)k * n * sizeof(float);
    pthread_mutex_lock(&c->rlock);
    sparq_status st = use_dev(c);
    if (st == SPARQ_OK) {
        const cudaError_t e = dev_alloc(c, (void **)&x->d, bytes, c->rstream);
        if (e != cudaSuccess)
            st = sparq_err(SPARQ_E_NOMEM, "cuda regularisation: cannot allocate %.1f MB for a %d x %d weight (%s)",
                           bytes / 1e6, k, n, cudaGetErrorString(e));
    }
    if (st == SPARQ_OK)
        st = cuda_status(cudaMemcpyAsync(x->d, w, bytes, cudaMemcpyHostToDevice, c->rstream), "upload weight");
    const sparq_status s2 = cuda_status(cudaStreamSynchronize(c->rstream), "upload weight");
    if (st == SPARQ_OK) st = s2;
    if (st != SPARQ_OK) {
        dev_free(c, x->d, c->rstream);
        cudaStreamSynchronize(c->rstream);
        sparq_free(x);
        x = NULL;
    }
    pthread_mutex_unlock(&c->rlock);
    *out = x;
    return st;
}

extern "C" void ldlq_cuda_reg_release(void *cv, void *m)
{
    ldlq_cuda *c = (ldlq_cuda *)cv;
    reg_mat *x = (reg_mat *)m;
    if (!x) return;
    pthread_mutex_lock(&c->rlock);
    cudaSetDevice(c->dev);
    dev_free(c, x->d, c->rstream);
    pthread_mutex_unlock(&c->rlock);
    sparq_free(x);
}

extern "C" sparq_status ldlq_cuda_reg_sumsq(void *cv, void *m, int dim, double *out)
{
    const reg_mat *x = (const reg_mat *)m;
    const int len = dim == 0 ? x->n : x->k;
    return reg_call((ldlq_cuda *)cv, (size_t)len * sizeof(double), "regularisation sums of squares",
                    [&](cudaStream_t s, void *buf) {
                        double *d = (double *)buf;
                        if (dim == 0) k_reg_col_sumsq<<<(x->n + 127) / 128, 128, 0, s>>>(x->d, x->k, x->n, d);
                        else k_reg_row_sumsq<<<(x->k + 31) / 32, dim3(32, 8), 0, s>>>(x->d, x->k, x->n, d);
                        return cuda_status(cudaMemcpyAsync(out, d, (size_t)len * sizeof(double),
                                                           cudaMemcpyDeviceToHost, s), "sums of squares");
                    });
}

extern "C" sparq_status ldlq_cuda_reg_scale_had(void *cv, void *m, int dim, const float *sc)
{
    const reg_mat *x = (const reg_mat *)m;
    const int len = dim == 0 ? x->n : x->k;
    return reg_call((ldlq_cuda *)cv, (size_t)len * sizeof(float), "regularisation scales and Hadamard",
                    [&](cudaStream_t s, void *buf) {
                        float *d = (float *)buf;
                        const sparq_status st = cuda_status(
                            cudaMemcpyAsync(d, sc, (size_t)len * sizeof(float), cudaMemcpyHostToDevice, s), "scales");
                        if (st != SPARQ_OK) return st;
                        const unsigned segs = (unsigned)((size_t)x->k * (x->n / 128)); /* (row, 128-block)s */
                        if (dim == 0) k_reg_had_right<<<segs, 128, 0, s>>>(x->d, x->k, x->n, d);
                        else k_reg_had_left<<<dim3((x->n + 31) / 32, x->k / 128), 256, 0, s>>>(x->d, x->k, x->n, d);
                        return SPARQ_OK;
                    });
}

extern "C" sparq_status ldlq_cuda_reg_tile_sumsq(void *cv, void *m, double *out)
{
    const reg_mat *x = (const reg_mat *)m;
    const size_t tiles = (size_t)(x->k / 16) * (x->n / 16);
    return reg_call((ldlq_cuda *)cv, tiles * sizeof(double), "regularisation tile sums",
                    [&](cudaStream_t s, void *buf) {
                        k_reg_tile_sumsq<<<grid_for(tiles), 256, 0, s>>>(x->d, x->k, x->n, (double *)buf);
                        return cuda_status(cudaMemcpyAsync(out, buf, tiles * sizeof(double), cudaMemcpyDeviceToHost, s),
                                           "tile sums");
                    });
}

extern "C" sparq_status ldlq_cuda_reg_tiles(void *cv, void *m, const int *idx, size_t count, float *out)
{
    const reg_mat *x = (const reg_mat *)m;
    if (count == 0) return SPARQ_OK;
    const size_t ib = (count * sizeof(int) + 255) / 256 * 256;
    return reg_call((ldlq_cuda *)cv, ib + count * 256 * sizeof(float), "regularisation sample tiles",
                    [&](cudaStream_t s, void *buf) {
                        int *di = (int *)buf;
                        float *dt = (float *)((char *)buf + ib);
                        sparq_status st = cuda_status(
                            cudaMemcpyAsync(di, idx, count * sizeof(int), cudaMemcpyHostToDevice, s), "tile indices");
                        if (st != SPARQ_OK) return st;
                        k_reg_tiles<<<grid_for(count * 256), 256, 0, s>>>(x->d, x->n, di, count, dt);
                        return cuda_status(cudaMemcpyAsync(out, dt, count * 256 * sizeof(float),
                                                           cudaMemcpyDeviceToHost, s), "sample tiles");
                    });
}

extern "C" sparq_status ldlq_cuda_reg_scale(void *cv, void *m, float g)
{
    const reg_mat *x = (const reg_mat *)m;
    const size_t kn = (size_t)x->k * x->n;
    return reg_call((ldlq_cuda *)cv, 0, "regularisation global scale", [&](cudaStream_t s, void *) {
        k_reg_scale<<<grid_for(kn), 256, 0, s>>>(x->d, kn, g);
        return SPARQ_OK;
    });
}

static const ldlq_cuda_ops g_ops = {ldlq_cuda_create,      ldlq_cuda_free,        ldlq_cuda_mem_info,
                                    ldlq_cuda_batch_bytes, ldlq_cuda_encoder_bytes, ldlq_cuda_encode_host,
                                    ldlq_cuda_batch,       ldlq_cuda_hess_prepare, ldlq_cuda_hess_free,
                                    ldlq_cuda_hess_of,     ldlq_cuda_hess_bytes,  ldlq_cuda_batch_submit,
                                    ldlq_cuda_batch_wait,  ldlq_cuda_reg_load,    ldlq_cuda_reg_sumsq,
                                    ldlq_cuda_reg_scale_had, ldlq_cuda_reg_tile_sumsq, ldlq_cuda_reg_tiles,
                                    ldlq_cuda_reg_scale,   ldlq_cuda_reg_release, ldlq_cuda_reg_device,
                                    ldlq_cuda_reg_bytes};

extern "C" const ldlq_cuda_ops *ldlq_cuda_get_ops(void) { return &g_ops; }
