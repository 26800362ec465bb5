/* kernels/backend.h — the backend interface: the few operations a model graph
 * is built from, as a struct of function pointers, plus the linear-layer
 * abstraction every weight matrix goes through.
 *
 * Why a vtable: the CPU backend (kernels/cpu/ops.c) is the readable oracle;
 * a CUDA backend fills the same struct, and one test runs every op on every
 * backend against the CPU (ggml's test-backend-ops habit). A graph
 * (runtime/models/qwen3moe.c) only ever calls `ex->be->op(...)`, so it does not know
 * which backend runs it.
 *
 * Why `sq_linear`: a weight matrix may be bf16/fp16/fp32 (mmapped, used in
 * place), FP8 or MXFP4 with UE8M0 block scales as DeepSeek ships them
 * (mmapped, decoded on the fly by the backend's linear), or an EXL3
 * trellis-quantized matrix (kernels/cpu/trellis.h, decoded on the fly). The
 * graph holds `sq_linear`s and calls sq_linear_forward(); a new weight kind
 * plugs in by setting `forward` (and `impl`) at load time, without changing
 * the graph.
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
    /* w: uint8 E4M3 [out, in] ("fn": no inf, NaN = S.1111.111, max 448), one
     * UE8M0 scale per block of block_rows × block_cols weights (DeepSeek V4.1
     * 32×32, V3/V4 128×128); weight = e4m3 · 2^(scale - 127). */
    SQ_LINEAR_FP8,
    /* w: uint8 [out, in/2], two E2M1 values a byte, low nibble first (column
     * 2i low, 2i+1 high); one UE8M0 scale per row and group of 32 columns
     * (block_rows 1, block_cols 32). DeepSeek V4.1's routed experts. */
    SQ_LINEAR_MXFP4,
    SQ_LINEAR_KIND_COUNT_
} sq_linear_kind;

typedef struct sq_linear sq_linear;

/* y[rows, out] = x[rows, in] · Wᵀ (+ bias). Must not fail for valid shapes,
 * except for memory: then sq_exec_set_error (below). */
typedef void (*sq_linear_forward_fn)(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y);

struct sq_linear {
    sq_linear_kind kind;
    int in, out;
    const void *w;                /* dense weight [out, in] (points into the mmapped file) */
    const float *bias;            /* [out] or NULL */
    const void *impl;             /* kind-specific state (EXL3: its tensors) */
    sq_linear_forward_fn forward; /* NULL: the backend's dense linear for `kind` */
    const char *name;             /* tensor key for messages, e.g. "model.layers.0.self_attn.q_proj" */
    /* FP8 / MXFP4: the UE8M0 scale bytes, [ceil(out / block_rows),
     * ceil(in / block_cols)] row-major, pointing into the mapped file like w.
     * A byte b means 2^(b - 127); 0 is 2^-127 (a subnormal fp32, used as is),
     * 255 (NaN) is refused when the linear is bound, as are E4M3 NaN codes.
     * NULL and 0 for the other kinds. */
    const uint8_t *scale;
    int block_rows, block_cols;
};

/* "f32", "bf16", "f16", "exl3", "fp8", "mxfp4". */
const char *sq_linear_kind_name(sq_linear_kind k);

/* Bytes of w plus scale that one pass over a dense, FP8 or MXFP4 linear
 * reads (what a decode step streams); 0 for EXL3, whose impl knows. */
uint64_t sq_linear_stored_bytes(const sq_linear *l);

/* *view = rows [row0, row0 + rows) of l, as a linear of its own over the same
 * memory (w, scale and bias advanced; nothing copied): DeepSeek's grouped
 * output projection applies row groups of one wo_a tensor to different
 * inputs. Dense, FP8 and MXFP4 only (EXL3 and any linear with a `forward`
 * hook: SPARQ_E_UNSUPPORTED). FP8: row0 must be a multiple of block_rows and
 * rows too, unless the view ends at l->out (a partial last block); otherwise
 * SPARQ_E_ARG. A range outside [0, l->out): SPARQ_E_RANGE. A device backend
 * uploads a view as a linear of its own (prepare_linear keys on w). */
sparq_status sq_linear_rows_view(const sq_linear *l, int row0, int rows, sq_linear *view);

/* The expert split (runtime/dist/dist.h): turns a rank's partial MoE output
 * part[rows, d] (the sum over the experts it holds; backend memory) into the
 * whole one, in place and bit-identical on every rank (an all-gather, then
 * the pieces added in rank order by the `sum_parts` op), before it goes into
 * the residual. */
typedef struct sq_moe_combine {
    sparq_status (*fn)(void *user, float *part, int rows, int d);
    void *user;
} sq_moe_combine;

/* One layer's feed-forward for the `moe` op. router NULL: a dense MLP
 * (expert 0, weight 1). gate/up/down are arrays of n_exp linears.
 * The expert split: own_n > 1 means this process holds only the experts e
 * with e % own_n == own_k (the others' linears are empty): every row is
 * routed as always, the pairs of other experts are skipped, and `combine`
 * (when its fn is set) completes the sum. The host path does this, and so
 * does the CUDA backend's `moe`: its kernels skip the pairs of experts it
 * does not hold, and its prepare_moe uploads only the experts it holds. */
typedef struct sq_moe_layer {
    int n_exp, top_k;
    bool norm_topk;           /* renormalise the top-k weights to sum 1 */
    const sq_linear *router;  /* [n_exp, d] or NULL */
    const sq_linear *gate, *up, *down;
    int own_n, own_k;
    const sq_moe_combine *combine;
} sq_moe_layer;

/* Does this process hold routed expert e of ml (the expert split's rule)? */
static inline bool sq_moe_holds(const sq_moe_layer *ml, int e)
{
    return ml->own_n <= 1 || e % ml->own_n == ml->own_k;
}

/* An expert this process holds, for the layer's shapes (expert 0 may be
 * another rank's: its linears are empty). */
static inline int sq_moe_held(const sq_moe_layer *ml)
{
    return ml->own_n > 1 ? ml->own_k : 0;
}

/* Workspace of the `moe` op, backend memory sized for max_rows rows:
 * rl [R, E]; rw, lw [R, k]; ridx, rows_of [R, k] ints; xg, dn [R, d];
 * g, u [R, I]. */
typedef struct sq_moe_ws {
    float *rl, *rw, *lw, *xg, *g, *u, *dn;
    int *ridx, *rows_of;
} sq_moe_ws;

/* One row's request of the `sample_select` op (issue 21): what the host
 * sampler (runtime/sampler.h) needs from the device to make its draw exactly
 * as if it had the whole row. */
typedef struct sq_sample_req {
    int n_vocab;         /* candidate ids 0..n_vocab-1 (≤ the row length ld) */
    int k;               /* 0: greedy (the argmax, ties to the lowest id); 1..SQ_SAMPLE_MAX_K: the k best */
    float penalty;       /* repetition penalty applied first (1: none): a logit > 0 divided, else multiplied */
    int n_pen;           /* distinct ids in [0, n_vocab) the penalty applies to */
    const int32_t *pen;  /* host */
} sq_sample_req;

/* An attention layer's front for the `attn_front` op (issue 21): its input
 * norm, q/k/v projections, per-head norms and RoPE. */
typedef struct sq_attn_front {
    const sq_linear *q, *k, *v;
    const float *norm;           /* [in] the input RMSNorm's weight */
    const float *q_norm, *k_norm; /* [head_dim] or NULL (no per-head norm) */
    float eps;
    int head_dim;                /* the heads: q->out / head_dim of q, k->out / head_dim of k and v */
    const float *inv_freq;       /* [head_dim / 2]: RoPE rotate-half, as `rope` */
} sq_attn_front;

/* The most candidates one row of `sample_select` returns. */
#define SQ_SAMPLE_MAX_K 1024

/* --- the backend vtable -------------------------------------------------- */

typedef struct sq_link_spec sq_link_spec; /* below the vtable */
typedef struct sq_link sq_link;           /* a backend's end of a device link */

typedef struct sq_backend {
    const char *name; /* "cpu", "cuda" */

    /* Dense (F32/BF16/F16) and block-scaled (FP8/MXFP4) linears. Many rows:
     * blocked GEMM; few rows: GEMV. */
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
     * Query head h uses KV head h / (n_heads / n_kv). Scores scaled by `scale`.
     * The ops just before it may have written only key rows at or above
     * kv_first[r] + kv_len[r] - rows (each row appends one key, as a decode
     * or prefill step does): the CUDA backend loads the older ones before it
     * waits for those ops. */
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
    /* out[i] = parts[0][i] + parts[1][i] + ... + parts[n_parts - 1][i],
     * added in that order (parts: [n_parts][n]; out may not overlap them):
     * the expert split's combine, where every rank must end with the same
     * floats (issue 25). */
    void (*sum_parts)(sq_exec *ex, const float *parts, int n_parts, size_t n, float *out);

    /* h[r] += x[r]; y[r] = rmsnorm(h[r]) ⊙ w (rmsnorm's rule), rows vectors of dim. y ≠ h.
     * The residual add and the next norm in one pass (one launch on the GPU):
     * to the bit the same backend's axpy(1, x, h) then rmsnorm(h, …, y). */
    void (*add_rmsnorm)(sq_exec *ex, const float *x, float *h, int rows, int dim, const float *w, float eps,
                        float *y);

    /* --- memory and the graph's former host steps (issue 10) -------------
     * With `device` true, every float/int activation pointer passed to the ops
     * above and below is backend memory (from `alloc`): device memory for
     * CUDA. Index arrays the graph fills on the host (rope's pos, attention's
     * kv_first / kv_len, kv_store's and embed's arguments) stay HOST pointers;
     * the backend copies them. Weights (sq_linear.w / impl, norm vectors,
     * inv_freq, the embedding table) stay the host pointers the loader made;
     * a device backend looks up the copy `prepare` / `prepare_linear` made.
     * Ops cannot fail; a device error is kept and returned by `to_host` /
     * `sync`. */
    bool device;

    /* bytes of backend memory, 64-byte aligned (CPU: host; CUDA: cudaMalloc),
     * NULL on failure; free(NULL) is a no-op. */
    void *(*alloc)(sq_exec *ex, size_t bytes);
    void (*free)(sq_exec *ex, void *p);
    /* host[0..bytes) = mem[0..bytes) (backend memory → host); waits. */
    sparq_status (*to_host)(sq_exec *ex, void *host, const void *mem, size_t bytes);
    /* mem[0..bytes) = host[0..bytes) (host → backend memory); waits. */
    sparq_status (*to_device)(sq_exec *ex, void *mem, const void *host, size_t bytes);
    /* Wait for queued work; returns the first error any op met. */
    sparq_status (*sync)(sq_exec *ex);

    /* Make constant host data (a norm vector, an embedding table: `bytes`
     * from `host`) and a linear's weights usable by the ops (CUDA: upload
     * once, keyed by the host pointer: the host data must stay unchanged and
     * allocated while the exec lives). CPU: no-op. CUDA refuses FP8 and
     * MXFP4 linears (SPARQ_E_UNSUPPORTED: they run on the CPU only for now). */
    sparq_status (*prepare)(sq_exec *ex, const void *host, size_t bytes);
    sparq_status (*prepare_linear)(sq_exec *ex, const sq_linear *l);

    /* hidden[i, :] = row tokens[i] of the table [*, d] of `kind` (F32, BF16,
     * F16), widened to fp32. tokens: host, already range-checked. */
    void (*embed)(sq_exec *ex, sq_linear_kind kind, const void *table, int d, const int32_t *tokens, int n,
                  float *hidden);

    /* KV cache append: rows r of k and v [rows, width] go to cache rows
     * kv_first[r] + pos[r] of kc / vc (host index arrays). */
    void (*kv_store)(sq_exec *ex, const float *k, const float *v, int rows, size_t width, const int *kv_first,
                     const int *pos, float *kc, float *vc);

    /* One layer's MoE (or dense MLP) on the device, router included:
     * out[rows, d] = Σ_j w_j · down_e(silu(gate_e(xn)) ⊙ up_e(xn)), or with
     * `add` out += that (the residual add folded in: the experts' outputs
     * go into the residual stream directly). NULL on the CPU, whose graph
     * does it on the host (it also serves the calibration observers). */
    void (*moe)(sq_exec *ex, const sq_moe_layer *ml, const float *xn, int rows, float *out,
                const sq_moe_ws *ws, bool add);
    sparq_status (*prepare_moe)(sq_exec *ex, const sq_moe_layer *ml, int max_rows);

    /* Free and total bytes of the device's memory (for the load-time check
     * against the plan); NULL on the CPU. */
    sparq_status (*mem_info)(sq_exec *ex, uint64_t *free_bytes, uint64_t *total_bytes);

    /* Release the exec's `dev` state (called by sq_exec_free); NULL on the CPU. */
    void (*exec_free)(sq_exec *ex);

    /* Decode steps as device graphs; NULL on the CPU. The model calls
     * step_begin before the first op of a whole step of `rows` rows whose rows
     * attend to at most `max_keys` keys, when nothing in the step waits for
     * the device before its end (the step ends at the next to_host, to_device,
     * sync, link op or step_begin), and step_abort when it leaves a step early on an
     * error. The CUDA backend runs the first step of a shape as usual,
     * captures the second and replays the capture from then on (docs/cuda.md);
     * the results are the same bit for bit. step_graphs: how many steps were
     * captured / replayed so far. */
    void (*step_begin)(sq_exec *ex, int rows, int max_keys);
    void (*step_abort)(sq_exec *ex);
    void (*step_graphs)(sq_exec *ex, uint64_t *captured, uint64_t *replayed);

    /* Sampling's device part (issue 21): for each of `rows` rows of logits
     * [rows, ld] (backend memory; the penalty is applied to them in place),
     * req[r] as above. Writes host arrays: a greedy row its argmax id to
     * ids[r][0] and its (penalised) logit to vals[r][0]; a top-k row its k
     * best ids to ids[r][0..k) in the order (penalised logit descending, id
     * ascending), the sampler's candidate order, their penalised logits to
     * vals[r][0..k). bad[r] = 1 when row r's ld logits (before the penalty)
     * hold a NaN or an Inf, else 0. Waits for the device; a step in flight
     * ends first. The rest of the chain (temperature, softmax, top-p, min-p,
     * the draw) is the host's, in double, on these k values only
     * (sq_sampler_finish). CPU: on host memory (kernels/cpu/sample.c), the
     * reference of the device op. */
    sparq_status (*sample_select)(sq_exec *ex, float *logits, int rows, int ld, const sq_sample_req *req,
                                  int32_t *const *ids, float *const *vals, uint8_t *bad);

    /* The attention front of a layer as one fused op (issue 21), or false
     * when this backend has no fused path for these linears and rows (the
     * graph then runs the ops one by one; the answer depends only on the
     * linears, rows and head_dim, so a captured step and its replays agree).
     * Computes what rmsnorm(x ⊙ a->norm) → q, k, v linears → q_norm / k_norm
     * per head → rope at pos → (kc non-NULL) kv_store(k, v, kv_first, pos)
     * computes, into q [rows, q->out], k and v [rows, k->out]; xn is
     * not materialised. pos, kv_first: host, as rope's and kv_store's. NULL
     * on the CPU, whose graph runs the ops (they are its reference). */
    bool (*attn_front)(sq_exec *ex, const sq_attn_front *a, const float *x, int rows, const int *pos,
                       const int *kv_first, float *kc, float *vc, float *q, float *k, float *v);

    /* Optional (issue 21): sq_linear_forward(l, x) then add_rmsnorm of that
     * output into h (h += y, xn = rmsnorm(h) ⊙ w) in one go, y not
     * materialised; returns false, having done nothing, when this backend
     * has no fused path for this linear and rows (the graph then runs the two
     * ops; the answer depends only on the linear and rows). NULL on the CPU,
     * whose ops are the reference. */
    bool (*linear_add_rmsnorm)(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *h, const float *w,
                               float eps, float *xn);

    /* --- device links (issue 25): a pipeline's hidden states rank to rank,
     * device memory to device memory on the exec's stream, never through the
     * host (runtime/dist/dist.c; sq_link_spec below). NULL on the CPU, and
     * every link op is NULL when one is.
     * link_open: this rank's end of a link of spec->size ranks (collective:
     * every rank opens, with the same spec but its rank). link_send queues
     * bytes of backend memory `mem` for `peer` behind the ops queued so far
     * and returns without waiting for the peer, unless the link's two
     * buffers towards it are both still unread: then it waits up to
     * timeout_s for the older one to be read, else SPARQ_E_TIMEOUT naming
     * the peer. link_send_ready: would a link_send to peer go without that
     * wait (never blocks; dist.c's rank 0 receives results until it would).
     * link_recv: the next link_send of `peer` to this rank (same bytes) into
     * `mem`, the ops queued after it seeing the data; it waits up to
     * timeout_s for the data, else SPARQ_E_TIMEOUT naming the peer (an NCCL
     * link is then aborted: every later op on it fails). Messages between
     * two ranks arrive in the order they were sent. link_close waits for
     * this rank's queued link work and frees its end; safe with NULL. */
    sparq_status (*link_open)(sq_exec *ex, const sq_link_spec *spec, sq_link **out);
    sparq_status (*link_send)(sq_exec *ex, sq_link *l, int peer, const void *mem, size_t bytes,
                              double timeout_s);
    bool (*link_send_ready)(sq_exec *ex, sq_link *l, int peer);
    sparq_status (*link_recv)(sq_exec *ex, sq_link *l, int peer, void *mem, size_t bytes, double timeout_s);
    /* link_allgather (the expert split's combine): collective, every rank in
     * the same order with the same bytes; all[r·bytes ..] = rank r's `mine`
     * for every rank r (this rank's own piece copied too), the ops queued
     * after it seeing all of them. It waits up to timeout_s for the pieces,
     * else SPARQ_E_TIMEOUT naming a rank that did not send (an NCCL link is
     * then aborted). mine and all are backend memory, bytes ≤ max_bytes. */
    sparq_status (*link_allgather)(sq_exec *ex, sq_link *l, const void *mine, void *all, size_t bytes,
                                   double timeout_s);
    void (*link_close)(sq_exec *ex, sq_link *l);
    /* The shared state of a same-process link of `size` ranks (ranks as
     * threads: sq_transport_threads), made once (by rank 0) and given to
     * every rank's link_open; NULL when out of memory. */
    void *(*link_hub_make)(int size);
} sq_backend;

/* How a device link is made (link_open above). Two kinds:
 *  - between processes (mpirun, one GPU each): nccl_id is the 128-byte NCCL
 *    unique id every rank got from sq_transport_nccl_bootstrap; the link is
 *    an NCCL communicator (ncclSend / ncclRecv). SPARQ_E_UNSUPPORTED in a
 *    build without NCCL;
 *  - ranks as threads of one process: hub is link_hub_make's, the same for
 *    every rank (NCCL refuses two ranks on one GPU); sends copy into a
 *    mailbox of two device buffers per pair of ranks, handed over with CUDA
 *    events and a host-side handshake. Each rank's link_open owns one
 *    reference to the hub, whatever it returns; the last close frees it.
 * max_bytes bounds one message; timeout_s bounds the open itself (NCCL's
 * communicator set-up waits for every rank). */
struct sq_link_spec {
    int rank, size;
    size_t max_bytes;
    double timeout_s;
    const uint8_t *nccl_id;
    void *hub;
};



/* The CPU backend (kernels/cpu/ops.c): OpenBLAS sgemm for many rows, an
 * AVX2/F16C GEMV (scalar fallback) for few, threaded on the exec's pool;
 * FP8/MXFP4 in kernels/cpu/ops_fp8.c. */
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
    void *dev;          /* device backend's own state (CUDA: stream, uploaded weights); NULL on the CPU */
    sparq_status err;   /* the first error a host op met since it was last taken (sq_exec_take_error) */
};

/* Ops return nothing, but a host one can fail (the CPU EXL3 linear's work
 * buffers are allocated per call): it keeps the first status here, its
 * message in the thread's sparq_errmsg(), and leaves its output zeroed. The
 * graph's public calls take it before they return, so the failure is theirs. */
static inline void sq_exec_set_error(sq_exec *ex, sparq_status st)
{
    if (ex->err == SPARQ_OK) ex->err = st;
}
static inline sparq_status sq_exec_take_error(sq_exec *ex)
{
    const sparq_status st = ex->err;
    ex->err = SPARQ_OK;
    return st;
}

/* Where a forward pass runs. */
typedef enum sq_device { SQ_DEVICE_CPU = 0, SQ_DEVICE_CUDA } sq_device;

/* "cpu" / "cuda" → *out; SPARQ_E_ARG otherwise. */
sparq_status sq_device_parse(const char *s, sq_device *out);

/* Create an exec on `dev` (CUDA: GPU 0 + a CPU pool of n_threads for host
 * work). SPARQ_E_UNSUPPORTED when this build has no CUDA backend or there is
 * no GPU. */
sparq_status sq_exec_create_on(sq_exec **out, sq_device dev, int n_threads);

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

/* y = l(x): l->forward when set (a host hook), else the backend's dense
 * linear. A device backend's `linear` runs every kind, EXL3 included. */
static inline void sq_linear_forward(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    if (l->forward && !ex->be->device) l->forward(ex, l, x, rows, y);
    else ex->be->linear(ex, l, x, rows, y);
}

#endif
