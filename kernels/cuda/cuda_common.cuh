/* kernels/cuda/cuda_common.cuh — the host-side pieces every CUDA trellis .cu
 * shares: the CUDA error check (the one place it is defined), the layouts of
 * the linear and workspace handles, the PDL launch configuration, the K ×
 * codebook dispatch helper and the launchers one file calls in another.
 * CUDA C++: included by the .cu files of kernels/cuda/ only (and by a lab .cu built into
 * the lab benchmark, kernels/cuda/lab/README.md), never by C code.
 *
 * The kernel families (docs/cuda.md, "Files"): trellis_linear.cu (handles,
 * decode, trellis_cuda_gemm's dispatch), gemv_int.cu (integer mul1 GEMV,
 * 1..4 rows), gemm_tc.cu (fp16 tensor-core GEMM, the other rows and
 * codebooks), gemm_prefill.cu (decode + cuBLAS), moe_decode.cu (the fused
 * MoE decode layer). */
#ifndef SPARQ_KERNELS_CUDA_CUDA_COMMON_CUH
#define SPARQ_KERNELS_CUDA_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_cuda_internal.h"
#include "kernels/cuda/trellis_decode.cuh"

/* --- errors ------------------------------------------------------------------ */

inline sparq_status cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return SPARQ_OK;
    return sparq_err(e == cudaErrorMemoryAllocation ? SPARQ_E_NOMEM : SPARQ_E_STATE, "cuda: %s: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CUDA_RETURN_IF(expr, ...)                                                  \
    do {                                                                           \
        cudaError_t e_ = (expr);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            char what_[256];                                                       \
            snprintf(what_, sizeof what_, __VA_ARGS__);                            \
            return cuda_status(e_, what_);                                         \
        }                                                                          \
    } while (0)

/* --- handles ------------------------------------------------------------------ */

struct trellis_cuda_linear {
    int k, n, K, cb;
    char name[96];
    uint32_t *trellis; /* (k/16)·(n/16) tiles of 8K words */
    __half *suh, *svh;
    bool owns; /* the three tensors are its own allocations (else the caller's memory) */
};

/* Rows the integer mul1 GEMV takes (one row group of its B operand). */
#define GEMV_INT_MAX_ROWS 4

struct trellis_cuda_ws {
    int max_k, max_n;
    __half *u; /* TRELLIS_GEMM_MAX_ROWS × max_k: gemm_tc's fp16 input */
    float *t;  /* TRELLIS_GEMM_MAX_ROWS × max_n, zero between calls */
    /* the integer GEMV's input (gemv_int.cu, k_gemv_int_input), for
     * GEMV_INT_MAX_ROWS rows: B words (max_k/16 k tiles × 32 lanes × 4),
     * A·s_β and Σu per row and 128-block, 510·Σq per row and 64-input half
     * block (ch) and 9 prefix sums of 510·Σq per row and 128-block (pc);
     * TRELLIS_CUDA_GROUP_MAX such sets (ws_input_set), one per linear of a
     * group, the first the single GEMV's */
    uint32_t *bq;
    float *sa, *usb;
    int *ch, *pc;
};

/* Set g of the integer GEMV's input arrays in ws. */
struct ws_input {
    uint32_t *bq;
    float *sa, *usb;
    int *ch, *pc;
};
inline ws_input ws_input_set(const trellis_cuda_ws *ws, int g)
{
    const size_t nbk = (size_t)(ws->max_k + 127) / 128, R = GEMV_INT_MAX_ROWS;
    return ws_input{ws->bq + g * (size_t)(ws->max_k / 16) * 32 * 4, ws->sa + g * R * nbk, ws->usb + g * R * nbk,
                    ws->ch + g * R * 2 * nbk, ws->pc + g * R * 9 * nbk};
}

/* --- launch helpers ----------------------------------------------------------- */

inline int sm_count(void) { return trellis_cuda_sm_count(); }

/* A launch configuration on stream s with programmatic dependent launch
 * allowed (attr: one attribute that must outlive the launch); the caller
 * sets the grid, block and shared memory. */
inline cudaLaunchConfig_t pdl_config(cudaLaunchAttribute *attr, cudaStream_t s)
{
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* The grid of a balanced main kernel fn launched in tpb-thread blocks: all
 * the blocks that are resident at once (occupancy query), but no more warps
 * than work items; *warps = the grid's warps (each takes an equal share). */
inline cudaError_t balanced_grid(const void *fn, int tpb, long long items, int *blocks, int *warps)
{
    const int wpb = tpb / 32;
    int per_sm = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, tpb, 0);
    if (e != cudaSuccess) return e;
    if (per_sm < 1) per_sm = 1;
    long long w = (long long)per_sm * sm_count() * wpb;
    if (w > items) w = items;
    *blocks = (int)((w + wpb - 1) / wpb);
    *warps = *blocks * wpb;
    return cudaSuccess;
}

/* Kernels are templates on K (1..8) and the codebook; with_k_cb turns the
 * run-time pair into compile-time constants once for every kernel family. */
template <int V>
using ic = std::integral_constant<int, V>;

template <int K, typename F>
inline auto with_cb(int cb, F &&f) -> decltype(f(ic<1>{}, ic<0>{}))
{
    switch (cb) {
    case trellis_dev::CB_3INST: return f(ic<K>{}, ic<trellis_dev::CB_3INST>{});
    case trellis_dev::CB_MCG: return f(ic<K>{}, ic<trellis_dev::CB_MCG>{});
    case trellis_dev::CB_MUL1: return f(ic<K>{}, ic<trellis_dev::CB_MUL1>{});
    default: return {};
    }
}

/* f(ic<K>, ic<CB>) for run-time K and cb; a value-initialised result (NULL) if
 * either is out of range. */
template <typename F>
inline auto with_k_cb(int K, int cb, F &&f) -> decltype(f(ic<1>{}, ic<0>{}))
{
    switch (K) {
    case 1: return with_cb<1>(cb, f);
    case 2: return with_cb<2>(cb, f);
    case 3: return with_cb<3>(cb, f);
    case 4: return with_cb<4>(cb, f);
    case 5: return with_cb<5>(cb, f);
    case 6: return with_cb<6>(cb, f);
    case 7: return with_cb<7>(cb, f);
    case 8: return with_cb<8>(cb, f);
    default: return {};
    }
}

/* --- across files -------------------------------------------------------------- */

/* The checks every GEMM entry point makes before launching (trellis_linear.cu). */
sparq_status gemm_args_check(const trellis_cuda_linear *lin, const float *x, int rows, const float *y,
                             const trellis_cuda_ws *ws);

/* The three launches of one GEMM kernel family on `stream`, parts =
 * TRELLIS_CUDA_PART_* (trellis_cuda_gemm: all). gemv_int_launch: kernel =
 * one of the TRELLIS_CUDA_GEMV_INT_* (gemv_int.cu); gemm_tc_launch: the fp16
 * tensor-core GEMM (gemm_tc.cu). Both check their arguments. */
sparq_status gemv_int_launch(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                             trellis_cuda_ws *ws, void *stream, trellis_cuda_gemm_kernel kernel, unsigned parts);
sparq_status gemm_tc_launch(const trellis_cuda_linear *lin, const float *x, int rows, float *y, trellis_cuda_ws *ws,
                            void *stream, unsigned parts);

#endif
