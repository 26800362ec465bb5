/* tests/kernels/test_fp8.c — the FP8 (E4M3 + UE8M0 blocks) and MXFP4 (E2M1 +
 * UE8M0 groups of 32) linears of kernels/cpu/ops_fp8.c, on the AVX2 and the
 * scalar path:
 *  - every E4M3 code (256), every E2M1 code (16) and UE8M0 codes 0..254
 *    through the GEMV (a one-hot input picks one weight out exactly), the tile
 *    dequantiser and formats/safetensors.c's decoders, bit for bit against
 *    ml_dtypes' values in tests/data/fp8/codes.txt
 *    (tools/fixtures/make_fp8_golden.py), including UE8M0 0 = 2^-127 kept as
 *    a subnormal and the overflow of the largest scales;
 *  - the forward at 1, 2, 3, 5, 8 (GEMV) and 9, 33 (GEMM) rows, shapes with
 *    partial blocks and groups, against the scalar reference: sf_dequant_fp8 /
 *    sf_dequant_mxfp4 to fp32, then a naive double-precision matmul (max
 *    relative difference printed on failure); the tile dequantiser equal to
 *    that reference element for element; thread-count independence;
 *  - sq_cpu_find_e4m3_nan at every position class (AVX2 steps, tails);
 *  - sq_linear_rows_view and sq_linear_stored_bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "formats/safetensors.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "t.h"

static sq_exec *ex;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float urand(void) { return (float)(rnd() & 0xFFFFFF) / 8388608.0f - 1.0f; }

/* --- golden codes ------------------------------------------------------------------ */

static float g_e4m3[256], g_e2m1[16], g_ue8m0[255];

static bool load_golden(void)
{
    FILE *f = fopen(t_data_path("fp8/codes.txt"), "r");
    if (!f) return false;
    char line[128], kind[16];
    unsigned code, bits;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%15s %x %x", kind, &code, &bits) != 3) continue;
        const float v = sparq_bits_f32(bits);
        if (!strcmp(kind, "e4m3") && code < 256) g_e4m3[code] = v, n++;
        else if (!strcmp(kind, "e2m1") && code < 16) g_e2m1[code] = v, n++;
        else if (!strcmp(kind, "ue8m0") && code < 255) g_ue8m0[code] = v, n++;
    }
    fclose(f);
    return n == 256 + 16 + 255;
}

static bool same_bits(float a, float b) { return sparq_f32_bits(a) == sparq_f32_bits(b); }

/* d rounded to fp32, ±inf past the largest float (as IEEE conversion does) */
static float to_f32(double d) { return fabs(d) > 0x1.fffffep127 ? (float)copysign(INFINITY, d) : (float)d; }
static bool is_e4m3_nan(unsigned c) { return (c & 0x7F) == 0x7F; }

static sq_linear fp8_linear(int out, int in, int br, int bc, const uint8_t *w, const uint8_t *s)
{
    return (sq_linear){.kind = SQ_LINEAR_FP8, .in = in, .out = out, .w = w, .name = "t", .scale = s,
                       .block_rows = br, .block_cols = bc};
}

static sq_linear fp4_linear(int out, int in, const uint8_t *w, const uint8_t *s)
{
    return (sq_linear){.kind = SQ_LINEAR_MXFP4, .in = in, .out = out, .w = w, .name = "t", .scale = s,
                       .block_rows = 1, .block_cols = 32};
}

/* y = l · e_col (one input row): y[o] is exactly weight [o, col]. */
static void one_hot(const sq_linear *l, int col, float *y)
{
    float *x = calloc((size_t)l->in, sizeof *x);
    x[col] = 1.0f;
    sq_linear_forward(ex, l, x, 1, y);
    free(x);
}

/* Every E4M3 code as a whole weight row ([256, 40], 1x32 blocks, scale 1):
 * column 5 sits in a SIMD chunk, column 35 in the scalar tail of the
 * partial second group. */
static void test_e4m3_codes(void)
{
    enum { O = 256, I = 40 };
    static uint8_t w[O * I], s[O * 2];
    for (int o = 0; o < O; o++) memset(w + o * I, o, I);
    memset(s, 127, sizeof s);
    const sq_linear l = fp8_linear(O, I, 1, 32, w, s);
    static float y[O], t[O * I];
    for (int scalar = 0; scalar < 2; scalar++) {
        sq_cpu_force_scalar(scalar);
        int bad = 0;
        for (int col = 5; col <= 35; col += 30) {
            one_hot(&l, col, y);
            for (int o = 0; o < O; o++)
                /* a sum's zero is +0 whatever the weight's sign */
                if (!is_e4m3_nan((unsigned)o) && !same_bits(y[o], g_e4m3[o]) && !(y[o] == 0 && g_e4m3[o] == 0)) {
                    if (bad++ < 4) fprintf(stderr, "  e4m3 0x%02x col %d: %a, golden %a\n", o, col, y[o], g_e4m3[o]);
                }
        }
        sq_cpu_block_to_f32(&l, 0, O, t);
        for (int o = 0; o < O; o++)
            for (int c = 0; c < I; c++)
                if (!is_e4m3_nan((unsigned)o) && !same_bits(t[o * I + c], g_e4m3[o])) bad++;
        CHECK_MSG(bad == 0, "scalar %d: %d E4M3 decodes differ from ml_dtypes", scalar, bad);
    }
    sq_cpu_force_scalar(false);
    int bad = 0;
    for (int c = 0; c < 256; c++)
        bad += is_e4m3_nan((unsigned)c) ? !isnan(sf_e4m3_to_f32((uint8_t)c)) || !isnan(g_e4m3[c])
                                        : !same_bits(sf_e4m3_to_f32((uint8_t)c), g_e4m3[c]);
    CHECK_MSG(bad == 0, "sf_e4m3_to_f32: %d codes differ", bad);
}

/* Every E2M1 code ([16, 64] MXFP4, both nibbles of every byte the same
 * code): columns 4 (low nibble) and 5 (high) in a SIMD group, 33 in the tail
 * of a 34-wide row's second group. */
static void test_e2m1_codes(void)
{
    for (int in = 64; in >= 34; in -= 30) {
        const int O = 16;
        uint8_t w[16 * 32], s[16 * 2];
        for (int o = 0; o < O; o++) memset(w + o * (in / 2), o | o << 4, (size_t)in / 2);
        memset(s, 127, sizeof s);
        const sq_linear l = fp4_linear(O, in, w, s);
        float y[16], t[16 * 64];
        for (int scalar = 0; scalar < 2; scalar++) {
            sq_cpu_force_scalar(scalar);
            int bad = 0;
            const int cols[] = {4, 5, 33};
            for (int k = 0; k < 3; k++) {
                one_hot(&l, cols[k], y);
                for (int o = 0; o < O; o++) bad += y[o] != g_e2m1[o]; /* == : -0 and +0 are one value */
            }
            sq_cpu_block_to_f32(&l, 0, O, t);
            for (int o = 0; o < O; o++)
                for (int c = 0; c < in; c++) bad += t[o * in + c] != g_e2m1[o];
            CHECK_MSG(bad == 0, "in %d scalar %d: %d E2M1 decodes differ from ml_dtypes", in, scalar, bad);
        }
    }
    sq_cpu_force_scalar(false);
    int bad = 0;
    for (int c = 0; c < 16; c++) bad += !same_bits(sf_e2m1_to_f32((uint8_t)c), g_e2m1[c]);
    CHECK_MSG(bad == 0, "sf_e2m1_to_f32: %d codes differ", bad);
}

/* l's row o has UE8M0 scale o and every weight `value`: through the GEMV (a
 * one-hot input at column `col`) and the tile, on both paths, the result must
 * be the exact product (a subnormal kept, an overflow inf). */
static void scale_sweep(const sq_linear *l, int col, float value, const char *what)
{
    enum { O = 255, I = 32 };
    static float y[O], t[O * I];
    for (int scalar = 0; scalar < 2; scalar++) {
        sq_cpu_force_scalar(scalar);
        one_hot(l, col, y);
        sq_cpu_block_to_f32(l, 0, O, t);
        int bad = 0;
        for (int o = 0; o < O; o++) {
            const float want = to_f32((double)value * (double)g_ue8m0[o]);
            if ((!same_bits(y[o], want) || !same_bits(t[o * I + 3], want)) && bad++ < 4)
                fprintf(stderr, "  %s, scale %d: gemv %a tile %a, want %a\n", what, o, y[o], t[o * I + 3], want);
        }
        CHECK_MSG(bad == 0, "%s scalar %d: %d of 255 UE8M0 scales wrong", what, scalar, bad);
    }
}

/* UE8M0 codes 0..254 against a few weight codes of each kind. */
static void test_ue8m0_codes(void)
{
    enum { O = 255, I = 32 };
    static uint8_t w[O * I], s[O], w4[O * I / 2];
    for (int o = 0; o < O; o++) s[o] = (uint8_t)o;
    char what[64];
    /* FP8 weights 1.0, 448 (max), 2^-9 (smallest subnormal), -1.5 */
    const uint8_t wcodes[] = {0x38, 0x7E, 0x01, 0xBC};
    for (int k = 0; k < 4; k++) {
        memset(w, wcodes[k], sizeof w);
        const sq_linear l = fp8_linear(O, I, 1, 32, w, s);
        snprintf(what, sizeof what, "FP8 weight 0x%02x", wcodes[k]);
        scale_sweep(&l, 7, g_e4m3[wcodes[k]], what);
    }
    /* MXFP4 weights 1.0 (0x2), 0.5 (0x1, the smallest), 6 (0x7, the largest), -3 (0xD) */
    const uint8_t ncodes[] = {0x2, 0x1, 0x7, 0xD};
    for (int k = 0; k < 4; k++) {
        memset(w4, ncodes[k] | ncodes[k] << 4, sizeof w4);
        const sq_linear l = fp4_linear(O, I, w4, s);
        snprintf(what, sizeof what, "MXFP4 weight 0x%x", ncodes[k]);
        scale_sweep(&l, 9, g_e2m1[ncodes[k]], what);
    }
    sq_cpu_force_scalar(false);
    int bad = 0;
    for (int c = 0; c < 255; c++) bad += !same_bits(sf_e8m0_to_f32((uint8_t)c), g_ue8m0[c]);
    CHECK_MSG(bad == 0, "sf_e8m0_to_f32: %d codes differ", bad);
    CHECK(sparq_f32_bits(g_ue8m0[0]) == 0x00400000u); /* 2^-127: the subnormal, not flushed */
}

static void test_codes(void)
{
    if (!load_golden()) {
        CHECK_MSG(false, "cannot read %s (tools/fixtures/make_fp8_golden.py makes it)", t_data_path("fp8/codes.txt"));
        return;
    }
    test_e4m3_codes();
    test_e2m1_codes();
    test_ue8m0_codes();
}

/* --- forward against the reference ----------------------------------------------------- */

/* Random codes of one kind: FP8 any non-NaN E4M3 code; scales 118..134
 * (weights within 2^-9 · 2^-9 .. 448 · 2^7). */
typedef struct qmat {
    sq_linear l;
    uint8_t *w, *s;
    float *ref; /* [out, in], dequantised by formats/safetensors.c */
    float *bias;
} qmat;

static void qmat_make(qmat *q, bool fp4, int out, int in, int br, int bc, bool bias)
{
    memset(q, 0, sizeof *q);
    const size_t wb = fp4 ? (size_t)out * in / 2 : (size_t)out * in;
    const int sr = (out + br - 1) / br, sc = (in + bc - 1) / bc;
    q->w = malloc(wb);
    q->s = malloc((size_t)sr * sc);
    q->ref = malloc((size_t)out * in * sizeof(float));
    for (size_t i = 0; i < wb; i++) {
        uint8_t c;
        do c = (uint8_t)rnd();
        while (!fp4 && is_e4m3_nan(c));
        q->w[i] = c;
    }
    for (int i = 0; i < sr * sc; i++) q->s[i] = (uint8_t)(118 + rnd() % 17);
    q->l = fp4 ? fp4_linear(out, in, q->w, q->s) : fp8_linear(out, in, br, bc, q->w, q->s);
    if (bias) {
        q->bias = malloc((size_t)out * sizeof(float));
        for (int o = 0; o < out; o++) q->bias[o] = urand();
        q->l.bias = q->bias;
    }
    /* the reference dequantiser is formats/'s, written independently of ops_fp8.c */
    sf_tensor tw = {.name = "w", .dtype = fp4 ? SF_U8 : SF_F8_E4M3, .ndim = 2,
                    .shape = {(uint64_t)out, fp4 ? (uint64_t)in / 2 : (uint64_t)in}, .data = q->w};
    sf_tensor ts = {.name = "w.scale", .dtype = SF_F8_E8M0, .ndim = 2, .shape = {(uint64_t)sr, (uint64_t)sc},
                    .data = q->s};
    tw.numel = tw.shape[0] * tw.shape[1], tw.nbytes = tw.numel;
    ts.numel = ts.shape[0] * ts.shape[1], ts.nbytes = ts.numel;
    const sparq_status st = fp4 ? sf_dequant_mxfp4(&tw, &ts, q->ref) : sf_dequant_fp8(&tw, &ts, br, bc, q->ref);
    CHECK_MSG(st == SPARQ_OK, "reference dequant: %s", sparq_errmsg());
}

static void qmat_free(qmat *q)
{
    free(q->w), free(q->s), free(q->ref), free(q->bias);
}

/* The forward at `rows` on both paths against decode-then-matmul in double. */
static void forward_case(bool fp4, int out, int in, int br, int bc, int rows, bool bias)
{
    qmat q;
    qmat_make(&q, fp4, out, in, br, bc, bias);
    float *x = malloc((size_t)rows * in * sizeof(float)), *y = malloc((size_t)rows * out * sizeof(float));
    double *ref = malloc((size_t)rows * out * sizeof(double));
    for (int i = 0; i < rows * in; i++) x[i] = urand();
    double mx = 0;
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double a = bias ? q.bias[o] : 0;
            for (int c = 0; c < in; c++) a += (double)x[(size_t)r * in + c] * q.ref[(size_t)o * in + c];
            ref[(size_t)r * out + o] = a;
            mx = fmax(mx, fabs(a));
        }
    float *t = malloc((size_t)out * in * sizeof(float));
    for (int scalar = 0; scalar < 2; scalar++) {
        sq_cpu_force_scalar(scalar);
        memset(y, 0xff, (size_t)rows * out * sizeof(float));
        sq_linear_forward(ex, &q.l, x, rows, y);
        double e = 0;
        for (int i = 0; i < rows * out; i++) e = fmax(e, fabs(y[i] - ref[i]));
        e = mx > 0 ? e / mx : e;
        CHECK_MSG(e < 4e-6, "%s %dx%d blocks %dx%d rows %d scalar %d: max rel diff %.3g",
                  sq_linear_kind_name(q.l.kind), out, in, q.l.block_rows, q.l.block_cols, rows, scalar, e);
        /* the GEMM's tile is exactly the reference's values */
        sq_cpu_block_to_f32(&q.l, 0, out, t);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)out * in; i++) bad += t[i] != q.ref[i];
        CHECK_MSG(bad == 0, "%s %dx%d scalar %d: %zu dequantised values differ", sq_linear_kind_name(q.l.kind), out,
                  in, scalar, bad);
    }
    sq_cpu_force_scalar(false);
    free(t), free(x), free(y), free(ref);
    qmat_free(&q);
}

static void test_forward(void)
{
    /* out, in, block rows, block cols: partial blocks in both dimensions, the
     * 128x128 of V3/V4, row groups (Engram-style 1x32), a block width that is
     * not a multiple of 16 (all scalar tails) */
    static const int fp8[][4] = {{37, 100, 32, 32}, {64, 256, 32, 32}, {130, 260, 128, 128}, {40, 200, 128, 128},
                                 {33, 70, 1, 32},   {50, 48, 16, 16},  {29, 45, 8, 24}};
    /* out, in (even): whole groups, a partial last group (66 = 2·32 + 2), 100 */
    static const int fp4[][2] = {{37, 64}, {20, 66}, {45, 100}, {8, 2}};
    const int rows[] = {1, 2, 3, 5, SQ_CPU_BLOCK_GEMV_MAX_ROWS, SQ_CPU_BLOCK_GEMV_MAX_ROWS + 1, 33};
    for (int r = 0; r < 7; r++) {
        for (size_t s = 0; s < sizeof fp8 / sizeof fp8[0]; s++)
            forward_case(false, fp8[s][0], fp8[s][1], fp8[s][2], fp8[s][3], rows[r], s == 1);
        for (size_t s = 0; s < sizeof fp4 / sizeof fp4[0]; s++)
            forward_case(true, fp4[s][0], fp4[s][1], 1, 32, rows[r], s == 2);
    }
    /* above SQ_CPU_SERIAL_MACS: the GEMV runs on the pool */
    CHECK(600 * 520 >= SQ_CPU_SERIAL_MACS);
    forward_case(false, 600, 520, 32, 32, 1, true);
    forward_case(true, 600, 520, 1, 32, 2, false);
}

/* The same numbers on 1 and 3 threads, GEMV and GEMM. */
static void test_threads(void)
{
    sq_exec *one = NULL;
    CHECK(sq_exec_create(&one, 1) == SPARQ_OK && sq_exec_reserve(one, sq_exec_scratch_floats(640, 0)) == SPARQ_OK);
    if (!one) return;
    for (int k = 0; k < 2; k++) {
        qmat q;
        qmat_make(&q, k == 1, 700, 640, k == 1 ? 1 : 32, 32, false);
        const int rows[] = {1, 8, 20};
        for (int i = 0; i < 3; i++) {
            float *x = malloc((size_t)rows[i] * 640 * 4), *a = malloc((size_t)rows[i] * 700 * 4),
                  *b = malloc((size_t)rows[i] * 700 * 4);
            for (int j = 0; j < rows[i] * 640; j++) x[j] = urand();
            sq_linear_forward(one, &q.l, x, rows[i], a);
            sq_linear_forward(ex, &q.l, x, rows[i], b);
            CHECK_MSG(!memcmp(a, b, (size_t)rows[i] * 700 * 4), "%s rows %d: 1 and 3 threads differ",
                      sq_linear_kind_name(q.l.kind), rows[i]);
            free(x), free(a), free(b);
        }
        qmat_free(&q);
    }
    sq_exec_free(one);
}

/* --- the NaN scan ---------------------------------------------------------------------- */

static void test_nan_scan(void)
{
    enum { N = 1000 };
    static uint8_t p[N];
    for (int scalar = 0; scalar < 2; scalar++) {
        sq_cpu_force_scalar(scalar);
        for (int i = 0; i < N; i++) p[i] = (uint8_t)(rnd() % 0x7F); /* 0x00..0x7E: no NaN */
        for (int i = 0; i < N; i += 7) p[i] |= 0x80;                /* negatives too */
        CHECK(sq_cpu_find_e4m3_nan(p, N) == N);
        CHECK(sq_cpu_find_e4m3_nan(p, 0) == 0);
        const size_t at[] = {0, 1, 127, 128, 500, 895, 896, 999};
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            for (int v = 0; v < 2; v++) {
                const uint8_t keep = p[at[k]];
                p[at[k]] = v ? 0xFF : 0x7F;
                CHECK_MSG(sq_cpu_find_e4m3_nan(p, N) == at[k], "scalar %d: NaN 0x%02X at %zu found at %zu", scalar,
                          p[at[k]], at[k], sq_cpu_find_e4m3_nan(p, N));
                CHECK(sq_cpu_find_e4m3_nan(p, at[k]) == at[k]); /* not inside the range */
                p[at[k]] = keep;
            }
        }
        /* the first of two */
        p[300] = 0xFF, p[200] = 0x7F;
        CHECK(sq_cpu_find_e4m3_nan(p, N) == 200);
        p[300] = p[200] = 0;
    }
    sq_cpu_force_scalar(false);
}

/* --- row views ------------------------------------------------------------------------- */

/* The view's outputs are the full linear's, bit for bit, at 3 input rows and
 * at 1 (where the GEMV takes weight rows four at a time: a row's result must
 * not depend on which rows it was grouped with). */
static void view_matches(const sq_linear *full, const sq_linear *v, int row0, int rows)
{
    float x[3 * 64], yf[3 * 200], yv[3 * 200];
    for (int i = 0; i < 3 * full->in; i++) x[i] = urand();
    for (int nr = 3; nr >= 1; nr -= 2) {
        sq_linear_forward(ex, full, x, nr, yf);
        sq_linear_forward(ex, v, x, nr, yv);
        int bad = 0;
        for (int r = 0; r < nr; r++)
            for (int o = 0; o < rows; o++) bad += yv[r * rows + o] != yf[r * full->out + row0 + o];
        CHECK_MSG(bad == 0, "%s view [%d, +%d), %d rows: %d outputs differ from the full linear's",
                  sq_linear_kind_name(full->kind), row0, rows, nr, bad);
    }
}

static void test_rows_view(void)
{
    qmat q;
    qmat_make(&q, false, 80, 64, 32, 32, true); /* row blocks [0,32) [32,64) [64,80) */
    sq_linear v;
    CHECK(sq_linear_rows_view(&q.l, 32, 32, &v) == SPARQ_OK && v.out == 32 && v.in == 64);
    CHECK(v.w == q.w + 32 * 64 && v.scale == q.s + 1 * 2 && v.bias == q.bias + 32);
    view_matches(&q.l, &v, 32, 32);
    CHECK(sq_linear_rows_view(&q.l, 64, 16, &v) == SPARQ_OK); /* the partial last block */
    view_matches(&q.l, &v, 64, 16);
    CHECK(sq_linear_rows_view(&q.l, 0, 64, &v) == SPARQ_OK);
    view_matches(&q.l, &v, 0, 64);
    CHECK(sq_linear_rows_view(&q.l, 16, 32, &v) == SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "32-row scale blocks");
    CHECK(sq_linear_rows_view(&q.l, 32, 16, &v) == SPARQ_E_ARG);
    CHECK(sq_linear_rows_view(&q.l, 64, 32, &v) == SPARQ_E_RANGE);
    CHECK(sq_linear_rows_view(&q.l, -32, 32, &v) == SPARQ_E_RANGE);
    CHECK(sq_linear_rows_view(&q.l, 0, 0, &v) == SPARQ_E_RANGE);
    CHECK_EQ_INT(sq_linear_stored_bytes(&q.l), 80 * 64 + 3 * 2);
    qmat_free(&q);

    qmat_make(&q, true, 40, 64, 1, 32, false); /* MXFP4: any rows */
    CHECK(sq_linear_rows_view(&q.l, 5, 7, &v) == SPARQ_OK && v.w == q.w + 5 * 32 && v.scale == q.s + 5 * 2);
    view_matches(&q.l, &v, 5, 7);
    CHECK_EQ_INT(sq_linear_stored_bytes(&q.l), 40 * 32 + 40 * 2);
    qmat_free(&q);

    /* dense bf16 with a bias: any rows */
    static uint16_t wb[30 * 64];
    static float b[30];
    for (int i = 0; i < 30 * 64; i++) wb[i] = sparq_f32_to_bf16(urand());
    for (int i = 0; i < 30; i++) b[i] = urand();
    const sq_linear d = {.kind = SQ_LINEAR_BF16, .in = 64, .out = 30, .w = wb, .bias = b, .name = "d"};
    CHECK(sq_linear_rows_view(&d, 3, 11, &v) == SPARQ_OK && v.w == wb + 3 * 64 && v.bias == b + 3);
    view_matches(&d, &v, 3, 11);
    CHECK_EQ_INT(sq_linear_stored_bytes(&d), 30 * 64 * 2);

    /* EXL3 (and any hooked linear): refused */
    const sq_linear e = {.kind = SQ_LINEAR_EXL3, .in = 64, .out = 64, .name = "layers.0.attn.wo_a"};
    CHECK(sq_linear_rows_view(&e, 0, 16, &v) == SPARQ_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(sparq_errmsg(), "layers.0.attn.wo_a");
    CHECK_EQ_INT(sq_linear_stored_bytes(&e), 0);
    sparq_err_clear();
}

static void test_names(void)
{
    CHECK(!strcmp(sq_linear_kind_name(SQ_LINEAR_FP8), "fp8"));
    CHECK(!strcmp(sq_linear_kind_name(SQ_LINEAR_MXFP4), "mxfp4"));
    CHECK(!strcmp(sq_linear_kind_name(SQ_LINEAR_EXL3), "exl3"));
}

int main(void)
{
    if (sq_exec_create(&ex, 3) != SPARQ_OK || sq_exec_reserve(ex, sq_exec_scratch_floats(640, 0)) != SPARQ_OK) {
        fprintf(stderr, "exec: %s\n", sparq_errmsg());
        return 1;
    }
    printf("code path: %s\n", sq_cpu_have_avx2() ? "avx2 and scalar" : "scalar");
    RUN(test_names);
    RUN(test_codes);
    RUN(test_forward);
    RUN(test_threads);
    RUN(test_nan_scan);
    RUN(test_rows_view);
    sq_exec_free(ex);
    return t_summary();
}
