/* tests/kernels/test_trellis.c — unit tests of the trellis codec that need no
 * golden data: tile permutation, pack/unpack rings for every K, the Hadamard,
 * SIMD paths equal to the scalar path bit for bit (tile decode, GEMV, small
 * GEMM, Viterbi step), the GEMM against decode-then-matmul in double, thread
 * count independence, and argument errors.
 *
 * Also compiled for aarch64 by tests/kernels/cross_neon.sh and run under qemu,
 * so it includes nothing beyond the trellis code, common/ and libc. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "kernels/cpu/trellis.h"
#include "kernels/trellis_rand.h"
#include "t.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)(rnd() & 0xFFFFFF) / 8388608.0f - 1.0f; }

static void test_permutation(void)
{
    int seen[256] = {0}, bad = 0;
    for (int p = 0; p < 256; p++) {
        const int r = trellis_pos_row(p), c = trellis_pos_col(p);
        bad += r < 0 || r > 15 || c < 0 || c > 15;
        seen[r * 16 + c]++;
        bad += trellis_rc_pos(r, c) != p;
    }
    for (int i = 0; i < 256; i++) bad += seen[i] != 1;
    CHECK_EQ_INT(bad, 0);
    /* reference.md: lane t owns rows {2(t%4), +1, +8, +9} at columns t/4 and t/4+8 */
    CHECK_EQ_INT(trellis_pos_row(8 * 5 + 2), 2 * 1 + 8);
    CHECK_EQ_INT(trellis_pos_col(8 * 5 + 2), 1);
    CHECK_EQ_INT(trellis_pos_col(8 * 5 + 6), 9);
    CHECK_EQ_INT(trellis_pos_row(8 * 31 + 7), 2 * 3 + 9);
}

static void test_pack_unpack(void)
{
    for (int K = 1; K <= TRELLIS_K_MAX; K++) {
        for (int rep = 0; rep < 20; rep++) {
            uint16_t words[16 * TRELLIS_K_MAX], words2[16 * TRELLIS_K_MAX], states[256];
            for (int i = 0; i < 16 * K; i++) words[i] = (uint16_t)rnd();
            trellis_tile_unpack(words, K, states);
            /* consecutive states overlap by 16 − K bits, around the ring too */
            int bad = 0;
            for (int p = 0; p < 256; p++) {
                const uint32_t prev = states[(p + 255) & 255];
                bad += ((prev << K) & 0xFFFF) >> K != (uint32_t)states[p] >> K;
            }
            CHECK_MSG(bad == 0, "K=%d: %d states do not continue their predecessor", K, bad);
            trellis_tile_pack(states, K, words2);
            CHECK_MSG(memcmp(words, words2, 32 * (size_t)K) == 0, "K=%d: pack(unpack(w)) != w", K);
        }
        /* bit order: the first stream bit is bit 15 of word 1 (halves swapped) */
        uint16_t w[16 * TRELLIS_K_MAX] = {0}, st[256];
        w[1] = 0x8000;
        trellis_tile_unpack(w, K, st);
        CHECK_MSG(st[0] == (uint16_t)(1u << (K - 1)), "K=%d: state 0 = %04x", K, st[0]);
    }
}

static void test_hadamard(void)
{
    float v[256], orig[256];
    for (int i = 0; i < 256; i++) orig[i] = v[i] = rndf();
    trellis_had128(v, 2);
    /* against the definition H[i][j] = (-1)^popcount(i&j) / sqrt(128) */
    double worst = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 128; i++) {
            double s = 0;
            for (int j = 0; j < 128; j++)
                s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * orig[128 * b + j];
            s /= sqrt(128.0);
            worst = fmax(worst, fabs(s - v[128 * b + i]));
        }
    CHECK_MSG(worst < 1e-5, "had128 off by %g", worst);
    trellis_had128(v, 2);
    worst = 0;
    for (int i = 0; i < 256; i++) worst = fmax(worst, fabs(v[i] - orig[i]));
    CHECK_MSG(worst < 1e-5, "had128 twice is not the identity (%g)", worst);
    /* left transform = transform of each column */
    float *m = malloc(128 * 3 * sizeof(float)), col[128];
    for (int i = 0; i < 128 * 3; i++) m[i] = rndf();
    for (int i = 0; i < 128; i++) col[i] = m[i * 3 + 1];
    trellis_had128_left(m, 128, 3);
    trellis_had128(col, 1);
    worst = 0;
    for (int i = 0; i < 128; i++) worst = fmax(worst, fabs(col[i] - m[i * 3 + 1]));
    CHECK_MSG(worst < 1e-6, "had128_left column 1 off by %g", worst);
    free(m);
}

static void test_simd_tile_decode(void)
{
    int n_paths = 0;
    for (int p = 1; p < TRELLIS_PATH_COUNT_; p++) {
        if (!trellis_path_available((trellis_path)p)) continue;
        n_paths++;
        for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++)
            for (int K = 1; K <= TRELLIS_K_MAX; K++)
                for (int rep = 0; rep < 8; rep++) {
                    uint16_t words[16 * TRELLIS_K_MAX];
                    for (int i = 0; i < 16 * K; i++) words[i] = (uint16_t)rnd();
                    float a[256], b[256];
                    trellis_tile_decode_path(words, K, (trellis_codebook)cb, a, TRELLIS_PATH_SCALAR);
                    trellis_tile_decode_path(words, K, (trellis_codebook)cb, b, (trellis_path)p);
                    CHECK_MSG(memcmp(a, b, sizeof a) == 0, "%s K=%d cb=%s: tile decode differs from scalar",
                              trellis_path_name((trellis_path)p), K, trellis_cb_name((trellis_codebook)cb));
                }
    }
    fprintf(stderr, "  SIMD paths here: %d (best: %s)\n", n_paths, trellis_path_name(trellis_path_best()));
}

/* the same scales as real layers roughly have: |suh| ~ 0.5..1, svh small */
static void rlin_make(trellis_rand_lin *r, int k, int n, int K, trellis_codebook cb)
{
    trellis_rand_lin_make(r, k, n, K, cb, rnd, 0.5f, 1.0f, 0.01f, 0.03f, false);
}

/* mul1's GEMM arithmetic written out from its definition (trellis.c) in
 * double, with exact integer sums: the library must agree to float rounding. */
static void ref_mul1(const trellis_linear *lin, const float *x, int rows, double *y)
{
    const int k = lin->k, n = lin->n, nb = k / 128;
    float *u = malloc((size_t)k * sizeof(float));
    int *q = malloc((size_t)k * sizeof(int));
    int *b = malloc((size_t)k * n * sizeof(int));
    double *t = malloc((size_t)n * sizeof(double));
    for (int kt = 0; kt < k / 16; kt++)
        for (int nt = 0; nt < n / 16; nt++) {
            uint16_t st[256];
            trellis_tile_unpack(lin->trellis + ((size_t)kt * (n / 16) + nt) * 16 * lin->K, lin->K, st);
            for (int p = 0; p < 256; p++) {
                const uint32_t h = st[p] * 0x83DCD12Du;
                b[(size_t)(16 * kt + trellis_pos_row(p)) * n + 16 * nt + trellis_pos_col(p)] =
                    (int)((h & 255) + ((h >> 8) & 255) + ((h >> 16) & 255) + (h >> 24));
            }
        }
    for (int r = 0; r < rows; r++) {
        double usum = 0;
        for (int i = 0; i < k; i++) u[i] = x[(size_t)r * k + i] * sparq_f16_to_f32(lin->suh[i]);
        trellis_had128(u, (size_t)nb);
        for (int i = 0; i < k; i++) usum += u[i];
        for (int j = 0; j < n; j++) t[j] = -476.0 / 262144.0 * usum;
        for (int blk = 0; blk < nb; blk++) {
            float m = 0;
            for (int i = 128 * blk; i < 128 * blk + 128; i++) m = fmaxf(m, fabsf(u[i]));
            const double s = m / 32639.0f;
            long qs = 0;
            for (int i = 128 * blk; i < 128 * blk + 128; i++) {
                q[i] = m > 0 ? (int)lrintf(u[i] * (32639.0f / m)) : 0;
                q[i] = q[i] > 32639 ? 32639 : q[i] < -32639 ? -32639 : q[i];
                qs += q[i];
            }
            for (int j = 0; j < n; j++) {
                long acc = -510 * qs;
                for (int i = 128 * blk; i < 128 * blk + 128; i++) acc += (long)b[(size_t)i * n + j] * q[i];
                t[j] += 1774.0 / 262144.0 * s * (double)acc;
            }
        }
        for (int j0 = 0; j0 < n; j0 += 128) /* had128 in double */
            for (int h = 1; h < 128; h <<= 1)
                for (int i = j0; i < j0 + 128; i += 2 * h)
                    for (int j = i; j < i + h; j++) {
                        const double a = t[j], c = t[j + h];
                        t[j] = a + c, t[j + h] = a - c;
                    }
        for (int j = 0; j < n; j++) y[(size_t)r * n + j] = t[j] / sqrt(128.0) * sparq_f16_to_f32(lin->svh[j]);
    }
    free(u), free(q), free(b), free(t);
}

/* ||a − b|| / ||b|| */
static double rel_rms(const float *a, const double *b, size_t count)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < count; i++) e += (a[i] - b[i]) * (a[i] - b[i]), m += b[i] * b[i];
    return sqrt(e / (m + 1e-300));
}

static void test_gemm(void)
{
    sparq_pool *pool = NULL;
    CHECK(sparq_pool_create(&pool, 3) == SPARQ_OK);
    const int shapes[][2] = {{128, 128}, {256, 384}, {384, 128}};
    const int rows_list[] = {1, 2, 5, 16};
    for (int K = 1; K <= TRELLIS_K_MAX; K++)
        for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++) {
            const int *sh = shapes[(K + cb) % 3];
            const int k = sh[0], n = sh[1], rows = rows_list[(K * 3 + cb) % 4];
            trellis_rand_lin r;
            rlin_make(&r, k, n, K, (trellis_codebook)cb);
            float *x = malloc((size_t)rows * k * sizeof(float));
            float *y0 = malloc((size_t)rows * n * sizeof(float)), *y1 = malloc((size_t)rows * n * sizeof(float));
            float *w = malloc((size_t)k * n * sizeof(float));
            for (int i = 0; i < rows * k; i++) x[i] = rndf();
            CHECK(trellis_linear_gemm_path(&r.lin, x, rows, y0, NULL, TRELLIS_PATH_SCALAR) == SPARQ_OK);
            /* decode-then-matmul in double */
            CHECK(trellis_linear_decode(&r.lin, w, NULL) == SPARQ_OK);
            double worst = 0;
            double *yd = malloc((size_t)rows * n * sizeof(double));
            for (int q = 0; q < rows; q++)
                for (int j = 0; j < n; j++) {
                    double s = 0, mag = 0;
                    for (int i = 0; i < k; i++) {
                        s += (double)x[q * k + i] * w[(size_t)i * n + j];
                        mag += fabs((double)x[q * k + i] * w[(size_t)i * n + j]);
                    }
                    yd[q * n + j] = s;
                    worst = fmax(worst, fabs(s - y0[q * n + j]) / (mag + 1e-30));
                }
            if (cb == TRELLIS_CB_MUL1) {
                /* mul1 uses unrounded values and 16-bit u (trellis.c): ~3e-4
                 * from decode-then-matmul, float rounding from its definition */
                const double e_dec = rel_rms(y0, yd, (size_t)rows * n);
                CHECK_MSG(e_dec < 1e-3 && e_dec > 1e-6, "K=%d mul1: gemm vs decode-then-matmul rms %g", K, e_dec);
                ref_mul1(&r.lin, x, rows, yd);
                const double e_ref = rel_rms(y0, yd, (size_t)rows * n);
                CHECK_MSG(e_ref < 2e-6, "K=%d mul1: gemm vs its definition rms %g", K, e_ref);
                fprintf(stderr, "  mul1 K=%d: gemm vs decode-then-matmul rel RMS %.3g, vs its definition %.3g\n", K,
                        e_dec, e_ref);
            } else {
                CHECK_MSG(worst < 2e-6, "K=%d cb=%d: gemm vs decode-then-matmul rel err %g", K, cb, worst);
            }
            free(yd);
            /* every SIMD path, serial and threaded, bit-identical to scalar */
            for (int p = 0; p < TRELLIS_PATH_COUNT_; p++) {
                if (!trellis_path_available((trellis_path)p)) continue;
                for (int threaded = 0; threaded < 2; threaded++) {
                    memset(y1, 0xFF, (size_t)rows * n * sizeof(float));
                    CHECK(trellis_linear_gemm_path(&r.lin, x, rows, y1, threaded ? pool : NULL, (trellis_path)p) ==
                          SPARQ_OK);
                    CHECK_MSG(memcmp(y0, y1, (size_t)rows * n * sizeof(float)) == 0,
                              "%s K=%d cb=%d rows=%d threaded=%d: differs from scalar",
                              trellis_path_name((trellis_path)p), K, cb, rows, threaded);
                }
            }
            /* batch rows are independent: row 0 of a batch equals a batch of one */
            if (rows > 1) {
                CHECK(trellis_linear_gemm(&r.lin, x, 1, y1, pool) == SPARQ_OK);
                CHECK(memcmp(y0, y1, (size_t)n * sizeof(float)) == 0);
            }
            free(x);
            free(y0);
            free(y1);
            free(w);
            trellis_rand_lin_free(&r);
        }
    sparq_pool_free(pool);
}

static void test_errors(void)
{
    trellis_rand_lin r;
    rlin_make(&r, 128, 128, 3, TRELLIS_CB_MUL1);
    float x[128], y[128];
    memset(x, 0, sizeof x);
    trellis_linear bad = r.lin;
    bad.K = 9;
    CHECK(trellis_linear_check(&bad, "layer.q_proj") == SPARQ_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(sparq_errmsg(), "layer.q_proj");
    bad = r.lin;
    bad.k = 100;
    CHECK(trellis_linear_gemm(&bad, x, 1, y, NULL) == SPARQ_E_SHAPE);
    bad = r.lin;
    bad.cb = (trellis_codebook)7;
    CHECK(trellis_linear_check(&bad, NULL) == SPARQ_E_ARG);
    bad = r.lin;
    bad.svh = NULL;
    CHECK(trellis_linear_check(&bad, NULL) == SPARQ_E_ARG);
    CHECK(trellis_linear_gemm(&r.lin, x, 0, y, NULL) == SPARQ_E_ARG);
    CHECK(trellis_linear_gemm(&r.lin, x, 17, y, NULL) == SPARQ_E_ARG);
    CHECK(trellis_linear_gemm_path(&r.lin, x, 1, y, NULL, (trellis_path)9) == SPARQ_E_UNSUPPORTED);
    /* allocation failure is reported, not crashed on */
    sparq_alloc_fail_at(1, true);
    const sparq_status st = trellis_linear_gemm(&r.lin, x, 1, y, NULL);
    sparq_alloc_fail_at(0, false);
    CHECK(st == SPARQ_E_NOMEM);
    trellis_codebook cb;
    CHECK(trellis_cb_parse("mcg", &cb) && cb == TRELLIS_CB_MCG);
    CHECK(!trellis_cb_parse("mul2", &cb));
    trellis_rand_lin_free(&r);
}

static void test_codebook_stats(void)
{
    /* RMS of each codebook over all states (exllamav3 README: 1.0003, 1.2441, 1.2437) */
    const double want[3] = {1.2437, 1.2441, 1.0003};
    for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++) {
        double s = 0;
        for (uint32_t st = 0; st < 65536; st++) {
            const double v = trellis_cb_value((trellis_codebook)cb, st);
            s += v * v;
        }
        CHECK_NEAR(sqrt(s / 65536), want[cb], 6e-4);
    }
    /* mul1 of state 0: b = 0 → fp16(1024·0.006771 − 10.39) */
    CHECK_NEAR(trellis_cb_value(TRELLIS_CB_MUL1, 0), -3.4531, 2e-3);
}

int main(void)
{
    RUN(test_permutation);
    RUN(test_pack_unpack);
    RUN(test_hadamard);
    RUN(test_codebook_stats);
    RUN(test_simd_tile_decode);
    RUN(test_gemm);
    RUN(test_errors);
    return t_summary();
}
