/* tests/quantize/test_stream.c — `--max-mem` is a real bound on the peak
 * resident set of `sparq quantize`, not only an estimate check.
 *
 * At test time this writes a synthetic Qwen3-MoE checkpoint whose weights
 * (fp32, random) are about 2.5× the bound given, quantizes it with
 * `sparq quantize --max-mem BOUND` in a child process (so that the measured
 * peak, VmHWM, is the quantizer's alone) and checks that
 *  - the run succeeds, the output loads with sq_model_load and its logits
 *    are finite and close to the source model's;
 *  - the report's measured peak_rss_bytes and its estimate are ≤ the bound;
 *  - a bound far too small is refused before any work (exit 1, nothing
 *    written) with a message that names the terms and the largest one.
 * The synthetic model uses `--method rtn` (the same streaming driver: layer
 * by layer mapping, reference and quantized forwards, per-layer checkpoint,
 * sharded assembly) because the trellis search costs ~10 µs per weight on
 * this machine and a model of 40 M weights would take minutes; the trellis
 * path's memory is covered by the estimate check on tiny-synth below and by
 * docs/benchmarks-quantize.md. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/safetensors.h"
#include "runtime/model.h"
#include "qtest.h"
#include "t.h"

/* the synthetic model */
enum { H = 256, NL = 12, NH = 4, NKV = 2, HD = 64, E = 16, TOPK = 2, MI = 256, V = 256 };
#define BOUND_MB 64

static char g_tmp[1024];

static uint64_t rng_state = 0x5EED;
static float frand(void) /* uniform in (-1, 1), deterministic */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static bool add_f32(sf_writer *w, const char *name, int rows, int cols, float scale, bool ones)
{
    size_t n = (size_t)rows * (cols ? cols : 1);
    float *a = sparq_malloc(n * sizeof(float));
    if (!a) return false;
    for (size_t i = 0; i < n; i++) a[i] = ones ? 1.0f : frand() * scale;
    uint64_t shape[2] = {(uint64_t)rows, (uint64_t)cols};
    sparq_status st = sf_writer_add(w, name, SF_F32, cols ? 2 : 1, shape, a, n * sizeof(float));
    sparq_free(a);
    return st == SPARQ_OK;
}

/* Writes dir/{config.json, model.safetensors, tokenizer*}; returns the weight bytes. */
static uint64_t make_model(const char *dir)
{
    if (sparq_mkdirs(dir) != SPARQ_OK) return 0;
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char cfg[2048];
    int n = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
                     "\"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
                     "\"num_key_value_heads\": %d, \"head_dim\": %d, \"intermediate_size\": 512, "
                     "\"moe_intermediate_size\": %d, \"num_experts\": %d, \"num_experts_per_tok\": %d, "
                     "\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], "
                     "\"vocab_size\": %d, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, "
                     "\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"attention_bias\": false, "
                     "\"hidden_act\": \"silu\", \"eos_token_id\": 10, \"pad_token_id\": 0, "
                     "\"torch_dtype\": \"float32\"}\n",
                     H, NL, NH, NKV, HD, MI, E, TOPK, V);
    if (sparq_file_write_atomic(p, cfg, (size_t)n) != SPARQ_OK) return 0;
    static const char *const tok[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char *data = NULL;
        size_t len = 0;
        char src[1200];
        snprintf(src, sizeof src, "quantize/tiny-synth/%s", tok[i]);
        snprintf(p, sizeof p, "%s/%s", dir, tok[i]);
        if (sparq_file_read_all(t_data_path(src), 0, &data, &len) != SPARQ_OK ||
            sparq_file_write_atomic(p, data, len) != SPARQ_OK) {
            sparq_free(data);
            return 0;
        }
        sparq_free(data);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    sf_writer *w = NULL;
    if (sf_writer_create(&w, p) != SPARQ_OK) return 0;
    bool ok = add_f32(w, "model.embed_tokens.weight", V, H, 1.0f, false);
    char k[256];
    const float sh = 1.7f / sqrtf((float)H), sm = 1.7f / sqrtf((float)MI);
    for (int L = 0; L < NL && ok; L++) {
#define K(...) (snprintf(k, sizeof k, __VA_ARGS__), k)
        ok = add_f32(w, K("model.layers.%d.input_layernorm.weight", L), H, 0, 0, true) &&
             add_f32(w, K("model.layers.%d.post_attention_layernorm.weight", L), H, 0, 0, true) &&
             add_f32(w, K("model.layers.%d.self_attn.q_norm.weight", L), HD, 0, 0, true) &&
             add_f32(w, K("model.layers.%d.self_attn.k_norm.weight", L), HD, 0, 0, true) &&
             add_f32(w, K("model.layers.%d.self_attn.q_proj.weight", L), NH * HD, H, sh, false) &&
             add_f32(w, K("model.layers.%d.self_attn.k_proj.weight", L), NKV * HD, H, sh, false) &&
             add_f32(w, K("model.layers.%d.self_attn.v_proj.weight", L), NKV * HD, H, sh, false) &&
             add_f32(w, K("model.layers.%d.self_attn.o_proj.weight", L), H, NH * HD, sh * 0.5f, false) &&
             add_f32(w, K("model.layers.%d.mlp.gate.weight", L), E, H, sh, false);
        for (int e = 0; e < E && ok; e++)
            ok = add_f32(w, K("model.layers.%d.mlp.experts.%d.gate_proj.weight", L, e), MI, H, sh, false) &&
                 add_f32(w, K("model.layers.%d.mlp.experts.%d.up_proj.weight", L, e), MI, H, sh, false) &&
                 add_f32(w, K("model.layers.%d.mlp.experts.%d.down_proj.weight", L, e), H, MI, sm * 0.5f, false);
#undef K
    }
    ok = ok && add_f32(w, "model.norm.weight", H, 0, 0, true) && add_f32(w, "lm_head.weight", V, H, sh, false);
    if (!ok) {
        sf_writer_free(w);
        return 0;
    }
    if (sf_writer_finish(w) != SPARQ_OK) return 0;
    sf_model *m = NULL;
    uint64_t bytes = 0;
    if (sf_open(&m, p) == SPARQ_OK)
        for (size_t i = 0; i < sf_count(m); i++) bytes += sf_at(m, i)->nbytes;
    sf_close(m);
    return bytes;
}

/* Run the CLI; stdout+stderr to `log`. Returns the exit status (-1 on error). */
static int run_cli(const char *args, const char *log)
{
    const char *bin = getenv("SPARQ_BIN");
    if (!bin) return -1;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' quantize %s > '%s' 2>&1", bin, args, log);
    int rc = system(cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_bound_holds(void)
{
    char model[1200], out[1200], rep[1200], log[1200], args[4096];
    snprintf(model, sizeof model, "%s/synth", g_tmp);
    snprintf(out, sizeof out, "%s/out", g_tmp);
    snprintf(rep, sizeof rep, "%s/rep.json", g_tmp);
    snprintf(log, sizeof log, "%s/run.log", g_tmp);
    uint64_t bytes = make_model(model);
    uint64_t bound = (uint64_t)BOUND_MB << 20;
    CHECK_MSG(bytes > 2 * bound, "synthetic weights %.1f MiB must exceed 2x the bound %d MiB", bytes / 1048576.0,
              BOUND_MB);
    snprintf(args, sizeof args,
             "'%s' '%s' --method rtn --bits 4 --max-mem %dM --calib '%s' --calib-rows 2 --calib-len 64 "
             "--threads 2 --report '%s'",
             model, out, BOUND_MB, t_data_path("text/calib.txt"), rep);
    int rc = run_cli(args, log);
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) {
        char *txt = NULL;
        size_t n = 0;
        if (sparq_file_read_all(log, 0, &txt, &n) == SPARQ_OK) fprintf(stderr, "%s\n", txt);
        sparq_free(txt);
        return;
    }
    json_error_t jerr;
    json_t *r = json_load_file(rep, 0, &jerr);
    CHECK(r != NULL);
    if (!r) return;
    uint64_t peak = (uint64_t)json_integer_value(json_object_get(r, "peak_rss_bytes"));
    uint64_t est = (uint64_t)json_integer_value(json_object_get(r, "mem_estimate_bytes"));
    uint64_t mm = (uint64_t)json_integer_value(json_object_get(r, "max_mem_bytes"));
    printf("  weights %.1f MiB, bound %.1f MiB, estimate %.1f MiB, measured peak RSS %.1f MiB\n", bytes / 1048576.0,
           bound / 1048576.0, est / 1048576.0, peak / 1048576.0);
    CHECK_EQ_INT((long long)mm, (long long)bound);
    CHECK(peak > (4u << 20)); /* a real measurement */
    CHECK_MSG(peak <= bound, "measured peak %.1f MiB > bound %d MiB", peak / 1048576.0, BOUND_MB);
    CHECK(est <= bound);
    CHECK(json_array_size(json_object_get(r, "mem_estimate_parts")) >= 5);
    CHECK_EQ_INT((long long)json_array_size(json_object_get(r, "layers")), NL);
    json_decref(r);
    /* The run log's human summary carries the three figures. */
    char *txt = NULL;
    size_t n = 0;
    if (sparq_file_read_all(log, 0, &txt, &n) == SPARQ_OK) {
        CHECK_STR_CONTAINS(txt, "peak RSS");
        CHECK_STR_CONTAINS(txt, "--max-mem bound 67.11 MB");
    }
    sparq_free(txt);

    /* The output loads and runs; RTN 4-bit stays close to the source. */
    sq_model *a = NULL, *b = NULL;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = 64;
    mo.max_rows = 64;
    mo.n_threads = 2;
    CHECK(sq_model_load(&a, model, &mo) == SPARQ_OK);
    CHECK(sq_model_load(&b, out, &mo) == SPARQ_OK);
    if (a && b) {
        int32_t tok[32];
        for (int i = 0; i < 32; i++) tok[i] = (i * 37 + 11) % V;
        float *la = sparq_malloc(32 * V * sizeof(float)), *lb = sparq_malloc(32 * V * sizeof(float));
        CHECK(sq_model_forward(a, 0, tok, 32, SQ_LOGITS_ALL, la) == SPARQ_OK);
        CHECK(sq_model_forward(b, 0, tok, 32, SQ_LOGITS_ALL, lb) == SPARQ_OK);
        double num = 0, den = 0;
        bool finite = true;
        for (int i = 0; i < 32 * V; i++) {
            finite &= isfinite(lb[i]) != 0;
            num += (double)(la[i] - lb[i]) * (la[i] - lb[i]);
            den += (double)la[i] * la[i];
        }
        CHECK(finite);
        printf("  logits rel. error of the 4-bit RTN output: %.4f\n", sqrt(num / den));
        CHECK(den > 0 && sqrt(num / den) < 0.35);
        sparq_free(la);
        sparq_free(lb);
    }
    sq_model_free(a);
    sq_model_free(b);
}

static void test_bound_too_small(void)
{
    char model[1200], out[1200], log[1200], args[4096];
    snprintf(model, sizeof model, "%s/synth", g_tmp);
    snprintf(out, sizeof out, "%s/out-small", g_tmp);
    snprintf(log, sizeof log, "%s/small.log", g_tmp);
    if (!sparq_path_exists(model)) make_model(model);
    /* trellis, 12 MiB: the process and one layer alone need more */
    snprintf(args, sizeof args, "'%s' '%s' --max-mem 12M --calib '%s' --calib-rows 2 --calib-len 64 --threads 2",
             model, out, t_data_path("text/calib.txt"));
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK(!sparq_path_exists(out));
    char work[1300];
    snprintf(work, sizeof work, "%s.work", out);
    CHECK(!sparq_path_exists(work)); /* nothing written: not even the work dir */
    char *txt = NULL;
    size_t n = 0;
    CHECK(sparq_file_read_all(log, 0, &txt, &n) == SPARQ_OK);
    if (txt) {
        printf("  %s", txt);
        CHECK_STR_CONTAINS(txt, "--max-mem 12.58 MB is too small");
        CHECK_STR_CONTAINS(txt, "Viterbi encoder");
        CHECK_STR_CONTAINS(txt, "calibration hidden states");
        CHECK_STR_CONTAINS(txt, "Largest:");
    }
    sparq_free(txt);
    /* many calibration rows: the hidden states are what does not fit, and the hint says so */
    snprintf(args, sizeof args,
             "'%s' '%s' --method rtn --max-mem 64M --calib '%s' --calib-rows 64 --calib-len 2048 --threads 2", model,
             out, t_data_path("text/calib.txt"));
    CHECK_EQ_INT(run_cli(args, log), 1);
    txt = NULL;
    CHECK(sparq_file_read_all(log, 0, &txt, &n) == SPARQ_OK);
    if (txt) {
        printf("  %s", txt);
        CHECK_STR_CONTAINS(txt, "Largest: calibration hidden states");
        CHECK_STR_CONTAINS(txt, "lower --calib-rows / --calib-len");
    }
    sparq_free(txt);
}

int main(int argc, char **argv)
{
    if (argc == 2) { /* just write the synthetic model (for benchmarks / debugging) */
        uint64_t b = make_model(argv[1]);
        printf("%s: %.1f MiB of weights\n", argv[1], b / 1048576.0);
        return b ? 0 : 1;
    }
    if (!getenv("SPARQ_BIN")) T_SKIP("SPARQ_BIN is not set (run through meson test)");
    if (!qt_tmpdir(g_tmp, sizeof g_tmp, "sparq-qstream")) T_SKIP("cannot create a temporary directory");
    RUN(test_bound_holds);
    RUN(test_bound_too_small);
    qt_rmtree(g_tmp);
    return t_summary();
}
