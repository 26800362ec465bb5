/* formats/hfconfig.c — config.json → sq_model_config (see hfconfig.h).
 *
 * Outline: parse with duplicate keys rejected, dispatch on model_type, fill
 * the transformers defaults, read every known field with type checks, then
 * validate the whole description (positive sizes, heads divide, top-k within
 * the expert count, layer indices in range) so later code can trust it. */
#include "formats/hfconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/json.h"

/* config.json files are a few KB; anything near this is not a config. */
#define SQ_CONFIG_MAX_BYTES (16u << 20)

static const char *const arch_names_[SQ_ARCH_COUNT_] = {"unknown", "qwen3_moe", "deepseek_v41"};
static const char supported_list_[] = "qwen3_moe, deepseek_v41";

const char *sq_arch_name(sq_arch a)
{
    return (a > SQ_ARCH_UNKNOWN && a < SQ_ARCH_COUNT_) ? arch_names_[a] : arch_names_[0];
}

void sq_config_free(sq_model_config *cfg)
{
    if (!cfg) return;
    sparq_free(cfg->mlp_only_layers);
    memset(cfg, 0, sizeof *cfg);
}

bool sq_config_is_moe_layer(const sq_model_config *cfg, int64_t layer)
{
    /* mlp_only_layers is sorted on load: binary search */
    int lo = 0, hi = cfg->n_mlp_only_layers;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (cfg->mlp_only_layers[mid] == layer) return false;
        if (cfg->mlp_only_layers[mid] < layer) lo = mid + 1;
        else hi = mid;
    }
    return cfg->num_experts > 0 && cfg->decoder_sparse_step > 0 && (layer + 1) % cfg->decoder_sparse_step == 0;
}

/* Qwen3MoeConfig's defaults (transformers 4.51 .. 5.x). */
static void qwen3_moe_defaults(sq_model_config *c)
{
    c->arch = SQ_ARCH_QWEN3_MOE;
    c->vocab_size = 151936;
    c->hidden_size = 2048;
    c->intermediate_size = 6144;
    c->num_hidden_layers = 24;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 4;
    c->head_dim = 0; /* filled after reading: hidden_size / num_attention_heads */
    c->max_position_embeddings = 32768;
    c->moe_intermediate_size = 768;
    c->num_experts = 128;
    c->num_experts_per_tok = 8;
    c->norm_topk_prob = false;
    c->decoder_sparse_step = 1;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    strcpy(c->rope_type, "default");
    c->tie_word_embeddings = false;
    c->attention_bias = false;
    c->use_sliding_window = false;
    strcpy(c->hidden_act, "silu");
    c->bos_token_id = -1;
    c->pad_token_id = -1;
    c->n_eos_token_ids = 0;
    c->torch_dtype = SQ_DTYPE_UNSPECIFIED;
}

static bool member_present(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v);
}

/* A token id: int or null (→ -1). */
static sparq_status read_token_id(const json_t *root, const char *key, int64_t *out, const char *name)
{
    *out = -1;
    FORWARD_IF(sq_json_get_int(root, key, out, name));
    RETURN_IF(*out < -1, SPARQ_E_FORMAT, "%s: '%s' is %lld, a token id must be >= 0", name, key, (long long)*out);
    return SPARQ_OK;
}

static sparq_status read_eos(sq_model_config *c, const json_t *root, const char *name)
{
    const json_t *v = json_object_get(root, "eos_token_id");
    c->n_eos_token_ids = 0;
    if (!v || json_is_null(v)) return SPARQ_OK;
    if (json_is_integer(v)) {
        RETURN_IF(json_integer_value(v) < 0, SPARQ_E_FORMAT, "%s: 'eos_token_id' is negative", name);
        c->eos_token_ids[c->n_eos_token_ids++] = json_integer_value(v);
        return SPARQ_OK;
    }
    RETURN_IF(!json_is_array(v), SPARQ_E_FORMAT, "%s: 'eos_token_id' must be an integer or a list of integers",
              name);
    RETURN_IF(json_array_size(v) > SQ_MAX_EOS_IDS, SPARQ_E_UNSUPPORTED,
              "%s: 'eos_token_id' lists %zu ids, at most %d are supported", name, json_array_size(v),
              SQ_MAX_EOS_IDS);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e)
    {
        RETURN_IF(!json_is_integer(e) || json_integer_value(e) < 0, SPARQ_E_FORMAT,
                  "%s: 'eos_token_id'[%zu] must be a non-negative integer", name, i);
        c->eos_token_ids[c->n_eos_token_ids++] = json_integer_value(e);
    }
    return SPARQ_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static sparq_status read_mlp_only_layers(sq_model_config *c, const json_t *root, const char *name)
{
    const json_t *v = json_object_get(root, "mlp_only_layers");
    if (!v || json_is_null(v)) return SPARQ_OK;
    RETURN_IF(!json_is_array(v), SPARQ_E_FORMAT, "%s: 'mlp_only_layers' must be a list of layer indices", name);
    size_t n = json_array_size(v);
    if (n == 0) return SPARQ_OK;
    RETURN_IF(n > 1u << 20, SPARQ_E_FORMAT, "%s: 'mlp_only_layers' has %zu entries", name, n);
    c->mlp_only_layers = sparq_calloc(n, sizeof *c->mlp_only_layers);
    RETURN_IF(!c->mlp_only_layers, SPARQ_E_NOMEM, "%s: out of memory", name);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e)
    {
        RETURN_IF(!json_is_integer(e), SPARQ_E_FORMAT, "%s: 'mlp_only_layers'[%zu] must be an integer", name, i);
        c->mlp_only_layers[i] = json_integer_value(e);
    }
    c->n_mlp_only_layers = (int)n;
    qsort(c->mlp_only_layers, n, sizeof *c->mlp_only_layers, cmp_i64);
    return SPARQ_OK;
}

/* rope_theta (4.x) and/or rope_parameters {rope_theta, rope_type} (5.x);
 * a 4.x rope_scaling object carries a non-default type. */
static sparq_status read_rope(sq_model_config *c, const json_t *root, const char *name)
{
    double top = 0;
    bool has_top = member_present(root, "rope_theta");
    FORWARD_IF(sq_json_get_double(root, "rope_theta", &top, name));
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && json_is_null(rp)) rp = NULL;
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && json_is_null(rs)) rs = NULL;
    if (has_top) c->rope_theta = top;
    for (int pass = 0; pass < 2; pass++) {
        const json_t *o = pass == 0 ? rp : rs;
        const char *key = pass == 0 ? "rope_parameters" : "rope_scaling";
        if (!o) continue;
        RETURN_IF(!json_is_object(o), SPARQ_E_FORMAT, "%s: '%s' must be an object", name, key);
        char type[sizeof c->rope_type] = "default";
        FORWARD_IF(sq_json_get_str(o, "type", type, sizeof type, name));
        FORWARD_IF(sq_json_get_str(o, "rope_type", type, sizeof type, name));
        RETURN_IF(strcmp(type, "default") != 0, SPARQ_E_UNSUPPORTED,
                  "%s: %s.rope_type '%s' is not supported (supported: default)", name, key, type);
        if (member_present(o, "rope_theta")) {
            double t = 0;
            FORWARD_IF(sq_json_get_double(o, "rope_theta", &t, name));
            RETURN_IF(has_top && t != top, SPARQ_E_FORMAT,
                      "%s: rope_theta %g and %s.rope_theta %g disagree", name, top, key, t);
            c->rope_theta = t;
        }
    }
    RETURN_IF(!(c->rope_theta > 0), SPARQ_E_FORMAT, "%s: rope_theta must be positive", name);
    return SPARQ_OK;
}

static sparq_status read_dtype(sq_model_config *c, const json_t *root, const char *name)
{
    char s[32] = "";
    FORWARD_IF(sq_json_get_str(root, "torch_dtype", s, sizeof s, name));
    FORWARD_IF(sq_json_get_str(root, "dtype", s, sizeof s, name));
    if (!s[0] || !strcmp(s, "auto")) c->torch_dtype = SQ_DTYPE_UNSPECIFIED;
    else if (!strcmp(s, "bfloat16")) c->torch_dtype = SQ_DTYPE_BFLOAT16;
    else if (!strcmp(s, "float16") || !strcmp(s, "half")) c->torch_dtype = SQ_DTYPE_FLOAT16;
    else if (!strcmp(s, "float32") || !strcmp(s, "float")) c->torch_dtype = SQ_DTYPE_FLOAT32;
    else
        return sparq_err(SPARQ_E_UNSUPPORTED, "%s: dtype '%s' is not supported (bfloat16, float16, float32)", name, s);
    return SPARQ_OK;
}

/* A string member of quantization_config that must be absent or one of `ok`
 * (NULL-terminated). */
static sparq_status read_quant_word(const json_t *o, const char *key, char *buf, size_t cap,
                                    const char *const *ok, const char *name)
{
    FORWARD_IF(sq_json_get_str(o, key, buf, cap, name));
    if (!buf[0]) return SPARQ_OK;
    char list[128] = "";
    for (int i = 0; ok[i]; i++) {
        if (!strcmp(buf, ok[i])) return SPARQ_OK;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", ok[i]);
    }
    return sparq_err(SPARQ_E_UNSUPPORTED, "%s: quantization_config.%s '%s' is not supported (supported: %s)", name,
                     key, buf, list);
}

/* DeepSeek's FP8 quantization_config (reference.md §3.1). */
static sparq_status read_quant_fp8(sq_quant_config *q, const json_t *o, const char *name)
{
    static const char *const fmts[] = {"e4m3", NULL}, *const scales[] = {"ue8m0", NULL};
    static const char *const acts[] = {"dynamic", NULL}, *const experts[] = {"fp4", "fp8", NULL};
    FORWARD_IF(read_quant_word(o, "fmt", q->fmt, sizeof q->fmt, fmts, name));
    FORWARD_IF(read_quant_word(o, "scale_fmt", q->scale_fmt, sizeof q->scale_fmt, scales, name));
    FORWARD_IF(read_quant_word(o, "activation_scheme", q->activation_scheme, sizeof q->activation_scheme, acts, name));
    FORWARD_IF(read_quant_word(o, "expert_dtype", q->expert_dtype, sizeof q->expert_dtype, experts, name));
    const json_t *b = json_object_get(o, "weight_block_size");
    if (!b || json_is_null(b)) return SPARQ_OK;
    RETURN_IF(!json_is_array(b) || json_array_size(b) != 2, SPARQ_E_FORMAT,
              "%s: quantization_config.weight_block_size must be a list of two integers [rows, cols]", name);
    for (size_t i = 0; i < 2; i++) {
        const json_t *e = json_array_get(b, i);
        RETURN_IF(!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > 1 << 16,
                  SPARQ_E_FORMAT, "%s: quantization_config.weight_block_size[%zu] must be an integer in 1..65536",
                  name, i);
        q->weight_block_size[i] = (int)json_integer_value(e);
    }
    return SPARQ_OK;
}

static sparq_status read_quant(sq_quant_config *q, const json_t *root, const char *name)
{
    const json_t *o = json_object_get(root, "quantization_config");
    if (!o || json_is_null(o)) return SPARQ_OK;
    RETURN_IF(!json_is_object(o), SPARQ_E_FORMAT, "%s: 'quantization_config' must be an object", name);
    q->present = true;
    FORWARD_IF(sq_json_get_str(o, "quant_method", q->quant_method, sizeof q->quant_method, name));
    if (!strcmp(q->quant_method, "fp8")) return read_quant_fp8(q, o, name);
    RETURN_IF(strcmp(q->quant_method, "exl3") != 0, SPARQ_E_UNSUPPORTED,
              "%s: quantization_config.quant_method '%s' is not supported (supported: exl3, fp8)", name,
              q->quant_method);
    FORWARD_IF(sq_json_get_str(o, "version", q->version, sizeof q->version, name));
    FORWARD_IF(sq_json_get_double(o, "bits", &q->bits, name));
    FORWARD_IF(sq_json_get_double(o, "head_bits", &q->head_bits, name));
    FORWARD_IF(sq_json_get_str(o, "out_scales", q->out_scales, sizeof q->out_scales, name));
    FORWARD_IF(sq_json_get_str(o, "codebook", q->codebook, sizeof q->codebook, name));
    RETURN_IF(!(q->bits >= 1 && q->bits <= 8), SPARQ_E_FORMAT,
              "%s: quantization_config.bits %g is not in [1, 8]", name, q->bits);
    RETURN_IF(!(q->head_bits >= 0 && q->head_bits <= 16), SPARQ_E_FORMAT,
              "%s: quantization_config.head_bits %g is out of range", name, q->head_bits);
    RETURN_IF(q->codebook[0] && strcmp(q->codebook, "mul1") && strcmp(q->codebook, "mcg") &&
                  strcmp(q->codebook, "3inst"),
              SPARQ_E_UNSUPPORTED, "%s: quantization_config.codebook '%s' is not supported (mul1, mcg, 3inst)",
              name, q->codebook);
    const json_t *cal = json_object_get(o, "calibration");
    if (cal && !json_is_null(cal)) {
        RETURN_IF(!json_is_object(cal), SPARQ_E_FORMAT, "%s: quantization_config.calibration must be an object",
                  name);
        int64_t rows = 0, cols = 0;
        FORWARD_IF(sq_json_get_int(cal, "rows", &rows, name));
        FORWARD_IF(sq_json_get_int(cal, "cols", &cols, name));
        RETURN_IF(rows < 0 || rows > 1 << 30 || cols < 0 || cols > 1 << 30, SPARQ_E_FORMAT,
                  "%s: quantization_config.calibration rows/cols out of range", name);
        q->calibration_rows = (int)rows;
        q->calibration_cols = (int)cols;
    }
    return SPARQ_OK;
}

/* An integer field that must lie in [lo, hi]. */
static sparq_status read_dim(const json_t *root, const char *key, int64_t *v, int64_t lo, int64_t hi, const char *name)
{
    FORWARD_IF(sq_json_get_int(root, key, v, name));
    RETURN_IF(*v < lo || *v > hi, SPARQ_E_FORMAT, "%s: '%s' is %lld, expected %lld..%lld", name, key,
              (long long)*v, (long long)lo, (long long)hi);
    return SPARQ_OK;
}

static sparq_status parse_qwen3_moe(sq_model_config *c, const json_t *root, const char *name)
{
    const int64_t big = (int64_t)1 << 31;
    qwen3_moe_defaults(c);
    FORWARD_IF(read_dim(root, "vocab_size", &c->vocab_size, 1, big, name));
    FORWARD_IF(read_dim(root, "hidden_size", &c->hidden_size, 1, big, name));
    FORWARD_IF(read_dim(root, "intermediate_size", &c->intermediate_size, 1, big, name));
    FORWARD_IF(read_dim(root, "num_hidden_layers", &c->num_hidden_layers, 1, 1 << 20, name));
    FORWARD_IF(read_dim(root, "num_attention_heads", &c->num_attention_heads, 1, 1 << 20, name));
    FORWARD_IF(read_dim(root, "num_key_value_heads", &c->num_key_value_heads, 1, 1 << 20, name));
    FORWARD_IF(read_dim(root, "max_position_embeddings", &c->max_position_embeddings, 1, big, name));
    FORWARD_IF(read_dim(root, "moe_intermediate_size", &c->moe_intermediate_size, 1, big, name));

    /* num_experts (4.x) and num_local_experts (5.x, attribute_map'ed) must agree. */
    int64_t ne = -1, nle = -1;
    FORWARD_IF(read_dim(root, "num_experts", &ne, -1, 1 << 20, name));
    FORWARD_IF(read_dim(root, "num_local_experts", &nle, -1, 1 << 20, name));
    RETURN_IF(ne >= 0 && nle >= 0 && ne != nle, SPARQ_E_FORMAT,
              "%s: num_experts %lld and num_local_experts %lld disagree", name, (long long)ne, (long long)nle);
    if (ne >= 0) c->num_experts = ne;
    if (nle >= 0) c->num_experts = nle;
    FORWARD_IF(read_dim(root, "num_experts_per_tok", &c->num_experts_per_tok, 0, 1 << 20, name));
    FORWARD_IF(read_dim(root, "decoder_sparse_step", &c->decoder_sparse_step, 1, 1 << 20, name));
    FORWARD_IF(sq_json_get_bool(root, "norm_topk_prob", &c->norm_topk_prob, name));
    FORWARD_IF(read_mlp_only_layers(c, root, name));

    c->head_dim = 0;
    FORWARD_IF(read_dim(root, "head_dim", &c->head_dim, 0, 1 << 20, name));
    if (c->head_dim == 0) {
        RETURN_IF(c->hidden_size % c->num_attention_heads != 0, SPARQ_E_FORMAT,
                  "%s: no head_dim and hidden_size %lld is not a multiple of num_attention_heads %lld", name,
                  (long long)c->hidden_size, (long long)c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    FORWARD_IF(sq_json_get_double(root, "rms_norm_eps", &c->rms_norm_eps, name));
    RETURN_IF(!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1), SPARQ_E_FORMAT, "%s: rms_norm_eps %g is not in (0, 1)",
              name, c->rms_norm_eps);
    FORWARD_IF(read_rope(c, root, name));
    FORWARD_IF(sq_json_get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, name));
    FORWARD_IF(sq_json_get_bool(root, "attention_bias", &c->attention_bias, name));
    FORWARD_IF(sq_json_get_bool(root, "use_sliding_window", &c->use_sliding_window, name));
    RETURN_IF(c->use_sliding_window, SPARQ_E_UNSUPPORTED, "%s: use_sliding_window true is not supported", name);
    FORWARD_IF(sq_json_get_str(root, "hidden_act", c->hidden_act, sizeof c->hidden_act, name));
    RETURN_IF(strcmp(c->hidden_act, "silu") != 0, SPARQ_E_UNSUPPORTED,
              "%s: hidden_act '%s' is not supported (supported: silu)", name, c->hidden_act);
    FORWARD_IF(read_token_id(root, "bos_token_id", &c->bos_token_id, name));
    FORWARD_IF(read_token_id(root, "pad_token_id", &c->pad_token_id, name));
    FORWARD_IF(read_eos(c, root, name));
    FORWARD_IF(read_dtype(c, root, name));
    FORWARD_IF(read_quant(&c->quant, root, name));

    /* Cross-field checks. */
    RETURN_IF(c->num_attention_heads % c->num_key_value_heads != 0, SPARQ_E_FORMAT,
              "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", name,
              (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    RETURN_IF(c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts),
              SPARQ_E_FORMAT, "%s: num_experts_per_tok %lld must be in 1..num_experts (%lld)", name,
              (long long)c->num_experts_per_tok, (long long)c->num_experts);
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        RETURN_IF(c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->num_hidden_layers, SPARQ_E_FORMAT,
                  "%s: mlp_only_layers entry %lld is not a layer index (0..%lld)", name,
                  (long long)c->mlp_only_layers[i], (long long)c->num_hidden_layers - 1);
    for (int i = 0; i < c->n_eos_token_ids; i++)
        RETURN_IF(c->eos_token_ids[i] >= c->vocab_size, SPARQ_E_FORMAT,
                  "%s: eos_token_id %lld is not below vocab_size %lld", name, (long long)c->eos_token_ids[i],
                  (long long)c->vocab_size);
    /* transformers' defaults for these describe one particular model, not the checkpoint at hand */
    static const char *const required[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        RETURN_IF(!member_present(root, required[i]), SPARQ_E_FORMAT,
                  "%s: no '%s' (vocab_size, hidden_size, num_hidden_layers and num_attention_heads fix the tensors' "
                  "shapes and have no default)", name, required[i]);
    return SPARQ_OK;
}

/* --- DeepSeek V4.1 ------------------------------------------------------------ */

/* A list of integers `key` of obj into out[0..*n) (at most cap), each in [lo, hi]. */
static sparq_status read_int_list(const json_t *obj, const char *key, int64_t *out, int cap, int *n, int64_t lo,
                                  int64_t hi, const char *name)
{
    *n = 0;
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return SPARQ_OK;
    RETURN_IF(!json_is_array(v), SPARQ_E_FORMAT, "%s: text_config.%s must be a list of integers", name, key);
    RETURN_IF(json_array_size(v) > (size_t)cap, SPARQ_E_UNSUPPORTED, "%s: text_config.%s has %zu entries, at most %d "
              "are supported", name, key, json_array_size(v), cap);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e)
    {
        RETURN_IF(!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi, SPARQ_E_FORMAT,
                  "%s: text_config.%s[%zu] must be an integer in %lld..%lld", name, key, i, (long long)lo,
                  (long long)hi);
        out[i] = json_integer_value(e);
    }
    *n = (int)i;
    return SPARQ_OK;
}

/* A sorted list of distinct layer ids into a per-layer flag. */
static sparq_status read_layer_set(const json_t *tc, const char *key, int64_t n_layers, bool *flag, const char *name)
{
    int64_t ids[SQ_V41_MAX_LAYERS];
    int n = 0;
    FORWARD_IF(read_int_list(tc, key, ids, SQ_V41_MAX_LAYERS, &n, 0, n_layers - 1, name));
    for (int i = 0; i < n; i++) {
        RETURN_IF(i && ids[i] <= ids[i - 1], SPARQ_E_FORMAT, "%s: text_config.%s must be increasing layer ids", name,
                  key);
        flag[ids[i]] = true;
    }
    return SPARQ_OK;
}

static sparq_status read_int(const json_t *o, const char *key, int *v, int64_t lo, int64_t hi, const char *name)
{
    int64_t x = *v;
    FORWARD_IF(read_dim(o, key, &x, lo, hi, name));
    *v = (int)x;
    return SPARQ_OK;
}

/* rope_scaling of a V4.1 text_config: absent, or YaRN. */
static sparq_status read_v41_rope(sq_model_config *c, const json_t *tc, const char *name)
{
    FORWARD_IF(sq_json_get_double(tc, "rope_theta", &c->rope_theta, name));
    FORWARD_IF(sq_json_get_double(tc, "compress_rope_theta", &c->v41.compress_rope_theta, name));
    RETURN_IF(!(c->rope_theta > 0) || !(c->v41.compress_rope_theta > 0), SPARQ_E_FORMAT,
              "%s: rope_theta and compress_rope_theta must be positive", name);
    const json_t *rs = json_object_get(tc, "rope_scaling");
    if (!rs || json_is_null(rs)) return SPARQ_OK;
    RETURN_IF(!json_is_object(rs), SPARQ_E_FORMAT, "%s: text_config.rope_scaling must be an object", name);
    char type[16] = "";
    FORWARD_IF(sq_json_get_str(rs, "type", type, sizeof type, name));
    FORWARD_IF(sq_json_get_str(rs, "rope_type", type, sizeof type, name));
    RETURN_IF(strcmp(type, "yarn") != 0, SPARQ_E_UNSUPPORTED,
              "%s: text_config.rope_scaling.rope_type '%s' is not supported (supported: yarn)", name, type);
    snprintf(c->rope_type, sizeof c->rope_type, "yarn");
    FORWARD_IF(sq_json_get_double(rs, "factor", &c->v41.rope_factor, name));
    FORWARD_IF(sq_json_get_double(rs, "beta_fast", &c->v41.beta_fast, name));
    FORWARD_IF(sq_json_get_double(rs, "beta_slow", &c->v41.beta_slow, name));
    FORWARD_IF(read_dim(rs, "original_max_position_embeddings", &c->v41.rope_original, 1, (int64_t)1 << 40, name));
    RETURN_IF(!(c->v41.rope_factor >= 1) || !(c->v41.beta_fast > 0) || !(c->v41.beta_slow > 0), SPARQ_E_FORMAT,
              "%s: text_config.rope_scaling: factor must be >= 1, beta_fast and beta_slow positive", name);
    return SPARQ_OK;
}

/* The released model's values for what may be absent (reference.md §3.2). */
static void v41_defaults(sq_model_config *c)
{
    c->arch = SQ_ARCH_DEEPSEEK_V41;
    sq_v41_config *v = &c->v41;
    c->num_key_value_heads = 1;
    c->max_position_embeddings = 65536;
    c->norm_topk_prob = true;
    c->decoder_sparse_step = 1;
    c->rms_norm_eps = 1e-20;
    c->rope_theta = 10000.0;
    strcpy(c->rope_type, "default");
    strcpy(c->hidden_act, "silu");
    c->bos_token_id = -1;
    c->pad_token_id = -1;
    v->compress_rope_theta = 160000.0;
    v->candidate_source = -1;
    v->hc_sinkhorn_iters = 20;
    v->hc_eps = 1e-6;
    v->n_shared_experts = 1;
    v->routed_scaling_factor = 1.5;
    v->engram_max_ngram = 4;
    v->engram_pad_id = 2;
}

static sparq_status check_v41(const sq_model_config *c, const char *name)
{
    const sq_v41_config *v = &c->v41;
    const int nl = (int)c->num_hidden_layers;
    RETURN_IF(c->num_key_value_heads != 1, SPARQ_E_UNSUPPORTED, "%s: num_key_value_heads %lld: V4.1 attention has "
              "one KV head", name, (long long)c->num_key_value_heads);
    RETURN_IF(c->head_dim % 2 || v->rope_dim % 2 || v->rope_dim > c->head_dim, SPARQ_E_FORMAT,
              "%s: head_dim %lld and qk_rope_head_dim %d must be even, the rope part no larger", name,
              (long long)c->head_dim, v->rope_dim);
    RETURN_IF((c->num_attention_heads * c->head_dim) % v->o_groups, SPARQ_E_FORMAT,
              "%s: o_groups %d does not divide num_attention_heads x head_dim", name, v->o_groups);
    RETURN_IF(c->num_experts_per_tok > c->num_experts, SPARQ_E_FORMAT,
              "%s: num_experts_per_tok %lld exceeds n_routed_experts %lld", name, (long long)c->num_experts_per_tok,
              (long long)c->num_experts);
    int kv = -1, ix = -1; /* latest kv / index source so far */
    for (int L = 0; L < nl; L++) {
        const int r = v->compress_ratio[L];
        if (v->kv_source[L]) kv = L;
        if (v->index_source[L]) ix = L;
        RETURN_IF(!r && (v->kv_source[L] || v->index_source[L]), SPARQ_E_FORMAT,
                  "%s: layer %d has compress ratio 0 but is a kv or index source", name, L);
        if (!r) continue;
        RETURN_IF(kv < 0 || v->compress_ratio[kv] != r, SPARQ_E_FORMAT,
                  "%s: layer %d (compress ratio %d) has no kv source of the same ratio at or before it "
                  "(kv_source_layer_ids)", name, L, r);
        RETURN_IF(ix < 0 || v->compress_ratio[ix] != r, SPARQ_E_FORMAT,
                  "%s: layer %d (compress ratio %d) has no index source of the same ratio at or before it "
                  "(index_source_layer_ids)", name, L, r);
        RETURN_IF(v->candidate_source >= 0 && v->candidate_source < L && v->index_source[L] &&
                      v->compress_ratio[v->candidate_source] != r,
                  SPARQ_E_FORMAT, "%s: index layer %d filters with the candidates of layer %d, whose compress ratio "
                  "differs", name, L, v->candidate_source);
    }
    RETURN_IF(v->candidate_source >= 0 && (v->candidate_source >= nl || !v->index_source[v->candidate_source]),
              SPARQ_E_FORMAT, "%s: candidate_source_layer_id %d is not an index source layer", name,
              v->candidate_source);
    RETURN_IF(v->candidate_source >= 0 && (v->candidate_topk_blocks < 1 || v->candidate_block_size < 1),
              SPARQ_E_FORMAT, "%s: candidate_topk_blocks and candidate_block_size must be positive", name);
    for (int i = 0; i < v->n_engram; i++) {
        RETURN_IF(i && v->engram_layer[i] <= v->engram_layer[i - 1], SPARQ_E_FORMAT,
                  "%s: engram_layer_ids must be increasing", name);
    }
    if (v->n_engram) {
        RETURN_IF(v->engram_max_ngram < 2 || v->engram_max_ngram > 4 || v->engram_n_heads < 1 ||
                      (v->engram_max_ngram - 1) * v->engram_n_heads > 64 || v->engram_head_dim < 32 ||
                      v->engram_head_dim % 32 || v->engram_vocab_size < 2,
                  SPARQ_E_UNSUPPORTED, "%s: Engram of n-gram order %d x %d heads of %d (vocab %lld) is not supported "
                  "(orders 2..4, at most 64 columns, head_dim a multiple of 32)", name, v->engram_max_ngram,
                  v->engram_n_heads, v->engram_head_dim, (long long)v->engram_vocab_size);
        RETURN_IF(v->engram_pad_id < 0, SPARQ_E_FORMAT, "%s: engram_pad_token_id must be >= 0", name);
    }
    return SPARQ_OK;
}

static sparq_status parse_deepseek_v41(sq_model_config *c, const json_t *root, const char *name)
{
    v41_defaults(c);
    sq_v41_config *v = &c->v41;
    const json_t *tc = json_object_get(root, "text_config");
    if (!tc || json_is_null(tc)) tc = root; /* a text-only config with the fields at the top */
    RETURN_IF(!json_is_object(tc), SPARQ_E_FORMAT, "%s: 'text_config' must be an object", name);
    char mt[32] = "";
    FORWARD_IF(sq_json_get_str(tc, "model_type", mt, sizeof mt, name));
    RETURN_IF(mt[0] && strcmp(mt, "deepseek_v41") != 0 && strcmp(mt, "deepseek_v41_text") != 0, SPARQ_E_FORMAT,
              "%s: text_config.model_type is '%s', the top level says deepseek_v41", name, mt);
    /* the sizes that fix the tensors' shapes have no default */
    static const char *const required[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
                                           "sliding_window", "compress_ratios", "n_routed_experts",
                                           "num_experts_per_tok", "moe_intermediate_size", "hc_mult"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        RETURN_IF(!member_present(tc, required[i]), SPARQ_E_FORMAT,
                  "%s: no text_config.%s (it fixes the tensors' shapes and has no default)", name, required[i]);
    const int64_t big = (int64_t)1 << 31;
    FORWARD_IF(read_dim(tc, "vocab_size", &c->vocab_size, 1, 1 << 24, name));
    FORWARD_IF(read_dim(tc, "hidden_size", &c->hidden_size, 1, 65536, name));
    FORWARD_IF(read_dim(tc, "num_hidden_layers", &c->num_hidden_layers, 1, SQ_V41_MAX_LAYERS, name));
    FORWARD_IF(read_dim(tc, "num_attention_heads", &c->num_attention_heads, 1, 1024, name));
    FORWARD_IF(read_dim(tc, "num_key_value_heads", &c->num_key_value_heads, 1, 1024, name));
    FORWARD_IF(read_dim(tc, "head_dim", &c->head_dim, 2, 4096, name));
    FORWARD_IF(read_dim(tc, "max_position_embeddings", &c->max_position_embeddings, 1, big, name));
    FORWARD_IF(read_dim(tc, "moe_intermediate_size", &c->moe_intermediate_size, 1, 1 << 20, name));
    FORWARD_IF(read_dim(tc, "n_routed_experts", &c->num_experts, 1, 65536, name));
    FORWARD_IF(read_dim(tc, "num_experts_per_tok", &c->num_experts_per_tok, 1, 65536, name));
    FORWARD_IF(sq_json_get_bool(tc, "norm_topk_prob", &c->norm_topk_prob, name));
    FORWARD_IF(sq_json_get_double(tc, "rms_norm_eps", &c->rms_norm_eps, name));
    RETURN_IF(!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1), SPARQ_E_FORMAT, "%s: rms_norm_eps %g is not in (0, 1)",
              name, c->rms_norm_eps);
    FORWARD_IF(sq_json_get_bool(tc, "tie_word_embeddings", &c->tie_word_embeddings, name));
    FORWARD_IF(read_v41_rope(c, tc, name));
    FORWARD_IF(read_int(tc, "q_lora_rank", &v->q_lora_rank, 1, 65536, name));
    FORWARD_IF(read_int(tc, "o_groups", &v->o_groups, 1, 256, name));
    FORWARD_IF(read_int(tc, "o_lora_rank", &v->o_lora_rank, 1, 65536, name));
    FORWARD_IF(read_int(tc, "qk_rope_head_dim", &v->rope_dim, 0, 4096, name));
    FORWARD_IF(read_int(tc, "sliding_window", &v->window, 1, 1 << 20, name));
    int64_t ratios[SQ_V41_MAX_LAYERS + 64];
    int n = 0;
    FORWARD_IF(read_int_list(tc, "compress_ratios", ratios, SQ_V41_MAX_LAYERS + 64, &n, 0, 64, name));
    /* the release lists the MTP stages' ratios after the layers' */
    FORWARD_IF(read_int(tc, "num_nextn_predict_layers", &v->num_nextn_predict_layers, 0, 64, name));
    RETURN_IF(n != c->num_hidden_layers && n != c->num_hidden_layers + v->num_nextn_predict_layers, SPARQ_E_FORMAT,
              "%s: text_config.compress_ratios has %d entries for %lld layers (and %d MTP stages)", name, n,
              (long long)c->num_hidden_layers, v->num_nextn_predict_layers);
    n = (int)c->num_hidden_layers;
    for (int i = 0; i < n; i++) v->compress_ratio[i] = (int8_t)ratios[i];
    FORWARD_IF(read_layer_set(tc, "kv_source_layer_ids", c->num_hidden_layers, v->kv_source, name));
    FORWARD_IF(read_layer_set(tc, "index_source_layer_ids", c->num_hidden_layers, v->index_source, name));
    FORWARD_IF(read_int(tc, "candidate_source_layer_id", &v->candidate_source, -1, c->num_hidden_layers - 1, name));
    FORWARD_IF(read_int(tc, "candidate_topk_blocks", &v->candidate_topk_blocks, 0, 1 << 24, name));
    FORWARD_IF(read_int(tc, "candidate_block_size", &v->candidate_block_size, 0, 1 << 20, name));
    FORWARD_IF(read_int(tc, "index_n_heads", &v->index_n_heads, 0, 1024, name));
    FORWARD_IF(read_int(tc, "index_head_dim", &v->index_head_dim, 0, 4096, name));
    FORWARD_IF(read_int(tc, "index_topk", &v->index_topk, 0, 1 << 24, name));
    FORWARD_IF(read_int(tc, "hc_mult", &v->hc_mult, 1, 16, name));
    FORWARD_IF(read_int(tc, "hc_sinkhorn_iters", &v->hc_sinkhorn_iters, 1, 1000, name));
    FORWARD_IF(sq_json_get_double(tc, "hc_eps", &v->hc_eps, name));
    FORWARD_IF(read_int(tc, "n_shared_experts", &v->n_shared_experts, 0, 64, name));
    FORWARD_IF(sq_json_get_double(tc, "routed_scaling_factor", &v->routed_scaling_factor, name));
    FORWARD_IF(sq_json_get_double(tc, "swiglu_limit", &v->swiglu_limit, name));
    RETURN_IF(!(v->swiglu_limit >= 0) || !(v->routed_scaling_factor > 0) || !(v->hc_eps >= 0), SPARQ_E_FORMAT,
              "%s: swiglu_limit, routed_scaling_factor or hc_eps out of range", name);
    char sf[32] = "sqrtsoftplus", tm[32] = "noaux_tc";
    FORWARD_IF(sq_json_get_str(tc, "scoring_func", sf, sizeof sf, name));
    FORWARD_IF(sq_json_get_str(tc, "topk_method", tm, sizeof tm, name));
    RETURN_IF(strcmp(sf, "sqrtsoftplus") != 0, SPARQ_E_UNSUPPORTED,
              "%s: text_config.scoring_func '%s' is not supported (supported: sqrtsoftplus)", name, sf);
    RETURN_IF(strcmp(tm, "noaux_tc") != 0, SPARQ_E_UNSUPPORTED,
              "%s: text_config.topk_method '%s' is not supported (supported: noaux_tc)", name, tm);
    /* Engram */
    int64_t el[SQ_V41_MAX_ENGRAM], er[SQ_V41_MAX_ENGRAM];
    int ne = 0, nr = 0;
    FORWARD_IF(read_int_list(tc, "engram_layer_ids", el, SQ_V41_MAX_ENGRAM, &ne, 0, c->num_hidden_layers - 1, name));
    FORWARD_IF(read_int_list(tc, "engram_num_embeddings", er, SQ_V41_MAX_ENGRAM, &nr, 1, (int64_t)1 << 40, name));
    RETURN_IF(nr != ne && nr != 0, SPARQ_E_FORMAT, "%s: text_config.engram_num_embeddings has %d entries for %d "
              "engram layers", name, nr, ne);
    v->n_engram = ne;
    for (int i = 0; i < ne; i++) {
        v->engram_layer[i] = (int)el[i];
        v->engram_rows[i] = nr ? (uint64_t)er[i] : 0;
    }
    FORWARD_IF(read_int(tc, "engram_max_ngram_size", &v->engram_max_ngram, 0, 16, name));
    FORWARD_IF(read_int(tc, "engram_n_heads", &v->engram_n_heads, 0, 1024, name));
    FORWARD_IF(read_int(tc, "engram_head_dim", &v->engram_head_dim, 0, 65536, name));
    FORWARD_IF(read_dim(tc, "engram_vocab_size", &v->engram_vocab_size, 0, (int64_t)1 << 40, name));
    FORWARD_IF(read_dim(tc, "engram_pad_token_id", &v->engram_pad_id, -1, 1 << 24, name));
    FORWARD_IF(read_dim(tc, "engram_compressed_vocab_size", &v->engram_compressed_vocab, 0, 1 << 24, name));
    /* token ids: top level, else text_config */
    const json_t *ids = member_present(root, "eos_token_id") ? root : tc;
    FORWARD_IF(read_token_id(ids, "bos_token_id", &c->bos_token_id, name));
    FORWARD_IF(read_token_id(ids, "pad_token_id", &c->pad_token_id, name));
    FORWARD_IF(read_eos(c, ids, name));
    for (int i = 0; i < c->n_eos_token_ids; i++)
        RETURN_IF(c->eos_token_ids[i] >= c->vocab_size, SPARQ_E_FORMAT,
                  "%s: eos_token_id %lld is not below vocab_size %lld", name, (long long)c->eos_token_ids[i],
                  (long long)c->vocab_size);
    FORWARD_IF(read_dtype(c, member_present(tc, "dtype") || member_present(tc, "torch_dtype") ? tc : root, name));
    FORWARD_IF(read_quant(&c->quant, root, name));
    return check_v41(c, name);
}

sparq_status sq_config_parse_json(sq_model_config *cfg, const char *json, size_t len, const char *name)
{
    memset(cfg, 0, sizeof *cfg);
    json_t *root;
    FORWARD_IF(sq_json_parse(&root, json, len, name));
    sparq_status st = SPARQ_OK;
    if (!json_is_object(root)) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: config must be a JSON object", name);
        goto done;
    }
    st = sq_json_get_str(root, "model_type", cfg->model_type, sizeof cfg->model_type, name);
    if (st) goto done;
    if (!cfg->model_type[0]) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: no 'model_type' (supported: %s)", name, supported_list_);
        goto done;
    }
    if (!strcmp(cfg->model_type, "qwen3_moe")) {
        st = parse_qwen3_moe(cfg, root, name);
    } else if (!strcmp(cfg->model_type, "deepseek_v41")) {
        st = parse_deepseek_v41(cfg, root, name);
    } else {
        st = sparq_err(SPARQ_E_UNSUPPORTED, "%s: model_type '%s' is not supported (supported: %s)", name,
                       cfg->model_type, supported_list_);
    }
done:
    json_decref(root);
    if (st != SPARQ_OK) sq_config_free(cfg);
    return st;
}

sparq_status sq_config_load(sq_model_config *cfg, const char *path)
{
    memset(cfg, 0, sizeof *cfg);
    char *file = sparq_path_is_dir(path) ? sparq_path_join(path, "config.json") : sparq_strdup(path);
    RETURN_IF(!file, SPARQ_E_NOMEM, "%s: out of memory", path);
    char *text = NULL;
    size_t len = 0;
    sparq_status st = sparq_file_read_all(file, SQ_CONFIG_MAX_BYTES, &text, &len);
    if (st == SPARQ_OK) st = sq_config_parse_json(cfg, text, len, file);
    sparq_free(text);
    sparq_free(file);
    return st;
}

/* DeepSeek V4.1 (reference.md §3.2): every tensor the forward reads; the
 * Engram tables count in the total, and in `active` only the rows one token
 * gathers. MTP stages and the vision tower are not counted. */
static void v41_param_counts(const sq_model_config *c, uint64_t *total, uint64_t *active)
{
    const sq_v41_config *v = &c->v41;
    const uint64_t H = (uint64_t)c->hidden_size, V = (uint64_t)c->vocab_size, hd = (uint64_t)c->head_dim;
    const uint64_t nh = (uint64_t)c->num_attention_heads, qr = (uint64_t)v->q_lora_rank;
    const uint64_t G = (uint64_t)v->o_groups, ol = (uint64_t)v->o_lora_rank, hc = (uint64_t)v->hc_mult;
    const uint64_t E = (uint64_t)c->num_experts, I = (uint64_t)c->moe_intermediate_size;
    const uint64_t inh = (uint64_t)v->index_n_heads, ihd = (uint64_t)v->index_head_dim, mix = (2 + hc) * hc;
    const uint64_t cols = (uint64_t)((v->engram_max_ngram - 1) * v->engram_n_heads), ehd = (uint64_t)v->engram_head_dim;
#define M(a, b) sparq_sat_mul_u64((a), (b))
#define A(a, b) sparq_sat_add_u64((a), (b))
    uint64_t t = A(M(V, H), H), a = A(M(V, H), H); /* embedding, final norm */
    if (!c->tie_word_embeddings) t = A(t, M(V, H)), a = A(a, M(V, H));
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        uint64_t base = A(A(M(H, qr), qr), A(M(qr, M(nh, hd)), A(M(H, hd), hd)));
        base = A(base, A(M(M(nh, hd) / (G ? G : 1), M(G, ol)), A(M(M(G, ol), H), nh)));
        base = A(base, A(2 * H, M(2, A(M(mix, M(hc, H)), mix + 3))));
        base = A(base, A(M(E, H), 2 * E));
        const int r = v->compress_ratio[L];
        if (r && v->kv_source[L]) base = A(base, A(M(H, M(hd, r > 1 ? 2 : 1)), hd));
        if (r && v->index_source[L]) {
            base = A(base, A(M(qr, M(inh, ihd)), M(H, inh)));
            if (v->kv_source[L]) base = A(base, A(M(hd, ihd), ihd));
        }
        const uint64_t shared = M((uint64_t)v->n_shared_experts, M(3 * H, I));
        base = A(base, shared);
        t = A(t, A(base, M(E, M(3 * H, I))));
        a = A(a, A(base, M((uint64_t)c->num_experts_per_tok, M(3 * H, I))));
        for (int i = 0; i < v->n_engram; i++)
            if (v->engram_layer[i] == L) {
                /* a table's rows: engram_num_embeddings, else at least one prime >= engram_vocab_size per
                 * column; a token reads one row per column, so never more rows than the table has */
                const uint64_t fuse = A(M(M(cols, ehd), M(hc + 1, H)), M(2 * hc, H));
                const uint64_t rows = v->engram_rows[i] ? v->engram_rows[i] : M(cols, (uint64_t)v->engram_vocab_size);
                t = A(t, A(fuse, M(rows, ehd)));
                a = A(a, A(fuse, M(cols < rows ? cols : rows, ehd)));
            }
    }
#undef M
#undef A
    if (total) *total = t;
    if (active) *active = a;
}

void sq_config_param_counts(const sq_model_config *c, uint64_t *total, uint64_t *active)
{
    if (c->arch == SQ_ARCH_DEEPSEEK_V41) {
        v41_param_counts(c, total, active);
        return;
    }
    const uint64_t H = (uint64_t)c->hidden_size, V = (uint64_t)c->vocab_size, hd = (uint64_t)c->head_dim;
    const uint64_t q = sparq_sat_mul_u64((uint64_t)c->num_attention_heads, hd), kv = sparq_sat_mul_u64((uint64_t)c->num_key_value_heads, hd);
    uint64_t attn = sparq_sat_add_u64(sparq_sat_mul_u64(H, q), sparq_sat_mul_u64(2 * H, kv));
    attn = sparq_sat_add_u64(attn, sparq_sat_mul_u64(q, H));
    attn = sparq_sat_add_u64(attn, 2 * hd); /* q_norm, k_norm */
    if (c->attention_bias) attn = sparq_sat_add_u64(attn, sparq_sat_add_u64(sparq_sat_add_u64(q, 2 * kv), H));
    const uint64_t norms = 2 * H;
    const uint64_t expert = sparq_sat_mul_u64(3 * H, (uint64_t)c->moe_intermediate_size);
    const uint64_t dense = sparq_sat_mul_u64(3 * H, (uint64_t)c->intermediate_size);
    uint64_t t = sparq_sat_mul_u64(V, H), a = sparq_sat_mul_u64(V, H);
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        uint64_t base = sparq_sat_add_u64(attn, norms);
        t = sparq_sat_add_u64(t, base);
        a = sparq_sat_add_u64(a, base);
        if (sq_config_is_moe_layer(c, L)) {
            uint64_t router = sparq_sat_mul_u64(H, (uint64_t)c->num_experts);
            t = sparq_sat_add_u64(t, sparq_sat_add_u64(router, sparq_sat_mul_u64(expert, (uint64_t)c->num_experts)));
            a = sparq_sat_add_u64(a, sparq_sat_add_u64(router, sparq_sat_mul_u64(expert, (uint64_t)c->num_experts_per_tok)));
        } else {
            t = sparq_sat_add_u64(t, dense);
            a = sparq_sat_add_u64(a, dense);
        }
    }
    t = sparq_sat_add_u64(t, H);
    a = sparq_sat_add_u64(a, H);
    if (!c->tie_word_embeddings) {
        t = sparq_sat_add_u64(t, sparq_sat_mul_u64(V, H));
        a = sparq_sat_add_u64(a, sparq_sat_mul_u64(V, H));
    }
    if (total) *total = t;
    if (active) *active = a;
}
