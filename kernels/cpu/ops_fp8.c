/* kernels/cpu/ops_fp8.c — the CPU linear for block-scaled weights as
 * DeepSeek ships them, run in place from the mapped file: FP8 E4M3 with one
 * UE8M0 scale per block_rows × block_cols block (V4.1 32×32, V3/V4 128×128)
 * and MXFP4 (two E2M1 a byte, one UE8M0 scale per row and 32 columns).
 *
 * Decoding. Both kinds decode to an exact fp32 multiple of the true value and
 * fold the factor into the block scale, so no step meets an fp32 subnormal
 * unless the result is one:
 *  - E4M3 s.eeee.mmm, moved into fp16 as s.0eeee.mmm0000000, is the value ·
 *    2^-8 for normals and subnormals alike (fp16's exponent bias is 15, E4M3's
 *    7, and both have subnormals at exponent field 0); AVX2 does it with an
 *    unpack, a shift, a mask and F16C's vcvtph2ps, the scalar path with a
 *    256-entry table of the same values.
 *  - E2M1 · 2 is 0, 1, 2, 3, 4, 6, 8 or 12, whose fp16 has a zero low
 *    byte: pshufb on a 16-byte table of the high bytes, then vcvtph2ps.
 *  - The group's scale is then the power 2^(b - 127 + k) (k = 8 for E4M3,
 *    -1 for E2M1). Where it is a normal fp32 (every real checkpoint) the
 *    fast GEMV multiplies the decoded weights by it in registers, which gives
 *    exactly the fp32 weight sf_dequant_* gives; otherwise (FP8 codes
 *    247..254, MXFP4 0..1 and 253..254) the general path scales each group's
 *    partial sum by two normal powers, so UE8M0 0 (2^-127) is honoured, never
 *    flushed, and an fp32-overflowing weight does not turn a zero input into
 *    a NaN.
 * E4M3 NaN codes decode to ±480 here: the binder refuses them (and UE8M0
 * 255) before a linear can run, with sq_cpu_find_e4m3_nan.
 *
 * Work split, as for bf16 (ops.c): up to SQ_CPU_BLOCK_GEMV_MAX_ROWS rows a
 * GEMV — items of GEMV_BLOCK output rows on the pool, each weight row read
 * once, decoded 32 columns a step and used for every input row (the fast
 * path: groups a multiple of 32 wide, scales in range; the general path:
 * any group width, four input rows a pass); more rows go through ops.c's
 * GEMM, which calls sq_cpu_block_to_f32 for its fp32 tiles. The sums have a
 * fixed order for a given path, so results do not depend on the thread
 * count. Measured: docs/benchmarks-runtime.md "FP8 / MXFP4 GEMV". */
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_simd.h"

#define GEMV_BLOCK 16 /* output rows per pool item */

/* --- tables and scales ------------------------------------------------------- */

/* E4M3 code → value · 2^-8, exact (the code's e.m: e = 0 subnormal m/8·2^-6,
 * else (1 + m/8)·2^(e-7)). The NaN codes 0x7F/0xFF hold 480 · 2^-8. */
#define E4V(e, m) ((e) ? (8.0f + (float)(m)) * (float)(1u << (e)) * 0x1p-18f : (float)(m) * 0x1p-17f)
#define E4ROW(s, e) s E4V(e, 0), s E4V(e, 1), s E4V(e, 2), s E4V(e, 3), s E4V(e, 4), s E4V(e, 5), s E4V(e, 6), s E4V(e, 7)
#define E4HALF(s)                                                                                            \
    E4ROW(s, 0), E4ROW(s, 1), E4ROW(s, 2), E4ROW(s, 3), E4ROW(s, 4), E4ROW(s, 5), E4ROW(s, 6), E4ROW(s, 7),     \
        E4ROW(s, 8), E4ROW(s, 9), E4ROW(s, 10), E4ROW(s, 11), E4ROW(s, 12), E4ROW(s, 13), E4ROW(s, 14),         \
        E4ROW(s, 15)
static const float e4m3_lut[256] = {E4HALF(+), E4HALF(-)};

/* E2M1 nibble → value · 2 (code 8 is -0). */
static const float e2m1_lut[16] = {0, 1, 2, 3, 4, 6, 8, 12, -0.0f, -1, -2, -3, -4, -6, -8, -12};

/* 2^e for e in [-126, 127], built from its bits. */
static inline float pow2f(int e) { return sparq_bits_f32((uint32_t)(e + 127) << 23); }

/* The group scale for UE8M0 code b of a kind whose decoded values carry
 * 2^-k: p · 2^(b - 127 + k) = (p · *s0) · *s1 with both factors normal.
 * Returns whether s0 is needed (false: *s0 = 1). */
static inline bool scale_factors(uint8_t b, bool fp4, float *s0, float *s1)
{
    const int e = (int)b - 127 + (fp4 ? -1 : 8);
    if (e >= -126 && e <= 127) {
        *s0 = 1.0f, *s1 = pow2f(e);
        return false;
    }
    if (e > 127) *s0 = 0x1p127f, *s1 = pow2f(e - 127);
    else *s0 = 0x1p-126f, *s1 = pow2f(e + 126);
    return true;
}

static inline float scale_apply(float p, uint8_t b, bool fp4)
{
    float s0, s1;
    return scale_factors(b, fp4, &s0, &s1) ? (p * s0) * s1 : p * s1;
}

/* Decoded weight c of a row (scaled as the tables are). */
static inline float dec1(const uint8_t *w, size_t c, bool fp4)
{
    return fp4 ? e2m1_lut[(w[c / 2] >> ((c & 1) * 4)) & 15] : e4m3_lut[w[c]];
}

/* --- scalar kernels -------------------------------------------------------------- */

/* out[r] = row · x_r for nr input rows (stride in): per group of G columns a
 * partial sum, scaled into the accumulator. */
static void rows_scalar(const float *x, size_t in, int nr, const uint8_t *w, const uint8_t *srow, size_t G, bool fp4,
                        float *out)
{
    for (int r = 0; r < nr; r++) {
        const float *xr = x + (size_t)r * in;
        float acc = 0;
        for (size_t c0 = 0, g = 0; c0 < in; c0 += G, g++) {
            const size_t c1 = c0 + G < in ? c0 + G : in;
            float p = 0;
            for (size_t c = c0; c < c1; c++) p += xr[c] * dec1(w, c, fp4);
            acc += scale_apply(p, srow[g], fp4);
        }
        out[r] = acc;
    }
}

static void to_f32_scalar(const uint8_t *w, const uint8_t *srow, size_t in, size_t G, bool fp4, float *out)
{
    for (size_t c0 = 0, g = 0; c0 < in; c0 += G, g++) {
        const size_t c1 = c0 + G < in ? c0 + G : in;
        for (size_t c = c0; c < c1; c++) out[c] = scale_apply(dec1(w, c, fp4), srow[g], fp4);
    }
}

/* --- AVX2 kernels ------------------------------------------------------------------ */

#if SQ_X86
#define SQ_INLINE __attribute__((always_inline)) inline

/* 16 E4M3 codes → two vectors of value · 2^-8: the byte as the high half of a
 * 16-bit lane (s.eeee.mmm.00000000), an arithmetic shift right by one and the
 * copied sign bit cleared gives fp16 s.0eeee.mmm0000000. */
SQ_AVX2 static SQ_INLINE void e4m3x16(const uint8_t *p, __m256 *a, __m256 *b)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p), z = _mm_setzero_si128();
    const __m128i m = _mm_set1_epi16((short)0xBFFF);
    *a = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(z, v), 1), m));
    *b = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(_mm_unpackhi_epi8(z, v), 1), m));
}

/* 32 E4M3 codes → four vectors of value · 2^-8, as e4m3x16 twice but on
 * 256-bit integer lanes: one load, two unpacks (in-lane, so the halves come
 * out as columns 0-7 / 16-23 and 8-15 / 24-31), two shifts, two masks. */
SQ_AVX2 static SQ_INLINE void e4m3x32(const uint8_t *p, __m256 v[4])
{
    const __m256i b = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    const __m256i m = _mm256_set1_epi16((short)0xBFFF);
    const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 1), m);
    const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 1), m);
    v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
    v[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
    v[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
    v[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
}

/* 16 bytes of E2M1 pairs → 32 values · 2 in column order (low nibble first):
 * pshufb maps each nibble to the high byte of its fp16 (0x00, 0x3C, 0x40,
 * 0x42, 0x44, 0x46, 0x48, 0x4A for 0, 1, 2, 3, 4, 6, 8, 12; 0x80 set for the
 * negatives, so -0 stays -0), unpacks interleave the nibbles into columns and
 * put a zero low byte under each, and F16C widens. */
SQ_AVX2 static SQ_INLINE void e2m1x32(const uint8_t *p, __m256 v[4])
{
    const __m128i lut = _mm_setr_epi8(0x00, 0x3C, 0x40, 0x42, 0x44, 0x46, 0x48, 0x4A, (char)0x80, (char)0xBC,
                                      (char)0xC0, (char)0xC2, (char)0xC4, (char)0xC6, (char)0xC8, (char)0xCA);
    const __m128i m = _mm_set1_epi8(0x0F), b = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m));
    /* high bytes of columns 0-15 | 16-31 */
    const __m256i t = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    const __m256i z = _mm256_setzero_si256();
    const __m256i h0 = _mm256_unpacklo_epi8(z, t), h1 = _mm256_unpackhi_epi8(z, t); /* 0-7|16-23, 8-15|24-31 */
    v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h0));
    v[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(h1));
    v[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(h0, 1));
    v[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(h1, 1));
}

/* rows_scalar for NR ≤ 4 rows (a constant once inlined, so the accumulators
 * live in registers): per group two partial vectors per row, summed, scaled
 * and added to the row's accumulator; the columns of a group past the last
 * full 16 (FP8) / 32 (MXFP4) in a scalar tail with its own scale. */
SQ_AVX2 static SQ_INLINE void rows_avx2_n(const float *x, size_t in, const int NR, const uint8_t *w,
                                          const uint8_t *srow, size_t G, const bool fp4, float *out)
{
    __m256 acc[4];
    float tacc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps(), tacc[r] = 0;
    for (size_t c0 = 0, g = 0; c0 < in; c0 += G, g++) {
        const size_t c1 = c0 + G < in ? c0 + G : in;
        __m256 p0[4], p1[4];
        float t[4];
        for (int r = 0; r < NR; r++) p0[r] = p1[r] = _mm256_setzero_ps(), t[r] = 0;
        size_t c = c0;
        if (fp4) {
            for (; c + 32 <= c1; c += 32) {
                __m256 v[4];
                e2m1x32(w + c / 2, v);
                for (int r = 0; r < NR; r++) {
                    const float *xr = x + (size_t)r * in + c;
                    p0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), v[0], p0[r]);
                    p1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), v[1], p1[r]);
                    p0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), v[2], p0[r]);
                    p1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), v[3], p1[r]);
                }
            }
        } else {
            for (; c + 16 <= c1; c += 16) {
                __m256 v0, v1;
                e4m3x16(w + c, &v0, &v1);
                for (int r = 0; r < NR; r++) {
                    const float *xr = x + (size_t)r * in + c;
                    p0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), v0, p0[r]);
                    p1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), v1, p1[r]);
                }
            }
        }
        for (; c < c1; c++) {
            const float v = dec1(w, c, fp4);
            for (int r = 0; r < NR; r++) t[r] += x[(size_t)r * in + c] * v;
        }
        float s0, s1;
        const bool two = scale_factors(srow[g], fp4, &s0, &s1);
        const __m256 vs1 = _mm256_set1_ps(s1);
        if (__builtin_expect(!two, 1)) {
            for (int r = 0; r < NR; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_add_ps(p0[r], p1[r]), vs1, acc[r]);
                tacc[r] += t[r] * s1;
            }
        } else {
            const __m256 vs0 = _mm256_set1_ps(s0);
            for (int r = 0; r < NR; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_add_ps(p0[r], p1[r]), vs0), vs1, acc[r]);
                tacc[r] += (t[r] * s0) * s1;
            }
        }
    }
    for (int r = 0; r < NR; r++) out[r] = sq_hsum256(acc[r]) + tacc[r];
}

#define ROWS_AVX2(name, NR, FP4)                                                                         \
    SQ_AVX2 static void name(const float *x, size_t in, const uint8_t *w, const uint8_t *srow, size_t G,   \
                             float *out)                                                                  \
    {                                                                                                     \
        rows_avx2_n(x, in, NR, w, srow, G, FP4, out);                                                     \
    }
ROWS_AVX2(rows_fp8_1, 1, false)
ROWS_AVX2(rows_fp8_2, 2, false)
ROWS_AVX2(rows_fp8_3, 3, false)
ROWS_AVX2(rows_fp8_4, 4, false)
ROWS_AVX2(rows_fp4_1, 1, true)
ROWS_AVX2(rows_fp4_2, 2, true)
ROWS_AVX2(rows_fp4_3, 3, true)
ROWS_AVX2(rows_fp4_4, 4, true)

typedef void (*rows_fn)(const float *x, size_t in, const uint8_t *w, const uint8_t *srow, size_t G, float *out);
static const rows_fn rows_avx2_tab[2][4] = {{rows_fp8_1, rows_fp8_2, rows_fp8_3, rows_fp8_4},
                                            {rows_fp4_1, rows_fp4_2, rows_fp4_3, rows_fp4_4}};

/* Any nr: four input rows at a time (the weight row is decoded again for
 * each four; it is in L1 by then). */
static void rows_avx2(const float *x, size_t in, int nr, const uint8_t *w, const uint8_t *srow, size_t G, bool fp4,
                      float *out)
{
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const int n = nr - r0 < 4 ? nr - r0 : 4;
        rows_avx2_tab[fp4][n - 1](x + (size_t)r0 * in, in, w, srow, G, out + r0);
    }
}

/* The fast path. When every group scale of a row is a single normal power
 * of two (FP8 codes ≤ 246, MXFP4 codes 2..252: all but absurd checkpoints)
 * and groups are a multiple of 32 columns wide, the decoded weights are
 * multiplied by their group's scale in registers — the exact fp32 weight, as
 * sf_dequant_* gives it — and accumulated with no per-group partial sums, 32
 * columns a step. Accumulators: 4 a row for 2 rows, 2 for 3-4, 1 for 5-8
 * (≤ 8 registers). One input row (decode) goes four weight rows at a time
 * through fast4_1 instead, one accumulator each, which this kernel's NR = 1
 * matches sum for sum (so a row's result does not depend on its neighbours). */
#define SF_MAX 1024 /* groups a row may have on this path (V4.1: ≤ 256) */
/* Software prefetch distance, bytes ahead in a weight row (past its end: the
 * rows that follow). The kernels spend ~20 instructions on 32 weights, so the
 * out-of-order window alone covers too few cache lines to keep DRAM busy: a
 * cold single-thread GEMV ran at ~6 G weights/s without (FP8 [32768, 1280]),
 * 9.6 with 2 KiB (1 KiB: 8.7, 4 KiB: 7.9), i.e. as fast as from L3. */
#define PF_BYTES 2048

/* sf[g] = 2^(b_g - 127 + k) for the ng codes of srow; false when one needs
 * two factors or would make a weight overflow fp32 (MXFP4 ±6 at codes 253,
 * 254: the group path then keeps a zero input's contribution zero). */
static bool row_scales(const uint8_t *srow, size_t ng, bool fp4, float *sf)
{
    const int add = fp4 ? -1 : 8, emax = fp4 ? 251 : 254; /* the fp32 exponent field is b + add */
    int bad = 0;
    for (size_t g = 0; g < ng; g++) {
        const int e = (int)srow[g] + add;
        bad |= e < 1 || e > emax;
        sf[g] = sparq_bits_f32((uint32_t)(e & 0xFF) << 23);
    }
    return !bad;
}

/* 32 weights from column c as 4 vectors, scaled by vs. */
SQ_AVX2 static SQ_INLINE void dec32_scaled(const uint8_t *w, size_t c, const bool fp4, __m256 vs, __m256 v[4])
{
    if (fp4) {
        e2m1x32(w + c / 2, v);
    } else {
        e4m3x32(w + c, v);
    }
    for (int q = 0; q < 4; q++) v[q] = _mm256_mul_ps(v[q], vs);
}

SQ_AVX2 static SQ_INLINE void rows_fast_n(const float *x, size_t in, const int NR, const uint8_t *w, const float *sf,
                                          size_t G, const bool fp4, float *out)
{
    const int NA = NR == 1 ? 1 : NR == 2 ? 4 : NR <= 4 ? 2 : 1; /* accumulators a row */
    const size_t ng = in / G, per = G / 32;
    __m256 acc[8][4];
    for (int r = 0; r < NR; r++)
        for (int a = 0; a < NA; a++) acc[r][a] = _mm256_setzero_ps();
    size_t c = 0;
    for (size_t g = 0; g < ng; g++) {
        const __m256 vs = _mm256_broadcast_ss(sf + g);
        for (size_t k = 0; k < per; k++, c += 32) {
            __m256 v[4];
            _mm_prefetch((const char *)w + (fp4 ? c / 2 : c) + PF_BYTES, _MM_HINT_T0); /* the next rows follow */
            dec32_scaled(w, c, fp4, vs, v);
            for (int q = 0; q < 4; q++)
                for (int r = 0; r < NR; r++)
                    acc[r][q % NA] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)r * in + c + 8 * q), v[q], acc[r][q % NA]);
        }
    }
    float t[8] = {0};
    if (c < in) { /* the partial last group: whole steps, then single columns */
        const __m256 vs = _mm256_broadcast_ss(sf + ng);
        for (; c + 32 <= in; c += 32) {
            __m256 v[4];
            dec32_scaled(w, c, fp4, vs, v);
            for (int q = 0; q < 4; q++)
                for (int r = 0; r < NR; r++)
                    acc[r][q % NA] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (size_t)r * in + c + 8 * q), v[q], acc[r][q % NA]);
        }
        for (; c < in; c++) {
            const float v = dec1(w, c, fp4) * sf[ng];
            for (int r = 0; r < NR; r++) t[r] += x[(size_t)r * in + c] * v;
        }
    }
    for (int r = 0; r < NR; r++) {
        __m256 a = acc[r][0];
        for (int k = 1; k < NA; k++) a = _mm256_add_ps(a, acc[r][k]);
        out[r] = sq_hsum256(a) + t[r];
    }
}

#define ROWS_FAST(name, NR, FP4)                                                                           \
    SQ_AVX2 static void name(const float *x, size_t in, const uint8_t *w, const float *sf, size_t G, float *out) \
    {                                                                                                       \
        rows_fast_n(x, in, NR, w, sf, G, FP4, out);                                                         \
    }
ROWS_FAST(fast_fp8_1, 1, false)
ROWS_FAST(fast_fp8_2, 2, false)
ROWS_FAST(fast_fp8_3, 3, false)
ROWS_FAST(fast_fp8_4, 4, false)
ROWS_FAST(fast_fp8_5, 5, false)
ROWS_FAST(fast_fp8_6, 6, false)
ROWS_FAST(fast_fp8_7, 7, false)
ROWS_FAST(fast_fp8_8, 8, false)
ROWS_FAST(fast_fp4_1, 1, true)
ROWS_FAST(fast_fp4_2, 2, true)
ROWS_FAST(fast_fp4_3, 3, true)
ROWS_FAST(fast_fp4_4, 4, true)
ROWS_FAST(fast_fp4_5, 5, true)
ROWS_FAST(fast_fp4_6, 6, true)
ROWS_FAST(fast_fp4_7, 7, true)
ROWS_FAST(fast_fp4_8, 8, true)

/* One input row against four weight rows (ldw bytes apart), each with its own
 * group scales: four streams from memory in flight and x loaded once for the
 * four (ops.c's dot4_bf16_avx2 does the same for bf16, for the same reason:
 * a decode GEMV must keep the memory busy). */
SQ_AVX2 static SQ_INLINE void fast4_1(const float *x, size_t in, const uint8_t *w, size_t ldw,
                                      const float *const sf[4], size_t G, const bool fp4, float out[4])
{
    const size_t ng = in / G, per = G / 32;
    __m256 acc[4];
    for (int o = 0; o < 4; o++) acc[o] = _mm256_setzero_ps();
    size_t c = 0;
    for (size_t g = 0; g <= ng; g++) { /* g = ng: the partial last group's whole steps */
        const size_t steps = g < ng ? per : (in - c) / 32;
        for (size_t k = 0; k < steps; k++, c += 32) {
            __m256 xs[4];
            for (int q = 0; q < 4; q++) xs[q] = _mm256_loadu_ps(x + c + 8 * q);
            /* this row's bytes PF_BYTES ahead: past its end, the same row of the next four */
            size_t pf = (fp4 ? c / 2 : c) + PF_BYTES;
            if (pf >= ldw) pf += 3 * ldw;
            for (int o = 0; o < 4; o++) {
                __m256 v[4];
                _mm_prefetch((const char *)w + o * ldw + pf, _MM_HINT_T0);
                dec32_scaled(w + o * ldw, c, fp4, _mm256_broadcast_ss(sf[o] + g), v);
                for (int q = 0; q < 4; q++) acc[o] = _mm256_fmadd_ps(xs[q], v[q], acc[o]);
            }
        }
    }
    for (int o = 0; o < 4; o++) {
        float t = 0;
        for (size_t cc = c; cc < in; cc++) t += x[cc] * (dec1(w + o * ldw, cc, fp4) * sf[o][ng]);
        out[o] = sq_hsum256(acc[o]) + t;
    }
}

SQ_AVX2 static void fast4_fp8(const float *x, size_t in, const uint8_t *w, size_t ldw, const float *const sf[4],
                              size_t G, float out[4])
{
    fast4_1(x, in, w, ldw, sf, G, false, out);
}

SQ_AVX2 static void fast4_fp4(const float *x, size_t in, const uint8_t *w, size_t ldw, const float *const sf[4],
                              size_t G, float out[4])
{
    fast4_1(x, in, w, ldw, sf, G, true, out);
}

typedef void (*fast_fn)(const float *x, size_t in, const uint8_t *w, const float *sf, size_t G, float *out);
static const fast_fn fast_tab[2][8] = {
    {fast_fp8_1, fast_fp8_2, fast_fp8_3, fast_fp8_4, fast_fp8_5, fast_fp8_6, fast_fp8_7, fast_fp8_8},
    {fast_fp4_1, fast_fp4_2, fast_fp4_3, fast_fp4_4, fast_fp4_5, fast_fp4_6, fast_fp4_7, fast_fp4_8}};

SQ_AVX2 static void to_f32_avx2(const uint8_t *w, const uint8_t *srow, size_t in, size_t G, bool fp4, float *out)
{
    for (size_t c0 = 0, g = 0; c0 < in; c0 += G, g++) {
        const size_t c1 = c0 + G < in ? c0 + G : in;
        float s0, s1;
        const bool two = scale_factors(srow[g], fp4, &s0, &s1);
        const __m256 vs0 = _mm256_set1_ps(s0), vs1 = _mm256_set1_ps(s1);
        size_t c = c0;
        if (fp4) {
            for (; c + 32 <= c1; c += 32) {
                __m256 v[4];
                e2m1x32(w + c / 2, v);
                for (int q = 0; q < 4; q++)
                    _mm256_storeu_ps(out + c + 8 * q, _mm256_mul_ps(two ? _mm256_mul_ps(v[q], vs0) : v[q], vs1));
            }
        } else {
            for (; c + 16 <= c1; c += 16) {
                __m256 v[2];
                e4m3x16(w + c, &v[0], &v[1]);
                for (int q = 0; q < 2; q++)
                    _mm256_storeu_ps(out + c + 8 * q, _mm256_mul_ps(two ? _mm256_mul_ps(v[q], vs0) : v[q], vs1));
            }
        }
        for (; c < c1; c++) out[c] = scale_apply(dec1(w, c, fp4), srow[g], fp4);
    }
}

/* First index i ≥ 0 with (p[i] | 0x80) == 0xFF, 128 bytes a step; returns
 * the start of the first step holding one, or the last whole step's end. */
SQ_AVX2 static size_t nan_steps_avx2(const uint8_t *p, size_t n)
{
    const __m256i hi = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8((char)0xFF);
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256((const __m256i *)(p + i)), hi), ones);
        __m256i b = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256((const __m256i *)(p + i + 32)), hi), ones);
        __m256i c = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256((const __m256i *)(p + i + 64)), hi), ones);
        __m256i d = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256((const __m256i *)(p + i + 96)), hi), ones);
        const __m256i any = _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d));
        if (!_mm256_testz_si256(any, any)) break;
    }
    return i;
}
#endif

/* --- dispatch ---------------------------------------------------------------------- */

static inline bool is_fp4(const sq_linear *l) { return l->kind == SQ_LINEAR_MXFP4; }

/* Bytes of a stored weight row and columns of the scale grid. */
static inline size_t row_bytes(const sq_linear *l) { return is_fp4(l) ? (size_t)l->in / 2 : (size_t)l->in; }
static inline size_t scale_cols(const sq_linear *l)
{
    return ((size_t)l->in + (size_t)l->block_cols - 1) / (size_t)l->block_cols;
}

static inline const uint8_t *scale_row(const sq_linear *l, size_t o)
{
    return l->scale + (o / (size_t)l->block_rows) * scale_cols(l);
}

void sq_cpu_block_to_f32(const sq_linear *l, int row0, int rows, float *out)
{
    const size_t in = (size_t)l->in, G = (size_t)l->block_cols;
    const bool fp4 = is_fp4(l);
#if SQ_X86
    const bool simd = sq_cpu_use_avx2();
#endif
    for (size_t o = (size_t)row0; o < (size_t)row0 + (size_t)rows; o++) {
        const uint8_t *w = (const uint8_t *)l->w + o * row_bytes(l);
        float *orow = out + (o - (size_t)row0) * in;
#if SQ_X86
        if (simd) {
            to_f32_avx2(w, scale_row(l, o), in, G, fp4, orow);
            continue;
        }
#endif
        to_f32_scalar(w, scale_row(l, o), in, G, fp4, orow);
    }
}

typedef struct {
    const sq_linear *l;
    const float *x;
    int rows;
    float *y;
    bool simd;
} gemv_job;

static void gemv_item(void *ctx, size_t item, int tid)
{
    (void)tid;
    const gemv_job *j = ctx;
    const sq_linear *l = j->l;
    const size_t in = (size_t)l->in, out = (size_t)l->out, G = (size_t)l->block_cols;
    const size_t o0 = item * GEMV_BLOCK, o1 = o0 + GEMV_BLOCK < out ? o0 + GEMV_BLOCK : out;
    const bool fp4 = is_fp4(l);
    float d[SQ_CPU_BLOCK_GEMV_MAX_ROWS];
    size_t o = o0;
#if SQ_X86
    /* the fast path's group scales, made again only when a scale row changes
     * (FP8: once a row block; MXFP4: every row) */
    const size_t ng = scale_cols(l);
    const bool fast = j->simd && ng <= SF_MAX && G % 32 == 0;
    float sf4[4][SF_MAX];
    const uint8_t *sf_of[4] = {NULL, NULL, NULL, NULL};
    bool sf_ok[4] = {false, false, false, false};
    /* one input row: four weight rows at a time */
    for (; fast && j->rows == 1 && o + 4 <= o1; o += 4) {
        const float *sfp[4];
        bool ok = true;
        for (int k = 0; k < 4; k++) {
            const uint8_t *sk = scale_row(l, o + (size_t)k);
            int from = k; /* a row sharing the scale row of an earlier one shares its floats */
            for (int q = 0; q < k; q++)
                if (sf_of[q] == sk) from = q;
            if (from == k && sf_of[k] != sk) sf_ok[k] = row_scales(sk, ng, fp4, sf4[k]), sf_of[k] = sk;
            ok &= sf_ok[from];
            sfp[k] = sf4[from];
        }
        if (!ok) break; /* the rest row by row */
        (fp4 ? fast4_fp4 : fast4_fp8)(j->x, in, (const uint8_t *)l->w + o * row_bytes(l), row_bytes(l), sfp, G, d);
        for (int k = 0; k < 4; k++) j->y[o + (size_t)k] = d[k] + (l->bias ? l->bias[o + (size_t)k] : 0.0f);
    }
    float *sf = sf4[0];
    sf_of[0] = NULL;
    bool ok0 = false;
#endif
    for (; o < o1; o++) {
        const uint8_t *w = (const uint8_t *)l->w + o * row_bytes(l), *s = scale_row(l, o);
#if SQ_X86
        if (fast && s != sf_of[0]) ok0 = row_scales(s, ng, fp4, sf), sf_of[0] = s;
        if (fast && ok0) fast_tab[fp4][j->rows - 1](j->x, in, w, sf, G, d);
        else if (j->simd) rows_avx2(j->x, in, j->rows, w, s, G, fp4, d);
        else
#endif
            rows_scalar(j->x, in, j->rows, w, s, G, fp4, d);
        for (int r = 0; r < j->rows; r++) j->y[(size_t)r * out + o] = d[r] + (l->bias ? l->bias[o] : 0.0f);
    }
}

void sq_cpu_block_gemv(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    /* more rows than the kernels hold (a direct caller): in runs of the most they do */
    for (int r0 = 0; r0 < rows; r0 += SQ_CPU_BLOCK_GEMV_MAX_ROWS) {
        const int n = rows - r0 < SQ_CPU_BLOCK_GEMV_MAX_ROWS ? rows - r0 : SQ_CPU_BLOCK_GEMV_MAX_ROWS;
        const gemv_job j = {l, x + (size_t)r0 * (size_t)l->in, n, y + (size_t)r0 * (size_t)l->out, sq_cpu_use_avx2()};
        const size_t items = ((size_t)l->out + GEMV_BLOCK - 1) / GEMV_BLOCK;
        /* a small GEMV costs less than waking the pool (ops.c) */
        if ((size_t)n * (size_t)l->in * (size_t)l->out < SQ_CPU_SERIAL_MACS) {
            for (size_t i = 0; i < items; i++) gemv_item((void *)&j, i, 0);
            continue;
        }
        sparq_pool_for(ex->pool, items, gemv_item, (void *)&j);
    }
}

/* --- code checks --------------------------------------------------------------------- */

size_t sq_cpu_find_e4m3_nan(const uint8_t *p, size_t n)
{
    size_t i = 0;
#if SQ_X86
    if (sq_cpu_use_avx2()) i = nan_steps_avx2(p, n);
#endif
    /* the rest in steps of 256 (a loop the compiler vectorises), then the
     * step that holds one byte by byte */
    while (i < n) {
        const size_t e = n - i < 256 ? n : i + 256;
        unsigned bad = 0;
        for (size_t k = i; k < e; k++) bad |= (p[k] | 0x80u) == 0xFFu;
        if (bad) break;
        i = e;
    }
    for (; i < n; i++)
        if ((p[i] | 0x80u) == 0xFFu) return i;
    return n;
}

sparq_status sq_cpu_linear_block_check(const sq_linear *l, const char *w_name, const char *s_name)
{
    const bool fp4 = is_fp4(l);
    RETURN_IF(l->kind != SQ_LINEAR_FP8 && !fp4, SPARQ_E_ARG, "tensor '%s': %s is not a block-scaled kind", w_name,
              sq_linear_kind_name(l->kind));
    RETURN_IF(!l->w || !l->scale || l->in < 1 || l->out < 1, SPARQ_E_ARG, "tensor '%s': empty %s linear", w_name,
              sq_linear_kind_name(l->kind));
    RETURN_IF(l->block_rows < 1 || l->block_cols < 1, SPARQ_E_SHAPE, "tensor '%s': scale block %dx%d", w_name,
              l->block_rows, l->block_cols);
    RETURN_IF(fp4 && (l->block_rows != 1 || l->block_cols != 32 || l->in % 2), SPARQ_E_SHAPE,
              "tensor '%s': MXFP4 needs an even row length (%d) and 1x32 scale groups (%dx%d)", w_name, l->in,
              l->block_rows, l->block_cols);
    const size_t scols = scale_cols(l);
    const size_t ns = ((size_t)l->out + (size_t)l->block_rows - 1) / (size_t)l->block_rows * scols;
    const uint8_t *bad = memchr(l->scale, 0xFF, ns);
    RETURN_IF(bad, SPARQ_E_FORMAT, "tensor '%s': element [%zu, %zu] is the UE8M0 code 255 (NaN), which no weight of %s can use",
              s_name, (size_t)(bad - l->scale) / scols, (size_t)(bad - l->scale) % scols, w_name);
    if (!fp4) {
        const size_t n = (size_t)l->out * (size_t)l->in;
        const uint8_t *w = l->w;
        const size_t i = sq_cpu_find_e4m3_nan(w, n);
        RETURN_IF(i < n, SPARQ_E_FORMAT, "tensor '%s': element [%zu, %zu] is the E4M3 NaN code 0x%02X", w_name,
                  i / (size_t)l->in, i % (size_t)l->in, w[i]);
    }
    return SPARQ_OK;
}
