/* tests/gpu/test_calib_cuda.c — the GPU engine of the all-experts MoE capture
 * (quantize/calib_gpu.c over kernels/cuda/calib_cuda.h) against the runtime's
 * own CPU loop (tests/quantize/calib_harness.h): random experts in f32, bf16
 * and MXFP4, plain and clamped SwiGLU, in one pass and in passes, several
 * calls of rows as the capture forward makes; the routed outputs and every
 * Hessian (gate/up's and each expert's down) compared.
 *
 * Bounds: the GPU sums the same fp32 products in another order (cuBLAS SGEMM
 * and SSYRK against OpenBLAS) and its expf is not glibc's (≤ 2 ulp), so each
 * value differs by a few fp32 roundings of its sums: relative Frobenius
 * differences of ~1e-7..1e-6 (sums of 64..2048 terms); the bound 2e-5 is 10×
 * what n·eps/√n gives for the longest sum here (2048 terms). Row counts must
 * be equal. The measured values are printed. Skipped (77) without a GPU. */
#include <stdio.h>

#include "../quantize/calib_harness.h"
#include "common/alloc.h"
#include "common/progress.h"
#include "common/threadpool.h"
#include "gpu_probe.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/calib_cuda.h"
#include "t.h"

#define BOUND 2e-5

static void check(sq_exec *ex, sparq_pool *pool, sq_linear_kind kind, int E, int d, int I, int K, const int *rows,
                  int n_calls, float limit, int per_pass)
{
    ch_layer L;
    ch_make(&L, kind, E, d, I, K, rows, n_calls, limit);
    ch_result ref, gpu;
    CHECK(ch_run(ex, &L, NULL, 0, &ref) == SPARQ_OK);
    const calib_cuda_dims dm = {.d = d, .inter = I, .slots = per_pass, .max_rows = ch_max_rows(&L), .top_k = K,
                                .n_xacc = 1};
    qz_calib_engine eng;
    sparq_status st = qz_calib_engine_gpu(calib_cuda_get_ops(), &dm, pool, &eng);
    CHECK_MSG(st == SPARQ_OK, "engine: %s", sparq_errmsg());
    if (st != SPARQ_OK) return;
    const double t0 = sparq_now();
    st = ch_run(ex, &L, &eng, per_pass, &gpu);
    const double t = sparq_now() - t0;
    CHECK_MSG(st == SPARQ_OK, "GPU capture: %s", sparq_errmsg());
    double d_out = 1, d_h = 1;
    bool counts = false, same = false;
    if (st == SPARQ_OK) ch_compare(&L, &gpu, &ref, &d_out, &d_h, &counts, &same);
    printf("%-5s E %3d d %4d I %4d top-%d limit %4.1f, %3d a pass: outputs %.2e, Hessians %.2e apart (%.3f s)\n",
           sq_linear_kind_name(kind), E, d, I, K, limit, per_pass, d_out, d_h, t);
    CHECK_MSG(counts, "row counts differ");
    CHECK_MSG(d_out < BOUND && d_h < BOUND, "outputs %.3g, Hessians %.3g (bound %g)", d_out, d_h, BOUND);
    ch_result_free(&L, &ref);
    if (st == SPARQ_OK) ch_result_free(&L, &gpu);
    ch_free(&L);
}

int main(void)
{
    const char *why = NULL;
    if (gpu_probe_count(&why) == 0) T_SKIP("%s", why);
    sq_exec *ex = NULL;
    sparq_pool *pool = NULL;
    CHECK(sq_exec_create(&ex, 0) == SPARQ_OK);
    CHECK(sq_exec_reserve(ex, sq_exec_scratch_floats(4096, 64)) == SPARQ_OK);
    CHECK(sparq_pool_create(&pool, 0) == SPARQ_OK);
    const int small[3] = {100, 128, 37}, big[2] = {512, 256};
    const sq_linear_kind kinds[] = {SQ_LINEAR_F32, SQ_LINEAR_BF16, SQ_LINEAR_MXFP4};
    for (int k = 0; k < 3; k++) {
        check(ex, pool, kinds[k], 16, 512, 256, 4, small, 3, 0.0f, 16);
        check(ex, pool, kinds[k], 16, 512, 256, 4, small, 3, 0.75f, 5); /* clamped, 4 passes */
    }
    /* Qwen3-30B-A3B's expert shape (2048 → 768), a few experts, one pass and passes of 3 */
    check(ex, pool, SQ_LINEAR_BF16, 8, 2048, 768, 8, big, 2, 0.0f, 8);
    check(ex, pool, SQ_LINEAR_MXFP4, 8, 2048, 768, 8, big, 2, 10.0f, 3);
    sparq_pool_free(pool);
    sq_exec_free(ex);
    return t_summary();
}
