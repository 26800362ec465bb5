/* tools/bench/quantize_layer_bench.c — one real-shape MoE layer quantized end
 * to end the way `sparq quantize --device cuda` does it (quantize/layer_cuda.c),
 * from random weights and random calibration activations:
 *   Hessians   H = XᵀX / rows per expert and input (gate/up share one, down
 *              its own), X Gaussian with a few loud channels, on the GPU
 *              (cuBLAS SSYRK, fp32), downloaded as the capture hands them over;
 *   prepare    ldlq_cuda_hess_prepare on the GPU (or ldlq_hessian_prepare on the CPU);
 *   regularise ldlq_regularize per weight (CPU, over the thread pool; the
 *              scale search's tiles on the GPU unless --scale fixed);
 *   recursion  ldlq_cuda_batch over every expert's gate, then up, then down
 *              (batches sized by free GPU memory as the driver sizes them).
 * Prints seconds per phase, weights/s, GPU memory (the largest batch and the
 * encoder, from their plans, and the peak seen by cudaMemGetInfo), and the
 * layer and whole-model times extrapolated from --run of --experts experts
 * (stated as such). Random weights: the time does not depend on the values.
 *
 *   quantize_layer_bench [--preset qwen3|v41] [--experts N] [--run M]
 *                        [--K K] [--scale full|shared|fixed] [--threads T]
 *                        [--layers L] [--cpu-check] [--cpu-hessian]
 * --cpu-hessian prepares the Hessians on the CPU (SPARQ_QUANT_GPU_HESSIAN=0).
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
    (void)arg;
    while (sampling) {
        size_t fr, tot;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > peak_used) peak_used = tot - fr;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static ldlq_cuda *g_ctx;       /* the recursion's */
static ldlq_cuda *g_search;    /* the scale search's (its own encoder) */
static pthread_mutex_t g_search_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_K;

static sparq_status search_encode(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded)
{
    (void)ctx;
    pthread_mutex_lock(&g_search_lock);
    sparq_status st = ldlq_cuda_encode_host(g_search, g_K, TRELLIS_CB_MUL1, x, n_tiles, states, decoded);
    pthread_mutex_unlock(&g_search_lock);
    return st;
}

typedef struct reg_job {
    int k, n, K, scale;
    ldlq_hessian **hs;   /* per item */
    ldlq_reg *reg;
    uint64_t seed0;
    double g_shared;
    sparq_status st;
} reg_job;

static void reg_one(void *ctx, size_t i, int tid)
{
    (void)tid;
    reg_job *r = ctx;
    const size_t kn = (size_t)r->k * r->n;
    float *w = sparq_malloc(kn * sizeof(float));
    if (!w) {
        r->st = SPARQ_E_NOMEM;
        return;
    }
    bench_rand rs;
    bench_rand_seed(&rs, r->seed0 + i);
    for (size_t e = 0; e < kn; e++) w[e] = 0.02f * bench_rand_gauss(&rs);
    ldlq_opts o;
    ldlq_opts_default(&o, r->K);
    o.seed = r->seed0 + i;
    o.out_scales = 1;
    if (r->scale == 2) o.g_fixed = ldlq_default_g(r->K, o.cb);
    else if (r->scale == 1 && r->g_shared > 0) o.g_fixed = r->g_shared;
    const ldlq_coder coder = {search_encode, NULL};
    sparq_status st = ldlq_regularize(r->hs[i], w, r->n, &o, &coder, "bench", &r->reg[i]);
    if (st != SPARQ_OK) r->st = st;
    sparq_free(w);
}

/* Random Hessians for m inputs of size k (GPU SSYRK of rows × k Gaussian activations). */
static int make_hessians(cublasHandle_t blas, int m, int k, int rows, uint64_t seed, float **h)
{
    float *x = sparq_malloc((size_t)rows * k * sizeof(float)), *dx = NULL, *dh = NULL;
    if (!x || cudaMalloc((void **)&dx, (size_t)rows * k * 4) || cudaMalloc((void **)&dh, (size_t)k * k * 4)) return 1;
    bench_rand rs;
    bench_rand_seed(&rs, seed);
    for (int e = 0; e < m; e++) {
        for (size_t i = 0; i < (size_t)rows * k; i++) x[i] = bench_rand_gauss(&rs) * ((i % k) < 16 ? 6.0f : 1.0f);
        cudaMemcpy(dx, x, (size_t)rows * k * 4, cudaMemcpyHostToDevice);
        const float a = 1.0f / rows, b = 0.0f;
        /* column-major C (k×k) = Aᵀ·A with A the row-major rows×k buffer read as k×rows */
        cublasSsyrk(blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, k, rows, &a, dx, k, &b, dh, k);
        cudaMemcpy(h[e], dh, (size_t)k * k * 4, cudaMemcpyDeviceToHost);
        /* the upper triangle of the column-major result = the lower of the row-major: mirror it */
        for (int r = 0; r < k; r++)
            for (int c = r + 1; c < k; c++) h[e][(size_t)r * k + c] = h[e][(size_t)c * k + r];
    }
    cudaFree(dx);
    cudaFree(dh);
    sparq_free(x);
    return 0;
}

int main(int argc, char **argv)
{
    const shape *sh = &presets[0];
    int experts = -1, run = -1, K = 3, scale = 0, threads = 0, layers = -1, cpu_check = 0, gpu_hess = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cpu-check")) { cpu_check = 1; continue; }
        if (!strcmp(a, "--cpu-hessian")) { gpu_hess = 0; continue; }
        if (!v) { fprintf(stderr, "%s: needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--preset")) {
            sh = NULL;
            for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++)
                if (!strcmp(v, presets[p].name)) sh = &presets[p];
            if (!sh) { fprintf(stderr, "--preset %s: qwen3 or v41\n", v); return 2; }
        } else if (!strcmp(a, "--experts")) experts = atoi(v);
        else if (!strcmp(a, "--run")) run = atoi(v);
        else if (!strcmp(a, "--K")) K = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--scale")) scale = !strcmp(v, "shared") ? 1 : !strcmp(v, "fixed") ? 2 : 0;
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    if (experts <= 0) experts = sh->experts;
    if (run <= 0 || run > experts) run = experts;
    if (layers <= 0) layers = sh->layers;
    g_K = K;
    sparq_pool *pool = NULL;
    cublasHandle_t blas;
    if (sparq_pool_create(&pool, threads) != SPARQ_OK || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS ||
        ldlq_cuda_create(0, &g_ctx) != SPARQ_OK || ldlq_cuda_create((size_t)1 << 30, &g_search) != SPARQ_OK) {
        fprintf(stderr, "setup: %s\n", sparq_errmsg());
        return 1;
    }
    printf("layer %s: %d experts of %d -> %d -> %d, K = %d, scale search %s; running %d of them, %d threads\n",
           sh->name, experts, sh->d, sh->inter, sh->d, K, scale == 0 ? "full" : scale == 1 ? "shared" : "fixed", run,
           sparq_pool_size(pool));
    pthread_t sampler;
    sampling = 1;
    pthread_create(&sampler, NULL, mem_sampler, NULL);

    /* the three projections: gate and up read the d-wide input (one Hessian per expert), down the inter-wide one */
    const struct { const char *name; int k, n, hess_of; } proj[3] = {
        {"gate", sh->d, sh->inter, 0}, {"up", sh->d, sh->inter, 0}, {"down", sh->inter, sh->d, 1}};
    double t_hess = 0, t_prep = 0, t_reg = 0, t_gpu = 0, proxy_sum = 0;
    size_t plan_peak = 0, enc_bytes = 0;
    uint64_t n_weights = 0;
    ldlq_cuda_encoder_bytes(g_ctx, K, TRELLIS_CB_MUL1, &enc_bytes);
    const double t_start = sparq_now();
    for (int in = 0; in < 2; in++) {
        const int k = in == 0 ? sh->d : sh->inter;
        const int rows = k + 256;
        /* batch of experts: as many as the free memory takes for the projections of this input */
        size_t fr, tot;
        cudaMemGetInfo(&fr, &tot);
        const size_t budget = fr > ((size_t)2 << 30) ? fr - ((size_t)2 << 30) : fr / 2;
        int per = 1;
        const ldlq_cuda_shape s0 = {k, in == 0 ? sh->inter : sh->d, K, TRELLIS_CB_MUL1, 0};
        const uint64_t host_cap = (uint64_t)48 << 30;
        while (per < run &&
               ldlq_cuda_batch_bytes(&s0, gpu_hess ? 0 : per + 1, per + 1, 0) +
                       (gpu_hess ? (size_t)(per + 1) * ldlq_cuda_hess_bytes(k) : 0) < budget &&
               (uint64_t)(per + 1) * (2ull * k * k * 4 + 2ull * k * s0.n * 4) < host_cap)
            per++;
        for (int e0 = 0; e0 < run; e0 += per) {
            const int m = run - e0 < per ? run - e0 : per;
            float **h = sparq_calloc((size_t)m, sizeof *h);
            ldlq_hessian **hs = sparq_calloc((size_t)m, sizeof *hs);
            for (int e = 0; e < m; e++) h[e] = sparq_malloc((size_t)k * k * sizeof(float));
            double t0 = sparq_now();
            if (make_hessians(blas, m, k, rows, 1000 + 7 * (e0 + in * 100000), h)) {
                fprintf(stderr, "hessians: cuda failed\n");
                return 1;
            }
            double t1 = sparq_now();
            t_hess += t1 - t0;
            ldlq_cuda_hess *gh = sparq_calloc((size_t)m, sizeof *gh);
            ldlq_cuda_dhess **dh = sparq_calloc((size_t)m, sizeof *dh);
            float *su = sparq_malloc((size_t)k * 4), *hd = sparq_malloc((size_t)k * 4);
            for (int e = 0; e < m; e++) {
                sparq_status ps;
                if (gpu_hess) {
                    int ident = 0;
                    float damp = 0;
                    ps = ldlq_cuda_hess_prepare(g_ctx, h[e], k, 0.0f, 77 + e0 + e, "bench", &dh[e], su, hd, &ident,
                                                &damp);
                    if (ps == SPARQ_OK) ps = ldlq_hessian_wrap(&hs[e], k, su, hd, ident != 0, damp);
                    if (ps == SPARQ_OK) gh[e] = ldlq_cuda_hess_of(dh[e]);
                } else {
                    ps = ldlq_hessian_prepare(&hs[e], h[e], k, 0.0f, 77 + e0 + e, "bench");
                    if (ps == SPARQ_OK)
                        gh[e] = (ldlq_cuda_hess){ldlq_hessian_hr(hs[e]), ldlq_hessian_l(hs[e]), ldlq_hessian_d(hs[e]), 0};
                }
                if (ps != SPARQ_OK) {
                    fprintf(stderr, "prepare: %s\n", sparq_errmsg());
                    return 1;
                }
                sparq_free(h[e]);
            }
            sparq_free(su), sparq_free(hd);
            double t2 = sparq_now();
            t_prep += t2 - t1;
            for (int p = 0; p < 3; p++) {
                if (proj[p].hess_of != in) continue;
                const int n = proj[p].n;
                ldlq_reg *reg = sparq_calloc((size_t)m, sizeof *reg);
                reg_job rj = {k, n, K, scale, hs, reg, (uint64_t)(p * 1000003 + e0), 0, SPARQ_OK};
                double t3 = sparq_now();
                if (scale == 1) { /* expert 0's scale for the others, as --scale-search shared */
                    reg_one(&rj, 0, 0);
                    rj.g_shared = reg[0].g;
                    ldlq_reg_free(&reg[0]);
                }
                sparq_pool_for(pool, (size_t)m, reg_one, &rj);
                if (rj.st != SPARQ_OK) {
                    fprintf(stderr, "regularise: %s\n", sparq_errmsg());
                    return 1;
                }
                double t4 = sparq_now();
                t_reg += t4 - t3;
                ldlq_cuda_item *it = sparq_calloc((size_t)m, sizeof *it);
                const size_t words = (size_t)k * n / 256 * 16 * K;
                for (int e = 0; e < m; e++)
                    it[e] = (ldlq_cuda_item){.hess = e, .wr = reg[e].wr, .trellis = sparq_malloc(words * 2)};
                const ldlq_cuda_shape s = {k, n, K, TRELLIS_CB_MUL1, 0};
                size_t bb = ldlq_cuda_batch_bytes(&s, gpu_hess ? 0 : m, m, 0) + enc_bytes +
                            (gpu_hess ? (size_t)m * ldlq_cuda_hess_bytes(k) : 0);
                if (bb > plan_peak) plan_peak = bb;
                if (ldlq_cuda_batch(g_ctx, &s, gh, m, it, m, proj[p].name) != SPARQ_OK) {
                    fprintf(stderr, "batch: %s\n", sparq_errmsg());
                    return 1;
                }
                double t5 = sparq_now();
                t_gpu += t5 - t4;
                for (int e = 0; e < m; e++) {
                    proxy_sum += it[e].proxy_err;
                    sparq_free(it[e].trellis);
                    ldlq_reg_free(&reg[e]);
                }
                n_weights += (uint64_t)m * k * n;
                printf("  %-4s experts %3d..%3d: regularise %.2f s, GPU %.2f s (%.0f tiles/s)\n", proj[p].name, e0,
                       e0 + m - 1, t4 - t3, t5 - t4, (double)m * k * n / 256 / (t5 - t4));
                fflush(stdout);
                sparq_free(it);
                sparq_free(reg);
            }
            if (cpu_check && !gpu_hess && e0 == 0 && in == 0) {
                /* expert 0's gate on the CPU encoder, for the ratio */
                viterbi_enc *enc = NULL;
                viterbi_create(&enc, K, TRELLIS_CB_MUL1, sparq_pool_size(pool));
                const int n = sh->inter;
                float *w = sparq_malloc((size_t)k * n * 4);
                bench_rand rs;
                bench_rand_seed(&rs, 1000003 * 0 + 0);
                for (size_t q = 0; q < (size_t)k * n; q++) w[q] = 0.02f * bench_rand_gauss(&rs);
                uint16_t *tr = sparq_malloc((size_t)k * n / 256 * 16 * K * 2), *su = sparq_malloc(k * 2),
                         *sv = sparq_malloc(n * 2);
                ldlq_opts o;
                ldlq_opts_default(&o, K);
                o.out_scales = 1;
                o.g_fixed = ldlq_default_g(K, o.cb);
                ldlq_result r = {.trellis = tr, .suh = su, .svh = sv};
                double c0 = sparq_now();
                ldlq_quantize(hs[0], w, n, &o, enc, pool, "cpu", &r);
                printf("  cpu check: one %d x %d weight on the CPU encoder (%d threads) %.2f s, proxy %.5f\n", k, n,
                       sparq_pool_size(pool), sparq_now() - c0, r.proxy_err);
                viterbi_free(enc);
                sparq_free(w), sparq_free(tr), sparq_free(su), sparq_free(sv);
            }
            for (int e = 0; e < m; e++) {
                ldlq_hessian_free(hs[e]);
                ldlq_cuda_hess_free(dh[e]);
            }
            sparq_free(dh);
            sparq_free(hs);
            sparq_free(h);
            sparq_free(gh);
        }
    }
    const double total = sparq_now() - t_start;
    sampling = 0;
    pthread_join(sampler, NULL);
    const double layer = total * experts / run;
    printf("measured: %d experts, %.0f M weights in %.1f s (%.2f M weights/s): Hessians %.1f s, prepare %.1f s, "
           "regularise %.1f s, GPU recursion %.1f s; mean proxy %.5f\n",
           run, n_weights / 1e6, total, n_weights / 1e6 / total, t_hess, t_prep, t_reg, t_gpu,
           proxy_sum / (3.0 * run));
    printf("GPU memory: largest batch + encoder planned %.2f GB, peak in use %.2f GB (cudaMemGetInfo, incl. context)\n",
           plan_peak / 1e9, peak_used / 1e9);
    printf("extrapolated (not measured): the whole layer of %d experts %.0f s; %d such layers %.2f h "
           "(routed experts only; the GPU recursion alone: %.2f h)\n",
           experts, layer, layers, layer * layers / 3600.0, t_gpu * experts / run * layers / 3600.0);
    ldlq_cuda_free(g_ctx);
    ldlq_cuda_free(g_search);
    cublasDestroy(blas);
    sparq_pool_free(pool);
    return 0;
}
