/* tests/gpu/test_sample_cuda.c — sampling on the device (issue 21): the CUDA
 * backend's sample_select, through sq_sampler_sample_rows, picks exactly the
 * token the whole-row CPU sampler picks, draw by draw (tests/runtime/
 * sample_check.h: random logits full of ties, rows 1..8, every sampler
 * setting, ≥ 1000 draws each at Qwen3's and DeepSeek V4.1's vocabularies; the
 * no-top-k setting goes to the host by design and is checked too). Exits 77
 * without a GPU. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu_probe.h"
#include "kernels/cuda/backend_cuda.h"
#include "runtime/sample_check.h"
#include "t.h"

static sq_exec *gpu;

static void test_qwen3_vocab(void) { sample_check_all(gpu, 151669, 151936, 1000); }
static void test_v41_vocab(void) { sample_check_all(gpu, 129280, 129280, 1000); }
static void test_small_vocabs(void)
{
    sample_check_all(gpu, 1000, 1000, 1000); /* every id a candidate, even without top-k */
    sample_check_all(gpu, 4093, 4099, 1000);
    sample_check_all(gpu, 37, 40, 300);      /* fewer ids than a warp */
}

int main(void)
{
    const char *why = "";
    if (gpu_probe_count(&why) == 0) T_SKIP("gpu suite skipped: %s", why);
    setenv("SPARQ_DEVICE_SAMPLING", "1", 1);
    if (sq_exec_create_cuda(&gpu, 2) != SPARQ_OK) T_SKIP("no cuda exec: %s", sparq_errmsg());
    RUN(test_small_vocabs);
    RUN(test_qwen3_vocab);
    RUN(test_v41_vocab);
    sq_exec_free(gpu);
    return t_summary();
}
