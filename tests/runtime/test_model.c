/* tests/runtime/test_model.c — the Qwen3-MoE graph on a small random model
 * written by the test itself (config.json + bf16 safetensors, with a dense
 * mlp_only layer and an untied head): KV-cache decode equals full prefill,
 * chunked prefill equals one step, the cache-less layer API on a batch of two
 * sequences equals running them separately, the observer sees every linear's
 * input, calibration mode (all_experts) leaves the output unchanged, a
 * swapped-in linear is used, errors are clean, and allocation failures during
 * load are handled. Numerical agreement with transformers is the golden
 * suite's job (test_golden.c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "formats/safetensors.h"
#include "kernels/cpu/ops.h"
#include "runtime/arch.h"
#include "runtime/model.h"
#include "t.h"

enum { D = 64, NH = 4, HD = 16, NKV = 2, NL = 3, E = 8, TOPK = 2, I_MOE = 32, I_MLP = 48, V = 100 };

static uint64_t rs = 99;
static float urand(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void add_t(sf_writer *w, const char *name, uint64_t d0, uint64_t d1, float scale, float offset)
{
    uint64_t n = d0 * (d1 ? d1 : 1), shape[2] = {d0, d1};
    uint16_t *b = malloc(n * 2);
    for (uint64_t i = 0; i < n; i++) b[i] = sparq_f32_to_bf16(offset + scale * urand());
    CHECK(sf_writer_add(w, name, SF_BF16, d1 ? 2 : 1, shape, b, n * 2) == SPARQ_OK);
    free(b);
}

static char model_dir[512];

static void write_model(bool drop_one)
{
    snprintf(model_dir, sizeof model_dir, "%s/model%s", t_tmpdir(), drop_one ? "-broken" : "");
    sparq_mkdirs(model_dir);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    const char *cfg = "{\"model_type\": \"qwen3_moe\", \"architectures\": [\"Qwen3MoeForCausalLM\"],"
                      "\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 16, \"num_key_value_heads\": 2,"
                      "\"num_hidden_layers\": 3, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                      "\"moe_intermediate_size\": 32, \"intermediate_size\": 48, \"mlp_only_layers\": [1],"
                      "\"vocab_size\": 100, \"tie_word_embeddings\": false, \"norm_topk_prob\": true,"
                      "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0}";
    CHECK(sparq_file_write_atomic(path, cfg, strlen(cfg)) == SPARQ_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    sf_writer *w;
    CHECK(sf_writer_create(&w, path) == SPARQ_OK);
    char n[256];
    add_t(w, "model.embed_tokens.weight", V, D, 1.0f, 0);
    add_t(w, "lm_head.weight", V, D, 0.2f, 0);
    add_t(w, "model.norm.weight", D, 0, 0.1f, 1.0f);
    for (int L = 0; L < NL; L++) {
#define N(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
        add_t(w, N("model.layers.%d.self_attn.q_proj.weight", L), NH * HD, D, 0.15f, 0);
        if (!(drop_one && L == 2)) add_t(w, N("model.layers.%d.self_attn.k_proj.weight", L), NKV * HD, D, 0.15f, 0);
        add_t(w, N("model.layers.%d.self_attn.v_proj.weight", L), NKV * HD, D, 0.15f, 0);
        add_t(w, N("model.layers.%d.self_attn.o_proj.weight", L), D, NH * HD, 0.15f, 0);
        add_t(w, N("model.layers.%d.self_attn.q_norm.weight", L), HD, 0, 0.1f, 1.0f);
        add_t(w, N("model.layers.%d.self_attn.k_norm.weight", L), HD, 0, 0.1f, 1.0f);
        add_t(w, N("model.layers.%d.input_layernorm.weight", L), D, 0, 0.1f, 1.0f);
        add_t(w, N("model.layers.%d.post_attention_layernorm.weight", L), D, 0, 0.1f, 1.0f);
        if (L == 1) {
            add_t(w, N("model.layers.%d.mlp.gate_proj.weight", L), I_MLP, D, 0.15f, 0);
            add_t(w, N("model.layers.%d.mlp.up_proj.weight", L), I_MLP, D, 0.15f, 0);
            add_t(w, N("model.layers.%d.mlp.down_proj.weight", L), D, I_MLP, 0.15f, 0);
        } else {
            add_t(w, N("model.layers.%d.mlp.gate.weight", L), E, D, 0.3f, 0);
            for (int e = 0; e < E; e++) {
                add_t(w, N("model.layers.%d.mlp.experts.%d.gate_proj.weight", L, e), I_MOE, D, 0.15f, 0);
                add_t(w, N("model.layers.%d.mlp.experts.%d.up_proj.weight", L, e), I_MOE, D, 0.15f, 0);
                add_t(w, N("model.layers.%d.mlp.experts.%d.down_proj.weight", L, e), D, I_MOE, 0.15f, 0);
            }
        }
#undef N
    }
    CHECK(sf_writer_finish(w) == SPARQ_OK);
}

static sq_model *load(int max_rows, int ctx, int n_seq)
{
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.max_rows = max_rows;
    o.ctx = ctx;
    o.n_seq = n_seq;
    o.n_threads = 2;
    sq_model *m = NULL;
    sparq_status st = sq_model_load(&m, model_dir, &o);
    CHECK_MSG(st == SPARQ_OK, "load: %s", sparq_errmsg());
    return m;
}

static int32_t toks[64];

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_decode_equals_prefill(void)
{
    sq_model *big = load(64, 128, 2), *small = load(7, 128, 1);
    if (!big || !small) return;
    const int n = 40;
    float *a = malloc((size_t)n * V * 4), *b = malloc((size_t)n * V * 4), *c = malloc((size_t)V * 4);
    CHECK(sq_model_forward(big, 0, toks, n, SQ_LOGITS_ALL, a) == SPARQ_OK);
    CHECK(sq_model_forward(small, 0, toks, n, SQ_LOGITS_ALL, b) == SPARQ_OK); /* 6 chunks of ≤ 7 */
    double d1 = max_diff(a, b, (size_t)n * V);
    CHECK_MSG(d1 < 1e-4, "chunked prefill differs by %.3g", d1);
    double d2 = 0;
    for (int p = 0; p < n; p++) {
        CHECK(sq_model_forward(big, 1, toks + p, 1, SQ_LOGITS_LAST, c) == SPARQ_OK);
        d2 = fmax(d2, max_diff(c, a + (size_t)p * V, V));
    }
    CHECK_MSG(d2 < 1e-4, "decode differs from prefill by %.3g", d2);
    CHECK_EQ_INT(sq_model_seq_len(big, 1), n);
    /* truncate and continue: same logits as before */
    sq_model_seq_truncate(big, 1, 20);
    CHECK(sq_model_forward(big, 1, toks + 20, 1, SQ_LOGITS_LAST, c) == SPARQ_OK);
    CHECK(max_diff(c, a + (size_t)20 * V, V) < 1e-4);
    /* the cache is full at ctx */
    sq_model_seq_reset(big, 0);
    int32_t many[129] = {0};
    CHECK(sq_model_forward(big, 0, many, 129, SQ_LOGITS_NONE, NULL) == SPARQ_E_RANGE);
    int32_t bad = V;
    CHECK(sq_model_forward(big, 0, &bad, 1, SQ_LOGITS_LAST, c) == SPARQ_E_RANGE);
    free(a), free(b), free(c);
    sq_model_free(big), sq_model_free(small);
}

/* decode_batch: three sequences of different lengths stepped together give
 * the logits each gets alone */
static void test_decode_batch(void)
{
    sq_model *m = load(8, 64, 3), *solo = load(8, 64, 1);
    if (!m || !solo) return;
    const int lens[3] = {5, 11, 2};
    float *lg = malloc((size_t)3 * V * 4), *one = malloc((size_t)V * 4);
    for (int s = 0; s < 3; s++) CHECK(sq_model_forward(m, s, toks + 7 * s, lens[s], SQ_LOGITS_NONE, NULL) == SPARQ_OK);
    int seqs[3] = {2, 0, 1};
    int32_t next[3];
    double d = 0;
    for (int step = 0; step < 4; step++) {
        for (int r = 0; r < 3; r++) next[r] = toks[40 + 3 * step + r];
        CHECK(sq_model_decode_batch(m, 3, seqs, next, lg) == SPARQ_OK);
        for (int r = 0; r < 3; r++) {
            const int s = seqs[r];
            sq_model_seq_reset(solo, 0);
            CHECK(sq_model_forward(solo, 0, toks + 7 * s, lens[s], SQ_LOGITS_NONE, NULL) == SPARQ_OK);
            for (int q = 0; q <= step; q++) {
                int32_t t = toks[40 + 3 * q + r];
                CHECK(sq_model_forward(solo, 0, &t, 1, SQ_LOGITS_LAST, one) == SPARQ_OK);
            }
            d = fmax(d, max_diff(lg + (size_t)r * V, one, V));
        }
    }
    CHECK_MSG(d < 1e-4, "batched decode differs from solo decode by %.3g", d);
    CHECK_EQ_INT(sq_model_seq_len(m, 0), lens[0] + 4);
    CHECK_EQ_INT(sq_model_seq_len(m, 2), lens[2] + 4);
    int dup[2] = {1, 1};
    CHECK(sq_model_decode_batch(m, 2, dup, next, lg) == SPARQ_E_ARG);
    int bad[1] = {3};
    CHECK(sq_model_decode_batch(m, 1, bad, next, lg) == SPARQ_E_RANGE);
    free(lg), free(one);
    sq_model_free(m), sq_model_free(solo);
}

/* The observer's slots, by what they are in a Qwen3-MoE layer. */
enum { LQ, LK, LV, LO, LROUTER, LGATE, LUP, LDOWN, LCOUNT };

typedef struct obs_log {
    sq_model *m;
    int calls[LCOUNT];
    int rows_q, router_rows, router_k, down_rows_all;
    int bad;
} obs_log;

static int slot_kind(const sq_model *m, int layer, int slot)
{
    static const char *const names[LCOUNT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate", "gate_proj", "up_proj",
                                              "down_proj"};
    const sq_layer_desc *d = sq_model_layer_desc(m, layer);
    if (!d || slot < 0 || slot >= d->n_slots) return -1;
    const char *n = d->slot[slot].name;
    if (!strncmp(n, "experts.", 8)) n += 8;
    for (int i = 0; i < LCOUNT; i++)
        if (!strcmp(n, names[i])) return i;
    return -1;
}

static void on_input(void *u, int layer, int slot, int expert, const float *x, int rows, int in)
{
    obs_log *l = u;
    const int which = slot_kind(l->m, layer, slot);
    if (which < 0) {
        l->bad++;
        return;
    }
    l->calls[which]++;
    if (which == LQ && layer == 0) l->rows_q = rows;
    if (which == LDOWN && layer == 0 && expert == 3) l->down_rows_all = rows;
    int want_in = which == LO ? NH * HD : which == LDOWN ? (layer == 1 ? I_MLP : I_MOE) : D;
    if (in != want_in || !x) l->bad++;
    for (int i = 0; i < rows * in; i++)
        if (!isfinite(x[i])) l->bad++;
}

static void on_router(void *u, int layer, int rows, int k, const int *idx, const float *w)
{
    obs_log *l = u;
    (void)layer;
    l->router_rows = rows;
    l->router_k = k;
    for (int r = 0; r < rows; r++) {
        float s = 0;
        for (int i = 0; i < k; i++) {
            if (idx[r * k + i] < 0 || idx[r * k + i] >= E || (i && w[r * k + i] > w[r * k + i - 1])) l->bad++;
            s += w[r * k + i];
        }
        if (fabsf(s - 1) > 1e-5f) l->bad++; /* norm_topk_prob */
    }
}

/* forward_layer without cache on two concatenated sequences == separate runs */
static void test_layer_api(void)
{
    sq_model *m = load(64, 64, 1);
    if (!m) return;
    const int na = 20, nb = 15, n = na + nb;
    float *h = malloc((size_t)n * D * 4), *h2 = malloc((size_t)n * D * 4), *lg = malloc((size_t)n * V * 4),
          *ref = malloc((size_t)na * V * 4);
    int pos[64];
    for (int r = 0; r < n; r++) pos[r] = r < na ? r : r - na;
    CHECK(sq_model_embed(m, toks, n, h) == SPARQ_OK);
    memcpy(h2, h, (size_t)n * D * 4);
    obs_log log = {.m = m};
    sq_observer obs = {.user = &log, .linear_input = on_input, .router = on_router};
    for (int L = 0; L < NL; L++) CHECK(sq_model_forward_layer(m, L, h, n, pos, -1, &obs) == SPARQ_OK);
    CHECK(sq_model_head(m, h, n, lg) == SPARQ_OK);
    CHECK_EQ_INT(log.bad, 0);
    CHECK_EQ_INT(log.rows_q, n);
    CHECK_EQ_INT(log.calls[LQ], NL);
    CHECK_EQ_INT(log.calls[LROUTER], 2); /* layer 1 is dense */
    CHECK_EQ_INT(log.router_rows, n);
    CHECK_EQ_INT(log.router_k, TOPK);
    CHECK(log.calls[LGATE] == log.calls[LUP] && log.calls[LGATE] >= 3);
    /* the same tokens through the cached path, sequence by sequence */
    CHECK(sq_model_forward(m, 0, toks, na, SQ_LOGITS_ALL, ref) == SPARQ_OK);
    double d = max_diff(lg, ref, (size_t)na * V);
    sq_model_seq_reset(m, 0);
    CHECK(sq_model_forward(m, 0, toks + na, nb, SQ_LOGITS_ALL, ref) == SPARQ_OK);
    d = fmax(d, max_diff(lg + (size_t)na * V, ref, (size_t)nb * V));
    CHECK_MSG(d < 1e-4, "layer API differs from forward by %.3g", d);

    /* calibration mode: every expert sees every row, the output is unchanged */
    obs_log log2 = {.m = m};
    sq_observer all = {.user = &log2, .linear_input = on_input, .all_experts = true};
    for (int L = 0; L < NL; L++) CHECK(sq_model_forward_layer(m, L, h2, n, pos, -1, &all) == SPARQ_OK);
    CHECK_EQ_INT(log2.bad, 0);
    CHECK_EQ_INT(log2.calls[LGATE], 2 * E + 1);
    CHECK_EQ_INT(log2.down_rows_all, n);
    d = max_diff(h, h2, (size_t)n * D);
    CHECK_MSG(d < 1e-4, "all_experts changes the hidden state by %.3g", d);

    /* bad positions are refused */
    int badpos[3] = {0, 2, 3};
    CHECK(sq_model_forward_layer(m, 0, h, 3, badpos, -1, NULL) == SPARQ_E_ARG);
    CHECK(sq_model_forward_layer(m, 0, h, 65, pos, -1, NULL) == SPARQ_E_RANGE);
    CHECK(sq_model_forward_layer(m, NL, h, 1, pos, -1, NULL) == SPARQ_E_RANGE);
    free(h), free(h2), free(lg), free(ref);
    sq_model_free(m);
}

/* A linear replaced through sq_model_linear() is what the graph runs. */
static int custom_calls;
static void custom_forward(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    custom_calls++;
    const sq_linear *inner = l->impl; /* the original bf16 linear */
    ex->be->linear(ex, inner, x, rows, y);
}

static void test_linear_swap(void)
{
    sq_model *m = load(16, 32, 1);
    if (!m) return;
    float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    CHECK(sq_model_forward(m, 0, toks, 30, SQ_LOGITS_LAST, a) == SPARQ_OK);
    const int down = sq_layer_find(sq_model_layer_desc(m, 2), "experts.down_proj");
    sq_linear *l = sq_model_linear(m, 2, down, 5);
    CHECK(l != NULL && l->in == I_MOE && l->out == D);
    CHECK(sq_layer_find(sq_model_layer_desc(m, 1), "gate") < 0); /* layer 1 is dense: no router */
    CHECK(sq_model_linear(m, 1, sq_layer_find(sq_model_layer_desc(m, 1), "gate_proj"), 1) == NULL);
    CHECK(sq_model_linear(m, 2, down, E) == NULL && sq_model_linear(m, 2, 99, 0) == NULL);
    CHECK(sq_model_layer_is_moe(m, 0) && !sq_model_layer_is_moe(m, 1));
    sq_linear orig = *l;
    l->kind = SQ_LINEAR_EXL3;
    l->impl = &orig;
    l->forward = custom_forward;
    sq_model_seq_reset(m, 0);
    CHECK(sq_model_forward(m, 0, toks, 30, SQ_LOGITS_LAST, b) == SPARQ_OK);
    CHECK_MSG(custom_calls > 0, "custom linear never called (expert 5 of layer 2 unused?)");
    CHECK(memcmp(a, b, (size_t)V * 4) == 0);
    *l = orig;
    free(a), free(b);
    sq_model_free(m);
}

/* The architecture's description (runtime/arch.h): slots, keys, groups, and
 * the quantizer's question "is this tensor a linear it converts?". */
static void test_arch_desc(void)
{
    sq_model *m = load(16, 32, 1);
    if (!m) return;
    const sq_model_config *c = sq_model_cfg(m);
    sq_layer_desc d;
    CHECK(sq_arch_layer(c, 0, &d) == SPARQ_OK);
    CHECK(d.moe && d.n_experts == E && d.n_slots == 8);
    const int q = sq_layer_find(&d, "q_proj"), k = sq_layer_find(&d, "k_proj"), o = sq_layer_find(&d, "o_proj");
    const int r = sq_layer_find(&d, "gate"), g = sq_layer_find(&d, "experts.gate_proj");
    const int u = sq_layer_find(&d, "experts.up_proj"), dn = sq_layer_find(&d, "experts.down_proj");
    CHECK(q >= 0 && k >= 0 && o >= 0 && r >= 0 && g >= 0 && u >= 0 && dn >= 0 && sq_layer_find(&d, "nope") < 0);
    CHECK(d.slot[k].group == q && d.slot[o].group == o && d.slot[u].group == g && d.slot[dn].group == dn);
    CHECK(d.slot[dn].own_input && !d.slot[g].own_input);
    CHECK(!d.slot[r].quantize && d.slot[r].role == SQ_ROLE_ROUTER && d.slot[g].role == SQ_ROLE_EXPERT);
    CHECK(d.slot[g].instances == E && d.slot[q].instances == 1);
    CHECK(d.slot[o].in == NH * HD && d.slot[o].out == D && d.slot[dn].in == I_MOE);
    char key[64];
    CHECK(sq_lin_key(&d.slot[dn], 2, 7, key, sizeof key) == SPARQ_OK);
    CHECK(strcmp(key, "model.layers.2.mlp.experts.7.down_proj") == 0);
    CHECK(sq_lin_key(&d.slot[dn], 2, 7, key, 10) == SPARQ_E_RANGE);
    /* the key names the tensor the model bound there */
    CHECK(sq_lin_key(&d.slot[q], 0, 0, key, sizeof key) == SPARQ_OK);
    CHECK(strcmp(sq_model_linear(m, 0, q, 0)->name, key) == 0);
    CHECK(sq_arch_layer(c, 1, &d) == SPARQ_OK);
    CHECK(!d.moe && d.n_slots == 7 && sq_layer_find(&d, "down_proj") >= 0 && sq_layer_find(&d, "gate") < 0);
    CHECK(d.slot[sq_layer_find(&d, "down_proj")].in == I_MLP && d.slot[sq_layer_find(&d, "up_proj")].role == SQ_ROLE_MLP);
    CHECK(sq_arch_layer(c, NL, &d) == SPARQ_E_RANGE);
    int L = -2;
    CHECK(sq_arch_is_quant_linear(c, "model.layers.2.mlp.experts.7.down_proj", &L) && L == 2);
    CHECK(sq_arch_is_quant_linear(c, "model.layers.1.mlp.down_proj", &L) && L == 1);
    CHECK(sq_arch_is_quant_linear(c, "model.layers.0.self_attn.v_proj", &L) && L == 0);
    CHECK(!sq_arch_is_quant_linear(c, "model.layers.0.mlp.gate", &L) && L == -1);          /* router */
    CHECK(!sq_arch_is_quant_linear(c, "model.layers.1.mlp.experts.0.down_proj", NULL));   /* dense layer */
    CHECK(!sq_arch_is_quant_linear(c, "model.layers.0.mlp.experts.8.down_proj", NULL));   /* expert E */
    CHECK(!sq_arch_is_quant_linear(c, "model.layers.3.self_attn.q_proj", NULL));          /* layer NL */
    CHECK(!sq_arch_is_quant_linear(c, "model.layers.0.self_attn.q_proj.x", NULL));
    CHECK(!sq_arch_is_quant_linear(c, "model.layers.0.input_layernorm", NULL));
    CHECK(!sq_arch_is_quant_linear(c, "lm_head", NULL));
    CHECK(strcmp(sq_lin_role_name(SQ_ROLE_EXPERT), "expert") == 0);
    sq_model_free(m);
}

/* The config against the checkpoint's tensors (runtime/arch.h), from headers:
 * the model as written passes; a config that says more or fewer layers,
 * other sizes, or a scope (a bundle node) that leaves tensors unused does
 * not, each problem named; allocation failures are clean. */
static void test_arch_check(void)
{
    sq_model_config c;
    sf_model *sf = NULL;
    CHECK(sq_config_load(&c, model_dir) == SPARQ_OK);
    CHECK(sf_open(&sf, model_dir) == SPARQ_OK);
    if (!sf) return;
    sq_arch_problems p;
    CHECK_MSG(sq_arch_check_tensors(&c, sf, NULL, "m", &p) == SPARQ_OK, "%s", sparq_errmsg());
    CHECK(p.n == 0 && p.n_lines == 0);
    sq_arch_problems_free(&p);
    /* a node holding layer 1 only, without embeddings and head: the rest is not its */
    CHECK(sq_arch_check_tensors(&c, sf, &(sq_arch_scope){1, 2, false, false}, "m", &p) == SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "m: config.json and the tensors disagree (");
    CHECK_STR_CONTAINS(sparq_errmsg(), "of layer 0, which is not among the layers 1..1 read here: left unused");
    CHECK_EQ_INT(p.n, 2 * (4 + 4 + 1 + 3 * E) + 3); /* layers 0 and 2, embed, head, norm */
    sq_arch_problems_free(&p);
    /* the same node with the head: lm_head and model.norm are read */
    CHECK(sq_arch_check_tensors(&c, sf, &(sq_arch_scope){1, 3, false, true}, "m", &p) == SPARQ_E_FORMAT);
    CHECK_EQ_INT(p.n, (4 + 4 + 1 + 3 * E) + 1);
    sq_arch_problems_free(&p);
    /* fewer layers than the file has */
    c.num_hidden_layers = 2;
    CHECK(sq_arch_check_tensors(&c, sf, NULL, "m", NULL) == SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "the tensors of layer 2 ('model.layers.2.");
    CHECK_STR_CONTAINS(sparq_errmsg(), "are left unused: config.json says num_hidden_layers 2");
    /* more */
    c.num_hidden_layers = 10;
    CHECK(sq_arch_check_tensors(&c, sf, NULL, "m", &p) == SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "layers 3..9 have no tensors (config.json: num_hidden_layers 10)");
    CHECK_EQ_INT(p.n, 1);
    sq_arch_problems_free(&p);
    c.num_hidden_layers = NL;
    /* other sizes: every tensor of that size disagrees, named with both shapes */
    c.moe_intermediate_size = 2 * I_MOE;
    CHECK(sq_arch_check_tensors(&c, sf, NULL, "m", &p) == SPARQ_E_SHAPE);
    CHECK_EQ_INT(p.n, 2 * 3 * E);
    CHECK_STR_CONTAINS(p.line[0], "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' (layer 0 experts.gate_proj "
                                  "0): shape [32, 64], expected [64, 64]");
    CHECK_STR_CONTAINS(sparq_errmsg(), "; and 45 more");
    sq_arch_problems_free(&p);
    c.moe_intermediate_size = I_MOE;
    c.vocab_size = V + 1;
    CHECK(sq_arch_check_tensors(&c, sf, NULL, "m", NULL) == SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "'lm_head.weight' (the head): shape [100, 64], expected [101, 64]");
    CHECK_STR_CONTAINS(sparq_errmsg(), "'model.embed_tokens.weight' (the embeddings): shape [100, 64], expected [101, 64]");
    c.vocab_size = V;
    /* a tied head may be absent (not here: it is present and checked) */
    c.tie_word_embeddings = true;
    CHECK(sq_arch_check_tensors(&c, sf, NULL, "m", NULL) == SPARQ_OK);
    /* the model is read as its config says, or not at all */
    int ok = 0, failed = 0;
    for (uint64_t nth = 1; nth < 2000 && !ok; nth++) {
        sparq_alloc_fail_at(nth, false);
        sparq_status st = sq_arch_check_tensors(&c, sf, &(sq_arch_scope){1, 2, false, false}, "m", &p);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_E_FORMAT) ok = 1;
        else CHECK_MSG(st == SPARQ_E_NOMEM && p.n_lines == 0, "nth %llu: %d %s", (unsigned long long)nth, st,
                       sparq_errmsg());
        failed += st == SPARQ_E_NOMEM;
        sq_arch_problems_free(&p);
    }
    CHECK(ok && failed > 3);
    sf_close(sf);
    sq_config_free(&c);
    /* an EXL3 model: <key>.trellis / .suh / .svh / .mul1 and a separate lm_head with tied embeddings */
    CHECK(sq_config_load(&c, t_data_path("exl3-model/exl3-3.0bpw")) == SPARQ_OK);
    CHECK(sf_open(&sf, t_data_path("exl3-model/exl3-3.0bpw")) == SPARQ_OK);
    CHECK_MSG(sf && sq_arch_check_tensors(&c, sf, NULL, "exl3", NULL) == SPARQ_OK, "%s", sparq_errmsg());
    sf_close(sf);
    sq_config_free(&c);
}

static void test_mem_report(void)
{
    sq_model *m = load(32, 100, 3);
    if (!m) return;
    sq_model_mem mm;
    sq_model_mem_report(m, &mm);
    CHECK_EQ_INT(mm.kv, 2ull * NL * 3 * 100 * NKV * HD * 4);
    CHECK_EQ_INT(mm.kv, mm.plan_kv);
    CHECK(mm.workspace > 0 && mm.plan_workspace > 0);
    /* every bf16 tensor is counted once (embed + head + norm + layers) */
    uint64_t w = 2ull * V * D * 2 + D * 2;
    w += NL * ((2ull * NH * HD * D + 2ull * NKV * HD * D) * 2 + 2 * HD * 2 + 2 * D * 2);
    w += 2 * ((uint64_t)E * D * 2 + (uint64_t)E * 3 * I_MOE * D * 2) + 3ull * I_MLP * D * 2;
    CHECK_EQ_INT(mm.weights, w);
    sq_model_free(m);
}

static void test_errors(void)
{
    char good[512];
    snprintf(good, sizeof good, "%s", model_dir);
    write_model(true);
    sq_model *m = NULL;
    sparq_status st = sq_model_load(&m, model_dir, NULL);
    CHECK(st == SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "model.layers.2.self_attn.k_proj.weight");
    CHECK(m == NULL);
    snprintf(model_dir, sizeof model_dir, "%s", good);
    CHECK(sq_model_load(&m, "/nonexistent/model", NULL) != SPARQ_OK);
}

static void test_alloc_faults(void)
{
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = 32;
    o.max_rows = 8;
    o.n_threads = 1;
    int ok = 0, failed = 0;
    for (uint64_t nth = 1; nth < 5000; nth++) {
        sq_model *m = NULL;
        sparq_alloc_fail_at(nth, false);
        sparq_status st = sq_model_load(&m, model_dir, &o);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_OK) {
            sq_model_free(m);
            ok = 1;
            break;
        }
        failed++;
        CHECK(m == NULL);
        CHECK(sparq_errmsg()[0] != 0);
    }
    CHECK(ok);
    CHECK(failed > 10);
}

int main(void)
{
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)((i * 37 + 11) % V);
    write_model(false);
    RUN(test_decode_equals_prefill);
    RUN(test_decode_batch);
    RUN(test_layer_api);
    RUN(test_linear_swap);
    RUN(test_arch_desc);
    RUN(test_arch_check);
    RUN(test_mem_report);
    RUN(test_errors);
    RUN(test_alloc_faults);
    return t_summary();
}
