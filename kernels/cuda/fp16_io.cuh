/* kernels/cuda/fp16_io.cuh — the input and output transforms of the fp16
 * paths: gemm_tc.cu (PDL-chained, PDL = true) and gemm_prefill.cu (plain
 * launches around cuBLAS). Both are bound by memory latency (one 128-element
 * Hadamard per block, a few hundred bytes a thread block). */
#ifndef SPARQ_KERNELS_CUDA_FP16_IO_CUH
#define SPARQ_KERNELS_CUDA_FP16_IO_CUH

#include "kernels/cuda/trellis_decode.cuh"

namespace trellis_dev {

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

} // namespace trellis_dev

#endif
