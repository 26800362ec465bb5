/* quantize/hadamard.h — the blockwise 128-point Walsh–Hadamard transform the
 * EXL3 quantizer rotates weights and Hessians with.
 *
 * H is the normalised 128×128 Sylvester matrix (entries ±1/√128, symmetric,
 * its own inverse). "Blockwise" means a dimension of size d (a multiple of
 * 128) is transformed as d/128 independent 128-blocks, the layout exllamav3
 * uses on both sides of a weight (reference.md §1.1). All fp32, in place.
 * The butterflies themselves live in kernels/cpu/trellis.c (the GEMV needs
 * them too); this header gives the quantizer its matrix-shaped entry points. */
#ifndef SPARQ_QUANTIZE_HADAMARD_H
#define SPARQ_QUANTIZE_HADAMARD_H

#include <stddef.h>

#include "common/status.h"

#define HADAMARD_BLOCK 128

/* v (length n, a multiple of 128) ← v·H blockwise. */
sparq_status hadamard_vec(float *v, size_t n);
/* m (rows×cols, row-major) ← m·H: every row transformed (cols multiple of 128). */
sparq_status hadamard_right(float *m, size_t rows, size_t cols);
/* m ← H·m: every column transformed (rows multiple of 128). */
sparq_status hadamard_left(float *m, size_t rows, size_t cols);

#endif
