/* tests/gpu/test_trellis_encode_cuda.c — the GPU trellis encoder
 * (kernels/cuda/trellis_encode.h) against the CPU encoder
 * (quantize/viterbi.h), the oracle. Everything here is deterministic, so the
 * bar is bit-exact:
 *  - the encoder's codebook values on the GPU = trellis_cb_table, all 65536
 *    states, every codebook;
 *  - for every K = 1..8 and codebook, without and with per-position weights,
 *    tiles chosen to hit the tie rules (Gaussian, wide uniform, all zeros,
 *    codebook values of random states (a zero-cost path exists, often
 *    several), a constant, tiny values, zero weights): the 256 states of every
 *    tile and the decoded values equal the CPU's bit for bit, and the tile
 *    errors agree within 1e-5 relative (they are the same fp32 number; the
 *    count of bit-identical errors is printed);
 *  - exllamav3's golden trellises (tests/data/exl3/cases.safetensors, every
 *    case: K 1..8, all three codebooks): their decoded tiles as targets; and
 *    tiles of the real 768x256 weight (quant-cases.safetensors) at K = 2..4
 *    with weights;
 *  - a workspace of exactly one tile (one block reused for every tile), and
 *    one byte too small (refused, saying so).
 * Exits 77 ("skipped: no GPU") when there is no usable GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/threadpool.h"
#include "gpu/gpu_probe.h"
#include "kernels/cpu/trellis.h"
#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_encode.h"
#include "kernels/st_mini.h"
#include "quantize/viterbi.h"
#include "t.h"

#define GPU_RAND_SEED 0x9E3779B97F4A7C15ull
#include "gpu/gpu_rand.h"

static sparq_pool *pool;
static long tiles_checked, err_bit_exact;

typedef struct cpu_job {
    viterbi_enc *enc;
    const float *x, *w;
    uint16_t *st;
    float *dec, *err;
} cpu_job;

static void cpu_task(void *vctx, size_t t, int tid)
{
    const cpu_job *j = vctx;
    j->err[t] = viterbi_encode_tile(j->enc, tid, j->x + t * 256, j->w ? j->w + t * 256 : NULL, j->st + t * 256,
                                    j->dec + t * 256);
}

/* Encode n tiles on both sides and compare; ws = GPU workspace bytes (0 = default). */
static void compare(int K, trellis_codebook cb, const float *x, const float *w, size_t n, size_t ws,
                    const char *what)
{
    uint16_t *st_c = malloc(n * 256 * sizeof *st_c), *st_g = malloc(n * 256 * sizeof *st_g);
    float *dec_c = malloc(n * 256 * sizeof(float)), *dec_g = malloc(n * 256 * sizeof(float));
    float *err_c = malloc(n * sizeof(float)), *err_g = malloc(n * sizeof(float));
    viterbi_enc *ce = NULL;
    trellis_cuda_enc *ge = NULL;
    CHECK(st_c && st_g && dec_c && dec_g && err_c && err_g);
    CHECK(viterbi_create(&ce, K, cb, sparq_pool_size(pool)) == SPARQ_OK);
    const sparq_status rc = trellis_cuda_enc_create(K, cb, ws, &ge);
    CHECK_MSG(rc == SPARQ_OK, "%s: %s", what, sparq_errmsg());
    if (!ce || !ge || !st_c || !st_g || !dec_c || !dec_g || !err_c || !err_g) goto out;
    cpu_job job = {ce, x, w, st_c, dec_c, err_c};
    sparq_pool_for(pool, n, cpu_task, &job);
    double tot_g = 0, tot_c = 0;
    CHECK_MSG(trellis_cuda_encode_tiles_host(ge, x, w, n, st_g, dec_g, err_g, &tot_g) == SPARQ_OK, "%s: %s", what,
              sparq_errmsg());
    int bad_tiles = 0, bad_dec = 0, bad_err = 0;
    for (size_t t = 0; t < n; t++) {
        tot_c += err_c[t];
        tiles_checked++;
        if (memcmp(st_c + t * 256, st_g + t * 256, 256 * sizeof *st_c) != 0) {
            if (bad_tiles++ == 0) {
                int p = 0;
                while (st_c[t * 256 + p] == st_g[t * 256 + p]) p++;
                fprintf(stderr, "  %s: tile %zu first differs at position %d: CPU state %u, GPU %u\n", what, t, p,
                        st_c[t * 256 + p], st_g[t * 256 + p]);
            }
        }
        bad_dec += memcmp(dec_c + t * 256, dec_g + t * 256, 256 * sizeof(float)) != 0;
        const double ec = err_c[t], eg = err_g[t];
        if (memcmp(&err_c[t], &err_g[t], sizeof(float)) == 0) err_bit_exact++;
        else if (!(fabs(ec - eg) <= 1e-5 * fabs(ec) + 1e-30)) bad_err++;
    }
    CHECK_MSG(bad_tiles == 0, "%s: %d of %zu tiles have other states than the CPU", what, bad_tiles, n);
    CHECK_MSG(bad_dec == 0, "%s: %d of %zu tiles decode to other values", what, bad_dec, n);
    CHECK_MSG(bad_err == 0, "%s: %d of %zu tile errors differ by more than 1e-5 relative", what, bad_err, n);
    CHECK_MSG(fabs(tot_c - tot_g) <= 1e-5 * fabs(tot_c) + 1e-30, "%s: total error CPU %.9g, GPU %.9g", what, tot_c,
              tot_g);
out:
    viterbi_free(ce);
    trellis_cuda_enc_free(ge);
    free(st_c);
    free(st_g);
    free(dec_c);
    free(dec_g);
    free(err_c);
    free(err_g);
}

static void test_cb_values(void)
{
    float *host = malloc(65536 * sizeof(float)), *want = malloc(65536 * sizeof(float)), *dev = NULL;
    CHECK(host && want && trellis_cuda_alloc((void **)&dev, 65536 * sizeof(float)) == SPARQ_OK);
    for (int cb = 0; dev && cb < TRELLIS_CB_COUNT_; cb++) {
        CHECK(trellis_cuda_enc_cb_values((trellis_codebook)cb, dev) == SPARQ_OK);
        CHECK(trellis_cuda_download(host, dev, 65536 * sizeof(float)) == SPARQ_OK);
        trellis_cb_table((trellis_codebook)cb, want);
        int bad = 0;
        for (int s = 0; s < 65536; s++) bad += memcmp(&host[s], &want[s], sizeof(float)) != 0;
        CHECK_MSG(bad == 0, "%s: %d of 65536 codebook values differ from the CPU", trellis_cb_name(cb), bad);
    }
    trellis_cuda_free(dev);
    free(host);
    free(want);
}

#define N_KINDS 7

/* Tile `kind` of the random set (see the file comment). */
static void make_tile(int kind, trellis_codebook cb, float *x, float *w, bool weighted)
{
    for (int p = 0; p < 256; p++) {
        switch (kind) {
        case 0: x[p] = gauss(); break;
        case 1: x[p] = (float)(unif() * 6.0 - 3.0) * 3.0f; break;
        case 2: x[p] = 0.0f; break;
        case 3: x[p] = trellis_cb_value(cb, rnd32() & 0xFFFF); break;
        case 4: x[p] = 0.5f; break;
        case 5: x[p] = 0.01f * gauss(); break;
        default: x[p] = p < 128 ? gauss() : 0.0f; break;
        }
        if (weighted) {
            const uint32_t r = rnd32() & 7;
            w[p] = r < 2 ? 1.0f : r == 2 && kind >= 2 ? 0.0f : (float)(0.1 + 3.9 * unif());
        }
    }
}

static void test_random(void)
{
    const int reps = 2;
    const size_t n = (size_t)N_KINDS * reps;
    float *x = malloc(n * 256 * sizeof(float)), *w = malloc(n * 256 * sizeof(float));
    CHECK(x && w);
    for (int K = 1; x && w && K <= TRELLIS_K_MAX; K++)
        for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++)
            for (int weighted = 0; weighted < 2; weighted++) {
                for (size_t t = 0; t < n; t++)
                    make_tile((int)(t % N_KINDS), (trellis_codebook)cb, x + t * 256, w + t * 256, weighted);
                char what[64];
                snprintf(what, sizeof what, "K=%d %s%s", K, trellis_cb_name(cb), weighted ? " weighted" : "");
                compare(K, (trellis_codebook)cb, x, weighted ? w : NULL, n, 0, what);
            }
    free(x);
    free(w);
}

/* exllamav3's trellises decoded back into targets, and real weight tiles. */
static void test_golden(void)
{
    st_mini st;
    if (st_mini_open(&st, t_data_path("exl3/cases.safetensors")) != 0) {
        CHECK_MSG(0, "cannot read %s", t_data_path("exl3/cases.safetensors"));
        return;
    }
    char list[2048];
    CHECK(st_mini_meta(&st, "cases", list, sizeof list) == 0);
    const size_t max_tiles = 24;
    float *x = malloc(max_tiles * 256 * sizeof(float));
    int cases = 0;
    for (char *tok = strtok(list, ","); tok && x; tok = strtok(NULL, ",")) {
        int k, nn, K;
        char cbname[16];
        trellis_codebook cb;
        if (sscanf(tok, "%dx%d.K%d.%15s", &k, &nn, &K, cbname) != 4 || !trellis_cb_parse(cbname, &cb)) continue;
        char key[128];
        snprintf(key, sizeof key, "%s.trellis", tok);
        size_t nb = 0;
        const uint16_t *tr = st_mini_get(&st, key, &nb);
        CHECK_MSG(tr != NULL, "%s missing", key);
        if (!tr) continue;
        const size_t tw = (size_t)trellis_tile_words(K), have = nb / (2 * tw);
        const size_t n = have < max_tiles ? have : max_tiles;
        for (size_t t = 0; t < n; t++) {
            uint16_t s[256];
            trellis_tile_unpack(tr + t * tw, K, s);
            for (int p = 0; p < 256; p++) x[t * 256 + p] = trellis_cb_value(cb, s[p]);
        }
        compare(K, cb, x, NULL, n, 0, tok);
        cases++;
    }
    CHECK_MSG(cases >= 16, "%d golden cases read, expected 16", cases);
    st_mini_close(&st);

    /* the real weight's tiles at unit RMS, with weights from its own magnitude */
    if (x && st_mini_open(&st, t_data_path("exl3/quant-cases.safetensors")) == 0) {
        size_t nb = 0;
        const float *wt = st_mini_get(&st, "768x256.weight", &nb);
        CHECK(wt && nb == 768 * 256 * sizeof(float));
        float *tw = malloc(max_tiles * 256 * sizeof(float));
        if (wt && tw && nb == 768 * 256 * sizeof(float)) {
            double ss = 0;
            for (size_t i = 0; i < 768 * 256; i++) ss += (double)wt[i] * wt[i];
            const float inv = (float)(1.0 / sqrt(ss / (768 * 256)));
            for (size_t t = 0; t < max_tiles; t++) /* tile (t / 16, t % 16) in stream order */
                for (int p = 0; p < 256; p++) {
                    const size_t r = (t / 16) * 16 + (size_t)trellis_pos_row(p), c = (t % 16) * 16 + trellis_pos_col(p);
                    x[t * 256 + p] = wt[r * 256 + c] * inv;
                    tw[t * 256 + p] = 0.5f + fabsf(x[t * 256 + p]);
                }
            for (int K = 2; K <= 4; K++) {
                char what[64];
                snprintf(what, sizeof what, "768x256.weight K=%d mul1", K);
                compare(K, TRELLIS_CB_MUL1, x, NULL, max_tiles, 0, what);
                snprintf(what, sizeof what, "768x256.weight K=%d mul1 weighted", K);
                compare(K, TRELLIS_CB_MUL1, x, tw, max_tiles, 0, what);
            }
        }
        free(tw);
        st_mini_close(&st);
    } else {
        CHECK_MSG(0, "cannot read %s", t_data_path("exl3/quant-cases.safetensors"));
    }
    free(x);
}

static void test_workspace(void)
{
    const size_t n = 9;
    float *x = malloc(n * 256 * sizeof(float));
    CHECK(x != NULL);
    for (size_t i = 0; x && i < n * 256; i++) x[i] = gauss();
    for (int K = 1; x && K <= TRELLIS_K_MAX; K++) {
        const size_t sb = trellis_cuda_enc_slot_bytes(K, TRELLIS_CB_MUL1);
        trellis_cuda_enc *ge = NULL;
        CHECK(trellis_cuda_enc_create(K, TRELLIS_CB_MUL1, sb, &ge) == SPARQ_OK);
        if (ge) {
            CHECK_EQ_INT(trellis_cuda_enc_slots(ge), 1);
            fprintf(stderr, "  K=%d: node costs in %s memory, %zu bytes per tile in flight\n", K,
                    trellis_cuda_enc_costs_in_shared(ge) ? "shared" : "global", sb);
        }
        trellis_cuda_enc_free(ge);
        ge = NULL;
        CHECK(trellis_cuda_enc_create(K, TRELLIS_CB_MUL1, sb - 1, &ge) == SPARQ_E_NOMEM);
        CHECK_STR_CONTAINS(sparq_errmsg(), "cannot hold one");
        CHECK(ge == NULL);
        char what[64];
        snprintf(what, sizeof what, "K=%d one-tile workspace", K);
        if (K == 1 || K == 3 || K == 8) compare(K, TRELLIS_CB_MUL1, x, NULL, n, sb, what);
    }
    free(x);
}

int main(void)
{
    const char *why = "";
    if (gpu_probe_count(&why) == 0 || trellis_cuda_device_count() == 0) T_SKIP("skipped: no GPU (%s)", why);
    if (sparq_pool_create(&pool, sparq_cpu_count()) != SPARQ_OK) {
        fprintf(stderr, "no thread pool: %s\n", sparq_errmsg());
        return 1;
    }
    RUN(test_cb_values);
    RUN(test_workspace);
    RUN(test_random);
    RUN(test_golden);
    fprintf(stderr, "  %ld tiles compared, %ld tile errors bit-identical to the CPU's\n", tiles_checked,
            err_bit_exact);
    sparq_pool_free(pool);
    return t_summary();
}
