/* tools/bench/trellis_encode_bench.c — the GPU trellis encoder
 * (kernels/cuda/trellis_encode.h) against sparq's CPU encoder
 * (quantize/viterbi.h) in the same run: tiles/s per K on i.i.d. N(0,1)
 * tiles, and a check that the two give the same states on the tiles both
 * encoded. Not a test: it prints figures (docs/benchmarks-trellis.md).
 *
 *   trellis_encode_bench [--k LIST] [--cb NAME] [--tiles N] [--cpu-tiles M] [--threads T] [--weighted]
 *     --k        K values, comma-separated (default 1,2,3,4,5,6,8)
 *     --cb       codebook (default mul1)
 *     --tiles    GPU tiles per K (default: 4 waves of the encoder's slots)
 *     --cpu-tiles CPU tiles per K (default 2 per thread)
 *     --threads  CPU threads (default: all cores)
 *     --weighted per-position weights (random, 0.1..4)
 * The GPU time is the encode alone (inputs already on the device, one warm-up
 * launch first); the CPU time is viterbi_encode_tiles over a T-thread pool.
 * SPARQ_VITERBI_MUL1=table|arith picks mul1's other kernels (the baseline of
 * docs/benchmarks-trellis.md); the last column is the encodings' mean squared
 * error per weight (weighted, with --weighted). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/threadpool.h"
#include "kernels/cpu/trellis.h"
#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_encode.h"
#include "quantize/viterbi.h"
#include "tools/bench/bench_rand.h"


static int usage(void)
{
    fprintf(stderr, "usage: trellis_encode_bench [--k LIST] [--cb mul1|mcg|3inst] [--tiles N] [--cpu-tiles M] "
                    "[--threads T] [--weighted]\n");
    return 2;
}

static int fail(const char *what)
{
    fprintf(stderr, "trellis_encode_bench: %s: %s\n", what, sparq_errmsg());
    return 1;
}

/* One K: returns 0 on success. */
static int bench_k(int K, trellis_codebook cb, size_t gpu_tiles, size_t cpu_tiles, bool weighted, sparq_pool *pool)
{
    trellis_cuda_enc *ge = NULL;
    viterbi_enc *ce = NULL;
    if (trellis_cuda_enc_create(K, cb, 0, &ge) != SPARQ_OK) return fail("GPU encoder");
    if (viterbi_create(&ce, K, cb, sparq_pool_size(pool)) != SPARQ_OK) {
        trellis_cuda_enc_free(ge);
        return fail("CPU encoder");
    }
    const int slots = trellis_cuda_enc_slots(ge);
    if (gpu_tiles == 0) gpu_tiles = (size_t)slots * 4;
    if (cpu_tiles > gpu_tiles) cpu_tiles = gpu_tiles;
    const size_t nv = gpu_tiles * 256;
    float *x = malloc(nv * sizeof(float)), *w = weighted ? malloc(nv * sizeof(float)) : NULL;
    uint16_t *st_g = malloc(nv * sizeof(uint16_t)), *st_c = malloc(cpu_tiles * 256 * sizeof(uint16_t));
    float *dx = NULL, *dw = NULL, *derr = NULL, *herr = malloc(gpu_tiles * sizeof(float));
    uint16_t *dst = NULL;
    int rc = 1;
    if (!x || (weighted && !w) || !st_g || !st_c || !herr) {
        fprintf(stderr, "trellis_encode_bench: no memory for %zu tiles\n", gpu_tiles);
        goto out;
    }
    for (size_t i = 0; i < nv; i++) x[i] = gauss();
    for (size_t i = 0; w && i < nv; i++) w[i] = (float)(0.1 + 3.9 * unif());
    if (trellis_cuda_alloc((void **)&dx, nv * sizeof(float)) != SPARQ_OK ||
        (w && trellis_cuda_alloc((void **)&dw, nv * sizeof(float)) != SPARQ_OK) ||
        trellis_cuda_alloc((void **)&dst, nv * sizeof(uint16_t)) != SPARQ_OK ||
        trellis_cuda_alloc((void **)&derr, gpu_tiles * sizeof(float)) != SPARQ_OK ||
        trellis_cuda_upload(dx, x, nv * sizeof(float)) != SPARQ_OK ||
        (w && trellis_cuda_upload(dw, w, nv * sizeof(float)) != SPARQ_OK)) {
        fail("device buffers");
        goto out;
    }
    /* warm-up: one tile per slot at most */
    const size_t warm = gpu_tiles < (size_t)slots ? gpu_tiles : (size_t)slots;
    if (trellis_cuda_encode_tiles(ge, dx, dw, warm, dst, NULL, NULL, NULL) != SPARQ_OK ||
        trellis_cuda_sync(NULL) != SPARQ_OK) {
        fail("GPU warm-up");
        goto out;
    }
    double t0 = now();
    if (trellis_cuda_encode_tiles(ge, dx, dw, gpu_tiles, dst, NULL, derr, NULL) != SPARQ_OK ||
        trellis_cuda_sync(NULL) != SPARQ_OK) {
        fail("GPU encode");
        goto out;
    }
    const double t_gpu = now() - t0;
    if (trellis_cuda_download(st_g, dst, nv * sizeof(uint16_t)) != SPARQ_OK ||
        trellis_cuda_download(herr, derr, gpu_tiles * sizeof(float)) != SPARQ_OK) {
        fail("download");
        goto out;
    }
    t0 = now();
    if (viterbi_encode_tiles(ce, x, w, cpu_tiles, st_c, NULL, NULL, pool) != SPARQ_OK) {
        fail("CPU encode");
        goto out;
    }
    const double t_cpu = now() - t0;
    size_t same = 0;
    for (size_t t = 0; t < cpu_tiles; t++) same += memcmp(st_c + t * 256, st_g + t * 256, 512) == 0;
    const double r_gpu = (double)gpu_tiles / t_gpu, r_cpu = (double)cpu_tiles / t_cpu;
    double sq = 0; /* the tiles' squared errors (weighted, if so), per weight */
    for (size_t t = 0; t < gpu_tiles; t++) sq += herr[t];
    printf("%2d  %6s  %-6s  %7d  %8zu  %11.0f  %10.3g  %6zu  %10.1f  %8.1f  %5zu/%-5zu  %.5f\n", K,
           trellis_cuda_enc_costs_in_shared(ge) ? "shared" : "global", trellis_cb_name(cb), slots, gpu_tiles, r_gpu,
           r_gpu * 256, cpu_tiles, r_cpu, r_gpu / r_cpu, same, cpu_tiles, sq / (double)nv);
    fflush(stdout);
    rc = same == cpu_tiles ? 0 : 1;
    if (rc) fprintf(stderr, "trellis_encode_bench: K=%d: GPU states differ from the CPU's\n", K);
out:
    trellis_cuda_free(dx);
    trellis_cuda_free(dw);
    trellis_cuda_free(dst);
    trellis_cuda_free(derr);
    free(herr);
    free(x);
    free(w);
    free(st_g);
    free(st_c);
    trellis_cuda_enc_free(ge);
    viterbi_free(ce);
    return rc;
}

int main(int argc, char **argv)
{
    const char *klist = "1,2,3,4,5,6,8";
    trellis_codebook cb = TRELLIS_CB_MUL1;
    size_t gpu_tiles = 0, cpu_tiles = 0;
    int threads = sparq_cpu_count();
    bool weighted = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--k") && v) klist = argv[++i];
        else if (!strcmp(a, "--cb") && v) {
            if (!trellis_cb_parse(argv[++i], &cb)) return usage();
        } else if (!strcmp(a, "--tiles") && v) gpu_tiles = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--cpu-tiles") && v) cpu_tiles = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--weighted")) weighted = true;
        else return usage();
    }
    if (threads < 1) return usage();
    if (trellis_cuda_device_count() == 0) {
        fprintf(stderr, "trellis_encode_bench: no GPU\n");
        return 1;
    }
    if (cpu_tiles == 0) cpu_tiles = (size_t)threads * 2;
    sparq_pool *pool = NULL;
    if (sparq_pool_create(&pool, threads) != SPARQ_OK) return fail("thread pool");
    printf("trellis encoder, i.i.d. N(0,1) tiles%s: GPU (encode only) vs CPU viterbi_encode_tiles, %d threads\n",
           weighted ? ", weighted" : "", threads);
    printf(" K  costs   cb        slots  gpu tiles  gpu tiles/s  weights/s  cpu tiles  cpu tiles/s  gpu/cpu  same states  mse/weight\n");
    int rc = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", klist);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const int K = atoi(tok);
        if (K < 1 || K > TRELLIS_K_MAX) {
            fprintf(stderr, "trellis_encode_bench: K %s is not 1..8\n", tok);
            rc = 2;
            break;
        }
        rc |= bench_k(K, cb, gpu_tiles, cpu_tiles, weighted, pool);
    }
    sparq_pool_free(pool);
    return rc;
}
