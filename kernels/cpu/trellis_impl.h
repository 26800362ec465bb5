/* kernels/cpu/trellis_impl.h — internals shared by trellis.c and its SIMD
 * files (trellis_avx2.c, trellis_neon.c). Not a public header.
 *
 * Every path reads a tile through an "extended ring": the tile's 8·K 32-bit
 * stream words (MSB-first, the little-endian load of two int16 words) with
 * the last word copied in front and the first two after, so that any 16-bit
 * state window — including the one that wraps around the ring at position 0
 * — and any 64-bit read starting at a state window is one plain load.
 *
 * The GEMM is defined by one canonical order of fp32 operations (fused
 * multiply-add per weight, accumulators per tile column pair and lane, a fixed
 * pairwise reduction) that the scalar path spells out and the SIMD paths
 * reproduce exactly; see trellis.c. */
#ifndef SPARQ_KERNELS_CPU_TRELLIS_IMPL_H
#define SPARQ_KERNELS_CPU_TRELLIS_IMPL_H

#include <stdint.h>

#include "kernels/cpu/trellis.h"

#define TRELLIS_EXT_WORDS (8 * TRELLIS_K_MAX + 3)

/* Build the extended ring of one packed tile (16·K int16 words). */
static inline void trellis_ring_prepare(const uint16_t *words, int K, uint32_t *ext)
{
    const int nw = 8 * K;
    for (int j = 0; j < nw; j++)
        ext[j + 1] = (uint32_t)words[2 * j] | ((uint32_t)words[2 * j + 1] << 16);
    ext[0] = ext[nw];
    ext[nw + 1] = ext[1];
    ext[nw + 2] = ext[2];
}

/* The 64 stream bits starting at ring bit `bit` (-32 ≤ bit < 256·K; the ring wraps),
 * first stream bit in the MSB. */
static inline uint64_t trellis_ring_read64(const uint32_t *ext, int bit)
{
    const unsigned s = (unsigned)(bit + 32);
    const unsigned q = s >> 5, r = s & 31;
    const uint64_t hi = ((uint64_t)ext[q] << 32) | ext[q + 1];
    return (hi << r) | (((uint64_t)ext[q + 2] << r) >> 32);
}

/* 16-bit state of stream position p. */
static inline uint32_t trellis_ring_state(const uint32_t *ext, int K, int p)
{
    return (uint32_t)(trellis_ring_read64(ext, (p + 1) * K - 16) >> 48);
}

/* The GEMM walks a tile as 8 segments × 32 steps: segment j holds stream
 * positions 32j..32j+31, all in columns j (steps with bit 2 clear) and j + 8
 * (bit 2 set); step m of every segment sits in the same row, so one
 * broadcast input element serves all 8 segments. Segment j starts on 32-bit
 * ring word K·j, so the state windows of step m are at the same offsets in
 * every segment: a SIMD lane per segment extracts them with immediate shifts. */
static inline int trellis_step_row(int m) { return 2 * (m >> 3) + (m & 1) + 8 * ((m >> 1) & 1); }

/* The GEMM work shared by all paths: u = had128(x ⊙ suh), rows × k; the
 * kernel writes the pre-Hadamard output t[r·n + col] for the 16 columns of
 * tile column nt, in the canonical order described in trellis.c. */
typedef struct trellis_gemm_job {
    const trellis_linear *lin;
    int rows;
    const float *u;
    float *t;
    /* mul1 only, the integer arithmetic of trellis.c: per row r and input i,
     * uq2[r·k + i] = the 16-bit quantized u twice, (q & 0xFFFF) | (q << 16);
     * per row and 128-input block β (index r·k/128 + β), bscale = A·s_β and
     * bbias = 510·Σq over the block. */
    const int32_t *uq2;
    const float *bscale;
    const int32_t *bbias;
} trellis_gemm_job;

/* mul1's integer GEMM: u is quantized per 128-input block to |q| ≤ 32639
 * (so the high byte fits int8 for the GPU's tensor core); the value of a
 * weight is A·(b − 510) + D with b the byte sum of state·0x83DCD12D,
 * A = fp16 0x1EEE = 1774·2^-18 and D = 1534·A + fp16 0xC931 = −476·2^-18. */
#define TRELLIS_Q_BLOCK 128
#define TRELLIS_Q_MAX 32639
#define TRELLIS_MUL1_A (1774.0f / 262144.0f)
#define TRELLIS_MUL1_D (-476.0f / 262144.0f)

typedef void (*trellis_gemm_col_fn)(const trellis_gemm_job *job, int nt);
typedef void (*trellis_values_fn)(const uint16_t *words, int K, trellis_codebook cb, float *v);
typedef void (*trellis_vstep_fn)(const float *cb, const float *cost_in, float *cost_out, uint8_t *back,
                                 int K, float target, float weight);

/* Per-path entry points. gemm_col handles task i = tile columns
 * [cols_per_task·i, cols_per_task·(i+1)); n/16 is a multiple of 8. */
typedef struct trellis_path_impl {
    trellis_gemm_col_fn gemm_col;
    int cols_per_task;        /* 1 or 2 */
    trellis_values_fn values; /* 256 values, stream order */
    trellis_vstep_fn viterbi_step;
} trellis_path_impl;

extern const trellis_path_impl trellis_impl_scalar;

/* The SIMD paths of this build, best first: exactly one of trellis_avx2.c
 * (with trellis_avx512.c), trellis_neon.c, trellis_nosimd.c defines it.
 * Unused slots have path TRELLIS_PATH_SCALAR and impl NULL. */
#define TRELLIS_SIMD_SLOTS 2
typedef struct trellis_simd_desc {
    trellis_path path;             /* TRELLIS_PATH_AVX512 / _AVX2 / _NEON */
    const trellis_path_impl *impl; /* NULL: unused slot */
    bool (*cpu_ok)(void);          /* can this CPU run it (CPUID check) */
} trellis_simd_desc;
extern const trellis_simd_desc trellis_simd[TRELLIS_SIMD_SLOTS];

/* trellis_avx512.c, x86-64 only */
void trellis_avx512_gemm_pair(const trellis_gemm_job *job, int pair);
bool trellis_avx512_cpu_ok(void);

/* X-macros over K = 1..8, for the per-K specialised kernels of each path. */
#define TRELLIS_EACH_K(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)
#define TRELLIS_EACH_K_LIST(X) X(1), X(2), X(3), X(4), X(5), X(6), X(7), X(8)

/* Codebook constants. */
#define TRELLIS_MUL1_MUL 0x83DCD12Du
#define TRELLIS_MCG_MUL 0xCBAC1FEDu
#define TRELLIS_3INST_MUL 89226354u
#define TRELLIS_3INST_ADD 64248484u
#define TRELLIS_LOP_MASK 0x8FFF8FFFu
#define TRELLIS_LOP_XOR 0x3B603B60u
#define TRELLIS_MUL1_SCALE_F16 0x1EEEu /* ≈ 1/147.7 */
#define TRELLIS_MUL1_BIAS_F16 0xC931u  /* ≈ -10.39 = -(1024 + 510)/147.7 */

#endif
