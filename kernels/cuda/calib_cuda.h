/* kernels/cuda/calib_cuda.h — the all-experts calibration step of a MoE layer
 * on an NVIDIA GPU (issue 24): for every resident expert, g = xn·Wgᵀ and
 * u = xn·Wuᵀ (cuBLAS SGEMM, fp32, the default math mode: never TF32),
 * a = act(g, u) (runtime/models/blocks.h's sq_swiglu_limit formula), the down
 * input's Hessian aᵀa accumulated into the expert's device accumulator
 * (cublasSsyrk, the upper triangle as qz_hess_add), then the routed rows only:
 * their rows of a gathered, y = a·Wdᵀ, and out[row] += w·y (fmaf, as the
 * CPU's AVX2 axpy) expert by expert in the order the caller calls them. The
 * layer input's Hessian(s) (xn, shared by every expert's gate and up) are
 * accumulated once a call when asked. Plain C, no CUDA types.
 *
 * The quantizer (quantize/calib_moe.c, calib_gpu.c) drives it: it plans the
 * device memory with calib_cuda_plan before the layer, dequantises each
 * expert's weights to fp32 on the CPU into one of two pinned staging buffers
 * (calib_cuda_host_alloc) while the GPU uploads and runs the previous one
 * (calib_cuda_load on a copy stream, the compute stream waiting on its event),
 * and downloads the accumulators at the end of a pass (calib_cuda_acc_get).
 *
 * Layouts (row-major, fp32): xn [rows, d]; an expert's gate and up [inter, d]
 * and down [d, inter] as the model stores them ([out, in]); an accumulator
 * k×k with its upper triangle (c ≥ r) summed, the rest zero. */
#ifndef SPARQ_KERNELS_CUDA_CALIB_CUDA_H
#define SPARQ_KERNELS_CUDA_CALIB_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"

typedef struct calib_cuda calib_cuda;

typedef struct calib_cuda_dims {
    int d, inter;   /* hidden size, the experts' intermediate size */
    int slots;      /* experts resident at once (weights + down accumulator each) */
    int max_rows;   /* rows of one call */
    int top_k;      /* routed pairs per row */
    int n_xacc;     /* accumulators fed with xn (0..2) */
} calib_cuda_dims;

/* Device bytes a context of dims holds: *fixed (the xn accumulators, the row
 * buffers, the routing, a margin for cuBLAS's workspace) plus *per_slot for
 * each resident expert (its three fp32 weights and its inter² accumulator). */
void calib_cuda_plan(const calib_cuda_dims *dm, size_t *fixed, size_t *per_slot);
/* Free and total memory of the current device. */
sparq_status calib_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* A context on the current device: two streams, a cuBLAS handle, the memory
 * calib_cuda_plan says (accumulators zeroed). */
sparq_status calib_cuda_create(const calib_cuda_dims *dm, calib_cuda **out);
void calib_cuda_free(calib_cuda *c);

/* Pinned host memory for the staging buffers (NULL on failure). */
void *calib_cuda_host_alloc(size_t bytes);
void calib_cuda_host_free(void *p);

/* Upload an expert's fp32 weights (pinned host: gate, up [inter, d], down
 * [d, inter]) into `slot`, asynchronously on the copy stream; `stage` (0 or
 * 1) names the staging buffer they are in: calib_cuda_stage_wait(stage)
 * returns when the host may write it again. The compute stream's later work
 * waits for the upload. */
sparq_status calib_cuda_load(calib_cuda *c, int slot, int stage, const float *wg, const float *wu, const float *wd);
sparq_status calib_cuda_stage_wait(calib_cuda *c, int stage);

/* Start a call: xn [rows, d] and out [rows, d] uploaded (host memory, any),
 * the routed pairs' rows and weights (n_pairs of each, grouped by expert, the
 * caller's order) uploaded, and xn's Hessian added to xacc i for every bit i
 * of xacc_mask. */
sparq_status calib_cuda_begin(calib_cuda *c, const float *xn, int rows, const float *out, int n_pairs,
                              const int *pair_rows, const float *pair_w, unsigned xacc_mask);
/* Expert in `slot` on every row of the call, its down input accumulated into
 * the slot's accumulator when acc_down, and its routed pairs [first, first + n)
 * added to out. limit > 0: the clamped SwiGLU. Asynchronous. */
sparq_status calib_cuda_expert(calib_cuda *c, int slot, int acc_down, int first, int n, float limit);
/* out (host [rows, d]) = the call's out; waits for the call's work. */
sparq_status calib_cuda_end(calib_cuda *c, float *out);

/* host[k×k] = accumulator `which` (0 ≤ which < slots: a slot's, inter²;
 * −1 − i: xacc i, d²), which is then zeroed on the device. Synchronous. */
sparq_status calib_cuda_acc_get(calib_cuda *c, int which, float *host);

/* The functions above as a table (the sparq binary opens the CUDA module
 * with dlopen: kernels/cpu/ops_device.c, sq_cuda_calib_ops). */
typedef struct calib_cuda_ops {
    void (*plan)(const calib_cuda_dims *dm, size_t *fixed, size_t *per_slot);
    sparq_status (*mem_info)(size_t *free_bytes, size_t *total_bytes);
    sparq_status (*create)(const calib_cuda_dims *dm, calib_cuda **out);
    void (*free)(calib_cuda *c);
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    sparq_status (*load)(calib_cuda *c, int slot, int stage, const float *wg, const float *wu, const float *wd);
    sparq_status (*stage_wait)(calib_cuda *c, int stage);
    sparq_status (*begin)(calib_cuda *c, const float *xn, int rows, const float *out, int n_pairs,
                          const int *pair_rows, const float *pair_w, unsigned xacc_mask);
    sparq_status (*expert)(calib_cuda *c, int slot, int acc_down, int first, int n, float limit);
    sparq_status (*end)(calib_cuda *c, float *out);
    sparq_status (*acc_get)(calib_cuda *c, int which, float *host);
} calib_cuda_ops;

const calib_cuda_ops *calib_cuda_get_ops(void);

/* For C code in any build: the linked or dlopen-ed module's table, or NULL
 * with the reason set (kernels/cpu/ops_device.c). */
const calib_cuda_ops *sq_cuda_calib_ops(void);

#ifdef __cplusplus
}
#endif

#endif
