/* tests/quantize/test_v41.c — `sparq quantize` of DeepSeek V4.1 (native FP8 /
 * MXFP4 source: `make_v41_model --preset qtest`, tools/bench, generated at
 * test time; the tool's path is the first argument):
 *  - the bits of every tensor from the V4.1 defaults (experts --bits, attention
 *    5, shared experts 4, head 6) and from a --recipe file (with --bits-for after it);
 *  - the tensors kept native (router FP8 + scale, norms, hc_*, attn_sink,
 *    compressor, indexer) byte-identical to the source, mtp.* dropped, no
 *    FP8 scale left beside a quantized linear;
 *  - the work dir's skeleton holds only the placeholders of the quantized
 *    linears: nothing kept as it is was copied into it;
 *  - the output loads (the runtime binds its EXL3 linears), its logits stay
 *    close to the native model's (mean KLD below a bound that the same output
 *    with every output sign flipped exceeds);
 *  - --stop-after-layer then --resume writes the same bytes as one run;
 *  - the recipe parser's errors name FILE:LINE.
 * The Engram layers are tests/quantize/test_v41_engram.sh's (their fixture
 * needs 15 layers and the real vocabulary). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "formats/safetensors.h"
#include "quantize/driver.h"
#include "runtime/model.h"
#include "qtest.h"
#include "t.h"

#define V41_LAYERS 3 /* the qtest preset's */

static char g_tmp[1024], g_src[1200], g_out[1200], g_recipe[1200];
static bool g_have_out;

/* The options every run here uses: small calibration, no scale search (speed), a recipe and a
 * --bits-for rule applied after it. */
static void opts_for(qz_opts *o, const char *out)
{
    qz_opts_default(o);
    o->model_dir = g_src;
    o->out_dir = out;
    o->calib[0] = t_data_path("text/calib.txt");
    o->n_calib = 1;
    o->calib_rows = 4;
    o->calib_len = 32;
    o->scale_search = QZ_SCALE_FIXED;
    o->threads = 2;
    o->recipe = g_recipe;
    o->rules[0] = (qz_bits_rule){"layers.1.attn.wq_b", 4};
    o->n_rules = 1;
}

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static bool ends(const char *s, const char *sfx)
{
    size_t n = strlen(s), m = strlen(sfx);
    return n >= m && strcmp(s + n - m, sfx) == 0;
}

/* The K the defaults, the recipe and the rule give `key` (a linear without suffix). */
static int expected_K(const char *key)
{
    if (strcmp(key, "head") == 0) return 6;
    if (strcmp(key, "layers.1.attn.wq_b") == 0) return 4;  /* --bits-for, after the recipe's 6 */
    if (strstr(key, ".attn.")) return 5;
    if (strstr(key, ".shared_experts.")) return 4;
    if (starts(key, "layers.2.ffn.experts.")) return 2;    /* the recipe */
    if (strstr(key, ".ffn.experts.")) return 3;           /* --bits */
    return -1;
}

static void test_quantize(void)
{
    const char recipe[] = "# V4.1 test recipe\n\nlayers.2.ffn.experts.*=2   # a budget layer\n"
                          "layers.1.attn.wq_b = 6\n";
    snprintf(g_recipe, sizeof g_recipe, "%s/recipe.txt", g_tmp);
    CHECK(sparq_file_write_atomic(g_recipe, recipe, strlen(recipe)) == SPARQ_OK);
    snprintf(g_out, sizeof g_out, "%s/out", g_tmp);
    qz_opts o;
    opts_for(&o, g_out);
    qz_report rep = {0};
    sparq_status st = qz_run(&o, &rep);
    CHECK_MSG(st == SPARQ_OK, "%s", sparq_errmsg());
    g_have_out = st == SPARQ_OK;
    CHECK(rep.skeleton);
    CHECK_EQ_INT(rep.n_layers, V41_LAYERS);
    for (int L = 0; L < rep.n_layers; L++)
        CHECK_MSG(rep.layers[L].rel_err > 0 && rep.layers[L].rel_err < 0.5, "layer %d rel_err %g", L,
                  rep.layers[L].rel_err);
    qz_report_free(&rep);
    if (!g_have_out) return;

    sf_model *src = NULL, *out = NULL;
    CHECK(sf_open(&src, g_src) == SPARQ_OK && sf_open(&out, g_out) == SPARQ_OK);
    if (!src || !out) return;
    int n_q = 0, n_native = 0;
    for (size_t i = 0; i < sf_count(out); i++) {
        const sf_tensor *t = sf_at(out, i);
        char key[256];
        if (ends(t->name, ".trellis")) {
            snprintf(key, sizeof key, "%.*s", (int)strlen(t->name) - 8, t->name);
            CHECK_MSG((int)(t->shape[2] / 16) == expected_K(key), "%s: K %d, expected %d", key,
                      (int)(t->shape[2] / 16), expected_K(key));
            char nm[300];
            snprintf(nm, sizeof nm, "%s.scale", key); /* no FP8 part of the source left beside it */
            CHECK_MSG(!sf_find(out, nm), "%s is still there", nm);
            snprintf(nm, sizeof nm, "%s.weight", key);
            CHECK_MSG(!sf_find(out, nm), "%s is still there", nm);
            n_q++;
            continue;
        }
        if (ends(t->name, ".suh") || ends(t->name, ".svh") || ends(t->name, ".mul1")) continue;
        /* everything else is the source's tensor, byte for byte (FP8 router and indexer with their scales) */
        const sf_tensor *s = sf_find(src, t->name);
        CHECK_MSG(s && s->dtype == t->dtype && s->nbytes == t->nbytes && memcmp(s->data, t->data, s->nbytes) == 0,
                  "%s differs from the source", t->name);
        CHECK_MSG(!starts(t->name, "mtp."), "%s: mtp.* must be dropped", t->name);
        n_native++;
    }
    /* 3 layers x (5 attention + 3 x experts + 3 shared) + head */
    CHECK_EQ_INT(n_q, V41_LAYERS * (5 + 3 * 2 + 3) + 1);
    for (size_t i = 0; i < sf_count(src); i++) { /* and every kept source tensor is there */
        const sf_tensor *s = sf_at(src, i);
        char key[256];
        const char *dot = strrchr(s->name, '.');
        snprintf(key, sizeof key, "%.*s", (int)(dot - s->name), s->name);
        if (expected_K(key) > 0 || starts(s->name, "mtp.")) continue;
        CHECK_MSG(sf_find(out, s->name) != NULL, "%s missing from the output", s->name);
    }
    CHECK(sf_find(out, "layers.0.ffn.gate.weight") && sf_find(out, "layers.0.ffn.gate.weight")->dtype == SF_F8_E4M3);
    CHECK(n_native > 0);
    sf_close(src);
    sf_close(out);
    char qc[1300], *txt = NULL;
    size_t n = 0;
    snprintf(qc, sizeof qc, "%s/quantization_config.json", g_out);
    CHECK(sparq_file_read_all(qc, 0, &txt, &n) == SPARQ_OK);
    if (txt) {
        CHECK_STR_CONTAINS(txt, "\"quant_method\": \"exl3\"");
        CHECK_STR_CONTAINS(txt, "\"layers.0.ffn.experts.0.w1\"");
        CHECK_STR_CONTAINS(txt, "\"mul1_multiplier\"");
    }
    sparq_free(txt);
    /* sparq inspect: bits per weight by group */
    const char *bin = getenv("SPARQ_BIN");
    if (!bin) return;
    static char line[1 << 16];
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --json", bin, g_out);
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(line, 1, sizeof line - 1, p) : 0;
    line[got] = 0;
    if (p) pclose(p);
    const char *bg = strstr(line, "\"bpw_by_group\"");
    CHECK_MSG(bg != NULL, "no bpw_by_group in: %.200s", line);
    static const char *const grp[] = {"\"attention\": 5.", "\"experts\": 2.", "\"shared\": 4.", "\"head\": 6.",
                                      "\"native\": "};
    for (size_t i = 0; bg && i < sizeof grp / sizeof *grp; i++) CHECK_STR_CONTAINS(bg, grp[i]);
}

/* The skeleton (work/skeleton) is read over the source: it holds the quantized linears'
 * placeholders and nothing the source has (router, norms, indexer: read from the source). */
static void test_skeleton(void)
{
    if (!g_have_out) T_SKIP("no output");
    char dir[1300];
    snprintf(dir, sizeof dir, "%s.work/skeleton", g_out);
    sf_model *sk = NULL, *src = NULL;
    CHECK_MSG(sf_open(&sk, dir) == SPARQ_OK, "%s", sparq_errmsg());
    CHECK(sf_open(&src, g_src) == SPARQ_OK);
    if (!sk || !src) {
        sf_close(sk);
        sf_close(src);
        return;
    }
    int n_placeholder = 0;
    for (size_t i = 0; i < sf_count(sk); i++) {
        const sf_tensor *t = sf_at(sk, i);
        const bool ph = ends(t->name, ".trellis") || ends(t->name, ".suh") || ends(t->name, ".svh");
        CHECK_MSG(ph, "%s: the skeleton copies a tensor the source has", t->name);
        CHECK_MSG(!sf_find(src, t->name), "%s is in the source too", t->name);
        n_placeholder += ends(t->name, ".trellis");
    }
    CHECK_EQ_INT(n_placeholder, V41_LAYERS * (5 + 3 * 2 + 3) + 1);
    sf_close(sk);
    sf_close(src);
}

/* Mean KL(native || model) per position over one sequence of n byte tokens. */
static double mean_kld(const char *model_dir, const int32_t *tok, int n, const float *ref)
{
    sq_model *m = NULL;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = n;
    mo.n_threads = 2;
    if (sq_model_load(&m, model_dir, &mo) != SPARQ_OK) {
        fprintf(stderr, "load %s: %s\n", model_dir, sparq_errmsg());
        return INFINITY;
    }
    const int V = (int)sq_model_cfg(m)->vocab_size;
    float *lg = sparq_malloc((size_t)n * V * sizeof(float));
    double kl = 0;
    if (!lg || sq_model_forward(m, 0, tok, n, SQ_LOGITS_ALL, lg) != SPARQ_OK) kl = INFINITY;
    for (int p = 0; p < n && isfinite(kl); p++) {
        const float *a = ref + (size_t)p * V, *b = lg + (size_t)p * V;
        double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0;
        for (int v = 0; v < V; v++) ma = fmax(ma, a[v]), mb = fmax(mb, b[v]);
        for (int v = 0; v < V; v++) sa += exp(a[v] - ma), sb += exp(b[v] - mb);
        for (int v = 0; v < V; v++) {
            const double la = a[v] - ma - log(sa), lb = b[v] - mb - log(sb);
            kl += exp(la) * (la - lb);
        }
    }
    sparq_free(lg);
    sq_model_free(m);
    return kl / n;
}

/* A copy of the output with every quantized linear's output signs (svh) flipped: W -> -W. */
static bool write_broken(const char *from, const char *to)
{
    sf_model *sf = NULL;
    char p[1300];
    if (sf_open(&sf, from) != SPARQ_OK || sparq_mkdirs(to) != SPARQ_OK) return false;
    snprintf(p, sizeof p, "%s/model.safetensors", to);
    sf_writer *w = NULL;
    bool ok = sf_writer_create(&w, p) == SPARQ_OK;
    for (size_t i = 0; i < sf_count(sf) && ok; i++) {
        const sf_tensor *t = sf_at(sf, i);
        uint16_t *x = sparq_malloc(t->nbytes ? t->nbytes : 1);
        ok = x != NULL;
        if (ok) memcpy(x, t->data, t->nbytes);
        for (uint64_t k = 0; ok && ends(t->name, ".svh") && k < t->nbytes / 2; k++) x[k] ^= 0x8000;
        ok = ok && sf_writer_add(w, t->name, t->dtype, t->ndim, t->shape, x, t->nbytes) == SPARQ_OK;
        sparq_free(x);
    }
    ok = ok && sf_writer_finish(w) == SPARQ_OK;
    sf_close(sf);
    static const char *const files[] = {"config.json", "tokenizer.json", "quantization_config.json"};
    for (int i = 0; i < 3 && ok; i++) {
        char a[1300], *d = NULL;
        size_t n = 0;
        snprintf(a, sizeof a, "%s/%s", from, files[i]);
        snprintf(p, sizeof p, "%s/%s", to, files[i]);
        ok = sparq_file_read_all(a, 0, &d, &n) == SPARQ_OK && sparq_file_write_atomic(p, d, n) == SPARQ_OK;
        sparq_free(d);
    }
    return ok;
}

/* measured 0.058 on this fixture (0.062 and 0.068 with --seed 2 and 3; the older hand-written fixture
 * gave 0.025); every svh sign flipped gives 1.2 */
#define KLD_BOUND 0.08

static void test_load_kld(void)
{
    if (!g_have_out) T_SKIP("no output");
    const char text[] = "The quantized model must stay close to the native one on ordinary text, byte by byte.";
    const int n = (int)strlen(text);
    int32_t tok[128];
    for (int i = 0; i < n; i++) tok[i] = (uint8_t)text[i];
    sq_model *m = NULL;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = n;
    mo.n_threads = 2;
    CHECK_MSG(sq_model_load(&m, g_src, &mo) == SPARQ_OK, "%s", sparq_errmsg());
    if (!m) return;
    const int V = (int)sq_model_cfg(m)->vocab_size;
    float *ref = sparq_malloc((size_t)n * V * sizeof(float));
    CHECK(ref && sq_model_forward(m, 0, tok, n, SQ_LOGITS_ALL, ref) == SPARQ_OK);
    sq_model_free(m);
    const double kl = mean_kld(g_out, tok, n, ref);
    printf("  mean KL(native || quantized) = %.5f (bound %.3g)\n", kl, KLD_BOUND);
    CHECK_MSG(kl < KLD_BOUND, "KLD %g", kl);
    char broken[1200];
    snprintf(broken, sizeof broken, "%s/broken", g_tmp);
    CHECK(write_broken(g_out, broken));
    const double klb = mean_kld(broken, tok, n, ref);
    printf("  mean KL(native || signs flipped) = %.5f\n", klb);
    CHECK_MSG(klb > KLD_BOUND, "a broken output passes the bound: KLD %g", klb);
    sparq_free(ref);
}

static void test_resume(void)
{
    if (!g_have_out) T_SKIP("no output");
    char out[1200], a[1300], b[1300];
    snprintf(out, sizeof out, "%s/resumed", g_tmp);
    qz_opts o;
    opts_for(&o, out);
    o.stop_after_layer = 1; /* layer 2 reads the pool and the selection layer 1 made */
    qz_report rep = {0};
    CHECK(qz_run(&o, &rep) == SPARQ_E_INTERRUPTED);
    qz_report_free(&rep);
    sparq_err_clear();
    memset(&rep, 0, sizeof rep);
    o.stop_after_layer = -1;
    o.resume = true;
    sparq_status st = qz_run(&o, &rep);
    CHECK_MSG(st == SPARQ_OK, "%s", sparq_errmsg());
    CHECK_EQ_INT(rep.resumed_layers, 2);
    qz_report_free(&rep);
    static const char *const files[] = {"model.safetensors", "quantization_config.json", "config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", g_out, files[i]);
        snprintf(b, sizeof b, "%s/%s", out, files[i]);
        CHECK_MSG(qt_files_equal(a, b), "%s differs after --resume", files[i]);
    }
}

static void test_recipe_errors(void)
{
    qz_recipe r;
    const char ok[] = "# c\n\n  a.*=3 \nb=8#x\n";
    CHECK(qz_recipe_parse("ok.txt", ok, strlen(ok), &r) == SPARQ_OK);
    CHECK_EQ_INT(r.n, 2);
    if (r.n == 2) {
        CHECK(strcmp(r.rules[0].pattern, "a.*") == 0 && r.rules[0].K == 3);
        CHECK(strcmp(r.rules[1].pattern, "b") == 0 && r.rules[1].K == 8);
    }
    qz_recipe_free(&r);
    static const char *const bad[] = {"a=3\nnot a rule\n", "a=3\nb=9\n", "a=3\n=4\n", "a=3\nb=33\n", "a=3\nb=\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(qz_recipe_parse("bad.txt", bad[i], strlen(bad[i]), &r) == SPARQ_E_FORMAT);
        CHECK_STR_CONTAINS(sparq_errmsg(), "bad.txt:2:");
        sparq_err_clear();
    }
    qz_opts o;
    qz_opts_default(&o);
    char missing[1300], out[1300];
    snprintf(missing, sizeof missing, "%s/no-such-recipe", g_tmp);
    snprintf(out, sizeof out, "%s/never", g_tmp);
    o.model_dir = g_src, o.out_dir = out, o.recipe = missing;
    o.calib[0] = t_data_path("text/calib.txt");
    o.n_calib = 1;
    qz_report rep = {0};
    CHECK(qz_run(&o, &rep) != SPARQ_OK);
    CHECK_STR_CONTAINS(sparq_errmsg(), "no-such-recipe");
    CHECK(!sparq_path_exists(out));
    qz_report_free(&rep);
    sparq_err_clear();
}

int main(int argc, char **argv)
{
    const char *mk = argc > 1 ? argv[1] : "build/tools/bench/make_v41_model";
    if (!qt_tmpdir(g_tmp, sizeof g_tmp, "sparq-qv41")) T_SKIP("cannot create a temporary directory");
    setenv("SPARQ_NO_PROGRESS", "1", 1);
    snprintf(g_src, sizeof g_src, "%s/src", g_tmp);
    char cmd[4096], tok[1100];
    snprintf(tok, sizeof tok, "%s", t_data_path("quantize/tiny-synth"));
    snprintf(cmd, sizeof cmd, "'%s' '%s' --preset qtest --tokenizer '%s' --seed 1 >/dev/null", mk, g_src, tok);
    if (system(cmd) != 0) {
        fprintf(stderr, "writing the fixture failed: %s\n", cmd);
        return 1;
    }
    RUN(test_recipe_errors);
    RUN(test_quantize);
    RUN(test_skeleton);
    RUN(test_load_kld);
    RUN(test_resume);
    qt_rmtree(g_tmp);
    return t_summary();
}
