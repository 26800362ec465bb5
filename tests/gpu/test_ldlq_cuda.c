/* tests/gpu/test_ldlq_cuda.c — the GPU LDLQ recursion (kernels/cuda/ldlq_cuda.h)
 * against the CPU quantizer (quantize/ldlq.h, itself checked against
 * exllamav3 by tests/quantize/test_ldlq.c), on exllamav3's golden linears
 * (tests/data/exl3: real weights and Hessians, K 1..8, three codebooks):
 *  - the global scale found through the GPU encoder equals the CPU's exactly
 *    (the encoder is bit-exact, so the search walks the same numbers);
 *  - the last 16-row strip (no feedback yet) is the CPU's trellis bit for bit;
 *  - the proxy error agrees with the CPU's within 1e-4 relative (the feedback
 *    SGEMM sums in another order: the figure is printed);
 *  - the GPU's trellis words decode (CPU decoder) to exactly the GPU's wq;
 *  - with the identity Hessian every word equals the CPU's;
 *  - a weight gives the same words alone and inside a batch of several
 *    weights with two Hessians (so --resume and batch sizes cannot change
 *    the output);
 *  - with the Hessian prepared on the GPU (ldlq_cuda_hess_prepare): the same
 *    identity / damping / signs as the CPU's; its L differs from spotrf's by
 *    ~1e-5, which flips a few tiles' paths: proxy within 1e-2 per case and
 *    within 2e-3 on average (no bias);
 *  - two batches in flight at once (submit, submit, wait, wait; other
 *    shapes and K) give ldlq_cuda_batch's words, wq and proxies bit for bit,
 *    and a search encode and a Hessian preparation run beside them with
 *    their results unchanged;
 *  - the scale search's encodes (Gaussian tiles at scales 0.3..1.5, every K):
 *    the GPU's states equal the CPU's; where they differ, whether the GPU's
 *    error is worse, better or equal is printed;
 *  - contexts per device (--devices): an ordinal past the last device, or
 *    negative, is refused naming it; two contexts on device 0, each driven
 *    from its own thread at the same time (a batch of three weights, a GPU
 *    Hessian preparation and a search encode each), give the words and
 *    proxies of the one context, bit for bit;
 *  - the regularisation on the GPU (ldlq_cuda_reg_*, the ldlq_reg_engine):
 *    on random weights with loud rows and columns, a zero row and a zero
 *    column, calibrated and identity Hessians, the scale search or a fixed
 *    scale, several shapes: su, sv, g and every float of the regularised
 *    weight equal the CPU engine's bit for bit, and the batch reading the
 *    device matrix in place (wr_device) gives the words of the batch that
 *    uploads the CPU's;
 *  - errors: a shape that is not a multiple of 128 is refused.
 * Exits 77 ("skipped: no GPU") without a usable GPU. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/safetensors.h"
#include "gpu/gpu_probe.h"
#include "kernels/cpu/trellis.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "quantize/exl3_cases.h"
#include "quantize/ldlq.h"
#include "t.h"

static sparq_pool *g_pool;
static ldlq_cuda *g_ctx;
static double worst_proxy_rel, worst_proxy_relh, sum_relh;

typedef struct gpu_coder_ctx {
    int K;
    trellis_codebook cb;
} gpu_coder_ctx;

static sparq_status gpu_encode(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded)
{
    const gpu_coder_ctx *g = ctx;
    return ldlq_cuda_encode_host(g_ctx, g->K, g->cb, x, n_tiles, states, decoded);
}

/* One weight quantized both ways. */
typedef struct both {
    uint16_t *t_cpu, *t_gpu;
    float *wq_gpu;
    double p_cpu, p_gpu, g_cpu, g_gpu;
    double p_gpuh;   /* the GPU recursion with the Hessian prepared on the GPU too */
    int same_prep;   /* identity, damping and su of the GPU preparation equal the CPU's */
} both;

static void both_free(both *b)
{
    sparq_free(b->t_cpu);
    sparq_free(b->t_gpu);
    sparq_free(b->wq_gpu);
}

static sparq_status run_both(const float *h, const float *w, int k, int n, int K, trellis_codebook cb, uint64_t seed,
                             both *b)
{
    memset(b, 0, sizeof *b);
    ldlq_hessian *hs = NULL;
    FORWARD_IF(ldlq_hessian_prepare(&hs, h, k, 0.0f, seed, "case"));
    const size_t words = (size_t)k * n / 256 * 16 * K;
    b->t_cpu = sparq_malloc(words * 2);
    b->t_gpu = sparq_malloc(words * 2);
    b->wq_gpu = sparq_malloc((size_t)k * n * 4);
    uint16_t *suh = sparq_malloc((size_t)k * 2), *svh = sparq_malloc((size_t)n * 2);
    viterbi_enc *enc = NULL;
    sparq_status st = viterbi_create(&enc, K, cb, sparq_pool_size(g_pool));
    ldlq_opts o;
    ldlq_opts_default(&o, K);
    o.cb = cb;
    o.seed = seed;
    ldlq_result r = {.trellis = b->t_cpu, .suh = suh, .svh = svh};
    if (st == SPARQ_OK) st = ldlq_quantize(hs, w, n, &o, enc, g_pool, "cpu", &r);
    b->p_cpu = r.proxy_err, b->g_cpu = r.g_scale;
    gpu_coder_ctx gc = {K, cb};
    const ldlq_coder coder = {gpu_encode, &gc};
    ldlq_reg reg = {0};
    if (st == SPARQ_OK) st = ldlq_regularize(hs, w, n, &o, &coder, "gpu", &reg);
    b->g_gpu = reg.g;
    ldlq_cuda_item it = {.hess = 0, .wr = reg.wr, .trellis = b->t_gpu, .wq = b->wq_gpu};
    const ldlq_cuda_hess gh = {ldlq_hessian_hr(hs), ldlq_hessian_l(hs), ldlq_hessian_d(hs), 0};
    const ldlq_cuda_shape s = {k, n, K, cb, 0};
    if (st == SPARQ_OK) st = ldlq_cuda_batch(g_ctx, &s, &gh, 1, &it, 1, "gpu");
    b->p_gpu = it.proxy_err;
    ldlq_reg_free(&reg);
    /* again with the Hessian prepared on the GPU (what quantize --device cuda does) */
    ldlq_cuda_dhess *dh = NULL;
    ldlq_hessian *wh = NULL;
    float *su = sparq_malloc((size_t)k * 4), *hd = sparq_malloc((size_t)k * 4);
    int ident = 0;
    float damp = 0;
    if (st == SPARQ_OK) st = ldlq_cuda_hess_prepare(g_ctx, h, k, 0.0f, seed, "case", &dh, su, hd, &ident, &damp);
    if (st == SPARQ_OK) {
        b->same_prep = (ident != 0) == ldlq_hessian_is_identity(hs) && damp == ldlq_hessian_damping(hs) &&
                       memcmp(su, ldlq_hessian_su(hs), (size_t)k * 4) == 0;
        st = ldlq_hessian_wrap(&wh, k, su, hd, ident != 0, damp);
    }
    if (st == SPARQ_OK) st = ldlq_regularize(wh, w, n, &o, &coder, "gpu", &reg);
    uint16_t *t2 = sparq_malloc(words * 2);
    ldlq_cuda_item it2 = {.hess = 0, .wr = reg.wr, .trellis = t2};
    const ldlq_cuda_hess gh2 = dh ? ldlq_cuda_hess_of(dh) : (ldlq_cuda_hess){0};
    if (st == SPARQ_OK) st = ldlq_cuda_batch(g_ctx, &s, &gh2, 1, &it2, 1, "gpu hessian");
    b->p_gpuh = it2.proxy_err;
    ldlq_reg_free(&reg);
    ldlq_hessian_free(wh);
    ldlq_cuda_hess_free(dh);
    sparq_free(t2), sparq_free(su), sparq_free(hd);
    viterbi_free(enc);
    ldlq_hessian_free(hs);
    sparq_free(suh);
    sparq_free(svh);
    return st;
}

/* The GPU words decode to the GPU's wq (regularised basis: the codebook values). */
static void check_words_decode(const both *b, int k, int n, int K, trellis_codebook cb, const char *c)
{
    const int tn = n / 16, words = 16 * K;
    long bad = 0;
    float tile[256];
    for (int ti = 0; ti < k / 16; ti++)
        for (int tj = 0; tj < tn; tj++) {
            trellis_tile_decode(b->t_gpu + ((size_t)ti * tn + tj) * words, K, cb, tile);
            for (int r = 0; r < 16; r++)
                for (int q = 0; q < 16; q++)
                    bad += tile[r * 16 + q] != b->wq_gpu[(size_t)(ti * 16 + r) * n + tj * 16 + q];
        }
    CHECK_MSG(bad == 0, "%s: %ld values of the GPU's words differ from its wq", c, bad);
}

static void test_golden(void)
{
    const char *list = sf_metadata(g_cases, "cases");
    CHECK(list != NULL);
    if (!list) return;
    char *cases = sparq_strdup(list);
    int n_cases = 0;
    for (char *save = NULL, *c = strtok_r(cases, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
        int k = 0, n = 0, K = 0;
        trellis_codebook cb = TRELLIS_CB_MUL1;
        float *w = NULL, *h = NULL;
        const bool have = exl3_case_load(c, &k, &n, &K, &cb, &w, &h);
        CHECK_MSG(have, "%s: missing weight / Hessian / count", c);
        if (have) {
            both b;
            sparq_status st = run_both(h, w, k, n, K, cb, 1234, &b);
            CHECK_MSG(st == SPARQ_OK, "%s: %s", c, sparq_errmsg());
            if (st == SPARQ_OK) {
                const double rel = fabs(b.p_gpu - b.p_cpu) / b.p_cpu;
                if (rel > worst_proxy_rel) worst_proxy_rel = rel;
                printf("  %-24s proxy cpu %.6e gpu %.6e (rel %.1e)  g %.6f / %.6f\n", c, b.p_cpu, b.p_gpu, rel,
                       b.g_cpu, b.g_gpu);
                CHECK_MSG(b.g_cpu == b.g_gpu, "%s: scale %.9g on the GPU, %.9g on the CPU", c, b.g_gpu, b.g_cpu);
                CHECK_MSG(rel <= 1e-4, "%s: proxy %.9g on the GPU, %.9g on the CPU (%.2e relative)", c, b.p_gpu,
                          b.p_cpu, rel);
                /* the GPU's Cholesky differs from spotrf by ~1e-5 relative: enough to flip a few tiles'
                 * paths, so the proxy moves by up to ~3e-3 either way (measured); a wrong factor moves it
                 * by far more, and a bias shows in the mean */
                const double relh = fabs(b.p_gpuh - b.p_cpu) / b.p_cpu;
                if (relh > worst_proxy_relh) worst_proxy_relh = relh;
                sum_relh += (b.p_gpuh - b.p_cpu) / b.p_cpu;
                CHECK_MSG(relh <= 1e-2, "%s: proxy %.9g with the GPU's Hessian, %.9g on the CPU (%.2e)", c, b.p_gpuh,
                          b.p_cpu, relh);
                CHECK_MSG(b.same_prep, "%s: the GPU's Hessian preparation decided otherwise than the CPU's", c);
                const size_t words = (size_t)n / 16 * 16 * K, last = (size_t)(k / 16 - 1) * words;
                CHECK_MSG(memcmp(b.t_cpu + last, b.t_gpu + last, words * 2) == 0,
                          "%s: the last strip's words differ from the CPU's", c);
                check_words_decode(&b, k, n, K, cb, c);
                n_cases++;
            }
            both_free(&b);
        }
        sparq_free(w);
        sparq_free(h);
    }
    sparq_free(cases);
    CHECK(n_cases >= 8);
    CHECK_MSG(n_cases && fabs(sum_relh / n_cases) <= 2e-3, "the GPU's Hessians move the proxy by %.2e on average",
              n_cases ? sum_relh / n_cases : 0.0);
    printf("  %d golden cases, worst proxy difference %.2e relative (%.2e with the GPU's Hessians)\n", n_cases,
           worst_proxy_rel, worst_proxy_relh);
}

static uint64_t rs = 0x243F6A8885A308D3ull;
static double unif(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return ((double)(rs >> 11) + 0.5) / 9007199254740992.0;
}
static float gauss(void) { return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif())); }

static void test_identity(void)
{
    const int k = 256, n = 384;
    float *w = sparq_malloc((size_t)k * n * 4);
    for (size_t i = 0; i < (size_t)k * n; i++) w[i] = gauss() * 0.02f;
    for (int K = 2; K <= 4; K++) {
        both b;
        sparq_status st = run_both(NULL, w, k, n, K, TRELLIS_CB_MUL1, 7, &b);
        CHECK_MSG(st == SPARQ_OK, "identity K=%d: %s", K, sparq_errmsg());
        if (st == SPARQ_OK) {
            CHECK_MSG(memcmp(b.t_cpu, b.t_gpu, (size_t)k * n / 256 * 16 * K * 2) == 0,
                      "identity K=%d: words differ from the CPU's", K);
            CHECK_MSG(fabs(b.p_gpu - b.p_cpu) <= 1e-9 * b.p_cpu, "identity K=%d: proxy %.12g vs %.12g", K, b.p_gpu,
                      b.p_cpu);
        }
        both_free(&b);
    }
    sparq_free(w);
}

/* Item 0 alone and inside a batch of 5 weights reading 2 Hessians: the same words. */
static void test_batch_invariance(void)
{
    const int k = 512, n = 256, K = 3, rows = 700;
    float *x = sparq_malloc((size_t)rows * k * 4), *h[2];
    ldlq_hessian *hs[2] = {0};
    for (int q = 0; q < 2; q++) {
        h[q] = sparq_calloc((size_t)k * k, 4);
        for (size_t i = 0; i < (size_t)rows * k; i++) x[i] = gauss() * (i % k < 8 ? 4.0f : 1.0f);
        for (int r = 0; r < rows; r++)
            for (int a = 0; a < k; a++)
                for (int c = 0; c < k; c++) h[q][(size_t)a * k + c] += x[(size_t)r * k + a] * x[(size_t)r * k + c] / rows;
        CHECK(ldlq_hessian_prepare(&hs[q], h[q], k, 0.0f, 11 + q, "batch") == SPARQ_OK);
    }
    ldlq_opts o;
    ldlq_opts_default(&o, K);
    o.g_fixed = ldlq_default_g(K, o.cb);
    ldlq_reg reg[5] = {0};
    ldlq_cuda_item it[5];
    uint16_t *t[5], *alone = sparq_malloc((size_t)k * n / 256 * 16 * K * 2);
    float *w = sparq_malloc((size_t)k * n * 4);
    for (int i = 0; i < 5; i++) {
        for (size_t e = 0; e < (size_t)k * n; e++) w[e] = gauss();
        o.seed = 100 + i;
        CHECK(ldlq_regularize(hs[i % 2], w, n, &o, NULL, "batch", &reg[i]) == SPARQ_OK);
        t[i] = sparq_malloc((size_t)k * n / 256 * 16 * K * 2);
        it[i] = (ldlq_cuda_item){.hess = i % 2, .wr = reg[i].wr, .trellis = t[i]};
    }
    const ldlq_cuda_hess gh[2] = {{ldlq_hessian_hr(hs[0]), ldlq_hessian_l(hs[0]), ldlq_hessian_d(hs[0]), 0},
                                  {ldlq_hessian_hr(hs[1]), ldlq_hessian_l(hs[1]), ldlq_hessian_d(hs[1]), 0}};
    const ldlq_cuda_shape s = {k, n, K, TRELLIS_CB_MUL1, 0};
    CHECK(ldlq_cuda_batch(g_ctx, &s, gh, 2, it, 5, "batch") == SPARQ_OK);
    for (int i = 0; i < 5; i += 3) { /* item 0 (Hessian 0) and item 3 (Hessian 1) alone */
        ldlq_cuda_item one = {.hess = 0, .wr = reg[i].wr, .trellis = alone};
        CHECK(ldlq_cuda_batch(g_ctx, &s, &gh[i % 2], 1, &one, 1, "alone") == SPARQ_OK);
        CHECK_MSG(memcmp(alone, t[i], (size_t)k * n / 256 * 16 * K * 2) == 0,
                  "item %d: words alone differ from the batch's", i);
        CHECK_MSG(one.proxy_err == it[i].proxy_err, "item %d: proxy %.12g alone, %.12g in the batch", i,
                  one.proxy_err, it[i].proxy_err);
    }
    /* errors */
    const ldlq_cuda_shape bad = {k, 200, K, TRELLIS_CB_MUL1, 0};
    CHECK(ldlq_cuda_batch(g_ctx, &bad, gh, 2, it, 1, "bad") == SPARQ_E_SHAPE);
    for (int i = 0; i < 5; i++) {
        ldlq_reg_free(&reg[i]);
        sparq_free(t[i]);
    }
    for (int q = 0; q < 2; q++) {
        ldlq_hessian_free(hs[q]);
        sparq_free(h[q]);
    }
    sparq_free(alone);
    sparq_free(w);
    sparq_free(x);
}

/* A random calibrated Hessian (rows Gaussian activations with 8 loud channels). */
static float *random_hessian(int k, int rows)
{
    float *x = sparq_malloc((size_t)rows * k * 4), *h = sparq_calloc((size_t)k * k, 4);
    for (size_t i = 0; i < (size_t)rows * k; i++) x[i] = gauss() * (i % k < 8 ? 4.0f : 1.0f);
    for (int r = 0; r < rows; r++)
        for (int a = 0; a < k; a++)
            for (int c = 0; c < k; c++) h[(size_t)a * k + c] += x[(size_t)r * k + a] * x[(size_t)r * k + c] / rows;
    sparq_free(x);
    return h;
}

/* Two batches in flight at once (submit A, submit B, wait A, wait B), of other shapes and
 * K, one with host Hessians and wq, one with a Hessian prepared on the GPU and the identity:
 * every word, wq and proxy equal ldlq_cuda_batch's of the same batch, bit for bit. While
 * both are in flight, the scale search's encode and a Hessian preparation run (they must
 * not wait for the batches, nor disturb them) and give what they gave before. */
static void test_two_in_flight(void)
{
    const int ka = 512, na = 256, Ka = 3, kb = 256, nb = 384, Kb = 4;
    float *ha[2] = {random_hessian(ka, 600), random_hessian(ka, 600)}, *hb = random_hessian(kb, 400);
    ldlq_hessian *hsa[2] = {0}, *hsb = NULL;
    for (int q = 0; q < 2; q++) CHECK(ldlq_hessian_prepare(&hsa[q], ha[q], ka, 0.0f, 21 + q, "a") == SPARQ_OK);
    ldlq_cuda_dhess *dhb = NULL;
    float *su = sparq_malloc((size_t)kb * 4), *hd = sparq_malloc((size_t)kb * 4);
    int ident = 0;
    float damp = 0;
    CHECK(ldlq_cuda_hess_prepare(g_ctx, hb, kb, 0.0f, 31, "b", &dhb, su, hd, &ident, &damp) == SPARQ_OK);
    CHECK(dhb && ldlq_hessian_wrap(&hsb, kb, su, hd, ident != 0, damp) == SPARQ_OK);
    if (!dhb || !hsb) return;
    const ldlq_cuda_hess gha[2] = {{ldlq_hessian_hr(hsa[0]), ldlq_hessian_l(hsa[0]), ldlq_hessian_d(hsa[0]), 0},
                                   {ldlq_hessian_hr(hsa[1]), ldlq_hessian_l(hsa[1]), ldlq_hessian_d(hsa[1]), 0}};
    const ldlq_cuda_hess ghb[2] = {ldlq_cuda_hess_of(dhb), {0}};
    enum { NA = 3, NB = 2 };
    ldlq_reg ra[NA] = {0}, rb[NB] = {0};
    ldlq_cuda_item ia[2][NA], ib[2][NB]; /* [0] ldlq_cuda_batch, [1] in flight together */
    const size_t wa = (size_t)ka * na / 256 * 16 * Ka, wb = (size_t)kb * nb / 256 * 16 * Kb;
    float *w = sparq_malloc((size_t)ka * na * 4 > (size_t)kb * nb * 4 ? (size_t)ka * na * 4 : (size_t)kb * nb * 4);
    ldlq_opts o;
    for (int i = 0; i < NA; i++) {
        ldlq_opts_default(&o, Ka);
        o.g_fixed = ldlq_default_g(Ka, o.cb), o.seed = 300 + i;
        for (size_t e = 0; e < (size_t)ka * na; e++) w[e] = gauss();
        CHECK(ldlq_regularize(hsa[i % 2], w, na, &o, NULL, "a", &ra[i]) == SPARQ_OK);
        for (int v = 0; v < 2; v++)
            ia[v][i] = (ldlq_cuda_item){.hess = i % 2, .wr = ra[i].wr, .trellis = sparq_malloc(wa * 2),
                                        .wq = sparq_malloc((size_t)ka * na * 4)};
    }
    for (int i = 0; i < NB; i++) {
        ldlq_opts_default(&o, Kb);
        o.g_fixed = ldlq_default_g(Kb, o.cb), o.seed = 400 + i;
        for (size_t e = 0; e < (size_t)kb * nb; e++) w[e] = gauss();
        CHECK(ldlq_regularize(hsb, w, nb, &o, NULL, "b", &rb[i]) == SPARQ_OK);
        for (int v = 0; v < 2; v++)
            ib[v][i] = (ldlq_cuda_item){.hess = i, .wr = rb[i].wr, .trellis = sparq_malloc(wb * 2)};
    }
    const ldlq_cuda_shape sa = {ka, na, Ka, TRELLIS_CB_MUL1, 0}, sb = {kb, nb, Kb, TRELLIS_CB_MUL1, 1};
    CHECK(ldlq_cuda_batch(g_ctx, &sa, gha, 2, ia[0], NA, "a alone") == SPARQ_OK);
    CHECK(ldlq_cuda_batch(g_ctx, &sb, ghb, 2, ib[0], NB, "b alone") == SPARQ_OK);
    /* the side work's references, before anything is in flight */
    const size_t nt = 3000;
    float *x = sparq_malloc(nt * 256 * 4), *dec0 = sparq_malloc(nt * 256 * 4), *dec1 = sparq_malloc(nt * 256 * 4);
    uint16_t *st0 = sparq_malloc(nt * 512), *st1 = sparq_malloc(nt * 512);
    for (size_t i = 0; i < nt * 256; i++) x[i] = gauss() * 0.8f;
    CHECK(ldlq_cuda_encode_host(g_ctx, Ka, TRELLIS_CB_MUL1, x, nt, st0, dec0) == SPARQ_OK);
    float *su2 = sparq_malloc((size_t)ka * 4), *hd2 = sparq_malloc((size_t)ka * 4), *su3 = sparq_malloc((size_t)ka * 4),
          *hd3 = sparq_malloc((size_t)ka * 4);
    ldlq_cuda_dhess *d2 = NULL, *d3 = NULL;
    int id2 = 0, id3 = 0;
    float dm2 = 0, dm3 = 0;
    CHECK(ldlq_cuda_hess_prepare(g_ctx, ha[0], ka, 0.0f, 41, "side", &d2, su2, hd2, &id2, &dm2) == SPARQ_OK);

    ldlq_cuda_pending *pa = NULL, *pb = NULL;
    CHECK(ldlq_cuda_batch_submit(g_ctx, &sa, gha, 2, ia[1], NA, "a", &pa) == SPARQ_OK);
    CHECK(ldlq_cuda_batch_submit(g_ctx, &sb, ghb, 2, ib[1], NB, "b", &pb) == SPARQ_OK);
    CHECK(pa != NULL && pb != NULL);
    CHECK(ldlq_cuda_encode_host(g_ctx, Ka, TRELLIS_CB_MUL1, x, nt, st1, dec1) == SPARQ_OK);
    CHECK(ldlq_cuda_hess_prepare(g_ctx, ha[0], ka, 0.0f, 41, "side", &d3, su3, hd3, &id3, &dm3) == SPARQ_OK);
    double ga = 0, gb = 0;
    CHECK(ldlq_cuda_batch_wait(pa, &ga) == SPARQ_OK);
    CHECK(ldlq_cuda_batch_wait(pb, &gb) == SPARQ_OK);
    CHECK_MSG(ga > 0 && gb > 0, "GPU seconds %.6f and %.6f", ga, gb);
    for (int i = 0; i < NA; i++) {
        CHECK_MSG(memcmp(ia[0][i].trellis, ia[1][i].trellis, wa * 2) == 0, "a %d: words differ in flight", i);
        CHECK_MSG(memcmp(ia[0][i].wq, ia[1][i].wq, (size_t)ka * na * 4) == 0, "a %d: wq differs in flight", i);
        CHECK_MSG(ia[0][i].proxy_err == ia[1][i].proxy_err, "a %d: proxy %.17g vs %.17g", i, ia[0][i].proxy_err,
                  ia[1][i].proxy_err);
    }
    for (int i = 0; i < NB; i++) {
        CHECK_MSG(memcmp(ib[0][i].trellis, ib[1][i].trellis, wb * 2) == 0, "b %d: words differ in flight", i);
        CHECK_MSG(ib[0][i].proxy_err == ib[1][i].proxy_err, "b %d: proxy %.17g vs %.17g", i, ib[0][i].proxy_err,
                  ib[1][i].proxy_err);
    }
    CHECK_MSG(memcmp(st0, st1, nt * 512) == 0 && memcmp(dec0, dec1, nt * 256 * 4) == 0,
              "the search's encode beside two batches differs from its encode alone");
    CHECK_MSG(d3 && id2 == id3 && dm2 == dm3 && memcmp(su2, su3, (size_t)ka * 4) == 0 &&
                  memcmp(hd2, hd3, (size_t)ka * 4) == 0,
              "the Hessian prepared beside two batches differs from the one prepared alone");
    /* errors: a bad item is refused before anything is queued */
    ldlq_cuda_item bad = ia[1][0];
    bad.hess = 5;
    ldlq_cuda_pending *pc = (ldlq_cuda_pending *)&bad;
    CHECK(ldlq_cuda_batch_submit(g_ctx, &sa, gha, 2, &bad, 1, "bad", &pc) == SPARQ_E_ARG);
    CHECK(pc == NULL);
    CHECK(ldlq_cuda_batch_wait(NULL, NULL) == SPARQ_OK);
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < NA; i++) sparq_free(ia[v][i].trellis), sparq_free(ia[v][i].wq);
        for (int i = 0; i < NB; i++) sparq_free(ib[v][i].trellis);
    }
    for (int i = 0; i < NA; i++) ldlq_reg_free(&ra[i]);
    for (int i = 0; i < NB; i++) ldlq_reg_free(&rb[i]);
    ldlq_cuda_hess_free(d2), ldlq_cuda_hess_free(d3), ldlq_cuda_hess_free(dhb);
    for (int q = 0; q < 2; q++) ldlq_hessian_free(hsa[q]), sparq_free(ha[q]);
    ldlq_hessian_free(hsb);
    sparq_free(hb), sparq_free(su), sparq_free(hd), sparq_free(su2), sparq_free(hd2), sparq_free(su3), sparq_free(hd3);
    sparq_free(x), sparq_free(dec0), sparq_free(dec1), sparq_free(st0), sparq_free(st1), sparq_free(w);
}

/* The scale search's encodes: Gaussian tiles at some of the search's scales, every K, mul1:
 * the GPU's states against the CPU encoder's. Where they differ the tile's squared
 * errors are compared (equal: another path of the same cost; else a real difference). */
/* The regularisation's matrix work on the GPU against the CPU's: the same bits (see the top). */
static void test_reg_engine(void)
{
    const ldlq_reg_engine gpu = LDLQ_CUDA_REG_ENGINE(g_ctx);
    static const struct {
        int k, n, calibrated, search, out_scales, K;
    } cases[] = {{128, 256, 1, 1, 1, 3}, {256, 128, 0, 1, -1, 2}, {512, 384, 1, 0, 1, 4}, {384, 512, 1, 1, -1, 5}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int k = cases[ci].k, n = cases[ci].n, K = cases[ci].K;
        float *w = sparq_malloc((size_t)k * n * 4);
        for (int r = 0; r < k; r++)
            for (int c = 0; c < n; c++)
                w[(size_t)r * n + c] = gauss() * 0.02f * (r % 37 == 3 ? 20.0f : 1.0f) * (c % 53 == 5 ? 30.0f : 1.0f) *
                                       (r == 7 || c == 11 ? 0.0f : 1.0f);
        float *h = cases[ci].calibrated ? random_hessian(k, k + 64) : NULL;
        ldlq_hessian *hs = NULL;
        CHECK_MSG(ldlq_hessian_prepare(&hs, h, k, 0.0f, 11 + ci, "reg") == SPARQ_OK, "%s", sparq_errmsg());
        ldlq_opts o;
        ldlq_opts_default(&o, K);
        o.seed = 5 + ci;
        o.out_scales = cases[ci].out_scales;
        if (!cases[ci].search) o.g_fixed = ldlq_default_g(K, o.cb);
        gpu_coder_ctx gc = {K, o.cb};
        const ldlq_coder coder = {gpu_encode, &gc};
        ldlq_reg rc = {0}, rg = {0};
        sparq_status st = ldlq_regularize_on(hs, w, n, &o, &coder, &ldlq_reg_engine_cpu, "cpu", &rc);
        CHECK_MSG(st == SPARQ_OK, "case %zu: cpu: %s", ci, sparq_errmsg());
        if (st == SPARQ_OK) st = ldlq_regularize_on(hs, w, n, &o, &coder, &gpu, "gpu", &rg);
        CHECK_MSG(st == SPARQ_OK, "case %zu: gpu: %s", ci, sparq_errmsg());
        if (st == SPARQ_OK) {
            CHECK_MSG(rg.wr == NULL && rg.dev != NULL, "case %zu: the GPU's matrix is on the device", ci);
            CHECK_MSG(rc.g == rg.g && rc.smse == rg.smse && rc.apply_out == rg.apply_out,
                      "case %zu: g %.9g / %.9g, smse %.9g / %.9g", ci, rc.g, rg.g, rc.smse, rg.smse);
            CHECK_MSG(memcmp(rc.su, rg.su, (size_t)k * 4) == 0 && memcmp(rc.sv, rg.sv, (size_t)n * 4) == 0,
                      "case %zu: su / sv differ", ci);
            /* every tile of both matrices, through the engines' own gathers */
            const size_t nt = (size_t)k * n / 256;
            int *idx = sparq_malloc(nt * sizeof *idx);
            float *tc = sparq_malloc(nt * 1024), *tg = sparq_malloc(nt * 1024);
            for (size_t i = 0; i < nt; i++) idx[i] = (int)i;
            CHECK(ldlq_reg_engine_cpu.tiles(NULL, rc.dev, idx, nt, tc) == SPARQ_OK);
            CHECK(gpu.tiles(g_ctx, rg.dev, idx, nt, tg) == SPARQ_OK);
            size_t diff = 0;
            for (size_t i = 0; i < nt * 256; i++) diff += memcmp(&tc[i], &tg[i], 4) != 0;
            CHECK_MSG(diff == 0, "case %zu (%d x %d): %zu of %zu regularised floats differ", ci, k, n, diff, nt * 256);
            /* the batch reading the device matrix in place: the words of the host one */
            const size_t words = nt * 16 * K;
            uint16_t *t1 = sparq_malloc(words * 2), *t2 = sparq_malloc(words * 2);
            ldlq_cuda_item i1 = {.hess = 0, .wr = rc.wr, .trellis = t1};
            ldlq_cuda_item i2 = {.hess = 0, .wr = ldlq_cuda_reg_device(rg.dev), .trellis = t2};
            const ldlq_cuda_hess gh = {ldlq_hessian_hr(hs), ldlq_hessian_l(hs), ldlq_hessian_d(hs), 0};
            const ldlq_cuda_shape s1 = {k, n, K, o.cb, 0, 0}, s2 = {k, n, K, o.cb, 0, 1};
            CHECK_MSG(ldlq_cuda_batch_bytes(&s2, 1, 1, 0) + (size_t)k * n * 4 == ldlq_cuda_batch_bytes(&s1, 1, 1, 0),
                      "case %zu: a device weight's batch holds no copy of it", ci);
            st = ldlq_cuda_batch(g_ctx, &s1, &gh, 1, &i1, 1, "host wr");
            if (st == SPARQ_OK) st = ldlq_cuda_batch(g_ctx, &s2, &gh, 1, &i2, 1, "device wr");
            CHECK_MSG(st == SPARQ_OK, "case %zu: batch: %s", ci, sparq_errmsg());
            CHECK_MSG(st != SPARQ_OK || (memcmp(t1, t2, words * 2) == 0 && i1.proxy_err == i2.proxy_err),
                      "case %zu: words or proxy differ with the device weight", ci);
            sparq_free(t1), sparq_free(t2), sparq_free(idx), sparq_free(tc), sparq_free(tg);
        }
        ldlq_reg_free(&rc);
        ldlq_reg_free(&rg);
        ldlq_hessian_free(hs);
        sparq_free(h);
        sparq_free(w);
    }
    /* a shape the butterflies cannot take is refused before anything is allocated */
    void *m = NULL;
    float x[128 * 4] = {0};
    CHECK(ldlq_cuda_reg_load(g_ctx, x, 4, 128, &m) == SPARQ_E_SHAPE && m == NULL);
}

static long search_worse, search_better, search_tie, search_tiles;
static void test_search_encodes(void)
{
    const size_t nt = 256;
    const float scales[] = {0.3f, 0.5f, 0.9f, 1.5f};
    float *x = sparq_malloc(nt * 256 * 4), *dc = sparq_malloc(nt * 256 * 4), *dg = sparq_malloc(nt * 256 * 4);
    uint16_t *sc = sparq_malloc(nt * 512), *sg = sparq_malloc(nt * 512);
    for (int K = 1; K <= 8; K++) {
        viterbi_enc *enc = NULL;
        CHECK(viterbi_create(&enc, K, TRELLIS_CB_MUL1, sparq_pool_size(g_pool)) == SPARQ_OK);
        for (int si = 0; si < 4; si++) {
            for (size_t i = 0; i < nt * 256; i++) x[i] = gauss() * 1.004f * scales[si];
            CHECK(viterbi_encode_tiles(enc, x, NULL, nt, sc, dc, NULL, g_pool) == SPARQ_OK);
            CHECK(ldlq_cuda_encode_host(g_ctx, K, TRELLIS_CB_MUL1, x, nt, sg, dg) == SPARQ_OK);
            long d = 0;
            for (size_t t = 0; t < nt; t++) {
                if (memcmp(sc + t * 256, sg + t * 256, 512) == 0) continue;
                d++;
                float ec = 0, eg = 0; /* the encoder's own fp32 sums, in position order */
                for (int p = 0; p < 256; p++) {
                    const float a = dc[t * 256 + p] - x[t * 256 + p], b = dg[t * 256 + p] - x[t * 256 + p];
                    ec += a * a, eg += b * b;
                }
                if (eg > ec) search_worse++;
                else if (eg < ec) search_better++;
                else search_tie++;
                if (d <= 2)
                    printf("  mul1 K=%d scale %.1f tile %zu: squared error cpu %.9g gpu %.9g\n", K, scales[si], t, ec,
                           eg);
            }
            search_tiles += (long)nt;
            if (d) printf("  mul1 K=%d scale %.1f: %ld of %zu tiles differ\n", K, scales[si], d, nt);
        }
        viterbi_free(enc);
    }
    printf("  search encodes: %ld tiles, differing: %ld GPU worse, %ld GPU better, %ld equal error\n", search_tiles,
           search_worse, search_better, search_tie);
    CHECK_MSG(search_worse + search_better + search_tie == 0, "the GPU encoder took other paths on %ld tiles",
              search_worse + search_better + search_tie);
    sparq_free(x), sparq_free(dc), sparq_free(dg), sparq_free(sc), sparq_free(sg);
}

/* One context's share of test_contexts: a Hessian prepared on its device, a search encode,
 * and a batch of three weights reading it, all from this thread. */
typedef struct ctx_job {
    ldlq_cuda *c;
    const float *h, *w[3];
    int k, n, K;
    uint16_t *t[3], *st;
    const float *tiles;
    double proxy[3];
    sparq_status status;
    char msg[512];
} ctx_job;

static void *ctx_run(void *arg)
{
    ctx_job *jb = arg;
    ldlq_cuda_dhess *dh = NULL;
    float *su = sparq_malloc((size_t)jb->k * 4), *hd = sparq_malloc((size_t)jb->k * 4);
    int ident = 0;
    float damp = 0;
    sparq_status st = ldlq_cuda_hess_prepare(jb->c, jb->h, jb->k, 0.0f, 5, "ctx", &dh, su, hd, &ident, &damp);
    if (st == SPARQ_OK) st = ldlq_cuda_encode_host(jb->c, jb->K, TRELLIS_CB_MUL1, jb->tiles, 64, jb->st, NULL);
    if (st == SPARQ_OK) {
        const ldlq_cuda_hess gh = ldlq_cuda_hess_of(dh);
        ldlq_cuda_item it[3];
        for (int i = 0; i < 3; i++) it[i] = (ldlq_cuda_item){.hess = 0, .wr = jb->w[i], .trellis = jb->t[i]};
        const ldlq_cuda_shape s = {jb->k, jb->n, jb->K, TRELLIS_CB_MUL1, 0};
        st = ldlq_cuda_batch(jb->c, &s, &gh, 1, it, 3, "ctx");
        for (int i = 0; i < 3; i++) jb->proxy[i] = it[i].proxy_err;
    }
    if (st != SPARQ_OK) snprintf(jb->msg, sizeof jb->msg, "%s", sparq_errmsg());
    jb->status = st;
    ldlq_cuda_hess_free(dh);
    sparq_free(su), sparq_free(hd);
    return NULL;
}

static int g_n_gpus;

static void test_contexts(void)
{
    const int n_gpus = g_n_gpus;
    ldlq_cuda *c = NULL;
    char want[64];
    snprintf(want, sizeof want, "CUDA device %d does not exist", n_gpus);
    CHECK(ldlq_cuda_create(n_gpus, 0, &c) == SPARQ_E_ARG && c == NULL);
    CHECK_MSG(strstr(sparq_errmsg(), want) != NULL, "message: %s", sparq_errmsg());
    CHECK(ldlq_cuda_create(-1, 0, &c) == SPARQ_E_ARG && c == NULL);
    CHECK_STR_CONTAINS(sparq_errmsg(), "CUDA device -1");

    const int k = 256, n = 256, K = 3;
    float *h = random_hessian(k, 400), *w[3], *tiles = sparq_malloc(64 * 256 * 4);
    for (int i = 0; i < 64 * 256; i++) tiles[i] = gauss();
    for (int i = 0; i < 3; i++) { /* stand-ins for regularised weights: the recursion reads any wr */
        w[i] = sparq_malloc((size_t)k * n * 4);
        for (size_t e = 0; e < (size_t)k * n; e++) w[i][e] = gauss();
    }
    const size_t words = (size_t)k * n / 256 * 16 * K;
    ctx_job jb[3];
    ldlq_cuda *ctx[3] = {g_ctx, NULL, NULL};
    CHECK(ldlq_cuda_create(0, 0, &ctx[1]) == SPARQ_OK);
    CHECK(ldlq_cuda_create(0, 0, &ctx[2]) == SPARQ_OK);
    for (int j = 0; j < 3; j++) {
        jb[j] = (ctx_job){.c = ctx[j], .h = h, .w = {w[0], w[1], w[2]}, .k = k, .n = n, .K = K, .tiles = tiles};
        for (int i = 0; i < 3; i++) jb[j].t[i] = sparq_malloc(words * 2);
        jb[j].st = sparq_malloc(64 * 256 * 2);
    }
    ctx_run(&jb[0]); /* the reference: the first context alone, on this thread */
    pthread_t th[2];
    int started[2] = {0, 0};
    for (int j = 1; j < 3 && ctx[j]; j++) started[j - 1] = pthread_create(&th[j - 1], NULL, ctx_run, &jb[j]) == 0;
    for (int j = 1; j < 3; j++)
        if (started[j - 1]) pthread_join(th[j - 1], NULL);
    CHECK_MSG(jb[0].status == SPARQ_OK, "one context: %s", jb[0].msg);
    for (int j = 1; j < 3; j++) {
        CHECK_MSG(started[j - 1] && jb[j].status == SPARQ_OK, "context %d: %s", j, jb[j].msg);
        if (!started[j - 1] || jb[j].status != SPARQ_OK) continue;
        CHECK_MSG(memcmp(jb[0].st, jb[j].st, 64 * 256 * 2) == 0, "context %d: search states differ", j);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(memcmp(jb[0].t[i], jb[j].t[i], words * 2) == 0, "context %d, item %d: words differ", j, i);
            CHECK_MSG(jb[0].proxy[i] == jb[j].proxy[i], "context %d, item %d: proxy %.12g against %.12g", j, i,
                      jb[j].proxy[i], jb[0].proxy[i]);
        }
    }
    for (int j = 0; j < 3; j++) {
        for (int i = 0; i < 3; i++) sparq_free(jb[j].t[i]);
        sparq_free(jb[j].st);
    }
    ldlq_cuda_free(ctx[1]);
    ldlq_cuda_free(ctx[2]);
    for (int i = 0; i < 3; i++) sparq_free(w[i]);
    sparq_free(h), sparq_free(tiles);
}

int main(int argc, char **argv)
{
    const int only_search = argc > 1 && strcmp(argv[1], "search") == 0;
    const char *why = NULL;
    const int n_gpus = gpu_probe_count(&why);
    if (n_gpus == 0) T_SKIP("skipped: no GPU (%s)", why);
    g_n_gpus = n_gpus;
    char *p1 = strdup(t_data_path("exl3/cases.safetensors"));
    char *p2 = strdup(t_data_path("exl3/quant-cases.safetensors"));
    if (sf_open(&g_cases, p1) != SPARQ_OK || sf_open(&g_extra, p2) != SPARQ_OK) {
        fprintf(stderr, "cannot open golden data: %s\n", sparq_errmsg());
        return 1;
    }
    if (sparq_pool_create(&g_pool, 0) != SPARQ_OK || ldlq_cuda_create(0, 0, &g_ctx) != SPARQ_OK) {
        fprintf(stderr, "setup: %s\n", sparq_errmsg());
        return 1;
    }
    RUN(test_search_encodes);
    if (!only_search) {
        RUN(test_identity);
        RUN(test_reg_engine);
        RUN(test_batch_invariance);
        RUN(test_two_in_flight);
        RUN(test_contexts);
        RUN(test_golden);
    }
    ldlq_cuda_free(g_ctx);
    sparq_pool_free(g_pool);
    sf_close(g_cases);
    sf_close(g_extra);
    free(p1), free(p2);
    return t_summary();
}
