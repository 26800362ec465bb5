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
#include "runtime/memplan.h"

/* What a linear does in its layer: decides its default bits and whether the
 * quantizer touches it at all. */
typedef enum sq_lin_role {
    SQ_ROLE_ATTN = 0, /* attention projections */
    SQ_ROLE_ROUTER,   /* MoE router: kept as it is, never quantized */
    SQ_ROLE_EXPERT,   /* routed expert: one instance per expert */
    SQ_ROLE_SHARED,   /* shared expert of a MoE layer */
    SQ_ROLE_MLP,      /* dense MLP of a layer without experts */
    SQ_ROLE_COUNT_
} sq_lin_role;

/* "attn", "router", "expert", "shared", "mlp". */
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
    /* The memory its graph allocates (runtime/memplan.h documents the terms). */
    uint64_t (*kv_bytes)(const sq_model_config *cfg, int64_t n_layers, const sq_memplan_params *p);
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

#endif
