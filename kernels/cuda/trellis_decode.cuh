/* kernels/cuda/trellis_decode.cuh — device-side decode of EXL3 trellis tiles
 * in registers, shared by the promoted kernels (trellis.cu) and the lab
 * versions (lab/). Not a public header: it is CUDA C++ and only .cu files
 * include it.
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

__device__ __forceinline__ uint32_t h2_bits(__half2 h)
{
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u)
{
    return *reinterpret_cast<__half2 *>(&u);
}

/* Codebook values of two states as a half2 (low half = s0). */
template <int CB>
__device__ __forceinline__ uint32_t cb_pair(uint32_t s0, uint32_t s1)
{
    if constexpr (CB == CB_MUL1) {
        const uint32_t x0 = s0 * 0x83DCD12Du, x1 = s1 * 0x83DCD12Du;
        const uint32_t h0 = __dp4a(x0, 0x01010101u, 0x6400u);
        const uint32_t h1 = __dp4a(x1, 0x01010101u, 0x6400u);
        const __half2 h = bits_h2(__byte_perm(h0, h1, 0x5410));
        const __half2 scale = bits_h2(0x1EEE1EEEu), bias = bits_h2(0xC931C931u);
        return h2_bits(__hfma2(h, scale, bias));
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

/* Decode a lane's 8 values from its three ring words w0..w2 and shift r:
 * out[0..1] = B fragment of the left n8 half, out[2..3] of the right half
 * (each a half2: positions 8t+0,1 | 8t+2,3 | 8t+4,5 | 8t+6,7). */
template <int K, int CB>
__device__ __forceinline__ void lane_decode(uint32_t w0, uint32_t w1, uint32_t w2, unsigned r, uint32_t out[4])
{
    const uint32_t a = __funnelshift_l(w1, w0, r);
    const uint32_t b = __funnelshift_l(w2, w1, r);
    const uint32_t c = w2 << r;
    out[0] = cb_pair<CB>(lane_state<K, 0>(a, b, c), lane_state<K, 1>(a, b, c));
    out[1] = cb_pair<CB>(lane_state<K, 2>(a, b, c), lane_state<K, 3>(a, b, c));
    out[2] = cb_pair<CB>(lane_state<K, 4>(a, b, c), lane_state<K, 5>(a, b, c));
    out[3] = cb_pair<CB>(lane_state<K, 6>(a, b, c), lane_state<K, 7>(a, b, c));
}

/* D += A·B for one m16n8k16 fp16 product with fp32 accumulators. */
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* --- the GEMM loop's pieces, shared by every version ------------------------
 * A warp owns NW adjacent tile columns; lane (g = lane/4, c = lane%4) holds
 * the A fragment of batch rows g and g+8 and accumulators acc[j][half][4]
 * (D rows g, g+8 × columns 2c, 2c+1 of each n8 half of tile column j). */

/* Ring words of U consecutive k tiles × NW adjacent tile columns; p points at
 * the first tile, row_stride = 32-bit words from one k tile to the next. */
template <int K, int NW, int U>
__device__ __forceinline__ void words_load(const uint32_t *p, size_t row_stride, const lane_ring &lr,
                                           uint32_t (&w)[U][NW][3])
{
#pragma unroll
    for (int s = 0; s < U; s++) {
        const uint32_t *pt = p + (size_t)s * row_stride;
#pragma unroll
        for (int j = 0; j < NW; j++) {
            w[s][j][0] = __ldg(pt + j * 8 * K + lr.o0);
            w[s][j][1] = __ldg(pt + j * 8 * K + lr.o1);
            w[s][j][2] = __ldg(pt + j * 8 * K + lr.o2);
        }
    }
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

/* acc += A · (decoded tiles) for the NW tile columns of one k tile. */
template <int K, int CB, int NW>
__device__ __forceinline__ void tiles_mma(const uint32_t (&w)[NW][3], unsigned r, const uint32_t (&a)[4],
                                          float (&acc)[NW][2][4])
{
#pragma unroll
    for (int j = 0; j < NW; j++) {
        uint32_t b[4];
        lane_decode<K, CB>(w[j][0], w[j][1], w[j][2], r, b);
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

} // namespace trellis_dev

#endif
