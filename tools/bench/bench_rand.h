/* tools/bench/bench_rand.h — the wall clock and the N(0,1) source the trellis
 * benchmarks share (trellis_bench.c, trellis_encode_bench.c), so their inputs
 * are the same sequence. Header-only: bench_rs is per program; reset it to
 * BENCH_RS_SEED to replay the sequence. */
#ifndef SPARQ_TOOLS_BENCH_BENCH_RAND_H
#define SPARQ_TOOLS_BENCH_BENCH_RAND_H

#include <math.h>
#include <stdint.h>
#include <time.h>

#define BENCH_RS_SEED 0x853c49e6748fea9bull
static uint64_t bench_rs = BENCH_RS_SEED;

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* uniform in (0, 1), xorshift64 */
static inline double unif(void)
{
    bench_rs ^= bench_rs << 13;
    bench_rs ^= bench_rs >> 7;
    bench_rs ^= bench_rs << 17;
    return ((double)(bench_rs >> 11) + 0.5) / 9007199254740992.0;
}

/* N(0,1), Box–Muller */
static inline float gauss(void)
{
    return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif()));
}

#endif
