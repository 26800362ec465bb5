/* kernels/cpu/ops_simd.h — what the CPU backend's source files (ops.c,
 * ops_fp8.c) share to compile their AVX2 kernels: the x86 test, the
 * function-level target attribute (one binary runs on any x86-64; the kernels
 * are picked at run time through sq_cpu_use_avx2()) and the horizontal sum.
 * Internal to kernels/cpu/. */
#ifndef SPARQ_KERNELS_CPU_OPS_SIMD_H
#define SPARQ_KERNELS_CPU_OPS_SIMD_H

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define SQ_X86 1
#else
#define SQ_X86 0
#endif

#if SQ_X86
#define SQ_AVX2 __attribute__((target("avx2,fma,f16c")))

SQ_AVX2 static inline float sq_hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}
#endif

#endif
