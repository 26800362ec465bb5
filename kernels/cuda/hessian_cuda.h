/* kernels/cuda/hessian_cuda.h — the EXL3 quantizer's Hessian work on NVIDIA
 * GPUs, callable from C: accumulating xᵀx over calibration rows, and
 * ldlq_hessian_prepare (quantize/ldlq.h) on the device — damping, input signs,
 * the two-sided blockwise 128-Hadamard, Cholesky and the 16×16 block LDL —
 * whose outputs the GPU LDLQ loop reads in place. No CUDA types here: device
 * pointers are plain pointers, streams and cuBLAS handles are `void *`
 * (a cudaStream_t, NULL = the default stream; a cublasHandle_t).
 *
 * Agreement with the CPU (tests/gpu/test_hessian_cuda.c proves it):
 *  - the same decisions: identity fallback (non-finite H, or mean(diag) not
 *    above 1e-20), damping factor and number of retries (the diagonal mean is
 *    summed in double in the CPU's order, so it is the same double), su;
 *  - Hr and h_diag bit for bit (the same fp32 operations per element: signs,
 *    + damping, the butterflies and the 1/√128 scale in trellis_had128's order);
 *  - L and diag(D) to fp32 rounding: the Cholesky is a blocked right-looking
 *    one (cuBLAS strsm/ssyrk, fp32, no TF32) rather than OpenBLAS's spotrf.
 *    A pivot within rounding of zero may fail on one side and not the other;
 *    the Hessians the quantizer sees are damped far from that.
 *
 * cuBLAS: every call takes the caller's handle; its stream, pointer mode and
 * math mode are set for the call (the default math mode: no TF32) and restored
 * before returning. cuBLAS may allocate its own workspace on first use. */
#ifndef SPARQ_KERNELS_CUDA_HESSIAN_CUDA_H
#define SPARQ_KERNELS_CUDA_HESSIAN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the extern "C" block: this C header has no guard of its own */
#include "common/status.h"

/* A prepared Hessian on the device, the arrays of ldlq_hessian (ldlq.h). All
 * of them live in one device allocation (mem) of hess_cuda_bytes(k) bytes,
 * the identity's too (the decision is made on the device, after it). */
typedef struct hess_cuda {
    int k;
    int identity;  /* 1: no usable H (hr, l, d_diag are NULL; su and h_diag are set) */
    float damping; /* factor × mean(diag) actually added, as ldlq_hessian_damping (0 for the identity) */
    float *hr;     /* device k×k row-major: damped rotated Hr = Had·diag(su)·(H + damp·I)·diag(su)·Had */
    float *l;      /* device k×k row-major: block-unit-lower L, Hr = L·D·Lᵀ with 16×16 blocks */
    float *d_diag; /* device k: diag(D) */
    float *su;     /* device k: ±1 input signs */
    float *h_diag; /* device k: diag of the damped unrotated H (1 for the identity) */
    void *mem;     /* the device memory the arrays above point into */
    int owns_mem;  /* 1: mem is hess_cuda_prepare's own allocation (hess_cuda_free frees it) */
} hess_cuda;

/* A cuBLAS handle for these calls (for C callers without the CUDA headers). */
sparq_status hess_cuda_blas_create(void **cublas);
void hess_cuda_blas_destroy(void *cublas);

/* h (device k×k row-major fp32) += xᵀx for the rows×k row-major rows x
 * (device): the UPPER triangle only (c ≥ r), as qz_hess_add's cblas_ssyrk;
 * the strict lower triangle is not touched. cublasSsyrk, fp32. rows = 0 does
 * nothing. The caller counts the rows. Asynchronous on stream. */
sparq_status hess_cuda_accumulate(void *cublas, void *stream, float *h, int k, const float *x, int rows);

/* The mean from the accumulated upper triangle, as qz_hess_finish: every
 * h[r][c], c ≥ r, becomes h[r][c]·(1/count) (fp32, the same operations), and
 * is mirrored to h[c][r]; count = 0 gives all zeros. k a multiple of 32.
 * Asynchronous on stream. */
sparq_status hess_cuda_finish(void *stream, float *h, int k, uint64_t count);

/* Prepare from the device mean Hessian h (k×k row-major, symmetric, not
 * modified) exactly as ldlq_hessian_prepare: k a multiple of 128 (else
 * SPARQ_E_SHAPE), sigma_reg ≤ 0 means LDLQ_SIGMA_REG, damping × 4 and retried
 * up to 9 attempts, identity fallback, seed for su, the same messages naming
 * `name`. h == NULL gives the identity. Synchronous (the retry decision reads
 * the pivot check); *out is zeroed first and must be freed with hess_cuda_free
 * on success. */
sparq_status hess_cuda_prepare(void *cublas, void *stream, const float *h, int k, float sigma_reg, uint64_t seed,
                               const char *name, hess_cuda *out);
/* The same into caller memory: mem, at least hess_cuda_bytes(k) device bytes
 * (256-byte aligned, as cudaMalloc's), which the caller keeps while *out is
 * used; hess_cuda_free then only clears *out. Saves a cudaMalloc / cudaFree
 * (which waits for the device) per Hessian when many are prepared in turn. */
sparq_status hess_cuda_prepare_into(void *cublas, void *stream, const float *h, int k, float sigma_reg,
                                    uint64_t seed, const char *name, void *mem, size_t mem_bytes, hess_cuda *out);
void hess_cuda_free(hess_cuda *hs);

/* Device bytes hess_cuda_prepare allocates for k (its outputs and scratch, in
 * one allocation), for memory plans; cuBLAS's own workspace not included. */
size_t hess_cuda_bytes(int k);

/* The Cholesky factor in place: a (device n×n row-major, its lower triangle
 * read) becomes the lower C with A = C·Cᵀ in its lower triangle; the strict
 * upper triangle is not touched. Blocked right-looking with panel width nb
 * (64, 128 or 256; 0 = the default, HESS_CUDA_CHOL_NB). *info = 0, or the
 * 1-based column of the first pivot that is not positive and finite (as
 * LAPACK's spotrf; the factor is then partial). Synchronous. */
#define HESS_CUDA_CHOL_NB 128
sparq_status hess_cuda_cholesky(void *cublas, void *stream, float *a, int n, int nb, int *info);

#ifdef __cplusplus
}
#endif

#endif
