/* tests/runtime/test_golden.c FIXTURE — the CPU runtime against transformers'
 * golden data of a fixture model (tests/data/FIXTURE/golden/, format in its
 * README.md; made by tools/fixtures/make_golden.py in fp32):
 *  - logits of 4 sequences × 64 positions: max abs and relative error
 *    (relative = max |Δ| / max |ref|, must be ≤ 1e-3);
 *  - the hidden-state RMS after every layer (layer-at-a-time API);
 *  - router choices identical (a swap is allowed only where transformers'
 *    two weights tie within 1e-5) and router weights;
 *  - top-20 log-probs at 1024 positions of two full 512-token windows;
 *  - perplexity of eval.txt at ctx 512 within 0.1 % (runtime/eval.h scoring);
 *  - greedy continuations (64 tokens, plain and chat prompts) token for token.
 * Skips (exit 77, saying why) while the fixture is not there. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/safetensors.h"
#include "runtime/eval.h"
#include "runtime/model.h"
#include "t.h"

static sq_model *m;
static sf_model *g;
static json_t *gj;
static int V, NLAYERS, TOPK;
static char dir[4096];

static const sf_tensor *gt(const char *name, sf_dtype dt)
{
    const sf_tensor *t = sf_find(g, name);
    CHECK_MSG(t && t->dtype == dt, "golden tensor %s missing or not %s", name, sf_dtype_name(dt));
    return t && t->dtype == dt ? t : NULL;
}

static void test_logits(void)
{
    const sf_tensor *ids = gt("eval_ids", SF_I32), *lt = gt("logits", SF_F32);
    if (!ids || !lt) return;
    CHECK(lt->ndim == 3 && lt->shape[0] == 4 && lt->shape[1] == 64 && lt->shape[2] == (uint64_t)V);
    const int32_t *id = ids->data;
    const float *ref = lt->data;
    float *lg = malloc((size_t)64 * V * 4);
    double maxabs = 0, maxref = 0;
    int agree = 0;
    for (int s = 0; s < 4; s++) {
        sq_model_seq_reset(m, 0);
        CHECK(sq_model_forward(m, 0, id + s * 512, 64, SQ_LOGITS_ALL, lg) == SPARQ_OK);
        for (int p = 0; p < 64; p++) {
            const float *r = ref + ((size_t)s * 64 + p) * V, *o = lg + (size_t)p * V;
            int a = 0, b = 0;
            for (int v = 0; v < V; v++) {
                maxabs = fmax(maxabs, fabs((double)o[v] - r[v]));
                maxref = fmax(maxref, fabs(r[v]));
                if (r[v] > r[a]) a = v;
                if (o[v] > o[b]) b = v;
            }
            agree += a == b;
        }
    }
    fprintf(stderr, "logits [4, 64, %d]: max abs err %.3g, max |ref| %.3g, relative %.3g, argmax equal %d/256\n", V,
            maxabs, maxref, maxabs / maxref, agree);
    CHECK_MSG(maxabs / maxref <= 1e-3, "relative error %.3g", maxabs / maxref);
    CHECK_EQ_INT(agree, 256);
    free(lg);
}

typedef struct router_log {
    int layer_slot[512]; /* layer -> index among MoE layers */
    int32_t *idx;        /* [n_moe, 64, k] */
    float *w;
} router_log;

static void on_router(void *u, int layer, int rows, int k, const int *idx, const float *w)
{
    router_log *r = u;
    int s = r->layer_slot[layer];
    for (int i = 0; i < rows * k; i++) {
        r->idx[(size_t)s * 64 * k + i] = idx[i];
        r->w[(size_t)s * 64 * k + i] = w[i];
    }
}

static void test_hidden_and_router(void)
{
    const sf_tensor *ids = gt("eval_ids", SF_I32), *hr = gt("hidden_rms", SF_F32), *rt = gt("router_topk", SF_I32),
                    *rw = gt("router_weights", SF_F32);
    if (!ids || !hr || !rt || !rw) return;
    const int d = (int)sq_model_cfg(m)->hidden_size;
    const int n_moe = (int)rt->shape[0];
    CHECK(hr->shape[0] == (uint64_t)NLAYERS + 1 && hr->shape[1] == 64);
    CHECK(rt->shape[1] == 64 && rt->shape[2] == (uint64_t)TOPK);
    router_log rl = {{0}, calloc((size_t)n_moe * 64 * TOPK, 4), calloc((size_t)n_moe * 64 * TOPK, 4)};
    int s = 0;
    for (int L = 0; L < NLAYERS && L < 512; L++) rl.layer_slot[L] = sq_model_layer_is_moe(m, L) ? s++ : 0;
    CHECK_EQ_INT(s, n_moe);
    float *h = malloc((size_t)64 * d * 4);
    int pos[64];
    for (int i = 0; i < 64; i++) pos[i] = i;
    CHECK(sq_model_embed(m, ids->data, 64, h) == SPARQ_OK);
    sq_observer obs = {.user = &rl, .router = on_router};
    double maxrel = 0;
    for (int L = 0; L <= NLAYERS; L++) {
        if (L > 0) CHECK(sq_model_forward_layer(m, L - 1, h, 64, pos, -1, &obs) == SPARQ_OK);
        for (int p = 0; p < 64; p++) {
            double ss = 0;
            for (int i = 0; i < d; i++) ss += (double)h[(size_t)p * d + i] * h[(size_t)p * d + i];
            double rms = sqrt(ss / d), ref = ((const float *)hr->data)[L * 64 + p];
            maxrel = fmax(maxrel, fabs(rms - ref) / ref);
        }
    }
    fprintf(stderr, "hidden RMS after each of %d layers: max relative error %.3g\n", NLAYERS, maxrel);
    CHECK_MSG(maxrel < 1e-4, "hidden RMS relative error %.3g", maxrel);
    const int32_t *gi = rt->data;
    const float *gw = rw->data;
    int same = 0, tie_swaps = 0, n = n_moe * 64 * TOPK;
    double maxw = 0;
    for (int i = 0; i < n; i++) {
        if (rl.idx[i] == gi[i]) {
            same++;
            maxw = fmax(maxw, fabs(rl.w[i] - gw[i]));
        } else {
            /* allowed only as a swap of two experts whose weights tie */
            int j = i % TOPK ? i - 1 : i + 1;
            bool tie = (j / TOPK == i / TOPK) && rl.idx[i] == gi[j] && fabs(gw[i] - gw[j]) < 1e-5;
            tie_swaps += tie;
            CHECK_MSG(tie, "router choice %d (moe layer %d, pos %d, slot %d): sparq %d, transformers %d", i,
                      i / (64 * TOPK), i / TOPK % 64, i % TOPK, rl.idx[i], gi[i]);
        }
    }
    fprintf(stderr, "router: %d/%d choices identical (%d tie swaps), max weight error %.3g\n", same, n, tie_swaps, maxw);
    CHECK_MSG(maxw < 1e-4, "router weight error %.3g", maxw);
    free(h), free(rl.idx), free(rl.w);
}

static void test_top20(void)
{
    const sf_tensor *ids = gt("eval_ids", SF_I32), *ti = gt("top20_ids", SF_I32), *tl = gt("top20_logprobs", SF_F32);
    if (!ids || !ti || !tl) return;
    float *lg = malloc((size_t)512 * V * 4), *lp = malloc((size_t)V * 4);
    double maxd = 0;
    int top1 = 0, rows = 0;
    for (int w = 0; w < 2; w++) {
        sq_model_seq_reset(m, 0);
        if (ids->numel < (uint64_t)(w + 1) * 512) break;
        CHECK(sq_model_forward(m, 0, (const int32_t *)ids->data + w * 512, 512, SQ_LOGITS_ALL, lg) == SPARQ_OK);
        for (int p = 0; p < 512; p++, rows++) {
            sq_eval_log_softmax(lg + (size_t)p * V, V, lp);
            const int32_t *gid = (const int32_t *)ti->data + (size_t)(w * 512 + p) * 20;
            const float *glp = (const float *)tl->data + (size_t)(w * 512 + p) * 20;
            for (int j = 0; j < 20; j++) maxd = fmax(maxd, fabs(lp[gid[j]] - glp[j]));
            int b = 0;
            for (int v = 1; v < V; v++)
                if (lp[v] > lp[b]) b = v;
            top1 += b == gid[0] || fabs(lp[b] - lp[gid[0]]) < 1e-5;
        }
    }
    fprintf(stderr, "top-20 log-probs at %d positions: max abs err %.3g, top-1 equal %d/%d\n", rows, maxd, top1, rows);
    CHECK_MSG(maxd < 1e-3, "top-20 log-prob error %.3g", maxd);
    CHECK_EQ_INT(top1, rows);
    free(lg), free(lp);
}

static void test_ppl(void)
{
    const sf_tensor *ids = gt("eval_ids", SF_I32);
    if (!ids) return;
    double want = json_number_value(json_object_get(gj, "ppl_ctx512"));
    json_int_t want_scored = json_integer_value(json_object_get(gj, "n_scored"));
    sq_eval_opts o = {512, 0};
    sq_eval_result r;
    sq_dist *dm = NULL;
    sparq_status st = sq_dist_wrap(&dm, m);
    if (st == SPARQ_OK) st = sq_eval_run(dm, NULL, NULL, NULL, ids->data, (int64_t)ids->numel, &o, NULL, &r);
    sq_dist_close(dm);
    CHECK_MSG(st == SPARQ_OK, "eval: %s", sparq_errmsg());
    fprintf(stderr, "perplexity ctx 512: sparq %.6f, transformers %.6f (relative %.3g); %lld scored (golden %lld)\n",
            r.ppl, want, fabs(r.ppl - want) / want, (long long)r.n_scored, (long long)want_scored);
    CHECK_EQ_INT(r.n_scored, want_scored);
    CHECK_MSG(fabs(r.ppl - want) / want <= 1e-3, "ppl %.6f vs %.6f", r.ppl, want);
}

static void test_greedy(void)
{
    json_t *gr = json_object_get(gj, "greedy");
    CHECK(json_is_array(gr) && json_array_size(gr) >= 1);
    float *lg = malloc((size_t)V * 4);
    size_t i;
    json_t *e;
    json_array_foreach(gr, i, e)
    {
        json_t *pi = json_object_get(e, "prompt_ids"), *oi = json_object_get(e, "output_ids");
        const char *name = json_string_value(json_object_get(e, "name"));
        int np = (int)json_array_size(pi), no = (int)json_array_size(oi);
        int32_t *p = malloc((size_t)(np + no + 1) * 4);
        for (int k = 0; k < np; k++) p[k] = (int32_t)json_integer_value(json_array_get(pi, (size_t)k));
        sq_model_seq_reset(m, 0);
        CHECK(sq_model_forward(m, 0, p, np, SQ_LOGITS_LAST, lg) == SPARQ_OK);
        int match = 0;
        for (int k = 0; k < no; k++) {
            int b = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[b]) b = v;
            int want = (int)json_integer_value(json_array_get(oi, (size_t)k));
            if (b != want) {
                CHECK_MSG(0, "greedy '%s': token %d is %d, transformers %d (logits %.6f vs %.6f)", name ? name : "?",
                          k, b, want, lg[b], lg[want]);
                break;
            }
            match++;
            int32_t t = b;
            if (k + 1 < no) CHECK(sq_model_forward(m, 0, &t, 1, SQ_LOGITS_LAST, lg) == SPARQ_OK);
        }
        fprintf(stderr, "greedy '%s': %d/%d tokens identical\n", name ? name : "?", match, no);
        CHECK_EQ_INT(match, no);
        free(p);
    }
    free(lg);
}

int main(int argc, char **argv)
{
    const char *fx = argc > 1 ? argv[1] : "tiny-qwen3moe";
    snprintf(dir, sizeof dir, "%s", t_data_path(fx));
    char path[4200];
    snprintf(path, sizeof path, "%s/golden/golden.safetensors", dir);
    FILE *f = fopen(path, "rb");
    if (!f) T_SKIP("%s not there yet (fixture '%s' is made by tools/fixtures, issue 3)", path, fx);
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(f = fopen(path, "rb"))) T_SKIP("%s not there yet", path);
    fclose(f);
    snprintf(path, sizeof path, "%s/golden/golden.json", dir);
    json_error_t je;
    gj = json_load_file(path, 0, &je);
    if (!gj) {
        fprintf(stderr, "%s: %s\n", path, je.text);
        return 1;
    }
    snprintf(path, sizeof path, "%s/golden/golden.safetensors", dir);
    if (sf_open(&g, path) != SPARQ_OK) {
        fprintf(stderr, "%s\n", sparq_errmsg());
        return 1;
    }
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = 512;
    o.max_rows = 512;
    if (sq_model_load(&m, dir, &o) != SPARQ_OK) {
        fprintf(stderr, "load: %s\n", sparq_errmsg());
        return 1;
    }
    V = (int)sq_model_cfg(m)->vocab_size;
    NLAYERS = (int)sq_model_cfg(m)->num_hidden_layers;
    TOPK = (int)sq_model_cfg(m)->num_experts_per_tok;
    fprintf(stderr, "fixture %s: %d layers, vocab %d\n", fx, NLAYERS, V);
    RUN(test_logits);
    RUN(test_hidden_and_router);
    RUN(test_top20);
    RUN(test_greedy);
    RUN(test_ppl);
    sq_model_free(m);
    sf_close(g);
    json_decref(gj);
    return t_summary();
}
