/* tests/kernels/trellis_rand.h — a random EXL3 linear for the trellis tests
 * and benchmarks (tests/kernels/test_trellis.c, tests/gpu/test_trellis_cuda.c,
 * tools/bench/trellis_bench.c). Header-only and libc-only, because two of its
 * users are also built by plain compiler calls (the aarch64 qemu test, the
 * GPU machine's tools/bench/cuda_build.sh).
 *
 * Any 16-bit words form a valid trellis ring, so random words decode like
 * real ones (cost-wise and value-wise). suh gets a random sign and a
 * magnitude in [suh_lo, suh_hi]; svh a magnitude in [svh_lo, svh_hi] and a
 * random sign only when svh_signed. rnd is the caller's 32-bit generator. */
#ifndef SPARQ_TESTS_KERNELS_TRELLIS_RAND_H
#define SPARQ_TESTS_KERNELS_TRELLIS_RAND_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/half.h"
#include "kernels/cpu/trellis.h"

typedef struct trellis_rand_lin {
    trellis_linear lin;
    uint16_t *trellis, *suh, *svh; /* malloc'ed; trellis_rand_lin_free */
} trellis_rand_lin;

static inline float trellis_rand_in(uint32_t (*rnd)(void), float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() >> 8) / 16777216.0f;
}

static inline void trellis_rand_lin_make(trellis_rand_lin *r, int k, int n, int K, trellis_codebook cb,
                                         uint32_t (*rnd)(void), float suh_lo, float suh_hi, float svh_lo,
                                         float svh_hi, bool svh_signed)
{
    const size_t words = (size_t)k / 16 * (n / 16) * 16 * K;
    r->trellis = malloc(words * 2);
    r->suh = malloc((size_t)k * 2);
    r->svh = malloc((size_t)n * 2);
    for (size_t i = 0; i < words; i++) r->trellis[i] = (uint16_t)rnd();
    for (int i = 0; i < k; i++)
        r->suh[i] = sparq_f32_to_f16((rnd() & 1 ? -1.0f : 1.0f) * trellis_rand_in(rnd, suh_lo, suh_hi));
    for (int i = 0; i < n; i++) {
        const float m = trellis_rand_in(rnd, svh_lo, svh_hi);
        r->svh[i] = sparq_f32_to_f16(svh_signed && (rnd() & 1) ? -m : m);
    }
    r->lin = (trellis_linear){k, n, K, cb, r->trellis, r->suh, r->svh};
}

static inline void trellis_rand_lin_free(trellis_rand_lin *r)
{
    free(r->trellis);
    free(r->suh);
    free(r->svh);
}

#endif
