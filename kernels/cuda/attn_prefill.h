/* kernels/cuda/attn_prefill.h — causal GQA attention for prompt-sized steps
 * (more than 16 query rows): the CUDA backend's `attention` op for prefill
 * chunks (kernels/backend.h; backend_cuda.cu picks it).
 *
 * Flash attention in fp32: a block takes 64 query rows of one query head and
 * walks their keys 64 at a time through shared memory, the scores and the
 * softmax's running max and sum in registers (online softmax), so K and V are
 * read once a tile instead of once a row, and there is no limit on the keys.
 * Rows may belong to different sequences (any kv_first / kv_len a row): a key
 * tile none of the block's rows uses is skipped, and a key only some rows use
 * is masked for the others. Plain C interface: device pointers as plain
 * pointers, the stream as void *. */
#ifndef SPARQ_KERNELS_CUDA_ATTN_PREFILL_H
#define SPARQ_KERNELS_CUDA_ATTN_PREFILL_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the extern "C" block: the C header has no guard of its own */
#include "common/status.h"

/* Whether the kernel takes these heads: head width 64 or 128, n_heads a
 * multiple of n_kv, every pointer 16-byte aligned. */
bool sq_cuda_attn_prefill_ok(int n_heads, int n_kv, int hd, const void *q, const void *k, const void *v,
                             const void *out);

/* Once per process (or CUDA context) before the first launch: the kernels'
 * shared-memory limits. */
sparq_status sq_cuda_attn_prefill_init(void);

/* Queue on `stream`: the op's arguments (kernels/backend.h), kv_first and
 * kv_len as device arrays of `rows` ints. */
void sq_cuda_attn_prefill(void *stream, const float *q, int rows, int n_heads, int n_kv, int hd, const float *k,
                          const float *v, const int *kv_first, const int *kv_len, float scale, float *out);

#ifdef __cplusplus
}
#endif

#endif
