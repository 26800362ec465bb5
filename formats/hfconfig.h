/* formats/hfconfig.h — Hugging Face `config.json` → the model description the
 * forward pass, the quantizer and the packer read.
 *
 * Only architectures sparq can run are accepted (`qwen3_moe`,
 * `deepseek_v41` — whose sizes are read from `text_config`); any
 * other `model_type` is SPARQ_E_UNSUPPORTED with a message that lists the
 * supported ones. The sizes that fix the tensors' shapes — vocab_size,
 * hidden_size, num_hidden_layers, num_attention_heads — must be present
 * (transformers' defaults for them describe one particular model, not the
 * checkpoint at hand); other missing fields take exactly the defaults
 * transformers' Qwen3MoeConfig has. Whether the config fits the tensors is
 * checked against the checkpoint by runtime/arch.h (sq_arch_check_tensors). Both config styles are read: transformers 4.x
 * (`num_experts`, `rope_theta`) and 5.x (`num_local_experts`,
 * `rope_parameters: {rope_theta, rope_type}`); when both are present they
 * must agree. An EXL3 or FP8 `quantization_config` is parsed when present.
 *
 * JSON is parsed with duplicate keys rejected (formats/json.h). */
#ifndef SPARQ_FORMATS_HFCONFIG_H
#define SPARQ_FORMATS_HFCONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum sq_arch {
    SQ_ARCH_UNKNOWN = 0,
    SQ_ARCH_QWEN3_MOE,    /* "qwen3_moe" */
    SQ_ARCH_DEEPSEEK_V41, /* "deepseek_v41" (DeepSeek V4.1 Flash, native release layout) */
    SQ_ARCH_COUNT_
} sq_arch;

/* "qwen3_moe", ... ("unknown" for SQ_ARCH_UNKNOWN). Never NULL. */
const char *sq_arch_name(sq_arch a);

/* Storage dtype the checkpoint declares (`dtype` in transformers 5,
 * `torch_dtype` in 4.x). */
typedef enum sq_torch_dtype {
    SQ_DTYPE_UNSPECIFIED = 0,
    SQ_DTYPE_FLOAT32,
    SQ_DTYPE_FLOAT16,
    SQ_DTYPE_BFLOAT16,
} sq_torch_dtype;

#define SQ_MAX_EOS_IDS 16

/* quantization_config: EXL3 (reference.md §1.4) or FP8 (DeepSeek V3 / V4.x
 * as shipped, reference.md §3.1). `present` is false when the config has no
 * quantization_config; other quant methods are rejected (SPARQ_E_UNSUPPORTED
 * naming the ones accepted). The fields of the other method stay zero. */
typedef struct sq_quant_config {
    bool present;
    char quant_method[16];  /* "exl3" or "fp8" */
    /* --- exl3 --- */
    char version[32];       /* exllamav3 / sparq version that wrote it ("" if absent) */
    double bits;            /* expert base bits per weight, e.g. 3.0 */
    double head_bits;       /* lm_head bits (0 if absent) */
    int calibration_rows;   /* 0 if absent */
    int calibration_cols;   /* 0 if absent */
    char out_scales[16];    /* "always", "never", "auto" or "" */
    char codebook[16];      /* "mul1", "mcg", "3inst" ("" if absent: mul1 is exllamav3's default) */
    /* --- fp8: {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32],
     *          "scale_fmt": "ue8m0", "activation_scheme": "dynamic", "expert_dtype": "fp4"} --- */
    char fmt[16];               /* "e4m3" (the only FP8 format accepted) or "" if absent */
    int weight_block_size[2];   /* an FP8 weight's scale block [rows, cols] (V4.1 32×32, V3 128×128);
                                   {0, 0} if absent: inferred from each scale's shape (formats/weights.h) */
    char scale_fmt[16];         /* "ue8m0", or "" if absent (DeepSeek V3: fp32 weight_scale_inv) */
    char activation_scheme[16]; /* "dynamic" (activations stay fp32 here) or "" if absent */
    char expert_dtype[16];      /* "fp4" (V4.1: routed experts MXFP4), "fp8", or "" if absent */
} sq_quant_config;

/* DeepSeek V4.1 (`deepseek_v41`, reference.md §3.1–3.2): the fields of
 * config.json's `text_config` that the generic part above does not hold.
 * Per-layer lists are indexed by layer; id lists are sorted and checked. */
#define SQ_V41_MAX_LAYERS 128
#define SQ_V41_MAX_ENGRAM 8
typedef struct sq_v41_config {
    int q_lora_rank;             /* wq_a output (1280) */
    int o_groups, o_lora_rank;   /* grouped low-rank output (8, 1024) */
    int rope_dim;                /* qk_rope_head_dim: the roped tail of each head (64) */
    int window;                  /* sliding_window (128) */
    double compress_rope_theta;  /* RoPE base of compressing layers (160000) */
    /* YaRN (rope_scaling, rope_type "yarn"): applies to compressing layers when
     * max_position_embeddings > original_max_position_embeddings */
    double rope_factor, beta_fast, beta_slow;
    int64_t rope_original;       /* original_max_position_embeddings; 0: no YaRN */
    int8_t compress_ratio[SQ_V41_MAX_LAYERS]; /* 0: window only; r: KV pooled r-to-1 */
    bool kv_source[SQ_V41_MAX_LAYERS];        /* has a compressor (kv_source_layer_ids) */
    bool index_source[SQ_V41_MAX_LAYERS];     /* has an indexer (index_source_layer_ids) */
    int candidate_source;        /* candidate_source_layer_id, -1: none */
    int candidate_topk_blocks, candidate_block_size;
    int index_n_heads, index_head_dim, index_topk;
    int hc_mult, hc_sinkhorn_iters; /* hyper-connection streams (4), Sinkhorn iterations (20) */
    double hc_eps;
    int n_shared_experts;
    double routed_scaling_factor; /* 1.5 */
    double swiglu_limit;          /* gate <= limit, up in [-limit, limit]; 0: no clamp */
    int num_nextn_predict_layers; /* mtp.* stages: loaded and ignored */
    /* Engram (§3.1) */
    int n_engram;                 /* tables: len(engram_layer_ids) */
    int engram_layer[SQ_V41_MAX_ENGRAM];
    uint64_t engram_rows[SQ_V41_MAX_ENGRAM]; /* engram_num_embeddings */
    int engram_max_ngram, engram_n_heads, engram_head_dim;
    int64_t engram_vocab_size;    /* base bucket count: the primes are the consecutive primes >= it */
    int64_t engram_pad_id;        /* compressed pad id (2) */
    int64_t engram_compressed_vocab; /* engram_compressed_vocab_size (99092), 0 if absent */
} sq_v41_config;

typedef struct sq_model_config {
    sq_arch arch;
    char model_type[32];          /* as written in config.json */

    int64_t vocab_size;           /* required */
    int64_t hidden_size;          /* required */
    int64_t num_hidden_layers;    /* required */
    int64_t num_attention_heads;  /* required */
    int64_t num_key_value_heads;  /* default 4 */
    int64_t head_dim;             /* default hidden_size / num_attention_heads */
    int64_t intermediate_size;    /* dense MLP (mlp_only_layers), default 6144 */
    int64_t max_position_embeddings; /* default 32768 */

    /* MoE */
    int64_t moe_intermediate_size; /* default 768 */
    int64_t num_experts;           /* `num_experts` or `num_local_experts`, default 128 */
    int64_t num_experts_per_tok;   /* default 8 */
    bool norm_topk_prob;           /* default false */
    int64_t decoder_sparse_step;   /* default 1 */
    int64_t *mlp_only_layers;      /* sorted, owned; NULL when n == 0 */
    int n_mlp_only_layers;         /* default 0 (empty list) */

    double rms_norm_eps;           /* default 1e-6 */
    double rope_theta;             /* default 10000.0 */
    char rope_type[16];            /* "default" (the only one supported so far) */

    bool tie_word_embeddings;      /* default false */
    bool attention_bias;           /* default false */
    bool use_sliding_window;       /* default false; true is rejected (unsupported) */
    char hidden_act[16];           /* default "silu" (the only one supported) */

    int64_t bos_token_id;          /* -1 = null / absent (transformers default None) */
    int64_t pad_token_id;          /* -1 = null / absent */
    int64_t eos_token_ids[SQ_MAX_EOS_IDS]; /* eos may be an int or a list */
    int n_eos_token_ids;           /* 0 = null / absent */

    sq_torch_dtype torch_dtype;

    sq_quant_config quant;
    sq_v41_config v41;             /* arch == SQ_ARCH_DEEPSEEK_V41 only */
} sq_model_config;

/* Load `<dir>/config.json`, or the given .json file. On success *cfg is
 * filled and must be released with sq_config_free. On failure *cfg is left
 * zeroed (sq_config_free is still safe) and the message names the file and
 * the field. */
sparq_status sq_config_load(sq_model_config *cfg, const char *model_dir_or_config_json);

/* The same from an in-memory JSON text of `len` bytes (need not be NUL
 * terminated). `name` is used in messages. Fuzz target entry point. */
sparq_status sq_config_parse_json(sq_model_config *cfg, const char *json, size_t len, const char *name);

/* Release what sq_config_load allocated and zero *cfg. NULL-safe. */
void sq_config_free(sq_model_config *cfg);

/* transformers' rule: layer L uses the sparse MoE block iff
 * L is not in mlp_only_layers, num_experts > 0 and (L + 1) % decoder_sparse_step == 0.
 * Other layers use the dense MLP of width intermediate_size. */
bool sq_config_is_moe_layer(const sq_model_config *cfg, int64_t layer);

/* Short alias, as the brief names it. */
static inline bool is_moe_layer(const sq_model_config *cfg, int64_t layer)
{
    return sq_config_is_moe_layer(cfg, layer);
}

/* Parameter counts from the config alone (weights only, the model's
 * nn.Parameters: embeddings, attention with q/k norms, router, experts or
 * dense MLPs, norms, lm_head unless tied). `active` counts what one token
 * touches: every non-expert parameter plus num_experts_per_tok experts per
 * MoE layer. The embedding matrix is counted in both (a lookup). */
void sq_config_param_counts(const sq_model_config *cfg, uint64_t *total, uint64_t *active);

#endif
