/* tests/kernels/test_fp8_bind.c — FP8 / MXFP4 linears bound from a
 * checkpoint (runtime/models/model.c sq_mdl_bind_linear over
 * formats/weights.h), on safetensors files the test writes:
 *  - bound in place (w and scale point into the mapping), kind, block and the
 *    weights' bytes; the block from quantization_config.weight_block_size
 *    when the config has one, inferred from the scale's shape otherwise;
 *  - refused, naming the tensor and the first bad element: a UE8M0 255 scale,
 *    an E4M3 NaN weight (both NaN codes), a scale shaped for another block,
 *    an MXFP4 scale of the wrong shape, E5M2 / float weight_scale_inv FP8
 *    (not run in place), a weight of another shape than the slot's;
 *  - end to end: a small Qwen3-MoE whose attention, dense MLP and head are FP8
 *    (32×32 blocks, partial blocks included) and whose experts are MXFP4,
 *    with an fp8 quantization_config, loads and gives the logits of the same
 *    model written with the dequantised values as F32 (prefill through the
 *    GEMM, decode through the GEMV). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/half.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "kernels/cpu/ops.h"
#include "runtime/model.h"
#include "runtime/models/model_impl.h"
#include "t.h"

static uint64_t rng = 77;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static float urand(void) { return (float)((double)rnd() / 2147483648.0 - 1.0); }

static void add(sf_writer *w, const char *name, sf_dtype dt, uint64_t d0, uint64_t d1, const void *data)
{
    const uint64_t shape[2] = {d0, d1};
    const uint64_t nb = d0 * (d1 ? d1 : 1) * (sf_dtype_bits(dt) / 8);
    CHECK_MSG(sf_writer_add(w, name, dt, d1 ? 2 : 1, shape, data, nb) == SPARQ_OK, "add %s: %s", name, sparq_errmsg());
}

/* --- refusals ------------------------------------------------------------------------ */

static char forms_path[600];

static void write_forms(void)
{
    snprintf(forms_path, sizeof forms_path, "%s/forms.safetensors", t_tmpdir());
    sf_writer *w;
    CHECK(sf_writer_create(&w, forms_path) == SPARQ_OK);
    static uint8_t fp8[100 * 100], sc[16 * 4], fp4[16 * 32];
    for (size_t i = 0; i < sizeof fp8; i++) fp8[i] = (uint8_t)(0x30 + i % 16); /* no NaN */
    memset(sc, 120, sizeof sc);
    for (size_t i = 0; i < sizeof fp4; i++) fp4[i] = (uint8_t)rnd();
    add(w, "a.weight", SF_F8_E4M3, 40, 70, fp8); /* 32x32: scale [2, 3] */
    add(w, "a.scale", SF_F8_E8M0, 2, 3, sc);
    static uint8_t sc255[6], nan1[40 * 70], nan2[40 * 70];
    memset(sc255, 120, 6);
    sc255[1 * 3 + 2] = 255;
    add(w, "b.weight", SF_F8_E4M3, 40, 70, fp8);
    add(w, "b.scale", SF_F8_E8M0, 2, 3, sc255);
    memcpy(nan1, fp8, sizeof nan1);
    nan1[5 * 70 + 17] = 0x7F, nan1[30 * 70 + 1] = 0xFF;
    add(w, "c.weight", SF_F8_E4M3, 40, 70, nan1);
    add(w, "c.scale", SF_F8_E8M0, 2, 3, sc);
    memcpy(nan2, fp8, sizeof nan2);
    nan2[39 * 70 + 69] = 0xFF; /* the very last byte */
    add(w, "c2.weight", SF_F8_E4M3, 40, 70, nan2);
    add(w, "c2.scale", SF_F8_E8M0, 2, 3, sc);
    add(w, "d.weight", SF_F8_E4M3, 40, 70, fp8); /* a 2x2 scale fits the 1x32 / 128 blocks of no shape here */
    add(w, "d.scale", SF_F8_E8M0, 2, 2, sc);
    add(w, "e.weight", SF_F8_E4M3, 100, 100, fp8); /* 128x128: scale [1, 1] */
    add(w, "e.scale", SF_F8_E8M0, 1, 1, sc);
    add(w, "f.weight", SF_I8, 16, 32, fp4); /* MXFP4 [16, 64] */
    add(w, "f.scale", SF_F8_E8M0, 16, 2, sc);
    static uint8_t sc4[32];
    memset(sc4, 127, sizeof sc4);
    sc4[9 * 2 + 1] = 255;
    add(w, "g.weight", SF_I8, 16, 32, fp4);
    add(w, "g.scale", SF_F8_E8M0, 16, 2, sc4);
    add(w, "h.weight", SF_I8, 16, 32, fp4);
    add(w, "h.scale", SF_F8_E8M0, 16, 1, sc);
    add(w, "i.weight", SF_F8_E5M2, 40, 70, fp8);
    add(w, "i.scale", SF_F8_E8M0, 2, 3, sc);
    static const float inv[1] = {0.01f};
    add(w, "j.weight", SF_F8_E4M3, 100, 100, fp8);
    add(w, "j.weight_scale_inv", SF_F32, 1, 1, inv);
    /* gpt-oss naming: [8, 2 groups, 16 bytes] + [8, 2] */
    const uint64_t s3[3] = {8, 2, 16};
    CHECK(sf_writer_add(w, "k_blocks", SF_U8, 3, s3, fp4, 256) == SPARQ_OK);
    add(w, "k_scales", SF_U8, 8, 2, sc);
    static uint16_t bf[8 * 16];
    add(w, "z.weight", SF_BF16, 8, 16, bf);
    CHECK(sf_writer_finish(w) == SPARQ_OK);
}

/* A model core holding only the mapped file and a config's quantization_config. */
static void bind_setup(sq_model *m, int br, int bc)
{
    memset(m, 0, sizeof *m);
    CHECK(sf_open(&m->sf, forms_path) == SPARQ_OK);
    if (br) {
        strcpy(m->cfg.quant.quant_method, "fp8");
        m->cfg.quant.present = true;
        m->cfg.quant.weight_block_size[0] = br, m->cfg.quant.weight_block_size[1] = bc;
    }
}

/* Bind key as [out, in]; expect `st` and, when refused, every needle in the message. */
static void expect_bind(sq_model *m, const char *key, int out, int in, sparq_status st, const char *n1,
                        const char *n2)
{
    sq_linear l;
    sparq_err_clear();
    const sparq_status got = sq_mdl_bind_linear(m, &l, key, out, in);
    CHECK_MSG(got == st, "%s: status %d, expected %d (%s)", key, got, st, sparq_errmsg());
    if (n1) CHECK_STR_CONTAINS(sparq_errmsg(), n1);
    if (n2) CHECK_STR_CONTAINS(sparq_errmsg(), n2);
    sq_mdl_free_linear(&l);
}

static void test_bind(void)
{
    write_forms();
    sq_model m;
    bind_setup(&m, 32, 32);
    sq_linear l;
    CHECK(sq_mdl_bind_linear(&m, &l, "a", 40, 70) == SPARQ_OK);
    const sf_tensor *aw = sf_find(m.sf, "a.weight"), *as = sf_find(m.sf, "a.scale");
    CHECK(l.kind == SQ_LINEAR_FP8 && l.block_rows == 32 && l.block_cols == 32);
    CHECK(l.w == aw->data && l.scale == as->data); /* in place: no copy */
    CHECK_EQ_INT(m.weights_bytes, 40 * 70 + 6);
    CHECK_EQ_INT(sq_linear_stored_bytes(&l), 40 * 70 + 6);
    sq_mdl_free_linear(&l);
    expect_bind(&m, "b", 40, 70, SPARQ_E_FORMAT, "'b.scale': element [1, 2] is the UE8M0 code 255", "forms.safetensors");
    expect_bind(&m, "c", 40, 70, SPARQ_E_FORMAT, "'c.weight': element [5, 17] is the E4M3 NaN code 0x7F", NULL);
    expect_bind(&m, "c2", 40, 70, SPARQ_E_FORMAT, "'c2.weight': element [39, 69] is the E4M3 NaN code 0xFF", NULL);
    expect_bind(&m, "d", 40, 70, SPARQ_E_SHAPE, "'d.scale' is [2, 2]", "needs [2, 3]");
    expect_bind(&m, "a", 40, 64, SPARQ_E_SHAPE, "'a.weight' holds a [40, 70] weight, expected [40, 64]", NULL);
    CHECK(sq_mdl_bind_linear(&m, &l, "f", 16, 64) == SPARQ_OK);
    CHECK(l.kind == SQ_LINEAR_MXFP4 && l.block_rows == 1 && l.block_cols == 32 && l.in == 64 &&
          l.w == sf_find(m.sf, "f.weight")->data);
    sq_mdl_free_linear(&l);
    expect_bind(&m, "g", 16, 64, SPARQ_E_FORMAT, "'g.scale': element [9, 1] is the UE8M0 code 255", NULL);
    expect_bind(&m, "h", 16, 64, SPARQ_E_SHAPE, "scale 'h.scale'", "[16, 2]");
    expect_bind(&m, "i", 40, 70, SPARQ_E_UNSUPPORTED, "'i.weight': FP8 F8_E5M2 weights are not run in place", NULL);
    CHECK(sq_mdl_bind_linear(&m, &l, "k", 8, 64) == SPARQ_OK && l.kind == SQ_LINEAR_MXFP4);
    sq_mdl_free_linear(&l);
    CHECK(sq_mdl_bind_linear(&m, &l, "z", 8, 16) == SPARQ_OK && l.kind == SQ_LINEAR_BF16 && !l.scale);
    sq_mdl_free_linear(&l);
    expect_bind(&m, "nope", 8, 16, SPARQ_E_NOTFOUND, "tensor 'nope.weight' not found", NULL);
    sf_close(m.sf);

    /* a config's block the scale does not fit */
    bind_setup(&m, 128, 128);
    expect_bind(&m, "a", 40, 70, SPARQ_E_SHAPE, "'a.scale' is [2, 3]", "needs [1, 1]");
    sf_close(m.sf);

    /* no config: the block is inferred (e is 128x128, a 32x32) */
    bind_setup(&m, 0, 0);
    CHECK(sq_mdl_bind_linear(&m, &l, "e", 100, 100) == SPARQ_OK && l.block_rows == 128 && l.block_cols == 128);
    sq_mdl_free_linear(&l);
    CHECK(sq_mdl_bind_linear(&m, &l, "a", 40, 70) == SPARQ_OK && l.block_rows == 32);
    sq_mdl_free_linear(&l);
    expect_bind(&m, "j", 100, 100, SPARQ_E_UNSUPPORTED, "'j.weight_scale_inv': F32 block scales are not run in place",
                NULL);
    sf_close(m.sf);
    sparq_err_clear();
}

/* --- end to end -------------------------------------------------------------------------- */

enum { D = 64, NH = 4, HD = 16, NKV = 2, NL = 3, E = 4, TOPK = 2, I_MOE = 32, I_MLP = 48, V = 100 };

typedef struct pair_writer {
    sf_writer *q, *f; /* the quantized model, the same values as F32 */
} pair_writer;

static void add_bf16_both(pair_writer *p, const char *name, uint64_t d0, uint64_t d1, float scale, float offset)
{
    const uint64_t n = d0 * (d1 ? d1 : 1);
    uint16_t *b = malloc(n * 2);
    for (uint64_t i = 0; i < n; i++) b[i] = sparq_f32_to_bf16(offset + scale * urand());
    add(p->q, name, SF_BF16, d0, d1, b);
    add(p->f, name, SF_BF16, d0, d1, b);
    free(b);
}

/* key.weight + key.scale in the quantized model, key.weight F32 (decoded by
 * formats/safetensors.c) in the other. FP8: E4M3 codes of magnitude
 * 2^-3 .. 2^1 and 32x32 scales 2^-6 .. 2^-3; MXFP4: any nibble, scales
 * 2^-5 .. 2^-3. */
static void add_linear_both(pair_writer *p, const char *key, bool fp4, int out, int in)
{
    const int sr = fp4 ? out : (out + 31) / 32, sc = (in + 31) / 32;
    const size_t wb = fp4 ? (size_t)out * in / 2 : (size_t)out * in;
    uint8_t *w = malloc(wb), *s = malloc((size_t)sr * sc);
    float *f = malloc((size_t)out * in * sizeof(float));
    for (size_t i = 0; i < wb; i++)
        w[i] = fp4 ? (uint8_t)rnd() : (uint8_t)((rnd() & 0x80) | (4 + rnd() % 5) << 3 | (rnd() & 7));
    for (int i = 0; i < sr * sc; i++) s[i] = (uint8_t)(fp4 ? 122 + rnd() % 3 : 121 + rnd() % 4);
    char name[300];
    snprintf(name, sizeof name, "%s.weight", key);
    add(p->q, name, fp4 ? SF_I8 : SF_F8_E4M3, (uint64_t)out, fp4 ? (uint64_t)in / 2 : (uint64_t)in, w);
    sf_tensor tw = {.name = name, .dtype = fp4 ? SF_I8 : SF_F8_E4M3, .ndim = 2,
                    .shape = {(uint64_t)out, fp4 ? (uint64_t)in / 2 : (uint64_t)in}, .data = w};
    tw.numel = tw.shape[0] * tw.shape[1], tw.nbytes = tw.numel;
    sf_tensor ts = {.name = "scale", .dtype = SF_F8_E8M0, .ndim = 2, .shape = {(uint64_t)sr, (uint64_t)sc},
                    .numel = (uint64_t)sr * sc, .nbytes = (uint64_t)sr * sc, .data = s};
    CHECK(fp4 ? sf_dequant_mxfp4(&tw, &ts, f) == SPARQ_OK : sf_dequant_fp8(&tw, &ts, 32, 32, f) == SPARQ_OK);
    add(p->f, name, SF_F32, (uint64_t)out, (uint64_t)in, f);
    snprintf(name, sizeof name, "%s.scale", key);
    add(p->q, name, SF_F8_E8M0, (uint64_t)sr, (uint64_t)sc, s);
    free(w), free(s), free(f);
}

static void write_config(const char *dir, bool fp8)
{
    char path[700], cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"qwen3_moe\", \"hidden_size\": %d, \"num_attention_heads\": %d, \"head_dim\": %d,"
             " \"num_key_value_heads\": %d, \"num_hidden_layers\": %d, \"num_experts\": %d,"
             " \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"intermediate_size\": %d,"
             " \"mlp_only_layers\": [1], \"vocab_size\": %d, \"tie_word_embeddings\": false,"
             " \"norm_topk_prob\": true, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-6%s}",
             D, NH, HD, NKV, NL, E, TOPK, I_MOE, I_MLP, V,
             fp8 ? ", \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"weight_block_size\": "
                   "[32, 32], \"scale_fmt\": \"ue8m0\", \"activation_scheme\": \"dynamic\", \"expert_dtype\": \"fp4\"}"
                 : "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(sparq_file_write_atomic(path, cfg, strlen(cfg)) == SPARQ_OK);
}

static void write_pair(const char *qdir, const char *fdir)
{
    sparq_mkdirs(qdir);
    sparq_mkdirs(fdir);
    write_config(qdir, true);
    write_config(fdir, false);
    char path[700], n[256];
    pair_writer p;
    snprintf(path, sizeof path, "%s/model.safetensors", qdir);
    CHECK(sf_writer_create(&p.q, path) == SPARQ_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", fdir);
    CHECK(sf_writer_create(&p.f, path) == SPARQ_OK);
    add_bf16_both(&p, "model.embed_tokens.weight", V, D, 1.0f, 0);
    add_linear_both(&p, "lm_head", false, V, D); /* 100 rows: a partial last row block */
    add_bf16_both(&p, "model.norm.weight", D, 0, 0.1f, 1.0f);
    for (int L = 0; L < NL; L++) {
#define N(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
        add_linear_both(&p, N("model.layers.%d.self_attn.q_proj", L), false, NH * HD, D);
        add_linear_both(&p, N("model.layers.%d.self_attn.k_proj", L), false, NKV * HD, D);
        add_linear_both(&p, N("model.layers.%d.self_attn.v_proj", L), false, NKV * HD, D);
        add_linear_both(&p, N("model.layers.%d.self_attn.o_proj", L), false, D, NH * HD);
        add_bf16_both(&p, N("model.layers.%d.self_attn.q_norm.weight", L), HD, 0, 0.1f, 1.0f);
        add_bf16_both(&p, N("model.layers.%d.self_attn.k_norm.weight", L), HD, 0, 0.1f, 1.0f);
        add_bf16_both(&p, N("model.layers.%d.input_layernorm.weight", L), D, 0, 0.1f, 1.0f);
        add_bf16_both(&p, N("model.layers.%d.post_attention_layernorm.weight", L), D, 0, 0.1f, 1.0f);
        if (L == 1) { /* dense MLP, FP8; 48 rows: a partial row block */
            add_linear_both(&p, N("model.layers.%d.mlp.gate_proj", L), false, I_MLP, D);
            add_linear_both(&p, N("model.layers.%d.mlp.up_proj", L), false, I_MLP, D);
            add_linear_both(&p, N("model.layers.%d.mlp.down_proj", L), false, D, I_MLP);
        } else {
            add_bf16_both(&p, N("model.layers.%d.mlp.gate.weight", L), E, D, 0.3f, 0);
            for (int e = 0; e < E; e++) {
                add_linear_both(&p, N("model.layers.%d.mlp.experts.%d.gate_proj", L, e), true, I_MOE, D);
                add_linear_both(&p, N("model.layers.%d.mlp.experts.%d.up_proj", L, e), true, I_MOE, D);
                add_linear_both(&p, N("model.layers.%d.mlp.experts.%d.down_proj", L, e), true, D, I_MOE);
            }
        }
#undef N
    }
    CHECK(sf_writer_finish(p.q) == SPARQ_OK);
    CHECK(sf_writer_finish(p.f) == SPARQ_OK);
}

static sq_model *load(const char *dir)
{
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = 64;
    o.max_rows = 32;
    o.n_threads = 2;
    sq_model *m = NULL;
    const sparq_status st = sq_model_load(&m, dir, &o);
    CHECK_MSG(st == SPARQ_OK, "load %s: %s", dir, sparq_errmsg());
    return m;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), s = fmax(s, fabs((double)b[i]));
    return s > 0 ? d / s : d;
}

static void test_model(void)
{
    char qdir[600], fdir[600];
    snprintf(qdir, sizeof qdir, "%s/model-fp8", t_tmpdir());
    snprintf(fdir, sizeof fdir, "%s/model-f32", t_tmpdir());
    write_pair(qdir, fdir);
    sq_model *mq = load(qdir), *mf = load(fdir);
    if (!mq || !mf) {
        sq_model_free(mq);
        sq_model_free(mf);
        return;
    }
    CHECK(sq_model_cfg(mq)->quant.present && sq_model_cfg(mq)->quant.weight_block_size[0] == 32);
    const sq_linear *q = sq_model_linear(mq, 0, 0, 0), *h = sq_model_head_linear(mq);
    CHECK_MSG(q && q->kind == SQ_LINEAR_FP8 && h->kind == SQ_LINEAR_FP8, "layer 0 slot 0 is %s, head %s",
              q ? sq_linear_kind_name(q->kind) : "-", sq_linear_kind_name(h->kind));
    sq_model_mem mq_mem, mf_mem;
    sq_model_mem_report(mq, &mq_mem);
    sq_model_mem_report(mf, &mf_mem);
    CHECK_MSG(mq_mem.weights * 3 < mf_mem.weights, "weights %llu bytes vs %llu as F32",
              (unsigned long long)mq_mem.weights, (unsigned long long)mf_mem.weights);
    enum { P = 20, S = 5 };
    int32_t toks[P + S];
    for (int i = 0; i < P + S; i++) toks[i] = (int32_t)(rnd() % V);
    float *a = malloc((size_t)P * V * 4), *b = malloc((size_t)P * V * 4);
    CHECK(sq_model_forward(mq, 0, toks, P, SQ_LOGITS_ALL, a) == SPARQ_OK); /* 20 rows: the GEMM */
    CHECK(sq_model_forward(mf, 0, toks, P, SQ_LOGITS_ALL, b) == SPARQ_OK);
    double e = rel_diff(a, b, (size_t)P * V);
    CHECK_MSG(e < 1e-4, "prefill logits: max rel diff %.3g from the F32 model", e);
    double ed = 0;
    for (int i = 0; i < S; i++) { /* one row: the GEMV */
        CHECK(sq_model_forward(mq, 0, toks + P + i, 1, SQ_LOGITS_LAST, a) == SPARQ_OK);
        CHECK(sq_model_forward(mf, 0, toks + P + i, 1, SQ_LOGITS_LAST, b) == SPARQ_OK);
        ed = fmax(ed, rel_diff(a, b, V));
    }
    CHECK_MSG(ed < 1e-4, "decode logits: max rel diff %.3g from the F32 model", ed);
    bool finite = true;
    for (int i = 0; i < V; i++) finite &= isfinite(a[i]) != 0;
    CHECK(finite);
    free(a), free(b);
    sq_model_free(mq);
    sq_model_free(mf);
}

int main(void)
{
    RUN(test_bind);
    RUN(test_model);
    return t_summary();
}
