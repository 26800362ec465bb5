/* kernels/cpu/ops_exl3.c — the EXL3 (trellis-quantized) linear as an
 * sq_linear, so a quantized layer runs through the same graph as a bf16 one.
 *
 * The math is helper "trellis"'s (kernels/cpu/trellis.h): y = x·W with
 * W = diag(suh)·H·Q·H·diag(svh), Q decoded tile by tile in registers and never
 * stored. trellis_linear_gemm takes at most TRELLIS_GEMM_MAX_ROWS rows, so a
 * larger batch is walked in blocks of that many rows (each block decodes Q
 * again: prefill of a quantized model is decode-bound, as on the GPU). */
#include "kernels/cpu/ops.h"

#include <string.h>

static void exl3_forward(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    const trellis_linear *t = l->impl;
    for (int r0 = 0; r0 < rows; r0 += TRELLIS_GEMM_MAX_ROWS) {
        int n = rows - r0 < TRELLIS_GEMM_MAX_ROWS ? rows - r0 : TRELLIS_GEMM_MAX_ROWS;
        /* a small product is done before the pool's threads would be awake
         * (as for bf16, ops.c); shapes were validated by
         * sq_cpu_linear_exl3_bind, so only its work buffers can fail */
        sparq_pool *pool = (size_t)n * (size_t)t->k * (size_t)t->n < SQ_CPU_SERIAL_MACS ? NULL : ex->pool;
        const sparq_status st = trellis_linear_gemm(t, x + (size_t)r0 * l->in, n, y + (size_t)r0 * l->out, pool);
        if (st != SPARQ_OK) {
            sq_exec_set_error(ex, st);
            memset(y, 0, (size_t)rows * (size_t)l->out * sizeof *y);
            return;
        }
    }
    if (l->bias)
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < l->out; o++) y[(size_t)r * l->out + o] += l->bias[o];
}

sparq_status sq_cpu_linear_exl3_bind(sq_linear *l, const trellis_linear *t, const char *name)
{
    FORWARD_IF(trellis_linear_check(t, name));
    l->kind = SQ_LINEAR_EXL3;
    l->in = t->k;
    l->out = t->n;
    l->w = NULL;
    l->impl = t;
    l->forward = exl3_forward;
    return SPARQ_OK;
}
