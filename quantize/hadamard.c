/* quantize/hadamard.c — see hadamard.h. Shape checks around the kernel's
 * butterflies (kernels/cpu/trellis.h: trellis_had128, trellis_had128_left). */
#include "quantize/hadamard.h"

#include "kernels/cpu/trellis.h"

sparq_status hadamard_vec(float *v, size_t n)
{
    RETURN_IF(n % HADAMARD_BLOCK, SPARQ_E_SHAPE, "hadamard: length %zu is not a multiple of 128", n);
    trellis_had128(v, n / HADAMARD_BLOCK);
    return SPARQ_OK;
}

sparq_status hadamard_right(float *m, size_t rows, size_t cols)
{
    RETURN_IF(cols % HADAMARD_BLOCK, SPARQ_E_SHAPE, "hadamard: %zu columns is not a multiple of 128", cols);
    for (size_t r = 0; r < rows; r++) trellis_had128(m + r * cols, cols / HADAMARD_BLOCK);
    return SPARQ_OK;
}

sparq_status hadamard_left(float *m, size_t rows, size_t cols)
{
    RETURN_IF(rows % HADAMARD_BLOCK, SPARQ_E_SHAPE, "hadamard: %zu rows is not a multiple of 128", rows);
    trellis_had128_left(m, rows, cols);
    return SPARQ_OK;
}
