/* kernels/cpu/trellis_nosimd.c — the trellis codec's SIMD slot on machines
 * that are neither x86-64 nor aarch64: no SIMD path, scalar only. The build
 * compiles exactly one of trellis_avx2.c, trellis_neon.c and this file. */
#include "kernels/cpu/trellis_impl.h"

const trellis_simd_desc trellis_simd[TRELLIS_SIMD_SLOTS] = {
    {TRELLIS_PATH_SCALAR, NULL, NULL},
    {TRELLIS_PATH_SCALAR, NULL, NULL},
};
