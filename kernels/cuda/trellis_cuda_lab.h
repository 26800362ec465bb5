/* kernels/cuda/trellis_cuda_lab.h — internal knobs of the CUDA trellis GEMM for
 * the kernel lab, its tests and benchmarks (tools/bench/cuda_bench.c,
 * tests/gpu/). Not part of the public API: trellis_cuda_gemm picks the
 * defaults that the lab measured best (kernels/cuda/lab/README.md). */
#ifndef SPARQ_KERNELS_CUDA_TRELLIS_CUDA_LAB_H
#define SPARQ_KERNELS_CUDA_TRELLIS_CUDA_LAB_H

#include "kernels/cuda/trellis_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which of the three launches of a GEMM to queue (timing one stage alone). */
enum {
    TRELLIS_CUDA_PART_INPUT = 1,  /* u = fp16(had128(x ⊙ suh)) */
    TRELLIS_CUDA_PART_MAIN = 2,   /* t += u·Q from the trellis words */
    TRELLIS_CUDA_PART_OUTPUT = 4, /* y = had128(t) ⊙ svh; t = 0 */
    TRELLIS_CUDA_PART_ALL = 7
};

/* trellis_cuda_gemm with explicit kernel shape: nw tile columns per warp
 * (1, 2 or 4), unroll k tiles loaded ahead (4 or 8), chunk k tiles per warp
 * (0 = auto: about 32 warps per SM); 0 for nw/unroll = the default.
 * (nw, unroll) = (2, 4) and (1, 8) exist for every K and codebook, the
 * others for mul1 at K = 2..4 only (SPARQ_E_UNSUPPORTED otherwise). */
sparq_status trellis_cuda_gemm_lab(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int nw, int unroll, int chunk,
                                   unsigned parts);

/* Lab version v3: the same GEMM in one launch (input transform, decode +
 * mma with double-buffered loads, output transform by the last block of each
 * 256-column block). chunk = k tiles per block (0 = auto; rounded up to a
 * multiple of 8, at most 64). */
sparq_status trellis_cuda_gemm_v3(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                  trellis_cuda_ws *ws, void *stream, int chunk);

/* Lab version v4: v2's three launches with a balanced main kernel (grid =
 * resident warps, equal shares of the work, no partial last wave); minb =
 * blocks per SM it is compiled for: 2 (every K and codebook), 3 (256-thread
 * blocks) or 5, 6 (128-thread blocks) for mul1 at K = 2..4 only; 0 = 2.
 * parts as for trellis_cuda_gemm_lab. */
sparq_status trellis_cuda_gemm_bal(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                   trellis_cuda_ws *ws, void *stream, int minb, unsigned parts);

/* Lab versions v6..v8 (kernels/cuda/lab/README.md): v4's three launches
 * and balanced grid with a cheaper decode. version 6 = two ring words per
 * lane at K ≤ 4 and the next step's words loaded ahead; 7 = 6 + mul1 byte
 * sums on the tensor core (one mma.m16n8k32 u8 per 4 weights a lane instead
 * of dp4a); 8 = 7 + state masks moved from the ALU to the FMA pipe;
 * 9 = v3's one launch with v7's decode (parts ignored: always the whole op);
 * 10 = 8 with the three launches overlapped by programmatic dependent launch;
 * 11 = v3's one launch with v8's decode; 12 = 10 with 4 tile columns × 2 k
 * tiles per step.
 * Every K and codebook; SPARQ_E_UNSUPPORTED for another version. parts as
 * for trellis_cuda_gemm_lab. */
sparq_status trellis_cuda_gemm_labv(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                    trellis_cuda_ws *ws, void *stream, int version, unsigned parts);

/* Lab versions v20..v34 (labv's version argument): the integer mul1 GEMM
 * (kernels/cuda/lab/README.md, docs/cuda.md): activations as 16-bit
 * integers per 128-block, exact int32 sums on the tensor core
 * (mma.m16n8k32 u8·s8) with the bytes of h = state·0x83DCD12D as one
 * operand; no fp16 weight value is formed. 20 = four pre-replicated B words
 * per lane and k tile, 21 = one packed word replicated in the loop
 * (byte_perm), 22 = 20 + state masks on the FMA pipe, 23 = 21 + 22,
 * 24 = one k tile × 8 tile columns per step + FMA masks, 25 = 24 without
 * FMA masks, 26 = 24 compiled for 3 blocks/SM, 27 = 24 and 28 = 22 with the
 * output transform done by the warp that completes each 128-column block
 * (two launches, not three; lost), 30 = 24 and 31 = 22 with the input and
 * output launches one warp per 128-block, 32 = 30 and 33 = 31 with the input
 * launch chained to the previous kernel by PDL (33: what trellis_cuda_gemm
 * runs for mul1 at 1..4 rows on small linears; 32 ran on large ones before
 * round 8), 34 = 32 with
 * the main kernel compiled for 1 block of 8 warps per SM (it uses 125
 * registers, so two still fit and run), 35 = 32 with v24's loop as
 * in round 4 (30–34 convert once per 128-block pass) (29, an in-warp input
 * transform, the first 35–37, 4 tile columns per step at 2–4 blocks per SM,
 * and 36, per-block atomics, and 41, one launch with k split over a
 * thread-block cluster, lost and were removed), 42 = 32 with the main kernel
 * in 16-warp blocks at ≤ 120 registers, one a SM (1..4 rows; more run 32's
 * kernel), 44 / 45 = 32 / 42 with the loop taking two steps a pass (no copy
 * of the next words; trellis_cuda_gemm runs 45 at one row and 44 at 2..4 rows
 * on large linears, trellis_cuda_gemm_version says which). mul1 only
 * (SPARQ_E_UNSUPPORTED for the other codebooks); every version exists for
 * K = 2..4 and 1..16 rows, those with trellis_cuda_gemm_lab_allk() (22, 24,
 * 30..33, 35, 44) for every K at 1..4 rows. */

/* The lab version trellis_cuda_gemm runs for this linear and row count. */
int trellis_cuda_gemm_version(const trellis_cuda_linear *lin, int rows);
/* 1 if integer lab version `version` exists for every K (at 1..4 rows). */
int trellis_cuda_gemm_lab_allk(int version);
/* Streaming multiprocessors of the current device (trellis_cuda_gemm_version
 * counts 16 resident warps a SM when it weighs a linear's work). */
int trellis_cuda_sm_count(void);

/* trellis_cuda_decode_inner with the tile decode of lab version 6..12 (0 =
 * the real one), so the test can check each version's decode bit for bit. */
/* trellis_cuda_moe_forward with MoE lab version `version`
 * (kernels/cuda/lab/README.md): 5 = round 1 (v3's block body), 13 = v9's
 * decode (two ring words per lane, mul1 byte sums on the tensor core),
 * 14 = 13 + the down launch overlapped with gate/up by programmatic
 * dependent launch, 15 = v11's decode (+ state masks on the FMA pipe) +
 * PDL, 16 = 5 + PDL, 17 / 18 = 14 with the k tiles per block fitted
 * to one / two waves of resident blocks (17 is the default for 3inst and
 * mcg), 19 = 16 with 17's k tiles per block, 20 = 17 with the integer mul1
 * GEMM arithmetic (mul1 only, every K); the balanced integer launches
 * (mul1 only, hidden and inter multiples of 128): 21 = five PDL-chained
 * launches (input transform of all gate/up jobs; v24's integer loop on a grid
 * of exactly the resident warps with equal work over all routed experts;
 * gate/up output + SwiGLU + down input in one launch; the same loop for down;
 * output + weighted sum), 22 = 21 without FMA masks, 23 = 21 with the middle
 * launch's loads before its wait and the output launch parallel over pairs
 * (21 and 23 for every K), 24 = 23 compiled for one block per SM, 27 = 23
 * with the input launch chained to the previous kernel by PDL (every K),
 * 28 = 27 with 24's main kernels (every K), 29 / 30 = 28 / 27 without the
 * PDL-chained input launch (every K), 34 = 23 with 16-warp blocks, one per
 * SM, 40 = 23 with both main kernels at ≤ 120 registers (so that a block of
 * the small launches fits beside two of theirs), 41 = 34's gate/up kernel
 * and 40's down kernel, 50 = 40 with the middle launch's gate and up
 * Hadamards through one set of barriers (every K), 54 / 55 = 50 with the
 * gate/up / both main kernels in 16-warp blocks at ≤ 120 registers (one a SM,
 * with room for a block of the small launches beside it), 56 = 54, and 55's
 * down kernel when it has at least 8 work items per resident warp (every
 * K); 21–24, 34, 40, 41, 50, 54–56 run the loop in round 4's form, 27–30 one
 * pass per 128-block; 56 is the default for mul1 (25,
 * 26 and the first 29, 30: in-warp input transform, warp-per-block small
 * launches, 4 tile columns per step; 31–33, 35–39, 42–49: L2 prefetches,
 * uneven shares, warp-per-block small launches again; 51–53: the SwiGLU
 * and output launches folded into the main kernels: lost, removed);
 * benchmark only (x = 0, they leave the scratch dirty
 * otherwise): 231 / 232 / 233 = 23's launches 1–2 / 3–5 / its two main
 * kernels alone. v17 exists for every K and codebook, the others for mul1 at
 * K = 2..4 only (SPARQ_E_UNSUPPORTED otherwise). */
sparq_status trellis_cuda_moe_forward_lab(trellis_cuda_moe *moe, const float *x, int tokens, const int *ids,
                                          const float *weights, float *out, void *stream, int version);

sparq_status trellis_cuda_decode_lab(const trellis_cuda_linear *lin, uint16_t *q, void *stream, int version);

/* The launch floor, for the benchmark: `launches` (1..8) empty one-block
 * kernels queued on `stream`, the second and later chained to the previous
 * one by programmatic dependent launch as the GEMM's are. */
sparq_status trellis_cuda_lab_empty(void *stream, int launches);

/* Lab timeline of the MoE v21+ layers (cuda_bench --moe-timeline): queues a
 * one-thread kernel that points the timeline marks of the calls queued after
 * it at rec (5 × 4096 × 3 zeroed words, [launch][unit][mark]: launch 0..4 =
 * input, gate/up, SwiGLU, down, output; unit = block, or warp in the main
 * kernels; mark 0..2 = start, past griddepcontrol.wait, end; %globaltimer in
 * ns); NULL stops recording.
 * SPARQ_E_UNSUPPORTED unless trellis.cu was built with -DSPARQ_MOE_TIMELINE
 * (the marks change the kernels' code, so the normal build has none). */
sparq_status trellis_cuda_lab_timeline(unsigned long long *rec, void *stream);

/* For the tests: a one-block kernel on `stream` that lets kernels chained to
 * it by programmatic dependent launch start at once, spins for spin_us
 * microseconds, then copies `bytes` (a multiple of 4) from src to dst (device
 * memory): a producer that writes its output late, as a PDL-aware kernel
 * before a GEMM or MoE layer may. */
sparq_status trellis_cuda_lab_slow_copy(void *dst, const void *src, size_t bytes, int spin_us, void *stream);

#ifdef __cplusplus
}
#endif

#endif
