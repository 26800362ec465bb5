/* tools/bench/make_exl3_model.c — write a random-weight EXL3 Qwen3-MoE model
 * at any real shape, so the GPU runtime can be loaded and timed at the sizes
 * users run without downloading anything.
 *
 *   make_exl3_model OUT [--preset qwen3-30b-a3b | qwen3-235b-a22b | dsv41-moe | tiny] [--layers N]
 *                   [--hidden N] [--heads N] [--kv-heads N] [--head-dim N] [--experts N] [--topk N]
 *                   [--inter N] [--vocab N] [--expert-bits K] [--attn-bits K] [--head-bits K]
 *                   [--shard-mb N] [--seed N]
 *
 * The layout is exllamav3's as sparq's quantizer writes it (docs/exl3.md):
 * per linear <key>.trellis I16 (k/16, n/16, 16K), <key>.suh / .svh F16 and a
 * <key>.mul1 marker (codebook mul1); routers, norms and the embedding bf16;
 * an untied EXL3 lm_head. Trellis words are uniform random (each decodes to
 * a valid codebook value), suh random signs, svh random signs / sqrt(k) so
 * activations stay O(1) through the layers. Shards of --shard-mb with a
 * model.safetensors.index.json; config.json and quantization_config.json.
 * Presets: qwen3-30b-a3b = Qwen3-30B-A3B (48 layers, hidden 2048, 32/4 heads ×
 * 128, 128 experts top-8 of width 768, vocab 151936); qwen3-235b-a22b =
 * Qwen3-235B-A22B (94 layers, 4096, 64/4 × 128, 128 × 1536 top-8) — use
 * --layers to trim it to a GPU; dsv41-moe = DeepSeek-V4.1-Flash's MoE shapes (hidden 5120,
 * 384 × 2304 top-6, vocab 129280) in a Qwen3-MoE body, 8 layers; tiny = a 2-layer model for tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "common/progress.h"
#include "formats/safetensors.h"
#include "tools/bench/model_writer.h"

typedef struct shape {
    int layers, hidden, heads, kv_heads, head_dim, experts, topk, inter, vocab;
    int expert_bits, attn_bits, head_bits;
} shape;

typedef mw_job job;

static sparq_status add(job *j, const char *name, sf_dtype dt, int ndim, const uint64_t *shape_, void *data,
                        uint64_t nbytes)
{
    return mw_add(j, name, dt, ndim, shape_, data, nbytes);
}

#define rnd mw_rnd

static sparq_status add_exl3(job *j, const char *key, int k, int n, int K)
{
    char name[256];
    const uint64_t ts[3] = {(uint64_t)k / 16, (uint64_t)n / 16, (uint64_t)16 * K};
    const uint64_t tn = ts[0] * ts[1] * ts[2];
    uint64_t *tw = sparq_malloc((tn * 2 + 7) / 8 * 8);
    uint16_t *su = sparq_malloc((size_t)k * 2), *sv = sparq_malloc((size_t)n * 2);
    int32_t *mul1 = sparq_malloc(4);
    RETURN_IF(!tw || !su || !sv || !mul1, SPARQ_E_NOMEM, "%s: out of memory", key);
    for (uint64_t i = 0; i < (tn * 2 + 7) / 8; i++) tw[i] = rnd();
    const float s = 1.0f / sqrtf((float)k);
    for (int i = 0; i < k; i++) su[i] = sparq_f32_to_f16(rnd() & 1 ? 1.0f : -1.0f);
    for (int i = 0; i < n; i++) sv[i] = sparq_f32_to_f16(rnd() & 1 ? s : -s);
    *mul1 = (int32_t)0x83DCD12Du; /* exllamav3's mul1 multiplier (the marker's value) */
    snprintf(name, sizeof name, "%s.trellis", key);
    FORWARD_IF(add(j, name, SF_I16, 3, ts, tw, tn * 2));
    const uint64_t ks = (uint64_t)k, ns = (uint64_t)n;
    snprintf(name, sizeof name, "%s.suh", key);
    FORWARD_IF(add(j, name, SF_F16, 1, &ks, su, ks * 2));
    snprintf(name, sizeof name, "%s.svh", key);
    FORWARD_IF(add(j, name, SF_F16, 1, &ns, sv, ns * 2));
    snprintf(name, sizeof name, "%s.mul1", key);
    return add(j, name, SF_I32, 0, NULL, mul1, 4);
}

/* bf16 [rows, cols] (cols 0: a vector [rows]) of N(0, sd²)-ish values, or all `fill` when sd == 0. */
static sparq_status add_bf16(job *j, const char *name, uint64_t rows, uint64_t cols, float sd, float fill)
{
    const uint64_t n = rows * (cols ? cols : 1);
    uint16_t *b = sparq_malloc(n * 2);
    RETURN_IF(!b, SPARQ_E_NOMEM, "%s: out of memory", name);
    for (uint64_t i = 0; i < n; i++) {
        float v = fill;
        if (sd > 0) v = mw_gauss(sd);
        b[i] = sparq_f32_to_bf16(v);
    }
    const uint64_t sh[2] = {rows, cols};
    return add(j, name, SF_BF16, cols ? 2 : 1, sh, b, n * 2);
}

static sparq_status make(job *j, const shape *s)
{
    char key[256], text[4096];
    sparq_progress pb;
    sparq_progress_begin(&pb, "layers", (uint64_t)s->layers, SPARQ_PROGRESS_ITEMS);
    const int d = s->hidden, qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    FORWARD_IF(add_bf16(j, "model.embed_tokens.weight", (uint64_t)s->vocab, (uint64_t)d, 1.0f, 0));
    for (int L = 0; L < s->layers; L++) {
        static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int a = 0; a < 4; a++) {
            snprintf(key, sizeof key, "model.layers.%d.self_attn.%s", L, attn[a]);
            FORWARD_IF(add_exl3(j, key, a == 3 ? qd : d, a == 0 ? qd : a == 3 ? d : kvd, s->attn_bits));
        }
        snprintf(key, sizeof key, "model.layers.%d.self_attn.q_norm.weight", L);
        FORWARD_IF(add_bf16(j, key, (uint64_t)s->head_dim, 0, 0, 1.0f));
        snprintf(key, sizeof key, "model.layers.%d.self_attn.k_norm.weight", L);
        FORWARD_IF(add_bf16(j, key, (uint64_t)s->head_dim, 0, 0, 1.0f));
        snprintf(key, sizeof key, "model.layers.%d.input_layernorm.weight", L);
        FORWARD_IF(add_bf16(j, key, (uint64_t)d, 0, 0, 1.0f));
        snprintf(key, sizeof key, "model.layers.%d.post_attention_layernorm.weight", L);
        FORWARD_IF(add_bf16(j, key, (uint64_t)d, 0, 0, 1.0f));
        snprintf(key, sizeof key, "model.layers.%d.mlp.gate.weight", L);
        FORWARD_IF(add_bf16(j, key, (uint64_t)s->experts, (uint64_t)d, 1.0f / sqrtf((float)d), 0));
        for (int e = 0; e < s->experts; e++) {
            snprintf(key, sizeof key, "model.layers.%d.mlp.experts.%d.gate_proj", L, e);
            FORWARD_IF(add_exl3(j, key, d, s->inter, s->expert_bits));
            snprintf(key, sizeof key, "model.layers.%d.mlp.experts.%d.up_proj", L, e);
            FORWARD_IF(add_exl3(j, key, d, s->inter, s->expert_bits));
            snprintf(key, sizeof key, "model.layers.%d.mlp.experts.%d.down_proj", L, e);
            FORWARD_IF(add_exl3(j, key, s->inter, d, s->expert_bits));
        }
        sparq_progress_add(&pb, 1);
    }
    sparq_progress_end(&pb);
    FORWARD_IF(add_bf16(j, "model.norm.weight", (uint64_t)d, 0, 0, 1.0f));
    FORWARD_IF(add_exl3(j, "lm_head", d, s->vocab, s->head_bits));

    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n  \"model_type\": \"qwen3_moe\",\n"
             "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
             "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"intermediate_size\": %d,\n"
             "  \"moe_intermediate_size\": %d,\n  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n"
             "  \"norm_topk_prob\": true,\n  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n"
             "  \"vocab_size\": %d,\n  \"max_position_embeddings\": 40960,\n  \"rms_norm_eps\": 1e-06,\n"
             "  \"rope_theta\": 1000000.0,\n  \"tie_word_embeddings\": false,\n  \"attention_bias\": false,\n"
             "  \"hidden_act\": \"silu\",\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
             "  \"torch_dtype\": \"bfloat16\",\n"
             "  \"quantization_config\": {\"quant_method\": \"exl3\", \"version\": \"0.0.1\", \"bits\": %d,\n"
             "    \"head_bits\": %d, \"calibration\": {\"rows\": 0, \"cols\": 0}, \"out_scales\": \"always\",\n"
             "    \"codebook\": \"mul1\"}\n}\n",
             d, s->layers, s->heads, s->kv_heads, s->head_dim, s->inter * s->topk, s->inter, s->experts, s->topk,
             s->vocab, s->expert_bits, s->head_bits);
    FORWARD_IF(mw_write_text(j->out, "config.json", text));
    snprintf(text, sizeof text,
             "{\"quant_method\": \"exl3\", \"version\": \"0.0.1\", \"bits\": %d, \"head_bits\": %d, "
             "\"calibration\": {\"rows\": 0, \"cols\": 0}, \"out_scales\": \"always\", \"codebook\": \"mul1\", "
             "\"note\": \"random weights (tools/bench/make_exl3_model)\"}\n",
             s->expert_bits, s->head_bits);
    return mw_write_text(j->out, "quantization_config.json", text);
}

int main(int argc, char **argv)
{
    shape s = {48, 2048, 32, 4, 128, 128, 8, 768, 151936, 3, 4, 6};
    const shape big = {94, 4096, 64, 4, 128, 128, 8, 1536, 151936, 3, 4, 6};
    const shape tiny = {2, 256, 4, 2, 64, 8, 2, 256, 1024, 3, 4, 6};
    /* DeepSeek-V4.1-Flash's MoE at its real size in a Qwen3-MoE body (the runtime's CUDA
     * architecture): hidden 5120, 384 experts of width 2304, top-6, vocab 129280; the
     * attention is Qwen3's GQA (40/8 heads × 128), not V4.1's MQA. 5.1 GB of experts a
     * layer at K=3: --layers trims it to the GPU (8 layers: ~42 GB). */
    const shape dsv41 = {8, 5120, 40, 8, 128, 384, 6, 2304, 129280, 3, 4, 6};
    const char *out = NULL;
    int shard_mb = 4096;
    mw_seed(1);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--preset") && i + 1 < argc) {
            const char *p = argv[++i];
            if (!strcmp(p, "qwen3-235b-a22b")) s = big;
            else if (!strcmp(p, "tiny")) s = tiny;
            else if (!strcmp(p, "dsv41-moe")) s = dsv41;
            else if (strcmp(p, "qwen3-30b-a3b")) {
                fprintf(stderr, "make_exl3_model: unknown preset '%s'\n", p);
                return 2;
            }
        } else if (!strcmp(a, "--layers")) s.layers = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 4096);
        else if (!strcmp(a, "--hidden")) s.hidden = mw_arg_int("make_exl3_model", argc, argv, &i, 128, 65536);
        else if (!strcmp(a, "--heads")) s.heads = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--kv-heads")) s.kv_heads = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--head-dim")) s.head_dim = mw_arg_int("make_exl3_model", argc, argv, &i, 64, 1024);
        else if (!strcmp(a, "--experts")) s.experts = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 65536);
        else if (!strcmp(a, "--topk")) s.topk = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 64);
        else if (!strcmp(a, "--inter")) s.inter = mw_arg_int("make_exl3_model", argc, argv, &i, 128, 1 << 20);
        else if (!strcmp(a, "--vocab")) s.vocab = mw_arg_int("make_exl3_model", argc, argv, &i, 128, 1 << 24);
        else if (!strcmp(a, "--expert-bits")) s.expert_bits = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 8);
        else if (!strcmp(a, "--attn-bits")) s.attn_bits = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 8);
        else if (!strcmp(a, "--head-bits")) s.head_bits = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 8);
        else if (!strcmp(a, "--shard-mb")) shard_mb = mw_arg_int("make_exl3_model", argc, argv, &i, 1, 1 << 20);
        else if (!strcmp(a, "--seed")) mw_seed((uint64_t)mw_arg_int("make_exl3_model", argc, argv, &i, 0, 1 << 30));
        else if (a[0] != '-' && !out) out = a;
        else {
            fprintf(stderr, "usage: make_exl3_model OUT [--preset qwen3-30b-a3b|qwen3-235b-a22b|dsv41-moe|tiny] [--layers N] "
                            "[--hidden N] [--heads N] [--kv-heads N] [--head-dim N] [--experts N] [--topk N] "
                            "[--inter N] [--vocab N] [--expert-bits K] [--attn-bits K] [--head-bits K] "
                            "[--shard-mb N] [--seed N]\n");
            return 2;
        }
    }
    if (!out || s.hidden % 128 || s.inter % 128 || (s.heads * s.head_dim) % 128 || (s.kv_heads * s.head_dim) % 128 ||
        s.vocab % 128 || s.heads % s.kv_heads || s.topk > s.experts) {
        fprintf(stderr, "make_exl3_model: OUT missing, or a width not a multiple of 128 / inconsistent heads\n");
        return 2;
    }
    job j;
    sparq_status st = mw_begin(&j, out, (uint64_t)shard_mb << 20, false);
    if (st == SPARQ_OK) st = make(&j, &s);
    st = mw_end(&j, st);
    if (st != SPARQ_OK) {
        fprintf(stderr, "make_exl3_model: %s\n", sparq_errmsg());
        return 1;
    }
    printf("%s: %d layers, hidden %d, %d experts top-%d of width %d, vocab %d; experts K=%d, attention K=%d, head "
           "K=%d; %d shards\n",
           out, s.layers, s.hidden, s.experts, s.topk, s.inter, s.vocab, s.expert_bits, s.attn_bits, s.head_bits,
           j.n_shards);
    return 0;
}
