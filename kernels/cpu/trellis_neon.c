/* kernels/cpu/trellis_neon.c — the trellis codec's NEON path (aarch64, e.g.
 * GB10's Grace cores; NEON is baseline there, so no run-time check).
 *
 * Same structure and the same arithmetic as the AVX2 path (trellis_avx2.c,
 * trellis_impl.h): the 8 tile segments are two 4-lane halves; a step's states
 * come from the transposed segment words by two shifts; mul1 values are a
 * vmulq_u32, a byte sum by two pairwise widening adds, an exact fp32 fma and a
 * round trip through fp16; 3inst/mcg round the exact sum of the two masked
 * fp16 halves. Accumulation is fused (vfmaq) in the canonical order, so the
 * result equals the scalar path bit for bit (tests/kernels/cross_neon.sh runs
 * the unit tests under qemu-aarch64 to prove it). */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/trellis_impl.h"

#define AI static inline __attribute__((always_inline))

AI float32x4_t round_f16(float32x4_t r) { return vcvt_f32_f16(vcvt_f16_f32(r)); }

AI float32x4_t lop_halves_sum4(uint32x4_t x)
{
    x = veorq_u32(vandq_u32(x, vdupq_n_u32(TRELLIS_LOP_MASK)), vdupq_n_u32(TRELLIS_LOP_XOR));
    const uint32x4_t bias = vdupq_n_u32(0x38000000u), mag = vdupq_n_u32(0x7FFFu << 13),
                     sign = vdupq_n_u32(0x80000000u);
    const uint32x4_t lo =
        vorrq_u32(vandq_u32(vshlq_n_u32(x, 16), sign), vaddq_u32(vandq_u32(vshlq_n_u32(x, 13), mag), bias));
    const uint32x4_t hi = vorrq_u32(vandq_u32(x, sign), vaddq_u32(vandq_u32(vshrq_n_u32(x, 3), mag), bias));
    return round_f16(vaddq_f32(vreinterpretq_f32_u32(lo), vreinterpretq_f32_u32(hi)));
}

AI float32x4_t values4(uint32x4_t s, trellis_codebook cb)
{
    if (cb == TRELLIS_CB_MUL1) {
        const uint32x4_t x = vmulq_u32(s, vdupq_n_u32(TRELLIS_MUL1_MUL));
        const uint32x4_t b = vpaddlq_u16(vpaddlq_u8(vreinterpretq_u8_u32(x)));
        /* exact: see trellis_avx2.c */
        const float scale = sparq_f16_to_f32(TRELLIS_MUL1_SCALE_F16);
        const float bias = sparq_f16_to_f32(TRELLIS_MUL1_BIAS_F16) + 1024.0f * scale;
        return round_f16(vfmaq_f32(vdupq_n_f32(bias), vcvtq_f32_u32(b), vdupq_n_f32(scale)));
    }
    if (cb == TRELLIS_CB_MCG) return lop_halves_sum4(vmulq_u32(s, vdupq_n_u32(TRELLIS_MCG_MUL)));
    return lop_halves_sum4(vaddq_u32(vmulq_u32(s, vdupq_n_u32(TRELLIS_3INST_MUL)), vdupq_n_u32(TRELLIS_3INST_ADD)));
}

/* Transposed segment words: w[c + 1][j] = ring word K·j + c (c = −1 .. K−1). */
AI void segment_words(const uint16_t *tile, const int K, uint32_t w[][8])
{
    const int nw = 8 * K;
    for (int c = -1; c < K; c++)
        for (int j = 0; j < 8; j++) {
            const int q = (K * j + c + nw) % nw;
            w[c + 1][j] = (uint32_t)tile[2 * q] | ((uint32_t)tile[2 * q + 1] << 16);
        }
}

/* States of step m in segments 4h..4h+3. */
AI uint32x4_t step_states(uint32_t w[][8], const int K, const int m, const int h)
{
    const int S = (m + 1) * K - 16, a = (S + 32) / 32 - 1, r = S - 32 * a;
    const uint32x4_t mask = vdupq_n_u32(0xFFFF);
    const uint32x4_t wa = vld1q_u32(&w[a + 1][4 * h]);
    if (r <= 16) return vandq_u32(vshlq_u32(wa, vdupq_n_s32(-(16 - r))), mask);
    const uint32x4_t wb = vld1q_u32(&w[a + 2][4 * h]);
    return vandq_u32(vorrq_u32(vshlq_u32(wa, vdupq_n_s32(r - 16)), vshlq_u32(wb, vdupq_n_s32(-(48 - r)))), mask);
}

static void values_neon(const uint16_t *words, int K, trellis_codebook cb, float *v)
{
    uint32_t w[TRELLIS_K_MAX + 1][8];
    float tmp[4];
    segment_words(words, K, w);
    for (int m = 0; m < 32; m++)
        for (int h = 0; h < 2; h++) {
            vst1q_f32(tmp, values4(step_states(w, K, m, h), cb));
            for (int j = 0; j < 4; j++) v[32 * (4 * h + j) + m] = tmp[j];
        }
}

AI void gemm_col_kernel(const trellis_gemm_job *job, int nt, const int K, const trellis_codebook cb,
                        const int one_row)
{
    const trellis_linear *lin = job->lin;
    const int kt_count = lin->k / 16, nt_count = lin->n / 16, rows = job->rows;
    const size_t tile_words = (size_t)trellis_tile_words(K);
    const size_t stride = (size_t)nt_count * tile_words;
    const uint16_t *tile = lin->trellis + (size_t)nt * tile_words;
    uint32_t w[TRELLIS_K_MAX + 1][8];

    if (one_row) { /* batch 1: 16 accumulators in registers, values consumed as made */
        float32x4_t acc[2][4][2];
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) acc[h][a][0] = acc[h][a][1] = vdupq_n_f32(0.0f);
        const float *u = job->u;
        for (int kt = 0; kt < kt_count; kt++, tile += stride, u += 16) {
            __builtin_prefetch(tile + 8 * stride);
            segment_words(tile, K, w);
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++) {
                const float32x4_t x = vdupq_n_f32(u[trellis_step_row(m)]);
                float32x4_t *a = acc[(m >> 2) & 1][m & 3];
                a[0] = vfmaq_f32(a[0], values4(step_states(w, K, m, 0), cb), x);
                a[1] = vfmaq_f32(a[1], values4(step_states(w, K, m, 1), cb), x);
            }
        }
        float *t = job->t + 16 * (size_t)nt;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 2; s++)
                vst1q_f32(t + 8 * h + 4 * s, vaddq_f32(vaddq_f32(acc[h][0][s], acc[h][1][s]),
                                                       vaddq_f32(acc[h][2][s], acc[h][3][s])));
        return;
    }
    /* acc[r][colhalf][a][seghalf] */
    float32x4_t acc[TRELLIS_GEMM_MAX_ROWS][2][4][2];
    float32x4_t v[32][2];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) acc[r][h][a][0] = acc[r][h][a][1] = vdupq_n_f32(0.0f);
    for (int kt = 0; kt < kt_count; kt++, tile += stride) {
        segment_words(tile, K, w);
        for (int m = 0; m < 32; m++) {
            v[m][0] = values4(step_states(w, K, m, 0), cb);
            v[m][1] = values4(step_states(w, K, m, 1), cb);
        }
        for (int r = 0; r < rows; r++) {
            const float *u = job->u + (size_t)r * lin->k + 16 * kt;
            for (int m = 0; m < 32; m++) {
                const float32x4_t x = vdupq_n_f32(u[trellis_step_row(m)]);
                float32x4_t *a = acc[r][(m >> 2) & 1][m & 3];
                a[0] = vfmaq_f32(a[0], v[m][0], x);
                a[1] = vfmaq_f32(a[1], v[m][1], x);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float *t = job->t + (size_t)r * lin->n + 16 * (size_t)nt;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 2; s++)
                vst1q_f32(t + 8 * h + 4 * s, vaddq_f32(vaddq_f32(acc[r][h][0][s], acc[r][h][1][s]),
                                                       vaddq_f32(acc[r][h][2][s], acc[r][h][3][s])));
    }
}

/* mul1 byte sums b of state·0x83DCD12D, 4 lanes. */
AI int32x4_t byte_sums4(uint32x4_t s)
{
    const uint32x4_t x = vmulq_u32(s, vdupq_n_u32(TRELLIS_MUL1_MUL));
    return vreinterpretq_s32_u32(vpaddlq_u16(vpaddlq_u8(vreinterpretq_u8_u32(x))));
}

/* mul1: trellis.c's integer arithmetic, one tile column; ia[r][h][a][half]
 * sums b·q (wrapping int32), folded into fa per 128-input block. */
AI void gemm_col_mul1(const trellis_gemm_job *job, int nt, const int K)
{
    const trellis_linear *lin = job->lin;
    const int kt_count = lin->k / 16, nt_count = lin->n / 16, rows = job->rows, per_blk = TRELLIS_Q_BLOCK / 16;
    const size_t tile_words = (size_t)trellis_tile_words(K), nblk = (size_t)lin->k / TRELLIS_Q_BLOCK;
    const size_t stride = (size_t)nt_count * tile_words;
    const uint16_t *tile = lin->trellis + (size_t)nt * tile_words;
    uint32_t w[TRELLIS_K_MAX + 1][8];
    int32x4_t ia[TRELLIS_GEMM_MAX_ROWS][2][4][2];
    float32x4_t fa[TRELLIS_GEMM_MAX_ROWS][2][2];
    int32x4_t v[32][2];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            fa[r][h][0] = fa[r][h][1] = vdupq_n_f32(0.0f);
            for (int a = 0; a < 4; a++) ia[r][h][a][0] = ia[r][h][a][1] = vdupq_n_s32(0);
        }
    for (int kt = 0; kt < kt_count; kt++, tile += stride) {
        __builtin_prefetch(tile + 8 * stride);
        segment_words(tile, K, w);
#pragma GCC unroll 32
        for (int m = 0; m < 32; m++) {
            v[m][0] = byte_sums4(step_states(w, K, m, 0));
            v[m][1] = byte_sums4(step_states(w, K, m, 1));
        }
        for (int r = 0; r < rows; r++) {
            const int32_t *q = job->uq2 + (size_t)r * lin->k + 16 * kt;
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++) {
                const int32x4_t x = vdupq_n_s32((int16_t)q[trellis_step_row(m)]);
                int32x4_t *a = ia[r][(m >> 2) & 1][m & 3];
                a[0] = vmlaq_s32(a[0], v[m][0], x);
                a[1] = vmlaq_s32(a[1], v[m][1], x);
            }
            if ((kt + 1) % per_blk) continue;
            const size_t i_blk = (size_t)r * nblk + (size_t)(kt / per_blk);
            const int32x4_t bias = vdupq_n_s32(job->bbias[i_blk]);
            const float32x4_t scale = vdupq_n_f32(job->bscale[i_blk]);
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 2; s++) {
                    int32x4_t (*a)[2] = ia[r][h];
                    const int32x4_t sum = vaddq_s32(vaddq_s32(a[0][s], a[1][s]), vaddq_s32(a[2][s], a[3][s]));
                    fa[r][h][s] = vfmaq_f32(fa[r][h][s], vcvtq_f32_s32(vsubq_s32(sum, bias)), scale);
                    for (int i = 0; i < 4; i++) a[i][s] = vdupq_n_s32(0);
                }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 2; s++) vst1q_f32(job->t + (size_t)r * lin->n + 16 * (size_t)nt + 8 * h + 4 * s, fa[r][h][s]);
}

#define KERNEL(K, CB)                                                                        \
    static void gemm_##K##_##CB(const trellis_gemm_job *job, int nt)                         \
    {                                                                                        \
        if (CB == TRELLIS_CB_MUL1) gemm_col_mul1(job, nt, K);                                \
        else if (job->rows == 1) gemm_col_kernel(job, nt, K, (trellis_codebook)CB, 1);       \
        else gemm_col_kernel(job, nt, K, (trellis_codebook)CB, 0);                           \
    }
#define KERNELS_K(K) KERNEL(K, 0) KERNEL(K, 1) KERNEL(K, 2)
TRELLIS_EACH_K(KERNELS_K)
#define ROW(K) {gemm_##K##_0, gemm_##K##_1, gemm_##K##_2}
static const trellis_gemm_col_fn kernels[8][3] = {TRELLIS_EACH_K_LIST(ROW)};

static void gemm_col_neon(const trellis_gemm_job *job, int nt) { kernels[job->lin->K - 1][job->lin->cb](job, nt); }

/* Viterbi step, 4 nodes per vector and 4 vectors in flight to break the
 * compare/select latency chain (see trellis_viterbi_step for the maths). */
static void viterbi_step_neon(const float *cb, const float *cost_in, float *cost_out, uint8_t *back, int K,
                              float target, float weight)
{
    const int shift = 16 - K, nodes = 1 << shift, branches = 1 << K, weighted = weight != 1.0f;
    const float32x4_t tv = vdupq_n_f32(target), wv = vdupq_n_f32(weight);
    for (int e0 = 0; e0 < nodes; e0 += 16) {
        float32x4_t best[4];
        uint32x4_t arg[4];
        for (int c = 0; c < 4; c++) {
            best[c] = vdupq_n_f32(INFINITY);
            arg[c] = vdupq_n_u32(0);
        }
        for (int j = 0; j < branches; j++) {
            const uint32x4_t jv = vdupq_n_u32((uint32_t)j);
            for (int c = 0; c < 4; c++) {
                const int s0 = (j << shift) | (e0 + 4 * c);
                float32x4_t cp;
                if (K >= 2) cp = vld1q_dup_f32(cost_in + (s0 >> K));
                else {
                    const float32x4_t q = vld1q_f32(cost_in + (s0 >> K));
                    cp = vzip1q_f32(q, q);
                }
                const float32x4_t d = vsubq_f32(vld1q_f32(cb + s0), tv);
                float32x4_t dd = vmulq_f32(d, d);
                if (weighted) dd = vmulq_f32(dd, wv);
                const float32x4_t cost = vaddq_f32(cp, dd);
                const uint32x4_t lt = vcltq_f32(cost, best[c]);
                best[c] = vbslq_f32(lt, cost, best[c]);
                arg[c] = vbslq_u32(lt, jv, arg[c]);
            }
        }
        for (int c = 0; c < 4; c++) {
            vst1q_f32(cost_out + e0 + 4 * c, best[c]);
            const uint8x8_t b8 = vmovn_u16(vcombine_u16(vmovn_u32(arg[c]), vdup_n_u16(0)));
            vst1_lane_u32((uint32_t *)(void *)(back + e0 + 4 * c), vreinterpret_u32_u8(b8), 0);
        }
    }
}

static bool neon_cpu_ok(void) { return true; }

static const trellis_path_impl impl_neon = {
    .gemm_col = gemm_col_neon,
    .cols_per_task = 1,
    .values = values_neon,
    .viterbi_step = viterbi_step_neon,
};

const trellis_simd_desc trellis_simd[TRELLIS_SIMD_SLOTS] = {
    {TRELLIS_PATH_NEON, &impl_neon, neon_cpu_ok},
    {TRELLIS_PATH_SCALAR, NULL, NULL},
};
