/* kernels/cuda/trellis.cu — the EXL3 trellis kernels behind the C API of
 * trellis_cuda.h, and the lab versions next to them (kernels/cuda/lab/
 * README.md; trellis_cuda_gemm runs, for mul1 at 1..4 rows, the integer GEMM
 * v45 / v44 / v33 (the main loops of k_gemm_int2 / k_gemm_int below: no fp16
 * weight values, int32 sums on the tensor core; warp-per-block input and
 * output launches, all three PDL-chained), otherwise v10, the balanced kernel
 * below with the lab options of trellis_decode.cuh and programmatic dependent
 * launch; trellis_cuda_moe_forward runs MoE lab v66 for mul1 (five
 * PDL-chained launches: v24's balanced integer loop over all routed experts
 * at once, see k_moe_in_gu; main kernels at ≤ 120 registers, in 16-warp
 * blocks where they have enough work, two loop steps a pass) and v17
 * otherwise, trellis_fused.cuh's block body in two launches with one-wave
 * grids).
 *
 * A GEMM y = x·W (1..16 rows) is three launches on one stream:
 *  1. input:  u = fp16(had128(x ⊙ suh)), one 128-thread block per 128
 *             inputs and row;
 *  2. main:   t += u·Q, one warp per (NW adjacent tile columns, k-split):
 *             per k tile each lane loads its three ring words per column,
 *             decodes 8 values in registers (trellis_decode.cuh) straight
 *             into mma.m16n8k16 B fragments, and issues two mma.sync per
 *             tile with u as the A operand (batch rows = mma rows, so 1..16
 *             rows cost the same decode); partial sums go to t with fp32
 *             atomics;
 *  3. output: y = had128(t) ⊙ svh, and t is zeroed again for the next call.
 * The decode dominates: per weight about four (v10) to five (v2) integer/fp16
 * instructions, so at K ≤ 4 the main kernel is bound by the integer issue
 * rate, not by memory.
 *
 * Decode-only (trellis_cuda_decode_inner) uses the same lane decode and
 * scatters each lane's 8 values into the 16×16 tile. */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_cuda_lab.h"
#include "kernels/cuda/trellis_decode.cuh"
#include "kernels/cuda/trellis_fused.cuh"

using namespace trellis_dev;

/* --- errors ------------------------------------------------------------------ */

static sparq_status cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return SPARQ_OK;
    return sparq_err(e == cudaErrorMemoryAllocation ? SPARQ_E_NOMEM : SPARQ_E_STATE, "cuda: %s: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CUDA_RETURN_IF(expr, ...)                                                  \
    do {                                                                           \
        cudaError_t e_ = (expr);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            char what_[256];                                                       \
            snprintf(what_, sizeof what_, __VA_ARGS__);                            \
            return cuda_status(e_, what_);                                         \
        }                                                                          \
    } while (0)

/* --- kernels ------------------------------------------------------------------- */

/* u[r·k + i] = fp16(had128(x ⊙ suh)); grid (k/128, rows), 128 threads.
 * PDL: let the main kernel start at once (it waits for u itself). */
template <bool PDL = false>
__global__ void __launch_bounds__(128) k_input(const float *__restrict__ x, const __half *__restrict__ suh,
                                               __half *__restrict__ u, int k)
{
    __shared__ float sm[128];
    if constexpr (PDL) griddep_launch();
    const size_t i = (size_t)blockIdx.x * 128 + threadIdx.x, r = blockIdx.y;
    float v = x[r * k + i] * __half2float(suh[i]);
    v = had128_block(v, sm);
    u[r * k + i] = __float2half_rn(v);
}

/* y[r·n + j] = had128(t)[j] ⊙ svh[j], then t = 0; grid (n/128, rows).
 * PDL: launched early, waits for the main kernel before reading t. */
template <bool PDL = false>
__global__ void __launch_bounds__(128) k_output(float *__restrict__ t, const __half *__restrict__ svh,
                                                float *__restrict__ y, int n)
{
    __shared__ float sm[128];
    if constexpr (PDL) griddep_wait();
    const size_t j = (size_t)blockIdx.x * 128 + threadIdx.x, r = blockIdx.y;
    float v = t[r * n + j];
    t[r * n + j] = 0.0f;
    v = had128_block(v, sm);
    y[r * n + j] = v * __half2float(svh[j]);
}

/* Q → fp16 (k×n row-major), one warp per tile, 8 tiles per 256-thread block;
 * D = the lab decode options (trellis_decode.cuh), 0 for the real one. */
template <int K, int CB, int D = 0>
__global__ void __launch_bounds__(256) k_decode(const uint32_t *__restrict__ trellis, __half *__restrict__ q,
                                                int k, int n)
{
    const int lane = threadIdx.x & 31;
    const size_t tile = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int ntiles = n >> 4;
    if (tile >= (size_t)(k >> 4) * ntiles) return;
    const size_t kt = tile / ntiles, nt = tile % ntiles;
    const lane_ring lr = lane_ring_make(K, lane);
    const uint32_t *p = trellis + tile * (8 * K);
    constexpr int NWD = lane_nwords<K, D>();
    uint32_t w[NWD], v[4], sel0 = 0, sel1 = 0;
    w[0] = __ldg(p + lr.o0);
    w[1] = __ldg(p + lr.o1);
    if constexpr (NWD == 3) w[NWD - 1] = __ldg(p + lr.o2);
    if constexpr ((D & DEC_IMMA) != 0) imma_sel_make(lane, sel0, sel1);
    lane_decode_w<K, CB, D, NWD>(w, lr.r, sel0, sel1, 1u, v);
    const int g = lane >> 2, c = lane & 3;
    __half *base = q + (16 * kt) * n + 16 * nt + g;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int row = 2 * c + (i & 1) + 8 * ((i >> 1) & 1), col = 8 * (i >> 2);
        const uint32_t pair = v[i >> 1];
        const uint16_t bits = (i & 1) ? (uint16_t)(pair >> 16) : (uint16_t)(pair & 0xFFFF);
        base[(size_t)row * n + col] = __ushort_as_half(bits);
    }
}

/* t += u·Q for one (group of NW tile columns, k split) per warp; u is fp16
 * rows×k read as half2 words. chunk (k tiles per warp) is a multiple of U. */
template <int K, int CB, int NW, int U>
__global__ void __launch_bounds__(256) k_gemm(const uint32_t *__restrict__ trellis,
                                              const uint32_t *__restrict__ u2, float *__restrict__ t, int k,
                                              int n, int rows, int chunk)
{
    constexpr int TW = 8 * K; /* 32-bit words per tile */
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW;
    const int grp = warp % ngroups, split = warp / ngroups;
    const int kt0 = split * chunk;
    if (kt0 >= ktiles) return;
    const int kt1 = min(kt0 + chunk, ktiles);
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const uint32_t *p = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool lo_ok = g < rows, hi_ok = g + 8 < rows;
    const uint32_t *ua = u2 + (((size_t)g * k) >> 1) + c;
    const uint32_t *ub = u2 + (((size_t)(g + 8) * k) >> 1) + c;
    float acc[NW][2][4];
    acc_zero<NW>(acc);
    for (int kt = kt0; kt < kt1; kt += U) {
        uint32_t w[U][NW][3], a[U][4];
        words_load<K, NW, U>(p + (size_t)(kt - kt0) * row_stride, row_stride, lr, w);
#pragma unroll
        for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
        for (int s = 0; s < U; s++) tiles_mma<K, CB, NW>(w[s], lr.r, a[s], acc);
    }
    acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
}

/* v4 ("balanced"): v2's loop, but a grid of exactly the resident warps, each
 * taking an equal share of the flattened work (tile-column group major, then
 * steps of 4 k tiles), flushing its accumulators with atomics whenever it
 * crosses into the next column group: no partial last wave. TPB threads per
 * block, MINB = blocks per SM the register budget is set for
 * (__launch_bounds__). D = the lab options of v6+ (trellis_decode.cuh:
 * DEC_2W two ring words per lane at K ≤ 4, DEC_IMMA tensor-core byte sums for
 * mul1, DEC_PF next step's words loaded before the current step's decode,
 * DEC_FMA masks on the FMA pipe; one = 1, see lane_state_d); D = 0 is v4. */
template <int K, int CB, int MINB, int TPB, int D = 0>
__global__ void __launch_bounds__(TPB, MINB) k_gemm_bal(const uint32_t *__restrict__ trellis,
                                                        const uint32_t *__restrict__ u2, float *__restrict__ t,
                                                        int k, int n, int rows, int total_warps, uint32_t one)
{
    constexpr int NW = (D & DEC_NW4) ? 4 : 2, U = (D & DEC_NW4) ? 2 : 4, TW = 8 * K, NWD = lane_nwords<K, D>();
    if constexpr ((D & DEC_PDL) != 0) griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW, spg = ktiles / U;
    const long long total = (long long)ngroups * spg;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool lo_ok = g < rows, hi_ok = g + 8 < rows;
    const uint32_t *ua = u2 + (((size_t)g * k) >> 1) + c;
    const uint32_t *ub = u2 + (((size_t)(g + 8) * k) >> 1) + c;
    uint32_t sel0 = 0, sel1 = 0;
    if constexpr ((D & DEC_IMMA) != 0) imma_sel_make(lane, sel0, sel1);
    bool waited = (D & DEC_PDL) == 0; /* PDL: u is read only after griddep_wait */
    while (q < q1) {
        const int grp = (int)(q / spg);
        const long long qend = min(q1, (long long)(grp + 1) * spg);
        const uint32_t *p = trellis + (size_t)grp * NW * TW;
        float acc[NW][2][4];
        acc_zero<NW>(acc);
        uint32_t w[U][NW][NWD];
        if constexpr ((D & DEC_PF) != 0)
            words_load<K, NW, U, NWD>(p + (size_t)(q - (long long)grp * spg) * U * row_stride, row_stride, lr, w);
        if (!waited) {
            griddep_wait();
            waited = true;
        }
        for (; q < qend; q++) {
            const int kt = (int)(q - (long long)grp * spg) * U;
            uint32_t a[U][4];
            if constexpr ((D & DEC_PF) != 0) {
                uint32_t wn[U][NW][NWD];
                /* the next step's words (the last step reloads its own: no branch) */
                const int ktn = q + 1 < qend ? kt + U : kt;
                words_load<K, NW, U, NWD>(p + (size_t)ktn * row_stride, row_stride, lr, wn);
#pragma unroll
                for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
                for (int s = 0; s < U; s++) tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a[s], acc, sel0, sel1, one);
                words_copy<NW, U, NWD>(w, wn);
            } else {
                words_load<K, NW, U, NWD>(p + (size_t)kt * row_stride, row_stride, lr, w);
#pragma unroll
                for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
                for (int s = 0; s < U; s++) tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a[s], acc, sel0, sel1, one);
            }
        }
        acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
    }
}

/* --- the integer mul1 GEMM (lab v20+; docs/cuda.md "Integer mul1 GEMM") ---------
 * For mul1 the GEMM forms no fp16 weight value (the decode kernels still do):
 * per batch row r and 128-block β of u = had128(x ⊙ suh), m = max|u_i|,
 * s_β = m / 32639, q_i = clamp(rint(u_i · 32639 / m), ±32639) (s_β = NaN,
 * q = 0 if a u_i is not finite; s_β = 0, q = 0 if m = 0); per weight b = byte
 * sum of h = state·0x83DCD12D; t_n = Σ_β (A·s_β)·Σ_{i∈β} (b_{i,n} − 510)·q_i
 * + D·Σ_i u_i with A = 1774·2^-18, D = −476·2^-18 (the codebook value is
 * A·(b − 510) + D up to its fp16 rounding); y = had128(t) ⊙ svh. The inner
 * sums are exact int32 on the tensor core (imma_u8s8): A operand = the bytes
 * of h, B operand = q split as hi = (q + 128) >> 8, lo = q − 256·hi (both s8);
 * 256·Σ b·hi + Σ b·lo − 510·Σ q per 64-input half block is the exact I
 * (|I| < 2^31; the wrapping partial sums are harmless). */
/* INT_QMAX, INT_A, INT_D: trellis_decode.cuh */

/* Integer lab options (template bit mask V of k_gemm_int): INT_PACK = the B
 * words of a lane and k tile are stored as one packed word (4 s8 values) and
 * replicated over the 4 k bytes with byte_perm in the main loop (4× less
 * L1/L2 traffic, 4 PRMT per k tile) instead of four pre-replicated words;
 * INT_FMA = state masks on the FMA pipe (lane_state_d's DEC_FMA); INT_LOOP2 =
 * k_gemm_int2's loop (one k tile × 8 tile columns per step); INT_MINB3 = its
 * register budget set for 3 blocks per SM; INT_EPI = no output launch: the
 * warp that completes a 128-column block (int_group_done) transforms it
 * (32: lab v29's in-warp input transform, removed after run 26); INT_WIO = the input and
 * output launches with one warp per 128-block (k_input_int_w, k_output_int_w:
 * shuffles only, no shared memory or barrier) instead of 128-thread blocks;
 * INT_PDLIN = the input launch chained to the previous kernel by PDL too (it
 * loads suh, then waits; the output launch lets the next one start at once);
 * INT_MINB1 = k_gemm_int2 compiled for 1 block of 8 warps per SM (up to 255
 * registers). (512, 1024: 4 tile columns per step, 4 blocks per SM; lab
 * v35–v37, lost in run 28, removed: in git at e333b66.) INT_FLAT =
 * int2_segment as in rounds 3–4 (one pass over a warp's k range, the int32 →
 * fp32 conversion inside it at each 128-block end) instead of one pass per
 * 128-block: v24–v27 and MoE v21–v24 are built with it, as measured then
 * (same SASS: v24's loop 284 instructions + 104 per conversion, as in run
 * 17). Neither form wins everywhere: the per-block pass makes v32 0.4 µs
 * faster than v35 (= v32 flat), the flat one makes MoE v23 0.8 µs faster
 * than v30 (= v23 per block) on Qwen3 shapes (run 34). (4096, before round
 * 8: each block's sums added to t by atomics instead of fp32 partials; lab
 * v36, lost 2.4 µs in run 36, removed: in git at 9bf7e6a.) INT_PP = the loop
 * takes two steps a pass, the first loading the next words into w2, the
 * second back into w, instead of one step a pass and a copy of the next
 * words (12–20 MOVs a step at K = 3: ptxas does not rename across the
 * back edge): 32 instructions a tile instead of 34 (GEMV v44 and, in
 * 16-warp blocks, v45: defaults since runs 69 and 76). With INT_FLAT the
 * pairs start at an even k tile (one step first where a range starts
 * odd), so a 128-block ends only on a pair's second step and the
 * conversion branch follows the pair: MoE v65, the default since run 70
 * (37 → 33 a tile); pairs from the range's start, with the branch after
 * each step (MoE v62–v64), lost in runs 67–69.
 * (8192, 16384: each warp asking L2 for its whole range first, the MoE
 * gate/up warps asking it for the down weights; GEMV v38, MoE v31–v33, lost
 * in run 39, removed: in git at 66237c6; 8192 in round 8: a block's warps
 * taking ranges a grid apart, GEMV v46 / v47, lost in run 68, removed.)
 * INT_B512 = the main kernel in blocks of 16 warps, one per SM,
 * instead of two blocks of 8: the schedulers favour the older of two blocks, so the
 * SM's second block fell behind and finished alone on half the warps
 * (cuda_bench --moe-timeline, run 40: MoE gate/up warps of the first grid
 * half ended 30.1 µs into the call on average, of the second 36.5).
 * (k_moe_int2_r120, "INT_R120" in the lab notes: at most 120 registers a
 * thread, where ptxas gave 122, allocated as 128: two 256-thread blocks then
 * leave 4096 registers, room for one 128-thread block of the small launches
 * (≤ 32 registers), so the main kernel's second block need not wait for the
 * previous launch's blocks to leave the SM, nor the next launch's first
 * block for it; at most 112, room for two: MoE v43, lost in run 44, removed:
 * in git at 66237c6.)
 * (Round 9, lost to v45 on the large shapes and removed: the options are in
 * git at 035cc97, v53, v54 and v56 as combinations of them.
 * 65536 = the loop software-pipelined by hand, each step hashing the operands
 * of the next step's IMMAs while its IMMAs read the set the step before
 * made (ptxas then interleaves them: stall counts −10 %), at 190 registers
 * in one 8-warp block a SM (v52, v55) or with 4 tile columns a step in 8- or
 * 16-warp blocks (v57, v58); 131072 / 262144 = each step asking L2 for the
 * words 2 / 4 steps ahead (v53–v56, v59, v60). Runs 84 and 86–88: the
 * main kernel 0.4–2.2 µs slower on 4096×14336; ncu: issue 56–65 % active in
 * every one, the stall mix moving between fixed-latency waits and long
 * scoreboard.) */
enum {
    INT_PACK = 1,
    INT_FMA = 2,
    INT_LOOP2 = 4,
    INT_MINB3 = 8,
    INT_EPI = 16,
    INT_WIO = 64,
    INT_PDLIN = 128,
    INT_MINB1 = 256,
    INT_FLAT = 2048,
    INT_PP = 4096,
    INT_B512 = 32768
};

/* B operand storage per row group (4 batch rows) and k tile: 32 lanes × 4
 * words (lane (g, c): column g = batch row g/2, hi (g even) or lo; words =
 * inputs 2c, 2c+1, 2c+8, 2c+9, each s8 replicated 4×), or with INT_PACK 32
 * lanes × 1 word (the 4 bytes). */
__host__ __device__ constexpr int int_bwords(int V) { return (V & INT_PACK) ? 1 : 4; }

/* Input transform of the integer GEMM: grid (k/128, rows), 128 threads (the
 * main loop neither loads the B words of rows ≥ `rows` nor uses what lanes of
 * those rows compute, so they are not written). Writes the B words (bq), A·s_β (sa,
 * [row][β]), 510·Σq per 64-input half block (ch, [row][2β + h]) and Σ_{i∈β} u_i
 * (usb, [row][β]). */
/* The B words of input i (0..127) of 128-block beta of row r, q = its 16-bit
 * value: position p = i % 16 of k tile 8β + i/16; lanes (g = 2·(r%4) +
 * {0: hi, 1: lo}, c = (p%8)/2), word 2·(p/8) + p%2. */
template <int V>
__device__ __forceinline__ void int_bq_store(uint32_t *__restrict__ bq, int q, int i, int beta, int r, int ktiles)
{
    const int hi = (q + 128) >> 8, lo = q - 256 * hi;
    const int kt = beta * 8 + (i >> 4), p = i & 15, c = (p & 7) >> 1, word = 2 * (p >> 3) + (p & 1);
    const int g = 2 * (r & 3), lane = 4 * g + c;
    const size_t base = (size_t)((r >> 2) * ktiles + kt) * 32;
    if constexpr ((V & INT_PACK) != 0) {
        uint8_t *b8 = (uint8_t *)(bq + base);
        b8[4 * lane + word] = (uint8_t)hi;
        b8[4 * (lane + 4) + word] = (uint8_t)lo;
    } else {
        bq[(base + lane) * 4 + word] = 0x01010101u * (uint8_t)hi;
        bq[(base + lane + 4) * 4 + word] = 0x01010101u * (uint8_t)lo;
    }
}

/* k_input_int's work for 128-block beta of row r by one warp (INT_WIO):
 * u[e] = (x ⊙ suh) at positions lane + 32e before the Hadamard. */
template <int V>
__device__ __forceinline__ void int_input_warp(float (&u)[4], int beta, int r, int k, uint32_t *__restrict__ bq,
                                               float *__restrict__ sa, int *__restrict__ ch,
                                               float *__restrict__ usb, int *__restrict__ pc)
{
    const int lane = threadIdx.x & 31, nb = k >> 7;
    had128_warp(u, lane);
    int q[4], kq[8];
    float as, su;
    warp_quant128(u, lane, q, as, su, kq);
    if (lane == 0) {
        sa[r * nb + beta] = as;
        usb[r * nb + beta] = su;
        ch[r * 2 * nb + 2 * beta] = 510 * ((kq[0] + kq[1]) + (kq[2] + kq[3]));
        ch[r * 2 * nb + 2 * beta + 1] = 510 * ((kq[4] + kq[5]) + (kq[6] + kq[7]));
        int acc = 0;
        pc[(r * nb + beta) * 9] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            acc += 510 * kq[j];
            pc[(r * nb + beta) * 9 + j + 1] = acc;
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) int_bq_store<V>(bq, q[e], lane + 32 * e, beta, r, k >> 4);
}

/* The body of k_input_int for 128-input block beta of row r (128 threads,
 * thread i holds input i of the block, u = x ⊙ suh before the Hadamard;
 * valid: r < rows, uniform per block). Also the MoE v21+ input stages. */
template <int V>
__device__ __forceinline__ void int_input_block(float u, bool valid, int beta, int r, int k,
                                                uint32_t *__restrict__ bq, float *__restrict__ sa,
                                                int *__restrict__ ch, float *__restrict__ usb, int *__restrict__ pc)
{
    __shared__ float sm[128];
    __shared__ float red_m[4], red_s[4];
    __shared__ int red_q[4], red_bad[4], red_kt[8];
    const int i = threadIdx.x, wid = i >> 5;
    const int nb = k >> 7, ktiles = k >> 4;
    if (valid) u = had128_block(u, sm); /* uniform per block: had128_block synchronises */
    else u = 0.0f;
    int bad = !isfinite(u);
    float m = bad ? 0.0f : fabsf(u), su = u;
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, h));
        su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
        bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, h);
    }
    if ((i & 31) == 0) {
        red_m[wid] = m;
        red_s[wid] = su;
        red_bad[wid] = bad;
    }
    __syncthreads();
    m = fmaxf(fmaxf(red_m[0], red_m[1]), fmaxf(red_m[2], red_m[3]));
    bad = red_bad[0] | red_bad[1] | red_bad[2] | red_bad[3];
    float s;
    int q = 0;
    if (bad) {
        s = __int_as_float(0x7FC00000);
    } else if (m == 0.0f) {
        s = 0.0f;
    } else {
        const float inv = (float)INT_QMAX / m;
        s = m / (float)INT_QMAX;
        q = __float2int_rn(u * inv);
        q = max(-INT_QMAX, min(INT_QMAX, q));
    }
    int sq = q;
#pragma unroll
    for (int h = 8; h > 0; h >>= 1) sq += __shfl_xor_sync(0xFFFFFFFFu, sq, h);
    if ((i & 15) == 0) red_kt[i >> 4] = sq; /* Σq of k tile 8β + i/16 */
    sq += __shfl_xor_sync(0xFFFFFFFFu, sq, 16);
    if ((i & 31) == 0) red_q[wid] = sq;
    __syncthreads();
    if (i == 0) {
        sa[r * nb + beta] = INT_A * s;
        usb[r * nb + beta] = (red_s[0] + red_s[1]) + (red_s[2] + red_s[3]);
        ch[r * 2 * nb + 2 * beta] = 510 * (red_q[0] + red_q[1]);
        ch[r * 2 * nb + 2 * beta + 1] = 510 * (red_q[2] + red_q[3]);
        /* pc[row][β][j] = 510·Σq over k tiles 8β .. 8β + j − 1 (j = 0..8) */
        int acc = 0;
        for (int j = 0; j <= 8; j++) {
            pc[(r * nb + beta) * 9 + j] = acc;
            if (j < 8) acc += 510 * red_kt[j];
        }
    }
    int_bq_store<V>(bq, q, i, beta, r, ktiles);
}

template <int V, bool PDL>
__global__ void __launch_bounds__(128) k_input_int(const float *__restrict__ x, const __half *__restrict__ suh,
                                                   uint32_t *__restrict__ bq, float *__restrict__ sa,
                                                   int *__restrict__ ch, float *__restrict__ usb,
                                                   int *__restrict__ pc, int k, int rows)
{
    if constexpr (PDL) griddep_launch();
    const int i = threadIdx.x, beta = blockIdx.x, r = blockIdx.y;
    const float sh = __half2float(suh[(size_t)beta * 128 + i]);
    griddep_wait(); /* a no-op unless launched with PDL (INT_PDLIN) */
    float u = 0.0f;
    if (r < rows) u = x[(size_t)r * k + (size_t)beta * 128 + i] * sh;
    int_input_block<V>(u, r < rows, beta, r, k, bq, sa, ch, usb, pc);
}

/* y[r·n + j] = had128(t + D·Σu_r)[j] ⊙ svh[j], then t = 0; grid (n/128, rows). */
template <bool PDL>
__global__ void __launch_bounds__(128) k_output_int(float *__restrict__ t, const float *__restrict__ usb,
                                                    const __half *__restrict__ svh, float *__restrict__ y, int n,
                                                    int nb)
{
    __shared__ float sm[128];
    __shared__ float red[4];
    griddep_launch(); /* the next launch may start; it waits before touching what this one reads */
    if constexpr (PDL) griddep_wait();
    const int i = threadIdx.x, r = blockIdx.y;
    const size_t j = (size_t)blockIdx.x * 128 + i;
    float su = 0.0f;
    for (int b = i; b < nb; b += 128) su += usb[r * nb + b];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
    if ((i & 31) == 0) red[i >> 5] = su;
    __syncthreads();
    su = (red[0] + red[1]) + (red[2] + red[3]);
    float v = t[r * (size_t)n + j] + INT_D * su;
    t[r * (size_t)n + j] = 0.0f;
    v = had128_block(v, sm);
    y[r * (size_t)n + j] = v * __half2float(svh[j]);
}

/* INT_WIO: k_input_int with one warp per 128-block; grid (⌈nb/4⌉, rows), 128 threads. */
template <int V, bool PDL>
__global__ void __launch_bounds__(128) k_input_int_w(const float *__restrict__ x, const __half *__restrict__ suh,
                                                     uint32_t *__restrict__ bq, float *__restrict__ sa,
                                                     int *__restrict__ ch, float *__restrict__ usb,
                                                     int *__restrict__ pc, int k, int rows)
{
    if constexpr (PDL) griddep_launch();
    const int lane = threadIdx.x & 31, beta = blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y;
    if (beta >= (k >> 7)) return;
    float u[4];
#pragma unroll
    for (int e = 0; e < 4; e++) u[e] = __half2float(suh[(size_t)beta * 128 + lane + 32 * e]);
    griddep_wait(); /* a no-op unless launched with PDL (INT_PDLIN) */
#pragma unroll
    for (int e = 0; e < 4; e++) u[e] *= x[(size_t)r * k + (size_t)beta * 128 + lane + 32 * e];
    int_input_warp<V>(u, beta, r, k, bq, sa, ch, usb, pc);
    (void)rows;
}

/* INT_WIO: k_output_int with one warp per 128 columns; grid (⌈n/512⌉, rows),
 * 128 threads. svh is loaded before the wait for the main kernel in the
 * source, but ptxas moves the wait above those loads. The t loads are issued
 * before the Σu loop: behind it (until run 79) they waited for its loads and
 * adds, a second L2 round trip after the main kernel (lab v49–v51, run 79:
 * 0.06–0.32 µs faster on every shape, K and version). */
template <bool PDL>
__global__ void __launch_bounds__(128) k_output_int_w(float *__restrict__ t, const float *__restrict__ usb,
                                                      const __half *__restrict__ svh, float *__restrict__ y, int n,
                                                      int nb)
{
    griddep_launch(); /* the next launch may start; it waits before touching what this one reads */
    const int lane = threadIdx.x & 31, cb = blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y;
    if (cb >= (n >> 7)) return;
    float sv[4];
#pragma unroll
    for (int e = 0; e < 4; e++) sv[e] = __half2float(svh[cb * 128 + lane + 32 * e]);
    if constexpr (PDL) griddep_wait();
    float *tr = t + (size_t)r * n + cb * 128;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = tr[lane + 32 * e];
    float su = 0.0f;
    for (int b = lane; b < nb; b += 32) su += usb[r * nb + b];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        v[e] += INT_D * su;
        tr[lane + 32 * e] = 0.0f;
    }
    had128_warp(v, lane);
#pragma unroll
    for (int e = 0; e < 4; e++) y[(size_t)r * n + cb * 128 + lane + 32 * e] = v[e] * sv[e];
}

/* INT_EPI: called by each warp after it has added its partial sums of `work`
 * k tiles for the columns col0.. (part of 128-column block col0/128). The
 * warp that completes the block (cnt reaches total) does k_output_int's work
 * for it: y = had128(t + D·Σu) ⊙ svh for every row, t = 0, cnt = 0. Lane l
 * holds columns l + 32e (e = 0..3): strides 1..16 by shuffles, 32 and 64 in
 * registers. */
__device__ __noinline__ void int_group_done(float *t, unsigned *cnt, const float *usb, const __half *svh, float *y,
                                            int n, int nb, int rows, int col0, int work, int total, int lane)
{
    const int cb = col0 >> 7;
    __syncwarp();
    __threadfence();
    unsigned old = 0;
    if (lane == 0) old = atomicAdd(cnt + cb, (unsigned)work);
    old = __shfl_sync(0xFFFFFFFFu, old, 0);
    if (old + (unsigned)work != (unsigned)total) return;
    __threadfence();
    for (int r = 0; r < rows; r++) {
        float su = 0.0f;
        for (int b = lane; b < nb; b += 32) su += __ldcg(usb + r * nb + b);
#pragma unroll
        for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
        float *tr = t + (size_t)r * n + 128 * cb;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v[e] = __ldcg(tr + lane + 32 * e) + INT_D * su;
            tr[lane + 32 * e] = 0.0f;
        }
        had128_warp(v, lane);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = 128 * cb + lane + 32 * e;
            y[(size_t)r * n + j] = v[e] * __half2float(svh[j]);
        }
    }
    if (lane == 0) cnt[cb] = 0;
}

/* Partial sums of the integer loops into t: lane (g, c) holds batch row
 * 4·rg + c, outputs col0 + 16j + g and col0 + 16j + g + 8. */
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

/* The main loop of the integer GEMM, on v10's balanced grid (equal shares of
 * (column pair, step of 4 k tiles) items per resident warp, next step's words
 * loaded ahead, PDL): per k tile and tile column a lane cuts 8 states, 8 IMAD
 * for h, 2 IMMA per row group of 4 batch rows (RG = 1..4); per step (one
 * 64-input half block) the int32 sums become fp32: f += A·s_β · I. */
template <int K, int RG, int V>
__global__ void __launch_bounds__(256, RG <= 2 ? 2 : 1)
    k_gemm_int(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq, const float *__restrict__ sa,
               const int *__restrict__ ch, float *__restrict__ t, int k, int n, int rows, int total_warps,
               uint32_t one, const __half *__restrict__ svh, float *__restrict__ y, const float *__restrict__ usb,
               unsigned *__restrict__ cnt)
{
    constexpr int NW = 2, U = 4, TW = 8 * K, NWD = lane_nwords<K, DEC_2W>(), BW = int_bwords(V);
    constexpr int D = DEC_2W | ((V & INT_FMA) ? DEC_FMA : 0);
    griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW, spg = ktiles / U, nb = k >> 7;
    const long long total = (long long)ngroups * spg;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    bool bok[RG];
#pragma unroll
    for (int rg = 0; rg < RG; rg++) bok[rg] = 4 * rg + (g >> 1) < rows;
    bool waited = false;
    while (q < q1) {
        const int grp = (int)(q / spg);
        const long long qend = min(q1, (long long)(grp + 1) * spg), q_start = q;
        const uint32_t *p = trellis + (size_t)grp * NW * TW;
        float f[RG][NW][2];
#pragma unroll
        for (int rg = 0; rg < RG; rg++)
#pragma unroll
            for (int j = 0; j < NW; j++) f[rg][j][0] = f[rg][j][1] = 0.0f;
        uint32_t w[U][NW][NWD];
        words_load<K, NW, U, NWD>(p + (size_t)(q - (long long)grp * spg) * U * row_stride, row_stride, lr, w);
        if (!waited) {
            griddep_wait();
            waited = true;
        }
        for (; q < qend; q++) {
            const int kt = (int)(q - (long long)grp * spg) * U;
            uint32_t wn[U][NW][NWD];
            const int ktn = q + 1 < qend ? kt + U : kt;
            words_load<K, NW, U, NWD>(p + (size_t)ktn * row_stride, row_stride, lr, wn);
            uint32_t braw[RG][U][BW];
            float s[RG];
            int cq[RG];
#pragma unroll
            for (int rg = 0; rg < RG; rg++) {
                const uint32_t *pb = bq + ((size_t)(rg * ktiles + kt) * 32 + lane) * BW;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if constexpr (BW == 4) {
                        uint4 v = make_uint4(0u, 0u, 0u, 0u);
                        if (bok[rg]) v = __ldg((const uint4 *)(pb + (size_t)u * 32 * BW));
                        braw[rg][u][0] = v.x;
                        braw[rg][u][1] = v.y;
                        braw[rg][u][2] = v.z;
                        braw[rg][u][3] = v.w;
                    } else {
                        braw[rg][u][0] = bok[rg] ? __ldg(pb + (size_t)u * 32) : 0u;
                    }
                }
                s[rg] = __ldg(sa + (4 * rg + c) * nb + (kt >> 3));
                cq[rg] = __ldg(ch + (4 * rg + c) * 2 * nb + (kt >> 2));
            }
            uint32_t acc[RG][NW][2][4];
#pragma unroll
            for (int rg = 0; rg < RG; rg++)
#pragma unroll
                for (int j = 0; j < NW; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[rg][j][0][e] = acc[rg][j][1][e] = 0u;
#pragma unroll
            for (int u = 0; u < U; u++) {
                uint32_t b[RG][4];
#pragma unroll
                for (int rg = 0; rg < RG; rg++) {
                    if constexpr (BW == 4) {
#pragma unroll
                        for (int e = 0; e < 4; e++) b[rg][e] = braw[rg][u][e];
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) b[rg][e] = __byte_perm(braw[rg][u][0], 0u, 0x1111u * e);
                    }
                }
#pragma unroll
                for (int j = 0; j < NW; j++) {
                    uint32_t x[8];
                    lane_hash_w<K, D, NWD>(w[u][j], lr.r, one, x);
#pragma unroll
                    for (int rg = 0; rg < RG; rg++) tile_imma(x, b[rg], acc[rg][j][0], acc[rg][j][1]);
                }
            }
#pragma unroll
            for (int rg = 0; rg < RG; rg++)
#pragma unroll
                for (int j = 0; j < NW; j++) {
                    const uint32_t h0 = acc[rg][j][0][0] + acc[rg][j][1][0], l0 = acc[rg][j][0][1] + acc[rg][j][1][1];
                    const uint32_t h1 = acc[rg][j][0][2] + acc[rg][j][1][2], l1 = acc[rg][j][0][3] + acc[rg][j][1][3];
                    const int i0 = (int)((h0 << 8) + l0 - (uint32_t)cq[rg]);
                    const int i1 = (int)((h1 << 8) + l1 - (uint32_t)cq[rg]);
                    f[rg][j][0] = fmaf(s[rg], (float)i0, f[rg][j][0]);
                    f[rg][j][1] = fmaf(s[rg], (float)i1, f[rg][j][1]);
                }
            words_copy<NW, U, NWD>(w, wn);
        }
        const int col0 = 16 * grp * NW;
        int_flush<RG, NW>(t, n, rows, col0, g, c, f);
        if constexpr ((V & INT_EPI) != 0)
            int_group_done(t, cnt, usb, svh, y, n, nb, rows, col0, (int)(qend - q_start) * U, 4 * ktiles, lane);
    }
}

/* v24+: the integer loop with one k tile × NW tile columns per step (NW = 8
 * for 1..4 batch rows, 4 for 5..8, 2 above), so a lane's ring words of a step
 * are at immediate offsets from one pointer per word (advanced by one k-tile
 * row per step) and one B load serves NW tiles. Work items are (group of NW
 * tile columns, k tile); the int32 sums become fp32 at each 128-block end
 * and at the end of a warp's range, subtracting 510·Σq of exactly the k
 * tiles summed (pc: per-block prefix sums from k_input_int). V: INT_FMA. */
template <int K, int RG, int V>
__host__ __device__ constexpr int int2_nw()
{
    return RG == 1 ? 8 : RG == 2 ? 4 : 2;
}

/* Lab timeline of the MoE layer's five launches (cuda_bench --moe-timeline):
 * compiled only with -DSPARQ_MOE_TIMELINE (a separate build), a no-op
 * otherwise. g_tl points at one call's record: per launch (0 input, 1
 * gate/up, 2 SwiGLU, 3 down, 4 output), unit (block, or warp in the main
 * kernels; < TL_UNITS) and mark (0 start, 1 past griddepcontrol.wait, 2 end)
 * the %globaltimer value, a plain store (atomics on shared words serialise
 * and moved the marks by µs). */
#define TL_UNITS 4096
#ifdef SPARQ_MOE_TIMELINE
__device__ unsigned long long *g_tl;
__device__ __forceinline__ void tl_mark(int launch, int unit, int mark)
{
    unsigned long long *b = g_tl, t;
    if (!b || unit >= TL_UNITS) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    b[((size_t)launch * TL_UNITS + unit) * 3 + mark] = t;
}
__global__ void k_tl_set(unsigned long long *p) { g_tl = p; }
#define TL(launch, unit, mark) tl_mark(launch, unit, mark)
#else
#define TL(launch, unit, mark) ((void)0)
#endif

/* One warp's segment of k_gemm_int2 (and of the MoE v21+ launches): k tiles
 * kt0..kt1-1 of tile column group grp of the linear at `trellis` (k × n),
 * partial sums added into t. The first segment of a warp waits for the
 * previous launch (PDL) once its first words are in flight. One pass of the
 * outer loop per 128-block, or with INT_FLAT one pass over the whole range
 * converting at each block end (rounds 3–4; see INT_FLAT). */
template <int K, int RG, int V, int TLK = -1>
__device__ __forceinline__ void int2_segment(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                                             const float *__restrict__ sa, const int *__restrict__ pc,
                                             float *__restrict__ t, int k, int n, int rows, int grp, int kt0,
                                             int kt1, const lane_ring &lr, uint32_t one, const bool (&bok)[RG],
                                             bool &waited)
{
    constexpr int NW = int2_nw<K, RG, V>(), TW = 8 * K, NWD = lane_nwords<K, DEC_2W>();
    constexpr int D = DEC_2W | ((V & INT_FMA) ? DEC_FMA : 0);
    constexpr bool FLAT = (V & INT_FLAT) != 0, PP = (V & INT_PP) != 0;
    const int lane = threadIdx.x & 31;
    const int ntiles = n >> 4, ktiles = k >> 4, nb = k >> 7;
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const uint32_t *p0 = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW + lr.o0;
    const uint32_t *p1 = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW + lr.o1;
    const uint32_t *p2 = trellis + (size_t)kt0 * row_stride + (size_t)grp * NW * TW + lr.o2;
    float f[RG][NW][2];
    uint32_t acc[RG][NW][4];
#pragma unroll
    for (int rg = 0; rg < RG; rg++)
#pragma unroll
        for (int j = 0; j < NW; j++) {
            f[rg][j][0] = f[rg][j][1] = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; e++) acc[rg][j][e] = 0u;
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
        if constexpr (TLK >= 0) {
            if (lane == 0) TL(TLK, (blockIdx.x * blockDim.x + threadIdx.x) >> 5, 1);
        }
    }
    /* k tile kt: load the next k tile's words into wn (the last step reloads
     * its own: no branch), the B words, and add 8 tiles' IMMAs of w into acc.
     * Without INT_PP the caller copies wn back into w after every step
     * (ptxas emits 12–20 MOVs a step for it); with INT_PP it alternates w
     * and w2 as (w, wn) two steps at a time. */
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
        uint32_t b[RG][4];
#pragma unroll
        for (int rg = 0; rg < RG; rg++) {
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (bok[rg]) v = __ldg((const uint4 *)(bq + ((size_t)(rg * ktiles + kt) * 32 + lane) * 4));
            b[rg][0] = v.x;
            b[rg][1] = v.y;
            b[rg][2] = v.z;
            b[rg][3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < NW; j++) {
            uint32_t x[8];
            lane_hash_w<K, D, NWD>(w[j], lr.r, one, x);
#pragma unroll
            for (int rg = 0; rg < RG; rg++) tile_imma(x, b[rg], acc[rg][j], acc[rg][j]);
        }
    };
    /* k tiles s0..s1-1 of block β: I = 256·Σb·hi + Σb·lo − 510·Σq, into f; acc = 0 */
    auto convert = [&](int be, int s0, int s1) {
#pragma unroll
        for (int rg = 0; rg < RG; rg++) {
            const int *pcr = pc + ((4 * rg + c) * nb + be) * 9;
            const uint32_t cq = (uint32_t)__ldg(pcr + (s1 - 8 * be)) - (uint32_t)__ldg(pcr + (s0 - 8 * be));
            const float sc = __ldg(sa + (4 * rg + c) * nb + be);
#pragma unroll
            for (int j = 0; j < NW; j++) {
                const int i0 = (int)((acc[rg][j][0] << 8) + acc[rg][j][1] - cq);
                const int i1 = (int)((acc[rg][j][2] << 8) + acc[rg][j][3] - cq);
                f[rg][j][0] = fmaf(sc, (float)i0, f[rg][j][0]);
                f[rg][j][1] = fmaf(sc, (float)i1, f[rg][j][1]);
#pragma unroll
                for (int e = 0; e < 4; e++) acc[rg][j][e] = 0u;
            }
        }
    };
    auto keep = [&]() { /* w = w2: the next step starts from w */
#pragma unroll
        for (int j = 0; j < NW; j++)
#pragma unroll
            for (int e = 0; e < NWD; e++) w[j][e] = w2[j][e];
    };
    if constexpr (FLAT) { /* rounds 3–4: one pass, converting at each block end */
        int seg = kt0;
        auto ends = [&](int kt) {
            if (((kt + 1) & 7) == 0 || kt + 1 == kt1) {
                convert(kt >> 3, seg, kt + 1);
                seg = kt + 1;
            }
        };
        if constexpr (PP) { /* pairs from an even k tile: a block ends only on a pair's second step */
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
        } else {
            for (int kt = kt0; kt < kt1; kt++) {
                step(kt, w, w2);
                keep();
                ends(kt);
            }
        }
    } else { /* round 5: one pass per 128-block */
        for (int kt = kt0; kt < kt1;) {
            const int be = kt >> 3, seg = kt, kend = min(kt1, 8 * be + 8);
            if constexpr (PP) {
                for (; kt + 2 <= kend; kt += 2) {
                    step(kt, w, w2);
                    step(kt + 1, w2, w);
                }
            }
            for (; kt < kend; kt++) { /* PP: an odd count's last step */
                step(kt, w, w2);
                keep();
            }
            convert(be, seg, kend);
        }
    }
    int_flush<RG, NW>(t, n, rows, 16 * grp * NW, g, c, f);
}

/* k_gemm_int2's body; k_gemm_int2 and k_gemm_int2_r120 differ only in their
 * register budget. */
template <int K, int RG, int V>
__device__ __forceinline__ void gemm_int2_body(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                                               const float *__restrict__ sa, const int *__restrict__ pc,
                                               float *__restrict__ t, int k, int n, int rows, int total_warps,
                                               uint32_t one, const __half *__restrict__ svh, float *__restrict__ y,
                                               const float *__restrict__ usb, unsigned *__restrict__ cnt)
{
    constexpr int NW = int2_nw<K, RG, V>();
    griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW;
    const long long total = (long long)ngroups * ktiles;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const int g = lane >> 2;
    bool bok[RG];
#pragma unroll
    for (int rg = 0; rg < RG; rg++) bok[rg] = 4 * rg + (g >> 1) < rows;
    bool waited = false;
    while (q < q1) {
        const int grp = (int)(q / ktiles);
        const int kt0 = (int)(q - (long long)grp * ktiles);
        const int kt1 = (int)(min(q1, (long long)(grp + 1) * ktiles) - (long long)grp * ktiles);
        q += kt1 - kt0;
        int2_segment<K, RG, V>(trellis, bq, sa, pc, t, k, n, rows, grp, kt0, kt1, lr, one, bok, waited);
        if constexpr ((V & INT_EPI) != 0)
            int_group_done(t, cnt, usb, svh, y, n, (k >> 7), rows, 16 * grp * NW, kt1 - kt0, ktiles * (8 / NW), lane);
    }
}

template <int K, int RG, int V, int MINB>
__global__ void __launch_bounds__(256, MINB)
    k_gemm_int2(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq, const float *__restrict__ sa,
                const int *__restrict__ pc, float *__restrict__ t, int k, int n, int rows, int total_warps,
                uint32_t one, const __half *__restrict__ svh, float *__restrict__ y, const float *__restrict__ usb,
                unsigned *__restrict__ cnt)
{
    gemm_int2_body<K, RG, V>(trellis, bq, sa, pc, t, k, n, rows, total_warps, one, svh, y, usb, cnt);
}

/* GEMV lab v42: at most 120 registers a thread, launched in 16-warp blocks
 * (one a SM, with room for a block of the small launches beside it; as MoE v56). */
template <int K, int RG, int V>
__global__ void __maxnreg__(120)
    k_gemm_int2_r120(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                     const float *__restrict__ sa, const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                     int rows, int total_warps, uint32_t one, const __half *__restrict__ svh,
                     float *__restrict__ y, const float *__restrict__ usb, unsigned *__restrict__ cnt)
{
    gemm_int2_body<K, RG, V>(trellis, bq, sa, pc, t, k, n, rows, total_warps, one, svh, y, usb, cnt);
}

/* --- fused MoE decode layer, MoE lab v21+ (mul1): v24's balanced integer loop ---------
 * Five launches, chained by programmatic dependent launch (PDL) from the second on:
 *   k_moe_in_gu    grid (hidden/128, 2·pairs): job 2·pair + {0 gate, 1 up}:
 *                  quantised had128(x[token] ⊙ suh) as k_input_int (B words, A·s_β, prefix sums)
 *   k_moe_int2<GU> one balanced grid of exactly the resident warps over the work
 *                  items (job, group of 8 tile columns, k tile) of ALL jobs, equal
 *                  ranges per warp (a range may cross jobs): int2_segment per
 *                  (job, group) piece, partial sums into t_gu[job]
 *   k_moe_mid      grid (inter/128, pairs): output transform of gate and up
 *                  (had128(t + D·Σu) ⊙ svh, t = 0), SwiGLU, and the down input
 *                  transform of the same 128 values (x ⊙ suh_down, had128, quantise)
 *   k_moe_int2<!GU> the same balanced grid over the down jobs, into t_down[pair]
 *   k_moe_out      grid (hidden/128, tokens): out[token] += Σ_j w_j · had128(t_down +
 *                  D·Σu) ⊙ svh_down over the token's pairs, t_down = 0 (no atomics)
 * The first launch is plain (it rewrites scratch the previous call read); in
 * v27/v28 it is PDL-chained to the previous kernel and waits for it before it
 * lets the others start (they read the routing before their own waits). */
template <int V, bool PDLIN>
__global__ void __launch_bounds__(128) k_moe_in_gu(moe_proj gate, moe_proj up, const int *__restrict__ ids,
                                                   const float *__restrict__ x, uint32_t *__restrict__ bq,
                                                   float *__restrict__ sa, int *__restrict__ ch,
                                                   float *__restrict__ usb, int *__restrict__ pc, int hidden,
                                                   int top_k)
{
    /* PDLIN (MoE v27+): chained to the previous kernel by PDL (ids and x come
     * from it). Wait first, then let the next launch start: the later launches
     * read the routing before their own waits, so it must be final by then. */
    if (threadIdx.x == 0) TL(0, blockIdx.y * gridDim.x + blockIdx.x, 0);
    if constexpr (PDLIN) griddep_wait();
    griddep_launch();
    if (threadIdx.x == 0) TL(0, blockIdx.y * gridDim.x + blockIdx.x, 1);
    const int job = blockIdx.y, pair = job >> 1, token = pair / top_k, e = ids[pair], beta = blockIdx.x;
    const int i = threadIdx.x, nb = hidden >> 7, ktiles = hidden >> 4;
    const __half *suh = (job & 1) ? up.suh[e] : gate.suh[e];
    const float u = x[(size_t)token * hidden + beta * 128 + i] * __half2float(suh[beta * 128 + i]);
    int_input_block<V>(u, true, beta, 0, hidden, bq + (size_t)job * ktiles * 128, sa + (size_t)job * nb,
                       ch + (size_t)job * 2 * nb, usb + (size_t)job * nb, pc + (size_t)job * nb * 9);
    if (i == 0) TL(0, blockIdx.y * gridDim.x + blockIdx.x, 2);
}

/* The main kernel's body; k_moe_int2 and k_moe_int2_r120 below differ only in
 * their register budget. */
template <int K, int V, bool GU>
__device__ __forceinline__ void moe_int2_body(moe_proj pa, moe_proj pb, const int *__restrict__ ids,
                                              const uint32_t *__restrict__ bq, const float *__restrict__ sa,
                                              const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                                              int jobs, int total_warps, uint32_t one)
{
    constexpr int NW = int2_nw<K, 1, V>();
    griddep_launch();
    const int lane = threadIdx.x & 31;
    if (lane == 0) TL(GU ? 1 : 3, (blockIdx.x * blockDim.x + threadIdx.x) >> 5, 0);
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ktiles = k >> 4, ngroups = (n >> 4) / NW, nb = k >> 7;
    const long long per_job = (long long)ngroups * ktiles, total = per_job * jobs;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const bool bok[1] = {lane < 8}; /* one row: B lanes g = 0 (hi), 1 (lo) */
    bool waited = false;
    while (q < q1) {
        const int job = (int)(q / per_job);
        const long long qj = q - (long long)job * per_job;
        const int grp = (int)(qj / ktiles);
        const int kt0 = (int)(qj - (long long)grp * ktiles);
        const int kt1 =
            (int)(min(q1 - (long long)job * per_job, (long long)(grp + 1) * ktiles) - (long long)grp * ktiles);
        q += kt1 - kt0;
        const int e = __ldg(ids + (GU ? job >> 1 : job));
        const uint32_t *tr = (GU && (job & 1)) ? pb.tr[e] : pa.tr[e];
        int2_segment<K, 1, V, GU ? 1 : 3>(tr, bq + (size_t)job * ktiles * 128, sa + (size_t)job * nb,
                                          pc + (size_t)job * nb * 9, t + (size_t)job * n, k, n, 1, grp, kt0, kt1,
                                          lr, one, bok, waited);
    }
    if (lane == 0) TL(GU ? 1 : 3, warp, 2);
}

template <int K, int V, int MINB, bool GU>
__global__ void __launch_bounds__((V & INT_B512) ? 512 : 256, (V & INT_B512) ? 1 : MINB)
    k_moe_int2(moe_proj pa, moe_proj pb, const int *__restrict__ ids, const uint32_t *__restrict__ bq,
               const float *__restrict__ sa, const int *__restrict__ pc, float *__restrict__ t, int k, int n,
               int jobs, int total_warps, uint32_t one)
{
    moe_int2_body<K, V, GU>(pa, pb, ids, bq, sa, pc, t, k, n, jobs, total_warps, one);
}

/* INT_R120 (MoE v40, v41): at most 120 registers (256-thread blocks; nvcc
 * takes __maxnreg__ or __launch_bounds__ on a kernel, not both). */
template <int K, int V, bool GU>
__global__ void __maxnreg__(120)
    k_moe_int2_r120(moe_proj pa, moe_proj pb, const int *__restrict__ ids, const uint32_t *__restrict__ bq,
                    const float *__restrict__ sa, const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                    int jobs, int total_warps, uint32_t one)
{
    moe_int2_body<K, V, GU>(pa, pb, ids, bq, sa, pc, t, k, n, jobs, total_warps, one);
}

/* Σ over the nb entries s[0..nb) by a 128-thread block (red: 4 floats). */
__device__ __forceinline__ float block_sum128(const float *__restrict__ s, int nb, float *red)
{
    const int i = threadIdx.x;
    float su = 0.0f;
    for (int b = i; b < nb; b += 128) su += s[b];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
    __syncthreads(); /* red may still be read from the previous call */
    if ((i & 31) == 0) red[i >> 5] = su;
    __syncthreads();
    return (red[0] + red[1]) + (red[2] + red[3]);
}

/* had128_block on two values a thread at once (one set of barriers for both;
 * each value sees had128_block's operations in its order: bit-identical). */
__device__ __forceinline__ void had128_block2(float &v0, float &v1, float2 *sm)
{
    const int i = threadIdx.x;
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        const float p0 = __shfl_xor_sync(0xFFFFFFFFu, v0, h), p1 = __shfl_xor_sync(0xFFFFFFFFu, v1, h);
        v0 = (i & h) ? p0 - v0 : v0 + p0;
        v1 = (i & h) ? p1 - v1 : v1 + p1;
    }
#pragma unroll
    for (int h = 32; h < 128; h <<= 1) {
        sm[i] = make_float2(v0, v1);
        __syncthreads();
        const float2 p = sm[i ^ h];
        __syncthreads();
        v0 = (i & h) ? p.x - v0 : v0 + p.x;
        v1 = (i & h) ? p.y - v1 : v1 + p.y;
    }
    v0 *= 0.08838834764831845f;
    v1 *= 0.08838834764831845f;
}

/* PRE (v23+): every load that does not depend on the previous launch (the
 * expert id, its svh / suh values) is issued before griddep_wait, and both
 * jobs' t and Σu loads before either reduction; v21, v22: one job after the
 * other, loads after the wait. PAIR (MoE v50): the gate and up Hadamards
 * through one set of barriers (had128_block2). T1 (MoE v66): both jobs' t
 * loads first, then one Σu loop loading both jobs' terms; before, the second
 * job's t load and its Σu loop came after the first job's loop, whose adds
 * wait for its loads: three L2 round trips after the wait, not one. */
template <int V, bool PRE, bool PAIR = false, bool T1 = false>
__global__ void __launch_bounds__(128)
    k_moe_mid(moe_proj gate, moe_proj up, moe_proj down, const int *__restrict__ ids, float *__restrict__ t_gu,
              const float *__restrict__ usb_gu, uint32_t *__restrict__ bq, float *__restrict__ sa,
              int *__restrict__ ch, float *__restrict__ usb, int *__restrict__ pc, int hidden, int inter)
{
    __shared__ float sm[128];
    __shared__ float red[4];
    griddep_launch();
    if (threadIdx.x == 0) TL(2, blockIdx.y * gridDim.x + blockIdx.x, 0);
    const int pair = blockIdx.y, beta = blockIdx.x, i = threadIdx.x, e = ids[pair];
    const int nbh = hidden >> 7, nbi = inter >> 7, kti = inter >> 4;
    const size_t j = (size_t)beta * 128 + i;
    float v[2];
    float sd;
    if constexpr (PRE) {
        const float sg = __half2float(gate.svh[e][j]), su_ = __half2float(up.svh[e][j]);
        sd = __half2float(down.suh[e][j]);
        griddep_wait();
        if (i == 0) TL(2, blockIdx.y * gridDim.x + blockIdx.x, 1);
        float a[2], us[2] = {0.0f, 0.0f};
        if constexpr (T1) {
            a[0] = t_gu[(size_t)(2 * pair) * inter + j];
            a[1] = t_gu[(size_t)(2 * pair + 1) * inter + j];
            for (int b = i; b < nbh; b += 128) {
                us[0] += usb_gu[(size_t)(2 * pair) * nbh + b];
                us[1] += usb_gu[(size_t)(2 * pair + 1) * nbh + b];
            }
        } else {
#pragma unroll
            for (int w = 0; w < 2; w++) {
                a[w] = t_gu[(size_t)(2 * pair + w) * inter + j];
                for (int b = i; b < nbh; b += 128) us[w] += usb_gu[(size_t)(2 * pair + w) * nbh + b];
            }
        }
#pragma unroll
        for (int w = 0; w < 2; w++) t_gu[(size_t)(2 * pair + w) * inter + j] = 0.0f;
#pragma unroll
        for (int h = 16; h > 0; h >>= 1) {
            us[0] += __shfl_xor_sync(0xFFFFFFFFu, us[0], h);
            us[1] += __shfl_xor_sync(0xFFFFFFFFu, us[1], h);
        }
        __shared__ float red2[2][4];
        if ((i & 31) == 0) {
            red2[0][i >> 5] = us[0];
            red2[1][i >> 5] = us[1];
        }
        __syncthreads();
        if constexpr (PAIR) {
            __shared__ float2 sm2[128];
            float w0 = a[0] + INT_D * ((red2[0][0] + red2[0][1]) + (red2[0][2] + red2[0][3]));
            float w1 = a[1] + INT_D * ((red2[1][0] + red2[1][1]) + (red2[1][2] + red2[1][3]));
            had128_block2(w0, w1, sm2);
            v[0] = w0 * sg;
            v[1] = w1 * su_;
        } else {
#pragma unroll
            for (int w = 0; w < 2; w++) {
                const float su = (red2[w][0] + red2[w][1]) + (red2[w][2] + red2[w][3]);
                v[w] = had128_block(a[w] + INT_D * su, sm) * (w ? su_ : sg);
            }
        }
    } else {
        griddep_wait();
#pragma unroll
        for (int w = 0; w < 2; w++) {
            const int job = 2 * pair + w;
            const float su = block_sum128(usb_gu + (size_t)job * nbh, nbh, red);
            float a = t_gu[(size_t)job * inter + j] + INT_D * su;
            t_gu[(size_t)job * inter + j] = 0.0f;
            a = had128_block(a, sm);
            v[w] = a * __half2float((w ? up.svh[e] : gate.svh[e])[j]);
        }
        sd = __half2float(down.suh[e][j]);
    }
    const float z = v[0] / (1.0f + __expf(-v[0])) * v[1];
    int_input_block<V>(z * sd, true, beta, 0, inter, bq + (size_t)pair * kti * 128, sa + (size_t)pair * nbi,
                       ch + (size_t)pair * 2 * nbi, usb + (size_t)pair * nbi, pc + (size_t)pair * nbi * 9);
    if (i == 0) TL(2, blockIdx.y * gridDim.x + blockIdx.x, 2);
}

/* v21, v22: grid (hidden/128, tokens), the token's pairs one after the other
 * (a chain of dependent loads per pair: it cost ~10 µs at top-8, run 21). */
__global__ void __launch_bounds__(128) k_moe_out(moe_proj down, const int *__restrict__ ids,
                                                 const float *__restrict__ weights, float *__restrict__ t_d,
                                                 const float *__restrict__ usb_d, float *__restrict__ out, int hidden,
                                                 int inter, int top_k)
{
    __shared__ float sm[128];
    __shared__ float red[4];
    griddep_wait();
    const int token = blockIdx.y, i = threadIdx.x, nbi = inter >> 7;
    const size_t j = (size_t)blockIdx.x * 128 + i;
    float acc = 0.0f;
    for (int jj = 0; jj < top_k; jj++) {
        const int pair = token * top_k + jj, e = ids[pair];
        const float su = block_sum128(usb_d + (size_t)pair * nbi, nbi, red);
        float a = t_d[(size_t)pair * hidden + j] + INT_D * su;
        t_d[(size_t)pair * hidden + j] = 0.0f;
        a = had128_block(a, sm);
        acc = fmaf(weights[pair], a * __half2float(down.svh[e][j]), acc);
    }
    out[(size_t)token * hidden + j] += acc;
}

/* v23+: grid (hidden/128, pairs), one pair per block, added into out with
 * atomics; the expert's svh and the routing weight are loaded before the wait. */
template <bool EARLY>
__global__ void __launch_bounds__(128) k_moe_out_par(moe_proj down, const int *__restrict__ ids,
                                                     const float *__restrict__ weights, float *__restrict__ t_d,
                                                     const float *__restrict__ usb_d, float *__restrict__ out,
                                                     int hidden, int inter, int top_k)
{
    __shared__ float sm[128];
    __shared__ float red[4];
    if constexpr (EARLY) griddep_launch(); /* MoE v27+: the next layer's first launch may start (it waits) */
    if (threadIdx.x == 0) TL(4, blockIdx.y * gridDim.x + blockIdx.x, 0);
    const int pair = blockIdx.y, token = pair / top_k, i = threadIdx.x, nbi = inter >> 7, e = ids[pair];
    const size_t j = (size_t)blockIdx.x * 128 + i;
    const float sv = weights[pair] * __half2float(down.svh[e][j]);
    griddep_wait();
    if (i == 0) TL(4, blockIdx.y * gridDim.x + blockIdx.x, 1);
    const float a = t_d[(size_t)pair * hidden + j];
    const float su = block_sum128(usb_d + (size_t)pair * nbi, nbi, red);
    t_d[(size_t)pair * hidden + j] = 0.0f;
    atomicAdd(out + (size_t)token * hidden + j, had128_block(a + INT_D * su, sm) * sv);
    if (i == 0) TL(4, blockIdx.y * gridDim.x + blockIdx.x, 2);
}

/* trellis_cuda_lab_slow_copy: lets PDL dependents start at once, spins ns
 * nanoseconds, then copies n words (a producer that writes late). */
__global__ void k_slow_copy(uint32_t *__restrict__ dst, const uint32_t *__restrict__ src, size_t n,
                            unsigned long long ns)
{
    griddep_launch();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

/* The launch floor (trellis_cuda_lab_empty): lets the next launch start, waits for the previous one. */
__global__ void k_empty()
{
    griddep_launch();
    griddep_wait();
}

/* --- dispatch ----------------------------------------------------------------------
 * Kernels are templates on K (1..8) and the codebook; with_k_cb turns the
 * run-time pair into compile-time constants once for every kernel family. */

template <int V>
using ic = std::integral_constant<int, V>;

template <int K, typename F>
static auto with_cb(int cb, F &&f) -> decltype(f(ic<1>{}, ic<0>{}))
{
    switch (cb) {
    case CB_3INST: return f(ic<K>{}, ic<CB_3INST>{});
    case CB_MCG: return f(ic<K>{}, ic<CB_MCG>{});
    case CB_MUL1: return f(ic<K>{}, ic<CB_MUL1>{});
    default: return {};
    }
}

/* f(ic<K>, ic<CB>) for run-time K and cb; a value-initialised result (NULL) if
 * either is out of range. */
template <typename F>
static auto with_k_cb(int K, int cb, F &&f) -> decltype(f(ic<1>{}, ic<0>{}))
{
    switch (K) {
    case 1: return with_cb<1>(cb, f);
    case 2: return with_cb<2>(cb, f);
    case 3: return with_cb<3>(cb, f);
    case 4: return with_cb<4>(cb, f);
    case 5: return with_cb<5>(cb, f);
    case 6: return with_cb<6>(cb, f);
    case 7: return with_cb<7>(cb, f);
    case 8: return with_cb<8>(cb, f);
    default: return {};
    }
}

typedef void (*gemm_fn)(const uint32_t *, const uint32_t *, float *, int, int, int, int);
typedef void (*bal_fn)(const uint32_t *, const uint32_t *, float *, int, int, int, int, uint32_t);
typedef void (*decode_fn)(const uint32_t *, __half *, int, int);
typedef void (*fused_fn)(const uint32_t *, const float *, const __half *, const __half *, float *, unsigned *,
                         float *, int, int, int, int);
typedef void (*moe_gu_fn)(moe_proj, moe_proj, const int *, const float *, float *, float *, unsigned *, int, int,
                          int, int);
typedef void (*moe_down_fn)(moe_proj, const int *, const float *, const float *, float *, float *, unsigned *, int,
                            int, int, int);

/* v2 shapes: (2,4) and (1,8) for every K and codebook, the other lab shapes
 * for mul1 at K = 2..4 only (compile time). */
static gemm_fn gemm_pick(int K, int cb, int nw, int unroll)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> gemm_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if (nw == 2 && unroll == 4) return k_gemm<KK, CC, 2, 4>;
        if (nw == 1 && unroll == 8) return k_gemm<KK, CC, 1, 8>;
        if constexpr (CC == CB_MUL1 && KK >= 2 && KK <= 4) {
            if (nw == 1 && unroll == 4) return k_gemm<KK, CC, 1, 4>;
            if (nw == 2 && unroll == 8) return k_gemm<KK, CC, 2, 8>;
            if (nw == 4 && unroll == 4) return k_gemm<KK, CC, 4, 4>;
        }
        return NULL;
    });
}

/* v4: minb 2 (256 threads) everywhere; 3 (256 threads), 5, 6 (128 threads) for
 * mul1 at K = 2..4 only. */
static bal_fn bal_pick(int K, int cb, int minb)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> bal_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if (minb == 2) return k_gemm_bal<KK, CC, 2, 256>;
        if constexpr (CC == CB_MUL1 && KK >= 2 && KK <= 4) {
            if (minb == 3) return k_gemm_bal<KK, CC, 3, 256>;
            if (minb == 5) return k_gemm_bal<KK, CC, 5, 128>;
            if (minb == 6) return k_gemm_bal<KK, CC, 6, 128>;
        }
        return NULL;
    });
}

/* Lab versions v6..v8, v10, v12: the balanced kernel with the lab options D
 * (trellis_decode.cuh), every K and codebook; -1 for another version. */
static int lab_version_opts(int version)
{
    switch (version) {
    case 6: return DEC_2W | DEC_PF;
    case 7: return DEC_2W | DEC_PF | DEC_IMMA;
    case 8: return DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA;
    case 10: return DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA | DEC_PDL;
    case 12: return DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA | DEC_PDL | DEC_NW4;
    default: return -1;
    }
}

static bal_fn lab_pick(int K, int cb, int version)
{
    const int d = lab_version_opts(version);
    return with_k_cb(K, cb, [&](auto k, auto c) -> bal_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        constexpr int V8 = DEC_2W | DEC_PF | DEC_IMMA | DEC_FMA;
        switch (d) {
        case DEC_2W | DEC_PF: return k_gemm_bal<KK, CC, 2, 256, DEC_2W | DEC_PF>;
        case DEC_2W | DEC_PF | DEC_IMMA: return k_gemm_bal<KK, CC, 2, 256, DEC_2W | DEC_PF | DEC_IMMA>;
        case V8: return k_gemm_bal<KK, CC, 2, 256, V8>;
        case V8 | DEC_PDL: return k_gemm_bal<KK, CC, 2, 256, V8 | DEC_PDL>;
        case V8 | DEC_PDL | DEC_NW4: return k_gemm_bal<KK, CC, 2, 256, V8 | DEC_PDL | DEC_NW4>;
        default: return NULL;
        }
    });
}

/* v3 (version 3), v9 (v3 with v7's decode) or v11 (v3 with v8's decode). */
static fused_fn fused_pick(int K, int cb, int version = 3)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> fused_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if (version == 9) return k_gemm_fused<KK, CC, 4, DEC_2W | DEC_IMMA>;
        if (version == 11) return k_gemm_fused<KK, CC, 4, DEC_2W | DEC_IMMA | DEC_FMA>;
        return version == 3 ? k_gemm_fused<KK, CC, 4> : NULL;
    });
}

/* The real decode (version 0), or the decode of lab version 6..9. */
static decode_fn decode_pick(int K, int cb, int version = 0)
{
    return with_k_cb(K, cb, [&](auto k, auto c) -> decode_fn {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        switch (version) {
        case 0: return k_decode<KK, CC>;
        case 6: return k_decode<KK, CC, DEC_2W>;
        case 7:
        case 9: return k_decode<KK, CC, DEC_2W | DEC_IMMA>;
        case 8:
        case 10:
        case 11:
        case 12: return k_decode<KK, CC, DEC_2W | DEC_IMMA | DEC_FMA>;
        default: return NULL;
        }
    });
}

/* MoE lab versions (kernels/cuda/lab/README.md): 20 = 17 with the integer
 * mul1 arithmetic (fused_body_int: 16-bit signed activations (|q| ≤ 32639), IMMA on the bytes of
 * h; mul1 only, every K); 5 = round 1 (v3's body),
 * 13 = v9's decode, 14 = 13 + programmatic dependent launch of the down
 * launch, 15 = v11's decode + PDL, 16 = 5 + PDL, 17 / 18 = 14 with the
 * chunk fitted to one / two waves of resident blocks (moe_chunk_fit), 19 =
 * 16 with 17's chunk; -1 for another version. */
static int moe_version_opts(int version)
{
    switch (version) {
    case 5: return 0;
    case 13: return DEC_2W | DEC_IMMA;
    case 14: return DEC_2W | DEC_IMMA | DEC_PDL;
    case 15: return DEC_2W | DEC_IMMA | DEC_FMA | DEC_PDL;
    case 16: return DEC_PDL;
    case 17:
    case 18: return DEC_2W | DEC_IMMA | DEC_PDL;
    case 19: return DEC_PDL;
    case 20: return DEC_2W | DEC_INT | DEC_FMA | DEC_PDL;
    default: return -1;
    }
}

/* The version trellis_cuda_moe_forward runs, and its options (instantiated
 * for every K and codebook; the other versions for mul1 at K = 2..4 only). */
#define MOE_DEFAULT_VERSION 17
/* mul1 layers: v66 = v65 with the SwiGLU launch's t loads issued before its Σu loop
 * (k_moe_mid's T1: one L2 round trip after the wait, not three; run 81: 0.3 µs faster on
 * DeepSeek shapes, 0.2–0.25 on Qwen3's). v65 = v56 with the loop taking two steps a pass from an even k tile
 * (INT_PP with INT_FLAT: no copy of the next words, 37 → 33 instructions a tile; run 70:
 * 0.4–0.7 µs faster on DeepSeek shapes, 0.1 on Qwen3's; v62, the same without the even
 * start, lost in runs 67–69). v56 = v50 with the main kernels in 16-warp blocks, one a SM (gate/up
 * always, down from MOE_B512_ITEMS work items per resident warp), at ≤ 120 registers so
 * that a block of the small launches still fits beside one (runs 56–57: 1.6–2.0 µs faster
 * than v50 on DeepSeek shapes, equal on Qwen3's). v50 = v23 (five
 * PDL-chained launches, v24's balanced integer loop in round 4's form; every K; round 5's
 * variants v27–v30 lost to it in run 34) with both main kernels at ≤ 120 registers (v40:
 * k_moe_int2_r120; won in runs 43–48) and the middle launch's two Hadamards through one set
 * of barriers (run 49: 0.1 µs on Qwen3 shapes) */
#define MOE_MUL1_VERSION 66
/* ... or v20 (v17 with the integer arithmetic) where v66's scratch is absent
 * (hidden or inter not a multiple of 128) */
#define MOE_MUL1_FALLBACK 20
/* v56's and v65's down kernel runs 16-warp blocks from this many work items per resident warp
 * (DeepSeek-V4.1 shapes: 16.4 at one token, where v55's 16-warp down blocks were 0.3–0.8 µs
 * faster than v54's 8-warp ones; Qwen3-30B: 2.9, 0.05–0.1 µs slower; runs 56–57) */
#define MOE_B512_ITEMS 8
#define MOE_DEFAULT_D (DEC_2W | DEC_IMMA | DEC_PDL)

template <int KK, int CC, int D>
static void moe_pick_d(moe_gu_fn *gu, moe_down_fn *down)
{
    if constexpr ((D & DEC_INT) != 0) { /* mul1 only, every K */
        if constexpr (CC == CB_MUL1) {
            *gu = k_moe_gate_up<KK, CC, 4, D>;
            *down = k_moe_down<KK, CC, 4, D>;
        }
    } else if constexpr (D == MOE_DEFAULT_D || (CC == CB_MUL1 && KK >= 2 && KK <= 4)) {
        *gu = k_moe_gate_up<KK, CC, 4, D>;
        *down = k_moe_down<KK, CC, 4, D>;
    }
}

static void moe_pick(int K, int cb, int version, moe_gu_fn *gu, moe_down_fn *down)
{
    *gu = NULL;
    *down = NULL;
    const int d = moe_version_opts(version);
    with_k_cb(K, cb, [&](auto k, auto c) -> int {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        switch (d) {
        case 0: moe_pick_d<KK, CC, 0>(gu, down); break;
        case DEC_2W | DEC_IMMA: moe_pick_d<KK, CC, DEC_2W | DEC_IMMA>(gu, down); break;
        case DEC_2W | DEC_IMMA | DEC_PDL: moe_pick_d<KK, CC, DEC_2W | DEC_IMMA | DEC_PDL>(gu, down); break;
        case DEC_2W | DEC_IMMA | DEC_FMA | DEC_PDL:
            moe_pick_d<KK, CC, DEC_2W | DEC_IMMA | DEC_FMA | DEC_PDL>(gu, down);
            break;
        case DEC_PDL: moe_pick_d<KK, CC, DEC_PDL>(gu, down); break;
        case DEC_2W | DEC_INT | DEC_FMA | DEC_PDL:
            moe_pick_d<KK, CC, DEC_2W | DEC_INT | DEC_FMA | DEC_PDL>(gu, down);
            break;
        default: break;
        }
        return 0;
    });
}

/* MoE lab v21+ (mul1 only): five PDL-chained launches (input, gate/up,
 * SwiGLU, down, output; see k_moe_in_gu). Each version is one row of
 * moe_labs, which names its two main kernels' form (moe_int_form), their
 * block size, the SwiGLU and output launches' generation and whether the
 * input launch is chained to the previous kernel. The versions:
 * 21 = INT_FMA; 22 = no FMA masks (K = 2..4); 23 = 21 with k_moe_mid's
 * loads before its wait and k_moe_out_par; 24 = 23 compiled for 1 block of
 * 8 warps per SM (K = 2..4); 27 = 23 with the input launch chained to the
 * previous kernel by PDL; 28 = 27 with 24's main kernels; 29 / 30 = 28 / 27
 * without the PDL-chained input launch; 34 = 23 with 16-warp blocks, one per
 * SM (INT_B512); 40 = 23 with both main kernels at ≤ 120 registers
 * (k_moe_int2_r120; the default in runs 46–48); 41 = 34's gate/up kernel and
 * 40's down kernel; 50 = 40 with the gate and up Hadamards of the middle
 * launch through one set of barriers (the default in runs 49–55); 54 / 55 =
 * 50 with 40's gate/up / both main kernels in 16-warp blocks (the same
 * kernels: only the block size differs); 56 = 54, and 55's down kernel where
 * it has enough work (MOE_B512_ITEMS; the default in runs 57–69); 65 = 56
 * with two loop steps a pass from an even k tile (INT_PP; the default in runs
 * 70–80); 66 = 65 with the SwiGLU launch's t loads before its Σu loop
 * (k_moe_mid's T1; the default since run 82). Every K unless noted. 21–24,
 * 34, 40, 41, 50, 54–56, 65, 66 run the loop as in round 4 (INT_FLAT), 27–30
 * round 5's (one pass per 128-block). Refused (lost and removed; the lab
 * README has the runs and the commit that still has their code): 25, 26
 * (in-warp input transform, warp-per-block small launches), 31–33, 35–39,
 * 42–49, 51–53 (the SwiGLU and output launches folded into the main
 * kernels), 57–64. */
enum moe_int_form {
    MF_2,       /* k_moe_int2<INT_FMA | INT_FLAT>, 2 blocks a SM */
    MF_NOFMA,   /* k_moe_int2<INT_FLAT>, 2 blocks a SM (K = 2..4) */
    MF_1,       /* k_moe_int2<INT_FMA | INT_FLAT>, 1 block a SM (K = 2..4) */
    MF_B512,    /* k_moe_int2<INT_FMA | INT_FLAT | INT_B512>: 16-warp blocks */
    MF_R120,    /* k_moe_int2_r120<INT_FMA | INT_FLAT> */
    MF_R120_PP, /* k_moe_int2_r120<INT_FMA | INT_FLAT | INT_PP> */
    MF_R5_2,    /* k_moe_int2<INT_FMA> (round 5's loop), 2 blocks a SM */
    MF_R5_1,    /* k_moe_int2<INT_FMA>, 1 block a SM */
};
typedef struct {
    short version;
    signed char gu, down; /* moe_int_form of the two main kernels */
    /* 16-warp blocks for gate/up, down: 0 no, 1 yes, 2 (down) from
     * MOE_B512_ITEMS work items per resident warp */
    signed char b512_gu, b512_down;
    /* the small launches: 0 = v21's (k_moe_mid<0, false>, k_moe_out), 1 =
     * v23's (k_moe_mid PRE, k_moe_out_par), 2 = + PAIR, 3 = + T1 */
    signed char small;
    signed char pdl_in; /* the input launch chained to the previous kernel (and k_moe_out_par<true>) */
} moe_lab;
static const moe_lab moe_labs[] = {
    {21, MF_2, MF_2, 0, 0, 0, 0},           {22, MF_NOFMA, MF_NOFMA, 0, 0, 0, 0},
    {23, MF_2, MF_2, 0, 0, 1, 0},           {24, MF_1, MF_1, 0, 0, 1, 0},
    {27, MF_R5_2, MF_R5_2, 0, 0, 1, 1},     {28, MF_R5_1, MF_R5_1, 0, 0, 1, 1},
    {29, MF_R5_1, MF_R5_1, 0, 0, 1, 0},     {30, MF_R5_2, MF_R5_2, 0, 0, 1, 0},
    {34, MF_B512, MF_B512, 1, 1, 1, 0},     {40, MF_R120, MF_R120, 0, 0, 1, 0},
    {41, MF_B512, MF_R120, 1, 0, 1, 0},     {50, MF_R120, MF_R120, 0, 0, 2, 0},
    {54, MF_R120, MF_R120, 1, 0, 2, 0},     {55, MF_R120, MF_R120, 1, 1, 2, 0},
    {56, MF_R120, MF_R120, 1, 2, 2, 0},     {65, MF_R120_PP, MF_R120_PP, 1, 2, 2, 0},
    {66, MF_R120_PP, MF_R120_PP, 1, 2, 3, 0},
};
enum { N_MOE_LABS = sizeof moe_labs / sizeof moe_labs[0] };

/* The row of an integer MoE version, or -1. */
static int moe_lab_index(int version)
{
    for (int i = 0; i < N_MOE_LABS; i++)
        if (moe_labs[i].version == version) return i;
    return -1;
}

typedef void (*moe_int_fn)(moe_proj, moe_proj, const int *, const uint32_t *, const float *, const int *, float *,
                           int, int, int, int, uint32_t);

template <int KK, bool GU>
static moe_int_fn moe_int_kernel(int form)
{
    constexpr int F = INT_FMA | INT_FLAT;
    switch (form) {
    case MF_2: return k_moe_int2<KK, F, 2, GU>;
    case MF_B512: return k_moe_int2<KK, F | INT_B512, 1, GU>;
    case MF_R120: return k_moe_int2_r120<KK, F, GU>;
    case MF_R120_PP: return k_moe_int2_r120<KK, F | INT_PP, GU>;
    case MF_R5_2: return k_moe_int2<KK, INT_FMA, 2, GU>;
    case MF_R5_1: return k_moe_int2<KK, INT_FMA, 1, GU>;
    default: break;
    }
    if constexpr (KK >= 2 && KK <= 4) {
        if (form == MF_NOFMA) return k_moe_int2<KK, INT_FLAT, 2, GU>;
        if (form == MF_1) return k_moe_int2<KK, INT_FMA | INT_FLAT, 1, GU>;
    }
    return NULL;
}

static void moe_int_pick(int K, const moe_lab &v, moe_int_fn *gu, moe_int_fn *down)
{
    *gu = NULL;
    *down = NULL;
    with_k_cb(K, CB_MUL1, [&](auto k, auto) -> int {
        constexpr int KK = decltype(k)::value;
        *gu = moe_int_kernel<KK, true>(v.gu);
        *down = moe_int_kernel<KK, false>(v.down);
        return 0;
    });
}

/* --- integer mul1 GEMM (lab v20+): kernel choice --------------------------------- */

typedef void (*int_fn)(const uint32_t *, const uint32_t *, const float *, const int *, float *, int, int, int, int,
                       uint32_t, const __half *, float *, const float *, unsigned *);
typedef void (*int_in_fn)(const float *, const __half *, uint32_t *, float *, int *, float *, int *, int, int);

/* Integer lab options of version 20.. (-1: not an integer version; 41, the
 * whole op in one launch with k split over a thread-block cluster, lost in
 * runs 53–55 and was removed: in git at 9df8daa). */
static int int_version_opts(int version)
{
    switch (version) {
    case 20: return 0;
    case 21: return INT_PACK;
    case 22: return INT_FMA;
    case 23: return INT_PACK | INT_FMA;
    case 24: return INT_LOOP2 | INT_FMA | INT_FLAT;
    case 25: return INT_LOOP2 | INT_FLAT;
    case 26: return INT_LOOP2 | INT_FMA | INT_MINB3 | INT_FLAT;
    case 27: return INT_LOOP2 | INT_FMA | INT_EPI | INT_FLAT;
    case 28: return INT_FMA | INT_EPI;
    case 30: return INT_LOOP2 | INT_FMA | INT_WIO;
    case 31: return INT_FMA | INT_WIO;
    case 32: return INT_LOOP2 | INT_FMA | INT_WIO | INT_PDLIN;
    case 33: return INT_FMA | INT_WIO | INT_PDLIN;
    case 34: return INT_LOOP2 | INT_FMA | INT_WIO | INT_PDLIN | INT_MINB1;
    case 35: return INT_LOOP2 | INT_FMA | INT_WIO | INT_PDLIN | INT_FLAT;
    case 42: return INT_LOOP2 | INT_FMA | INT_WIO | INT_PDLIN | INT_B512;
    case 44: return INT_LOOP2 | INT_FMA | INT_WIO | INT_PDLIN | INT_PP;
    case 45: return INT_LOOP2 | INT_FMA | INT_WIO | INT_PDLIN | INT_B512 | INT_PP;
    default: return -1;
    }
}

/* The versions trellis_cuda_gemm may run (29, 24, 22) exist for every K at
 * 1..4 rows; every version exists for K = 2..4 and 1..16 rows (29 runs 24's
 * kernel above 4 rows: its in-warp input holds one row group). */
static bool int_allk(int v)
{
    v &= ~(INT_WIO | INT_PDLIN); /* the same main kernels */
    return v == (INT_LOOP2 | INT_FMA) || v == (INT_LOOP2 | INT_FMA | INT_FLAT) || v == INT_FMA ||
           v == (INT_LOOP2 | INT_FMA | INT_PP);
}

template <int KK, int V>
static int_fn int_pick_rg(int rg)
{
    switch (rg) {
    case 1: return k_gemm_int<KK, 1, V>;
    case 2: return k_gemm_int<KK, 2, V>;
    case 3: return k_gemm_int<KK, 3, V>;
    default: return k_gemm_int<KK, 4, V>;
    }
}

template <int KK, int V>
static int_fn int2_pick_rg(int rg)
{
    constexpr int MB = (V & INT_MINB3) ? 3 : (V & INT_MINB1) ? 1 : 2, VV = V & (INT_FMA | INT_EPI | INT_FLAT | INT_PP);
    switch (rg) {
    case 1: return k_gemm_int2<KK, 1, VV, MB>;
    case 2: return k_gemm_int2<KK, 2, VV, MB>;
    case 3: return k_gemm_int2<KK, 3, VV, (MB > 2 ? 2 : 1)>;
    default: return k_gemm_int2<KK, 4, VV, 1>;
    }
}

template <int KK>
static int_fn int_pick_k(int v, int rg)
{
    if constexpr (KK < 2 || KK > 4) {
        if (rg != 1) return NULL;
        if (v == (INT_LOOP2 | INT_FMA)) return k_gemm_int2<KK, 1, INT_FMA, 2>;
        if (v == (INT_LOOP2 | INT_FMA | INT_PP)) return k_gemm_int2<KK, 1, INT_FMA | INT_PP, 2>;
        if (v == (INT_LOOP2 | INT_FMA | INT_FLAT)) return k_gemm_int2<KK, 1, INT_FMA | INT_FLAT, 2>;
        if (v == INT_FMA) return k_gemm_int<KK, 1, INT_FMA>;
    } else {
        switch (v) {
        case INT_LOOP2 | INT_FMA | INT_EPI | INT_FLAT:
            return int2_pick_rg<KK, INT_LOOP2 | INT_FMA | INT_EPI | INT_FLAT>(rg);
        case INT_FMA | INT_EPI: return int_pick_rg<KK, INT_FMA | INT_EPI>(rg);
        case INT_LOOP2 | INT_FMA: return int2_pick_rg<KK, INT_LOOP2 | INT_FMA>(rg);
        case INT_LOOP2 | INT_FMA | INT_FLAT: return int2_pick_rg<KK, INT_LOOP2 | INT_FMA | INT_FLAT>(rg);
        case INT_LOOP2 | INT_FLAT: return int2_pick_rg<KK, INT_LOOP2 | INT_FLAT>(rg);
        case INT_LOOP2 | INT_FMA | INT_MINB3 | INT_FLAT:
            return int2_pick_rg<KK, INT_LOOP2 | INT_FMA | INT_MINB3 | INT_FLAT>(rg);
        case INT_LOOP2 | INT_FMA | INT_MINB1: return int2_pick_rg<KK, INT_LOOP2 | INT_FMA | INT_MINB1>(rg);
        case INT_LOOP2 | INT_FMA | INT_B512: /* 1..4 rows; more run v32's kernel */
            return rg == 1 ? k_gemm_int2_r120<KK, 1, INT_FMA> : int2_pick_rg<KK, INT_LOOP2 | INT_FMA>(rg);
        case INT_LOOP2 | INT_FMA | INT_PP: return int2_pick_rg<KK, INT_LOOP2 | INT_FMA | INT_PP>(rg);
        case INT_LOOP2 | INT_FMA | INT_B512 | INT_PP:
            return rg == 1 ? k_gemm_int2_r120<KK, 1, INT_FMA | INT_PP>
                           : int2_pick_rg<KK, INT_LOOP2 | INT_FMA | INT_PP>(rg);
        case 0: return int_pick_rg<KK, 0>(rg);
        case INT_PACK: return int_pick_rg<KK, INT_PACK>(rg);
        case INT_FMA: return int_pick_rg<KK, INT_FMA>(rg);
        case INT_PACK | INT_FMA: return int_pick_rg<KK, INT_PACK | INT_FMA>(rg);
        default: return NULL;
        }
    }
    return NULL;
}

static int_fn int_pick(int K, int v, int rg)
{
    v &= ~(INT_WIO | INT_PDLIN); /* the input and output launches only */
    return with_k_cb(K, CB_MUL1, [&](auto k, auto) { return int_pick_k<decltype(k)::value>(v, rg); });
}

/* --- handles ---------------------------------------------------------------------- */

struct trellis_cuda_linear {
    int k, n, K, cb;
    char name[96];
    uint32_t *trellis; /* (k/16)·(n/16) tiles of 8K words */
    __half *suh, *svh;
    __half *q;                /* decoded Q for the prefill path, or NULL */
    cublasHandle_t cublas;    /* created by the first prefill, or NULL */
};

struct trellis_cuda_ws {
    int max_k, max_n;
    __half *u; /* 16 × max_k */
    float *t;  /* 16 × max_n, zero between calls */
    unsigned *counters; /* one per 256 outputs (v3), zero between calls */
    /* the integer mul1 GEMM's input (k_input_int): B words (4 row groups ×
     * max_k/16 k tiles × 32 lanes × 4), A·s_β and Σu per row and 128-block,
     * 510·Σq per row and 64-input half block */
    uint32_t *bq;
    float *sa, *usb;
    int *ch, *pc; /* pc: 9 prefix sums of 510·Σq per row and 128-block */
    unsigned *cnt; /* INT_EPI: k tiles done per 128-column block, zero between calls */
};

static int sm_count(void)
{
    static int cached = 0;
    if (!cached) {
        int dev = 0, n = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0)
            cached = n;
        else
            cached = 132;
    }
    return cached;
}

/* A launch configuration on stream s with programmatic dependent launch
 * allowed (attr: one attribute that must outlive the launch); the caller
 * sets the grid, block and shared memory. */
static cudaLaunchConfig_t pdl_config(cudaLaunchAttribute *attr, cudaStream_t s)
{
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

extern "C" {

int trellis_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

sparq_status trellis_cuda_alloc(void **dev, size_t bytes)
{
    RETURN_IF(!dev, SPARQ_E_ARG, "cuda alloc: no output pointer");
    *dev = NULL;
    CUDA_RETURN_IF(cudaMalloc(dev, bytes ? bytes : 1), "cudaMalloc of %zu bytes", bytes);
    return SPARQ_OK;
}

void trellis_cuda_free(void *dev)
{
    if (dev) cudaFree(dev);
}

sparq_status trellis_cuda_upload(void *dev, const void *host, size_t bytes)
{
    CUDA_RETURN_IF(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "upload of %zu bytes", bytes);
    return SPARQ_OK;
}

sparq_status trellis_cuda_download(void *host, const void *dev, size_t bytes)
{
    CUDA_RETURN_IF(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "download of %zu bytes", bytes);
    return SPARQ_OK;
}

sparq_status trellis_cuda_sync(void *stream)
{
    CUDA_RETURN_IF(cudaStreamSynchronize((cudaStream_t)stream), "stream synchronize");
    CUDA_RETURN_IF(cudaGetLastError(), "kernel error");
    return SPARQ_OK;
}

void trellis_cuda_linear_free(trellis_cuda_linear *lin)
{
    if (!lin) return;
    cudaFree(lin->trellis);
    cudaFree(lin->suh);
    cudaFree(lin->svh);
    cudaFree(lin->q);
    if (lin->cublas) cublasDestroy(lin->cublas);
    free(lin);
}

sparq_status trellis_cuda_linear_upload(const trellis_linear *host, const char *name, trellis_cuda_linear **out)
{
    RETURN_IF(!out, SPARQ_E_ARG, "cuda linear upload: no output handle");
    *out = NULL;
    FORWARD_IF(trellis_linear_check(host, name));
    trellis_cuda_linear *lin = (trellis_cuda_linear *)calloc(1, sizeof *lin);
    RETURN_IF(!lin, SPARQ_E_NOMEM, "%s: no memory for a CUDA linear handle", name ? name : "linear");
    lin->k = host->k;
    lin->n = host->n;
    lin->K = host->K;
    lin->cb = (int)host->cb;
    snprintf(lin->name, sizeof lin->name, "%s", name ? name : "linear");
    const size_t tbytes = (size_t)host->k / 16 * (host->n / 16) * 32 * host->K;
    sparq_status st = SPARQ_OK;
    cudaError_t e = cudaMalloc((void **)&lin->trellis, tbytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&lin->suh, (size_t)host->k * 2);
    if (e == cudaSuccess) e = cudaMalloc((void **)&lin->svh, (size_t)host->n * 2);
    if (e == cudaSuccess) e = cudaMemcpy(lin->trellis, host->trellis, tbytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(lin->suh, host->suh, (size_t)host->k * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(lin->svh, host->svh, (size_t)host->n * 2, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        char what[160];
        snprintf(what, sizeof what, "%s: upload of a %dx%d K=%d linear", lin->name, lin->k, lin->n, lin->K);
        st = cuda_status(e, what);
        trellis_cuda_linear_free(lin);
        return st;
    }
    *out = lin;
    return SPARQ_OK;
}

void trellis_cuda_linear_shape(const trellis_cuda_linear *lin, int *k, int *n, int *K)
{
    if (k) *k = lin ? lin->k : 0;
    if (n) *n = lin ? lin->n : 0;
    if (K) *K = lin ? lin->K : 0;
}

sparq_status trellis_cuda_ws_create(int max_k, int max_n, trellis_cuda_ws **out)
{
    RETURN_IF(!out, SPARQ_E_ARG, "cuda workspace: no output handle");
    *out = NULL;
    RETURN_IF(max_k <= 0 || max_n <= 0, SPARQ_E_ARG, "cuda workspace: bad size %d x %d", max_k, max_n);
    trellis_cuda_ws *ws = (trellis_cuda_ws *)calloc(1, sizeof *ws);
    RETURN_IF(!ws, SPARQ_E_NOMEM, "cuda workspace: no host memory");
    ws->max_k = max_k;
    ws->max_n = max_n;
    const size_t ub = (size_t)TRELLIS_GEMM_MAX_ROWS * max_k * 2, tb = (size_t)TRELLIS_GEMM_MAX_ROWS * max_n * 4;
    cudaError_t e = cudaMalloc((void **)&ws->u, ub);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->t, tb);
    if (e == cudaSuccess) e = cudaMemset(ws->u, 0, ub);
    if (e == cudaSuccess) e = cudaMemset(ws->t, 0, tb);
    const size_t cbytes = (size_t)(max_n + FUSED_COLS - 1) / FUSED_COLS * sizeof(unsigned);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->counters, cbytes);
    if (e == cudaSuccess) e = cudaMemset(ws->counters, 0, cbytes);
    const size_t nbk = (size_t)(max_k + 127) / 128;
    const size_t bqb = (size_t)TRELLIS_GEMM_MAX_ROWS / 4 * (max_k / 16) * 32 * 16; /* 4 row groups of B words */
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->bq, bqb);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->sa, TRELLIS_GEMM_MAX_ROWS * nbk * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->usb, TRELLIS_GEMM_MAX_ROWS * nbk * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->ch, TRELLIS_GEMM_MAX_ROWS * 2 * nbk * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->pc, TRELLIS_GEMM_MAX_ROWS * 9 * nbk * sizeof(int));
    const size_t nbn = (size_t)(max_n + 127) / 128 * sizeof(unsigned);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ws->cnt, nbn);
    if (e == cudaSuccess) e = cudaMemset(ws->cnt, 0, nbn);
    if (e != cudaSuccess) {
        trellis_cuda_ws_free(ws);
        return cuda_status(e, "workspace allocation");
    }
    *out = ws;
    return SPARQ_OK;
}

void trellis_cuda_ws_free(trellis_cuda_ws *ws)
{
    if (!ws) return;
    cudaFree(ws->u);
    cudaFree(ws->t);
    cudaFree(ws->counters);
    cudaFree(ws->bq);
    cudaFree(ws->sa);
    cudaFree(ws->usb);
    cudaFree(ws->ch);
    cudaFree(ws->pc);
    cudaFree(ws->cnt);
    free(ws);
}

sparq_status trellis_cuda_decode_inner(const trellis_cuda_linear *lin, uint16_t *q, void *stream)
{
    return trellis_cuda_decode_lab(lin, q, stream, 0);
}

sparq_status trellis_cuda_decode_lab(const trellis_cuda_linear *lin, uint16_t *q, void *stream, int version)
{
    RETURN_IF(!lin || !q, SPARQ_E_ARG, "cuda decode: missing linear or output");
    decode_fn fn = decode_pick(lin->K, lin->cb, version);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA decode for K=%d codebook %d (lab version %d)", lin->name,
              lin->K, lin->cb, version);
    const size_t tiles = (size_t)(lin->k / 16) * (lin->n / 16);
    fn<<<(unsigned)((tiles + 7) / 8), 256, 0, (cudaStream_t)stream>>>(lin->trellis, (__half *)q, lin->k, lin->n);
    CUDA_RETURN_IF(cudaGetLastError(), "%s: decode launch", lin->name);
    return SPARQ_OK;
}

sparq_status trellis_cuda_lab_timeline(unsigned long long *rec, void *stream)
{
#ifdef SPARQ_MOE_TIMELINE
    k_tl_set<<<1, 1, 0, (cudaStream_t)stream>>>(rec);
    CUDA_RETURN_IF(cudaGetLastError(), "timeline launch");
    return SPARQ_OK;
#else
    (void)rec;
    (void)stream;
    return sparq_err(SPARQ_E_UNSUPPORTED, "cuda moe timeline: built without -DSPARQ_MOE_TIMELINE");
#endif
}

sparq_status trellis_cuda_lab_empty(void *stream, int launches)
{
    RETURN_IF(launches < 1 || launches > 8, SPARQ_E_ARG, "cuda empty launches: %d, expected 1..8", launches);
    cudaStream_t s = (cudaStream_t)stream;
    k_empty<<<1, 32, 0, s>>>();
    CUDA_RETURN_IF(cudaGetLastError(), "empty launch");
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    for (int i = 1; i < launches; i++) CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_empty), "empty launch (PDL)");
    return SPARQ_OK;
}

sparq_status trellis_cuda_lab_slow_copy(void *dst, const void *src, size_t bytes, int spin_us, void *stream)
{
    RETURN_IF(!dst || !src || bytes % 4 || spin_us < 0, SPARQ_E_ARG, "cuda slow copy: bad arguments");
    k_slow_copy<<<1, 256, 0, (cudaStream_t)stream>>>((uint32_t *)dst, (const uint32_t *)src, bytes / 4,
                                                     (unsigned long long)spin_us * 1000ull);
    CUDA_RETURN_IF(cudaGetLastError(), "slow copy launch");
    return SPARQ_OK;
}

/* The checks every GEMM entry point makes before launching. */
static sparq_status gemm_args_check(const trellis_cuda_linear *lin, const float *x, int rows, const float *y,
                                    const trellis_cuda_ws *ws)
{
    RETURN_IF(!lin || !x || !y || !ws, SPARQ_E_ARG, "cuda gemm: missing linear, input, output or workspace");
    RETURN_IF(rows < 1 || rows > TRELLIS_GEMM_MAX_ROWS, SPARQ_E_ARG, "%s: cuda gemm of %d rows, expected 1..%d",
              lin->name, rows, TRELLIS_GEMM_MAX_ROWS);
    RETURN_IF(lin->k > ws->max_k || lin->n > ws->max_n, SPARQ_E_ARG,
              "%s: %dx%d linear does not fit a %dx%d cuda workspace", lin->name, lin->k, lin->n, ws->max_k,
              ws->max_n);
    return SPARQ_OK;
}

/* Default kernel shape: see kernels/cuda/lab/README.md for how it was chosen. */
#define GEMM_DEFAULT_NW 2
#define GEMM_DEFAULT_UNROLL 4

sparq_status trellis_cuda_gemm_lab(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int nw, int unroll, int chunk,
                                   unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    if (nw <= 0) nw = GEMM_DEFAULT_NW;
    if (unroll <= 0) unroll = GEMM_DEFAULT_UNROLL;
    gemm_fn fn = gemm_pick(lin->K, lin->cb, nw, unroll);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm kernel for K=%d codebook %d (nw %d, unroll %d)",
              lin->name, lin->K, lin->cb, nw, unroll);
    cudaStream_t s = (cudaStream_t)stream;
    const int ktiles = lin->k / 16, ngroups = lin->n / 16 / nw;
    if (chunk <= 0) {
        const int target = sm_count() * 32; /* warps */
        int splits = (target + ngroups - 1) / ngroups;
        if (splits < 1) splits = 1;
        chunk = (ktiles + splits - 1) / splits;
    }
    chunk = (chunk + unroll - 1) / unroll * unroll;
    const int splits = (ktiles + chunk - 1) / chunk;
    const long warps = (long)ngroups * splits;
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        fn<<<(unsigned)((warps + 7) / 8), 256, 0, s>>>(lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k,
                                                        lin->n, rows, chunk);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: gemm launch (%ld warps, chunk %d)", lin->name, warps, chunk);
    }
    if (parts & TRELLIS_CUDA_PART_OUTPUT) {
        k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(ws->t, lin->svh, y, lin->n);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: output transform launch", lin->name);
    }
    return SPARQ_OK;
}

/* Largest k split of v3 (k tiles): bounds its shared memory to
 * 16 rows × (64·8 + 4) · 4 B = 33 KB, under the 48 KB static limit. */
#define FUSED_MAX_CHUNK 64

static sparq_status gemm_fused_run(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int chunk, int version)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    fused_fn fn = fused_pick(lin->K, lin->cb, version);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm kernel for K=%d codebook %d", lin->name, lin->K, lin->cb);
    const int ktiles = lin->k / 16, nbc = (lin->n + FUSED_COLS - 1) / FUSED_COLS;
    if (chunk <= 0) {
        const int target = sm_count() * 4; /* blocks of 8 warps: ~32 warps per SM */
        const int splits = (target + nbc - 1) / nbc;
        chunk = (ktiles + splits - 1) / splits;
    }
    chunk = (chunk + 7) / 8 * 8;
    if (chunk > FUSED_MAX_CHUNK) chunk = FUSED_MAX_CHUNK;
    const int splits = (ktiles + chunk - 1) / chunk;
    const size_t smem = fused_smem_bytes(chunk, rows);
    fn<<<(unsigned)(nbc * splits), 256, smem, (cudaStream_t)stream>>>(
        lin->trellis, x, lin->suh, lin->svh, ws->t, ws->counters, y, lin->k, lin->n, rows, chunk);
    CUDA_RETURN_IF(cudaGetLastError(), "%s: fused gemm launch (%d blocks, chunk %d)", lin->name, nbc * splits,
                   chunk);
    return SPARQ_OK;
}

sparq_status trellis_cuda_gemm_v3(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                  trellis_cuda_ws *ws, void *stream, int chunk)
{
    return gemm_fused_run(lin, x, rows, y, ws, stream, chunk, 3);
}

/* The three launches of v4 and v6+ around a balanced main kernel fn (TPB
 * threads per block): grid = the resident warps, at most one per work item. */
static sparq_status gemm_bal_launch(const trellis_cuda_linear *lin, bal_fn fn, int tpb, const float *x, int rows,
                                    float *y, trellis_cuda_ws *ws, void *stream, unsigned parts, bool pdl = false)
{
    const int wpb = tpb / 32;
    int per_sm = 0;
    CUDA_RETURN_IF(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, tpb, 0), "%s: occupancy query",
                   lin->name);
    if (per_sm < 1) per_sm = 1;
    /* no more warps than work items (steps of 4 k tiles × column pairs) */
    const long long items = (long long)(lin->n / 32) * (lin->k / 64);
    long long warps = (long long)per_sm * sm_count() * wpb;
    if (warps > items) warps = items;
    const int blocks = (int)((warps + wpb - 1) / wpb);
    warps = (long long)blocks * wpb;
    cudaStream_t s = (cudaStream_t)stream;
    if (pdl) {
        /* main and output may start before their predecessor ends (they wait
         * with griddepcontrol.wait before reading its results) */
        cudaLaunchAttribute attr[1];
        cudaLaunchConfig_t cfg = pdl_config(attr, s);
        if (parts & TRELLIS_CUDA_PART_INPUT) {
            k_input<true><<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
            CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
        }
        if (parts & TRELLIS_CUDA_PART_MAIN) {
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(tpb);
            CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fn, lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k, lin->n,
                                              rows, (int)warps, 1u),
                           "%s: balanced gemm launch (%d blocks, PDL)", lin->name, blocks);
        }
        if (parts & TRELLIS_CUDA_PART_OUTPUT) {
            cfg.gridDim = dim3(lin->n / 128, rows);
            cfg.blockDim = dim3(128);
            CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_output<true>, ws->t, (const __half *)lin->svh, y, lin->n),
                           "%s: output transform launch (PDL)", lin->name);
        }
        return SPARQ_OK;
    }
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        fn<<<blocks, tpb, 0, s>>>(lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k, lin->n, rows, (int)warps, 1u);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: balanced gemm launch (%d blocks)", lin->name, blocks);
    }
    if (parts & TRELLIS_CUDA_PART_OUTPUT) {
        k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(ws->t, lin->svh, y, lin->n);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: output transform launch", lin->name);
    }
    return SPARQ_OK;
}

sparq_status trellis_cuda_gemm_bal(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int minb, unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    if (minb <= 0) minb = 2;
    bal_fn fn = bal_pick(lin->K, lin->cb, minb);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no balanced CUDA gemm for K=%d codebook %d (%d blocks/SM)", lin->name,
              lin->K, lin->cb, minb);
    return gemm_bal_launch(lin, fn, minb >= 5 ? 128 : 256, x, rows, y, ws, stream, parts);
}

/* --- integer mul1 GEMM (lab v20+) ---------------------------------------------------- */

/* The three launches of the integer GEMM (PDL-overlapped like v10): input
 * transform to q, main loop on the balanced grid, output transform. */
static sparq_status gemm_int_run(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                 trellis_cuda_ws *ws, void *stream, int version, unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    const int v = int_version_opts(version), rg = (rows + 3) / 4;
    RETURN_IF(lin->cb != CB_MUL1, SPARQ_E_UNSUPPORTED, "%s: the integer CUDA gemm (version %d) is for mul1 only",
              lin->name, version);
    int_fn fn = v < 0 ? NULL : int_pick(lin->K, v, rg);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no integer CUDA gemm version %d for K=%d at %d rows", lin->name, version,
              lin->K, rows);
    const int tpb = (v & INT_B512) && rg == 1 ? 512 : 256, wpb = tpb / 32, nb = lin->k / 128;
    int per_sm = 0;
    CUDA_RETURN_IF(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, tpb, 0), "%s: occupancy query",
                   lin->name);
    if (per_sm < 1) per_sm = 1;
    const int nw2 = rg == 1 ? 8 : rg == 2 ? 4 : 2; /* int2_nw */
    const long long items = (v & INT_LOOP2) ? (long long)(lin->n / 16 / nw2) * (lin->k / 16)
                                            : (long long)(lin->n / 32) * (lin->k / 64);
    long long warps = (long long)per_sm * sm_count() * wpb;
    if (warps > items) warps = items;
    const int blocks = (int)((warps + wpb - 1) / wpb);
    warps = (long long)blocks * wpb;
    cudaStream_t s = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        int_in_fn in = (v & INT_PACK) ? k_input_int<INT_PACK, true> : k_input_int<0, true>;
        dim3 grid(nb, rows);
        if (v & INT_WIO) {
            in = (v & INT_PACK) ? k_input_int_w<INT_PACK, true> : k_input_int_w<0, true>;
            grid.x = (nb + 3) / 4;
        }
        cfg.gridDim = grid;
        cfg.blockDim = dim3(128);
        cfg.numAttrs = (v & INT_PDLIN) ? 1 : 0; /* PDL-chained to the previous kernel, or plain */
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, in, x, (const __half *)lin->suh, ws->bq, ws->sa, ws->ch, ws->usb,
                                          ws->pc, lin->k, rows),
                       "%s: integer input transform launch", lin->name);
        cfg.numAttrs = 1;
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(tpb);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fn, (const uint32_t *)lin->trellis, (const uint32_t *)ws->bq,
                                          (const float *)ws->sa, (const int *)((v & INT_LOOP2) ? ws->pc : ws->ch),
                                          ws->t, lin->k, lin->n, rows, (int)warps, 1u, (const __half *)lin->svh,
                                          y, (const float *)ws->usb, ws->cnt),
                       "%s: integer gemm launch (%d blocks, PDL)", lin->name, blocks);
    }
    if ((parts & TRELLIS_CUDA_PART_OUTPUT) && !(v & INT_EPI)) {
        cfg.gridDim = dim3((v & INT_WIO) ? (lin->n / 128 + 3) / 4 : lin->n / 128, rows);
        cfg.blockDim = dim3(128);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, (v & INT_WIO) ? k_output_int_w<true> : k_output_int<true>, ws->t,
                                          (const float *)ws->usb,
                                          (const __half *)lin->svh, y, lin->n, nb),
                       "%s: integer output transform launch (PDL)", lin->name);
    }
    return SPARQ_OK;
}

sparq_status trellis_cuda_gemm_labv(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                    trellis_cuda_ws *ws, void *stream, int version, unsigned parts)
{
    if (version == 9 || version == 11) return gemm_fused_run(lin, x, rows, y, ws, stream, 0, version);
    if (version >= 20) return gemm_int_run(lin, x, rows, y, ws, stream, version, parts);
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    bal_fn fn = lab_pick(lin->K, lin->cb, version);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm lab version %d for K=%d codebook %d", lin->name, version,
              lin->K, lin->cb);
    return gemm_bal_launch(lin, fn, 256, x, rows, y, ws, stream, parts, (lab_version_opts(version) & DEC_PDL) != 0);
}

/* trellis_cuda_gemm runs trellis_cuda_gemm_version's choice: the integer
 * GEMM (v45 / v44 / v33, runs 26 and 69–75 in docs/benchmarks-cuda.md) for mul1 at 1..4 rows,
 * else lab version v10 (run 9): three launches overlapped by programmatic
 * dependent launch, a balanced main grid and v8's decode. */
/* The default's choice (kernels/cuda/lab/README.md, runs 15–17, 26 and 67–77).
 * mul1 at 1..4 rows runs the integer GEMM:
 *  - at one row, v45 (v24's loop: one k tile × 8 tile columns per step, two
 *    steps a pass so that no step copies its next words, 16-warp blocks at
 *    ≤ 120 registers) where there are at least INT_V45_ITEMS of its work
 *    items per resident warp: the fastest of v33/v32/v44/v45 on 13 of the 17
 *    shapes of runs 74–77 from 5.8 items a warp up, and within 0.2–0.5 µs
 *    on the other four (8192×8192, 8192×3072, 6144×4096, 5120×5120); at
 *    4.8 items a warp v33 and v45 each won one of three shapes;
 *  - at 2..4 rows, v44 (the same loop in 8-warp blocks; v45's 16 adjacent
 *    warps flush the same outputs' atomics for every row and lost 0.7–2.5 µs
 *    at 2 and 4 rows) where there are at least INT_V24_ITEMS (run 75);
 *  - else v33 (v22's loop: 4 k tiles × 2 tile columns, 4× more items, better
 *    spread on small linears: 4096×4096 and smaller).
 * All with the input and output launches one warp per 128-block and all
 * three launches PDL-chained. 5..16 rows and the other codebooks run v10 (the
 * integer loop's IMMA count grows with each group of 4 rows: 5 rows already
 * cost more than v10). */
#define INT_V45_ITEMS 5
#define INT_V24_ITEMS 8
int trellis_cuda_gemm_version(const trellis_cuda_linear *lin, int rows)
{
    if (!lin || lin->cb != CB_MUL1 || rows > 4) return 10;
    const long long items = (long long)(lin->n / 128) * (lin->k / 16), warps = (long long)sm_count() * 16;
    if (rows == 1) return items >= INT_V45_ITEMS * warps ? 45 : 33;
    return items >= INT_V24_ITEMS * warps ? 44 : 33;
}

int trellis_cuda_sm_count(void) { return sm_count(); }

int trellis_cuda_gemm_lab_allk(int version)
{
    const int v = int_version_opts(version);
    return v >= 0 && int_allk(v);
}

sparq_status trellis_cuda_gemm(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                               trellis_cuda_ws *ws, void *stream)
{
    RETURN_IF(!lin, SPARQ_E_ARG, "cuda gemm: no linear");
    return trellis_cuda_gemm_labv(lin, x, rows, y, ws, stream, trellis_cuda_gemm_version(lin, rows),
                                  TRELLIS_CUDA_PART_ALL);
}

sparq_status trellis_cuda_gemm_prefill(trellis_cuda_linear *lin, const float *x, int rows, float *y, void *stream)
{
    RETURN_IF(!lin || !x || !y || rows < 1, SPARQ_E_ARG, "cuda prefill: bad arguments (%d rows)", rows);
    cudaStream_t s = (cudaStream_t)stream;
    if (!lin->q) {
        CUDA_RETURN_IF(cudaMalloc((void **)&lin->q, (size_t)lin->k * lin->n * 2), "%s: decoded copy (%dx%d fp16)",
                       lin->name, lin->k, lin->n);
        sparq_status st = trellis_cuda_decode_inner(lin, (uint16_t *)lin->q, stream);
        if (st != SPARQ_OK) {
            cudaFree(lin->q);
            lin->q = NULL;
            return st;
        }
    }
    if (!lin->cublas)
        RETURN_IF(cublasCreate(&lin->cublas) != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasCreate failed",
                  lin->name);
    cublasSetStream(lin->cublas, s);
    __half *u = NULL;
    float *t = NULL;
    CUDA_RETURN_IF(cudaMallocAsync((void **)&u, (size_t)rows * lin->k * 2, s), "%s: prefill input buffer", lin->name);
    cudaError_t e = cudaMallocAsync((void **)&t, (size_t)rows * lin->n * 4, s);
    if (e != cudaSuccess) {
        cudaFreeAsync(u, s);
        return cuda_status(e, "prefill output buffer");
    }
    k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, u, lin->k);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t cs =
        cublasGemmEx(lin->cublas, CUBLAS_OP_N, CUBLAS_OP_N, lin->n, rows, lin->k, &one, lin->q, CUDA_R_16F, lin->n,
                     u, CUDA_R_16F, lin->k, &zero, t, CUDA_R_32F, lin->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(t, lin->svh, y, lin->n);
    e = cudaGetLastError();
    cudaFreeAsync(u, s);
    cudaFreeAsync(t, s);
    RETURN_IF(cs != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasGemmEx failed (status %d)", lin->name, (int)cs);
    return cuda_status(e, "prefill launch");
}

/* --- fused MoE decode layer ------------------------------------------------------------ */

/* The transient device buffers of an MoE layer (gu, t_gu, t_down, the
 * counters and the v21+ scratch): per forward only, so the layers of one
 * model, which run one after another on one stream, can share them
 * (trellis_cuda_moe_share); freed with the last handle that uses them. */
typedef struct moe_bufs {
    int refs;
    void *gu, *t_gu, *t_down, *c_gu, *c_down, *iscr;
} moe_bufs;

struct trellis_cuda_moe {
    int n_experts, hidden, inter, K, cb, max_tokens, top_k;
    moe_bufs *bufs;     /* what gu .. pc_d below point into */
    moe_proj proj[3];   /* gate, up, down: device pointer tables */
    void *tables;       /* one device allocation behind the nine tables */
    float *gu;          /* pairs × 2 × inter */
    float *t_gu;        /* pairs × 2 × inter, zero between calls */
    float *t_down;      /* pairs × hidden, zero between calls */
    unsigned *c_gu, *c_down;
    /* moe_chunk_fit's answers by [version − 17][launch: 0 gate/up, 1 down]
     * [tokens] (0 = not asked yet): the occupancy query runs once */
    int chunk_fit[4][2][TRELLIS_GEMM_MAX_ROWS + 1]; /* [3]: version 20 */
    /* MoE lab v21+ (mul1 with hidden, inter multiples of 128; else NULL):
     * k_input_int's outputs per gate/up job (2·pairs, k = hidden) and per
     * down job (pairs, k = inter), one allocation */
    void *iscr;
    uint32_t *bq_gu, *bq_d;
    float *sa_gu, *sa_d, *usb_gu, *usb_d;
    int *ch_gu, *ch_d, *pc_gu, *pc_d;
    /* resident warps of [moe_labs row][2 · (0 gate/up, 1 down) + (1: 16-warp blocks)] (0: not asked) */
    int int_warps[N_MOE_LABS][4];
};

/* Carve the v21+ scratch for `jobs` jobs of k inputs out of *p (or only
 * count its bytes when base is NULL). */
static size_t moe_int_carve(char *base, size_t off, int jobs, int k, uint32_t **bq, float **sa, int **ch,
                            float **usb, int **pc)
{
    const size_t nb = (size_t)k / 128, kt = (size_t)k / 16;
    const size_t sz[5] = {kt * 128 * 4, nb * 4, 2 * nb * 4, nb * 4, 9 * nb * 4};
    void **dst[5] = {(void **)bq, (void **)sa, (void **)ch, (void **)usb, (void **)pc};
    for (int i = 0; i < 5; i++) {
        if (base) *dst[i] = base + off;
        off += ((sz[i] * (size_t)jobs + 255) / 256) * 256;
    }
    return off;
}

/* k tiles per block for n_jobs fused GEMVs of shape (k, n): about 4 blocks of
 * 8 warps per SM in all, a multiple of 8, at most FUSED_MAX_CHUNK. */
static int fused_chunk(int k, int n, int n_jobs)
{
    const int ktiles = k / 16, nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const long long per_split = (long long)nbc * n_jobs;
    long long splits = (sm_count() * 4LL + per_split - 1) / per_split;
    if (splits < 1) splits = 1;
    int chunk = (int)((ktiles + splits - 1) / splits);
    chunk = (chunk + 7) / 8 * 8;
    return chunk > FUSED_MAX_CHUNK ? FUSED_MAX_CHUNK : chunk;
}

/* MoE lab v17 (the default), v18, v19: k tiles per block fitted to the
 * resident blocks of the kernel fn (occupancy query: `cap` blocks at once on
 * the whole GPU), so the last wave is not a sliver (round 1's fused_chunk gave 540 blocks = 2.05
 * waves for DeepSeek's gate/up). max_waves 1 (v17): the most splits whose
 * blocks all fit at once; 2 (v18): the split count that fills the slots of
 * ≤ 2 waves best (ties: more blocks). Rows are 1..16 tokens' worth of one
 * row each, so shared memory stays small: chunk ≤ MOE_MAX_CHUNK. */
#define MOE_MAX_CHUNK 512
static int moe_chunk_fit(const void *fn, int k, int n, int n_jobs, int max_waves)
{
    const int ktiles = k / 16, nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const long long per_split = (long long)nbc * n_jobs;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, fused_smem_bytes(MOE_MAX_CHUNK, 1)) !=
            cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        per_sm = 1;
    }
    const long long cap = (long long)per_sm * sm_count();
    int best = ((ktiles + 7) / 8) * 8;
    double best_fill = -1.0;
    long long best_blocks = 0;
    for (int chunk = 8; chunk <= ktiles + 7 && chunk <= MOE_MAX_CHUNK; chunk += 8) {
        const long long blocks = per_split * ((ktiles + chunk - 1) / chunk);
        const long long waves = (blocks + cap - 1) / cap;
        if (waves > max_waves) continue;
        const double fill = (double)blocks / (double)(waves * cap);
        if (fill > best_fill + 1e-9 || (fill > best_fill - 1e-9 && blocks > best_blocks)) {
            best_fill = fill;
            best_blocks = blocks;
            best = chunk;
        }
    }
    if (best > MOE_MAX_CHUNK) best = MOE_MAX_CHUNK;
    return best;
}

static void moe_bufs_release(moe_bufs *b)
{
    if (!b || --b->refs > 0) return;
    cudaFree(b->gu);
    cudaFree(b->t_gu);
    cudaFree(b->t_down);
    cudaFree(b->c_gu);
    cudaFree(b->c_down);
    cudaFree(b->iscr);
    free(b);
}

void trellis_cuda_moe_free(trellis_cuda_moe *m)
{
    if (!m) return;
    cudaFree(m->tables);
    moe_bufs_release(m->bufs);
    free(m);
}

/* m's buffer pointers from b (the v21+ scratch carved as create does). */
static void moe_point_at(trellis_cuda_moe *m, moe_bufs *b, size_t gu_end)
{
    m->bufs = b;
    m->gu = (float *)b->gu;
    m->t_gu = (float *)b->t_gu;
    m->t_down = (float *)b->t_down;
    m->c_gu = (unsigned *)b->c_gu;
    m->c_down = (unsigned *)b->c_down;
    m->iscr = b->iscr;
    if (b->iscr) {
        const int pairs = m->max_tokens * m->top_k;
        moe_int_carve((char *)b->iscr, 0, 2 * pairs, m->hidden, &m->bq_gu, &m->sa_gu, &m->ch_gu, &m->usb_gu,
                      &m->pc_gu);
        moe_int_carve((char *)b->iscr, gu_end, pairs, m->inter, &m->bq_d, &m->sa_d, &m->ch_d, &m->usb_d, &m->pc_d);
    }
}

sparq_status trellis_cuda_moe_share(trellis_cuda_moe *m, trellis_cuda_moe *donor)
{
    RETURN_IF(!m || !donor, SPARQ_E_ARG, "cuda moe share: missing layer");
    if (m->bufs == donor->bufs) return SPARQ_OK;
    RETURN_IF(m->hidden != donor->hidden || m->inter != donor->inter || m->max_tokens != donor->max_tokens ||
                  m->top_k != donor->top_k || (m->bufs->iscr != NULL) != (donor->bufs->iscr != NULL),
              SPARQ_E_SHAPE, "cuda moe share: layers of %dx%d, %d tokens, top-%d and %dx%d, %d tokens, top-%d",
              m->hidden, m->inter, m->max_tokens, m->top_k, donor->hidden, donor->inter, donor->max_tokens,
              donor->top_k);
    moe_bufs_release(m->bufs);
    donor->bufs->refs++;
    const size_t gu_end = moe_int_carve(NULL, 0, 2 * m->max_tokens * m->top_k, m->hidden, NULL, NULL, NULL, NULL, NULL);
    moe_point_at(m, donor->bufs, gu_end);
    return SPARQ_OK;
}

sparq_status trellis_cuda_moe_create(trellis_cuda_linear *const *gate, trellis_cuda_linear *const *up,
                                     trellis_cuda_linear *const *down, int n_experts, int max_tokens, int top_k,
                                     trellis_cuda_moe **out)
{
    RETURN_IF(!out || !gate || !up || !down, SPARQ_E_ARG, "cuda moe: missing expert tables or output");
    *out = NULL;
    RETURN_IF(n_experts < 1 || max_tokens < 1 || max_tokens > TRELLIS_GEMM_MAX_ROWS || top_k < 1 ||
                  top_k > n_experts,
              SPARQ_E_ARG, "cuda moe: %d experts, %d tokens, top-%d (tokens 1..%d, top-k ≤ experts)", n_experts,
              max_tokens, top_k, TRELLIS_GEMM_MAX_ROWS);
    const trellis_cuda_linear *g0 = gate[0];
    RETURN_IF(!g0, SPARQ_E_ARG, "cuda moe: expert 0 has no gate projection");
    const int hidden = g0->k, inter = g0->n;
    for (int e = 0; e < n_experts; e++) {
        const trellis_cuda_linear *l[3] = {gate[e], up[e], down[e]};
        for (int j = 0; j < 3; j++) {
            RETURN_IF(!l[j], SPARQ_E_ARG, "cuda moe: expert %d lacks its %s projection", e,
                      j == 0 ? "gate" : j == 1 ? "up" : "down");
            const int wk = j == 2 ? inter : hidden, wn = j == 2 ? hidden : inter;
            RETURN_IF(l[j]->k != wk || l[j]->n != wn || l[j]->K != g0->K || l[j]->cb != g0->cb, SPARQ_E_SHAPE,
                      "cuda moe: %s is %dx%d K=%d codebook %d, expected %dx%d K=%d codebook %d like %s",
                      l[j]->name, l[j]->k, l[j]->n, l[j]->K, l[j]->cb, wk, wn, g0->K, g0->cb, g0->name);
        }
    }
    trellis_cuda_moe *m = (trellis_cuda_moe *)calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "cuda moe: no host memory");
    m->n_experts = n_experts;
    m->hidden = hidden;
    m->inter = inter;
    m->K = g0->K;
    m->cb = g0->cb;
    m->max_tokens = max_tokens;
    m->top_k = top_k;
    const size_t E = (size_t)n_experts, pairs = (size_t)max_tokens * top_k;
    const size_t nbc_gu = (inter + FUSED_COLS - 1) / FUSED_COLS, nbc_d = (hidden + FUSED_COLS - 1) / FUSED_COLS;
    void **host = (void **)calloc(9 * E, sizeof(void *));
    if (!host) {
        free(m);
        return sparq_err(SPARQ_E_NOMEM, "cuda moe: no host memory for %d expert tables", n_experts);
    }
    for (size_t e = 0; e < E; e++) {
        const trellis_cuda_linear *l[3] = {gate[e], up[e], down[e]};
        for (int j = 0; j < 3; j++) {
            host[(3 * j + 0) * E + e] = l[j]->trellis;
            host[(3 * j + 1) * E + e] = l[j]->suh;
            host[(3 * j + 2) * E + e] = l[j]->svh;
        }
    }
    cudaError_t err = cudaMalloc(&m->tables, 9 * E * sizeof(void *));
    if (err == cudaSuccess) err = cudaMemcpy(m->tables, host, 9 * E * sizeof(void *), cudaMemcpyHostToDevice);
    free(host);
    moe_bufs *b = (moe_bufs *)calloc(1, sizeof *b);
    if (!b) {
        trellis_cuda_moe_free(m);
        return sparq_err(SPARQ_E_NOMEM, "cuda moe: no host memory");
    }
    b->refs = 1;
    m->bufs = b;
    if (err == cudaSuccess) err = cudaMalloc(&b->gu, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->t_gu, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->t_down, pairs * hidden * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->c_gu, pairs * 2 * nbc_gu * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->c_down, pairs * nbc_d * 4);
    if (err == cudaSuccess) err = cudaMemset(b->t_gu, 0, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMemset(b->t_down, 0, pairs * hidden * 4);
    if (err == cudaSuccess) err = cudaMemset(b->c_gu, 0, pairs * 2 * nbc_gu * 4);
    if (err == cudaSuccess) err = cudaMemset(b->c_down, 0, pairs * nbc_d * 4);
    const size_t gu_end = moe_int_carve(NULL, 0, 2 * (int)pairs, hidden, NULL, NULL, NULL, NULL, NULL);
    if (err == cudaSuccess && m->cb == CB_MUL1 && hidden % 128 == 0 && inter % 128 == 0) {
        const size_t bytes = moe_int_carve(NULL, gu_end, (int)pairs, inter, NULL, NULL, NULL, NULL, NULL);
        err = cudaMalloc(&b->iscr, bytes);
        if (err == cudaSuccess) err = cudaMemset(b->iscr, 0, bytes);
    }
    if (err != cudaSuccess) {
        trellis_cuda_moe_free(m);
        return cuda_status(err, "moe workspace allocation");
    }
    moe_point_at(m, b, gu_end);
    void **t = (void **)m->tables;
    for (int j = 0; j < 3; j++)
        m->proj[j] = moe_proj{(const uint32_t *const *)(t + (3 * j + 0) * E),
                              (const __half *const *)(t + (3 * j + 1) * E), (const __half *const *)(t + (3 * j + 2) * E)};
    *out = m;
    return SPARQ_OK;
}

/* MoE lab v21+: the five launches (see k_moe_in_gu), grids of the two main
 * kernels = exactly the resident warps (occupancy query once per layer). */
static sparq_status moe_int_run(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                const float *weights, float *out, void *stream, int version)
{
    /* benchmark-only stage subsets of v23 (timing where the time goes; they
     * leave the scratch dirty unless x = 0): 231 = launches 1–2 (input +
     * gate/up), 232 = launches 3–5 (SwiGLU + down + output), 233 = the two
     * main kernels alone */
    const unsigned stages = version == 231 ? 3u : version == 232 ? 28u : version == 233 ? 10u : 31u;
    if (version > 100) version = 23;
    const int row = moe_lab_index(version);
    RETURN_IF(row < 0, SPARQ_E_UNSUPPORTED, "cuda moe: no MoE lab version %d", version);
    const moe_lab &v = moe_labs[row];
    const bool pdl_in = v.pdl_in != 0; /* the input launch chained to the previous kernel */
    moe_int_fn fg, fd;
    moe_int_pick(m->K, v, &fg, &fd);
    RETURN_IF(!fg || !fd || !m->iscr, SPARQ_E_UNSUPPORTED,
              "cuda moe: no MoE lab version %d for K=%d codebook %d, %dx%d (mul1, multiples of 128)", version, m->K,
              m->cb, m->hidden, m->inter);
    const int pairs = tokens * m->top_k, H = m->hidden, I = m->inter;
    const int nw = int2_nw<1, 1, 0>();
    const long long items[2] = {2LL * pairs * (I / 16 / nw) * (H / 16), (long long)pairs * (H / 16 / nw) * (I / 16)};
    /* 16-warp blocks; b512_down 2 (v56, v65, v66): when down has at least MOE_B512_ITEMS work
     * items per resident warp (2 blocks of 8 warps a SM) */
    const bool b512[2] = {v.b512_gu != 0, v.b512_down == 1 || (v.b512_down == 2 &&
                                                                items[1] >= (long long)MOE_B512_ITEMS * sm_count() * 16)};
    const int tpb[2] = {b512[0] ? 512 : 256, b512[1] ? 512 : 256}, wpb[2] = {tpb[0] / 32, tpb[1] / 32};
    int *wc = m->int_warps[row];
    const int sl[2] = {b512[0] ? 1 : 0, b512[1] ? 3 : 2}; /* by kernel and block size (v56's down has two) */
    for (int l = 0; l < 2; l++)
        if (!wc[sl[l]]) {
            int per_sm = 0;
            CUDA_RETURN_IF(
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)(l ? fd : fg), tpb[l], 0),
                "moe: occupancy query");
            wc[sl[l]] = (per_sm < 1 ? 1 : per_sm) * sm_count() * wpb[l];
        }
    int warps[2], blocks[2];
    for (int l = 0; l < 2; l++) {
        long long w = wc[sl[l]] < items[l] ? wc[sl[l]] : items[l];
        blocks[l] = (int)((w + wpb[l] - 1) / wpb[l]);
        warps[l] = blocks[l] * wpb[l];
    }
    cudaStream_t s = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    if (stages & 1u) {
        cfg.gridDim = dim3(H / 128, 2 * pairs);
        cfg.blockDim = dim3(128);
        cfg.numAttrs = pdl_in ? 1 : 0;
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, pdl_in ? k_moe_in_gu<0, true> : k_moe_in_gu<0, false>, m->proj[0],
                                          m->proj[1], ids, x, m->bq_gu, m->sa_gu, m->ch_gu, m->usb_gu, m->pc_gu, H,
                                          m->top_k),
                       "moe input launch (%d pairs)", pairs);
        cfg.numAttrs = 1;
    }
    cfg.gridDim = dim3(blocks[0]);
    cfg.blockDim = dim3(tpb[0]);
    if (stages & 2u)
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fg, m->proj[0], m->proj[1], ids, (const uint32_t *)m->bq_gu,
                                          (const float *)m->sa_gu, (const int *)m->pc_gu, m->t_gu, H, I, 2 * pairs,
                                          warps[0], 1u),
                       "moe gate/up launch (%d blocks, PDL)", blocks[0]);
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(I / 128, pairs);
    cfg.blockDim = dim3(128);
    if (stages & 4u)
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg,
                                          v.small == 3   ? k_moe_mid<0, true, true, true>
                                          : v.small == 2 ? k_moe_mid<0, true, true>
                                          : v.small == 1 ? k_moe_mid<0, true>
                                                         : k_moe_mid<0, false>,
                                          m->proj[0], m->proj[1], m->proj[2], ids, m->t_gu, (const float *)m->usb_gu,
                                          m->bq_d, m->sa_d, m->ch_d, m->usb_d, m->pc_d, H, I),
                       "moe SwiGLU launch (PDL)");
    cfg.gridDim = dim3(blocks[1]);
    cfg.blockDim = dim3(tpb[1]);
    if (stages & 8u)
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fd, m->proj[2], m->proj[2], ids, (const uint32_t *)m->bq_d,
                                          (const float *)m->sa_d, (const int *)m->pc_d, m->t_down, I, H, pairs,
                                          warps[1], 1u),
                       "moe down launch (%d blocks, PDL)", blocks[1]);
    cfg.gridDim = dim3(H / 128, v.small ? pairs : tokens);
    cfg.blockDim = dim3(128);
    if (stages & 16u)
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg,
                                          pdl_in    ? k_moe_out_par<true>
                                          : v.small ? k_moe_out_par<false>
                                                    : k_moe_out,
                                          m->proj[2], ids,
                                          weights, m->t_down, (const float *)m->usb_d, out, H, I, m->top_k),
                       "moe output launch (PDL)");
    return SPARQ_OK;
}

sparq_status trellis_cuda_moe_forward_lab(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                          const float *weights, float *out, void *stream, int version)
{
    RETURN_IF(!m || !x || !ids || !weights || !out, SPARQ_E_ARG, "cuda moe forward: missing argument");
    RETURN_IF(tokens < 1 || tokens > m->max_tokens, SPARQ_E_ARG, "cuda moe forward: %d tokens, created for 1..%d",
              tokens, m->max_tokens);
    if (moe_lab_index(version) >= 0 || (version >= 231 && version <= 233))
        return moe_int_run(m, x, tokens, ids, weights, out, stream, version);
    moe_gu_fn gu;
    moe_down_fn dn;
    moe_pick(m->K, m->cb, version, &gu, &dn);
    RETURN_IF(!gu || !dn, SPARQ_E_UNSUPPORTED, "cuda moe: no kernel for K=%d codebook %d (MoE lab version %d)", m->K,
              m->cb, version);
    const bool pdl = (moe_version_opts(version) & DEC_PDL) != 0;
    cudaStream_t s = (cudaStream_t)stream;
    const int pairs = tokens * m->top_k;
    int c1 = fused_chunk(m->hidden, m->inter, 2 * pairs), c2 = fused_chunk(m->inter, m->hidden, pairs);
    if (version >= 17) { /* 17, 19, 20: one wave; 18: two */
        const int waves = version == 18 ? 2 : 1, fi = version == 20 ? 3 : version - 17;
        int *f = m->chunk_fit[fi][0] + tokens, *fd = m->chunk_fit[fi][1] + tokens;
        if (!*f) {
            *f = moe_chunk_fit((const void *)gu, m->hidden, m->inter, 2 * pairs, waves);
            *fd = moe_chunk_fit((const void *)dn, m->inter, m->hidden, pairs, waves);
        }
        c1 = *f;
        c2 = *fd;
    }
    const int nbc1 = (m->inter + FUSED_COLS - 1) / FUSED_COLS, nbc2 = (m->hidden + FUSED_COLS - 1) / FUSED_COLS;
    const int sp1 = (m->hidden / 16 + c1 - 1) / c1, sp2 = (m->inter / 16 + c2 - 1) / c2;
    gu<<<dim3(nbc1 * sp1, 2 * pairs), 256, fused_smem_bytes(c1, 1), s>>>(
        m->proj[0], m->proj[1], ids, x, m->gu, m->t_gu, m->c_gu, m->hidden, m->inter, m->top_k, c1);
    CUDA_RETURN_IF(cudaGetLastError(), "moe gate/up launch (%d pairs)", pairs);
    if (pdl) {
        /* down may start while gate/up runs: it waits (griddepcontrol.wait)
         * before reading gu */
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(nbc2 * sp2, pairs);
        cfg.blockDim = dim3(256);
        cfg.dynamicSmemBytes = fused_smem_bytes(c2, 1);
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, dn, m->proj[2], ids, weights, (const float *)m->gu, out, m->t_down,
                                          m->c_down, m->hidden, m->inter, m->top_k, c2),
                       "moe down launch (%d pairs, PDL)", pairs);
        return SPARQ_OK;
    }
    dn<<<dim3(nbc2 * sp2, pairs), 256, fused_smem_bytes(c2, 1), s>>>(m->proj[2], ids, weights, m->gu, out, m->t_down,
                                                                     m->c_down, m->hidden, m->inter, m->top_k, c2);
    CUDA_RETURN_IF(cudaGetLastError(), "moe down launch (%d pairs)", pairs);
    return SPARQ_OK;
}

/* trellis_cuda_moe_forward runs MoE lab version MOE_MUL1_VERSION = v66 for
 * mul1 layers (run 81: 58.8 / 19.1 µs on DeepSeek / Qwen3 shapes; v65
 * 59.0–59.2 / 19.3–19.4, v56 in run 70 59.4–59.7 / 19.4–19.6), v20 for mul1 layers
 * whose widths are not multiples of 128, and MOE_DEFAULT_VERSION = v17 for the
 * other codebooks (kernels/cuda/lab/README.md, docs/benchmarks-cuda.md): v9's
 * decode, the down launch overlapped by PDL, k tiles per block fitted to one
 * wave of resident blocks (run 13). */
sparq_status trellis_cuda_moe_forward(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                      const float *weights, float *out, void *stream)
{
    RETURN_IF(!m, SPARQ_E_ARG, "cuda moe forward: no layer");
    const int version = m->cb != CB_MUL1 ? MOE_DEFAULT_VERSION : m->iscr ? MOE_MUL1_VERSION : MOE_MUL1_FALLBACK;
    return trellis_cuda_moe_forward_lab(m, x, tokens, ids, weights, out, stream, version);
}

} /* extern "C" */
