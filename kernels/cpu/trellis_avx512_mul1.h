/* kernels/cpu/trellis_avx512_mul1.h — the AVX-512 mul1 GEMM kernel (the
 * integer arithmetic of trellis.c), included twice by trellis_avx512.c:
 * MUL1_FN names the function, MUL1_ATTR its target attribute, MUL1_ICL = 1
 * uses AVX512-VNNI's vpdpwssd and VBMI2's funnel shift, 0 the F+BW
 * equivalents (vpmaddwd + vpaddd, two shifts and an or). Both give the same
 * integers. Each inclusion undefines the three macros. Not a public header. */

#if MUL1_ICL
/* A step's 16-bit states (see step_states) with the two-word window as one
 * funnel shift. */
static inline __attribute__((always_inline)) MUL1_ATTR __m512i step_states_icl(const __m512i *w, const int K,
                                                                               const int m)
{
    const int S = (m + 1) * K - 16, a = (S + 32) / 32 - 1, r = S - 32 * a;
    const __m512i mask = _mm512_set1_epi32(0xFFFF);
    if (r <= 16) return _mm512_and_si512(_mm512_srli_epi32(w[a + 1], 16 - r), mask);
    /* the variable-count form: the immediate one needs a constant expression, which
     * r is only after optimisation (clang -O0 refuses it) */
    return _mm512_and_si512(_mm512_shrdv_epi32(w[a + 2], w[a + 1], _mm512_set1_epi32(48 - r)), mask);
}
#define MUL1_STATES(m) step_states_icl(w, K, (m))
#define MUL1_DP(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define MUL1_STATES(m) step_states(w, K, (m))
#define MUL1_DP(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif

/* Tile columns 2·pair and 2·pair + 1. Lane j < 8 of ia[h][a] sums b·q over
 * the steps m with (m>>2)&1 = h, m&3 = a of segment j of the first tile
 * column (column 8h + j), lane 8 + j the same of the second one. */
static inline __attribute__((always_inline)) MUL1_ATTR void MUL1_FN(const trellis_gemm_job *job, int pair,
                                                                    const int K, const int one_row)
{
    const trellis_linear *lin = job->lin;
    const int kt_count = lin->k / 16, nt_count = lin->n / 16, nt = 2 * pair, per_blk = TRELLIS_Q_BLOCK / 16;
    const size_t tile_words = (size_t)trellis_tile_words(K), nblk = (size_t)lin->k / TRELLIS_Q_BLOCK;
    const size_t stride = (size_t)nt_count * tile_words;
    const uint16_t *tile = lin->trellis + (size_t)nt * tile_words;
    __m512i w[TRELLIS_K_MAX + 1];

    if (one_row) {
        __m512i ia[2][4];
        __m512 fa[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) ia[h][a] = _mm512_setzero_si512();
        const int32_t *q = job->uq2;
        for (int kt = 0; kt < kt_count; kt++, tile += stride, q += 16) {
            prefetch_tiles2(tile + PREFETCH_TILES * stride, K);
            segment_words2(tile, K, w);
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++)
                ia[(m >> 2) & 1][m & 3] = MUL1_DP(ia[(m >> 2) & 1][m & 3], pair_sums(MUL1_STATES(m)),
                                                  _mm512_set1_epi32(q[trellis_step_row(m)]));
            if ((kt + 1) % per_blk == 0) block_fold(ia, fa, job, (size_t)(kt / per_blk));
        }
        store_pair(job, 0, nt, fa);
        return;
    }

    const int rows = job->rows;
    __m512i ia[TRELLIS_GEMM_MAX_ROWS][2][4];
    __m512 fa[TRELLIS_GEMM_MAX_ROWS][2];
    __m512i v[32];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            fa[r][h] = _mm512_setzero_ps();
            for (int a = 0; a < 4; a++) ia[r][h][a] = _mm512_setzero_si512();
        }
    for (int kt = 0; kt < kt_count; kt++, tile += stride) {
        prefetch_tiles2(tile + PREFETCH_TILES * stride, K);
        segment_words2(tile, K, w);
#pragma GCC unroll 32
        for (int m = 0; m < 32; m++) v[m] = pair_sums(MUL1_STATES(m));
        for (int r = 0; r < rows; r++) {
            const int32_t *q = job->uq2 + (size_t)r * lin->k + 16 * kt;
#pragma GCC unroll 32
            for (int m = 0; m < 32; m++)
                ia[r][(m >> 2) & 1][m & 3] =
                    MUL1_DP(ia[r][(m >> 2) & 1][m & 3], v[m], _mm512_set1_epi32(q[trellis_step_row(m)]));
            if ((kt + 1) % per_blk == 0) block_fold(ia[r], fa[r], job, (size_t)r * nblk + (size_t)(kt / per_blk));
        }
    }
    for (int r = 0; r < rows; r++) store_pair(job, r, nt, fa[r]);
}

#undef MUL1_STATES
#undef MUL1_DP
#undef MUL1_FN
#undef MUL1_ATTR
#undef MUL1_ICL
