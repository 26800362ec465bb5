/* tests/quantize/test_calib_moe.c — the all-experts MoE capture hook
 * (quantize/calib_moe.c) without a GPU: with the CPU engine, which computes
 * what the runtime's loop computes, the hook must give the runtime's own
 * capture bit for bit — outputs, every Hessian, every row count — for f32,
 * bf16 and MXFP4 experts, plain and clamped SwiGLU, in one pass and in
 * passes of 3 and 1 experts (the routing order, the slot bookkeeping and the
 * pass outputs are what is tested). Then through the models: a Qwen3-MoE and
 * a DeepSeek V4.1 fixture layer, forward_layer with the hook against without,
 * the hidden states and all the layer's Hessians bit for bit. */
#include <stdio.h>

#include "calib_harness.h"
#include "common/alloc.h"
#include "runtime/model.h"
#include "t.h"

static void check_layer(sq_exec *ex, sq_linear_kind kind, float limit, int per_pass)
{
    ch_layer L;
    const int rows[3] = {40, 33, 7};
    ch_make(&L, kind, 8, 64, 32, 2, rows, 3, limit);
    ch_result ref, hook;
    CHECK(ch_run(ex, &L, NULL, 0, &ref) == SPARQ_OK);
    qz_calib_engine eng;
    CHECK(qz_calib_engine_cpu(ex, &eng) == SPARQ_OK);
    const sparq_status st = ch_run(ex, &L, &eng, per_pass, &hook);
    CHECK_MSG(st == SPARQ_OK, "hook: %s", sparq_errmsg());
    double d_out, d_h;
    bool counts, same;
    ch_compare(&L, &hook, &ref, &d_out, &d_h, &counts, &same);
    CHECK_MSG(same && counts, "%s limit %g, %d a pass: outputs %.3g, Hessians %.3g apart, counts %s",
              sq_linear_kind_name(kind), limit, per_pass, d_out, d_h, counts ? "equal" : "differ");
    /* the reference fed every Hessian (a capture of nothing would compare equal too) */
    hess_acc *h = qz_capture_hessian(&ref.cap, 3, 5);
    CHECK(h && h->count == 80 && ch_rel(h->h, (float[1]){0}, 1) > 0);
    ch_result_free(&L, &ref);
    ch_result_free(&L, &hook);
    ch_free(&L);
}

/* A model layer with and without the hook (the CPU engine, passes of 3). */
typedef struct cap_run {
    layer_capture cap;
    float *h;
} cap_run;

static void model_run(sq_model *m, sq_exec *ex, int L, const float *h0, int rows, const int *pos, int seq, int w,
                      bool hook, cap_run *out)
{
    const sq_layer_desc *desc = sq_model_layer_desc(m, L);
    CHECK(qz_capture_init(&out->cap, L, desc, true) == SPARQ_OK);
    out->h = malloc((size_t)rows * w * sizeof(float));
    calib_moe cm;
    int n_pass = 1;
    if (hook) {
        qz_calib_engine eng;
        CHECK(qz_calib_engine_cpu(ex, &eng) == SPARQ_OK);
        CHECK(qz_calib_moe_init(&cm, &out->cap, desc->n_experts, 3, &eng) == SPARQ_OK);
        n_pass = cm.n_pass;
    }
    for (int p = 0; p < n_pass; p++) {
        if (hook) qz_calib_moe_pass(&cm, p);
        memcpy(out->h, h0, (size_t)rows * w * sizeof(float));
        sq_observer obs = {.user = &out->cap, .linear_input = qz_capture_cb, .moe_all = hook ? qz_calib_moe_cb : NULL,
                           .all_experts = true};
        const sparq_status st = sq_model_forward_layer(m, L, out->h, rows, pos, seq, &obs);
        CHECK_MSG(st == SPARQ_OK, "layer %d: %s", L, sparq_errmsg());
        if (hook) CHECK(qz_calib_moe_pass_end(&cm) == SPARQ_OK);
    }
    if (hook) qz_calib_moe_free(&cm);
}

static void check_model(const char *name, bool need_seq)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", t_data_path(name));
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = 64;
    o.max_rows = 24;
    o.n_threads = 2;
    o.n_seq = 1;
    sq_model *m = NULL;
    sparq_status st = sq_model_load(&m, dir, &o);
    CHECK_MSG(st == SPARQ_OK, "load %s: %s", dir, sparq_errmsg());
    if (st != SPARQ_OK) return;
    const sq_model_config *cfg = sq_model_cfg(m);
    const int rows = 24, w = (int)sq_arch_hidden_width(cfg);
    int32_t tok[24];
    int pos[24];
    for (int r = 0; r < rows; r++) tok[r] = (r * 37 + 11) % 1000, pos[r] = r;
    float *h0 = malloc((size_t)rows * w * sizeof(float));
    CHECK(sq_model_embed(m, tok, rows, h0) == SPARQ_OK);
    int L = -1;
    for (int l = 0; l < (int)cfg->num_hidden_layers && L < 0; l++) {
        const sq_layer_desc *d = sq_model_layer_desc(m, l);
        if (d && d->moe && l > 0) L = l;
    }
    CHECK_MSG(L > 0, "%s: no MoE layer", name);
    /* the layer's input: the layers before it, no observer */
    const int seq = need_seq ? 0 : -1;
    for (int l = 0; l < L; l++) CHECK(sq_model_forward_layer(m, l, h0, rows, pos, seq, NULL) == SPARQ_OK);
    sq_exec *ex = NULL;
    CHECK(sq_exec_create(&ex, 2) == SPARQ_OK);
    CHECK(sq_exec_reserve(ex, sq_exec_scratch_floats(4096, 64)) == SPARQ_OK);
    cap_run a, b;
    model_run(m, ex, L, h0, rows, pos, seq, w, false, &a);
    model_run(m, ex, L, h0, rows, pos, seq, w, true, &b);
    CHECK_MSG(memcmp(a.h, b.h, (size_t)rows * w * sizeof(float)) == 0, "%s layer %d: the hook's hidden states differ",
              name, L);
    const sq_layer_desc *desc = sq_model_layer_desc(m, L);
    int n_h = 0;
    for (int s = 0; s < desc->n_slots; s++)
        for (int i = 0; i < a.cap.n_h[s]; i++) {
            const hess_acc *x = &a.cap.h[s][i], *y = &b.cap.h[s][i];
            CHECK_MSG(x->count == y->count && x->k == y->k && (!x->h) == (!y->h), "%s layer %d: %s/%d count %llu vs %llu",
                      name, L, desc->slot[s].name, i, (unsigned long long)x->count, (unsigned long long)y->count);
            if (x->h && y->h && x->k == y->k) {
                CHECK_MSG(memcmp(x->h, y->h, (size_t)x->k * x->k * sizeof(float)) == 0, "%s layer %d: %s/%d differs",
                          name, L, desc->slot[s].name, i);
                n_h++;
            }
        }
    CHECK_MSG(n_h > desc->n_experts, "%s: only %d Hessians compared", name, n_h);
    printf("%s layer %d: %d Hessians and the hidden states bit for bit\n", name, L, n_h);
    qz_capture_free(&a.cap), qz_capture_free(&b.cap);
    free(a.h), free(b.h), free(h0);
    sq_exec_free(ex);
    sq_model_free(m);
}

int main(void)
{
    sq_exec *ex = NULL;
    CHECK(sq_exec_create(&ex, 2) == SPARQ_OK);
    CHECK(sq_exec_reserve(ex, sq_exec_scratch_floats(4096, 64)) == SPARQ_OK);
    const sq_linear_kind kinds[] = {SQ_LINEAR_F32, SQ_LINEAR_BF16, SQ_LINEAR_MXFP4};
    for (int k = 0; k < 3; k++)
        for (int pp = 0; pp < 3; pp++) {
            const int per[] = {8, 3, 1};
            check_layer(ex, kinds[k], 0.0f, per[pp]);
            check_layer(ex, kinds[k], 0.75f, per[pp]);
        }
    sq_exec_free(ex);
    check_model("tiny-qwen3moe", false);
    check_model("tiny-dsv41", true);
    return t_summary();
}
