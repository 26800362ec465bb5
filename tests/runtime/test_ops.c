/* tests/runtime/test_ops.c — every CPU backend op against a naive double-
 * precision reference written here, on both the SIMD and the scalar path,
 * with shapes that exercise the tails (sizes not multiples of 8/16/64) and
 * both linear regimes (GEMV ≤ SQ_CPU_GEMV_MAX_ROWS rows, tiled sgemm above). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "t.h"

static uint64_t rng_state = 12345;
static double urand(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}
static void fill(float *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(urand() * scale);
}

static sq_exec *ex;

static double max_rel(const float *a, const double *b, size_t n)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) s = fmax(s, fabs(b[i]));
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return s > 0 ? m / s : m;
}

static void linear_case(sq_linear_kind kind, int rows, int in, int out, bool bias)
{
    float *wf = malloc((size_t)in * out * 4), *x = malloc((size_t)rows * in * 4), *y = malloc((size_t)rows * out * 4);
    float *b = malloc((size_t)out * 4);
    uint16_t *wh = malloc((size_t)in * out * 2);
    double *ref = malloc((size_t)rows * out * 8);
    fill(wf, (size_t)in * out, 0.5);
    fill(x, (size_t)rows * in, 1.0);
    fill(b, (size_t)out, 1.0);
    for (size_t i = 0; i < (size_t)in * out; i++) {
        if (kind == SQ_LINEAR_BF16) {
            wh[i] = sparq_f32_to_bf16(wf[i]);
            wf[i] = sparq_bf16_to_f32(wh[i]);
        } else if (kind == SQ_LINEAR_F16) {
            wh[i] = sparq_f32_to_f16(wf[i]);
            wf[i] = sparq_f16_to_f32(wh[i]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double s = bias ? b[o] : 0;
            for (int i = 0; i < in; i++) s += (double)x[(size_t)r * in + i] * wf[(size_t)o * in + i];
            ref[(size_t)r * out + o] = s;
        }
    sq_linear l = {kind, in, out, kind == SQ_LINEAR_F32 ? (const void *)wf : (const void *)wh, bias ? b : NULL,
                   NULL, NULL, "test"};
    for (int scalar = 0; scalar < 2; scalar++) {
        sq_cpu_force_scalar(scalar);
        memset(y, 0xff, (size_t)rows * out * 4);
        sq_linear_forward(ex, &l, x, rows, y);
        double e = max_rel(y, ref, (size_t)rows * out);
        CHECK_MSG(e < 2e-6, "%s rows %d in %d out %d scalar %d: max rel err %.3g", sq_linear_kind_name(kind), rows,
                  in, out, scalar, e);
    }
    sq_cpu_force_scalar(false);
    free(wf), free(x), free(y), free(b), free(wh), free(ref);
}

static void test_linear(void)
{
    const sq_linear_kind kinds[] = {SQ_LINEAR_F32, SQ_LINEAR_BF16, SQ_LINEAR_F16};
    const int rows[] = {1, 3, SQ_CPU_GEMV_MAX_ROWS, SQ_CPU_GEMV_MAX_ROWS + 1, 37};
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < 5; r++) {
            linear_case(kinds[k], rows[r], 203, 131, false);
            linear_case(kinds[k], rows[r], 64, 200, r == 2);
        }
    /* above SQ_CPU_SERIAL_MACS: the GEMV runs on the pool */
    CHECK(1 * 600 * 520 >= SQ_CPU_SERIAL_MACS);
    for (int k = 0; k < 3; k++) linear_case(kinds[k], 1, 600, 520, k == 1);
}

static void test_dot(void)
{
    float x[77], w[77];
    uint16_t wb[77], wh[77];
    fill(x, 77, 1);
    fill(w, 77, 1);
    for (int i = 0; i < 77; i++) wb[i] = sparq_f32_to_bf16(w[i]), wh[i] = sparq_f32_to_f16(w[i]);
    for (int n = 0; n <= 77; n += 11) {
        double r = 0, rb = 0, rh = 0;
        for (int i = 0; i < n; i++) {
            r += (double)x[i] * w[i];
            rb += (double)x[i] * sparq_bf16_to_f32(wb[i]);
            rh += (double)x[i] * sparq_f16_to_f32(wh[i]);
        }
        for (int s = 0; s < 2; s++) {
            sq_cpu_force_scalar(s);
            CHECK_NEAR(sq_cpu_dot_f32(x, w, (size_t)n), r, 1e-5);
            CHECK_NEAR(sq_cpu_dot_bf16(x, wb, (size_t)n), rb, 1e-5);
            CHECK_NEAR(sq_cpu_dot_f16(x, wh, (size_t)n), rh, 1e-5);
        }
    }
    sq_cpu_force_scalar(false);
}

static void test_rmsnorm(void)
{
    const int rows = 70, dim = 45;
    float x[70 * 45], w[45], y[70 * 45];
    fill(x, sizeof x / 4, 3);
    fill(w, 45, 1);
    ex->be->rmsnorm(ex, x, rows, dim, w, 1e-6f, y);
    double err = 0;
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
        double inv = 1 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++) err = fmax(err, fabs(y[r * dim + i] - w[i] * x[r * dim + i] * inv));
    }
    CHECK_MSG(err < 1e-5, "rmsnorm max err %.3g", err);
    /* in place gives the same */
    ex->be->rmsnorm(ex, x, rows, dim, w, 1e-6f, x);
    CHECK(memcmp(x, y, sizeof x) == 0);
}

/* add_rmsnorm is axpy(1) then rmsnorm to the bit (both axpy paths, rows on the
 * calling thread and on the pool, a dim that is no multiple of 8). */
static void test_add_rmsnorm(void)
{
    static const int shapes[][2] = {{1, 2048}, {3, 45}, {70, 203}};
    for (int s = 0; s < 3; s++) {
        const int rows = shapes[s][0], dim = shapes[s][1];
        const size_t n = (size_t)rows * dim;
        float *x = malloc(n * 4), *h0 = malloc(n * 4), *w = malloc((size_t)dim * 4), *h = malloc(n * 4),
              *y = malloc(n * 4), *href = malloc(n * 4), *yref = malloc(n * 4);
        fill(x, n, 2);
        fill(h0, n, 3);
        fill(w, (size_t)dim, 1);
        for (int scalar = 0; scalar < 2; scalar++) {
            sq_cpu_force_scalar(scalar);
            memcpy(href, h0, n * 4);
            ex->be->axpy(ex, 1.0f, x, n, href);
            ex->be->rmsnorm(ex, href, rows, dim, w, 1e-6f, yref);
            memcpy(h, h0, n * 4);
            ex->be->add_rmsnorm(ex, x, h, rows, dim, w, 1e-6f, y);
            CHECK_MSG(memcmp(h, href, n * 4) == 0 && memcmp(y, yref, n * 4) == 0,
                      "add_rmsnorm rows %d dim %d scalar %d: not axpy + rmsnorm's floats", rows, dim, scalar);
        }
        sq_cpu_force_scalar(false);
        free(x), free(h0), free(w), free(h), free(y), free(href), free(yref);
    }
}

static void test_rope(void)
{
    const int rows = 5, nh = 3, hd = 8;
    float x[5 * 3 * 8], y[5 * 3 * 8], inv[4];
    int pos[5] = {0, 1, 7, 100, 4095};
    fill(x, sizeof x / 4, 1);
    memcpy(y, x, sizeof x);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, 2.0 * i / hd));
    ex->be->rope(ex, y, rows, nh, hd, pos, inv);
    double err = 0;
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < hd; i++) {
                /* HF: q*cos + rotate_half(q)*sin with rotate_half = cat(-x2, x1) */
                const float *v = x + (r * nh + h) * hd;
                double th = pos[r] * (double)inv[i % (hd / 2)];
                double rot = i < hd / 2 ? -v[i + hd / 2] : v[i - hd / 2];
                double e = v[i] * cos(th) + rot * sin(th);
                err = fmax(err, fabs(e - y[(r * nh + h) * hd + i]));
            }
    CHECK_MSG(err < 2e-3, "rope max err %.3g", err); /* fp32 angle at pos 4095 */
    /* position 0 is the identity */
    CHECK(memcmp(x, y, (size_t)nh * hd * 4) == 0);
}

static void attention_case(int T, int nh, int nkv, int hd)
{
    float *q = malloc((size_t)T * nh * hd * 4), *k = malloc((size_t)T * nkv * hd * 4),
          *v = malloc((size_t)T * nkv * hd * 4), *out = malloc((size_t)T * nh * hd * 4);
    int *first = malloc((size_t)T * sizeof(int)), *len = malloc((size_t)T * sizeof(int));
    double *s = malloc((size_t)T * sizeof(double));
    fill(q, (size_t)T * nh * hd, 1);
    fill(k, (size_t)T * nkv * hd, 1);
    fill(v, (size_t)T * nkv * hd, 1);
    const int split = T / 2; /* two sequences packed in one batch */
    for (int r = 0; r < T; r++) first[r] = r < split ? 0 : split, len[r] = r < split ? r + 1 : r - split + 1;
    const float scale = 1.0f / sqrtf((float)hd);
    ex->be->attention(ex, q, T, nh, nkv, hd, k, v, first, len, scale, out);
    double err = 0;
    for (int r = 0; r < T; r++)
        for (int h = 0; h < nh; h++) {
            int g = h / (nh / nkv);
            double mx = -1e30, sum = 0;
            for (int t = 0; t < len[r]; t++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[((size_t)r * nh + h) * hd + i] * k[(((size_t)first[r] + t) * nkv + g) * hd + i];
                s[t] = d * scale;
                mx = fmax(mx, s[t]);
            }
            for (int t = 0; t < len[r]; t++) sum += s[t] = exp(s[t] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int t = 0; t < len[r]; t++) o += s[t] / sum * v[(((size_t)first[r] + t) * nkv + g) * hd + i];
                err = fmax(err, fabs(o - out[((size_t)r * nh + h) * hd + i]));
            }
        }
    CHECK_MSG(err < 1e-5, "attention T %d heads %d/%d hd %d: max err %.3g", T, nh, nkv, hd, err);
    free(q), free(k), free(v), free(out), free(first), free(len), free(s);
}

static void test_attention(void)
{
    attention_case(9, 4, 2, 16);   /* small: runs on the calling thread */
    attention_case(64, 8, 2, 64);  /* above SQ_CPU_SERIAL_MACS: on the pool */
}

static void test_router(void)
{
    const int rows = 3, E = 10, K = 4;
    float l[30] = {0.1f, 2, -1, 3, 3, 0, 0.5f, -2, 1, 0.2f, /* a tie between experts 3 and 4 */
                   5, 4, 3, 2, 1, 0, -1, -2, -3, -4,
                   0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    int idx[12];
    float w[12];
    ex->be->router_topk(ex, l, rows, E, K, false, idx, w);
    CHECK_EQ_INT(idx[0], 3);
    CHECK_EQ_INT(idx[1], 4);
    CHECK_EQ_INT(idx[2], 1);
    CHECK_EQ_INT(idx[3], 8);
    double z = 0;
    for (int e = 0; e < E; e++) z += exp(l[e]);
    CHECK_NEAR(w[0], exp(3) / z, 1e-6);
    CHECK_NEAR(w[3], exp(1) / z, 1e-6);
    CHECK_EQ_INT(idx[4], 0);
    CHECK_EQ_INT(idx[7], 3);
    CHECK_EQ_INT(idx[8], 9);
    CHECK_EQ_INT(idx[9], 0); /* ties go to the lower index */
    CHECK_EQ_INT(idx[10], 1);
    ex->be->router_topk(ex, l, rows, E, K, true, idx, w);
    for (int r = 0; r < rows; r++) CHECK_NEAR(w[r * K] + w[r * K + 1] + w[r * K + 2] + w[r * K + 3], 1.0, 1e-6);
    CHECK_NEAR(w[4] / w[5], exp(1.0), 1e-5);
}

static void test_elementwise(void)
{
    float g[19], u[19], o[19], y[19], x[19];
    fill(g, 19, 4);
    fill(u, 19, 1);
    fill(y, 19, 1);
    fill(x, 19, 1);
    ex->be->swiglu(ex, g, u, 19, o);
    for (int i = 0; i < 19; i++) CHECK_NEAR(o[i], g[i] / (1 + exp(-(double)g[i])) * u[i], 1e-6);
    float y0[19];
    memcpy(y0, y, sizeof y);
    for (int s = 0; s < 2; s++) {
        sq_cpu_force_scalar(s);
        memcpy(y, y0, sizeof y);
        ex->be->axpy(ex, 0.5f, x, 19, y);
        for (int i = 0; i < 19; i++) CHECK_NEAR(y[i], y0[i] + 0.5 * x[i], 1e-6);
    }
    sq_cpu_force_scalar(false);
}

/* sum_parts adds the pieces in rank order, rounding after each add: with
 * pieces 2^24, 1, -2^24 the first add loses the 1 (2^24 + 1 rounds to 2^24),
 * so the sum is 0, where adding in another order gives 1. */
static void test_sum_parts(void)
{
    const float big = 16777216.0f;
    float parts[3][5], out[5];
    for (int i = 0; i < 5; i++) parts[0][i] = big, parts[1][i] = 1.0f, parts[2][i] = -big;
    parts[0][4] = 0.5f, parts[1][4] = 0.25f, parts[2][4] = 0.125f;
    ex->be->sum_parts(ex, &parts[0][0], 3, 5, out);
    for (int i = 0; i < 4; i++) CHECK_MSG(out[i] == 0.0f, "element %d: %g, not ((2^24 + 1) - 2^24) = 0", i, out[i]);
    CHECK(out[4] == 0.875f);
    ex->be->sum_parts(ex, &parts[1][0], 1, 5, out); /* one piece: itself */
    CHECK(out[0] == 1.0f && out[4] == 0.25f);
}

/* Results must not depend on the thread count. */
static void test_threads_deterministic(void)
{
    sq_exec *one;
    CHECK(sq_exec_create(&one, 1) == SPARQ_OK);
    CHECK(sq_exec_reserve(one, sq_exec_scratch_floats(300, 64)) == SPARQ_OK);
    float *w = malloc(300 * 150 * 4), *x = malloc(20 * 300 * 4), *y1 = malloc(20 * 150 * 4),
          *y2 = malloc(20 * 150 * 4);
    fill(w, 300 * 150, 1);
    fill(x, 20 * 300, 1);
    sq_linear l = {SQ_LINEAR_F32, 300, 150, w, NULL, NULL, NULL, "t"};
    float *wb = malloc(600 * 520 * 4), *xb = malloc(600 * 4), *yb1 = malloc(520 * 4), *yb2 = malloc(520 * 4);
    fill(wb, 600 * 520, 1);
    fill(xb, 600, 1);
    sq_linear lb = {SQ_LINEAR_F32, 600, 520, wb, NULL, NULL, NULL, "t"};
    sq_linear_forward(ex, &lb, xb, 1, yb1);  /* pooled GEMV on 3 threads */
    sq_linear_forward(one, &lb, xb, 1, yb2); /* on 1 */
    CHECK(memcmp(yb1, yb2, 520 * 4) == 0);
    free(wb), free(xb), free(yb1), free(yb2);
    for (int rows = 1; rows <= 20; rows += 19) {
        sq_linear_forward(ex, &l, x, rows, y1);
        sq_linear_forward(one, &l, x, rows, y2);
        CHECK(memcmp(y1, y2, (size_t)rows * 150 * 4) == 0);
    }
    free(w), free(x), free(y1), free(y2);
    sq_exec_free(one);
}

int main(void)
{
    if (sq_exec_create(&ex, 3) != SPARQ_OK || sq_exec_reserve(ex, sq_exec_scratch_floats(512, 64)) != SPARQ_OK) {
        fprintf(stderr, "exec: %s\n", sparq_errmsg());
        return 1;
    }
    fprintf(stderr, "avx2 path: %s\n", sq_cpu_have_avx2() ? "yes" : "no (scalar only)");
    RUN(test_dot);
    RUN(test_linear);
    RUN(test_rmsnorm);
    RUN(test_add_rmsnorm);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_router);
    RUN(test_elementwise);
    RUN(test_sum_parts);
    RUN(test_threads_deterministic);
    sq_exec_free(ex);
    return t_summary();
}
