/* tools/bench/bench_bw.h — the streaming-read bandwidth the benchmarks put
 * their kernels' bytes/s against, measured on their own thread pool in the
 * same run (so the ratio depends less on what else the machine is doing).
 * Header-only: each bench program includes it once. */
#ifndef SPARQ_TOOLS_BENCH_BENCH_BW_H
#define SPARQ_TOOLS_BENCH_BENCH_BW_H

#include <stddef.h>
#include <stdint.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "common/threadpool.h"

typedef struct bench_bw_ctx {
    const uint64_t *a;
    size_t chunk; /* uint64 per item */
    uint64_t sink[64];
} bench_bw_ctx;

static void bench_bw_task(void *vctx, size_t i, int tid)
{
    /* an integer XOR reduction: associative, so the compiler vectorises it and
     * the loop runs at the memory system's read speed */
    bench_bw_ctx *c = vctx;
    const uint64_t *p = c->a + i * c->chunk;
    uint64_t x = 0;
    for (size_t j = 0; j < c->chunk; j++) x ^= p[j];
    c->sink[tid & 63] ^= x;
}

/* Read bandwidth (bytes/s) of a `mb` MiB array over `pool`, best of 5; 0 if
 * the array cannot be allocated. */
static inline double bench_read_bandwidth(sparq_pool *pool, size_t mb)
{
    const size_t n = mb << 17; /* uint64 */
    uint64_t *a = sparq_aligned_alloc(64, n * sizeof(uint64_t));
    if (!a) return 0;
    for (size_t i = 0; i < n; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    bench_bw_ctx c = {a, (size_t)1 << 17, {0}};
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = sparq_now();
        sparq_pool_for(pool, n / c.chunk, bench_bw_task, &c);
        const double dt = sparq_now() - t0;
        if (dt < best) best = dt;
    }
    volatile uint64_t sink = c.sink[0];
    (void)sink;
    sparq_aligned_free(a);
    return (double)(n * sizeof(uint64_t)) / best;
}

#endif
