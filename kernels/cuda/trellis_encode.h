/* kernels/cuda/trellis_encode.h — the EXL3 trellis encoder on NVIDIA GPUs:
 * the tail-biting Viterbi of quantize/viterbi.h for many 16×16 tiles per
 * launch (all tiles of all experts of a layer step), callable from C. No CUDA
 * types here: device pointers are plain pointers, streams are `void *`
 * (a cudaStream_t; NULL = the default stream).
 *
 * Result: the same 256 states per tile as viterbi_encode_tile, bit for bit —
 * the path costs are the same fp32 operations in the same order (d = cb −
 * target; d·d; ·weight unless weight == 1; + cost), the minimum over the 2^K
 * predecessors is taken in ascending order with a strict <, so the smallest
 * index wins a tie, and the two tail-biting passes start, end and trace back
 * as viterbi.c does. The per-tile squared error is the final path cost, the
 * same fp32 number. tests/gpu/test_trellis_encode_cuda.c proves all of it
 * against the CPU encoder.
 *
 * Memory: each tile in flight needs its back-pointers, 256 × 2^(16−K) bytes
 * (8 MB at K = 1, 2 MB at K = 3, 64 KB at K = 8), and where the node costs do
 * not fit in shared memory (K = 1 everywhere, K = 2 on GPUs with under
 * ~150 KB of shared memory per block such as GB10) 2 × 2^(16−K) floats more.
 * The encoder runs at most as many tiles at once as its workspace holds
 * (and as the GPU keeps resident), whatever n_tiles is: the workspace size
 * the caller gives bounds the memory, not the batch. */
#ifndef SPARQ_KERNELS_CUDA_TRELLIS_ENCODE_H
#define SPARQ_KERNELS_CUDA_TRELLIS_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the extern "C" block: these C headers have no guards of their own */
#include "common/status.h"
#include "kernels/cpu/trellis.h"

typedef struct trellis_cuda_enc trellis_cuda_enc;

/* Device bytes one tile in flight needs at K bits with codebook cb on the
 * current device (back-pointers, plus the node costs where they live in
 * global memory). */
size_t trellis_cuda_enc_slot_bytes(int K, trellis_codebook cb);

/* An encoder for K = 1..8 and cb on the current device, with a workspace of
 * at most workspace_bytes (0: a quarter of the free device memory, at most
 * 4 GiB). SPARQ_E_NOMEM if the workspace cannot hold one tile. */
sparq_status trellis_cuda_enc_create(int K, trellis_codebook cb, size_t workspace_bytes, trellis_cuda_enc **out);
void trellis_cuda_enc_free(trellis_cuda_enc *enc);

/* Tiles encoded at once: min(workspace / slot bytes, blocks the GPU keeps
 * resident). */
int trellis_cuda_enc_slots(const trellis_cuda_enc *enc);
/* Whether the node costs live in shared memory (else in the workspace). */
int trellis_cuda_enc_costs_in_shared(const trellis_cuda_enc *enc);

/* Encode n_tiles tiles, all pointers device memory: x n_tiles·256 targets in
 * stream order, weight likewise or NULL (all 1); writes states (n_tiles·256),
 * and if not NULL decoded (n_tiles·256 codebook values) and err (n_tiles
 * per-tile squared errors). Asynchronous on `stream`; one call at a time per
 * encoder (the workspace is shared). */
sparq_status trellis_cuda_encode_tiles(trellis_cuda_enc *enc, const float *x, const float *weight, size_t n_tiles,
                                       uint16_t *states, float *decoded, float *err, void *stream);

/* The same from host arrays (as viterbi_encode_tiles): copies in chunks,
 * synchronous. err (n_tiles floats) and sq_err (the total, summed in double
 * in tile order as viterbi_encode_tiles does) may be NULL. */
sparq_status trellis_cuda_encode_tiles_host(trellis_cuda_enc *enc, const float *x, const float *weight,
                                            size_t n_tiles, uint16_t *states, float *decoded, float *err,
                                            double *sq_err);

/* For tests: out (device, 65536 floats) = the encoder's codebook value of
 * every state, which must equal trellis_cb_table bit for bit. Synchronous. */
sparq_status trellis_cuda_enc_cb_values(trellis_codebook cb, float *out);

#ifdef __cplusplus
}
#endif

#endif
