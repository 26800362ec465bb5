/* tools/bench/trellis_bench.c — benchmarks of the EXL3 trellis codec (not a
 * test: it prints figures and ratios against baselines measured in the same
 * run). docs/benchmarks-trellis.md records its output with the commands.
 *
 *   trellis_bench mse    [--values N] [--threads T]   encoder MSE on i.i.d. N(0,1), K = 2,3,4, mul1,
 *                                                    vs exllamav3, 2^-2K and the Lloyd-Max quantizer
 *   trellis_bench encode [--tiles N]                 encoder weights/s, one thread and T threads
 *   trellis_bench gemv   [--threads T] [--reps R] [--path P]
 *                                                    batch-1 GEMV at K=3 vs OpenBLAS sgemv, and
 *                                                    bytes/s vs measured memory read bandwidth;
 *                                                    then 1..16-row GEMM vs sgemm (1 thread)
 *   trellis_bench expert [--in K] [--out N] [--cols C] [--bits K] [--threads T]
 *                                                    the quantizer on one expert-shaped linear (default
 *                                                    DeepSeek V4.1's w1: in 5120, out 2304): Hessian
 *                                                    preparation of in x in, then block LDLQ + Viterbi
 *                                                    on the first C output columns (the cost is per
 *                                                    16x16 tile, so N/C times that is the whole matrix),
 *                                                    peak RSS, and the extrapolation to a V4.1 expert
 *                                                    layer and to the whole model
 *   trellis_bench regularize [--in K] [--out N] [--reps R]
 *                                                    ldlq_regularize (the CPU engine: sums of squares,
 *                                                    scales, both Hadamards; the fixed scale, no search)
 *                                                    on one in x out weight, one thread, best of R;
 *                                                    the CPU half of each weight that --device cuda
 *                                                    does on the host by default (docs/cuda.md) */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/threadpool.h"
#include "kernels/cpu/trellis.h"
#include "quantize/ldlq.h"
#include "quantize/viterbi.h"
#include "tests/kernels/trellis_rand.h"
#include "tools/bench/bench_bw.h"
#include "tools/bench/bench_rand.h"

void openblas_set_num_threads(int);

static trellis_path bench_path; /* --path, default trellis_path_best() */

/* CPU time of this thread: on a shared machine the 1-thread rates are also
 * given per CPU-second, which other processes do not distort. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --- Lloyd-Max scalar quantizer for N(0,1), 2^bits levels ------------------- */

static double phi(double x) { return exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }
static double Phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

static double lloyd_max_mse(int bits)
{
    const int L = 1 << bits;
    double c[256], b[257];
    for (int i = 0; i < L; i++) c[i] = -3.0 + 6.0 * (i + 0.5) / L;
    double mse = 0;
    for (int it = 0; it < 20000; it++) {
        b[0] = -INFINITY;
        b[L] = INFINITY;
        for (int i = 1; i < L; i++) b[i] = 0.5 * (c[i - 1] + c[i]);
        mse = 0;
        for (int i = 0; i < L; i++) {
            const double pa = isinf(b[i]) ? 0 : phi(b[i]), pb = isinf(b[i + 1]) ? 0 : phi(b[i + 1]);
            const double mass = Phi(b[i + 1]) - Phi(b[i]);
            const double m1 = pa - pb; /* ∫ x φ */
            const double ba = isinf(b[i]) ? 0 : b[i] * pa, bb = isinf(b[i + 1]) ? 0 : b[i + 1] * pb;
            const double m2 = mass - (bb - ba); /* ∫ x² φ */
            mse += m2 - 2 * c[i] * m1 + c[i] * c[i] * mass;
            c[i] = m1 / mass;
        }
    }
    return mse;
}

/* --- (a) MSE ------------------------------------------------------------------ */

static int bench_mse(size_t n_values, int threads)
{
    const double exl[3] = {0.06854, 0.01761, 0.00460};
    const size_t n_tiles = n_values / 256;
    sparq_pool *pool = NULL;
    if (sparq_pool_create(&pool, threads) != SPARQ_OK) return 1;
    float *x = malloc(n_tiles * 256 * sizeof(float));
    uint16_t *st = malloc(n_tiles * 256 * sizeof(uint16_t));
    bench_rs = BENCH_RS_SEED;
    for (size_t i = 0; i < n_tiles * 256; i++) x[i] = gauss();
    printf("MSE on %zu i.i.d. N(0,1) values (%zu tiles), mul1, %d threads, path %s\n", n_tiles * 256, n_tiles,
           sparq_pool_size(pool), trellis_path_name(trellis_path_best()));
    printf("%2s %9s %9s %7s %9s %8s %10s %9s %6s\n", "K", "sparq", "exllamav3", "ratio", "2^-2K", "ratio", "Lloyd-Max",
           "ratio", "sec");
    int rc = 0;
    for (int K = 2; K <= 4; K++) {
        viterbi_enc *enc = NULL;
        if (viterbi_create(&enc, K, TRELLIS_CB_MUL1, sparq_pool_size(pool)) != SPARQ_OK) return 1;
        double sq = 0;
        const double t0 = now();
        viterbi_encode_tiles(enc, x, NULL, n_tiles, st, NULL, &sq, pool);
        const double dt = now() - t0;
        const double mse = sq / (double)(n_tiles * 256), lm = lloyd_max_mse(K), rd = pow(2.0, -2.0 * K);
        printf("%2d %9.5f %9.5f %7.4f %9.5f %8.3f %10.5f %9.3f %6.1f\n", K, mse, exl[K - 2], mse / exl[K - 2], rd,
               mse / rd, lm, mse / lm, dt);
        if (mse > 1.005 * exl[K - 2]) rc = 1;
        viterbi_free(enc);
    }
    printf("%s\n", rc ? "FAIL: worse than 1.005x exllamav3" : "all K within 1.005x of exllamav3");
    free(x);
    free(st);
    sparq_pool_free(pool);
    return rc;
}

/* --- (b) encoder throughput ------------------------------------------------- */

static int bench_encode(size_t n_tiles, int threads)
{
    float *x = malloc(n_tiles * 256 * sizeof(float));
    uint16_t *st = malloc(n_tiles * 256 * sizeof(uint16_t));
    for (size_t i = 0; i < n_tiles * 256; i++) x[i] = gauss();
    sparq_pool *pool = NULL;
    if (sparq_pool_create(&pool, threads) != SPARQ_OK) return 1;
    printf("Viterbi encoder throughput, %zu tiles (%zu weights) per run\n", n_tiles, n_tiles * 256);
    printf("%2s %-7s %16s %18s %16s\n", "K", "path", "weights/s 1 thr", "weights/CPU-s 1 thr", "weights/s pool");
    for (int K = 1; K <= TRELLIS_K_MAX; K++)
        for (int p = 0; p < TRELLIS_PATH_COUNT_; p++) {
            /* the AVX-512 path encodes with the AVX2 step */
            if (!trellis_path_available((trellis_path)p) || p == TRELLIS_PATH_AVX512) continue;
            viterbi_enc *enc = NULL;
            if (viterbi_create(&enc, K, TRELLIS_CB_MUL1, sparq_pool_size(pool)) != SPARQ_OK) return 1;
            viterbi_set_path(enc, (trellis_path)p);
            const size_t nt = p == TRELLIS_PATH_SCALAR ? (n_tiles + 3) / 4 : n_tiles;
            double t0 = now(), c0 = cpu_now();
            viterbi_encode_tiles(enc, x, NULL, nt, st, NULL, NULL, NULL);
            const double one = (double)(nt * 256) / (now() - t0), one_cpu = (double)(nt * 256) / (cpu_now() - c0);
            t0 = now();
            viterbi_encode_tiles(enc, x, NULL, nt, st, NULL, NULL, pool);
            const double all = (double)(nt * 256) / (now() - t0);
            printf("%2d %-7s %16.0f %18.0f %16.0f  (%d threads)\n", K, trellis_path_name((trellis_path)p), one,
                   one_cpu, all, sparq_pool_size(pool));
            viterbi_free(enc);
        }
    free(x);
    free(st);
    sparq_pool_free(pool);
    return 0;
}

/* --- (c) GEMV ------------------------------------------------------------------- */

static double time_best(int reps, void (*fn)(void *), void *arg, double *cpu)
{
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now(), c0 = cpu_now();
        fn(arg);
        best = fmin(best, now() - t0);
        best_cpu = fmin(best_cpu, cpu_now() - c0);
    }
    if (cpu) *cpu = best_cpu;
    return best;
}

/* Best wall (and thread CPU) times of fa and fb over `reps` runs, the two
 * alternated run by run so both see the same machine load. */
static void time_alternated(int reps, void (*fa)(void *), void (*fb)(void *), void *arg, double *wa, double *wb,
                            double *ca, double *cb)
{
    *wa = *wb = *ca = *cb = 1e30;
    for (int r = 0; r < reps; r++) {
        double c;
        *wa = fmin(*wa, time_best(1, fa, arg, &c));
        *ca = fmin(*ca, c);
        *wb = fmin(*wb, time_best(1, fb, arg, &c));
        *cb = fmin(*cb, c);
    }
}

/* "Cold" runs rotate over copies of the weights whose total exceeds the
 * last-level cache several times, so every call reads its matrix from DRAM,
 * as a decode step through a model larger than the cache does; "hot" runs
 * repeat one copy (the matrix partly or wholly cache-resident). */
typedef struct gemv_arg {
    const trellis_linear *lin; /* [n_tr] copies (same shape, own trellis words) */
    const float *const *w;     /* [n_w] fp32 copies */
    int n_tr, n_w, i_tr, i_w;
    const float *x;
    float *y;
    sparq_pool *pool;
} gemv_arg;

static void run_trellis(void *v)
{
    gemv_arg *g = v;
    trellis_linear_gemm_path(&g->lin[g->i_tr], g->x, 1, g->y, g->pool, bench_path);
    g->i_tr = (g->i_tr + 1) % g->n_tr;
}

static void run_sgemv(void *v)
{
    gemv_arg *g = v;
    cblas_sgemv(CblasRowMajor, CblasTrans, g->lin->k, g->lin->n, 1.0f, g->w[g->i_w], g->lin->n, g->x, 1, 0.0f, g->y,
                1);
    g->i_w = (g->i_w + 1) % g->n_w;
}

typedef struct gemm_arg {
    const trellis_linear *lin;
    const float *w, *x;
    float *y;
    int rows;
    sparq_pool *pool;
} gemm_arg;

static void run_trellis_gemm(void *v)
{
    gemm_arg *g = v;
    trellis_linear_gemm_path(g->lin, g->x, g->rows, g->y, g->pool, bench_path);
}

static void run_sgemm(void *v)
{
    gemm_arg *g = v;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->rows, g->lin->n, g->lin->k, 1.0f, g->x, g->lin->k,
                g->w, g->lin->n, 0.0f, g->y, g->lin->n);
}

/* A random K-bit mul1 linear (random trellis words decode like real ones,
 * cost-wise) and its decoded fp32 matrix for the BLAS baseline. */
typedef struct bench_linear {
    trellis_rand_lin r; /* r.lin: the linear */
    float *w;
} bench_linear;

static uint32_t rnd32(void) { return (uint32_t)(unif() * 4294967296.0); }

static void bench_linear_make(bench_linear *b, int k, int n, int K, sparq_pool *pool)
{
    /* |suh| = 1 (random signs), svh = 0.02: a typical layer's scales */
    trellis_rand_lin_make(&b->r, k, n, K, TRELLIS_CB_MUL1, rnd32, 1.0f, 1.0f, 0.02f, 0.02f, false);
    b->w = sparq_aligned_alloc(64, (size_t)k * n * sizeof(float));
    trellis_linear_decode(&b->r.lin, b->w, pool);
}

static void bench_linear_free(bench_linear *b)
{
    trellis_rand_lin_free(&b->r);
    sparq_aligned_free(b->w);
}

/* Small-batch GEMM on one 4096×4096 K=3 linear, one thread: trellis vs sgemm. */
static void bench_small_batch(int reps)
{
    const int k = 4096, n = 4096, K = 3;
    bench_linear bl;
    bench_linear_make(&bl, k, n, K, NULL);
    const trellis_linear lin = bl.r.lin;
    const float *w = bl.w;
    float *x = malloc((size_t)16 * k * sizeof(float)), *y = malloc((size_t)16 * n * sizeof(float));
    for (int i = 0; i < 16 * k; i++) x[i] = gauss();
    openblas_set_num_threads(1);
    printf("small-batch GEMM, 4096x4096, K=%d mul1, path %s, 1 thread, best of %d\n", K,
           trellis_path_name(bench_path), reps);
    printf("%4s %13s %13s %9s %16s %16s\n", "rows", "trellis us", "sgemm us", "speedup", "trellis us/row",
           "trellis CPU us");
    const int rows_list[] = {1, 2, 4, 8, 16};
    for (int i = 0; i < 5; i++) {
        gemm_arg g = {&lin, w, x, y, rows_list[i], NULL};
        run_trellis_gemm(&g);
        run_sgemm(&g);
        double a = 0, b = 0, ca, cb;
        time_alternated(reps, run_trellis_gemm, run_sgemm, &g, &a, &b, &ca, &cb);
        printf("%4d %13.1f %13.1f %8.2fx %16.1f %16.1f\n", rows_list[i], a * 1e6, b * 1e6, b / a,
               a * 1e6 / rows_list[i], ca * 1e6);
    }
    bench_linear_free(&bl);
    free(x);
    free(y);
}

/* Copies of a bytes-sized array so that they total at least `total` bytes. */
static int copies_for(size_t bytes, size_t total)
{
    size_t c = (total + bytes - 1) / bytes;
    return c < 1 ? 1 : c > 4096 ? 4096 : (int)c;
}

static int bench_gemv(int threads, int reps)
{
    const int K = 3;
    const int shapes[2][2] = {{4096, 4096}, {2048, 768}};
    const size_t cold_total = (size_t)256 << 20; /* 8x this machine's 32 MB L3 */
    sparq_pool *pool = NULL, *one = NULL;
    if (sparq_pool_create(&pool, threads) != SPARQ_OK || sparq_pool_create(&one, 1) != SPARQ_OK) return 1;
    const int T = sparq_pool_size(pool);
    const double bw1 = bench_read_bandwidth(one, 512), bwT = bench_read_bandwidth(pool, 512);
    const double c1 = bench_read_bandwidth(one, 64), cT = bench_read_bandwidth(pool, 64);
    printf("memory read bandwidth, 512 MB array: %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n", bw1 / 1e9,
           bwT / 1e9, T);
    printf("read bandwidth, 64 MB array (the 4096x4096 fp32 matrix's size, partly cached): %.1f GB/s (1 thread), "
           "%.1f GB/s (%d threads)\n", c1 / 1e9, cT / 1e9, T);
    printf("batch-1 GEMV, K=%d mul1, path %s, best of %d alternated runs; cold = each call on another copy of the "
           "weights (copies totalling >= %zu MB: read from DRAM, as in a decode step), hot = one copy\n",
           K, trellis_path_name(bench_path), reps, cold_total >> 20);
    printf("%-10s %-4s %3s %11s %11s %8s %14s %9s\n", "(k, n)", "mode", "thr", "trellis us", "sgemv us", "speedup",
           "trellis GB/s", "% of bw");
    for (int s = 0; s < 2; s++) {
        const int k = shapes[s][0], n = shapes[s][1];
        const size_t nw = (size_t)k / 16 * (n / 16) * 16 * K;
        bench_linear bl;
        bench_linear_make(&bl, k, n, K, pool);
        const int n_tr = copies_for(nw * 2, cold_total), n_w = copies_for((size_t)k * n * 4, cold_total);
        trellis_linear *lins = malloc((size_t)n_tr * sizeof *lins);
        float **ws = malloc((size_t)n_w * sizeof *ws);
        lins[0] = bl.r.lin;
        ws[0] = bl.w;
        for (int c = 1; c < n_tr; c++) {
            uint16_t *tr = malloc(nw * 2);
            memcpy(tr, bl.r.trellis, nw * 2);
            lins[c] = bl.r.lin;
            lins[c].trellis = tr;
        }
        for (int c = 1; c < n_w; c++) {
            ws[c] = sparq_aligned_alloc(64, (size_t)k * n * sizeof(float));
            memcpy(ws[c], bl.w, (size_t)k * n * sizeof(float));
        }
        float *x = malloc((size_t)k * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
        for (int i = 0; i < k; i++) x[i] = gauss();
        for (int cold = 1; cold >= 0; cold--)
            for (int tt = 0; tt < 2; tt++) {
                const int nthr = tt ? T : 1;
                openblas_set_num_threads(nthr);
                gemv_arg g = {lins, (const float *const *)ws, cold ? n_tr : 1, cold ? n_w : 1, 0, 0, x, y,
                              tt ? pool : NULL};
                run_trellis(&g);
                run_sgemv(&g);
                double cpu_tr = 0, cpu_bl = 0, tt_tr = 0, tt_bl = 0;
                time_alternated(cold ? reps * 2 : reps, run_trellis, run_sgemv, &g, &tt_tr, &tt_bl, &cpu_tr, &cpu_bl);
                const double gbs = (double)nw * 2 / tt_tr;
                printf("%4dx%-5d %-4s %3d %11.1f %11.1f %7.2fx %14.2f %8.1f%%", k, n, cold ? "cold" : "hot", nthr,
                       tt_tr * 1e6, tt_bl * 1e6, tt_bl / tt_tr, gbs / 1e9, 100 * gbs / (tt ? bwT : bw1));
                if (!tt) printf("   CPU us: trellis %.1f, sgemv %.1f", cpu_tr * 1e6, cpu_bl * 1e6);
                printf("\n");
            }
        for (int c = 1; c < n_tr; c++) free((void *)lins[c].trellis);
        for (int c = 1; c < n_w; c++) sparq_aligned_free(ws[c]);
        free(lins);
        free(ws);
        bench_linear_free(&bl);
        free(x);
        free(y);
    }
    sparq_pool_free(pool);
    sparq_pool_free(one);
    bench_small_batch(reps / 3 + 1);
    return 0;
}

/* VmHWM of this process in bytes (0 if unknown). */
static unsigned long long peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtoull(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb * 1024;
}

/* Seconds to prepare a k x k Hessian from `rows` random activations (ssyrk + ldlq_hessian_prepare). */
static double time_hessian(int k, int rows, ldlq_hessian **hs_out)
{
    float *x = sparq_malloc((size_t)rows * k * sizeof(float)), *h = sparq_calloc((size_t)k * k, sizeof(float));
    if (!x || !h) return -1;
    for (size_t i = 0; i < (size_t)rows * k; i++) x[i] = trellis_rand_in(rnd32, -1.0f, 1.0f);
    const double t0 = now();
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, k, rows, 1.0f / (float)rows, x, k, 0.0f, h, k);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < i; j++) h[(size_t)i * k + j] = h[(size_t)j * k + i];
    ldlq_hessian *hs = NULL;
    sparq_status st = ldlq_hessian_prepare(&hs, h, k, 0.0f, 11, "bench Hessian");
    const double dt = now() - t0;
    sparq_free(x);
    sparq_free(h);
    if (st != SPARQ_OK) return -1;
    if (hs_out) *hs_out = hs;
    else ldlq_hessian_free(hs);
    return dt;
}

static int bench_expert(int in, int out, int cols, int K, int threads)
{
    if (in % 128 || out % 128 || cols % 128 || cols > out) {
        fprintf(stderr, "trellis_bench expert: --in, --out and --cols must be multiples of 128, cols <= out\n");
        return 2;
    }
    sparq_pool *pool = NULL;
    if (sparq_pool_create(&pool, threads) != SPARQ_OK) return 1;
    openblas_set_num_threads(sparq_pool_size(pool));
    ldlq_hessian *hs = NULL;
    const double t_h = time_hessian(in, 1024, &hs), t_h2 = time_hessian(out, 1024, NULL);
    if (t_h < 0 || t_h2 < 0) return 1;
    float *w = sparq_malloc((size_t)in * cols * sizeof(float));
    uint16_t *tr = sparq_malloc((size_t)in * cols / 256 * 16 * K * 2), *suh = sparq_malloc((size_t)in * 2),
             *svh = sparq_malloc((size_t)cols * 2);
    viterbi_enc *enc = NULL;
    if (!w || !tr || !suh || !svh || viterbi_create(&enc, K, TRELLIS_CB_MUL1, sparq_pool_size(pool)) != SPARQ_OK)
        return 1;
    for (size_t i = 0; i < (size_t)in * cols; i++) w[i] = trellis_rand_in(rnd32, -0.03f, 0.03f);
    ldlq_opts lo;
    ldlq_opts_default(&lo, K);
    lo.g_fixed = ldlq_default_g(K, TRELLIS_CB_MUL1); /* as --scale-search shared for all but expert 0 */
    ldlq_result res = {.trellis = tr, .suh = suh, .svh = svh};
    const double t0 = now(), c0 = cpu_now();
    if (ldlq_quantize(hs, w, cols, &lo, enc, pool, "bench expert", &res) != SPARQ_OK) return 1;
    const double dt = now() - t0, dc = cpu_now() - c0;
    const double nw = (double)in * cols, wps = nw / dt;
    printf("expert linear in %d, out %d (first %d columns), K=%d, %d threads\n", in, out, cols, K, sparq_pool_size(pool));
    printf("  Hessian %dx%d prepared in %.2f s (%dx%d: %.2f s)\n", in, in, t_h, out, out, t_h2);
    printf("  LDLQ + Viterbi: %.0f weights in %.2f s = %.0f weights/s (%.0f per CPU-second of this thread), "
           "proxy %.5f\n", nw, dt, wps, nw / dc, res.proxy_err);
    printf("  peak RSS %.1f MB\n", (double)peak_rss() / 1e6);
    /* V4.1: 384 experts x (w1, w3: in 5120 -> 2304; w2: 2304 -> 5120), one Hessian for w1/w3 and one per w2 */
    const double layer_w = 384.0 * 3 * 5120 * 2304, layer_s = layer_w / wps + t_h + 384 * t_h2;
    printf("  extrapolated: one V4.1 expert layer (384 experts, %.3g weights) %.0f s = %.1f h; ", layer_w, layer_s,
           layer_s / 3600);
    /* 40 layers; per layer about 162e6 attention + shared weights; head 662e6; engram.wkv 2 x 157e6 */
    const double all_w = 40 * (layer_w + 162e6) + 662e6 + 2 * 157e6, all_s = 40 * layer_s + (all_w - 40 * layer_w) / wps;
    printf("whole model (%.3g weights) %.0f s = %.1f days at this rate\n", all_w, all_s, all_s / 86400);
    viterbi_free(enc);
    ldlq_hessian_free(hs);
    sparq_free(w), sparq_free(tr), sparq_free(suh), sparq_free(svh);
    sparq_pool_free(pool);
    return 0;
}

static int bench_regularize(int in, int out, int reps)
{
    if (in % 128 || out % 128 || reps < 1) {
        fprintf(stderr, "trellis_bench regularize: --in and --out must be multiples of 128, --reps >= 1\n");
        return 2;
    }
    ldlq_hessian *hs = NULL;
    float *w = sparq_malloc((size_t)in * out * sizeof(float));
    if (!w || time_hessian(in, 1024, &hs) < 0) return 1;
    for (size_t i = 0; i < (size_t)in * out; i++) w[i] = trellis_rand_in(rnd32, -0.03f, 0.03f);
    ldlq_opts lo;
    ldlq_opts_default(&lo, 3);
    lo.g_fixed = ldlq_default_g(3, TRELLIS_CB_MUL1); /* no search: the coder is not called */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        ldlq_reg reg;
        const double t0 = now();
        if (ldlq_regularize(hs, w, out, &lo, NULL, "bench regularize", &reg) != SPARQ_OK) return 1;
        const double dt = now() - t0;
        ldlq_reg_free(&reg);
        if (dt < best) best = dt;
    }
    printf("regularize %d x %d (K = 3, fixed scale, one thread): best of %d %.1f ms = %.0f M weights/s\n", in, out,
           reps, best * 1e3, (double)in * out / best / 1e6);
    ldlq_hessian_free(hs);
    sparq_free(w);
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: trellis_bench mse [--values N] [--threads T]\n"
                    "       trellis_bench encode [--tiles N] [--threads T]\n"
                    "       trellis_bench gemv [--threads T] [--reps R] [--path scalar|avx2|avx512|neon]\n"
                    "       trellis_bench expert [--in K] [--out N] [--cols C] [--bits K] [--threads T]\n"
                    "       trellis_bench regularize [--in K] [--out N] [--reps R]\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage();
    size_t values = (size_t)1 << 20, tiles = 64;
    int threads = 0, reps = 0 /* the mode's: gemv 50, regularize 5 */, e_in = 5120, e_out = 2304, e_cols = 256, e_bits = 3;
    bench_path = trellis_path_best();
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--values")) values = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--tiles")) tiles = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--in")) e_in = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out")) e_out = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cols")) e_cols = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bits")) e_bits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--path")) {
            const char *name = argv[++i];
            int found = 0;
            for (int p = 0; p < TRELLIS_PATH_COUNT_; p++)
                if (!strcmp(name, trellis_path_name((trellis_path)p)) && trellis_path_available((trellis_path)p)) {
                    bench_path = (trellis_path)p;
                    found = 1;
                }
            if (!found) {
                fprintf(stderr, "trellis_bench: path '%s' not available here\n", name);
                return 2;
            }
        }
        else return usage();
    }
    if (!strcmp(argv[1], "mse")) return bench_mse(values, threads);
    if (!strcmp(argv[1], "encode")) return bench_encode(tiles, threads);
    if (!strcmp(argv[1], "gemv")) return bench_gemv(threads, reps ? reps : 50);
    if (!strcmp(argv[1], "expert")) return bench_expert(e_in, e_out, e_cols, e_bits, threads);
    if (!strcmp(argv[1], "regularize")) return bench_regularize(e_in, e_out, reps ? reps : 5);
    return usage();
}
