/* kernels/cuda/gemv_int.cuh — the device pieces of the integer mul1 GEMV
 * (gemv_int.cu) that the integer MoE layer (moe_decode.cu) runs too.
 *
 * The arithmetic (docs/cuda.md "Integer mul1 GEMM"; the CPU's
 * trellis_linear_gemm computes the same): no fp16 weight value is formed.
 * Per batch row r and 128-block β of u = had128(x ⊙ suh), m = max|u_i|,
 * s_β = m / 32639, q_i = clamp(rint(u_i · 32639 / m), ±32639) (s_β = NaN,
 * q = 0 if a u_i is not finite; s_β = 0, q = 0 if m = 0); per weight b = byte
 * sum of h = state·0x83DCD12D; t_n = Σ_β (A·s_β)·Σ_{i∈β} (b_{i,n} − 510)·q_i
 * + D·Σ_i u_i with A = 1774·2^-18, D = −476·2^-18 (the codebook value is
 * A·(b − 510) + D up to its fp16 rounding); y = had128(t) ⊙ svh. The inner
 * sums are exact int32 on the tensor core (imma_u8s8): A operand = the bytes
 * of h, B operand = q split as hi = (q + 128) >> 8, lo = q − 256·hi (both s8);
 * 256·Σ b·hi + Σ b·lo − 510·Σ q is the exact I (|I| < 2^31; the wrapping
 * partial sums are harmless). One row group (4 batch rows) of B words: the
 * product runs these loops at 1..4 rows only. INT_QMAX, INT_A, INT_D:
 * trellis_decode.cuh. */
#ifndef SPARQ_KERNELS_CUDA_GEMV_INT_CUH
#define SPARQ_KERNELS_CUDA_GEMV_INT_CUH

#include "kernels/cuda/trellis_decode.cuh"

namespace trellis_dev {

/* Tile columns per step of the 8-column loop (int2_segment). */
#define GEMV_INT_C8_NW 8

/* B operand storage per row group (4 batch rows) and k tile: 32 lanes × 4
 * words (lane (g, c): column g = batch row g/2 of the group, hi (g even) or
 * lo; words = inputs 2c, 2c+1, 2c+8, 2c+9, each s8 replicated 4×); the
 * product's loops read row group 0 (rows 0..3). The B words of input i
 * (0..127) of 128-block beta of row r, q = its 16-bit value: position
 * p = i % 16 of k tile 8β + i/16; lanes (g = 2·(r%4) + {0: hi, 1: lo},
 * c = (p%8)/2), word 2·(p/8) + p%2. */
__device__ __forceinline__ void int_bq_store(uint32_t *__restrict__ bq, int q, int i, int beta, int r, int ktiles)
{
    const int hi = (q + 128) >> 8, lo = q - 256 * hi;
    const int kt = beta * 8 + (i >> 4), p = i & 15, c = (p & 7) >> 1, word = 2 * (p >> 3) + (p & 1);
    const int g = 2 * (r & 3), lane = 4 * g + c;
    const size_t base = (size_t)((r >> 2) * ktiles + kt) * 32;
    bq[(base + lane) * 4 + word] = 0x01010101u * (uint8_t)hi;
    bq[(base + lane + 4) * 4 + word] = 0x01010101u * (uint8_t)lo;
}

/* Partial sums of the integer loops into t: lane (g, c) holds batch row
 * 4·rg + c of row group rg (RG = 1 here: rows 0..3), outputs col0 + 16j + g
 * and col0 + 16j + g + 8. */
template <int RG, int NW>
__device__ __forceinline__ void int_flush(float *__restrict__ t, int n, int rows, int col0, int g, int c,
                                          const float (&f)[RG][NW][2])
{
#pragma unroll
    for (int rg = 0; rg < RG; rg++) {
        const int row = 4 * rg + c;
        if (row >= rows) continue;
#pragma unroll
        for (int j = 0; j < NW; j++) {
            atomicAdd(t + (size_t)row * n + col0 + 16 * j + g, f[rg][j][0]);
            atomicAdd(t + (size_t)row * n + col0 + 16 * j + g + 8, f[rg][j][1]);
        }
    }
}

/* One warp's segment of the 8-column loop (the GEMV's gemv_int_c8 kernels
 * and the MoE main kernels): k tiles kt0..kt1-1 of tile column group grp
 * (8 tile columns) of the linear at `trellis` (k × n), partial sums added
 * into t. Per k tile a lane cuts 8 states per column from its ring words
 * (at immediate offsets from one pointer per word, advanced one k-tile row a
 * step), 8 IMAD for h, 2 IMMA per tile against one B load for all 8 tiles;
 * the int32 sums become fp32 at each 128-block end and at the range's end,
 * less 510·Σq of exactly the k tiles summed (pc: per-block prefix sums).
 * The loop takes two steps a pass, the first loading the next words into
 * w2, the second back into w (a copy of the next words each step costs 12–20
 * MOVs: ptxas does not rename across the back edge). The first segment of a
 * warp waits for the previous launch (PDL) once its first words are in
 * flight. bok: this lane's B words are a batch row's (else zero).
 * FLAT = false (the GEMV): one pass of the outer loop per 128-block, the
 * pairs from each block's start; true (the MoE kernels): one pass over the
 * whole range, the pairs from an even k tile (one step first where the range
 * starts odd), so a block ends only on a pair's second step and the
 * conversion follows the pair. The faster form differs between the two
 * (docs/benchmarks-cuda.md, rounds 5 and 8). */
template <int K, bool FLAT>
__device__ __forceinline__ void int2_segment(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                                             const float *__restrict__ sa, const int *__restrict__ pc,
                                             float *__restrict__ t, int k, int n, int rows, int grp, int kt0,
                                             int kt1, const lane_ring &lr, uint32_t one, bool bok, bool &waited)
{
    constexpr int NW = GEMV_INT_C8_NW, TW = 8 * K, NWD = lane_nwords<K, DEC_2W>();
    constexpr int D = DEC_2W | DEC_FMA;
    const int lane = threadIdx.x & 31;
    const int ntiles = n >> 4, nb = k >> 7;
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const uint32_t *p0 = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW + lr.o0;
    const uint32_t *p1 = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW + lr.o1;
    const uint32_t *p2 = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW + lr.o2;
    float f[1][NW][2]; /* one row group */
    uint32_t acc[NW][4];
#pragma unroll
    for (int j = 0; j < NW; j++) {
        f[0][j][0] = f[0][j][1] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0u;
    }
    uint32_t w[NW][NWD];
#pragma unroll
    for (int j = 0; j < NW; j++) {
        w[j][0] = __ldg(p0 + j * TW);
        w[j][1] = __ldg(p1 + j * TW);
        if constexpr (NWD == 3) w[j][2] = __ldg(p2 + j * TW);
    }
    if (!waited) {
        griddep_wait();
        waited = true;
    }
    /* k tile kt: load the next k tile's words into wn (the last step reloads
     * its own: no branch), the B words, and add 8 tiles' IMMAs of w into acc */
    uint32_t w2[NW][NWD];
    auto step = [&](int kt, const uint32_t (&w)[NW][NWD], uint32_t (&wn)[NW][NWD]) {
        const size_t adv = kt + 1 < kt1 ? row_stride : 0;
        p0 += adv;
        p1 += adv;
        if constexpr (NWD == 3) p2 += adv;
#pragma unroll
        for (int j = 0; j < NW; j++) {
            wn[j][0] = __ldg(p0 + j * TW);
            wn[j][1] = __ldg(p1 + j * TW);
            if constexpr (NWD == 3) wn[j][2] = __ldg(p2 + j * TW);
        }
        uint32_t b[4];
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (bok) v = __ldg((const uint4 *)(bq + ((size_t)kt * 32 + lane) * 4));
        b[0] = v.x;
        b[1] = v.y;
        b[2] = v.z;
        b[3] = v.w;
#pragma unroll
        for (int j = 0; j < NW; j++) {
            uint32_t x[8];
            lane_hash_w<K, D, NWD>(w[j], lr.r, one, x);
            tile_imma(x, b, acc[j], acc[j]);
        }
    };
    /* k tiles s0..s1-1 of block β: I = 256·Σb·hi + Σb·lo − 510·Σq, into f; acc = 0 */
    auto convert = [&](int be, int s0, int s1) {
        const int *pcr = pc + (c * nb + be) * 9;
        const uint32_t cq = (uint32_t)__ldg(pcr + (s1 - 8 * be)) - (uint32_t)__ldg(pcr + (s0 - 8 * be));
        const float sc = __ldg(sa + c * nb + be);
#pragma unroll
        for (int j = 0; j < NW; j++) {
            const int i0 = (int)((acc[j][0] << 8) + acc[j][1] - cq);
            const int i1 = (int)((acc[j][2] << 8) + acc[j][3] - cq);
            f[0][j][0] = fmaf(sc, (float)i0, f[0][j][0]);
            f[0][j][1] = fmaf(sc, (float)i1, f[0][j][1]);
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] = 0u;
        }
    };
    auto keep = [&]() { /* w = w2: the next step starts from w */
#pragma unroll
        for (int j = 0; j < NW; j++)
#pragma unroll
            for (int e = 0; e < NWD; e++) w[j][e] = w2[j][e];
    };
    if constexpr (FLAT) { /* one pass, converting at each block end */
        int seg = kt0;
        auto ends = [&](int kt) {
            if (((kt + 1) & 7) == 0 || kt + 1 == kt1) {
                convert(kt >> 3, seg, kt + 1);
                seg = kt + 1;
            }
        };
        int kt = kt0;
        if (kt & 1) {
            step(kt, w, w2);
            keep();
            ends(kt);
            kt++;
        }
        for (; kt + 2 <= kt1; kt += 2) {
            step(kt, w, w2);
            step(kt + 1, w2, w);
            ends(kt + 1);
        }
        if (kt < kt1) {
            step(kt, w, w2);
            ends(kt);
        }
    } else { /* one pass per 128-block */
        for (int kt = kt0; kt < kt1;) {
            const int be = kt >> 3, seg = kt, kend = min(kt1, 8 * be + 8);
            for (; kt + 2 <= kend; kt += 2) {
                step(kt, w, w2);
                step(kt + 1, w2, w);
            }
            for (; kt < kend; kt++) { /* an odd count's last step */
                step(kt, w, w2);
                keep();
            }
            convert(be, seg, kend);
        }
    }
    int_flush<1, NW>(t, n, rows, 16 * grp * NW, g, c, f);
}

} // namespace trellis_dev

#endif
