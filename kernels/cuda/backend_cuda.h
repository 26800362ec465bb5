/* kernels/cuda/backend_cuda.h — the CUDA backend: the sq_backend vtable
 * (kernels/backend.h) on an NVIDIA GPU, so runtime/models/qwen3moe.c runs the whole
 * forward pass with activations, workspace and KV cache in device memory.
 *
 * What it does (docs/cuda.md, "The CUDA backend"):
 *  - dense bf16/fp16/fp32 linears: the weights are uploaded once (raw dtype)
 *    and read by a warp-per-output GEMV (≤ 8 rows) or a tiled fp32 SIMT GEMM;
 *    fp32 accumulation, inputs never rounded;
 *  - EXL3 linears: kernels/cuda/trellis_cuda.h (tensor-core GEMM for ≤ 16
 *    rows, decode-then-cuBLAS above through one shared prefill workspace:
 *    nothing per linear beyond its own tensors);
 *  - MoE: router + top-k on the GPU; EXL3 experts at ≤ 16 rows through the
 *    fused trellis_cuda_moe_forward (no host round trip); otherwise the top-k
 *    ids (rows × k ints) come back to the host to group rows by expert, and
 *    the experts run on gathered rows on the GPU;
 *  - rmsnorm (and add_rmsnorm), rope, attention, swiglu, axpy, embedding
 *    gather, KV append: plain kernels.
 *  - the device links of a pipeline over GPU ranks (backend.h's link_*):
 *    kernels/cuda/link_cuda.h (NCCL between processes, device mailboxes
 *    between thread ranks).
 * Everything is queued on the default stream; ops never fail, the first CUDA
 * error is kept and returned by the vtable's to_host / sync. Device copies of
 * weights are keyed by their host address: a host buffer must not be changed
 * or freed (and its address reused) while the exec lives. */
#ifndef SPARQ_KERNELS_CUDA_BACKEND_CUDA_H
#define SPARQ_KERNELS_CUDA_BACKEND_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/backend.h"

/* A CUDA exec on GPU 0 (n_threads: the CPU pool it also carries, for host
 * work). SPARQ_E_UNSUPPORTED with the reason when no GPU is usable. Free with
 * sq_exec_free. */
sparq_status sq_exec_create_cuda(sq_exec **out, int n_threads);

/* The CUDA backend's vtable (for tests: compare its ops with the CPU's). */
const sq_backend *sq_backend_cuda(void);

/* Host → backend memory copy, for tests and the graph's few uploads. */
sparq_status sq_cuda_to_device(sq_exec *ex, void *dev, const void *host, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
