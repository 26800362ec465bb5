/* tools/bench/cuda_launch_floor.cu — cuda_bench's launch floor (built into
 * the benchmark only): `launches` (1..8) empty one-block kernels on `stream`,
 * the second and later chained to the previous one by programmatic dependent
 * launch as the GEMM's launches are, so a GEMM's time can be read against
 * what its launch chain alone costs. */
#include "kernels/cuda/cuda_common.cuh"

/* lets the next launch start, waits for the previous one */
__global__ void k_empty()
{
    trellis_dev::griddep_launch();
    trellis_dev::griddep_wait();
}

extern "C" sparq_status bench_cuda_empty(void *stream, int launches)
{
    RETURN_IF(launches < 1 || launches > 8, SPARQ_E_ARG, "cuda empty launches: %d, expected 1..8", launches);
    cudaStream_t s = (cudaStream_t)stream;
    k_empty<<<1, 32, 0, s>>>();
    CUDA_RETURN_IF(cudaGetLastError(), "empty launch");
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    for (int i = 1; i < launches; i++) CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_empty), "empty launch (PDL)");
    return SPARQ_OK;
}
