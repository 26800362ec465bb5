/* runtime/memplan.h — the memory plan: what every node of a bundle holds and
 * how many bytes each part needs, decided before anything is loaded.
 *
 * "Memory is planned, not discovered" (design.md): `sparq plan` prints this,
 * `sparq pack` refuses a bundle it says will not fit, and the runtime sizes
 * its allocations at load with the very same functions (sq_memplan_kv_bytes,
 * sq_memplan_workspace_bytes, ...), so a bundle that plans must load.
 *
 * Per node the need is
 *     total = weights + kv + workspace + engram_cache + comm + margin
 * and it must not exceed the usable memory of one box:
 *     usable = floor((mem_per_box - reserve_os - display_reserve + unlock_display) * gpu_util)
 * (DGX Spark defaults: 128G, 6G, 2G, 1.75G, 0.92 -> 121.75 GiB, close to the
 * ~121.7 GiB CUDA sees, times 0.92 = 112.01 GiB usable). Sizes are bytes,
 * G = GiB. The formulas of every term are documented at its function and in
 * docs/cli-plan.md; all functions here are pure (no I/O, no globals) except
 * sq_memplan_build, which allocates its result.
 *
 * Layer split: contiguous layers per node, chosen (dynamic programming) to
 * minimise the largest per-node cost, where a layer's cost is its share of
 * all memory (weights + KV) plus its share of per-token work (bytes read per
 * decoded token: non-expert weights + top_k/n_experts of the expert weights).
 * Node 0 also holds the embeddings (memory, no work); the last node the final
 * norm and lm_head (memory and work) — and, with tied embeddings and no
 * separate lm_head tensor, a second copy of the embedding matrix.
 *
 * Expert split (params.split = SQ_SPLIT_EXPERTS, `--split experts`): every
 * node runs every layer; routed expert e of every MoE layer lives on node
 * e mod boxes (sq_memplan_expert_owner), everything else on every node,
 * except the final norm and lm_head, which only node 0 holds (only the leader
 * samples, so the others skip the head). Per node:
 *     weights = the replicated part + its experts (node 0: + final norm, head)
 *     kv      = every layer's KV cache
 *     comm    = boxes * rows * hidden_width * 4 (the all-gathered partial MoE
 *               sums, its own included) + rows * 12 + 64 (the step message:
 *               sequence, position and token of each row, and a header)
 *               + SQ_MEMPLAN_COMM_FIXED   (0 with one box) */
#ifndef SPARQ_RUNTIME_MEMPLAN_H
#define SPARQ_RUNTIME_MEMPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/hfconfig.h"

/* --- parameters of a run ------------------------------------------------ */

typedef enum sq_kv_dtype {
    SQ_KV_F32 = 0, /* CPU runtime today */
    SQ_KV_F16 = 1, /* CUDA runtime later */
} sq_kv_dtype;

/* Bytes per element (4 or 2); "f32"/"f16"; parse returns false if unknown. */
uint64_t sq_kv_dtype_bytes(sq_kv_dtype dt);
const char *sq_kv_dtype_name(sq_kv_dtype dt);
bool sq_kv_dtype_parse(const char *s, sq_kv_dtype *out);

/* How a bundle divides the model between its boxes. */
typedef enum sq_memplan_split {
    SQ_SPLIT_PIPELINE = 0, /* contiguous layers per node; hidden states go node to node */
    SQ_SPLIT_EXPERTS = 1,  /* every node runs every layer; the routed experts are divided */
} sq_memplan_split;

/* "pipeline" / "experts"; parse returns false if unknown. */
const char *sq_memplan_split_name(sq_memplan_split s);
bool sq_memplan_split_parse(const char *s, sq_memplan_split *out);

/* The node that holds routed expert e under the expert split: e mod boxes.
 * Round robin rather than contiguous ranges: routers favour neighbouring
 * expert ids unevenly less often than they favour whole ranges (the ids are
 * arbitrary, but training often leaves clusters of hot experts), and the
 * pack layout is no harder either way (every expert is its own tensors). */
static inline int sq_memplan_expert_owner(int64_t e, int boxes) { return boxes > 1 ? (int)(e % boxes) : 0; }

/* How many of n_experts node k holds under the expert split. */
static inline int64_t sq_memplan_experts_of_node(int64_t n_experts, int boxes, int k)
{
    return boxes > 1 ? (n_experts - k + boxes - 1) / boxes : n_experts;
}

typedef struct sq_memplan_params {
    int64_t ctx;          /* tokens per sequence the KV cache holds (default 32768) */
    int64_t users;        /* sequences decoded together (default 6) */
    int64_t chunk;        /* prefill rows per forward step (default 512) */
    int64_t logits_rows;  /* rows of logits held at once (default 0 = users; eval uses chunk) */
    int64_t threads;      /* runtime threads per node, for per-thread scratch (default 32,
                             at least a DGX Spark's 20 cores) */
    sq_kv_dtype kv_dtype; /* default SQ_KV_F32 */
    bool ship_sources;    /* a what-if only `sparq plan --ship-pools` sets (default false; no runtime
                             runs it yet): a pipeline node may start at any layer even where the
                             architecture's split_ok forbids it, keeping its own copy of the caches
                             of earlier source layers its layers read (kv_bytes counts them; the
                             source's node would ship each step's new entries with the hidden row) */
    sq_memplan_split split; /* default SQ_SPLIT_PIPELINE */
} sq_memplan_params;

void sq_memplan_params_default(sq_memplan_params *p);

/* Rows of one forward step: max(chunk, users) (a decode step is one row per
 * user, a prefill step `chunk` rows of one user). */
int64_t sq_memplan_rows(const sq_memplan_params *p);

/* --- the terms the runtime allocates ------------------------------------ */

/* The KV cache and workspace are the architecture's (runtime/arch.h:
 * kv_bytes, workspace_terms, next to the graph that allocates them); these
 * two call the config's architecture, and return UINT64_MAX (never fits) for
 * one sparq cannot run. The formulas below are Qwen3-MoE's.
 *
 * KV cache of `n_layers` layers:
 *     2 (K and V) * n_layers * num_key_value_heads * head_dim * ctx * users * bytes(kv_dtype)
 * Saturates at UINT64_MAX on overflow (which never fits). */
uint64_t sq_memplan_kv_bytes(const sq_model_config *cfg, int64_t n_layers, const sq_memplan_params *p);
/* The same for the layers [first, first + n_layers): architectures whose
 * layers keep different caches (DeepSeek V4.1: compressed pools only on its
 * kv-source layers) count exactly the node's layers. sq_memplan_kv_bytes is
 * this with first = 0. */
uint64_t sq_memplan_kv_bytes_range(const sq_model_config *cfg, int64_t first, int64_t n_layers,
                                   const sq_memplan_params *p);

/* Activation / workspace buffers of one node, allocated once at load and
 * reused by every layer (so they do not grow with the layers it holds). The
 * buffers the CPU runtime carves (runtime/models/qwen3moe.c), fp32 unless said,
 * rows R = sq_memplan_rows(p), d = hidden_size, H / KV = attention / KV
 * heads, hd = head_dim, E = max(num_experts, 1), k = max(top_k, 1),
 * I = the widest MLP (moe_intermediate_size of MoE layers,
 * intermediate_size of dense ones):
 *   hidden  = 6 * R * d * 4              residual, normed, sublayer out, expert in/out, MoE sum
 *   attn    = R * (2*H + 2*KV) * hd * 4  q, attention output, k, v
 *   moe     = (R*E + 4*R*k + 2*R*I) * 4  router logits; weights, local weights, expert
 *                                        indices, row lists (int32); gate and up
 *   misc    = (3*R + 2*(E+1)) * 4 + SQ_MEMPLAN_WS_SLACK
 *                                        positions and expert counters; alignment and
 *                                        small buffers (64 KiB)
 *   norms   = (layers * (2*d + 2*hd) + d) * 4 fp32 copies of the norm weights (all layers of
 *                                        the model: a bound for any node)
 *   scratch = threads * max(64 * max(d, I, H*hd), ctx) * 4
 *                                        per-thread GEMM tile / attention-score scratch
 *   logits  = logits_rows * vocab_size * 4   only on the node holding lm_head (the
 *                                        runtime's caller owns this buffer)
 * The runtime's own report (sq_model_mem_report) is compared with this in
 * tests/pack/test_plan_runtime.c. */
#define SQ_MEMPLAN_WS_SLACK ((uint64_t)64 << 10)
typedef struct sq_memplan_workspace {
    uint64_t hidden, attn, moe, misc, norms, scratch, logits;
    uint64_t total;
} sq_memplan_workspace;

void sq_memplan_workspace_terms(const sq_model_config *cfg, const sq_memplan_params *p, bool has_head,
                                sq_memplan_workspace *out);
uint64_t sq_memplan_workspace_bytes(const sq_model_config *cfg, const sq_memplan_params *p, bool has_head);

/* Pipeline communication buffers of one node (0 with one box):
 *     2 (send, recv) * 2 (double buffered) * rows * hidden_width * 4
 * (hidden_width: floats of a hidden row, sq_arch_hidden_width: hidden_size, or
 * V4.1's 4 streams + the lagged mix + the compressed id, padded to 16)
 *     + SQ_MEMPLAN_COMM_FIXED (transport's own buffers: NCCL channels / MPI eager) */
/* --- the CUDA runtime's device memory ----------------------------------
 * On a GPU the runtime holds, besides the weights (each tensor rounded up to
 * 256 bytes, carved from 256 MiB slabs: at most one slab's tail unused), the
 * KV cache and the workspace of the terms above:
 *   prefill = 2·max_kn + 128·max_k·2 + 128·max_n·4 + 32 MiB, each part
 *             rounded up to 256: the one decode scratch of the EXL3 prefill
 *             path (the largest linear's k·n fp16), its 128-row input and
 *             output buffers over the widest linear, cuBLAS's workspace
 *             (kernels/cuda/trellis_cuda.h trellis_cuda_prefill_ws_bytes;
 *             tests/gpu compares the two); 0 without EXL3 linears
 *   fixed   = SQ_MEMPLAN_CUDA_FIXED: the cuBLAS handle's own memory, the
 *             small-batch GEMM workspace, the index staging ring, the MoE
 *             layers' tables, and the slab tail. */
#define SQ_MEMPLAN_CUDA_FIXED ((uint64_t)448 << 20)
uint64_t sq_memplan_cuda_prefill_bytes(uint64_t max_kn, uint64_t max_k, uint64_t max_n);

/* Saturating helpers for the architectures' memory terms: max(v, 0), and the
 * sum / product of n values (UINT64_MAX on overflow). */
uint64_t sq_memplan_pos(int64_t v);
uint64_t sq_memplan_sum(int n, const uint64_t *v);
uint64_t sq_memplan_prod(int n, const uint64_t *v);

#define SQ_MEMPLAN_COMM_FIXED ((uint64_t)64 << 20)
/* The comm term of p->split (the pipeline's above, the expert split's in the
 * header comment). */
uint64_t sq_memplan_comm_bytes(const sq_model_config *cfg, const sq_memplan_params *p, int boxes);

/* What one decoded token (one row) sends between the boxes, payload only
 * (message headers left out), W = hidden_width * 4 bytes, V = vocab * 4,
 * M = MoE layers, N = boxes (everything 0 with one box):
 *   pipeline: N - 1 hops of W, then V of logits from the last node to node 0:
 *             bytes = (N-1)·W + V, messages = N, collectives 0;
 *   experts:  node 0 sends the row's token, sequence and position (12 bytes)
 *             to every other node, then each MoE layer is one all-gather in
 *             which every node sends its W of partial sums to every other:
 *             bytes = (N-1)·12 + M·N·(N-1)·W, messages = (N-1)·(1 + M·N),
 *             collectives M; the busiest node sends (N-1)·(12 + M·W). */
typedef struct sq_memplan_traffic {
    uint64_t bytes;          /* all boxes together */
    uint64_t bytes_max_node; /* the busiest box's sends */
    uint64_t messages;
    int64_t collectives;
} sq_memplan_traffic;
void sq_memplan_traffic_per_token(const sq_model_config *cfg, int boxes, sq_memplan_split split,
                                  sq_memplan_traffic *out);

/* --- the budget of one box ---------------------------------------------- */

typedef struct sq_memplan_budget {
    uint64_t mem_per_box;     /* physical memory of one box (default 128 GiB) */
    uint64_t reserve_os;      /* kept for the OS and services (default 6 GiB) */
    uint64_t display_reserve; /* firmware display carve-out (default 2 GiB) */
    uint64_t unlock_display;  /* part of it handed back on a headless box (default 1.75 GiB) */
    double gpu_util;          /* fraction of the rest the runtime may use (default 0.92) */
    uint64_t margin;          /* safety margin per node (default 512 MiB) */
    uint64_t engram_cache;    /* Engram row cache per node holding Engram layers
                                 (default 2 GiB; used only if the model has Engram) */
} sq_memplan_budget;

void sq_memplan_budget_default(sq_memplan_budget *b);

/* usable = floor((mem_per_box - reserve_os - display_reserve + unlock_display) * gpu_util).
 * SPARQ_E_ARG when the reserves exceed the memory, unlock_display exceeds
 * display_reserve, or gpu_util is outside (0, 1]. */
sparq_status sq_memplan_usable(const sq_memplan_budget *b, uint64_t *out);

/* --- tensors -> nodes --------------------------------------------------- */

typedef enum sq_tensor_class {
    SQ_TENSOR_LAYER = 0,    /* model.layers.L.* / layers.L.* (not Engram tables) */
    SQ_TENSOR_EMBED,        /* model.embed_tokens.*, embed.*            -> node 0 */
    SQ_TENSOR_HEAD,         /* lm_head.*, head.*                        -> last node */
    SQ_TENSOR_FINAL_NORM,   /* model.norm.*, norm.*                     -> last node */
    SQ_TENSOR_LAST_OTHER,   /* mtp.* (next-token prediction heads)      -> last node */
    SQ_TENSOR_ENGRAM_TABLE, /* layers.L.engram.embed.{weight,scale}: on the SSD, not in memory */
    SQ_TENSOR_OTHER,        /* anything else (vision.*, ...)            -> node 0 */
} sq_tensor_class;

/* Classify a tensor name; *layer gets L for LAYER and ENGRAM_TABLE, else -1.
 * *is_expert is true for routed-expert tensors (".experts.<E>."). */
sq_tensor_class sq_memplan_classify(const char *name, int64_t *layer, bool *is_expert);
/* The routed expert a tensor belongs to (the E of ".experts.<E>."), or -1. */
int64_t sq_memplan_expert_of(const char *name);

typedef struct sq_memplan_tensor {
    const char *name;
    uint64_t nbytes;
} sq_memplan_tensor;

/* --- the plan ----------------------------------------------------------- */

typedef struct sq_memplan_node {
    int node;
    int64_t first_layer, n_layers;   /* layers [first_layer, first_layer + n_layers) */
    bool has_embed, has_head;        /* has_head: final norm + lm_head (+ tied embedding) */
    bool has_engram;                 /* holds a layer with an Engram table */
    uint64_t engram_ssd;             /* bytes of its layers' Engram tables (on the node's SSD, not in memory) */
    int64_t experts;                 /* routed experts held, summed over its MoE layers (the pipeline: all
                                        experts of its layers; the expert split: its share of every layer) */
    uint64_t weights, kv, workspace, engram_cache, comm, margin;
    uint64_t total;                  /* sum of the six terms (saturating) */
    int64_t headroom;                /* usable - total (negative: does not fit) */
} sq_memplan_node;

typedef struct sq_memplan {
    int boxes;
    sq_memplan_params params;
    sq_memplan_budget budget;
    uint64_t usable;                 /* per box */
    int64_t n_layers;
    bool tied_head;                  /* last node holds a copy of the embedding as lm_head */
    bool has_engram;                 /* the model has Engram tables (kept on the SSD) */
    uint64_t engram_table_bytes;     /* their size on disk */
    uint64_t weights_total;          /* every in-memory tensor once */
    int64_t n_experts;               /* routed experts per MoE layer (the expert split; 0 otherwise) */
    sq_memplan_node *nodes;          /* [boxes] */
    bool fits;
    int worst_node;                  /* smallest headroom */
    const char *blame;               /* largest term on the worst node: "weights", "kv", ... */
} sq_memplan;

/* Plan `boxes` nodes for a model described by cfg and its tensors (every
 * tensor of the checkpoint with its byte size, any dtype), split as p->split
 * says. SPARQ_E_ARG when boxes < 1 or boxes > layers (the pipeline) or
 * boxes > num_experts (the expert split, which is SPARQ_E_UNSUPPORTED for a
 * model without routed experts or an architecture whose graph cannot skip
 * experts: sq_arch_info.expert_split); SPARQ_E_FORMAT when a layer index is outside
 * the config's layer count. Not fitting is NOT an error: check plan->fits.
 * Free with sq_memplan_free. */
sparq_status sq_memplan_build(sq_memplan *plan, const sq_model_config *cfg, const sq_memplan_tensor *tensors,
                              size_t n_tensors, int boxes, const sq_memplan_params *p,
                              const sq_memplan_budget *b);
void sq_memplan_free(sq_memplan *plan);

/* Which node holds a tensor: returns the node (0..boxes-1) and, for a tied
 * embedding also used as lm_head, sets *also to the last node (else -1).
 * Engram tables return -1 (they go to engram/, not a node shard). Under the
 * expert split a routed expert's owner, node 0 for the head and final norm,
 * and for a tensor every node holds 0 with *also = SQ_MEMPLAN_EVERY_NODE. */
#define SQ_MEMPLAN_EVERY_NODE (-2)
int sq_memplan_tensor_node(const sq_memplan *plan, const char *name, int *also);
/* Does node k's shard hold the tensor (either split)? What pack writes by
 * and verify checks against. */
bool sq_memplan_tensor_on_node(const sq_memplan *plan, const char *name, int k);

/* When a plan does not fit: the smallest box count (boxes+1 .. n_layers) that
 * fits with the same parameters (0 if none), and the largest ctx (1 .. ctx)
 * that fits on plan->boxes boxes (0 if none). */
sparq_status sq_memplan_suggest(const sq_memplan *plan, const sq_model_config *cfg,
                                const sq_memplan_tensor *tensors, size_t n_tensors, int *min_boxes,
                                int64_t *max_ctx);

#endif
