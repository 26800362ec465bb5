/* kernels/cuda/trellis_decode.cuh — device-side decode of EXL3 trellis tiles
 * in registers and the tensor-core and Hadamard helpers, shared by every
 * kernel family (the .cu files of kernels/cuda/) and by a lab .cu (lab/README.md). Not a
 * public header: it is CUDA C++ and only .cu files include it.
 *
 * One warp decodes one 16×16 tile. Lane t owns stream positions 8t..8t+7,
 * which are exactly the B operand fragment of two mma.m16n8k16 (k16×n8)
 * products: positions 8t+0..3 are {b0,b1,b2,b3} of the left n8 half (tile
 * rows 2(t%4), +1, +8, +9 at column t/4), positions 8t+4..7 the same rows of
 * the right half (column t/4 + 8). See kernels/cpu/trellis.h for the format.
 *
 * The states of a lane's 8 positions are 16-bit windows of the ring starting
 * at ring bit b0 = 8tK + K − 16 (negative for lane 0: the ring wraps), every K
 * bits; all of them lie in the 96 bits of three consecutive 32-bit ring words
 * starting at word floor(b0/32) (7K + 16 + (b0 mod 32) ≤ 96 for every K ≤ 8),
 * so a lane loads three words and funnel-shifts them by b0 mod 32.
 *
 * Codebook values are produced two at a time as a half2, bit-exact with the
 * CPU (trellis_cb_value_f16):
 *  - mul1:  x = s·0x83DCD12D; b = byte sum of x (dp4a); the fp16 bits of
 *           1024 + b are 0x6400 + b (b ≤ 1020), so dp4a with 0x6400 as its
 *           addend yields them; one hfma2 by (scale, bias) rounds once.
 *  - 3inst / mcg: x = s·mul (+add); (x & 0x8FFF8FFF) ^ 0x3B603B60 holds two
 *           fp16 halves; the pair's low halves and high halves are gathered
 *           with byte_perm and summed with one hadd2 (one rounding). */
#ifndef SPARQ_KERNELS_CUDA_TRELLIS_DECODE_CUH
#define SPARQ_KERNELS_CUDA_TRELLIS_DECODE_CUH

#include <cuda_fp16.h>
#include <stdint.h>

namespace trellis_dev {

enum { CB_3INST = 0, CB_MCG = 1, CB_MUL1 = 2 };

/* Decode options (template bit mask D of lane_decode_w and what calls it;
 * 0 = the plain decode of k_decode):
 *  DEC_2W:   K ≤ 4 reads two ring words per lane, not three (the lane's
 *            16 + 7K state bits start at b0 mod 32 ≤ 48 − 7K for every
 *            lane, so they end within 64 bits: the third word is never
 *            needed);
 *  DEC_IMMA: mul1 byte sums on the tensor core (imma_bytesum4) instead of
 *            one dp4a per weight;
 *  DEC_FMA:  states that lie inside the first aligned word are cut out with
 *            a multiply by 2^s (IMAD, FMA pipe) and a shift instead of a shift
 *            and a mask (both ALU pipe), to balance the two integer pipes.
 * gemm_tc runs DEC_2W | DEC_IMMA | DEC_FMA, the fused MoE body DEC_2W |
 * DEC_IMMA, the integer loops DEC_2W | DEC_FMA (lane_hash_w). */
enum { DEC_2W = 1, DEC_IMMA = 2, DEC_FMA = 8 };

/* Programmatic dependent launch (sm_90+, GB10 included; a no-op in a kernel
 * launched without the attribute, and compiled out for older targets, where
 * the launches are plainly serialised): griddep_launch lets the next kernel
 * of the stream start; griddep_wait blocks until the previous kernel has
 * finished and its writes are visible. */
__device__ __forceinline__ void griddep_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Ring words a lane reads per tile under options D. */
template <int K, int D>
__host__ __device__ constexpr int lane_nwords()
{
    return (D & DEC_2W) && K <= 4 ? 2 : 3;
}

/* Per-lane constants: indices (in 32-bit ring words, within a tile of 8K words)
 * of the three words a lane reads, and the funnel shift. */
struct lane_ring {
    int o0, o1, o2;
    unsigned r;
};

__host__ __device__ inline lane_ring lane_ring_make(int K, int lane)
{
    const int nw = 8 * K;
    const int b0 = 8 * lane * K + K - 16; /* ≥ −15 */
    const int q = (b0 + 32) / 32 - 1;     /* floor(b0 / 32) */
    lane_ring lr;
    lr.r = (unsigned)(b0 - 32 * q);
    lr.o0 = (q + nw) % nw;
    lr.o1 = (q + 1 + nw) % nw;
    lr.o2 = (q + 2 + nw) % nw;
    return lr;
}

/* The 16-bit state i (0..7) of a lane from its aligned 96-bit window a:b:c
 * (first ring bit in the MSB of a). */
template <int K, int I>
__device__ __forceinline__ uint32_t lane_state(uint32_t a, uint32_t b, uint32_t c)
{
    constexpr int s = I * K; /* window start, bits from the MSB of a */
    if constexpr (s + 16 <= 32) {
        return (a >> (16 - s)) & 0xFFFFu;
    } else if constexpr (s < 32) {
        return __funnelshift_l(b, a, s) >> 16;
    } else if constexpr (s + 16 <= 64) {
        return (b >> (48 - s)) & 0xFFFFu;
    } else {
        return __funnelshift_l(c, b, s - 32) >> 16;
    }
}

/* lane_state under the decode options D: with DEC_FMA, a state inside a is
 * (a · 2^s) >> 16, the multiply on the FMA pipe; `one` is 1 at run time (a
 * kernel argument) so the compiler keeps the multiply instead of turning it
 * back into a shift. */
template <int K, int I, int D>
__device__ __forceinline__ uint32_t lane_state_d(uint32_t a, uint32_t b, uint32_t c, uint32_t one)
{
    constexpr int s = I * K;
    if constexpr ((D & DEC_FMA) != 0 && s > 0 && s + 16 <= 32) {
        return (a * (one << s)) >> 16;
    } else {
        (void)one;
        return lane_state<K, I>(a, b, c);
    }
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h)
{
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u)
{
    return *reinterpret_cast<__half2 *>(&u);
}

/* mul1 values of two fp16 patterns 1024 + byte sum (low half = first):
 * one hfma2 by (scale, bias), one rounding as on the CPU. */
__device__ __forceinline__ uint32_t mul1_finish(uint32_t h0, uint32_t h1)
{
    const __half2 h = bits_h2(__byte_perm(h0, h1, 0x5410));
    const __half2 scale = bits_h2(0x1EEE1EEEu), bias = bits_h2(0xC931C931u);
    return h2_bits(__hfma2(h, scale, bias));
}

/* Codebook values of two states as a half2 (low half = s0). */
template <int CB>
__device__ __forceinline__ uint32_t cb_pair(uint32_t s0, uint32_t s1)
{
    if constexpr (CB == CB_MUL1) {
        const uint32_t x0 = s0 * 0x83DCD12Du, x1 = s1 * 0x83DCD12Du;
        return mul1_finish(__dp4a(x0, 0x01010101u, 0x6400u), __dp4a(x1, 0x01010101u, 0x6400u));
    } else {
        uint32_t x0, x1;
        if constexpr (CB == CB_3INST) {
            x0 = s0 * 89226354u + 64248484u;
            x1 = s1 * 89226354u + 64248484u;
        } else {
            x0 = s0 * 0xCBAC1FEDu;
            x1 = s1 * 0xCBAC1FEDu;
        }
        x0 = (x0 & 0x8FFF8FFFu) ^ 0x3B603B60u;
        x1 = (x1 & 0x8FFF8FFFu) ^ 0x3B603B60u;
        const __half2 lo = bits_h2(__byte_perm(x0, x1, 0x5410));
        const __half2 hi = bits_h2(__byte_perm(x0, x1, 0x7632));
        return h2_bits(__hadd2(lo, hi));
    }
}

/* The 0/1 B operand of imma_bytesum4 for this lane: column n of the 32×8
 * selection matrix sums the four bytes of A's k group π(n), π(2c) = c,
 * π(2c + 1) = c + 4, so every lane gets back the sums of its own words. */
__device__ __forceinline__ void imma_sel_make(int lane, uint32_t &b0, uint32_t &b1)
{
    const int g = lane >> 2, c = lane & 3;
    b0 = ((g & 1) == 0 && (g >> 1) == c) ? 0x01010101u : 0u;
    b1 = ((g & 1) == 1 && (g >> 1) == c) ? 0x01010101u : 0u;
}

/* d[i] = cadd + (sum of the four bytes of x_i), i = 0..3, for every lane of
 * the warp at once: one mma.m16n8k32 u8·u8 → s32 (exact integer arithmetic)
 * with A = the lanes' words (row g: k groups c, c + 4 ← x0, x1; row g + 8 ←
 * x2, x3) and B from imma_sel_make. Replaces four dp4a per lane. */
__device__ __forceinline__ void imma_bytesum4(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, uint32_t b0,
                                              uint32_t b1, uint32_t cadd, uint32_t (&d)[4])
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(x0), "r"(x2), "r"(x1), "r"(x3), "r"(b0), "r"(b1), "r"(cadd));
}

/* --- the integer mul1 GEMV (gemv_int.cu; docs/cuda.md "Integer mul1 GEMM") -----
 * No weight value is formed: each weight's A operand is the four bytes of
 * h = state·0x83DCD12D, and the activations are 16-bit signed integers q (|q| ≤ 32639) split into
 * two s8 halves (hi, lo) replicated over the four k bytes of each weight, so
 * one mma.m16n8k32 u8·s8 → s32 gives Σ_i b_i·hi_i and Σ_i b_i·lo_i (b = byte
 * sum of h) for 8 inputs × 16 outputs × 4 batch rows at once. */

/* d += A·B, m16n8k32, A u8 (row), B s8 (col), exact int32 (wrapping) sums. */
__device__ __forceinline__ void imma_u8s8(uint32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* h = state·0x83DCD12D of a lane's 8 stream positions (order as
 * lane_decode_w's: 8t+0..7 = (input, output) (2c, g), (2c+1, g), (2c+8, g),
 * (2c+9, g), then the same inputs at output g+8). D: lane_state_d options. */
template <int K, int D, int NWD>
__device__ __forceinline__ void lane_hash_w(const uint32_t (&w)[NWD], unsigned r, uint32_t one, uint32_t (&x)[8])
{
    const uint32_t a = __funnelshift_l(w[1], w[0], r);
    const uint32_t b = NWD == 2 ? w[1] << r : __funnelshift_l(w[NWD - 1], w[1], r);
    const uint32_t c = NWD == 2 ? 0u : w[NWD - 1] << r;
    x[0] = lane_state_d<K, 0, D>(a, b, c, one) * 0x83DCD12Du;
    x[1] = lane_state_d<K, 1, D>(a, b, c, one) * 0x83DCD12Du;
    x[2] = lane_state_d<K, 2, D>(a, b, c, one) * 0x83DCD12Du;
    x[3] = lane_state_d<K, 3, D>(a, b, c, one) * 0x83DCD12Du;
    x[4] = lane_state_d<K, 4, D>(a, b, c, one) * 0x83DCD12Du;
    x[5] = lane_state_d<K, 5, D>(a, b, c, one) * 0x83DCD12Du;
    x[6] = lane_state_d<K, 6, D>(a, b, c, one) * 0x83DCD12Du;
    x[7] = lane_state_d<K, 7, D>(a, b, c, one) * 0x83DCD12Du;
}

/* One 16×16 tile: acc0 += inputs 0..7 (A slots c ↔ input 2c, c+4 ↔ 2c+1),
 * acc1 += inputs 8..15; b[0..3] = the lane's B words for inputs 2c, 2c+1,
 * 2c+8, 2c+9 of its column (batch row c/2 of the group, hi or lo). */
__device__ __forceinline__ void tile_imma(const uint32_t (&x)[8], const uint32_t (&b)[4], uint32_t (&acc0)[4],
                                          uint32_t (&acc1)[4])
{
    imma_u8s8(acc0, x[0], x[4], x[1], x[5], b[0], b[1]);
    imma_u8s8(acc1, x[2], x[6], x[3], x[7], b[2], b[3]);
}

/* Decode a lane's 8 values from its ring words w (lane_nwords<K, D>() of
 * them, from word lr.o0 on) and shift r: out[0..1] = B fragment of the left
 * n8 half, out[2..3] of the right half (each a half2: positions 8t+0,1 |
 * 8t+2,3 | 8t+4,5 | 8t+6,7). sel0/sel1: imma_sel_make (DEC_IMMA only);
 * one: 1 (DEC_FMA only, see lane_state_d). */
template <int K, int CB, int D, int NWD>
__device__ __forceinline__ void lane_decode_w(const uint32_t (&w)[NWD], unsigned r, uint32_t sel0, uint32_t sel1,
                                              uint32_t one, uint32_t out[4])
{
    if constexpr (CB == CB_MUL1 && (D & DEC_IMMA)) {
        uint32_t x[8];
        lane_hash_w<K, D, NWD>(w, r, one, x);
        uint32_t d[4], e[4];
        imma_bytesum4(x[0], x[1], x[2], x[3], sel0, sel1, 0x6400u, d);
        imma_bytesum4(x[4], x[5], x[6], x[7], sel0, sel1, 0x6400u, e);
        out[0] = mul1_finish(d[0], d[1]);
        out[1] = mul1_finish(d[2], d[3]);
        out[2] = mul1_finish(e[0], e[1]);
        out[3] = mul1_finish(e[2], e[3]);
    } else {
        (void)sel0;
        (void)sel1;
        const uint32_t a = __funnelshift_l(w[1], w[0], r);
        const uint32_t b = NWD == 2 ? w[1] << r : __funnelshift_l(w[NWD - 1], w[1], r);
        const uint32_t c = NWD == 2 ? 0u : w[NWD - 1] << r;
        out[0] = cb_pair<CB>(lane_state_d<K, 0, D>(a, b, c, one), lane_state_d<K, 1, D>(a, b, c, one));
        out[1] = cb_pair<CB>(lane_state_d<K, 2, D>(a, b, c, one), lane_state_d<K, 3, D>(a, b, c, one));
        out[2] = cb_pair<CB>(lane_state_d<K, 4, D>(a, b, c, one), lane_state_d<K, 5, D>(a, b, c, one));
        out[3] = cb_pair<CB>(lane_state_d<K, 6, D>(a, b, c, one), lane_state_d<K, 7, D>(a, b, c, one));
    }
}

/* D += A·B for one m16n8k16 fp16 product with fp32 accumulators. */
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* --- the fp16 GEMM loop's pieces (gemm_tc.cu, the fused MoE body) -----------
 * A warp owns NW adjacent tile columns; lane (g = lane/4, c = lane%4) holds
 * the A fragment of batch rows g and g+8 and accumulators acc[j][half][4]
 * (D rows g, g+8 × columns 2c, 2c+1 of each n8 half of tile column j). */

/* Ring words of U consecutive k tiles × NW adjacent tile columns; p points at
 * the first tile, row_stride = 32-bit words from one k tile to the next. */
template <int K, int NW, int U, int NWD = 3>
__device__ __forceinline__ void words_load(const uint32_t *p, size_t row_stride, const lane_ring &lr,
                                           uint32_t (&w)[U][NW][NWD])
{
#pragma unroll
    for (int s = 0; s < U; s++) {
        const uint32_t *pt = p + (size_t)s * row_stride;
#pragma unroll
        for (int j = 0; j < NW; j++) {
            w[s][j][0] = __ldg(pt + j * 8 * K + lr.o0);
            w[s][j][1] = __ldg(pt + j * 8 * K + lr.o1);
            if constexpr (NWD == 3) w[s][j][NWD - 1] = __ldg(pt + j * 8 * K + lr.o2);
        }
    }
}

/* dst = src: the next step's prefetched words become the current ones. */
template <int NW, int U, int NWD>
__device__ __forceinline__ void words_copy(uint32_t (&dst)[U][NW][NWD], const uint32_t (&src)[U][NW][NWD])
{
#pragma unroll
    for (int s = 0; s < U; s++)
#pragma unroll
        for (int j = 0; j < NW; j++)
#pragma unroll
            for (int e = 0; e < NWD; e++) dst[s][j][e] = src[s][j][e];
}

/* A fragment of k tile `kt` from fp16 rows read as half2 words: ua, ub point
 * at word c of rows g and g+8; rows past the batch read as zero. */
__device__ __forceinline__ void afrag_load(const uint32_t *ua, const uint32_t *ub, int kt, bool lo_ok, bool hi_ok,
                                           uint32_t (&a)[4])
{
    const int col = kt * 8;
    a[0] = lo_ok ? ua[col] : 0u;
    a[2] = lo_ok ? ua[col + 4] : 0u;
    a[1] = hi_ok ? ub[col] : 0u;
    a[3] = hi_ok ? ub[col + 4] : 0u;
}

/* acc += A · (decoded tiles) for the NW tile columns of one k tile (D, sel0,
 * sel1: see lane_decode_w). */
template <int K, int CB, int NW, int D = 0, int NWD = 3>
__device__ __forceinline__ void tiles_mma(const uint32_t (&w)[NW][NWD], unsigned r, const uint32_t (&a)[4],
                                          float (&acc)[NW][2][4], uint32_t sel0 = 0u, uint32_t sel1 = 0u,
                                          uint32_t one = 1u)
{
#pragma unroll
    for (int j = 0; j < NW; j++) {
        uint32_t b[4];
        lane_decode_w<K, CB, D, NWD>(w[j], r, sel0, sel1, one, b);
        mma_16816(acc[j][0], a, b[0], b[1]);
        mma_16816(acc[j][1], a, b[2], b[3]);
    }
}

template <int NW>
__device__ __forceinline__ void acc_zero(float (&acc)[NW][2][4])
{
#pragma unroll
    for (int j = 0; j < NW; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][h][e] = 0.0f;
}

/* t[row·n + col] += acc for the warp's tile columns starting at output column
 * col0 (fp32 atomics: other k splits add into the same outputs). */
template <int NW>
__device__ __forceinline__ void acc_flush(float *t, int n, int col0, int lane, bool lo_ok, bool hi_ok,
                                          const float (&acc)[NW][2][4])
{
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int j = 0; j < NW; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int col = col0 + 16 * j + 8 * h + 2 * c;
            if (lo_ok) {
                atomicAdd(t + (size_t)g * n + col, acc[j][h][0]);
                atomicAdd(t + (size_t)g * n + col + 1, acc[j][h][1]);
            }
            if (hi_ok) {
                atomicAdd(t + (size_t)(g + 8) * n + col, acc[j][h][2]);
                atomicAdd(t + (size_t)(g + 8) * n + col + 1, acc[j][h][3]);
            }
        }
}

/* In-place normalised 128-point Walsh–Hadamard transform across a block of
 * 128 threads (one value each, thread i holds element i): strides 1..16 by
 * warp shuffles, 32 and 64 through shared memory `sm` (128 floats). */
__device__ __forceinline__ float had128_block(float v, float *sm)
{
    const int i = threadIdx.x;
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        const float p = __shfl_xor_sync(0xFFFFFFFFu, v, h);
        v = (i & h) ? p - v : v + p;
    }
#pragma unroll
    for (int h = 32; h < 128; h <<= 1) {
        sm[i] = v;
        __syncthreads();
        const float p = sm[i ^ h];
        __syncthreads();
        v = (i & h) ? p - v : v + p;
    }
    return v * 0.08838834764831845f;
}

/* The integer mul1 GEMM's activation quantisation (docs/cuda.md, "Integer
 * mul1 GEMM"): q = clamp(rint(u·INT_QMAX/max|u|)) per 128-block; the codebook
 * value is INT_A·(b − 510) + INT_D up to its fp16 rounding. */
#define INT_QMAX 32639
#define INT_A (1774.0f / 262144.0f)
#define INT_D (-476.0f / 262144.0f)

/* had128_block by one warp on 128 values held 4 per lane (element lane +
 * 32j in v[j]): strides 1..16 by shuffles, 32 and 64 in registers, in
 * had128_block's order, so the results are bit-identical. */
__device__ __forceinline__ void had128_warp(float v[4], int lane)
{
#pragma unroll
    for (int h = 1; h < 32; h <<= 1)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float p = __shfl_xor_sync(0xFFFFFFFFu, v[j], h);
            v[j] = (lane & h) ? p - v[j] : v[j] + p;
        }
    float a = v[0] + v[1], b = v[0] - v[1], c = v[2] + v[3], d = v[2] - v[3];
    v[0] = (a + c) * 0.08838834764831845f;
    v[1] = (b + d) * 0.08838834764831845f;
    v[2] = (a - c) * 0.08838834764831845f;
    v[3] = (b - d) * 0.08838834764831845f;
}

/* The quantisation of one 128-block held by a warp after its Hadamard (lane l:
 * positions l + 32e): q, A·s_β and Σu on every lane, and on lane 0 the Σq of
 * each of the block's 8 k tiles. q and s are bit-identical to
 * int_input_block's (the max is exact); Σu is summed in another order.
 * Used by the integer GEMV's warp-per-block input launch (gemv_int.cu). */
__device__ __forceinline__ void warp_quant128(const float (&u)[4], int lane, int (&q)[4], float &as, float &su,
                                              int (&kq)[8])
{
    int bad = 0;
    float m = 0.0f;
    su = (u[0] + u[1]) + (u[2] + u[3]);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        bad |= !isfinite(u[e]);
        m = fmaxf(m, isfinite(u[e]) ? fabsf(u[e]) : 0.0f);
    }
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, h));
        su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
        bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, h);
    }
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) q[e] = 0;
    if (bad) {
        s = __int_as_float(0x7FC00000);
    } else if (m != 0.0f) {
        const float inv = (float)INT_QMAX / m;
        s = m / (float)INT_QMAX;
#pragma unroll
        for (int e = 0; e < 4; e++) q[e] = max(-INT_QMAX, min(INT_QMAX, __float2int_rn(u[e] * inv)));
    }
    as = INT_A * s;
    /* Σq per k tile: position l + 32e is in k tile 2e + l/16 */
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int t = q[e];
#pragma unroll
        for (int h = 8; h > 0; h >>= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, h);
        kq[2 * e] = t;
        kq[2 * e + 1] = __shfl_sync(0xFFFFFFFFu, t, 16);
    }
}

} // namespace trellis_dev

#endif
