/* tests/quantize/test_inputs.c — FP8 and MXFP4 source checkpoints.
 *
 * At test time the linears of tests/data/quantize/tiny-synth are re-encoded
 * in every stored form formats/weights.h reads, one form per role:
 *   experts gate/up  F8_E4M3 + `weight_scale_inv` F32, 128×128 blocks (DeepSeek-V3)
 *   experts down     MXFP4 I8 [O, I/2] + `.scale` F8_E8M0 [O, I/32] (DeepSeek-V4.1)
 *   q_proj, k_proj   F8_E4M3 + `.scale` F8_E8M0, 32×32 blocks (DeepSeek-V4.1 dense)
 *   v_proj           F8_E4M3 + `.scale` F8_E8M0, 1×32 blocks
 *   o_proj           gpt-oss naming: `o_proj_blocks` U8 [O, I/32, 16] + `o_proj_scales`
 *   lm_head          F8_E4M3 + `weight_scale_inv` BF16, 128×128
 * and a second checkpoint holds the same values decoded here (independently of
 * formats/) as F32. Both are quantized with the same options: the quantizer
 * sees the same fp32 weights, so the outputs must be byte-identical (EXL3 and
 * RTN), and the per-tensor proxy errors equal. The FP8/MXFP4 run goes through
 * the driver's skeleton (the runtime does not read FP8), the F32 run does not;
 * an FP8/MXFP4 run stopped after layer 0 and resumed writes the same bytes.
 * test_weight_forms checks formats/weights.h's recognition and its errors on
 * a small hand-made file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "formats/safetensors.h"
#include "formats/weights.h"
#include "quantize/driver.h"
#include "runtime/model.h"
#include "qtest.h"
#include "t.h"

static char g_tmp[1024];

/* --- checkpoint writing ----------------------------------------------- */

typedef struct ck {
    sf_writer *w;  /* the FP8/MXFP4 checkpoint */
    sf_writer *r;  /* the F32 reference */
} ck;

/* FP8 E4M3 with br×bc blocks; scale stored as E8M0 (`.scale`) or as `sdt`
 * (`weight_scale_inv`). deq receives the decoded values. */
static bool put_fp8(ck *c, const char *key, const float *w, int O, int I, int br, int bc, bool e8m0, sf_dtype sdt)
{
    int SR = (O + br - 1) / br, SC = (I + bc - 1) / bc;
    uint8_t *q = sparq_malloc((size_t)O * I);
    float *deq = sparq_malloc((size_t)O * I * sizeof(float));
    float *sf = sparq_malloc((size_t)SR * SC * sizeof(float));
    uint8_t *sb = sparq_malloc((size_t)SR * SC * 4);
    if (!q || !deq || !sf || !sb) return false;
    for (int a = 0; a < SR; a++)
        for (int b = 0; b < SC; b++) {
            float amax = 0;
            for (int r = a * br; r < (a + 1) * br && r < O; r++)
                for (int k = b * bc; k < (b + 1) * bc && k < I; k++) amax = fmaxf(amax, fabsf(w[(size_t)r * I + k]));
            float s = amax > 0 ? amax / 448.0f : 1.0f;
            if (e8m0) {
                int e = (int)ceilf(log2f(s));
                s = ldexpf(1.0f, e);
                sb[a * SC + b] = (uint8_t)(e + 127);
            } else if (sdt == SF_BF16) {
                uint16_t h = sparq_f32_to_bf16(s * 1.01f); /* round up a little: no overflow past 448 */
                s = sparq_bf16_to_f32(h);
                memcpy(sb + (size_t)2 * (a * SC + b), &h, 2);
            } else {
                memcpy(sb + (size_t)4 * (a * SC + b), &s, 4);
            }
            sf[a * SC + b] = s;
        }
    for (int r = 0; r < O; r++)
        for (int k = 0; k < I; k++) {
            float s = sf[(r / br) * SC + k / bc];
            uint8_t code = e4m3_encode(w[(size_t)r * I + k] / s);
            q[(size_t)r * I + k] = code;
            deq[(size_t)r * I + k] = e4m3_value(code) * s;
        }
    char name[512];
    uint64_t shw[2] = {(uint64_t)O, (uint64_t)I}, shs[2] = {(uint64_t)SR, (uint64_t)SC};
    bool ok = true;
    snprintf(name, sizeof name, "%s.weight", key);
    ok &= sf_writer_add(c->w, name, SF_F8_E4M3, 2, shw, q, (uint64_t)O * I) == SPARQ_OK;
    ok &= sf_writer_add(c->r, name, SF_F32, 2, shw, deq, (uint64_t)O * I * 4) == SPARQ_OK;
    snprintf(name, sizeof name, e8m0 ? "%s.scale" : "%s.weight_scale_inv", key);
    sf_dtype dt = e8m0 ? SF_F8_E8M0 : sdt;
    ok &= sf_writer_add(c->w, name, dt, 2, shs, sb, (uint64_t)SR * SC * (e8m0 ? 1 : dt == SF_BF16 ? 2 : 4)) ==
          SPARQ_OK;
    sparq_free(q), sparq_free(deq), sparq_free(sf), sparq_free(sb);
    return ok;
}

/* MXFP4: groups of 32 along I, E8M0 scale; gpt-oss naming when `gptoss`. */
static bool put_mxfp4(ck *c, const char *key, const float *w, int O, int I, bool gptoss)
{
    int G = I / 32;
    uint8_t *q = sparq_calloc((size_t)O * I / 2, 1), *sc = sparq_malloc((size_t)O * G);
    float *deq = sparq_malloc((size_t)O * I * sizeof(float));
    if (!q || !sc || !deq) return false;
    for (int r = 0; r < O; r++)
        for (int g = 0; g < G; g++) {
            float amax = 0;
            for (int k = g * 32; k < g * 32 + 32; k++) amax = fmaxf(amax, fabsf(w[(size_t)r * I + k]));
            int e = amax > 0 ? (int)ceilf(log2f(amax / 6.0f)) : -127;
            if (e < -127) e = -127;
            sc[r * G + g] = (uint8_t)(e + 127);
            float s = ldexpf(1.0f, e);
            for (int k = g * 32; k < g * 32 + 32; k++) {
                uint8_t n = e2m1_encode(w[(size_t)r * I + k] / s);
                q[((size_t)r * I + k) / 2] |= (uint8_t)(k % 2 ? n << 4 : n);
                deq[(size_t)r * I + k] = e2m1_value(n) * s;
            }
        }
    char name[512];
    bool ok = true;
    if (gptoss) {
        uint64_t sb[3] = {(uint64_t)O, (uint64_t)G, 16}, ss[2] = {(uint64_t)O, (uint64_t)G};
        snprintf(name, sizeof name, "%s_blocks", key);
        ok &= sf_writer_add(c->w, name, SF_U8, 3, sb, q, (uint64_t)O * I / 2) == SPARQ_OK;
        snprintf(name, sizeof name, "%s_scales", key);
        ok &= sf_writer_add(c->w, name, SF_U8, 2, ss, sc, (uint64_t)O * G) == SPARQ_OK;
    } else {
        uint64_t sb[2] = {(uint64_t)O, (uint64_t)I / 2}, ss[2] = {(uint64_t)O, (uint64_t)G};
        snprintf(name, sizeof name, "%s.weight", key);
        ok &= sf_writer_add(c->w, name, SF_I8, 2, sb, q, (uint64_t)O * I / 2) == SPARQ_OK;
        snprintf(name, sizeof name, "%s.scale", key);
        ok &= sf_writer_add(c->w, name, SF_F8_E8M0, 2, ss, sc, (uint64_t)O * G) == SPARQ_OK;
    }
    uint64_t shw[2] = {(uint64_t)O, (uint64_t)I};
    snprintf(name, sizeof name, "%s.weight", key);
    ok &= sf_writer_add(c->r, name, SF_F32, 2, shw, deq, (uint64_t)O * I * 4) == SPARQ_OK;
    sparq_free(q), sparq_free(sc), sparq_free(deq);
    return ok;
}

static bool ends(const char *s, const char *sfx)
{
    size_t n = strlen(s), m = strlen(sfx);
    return n >= m && strcmp(s + n - m, sfx) == 0;
}

static bool copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/%s", from_dir, name);
    snprintf(b, sizeof b, "%s/%s", to_dir, name);
    char *d = NULL;
    size_t n = 0;
    bool ok = sparq_file_read_all(a, 0, &d, &n) == SPARQ_OK && sparq_file_write_atomic(b, d, n) == SPARQ_OK;
    sparq_free(d);
    return ok;
}

/* Write dir_q (FP8/MXFP4) and dir_r (F32 reference) from tiny-synth. */
static bool make_checkpoints(const char *src_dir, const char *dir_q, const char *dir_r)
{
    sf_model *src = NULL;
    if (sf_open(&src, src_dir) != SPARQ_OK) return false;
    bool ok = sparq_mkdirs(dir_q) == SPARQ_OK && sparq_mkdirs(dir_r) == SPARQ_OK;
    const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 3 && ok; i++) ok = copy_file(src_dir, dir_q, files[i]) && copy_file(src_dir, dir_r, files[i]);
    char pq[1300], pr[1300];
    snprintf(pq, sizeof pq, "%s/model.safetensors", dir_q);
    snprintf(pr, sizeof pr, "%s/model.safetensors", dir_r);
    ck c = {0};
    ok = ok && sf_writer_create(&c.w, pq) == SPARQ_OK && sf_writer_create(&c.r, pr) == SPARQ_OK;
    for (size_t i = 0; i < sf_count(src) && ok; i++) {
        const sf_tensor *t = sf_at(src, i);
        char key[512];
        snprintf(key, sizeof key, "%.*s", (int)strlen(t->name) - 7, t->name);
        int form = -1;
        if (ends(t->name, "_proj.weight") && strstr(t->name, ".experts.")) form = ends(t->name, "down_proj.weight") ? 1 : 0;
        else if (ends(t->name, "q_proj.weight") || ends(t->name, "k_proj.weight")) form = 2;
        else if (ends(t->name, "v_proj.weight")) form = 3;
        else if (ends(t->name, "o_proj.weight")) form = 4;
        else if (strcmp(t->name, "lm_head.weight") == 0) form = 5;
        if (form < 0) { /* as is, in both */
            ok = sf_writer_add(c.w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) == SPARQ_OK &&
                 sf_writer_add(c.r, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) == SPARQ_OK;
            continue;
        }
        int O = (int)t->shape[0], I = (int)t->shape[1];
        float *w = sparq_malloc((size_t)O * I * sizeof(float));
        ok = w && sf_to_f32(t, w) == SPARQ_OK;
        switch (form) {
        case 0: ok = ok && put_fp8(&c, key, w, O, I, 128, 128, false, SF_F32); break;
        case 1: ok = ok && put_mxfp4(&c, key, w, O, I, false); break;
        case 2: ok = ok && put_fp8(&c, key, w, O, I, 32, 32, true, SF_F32); break;
        case 3: ok = ok && put_fp8(&c, key, w, O, I, 1, 32, true, SF_F32); break;
        case 4: ok = ok && put_mxfp4(&c, key, w, O, I, true); break;
        case 5: ok = ok && put_fp8(&c, key, w, O, I, 128, 128, false, SF_BF16); break;
        }
        sparq_free(w);
    }
    ok = ok && sf_writer_finish(c.w) == SPARQ_OK;
    c.w = NULL;
    ok = ok && sf_writer_finish(c.r) == SPARQ_OK;
    c.r = NULL;
    if (c.w) sf_writer_free(c.w);
    if (c.r) sf_writer_free(c.r);
    sf_close(src);
    return ok;
}

static void run_pair(qz_method method)
{
    char dq[1200], dr[1200], oq[1200], orf[1200], a[1300], b[1300];
    snprintf(dq, sizeof dq, "%s/src-fp8", g_tmp);
    snprintf(dr, sizeof dr, "%s/src-f32", g_tmp);
    snprintf(oq, sizeof oq, "%s/out-fp8-%s", g_tmp, qz_method_name(method));
    snprintf(orf, sizeof orf, "%s/out-f32-%s", g_tmp, qz_method_name(method));
    qz_report rq = {0}, rr = {0};
    qz_opts o;
    for (int pass = 0; pass < 2; pass++) {
        qz_opts_default(&o);
        o.model_dir = pass ? dr : dq;
        o.out_dir = pass ? orf : oq;
        o.calib[o.n_calib++] = t_data_path("text/calib.txt");
        o.calib_rows = 2;
        o.calib_len = 64;
        o.scale_search = QZ_SCALE_FIXED;
        o.threads = 2;
        o.seed = 3;
        o.method = method;
        sparq_status st = qz_run(&o, pass ? &rr : &rq);
        CHECK_MSG(st == SPARQ_OK, "%s: %s", o.model_dir, sparq_errmsg());
    }
    CHECK(rq.skeleton);
    CHECK(!rr.skeleton);
    CHECK_EQ_INT(rq.n_tensors, rr.n_tensors);
    int same = 0;
    for (int i = 0; i < rq.n_tensors && i < rr.n_tensors; i++)
        same += strcmp(rq.tensors[i].key, rr.tensors[i].key) == 0 && rq.tensors[i].proxy_err == rr.tensors[i].proxy_err;
    CHECK_EQ_INT(same, rq.n_tensors);
    static const char *const files[] = {"model.safetensors", "config.json", "quantization_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", oq, files[i]);
        snprintf(b, sizeof b, "%s/%s", orf, files[i]);
        CHECK_MSG(qt_files_equal(a, b), "%s differs between the FP8/MXFP4 and the F32 source (%s)", files[i],
                  qz_method_name(method));
    }
    if (method == QZ_METHOD_TRELLIS) {
        /* interrupted after layer 0 and resumed (the skeleton is rebuilt): the same bytes */
        char ob[1250];
        snprintf(ob, sizeof ob, "%s/out-fp8-resumed", g_tmp);
        qz_report r1 = {0}, r2 = {0};
        o.model_dir = dq;
        o.out_dir = ob;
        o.stop_after_layer = 0;
        CHECK(qz_run(&o, &r1) == SPARQ_E_INTERRUPTED);
        o.stop_after_layer = -1;
        o.resume = true;
        CHECK_MSG(qz_run(&o, &r2) == SPARQ_OK, "resume: %s", sparq_errmsg());
        CHECK_EQ_INT(r2.resumed_layers, 1);
        snprintf(a, sizeof a, "%s/model.safetensors", oq);
        snprintf(b, sizeof b, "%s/model.safetensors", ob);
        CHECK_MSG(qt_files_equal(a, b), "resumed FP8/MXFP4 run differs from the uninterrupted one");
        qz_report_free(&r1);
        qz_report_free(&r2);
    }
    /* sane: the quantized model loads and its proxies are small */
    double pmax = 0;
    for (int i = 0; i < rq.n_tensors; i++) pmax = fmax(pmax, rq.tensors[i].proxy_err);
    printf("  %s: %d tensors, max proxy error %.4f, measured peak RSS %.1f MB\n", qz_method_name(method), rq.n_tensors,
           pmax, rq.peak_rss / 1048576.0);
    CHECK(pmax > 0 && pmax < (method == QZ_METHOD_RTN ? 0.1 : 0.2));
    sq_model *m = NULL;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = 64, mo.max_rows = 64, mo.n_threads = 2;
    CHECK(sq_model_load(&m, oq, &mo) == SPARQ_OK);
    sq_model_free(m);
    qz_report_free(&rq);
    qz_report_free(&rr);
}

static void test_checkpoints(void)
{
    char dq[1200], dr[1200];
    snprintf(dq, sizeof dq, "%s/src-fp8", g_tmp);
    snprintf(dr, sizeof dr, "%s/src-f32", g_tmp);
    CHECK(make_checkpoints(t_data_path("quantize/tiny-synth"), dq, dr));
    /* the runtime does not read the FP8 checkpoint itself: that is why the driver needs its skeleton */
    sq_model *m = NULL;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = 64, mo.max_rows = 64;
    CHECK(sq_model_load(&m, dq, &mo) != SPARQ_OK);
    sq_model_free(m);
    sparq_err_clear();
}

/* formats/weights.h on its own: forms recognised, inconsistent ones named. */
static void test_weight_forms(void)
{
    char p[1300];
    snprintf(p, sizeof p, "%s/forms.safetensors", g_tmp);
    sf_writer *w = NULL;
    CHECK(sf_writer_create(&w, p) == SPARQ_OK);
    if (!w) return;
    static uint8_t zeros[64 * 64 * 4];
    uint64_t s4x32[2] = {4, 32}, s64[2] = {64, 64}, s3[2] = {3, 3}, s4x16[2] = {4, 16}, s4x1[2] = {4, 1},
             s4x1x16[3] = {4, 1, 16}, s2[2] = {2, 2};
    sf_writer_add(w, "a.weight", SF_F8_E4M3, 2, s4x32, zeros, 128);           /* FP8 without a scale */
    sf_writer_add(w, "b.weight", SF_F8_E4M3, 2, s64, zeros, 4096);            /* scale of no known block */
    sf_writer_add(w, "b.scale", SF_F8_E8M0, 2, s3, zeros, 9);
    sf_writer_add(w, "c.weight", SF_I8, 2, s4x16, zeros, 64);                 /* MXFP4, V4 style: in = 32 */
    sf_writer_add(w, "c.scale", SF_F8_E8M0, 2, s4x1, zeros, 4);
    sf_writer_add(w, "d_blocks", SF_U8, 3, s4x1x16, zeros, 64);              /* MXFP4, gpt-oss naming */
    sf_writer_add(w, "d_scales", SF_U8, 2, s4x1, zeros, 4);
    sf_writer_add(w, "e.weight", SF_I32, 2, s2, zeros, 16);                  /* not a weight dtype */
    sf_writer_add(w, "f.weight", SF_F8_E4M3, 2, s64, zeros, 4096);            /* 32x32 E8M0 */
    sf_writer_add(w, "f.scale", SF_F8_E8M0, 2, s2, zeros, 4);
    CHECK(sf_writer_finish(w) == SPARQ_OK);
    sf_model *m = NULL;
    CHECK(sf_open(&m, p) == SPARQ_OK);
    if (!m) return;
    sf_weight x;
    CHECK(sf_weight_find(m, "a", &x) == SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "'a.weight_scale_inv' or 'a.scale'");
    CHECK(sf_weight_find(m, "b", &x) == SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "fits no known block");
    CHECK(sf_weight_find(m, "c", &x) == SPARQ_OK && x.kind == SF_WEIGHT_MXFP4 && x.in == 32 && x.out == 4);
    CHECK(sf_weight_find(m, "d", &x) == SPARQ_OK && x.kind == SF_WEIGHT_MXFP4 && x.in == 32 && x.out == 4);
    float f[4 * 32];
    CHECK(sf_weight_to_f32(&x, f) == SPARQ_OK && f[0] == 0.0f);
    CHECK(sf_weight_find(m, "e", &x) == SPARQ_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(sparq_errmsg(), "dtype I32");
    CHECK(sf_weight_find(m, "f", &x) == SPARQ_OK && x.kind == SF_WEIGHT_FP8 && x.block_rows == 32 &&
          x.block_cols == 32);
    CHECK(sf_weight_find(m, "zz", &x) == SPARQ_E_NOTFOUND);
    sparq_err_clear();
    sf_close(m);
}

static void test_trellis_identical(void) { run_pair(QZ_METHOD_TRELLIS); }
static void test_rtn_identical(void) { run_pair(QZ_METHOD_RTN); }

int main(int argc, char **argv)
{
    if (argc == 4) { /* test_qinputs SRC FP8_DIR F32_DIR: convert any bf16 Qwen3-MoE (benchmarks) */
        bool ok = make_checkpoints(argv[1], argv[2], argv[3]);
        if (!ok) fprintf(stderr, "conversion failed: %s\n", sparq_errmsg());
        return ok ? 0 : 1;
    }
    if (!qt_tmpdir(g_tmp, sizeof g_tmp, "sparq-qinputs")) T_SKIP("cannot create a temporary directory");
    setenv("SPARQ_NO_PROGRESS", "1", 1);
    RUN(test_weight_forms);
    RUN(test_checkpoints);
    RUN(test_rtn_identical);
    RUN(test_trellis_identical);
    qt_rmtree(g_tmp);
    return t_summary();
}
