/* tools/bench/quantize_layer_bench.c — one real-shape MoE layer quantized end
 * to end the way `sparq quantize --device cuda` does it (quantize/layer_cuda.c),
 * from random weights and random calibration activations, through the same
 * two-stage pipeline (quantize/gpu_pipe.h: the CPU prepares batch b+1 while
 * the GPU runs batch b, batches sized by its rule, qz_pipe_fit):
 *   Hessians   H = XᵀX / rows per expert and input (gate/up share one, down
 *              its own), X Gaussian with a few loud channels (made over the
 *              thread pool), H on the GPU
 *              (cuBLAS SSYRK, fp32, on its own stream), downloaded as the
 *              capture hands them over; made again for each batch that reads
 *              them (gate's and up's), as the driver prepares them again;
 *   prepare    ldlq_cuda_hess_prepare on the GPU (or ldlq_hessian_prepare on the CPU);
 *   regularise ldlq_regularize_on per weight over the thread pool, the matrix
 *              work on the CPU threads (--gpu-reg: on the GPU, ldlq_cuda_reg_*),
 *              the scale search's tiles on the GPU unless --scale fixed;
 *   recursion  ldlq_cuda_batch_submit / _wait over every expert's gate and up
 *              (one group, as the driver's), then down.
 * The first three are the pipeline's CPU stage. Prints seconds per phase,
 * weights/s, the overlap (wall time against the CPU stage plus the GPU busy
 * time), GPU memory (the largest two batches and the encoders, from their
 * plans, and the peak seen by cudaMemGetInfo), and the layer and whole-model
 * times extrapolated from --run of --experts experts (stated as such).
 * Random weights: the time does not depend on the values.
 *
 *   quantize_layer_bench [--preset qwen3|v41] [--experts N] [--run M]
 *                        [--K K] [--scale full|shared|fixed] [--threads T]
 *                        [--first E] [--layers L] [--cpu-check] [--cpu-hessian] [--gpu-reg]
 *                        [--no-overlap] [--devices LIST]
 * --first E runs experts E .. E+M-1 (each expert's weights and Hessians are
 * seeded by its index), so that a layer too long for one sitting is run in
 * pieces: --run 192 --first 0, then --run 192 --first 192.
 * --devices LIST (as `sparq quantize --devices`, e.g. 0,1): with more than one
 * entry the layer runs twice, on the first device alone and then on all of
 * them (one context and pipeline each, qz_pipe_run_multi), and the bench
 * prints both and the speed-up. The bench's own Hessians (the capture's
 * stand-in) are made on the first device.
 * --cpu-hessian prepares the Hessians on the CPU (SPARQ_QUANT_GPU_HESSIAN=0).
 * --gpu-reg regularises on the GPU (SPARQ_QUANT_GPU_REG=1).
 * --no-overlap waits for each batch right after its submit (the same batches).
 * --cpu-check also quantizes expert 0's gate on the CPU (one thread per
 * tile over the pool) and prints both times and proxies. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "common/threadpool.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "quantize/driver.h"
#include "quantize/gpu_pipe.h"
#include "quantize/ldlq.h"

/* A per-thread Gaussian source (the weights are made on the pool's threads). */
typedef struct bench_rand {
    uint64_t s;
} bench_rand;
static void bench_rand_seed(bench_rand *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }
static double bench_rand_unif(bench_rand *r)
{
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return ((double)(r->s >> 11) + 0.5) / 9007199254740992.0;
}
static float bench_rand_gauss(bench_rand *r)
{
    const double u = bench_rand_unif(r), v = bench_rand_unif(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

typedef struct shape {
    const char *name;
    int d, inter, experts, layers;
} shape;

static const shape presets[] = {
    {"qwen3", 2048, 768, 128, 48},  /* Qwen3-30B-A3B: 48 MoE layers */
    {"v41", 5120, 2304, 384, 40},   /* DeepSeek-V4.1-Flash: 40 layers, 384 routed experts */
};

static size_t peak_used;
static volatile int sampling;

static void *mem_sampler(void *arg)
{
    cudaSetDevice(*(const int *)arg); /* the first listed device's memory */
    while (sampling) {
        size_t fr, tot;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > peak_used) peak_used = tot - fr;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static int g_K;

/* The scale search's coder (ctx: the pipeline's context): its own encoder (thread-safe, beside the
 * batch in flight). */
static sparq_status search_encode(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded)
{
    return ldlq_cuda_encode_host(ctx, g_K, TRELLIS_CB_MUL1, x, n_tiles, states, decoded);
}

/* The projections: gate and up read the d-wide input (one Hessian per expert), down the inter-wide one. */
typedef struct proj_desc {
    const char *name;
    int input; /* 0: d-wide, 1: inter-wide */
} proj_desc;
static const proj_desc proj[3] = {{"gate", 0}, {"up", 0}, {"down", 1}};

/* One linear of the layer, in the driver's order: gate and up of expert 0, of expert 1, …
 * (one group: the same shape), then every down. */
typedef struct bitem {
    int p, e;
} bitem;

typedef struct bench {
    const shape *sh;
    int run, K, scale, gpu_hess, gpu_reg, n_items;
    bitem *items;
    sparq_pool *pool;
    int hdev;            /* the device of blas, hstream, dx, dh */
    cublasHandle_t blas; /* the bench's own Hessians, on hstream */
    cudaStream_t hstream;
    float *hx, *dx, *dh; /* their rows (host, device) and H (device), for the largest input */
    double g_shared[3];  /* --scale shared: per projection, its first expert's scale */
    int plan_first;
    uint64_t host_budget;
    size_t enc_bytes, plan_peak;
    double t_hess, t_prep, t_reg, proxy_sum;
    uint64_t n_weights;
} bench;

/* One device's pipeline: the callbacks' ctx. */
typedef struct bpipe {
    bench *B;
    ldlq_cuda *c;
    ldlq_reg_engine eng; /* c's regularisation engine: each ldlq_reg points at it until released */
} bpipe;

typedef struct bbatch {
    int first, m, k, n, n_hess;
    int *hidx;             /* per item: its Hessian */
    ldlq_hessian **hs;     /* per Hessian */
    ldlq_cuda_dhess **dh;
    ldlq_cuda_hess *gh;
    ldlq_reg *reg;         /* per item */
    ldlq_cuda_item *it;
    ldlq_cuda_pending *pend;
    size_t dev;
    uint64_t host;
    double t_cpu;
} bbatch;

static int item_k(const bench *B, const bitem *it) { return proj[it->p].input == 0 ? B->sh->d : B->sh->inter; }
static int item_n(const bench *B, const bitem *it) { return proj[it->p].input == 0 ? B->sh->inter : B->sh->d; }
/* Items reading the same Hessian are adjacent (gate and up of one expert), as the driver's leaders. */
static int same_hess(const bitem *a, const bitem *b) { return a->e == b->e && proj[a->p].input == proj[b->p].input; }

/* The rows of a bench Hessian, HX_ROWS a pool task, each block its own Gaussian stream. */
enum { HX_ROWS = 64 };
typedef struct hx_job {
    float *hx;
    int k, rows;
    uint64_t seed;
} hx_job;

static void hx_rows(void *ctx, size_t blk, int tid)
{
    (void)tid;
    const hx_job *j = ctx;
    bench_rand rs;
    bench_rand_seed(&rs, j->seed * 65537 + blk);
    const size_t r1 = (blk + 1) * HX_ROWS < (size_t)j->rows ? (blk + 1) * HX_ROWS : (size_t)j->rows;
    for (size_t i = blk * HX_ROWS * (size_t)j->k; i < r1 * (size_t)j->k; i++)
        j->hx[i] = bench_rand_gauss(&rs) * ((i % (size_t)j->k) < 16 ? 6.0f : 1.0f);
}

/* The mirror of a k×k result's lower triangle into its upper one, a row a task. */
typedef struct mirror_job {
    float *h;
    int k;
} mirror_job;

static void mirror_row(void *ctx, size_t r, int tid)
{
    (void)tid;
    const mirror_job *j = ctx;
    for (size_t c = r + 1; c < (size_t)j->k; c++) j->h[r * j->k + c] = j->h[c * j->k + r];
}

/* A random Hessian for input size k (SSYRK of k + 256 Gaussian rows, made over the pool), into
 * host h (k×k). */
static sparq_status make_hessian(bench *B, int k, uint64_t seed, float *h)
{
    const int rows = k + 256;
    RETURN_IF(cudaSetDevice(B->hdev) != cudaSuccess, SPARQ_E_STATE, "bench Hessian: device %d", B->hdev);
    hx_job hj = {B->hx, k, rows, seed};
    sparq_pool_for(B->pool, (size_t)(rows + HX_ROWS - 1) / HX_ROWS, hx_rows, &hj);
    const float a = 1.0f / rows, b = 0.0f;
    cudaMemcpyAsync(B->dx, B->hx, (size_t)rows * k * 4, cudaMemcpyHostToDevice, B->hstream);
    /* column-major C (k×k) = Aᵀ·A with A the row-major rows×k buffer read as k×rows */
    cublasSsyrk(B->blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, k, rows, &a, B->dx, k, &b, B->dh, k);
    cudaMemcpyAsync(h, B->dh, (size_t)k * k * 4, cudaMemcpyDeviceToHost, B->hstream);
    const cudaError_t e = cudaStreamSynchronize(B->hstream);
    RETURN_IF(e != cudaSuccess, SPARQ_E_STATE, "bench Hessian: %s", cudaGetErrorString(e));
    /* the upper triangle of the column-major result = the lower of the row-major: mirror it */
    mirror_job mj = {h, k};
    sparq_pool_for(B->pool, (size_t)k, mirror_row, &mj);
    return SPARQ_OK;
}

typedef struct reg_job {
    bench *B;
    ldlq_cuda *c;
    const ldlq_reg_engine *eng; /* the pipeline's (outlives the batch's ldlq_regs) */
    bbatch *b;
    sparq_status st;
} reg_job;

static void reg_one(void *ctx, size_t i, int tid)
{
    (void)tid;
    reg_job *r = ctx;
    bench *B = r->B;
    bbatch *b = r->b;
    if (b->reg[i].dev) return; /* a shared scale's search, done first */
    const bitem *it = &B->items[b->first + i];
    const size_t kn = (size_t)b->k * b->n;
    float *w = sparq_malloc(kn * sizeof(float));
    if (!w) {
        r->st = SPARQ_E_NOMEM;
        return;
    }
    const uint64_t seed = (uint64_t)it->p * 1000003 + it->e;
    bench_rand rs;
    bench_rand_seed(&rs, seed);
    for (size_t e = 0; e < kn; e++) w[e] = 0.02f * bench_rand_gauss(&rs);
    ldlq_opts o;
    ldlq_opts_default(&o, B->K);
    o.seed = seed;
    o.out_scales = 1;
    if (B->scale == 2) o.g_fixed = ldlq_default_g(B->K, o.cb);
    else if (B->scale == 1 && B->g_shared[it->p] > 0) o.g_fixed = B->g_shared[it->p];
    const ldlq_coder coder = {search_encode, r->c};
    sparq_status st = ldlq_regularize_on(b->hs[b->hidx[i]], w, b->n, &o, &coder,
                                         B->gpu_reg ? r->eng : &ldlq_reg_engine_cpu, "bench", &b->reg[i]);
    if (st != SPARQ_OK) r->st = st;
    sparq_free(w);
}

/* Device bytes and host bytes of the first m items from B->plan_first (qz_pipe_fit's cost). */
static void bench_cost(void *ctx, int m, qz_pipe_cost *c)
{
    const bench *B = ctx;
    const bitem *it = B->items + B->plan_first;
    int nh = 0;
    for (int i = 0; i < m; i++) nh += i == 0 || !same_hess(&it[i], &it[i - 1]);
    const int k = item_k(B, it), n = item_n(B, it);
    const ldlq_cuda_shape s = {k, n, B->K, TRELLIS_CB_MUL1, 0, B->gpu_reg};
    c->dev_early = (B->gpu_hess ? (size_t)nh * ldlq_cuda_hess_bytes(k) : 0) +
                   (B->gpu_reg ? (size_t)m * ldlq_cuda_reg_bytes(k, n) : 0);
    c->dev = ldlq_cuda_batch_bytes(&s, B->gpu_hess ? 0 : nh, m, 0) + c->dev_early;
    c->host = (uint64_t)m * ((B->gpu_reg ? 1ull : 2ull) * k * n * 4 + (uint64_t)k * n * B->K / 8) +
              (uint64_t)nh * 2ull * k * k * 4;
}

static sparq_status plan(void *ctx, int first, const void *busy_v, int *count)
{
    bench *B = ((bpipe *)ctx)->B;
    ldlq_cuda *g_ctx = ((bpipe *)ctx)->c;
    const bbatch *busy = busy_v;
    const bitem *it = B->items + first;
    int avail = 1;
    while (first + avail < B->n_items && item_k(B, &it[avail]) == item_k(B, it)) avail++;
    size_t fr = 0, tot = 0, enc = 0;
    FORWARD_IF(ldlq_cuda_encoder_bytes(g_ctx, B->K, TRELLIS_CB_MUL1, &enc));
    FORWARD_IF(ldlq_cuda_mem_info(g_ctx, &fr, &tot));
    B->enc_bytes = enc;
    const size_t margin = (size_t)2 << 30; /* the bench's own Hessian buffers and cuBLAS besides */
    const qz_pipe_room r = {.dev_free = fr > margin ? fr - margin : 0, .dev_held = busy ? busy->dev : 0,
                            .host = B->host_budget, .host_held = busy ? busy->host : 0, .busy = busy != NULL};
    B->plan_first = first;
    *count = qz_pipe_fit(&r, avail, bench_cost, B);
    if (*count > 0) {
        qz_pipe_cost c;
        bench_cost(B, *count, &c);
        const size_t peak = c.dev + r.dev_held + enc;
        if (peak > B->plan_peak) B->plan_peak = peak;
    }
    RETURN_IF(*count == 0 && !busy, SPARQ_E_FIT, "one %s weight does not fit in %.2f GB", proj[it->p].name,
              r.dev_free / 1e9);
    return SPARQ_OK;
}

static void release(void *ctx, void *bv)
{
    (void)ctx;
    bbatch *b = bv;
    if (!b) return;
    for (int i = 0; i < b->m; i++) {
        if (b->hs) ldlq_hessian_free(b->hs[i]);
        if (b->dh) ldlq_cuda_hess_free(b->dh[i]);
        if (b->reg) ldlq_reg_free(&b->reg[i]);
        if (b->it) sparq_free(b->it[i].trellis);
    }
    sparq_free(b->hidx), sparq_free(b->hs), sparq_free(b->dh), sparq_free(b->gh), sparq_free(b->reg);
    sparq_free(b->it);
    sparq_free(b);
}

/* The CPU stage: Hessians made and prepared, weights made and regularised. */
static sparq_status prepare(void *ctx, int first, int m, void **out)
{
    bench *B = ((bpipe *)ctx)->B;
    ldlq_cuda *g_ctx = ((bpipe *)ctx)->c;
    bbatch *b = sparq_calloc(1, sizeof *b);
    RETURN_IF(!b, SPARQ_E_NOMEM, "out of memory");
    *out = b;
    const bitem *items = B->items + first;
    const int k = item_k(B, items), n = item_n(B, items);
    *b = (bbatch){.first = first, .m = m, .k = k, .n = n};
    b->hidx = sparq_calloc((size_t)m, sizeof *b->hidx);
    b->hs = sparq_calloc((size_t)m, sizeof *b->hs);
    b->dh = sparq_calloc((size_t)m, sizeof *b->dh);
    b->gh = sparq_calloc((size_t)m, sizeof *b->gh);
    b->reg = sparq_calloc((size_t)m, sizeof *b->reg);
    b->it = sparq_calloc((size_t)m, sizeof *b->it);
    float *h = sparq_malloc((size_t)k * k * 4), *su = sparq_malloc((size_t)k * 4), *hd = sparq_malloc((size_t)k * 4);
    const double t0 = sparq_now();
    sparq_status st = b->hidx && b->hs && b->dh && b->gh && b->reg && b->it && h && su && hd
                          ? SPARQ_OK
                          : sparq_err(SPARQ_E_NOMEM, "out of memory");
    double th = 0;
    for (int i = 0; i < m && st == SPARQ_OK; i++) {
        if (i == 0 || !same_hess(&items[i], &items[i - 1])) {
            const int e = b->n_hess++;
            const double t1 = sparq_now();
            st = make_hessian(B, k, 1000 + 7 * (items[i].e + proj[items[i].p].input * 100000), h);
            th += sparq_now() - t1;
            const uint64_t seed = 77 + (uint64_t)items[i].e + 100000ull * proj[items[i].p].input;
            if (st == SPARQ_OK && B->gpu_hess) {
                int ident = 0;
                float damp = 0;
                st = ldlq_cuda_hess_prepare(g_ctx, h, k, 0.0f, seed, "bench", &b->dh[e], su, hd, &ident, &damp);
                if (st == SPARQ_OK) st = ldlq_hessian_wrap(&b->hs[e], k, su, hd, ident != 0, damp);
                if (st == SPARQ_OK) b->gh[e] = ldlq_cuda_hess_of(b->dh[e]);
            } else if (st == SPARQ_OK) {
                st = ldlq_hessian_prepare(&b->hs[e], h, k, 0.0f, seed, "bench");
                if (st == SPARQ_OK)
                    b->gh[e] = (ldlq_cuda_hess){ldlq_hessian_hr(b->hs[e]), ldlq_hessian_l(b->hs[e]),
                                                ldlq_hessian_d(b->hs[e]), 0};
            }
        }
        b->hidx[i] = b->n_hess - 1;
    }
    sparq_free(h), sparq_free(su), sparq_free(hd);
    const double t2 = sparq_now();
    B->t_hess += th;
    B->t_prep += t2 - t0 - th;
    reg_job rj = {B, g_ctx, &((bpipe *)ctx)->eng, b, SPARQ_OK};
    if (st == SPARQ_OK && B->scale == 1) /* each projection's first expert searches, as --scale-search shared */
        for (int i = 0; i < m && rj.st == SPARQ_OK; i++)
            if (!(B->g_shared[items[i].p] > 0)) {
                reg_one(&rj, (size_t)i, 0);
                if (rj.st == SPARQ_OK) B->g_shared[items[i].p] = b->reg[i].g;
            }
    if (st == SPARQ_OK && rj.st == SPARQ_OK) sparq_pool_for(B->pool, (size_t)m, reg_one, &rj);
    if (st == SPARQ_OK) st = rj.st;
    B->t_reg += sparq_now() - t2;
    const size_t words = (size_t)k * n / 256 * 16 * B->K;
    for (int i = 0; i < m && st == SPARQ_OK; i++) {
        const float *wr = B->gpu_reg ? ldlq_cuda_reg_device(b->reg[i].dev) : b->reg[i].wr;
        b->it[i] = (ldlq_cuda_item){.hess = b->hidx[i], .wr = wr, .trellis = sparq_malloc(words * 2)};
        if (!b->it[i].trellis) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    B->plan_first = first;
    qz_pipe_cost c;
    bench_cost(B, m, &c);
    b->dev = c.dev, b->host = c.host;
    b->t_cpu = sparq_now() - t0;
    return st;
}

static sparq_status submit(void *ctx, void *bv)
{
    const bench *B = ((bpipe *)ctx)->B;
    ldlq_cuda *g_ctx = ((bpipe *)ctx)->c;
    bbatch *b = bv;
    const ldlq_cuda_shape s = {b->k, b->n, B->K, TRELLIS_CB_MUL1, 0, B->gpu_reg};
    return ldlq_cuda_batch_submit(g_ctx, &s, b->gh, b->n_hess, b->it, b->m, proj[B->items[b->first].p].name, &b->pend);
}

static sparq_status wait_(void *ctx, void *bv, double *gpu_seconds)
{
    const bench *B = ((bpipe *)ctx)->B;
    bbatch *b = bv;
    const sparq_status st = ldlq_cuda_batch_wait(b->pend, gpu_seconds);
    b->pend = NULL;
    if (st == SPARQ_OK) {
        const bitem *f = &B->items[b->first], *l = &B->items[b->first + b->m - 1];
        printf("  %-4s..%-4s experts %3d..%3d: CPU stage %.2f s, GPU %.2f s (%.0f tiles/s)\n", proj[f->p].name,
               proj[l->p].name, f->e, l->e, b->t_cpu, *gpu_seconds, (double)b->m * b->k * b->n / 256 / *gpu_seconds);
        fflush(stdout);
    }
    return st;
}

static sparq_status finish(void *ctx, void *bv)
{
    bench *B = ((bpipe *)ctx)->B;
    bbatch *b = bv;
    for (int i = 0; i < b->m; i++) B->proxy_sum += b->it[i].proxy_err;
    B->n_weights += (uint64_t)b->m * b->k * b->n;
    return SPARQ_OK;
}

/* expert 0's gate on the CPU encoder (Hessian prepared on the CPU), for the ratio */
static void cpu_check(bench *B)
{
    const int k = B->sh->d, n = B->sh->inter, K = B->K;
    float *h = sparq_malloc((size_t)k * k * 4), *w = sparq_malloc((size_t)k * n * 4);
    ldlq_hessian *hs = NULL;
    if (make_hessian(B, k, 1000, h) != SPARQ_OK || ldlq_hessian_prepare(&hs, h, k, 0.0f, 77, "cpu") != SPARQ_OK) {
        fprintf(stderr, "cpu check: %s\n", sparq_errmsg());
        sparq_free(h), sparq_free(w);
        return;
    }
    viterbi_enc *enc = NULL;
    viterbi_create(&enc, K, TRELLIS_CB_MUL1, sparq_pool_size(B->pool));
    bench_rand rs;
    bench_rand_seed(&rs, 0);
    for (size_t q = 0; q < (size_t)k * n; q++) w[q] = 0.02f * bench_rand_gauss(&rs);
    uint16_t *tr = sparq_malloc((size_t)k * n / 256 * 16 * K * 2), *su = sparq_malloc(k * 2), *sv = sparq_malloc(n * 2);
    ldlq_opts o;
    ldlq_opts_default(&o, K);
    o.out_scales = 1;
    o.g_fixed = ldlq_default_g(K, o.cb);
    ldlq_result r = {.trellis = tr, .suh = su, .svh = sv};
    const double c0 = sparq_now();
    ldlq_quantize(hs, w, n, &o, enc, B->pool, "cpu", &r);
    printf("  cpu check: one %d x %d weight on the CPU encoder (%d threads) %.2f s, proxy %.5f\n", k, n,
           sparq_pool_size(B->pool), sparq_now() - c0, r.proxy_err);
    viterbi_free(enc);
    ldlq_hessian_free(hs);
    sparq_free(h), sparq_free(w), sparq_free(tr), sparq_free(su), sparq_free(sv);
}

/* The layer once through n_dev pipelines (ctx[0..n_dev)); prints its figures, returns its wall
 * seconds (< 0: failed). */
static double run_layer(bench *B, ldlq_cuda **ctx, const int *devs, int n_dev, int overlap, int experts,
                        int layers)
{
    B->t_hess = B->t_prep = B->t_reg = B->proxy_sum = 0;
    B->n_weights = 0;
    B->plan_peak = 0;
    memset(B->g_shared, 0, sizeof B->g_shared);
    bpipe bp[QZ_PIPE_MAX];
    qz_pipe_ops ops[QZ_PIPE_MAX];
    char names[QZ_PIPE_MAX][32];
    for (int d = 0; d < n_dev; d++) {
        bp[d] = (bpipe){B, ctx[d], LDLQ_CUDA_REG_ENGINE(ctx[d])};
        snprintf(names[d], sizeof names[d], "CUDA device %d", devs[d]);
        ops[d] = (qz_pipe_ops){&bp[d], plan, prepare, submit, wait_, finish, release, names[d]};
    }
    qz_pipe_stats pd[QZ_PIPE_MAX] = {{0}}, ps = {0};
    pthread_t sampler;
    peak_used = 0;
    sampling = 1;
    pthread_create(&sampler, NULL, mem_sampler, &B->hdev);
    const double t0 = sparq_now();
    const sparq_status st = qz_pipe_run_multi(ops, n_dev, B->n_items, overlap, pd);
    ps.wall = sparq_now() - t0;
    sampling = 0;
    pthread_join(sampler, NULL);
    if (st != SPARQ_OK) {
        fprintf(stderr, "quantize: %s\n", sparq_errmsg());
        return -1;
    }
    for (int d = 0; d < n_dev; d++) {
        ps.prepare += pd[d].prepare, ps.finish += pd[d].finish, ps.gpu += pd[d].gpu, ps.waited += pd[d].waited;
        ps.batches += pd[d].batches;
        if (n_dev > 1)
            printf("  device %d (entry %d): %d batches, GPU busy %.1f s, waited %.1f s\n", devs[d], d + 1,
                   pd[d].batches, pd[d].gpu, pd[d].waited);
    }
    const int run = B->run;
    const double total = ps.wall, layer = total * experts / run, cpu = ps.prepare + ps.finish;
    printf("measured: %d experts, %.0f M weights in %.1f s (%.2f M weights/s) in %d batches: Hessians %.1f s, "
           "prepare %.1f s, regularise %.1f s, GPU recursion %.1f s; mean proxy %.5f\n",
           run, B->n_weights / 1e6, total, B->n_weights / 1e6 / total, ps.batches, B->t_hess, B->t_prep, B->t_reg, ps.gpu,
           B->proxy_sum / (3.0 * run));
    printf("overlap: wall %.1f s against CPU stages %.1f s + GPU %.1f s = %.1f s: %.1f s hidden (%.0f %% of the "
           "shorter); waited for the GPU %.1f s\n",
           total, cpu, ps.gpu, cpu + ps.gpu, cpu + ps.gpu - total,
           100.0 * (cpu + ps.gpu - total) / (cpu < ps.gpu ? cpu : ps.gpu), ps.waited);
    printf("GPU memory: largest two batches + encoders planned %.2f GB, peak in use %.2f GB (cudaMemGetInfo, incl. "
           "context)\n",
           B->plan_peak / 1e9, peak_used / 1e9);
    /* the bench makes each expert's Hessian from random rows over the pool, in the CPU stage: a
     * stand-in for the calibration capture (quantize --device cuda: on the GPU, calib_cuda.h) that the
     * quantizer itself never does, so the quantizer's time is given without it too */
    const double qlayer = (total - B->t_hess) * experts / run;
    printf("extrapolated (not measured): the whole layer of %d experts %.0f s; %d such layers %.2f h "
           "(routed experts only; the GPU recursion alone: %.2f h)\n",
           experts, layer, layers, layer * layers / 3600.0, ps.gpu * experts / run * layers / 3600.0);
    printf("extrapolated without the bench's own Hessian making (%.1f s; the capture's work in "
           "a real run): %.0f s a layer, %d layers %.2f h\n",
           B->t_hess, qlayer, layers, qlayer * layers / 3600.0);
    return total;
}

int main(int argc, char **argv)
{
    const shape *sh = &presets[0];
    int experts = -1, run = -1, K = 3, scale = 0, threads = 0, layers = -1, check = 0, gpu_hess = 1, gpu_reg = 0;
    int overlap = 1, first = 0;
    int devs[QZ_MAX_DEVICES] = {0}, n_dev = 1;
    const char *dev_list = "0";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cpu-check")) { check = 1; continue; }
        if (!strcmp(a, "--cpu-hessian")) { gpu_hess = 0; continue; }
        if (!strcmp(a, "--gpu-reg")) { gpu_reg = 1; continue; }
        if (!strcmp(a, "--no-overlap")) { overlap = 0; continue; }
        if (!v) { fprintf(stderr, "%s: needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--preset")) {
            sh = NULL;
            for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++)
                if (!strcmp(v, presets[p].name)) sh = &presets[p];
            if (!sh) { fprintf(stderr, "--preset %s: qwen3 or v41\n", v); return 2; }
        } else if (!strcmp(a, "--experts")) experts = atoi(v);
        else if (!strcmp(a, "--run")) run = atoi(v);
        else if (!strcmp(a, "--first")) first = atoi(v);
        else if (!strcmp(a, "--K")) K = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--scale")) scale = !strcmp(v, "shared") ? 1 : !strcmp(v, "fixed") ? 2 : 0;
        else if (!strcmp(a, "--devices")) {
            if (qz_devices_parse(v, devs, &n_dev) != SPARQ_OK) { fprintf(stderr, "%s\n", sparq_errmsg()); return 2; }
            dev_list = v;
        }
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    if (experts <= 0) experts = sh->experts;
    if (run <= 0 || run > experts) run = experts;
    if (first < 0 || first + run > experts) {
        fprintf(stderr, "--first %d: experts %d..%d are past the layer's %d\n", first, first, first + run - 1, experts);
        return 2;
    }
    if (layers <= 0) layers = sh->layers;
    g_K = K;
    bench B = {.sh = sh, .run = run, .K = K, .scale = scale, .gpu_hess = gpu_hess, .gpu_reg = gpu_reg,
               .host_budget = (uint64_t)48 << 30};
    int lo_prio = 0, hi_prio = 0;
    const int kmax = sh->d > sh->inter ? sh->d : sh->inter;
    B.n_items = 3 * run;
    B.items = sparq_calloc((size_t)B.n_items, sizeof *B.items);
    B.hx = sparq_malloc((size_t)(kmax + 256) * kmax * 4);
    B.hdev = devs[0]; /* the bench's own Hessians (and the memory sampler) on the first device */
    ldlq_cuda *ctx[QZ_MAX_DEVICES] = {0};
    for (int d = 0; d < n_dev; d++)
        if (ldlq_cuda_create(devs[d], 0, &ctx[d]) != SPARQ_OK) {
            fprintf(stderr, "setup: --devices entry %d: %s\n", d + 1, sparq_errmsg());
            return 1;
        }
    if (cudaSetDevice(B.hdev) != cudaSuccess || !B.items || !B.hx || sparq_pool_create(&B.pool, threads) != SPARQ_OK ||
        cublasCreate(&B.blas) != CUBLAS_STATUS_SUCCESS ||
        cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio) != cudaSuccess ||
        /* its Hessians are the CPU stage's GPU work: at the highest priority, as the driver's
         * preparation (ldlq_cuda.cu), else they queue behind the whole batch in flight */
        cudaStreamCreateWithPriority(&B.hstream, cudaStreamNonBlocking, hi_prio) != cudaSuccess ||
        cublasSetStream(B.blas, B.hstream) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc((void **)&B.dx, (size_t)(kmax + 256) * kmax * 4) != cudaSuccess ||
        cudaMalloc((void **)&B.dh, (size_t)kmax * kmax * 4) != cudaSuccess) {
        fprintf(stderr, "setup: %s\n", sparq_errmsg());
        return 1;
    }
    for (int e = 0, q = 0; e < run; e++) /* the driver's order: gate, up of each expert (one group) */
        B.items[q++] = (bitem){0, first + e}, B.items[q++] = (bitem){1, first + e};
    for (int e = 0; e < run; e++) B.items[2 * run + e] = (bitem){2, first + e};
    printf("layer %s: %d experts of %d -> %d -> %d, K = %d, scale search %s; running %d of them (from %d), %d threads, "
           "%s\n",
           sh->name, experts, sh->d, sh->inter, sh->d, K, scale == 0 ? "full" : scale == 1 ? "shared" : "fixed", run, first,
           sparq_pool_size(B.pool), overlap ? "CPU and GPU overlapped" : "no overlap");
    const int n_runs = n_dev > 1 ? 2 : 1;
    double wall[2] = {0};
    for (int r = 0; r < n_runs; r++) {
        const int nd = r == 0 ? 1 : n_dev;
        printf("%s\n", nd == 1 ? "on the first device:" : "on every listed device:");
        wall[r] = run_layer(&B, ctx, devs, nd, overlap, experts, layers);
        if (wall[r] < 0) return 1;
    }
    if (n_runs == 2)
        printf("devices: 1 (device %d) %.1f s, %d (--devices %s) %.1f s: speed-up %.2fx\n", devs[0], wall[0], n_dev,
               dev_list, wall[1], wall[0] / wall[1]);
    if (check) cpu_check(&B);
    for (int d = 0; d < n_dev; d++) ldlq_cuda_free(ctx[d]);
    cudaSetDevice(B.hdev);
    cudaFree(B.dx);
    cudaFree(B.dh);
    cudaStreamDestroy(B.hstream);
    cublasDestroy(B.blas);
    sparq_pool_free(B.pool);
    sparq_free(B.hx);
    sparq_free(B.items);
    return 0;
}
