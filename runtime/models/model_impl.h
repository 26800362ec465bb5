/* runtime/models/model_impl.h — what the model core (model.c) and the
 * architecture files (qwen3moe.c, ...) share; nothing outside
 * runtime/models/ includes it.
 *
 * The core owns what every architecture has: the config, the mapped
 * checkpoint, the exec, the layer range of this process, the layers'
 * descriptions (runtime/arch.h) with one sq_linear per slot instance, the
 * head linear, sequence lengths, and the byte counters. An architecture
 * keeps its own weights (norms, tables), KV cache and workspace in `impl`
 * and implements the forward pass through sq_graph_ops. */
#ifndef SPARQ_RUNTIME_MODELS_MODEL_IMPL_H
#define SPARQ_RUNTIME_MODELS_MODEL_IMPL_H

#include "formats/safetensors.h"
#include "runtime/arch.h"
#include "runtime/model.h"

/* The forward pass of one architecture. The core checks the public calls'
 * common arguments (layer range, node roles) before calling these. */
struct sq_graph_ops {
    /* Bind the architecture's own tensors, allocate its KV cache and
     * workspace (sizes from the memory plan), upload to a device exec. The
     * layer linears are already bound. plan_threads: the thread count a
     * bundle was planned for (0: the default). */
    sparq_status (*load)(sq_model *m, int plan_threads);
    void (*free)(sq_model *m);
    sparq_status (*embed)(const sq_model *m, const int32_t *tokens, int n, float *hidden);
    sparq_status (*forward_layer)(sq_model *m, int layer, float *hidden, int rows, const int *pos, int seq,
                                  const sq_observer *obs);
    sparq_status (*forward_rows)(sq_model *m, float *hidden, int rows, const int *seqs, const int *pos);
    sparq_status (*head)(sq_model *m, const float *hidden, int rows, float *logits);
    /* A device exec: the logits of hidden's first *n rows (*n ≤ rows, as many as its buffer holds) left in
     * backend memory at *out, for sq_model_head_sample. NULL: the architecture has none (the logits then
     * go through `head` to the host). */
    sparq_status (*head_dev)(sq_model *m, const float *hidden, int rows, float **out, int *n);
    /* out[rows, hidden_size] = what the head linear is applied to (sq_model_head_input); NULL: the
     * final norm of hidden[rows, hidden_size] (an architecture whose hidden row is that). */
    sparq_status (*head_input)(sq_model *m, const float *hidden, int rows, float *out);
    sparq_status (*forward)(sq_model *m, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                            float *logits);
    sparq_status (*decode_batch)(sq_model *m, int n, const int *seqs, const int32_t *tokens, float *logits);
    float *(*hidden_buffer)(sq_model *m);
};

/* The linears of one layer: lin[s] holds desc.slot[s].instances linears. */
typedef struct sq_layer_lin {
    sq_layer_desc desc;
    sq_linear **lin;
} sq_layer_lin;

struct sq_model {
    sq_model_config cfg;
    sq_model_opts opts;
    char *dir;                 /* the model directory or bundle it was loaded from (config, tokenizer) */
    bool bundle;               /* loaded from one node of a bundle */
    char *engram_path;         /* a bundle node's Engram table file (the manifest's engram_file), or NULL */
    uint64_t engram_cache;     /* a bundle node's planned Engram row cache, bytes (the manifest's; 0: none) */
    const sq_arch_info *arch;
    sf_model *sf;
    sq_exec *ex;
    int n_layers;
    int first, end;            /* layers this process holds: [first, end) (all, unless a node of a bundle) */
    bool has_embed, has_head;  /* embeddings (first node) / final norm + lm_head (last node) */
    int own_n, own_k;          /* the expert split: routed experts e with e % own_n == own_k (own_n 0: all) */
    int64_t own_listed, own_listed_max; /* the expert split: the manifest's expert set of this node (count, max) */
    sq_moe_combine combine;    /* the expert split: completes each MoE layer's sum (sq_model_set_moe_combine) */
    sq_layer_lin *layers;      /* [n_layers]; bound for [first, end) */
    sq_linear head;
    int *seq_len;              /* [opts.n_seq] tokens cached per sequence */
    void **owned;              /* per-linear state the model allocated (EXL3 descriptors) */
    int n_owned, cap_owned;
    uint64_t weights_bytes, small_bytes, ws_bytes, kv_bytes, scratch_bytes;
    uint64_t plan_kv, plan_ws;
    uint64_t dev_plan, dev_free0, dev_used; /* device exec: planned bytes, free before the upload, used by the load */
    sq_model_engram_stats engram; /* the architecture counts its Engram reads here */
    void *impl;                /* the architecture's own state */
};

/* --- tensor binding helpers for the architecture files (model.c) ---------- */

sparq_status sq_mdl_find_tensor(const sq_model *m, const char *name, const sf_tensor **out);
sparq_status sq_mdl_check_shape(const sq_model *m, const sf_tensor *t, int ndim, uint64_t d0, uint64_t d1);
/* The sq_linear kind of a dense tensor (BF16, F16, F32), else SPARQ_E_UNSUPPORTED. */
sparq_status sq_mdl_dense_kind(const sq_model *m, const sf_tensor *t, sq_linear_kind *k);
/* *out = a small fp32 copy of the vector tensor `name` [n] (counted in small_bytes). */
sparq_status sq_mdl_bind_vec(sq_model *m, const char *name, int n, float **out);
/* Bind the linear `key` (dense "<key>.weight" or EXL3 "<key>.trellis" ...) of shape out × in. */
sparq_status sq_mdl_bind_linear(sq_model *m, sq_linear *l, const char *key, int out, int in);
void sq_mdl_free_linear(sq_linear *l);
/* Bind every slot instance of the layers [first, end) as their descriptions
 * name them (the architecture's load calls this first); under the expert
 * split the routed experts of other ranks stay empty linears (zeroed). */
sparq_status sq_mdl_bind_layers(sq_model *m);
/* A device exec: the bytes the load will take on the device — the weights
 * this process holds, own_bytes (the architecture's KV cache, workspace and
 * other buffers), and the CUDA runtime's prefill scratch and fixed part
 * (runtime/memplan.h) — against the device's free memory, before anything is
 * uploaded: SPARQ_E_NOMEM with the plan's numbers when it does not fit.
 * Sets dev_plan and dev_free0 (the load's used bytes are measured from it).
 * A no-op on the CPU. */
sparq_status sq_mdl_device_check(sq_model *m, uint64_t own_bytes);

/* The graph steps every architecture shares (model.c), over the model's own
 * hidden rows x (`width` floats each, device memory on a device exec) and a
 * host `pos` buffer of max_rows:
 *  - check_rows: rows continue their sequences (row r at len(seqs[r]) plus
 *    the earlier rows of the same sequence) and fit the context;
 *  - forward_chunked: sq_model_forward in max_rows chunks (embed, every layer,
 *    advance, the head's logits as `mode` asks), then the backend's sync;
 *  - decode_batch: one new token for each of n distinct sequences. */
sparq_status sq_mdl_check_rows(const sq_model *m, int rows, const int *seqs, const int *pos);
sparq_status sq_mdl_forward_chunked(sq_model *m, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                                    float *logits, float *x, int *pos, int width);
sparq_status sq_mdl_decode_batch(sq_model *m, int n, const int *seqs, const int32_t *tokens, float *logits, float *x,
                                 int *pos);

/* Make the linears of layer L whose role is in the bit set `roles`
 * (1 << sq_lin_role) usable by the exec (a device backend uploads them). */
sparq_status sq_mdl_prepare_layer(sq_model *m, int L, unsigned roles);

/* The instance `inst` of slot `s` of layer L (no checks). */
static inline sq_linear *sq_mdl_lin(sq_model *m, int layer, int s, int inst)
{
    return &m->layers[layer].lin[s][inst];
}

/* Architectures the core knows (runtime/models/registry.c). */
extern const sq_arch_info sq_arch_qwen3moe;
extern const sq_arch_info sq_arch_deepseek_v41;

#endif
