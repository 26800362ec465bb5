/* tests/faults/test_faults.c — fault injection, the SQLite habit: every error
 * path of the commands that read and write files is clean.
 *
 * Scenarios: config load, tokenizer load (+ its chat template and one
 * encode), model load + a forward of the bf16 fixture tiny-qwen3moe and of
 * the EXL3 model (trellis linears), pack of tiny-synth into 2 nodes, verify
 * of that bundle and a load of its node 1, quantize (RTN) of tiny-synth, and LDLQ of one weight with
 * a calibrated Hessian (the trellis method's per-matrix work: a whole
 * trellis quantize takes seconds a run, too long to sweep). pack and
 * quantize use the small tiny-synth (1.2 MB) because every failure there is
 * followed by a rerun: a full sweep of packing the 18 MB tiny-qwen3moe takes
 * minutes on 2 cores, one of tiny-synth 2 s, through the same code.
 *
 * For each, a clean run counts its allocations and file operations
 * (common/fault.h) and keeps its result as the reference; then for each N
 * the Nth allocation, and in a second sweep the Nth file operation, fails,
 * and:
 *   - the call returns SPARQ_E_NOMEM (SPARQ_E_IO for a file operation) with
 *     a message, or SPARQ_OK with the reference's result exactly (a fallback
 *     that absorbed the fault, e.g. a bundle file read when mmap fails:
 *     printed);
 *   - no output exists under its final name, and every file left in
 *     OUT.partial outside a temporary name is whole (the reference's bytes);
 *   - a rerun (--resume where a partial output is left) succeeds and gives
 *     the reference's bytes.
 * Built with -Db_sanitize=address the same run proves that no error path
 * leaks. Every N is swept except the allocations of quantize and of the EXL3
 * forward, sampled (QUANTIZE_MAX_RUNS, EXL3_MAX_RUNS runs: the first and last
 * SAMPLE_EDGE and every k-th between; the output says which). SPARQ_FAULT_FULL=1 sweeps every N; SPARQ_FAULT_TRACE=1
 * prints each N before its run (to find the one that crashes);
 * SPARQ_FAULT_ONLY=NAME runs one scenario (docs/testing.md). */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fault.h"
#include "common/file.h"
#include "formats/hfconfig.h"
#include "formats/tokenizer.h"
#include "pack/pack.h"
#include "quantize/driver.h"
#include "quantize/ldlq.h"
#include "quantize/qtest.h"
#include "runtime/model.h"
#include "t.h"

#define SAMPLE_EDGE 50
/* sampled sweeps: every N of a quantize run would be 1103 + 170 runs (~40 s on 2 busy cores), of the EXL3
 * forward 1576 (~16 s, most of them the same call of a linear's work buffers) */
#define QUANTIZE_MAX_RUNS 400
#define EXL3_MAX_RUNS 600

static char g_model[1024], g_exl3[1024], g_qmodel[1024], g_tmp[1024], g_calib[1100];

static char *tmp_path(const char *name)
{
    static char buf[8][1200];
    static int i;
    char *b = buf[i++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", g_tmp, name);
    return b;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --- trees ------------------------------------------------------------------------- */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

/* rm -rf without a shell: the sweep removes hundreds of outputs */
static void rmtree(const char *dir)
{
    if (sparq_path_exists(dir)) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The tree walked by same_files: every regular file of `dir` (names with
 * ".tmp." and those in `skip` aside) equals the file of the same relative
 * path under `ref`; with `all`, ref has no file dir lacks. Returns the
 * number of files compared, -1 on a difference (printed). */
static const char *w_dir, *w_ref, *const *w_skip;
static int w_n, w_bad;

static bool skipped(const char *rel)
{
    if (strstr(rel, ".tmp.")) return true;
    for (const char *const *s = w_skip; s && *s; s++)
        if (!strcmp(rel, *s)) return true;
    return false;
}

static int cmp_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)f;
    if (flag != FTW_F) return 0;
    const char *rel = p + strlen(w_dir) + 1;
    if (skipped(rel)) return 0;
    char rp[2400];
    snprintf(rp, sizeof rp, "%s/%s", w_ref, rel);
    w_n++;
    if (!qt_files_equal(p, rp)) {
        w_bad++;
        fprintf(stderr, "  %s differs from %s (a partial file under its final name?)\n", p, rp);
    }
    return 0;
}

static int same_files(const char *dir, const char *ref, const char *const *skip, bool all)
{
    w_n = w_bad = 0;
    w_skip = skip;
    w_dir = dir, w_ref = ref;
    nftw(dir, cmp_one, 16, FTW_PHYS);
    int n = w_n, bad = w_bad;
    if (all) { /* and the other way round: nothing missing */
        w_n = w_bad = 0;
        w_dir = ref, w_ref = dir;
        nftw(ref, cmp_one, 16, FTW_PHYS);
        bad += w_bad;
    }
    return bad ? -1 : n;
}

/* --- scenarios --------------------------------------------------------------------- */

/* A scenario: `run` is the call swept (it keeps its result for `check`),
 * `check` compares a successful run's result with the reference (the first
 * clean run's, kept when `ref` is true) and releases it, `after_fail` checks
 * what a failed run left and cleans up. After it the sweep reruns the call
 * without a fault and checks its result, unless after_fail did (pack and
 * quantize: with --resume when they left a partial output). */
typedef struct scenario {
    const char *name;
    sparq_status (*run)(void);
    bool (*check)(bool ref);
    void (*after_fail)(void);
    bool reruns;  /* after_fail reruns the call itself */
    int max_runs; /* 0: every N; else sampled to at most this many runs a sweep */
} scenario;

/* config.json */
static sq_model_config cfg_ref, cfg_got;
static sparq_status cfg_run(void) { return sq_config_load(&cfg_got, g_model); }
static bool cfg_check(bool ref)
{
    if (ref) {
        cfg_ref = cfg_got;
        return true;
    }
    bool same = cfg_got.n_mlp_only_layers == cfg_ref.n_mlp_only_layers && cfg_got.arch == cfg_ref.arch &&
                cfg_got.vocab_size == cfg_ref.vocab_size && cfg_got.num_experts == cfg_ref.num_experts &&
                cfg_got.rope_theta == cfg_ref.rope_theta && cfg_got.n_eos_token_ids == cfg_ref.n_eos_token_ids &&
                !strcmp(cfg_got.model_type, cfg_ref.model_type);
    sq_config_free(&cfg_got);
    return same;
}
static void cfg_after_fail(void) { sq_config_free(&cfg_got); }

/* tokenizer.json + tokenizer_config.json (its chat template recognised), and one encode */
static const char tok_text[] = "Hello, world! The quick brown fox jumps over the lazy dog: 12345 ...";
static int32_t *tok_ref;
static size_t tok_ref_n;
static int32_t *tok_ids;
static size_t tok_n;
static sq_chat_family tok_chat, tok_chat_ref;
static sparq_status tok_run(void)
{
    sq_tokenizer *tok = NULL;
    tok_ids = NULL, tok_n = 0;
    sparq_status st = sq_tokenizer_load(&tok, g_model);
    if (st == SPARQ_OK) st = sq_tokenizer_encode(tok, tok_text, sizeof tok_text - 1, true, &tok_ids, &tok_n);
    tok_chat = tok ? sq_tokenizer_chat_family(tok) : SQ_CHAT_NONE;
    sq_tokenizer_free(tok);
    return st;
}
static bool tok_check(bool ref)
{
    if (ref) {
        tok_ref = tok_ids, tok_ref_n = tok_n, tok_chat_ref = tok_chat;
        return tok_n > 5 && tok_chat != SQ_CHAT_NONE;
    }
    bool same = tok_n == tok_ref_n && !memcmp(tok_ids, tok_ref, tok_n * sizeof *tok_ids) && tok_chat == tok_chat_ref;
    sparq_free(tok_ids);
    return same;
}
static void tok_after_fail(void)
{
    sparq_free(tok_ids);
    tok_ids = NULL;
}

/* model load + a forward of a few tokens: the bf16 fixture, and the EXL3 model (trellis linears) */
enum { FWD_N = 6 };
static float *fwd_ref, *fwd_got;
static size_t fwd_vocab;
static const char *fwd_dir;
static sparq_status fwd_run(void)
{
    static const int32_t toks[FWD_N] = {1, 17, 400, 2001, 3, 4000};
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = 16;
    o.max_rows = 4; /* two steps */
    o.n_threads = 1;
    sq_model *m = NULL;
    fwd_got = NULL;
    sparq_status st = sq_model_load(&m, fwd_dir, &o);
    if (st == SPARQ_OK) {
        fwd_vocab = (size_t)sq_model_cfg(m)->vocab_size;
        fwd_got = calloc(fwd_vocab, sizeof *fwd_got);
        st = sq_model_forward(m, 0, toks, FWD_N, SQ_LOGITS_LAST, fwd_got);
    }
    sq_model_free(m);
    return st;
}
static bool fwd_check(bool ref)
{
    if (ref) {
        free(fwd_ref);
        fwd_ref = fwd_got;
        return true;
    }
    bool same = !memcmp(fwd_got, fwd_ref, fwd_vocab * sizeof *fwd_got);
    free(fwd_got);
    return same;
}
static void fwd_after_fail(void)
{
    free(fwd_got);
    fwd_got = NULL;
}
static sparq_status fwd_bf16_run(void)
{
    fwd_dir = g_model;
    return fwd_run();
}
static sparq_status fwd_exl3_run(void)
{
    fwd_dir = g_exl3;
    return fwd_run();
}

/* pack into OUT (reference: pack-ref), resumed from OUT.partial after a failure */
static const char *const pack_skip[] = {".pack-state.json", NULL};
static sq_pack_options pack_opts(bool resume)
{
    sq_pack_options o;
    sq_pack_options_default(&o);
    o.boxes = 2;
    o.params.ctx = 256;
    o.params.users = 2;
    o.params.chunk = 64;
    o.block_size = 65536;
    o.resume = resume;
    return o;
}
static const char *pack_out;
static sparq_status pack_run(void)
{
    sq_pack_options o = pack_opts(false);
    return sq_pack_bundle(g_qmodel, pack_out, &o);
}
static bool pack_check(bool ref)
{
    (void)ref; /* the reference is pack-ref, written before the sweep */
    bool same = same_files(pack_out, tmp_path("pack-ref"), NULL, true) > 0;
    rmtree(pack_out);
    return same;
}
static void pack_after_fail(void)
{
    char partial[1300];
    snprintf(partial, sizeof partial, "%s.partial", pack_out);
    CHECK_MSG(!sparq_path_exists(pack_out), "%s exists after a failed pack", pack_out);
    sq_pack_options o = pack_opts(sparq_path_exists(partial));
    if (o.resume)
        CHECK_MSG(same_files(partial, tmp_path("pack-ref"), pack_skip, false) >= 0, "partial files in %s", partial);
    sparq_status st = sq_pack_bundle(g_qmodel, pack_out, &o);
    CHECK_MSG(st == SPARQ_OK, "rerun%s: %s", o.resume ? " with --resume" : "", sparq_errmsg());
    CHECK_MSG(!sparq_path_exists(partial), "%s left after the rerun", partial);
    CHECK_MSG(st != SPARQ_OK || same_files(pack_out, tmp_path("pack-ref"), NULL, true) > 0,
              "the rerun's bundle differs");
    rmtree(pack_out);
    rmtree(partial);
}

/* verify of the reference bundle */
static sq_verify_report ver_got;
static sparq_status ver_run(void)
{
    sq_verify_options vo = {-1, false, 2}; /* a pool with a worker thread */
    memset(&ver_got, 0, sizeof ver_got);
    return sq_verify_bundle(tmp_path("pack-ref"), &vo, &ver_got);
}
static bool ver_check(bool ref)
{
    (void)ref;
    bool good = ver_got.n_bad == 0 && ver_got.files > 3 && ver_got.blocks > 10;
    sq_verify_report_free(&ver_got);
    return good;
}
static void ver_after_fail(void) { sq_verify_report_free(&ver_got); }

/* load node 1 of that bundle (every file it reads checked against the manifest, every block hashed) */
static sparq_status bload_run(void)
{
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.node = 1;
    o.nodes = 2;
    o.n_threads = 1;
    sq_model *m = NULL;
    sparq_status st = sq_model_load(&m, tmp_path("pack-ref"), &o);
    if (st == SPARQ_OK && sq_model_cfg(m)->num_hidden_layers != 2) st = sparq_err(SPARQ_E_STATE, "another model");
    sq_model_free(m);
    return st;
}
static bool bload_check(bool ref)
{
    (void)ref; /* what loads is checked in bload_run */
    return true;
}
static void bload_after_fail(void) {}

/* quantize (RTN, 2 rows of 32 tokens) of the small tiny-synth into OUT (reference: q-ref), resumed after a
 * failure. The calibrated method's per-matrix math has its own scenario (ldlq below): a whole trellis run of
 * even tiny-synth takes seconds, too long to sweep. */
static const char *const q_skip[] = {NULL};
static const char *q_out, *q_refdir;
static qz_opts q_opts(const char *out, bool resume)
{
    qz_opts o;
    qz_opts_default(&o);
    o.model_dir = g_qmodel;
    o.out_dir = out;
    o.calib[o.n_calib++] = g_calib;
    o.calib_rows = 2;
    o.calib_len = 32;
    o.method = QZ_METHOD_RTN;
    o.bits = 4;
    o.threads = 1;
    o.resume = resume;
    return o;
}
static sparq_status q_run(void)
{
    qz_opts o = q_opts(q_out, false);
    qz_report rep = {0};
    sparq_status st = qz_run(&o, &rep);
    qz_report_free(&rep);
    return st;
}
static void q_clean(const char *out)
{
    char p[1300];
    rmtree(out);
    snprintf(p, sizeof p, "%s.partial", out);
    rmtree(p);
    snprintf(p, sizeof p, "%s.work", out);
    rmtree(p);
}
static bool q_check(bool ref)
{
    (void)ref; /* the reference is q-ref, written before the sweep */
    bool same = same_files(q_out, q_refdir, NULL, true) > 0;
    q_clean(q_out);
    return same;
}
static void q_after_fail(void)
{
    char partial[1300], work[1300];
    snprintf(partial, sizeof partial, "%s.partial", q_out);
    snprintf(work, sizeof work, "%s.work", q_out);
    CHECK_MSG(!sparq_path_exists(q_out), "%s exists after a failed quantize", q_out);
    if (sparq_path_exists(partial))
        CHECK_MSG(same_files(partial, q_refdir, q_skip, false) >= 0, "partial files in %s", partial);
    qz_opts o = q_opts(q_out, sparq_path_exists(work));
    qz_report rep = {0};
    sparq_status st = qz_run(&o, &rep);
    qz_report_free(&rep);
    CHECK_MSG(st == SPARQ_OK, "rerun%s: %s", o.resume ? " with --resume" : "", sparq_errmsg());
    CHECK_MSG(st != SPARQ_OK || same_files(q_out, q_refdir, NULL, true) > 0, "the rerun's output differs");
    q_clean(q_out);
}

/* LDLQ of one 128 x 128 weight with a calibrated Hessian (the trellis method's per-matrix work: Hessian
 * preparation, the out-scale rule, block LDLQ + Viterbi, at a fixed global scale); the encoder is made once */
enum { LK = 128, LN = 128, LKBITS = 1 }; /* the smallest shape; 1 bit: the Viterbi search costs 2^K a state */
static float *l_h, *l_w;
static viterbi_enc *l_enc;
static uint16_t l_tr[2][(LK / 16) * (LN / 16) * 16 * LKBITS], l_su[2][LK], l_sv[2][LN];
static ldlq_result l_res[2];
static bool ldlq_setup(void)
{
    l_h = calloc((size_t)LK * LK, sizeof *l_h);
    l_w = calloc((size_t)LK * LN, sizeof *l_w);
    uint64_t x = 12345;
    float row[LK];
    for (int r = 0; r < 512; r++) { /* H = mean of xᵀx over rows with a few loud channels */
        for (int i = 0; i < LK; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            row[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * (i % 17 == 0 ? 8.0f : 1.0f);
        }
        for (int i = 0; i < LK; i++)
            for (int j = 0; j < LK; j++) l_h[(size_t)i * LK + j] += row[i] * row[j] / 512.0f;
    }
    for (size_t i = 0; i < (size_t)LK * LN; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l_w[i] = (float)(x >> 40) / (float)(1 << 24) - 0.5f;
    }
    return viterbi_create(&l_enc, LKBITS, TRELLIS_CB_MUL1, 1) == SPARQ_OK;
}
static int l_slot; /* 0: the reference, 1: the swept run */
static sparq_status ldlq_run(void)
{
    ldlq_hessian *hs = NULL;
    ldlq_opts o;
    ldlq_opts_default(&o, LKBITS);
    o.weighted = true;
    o.out_scales = -1;
    o.g_fixed = ldlq_default_g(LKBITS, TRELLIS_CB_MUL1); /* the scale search alone takes seconds */
    ldlq_result *r = &l_res[l_slot];
    *r = (ldlq_result){.trellis = l_tr[l_slot], .suh = l_su[l_slot], .svh = l_sv[l_slot]};
    sparq_status st = ldlq_hessian_prepare(&hs, l_h, LK, 0, 7, "h");
    if (st == SPARQ_OK) st = ldlq_quantize(hs, l_w, LN, &o, l_enc, NULL, "w", r);
    ldlq_hessian_free(hs);
    return st;
}
static bool ldlq_check(bool ref)
{
    if (ref) {
        l_slot = 1;
        return l_res[0].proxy_err > 0;
    }
    return !memcmp(l_tr[0], l_tr[1], sizeof l_tr[0]) && !memcmp(l_su[0], l_su[1], sizeof l_su[0]) &&
           !memcmp(l_sv[0], l_sv[1], sizeof l_sv[0]) && l_res[0].proxy_err == l_res[1].proxy_err &&
           l_res[0].g_scale == l_res[1].g_scale && l_res[0].out_scales == l_res[1].out_scales;
}
static void ldlq_after_fail(void) {} /* a pure function: nothing left, no rerun needed (0.2 s a run) */

/* --- the sweep --------------------------------------------------------------------- */

static bool g_full, g_trace;

/* The Ns to try out of 1..count: all, or the first and last SAMPLE_EDGE and every step-th between. */
static uint64_t sample_step(const scenario *s, uint64_t count)
{
    const uint64_t max = (uint64_t)s->max_runs;
    if (g_full || !max || count <= max) return 1;
    const uint64_t mid = count - 2 * SAMPLE_EDGE, room = max - 2 * SAMPLE_EDGE;
    return (mid + room - 1) / room;
}

static bool sampled_n(uint64_t n, uint64_t count, uint64_t step)
{
    return step == 1 || n <= SAMPLE_EDGE || n > count - SAMPLE_EDGE || (n - SAMPLE_EDGE) % step == 0;
}

/* One sweep over one counter (io: file operations, else allocations). */
static void sweep(const scenario *s, bool io, uint64_t count)
{
    const uint64_t step = sample_step(s, count);
    const sparq_status want = io ? SPARQ_E_IO : SPARQ_E_NOMEM;
    int runs = 0, failed = 0, absorbed = 0, unreached = 0;
    double t0 = now_s();
    for (uint64_t n = 1; n <= count; n++) {
        if (!sampled_n(n, count, step)) continue;
        runs++;
        if (g_trace) fprintf(stderr, "  %s: %s %llu\n", s->name, io ? "file op" : "alloc", (unsigned long long)n);
        sparq_err_clear();
        const uint64_t fired = sparq_fault_fired();
        if (io) sparq_io_fail_at(n, false, 0);
        else sparq_alloc_fail_at(n, false);
        sparq_status st = s->run();
        sparq_io_fail_at(0, false, 0);
        sparq_alloc_fail_at(0, false);
        if (sparq_fault_fired() == fired) unreached++;
        if (st == SPARQ_OK) {
            absorbed++;
            const bool same = s->check(false);
            CHECK_MSG(same, "%s: %s %llu failed, the call returned OK with another result", s->name,
                      io ? "file operation" : "allocation", (unsigned long long)n);
            if (same)
                printf("  %s: %s %llu absorbed (same result)\n", s->name, io ? "file operation" : "allocation",
                       (unsigned long long)n);
            continue;
        }
        failed++;
        CHECK_MSG(st == want && sparq_errmsg()[0], "%s: %s %llu failed: status %s (want %s), message '%s'", s->name,
                  io ? "file operation" : "allocation", (unsigned long long)n, sparq_status_str(st),
                  sparq_status_str(want), sparq_errmsg());
        s->after_fail();
        if (!s->reruns) {
            st = s->run();
            CHECK_MSG(st == SPARQ_OK && s->check(false), "%s: the rerun after %s %llu: %s", s->name,
                      io ? "file operation" : "allocation", (unsigned long long)n,
                      st == SPARQ_OK ? "another result" : sparq_errmsg());
            if (st != SPARQ_OK) s->after_fail();
        }
    }
    CHECK_MSG(unreached == 0, "%s: %d runs did fewer operations than the clean run", s->name, unreached);
    printf("%-10s %-10s %6llu counted, %4d run%s, %4d failed cleanly, %2d absorbed, %5.1f s\n", s->name,
           io ? "file ops" : "allocs", (unsigned long long)count, runs,
           step > 1 ? "s (sampled)" : "s          ", failed, absorbed, now_s() - t0);
    if (step > 1)
        printf("           (sampled: N = 1..%d, every %llu-th, and the last %d)\n", SAMPLE_EDGE,
               (unsigned long long)step, SAMPLE_EDGE);
}

static void run_scenario(const scenario *s)
{
    t_current_ = s->name;
    sparq_fault_counting(true);
    const uint64_t a0 = sparq_alloc_count(), f0 = sparq_io_count();
    sparq_status st = s->run();
    const uint64_t na = sparq_alloc_count() - a0, nf = sparq_io_count() - f0;
    sparq_fault_counting(false);
    CHECK_MSG(st == SPARQ_OK, "%s: the clean run failed: %s", s->name, sparq_errmsg());
    if (st != SPARQ_OK) return;
    CHECK(s->check(true));
    CHECK(na > 0);
    sweep(s, false, na);
    sweep(s, true, nf);
}

/* The references, under their own names; the sweeps write to pack-out and q-out. */
static sparq_status pack_ref(void)
{
    static char ref[1200], out[1200];
    snprintf(ref, sizeof ref, "%s", tmp_path("pack-ref"));
    snprintf(out, sizeof out, "%s", tmp_path("pack-out"));
    pack_out = ref;
    sparq_status st = pack_run();
    pack_out = out;
    return st;
}

static sparq_status q_ref(void)
{
    static char ref[1200], out[1200];
    snprintf(ref, sizeof ref, "%s", tmp_path("q-ref"));
    snprintf(out, sizeof out, "%s", tmp_path("q-out"));
    q_out = q_refdir = ref;
    sparq_status st = q_run();
    q_out = out;
    return st;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_full = getenv("SPARQ_FAULT_FULL") != NULL;
    const char *only = getenv("SPARQ_FAULT_ONLY");
    g_trace = getenv("SPARQ_FAULT_TRACE") != NULL;
    snprintf(g_model, sizeof g_model, "%s", t_data_path("tiny-qwen3moe"));
    snprintf(g_qmodel, sizeof g_qmodel, "%s", t_data_path("quantize/tiny-synth"));
    snprintf(g_exl3, sizeof g_exl3, "%s", t_data_path("exl3-model/exl3-3.0bpw"));
    if (!sparq_path_exists(g_model) || !sparq_path_exists(g_qmodel) || !sparq_path_exists(g_exl3))
        T_SKIP("a fixture is absent: %s, %s, %s", g_model, g_qmodel, g_exl3);
    /* every file written is fsync'ed: on tmpfs the sweep is 4x faster than on a disk */
    if (!getenv("TMPDIR") && sparq_path_is_dir("/dev/shm") && access("/dev/shm", W_OK) == 0)
        setenv("TMPDIR", "/dev/shm", 1);
    snprintf(g_tmp, sizeof g_tmp, "%s", t_tmpdir());
    /* a small calibration text: a few KB of the one in tests/data */
    char *text = NULL;
    size_t n = 0;
    if (sparq_file_read_all(t_data_path("text/calib.txt"), 0, &text, &n) != SPARQ_OK) T_SKIP("no calib.txt");
    snprintf(g_calib, sizeof g_calib, "%s/calib.txt", g_tmp);
    CHECK(sparq_file_write_atomic(g_calib, text, n < 3000 ? n : 3000) == SPARQ_OK);
    sparq_free(text);

    const double t0 = now_s();
    static const scenario scen[] = {
        {"config", cfg_run, cfg_check, cfg_after_fail, false, 0},
        {"tokenizer", tok_run, tok_check, tok_after_fail, false, 0},
        {"forward", fwd_bf16_run, fwd_check, fwd_after_fail, false, 0},
        {"exl3", fwd_exl3_run, fwd_check, fwd_after_fail, false, EXL3_MAX_RUNS},
        {"pack", pack_run, pack_check, pack_after_fail, true, 0},
        {"verify", ver_run, ver_check, ver_after_fail, false, 0},
        {"bundle", bload_run, bload_check, bload_after_fail, false, 0},
        {"quantize", q_run, q_check, q_after_fail, true, QUANTIZE_MAX_RUNS},
        {"ldlq", ldlq_run, ldlq_check, ldlq_after_fail, true, 0}, /* no state: the next run is the rerun */
    };
    /* pack's and quantize's references are written once, under their own names */
    CHECK_MSG(pack_ref() == SPARQ_OK, "pack: %s", sparq_errmsg());
    CHECK_MSG(q_ref() == SPARQ_OK, "quantize: %s", sparq_errmsg());
    CHECK(ldlq_setup());
    for (size_t i = 0; i < sizeof scen / sizeof *scen; i++) {
        if (only && strcmp(only, scen[i].name)) continue;
        double ts = now_s();
        run_scenario(&scen[i]);
        printf("%-10s %.1f s\n", scen[i].name, now_s() - ts);
    }
    printf("fault sweep: %.1f s\n", now_s() - t0);
    sq_config_free(&cfg_ref);
    sparq_free(tok_ref);
    free(fwd_ref);
    viterbi_free(l_enc);
    free(l_h);
    free(l_w);
    rmtree(g_tmp);
    return t_summary();
}
