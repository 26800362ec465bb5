/* runtime/arch.h — an architecture as data: its layers and their named linears.
 *
 * Everything outside runtime/models/ that has to know what a model is made of
 * (the quantizer's capture and layer loop, the memory plan, the packer, the
 * CUDA upload, inspect) walks this description instead of naming a model.
 * An architecture is one entry of a table (runtime/models/registry.c): its
 * tensor naming, a function that describes layer L from config.json alone
 * (no weights needed, so `sparq plan` can use it on headers), the memory
 * terms its graph allocates, and the graph itself (runtime/models/<arch>.c).
 * Adding an architecture adds one file and one table row there; nothing here
 * or in quantize/ and pack/ changes.
 *
 * A layer is a list of linear *slots*. A slot has a short name unique in the
 * layer ("q_proj", "experts.down_proj"), a role, a shape, a number of
 * instances (1, or one per routed expert), and a tensor key pattern in which
 * "{L}" stands for the layer and "{E}" for the instance. Slots that read the
 * same input form a Hessian group (`group` = the first slot of the group); in
 * calibration (all-experts capture, reference.md §1.3) every expert instance
 * of a group reads the layer input unless `own_input` says each instance sees
 * its own (an expert's down projection). */
#ifndef SPARQ_RUNTIME_ARCH_H
#define SPARQ_RUNTIME_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "runtime/memplan.h"

/* What a linear does in its layer: decides its default bits and whether the
 * quantizer touches it at all. */
typedef enum sq_lin_role {
    SQ_ROLE_ATTN = 0, /* attention projections */
    SQ_ROLE_ROUTER,   /* MoE router: kept as it is, never quantized */
    SQ_ROLE_EXPERT,   /* routed expert: one instance per expert */
    SQ_ROLE_SHARED,   /* shared expert of a MoE layer */
    SQ_ROLE_MLP,      /* dense MLP of a layer without experts */
    SQ_ROLE_ENGRAM,   /* an Engram fusion projection (DeepSeek V4.1's engram.wkv) */
    SQ_ROLE_COUNT_
} sq_lin_role;

/* "attn", "router", "expert", "shared", "mlp", "engram". */
const char *sq_lin_role_name(sq_lin_role r);

typedef struct sq_lin_desc {
    const char *name;   /* unique in the layer, e.g. "q_proj", "experts.gate_proj" */
    const char *key;    /* tensor key pattern, e.g. "model.layers.{L}.mlp.experts.{E}.gate_proj" */
    sq_lin_role role;
    int in, out;        /* y[out] = W x[in] */
    int instances;      /* 1, or the layer's number of routed experts */
    int group;          /* slot of the first linear that reads the same input */
    bool own_input;     /* each instance reads its own input, even in calibration */
    bool quantize;      /* the quantizer converts it (false: copied as it is) */
} sq_lin_desc;

#define SQ_LAYER_MAX_SLOTS 32

typedef struct sq_layer_desc {
    int n_slots;
    bool moe;           /* has routed experts */
    int n_experts;      /* routed experts (0 without) */
    sq_lin_desc slot[SQ_LAYER_MAX_SLOTS];
} sq_layer_desc;

/* The tensors of an architecture that are not layer slots: norms, the
 * embedding table, the head. Their sizes are named, and resolved from the
 * config (sq_dim_size). */
typedef enum sq_dim { SQ_DIM_NONE = 0, SQ_DIM_HIDDEN, SQ_DIM_HEAD_DIM, SQ_DIM_VOCAB } sq_dim;

/* Where such a tensor lives: in every layer ("{L}" in its key), with the
 * embeddings (the first node of a bundle), or with the head (the last node). */
typedef enum sq_tensor_place { SQ_PLACE_LAYER = 0, SQ_PLACE_EMBED, SQ_PLACE_HEAD } sq_tensor_place;

typedef struct sq_tensor_desc {
    const char *key;       /* the tensor's name, "{L}" for the layer ("model.layers.{L}.input_layernorm.weight");
                              for a linear its key without the suffix ("lm_head") */
    sq_tensor_place place;
    int ndim;              /* 1 or 2 */
    sq_dim dim[2];         /* [dim0] or [dim0, dim1] ([out, in] for a linear) */
    bool linear;           /* stored as a linear: "<key>.weight" (dense, FP8, MXFP4) or EXL3 "<key>.trellis" ... */
    bool tied;             /* may be absent when tie_word_embeddings: the embedding stands in */
} sq_tensor_desc;

/* A tensor of one layer with its concrete shape, for tensors whose presence
 * or shape depends on the layer (sq_arch_info.layer_tensors). */
typedef struct sq_tensor_shape {
    char key[160];       /* full tensor name, e.g. "layers.2.attn.compressor.norm.weight" */
    int ndim;            /* 1 or 2 */
    uint64_t shape[2];
} sq_tensor_shape;

#define SQ_LAYER_MAX_TENSORS 48

typedef struct sq_graph_ops sq_graph_ops; /* runtime/models/model_impl.h */

typedef struct sq_arch_info {
    sq_arch id;
    const char *model_type;   /* config.json's model_type */
    const char *layer_prefix; /* tensor keys of layer L start "<prefix>L." */
    /* tensor keys without ".weight": the embedding matrix, the output head
     * linear, the final norm */
    const char *embed_key, *head_key, *norm_key;
    /* Refuse a config whose sizes this architecture cannot run (message
     * names dir); NULL: no check. */
    sparq_status (*check)(const sq_model_config *cfg, const char *dir);
    /* Describe layer L (0 ≤ L < num_hidden_layers) from the config alone.
     * SPARQ_E_FORMAT when the config cannot describe it. */
    sparq_status (*layer)(const sq_model_config *cfg, int layer, sq_layer_desc *out);
    /* Every tensor it reads besides the layers' slots (per-layer norms, the
     * embedding, the final norm, the head): sq_arch_check_tensors checks them. */
    const sq_tensor_desc *tensors;
    int n_tensors;
    /* The tensors of layer L besides its slots that vary with the layer, with
     * their shapes (at most SQ_LAYER_MAX_TENSORS written to out; returns the
     * count); NULL: none. */
    int (*layer_tensors)(const sq_model_config *cfg, int layer, sq_tensor_shape *out);
    /* Prefixes of tensor names a checkpoint ships that this architecture
     * does not read (NULL-terminated; NULL: none): DeepSeek's MTP stages and
     * vision tower. They are skipped, and `inspect` says so. */
    const char *const *skipped_prefixes;
    /* Floats of one row of hidden state between layers (what embed writes,
     * forward_layer transforms, head reads, and pipeline nodes exchange);
     * NULL: hidden_size. */
    int64_t (*hidden_width)(const sq_model_config *cfg);
    /* May a pipeline node start at layer L (0 < L < layers)? false when a
     * layer at or after L reads the cache of one before it (DeepSeek V4.1's
     * compressed pools and indexer selections); NULL: every cut is allowed. */
    bool (*split_ok)(const sq_model_config *cfg, int layer);
    /* forward_layer needs a sequence (seq >= 0): later layers read caches earlier layers wrote for
     * the same rows (V4.1's pools and selections), so calibration runs every calibration row in a
     * cache slot of its own, one set for the reference path and one for the quantized path. */
    bool calib_per_seq;
    /* The graph runs the expert split (`--split experts`, runtime/dist/dist.h):
     * its MoE computes only the routed experts the process holds and hands the
     * partial sum to the combine hook (sq_moe_layer.own_n / combine); false:
     * plan, pack and load refuse that split, saying expert_split_why. */
    bool expert_split;
    const char *expert_split_why;
    /* The quantizer's default bits by tensor key, "GLOB=K" lines (NULL-terminated; NULL: none),
     * applied after its role rule (experts --bits, attention +2, dense and shared MLP +1) and
     * before the user's --recipe and --bits-for, last match winning. */
    const char *const *default_bits;
    /* The memory its graph allocates (runtime/memplan.h documents the terms). */
    /* KV cache of the layers [first, first + n_layers) */
    uint64_t (*kv_bytes)(const sq_model_config *cfg, int64_t first, int64_t n_layers, const sq_memplan_params *p);
    void (*workspace_terms)(const sq_model_config *cfg, const sq_memplan_params *p, bool has_head,
                            sq_memplan_workspace *out);
    const sq_graph_ops *graph; /* the forward pass (runtime/models/) */
} sq_arch_info;

/* The architecture of a config (its `arch`), or NULL when sparq has none. */
const sq_arch_info *sq_arch_of(const sq_model_config *cfg);

/* Layer L of the config's architecture; SPARQ_E_UNSUPPORTED for an
 * architecture sparq does not know, SPARQ_E_RANGE for L out of range. */
sparq_status sq_arch_layer(const sq_model_config *cfg, int layer, sq_layer_desc *out);

/* The slot called `name` in d, or -1. */
int sq_layer_find(const sq_layer_desc *d, const char *name);

/* buf = the tensor key of instance `inst` of slot `lin` in layer L (without
 * ".weight" / ".trellis"); SPARQ_E_RANGE if it does not fit in n bytes. */
sparq_status sq_lin_key(const sq_lin_desc *lin, int layer, int inst, char *buf, size_t n);

/* Does `key` (a tensor key without its suffix) name a linear the quantizer
 * converts? Walks the layers' descriptions; *layer gets its layer (or -1).
 * The head is not a layer linear: false for it. */
bool sq_arch_is_quant_linear(const sq_model_config *cfg, const char *key, int *layer);
/* The same, and *role (may be NULL) gets its slot's role. */
bool sq_arch_quant_linear_role(const sq_model_config *cfg, const char *key, int *layer, sq_lin_role *role);

/* The prefix of arch's skipped_prefixes that `name` starts with, or NULL. */
const char *sq_arch_skipped(const sq_model_config *cfg, const char *name);

/* sq_arch_info.split_ok, true when the architecture has none. */
bool sq_arch_split_ok(const sq_model_config *cfg, int layer);

/* Floats per row of hidden state (sq_arch_info.hidden_width; hidden_size by default). */
int64_t sq_arch_hidden_width(const sq_model_config *cfg);

/* The size `dim` stands for in cfg (0 for SQ_DIM_NONE). */
int64_t sq_dim_size(const sq_model_config *cfg, sq_dim dim);

/* --- does a checkpoint hold what its config describes? ----------------------- */

/* What one process reads of a checkpoint: layers [first, end), the tensors
 * placed with the embeddings and those placed with the head; no_engram: a
 * bundle node, whose Engram tables are in its engram/ file, not its shard. */
typedef struct sq_arch_scope {
    int first, end;
    bool embed, head;
    bool no_engram;
    int own_n, own_k; /* the expert split: only routed experts e with e % own_n == own_k (own_n <= 1: all) */
} sq_arch_scope;

/* Does a process holding the routed experts e % own_n == own_k (own_n <= 1:
 * all) hold instance e of slot l? Every instance of a slot that is not a
 * routed expert. */
static inline bool sq_arch_holds_instance(const sq_lin_desc *l, int e, int own_n, int own_k)
{
    return l->role != SQ_ROLE_EXPERT || own_n <= 1 || e % own_n == own_k;
}

/* Every problem found, one line each ("model.safetensors: tensor '...': shape
 * [256, 2048], expected [2048, 256]"); at most SQ_ARCH_PROBLEMS_KEPT are kept,
 * n counts all. */
#define SQ_ARCH_PROBLEMS_KEPT 200
typedef struct sq_arch_problems {
    size_t n;
    char **line;
    size_t n_lines;
} sq_arch_problems;
void sq_arch_problems_free(sq_arch_problems *p);

/* Check the tensors of `sf` (headers only: names, dtypes, shapes; no data is
 * read, so `sparq plan` can run it) against the config's architecture, for
 * what `scope` reads (NULL: the whole model):
 *  - the architecture's own check of the config sizes (sq_arch_info.check);
 *  - every slot instance of every layer in scope: a dense / FP8 / MXFP4
 *    "<key>.weight" of shape [out, in] (formats/weights.h), or an EXL3 linear
 *    ("<key>.trellis" I16 [in/16, out/16, 16·K] with ".suh" F16 [in] and
 *    ".svh" F16 [out]);
 *  - the architecture's other tensors (sq_arch_info.tensors) with their shapes;
 *  - no tensor left unused: one of a layer at or beyond num_hidden_layers, of
 *    a layer outside the scope, or one the architecture does not describe is
 *    a problem. (Engram tables belong to the bundle format: `sparq pack`
 *    checks them, here they are ignored.)
 * A layer in scope without a single tensor is one problem ("layers 4..999
 * have no tensors"), not one per missing tensor. Returns SPARQ_OK, or the
 * status of the first problem (SPARQ_E_NOTFOUND, SPARQ_E_SHAPE,
 * SPARQ_E_FORMAT) with a message "<where>: config.json and the tensors
 * disagree (N problems): <the first few>". `report` (may be NULL) gets every
 * problem; free it with sq_arch_problems_free. */
sparq_status sq_arch_check_tensors(const sq_model_config *cfg, const sf_model *sf, const sq_arch_scope *scope,
                                   const char *where, sq_arch_problems *report);

#endif
