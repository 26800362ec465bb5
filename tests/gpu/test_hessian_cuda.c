/* tests/gpu/test_hessian_cuda.c — the GPU Hessian work (kernels/cuda/
 * hessian_cuda.h) against the CPU, the oracle: ldlq_hessian_prepare
 * (quantize/ldlq.c), qz_hess_add / qz_hess_finish (quantize/capture.c) and
 * LAPACK's spotrf.
 *  - prepare on mean Hessians of random Gaussian rows with a few loud
 *    channels, k = 128, 256, 512, 2048, 5120; a rank-deficient one (rows < k);
 *    ones whose attempt 0 (and 1) fail, so the damping is retried: the GPU
 *    must pick the same damping (exactly, as a float), the same su bit for
 *    bit, Hr and h_diag bit for bit (the same fp32 operations; Hr's bound is
 *    ‖ΔHr‖/‖Hr‖ ≤ 1e-5 all the same), L and diag(D) within 1e-4 relative
 *    (Frobenius), and L's structure exactly (unit diagonal blocks, zeros
 *    above); the figures are printed per case;
 *  - identity fallbacks: a NaN, an Inf, all zeros, h = NULL; a Hessian that
 *    fails all 9 attempts (the same error and message as the CPU); a k that is
 *    not a multiple of 128;
 *  - hess_cuda_cholesky for every panel width against spotrf (and the same
 *    failing column as spotrf's info), the upper triangle untouched;
 *  - hess_cuda_accumulate + hess_cuda_finish against qz_hess_add +
 *    qz_hess_finish (the finish bit for bit on the same sums);
 *  - hess_cuda_bytes against the device memory a prepare takes;
 *  - timing lines "prepare k=5120: X ms" (and the CPU's, and the Cholesky per
 *    panel width) for the lead to read.
 * Exits 77 ("skipped: no GPU") when there is no usable GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu_probe.h"
#include "kernels/cuda/hessian_cuda.h"
#include "kernels/cuda/trellis_cuda.h"
#include "quantize/job.h"
#include "quantize/ldlq.h"
#include "t.h"

extern void spotrf_(const char *uplo, const int *n, float *a, const int *lda, int *info);

#define GPU_RAND_SEED 0x2545F4914F6CDD1Dull
#include "gpu/gpu_rand.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *blas;

/* ‖a − b‖ / ‖b‖ (Frobenius, in double). */
static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static size_t n_bit_equal(const float *a, const float *b, size_t n)
{
    size_t e = 0;
    for (size_t i = 0; i < n; i++) e += memcmp(&a[i], &b[i], sizeof(float)) == 0;
    return e;
}

static float *to_device(const float *h, size_t n)
{
    float *d = NULL;
    if (trellis_cuda_alloc((void **)&d, n * sizeof(float)) != SPARQ_OK) return NULL;
    if (trellis_cuda_upload(d, h, n * sizeof(float)) != SPARQ_OK) {
        trellis_cuda_free(d);
        return NULL;
    }
    return d;
}

static float *to_host(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    if (h && trellis_cuda_download(h, d, n * sizeof(float)) != SPARQ_OK) {
        free(h);
        return NULL;
    }
    return h;
}

/* rows Gaussian rows of k channels; every 61st channel ×8, channel 5 ×40;
 * channel `quiet` (if ≥ 0) ×1e-3. */
static float *make_rows(int k, int rows, int quiet)
{
    float *x = malloc((size_t)rows * k * sizeof(float));
    for (int r = 0; x && r < rows; r++)
        for (int c = 0; c < k; c++) {
            float v = gauss();
            if (c % 61 == 7) v *= 8.0f;
            if (c == 5) v *= 40.0f;
            if (c == quiet) v *= 1e-3f;
            x[(size_t)r * k + c] = v;
        }
    return x;
}

/* The mean of xᵀx over `rows` such rows, through the CPU accumulator. */
static float *make_h(int k, int rows, int quiet)
{
    hess_acc acc = {0};
    float *x = make_rows(k, rows, quiet);
    if (!x || qz_hess_init(&acc, k) != SPARQ_OK) {
        free(x);
        return NULL;
    }
    qz_hess_add(&acc, x, rows, k);
    qz_hess_finish(&acc);
    free(x);
    float *h = malloc((size_t)k * k * sizeof(float));
    if (h) memcpy(h, acc.h, (size_t)k * k * sizeof(float));
    qz_hess_free(&acc);
    return h;
}

static double diag_mean(const float *h, int k)
{
    double s = 0;
    for (int i = 0; i < k; i++) s += h[(size_t)i * k + i];
    return s / k;
}

static double last_cpu_ms;

/* Prepare h on both sides and compare everything; want_damping > 0: the CPU
 * must also have chosen it (the test's own premise). */
static void compare(const char *what, const float *h, int k, float sigma, float want_damping, bool want_identity)
{
    const uint64_t seed = 0xC0FFEE ^ (uint64_t)k;
    ldlq_hessian *cs = NULL;
    double t0 = now_ms();
    const sparq_status cst = ldlq_hessian_prepare(&cs, h, k, sigma, seed, what);
    last_cpu_ms = now_ms() - t0;
    CHECK_MSG(cst == SPARQ_OK, "%s: CPU: %s", what, sparq_errmsg());
    if (cst != SPARQ_OK) return;
    const size_t kk = (size_t)k * k;
    float *dh = h ? to_device(h, kk) : NULL;
    CHECK(!h || dh);
    hess_cuda g;
    t0 = now_ms();
    const sparq_status gst = hess_cuda_prepare(blas, NULL, dh, k, sigma, seed, what, &g);
    const double gpu_ms = now_ms() - t0;
    CHECK_MSG(gst == SPARQ_OK, "%s: GPU: %s", what, sparq_errmsg());
    if (gst != SPARQ_OK) goto out;
    CHECK_EQ_INT(g.k, k);
    CHECK_MSG(g.identity == (int)ldlq_hessian_is_identity(cs), "%s: identity GPU %d, CPU %d", what, g.identity,
              (int)ldlq_hessian_is_identity(cs));
    CHECK_MSG(g.identity == (int)want_identity, "%s: identity %d, expected %d", what, g.identity, (int)want_identity);
    CHECK_MSG(g.damping == ldlq_hessian_damping(cs), "%s: damping GPU %.9g, CPU %.9g", what, (double)g.damping,
              (double)ldlq_hessian_damping(cs));
    if (want_damping > 0)
        CHECK_MSG(ldlq_hessian_damping(cs) == want_damping, "%s: the CPU chose damping %.9g, the case expects %.9g",
                  what, (double)ldlq_hessian_damping(cs), (double)want_damping);
    float *su = to_host(g.su, (size_t)k), *hd = to_host(g.h_diag, (size_t)k);
    CHECK(su && hd);
    if (su) CHECK_MSG(memcmp(su, ldlq_hessian_su(cs), (size_t)k * sizeof(float)) == 0, "%s: su differs", what);
    if (hd) {
        /* ldlq.c's rule: h_rr + (float)(damp·mean diag), or 1 for the identity */
        int bad = 0;
        const float add = g.identity ? 0.0f : (float)(ldlq_hessian_damping(cs) * diag_mean(h, k));
        for (int r = 0; r < k; r++) {
            const float want = g.identity ? 1.0f : h[(size_t)r * k + r] + add;
            bad += memcmp(&hd[r], &want, sizeof want) != 0;
        }
        CHECK_MSG(bad == 0, "%s: %d of %d h_diag entries differ", what, bad, k);
    }
    if (g.identity) {
        CHECK(!g.hr && !g.l && !g.d_diag && !ldlq_hessian_hr(cs));
        fprintf(stderr, "  %s: identity on both sides\n", what);
    } else {
        float *hr = to_host(g.hr, kk), *l = to_host(g.l, kk), *d = to_host(g.d_diag, (size_t)k);
        CHECK(hr && l && d);
        if (hr && l && d) {
            const double ehr = rel_err(hr, ldlq_hessian_hr(cs), kk), el = rel_err(l, ldlq_hessian_l(cs), kk),
                         ed = rel_err(d, ldlq_hessian_d(cs), (size_t)k);
            const size_t hr_eq = n_bit_equal(hr, ldlq_hessian_hr(cs), kk);
            size_t bad_struct = 0;
            for (int r = 0; r < k; r++)
                for (int c = r / 16 * 16; c < k; c++) {
                    const float want = r == c ? 1.0f : 0.0f;
                    bad_struct += memcmp(&l[(size_t)r * k + c], &want, sizeof want) != 0;
                }
            fprintf(stderr,
                    "  %s: damping %.4g; |dHr|/|Hr| %.2e (%zu of %zu bit-equal), |dL|/|L| %.2e, |dD|/|D| %.2e; "
                    "CPU %.1f ms, GPU %.1f ms\n",
                    what, (double)g.damping, ehr, hr_eq, kk, el, ed, last_cpu_ms, gpu_ms);
            CHECK_MSG(ehr <= 1e-5, "%s: Hr relative error %.3g", what, ehr);
            CHECK_MSG(hr_eq == kk, "%s: %zu of %zu Hr entries differ from the CPU's bits", what, kk - hr_eq, kk);
            CHECK_MSG(el <= 1e-4, "%s: L relative error %.3g", what, el);
            CHECK_MSG(ed <= 1e-4, "%s: D relative error %.3g", what, ed);
            CHECK_MSG(bad_struct == 0, "%s: %zu entries of L on or above the diagonal blocks are not 0/1", what,
                      bad_struct);
        }
        free(hr);
        free(l);
        free(d);
    }
    free(su);
    free(hd);
out:
    hess_cuda_free(&g);
    ldlq_hessian_free(cs);
    trellis_cuda_free(dh);
}

static void test_random(void)
{
    static const int ks[] = {128, 256, 512, 2048, 5120};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        const int k = ks[i];
        float *h = make_h(k, k + k / 4, -1);
        CHECK(h);
        if (!h) continue;
        char what[64];
        snprintf(what, sizeof what, "random k=%d", k);
        compare(what, h, k, 0.0f, LDLQ_SIGMA_REG, false);
        free(h);
    }
}

static void test_rank_deficient(void)
{
    float *h = make_h(512, 200, -1);
    CHECK(h);
    if (h) compare("rank 200, k=512, sigma 0.05", h, 512, 0.05f, 0.05f, false);
    free(h);
}

/* H − λ·e_j·e_jᵀ with channel j nearly silent: the smallest eigenvalue of
 * H + δ·mean·I is δ·mean − λ (within 1e-6·mean), so λ = 0.06·mean fails
 * δ = 0.025 and passes 0.1, λ = 0.25·mean fails 0.025 and 0.1 and passes 0.4:
 * margins of 0.035 and 0.15 × mean, far above fp32 rounding. */
static void test_retry(void)
{
    const struct { int k; double lambda; float damping; } cases[] = {
        {256, 0.06, LDLQ_SIGMA_REG * 4.0f},
        {512, 0.25, LDLQ_SIGMA_REG * 16.0f},
    };
    for (size_t i = 0; i < 2; i++) {
        const int k = cases[i].k, j = 77;
        float *h = make_h(k, 2 * k, j);
        CHECK(h);
        if (!h) continue;
        h[(size_t)j * k + j] -= (float)(cases[i].lambda * diag_mean(h, k));
        char what[64];
        snprintf(what, sizeof what, "retry k=%d lambda=%.2f", k, cases[i].lambda);
        compare(what, h, k, 0.0f, cases[i].damping, false);
        free(h);
    }
}

static void test_identity(void)
{
    const int k = 256;
    float *h = make_h(k, 300, -1);
    CHECK(h);
    if (!h) return;
    h[3 * k + 7] = NAN;
    compare("NaN off the diagonal", h, k, 0.0f, 0.0f, true);
    h[3 * k + 7] = h[7 * k + 3];
    h[9 * k + 9] = INFINITY;
    compare("Inf on the diagonal", h, k, 0.0f, 0.0f, true);
    memset(h, 0, (size_t)k * k * sizeof(float));
    compare("all zero", h, k, 0.0f, 0.0f, true);
    compare("no Hessian", NULL, k, 0.0f, 0.0f, true);
    free(h);
}

/* diag(−250, 1, …, 1): mean 5/256, the largest damping adds 1638·mean ≈ 32. */
static void test_never_pd(void)
{
    const int k = 256;
    float *h = calloc((size_t)k * k, sizeof(float)), *dh = NULL;
    CHECK(h);
    if (!h) return;
    for (int i = 0; i < k; i++) h[(size_t)i * k + i] = i ? 1.0f : -250.0f;
    ldlq_hessian *cs = NULL;
    const sparq_status cst = ldlq_hessian_prepare(&cs, h, k, 0.0f, 1, "blk.0.never");
    char cmsg[512];
    snprintf(cmsg, sizeof cmsg, "%s", sparq_errmsg());
    CHECK_EQ_INT(cst, SPARQ_E_FORMAT);
    dh = to_device(h, (size_t)k * k);
    hess_cuda g;
    const sparq_status gst = hess_cuda_prepare(blas, NULL, dh, k, 0.0f, 1, "blk.0.never", &g);
    CHECK_EQ_INT(gst, SPARQ_E_FORMAT);
    CHECK_MSG(strcmp(sparq_errmsg(), cmsg) == 0, "GPU '%s', CPU '%s'", sparq_errmsg(), cmsg);
    CHECK(g.mem == NULL && g.hr == NULL);
    /* not a multiple of 128 */
    CHECK_EQ_INT(hess_cuda_prepare(blas, NULL, dh, 200, 0.0f, 1, "blk.0.odd", &g), SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "blk.0.odd: input size 200");
    ldlq_hessian_free(cs);
    trellis_cuda_free(dh);
    free(h);
}

/* hess_cuda_cholesky for each panel width against spotrf. */
static void test_cholesky(void)
{
    const int n = 640; /* not a multiple of 256: a narrower last panel */
    const size_t nn = (size_t)n * n;
    float *a = make_h(n, n + 100, -1), *want = malloc(nn * sizeof(float));
    CHECK(a && want);
    if (!a || !want) goto out;
    for (int i = 0; i < n; i++) a[(size_t)i * n + i] += 0.01f;
    /* row-major lower factor = column-major 'U' */
    memcpy(want, a, nn * sizeof(float));
    int info = 0, nl = n;
    spotrf_("U", &nl, want, &nl, &info);
    CHECK_EQ_INT(info, 0);
    static const int nbs[] = {64, 128, 256, 0};
    for (int t = 0; t < 4; t++) {
        float *d = to_device(a, nn);
        CHECK(d);
        if (!d) continue;
        int ginfo = -1;
        CHECK_MSG(hess_cuda_cholesky(blas, NULL, d, n, nbs[t], &ginfo) == SPARQ_OK, "%s", sparq_errmsg());
        CHECK_EQ_INT(ginfo, 0);
        float *got = to_host(d, nn);
        CHECK(got);
        if (got) {
            double num = 0, den = 0;
            size_t upper_changed = 0;
            for (int r = 0; r < n; r++)
                for (int c = 0; c < n; c++) {
                    const size_t i = (size_t)r * n + c;
                    if (c > r) {
                        upper_changed += memcmp(&got[i], &a[i], sizeof(float)) != 0;
                        continue;
                    }
                    num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
                    den += (double)want[i] * want[i];
                }
            const double e = sqrt(num / den);
            fprintf(stderr, "  cholesky n=%d nb=%d: |dC|/|C| %.2e against spotrf\n", n, nbs[t], e);
            CHECK_MSG(e <= 1e-5, "nb=%d: relative error %.3g", nbs[t], e);
            CHECK_MSG(upper_changed == 0, "nb=%d: %zu upper entries changed", nbs[t], upper_changed);
        }
        free(got);
        trellis_cuda_free(d);
    }
    /* failing pivots: the column spotrf reports (OpenBLAS's spotrf takes a NaN
     * pivot for a good one; LAPACK's reference and the GPU stop there) */
    const struct { int col; float v; } bad[] = {{300, -1.0f}, {0, 0.0f}, {n - 1, -1e-3f}, {500, NAN}};
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 3; t++) {
            float *m = calloc(nn, sizeof(float));
            for (int i = 0; m && i < n; i++) m[(size_t)i * n + i] = 1.0f;
            if (m) m[(size_t)bad[b].col * n + bad[b].col] = bad[b].v;
            float *d = m ? to_device(m, nn) : NULL;
            CHECK(d);
            int ginfo = 0, cinfo = 0;
            if (d) CHECK(hess_cuda_cholesky(blas, NULL, d, n, nbs[t], &ginfo) == SPARQ_OK);
            if (m && !isnan(bad[b].v)) spotrf_("U", &nl, m, &nl, &cinfo);
            else cinfo = bad[b].col + 1;
            CHECK_MSG(ginfo == cinfo && cinfo == bad[b].col + 1, "column %d, nb=%d: GPU info %d, spotrf %d",
                      bad[b].col, nbs[t], ginfo, cinfo);
            trellis_cuda_free(d);
            free(m);
        }
    /* an indefinite dense one: H − 2·mean·e_j·e_jᵀ, unrotated */
    {
        const int j = 333;
        float *m = malloc(nn * sizeof(float));
        memcpy(m, a, nn * sizeof(float));
        m[(size_t)j * n + j] -= (float)(2.0 * diag_mean(a, n));
        float *d = to_device(m, nn);
        int ginfo = 0, cinfo = 0;
        CHECK(d && hess_cuda_cholesky(blas, NULL, d, n, 0, &ginfo) == SPARQ_OK);
        spotrf_("U", &nl, m, &nl, &cinfo);
        CHECK_MSG(ginfo == cinfo && cinfo > 0, "indefinite: GPU info %d, spotrf %d", ginfo, cinfo);
        trellis_cuda_free(d);
        free(m);
    }
    CHECK_EQ_INT(hess_cuda_cholesky(blas, NULL, NULL, n, 32, &info), SPARQ_E_ARG);
out:
    free(a);
    free(want);
}

static void test_accumulate(void)
{
    static const int ks[] = {256, 2304};
    for (int t = 0; t < 2; t++) {
        const int k = ks[t], r1 = 300, r2 = 77;
        const size_t kk = (size_t)k * k;
        float *x1 = make_rows(k, r1, -1), *x2 = make_rows(k, r2, -1);
        hess_acc acc = {0};
        CHECK(x1 && x2 && qz_hess_init(&acc, k) == SPARQ_OK);
        float *zero = calloc(kk, sizeof(float));
        float *dh = zero ? to_device(zero, kk) : NULL, *dx1 = to_device(x1, (size_t)r1 * k),
              *dx2 = to_device(x2, (size_t)r2 * k);
        CHECK(dh && dx1 && dx2);
        if (!dh || !dx1 || !dx2 || !acc.h) goto next;
        qz_hess_add(&acc, x1, r1, k);
        qz_hess_add(&acc, x2, r2, k);
        CHECK(hess_cuda_accumulate(blas, NULL, dh, k, dx1, r1) == SPARQ_OK);
        CHECK(hess_cuda_accumulate(blas, NULL, dh, k, dx2, r2) == SPARQ_OK);
        CHECK(hess_cuda_accumulate(blas, NULL, dh, k, dx2, 0) == SPARQ_OK); /* nothing */
        float *sum = to_host(dh, kk);
        CHECK(sum);
        if (!sum) goto next;
        const double e = rel_err(sum, acc.h, kk); /* both lower triangles 0 */
        size_t lower = 0;
        for (int r = 0; r < k; r++)
            for (int c = 0; c < r; c++) lower += sum[(size_t)r * k + c] != 0.0f;
        fprintf(stderr, "  accumulate k=%d: |dH|/|H| %.2e against qz_hess_add\n", k, e);
        CHECK_MSG(e <= 1e-5, "k=%d: accumulated sums differ by %.3g relative", k, e);
        CHECK_MSG(lower == 0, "k=%d: %zu entries below the diagonal touched", k, lower);
        /* finish: the same fp32 operations as qz_hess_finish on the same sums */
        hess_acc mine = {sum, k, (uint64_t)(r1 + r2)};
        CHECK(hess_cuda_finish(NULL, dh, k, mine.count) == SPARQ_OK);
        float *mean = to_host(dh, kk);
        qz_hess_finish(&mine);
        qz_hess_finish(&acc);
        CHECK(mean);
        if (mean) {
            CHECK_MSG(n_bit_equal(mean, sum, kk) == kk, "k=%d: finish differs from qz_hess_finish", k);
            CHECK_MSG(rel_err(mean, acc.h, kk) <= 1e-5, "k=%d: mean Hessian differs by %.3g", k,
                      rel_err(mean, acc.h, kk));
        }
        CHECK(hess_cuda_finish(NULL, dh, k, 0) == SPARQ_OK);
        float *z = to_host(dh, kk);
        size_t nonzero = 0; /* values, not bits: x·0 is −0 for a negative sum, on the CPU as here */
        for (size_t i = 0; z && i < kk; i++) nonzero += z[i] != 0.0f;
        CHECK_MSG(z && nonzero == 0, "k=%d: count 0 leaves %zu non-zero entries", k, nonzero);
        free(z);
        free(mean);
        free(sum);
    next:
        qz_hess_free(&acc);
        trellis_cuda_free(dh);
        trellis_cuda_free(dx1);
        trellis_cuda_free(dx2);
        free(zero);
        free(x1);
        free(x2);
    }
}

/* Into caller memory: the same arrays, bit for bit (the GPU path is
 * deterministic), nothing freed by hess_cuda_free; too small is refused. */
static void test_into(void)
{
    const int k = 512;
    const size_t kk = (size_t)k * k, bytes = hess_cuda_bytes(k);
    float *h = make_h(k, 700, -1), *dh = h ? to_device(h, kk) : NULL;
    void *mem = NULL;
    CHECK(dh && trellis_cuda_alloc(&mem, bytes) == SPARQ_OK);
    if (!dh || !mem) goto out;
    hess_cuda a, b;
    CHECK(hess_cuda_prepare(blas, NULL, dh, k, 0.0f, 3, "own", &a) == SPARQ_OK);
    CHECK(hess_cuda_prepare_into(blas, NULL, dh, k, 0.0f, 3, "into", mem, bytes, &b) == SPARQ_OK);
    CHECK(a.owns_mem == 1 && b.owns_mem == 0 && b.mem == mem);
    const float *pa[] = {a.hr, a.l, a.d_diag, a.su, a.h_diag}, *pb[] = {b.hr, b.l, b.d_diag, b.su, b.h_diag};
    const size_t n[] = {kk, kk, (size_t)k, (size_t)k, (size_t)k};
    for (int i = 0; i < 5; i++) {
        float *x = to_host(pa[i], n[i]), *y = to_host(pb[i], n[i]);
        CHECK_MSG(x && y && n_bit_equal(x, y, n[i]) == n[i], "array %d differs between two runs", i);
        free(x);
        free(y);
    }
    hess_cuda_free(&a);
    hess_cuda_free(&b);
    CHECK(b.mem == NULL);
    CHECK(trellis_cuda_upload(mem, h, 64) == SPARQ_OK); /* still ours */
    CHECK_EQ_INT(hess_cuda_prepare_into(blas, NULL, dh, k, 0.0f, 3, "small", mem, bytes - 1, &b), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "small: ");
out:
    trellis_cuda_free(mem);
    trellis_cuda_free(dh);
    free(h);
}

/* hess_cuda_bytes against what a prepare takes, then the timings. */
static void test_memory_and_speed(void)
{
    const int k = 5120;
    const size_t kk = (size_t)k * k;
    float *h = make_h(k, k + k / 4, -1);
    float *dh = h ? to_device(h, kk) : NULL;
    CHECK(dh);
    if (!dh) goto out;
    hess_cuda g;
    CHECK(hess_cuda_prepare(blas, NULL, dh, k, 0.0f, 7, "warm-up", &g) == SPARQ_OK); /* cuBLAS's lazy setup */
    hess_cuda_free(&g);
    size_t free0 = 0, free1 = 0, total = 0;
    CHECK(trellis_cuda_mem_info(&free0, &total) == SPARQ_OK);
    CHECK(hess_cuda_prepare(blas, NULL, dh, k, 0.0f, 7, "memory", &g) == SPARQ_OK);
    CHECK(trellis_cuda_mem_info(&free1, &total) == SPARQ_OK);
    const size_t used = free0 - free1, want = hess_cuda_bytes(k);
    fprintf(stderr, "  prepare k=%d takes %zu device bytes, hess_cuda_bytes says %zu\n", k, used, want);
    CHECK_MSG(used >= want && used <= want + (8u << 20), "k=%d: %zu bytes taken, %zu planned", k, used, want);
    /* the Cholesky alone, per panel width, on this Hr */
    float *hr = to_host(g.hr, kk), *da = NULL;
    hess_cuda_free(&g);
    CHECK(hr && trellis_cuda_alloc((void **)&da, kk * sizeof(float)) == SPARQ_OK);
    static const int nbs[] = {64, 128, 256};
    for (int t = 0; hr && da && t < 3; t++) {
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            int info = -1;
            CHECK(trellis_cuda_upload(da, hr, kk * sizeof(float)) == SPARQ_OK);
            const double t0 = now_ms();
            CHECK(hess_cuda_cholesky(blas, NULL, da, k, nbs[t], &info) == SPARQ_OK && info == 0);
            const double ms = now_ms() - t0;
            if (ms < best) best = ms;
        }
        printf("cholesky k=%d nb=%d: %.2f ms\n", k, nbs[t], best);
    }
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now_ms();
        CHECK(hess_cuda_prepare(blas, NULL, dh, k, 0.0f, 7, "timing", &g) == SPARQ_OK);
        const double ms = now_ms() - t0;
        if (ms < best) best = ms;
        hess_cuda_free(&g);
    }
    ldlq_hessian *cs = NULL;
    const double t0 = now_ms();
    CHECK(ldlq_hessian_prepare(&cs, h, k, 0.0f, 7, "timing") == SPARQ_OK);
    const double cpu_ms = now_ms() - t0;
    ldlq_hessian_free(cs);
    printf("prepare k=%d: %.2f ms (CPU ldlq_hessian_prepare: %.0f ms)\n", k, best, cpu_ms);
    free(hr);
    trellis_cuda_free(da);
out:
    trellis_cuda_free(dh);
    free(h);
}

int main(void)
{
    const char *why = "";
    if (gpu_probe_count(&why) == 0 || trellis_cuda_device_count() == 0) T_SKIP("skipped: no GPU (%s)", why);
    if (hess_cuda_blas_create(&blas) != SPARQ_OK) {
        fprintf(stderr, "no cuBLAS handle: %s\n", sparq_errmsg());
        return 1;
    }
    RUN(test_accumulate);
    RUN(test_cholesky);
    RUN(test_random);
    RUN(test_rank_deficient);
    RUN(test_retry);
    RUN(test_identity);
    RUN(test_never_pd);
    RUN(test_into);
    RUN(test_memory_and_speed);
    hess_cuda_blas_destroy(blas);
    return t_summary();
}
