/* kernels/backend.h — the backend interface: the few operations a model graph
 * is built from, as a struct of function pointers, plus the linear-layer
 * abstraction every weight matrix goes through.
 *
 * Why a vtable: the CPU backend (kernels/cpu/ops.c) is the readable oracle;
 * a CUDA backend fills the same struct, and one test runs every op on every
 * backend against the CPU (ggml's test-backend-ops habit). A graph
 * (runtime/qwen3moe.c) only ever calls `ex->be->op(...)`, so it does not know
 * which backend runs it.
 *
 * Why `sq_linear`: a weight matrix may be bf16/fp16/fp32 (mmapped, used in
 * place) or an EXL3 trellis-quantized matrix (kernels/cpu/trellis.h, decoded
 * on the fly). The graph holds `sq_linear`s and calls sq_linear_forward(); a
 * new weight kind plugs in by setting `forward` (and `impl`) at load time,
 * without changing the graph.
 *
 * Layout conventions (all fp32 activations, row-major):
 *   activations x [rows, in]; y [rows, out]; weights [out, in] as HF stores
 *   `*.weight` tensors, so y = x · Wᵀ.
 * Every op is deterministic for a given thread count: work is split by output
 * element, never reduced across threads. */
#ifndef SPARQ_KERNELS_BACKEND_H
#define SPARQ_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/threadpool.h"

typedef struct sq_exec sq_exec;

/* --- linear layers ---------------------------------------------------- */

typedef enum sq_linear_kind {
    SQ_LINEAR_F32 = 0, /* w: float [out, in] */
    SQ_LINEAR_BF16,    /* w: uint16 bf16 [out, in] */
    SQ_LINEAR_F16,     /* w: uint16 fp16 [out, in] */
    SQ_LINEAR_EXL3,    /* trellis-quantized; `forward` and `impl` are set by its loader */
    SQ_LINEAR_KIND_COUNT_
} sq_linear_kind;

typedef struct sq_linear sq_linear;

/* y[rows, out] = x[rows, in] · Wᵀ (+ bias). Must not fail for valid shapes. */
typedef void (*sq_linear_forward_fn)(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y);

struct sq_linear {
    sq_linear_kind kind;
    int in, out;
    const void *w;                /* dense weight [out, in] (points into the mmapped file) */
    const float *bias;            /* [out] or NULL */
    const void *impl;             /* kind-specific state (EXL3: its tensors) */
    sq_linear_forward_fn forward; /* NULL: the backend's dense linear for `kind` */
    const char *name;             /* tensor key for messages, e.g. "model.layers.0.self_attn.q_proj" */
};

/* "f32", "bf16", "f16", "exl3". */
const char *sq_linear_kind_name(sq_linear_kind k);

/* --- the backend vtable -------------------------------------------------- */

typedef struct sq_backend {
    const char *name; /* "cpu" */

    /* Dense linear (F32/BF16/F16). Many rows: blocked GEMM; few rows: GEMV. */
    void (*linear)(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y);

    /* y[r] = x[r] / sqrt(mean(x[r]²) + eps) ⊙ w, for `rows` vectors of `dim`.
     * y may equal x. (Also used per head for q_norm / k_norm: rows = tokens × heads.) */
    void (*rmsnorm)(sq_exec *ex, const float *x, int rows, int dim, const float *w, float eps, float *y);

    /* RoPE in place on x [rows, n_heads * head_dim]; row r is at position pos[r].
     * inv_freq has head_dim/2 entries. Variant: rotate-half (GPT-NeoX / HF
     * Llama / Qwen3): pairs (i, i + head_dim/2). */
    void (*rope)(sq_exec *ex, float *x, int rows, int n_heads, int head_dim, const int *pos,
                 const float *inv_freq);

    /* Causal GQA attention. q [rows, n_heads*hd]; k, v: key/value rows
     * [*, n_kv*hd] (a KV cache or the batch itself). Query row r attends to key
     * rows kv_first[r] .. kv_first[r] + kv_len[r] - 1. out [rows, n_heads*hd].
     * Query head h uses KV head h / (n_heads / n_kv). Scores scaled by `scale`. */
    void (*attention)(sq_exec *ex, const float *q, int rows, int n_heads, int n_kv, int hd, const float *k,
                      const float *v, const int *kv_first, const int *kv_len, float scale, float *out);

    /* MoE router: softmax over `n_exp` logits per row, the top `k` experts
     * (descending probability, ties to the lower index), renormalised to sum 1
     * when `norm`. idx [rows, k], w [rows, k]. */
    void (*router_topk)(sq_exec *ex, const float *logits, int rows, int n_exp, int k, bool norm, int *idx,
                        float *w);

    /* out[i] = silu(gate[i]) · up[i], n elements. out may equal gate. */
    void (*swiglu)(sq_exec *ex, const float *gate, const float *up, size_t n, float *out);

    /* y[i] += a · x[i], n elements. */
    void (*axpy)(sq_exec *ex, float a, const float *x, size_t n, float *y);
} sq_backend;

/* The CPU backend (kernels/cpu/ops.c): OpenBLAS sgemm for many rows, an
 * AVX2/F16C GEMV (scalar fallback) for few, threaded on the exec's pool. */
const sq_backend *sq_backend_cpu(void);

/* --- execution context --------------------------------------------------- */

/* What one forward pass runs on: a backend, a thread pool, per-thread scratch
 * (weight tiles converted to fp32 for sgemm, attention scores). */
struct sq_exec {
    const sq_backend *be;
    sparq_pool *pool;   /* owned */
    int n_threads;
    float **scratch;    /* [n_threads] each scratch_floats long */
    size_t scratch_floats;
};

/* Create a CPU exec with n_threads (≤ 0: sparq_cpu_count()). Sets OpenBLAS to
 * one thread so it never fights the pool (each worker calls sgemm on its own
 * tile). */
sparq_status sq_exec_create(sq_exec **out, int n_threads);
void sq_exec_free(sq_exec *ex);

/* Make sure every thread has at least `floats` of scratch. */
sparq_status sq_exec_reserve(sq_exec *ex, size_t floats);

/* Scratch floats the CPU backend needs for linears with inputs up to max_in
 * and attention over up to max_ctx keys. */
size_t sq_exec_scratch_floats(int max_in, int max_ctx);

/* y = l(x): l->forward when set, else the backend's dense linear. */
static inline void sq_linear_forward(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    if (l->forward) l->forward(ex, l, x, rows, y);
    else ex->be->linear(ex, l, x, rows, y);
}

#endif
