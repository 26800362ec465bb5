/* tests/gpu/gpu_rand.h — the Gaussian source of the GPU tests that make
 * random inputs (xorshift64, Box-Muller): the same sequence as they had when
 * each carried its own copy. The including file defines GPU_RAND_SEED first. */
#ifndef SPARQ_TESTS_GPU_RAND_H
#define SPARQ_TESTS_GPU_RAND_H

#include <math.h>
#include <stdint.h>

#ifndef GPU_RAND_SEED
#error "define GPU_RAND_SEED before including gpu/gpu_rand.h"
#endif

static uint64_t rs = GPU_RAND_SEED;
static uint32_t rnd32(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static double unif(void) { return ((double)(rnd32() >> 8) + 0.5) / 16777216.0; }
static float gauss(void) { return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif())); }

#endif
