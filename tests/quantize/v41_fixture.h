/* tests/quantize/v41_fixture.h — a random (untrained) DeepSeek V4.1
 * checkpoint in the native release layout, written at test time into a
 * temporary or build directory (not kept in tests/data): every quantized
 * linear 128 wide (hidden 128, 2 heads of head_dim 128, q_lora 128, o_lora 128
 * in 2 groups, routed experts of width 128 top-2, one shared expert), three
 * layers exercising the caches layers share (compress ratios 0,2,2: layer 1
 * the kv, index and candidate source whose pool and selection layer 2 reads),
 * no Engram (its hash is built for layers 1 and 14 only). Dense linears and the
 * router F8_E4M3 + F8_E8M0 scales of 32×32 blocks, routed experts FP4-E2M1
 * (I8, two per byte, low nibble first) + F8_E8M0 per row group of 32, head
 * FP8, norms BF16, hyper-connections and sinks F32, compressor / indexer BF16
 * and FP8 as the release has them, one `mtp.0.*` tensor (the quantizer drops
 * it). The byte-level tokenizer of tests/data/quantize/tiny-synth (vocab 256).
 * Deterministic: each tensor's values come from a generator seeded by its
 * name. A stopgap until the lead's tools/bench/make_v41_model.c is on main. */
#ifndef SPARQ_TESTS_QUANTIZE_V41_FIXTURE_H
#define SPARQ_TESTS_QUANTIZE_V41_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/safetensors.h"
#include "qtest.h"

typedef struct v41fx {
    sf_writer *w;
    bool ok;
} v41fx;

static inline uint64_t v41fx_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n normal values of deviation sd (+ mean), from a generator seeded by `name`. */
static inline float *v41fx_randn(const char *name, size_t n, double mean, double sd)
{
    uint64_t s = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) s = (s ^ (uint8_t)*p) * 0x100000001b3ull;
    float *x = sparq_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; x && i < n; i++) {
        double u1 = ((double)(v41fx_next(&s) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = (double)(v41fx_next(&s) >> 11) / 9007199254740992.0;
        x[i] = (float)(mean + sd * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    return x;
}

static inline void v41fx_add(v41fx *f, const char *name, sf_dtype dt, int nd, uint64_t d0, uint64_t d1, const void *p,
                             uint64_t nb)
{
    const uint64_t sh[2] = {d0, d1};
    if (f->ok) f->ok = sf_writer_add(f->w, name, dt, nd, sh, p, nb) == SPARQ_OK;
}

static inline void v41fx_f32(v41fx *f, const char *name, int nd, uint64_t d0, uint64_t d1, double mean, double sd)
{
    const size_t n = (size_t)d0 * (nd == 2 ? d1 : 1);
    float *x = v41fx_randn(name, n, mean, sd);
    f->ok = f->ok && x;
    v41fx_add(f, name, SF_F32, nd, d0, d1, x, n * 4);
    sparq_free(x);
}

static inline void v41fx_bf16(v41fx *f, const char *name, int nd, uint64_t d0, uint64_t d1, double mean, double sd)
{
    const size_t n = (size_t)d0 * (nd == 2 ? d1 : 1);
    float *x = v41fx_randn(name, n, mean, sd);
    uint16_t *h = sparq_malloc(n * 2);
    f->ok = f->ok && x && h;
    for (size_t i = 0; f->ok && i < n; i++) h[i] = sparq_f32_to_bf16(x[i]);
    v41fx_add(f, name, SF_BF16, nd, d0, d1, h, n * 2);
    sparq_free(x);
    sparq_free(h);
}

/* key.weight F8_E4M3 [O, I] + key.scale F8_E8M0 [O/32, I/32]. */
static inline void v41fx_fp8(v41fx *f, const char *key, int O, int I, double sd)
{
    char nm[300];
    snprintf(nm, sizeof nm, "%s.weight", key);
    float *w = v41fx_randn(nm, (size_t)O * I, 0, sd);
    const int SR = (O + 31) / 32, SC = (I + 31) / 32;
    uint8_t *q = sparq_malloc((size_t)O * I), *sb = sparq_malloc((size_t)SR * SC);
    f->ok = f->ok && w && q && sb;
    for (int a = 0; f->ok && a < SR; a++)
        for (int b = 0; b < SC; b++) {
            float amax = 0;
            for (int r = a * 32; r < a * 32 + 32 && r < O; r++)
                for (int k = b * 32; k < b * 32 + 32 && k < I; k++) amax = fmaxf(amax, fabsf(w[(size_t)r * I + k]));
            const int e = amax > 0 ? (int)ceilf(log2f(amax / 448.0f)) : 0;
            sb[a * SC + b] = (uint8_t)(e + 127);
            for (int r = a * 32; r < a * 32 + 32 && r < O; r++)
                for (int k = b * 32; k < b * 32 + 32 && k < I; k++)
                    q[(size_t)r * I + k] = e4m3_encode(ldexpf(w[(size_t)r * I + k], -e));
        }
    v41fx_add(f, nm, SF_F8_E4M3, 2, (uint64_t)O, (uint64_t)I, q, (uint64_t)O * I);
    snprintf(nm, sizeof nm, "%s.scale", key);
    v41fx_add(f, nm, SF_F8_E8M0, 2, (uint64_t)SR, (uint64_t)SC, sb, (uint64_t)SR * SC);
    sparq_free(w), sparq_free(q), sparq_free(sb);
}

/* key.weight I8 [O, I/2] (FP4-E2M1 pairs) + key.scale F8_E8M0 [O, I/32]. */
static inline void v41fx_fp4(v41fx *f, const char *key, int O, int I, double sd)
{
    char nm[300];
    snprintf(nm, sizeof nm, "%s.weight", key);
    float *w = v41fx_randn(nm, (size_t)O * I, 0, sd);
    const int G = I / 32;
    uint8_t *q = sparq_calloc((size_t)O * I / 2, 1), *sc = sparq_malloc((size_t)O * G);
    f->ok = f->ok && w && q && sc;
    for (int r = 0; f->ok && r < O; r++)
        for (int g = 0; g < G; g++) {
            float amax = 0;
            for (int k = g * 32; k < g * 32 + 32; k++) amax = fmaxf(amax, fabsf(w[(size_t)r * I + k]));
            const int e = amax > 0 ? (int)ceilf(log2f(amax / 6.0f)) : 0;
            sc[r * G + g] = (uint8_t)(e + 127);
            for (int k = g * 32; k < g * 32 + 32; k++) {
                const uint8_t n = e2m1_encode(ldexpf(w[(size_t)r * I + k], -e));
                q[((size_t)r * I + k) / 2] |= (uint8_t)(k % 2 ? n << 4 : n);
            }
        }
    v41fx_add(f, nm, SF_I8, 2, (uint64_t)O, (uint64_t)I / 2, q, (uint64_t)O * I / 2);
    snprintf(nm, sizeof nm, "%s.scale", key);
    v41fx_add(f, nm, SF_F8_E8M0, 2, (uint64_t)O, (uint64_t)G, sc, (uint64_t)O * G);
    sparq_free(w), sparq_free(q), sparq_free(sc);
}

static const char v41fx_config[] =
    "{\n  \"architectures\": [\"DeepseekV41ForCausalLM\"], \"model_type\": \"deepseek_v41\",\n"
    "  \"bos_token_id\": 0, \"eos_token_id\": 1, \"pad_token_id\": 2,\n"
    "  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\",\n"
    "    \"weight_block_size\": [32, 32], \"scale_fmt\": \"ue8m0\", \"expert_dtype\": \"fp4\"},\n"
    "  \"text_config\": {\n"
    "    \"model_type\": \"deepseek_v41_text\", \"vocab_size\": 256, \"hidden_size\": 128,\n"
    "    \"moe_intermediate_size\": 128, \"num_hidden_layers\": 3, \"num_attention_heads\": 2,\n"
    "    \"num_key_value_heads\": 1, \"head_dim\": 128, \"qk_rope_head_dim\": 64, \"q_lora_rank\": 128,\n"
    "    \"o_lora_rank\": 128, \"o_groups\": 2, \"hidden_act\": \"silu\", \"swiglu_limit\": 10.0,\n"
    "    \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 4096, \"rope_theta\": 10000,\n"
    "    \"n_routed_experts\": %d, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2,\n"
    "    \"scoring_func\": \"sqrtsoftplus\", \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true,\n"
    "    \"routed_scaling_factor\": 1.5, \"sliding_window\": 16, \"compress_ratios\": [0, 2, 2],\n"
    "    \"compress_rope_theta\": 160000, \"kv_source_layer_ids\": [1], \"index_source_layer_ids\": [1],\n"
    "    \"index_n_heads\": 2, \"index_head_dim\": 64, \"index_topk\": 8, \"candidate_source_layer_id\": 1,\n"
    "    \"candidate_topk_blocks\": 4, \"candidate_block_size\": 4, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20,\n"
    "    \"hc_eps\": 1e-06, \"engram_layer_ids\": [], \"num_nextn_predict_layers\": 1,\n"
    "    \"tie_word_embeddings\": false\n  }\n}\n";

#define V41FX_LAYERS 3
static const int v41fx_ratio[V41FX_LAYERS] = {0, 2, 2};

/* Write the fixture with n_experts routed experts into dir (created); the
 * tokenizer is copied from tokenizer_json. */
static inline bool v41fx_write(const char *dir, const char *tokenizer_json, int n_experts)
{
    const int D = 128, NH = 2, HD = 128, QR = 128, G = 2, OL = 128, I = 128, V = 256, HC = 4, MIX = (2 + HC) * HC;
    const int IH = 2, IHD = 64;
    char path[1200], key[256], *tok = NULL, cfg[sizeof v41fx_config + 16];
    size_t nt = 0;
    if (sparq_mkdirs(dir) != SPARQ_OK || sparq_file_read_all(tokenizer_json, 0, &tok, &nt) != SPARQ_OK) return false;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    bool ok = sparq_file_write_atomic(path, tok, nt) == SPARQ_OK;
    sparq_free(tok);
    snprintf(cfg, sizeof cfg, v41fx_config, n_experts);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ok = ok && sparq_file_write_atomic(path, cfg, strlen(cfg)) == SPARQ_OK;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    v41fx f = {NULL, ok};
    f.ok = f.ok && sf_writer_create(&f.w, path) == SPARQ_OK;
#define K(...) (snprintf(key, sizeof key, __VA_ARGS__), key)
    v41fx_bf16(&f, "embed.weight", 2, V, D, 0, 1);
    for (int L = 0; L < V41FX_LAYERS; L++) {
        const int r = v41fx_ratio[L];
        const bool kv = L == 1, ix = L == 1;
        v41fx_bf16(&f, K("layers.%d.attn_norm.weight", L), 1, D, 0, 1, 0.05);
        v41fx_bf16(&f, K("layers.%d.ffn_norm.weight", L), 1, D, 0, 1, 0.05);
        static const char *const sub[2] = {"attn", "ffn"};
        for (int s = 0; s < 2; s++) {
            v41fx_f32(&f, K("layers.%d.hc_%s_fn", L, sub[s]), 2, MIX, (uint64_t)HC * D, 0, 0.03);
            v41fx_f32(&f, K("layers.%d.hc_%s_base", L, sub[s]), 1, MIX, 0, 0, 0.5);
            v41fx_f32(&f, K("layers.%d.hc_%s_scale", L, sub[s]), 1, 3, 0, 0.6, 0.1);
        }
        v41fx_fp8(&f, K("layers.%d.attn.wq_a", L), QR, D, 1 / sqrt(D));
        v41fx_bf16(&f, K("layers.%d.attn.q_norm.weight", L), 1, QR, 0, 1, 0.05);
        v41fx_fp8(&f, K("layers.%d.attn.wq_b", L), NH * HD, QR, 1 / sqrt(QR));
        v41fx_fp8(&f, K("layers.%d.attn.wkv", L), HD, D, 1 / sqrt(D));
        v41fx_bf16(&f, K("layers.%d.attn.kv_norm.weight", L), 1, HD, 0, 1, 0.05);
        v41fx_fp8(&f, K("layers.%d.attn.wo_a", L), G * OL, NH * HD / G, 1 / sqrt(NH * HD / G));
        v41fx_fp8(&f, K("layers.%d.attn.wo_b", L), D, G * OL, 0.5 / sqrt(G * OL));
        v41fx_f32(&f, K("layers.%d.attn.attn_sink", L), 1, NH, 0, 0, 0.5);
        if (r && kv) {
            v41fx_bf16(&f, K("layers.%d.attn.compressor.wkv.weight", L), 2, HD, D, 0, 0.125);
            if (r > 1) v41fx_bf16(&f, K("layers.%d.attn.compressor.wgate.weight", L), 2, HD, D, 0, 0.125);
            v41fx_bf16(&f, K("layers.%d.attn.compressor.norm.weight", L), 1, HD, 0, 1, 0.05);
        }
        if (r && ix) {
            v41fx_fp8(&f, K("layers.%d.attn.indexer.wq_b", L), IH * IHD, QR, 0.125);
            v41fx_bf16(&f, K("layers.%d.attn.indexer.weights_proj.weight", L), 2, IH, D, 0, 0.125);
            if (kv) {
                v41fx_bf16(&f, K("layers.%d.attn.indexer.wk.weight", L), 2, IHD, HD, 0, 0.125);
                v41fx_bf16(&f, K("layers.%d.attn.indexer.k_norm.weight", L), 1, IHD, 0, 1, 0.05);
            }
        }
        v41fx_fp8(&f, K("layers.%d.ffn.gate", L), n_experts, D, 0.3);
        v41fx_f32(&f, K("layers.%d.ffn.gate.bias", L), 1, (uint64_t)n_experts, 0, 0, 0.1);
        v41fx_f32(&f, K("layers.%d.ffn.gate.bias_vl", L), 1, (uint64_t)n_experts, 0, 0, 0.1);
        for (int e = 0; e < n_experts; e++) {
            v41fx_fp4(&f, K("layers.%d.ffn.experts.%d.w1", L, e), I, D, 1 / sqrt(D));
            v41fx_fp4(&f, K("layers.%d.ffn.experts.%d.w3", L, e), I, D, 1 / sqrt(D));
            v41fx_fp4(&f, K("layers.%d.ffn.experts.%d.w2", L, e), D, I, 0.5 / sqrt(I));
        }
        v41fx_fp8(&f, K("layers.%d.ffn.shared_experts.w1", L), I, D, 1 / sqrt(D));
        v41fx_fp8(&f, K("layers.%d.ffn.shared_experts.w3", L), I, D, 1 / sqrt(D));
        v41fx_fp8(&f, K("layers.%d.ffn.shared_experts.w2", L), D, I, 0.5 / sqrt(I));
    }
    v41fx_bf16(&f, "norm.weight", 1, D, 0, 1, 0.05);
    v41fx_fp8(&f, "head", V, D, 1 / sqrt(D));
    v41fx_bf16(&f, "mtp.0.norm.weight", 1, D, 0, 1, 0);
#undef K
    if (f.ok) f.ok = sf_writer_finish(f.w) == SPARQ_OK;
    else if (f.w) sf_writer_free(f.w);
    return f.ok;
}

#endif
