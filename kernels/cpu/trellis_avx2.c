/* kernels/cpu/trellis_avx2.c — the trellis codec's AVX2 path (x86-64 builds
 * compile this file; its functions carry target("avx2,fma,f16c") so the rest
 * of the library stays baseline x86-64, and it is used only when CPUID says
 * the CPU has all three).
 *
 * The GEMM gives each of the 8 SIMD lanes one 32-position segment of a tile
 * (trellis_impl.h): the segments' ring words are gathered once per tile,
 * transposed, and then every step's 8 states come out of two immediate
 * shifts, so batch 1 costs about a dozen vector ops per 8 weights and needs a
 * single broadcast input element per step. Codebook values are computed, not
 * looked up: mul1 is a vpmulld, a byte sum by vpmaddubsw + vpmaddwd and an
 * exact fp32 fma, rounded through
 * fp16 with F16C exactly as the GPU's __hfma rounds; 3inst/mcg convert the two
 * masked fp16 halves with integer ops and round their exact sum. */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/trellis_impl.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline)) TARGET

AI __m256 round_f16(__m256 r)
{
    return _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* Two normal fp16 values packed in x (as the lop3 mask guarantees) to fp32,
 * summed exactly and rounded once to fp16. */
AI __m256 lop_halves_sum8(__m256i x)
{
    x = _mm256_xor_si256(_mm256_and_si256(x, _mm256_set1_epi32((int)TRELLIS_LOP_MASK)),
                         _mm256_set1_epi32((int)TRELLIS_LOP_XOR));
    const __m256i bias = _mm256_set1_epi32(0x38000000);
    const __m256i mag = _mm256_set1_epi32(0x7FFF << 13);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(x, 16), sign),
                                       _mm256_add_epi32(_mm256_and_si256(_mm256_slli_epi32(x, 13), mag), bias));
    const __m256i hi = _mm256_or_si256(_mm256_and_si256(x, sign),
                                       _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(x, 3), mag), bias));
    return round_f16(_mm256_add_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)));
}

AI __m256 values8(__m256i s, trellis_codebook cb)
{
    if (cb == TRELLIS_CB_MUL1) {
        const __m256i x = _mm256_mullo_epi32(s, _mm256_set1_epi32((int)TRELLIS_MUL1_MUL));
        const __m256i pairs = _mm256_maddubs_epi16(x, _mm256_set1_epi8(1));
        const __m256i b = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        /* b·scale + (bias + 1024·scale): every term and the result are
         * multiples of 2^-18 below 2^4, so this is exactly (1024+b)·scale + bias */
        const float scale = sparq_f16_to_f32(TRELLIS_MUL1_SCALE_F16);
        const float bias = sparq_f16_to_f32(TRELLIS_MUL1_BIAS_F16) + 1024.0f * scale;
        const __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_set1_ps(scale), _mm256_set1_ps(bias));
        return round_f16(r);
    }
    if (cb == TRELLIS_CB_MCG)
        return lop_halves_sum8(_mm256_mullo_epi32(s, _mm256_set1_epi32((int)TRELLIS_MCG_MUL)));
    return lop_halves_sum8(_mm256_add_epi32(_mm256_mullo_epi32(s, _mm256_set1_epi32((int)TRELLIS_3INST_MUL)),
                                            _mm256_set1_epi32((int)TRELLIS_3INST_ADD)));
}

/* --- GEMM: one SIMD lane per tile segment (see trellis_impl.h) ----------- */

/* The ring words of every segment, transposed: w[c + 1] lane j = ring word
 * K·j + c (c = −1 .. K−1; word −1 of segment 0 wraps to the last one). For
 * K ≤ 4 the tile is K registers, and each w is one vpermd per register it
 * draws from, blended: an 8-lane gather costs more than that on recent
 * cores. K ≥ 5 gathers. */
AI void segment_words(const uint16_t *tile, const int K, __m256i *w)
{
    const int nw = 8 * K;
    if (K <= 4) {
        __m256i src[4];
        for (int i = 0; i < K; i++) src[i] = _mm256_loadu_si256((const __m256i *)(const void *)tile + i);
        for (int c = -1; c < K; c++) {
#define WD(j) ((K * (j) + c + nw) % nw)
#define IN(j, i) (-(WD(j) / 8 == (i)))
            __m256i r = _mm256_setzero_si256();
            for (int i = 0; i < K; i++) {
                const __m256i p = _mm256_permutevar8x32_epi32(
                    src[i], _mm256_setr_epi32(WD(0) & 7, WD(1) & 7, WD(2) & 7, WD(3) & 7, WD(4) & 7, WD(5) & 7,
                                              WD(6) & 7, WD(7) & 7));
                r = i == 0 ? p
                           : _mm256_blendv_epi8(r, p,
                                                _mm256_setr_epi32(IN(0, i), IN(1, i), IN(2, i), IN(3, i), IN(4, i),
                                                                  IN(5, i), IN(6, i), IN(7, i)));
            }
#undef IN
#undef WD
            w[c + 1] = r;
        }
        return;
    }
    for (int c = -1; c < K; c++) {
        const __m256i idx = _mm256_setr_epi32((c + nw) % nw, K + c, 2 * K + c, 3 * K + c, 4 * K + c, 5 * K + c,
                                              6 * K + c, 7 * K + c);
        w[c + 1] = _mm256_i32gather_epi32((const int *)(const void *)tile, idx, 4);
    }
}

/* States of step m in all 8 segments: the 16-bit window ending at segment
 * bit (m+1)·K. Offsets are compile-time constants once m and K are. */
AI __m256i step_states(const __m256i *w, const int K, const int m)
{
    const int S = (m + 1) * K - 16;       /* window start, segment bit, ≥ −15 */
    const int a = (S + 32) / 32 - 1;      /* word holding it: −1 .. K−1 */
    const int r = S - 32 * a;             /* its offset in that word */
    const __m256i mask = _mm256_set1_epi32(0xFFFF);
    if (r <= 16) return _mm256_and_si256(_mm256_srli_epi32(w[a + 1], 16 - r), mask);
    return _mm256_and_si256(_mm256_or_si256(_mm256_slli_epi32(w[a + 1], r - 16), _mm256_srli_epi32(w[a + 2], 48 - r)),
                            mask);
}

static TARGET void values_avx2(const uint16_t *words, int K, trellis_codebook cb, float *v)
{
    __m256i w[TRELLIS_K_MAX + 1];
    float tmp[8];
    segment_words(words, K, w);
    for (int m = 0; m < 32; m++) {
        /* generic K here (tests only): shifts are not immediates, same results */
        _mm256_storeu_ps(tmp, values8(step_states(w, K, m), cb));
        for (int j = 0; j < 8; j++) v[32 * j + m] = tmp[j];
    }
}

/* A column walk strides n·K·2 bytes from tile to tile, beyond what the
 * hardware prefetchers follow across pages: fetch every line of the tile
 * PREFETCH_TILES ahead (prefetches past the end are harmless). */
#define PREFETCH_TILES 8
AI void prefetch_tile(const uint16_t *tile, const int K)
{
    for (int b = 0; b < 32 * K; b += 64) _mm_prefetch((const char *)tile + b, _MM_HINT_T0);
    _mm_prefetch((const char *)tile + 32 * K - 1, _MM_HINT_T0);
}

AI void gemm_col_kernel(const trellis_gemm_job *job, int nt, const int K, const trellis_codebook cb,
                        const int one_row)
{
    const trellis_linear *lin = job->lin;
    const int kt_count = lin->k / 16, nt_count = lin->n / 16;
    const size_t tile_words = (size_t)trellis_tile_words(K);
    const size_t stride = (size_t)nt_count * tile_words;
    const uint16_t *tile = lin->trellis + (size_t)nt * tile_words;
    __m256i w[TRELLIS_K_MAX + 1];

    if (one_row) {
        __m256 acc[2][4];
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) acc[h][a] = _mm256_setzero_ps();
        const float *u = job->u;
        for (int kt = 0; kt < kt_count; kt++, tile += stride, u += 16) {
            prefetch_tile(tile + PREFETCH_TILES * stride, K);
            segment_words(tile, K, w);
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++) {
                const __m256 v = values8(step_states(w, K, m), cb);
                acc[(m >> 2) & 1][m & 3] =
                    _mm256_fmadd_ps(v, _mm256_broadcast_ss(u + trellis_step_row(m)), acc[(m >> 2) & 1][m & 3]);
            }
        }
        float *t = job->t + 16 * (size_t)nt;
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(t + 8 * h, _mm256_add_ps(_mm256_add_ps(acc[h][0], acc[h][1]),
                                                      _mm256_add_ps(acc[h][2], acc[h][3])));
        return;
    }

    const int rows = job->rows;
    __m256 acc[TRELLIS_GEMM_MAX_ROWS][2][4];
    __m256 v[32];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) acc[r][h][a] = _mm256_setzero_ps();
    for (int kt = 0; kt < kt_count; kt++, tile += stride) {
        prefetch_tile(tile + PREFETCH_TILES * stride, K);
        segment_words(tile, K, w);
#pragma GCC unroll 32
        for (int m = 0; m < 32; m++) v[m] = values8(step_states(w, K, m), cb);
        for (int r = 0; r < rows; r++) {
            const float *u = job->u + (size_t)r * lin->k + 16 * kt;
            __m256 a0 = acc[r][0][0], a1 = acc[r][0][1], a2 = acc[r][0][2], a3 = acc[r][0][3];
            __m256 b0 = acc[r][1][0], b1 = acc[r][1][1], b2 = acc[r][1][2], b3 = acc[r][1][3];
            for (int m = 0; m < 32; m += 8) {
                a0 = _mm256_fmadd_ps(v[m + 0], _mm256_broadcast_ss(u + trellis_step_row(m + 0)), a0);
                a1 = _mm256_fmadd_ps(v[m + 1], _mm256_broadcast_ss(u + trellis_step_row(m + 1)), a1);
                a2 = _mm256_fmadd_ps(v[m + 2], _mm256_broadcast_ss(u + trellis_step_row(m + 2)), a2);
                a3 = _mm256_fmadd_ps(v[m + 3], _mm256_broadcast_ss(u + trellis_step_row(m + 3)), a3);
                b0 = _mm256_fmadd_ps(v[m + 4], _mm256_broadcast_ss(u + trellis_step_row(m + 4)), b0);
                b1 = _mm256_fmadd_ps(v[m + 5], _mm256_broadcast_ss(u + trellis_step_row(m + 5)), b1);
                b2 = _mm256_fmadd_ps(v[m + 6], _mm256_broadcast_ss(u + trellis_step_row(m + 6)), b2);
                b3 = _mm256_fmadd_ps(v[m + 7], _mm256_broadcast_ss(u + trellis_step_row(m + 7)), b3);
            }
            acc[r][0][0] = a0, acc[r][0][1] = a1, acc[r][0][2] = a2, acc[r][0][3] = a3;
            acc[r][1][0] = b0, acc[r][1][1] = b1, acc[r][1][2] = b2, acc[r][1][3] = b3;
        }
    }
    for (int r = 0; r < rows; r++) {
        float *t = job->t + (size_t)r * lin->n + 16 * (size_t)nt;
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(t + 8 * h, _mm256_add_ps(_mm256_add_ps(acc[r][h][0], acc[r][h][1]),
                                                      _mm256_add_ps(acc[r][h][2], acc[r][h][3])));
    }
}

/* mul1 byte-pair sums: the 16-bit words (b0 + b1, b2 + b3) of state·0x83DCD12D;
 * vpmaddwd against (q, q) then gives b·q per lane. */
AI __m256i pair_sums8(__m256i s)
{
    return _mm256_maddubs_epi16(_mm256_mullo_epi32(s, _mm256_set1_epi32((int)TRELLIS_MUL1_MUL)),
                                _mm256_set1_epi8(1));
}

/* Fold one 128-input block's integer sums into the fp32 accumulators
 * (trellis.c's canonical conversion) and clear them. */
AI void block_fold8(__m256i ia[2][4], __m256 fa[2], const trellis_gemm_job *job, size_t i_blk)
{
    const __m256i bias = _mm256_set1_epi32(job->bbias[i_blk]);
    const __m256 scale = _mm256_set1_ps(job->bscale[i_blk]);
    for (int h = 0; h < 2; h++) {
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(ia[h][0], ia[h][1]), _mm256_add_epi32(ia[h][2], ia[h][3]));
        fa[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, bias)), scale, fa[h]);
        for (int a = 0; a < 4; a++) ia[h][a] = _mm256_setzero_si256();
    }
}

/* mul1: trellis.c's integer arithmetic, one tile column; batch 1 consumes
 * each step's sums as they are made, larger batches decode a tile once. */
AI void gemm_col_mul1(const trellis_gemm_job *job, int nt, const int K, const int one_row)
{
    const trellis_linear *lin = job->lin;
    const int kt_count = lin->k / 16, nt_count = lin->n / 16, rows = job->rows, per_blk = TRELLIS_Q_BLOCK / 16;
    const size_t tile_words = (size_t)trellis_tile_words(K), nblk = (size_t)lin->k / TRELLIS_Q_BLOCK;
    const size_t stride = (size_t)nt_count * tile_words;
    const uint16_t *tile = lin->trellis + (size_t)nt * tile_words;
    __m256i w[TRELLIS_K_MAX + 1];
    __m256i ia[TRELLIS_GEMM_MAX_ROWS][2][4];
    __m256 fa[TRELLIS_GEMM_MAX_ROWS][2];
    __m256i v[32];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            fa[r][h] = _mm256_setzero_ps();
            for (int a = 0; a < 4; a++) ia[r][h][a] = _mm256_setzero_si256();
        }
    for (int kt = 0; kt < kt_count; kt++, tile += stride) {
        prefetch_tile(tile + PREFETCH_TILES * stride, K);
        segment_words(tile, K, w);
        if (one_row) {
            const int32_t *q = job->uq2 + 16 * kt;
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++)
                ia[0][(m >> 2) & 1][m & 3] =
                    _mm256_add_epi32(ia[0][(m >> 2) & 1][m & 3],
                                     _mm256_madd_epi16(pair_sums8(step_states(w, K, m)),
                                                       _mm256_set1_epi32(q[trellis_step_row(m)])));
            if ((kt + 1) % per_blk == 0) block_fold8(ia[0], fa[0], job, (size_t)(kt / per_blk));
            continue;
        }
#pragma GCC unroll 32
        for (int m = 0; m < 32; m++) v[m] = pair_sums8(step_states(w, K, m));
        for (int r = 0; r < rows; r++) {
            const int32_t *q = job->uq2 + (size_t)r * lin->k + 16 * kt;
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++)
                ia[r][(m >> 2) & 1][m & 3] = _mm256_add_epi32(
                    ia[r][(m >> 2) & 1][m & 3], _mm256_madd_epi16(v[m], _mm256_set1_epi32(q[trellis_step_row(m)])));
            if ((kt + 1) % per_blk == 0) block_fold8(ia[r], fa[r], job, (size_t)r * nblk + (size_t)(kt / per_blk));
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(job->t + (size_t)r * lin->n + 16 * (size_t)nt + 8 * h, fa[r][h]);
}

/* Viterbi step, 8 nodes per vector and 4 vectors in flight (the running
 * minimum is a dependency chain of 2^K compare/blends; interleaving four
 * independent chains keeps the pipes busy at large K). The 8 predecessor
 * costs of a vector are one broadcast (K ≥ 3: all 8 nodes share e >> K) or
 * one permuted load (K = 1, 2). */
AI void vstep_kernel(const float *cb, const float *cost_in, float *cost_out, uint8_t *back, const int K,
                     float target, float weight, const int weighted)
{
    const int shift = 16 - K, nodes = 1 << shift, branches = 1 << K;
    const __m256 tv = _mm256_set1_ps(target), wv = _mm256_set1_ps(weight);
    const __m256i idx = _mm256_setr_epi32(0 >> K, 1 >> K, 2 >> K, 3 >> K, 4 >> K, 5 >> K, 6 >> K, 7 >> K);
    for (int e0 = 0; e0 < nodes; e0 += 32) {
        __m256 best[4];
        __m256i arg[4];
        for (int c = 0; c < 4; c++) {
            best[c] = _mm256_set1_ps(INFINITY);
            arg[c] = _mm256_setzero_si256();
        }
        for (int j = 0; j < branches; j++) {
            const __m256i jv = _mm256_set1_epi32(j);
            for (int c = 0; c < 4; c++) {
                const int s0 = (j << shift) | (e0 + 8 * c);
                const __m256 cp = K >= 3 ? _mm256_broadcast_ss(cost_in + (s0 >> K))
                                         : _mm256_permutevar8x32_ps(_mm256_loadu_ps(cost_in + (s0 >> K)), idx);
                const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(cb + s0), tv);
                __m256 dd = _mm256_mul_ps(d, d);
                if (weighted) dd = _mm256_mul_ps(dd, wv);
                const __m256 cost = _mm256_add_ps(cp, dd);
                const __m256 m = _mm256_cmp_ps(cost, best[c], _CMP_LT_OQ);
                best[c] = _mm256_blendv_ps(best[c], cost, m);
                arg[c] = _mm256_castps_si256(
                    _mm256_blendv_ps(_mm256_castsi256_ps(arg[c]), _mm256_castsi256_ps(jv), m));
            }
        }
        for (int c = 0; c < 4; c++) {
            _mm256_storeu_ps(cost_out + e0 + 8 * c, best[c]);
            const __m128i a16 =
                _mm_packus_epi32(_mm256_castsi256_si128(arg[c]), _mm256_extracti128_si256(arg[c], 1));
            _mm_storel_epi64((__m128i *)(back + e0 + 8 * c), _mm_packus_epi16(a16, a16));
        }
    }
}

#define VSTEP(K)                                                                                         \
    static TARGET void vstep_##K(const float *cb, const float *ci, float *co, uint8_t *bk, float t, float w) \
    {                                                                                                    \
        if (w == 1.0f) vstep_kernel(cb, ci, co, bk, K, t, w, 0);                                          \
        else vstep_kernel(cb, ci, co, bk, K, t, w, 1);                                                   \
    }
TRELLIS_EACH_K(VSTEP)

static TARGET void viterbi_step_avx2(const float *cb, const float *cost_in, float *cost_out, uint8_t *back,
                                     int K, float target, float weight)
{
#define VSTEP_NAME(K) vstep_##K
    static void (*const fns[8])(const float *, const float *, float *, uint8_t *, float, float) = {
        TRELLIS_EACH_K_LIST(VSTEP_NAME)};
    fns[K - 1](cb, cost_in, cost_out, back, target, weight);
}

/* One specialised kernel per (K, codebook, batch-1 or not). */
#define KERNEL(K, CB, ONE)                                                                   \
    static TARGET void gemm_##K##_##CB##_##ONE(const trellis_gemm_job *job, int nt)          \
    {                                                                                        \
        gemm_col_kernel(job, nt, K, (trellis_codebook)CB, ONE);                              \
    }
#define MUL1_KERNEL(K)                                                                       \
    static TARGET void gemm_##K##_mul1_0(const trellis_gemm_job *job, int nt) { gemm_col_mul1(job, nt, K, 0); } \
    static TARGET void gemm_##K##_mul1_1(const trellis_gemm_job *job, int nt) { gemm_col_mul1(job, nt, K, 1); }
#define KERNELS_K(K) KERNEL(K, 0, 0) KERNEL(K, 0, 1) KERNEL(K, 1, 0) KERNEL(K, 1, 1) MUL1_KERNEL(K)
TRELLIS_EACH_K(KERNELS_K)
#define ROW(K)                                                                               \
    {{gemm_##K##_0_0, gemm_##K##_0_1}, {gemm_##K##_1_0, gemm_##K##_1_1}, {gemm_##K##_mul1_0, gemm_##K##_mul1_1}}
static const trellis_gemm_col_fn kernels[8][3][2] = {TRELLIS_EACH_K_LIST(ROW)};

static TARGET void gemm_col_avx2(const trellis_gemm_job *job, int nt)
{
    kernels[job->lin->K - 1][job->lin->cb][job->rows == 1](job, nt);
}

/* CPUID: AVX2 (leaf 7 EBX bit 5), FMA (leaf 1 ECX bit 12), F16C (ECX bit 29),
 * and the OS saving YMM state (OSXSAVE, XCR0 bits 1-2). Read directly:
 * clang's __builtin_cpu_supports does not know "f16c". */
static bool avx2_cpu_ok(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool fma = c & (1u << 12), f16c = c & (1u << 29), osxsave = c & (1u << 27);
    if (!fma || !f16c || !osxsave) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6) != 6) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return b & (1u << 5);
}

static const trellis_path_impl impl_avx2 = {
    .gemm_col = gemm_col_avx2,
    .cols_per_task = 1,
    .values = values_avx2,
    .viterbi_step = viterbi_step_avx2,
};

/* AVX-512: its own GEMM (trellis_avx512.c), this file's single-tile decode
 * and Viterbi step. */
static const trellis_path_impl impl_avx512 = {
    .gemm_col = trellis_avx512_gemm_pair,
    .cols_per_task = 2,
    .values = values_avx2,
    .viterbi_step = viterbi_step_avx2,
};

static bool avx512_ok(void) { return avx2_cpu_ok() && trellis_avx512_cpu_ok(); }

const trellis_simd_desc trellis_simd[TRELLIS_SIMD_SLOTS] = {
    {TRELLIS_PATH_AVX512, &impl_avx512, avx512_ok},
    {TRELLIS_PATH_AVX2, &impl_avx2, avx2_cpu_ok},
};
