/* kernels/cuda/sample_cuda.h — the device part of sampling (issue 21): the
 * kernel behind the CUDA backend's `sample_select` op (kernels/backend.h).
 *
 * One block a row: a pass that flags a NaN / Inf, the repetition penalty in
 * place, then either the argmax (ties to the lowest id) or the k best ids by
 * an exact radix select on the logits' ordered bits (four 8-bit passes find
 * the k-th key; ids above it, and the lowest ids equal to it, are gathered in
 * id order) and a bitonic sort of those k by (logit descending, id
 * ascending): only comparisons and the penalty's one IEEE division or
 * multiplication, so the candidates are exactly the CPU sampler's
 * (runtime/sampler.c, kernels/cpu/sample.c). Plain C interface: device
 * pointers as plain pointers, the stream as void *. */
#ifndef SPARQ_KERNELS_CUDA_SAMPLE_CUDA_H
#define SPARQ_KERNELS_CUDA_SAMPLE_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Ints of a row's parameters in the request array: n_vocab, k (0 = greedy),
 * the penalty's fp32 bits, n_pen, and the offset of its ids in the array. */
#define SQ_CUDA_SAMPLE_PARAM_INTS 5

/* Launch on `stream`: logits [rows, ld] (device, penalised in place); req
 * (device ints): rows × SQ_CUDA_SAMPLE_PARAM_INTS parameters then the
 * penalised ids; out_ids / out_vals [rows, stride] and out_bad [rows]
 * (device). Queues only; the caller copies the results back. */
void sq_cuda_sample_launch(void *stream, float *logits, int rows, int ld, const int *req, int stride, int *out_ids,
                           float *out_vals, int *out_bad);

#ifdef __cplusplus
}
#endif

#endif
