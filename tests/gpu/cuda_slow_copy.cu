/* tests/gpu/cuda_slow_copy.cu — the late producer of test_trellis_cuda's
 * PDL-ordering checks (built into that test only, not into the library): a
 * one-block kernel that lets kernels chained to it by programmatic dependent
 * launch start at once, spins for spin_us microseconds, then copies `bytes`
 * (a multiple of 4) from src to dst, as a PDL-aware kernel before a GEMM or
 * MoE layer may write its output late. The chained launches must wait for it
 * (lab run 29: the MoE input launch once let its dependents read the routing
 * before its own wait). */
#include "kernels/cuda/cuda_common.cuh"

__global__ void k_slow_copy(uint32_t *__restrict__ dst, const uint32_t *__restrict__ src, size_t n,
                            unsigned long long ns)
{
    trellis_dev::griddep_launch();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

extern "C" sparq_status test_cuda_slow_copy(void *dst, const void *src, size_t bytes, int spin_us, void *stream)
{
    RETURN_IF(!dst || !src || bytes % 4 || spin_us < 0, SPARQ_E_ARG, "cuda slow copy: bad arguments");
    k_slow_copy<<<1, 256, 0, (cudaStream_t)stream>>>((uint32_t *)dst, (const uint32_t *)src, bytes / 4,
                                                     (unsigned long long)spin_us * 1000ull);
    CUDA_RETURN_IF(cudaGetLastError(), "slow copy launch");
    return SPARQ_OK;
}
