/* kernels/cpu/trellis_avx512.c — the trellis GEMM with AVX-512 (F + BW),
 * for x86-64 CPUs that have it (functions carry target("avx512f,avx512bw");
 * used only when CPUID and XCR0 say so). Same algorithm and the same
 * per-lane arithmetic as trellis_avx2.c, 16 lanes wide: lanes 0-7 are the
 * 8 segments of tile column nt, lanes 8-15 those of nt+1 (the two tiles are
 * adjacent in memory, so one gather per ring word serves both), which halves
 * the instructions per weight. Single-tile decode (tests only) and the
 * Viterbi step reuse the AVX2 code: a 16-wide Viterbi step (mask compares
 * and blends) measured 0.6× the speed of the AVX2 one on this Zen 5. */
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/trellis_impl.h"

#define TARGET __attribute__((target("avx512f,avx512bw")))
#define AI static inline __attribute__((always_inline)) TARGET

AI __m512 round_f16(__m512 r)
{
    return _mm512_cvtph_ps(_mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

AI __m512 lop_halves_sum16(__m512i x)
{
    x = _mm512_xor_si512(_mm512_and_si512(x, _mm512_set1_epi32((int)TRELLIS_LOP_MASK)),
                         _mm512_set1_epi32((int)TRELLIS_LOP_XOR));
    const __m512i bias = _mm512_set1_epi32(0x38000000);
    const __m512i mag = _mm512_set1_epi32(0x7FFF << 13);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi32(x, 16), sign),
                                       _mm512_add_epi32(_mm512_and_si512(_mm512_slli_epi32(x, 13), mag), bias));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(x, sign),
                                       _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(x, 3), mag), bias));
    return round_f16(_mm512_add_ps(_mm512_castsi512_ps(lo), _mm512_castsi512_ps(hi)));
}

AI __m512 values16(__m512i s, trellis_codebook cb)
{
    if (cb == TRELLIS_CB_MUL1) {
        const __m512i x = _mm512_mullo_epi32(s, _mm512_set1_epi32((int)TRELLIS_MUL1_MUL));
        const __m512i b = _mm512_madd_epi16(_mm512_maddubs_epi16(x, _mm512_set1_epi8(1)), _mm512_set1_epi16(1));
        const float scale = sparq_f16_to_f32(TRELLIS_MUL1_SCALE_F16);
        const float bias = sparq_f16_to_f32(TRELLIS_MUL1_BIAS_F16) + 1024.0f * scale; /* exact, see AVX2 */
        return round_f16(_mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(scale), _mm512_set1_ps(bias)));
    }
    if (cb == TRELLIS_CB_MCG) return lop_halves_sum16(_mm512_mullo_epi32(s, _mm512_set1_epi32((int)TRELLIS_MCG_MUL)));
    return lop_halves_sum16(_mm512_add_epi32(_mm512_mullo_epi32(s, _mm512_set1_epi32((int)TRELLIS_3INST_MUL)),
                                             _mm512_set1_epi32((int)TRELLIS_3INST_ADD)));
}

/* w[c + 1] lane j (< 8) = word K·j + c of tile A, lane 8 + j the same word of
 * tile B = tile A + 8K words (word −1 wraps to the tile's last). For K ≤ 4 a
 * tile's 8K words fit one two-register permute table, so each w is two
 * vpermt2d (tile A from the pair's first 32 words, tile B from its last 32)
 * and a blend: a 16-lane gather costs several times that. K ≥ 5 gathers. */
AI void segment_words2(const uint16_t *tile_a, const int K, __m512i *w)
{
    const int nw = 8 * K;
    const int32_t *d = (const int32_t *)(const void *)tile_a;
    if (K == 1) {
        const __m512i t = _mm512_loadu_si512((const void *)d);
        for (int c = -1; c < K; c++) {
            const __m512i idx = _mm512_setr_epi32((c + 8) % 8, 1 + c, 2 + c, 3 + c, 4 + c, 5 + c, 6 + c, 7 + c,
                                                  8 + (c + 8) % 8, 9 + c, 10 + c, 11 + c, 12 + c, 13 + c, 14 + c,
                                                  15 + c);
            w[c + 1] = _mm512_permutexvar_epi32(idx, t);
        }
        return;
    }
    if (K <= 4) {
        const __m512i a0 = _mm512_loadu_si512((const void *)d), a1 = _mm512_loadu_si512((const void *)(d + 16));
        const __m512i b0 = _mm512_loadu_si512((const void *)(d + 2 * nw - 32));
        const __m512i b1 = _mm512_loadu_si512((const void *)(d + 2 * nw - 16));
        const int ob = 32 - nw; /* tile B word i is table B entry i + ob */
        for (int c = -1; c < K; c++) {
#define WA(j) (((j) * K + c + nw) % nw)
            const __m512i ia = _mm512_setr_epi32(WA(0), WA(1), WA(2), WA(3), WA(4), WA(5), WA(6), WA(7), 0, 0, 0, 0,
                                                 0, 0, 0, 0);
            const __m512i ib = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, WA(0) + ob, WA(1) + ob, WA(2) + ob,
                                                 WA(3) + ob, WA(4) + ob, WA(5) + ob, WA(6) + ob, WA(7) + ob);
#undef WA
            w[c + 1] = _mm512_mask_blend_epi32((__mmask16)0xFF00, _mm512_permutex2var_epi32(a0, ia, a1),
                                               _mm512_permutex2var_epi32(b0, ib, b1));
        }
        return;
    }
    for (int c = -1; c < K; c++) {
        const __m512i idx = _mm512_setr_epi32((c + nw) % nw, K + c, 2 * K + c, 3 * K + c, 4 * K + c, 5 * K + c,
                                              6 * K + c, 7 * K + c, nw + (c + nw) % nw, nw + K + c, nw + 2 * K + c,
                                              nw + 3 * K + c, nw + 4 * K + c, nw + 5 * K + c, nw + 6 * K + c,
                                              nw + 7 * K + c);
        w[c + 1] = _mm512_i32gather_epi32(idx, (const void *)tile_a, 4);
    }
}

AI __m512i step_states(const __m512i *w, const int K, const int m)
{
    const int S = (m + 1) * K - 16, a = (S + 32) / 32 - 1, r = S - 32 * a;
    const __m512i mask = _mm512_set1_epi32(0xFFFF);
    if (r <= 16) return _mm512_and_si512(_mm512_srli_epi32(w[a + 1], 16 - r), mask);
    return _mm512_and_si512(_mm512_or_si512(_mm512_slli_epi32(w[a + 1], r - 16), _mm512_srli_epi32(w[a + 2], 48 - r)),
                            mask);
}

#define PREFETCH_TILES 8
AI void prefetch_tiles2(const uint16_t *tile, const int K)
{
    for (int b = 0; b < 64 * K; b += 64) _mm_prefetch((const char *)tile + b, _MM_HINT_T0);
    _mm_prefetch((const char *)tile + 64 * K - 1, _MM_HINT_T0);
}

/* Tile columns 2·pair and 2·pair + 1. */
AI void gemm_pair_kernel(const trellis_gemm_job *job, int pair, const int K, const trellis_codebook cb,
                         const int one_row)
{
    const trellis_linear *lin = job->lin;
    const int kt_count = lin->k / 16, nt_count = lin->n / 16, nt = 2 * pair;
    const size_t tile_words = (size_t)trellis_tile_words(K);
    const size_t stride = (size_t)nt_count * tile_words;
    const uint16_t *tile = lin->trellis + (size_t)nt * tile_words;
    __m512i w[TRELLIS_K_MAX + 1];

    if (one_row) {
        __m512 acc[2][4];
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) acc[h][a] = _mm512_setzero_ps();
        const float *u = job->u;
        for (int kt = 0; kt < kt_count; kt++, tile += stride, u += 16) {
            prefetch_tiles2(tile + PREFETCH_TILES * stride, K);
            segment_words2(tile, K, w);
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++)
                acc[(m >> 2) & 1][m & 3] = _mm512_fmadd_ps(values16(step_states(w, K, m), cb),
                                                           _mm512_set1_ps(u[trellis_step_row(m)]),
                                                           acc[(m >> 2) & 1][m & 3]);
        }
        float tmp[2][16];
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(tmp[h], _mm512_add_ps(_mm512_add_ps(acc[h][0], acc[h][1]),
                                                   _mm512_add_ps(acc[h][2], acc[h][3])));
        float *t = job->t + 16 * (size_t)nt;
        for (int tcol = 0; tcol < 2; tcol++)
            for (int h = 0; h < 2; h++) memcpy(t + 16 * tcol + 8 * h, tmp[h] + 8 * tcol, 8 * sizeof(float));
        return;
    }

    const int rows = job->rows;
    __m512 acc[TRELLIS_GEMM_MAX_ROWS][2][4];
    __m512 v[32];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) acc[r][h][a] = _mm512_setzero_ps();
    for (int kt = 0; kt < kt_count; kt++, tile += stride) {
        prefetch_tiles2(tile + PREFETCH_TILES * stride, K);
        segment_words2(tile, K, w);
#pragma GCC unroll 32
        for (int m = 0; m < 32; m++) v[m] = values16(step_states(w, K, m), cb);
        for (int r = 0; r < rows; r++) {
            const float *u = job->u + (size_t)r * lin->k + 16 * kt;
            __m512 a0 = acc[r][0][0], a1 = acc[r][0][1], a2 = acc[r][0][2], a3 = acc[r][0][3];
            __m512 b0 = acc[r][1][0], b1 = acc[r][1][1], b2 = acc[r][1][2], b3 = acc[r][1][3];
#pragma GCC unroll 4
            for (int m = 0; m < 32; m += 8) {
                a0 = _mm512_fmadd_ps(v[m + 0], _mm512_set1_ps(u[trellis_step_row(m + 0)]), a0);
                a1 = _mm512_fmadd_ps(v[m + 1], _mm512_set1_ps(u[trellis_step_row(m + 1)]), a1);
                a2 = _mm512_fmadd_ps(v[m + 2], _mm512_set1_ps(u[trellis_step_row(m + 2)]), a2);
                a3 = _mm512_fmadd_ps(v[m + 3], _mm512_set1_ps(u[trellis_step_row(m + 3)]), a3);
                b0 = _mm512_fmadd_ps(v[m + 4], _mm512_set1_ps(u[trellis_step_row(m + 4)]), b0);
                b1 = _mm512_fmadd_ps(v[m + 5], _mm512_set1_ps(u[trellis_step_row(m + 5)]), b1);
                b2 = _mm512_fmadd_ps(v[m + 6], _mm512_set1_ps(u[trellis_step_row(m + 6)]), b2);
                b3 = _mm512_fmadd_ps(v[m + 7], _mm512_set1_ps(u[trellis_step_row(m + 7)]), b3);
            }
            acc[r][0][0] = a0, acc[r][0][1] = a1, acc[r][0][2] = a2, acc[r][0][3] = a3;
            acc[r][1][0] = b0, acc[r][1][1] = b1, acc[r][1][2] = b2, acc[r][1][3] = b3;
        }
    }
    for (int r = 0; r < rows; r++) {
        float tmp[2][16];
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(tmp[h], _mm512_add_ps(_mm512_add_ps(acc[r][h][0], acc[r][h][1]),
                                                   _mm512_add_ps(acc[r][h][2], acc[r][h][3])));
        float *t = job->t + (size_t)r * lin->n + 16 * (size_t)nt;
        for (int tcol = 0; tcol < 2; tcol++)
            for (int h = 0; h < 2; h++) memcpy(t + 16 * tcol + 8 * h, tmp[h] + 8 * tcol, 8 * sizeof(float));
    }
}

/* mul1 byte-pair sums: the 16-bit words (b0 + b1, b2 + b3) of state·0x83DCD12D,
 * so that one multiply-add of 16-bit pairs against (q, q) adds b·q to a lane. */
AI __m512i pair_sums(__m512i s)
{
    return _mm512_maddubs_epi16(_mm512_mullo_epi32(s, _mm512_set1_epi32((int)TRELLIS_MUL1_MUL)),
                                _mm512_set1_epi8(1));
}

/* Fold one 128-input block's integer sums into the fp32 accumulators (the
 * canonical conversion of trellis.c) and clear them. */
AI void block_fold(__m512i ia[2][4], __m512 fa[2], const trellis_gemm_job *job, size_t i_blk)
{
    const __m512i bias = _mm512_set1_epi32(job->bbias[i_blk]);
    const __m512 scale = _mm512_set1_ps(job->bscale[i_blk]);
    for (int h = 0; h < 2; h++) {
        const __m512i s = _mm512_add_epi32(_mm512_add_epi32(ia[h][0], ia[h][1]), _mm512_add_epi32(ia[h][2], ia[h][3]));
        fa[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, bias)), scale, fa[h]);
        for (int a = 0; a < 4; a++) ia[h][a] = _mm512_setzero_si512();
    }
}

/* t of batch row r for tile columns nt, nt + 1 from the lane layout above. */
AI void store_pair(const trellis_gemm_job *job, int r, int nt, const __m512 fa[2])
{
    float tmp[2][16];
    for (int h = 0; h < 2; h++) _mm512_storeu_ps(tmp[h], fa[h]);
    float *t = job->t + (size_t)r * job->lin->n + 16 * (size_t)nt;
    for (int tcol = 0; tcol < 2; tcol++)
        for (int h = 0; h < 2; h++) memcpy(t + 16 * tcol + 8 * h, tmp[h] + 8 * tcol, 8 * sizeof(float));
}

/* The mul1 integer kernels, twice: for AVX-512 F+BW, and for CPUs that also
 * have VNNI and VBMI2 (Ice Lake, Zen 4 and later: vpdpwssd, vpshrdd). */
#define TARGET_ICL __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vbmi2")))
#define MUL1_FN gemm_pair_mul1
#define MUL1_ATTR TARGET
#define MUL1_ICL 0
#include "kernels/cpu/trellis_avx512_mul1.h"
#define MUL1_FN gemm_pair_mul1_icl
#define MUL1_ATTR TARGET_ICL
#define MUL1_ICL 1
#include "kernels/cpu/trellis_avx512_mul1.h"

#define MUL1_KERNELS(K)                                                                                    \
    static TARGET void mul1_##K##_0(const trellis_gemm_job *job, int pair) { gemm_pair_mul1(job, pair, K, 0); } \
    static TARGET void mul1_##K##_1(const trellis_gemm_job *job, int pair) { gemm_pair_mul1(job, pair, K, 1); } \
    static TARGET_ICL void mul1i_##K##_0(const trellis_gemm_job *job, int pair) { gemm_pair_mul1_icl(job, pair, K, 0); } \
    static TARGET_ICL void mul1i_##K##_1(const trellis_gemm_job *job, int pair) { gemm_pair_mul1_icl(job, pair, K, 1); }
TRELLIS_EACH_K(MUL1_KERNELS)
#define MUL1_ROW(K) {{mul1_##K##_0, mul1_##K##_1}, {mul1i_##K##_0, mul1i_##K##_1}}
static const trellis_gemm_col_fn mul1_kernels[8][2][2] = {TRELLIS_EACH_K_LIST(MUL1_ROW)};

/* AVX512-VNNI (leaf 7 ECX bit 11) and AVX512-VBMI2 (ECX bit 6), asked once. */
static bool icl_ok(void)
{
    static _Atomic int ok = -1;
    int v = atomic_load_explicit(&ok, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) && (c & (1u << 6));
        atomic_store_explicit(&ok, v, memory_order_relaxed);
    }
    return v;
}

#define KERNEL(K, CB, ONE)                                                                   \
    static TARGET void gemm_##K##_##CB##_##ONE(const trellis_gemm_job *job, int pair)        \
    {                                                                                        \
        gemm_pair_kernel(job, pair, K, (trellis_codebook)CB, ONE);                           \
    }
#define KERNELS_K(K) KERNEL(K, 0, 0) KERNEL(K, 0, 1) KERNEL(K, 1, 0) KERNEL(K, 1, 1) KERNEL(K, 2, 0) KERNEL(K, 2, 1)
TRELLIS_EACH_K(KERNELS_K)
#define ROW(K)                                                                               \
    {{gemm_##K##_0_0, gemm_##K##_0_1}, {gemm_##K##_1_0, gemm_##K##_1_1}, {gemm_##K##_2_0, gemm_##K##_2_1}}
static const trellis_gemm_col_fn kernels[8][3][2] = {TRELLIS_EACH_K_LIST(ROW)};

TARGET void trellis_avx512_gemm_pair(const trellis_gemm_job *job, int pair)
{
    if (job->lin->cb == TRELLIS_CB_MUL1) mul1_kernels[job->lin->K - 1][icl_ok()][job->rows == 1](job, pair);
    else kernels[job->lin->K - 1][job->lin->cb][job->rows == 1](job, pair);
}

/* AVX-512F (leaf 7 EBX bit 16), AVX-512BW (bit 30), F16C/FMA implied by
 * AVX-512F, and the OS saving opmask and ZMM state (XCR0 bits 5-7, 1-2). */
bool trellis_avx512_cpu_ok(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 0xE6) != 0xE6) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 16)) && (b & (1u << 30));
}
