/* kernels/cuda/gemm_tc.cu — gemm_tc, the fp16 tensor-core GEMM y = x·W for
 * 1..16 rows and every K and codebook: what trellis_cuda_gemm runs at 5..16
 * rows and for 3inst / mcg (lab v10, docs/cuda.md "GEMM").
 *
 * Three launches on one stream, chained by programmatic dependent launch:
 *  1. k_input<true>: u = fp16(had128(x ⊙ suh)), one 128-thread block per 128
 *     inputs and row; lets the main kernel start at once;
 *  2. k_gemm_tc: t += u·Q on a grid of exactly the resident warps, each
 *     taking an equal share of the (tile-column pair, step of 4 k tiles)
 *     work items and flushing its fp32 accumulators with atomics whenever it
 *     crosses into the next column pair; per k tile a lane loads two (K ≤ 4)
 *     or three ring words per column, decodes 8 values in registers
 *     (trellis_decode.cuh: mul1 byte sums on the tensor core, state masks on
 *     the FMA pipe) straight into mma.m16n8k16 B fragments and issues two
 *     mma.sync with u as the A operand (batch rows = mma rows: 1..16 rows
 *     cost the same decode); the next step's words are loaded before the
 *     current step is decoded, the first ones before griddepcontrol.wait;
 *  3. k_output<true>: y = had128(t) ⊙ svh, t = 0 for the next call.
 *
 * What bounds it: integer instruction issue, not memory. About four
 * integer/fp16 instructions a weight (51 warp-instructions per 16×16 tile),
 * issued at ~63 % with both integer pipes half busy; flat in K, DRAM at
 * 17–19 % of peak on the H200 (docs/benchmarks-cuda.md, round 2). It is
 * what 5..16 rows and the other codebooks run because the integer GEMV's
 * IMMA count grows with every group of 4 rows, while here rows are free. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp16_io.cuh"

using namespace trellis_dev;

/* t += u·Q, u fp16 rows×k read as half2 words: the balanced loop above,
 * 256 threads, register budget for 2 blocks a SM; `one` = 1 at run time
 * (DEC_FMA, see lane_state_d). */
template <int K, int CB>
__global__ void __launch_bounds__(256, 2) k_gemm_tc(const uint32_t *__restrict__ trellis,
                                                   const uint32_t *__restrict__ u2, float *__restrict__ t, int k,
                                                   int n, int rows, int total_warps, uint32_t one)
{
    constexpr int D = DEC_2W | DEC_IMMA | DEC_FMA;
    constexpr int NW = 2, U = 4, TW = 8 * K, NWD = lane_nwords<K, D>();
    griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW, spg = ktiles / U;
    const long long total = (long long)ngroups * spg;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool lo_ok = g < rows, hi_ok = g + 8 < rows;
    const uint32_t *ua = u2 + (((size_t)g * k) >> 1) + c;
    const uint32_t *ub = u2 + (((size_t)(g + 8) * k) >> 1) + c;
    uint32_t sel0 = 0, sel1 = 0;
    imma_sel_make(lane, sel0, sel1);
    bool waited = false; /* u is read only after griddep_wait */
    while (q < q1) {
        const int grp = (int)(q / spg);
        const long long qend = min(q1, (long long)(grp + 1) * spg);
        const uint32_t *p = trellis + (size_t)grp * NW * TW;
        float acc[NW][2][4];
        acc_zero<NW>(acc);
        uint32_t w[U][NW][NWD];
        words_load<K, NW, U, NWD>(p + (size_t)(q - (long long)grp * spg) * U * row_stride, row_stride, lr, w);
        if (!waited) {
            griddep_wait();
            waited = true;
        }
        for (; q < qend; q++) {
            const int kt = (int)(q - (long long)grp * spg) * U;
            uint32_t a[U][4];
            uint32_t wn[U][NW][NWD];
            /* the next step's words (the last step reloads its own: no branch) */
            const int ktn = q + 1 < qend ? kt + U : kt;
            words_load<K, NW, U, NWD>(p + (size_t)ktn * row_stride, row_stride, lr, wn);
#pragma unroll
            for (int s = 0; s < U; s++) afrag_load(ua, ub, kt + s, lo_ok, hi_ok, a[s]);
#pragma unroll
            for (int s = 0; s < U; s++) tiles_mma<K, CB, NW, D, NWD>(w[s], lr.r, a[s], acc, sel0, sel1, one);
            words_copy<NW, U, NWD>(w, wn);
        }
        acc_flush<NW>(t, n, 16 * grp * NW, lane, lo_ok, hi_ok, acc);
    }
}

typedef void (*gemm_tc_fn)(const uint32_t *, const uint32_t *, float *, int, int, int, int, uint32_t);

sparq_status gemm_tc_launch(const trellis_cuda_linear *lin, const float *x, int rows, float *y, trellis_cuda_ws *ws,
                            void *stream, unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    const gemm_tc_fn fn = with_k_cb(lin->K, lin->cb, [](auto k, auto c) -> gemm_tc_fn {
        return k_gemm_tc<decltype(k)::value, decltype(c)::value>;
    });
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no CUDA gemm for K=%d codebook %d", lin->name, lin->K, lin->cb);
    const int tpb = 256;
    /* work items: steps of 4 k tiles × column pairs */
    const long long items = (long long)(lin->n / 32) * (lin->k / 64);
    int blocks = 0, warps = 0;
    CUDA_RETURN_IF(balanced_grid((const void *)fn, tpb, items, &blocks, &warps), "%s: occupancy query", lin->name);
    cudaStream_t s = (cudaStream_t)stream;
    /* main and output may start before their predecessor ends (they wait
     * with griddepcontrol.wait before reading its results); the input
     * transform is a plain launch, so it waits for the previous call's
     * output transform to finish zeroing t */
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        k_input<true><<<dim3(lin->k / 128, rows), 128, 0, s>>>(x, lin->suh, ws->u, lin->k);
        CUDA_RETURN_IF(cudaGetLastError(), "%s: input transform launch", lin->name);
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(tpb);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fn, lin->trellis, (const uint32_t *)ws->u, ws->t, lin->k, lin->n,
                                          rows, warps, 1u),
                       "%s: balanced gemm launch (%d blocks, PDL)", lin->name, blocks);
    }
    if (parts & TRELLIS_CUDA_PART_OUTPUT) {
        cfg.gridDim = dim3(lin->n / 128, rows);
        cfg.blockDim = dim3(128);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_output<true>, ws->t, (const __half *)lin->svh, y, lin->n),
                       "%s: output transform launch (PDL)", lin->name);
    }
    return SPARQ_OK;
}
