/* runtime/model.h — a loaded model and its forward pass (CPU reference).
 *
 * sq_model_load() maps the checkpoint (formats/safetensors.h) and points into
 * it: bf16/fp16 matrices are used in place, never copied; only small vectors
 * (norm weights, ≤ a few KB each) are widened to fp32. Everything the forward
 * pass will ever need is allocated at load, sized by the memory plan
 * (runtime/memplan.h): a KV cache for `ctx` tokens × `n_seq` sequences and a
 * workspace for `max_rows` rows per step. A step never allocates.
 *
 * Three levels of API:
 *  - sq_model_forward(): tokens of one sequence in, logits out, KV cache
 *    appended (prefill: many tokens; decode: one). What `sparq run/eval` use.
 *  - sq_model_embed() / sq_model_forward_layer() / sq_model_head(): one layer
 *    at a time on a batch of hidden states, for the quantizer's calibration
 *    (with an observer that receives every linear's INPUT activations, for
 *    Hessian capture) and for per-layer checks against a reference.
 *  - sq_model_linear(): the sq_linear of a layer, mutable, so a caller can
 *    swap in a quantized linear (kernels/backend.h) and advance the hidden
 *    state through the quantized layer.
 *
 * The architectures are rows of a table (runtime/arch.h); each graph lives in
 * one file of runtime/models/ (qwen3moe.c), the core they share in
 * runtime/models/model.c.
 * Not thread-safe: one forward at a time per model (it is itself parallel). */
#ifndef SPARQ_RUNTIME_MODEL_H
#define SPARQ_RUNTIME_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/hfconfig.h"
#include "kernels/backend.h"
#include "runtime/arch.h"

typedef struct sq_model sq_model;

typedef struct sq_model_opts {
    int ctx;       /* KV cache tokens per sequence. 0 (the default): 4096 for a model directory, the planned
                      ctx for a bundle, either capped at max_position_embeddings. N > 0: exactly N, and
                      SPARQ_E_ARG when N exceeds max_position_embeddings (no RoPE scaling: positions past it
                      were never trained) or, for a bundle, the ctx it was packed for */
    int n_seq;     /* sequences with a KV cache (default 1) */
    int max_rows;  /* rows per forward step: prefill chunk / calibration batch (default 512) */
    int n_threads; /* ≤ 0: all CPUs (or SPARQ_THREADS) */
    int node;      /* bundle node this process loads (default 0) */
    int nodes;     /* processes the model runs on (default 1): must equal the bundle's box count */
    sq_device device; /* where the forward runs (default SQ_DEVICE_CPU; kernels/backend.h) */
    bool no_verify;   /* a bundle: skip the XXH3 check of every block this node loads (formats/bundle.h; sizes
                         and unlisted files are still checked). Default false: every block is checked */
    const char *base_dir; /* a model directory: the tensors read from `dir` over those of base_dir
                             (sf_open_overlay: base's tensors of the modules dir lacks), so dir need hold
                             only what differs (sparq quantize's work skeleton over its source). NULL
                             (the default): dir alone */
} sq_model_opts;

void sq_model_opts_default(sq_model_opts *o);

/* Load a model directory (config.json + *.safetensors, sharded or not), or
 * node opts->node of a bundle from `sparq pack`: for a bundle, every file the
 * node reads is first checked against the manifest, every block's XXH3-128
 * included unless opts->no_verify (formats/bundle.h), so a damaged bundle
 * is refused, naming the file and block. Errors name the file and tensor
 * (missing, wrong shape, unsupported dtype). */
sparq_status sq_model_load(sq_model **out, const char *dir, const sq_model_opts *opts);
void sq_model_free(sq_model *m);

const sq_model_config *sq_model_cfg(const sq_model *m);
const sq_model_opts *sq_model_options(const sq_model *m);
sq_exec *sq_model_exec(sq_model *m);

/* Bytes this model holds. weights: mapped tensors the graph uses (file
 * pages, touched on demand); kv: the KV cache; workspace: activations, fp32
 * norm vectors and per-thread scratch — all allocated at load. */
typedef struct sq_model_mem {
    uint64_t weights, kv, workspace;
    uint64_t plan_kv, plan_workspace; /* what runtime/memplan.h says for the same options */
    /* a device exec (0 on the CPU): the bytes its load was planned to take on
     * the device (checked against its free memory before any upload), and
     * what the load took (the drop in free device memory) */
    uint64_t device_plan, device_used;
} sq_model_mem;
void sq_model_mem_report(const sq_model *m, sq_model_mem *out);

/* Steps a device exec captured as graphs and replayed (kernels/backend.h
 * step_begin; docs/cuda.md); 0 and 0 on the CPU. */
void sq_model_graph_counts(const sq_model *m, uint64_t *captured, uint64_t *replayed);

/* Engram row reads of this process since load (zeros for a model without
 * Engram layers here): rows looked up ((row, column) pairs), distinct rows
 * read (after the per-step deduplication), seconds the reads took (from
 * queueing a step's reads to its last row, summed over steps and tables) and
 * seconds the forward blocked waiting for them (the part not hidden behind
 * the layers before the Engram layer). With a row cache, `unique` counts
 * the rows looked up in it and only its misses are read. */
typedef struct sq_model_engram_stats {
    uint64_t rows, unique;
    double fetch_s, wait_s;
    /* a bundle node with a planned row cache (the manifest's engram_cache): distinct rows found in
     * it, those read from the file, and its bytes; zeros without one */
    uint64_t cache_hits, cache_misses, cache_bytes;
} sq_model_engram_stats;
void sq_model_engram_report(const sq_model *m, sq_model_engram_stats *out);

/* --- whole-model forward ----------------------------------------------- */

typedef enum sq_logits_mode {
    SQ_LOGITS_NONE = 0, /* fill the KV cache only */
    SQ_LOGITS_LAST,     /* logits[vocab] of the last token */
    SQ_LOGITS_ALL,      /* logits[n, vocab] of every token */
} sq_logits_mode;

/* Run tokens[0..n) of sequence `seq` at positions len(seq) .. len(seq)+n-1,
 * appending to its KV cache (in steps of max_rows). SPARQ_E_RANGE when the
 * cache would overflow ctx or a token id is outside the vocabulary. */
sparq_status sq_model_forward(sq_model *m, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                              float *logits);

/* One decode step for several sequences at once (serving several users):
 * row r is the next token of sequence seqs[r] (distinct, n ≤ min(max_rows,
 * n_seq)), at position len(seqs[r]); each attends to its own cache. The
 * weights are read once for all rows. logits[n, vocab] (may be NULL). */
sparq_status sq_model_decode_batch(sq_model *m, int n, const int *seqs, const int32_t *tokens, float *logits);

/* Run the layers this process holds (all, or its node's) on hidden[rows, d].
 * Row r continues sequence seqs[r] at position pos[r]: len(seqs[r]) plus the
 * number of earlier rows of the same sequence (so a prefill chunk of one
 * sequence, a decode step of several, or a mix). K/V are cached and the
 * lengths advanced. This is one pipeline stage of runtime/dist/dist.h; the same
 * arithmetic as sq_model_forward, so the results are bit-identical. */
sparq_status sq_model_forward_rows(sq_model *m, float *hidden, int rows, const int *seqs, const int *pos);

/* A workspace buffer of [max_rows, hidden_size] floats that the model's own
 * steps use only inside sq_model_forward / decode_batch, so a caller driving
 * forward_rows itself (runtime/dist/dist.c with one rank) can hold a step's hidden
 * states there between embed, forward_rows and head. */
float *sq_model_hidden_buffer(sq_model *m);

/* The layers this process holds, [first, end), and whether it holds the
 * embeddings (first node) and the final norm + lm_head (last node). A model
 * directory, or a one-box bundle, holds everything. sq_model_embed/head fail
 * with SPARQ_E_UNSUPPORTED on a node without them. */
void sq_model_layer_range(const sq_model *m, int *first, int *end);
bool sq_model_has_embed(const sq_model *m);
bool sq_model_has_head(const sq_model *m);

/* A node of an expert-split bundle (`sparq pack --split experts`): the box
 * count N it was packed for, 1 included (it runs every layer and holds the
 * routed experts e with e mod N == its node), else 0. Each MoE layer then computes only the
 * pairs of its experts and calls fn(user, part, rows, hidden_size) on its
 * partial output before adding it to the residual; fn must make it the
 * whole sum, identical on every rank (runtime/dist/dist.c sets it). Without
 * fn a rank's layers use only their own experts' share. */
int sq_model_expert_split(const sq_model *m);
void sq_model_set_moe_combine(sq_model *m, sparq_status (*fn)(void *user, float *part, int rows, int d), void *user);

/* Tokens currently in the KV cache of seq; reset empties it. */
int sq_model_seq_len(const sq_model *m, int seq);
void sq_model_seq_reset(sq_model *m, int seq);
/* Keep only the first n cached tokens of seq (n ≥ len: no change), so a
 * conversation can reuse the cached prefix it shares with a new prompt. */
void sq_model_seq_truncate(sq_model *m, int seq, int n);

/* --- one layer at a time ------------------------------------------------- */

/* The linears of a layer are the slots of its description (runtime/arch.h):
 * sq_model_layer_desc() gives it for a layer this process holds (NULL
 * otherwise); a slot is named by its index there and an instance (the
 * expert, 0 for a slot with one instance).
 *
 * Observer of a forward_layer call (any callback may be NULL).
 *  linear_input: the exact fp32 input x[rows, in] that instance `inst` of
 *    slot `slot` is about to be applied to (slots of one input group are
 *    each reported with the same x).
 *  router: the experts chosen for each row (descending weight) and their
 *    weights (after norm_topk_prob), idx/w [rows, k].
 *  all_experts: calibration mode (reference.md §1.3) — every expert's input
 *    (gate/up) is reported as the whole layer input (all rows), and its down
 *    input as that expert's activation on all rows; the layer OUTPUT still
 *    uses the normal top-k routing. Costs n_experts/top_k times the MoE
 *    compute.
 *  moe_all: with all_experts, the whole all-experts loop of a routed MoE
 *    layer handed to the observer instead of run (the quantizer's GPU
 *    capture, quantize/calib_moe.c): the router, its linear_input and
 *    router reports, and V4.1's shared experts stay the runtime's; gate, up
 *    and down of the routed experts are then NOT reported through
 *    linear_input (the hook sees their inputs itself). It must do what the
 *    runtime's loop (runtime/models/blocks.c, sq_block_moe_all) does: add
 *    every routed row's output to job->out (sq_calib_moe below). A status
 *    other than SPARQ_OK fails the forward_layer call with it (no fallback
 *    to the CPU loop: a quantizer asked for the GPU should not silently take
 *    hours instead). NULL: the runtime's loop, with the reports above. Dense
 *    MLP layers (no router) never call it. */
typedef struct sq_calib_moe sq_calib_moe;
typedef struct sq_observer {
    void *user;
    void (*linear_input)(void *user, int layer, int slot, int inst, const float *x, int rows, int in);
    void (*router)(void *user, int layer, int rows, int k, const int *idx, const float *w);
    /* An architecture's named intermediate values, for tests against a
     * reference (e.g. DeepSeek V4.1's "hc_attn.pre" [rows, 4], "index.topk"
     * [rows, k] with -1 padding): data holds rows × width floats (kind 'f'),
     * int32 (kind 'i') or int64 (kind 'l'). NULL: not reported. */
    void (*probe)(void *user, int layer, const char *name, char kind, const void *data, int rows, int width);
    sparq_status (*moe_all)(void *user, int layer, const sq_calib_moe *job);
    bool all_experts;
} sq_observer;

/* One all-experts MoE step (sq_observer.moe_all): every expert e of n_exp on
 * every row of xn, a_e = act(xn·gate_eᵀ, xn·up_eᵀ), y_e = a_e·down_eᵀ, and
 *   out[r] += w[r, k] · y_e[r]  for each routed pair idx[r, k] = e,
 * expert by expert in ascending e (the rows of one expert in ascending r),
 * each add as the backend's axpy (y += a·x). act is silu(g)·u, or with
 * limit > 0 silu(min(g, limit))·clamp(u, −limit, limit) (DeepSeek V4.1's
 * swiglu_limit), in the formulas of runtime/models/blocks.h's sq_swiglu_limit.
 * The observer's Hessians: gate and up read xn (all rows), down reads a_e
 * (all rows); the slots name them as linear_input's would. The linears are
 * the model's (any kind the CPU runs: f32, bf16, f16, fp8, mxfp4, exl3),
 * xn / idx / w / out host memory valid for the call only. */
struct sq_calib_moe {
    int rows, d, inter;                 /* xn [rows, d]; inter = gate/up out = down in */
    int n_exp, top_k;
    const float *xn;                    /* [rows, d] */
    const sq_linear *gate, *up, *down;  /* [n_exp] each: [inter, d], [inter, d], [d, inter] */
    int slot_gate, slot_up, slot_down;  /* their slots in the layer description (runtime/arch.h) */
    const int *idx;                     /* [rows, top_k] expert ids, distinct in a row */
    const float *w;                     /* [rows, top_k] their weights */
    float limit;                        /* the activation's clamp (≤ 0: none) */
    float *out;                         /* [rows, d], added to */
};

/* hidden[n, hidden_size] = embedding rows of tokens (fp32). */
sparq_status sq_model_embed(const sq_model *m, const int32_t *tokens, int n, float *hidden);

/* Apply decoder layer L in place to hidden[rows, hidden_size]; rows ≤ max_rows.
 * pos[r] is row r's position.
 *  seq ≥ 0: the rows continue sequence seq: pos must be len(seq), len+1, ...;
 *    their K/V are written to its cache and they attend to cache[0..pos]. The
 *    caller advances the length with sq_model_seq_advance() after the last layer.
 *  seq < 0: no cache; the batch holds whole sequences one after another, each
 *    starting at position 0 (row r attends to rows r - pos[r] .. r). */
sparq_status sq_model_forward_layer(sq_model *m, int layer, float *hidden, int rows, const int *pos, int seq,
                                    const sq_observer *obs);

/* Mark n more tokens of seq as cached (after forward_layer over all layers). */
sparq_status sq_model_seq_advance(sq_model *m, int seq, int n);

/* logits[rows, vocab] = lm_head(final_norm(hidden[rows])); hidden is not modified. */
sparq_status sq_model_head(sq_model *m, const float *hidden, int rows, float *logits);

/* The head and one sampled token a row (issue 21): ids[r] = what smp[r]
 * draws (not accepted) from the logits of hidden[r], exactly as sq_model_head
 * then sq_sampler_sample give. On a device exec the logits stay in device
 * memory and only the candidates come back (runtime/sampler.h,
 * sq_sampler_sample_rows); logits[rows, vocab] is host scratch for the CPU's
 * logits and for the rows a device cannot sample (no top-k, or
 * SPARQ_DEVICE_SAMPLING=0). *bad_row: the first row whose logits are not
 * finite (no token drawn for it or later rows), else -1. */
typedef struct sq_sampler sq_sampler;
sparq_status sq_model_head_sample(sq_model *m, const float *hidden, int rows, sq_sampler *const *smp, float *logits,
                                  int32_t *ids, int *bad_row);

/* One decode step as sq_model_decode_batch (row r the next token of
 * sequence seqs[r], distinct), returning one token a row drawn by smp[r]
 * instead of the logits (sq_model_head_sample; logits is its host scratch
 * [n, vocab]). What `sparq run`, --parallel and serve decode with. */
sparq_status sq_model_decode_sample(sq_model *m, int n, const int *seqs, const int32_t *tokens, sq_sampler *const *smp,
                                    float *logits, int32_t *ids, int *bad_row);

/* out[rows, hidden_size] = the exact input of the head linear for hidden[rows] (the final norm;
 * DeepSeek V4.1: of the streams collapsed with their pre mix), for the head's calibration Hessian.
 * SPARQ_E_UNSUPPORTED when the architecture does not provide it (the caller then applies the final
 * norm itself) or this process does not hold the head. */
sparq_status sq_model_head_input(sq_model *m, const float *hidden, int rows, float *out);

/* The description of layer L (runtime/arch.h), or NULL for a layer this
 * process does not hold. */
const sq_layer_desc *sq_model_layer_desc(const sq_model *m, int layer);

/* Instance `inst` of slot `slot` of layer L, or NULL if there is none.
 * Mutable: a caller may replace it (e.g. with an EXL3 linear of the same
 * in/out). */
sq_linear *sq_model_linear(sq_model *m, int layer, int slot, int inst);

/* The output head (lm_head, or the embedding matrix when tied). */
sq_linear *sq_model_head_linear(sq_model *m);

/* Is layer L a MoE layer (else dense MLP)? */
bool sq_model_layer_is_moe(const sq_model *m, int layer);

#endif
