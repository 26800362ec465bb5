/* quantize/viterbi.h — the EXL3 trellis encoder: for a tile of 256 target
 * values (stream order, see kernels/cpu/trellis.h) find the tail-biting
 * state sequence whose codebook values minimise the (optionally
 * per-position-weighted) squared error.
 *
 * Algorithm (reference.md §1.2): a Viterbi search over the 2^(16−K) trellis
 * nodes, 2^K branches each, in fp32, run twice for tail-biting —
 *  1. over the sequence rotated by 128 (positions 128..255, 0..127) from a free
 *     start; the best path's node at the wrap point (before position 0) is N;
 *  2. over positions 0..255, starting from N only and forced to end in N,
 * so the 256·K stored bits form a consistent ring. The hot loop is
 * trellis_viterbi_step (scalar / AVX2 / NEON, bit-identical). Tiles are
 * independent and run in parallel over a sparq_pool.
 *
 * The tail-biting pass makes the result slightly worse than an unconstrained
 * search; the benchmark tools/bench/trellis_bench measures the MSE on
 * Gaussian data against exllamav3's. */
#ifndef SPARQ_QUANTIZE_VITERBI_H
#define SPARQ_QUANTIZE_VITERBI_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/threadpool.h"
#include "kernels/cpu/trellis.h"

typedef struct viterbi_enc viterbi_enc;

/* An encoder for K bits per weight (1..8) and codebook cb. It owns the
 * codebook table and per-thread scratch (256·2^(16−K) bytes of back-pointers
 * per thread: 8 MB at K = 1, 1 MB at K = 4). max_threads ≥ 1 is the largest
 * pool it will be used with. */
sparq_status viterbi_create(viterbi_enc **out, int K, trellis_codebook cb, int max_threads);
void viterbi_free(viterbi_enc *enc);

/* Force a code path (tests, benchmarks); default trellis_path_best(). */
sparq_status viterbi_set_path(viterbi_enc *enc, trellis_path path);

/* Encode one tile with scratch slot `slot` (< max_threads). x: 256 targets in
 * stream order; weight: 256 per-position weights or NULL (all 1). Writes the
 * 256 states (stream order; trellis_tile_pack stores them) and, if not NULL,
 * their decoded values. Returns the (weighted) squared error of the tile. */
float viterbi_encode_tile(viterbi_enc *enc, int slot, const float *x, const float *weight, uint16_t *states,
                          float *decoded);

/* Encode n_tiles consecutive tiles (x: n_tiles·256, weight likewise or NULL)
 * over `pool` (NULL = serial). states / decoded as above, n_tiles·256 each
 * (decoded may be NULL). *sq_err (if not NULL) gets the total squared error. */
sparq_status viterbi_encode_tiles(viterbi_enc *enc, const float *x, const float *weight, size_t n_tiles,
                                  uint16_t *states, float *decoded, double *sq_err, sparq_pool *pool);

/* Quantize a row-major k×n matrix (multiples of 16) tile by tile (no Hadamard,
 * no scaling, no error feedback: that is LDLQ's job) and write the packed
 * trellis (k/16, n/16, 16K) as stored on disk, and optionally the decoded
 * matrix (k×n row-major). */
sparq_status viterbi_encode_matrix(viterbi_enc *enc, const float *m, int k, int n, uint16_t *trellis,
                                   float *decoded, sparq_pool *pool);

#endif
