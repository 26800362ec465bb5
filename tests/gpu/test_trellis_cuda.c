/* tests/gpu/test_trellis_cuda.c — the CUDA trellis product kernels
 * (kernels/cuda/) against the CPU codec (kernels/cpu/trellis.h), the oracle:
 *  - decode of Q to fp16 is bit-exact with the CPU on random words for every
 *    K = 1..8 and codebook, and with exllamav3's own CUDA decode on the golden
 *    tensors of tests/data/exl3 (element by element and by FNV-1a digest);
 *  - trellis_cuda_gemm (1..16 rows) has normalised MSE ≤ 1e-5 against
 *    trellis_linear_gemm for every K and codebook, on shapes that are and are
 *    not multiples of the kernels' blocking, with the output poisoned (NaN)
 *    before each run so unwritten outputs fail; so does each product kernel
 *    run on its own (trellis_cuda_gemm_run: gemv_int_c8_w16, gemv_int_c8_w8,
 *    gemv_int_c2, gemm_tc), every K it exists for, and the kernels that do not
 *    exist for a K, codebook or row count are refused;
 *  - the integer mul1 kernels (activations quantised to 16-bit signed integers
 *    (|q| ≤ 32639) per 128-block, exact int32 sums of byte sums on the tensor
 *    core, no fp16 weight values) against a double-precision model of that
 *    arithmetic (tight: max error ≤ 1e-5 of max|y|, both sides use the same
 *    q), against trellis_linear_gemm (the same arithmetic on the CPU: the same
 *    bound), and against decode-then-matmul with the fp16 codebook values
 *    (loose: normalised MSE ≤ 1e-6; the difference is the per-weight fp16
 *    rounding the integer path skips, ~2.8e-4 relative RMS, and the 16-bit
 *    activations);
 *  - which kernel trellis_cuda_gemm picks (trellis_cuda_gemm_choice) on small,
 *    mid-size and large linears, against the rule re-derived here;
 *  - the fused MoE decode layer against per-expert CPU GEMVs + SwiGLU, both
 *    paths (moe_int for mul1, moe_fused for 3inst / mcg) at every K, twice on
 *    one scratch and with two layers sharing it;
 *  - inputs written late: the GEMM's x and the MoE layer's routing, written
 *    200 µs late by the kernel just before them, one that lets PDL-chained
 *    kernels start at once (test_cuda_slow_copy, tests/gpu/cuda_slow_copy.cu):
 *    the chained launches must wait for them (lab run 29: this failed before);
 *  - the prefill path (decode + cuBLAS) agrees the same way for 1..40 rows.
 * Exits 77 ("skipped: no GPU") when there is no usable GPU. Built by meson's
 * gpu suite and by tools/bench/cuda_build.sh on the GPU machine. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "gpu/gpu_probe.h"
#include "kernels/cpu/trellis.h"
#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_cuda_internal.h"
#include "kernels/st_mini.h"
#include "kernels/trellis_rand.h"
#include "t.h"

/* tests/gpu/cuda_slow_copy.cu */
sparq_status test_cuda_slow_copy(void *dst, const void *src, size_t bytes, int spin_us, void *stream);

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rnd_unit(void) { return (float)(rnd32() >> 8) / 16777216.0f * 2.0f - 1.0f; }

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* A random host linear: scales of random sign and magnitude 0.5..1.5. */
typedef trellis_rand_lin host_lin;
static void host_lin_make(host_lin *h, int k, int n, int K, trellis_codebook cb)
{
    trellis_rand_lin_make(h, k, n, K, cb, rnd32, 0.5f, 1.5f, 0.5f, 1.5f, true);
}

/* GPU decode of `lin` vs CPU decode, bit for bit; returns the fp16 result
 * (caller frees) for further checks. */
static uint16_t *check_decode(const trellis_linear *lin, const char *what)
{
    const size_t kn = (size_t)lin->k * lin->n;
    trellis_cuda_linear *dl = NULL;
    CHECK(trellis_cuda_linear_upload(lin, what, &dl) == SPARQ_OK);
    void *dq = NULL;
    CHECK(trellis_cuda_alloc(&dq, kn * 2) == SPARQ_OK);
    uint16_t *q = malloc(kn * 2);
    float *ref = malloc(kn * sizeof(float));
    CHECK(trellis_linear_decode_inner(lin, ref, NULL) == SPARQ_OK);
    CHECK(trellis_cuda_decode_inner(dl, dq, NULL) == SPARQ_OK);
    CHECK(trellis_cuda_sync(NULL) == SPARQ_OK);
    CHECK(trellis_cuda_download(q, dq, kn * 2) == SPARQ_OK);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < kn; i++)
        if (q[i] != sparq_f32_to_f16(ref[i]) && bad++ == 0) first = i;
    CHECK_MSG(bad == 0,
              "%s: %zu of %zu decoded values differ from the CPU (first at row %zu col %zu: %04x vs %04x)", what, bad,
              kn, first / lin->n, first % lin->n, q[first], sparq_f32_to_f16(ref[first]));
    free(ref);
    trellis_cuda_free(dq);
    trellis_cuda_linear_free(dl);
    return q;
}

static void test_decode_random(void)
{
    static const int shapes[][2] = {{128, 128}, {256, 384}};
    for (int K = 1; K <= 8; K++)
        for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                host_lin h;
                host_lin_make(&h, shapes[s][0], shapes[s][1], K, (trellis_codebook)cb);
                char what[96];
                snprintf(what, sizeof what, "random %dx%d K=%d %s", shapes[s][0], shapes[s][1], K,
                         trellis_cb_name((trellis_codebook)cb));
                free(check_decode(&h.lin, what));
                trellis_rand_lin_free(&h);
            }
}

static void test_decode_golden(void)
{
    st_mini st;
    if (st_mini_open(&st, t_data_path("exl3/cases.safetensors")) != 0) {
        CHECK_MSG(0, "cannot read %s", t_data_path("exl3/cases.safetensors"));
        return;
    }
    char list[2048];
    CHECK(st_mini_meta(&st, "cases", list, sizeof list) == 0);
    int ncases = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int k, n, K;
        char cbname[16];
        trellis_codebook cb;
        if (sscanf(tok, "%dx%d.K%d.%15s", &k, &n, &K, cbname) != 4 || !trellis_cb_parse(cbname, &cb)) continue;
        char key[160];
        size_t nb = 0;
        snprintf(key, sizeof key, "%s.trellis", tok);
        const uint16_t *tr = st_mini_get(&st, key, &nb);
        snprintf(key, sizeof key, "%s.suh", tok);
        const uint16_t *suh = st_mini_get(&st, key, NULL);
        snprintf(key, sizeof key, "%s.svh", tok);
        const uint16_t *svh = st_mini_get(&st, key, NULL);
        CHECK_MSG(tr && suh && svh, "%s: tensors missing", tok);
        if (!tr || !suh || !svh) continue;
        /* copy: the file's data is not necessarily 2-byte aligned for us */
        uint16_t *trc = malloc(nb), *suc = malloc((size_t)k * 2), *svc = malloc((size_t)n * 2);
        memcpy(trc, tr, nb);
        memcpy(suc, suh, (size_t)k * 2);
        memcpy(svc, svh, (size_t)n * 2);
        trellis_linear lin = {k, n, K, cb, trc, suc, svc};
        uint16_t *q = check_decode(&lin, tok);
        const size_t kn = (size_t)k * n;
        char want[32], got[32];
        snprintf(key, sizeof key, "%s.inner_fp16.fnv1a64", tok);
        CHECK(st_mini_meta(&st, key, want, sizeof want) == 0);
        snprintf(got, sizeof got, "%016llx", (unsigned long long)fnv1a64((const uint8_t *)q, kn * 2));
        CHECK_MSG(strcmp(want, got) == 0, "%s: GPU inner_fp16 digest %s, exllamav3 %s", tok, got, want);
        snprintf(key, sizeof key, "%s.inner_fp16", tok);
        const uint16_t *ref = st_mini_get(&st, key, &nb);
        if (ref) {
            CHECK(nb == kn * 2);
            CHECK_MSG(memcmp(ref, q, kn * 2) == 0, "%s: GPU inner_fp16 differs from exllamav3's", tok);
        }
        free(q);
        free(trc);
        free(suc);
        free(svc);
        ncases++;
    }
    fprintf(stderr, "  %d golden cases decoded on the GPU\n", ncases);
    CHECK(ncases >= 9);
    st_mini_close(&st);
}

/* ‖a − b‖² / ‖b‖²; NaN (unwritten output) gives NaN. */
static double nmse(const float *a, const float *b, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        e += d * d;
        r += (double)b[i] * b[i];
    }
    return e / (r > 0 ? r : 1);
}

#define NMSE_MAX 1e-5

/* --- the integer mul1 GEMV's arithmetic in double (kernels/cuda/gemv_int.cuh;
 * docs/cuda.md "Integer mul1 GEMM") ------------------------------------------ */

#define INT_QMAX 32639
#define INT_A (1774.0 / 262144.0)
#define INT_D (-476.0 / 262144.0)

static void had128_d(double *v)
{
    for (int h = 1; h < 128; h <<= 1)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const double a = v[j], c = v[j + h];
                v[j] = a + c;
                v[j + h] = a - c;
            }
    for (int j = 0; j < 128; j++) v[j] /= sqrt(128.0);
}

/* Byte sums b (0..1020) of every weight of a mul1 linear (k×n), from the CPU
 * decode: the fp16 value is round(A·(1024 + b) + B), whose rounding error
 * (≤ 2^-10 for |value| < 4) is far below A/2, so b is recovered exactly. */
static int16_t *int_bytesums(const trellis_linear *lin)
{
    const size_t kn = (size_t)lin->k * lin->n;
    float *v = malloc(kn * sizeof(float));
    int16_t *b = malloc(kn * sizeof(int16_t));
    CHECK(trellis_linear_decode_inner(lin, v, NULL) == SPARQ_OK);
    const double bias = sparq_f16_to_f32(0xC931);
    size_t bad = 0;
    for (size_t i = 0; i < kn; i++) {
        const long bb = lrint((v[i] - bias) / INT_A) - 1024;
        b[i] = (int16_t)bb;
        if (bb < 0 || bb > 1020 || fabs(v[i] - (INT_A * (1024 + bb) + bias)) > INT_A / 4) bad++;
    }
    CHECK_MSG(bad == 0, "%zu of %zu mul1 values do not invert to a byte sum", bad, kn);
    free(v);
    return b;
}

/* y (rows×n, double) = the integer GEMM's arithmetic: q per 128-block of
 * u = had128(x ⊙ suh) (float, as the GPU), exact integer sums, the rest in
 * double. */
static void int_ref_gemm(const trellis_linear *lin, const int16_t *bs, const float *x, int rows, double *y)
{
    const int k = lin->k, n = lin->n, nb = k / 128;
    float *u = malloc((size_t)k * sizeof(float));
    int *q = malloc((size_t)k * sizeof(int));
    double *sc = malloc((size_t)nb * sizeof(double)), *t = malloc((size_t)n * sizeof(double));
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < k; i++) u[i] = x[(size_t)r * k + i] * sparq_f16_to_f32(lin->suh[i]);
        trellis_had128(u, (size_t)nb);
        double usum = 0;
        for (int be = 0; be < nb; be++) {
            float m = 0;
            int bad = 0;
            for (int i = 128 * be; i < 128 * be + 128; i++) {
                usum += u[i];
                bad |= !isfinite(u[i]);
                if (fabsf(u[i]) > m) m = fabsf(u[i]);
            }
            float s = 0;
            const float inv = m > 0 ? (float)INT_QMAX / m : 0;
            if (bad) s = NAN;
            else if (m > 0) s = m / (float)INT_QMAX;
            for (int i = 128 * be; i < 128 * be + 128; i++) {
                long qq = bad || m == 0 ? 0 : lrintf(u[i] * inv);
                q[i] = (int)(qq > INT_QMAX ? INT_QMAX : qq < -INT_QMAX ? -INT_QMAX : qq);
            }
            sc[be] = (double)((float)INT_A * s);
        }
        for (int j = 0; j < n; j++) t[j] = INT_D * usum;
        for (int be = 0; be < nb; be++)
            for (int j = 0; j < n; j++) {
                long long I = 0;
                for (int i = 128 * be; i < 128 * be + 128; i++) I += (long long)(bs[(size_t)i * n + j] - 510) * q[i];
                t[j] += sc[be] * (double)I;
            }
        for (int b = 0; b < n / 128; b++) had128_d(t + 128 * b);
        for (int j = 0; j < n; j++) y[(size_t)r * n + j] = t[j] * sparq_f16_to_f32(lin->svh[j]);
    }
    free(u);
    free(q);
    free(sc);
    free(t);
}

/* y (rows×n, double) = x·W with W = diag(suh)·H·Q·H·diag(svh) and Q the fp16
 * codebook values (decode, then matmul), all in double. */
static void dense_ref_gemm(const trellis_linear *lin, const float *x, int rows, double *y)
{
    const int k = lin->k, n = lin->n;
    float *qv = malloc((size_t)k * n * sizeof(float));
    double *u = malloc((size_t)k * sizeof(double)), *t = malloc((size_t)n * sizeof(double));
    CHECK(trellis_linear_decode_inner(lin, qv, NULL) == SPARQ_OK);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < k; i++) u[i] = (double)x[(size_t)r * k + i] * sparq_f16_to_f32(lin->suh[i]);
        for (int b = 0; b < k / 128; b++) had128_d(u + 128 * b);
        for (int j = 0; j < n; j++) t[j] = 0;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < n; j++) t[j] += u[i] * qv[(size_t)i * n + j];
        for (int b = 0; b < n / 128; b++) had128_d(t + 128 * b);
        for (int j = 0; j < n; j++) y[(size_t)r * n + j] = t[j] * sparq_f16_to_f32(lin->svh[j]);
    }
    free(qv);
    free(u);
    free(t);
}

static double worst_int_rel = 0, worst_int_dense = 0;

/* The integer GEMM's result y against both references (see the top) and
 * against the CPU's trellis_linear_gemm `cpu`, which computes the same
 * arithmetic (only the float order of the Hadamard and of the sums over
 * blocks differs): max error ≤ 1e-5 of max|cpu|. */
static double worst_int_cpu = 0;
static void check_int_refs(const trellis_linear *lin, const float *x, int rows, const float *y, const float *cpu,
                           const char *what)
{
    {
        double mc = 0, me = 0;
        for (size_t i = 0; i < (size_t)rows * lin->n; i++) {
            if (fabs(cpu[i]) > mc) mc = fabs(cpu[i]);
            const double d = fabs((double)y[i] - cpu[i]);
            if (d > me || d != d) me = d;
        }
        const double rel = me / (mc > 0 ? mc : 1);
        if (rel > worst_int_cpu || rel != rel) worst_int_cpu = rel;
        CHECK_MSG(rel <= 1e-5, "%s: integer GEMM vs the CPU's: max error %.3g of max|y|", what, rel);
    }
    const size_t rn = (size_t)rows * lin->n;
    double *ri = malloc(rn * sizeof(double)), *rd = malloc(rn * sizeof(double));
    int16_t *bs = int_bytesums(lin);
    int_ref_gemm(lin, bs, x, rows, ri);
    dense_ref_gemm(lin, x, rows, rd);
    double maxr = 0, maxe = 0, e = 0, r2 = 0;
    for (size_t i = 0; i < rn; i++) {
        if (fabs(ri[i]) > maxr) maxr = fabs(ri[i]);
        const double d = fabs(y[i] - ri[i]);
        if (d > maxe || d != d) maxe = d;
        e += (y[i] - rd[i]) * (y[i] - rd[i]);
        r2 += rd[i] * rd[i];
    }
    const double rel = maxe / (maxr > 0 ? maxr : 1), dn = e / (r2 > 0 ? r2 : 1);
    if (rel > worst_int_rel || rel != rel) worst_int_rel = rel;
    if (dn > worst_int_dense || dn != dn) worst_int_dense = dn;
    CHECK_MSG(rel <= 1e-5, "%s: integer GEMM vs its double model: max error %.3g of max|y|", what, rel);
    CHECK_MSG(dn <= 1e-6, "%s: integer GEMM vs decode-then-matmul: normalised MSE %.3g", what, dn);
    free(bs);
    free(ri);
    free(rd);
}

static double worst_nmse = 0;

/* How a check_gemm runs the GEMM: DEFAULT = trellis_cuda_gemm; LATE = the same
 * with x written 200 µs late by the kernel just before it, one that lets
 * PDL-chained kernels start at once (x holds NaN until then); KERNEL = the
 * product kernel `kernel` alone (trellis_cuda_gemm_run); PREFILL = the cuBLAS
 * path (rows may exceed 16). */
enum { DEFAULT, LATE, KERNEL, PREFILL };
static trellis_cuda_prefill_ws *g_pws; /* PREFILL mode's shared workspace */

static int kernel_is_int(trellis_cuda_gemm_kernel k) { return k != TRELLIS_CUDA_GEMM_TC; }

/* Whether trellis_cuda_gemm_run(kernel) exists for this linear and row count
 * (SPARQ_E_UNSUPPORTED otherwise): the integer kernels for mul1 at 1..4 rows,
 * gemv_int_c8_w16 at K = 2..4 only. */
static int kernel_exists(const trellis_linear *lin, int rows, trellis_cuda_gemm_kernel k)
{
    if (!kernel_is_int(k)) return 1;
    if (lin->cb != TRELLIS_CB_MUL1 || rows > 4) return 0;
    return k != TRELLIS_CUDA_GEMV_INT_C8_W16 || (lin->K >= 2 && lin->K <= 4);
}

/* trellis_cuda_gemm's rule, re-derived (kernels/cuda/trellis_linear.cu): work
 * items = (n/128)·(k/16), against 16 resident warps a SM. */
static trellis_cuda_gemm_kernel expected_choice(const trellis_linear *lin, int rows)
{
    if (lin->cb != TRELLIS_CB_MUL1 || rows > 4) return TRELLIS_CUDA_GEMM_TC;
    const long long items = (long long)(lin->n / 128) * (lin->k / 16), warps = (long long)trellis_cuda_sm_count() * 16;
    if (rows == 1) {
        if (items < 5 * warps) return TRELLIS_CUDA_GEMV_INT_C2;
        return lin->K >= 2 && lin->K <= 4 ? TRELLIS_CUDA_GEMV_INT_C8_W16 : TRELLIS_CUDA_GEMV_INT_C8_W8;
    }
    return items >= 8 * warps ? TRELLIS_CUDA_GEMV_INT_C8_W8 : TRELLIS_CUDA_GEMV_INT_C2;
}

/* One GEMM check: fresh x, GPU (poisoned output) vs CPU; the integer kernels
 * also against check_int_refs. */
static void check_gemm(const host_lin *h, trellis_cuda_linear *dl, trellis_cuda_ws *ws, int rows, int mode,
                       trellis_cuda_gemm_kernel kernel)
{
    const int k = h->lin.k, n = h->lin.n;
    const trellis_cuda_gemm_kernel ran = mode == KERNEL ? kernel : trellis_cuda_gemm_choice(dl, rows);
    if (mode != PREFILL) CHECK(trellis_cuda_gemm_choice(dl, rows) == expected_choice(&h->lin, rows));
    float *x = malloc((size_t)rows * k * sizeof(float));
    float *y = malloc((size_t)rows * n * sizeof(float)), *ref = malloc((size_t)rows * n * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * k; i++) x[i] = rnd_unit();
    for (int r0 = 0; r0 < rows; r0 += TRELLIS_GEMM_MAX_ROWS) {
        const int rr = rows - r0 < TRELLIS_GEMM_MAX_ROWS ? rows - r0 : TRELLIS_GEMM_MAX_ROWS;
        CHECK(trellis_linear_gemm(&h->lin, x + (size_t)r0 * k, rr, ref + (size_t)r0 * n, NULL) == SPARQ_OK);
    }
    void *dx = NULL, *dy = NULL;
    CHECK(trellis_cuda_alloc(&dx, (size_t)rows * k * 4) == SPARQ_OK);
    CHECK(trellis_cuda_alloc(&dy, (size_t)rows * n * 4) == SPARQ_OK);
    CHECK(trellis_cuda_upload(dx, x, (size_t)rows * k * 4) == SPARQ_OK);
    for (size_t i = 0; i < (size_t)rows * n; i++) y[i] = NAN;
    CHECK(trellis_cuda_upload(dy, y, (size_t)rows * n * 4) == SPARQ_OK);
    void *dsrc = NULL;
    if (mode == LATE) { /* x arrives late; NaN meanwhile */
        CHECK(trellis_cuda_alloc(&dsrc, (size_t)rows * k * 4) == SPARQ_OK);
        CHECK(trellis_cuda_upload(dsrc, x, (size_t)rows * k * 4) == SPARQ_OK);
        float *nanx = malloc((size_t)rows * k * 4);
        for (size_t i = 0; i < (size_t)rows * k; i++) nanx[i] = NAN;
        CHECK(trellis_cuda_upload(dx, nanx, (size_t)rows * k * 4) == SPARQ_OK);
        free(nanx);
        CHECK(test_cuda_slow_copy(dx, dsrc, (size_t)rows * k * 4, 200, NULL) == SPARQ_OK);
    }
    const sparq_status st =
        mode == PREFILL  ? trellis_cuda_gemm_prefill(dl, dx, rows, dy, g_pws, NULL)
        : mode == KERNEL ? trellis_cuda_gemm_run(dl, dx, rows, dy, ws, NULL, kernel, TRELLIS_CUDA_PART_ALL)
                         : trellis_cuda_gemm(dl, dx, rows, dy, ws, NULL);
    CHECK_MSG(st == SPARQ_OK, "gemm (%s): %s", trellis_cuda_gemm_kernel_name(ran), sparq_errmsg());
    CHECK(trellis_cuda_sync(NULL) == SPARQ_OK);
    CHECK(trellis_cuda_download(y, dy, (size_t)rows * n * 4) == SPARQ_OK);
    const double e = nmse(y, ref, (size_t)rows * n);
    if (e > worst_nmse || e != e) worst_nmse = e;
    CHECK_MSG(e <= NMSE_MAX, "%dx%d K=%d %s rows=%d mode %d (%s): normalised MSE %.3g", k, n, h->lin.K,
              trellis_cb_name(h->lin.cb), rows, mode, mode == PREFILL ? "prefill" : trellis_cuda_gemm_kernel_name(ran),
              e);
    if (mode != PREFILL && kernel_is_int(ran)) {
        char what[128];
        snprintf(what, sizeof what, "%dx%d K=%d rows=%d %s", k, n, h->lin.K, rows, trellis_cuda_gemm_kernel_name(ran));
        check_int_refs(&h->lin, x, rows, y, ref, what);
    }
    trellis_cuda_free(dx);
    trellis_cuda_free(dy);
    trellis_cuda_free(dsrc);
    free(x);
    free(y);
    free(ref);
}

/* Every product kernel alone at the row counts given (the integer ones at
 * those ≤ 4), and refused where it does not exist. */
static void check_kernels(const host_lin *h, trellis_cuda_linear *dl, trellis_cuda_ws *ws, const int *rows_list,
                          int nrows)
{
    for (int kn = 0; kn < TRELLIS_CUDA_GEMM_KERNELS; kn++)
        for (int r = 0; r < nrows; r++) {
            const trellis_cuda_gemm_kernel kernel = (trellis_cuda_gemm_kernel)kn;
            const int rows = rows_list[r];
            if (kernel_exists(&h->lin, rows, kernel)) {
                check_gemm(h, dl, ws, rows, KERNEL, kernel);
                continue;
            }
            void *d = NULL;
            CHECK(trellis_cuda_alloc(&d, (size_t)rows * (h->lin.k > h->lin.n ? h->lin.k : h->lin.n) * 4) == SPARQ_OK);
            CHECK_MSG(trellis_cuda_gemm_run(dl, d, rows, d, ws, NULL, kernel, TRELLIS_CUDA_PART_ALL) ==
                          SPARQ_E_UNSUPPORTED,
                      "%s at K=%d %s, %d rows: not refused", trellis_cuda_gemm_kernel_name(kernel), h->lin.K,
                      trellis_cb_name(h->lin.cb), rows);
            trellis_cuda_free(d);
        }
}

static void test_gemm_all_k(void)
{
    /* 384 rows = 24 k tiles, not a multiple of the steps of 4 or of the
     * 128-blocks' 8; 640 cols = 20 pairs of tile columns, 5 groups of 8 */
    static const int shapes[][2] = {{128, 128}, {384, 640}, {1024, 256}};
    static const int rows_default[] = {1, 2, 3, 4, 5, 8, 16};
    static const int rows_kernel[] = {1, 3, 4, 6, 16};
    trellis_cuda_ws *ws = NULL;
    CHECK(trellis_cuda_ws_create(1024, 1024, &ws) == SPARQ_OK);
    for (int K = 1; K <= 8; K++)
        for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++)
            for (size_t s = 0; s < 3; s++) {
                host_lin h;
                host_lin_make(&h, shapes[s][0], shapes[s][1], K, (trellis_codebook)cb);
                trellis_cuda_linear *dl = NULL;
                CHECK(trellis_cuda_linear_upload(&h.lin, "random", &dl) == SPARQ_OK);
                for (size_t r = 0; r < sizeof rows_default / sizeof rows_default[0]; r++)
                    check_gemm(&h, dl, ws, rows_default[r], DEFAULT, 0);
                check_kernels(&h, dl, ws, rows_kernel, (int)(sizeof rows_kernel / sizeof rows_kernel[0]));
                trellis_cuda_linear_free(dl);
                trellis_rand_lin_free(&h);
            }
    trellis_cuda_ws_free(ws);
    fprintf(stderr, "  worst normalised MSE so far %.3g\n", worst_nmse);
}

static void test_gemm_shapes(void)
{
    static const int rows_kernel[] = {1, 2, 4, 7, 16};
    trellis_cuda_ws *ws = NULL;
    CHECK(trellis_cuda_ws_create(2048, 2048, &ws) == SPARQ_OK);
    /* many k tiles, few columns, and the other way round; every kernel */
    for (int K = 2; K <= 4; K++) {
        host_lin h;
        host_lin_make(&h, 2048, 768, K, TRELLIS_CB_MUL1);
        trellis_cuda_linear *dl = NULL;
        CHECK(trellis_cuda_linear_upload(&h.lin, "2048x768", &dl) == SPARQ_OK);
        check_kernels(&h, dl, ws, rows_kernel, (int)(sizeof rows_kernel / sizeof rows_kernel[0]));
        trellis_cuda_linear_free(dl);
        trellis_rand_lin_free(&h);
    }
    host_lin h;
    host_lin_make(&h, 768, 2048, 3, TRELLIS_CB_MUL1);
    trellis_cuda_linear *dl = NULL;
    CHECK(trellis_cuda_linear_upload(&h.lin, "768x2048", &dl) == SPARQ_OK);
    /* repeated calls on one workspace, alternating kernels: t must come back
     * to zero each time */
    for (int i = 0; i < 3; i++) {
        check_gemm(&h, dl, ws, 1, DEFAULT, 0);
        check_gemm(&h, dl, ws, 16, DEFAULT, 0);
        for (int kn = 0; kn < TRELLIS_CUDA_GEMM_KERNELS; kn++)
            check_gemm(&h, dl, ws, kn == TRELLIS_CUDA_GEMM_TC ? 1 + 5 * i : 1 + i, KERNEL,
                       (trellis_cuda_gemm_kernel)kn);
    }
    trellis_cuda_linear_free(dl);
    trellis_rand_lin_free(&h);
    /* the default called repeatedly on one workspace (t back to zero after
     * each call), and with x written late */
    host_lin_make(&h, 2048, 2048, 3, TRELLIS_CB_MUL1);
    CHECK(trellis_cuda_linear_upload(&h.lin, "default-2048x2048", &dl) == SPARQ_OK);
    for (int i = 0; i < 3; i++) {
        check_gemm(&h, dl, ws, 1, DEFAULT, 0);
        check_gemm(&h, dl, ws, 4 + 6 * i, DEFAULT, 0);
    }
    check_gemm(&h, dl, ws, 1, LATE, 0);
    check_gemm(&h, dl, ws, 7, LATE, 0);
    check_gemm(&h, dl, ws, 3, KERNEL, TRELLIS_CUDA_GEMV_INT_C8_W8);
    trellis_cuda_linear_free(dl);
    trellis_rand_lin_free(&h);
    trellis_cuda_ws_free(ws);
    /* a large mul1 linear: the default runs gemv_int_c8_w16 at 1 row,
     * gemv_int_c8_w8 at 2..4, gemm_tc above */
    CHECK(trellis_cuda_ws_create(4096, 14336, &ws) == SPARQ_OK);
    host_lin_make(&h, 4096, 14336, 3, TRELLIS_CB_MUL1);
    CHECK(trellis_cuda_linear_upload(&h.lin, "default-4096x14336", &dl) == SPARQ_OK);
    CHECK(trellis_cuda_gemm_choice(dl, 1) == TRELLIS_CUDA_GEMV_INT_C8_W16);
    CHECK(trellis_cuda_gemm_choice(dl, 2) == TRELLIS_CUDA_GEMV_INT_C8_W8);
    CHECK(trellis_cuda_gemm_choice(dl, 4) == TRELLIS_CUDA_GEMV_INT_C8_W8);
    CHECK(trellis_cuda_gemm_choice(dl, 5) == TRELLIS_CUDA_GEMM_TC);
    CHECK(strcmp(trellis_cuda_gemm_kernel_name(trellis_cuda_gemm_choice(dl, 1)), "gemv_int_c8_w16") == 0);
    check_gemm(&h, dl, ws, 1, DEFAULT, 0);
    check_gemm(&h, dl, ws, 4, DEFAULT, 0);
    check_gemm(&h, dl, ws, 1, DEFAULT, 0);
    check_gemm(&h, dl, ws, 1, LATE, 0);
    check_gemm(&h, dl, ws, 2, LATE, 0);
    trellis_cuda_linear_free(dl);
    trellis_rand_lin_free(&h);
    /* mid-size ones (5.8 work items per resident warp on 132 SMs): the 16-warp
     * kernel at one row from 5 items a warp (K = 2..4; the 8-warp one at other
     * K), the 8-warp one at 2..4 rows from 8, else gemv_int_c2 (check_gemm
     * checks each choice against expected_choice) */
    for (int K = 3; K <= 6; K += 3) {
        host_lin_make(&h, 4096, 6144, K, TRELLIS_CB_MUL1);
        CHECK(trellis_cuda_linear_upload(&h.lin, "default-4096x6144", &dl) == SPARQ_OK);
        check_gemm(&h, dl, ws, 1, DEFAULT, 0);
        check_gemm(&h, dl, ws, 3, DEFAULT, 0);
        trellis_cuda_linear_free(dl);
        trellis_rand_lin_free(&h);
    }
    trellis_cuda_ws_free(ws);
}

/* The prefill path: one workspace of 16 rows serves linears of several
 * shapes (smaller after larger, so a stale decode would show), longer steps
 * run in chunks, and a linear larger than the workspace is refused. */
static void test_prefill(void)
{
    static const int rows_list[] = {1, 16, 17, 40};
    static const int shapes[][3] = {{512, 384, 3}, {256, 1024, 6}, {512, 384, 2}, {128, 128, 8}};
    CHECK(trellis_cuda_prefill_ws_create(512 * 1024, 512, 1024, 16, &g_pws) == SPARQ_OK);
    CHECK(trellis_cuda_prefill_ws_bytes(512 * 1024, 512, 1024, 16) >= (size_t)512 * 1024 * 2 + 16 * 1024 * 4);
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0] && g_pws; sh++) {
        host_lin h;
        host_lin_make(&h, shapes[sh][0], shapes[sh][1], shapes[sh][2], TRELLIS_CB_MUL1);
        trellis_cuda_linear *dl = NULL;
        CHECK(trellis_cuda_linear_upload(&h.lin, "prefill", &dl) == SPARQ_OK);
        for (size_t r = 0; r < sizeof rows_list / sizeof rows_list[0]; r++)
            check_gemm(&h, dl, NULL, rows_list[r], PREFILL, 0);
        trellis_cuda_linear_free(dl);
        trellis_rand_lin_free(&h);
    }
    {
        host_lin h;
        host_lin_make(&h, 1024, 1024, 3, TRELLIS_CB_MUL1);
        trellis_cuda_linear *dl = NULL;
        float *d = NULL;
        CHECK(trellis_cuda_linear_upload(&h.lin, "too-large", &dl) == SPARQ_OK);
        CHECK(trellis_cuda_alloc((void **)&d, (size_t)4 * 1024 * 4) == SPARQ_OK);
        CHECK(trellis_cuda_gemm_prefill(dl, d, 2, d, g_pws, NULL) == SPARQ_E_SHAPE);
        trellis_cuda_free(d);
        trellis_cuda_linear_free(dl);
        trellis_rand_lin_free(&h);
    }
    trellis_cuda_prefill_ws_free(g_pws);
    g_pws = NULL;
}

/* The fused MoE layer against the CPU: per token and routed expert,
 * down(silu(gate(x)) ⊙ up(x)) weighted and added onto a random residual. */
/* ref[t] = Σ_j w[t,j] · down_e(silu(gate_e(x_t)) ⊙ up_e(x_t)), e = ids[t,j], on the CPU (hl: E gate,
 * E up, E down linears). */
static void moe_ref(const host_lin *hl, int E, int hidden, int inter, int top_k, int tokens, const float *x,
                    const int *ids, const float *w, float *ref)
{
    float *g = malloc((size_t)inter * 4), *u = malloc((size_t)inter * 4), *d = malloc((size_t)hidden * 4);
    memset(ref, 0, (size_t)tokens * hidden * 4);
    for (int t = 0; t < tokens; t++)
        for (int j = 0; j < top_k; j++) {
            const int e = ids[t * top_k + j];
            CHECK(trellis_linear_gemm(&hl[e].lin, x + (size_t)t * hidden, 1, g, NULL) == SPARQ_OK);
            CHECK(trellis_linear_gemm(&hl[E + e].lin, x + (size_t)t * hidden, 1, u, NULL) == SPARQ_OK);
            for (int i = 0; i < inter; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            CHECK(trellis_linear_gemm(&hl[2 * E + e].lin, g, 1, d, NULL) == SPARQ_OK);
            for (int i = 0; i < hidden; i++) ref[(size_t)t * hidden + i] += w[t * top_k + j] * d[i];
        }
    free(g);
    free(u);
    free(d);
}

/* Distinct random experts per token (and weights, if w). */
static void moe_route(int E, int top_k, int tokens, int *ids, float *w)
{
    for (int t = 0; t < tokens; t++)
        for (int j = 0; j < top_k; j++) {
            int e, dup;
            do {
                e = (int)(rnd32() % (uint32_t)E);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * top_k + q] == e;
            } while (dup);
            ids[t * top_k + j] = e;
            if (w) w[t * top_k + j] = 0.1f + 0.9f * (rnd_unit() * 0.5f + 0.5f);
        }
}

static void check_moe(int hidden, int inter, int E, int top_k, int tokens, int K, trellis_codebook cb)
{
    host_lin *hl = calloc((size_t)3 * E, sizeof *hl);
    trellis_cuda_linear **dl = calloc((size_t)3 * E, sizeof *dl);
    for (int i = 0; i < 3 * E; i++) {
        const int proj = i / E; /* 0 gate, 1 up, 2 down */
        host_lin_make(&hl[i], proj == 2 ? inter : hidden, proj == 2 ? hidden : inter, K, cb);
        CHECK(trellis_cuda_linear_upload(&hl[i].lin, "expert", &dl[i]) == SPARQ_OK);
    }
    trellis_cuda_moe *moe = NULL;
    CHECK(trellis_cuda_moe_create(dl, dl + E, dl + 2 * E, E, tokens, top_k, &moe) == SPARQ_OK);
    const size_t pairs = (size_t)tokens * top_k;
    float *x = malloc((size_t)tokens * hidden * 4), *res = malloc((size_t)tokens * hidden * 4);
    float *out = malloc((size_t)tokens * hidden * 4), *ref = malloc((size_t)tokens * hidden * 4);
    float *w = malloc(pairs * 4);
    int *ids = malloc(pairs * sizeof(int));
    for (size_t i = 0; i < (size_t)tokens * hidden; i++) {
        x[i] = rnd_unit();
        res[i] = rnd_unit();
    }
    moe_route(E, top_k, tokens, ids, w);
    moe_ref(hl, E, hidden, inter, top_k, tokens, x, ids, w, ref);
    void *dx = NULL, *dout = NULL, *dids = NULL, *dw = NULL;
    CHECK(trellis_cuda_alloc(&dx, (size_t)tokens * hidden * 4) == SPARQ_OK);
    CHECK(trellis_cuda_alloc(&dout, (size_t)tokens * hidden * 4) == SPARQ_OK);
    CHECK(trellis_cuda_alloc(&dids, pairs * sizeof(int)) == SPARQ_OK);
    CHECK(trellis_cuda_alloc(&dw, pairs * 4) == SPARQ_OK);
    CHECK(trellis_cuda_upload(dx, x, (size_t)tokens * hidden * 4) == SPARQ_OK);
    CHECK(trellis_cuda_upload(dids, ids, pairs * sizeof(int)) == SPARQ_OK);
    CHECK(trellis_cuda_upload(dw, w, pairs * 4) == SPARQ_OK);
    /* twice: the scratch must come back to zero */
    CHECK_STR_CONTAINS(trellis_cuda_moe_kernel_name(moe), cb == TRELLIS_CB_MUL1 ? "moe_int" : "moe_fused");
    for (int run = 0; run < 2; run++) {
        CHECK(trellis_cuda_upload(dout, res, (size_t)tokens * hidden * 4) == SPARQ_OK);
        const sparq_status st = trellis_cuda_moe_forward(moe, dx, tokens, dids, dw, dout, NULL);
        CHECK_MSG(st == SPARQ_OK, "moe forward (%s): %s", trellis_cuda_moe_kernel_name(moe), sparq_errmsg());
        CHECK(trellis_cuda_sync(NULL) == SPARQ_OK);
        CHECK(trellis_cuda_download(out, dout, (size_t)tokens * hidden * 4) == SPARQ_OK);
        for (size_t i = 0; i < (size_t)tokens * hidden; i++) out[i] -= res[i];
        const double e = nmse(out, ref, (size_t)tokens * hidden);
        if (e > worst_nmse || e != e) worst_nmse = e;
        CHECK_MSG(e <= NMSE_MAX, "moe (%s) %dx%d E=%d top-%d tokens=%d K=%d %s: normalised MSE %.3g",
                  trellis_cuda_moe_kernel_name(moe), hidden, inter, E, top_k, tokens, K, trellis_cb_name(cb), e);
    }
    /* a second layer sharing the first one's scratch (as the backend's layers do): both
     * still right when run in turn, twice each, and freeable in any order */
    trellis_cuda_moe *moe2 = NULL;
    CHECK(trellis_cuda_moe_create(dl, dl + E, dl + 2 * E, E, tokens, top_k, &moe2) == SPARQ_OK);
    CHECK(trellis_cuda_moe_share(moe2, moe) == SPARQ_OK);
    for (int run = 0; run < 4; run++) {
        CHECK(trellis_cuda_upload(dout, res, (size_t)tokens * hidden * 4) == SPARQ_OK);
        CHECK(trellis_cuda_moe_forward(run & 1 ? moe2 : moe, dx, tokens, dids, dw, dout, NULL) == SPARQ_OK);
        CHECK(trellis_cuda_sync(NULL) == SPARQ_OK);
        CHECK(trellis_cuda_download(out, dout, (size_t)tokens * hidden * 4) == SPARQ_OK);
        for (size_t i = 0; i < (size_t)tokens * hidden; i++) out[i] -= res[i];
        const double e = nmse(out, ref, (size_t)tokens * hidden);
        CHECK_MSG(e <= NMSE_MAX, "moe sharing scratch, run %d: normalised MSE %.3g", run, e);
    }
    /* the routing written by the kernel just before the layer, one that lets
     * PDL-chained kernels start at once and writes 200 µs later: the layer
     * must use the new routing (its later launches read it before their own
     * waits, so the first one may only let them start once it has waited) */
    {
        int *ids2 = malloc(pairs * sizeof(int));
        moe_route(E, top_k, tokens, ids2, NULL);
        moe_ref(hl, E, hidden, inter, top_k, tokens, x, ids2, w, ref);
        void *dsrc = NULL;
        CHECK(trellis_cuda_alloc(&dsrc, pairs * sizeof(int)) == SPARQ_OK);
        CHECK(trellis_cuda_upload(dsrc, ids2, pairs * sizeof(int)) == SPARQ_OK);
        CHECK(trellis_cuda_upload(dout, res, (size_t)tokens * hidden * 4) == SPARQ_OK);
        CHECK(test_cuda_slow_copy(dids, dsrc, pairs * sizeof(int), 200, NULL) == SPARQ_OK);
        CHECK(trellis_cuda_moe_forward(moe, dx, tokens, dids, dw, dout, NULL) == SPARQ_OK);
        CHECK(trellis_cuda_sync(NULL) == SPARQ_OK);
        CHECK(trellis_cuda_download(out, dout, (size_t)tokens * hidden * 4) == SPARQ_OK);
        for (size_t i = 0; i < (size_t)tokens * hidden; i++) out[i] -= res[i];
        const double e = nmse(out, ref, (size_t)tokens * hidden);
        CHECK_MSG(e <= NMSE_MAX, "moe with the routing written late by the previous kernel: normalised MSE %.3g", e);
        trellis_cuda_free(dsrc);
        free(ids2);
    }
    trellis_cuda_moe_free(moe);
    if (tokens > 1) { /* other token counts: refused */
        trellis_cuda_moe *moe3 = NULL;
        CHECK(trellis_cuda_moe_create(dl, dl + E, dl + 2 * E, E, tokens - 1, top_k, &moe3) == SPARQ_OK);
        CHECK(trellis_cuda_moe_share(moe3, moe2) == SPARQ_E_SHAPE);
        trellis_cuda_moe_free(moe3);
    }
    /* the expert split: a layer holding only the experts e % own_n == own_k
     * (the others' handles NULL), forward_own on every pair's routing: the
     * reference with the other pairs' weights zero; twice each (the scratch
     * of the slots it ran must come back to zero), every set of 2 and 3 */
    {
        trellis_cuda_linear **own = calloc((size_t)3 * E, sizeof *own);
        float *w0 = malloc(pairs * 4);
        CHECK(trellis_cuda_upload(dids, ids, pairs * sizeof(int)) == SPARQ_OK);
        for (int on = 2; on <= 3; on++)
            for (int ok = 0; ok < on; ok++) {
                for (int e = 0; e < E; e++)
                    for (int j = 0; j < 3; j++) own[j * E + e] = e % on == ok ? dl[j * E + e] : NULL;
                for (size_t p = 0; p < pairs; p++) w0[p] = ids[p] % on == ok ? w[p] : 0.0f;
                moe_ref(hl, E, hidden, inter, top_k, tokens, x, ids, w0, ref);
                double energy = 0;
                for (size_t i = 0; i < (size_t)tokens * hidden; i++) energy += (double)ref[i] * ref[i];
                trellis_cuda_moe *mo = NULL;
                CHECK_MSG(trellis_cuda_moe_create(own, own + E, own + 2 * E, E, tokens, top_k, &mo) == SPARQ_OK,
                          "moe of experts %d mod %d: %s", ok, on, sparq_errmsg());
                for (int run = 0; mo && run < 2; run++) {
                    CHECK(trellis_cuda_upload(dout, res, (size_t)tokens * hidden * 4) == SPARQ_OK);
                    CHECK(trellis_cuda_moe_forward_own(mo, dx, tokens, dids, dw, dout, on, ok, NULL) == SPARQ_OK);
                    CHECK(trellis_cuda_sync(NULL) == SPARQ_OK);
                    CHECK(trellis_cuda_download(out, dout, (size_t)tokens * hidden * 4) == SPARQ_OK);
                    double dev = 0;
                    for (size_t i = 0; i < (size_t)tokens * hidden; i++) {
                        out[i] -= res[i];
                        dev += (double)out[i] * out[i];
                    }
                    const double e = energy > 0 ? nmse(out, ref, (size_t)tokens * hidden) : dev;
                    CHECK_MSG(e <= NMSE_MAX, "moe (%s) of experts %d mod %d, %d tokens top-%d, run %d: %s %.3g",
                              trellis_cuda_moe_kernel_name(mo), ok, on, tokens, top_k, run,
                              energy > 0 ? "normalised MSE" : "no pair is this set's, yet output energy", e);
                }
                trellis_cuda_moe_free(mo);
            }
        free(own);
        free(w0);
    }
    trellis_cuda_moe_free(moe2);
    for (int i = 0; i < 3 * E; i++) {
        trellis_cuda_linear_free(dl[i]);
        trellis_rand_lin_free(&hl[i]);
    }
    trellis_cuda_free(dx);
    trellis_cuda_free(dout);
    trellis_cuda_free(dids);
    trellis_cuda_free(dw);
    free(hl);
    free(dl);
    free(x);
    free(res);
    free(out);
    free(ref);
    free(w);
    free(ids);
}

static void test_moe(void)
{
    check_moe(512, 384, 4, 2, 1, 3, TRELLIS_CB_MUL1);
    check_moe(512, 384, 4, 2, 3, 3, TRELLIS_CB_MUL1);
    check_moe(256, 640, 6, 3, 2, 2, TRELLIS_CB_3INST);
    check_moe(1024, 768, 8, 8, 16, 4, TRELLIS_CB_MCG); /* every expert, 16 tokens */
    /* many tokens, widths not a multiple of 256 */
    check_moe(768, 640, 8, 4, 16, 2, TRELLIS_CB_MUL1);
    /* enough down work (≥ 8 items per resident warp up to 160 SMs) for
     * moe_int's 16-warp down blocks */
    check_moe(1024, 640, 8, 4, 16, 3, TRELLIS_CB_MUL1);
    check_moe(1024, 384, 6, 6, 5, 4, TRELLIS_CB_MUL1);
    /* both paths at every K */
    for (int K = 1; K <= 8; K++)
        for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++) check_moe(256, 384, 4, 2, 2, K, (trellis_codebook)cb);
    /* mismatched expert shapes are refused, naming the tensor */
    host_lin a, b;
    host_lin_make(&a, 256, 128, 2, TRELLIS_CB_MUL1);
    host_lin_make(&b, 256, 128, 3, TRELLIS_CB_MUL1);
    trellis_cuda_linear *da = NULL, *db = NULL, *dd = NULL;
    host_lin c;
    host_lin_make(&c, 128, 256, 2, TRELLIS_CB_MUL1);
    CHECK(trellis_cuda_linear_upload(&a.lin, "gate0", &da) == SPARQ_OK);
    CHECK(trellis_cuda_linear_upload(&b.lin, "up0-k3", &db) == SPARQ_OK);
    CHECK(trellis_cuda_linear_upload(&c.lin, "down0", &dd) == SPARQ_OK);
    trellis_cuda_moe *moe = NULL;
    CHECK(trellis_cuda_moe_create(&da, &db, &dd, 1, 1, 1, &moe) == SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "up0-k3");
    CHECK(moe == NULL);
    trellis_cuda_linear_free(da);
    trellis_cuda_linear_free(db);
    trellis_cuda_linear_free(dd);
    trellis_rand_lin_free(&a);
    trellis_rand_lin_free(&b);
    trellis_rand_lin_free(&c);
}

static void test_errors(void)
{
    trellis_cuda_ws *ws = NULL;
    CHECK(trellis_cuda_ws_create(128, 128, &ws) == SPARQ_OK);
    host_lin h;
    host_lin_make(&h, 256, 128, 2, TRELLIS_CB_MUL1);
    trellis_cuda_linear *dl = NULL;
    CHECK(trellis_cuda_linear_upload(&h.lin, "too-big", &dl) == SPARQ_OK);
    void *d = NULL;
    CHECK(trellis_cuda_alloc(&d, 256 * 17 * 4) == SPARQ_OK);
    CHECK(trellis_cuda_gemm(dl, d, 1, d, ws, NULL) == SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "too-big");
    CHECK(trellis_cuda_gemm(dl, d, 17, d, ws, NULL) == SPARQ_E_ARG);
    CHECK(trellis_cuda_gemm_run(dl, d, 1, d, ws, NULL, TRELLIS_CUDA_GEMM_KERNELS, TRELLIS_CUDA_PART_ALL) ==
          SPARQ_E_ARG);
    CHECK(strcmp(trellis_cuda_gemm_kernel_name(TRELLIS_CUDA_GEMM_KERNELS), "?") == 0);
    h.lin.K = 9;
    trellis_cuda_linear *bad = NULL;
    CHECK(trellis_cuda_linear_upload(&h.lin, "k9", &bad) == SPARQ_E_UNSUPPORTED);
    CHECK(bad == NULL);
    trellis_cuda_free(d);
    trellis_cuda_linear_free(dl);
    trellis_rand_lin_free(&h);
    trellis_cuda_ws_free(ws);
}

int main(void)
{
    const char *why = "";
    if (gpu_probe_count(&why) == 0 || trellis_cuda_device_count() == 0) T_SKIP("skipped: no GPU (%s)", why);
    RUN(test_decode_random);
    RUN(test_decode_golden);
    RUN(test_gemm_all_k);
    RUN(test_gemm_shapes);
    RUN(test_prefill);
    RUN(test_moe);
    RUN(test_errors);
    fprintf(stderr, "  worst normalised MSE %.3g (bound %g)\n", worst_nmse, NMSE_MAX);
    fprintf(stderr, "  integer GEMM: worst max error vs its double model %.3g and vs the CPU %.3g of max|y| (bound "
                    "1e-5), worst normalised MSE vs decode-then-matmul %.3g (bound 1e-6)\n",
            worst_int_rel, worst_int_cpu, worst_int_dense);
    return t_summary();
}
