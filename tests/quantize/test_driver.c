/* tests/quantize/test_driver.c — the streaming quantization driver
 * (quantize/driver.h) end to end on tests/data/quantize/tiny-synth (a random
 * 2-layer Qwen3-MoE, hidden 128, 4 experts; tests/quantize/make_tiny_model.py):
 *  - EXL3 output: exllamav3's tensor names, shapes, K per role, codebook
 *    marker; config.json carries quantization_config; each stored linear
 *    decodes close to the original weight; the output loads with
 *    sq_model_load and its logits agree with the original model's;
 *  - RTN (bf16, loads) and trellis-nocalib outputs;
 *  - bits policy: fractional bits, --bits-for rules, head bits;
 *  - stop after layer 0 + resume == one uninterrupted run, byte for byte;
 *  - errors: existing OUT, --max-mem too small, --resume with other options.
 * The global-scale search is set to "fixed" to keep the run short (the
 * search itself is covered by test_ldlq). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "kernels/cpu/trellis.h"
#include "quantize/driver.h"
#include "quantize/ldlq.h"
#include "runtime/model.h"
#include "qtest.h"
#include "t.h"

static char g_model[1024], g_calib[1024], g_eval[1024], g_tmp[1024];

static void base_opts(qz_opts *o, const char *out)
{
    qz_opts_default(o);
    o->model_dir = g_model;
    o->out_dir = out;
    o->calib[o->n_calib++] = g_calib;
    o->calib_rows = 3;
    o->calib_len = 64;
    o->scale_search = QZ_SCALE_FIXED;
    o->threads = 2;
}

static char *tmp_path(const char *name)
{
    static char buf[8][1100];
    static int i;
    char *b = buf[i++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", g_tmp, name);
    return b;
}

static int tensor_K(const sf_model *sf, const char *key)
{
    char name[512];
    snprintf(name, sizeof name, "%s.trellis", key);
    const sf_tensor *t = sf_find(sf, name);
    return t && t->ndim == 3 ? (int)(t->shape[2] / 16) : -1;
}

/* Logits of both models on the first n tokens of the eval text: top-1
 * agreement and mean KL(ref || q). */
static void compare_models(const char *qdir, double *top1, double *kl)
{
    sq_model *a = NULL, *b = NULL;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = 128;
    mo.max_rows = 128;
    mo.n_threads = 2;
    *top1 = -1, *kl = 1e9;
    if (sq_model_load(&a, g_model, &mo) != SPARQ_OK || sq_model_load(&b, qdir, &mo) != SPARQ_OK) {
        fprintf(stderr, "load: %s\n", sparq_errmsg());
        sq_model_free(a);
        return;
    }
    const int n = 96, V = 256;
    int32_t tok[96];
    FILE *f = fopen(g_eval, "rb");
    for (int i = 0; i < n; i++) tok[i] = f ? (uint8_t)fgetc(f) % V : i;
    if (f) fclose(f);
    /* byte-level tokenizer without merges: ids are not bytes, but any ids do for a logits comparison */
    float *la = sparq_malloc((size_t)n * V * sizeof(float)), *lb = sparq_malloc((size_t)n * V * sizeof(float));
    if (sq_model_forward(a, 0, tok, n, SQ_LOGITS_ALL, la) == SPARQ_OK &&
        sq_model_forward(b, 0, tok, n, SQ_LOGITS_ALL, lb) == SPARQ_OK) {
        int agree = 0;
        double kls = 0;
        for (int r = 0; r < n; r++) {
            const float *x = la + (size_t)r * V, *y = lb + (size_t)r * V;
            int ax = 0, ay = 0;
            double mx = -1e30, my = -1e30, sx = 0, sy = 0;
            for (int v = 0; v < V; v++) {
                if (x[v] > x[ax]) ax = v;
                if (y[v] > y[ay]) ay = v;
                mx = fmax(mx, x[v]), my = fmax(my, y[v]);
            }
            for (int v = 0; v < V; v++) sx += exp(x[v] - mx), sy += exp(y[v] - my);
            for (int v = 0; v < V; v++) {
                double lpx = x[v] - mx - log(sx), lpy = y[v] - my - log(sy);
                kls += exp(lpx) * (lpx - lpy);
            }
            agree += ax == ay;
        }
        *top1 = (double)agree / n;
        *kl = kls / n;
    }
    sparq_free(la);
    sparq_free(lb);
    sq_model_free(a);
    sq_model_free(b);
}

static void test_trellis_output(void)
{
    qz_opts o;
    const char *out = tmp_path("q3");
    base_opts(&o, out);
    qz_report rep = {0};
    sparq_status st = qz_run(&o, &rep);
    CHECK_MSG(st == SPARQ_OK, "%s", sparq_errmsg());
    if (st != SPARQ_OK) return;
    CHECK_EQ_INT(rep.n_layers, 2);
    CHECK_EQ_INT(rep.n_tensors, 2 * (4 + 3 * 4) + 1);
    CHECK_EQ_INT(rep.calib_rows, 3);
    CHECK_EQ_INT(rep.random_rows, 0);
    for (int i = 0; i < rep.n_tensors; i++)
        CHECK_MSG(rep.tensors[i].proxy_err > 0 && rep.tensors[i].proxy_err < 0.05, "%s proxy %g",
                  rep.tensors[i].key, rep.tensors[i].proxy_err);
    for (int i = 0; i < rep.n_layers; i++) {
        CHECK_MSG(rep.layers[i].cosine > 0.99, "layer %d cosine %g", i, rep.layers[i].cosine);
        CHECK(rep.layers[i].rel_err > 0 && rep.layers[i].rel_err < 0.2);
    }
    CHECK(rep.n_weights == 2 * (4 * 128 * 128 + 12 * 128 * 128) + 256 * 128);
    qz_report_free(&rep);

    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    sf_model *sf = NULL;
    CHECK(sf_open(&sf, path) == SPARQ_OK);
    if (!sf) return;
    CHECK_EQ_INT(tensor_K(sf, "model.layers.0.self_attn.q_proj"), 5);
    CHECK_EQ_INT(tensor_K(sf, "model.layers.1.self_attn.o_proj"), 5);
    CHECK_EQ_INT(tensor_K(sf, "model.layers.0.mlp.experts.3.down_proj"), 3);
    CHECK_EQ_INT(tensor_K(sf, "model.layers.1.mlp.experts.0.gate_proj"), 3);
    CHECK_EQ_INT(tensor_K(sf, "lm_head"), 6);
    CHECK(sf_find(sf, "model.layers.0.self_attn.q_proj.weight") == NULL);
    CHECK(sf_find(sf, "lm_head.weight") == NULL);
    CHECK(sf_find(sf, "model.embed_tokens.weight") != NULL);
    CHECK(sf_find(sf, "model.layers.0.mlp.gate.weight") != NULL);
    CHECK(sf_find(sf, "model.layers.1.self_attn.k_norm.weight") != NULL);
    const sf_tensor *m1 = sf_find(sf, "model.layers.0.mlp.experts.2.up_proj.mul1");
    CHECK(m1 && m1->dtype == SF_I32 && m1->ndim == 0 && *(const uint32_t *)m1->data == 0x83DCD12Du);
    const sf_tensor *su = sf_find(sf, "model.layers.0.self_attn.k_proj.suh");
    const sf_tensor *sv = sf_find(sf, "model.layers.0.self_attn.k_proj.svh");
    const sf_tensor *tr = sf_find(sf, "model.layers.0.self_attn.k_proj.trellis");
    CHECK(su && su->dtype == SF_F16 && su->shape[0] == 128);
    CHECK(sv && sv->dtype == SF_F16 && sv->shape[0] == 128);
    CHECK(tr && tr->dtype == SF_I16 && tr->shape[0] == 8 && tr->shape[1] == 8);
    /* The stored k_proj decodes close to the original (in, out) weight. */
    sf_model *src = NULL;
    CHECK(sf_open(&src, g_model) == SPARQ_OK);
    const sf_tensor *ow = src ? sf_find(src, "model.layers.0.self_attn.k_proj.weight") : NULL;
    if (ow && tr && su && sv) {
        trellis_linear lin = {.k = 128, .n = 128, .K = 5, .cb = TRELLIS_CB_MUL1, .trellis = tr->data,
                              .suh = su->data, .svh = sv->data};
        float *dec = sparq_malloc(128 * 128 * sizeof(float)), *w = sparq_malloc(128 * 128 * sizeof(float));
        CHECK(trellis_linear_decode(&lin, dec, NULL) == SPARQ_OK);
        CHECK(sf_to_f32(ow, w) == SPARQ_OK);
        double num = 0, den = 0;
        for (int r = 0; r < 128; r++)
            for (int c = 0; c < 128; c++) {
                double x = w[r * 128 + c], y = dec[c * 128 + r]; /* HF [out, in] vs EXL3 (in, out) */
                num += (x - y) * (x - y), den += x * x;
            }
        CHECK_MSG(num / den < 0.01, "k_proj rel mse %g", num / den);
        sparq_free(dec);
        sparq_free(w);
    }
    sf_close(src);
    sf_close(sf);

    sq_model_config cfg;
    CHECK(sq_config_load(&cfg, out) == SPARQ_OK);
    CHECK(cfg.quant.present);
    CHECK_NEAR(cfg.quant.bits, 3.0, 1e-9);
    CHECK_NEAR(cfg.quant.head_bits, 6.0, 1e-9);
    CHECK(strcmp(cfg.quant.codebook, "mul1") == 0);
    CHECK_EQ_INT(cfg.quant.calibration_rows, 3);
    CHECK_EQ_INT(cfg.quant.calibration_cols, 64);
    sq_config_free(&cfg);
    snprintf(path, sizeof path, "%s/quantization_config.json", out);
    CHECK(sparq_path_exists(path));
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    CHECK(sparq_path_exists(path));
    snprintf(path, sizeof path, "%s.partial", out);
    CHECK(!sparq_path_exists(path));

    double top1, kl;
    compare_models(out, &top1, &kl);
    printf("trellis 3 bpw vs original: top-1 %.3f, KL %.5f\n", top1, kl);
    CHECK_MSG(top1 >= 0.85, "top-1 agreement %g", top1);
    CHECK_MSG(kl < 0.05, "KL %g", kl);
}

static void test_resume_identical(void)
{
    /* Interrupted after layer 0 (checkpoint written), then resumed: the same
     * bytes as test_trellis_output's uninterrupted run. */
    qz_opts o;
    const char *out = tmp_path("q3r");
    base_opts(&o, out);
    o.stop_after_layer = 0;
    qz_report rep = {0};
    CHECK(qz_run(&o, &rep) == SPARQ_E_INTERRUPTED);
    qz_report_free(&rep);
    CHECK(!sparq_path_exists(out));
    /* Other options on --resume are refused. */
    o.stop_after_layer = -1;
    o.resume = true;
    o.bits = 4;
    CHECK(qz_run(&o, &rep) == SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "different options");
    qz_report_free(&rep);
    o.bits = 3;
    CHECK(qz_run(&o, &rep) == SPARQ_OK);
    CHECK_EQ_INT(rep.resumed_layers, 1);
    CHECK(rep.layers[0].resumed && !rep.layers[1].resumed);
    CHECK(rep.layers[0].cosine > 0.99);
    CHECK_EQ_INT(rep.n_tensors, 33);
    qz_report_free(&rep);
    static const char *const files[] = {"model.safetensors", "config.json", "quantization_config.json",
                                        "tokenizer.json"};
    for (int i = 0; i < 4; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", tmp_path("q3"), files[i]);
        snprintf(b, sizeof b, "%s/%s", out, files[i]);
        CHECK_MSG(qt_files_equal(a, b), "%s differs after resume", files[i]);
    }
}

static void test_baselines(void)
{
    qz_opts o;
    const char *out = tmp_path("rtn4");
    base_opts(&o, out);
    o.method = QZ_METHOD_RTN;
    o.bits = 4;
    qz_report rep = {0};
    CHECK_MSG(qz_run(&o, &rep) == SPARQ_OK, "%s", sparq_errmsg());
    qz_report_free(&rep);
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    sf_model *sf = NULL;
    CHECK(sf_open(&sf, path) == SPARQ_OK);
    const sf_tensor *t = sf ? sf_find(sf, "model.layers.1.mlp.experts.1.down_proj.weight") : NULL;
    CHECK(t && t->dtype == SF_BF16 && t->shape[0] == 128 && t->shape[1] == 128);
    CHECK(sf && !sf_find(sf, "model.layers.1.mlp.experts.1.down_proj.trellis"));
    sf_close(sf);
    sq_model_config cfg;
    CHECK(sq_config_load(&cfg, out) == SPARQ_OK);
    CHECK(!cfg.quant.present); /* RTN output is a plain bf16 model */
    sq_config_free(&cfg);
    double top1, kl;
    compare_models(out, &top1, &kl);
    printf("rtn 4 bpw vs original: top-1 %.3f, KL %.5f\n", top1, kl);
    CHECK(top1 >= 0.8);

    out = tmp_path("nocal3");
    base_opts(&o, out);
    o.method = QZ_METHOD_TRELLIS_NOCALIB;
    CHECK_MSG(qz_run(&o, &rep) == SPARQ_OK, "%s", sparq_errmsg());
    qz_report_free(&rep);
    CHECK(sq_config_load(&cfg, out) == SPARQ_OK);
    CHECK(cfg.quant.present && cfg.quant.calibration_rows == 0);
    sq_config_free(&cfg);
    compare_models(out, &top1, &kl);
    printf("trellis-nocalib 3 bpw vs original: top-1 %.3f, KL %.5f\n", top1, kl);
    CHECK(top1 >= 0.8);
}

static int report_K(const qz_report *r, const char *key)
{
    for (int i = 0; i < r->n_tensors; i++)
        if (strcmp(r->tensors[i].key, key) == 0) return r->tensors[i].K;
    return -1;
}

static void test_bits_policy(void)
{
    /* Through RTN (same policy code, no trellis search: fast). */
    qz_opts o;
    base_opts(&o, tmp_path("rtnbits"));
    o.method = QZ_METHOD_RTN;
    o.bits = 3.5;
    o.head_bits = 5;
    o.rules[o.n_rules++] = (qz_bits_rule){"*.down_proj", 4};
    o.rules[o.n_rules++] = (qz_bits_rule){"model.layers.1.self_attn.v_proj", 8};
    qz_report rep = {0};
    CHECK_MSG(qz_run(&o, &rep) == SPARQ_OK, "%s", sparq_errmsg());
    CHECK_EQ_INT(report_K(&rep, "model.layers.0.mlp.experts.0.gate_proj"), 3);
    CHECK_EQ_INT(report_K(&rep, "model.layers.1.mlp.experts.0.gate_proj"), 4);
    CHECK_EQ_INT(report_K(&rep, "model.layers.0.mlp.experts.2.down_proj"), 4);
    CHECK_EQ_INT(report_K(&rep, "model.layers.0.self_attn.q_proj"), 5);
    CHECK_EQ_INT(report_K(&rep, "model.layers.1.self_attn.q_proj"), 6);
    CHECK_EQ_INT(report_K(&rep, "model.layers.1.self_attn.v_proj"), 8);
    CHECK_EQ_INT(report_K(&rep, "lm_head"), 5);
    CHECK(qz_report_write_json(&rep, &o, tmp_path("r.json")) == SPARQ_OK);
    CHECK(qz_report_write_svg(&rep, tmp_path("r.svg")) == SPARQ_OK);
    char *js = NULL;
    size_t n = 0;
    CHECK(sparq_file_read_all(tmp_path("r.json"), 0, &js, &n) == SPARQ_OK);
    CHECK_STR_CONTAINS(js, "\"sqnr_db\"");
    CHECK_STR_CONTAINS(js, "model.layers.1.self_attn.v_proj");
    sparq_free(js);
    qz_report_free(&rep);
}

static void test_errors(void)
{
    qz_opts o;
    qz_report rep = {0};
    base_opts(&o, g_tmp); /* exists */
    CHECK(qz_run(&o, &rep) == SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "already exists");
    qz_report_free(&rep);
    base_opts(&o, tmp_path("fit"));
    o.max_mem = 1 << 20;
    CHECK(qz_run(&o, &rep) == SPARQ_E_FIT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "--max-mem");
    qz_report_free(&rep);
    base_opts(&o, tmp_path("nocalib"));
    o.calib[0] = tmp_path("missing.txt");
    CHECK(qz_run(&o, &rep) == SPARQ_E_IO || rep.n_layers == 0);
    qz_report_free(&rep);
}

int main(void)
{
    snprintf(g_model, sizeof g_model, "%s", t_data_path("quantize/tiny-synth"));
    snprintf(g_calib, sizeof g_calib, "%s", t_data_path("text/calib.txt"));
    snprintf(g_eval, sizeof g_eval, "%s", t_data_path("text/eval.txt"));
    snprintf(g_tmp, sizeof g_tmp, "%s", t_tmpdir());
    RUN(test_errors);
    RUN(test_bits_policy);
    RUN(test_trellis_output);
    RUN(test_resume_identical);
    RUN(test_baselines);
    return t_summary();
}
