/* kernels/cuda/gemm_prefill.cu — trellis_cuda_gemm_prefill, y = x·W for any
 * number of rows (prompt processing, or more than 16 rows): Q is decoded to
 * fp16 once (trellis_cuda_decode_inner, kept with the linear: k·n·2 bytes)
 * and each call runs the fp16 input transform, cublasGemmEx (fp16 in, fp32
 * accumulate and out) and the output transform. What bounds it: cuBLAS's
 * fp16 GEMM (compute-bound at prompt sizes), plus the one-off decode on the
 * first call (lab v1: decoding every call cost 138.6 µs on 4096×14336). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp16_io.cuh"

using namespace trellis_dev;

extern "C" sparq_status trellis_cuda_gemm_prefill(trellis_cuda_linear *lin, const float *x, int rows, float *y,
                                                  void *stream)
{
    RETURN_IF(!lin || !x || !y || rows < 1, SPARQ_E_ARG, "cuda prefill: bad arguments (%d rows)", rows);
    cudaStream_t s = (cudaStream_t)stream;
    if (!lin->q) {
        CUDA_RETURN_IF(cudaMalloc((void **)&lin->q, (size_t)lin->k * lin->n * 2), "%s: decoded copy (%dx%d fp16)",
                       lin->name, lin->k, lin->n);
        sparq_status st = trellis_cuda_decode_inner(lin, (uint16_t *)lin->q, stream);
        if (st != SPARQ_OK) {
            cudaFree(lin->q);
            lin->q = NULL;
            return st;
        }
    }
    if (!lin->cublas)
        RETURN_IF(cublasCreate(&lin->cublas) != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasCreate failed",
                  lin->name);
    cublasSetStream(lin->cublas, s);
    __half *u = NULL;
    float *t = NULL;
    CUDA_RETURN_IF(cudaMallocAsync((void **)&u, (size_t)rows * lin->k * 2, s), "%s: prefill input buffer", lin->name);
    cudaError_t e = cudaMallocAsync((void **)&t, (size_t)rows * lin->n * 4, s);
    if (e != cudaSuccess) {
        cudaFreeAsync(u, s);
        return cuda_status(e, "prefill output buffer");
    }
    k_input<<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, u, lin->k);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t cs =
        cublasGemmEx(lin->cublas, CUBLAS_OP_N, CUBLAS_OP_N, lin->n, rows, lin->k, &one, lin->q, CUDA_R_16F, lin->n,
                     u, CUDA_R_16F, lin->k, &zero, t, CUDA_R_32F, lin->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    k_output<<<dim3(lin->n / 128, rows), 128, 0, s>>>(t, lin->svh, y, lin->n);
    e = cudaGetLastError();
    cudaFreeAsync(u, s);
    cudaFreeAsync(t, s);
    RETURN_IF(cs != CUBLAS_STATUS_SUCCESS, SPARQ_E_STATE, "%s: cublasGemmEx failed (status %d)", lin->name, (int)cs);
    return cuda_status(e, "prefill launch");
}
