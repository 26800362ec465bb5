/* kernels/cpu/trellis.h — EXL3 trellis codec on the CPU: codebooks, the
 * tensor-core tile permutation, pack/unpack of the tail-biting bit ring,
 * decode of whole quantized linears, and a GEMV / small-batch GEMM that works
 * straight from the packed trellis words.
 *
 * The format is exllamav3's, bit for bit (docs/exl3.md, reference.md §1):
 *  - a linear W (in=k, out=n) is diag(suh) · H · Q · H · diag(svh) with H the
 *    normalised 128-point Hadamard applied blockwise on both sides;
 *  - Q is a grid of 16×16 tiles, tile (i, j) covering rows 16i.., cols 16j..;
 *    each tile is 256·K bits (K = 1..8) stored as 16·K int16 words at
 *    trellis[(i·(n/16) + j)·16K ...];
 *  - the 256·K bits are a ring read MSB-first from 32-bit little-endian words;
 *    the 16-bit state of stream position p is the ring window that ends at bit
 *    (p+1)·K; its value is the codebook entry of that state;
 *  - stream position p lives at (row, col) = trellis_pos_row(p), trellis_pos_col(p)
 *    (the mma.m16n8k16 fragment layout).
 *
 * CPU code paths compute the same numbers: scalar C (the oracle), AVX2 and
 * AVX-512 (x86-64, picked at run time by CPUID) and NEON (aarch64). Which
 * SIMD files are compiled is decided by the build; trellis_path_best() says
 * what this process will use. Every path gives bit-identical results (tests
 * prove it).
 *
 * Nothing here depends on more than libc, libm and common/, so the file can be
 * cross-compiled on its own (tests/kernels/cross_neon.sh). */
#ifndef SPARQ_KERNELS_CPU_TRELLIS_H
#define SPARQ_KERNELS_CPU_TRELLIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/threadpool.h"

/* Code paths; see trellis_path_best() and friends at the end. */
typedef enum trellis_path {
    TRELLIS_PATH_SCALAR = 0,
    TRELLIS_PATH_AVX2 = 1,
    TRELLIS_PATH_NEON = 2,
    TRELLIS_PATH_AVX512 = 3, /* AVX-512F+BW GEMM (x86-64); decode and Viterbi as AVX2 */
    TRELLIS_PATH_COUNT_
} trellis_path;

/* --- codebooks ------------------------------------------------------------ */

/* The numbering is exllamav3's `cb` index (0 = 3inst, 1 = mcg, 2 = mul1). */
typedef enum trellis_codebook {
    TRELLIS_CB_3INST = 0, /* x·89226354 + 64248484, masked halves as fp16, fp16 add */
    TRELLIS_CB_MCG = 1,   /* x·0xCBAC1FED, then as 3inst */
    TRELLIS_CB_MUL1 = 2,  /* x·0x83DCD12D, byte sum b, fp16 fma (1024+b)·k + bias; default */
    TRELLIS_CB_COUNT_
} trellis_codebook;

/* "3inst", "mcg", "mul1" (NULL for an invalid value). */
const char *trellis_cb_name(trellis_codebook cb);
/* Parse a codebook name; false if unknown. */
bool trellis_cb_parse(const char *name, trellis_codebook *out);

/* fp16 bits of the codebook value of 16-bit `state`, rounded exactly as the
 * GPU does (one fp16 rounding of the fma for mul1, an fp16 add for 3inst/mcg). */
uint16_t trellis_cb_value_f16(trellis_codebook cb, uint32_t state);
/* The same value as fp32 (exact). */
float trellis_cb_value(trellis_codebook cb, uint32_t state);
/* Fill out[65536] with the value of every state (for the encoder). */
void trellis_cb_table(trellis_codebook cb, float *out);

/* --- tile layout ---------------------------------------------------------- */

#define TRELLIS_TILE 16      /* tiles are 16×16 */
#define TRELLIS_TILE_N 256   /* values per tile */
#define TRELLIS_K_MAX 8

/* Row / column inside the tile of stream position p (0..255): lane t = p/8
 * owns rows {2(t%4), 2(t%4)+1, 2(t%4)+8, 2(t%4)+9} at columns t/4 (p%8 < 4)
 * and t/4+8 (p%8 ≥ 4). */
#ifdef __CUDACC__
#define TRELLIS_HD __host__ __device__ /* the CUDA kernels use the same layout functions */
#else
#define TRELLIS_HD
#endif
static inline TRELLIS_HD int trellis_pos_row(int p)
{
    return 2 * ((p >> 3) & 3) + (p & 1) + 8 * ((p >> 1) & 1);
}
static inline TRELLIS_HD int trellis_pos_col(int p) { return (p >> 5) + 8 * ((p >> 2) & 1); }
/* Inverse: stream position of (row, col). */
int trellis_rc_pos(int row, int col);

/* Number of int16 words of one tile: 16·K. */
static inline int trellis_tile_words(int K) { return 16 * K; }

/* Pack 256 states in stream order (only the low K bits of each, the bits it
 * shifts in, are stored) into 16·K words, exllamav3's on-disk order. The
 * states must form a consistent tail-biting ring for unpack to give them back. */
void trellis_tile_pack(const uint16_t *states, int K, uint16_t *words);
/* Read the 256 16-bit states (stream order) of one packed tile. */
void trellis_tile_unpack(const uint16_t *words, int K, uint16_t *states);
/* Decode one packed tile to fp32, row-major 16×16 (out[row·16 + col]). */
void trellis_tile_decode(const uint16_t *words, int K, trellis_codebook cb, float *out);

/* --- Hadamard --------------------------------------------------------------- */

/* In-place normalised Walsh–Hadamard transform (Sylvester order, entries
 * ±1/√128) of each of the n_blocks consecutive 128-float blocks of v. It is
 * its own inverse. quantize/hadamard.h builds matrix helpers on it. */
void trellis_had128(float *v, size_t n_blocks);
/* The same transform down the columns of a row-major rows×cols matrix, per
 * 128-row band (m ← H·m blockwise); rows must be a multiple of 128. */
void trellis_had128_left(float *m, size_t rows, size_t cols);

/* --- quantized linear ------------------------------------------------------ */

/* One EXL3 linear as stored on disk; pointers are borrowed (typically into a
 * mapped safetensors file) and must stay valid while it is used. */
typedef struct trellis_linear {
    int k;                   /* input features (rows of W), multiple of 128 */
    int n;                   /* output features (cols of W), multiple of 128 */
    int K;                   /* bits per weight, 1..8 */
    trellis_codebook cb;
    const uint16_t *trellis; /* int16 (k/16, n/16, 16K) */
    const uint16_t *suh;     /* fp16 (k) */
    const uint16_t *svh;     /* fp16 (n) */
} trellis_linear;

/* Validate shapes, K, codebook and pointers; the message names `name`. */
sparq_status trellis_linear_check(const trellis_linear *lin, const char *name);

/* Decode Q alone (the codebook values, no Hadamard, no scales) to fp32 (k×n
 * row-major). Bit-exact with exllamav3's `reconstruct`. */
sparq_status trellis_linear_decode_inner(const trellis_linear *lin, float *q, sparq_pool *pool);
/* Decode the full weight W = diag(suh)·H·Q·H·diag(svh) to fp32 (k×n row-major). */
sparq_status trellis_linear_decode(const trellis_linear *lin, float *w, sparq_pool *pool);

/* y[r] = x[r] · W for r < rows (x: rows×k, y: rows×n, row-major), computed as
 * ((((x ⊙ suh)·H)·Q)·H) ⊙ svh with Q decoded tile by tile in registers, never
 * materialised. For mul1, Q's values are used without their final fp16
 * rounding and H·(x ⊙ suh) is rounded to 16 bits per 128 inputs, so the
 * products are integer (trellis.c; ~2e-4 relative RMS from decode-then-matmul);
 * 3inst and mcg use the exact fp16 values in fp32. rows is 1..TRELLIS_GEMM_MAX_ROWS; larger batches should
 * decode once (trellis_linear_decode) and call BLAS. Work is split over
 * columns across `pool` (NULL = serial); the result does not depend on the
 * number of threads. x and y must not overlap. Allocates rows·(k+n) floats
 * of scratch per call. */
#define TRELLIS_GEMM_MAX_ROWS 16
sparq_status trellis_linear_gemm(const trellis_linear *lin, const float *x, int rows, float *y,
                                 sparq_pool *pool);

/* --- Viterbi step (the encoder's hot loop; quantize/viterbi.h drives it) --- */

/* A trellis node is the low 16−K bits of a state (2^(16−K) nodes); the state
 * s = (j << (16−K)) | e enters node e from node s >> K. One step computes, for
 * every node e,
 *   cost_out[e] = min over j < 2^K of cost_in[s >> K] + weight·(cb[s] − target)²
 *   back[e]     = the smallest minimising j,
 * in fp32 with exactly these roundings (d = cb − target; d·d; ·weight unless
 * weight == 1; + cost) on every path. cb is the 65536-entry codebook table
 * (trellis_cb_table); cost_in needs 8 readable floats of padding after its
 * 2^(16−K) entries. */
void trellis_viterbi_step(const float *cb, const float *cost_in, float *cost_out, uint8_t *back, int K,
                          float target, float weight, trellis_path path);

/* --- code paths (for tests and benchmarks) -------------------------------- */

/* "scalar", "avx2", "neon", "avx512". */
const char *trellis_path_name(trellis_path p);
/* Whether path p is compiled in and this CPU can run it. */
bool trellis_path_available(trellis_path p);
/* The path trellis_linear_gemm uses: the best available one. */
trellis_path trellis_path_best(void);
/* trellis_linear_gemm on a chosen path (SPARQ_E_UNSUPPORTED if unavailable). */
sparq_status trellis_linear_gemm_path(const trellis_linear *lin, const float *x, int rows, float *y,
                                      sparq_pool *pool, trellis_path path);
/* trellis_tile_decode on a chosen path (returns false if unavailable). */
bool trellis_tile_decode_path(const uint16_t *words, int K, trellis_codebook cb, float *out,
                              trellis_path path);

#endif
