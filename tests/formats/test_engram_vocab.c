/* tests/formats/test_engram_vocab.c — the Engram compressed vocabulary and
 * the V4.1 hash rows against HF tokenizers / transformers / numpy.
 *
 * Golden data (tools/tokenizer/make_engram_map.py, tests/data/tokenizer/README.md):
 * the compressed id of every DeepSeek V4 token id as the Engram demo's rule
 * computes it with transformers (99,092 ids), HF's normalizer on hand-picked
 * strings, on every code point (alone and between "A" and "b") and on the
 * NFC probe text, and the global Engram rows of both layers for 342 tokens of
 * eval.txt computed with numpy from reference.md §3.1. Also: the map build's
 * time, invalid UTF-8, and allocation faults. */
#include <jansson.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/engram.h"
#include "formats/engram_vocab.h"
#include "formats/tokenizer.h"
#include "formats/tokenizer_internal.h"
#include "npy.h"
#include "t.h"

static char *read_data(const char *rel, size_t *n)
{
    char *buf = NULL;
    size_t len = 0;
    if (sparq_file_read_all(t_data_path(rel), 0, &buf, &len) != SPARQ_OK) {
        fprintf(stderr, "cannot read %s: %s\n", rel, sparq_errmsg());
        return NULL;
    }
    if (n) *n = len;
    return buf;
}

static sq_tokenizer *g_tok; /* the DeepSeek V4 tokenizer, loaded once */
static bool g_tok_tried;

static sq_tokenizer *deepseek(void)
{
    if (!g_tok_tried) {
        g_tok_tried = true;
        sparq_status st = sq_tokenizer_load(&g_tok, t_data_path("tokenizer/deepseek-v4"));
        CHECK_MSG(st == SPARQ_OK, "load deepseek-v4: %s", sparq_errmsg());
    }
    return g_tok;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Normalize a NUL-terminated string; NULL on error (and a failed check). */
static char *norm(const char *s, size_t n, size_t *on)
{
    char *out = NULL;
    sparq_status st = sq_engram_normalize(s, n, &out, on);
    CHECK_MSG(st == SPARQ_OK, "normalize: %s", sparq_errmsg());
    return st == SPARQ_OK ? out : NULL;
}

/* Print a string as escaped code points, for failure messages. */
static const char *show(const char *s, size_t n)
{
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    size_t o = 0;
    int len;
    for (size_t i = 0; i < n && o + 12 < sizeof buf[0]; i += (size_t)len) {
        uint32_t cp = tok_utf8_next((const uint8_t *)s, i, &len);
        o += (size_t)snprintf(b + o, sizeof buf[0] - o, cp < 0x80 && cp > 0x20 ? "%c" : "<%X>", cp);
    }
    b[o] = 0;
    return b;
}

/* ---- the map ---------------------------------------------------------------- */

static void test_map_golden(void)
{
    sq_tokenizer *tok = deepseek();
    CHECK(tok != NULL);
    if (!tok) return;
    npy_array g;
    if (npy_load(t_data_path("tokenizer/golden/deepseek-v4.engram-map.npy"), &g) != 0) {
        CHECK(0);
        return;
    }
    CHECK(g.kind == 'u' && g.itemsize == 4 && g.ndim == 1);
    uint32_t *map = NULL, nc = 0;
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        sparq_free(map);
        double t0 = now_s();
        sparq_status st = sq_engram_vocab_build(tok, &map, &nc);
        double dt = now_s() - t0;
        CHECK_MSG(st == SPARQ_OK, "build: %s", sparq_errmsg());
        if (st != SPARQ_OK) break;
        if (dt < best) best = dt;
    }
    printf("sq_engram_vocab_build: %d ids -> %u compressed ids in %.1f ms (best of 3, one core)\n",
           sq_tokenizer_vocab_size(tok), nc, best * 1e3);
    CHECK_EQ_INT(nc, SQ_ENGRAM_V41_COMPRESSED);
    CHECK_EQ_INT((uint64_t)sq_tokenizer_vocab_size(tok), g.count);
    if (map && (uint64_t)sq_tokenizer_vocab_size(tok) == g.count) {
        const uint32_t *want = g.data;
        size_t bad = 0;
        for (size_t i = 0; i < g.count; i++) {
            if (map[i] == want[i]) continue;
            if (bad++ < 10) {
                const char *s;
                size_t sl;
                sq_tokenizer_token_str(tok, (int32_t)i, &s, &sl);
                fprintf(stderr, "  id %zu (%s): sparq %u, HF %u\n", i, show(s, sl), map[i], want[i]);
            }
        }
        CHECK_MSG(bad == 0, "%zu of %llu ids map differently", bad, (unsigned long long)g.count);
        CHECK_EQ_INT(map[SQ_ENGRAM_V41_PAD], SQ_ENGRAM_V41_PAD);
    }
    CHECK(best < 1.0);
    sparq_free(map);
    npy_free(&g);
}

/* ---- the normalizer ------------------------------------------------------------ */

static void test_normalizer_cases(void)
{
    size_t n;
    char *js = read_data("tokenizer/golden/deepseek-v4.engram.json", &n);
    if (!js) {
        CHECK(0);
        return;
    }
    json_error_t err;
    json_t *root = json_loadb(js, n, 0, &err);
    CHECK_MSG(root != NULL, "engram.json: %s", err.text);
    CHECK_EQ_INT(json_integer_value(json_object_get(root, "n_compressed")), SQ_ENGRAM_V41_COMPRESSED);
    CHECK(json_is_true(json_object_get(root, "multipliers_match_vendor_rule")));
    /* the published multipliers are the ones the layout carries */
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, SQ_ENGRAM_V41_PRIME_BASE);
    for (int l = 0; l < 2; l++) {
        json_t *m = json_object_get(json_object_get(root, "vendor_rule_multipliers"), l ? "14" : "1");
        for (int k = 0; k < SQ_ENGRAM_ORDERS; k++)
            CHECK_EQ_INT((uint64_t)json_integer_value(json_array_get(m, (size_t)k)), lay.multipliers[l][k]);
    }
    json_t *cases = json_object_get(root, "normalizer");
    CHECK(json_array_size(cases) > 40);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *in = json_string_value(json_object_get(c, "in"));
        const char *want = json_string_value(json_object_get(c, "out"));
        size_t il = json_string_length(json_object_get(c, "in")), wl = json_string_length(json_object_get(c, "out"));
        size_t ol;
        char *out = norm(in, il, &ol);
        if (!out) continue;
        CHECK_MSG(ol == wl && !memcmp(out, want, wl), "case %zu \"%s\": sparq \"%s\", HF \"%s\"", i, show(in, il),
                  show(out, ol), show(want, wl));
        CHECK(out[ol] == 0);
        sparq_free(out);
    }
    json_decref(root);
    sparq_free(js);
}

/* Every code point alone and as "A" c "b": HF's result where the probe
 * lists one, the identity ("c", "a" c "b") everywhere else. */
static void test_normalizer_every_code_point(void)
{
    npy_array g;
    if (npy_load(t_data_path("tokenizer/golden/engram-norm.probe.npy"), &g) != 0) {
        CHECK(0);
        return;
    }
    const int32_t *r = g.data, *end = r + g.count;
    size_t bad = 0, listed = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        if (c >= 0xD800 && c < 0xE000) continue;
        uint8_t in[8];
        in[0] = 'A';
        int k = tok_utf8_put(c, in + 1);
        in[1 + k] = 'b';
        uint32_t want[2][40];
        size_t wn[2];
        if (r < end && (uint32_t)r[0] == c) {
            const int32_t *p = r + 1;
            for (int v = 0; v < 2; v++) {
                wn[v] = (size_t)*p++;
                for (size_t j = 0; j < wn[v] && j < 40; j++) want[v][j] = (uint32_t)p[j];
                p += wn[v];
            }
            r = p;
            listed++;
        } else {
            wn[0] = 1, want[0][0] = c;
            wn[1] = 3, want[1][0] = 'a', want[1][1] = c, want[1][2] = 'b';
        }
        for (int v = 0; v < 2; v++) {
            size_t ol;
            char *out = NULL;
            const char *s = (const char *)in + (v ? 0 : 1);
            size_t sl = (size_t)k + (v ? 2 : 0);
            if (sq_engram_normalize(s, sl, &out, &ol) != SPARQ_OK) {
                bad++;
                continue;
            }
            uint8_t w[160];
            size_t wl = 0;
            for (size_t j = 0; j < wn[v] && j < 40; j++) wl += (size_t)tok_utf8_put(want[v][j], w + wl);
            if (ol != wl || memcmp(out, w, wl)) {
                if (bad < 10)
                    fprintf(stderr, "  U+%04X %s: sparq \"%s\", HF \"%s\"\n", c, v ? "in A_b" : "alone",
                            show(out, ol), show((const char *)w, wl));
                bad++;
            }
            sparq_free(out);
        }
    }
    CHECK_MSG(r == end, "probe records left over");
    CHECK_MSG(bad == 0, "%zu of %zu normalizations differ from HF's", bad, 2 * (size_t)(0x110000 - 0x800));
    CHECK(listed > 5000);
    npy_free(&g);
}

static void test_normalizer_nfc_probe(void)
{
    size_t n, wn;
    char *in = read_data("tokenizer/golden/probe-nfc.in.txt", &n);
    char *want = read_data("tokenizer/golden/probe-nfc.engram.txt", &wn);
    if (in && want) {
        size_t on;
        char *out = norm(in, n, &on);
        if (out) {
            size_t i = 0;
            while (i < on && i < wn && out[i] == want[i]) i++;
            CHECK_MSG(on == wn && i == wn, "differs from HF at byte %zu (sparq %zu bytes, HF %zu)", i, on, wn);
            sparq_free(out);
        }
    } else {
        CHECK(0);
    }
    sparq_free(in);
    sparq_free(want);
}

static void test_normalizer_errors(void)
{
    char *out = (char *)1;
    size_t on = 5;
    CHECK_EQ_INT(sq_engram_normalize("ab\xC3", 3, &out, &on), SPARQ_E_UTF8);
    CHECK(out == NULL && on == 0);
    CHECK_STR_CONTAINS(sparq_errmsg(), "offset 2");
    CHECK_EQ_INT(sq_engram_normalize("\xED\xA0\x80", 3, &out, &on), SPARQ_E_UTF8); /* a surrogate */
    CHECK_EQ_INT(sq_engram_normalize("", 0, &out, &on), SPARQ_OK);
    CHECK(out && on == 0 && out[0] == 0);
    sparq_free(out);
    /* a long text that expands a lot (U+FDFA: 18 code points, 33 bytes of UTF-8) */
    size_t n = 3 * 5000;
    char *s = sparq_malloc(n);
    for (size_t i = 0; i < n; i += 3) memcpy(s + i, "\xEF\xB7\xBA", 3);
    CHECK_EQ_INT(sq_engram_normalize(s, n, &out, &on), SPARQ_OK);
    CHECK_EQ_INT(on, 5000 * 33u);
    sparq_free(out);
    sparq_free(s);
}

static void test_faults(void)
{
    sq_tokenizer *tok = NULL;
    if (sq_tokenizer_load(&tok, t_data_path("exl3-model/exl3-3.0bpw")) != SPARQ_OK) {
        CHECK_MSG(0, "load exl3-model: %s", sparq_errmsg());
        return;
    }
    uint32_t *ref = NULL, nref = 0;
    CHECK_EQ_INT(sq_engram_vocab_build(tok, &ref, &nref), SPARQ_OK);
    int fails = 0;
    for (int k = 1; k < 1000; k++) {
        uint32_t *map = (uint32_t *)1, nc = 7;
        sparq_alloc_fail_at((uint64_t)k, false);
        sparq_status st = sq_engram_vocab_build(tok, &map, &nc);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_OK) {
            CHECK(nc == nref && !memcmp(map, ref, (size_t)sq_tokenizer_vocab_size(tok) * sizeof *map));
            sparq_free(map);
            break;
        }
        CHECK_EQ_INT(st, SPARQ_E_NOMEM);
        CHECK(map == NULL && nc == 0);
        fails++;
    }
    CHECK_MSG(fails >= 4, "only %d allocation points", fails);
    for (int k = 1; k < 100; k++) {
        char *out = (char *)1;
        size_t on = 1;
        sparq_alloc_fail_at((uint64_t)k, false);
        sparq_status st = sq_engram_normalize("Caf\xC3\xA9 \xEF\xAC\x81", 9, &out, &on);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_OK) {
            CHECK(on == 7 && !memcmp(out, "cafe fi", 7));
            sparq_free(out);
            break;
        }
        CHECK_EQ_INT(st, SPARQ_E_NOMEM);
        CHECK(out == NULL && on == 0);
    }
    sparq_free(ref);
    sq_tokenizer_free(tok);
}

/* ---- V4.1 hash rows ------------------------------------------------------------ */

static void test_rows_golden(void)
{
    sq_tokenizer *tok = deepseek();
    CHECK(tok != NULL);
    if (!tok) return;
    npy_array gi, gr;
    if (npy_load(t_data_path("tokenizer/golden/deepseek-v4.engram-rows.ids.npy"), &gi) != 0 ||
        npy_load(t_data_path("tokenizer/golden/deepseek-v4.engram-rows.npy"), &gr) != 0) {
        CHECK(0);
        return;
    }
    size_t T = (size_t)gi.count;
    CHECK(gr.ndim == 3 && gr.shape[0] == T && gr.shape[1] == 2 && gr.shape[2] == SQ_ENGRAM_V41_COLUMNS);
    /* the ids are the tokenizer's own encoding of the text, BOS first */
    size_t tn;
    char *text = read_data("text/eval.txt", &tn);
    const int32_t *ids = gi.data;
    if (text) {
        size_t cut = 1500;
        while (cut < tn && text[cut] != '\n') cut++;
        int32_t *enc = NULL;
        size_t en = 0;
        CHECK_EQ_INT(sq_tokenizer_encode(tok, text, cut + 1, true, &enc, &en), SPARQ_OK);
        CHECK_MSG(en + 1 == T && ids[0] == sq_tokenizer_bos(tok) && !memcmp(enc, ids + 1, en * sizeof *enc),
                  "sparq encodes the text differently from HF (%zu ids vs %zu)", en + 1, T);
        sparq_free(enc);
        sparq_free(text);
    }
    uint32_t *map = NULL, nc = 0;
    CHECK_EQ_INT(sq_engram_vocab_build(tok, &map, &nc), SPARQ_OK);
    uint32_t *cids = sparq_malloc(T * sizeof *cids);
    if (map && cids && gr.count == T * 2 * SQ_ENGRAM_V41_COLUMNS) {
        for (size_t t = 0; t < T; t++) cids[t] = map[ids[t]];
        sq_engram_layout lay;
        sq_engram_v41_layout(&lay, SQ_ENGRAM_V41_PRIME_BASE);
        const int64_t *want = gr.data;
        size_t bad = 0;
        for (size_t t = 0; t < T; t++) {
            for (uint32_t l = 0; l < 2; l++) {
                uint64_t bucket[SQ_ENGRAM_MAX_COLUMNS];
                sq_engram_buckets(&lay, l, cids, T, t, bucket);
                for (int c = 0; c < SQ_ENGRAM_V41_COLUMNS; c++) {
                    uint64_t row = lay.row_offset[l][c] + bucket[c];
                    int64_t w = want[(t * 2 + l) * SQ_ENGRAM_V41_COLUMNS + (size_t)c];
                    if ((int64_t)row != w && bad++ < 10)
                        fprintf(stderr, "  position %zu layer %d column %d: sparq %llu, numpy %lld\n", t,
                                lay.layer_ids[l], c, (unsigned long long)row, (long long)w);
                }
            }
        }
        CHECK_MSG(bad == 0, "%zu of %zu rows differ", bad, T * 2 * SQ_ENGRAM_V41_COLUMNS);
    } else {
        CHECK(0);
    }
    sparq_free(cids);
    sparq_free(map);
    npy_free(&gi);
    npy_free(&gr);
}

int main(void)
{
    RUN(test_map_golden);
    RUN(test_normalizer_cases);
    RUN(test_normalizer_every_code_point);
    RUN(test_normalizer_nfc_probe);
    RUN(test_normalizer_errors);
    RUN(test_faults);
    RUN(test_rows_golden);
    sq_tokenizer_free(g_tok);
    return t_summary();
}
