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

static const char *const arch_names_[SQ_ARCH_COUNT_] = {"unknown", "qwen3_moe"};
static const char supported_list_[] = "qwen3_moe";

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

void sq_config_param_counts(const sq_model_config *c, uint64_t *total, uint64_t *active)
{
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
