/* kernels/cpu/ops_topk.h — the MoE router's per-row top-k, shared by the CPU
 * backend (kernels/cpu/ops.c) and the CUDA backend (kernels/cuda/backend_cuda.cu,
 * one row per GPU thread), so both choose experts by the same rule: softmax
 * over n_exp logits, the k largest by repeated selection (ties to the lower
 * index), weights renormalised to sum 1 when `norm`. Header-only because
 * the CUDA build compiles it as device code. */
#ifndef SPARQ_KERNELS_CPU_OPS_TOPK_H
#define SPARQ_KERNELS_CPU_OPS_TOPK_H

#include <math.h>
#include <stdbool.h>

#ifdef __CUDACC__
#define SQ_HOST_DEVICE __host__ __device__
#else
#define SQ_HOST_DEVICE
#endif

/* One row: l[n_exp] logits → ir[k] expert ids (descending), wr[k] weights. */
static inline SQ_HOST_DEVICE void sq_topk_row(const float *l, int n_exp, int k, bool norm, int *ir, float *wr)
{
    float mx = -INFINITY;
    for (int e = 0; e < n_exp; e++)
        if (l[e] > mx) mx = l[e];
    double sum = 0;
    for (int e = 0; e < n_exp; e++) sum += expf(l[e] - mx);
    /* top-k by repeated selection (k is small); strict '>' keeps the lower
     * index on ties, and probabilities are monotone in logits. */
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < n_exp; e++) {
            bool taken = false;
            for (int q = 0; q < i; q++) taken |= ir[q] == e;
            if (taken) continue;
            if (best < 0 || l[e] > l[best]) best = e;
        }
        ir[i] = best;
        wr[i] = (float)(expf(l[best] - mx) / sum);
    }
    if (norm) {
        float s = 0;
        for (int i = 0; i < k; i++) s += wr[i];
        for (int i = 0; i < k; i++) wr[i] /= s;
    }
}

#endif
