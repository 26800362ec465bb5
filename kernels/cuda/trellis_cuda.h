/* kernels/cuda/trellis_cuda.h — EXL3 trellis kernels on NVIDIA GPUs, callable
 * from C. No CUDA types appear here: device pointers are plain pointers that
 * came from trellis_cuda_alloc (or cudaMalloc), streams are `void *`
 * (a cudaStream_t; NULL = the default stream).
 *
 * What lives here (docs/cuda.md explains the kernels):
 *  - decode of the inner trellis Q to fp16, bit-exact with the CPU codec
 *    (kernels/cpu/trellis.h) and with exllamav3's reconstruct;
 *  - y = x·W for 1..16 rows straight from the trellis words (the decode
 *    happens in registers and feeds mma.sync tensor-core products), with the
 *    input Hadamard ⊙ suh and the output Hadamard ⊙ svh on the GPU;
 *  - a prefill path for any number of rows: decode Q once, then cuBLAS;
 *  - a fused MoE decode layer: all routed experts' gate/up → SwiGLU → down
 *    with the weighted scatter-add, in two launches, routing read on the GPU.
 *
 * Every function returns a sparq_status; on failure the message names the
 * operation, the shape and the CUDA error. All work is queued on `stream`
 * and is asynchronous unless the comment says otherwise. Builds for sm_90
 * (H200) and sm_121 (GB10) use the same code: mma.sync, no Hopper-only
 * instructions. */
#ifndef SPARQ_KERNELS_CUDA_TRELLIS_CUDA_H
#define SPARQ_KERNELS_CUDA_TRELLIS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the extern "C" block: these C headers have no guards of their own */
#include "common/status.h"
#include "kernels/cpu/trellis.h"

/* Number of usable CUDA devices (0 if none or no driver); never fails. */
int trellis_cuda_device_count(void);
/* Free and total bytes of the current device (cudaMemGetInfo). */
sparq_status trellis_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Device memory (plain cudaMalloc) and copies; synchronous. */
sparq_status trellis_cuda_alloc(void **dev, size_t bytes);
void trellis_cuda_free(void *dev);
sparq_status trellis_cuda_upload(void *dev, const void *host, size_t bytes);
sparq_status trellis_cuda_download(void *host, const void *dev, size_t bytes);
/* Wait for all work on `stream`; reports any error a kernel raised. */
sparq_status trellis_cuda_sync(void *stream);

/* A quantized linear whose trellis, suh and svh live on the device. */
typedef struct trellis_cuda_linear trellis_cuda_linear;

/* Copy a host linear (see trellis_linear_check) to the device; `name` is used
 * in error messages. Free with trellis_cuda_linear_free. */
sparq_status trellis_cuda_linear_upload(const trellis_linear *host, const char *name,
                                        trellis_cuda_linear **out);
void trellis_cuda_linear_free(trellis_cuda_linear *lin);
/* Device bytes of a linear's tensors (trellis, suh, svh, each rounded up to
 * 256 bytes), and an upload into `dev`: that many bytes of device memory the
 * caller owns and keeps while the handle lives (trellis_cuda_linear_free
 * then frees only the handle). One allocation for many linears avoids
 * cudaMalloc's per-allocation rounding (~35 KB a linear at Qwen3-30B shapes). */
size_t trellis_cuda_linear_bytes(const trellis_linear *host);
sparq_status trellis_cuda_linear_upload_into(const trellis_linear *host, const char *name, void *dev,
                                             trellis_cuda_linear **out);
/* The linear's shape and K (for callers that only hold the handle). */
void trellis_cuda_linear_shape(const trellis_cuda_linear *lin, int *k, int *n, int *K);

/* Scratch for trellis_cuda_gemm: 16·max_k fp16 and 16·max_n fp32 (kept zero
 * between calls), and for the integer mul1 GEMV 32·max_k bytes of quantised
 * activations with per-block scales and sums. One workspace serves any
 * linear up to that size, one stream at a time. */
typedef struct trellis_cuda_ws trellis_cuda_ws;
sparq_status trellis_cuda_ws_create(int max_k, int max_n, trellis_cuda_ws **out);
void trellis_cuda_ws_free(trellis_cuda_ws *ws);

/* q (device, fp16 bits, k×n row-major) = the inner trellis Q, bit-exact with
 * trellis_linear_decode_inner. */
sparq_status trellis_cuda_decode_inner(const trellis_cuda_linear *lin, uint16_t *q, void *stream);

/* y = x·W for rows = 1..TRELLIS_GEMM_MAX_ROWS (x: rows×k fp32, y: rows×n fp32,
 * device, row-major). mul1 at 1..4 rows: the integer arithmetic of the CPU's
 * trellis_linear_gemm (16-bit signed activations (|q| ≤ 32639) per 128-block, exact int32 sums of
 * the codebook byte sums; docs/cuda.md); otherwise the input transform is
 * rounded to fp16 for the tensor cores. Accumulation is fp32, summed across
 * k-splits with atomics, so the last bits can differ from run to run.
 * Normalised MSE against the CPU trellis_linear_gemm is ≤ ~1e-7
 * (tests/gpu/test_trellis_cuda.c bounds it). */
sparq_status trellis_cuda_gemm(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                               trellis_cuda_ws *ws, void *stream);

/* A group of up to TRELLIS_CUDA_GROUP_MAX mul1 linears on one input (an
 * attention layer's q, k, v; issue 21), in three launches for all of them
 * instead of three each, with the layer's neighbouring small ops folded in:
 *   x' = rmsnorm(x) ⊙ norm when norm is set (else x), per row of k;
 *   y_g = x'·W_g (trellis_cuda_gemm's integer arithmetic, 1..4 rows);
 *   then per head of head_dim (64 or 128) of y_g: the RMSNorm of the head
 *   with head_norm[g] (NULL: none), RoPE rotate-half at pos[r] with
 *   inv_freq when rope[g]; and row r of y_g also to cache[g] row
 *   kv_first[r] + pos[r] (NULL: none).
 * The arithmetic of each part is the separate op's (the backend's rmsnorm,
 * rope, kv_store: sums of squares in double), so the results equal the
 * separate ops' up to the GEMV's atomics. All pointers are device memory. */
#define TRELLIS_CUDA_GROUP_MAX 3
typedef struct trellis_cuda_group_opts {
    const float *norm;  /* [k] or NULL */
    float eps;          /* of norm and of the head norms */
    int head_dim;       /* 64 or 128 where a head norm or rope is set */
    const float *head_norm[TRELLIS_CUDA_GROUP_MAX]; /* [head_dim] or NULL */
    bool rope[TRELLIS_CUDA_GROUP_MAX];
    const float *inv_freq; /* [head_dim / 2] */
    const int *pos;        /* [rows] */
    float *cache[TRELLIS_CUDA_GROUP_MAX]; /* rows of n_g floats, or NULL */
    const int *kv_first;   /* [rows] where a cache is set */
} trellis_cuda_group_opts;

/* Whether trellis_cuda_gemv_group takes these linears, rows and head_dim
 * with this workspace: 1..4 rows, mul1, one K and one k (a multiple of 128)
 * for all, every n a multiple of 128 and within the workspace. */
bool trellis_cuda_gemv_group_ok(const trellis_cuda_linear *const *lin, int n_lin, int rows, int head_dim,
                                const trellis_cuda_ws *ws);
sparq_status trellis_cuda_gemv_group(const trellis_cuda_linear *const *lin, int n_lin, const float *x, int rows,
                                     float *const *y, const trellis_cuda_group_opts *o, trellis_cuda_ws *ws,
                                     void *stream);

/* y = x·W, then h += y and xn = rmsnorm(h) ⊙ w (the add_rmsnorm op: sums
 * of squares in double) in the GEMV's output launch, one block a row: three
 * launches where the two ops take four. x, h, xn: rows × k / n fp32, w: n
 * (device). Taken by trellis_cuda_gemv_add_rmsnorm_ok's linears: mul1, 1..4
 * rows, n a multiple of 128 up to 4096, within the workspace. */
bool trellis_cuda_gemv_add_rmsnorm_ok(const trellis_cuda_linear *lin, int rows, const trellis_cuda_ws *ws);
sparq_status trellis_cuda_gemv_add_rmsnorm(const trellis_cuda_linear *lin, const float *x, int rows, float *h,
                                           const float *w, float eps, float *xn, trellis_cuda_ws *ws, void *stream);

/* Prefill: y = x·W for any rows ≥ 1 through cuBLAS on Q decoded into the
 * workspace (nothing is kept per linear). One prefill workspace serves every
 * linear with k·n ≤ max_kn, k ≤ max_k and n ≤ max_n on one stream at a
 * time: the decode scratch, input/output buffers of max_rows rows (more rows
 * run in chunks) and one cuBLAS handle with its workspace. Its device bytes
 * are trellis_cuda_prefill_ws_bytes(), for the memory plan. */
typedef struct trellis_cuda_prefill_ws trellis_cuda_prefill_ws;
size_t trellis_cuda_prefill_ws_bytes(size_t max_kn, int max_k, int max_n, int max_rows);
sparq_status trellis_cuda_prefill_ws_create(size_t max_kn, int max_k, int max_n, int max_rows,
                                            trellis_cuda_prefill_ws **out);
void trellis_cuda_prefill_ws_free(trellis_cuda_prefill_ws *p);
sparq_status trellis_cuda_gemm_prefill(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                       trellis_cuda_prefill_ws *p, void *stream);

/* --- fused MoE decode layer -------------------------------------------------
 * One layer's routed experts, each a SwiGLU MLP of three EXL3 linears:
 * gate, up (hidden → inter) and down (inter → hidden), all with the same K
 * and codebook. The handles stay owned by the caller and must outlive the
 * layer. */
typedef struct trellis_cuda_moe trellis_cuda_moe;

/* Build device tables for n_experts experts (gate[e], up[e], down[e]) and
 * scratch for up to max_tokens (1..16) tokens routed to top_k experts each.
 * An expert whose three handles are all NULL is one this GPU does not hold
 * (the expert split): it may only be routed to trellis_cuda_moe_forward_own
 * of an expert set without it. */
sparq_status trellis_cuda_moe_create(trellis_cuda_linear *const *gate, trellis_cuda_linear *const *up,
                                     trellis_cuda_linear *const *down, int n_experts, int max_tokens, int top_k,
                                     trellis_cuda_moe **out);
void trellis_cuda_moe_free(trellis_cuda_moe *moe);
/* Let `moe` use donor's per-forward scratch instead of its own (which is
 * freed): the MoE layers of one model run one after another on one stream,
 * so one set of buffers serves them all (~39 MB at DeepSeek V4.1 shapes and
 * 16 tokens, instead of that much per layer). Same shapes, tokens and top-k
 * required (SPARQ_E_SHAPE otherwise); the handles may then be freed in any
 * order. Two layers that share must not run at the same time. */
sparq_status trellis_cuda_moe_share(trellis_cuda_moe *moe, trellis_cuda_moe *donor);

/* out[t] += Σ_j weights[t·top_k + j] · down_e(silu(gate_e(x[t])) ⊙ up_e(x[t])),
 * e = ids[t·top_k + j], for t < tokens. All pointers are device memory: x and
 * out tokens×hidden fp32 (out holds the residual or zeros), ids int32 and
 * weights fp32 tokens×top_k (the router's output, read on the device: no
 * host round trip). Graph-capturable (nothing is allocated per call): for
 * mul1 layers five PDL-chained launches (moe_int), for the other codebooks two
 * (moe_fused; docs/cuda.md, kernels/cuda/moe_decode.cu); fp32 atomics, so the last
 * bits vary from run to run. mul1 layers use the integer GEMM arithmetic (as
 * trellis_cuda_gemm). One call at a time per layer handle (and per set of
 * shared scratch). */
sparq_status trellis_cuda_moe_forward(trellis_cuda_moe *moe, const float *x, int tokens, const int *ids,
                                      const float *weights, float *out, void *stream);

/* The same for the pairs whose expert e has e % own_n == own_k only (the
 * expert split: this GPU holds those experts, the others' tables may be
 * NULL in trellis_cuda_moe_create); own_n <= 1: every pair, as above. A
 * first launch lists the step's own pairs on the device; the later ones
 * divide only their work over their grids and skip the rest. */
sparq_status trellis_cuda_moe_forward_own(trellis_cuda_moe *moe, const float *x, int tokens, const int *ids,
                                          const float *weights, float *out, int own_n, int own_k, void *stream);

#ifdef __cplusplus
}
#endif

#endif
