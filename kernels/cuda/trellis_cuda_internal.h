/* kernels/cuda/trellis_cuda_internal.h — diagnostics of the CUDA trellis
 * kernels, for tests/gpu/test_trellis_cuda.c and tools/bench/cuda_bench.c:
 * which product kernel trellis_cuda_gemm and trellis_cuda_moe_forward run,
 * by name, and one GEMM kernel run on its own (every K, and the launches
 * one at a time). Not public API: the library's users call trellis_cuda.h;
 * this header exposes no lab code (there is none in the library). */
#ifndef SPARQ_KERNELS_CUDA_TRELLIS_CUDA_INTERNAL_H
#define SPARQ_KERNELS_CUDA_TRELLIS_CUDA_INTERNAL_H

#include "kernels/cuda/trellis_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The product kernels of trellis_cuda_gemm, one per decision of its
 * dispatcher (trellis_cuda_gemm_choice; docs/cuda.md says what bounds each).
 * The integer ones are for mul1 at 1..4 rows. */
typedef enum trellis_cuda_gemm_kernel {
    /* integer mul1 GEMV, one k tile × 8 tile columns a step, 16-warp blocks
     * (one a SM, ≤ 120 registers): one row, K = 2..4, ≥ 5 work items per
     * resident warp (lab v45) */
    TRELLIS_CUDA_GEMV_INT_C8_W16 = 0,
    /* the same loop in 8-warp blocks (two a SM): 2..4 rows from 8 items per
     * resident warp, and one row at K = 1, 5..8 from 5 (lab v44) */
    TRELLIS_CUDA_GEMV_INT_C8_W8 = 1,
    /* integer mul1 GEMV, 4 k tiles × 2 tile columns a step (4× the work
     * items): 1..4 rows on smaller linears (lab v33) */
    TRELLIS_CUDA_GEMV_INT_C2 = 2,
    /* fp16 tensor-core GEMM on the balanced grid: 5..16 rows, and 3inst /
     * mcg at any row count (lab v10) */
    TRELLIS_CUDA_GEMM_TC = 3,
    TRELLIS_CUDA_GEMM_KERNELS = 4
} trellis_cuda_gemm_kernel;

/* The kernel trellis_cuda_gemm runs for this linear and row count (1..16). */
trellis_cuda_gemm_kernel trellis_cuda_gemm_choice(const trellis_cuda_linear *lin, int rows);
/* "gemv_int_c8_w16", "gemv_int_c8_w8", "gemv_int_c2", "gemm_tc"; "?" otherwise. */
const char *trellis_cuda_gemm_kernel_name(trellis_cuda_gemm_kernel kernel);

/* Which of a GEMM's three launches to queue (timing one stage alone). */
enum {
    TRELLIS_CUDA_PART_INPUT = 1,  /* the input transform of x */
    TRELLIS_CUDA_PART_MAIN = 2,   /* t += u·Q from the trellis words */
    TRELLIS_CUDA_PART_OUTPUT = 4, /* y = had128(t) ⊙ svh; t = 0 */
    TRELLIS_CUDA_PART_ALL = 7
};

/* trellis_cuda_gemm with `kernel` instead of trellis_cuda_gemm_choice's, and
 * only the launches in `parts` (a part alone leaves the workspace dirty unless
 * the rest follows). SPARQ_E_UNSUPPORTED where the kernel does not exist: the
 * integer ones for other codebooks or more than 4 rows, GEMV_INT_C8_W16 at
 * K ∉ 2..4. */
sparq_status trellis_cuda_gemm_run(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, trellis_cuda_gemm_kernel kernel,
                                   unsigned parts);

/* Streaming multiprocessors of the current device (the dispatchers count
 * resident warps with it). */
int trellis_cuda_sm_count(void);

/* The path trellis_cuda_moe_forward runs for this layer: "moe_int" (mul1: five
 * PDL-chained launches, the integer loop) or "moe_fused" (3inst / mcg: two
 * launches of the fused fp16 block body). */
const char *trellis_cuda_moe_kernel_name(const trellis_cuda_moe *moe);

#ifdef __cplusplus
}
#endif

#endif
