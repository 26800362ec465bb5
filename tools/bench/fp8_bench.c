/* tools/bench/fp8_bench.c — the CPU decode GEMV on FP8 and MXFP4 weights
 * (kernels/cpu/ops_fp8.c) at DeepSeek V4.1's real shapes, against the bf16
 * GEMV of the same shape measured in the same run.
 *
 *   fp8_bench [--threads N] [--reps N] [--rows 1,8] [--mib N] [--scalar]
 *
 * Shapes: FP8 (32×32 UE8M0 blocks) attn.wq_b [32768, 1280] and attn.wo_b
 * [5120, 8192]; MXFP4 expert w1 [2304, 5120] and w2 [5120, 2304]. For each
 * shape and row count: the best of --reps (default 10) sq_linear_forward
 * calls, each on the next of several copies of the weight whose bytes
 * together exceed --mib MiB (default 96, three times the L3), so every call
 * reads its weights from DRAM as a decode step does; then the same for a
 * bf16 weight of the shape. Prints per line: time, weight bytes per second
 * (the stored bytes: codes + scales, or bf16), and the ratios against bf16
 * (time bf16 / time, GB/s / bf16 GB/s). A streaming read over the same
 * buffers' size on the same pool gives the machine's bandwidth in this run.
 * --scalar forces the portable kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/progress.h"
#include "common/threadpool.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "tools/bench/bench_bw.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* n random bytes of a kind's codes: E4M3 of magnitude 2^-3..2^1 (no NaN),
 * any E2M1 pair, or bf16 of about the same values. */
static void fill(sq_linear_kind k, void *p, size_t n)
{
    uint8_t *b = p;
    if (k == SQ_LINEAR_FP8)
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((rnd() & 0x80) | (4 + rnd() % 5) << 3 | (rnd() & 7));
    else if (k == SQ_LINEAR_MXFP4)
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
    else
        for (size_t i = 0; i < n / 2; i++) ((uint16_t *)p)[i] = sparq_f32_to_bf16((float)(rnd() % 2001) / 4000.0f - 0.25f);
}

typedef struct timing {
    double s, bytes; /* best seconds of one call, weight bytes it read */
} timing;

/* Best time of `reps` GEMVs of `rows` rows over copies of a [out, in] linear of kind k. */
static timing time_kind(sq_exec *ex, sq_linear_kind k, int out, int in, int rows, int reps, size_t mib)
{
    sq_linear l = {.kind = k, .in = in, .out = out, .name = "bench"};
    if (k != SQ_LINEAR_BF16) {
        l.block_rows = k == SQ_LINEAR_FP8 ? 32 : 1;
        l.block_cols = 32;
    }
    const size_t wb = k == SQ_LINEAR_BF16 ? (size_t)out * in * 2 : k == SQ_LINEAR_FP8 ? (size_t)out * in : (size_t)out * in / 2;
    const size_t sb = k == SQ_LINEAR_BF16 ? 0 : (size_t)((out + l.block_rows - 1) / l.block_rows) * ((in + 31) / 32);
    size_t copies = ((mib << 20) + wb + sb - 1) / (wb + sb);
    if (copies < 2) copies = 2;
    uint8_t **w = calloc(copies, sizeof *w);
    for (size_t c = 0; c < copies; c++) {
        w[c] = sparq_aligned_alloc(64, wb + sb);
        if (!w[c]) {
            fprintf(stderr, "fp8_bench: out of memory\n");
            exit(1);
        }
        fill(k, w[c], wb);
        for (size_t i = 0; i < sb; i++) w[c][wb + i] = (uint8_t)(120 + rnd() % 4);
    }
    float *x = malloc((size_t)rows * in * 4), *y = malloc((size_t)rows * out * 4);
    for (size_t i = 0; i < (size_t)rows * in; i++) x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    timing t = {1e30, (double)(wb + sb)};
    for (int r = 0; r < reps + 1; r++) { /* the first call only warms the code and the pool */
        l.w = w[r % copies];
        l.scale = sb ? w[r % copies] + wb : NULL;
        const double t0 = sparq_now();
        sq_linear_forward(ex, &l, x, rows, y);
        const double dt = sparq_now() - t0;
        if (r > 0 && dt < t.s) t.s = dt;
    }
    for (size_t c = 0; c < copies; c++) sparq_aligned_free(w[c]);
    free(w), free(x), free(y);
    return t;
}

int main(int argc, char **argv)
{
    int threads = 0, reps = 10, rows[8] = {1, 8}, n_rows = 2;
    size_t mib = 96;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--scalar")) sq_cpu_force_scalar(true);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            n_rows = 0;
            for (char *s = argv[++i]; *s && n_rows < 8; s += strcspn(s, ","), s += *s == ',') rows[n_rows++] = atoi(s);
        } else {
            fprintf(stderr, "usage: fp8_bench [--threads N] [--reps N] [--rows 1,8] [--mib N] [--scalar]\n");
            return 2;
        }
    }
    sq_exec *ex;
    if (sq_exec_create(&ex, threads) != SPARQ_OK || sq_exec_reserve(ex, sq_exec_scratch_floats(8192, 0)) != SPARQ_OK) {
        fprintf(stderr, "fp8_bench: %s\n", sparq_errmsg());
        return 1;
    }
    static const struct {
        const char *name;
        sq_linear_kind kind;
        int out, in;
    } shapes[] = {{"wq_b", SQ_LINEAR_FP8, 32768, 1280},
                  {"wo_b", SQ_LINEAR_FP8, 5120, 8192},
                  {"expert_w1", SQ_LINEAR_MXFP4, 2304, 5120},
                  {"expert_w2", SQ_LINEAR_MXFP4, 5120, 2304}};
    printf("threads %d\npath %s\n", ex->n_threads, sq_cpu_use_avx2() ? "avx2" : "scalar");
    const double bw = bench_read_bandwidth(ex->pool, mib);
    printf("memory_bw_bytes_s %.3g (streaming read of %zu MiB, best of 5)\n", bw, mib);
    printf("%-10s %-6s %-12s %4s %10s %9s %10s %9s %8s %8s %7s\n", "shape", "kind", "[out, in]", "rows", "ms", "GB/s",
           "bf16 ms", "bf16 GB/s", "speedup", "GB/s x", "of bw");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int r = 0; r < n_rows; r++) {
            const timing q = time_kind(ex, shapes[s].kind, shapes[s].out, shapes[s].in, rows[r], reps, mib);
            const timing b = time_kind(ex, SQ_LINEAR_BF16, shapes[s].out, shapes[s].in, rows[r], reps, mib);
            char dims[32];
            snprintf(dims, sizeof dims, "%dx%d", shapes[s].out, shapes[s].in);
            printf("%-10s %-6s %-12s %4d %10.3f %9.2f %10.3f %9.2f %7.2fx %7.2fx %7.2f\n", shapes[s].name,
                   sq_linear_kind_name(shapes[s].kind), dims, rows[r], q.s * 1e3, q.bytes / q.s / 1e9, b.s * 1e3,
                   b.bytes / b.s / 1e9, b.s / q.s, (q.bytes / q.s) / (b.bytes / b.s), bw > 0 ? q.bytes / q.s / bw : 0);
        }
    sq_exec_free(ex);
    return 0;
}
