/* kernels/cuda/gemv_int.cu — the integer mul1 GEMV y = x·W at 1..4 rows, what
 * trellis_cuda_gemm runs for mul1 linears at up to 4 rows (arithmetic:
 * gemv_int.cuh; docs/cuda.md "Integer mul1 GEMM"). Three launches, all
 * chained by programmatic dependent launch:
 *  1. k_gemv_int_input: per row and 128-block, one warp: had128(x ⊙ suh),
 *     quantised to 16-bit q, written as B words with A·s_β, 510·Σq per half
 *     block, its prefix sums per k tile and Σu; chained to the previous kernel
 *     on the stream too (it loads suh, then waits for that kernel);
 *  2. the main kernel on a grid of exactly the resident warps, equal shares
 *     of its work items per warp: one of the three below;
 *  3. k_gemv_int_output: per row and 128 columns, one warp: y = had128(t +
 *     D·Σu) ⊙ svh, t = 0; its t loads go out before the Σu loop (one L2 round
 *     trip after the main kernel, not two).
 *
 * The main kernels, one per dispatch decision (trellis_cuda_gemm_choice):
 *  - gemv_int_c8_w16 (one row, ≥ GEMV_INT_W16_ITEMS work items per resident
 *    warp, K = 2..4): one k tile × 8 tile columns a step (int2_segment), in
 *    16-warp blocks at ≤ 120 registers, one a SM (two 8-warp blocks: the
 *    schedulers favour the older one, and the second fell behind);
 *  - gemv_int_c8_w8 (2..4 rows from GEMV_INT_W8_ITEMS items, and one row at
 *    K = 1, 5..8): the same loop in 8-warp blocks, two a SM (16 adjacent warps
 *    flushing the same outputs' atomics for every row lost 0.7–2.5 µs);
 *  - gemv_int_c2 (1..4 rows below those): 4 k tiles × 2 tile columns a step,
 *    4× the work items, so small linears spread over every SM.
 * What bounds them: integer instruction issue. The 8-column loop executes 32
 * instructions a tile at K = 3 (8 IMAD for h, 13 for the 8 state cuts, 2
 * funnel shifts, 2 IMMA, loads and addressing), issued at ~64 % with both
 * integer pipes ~52 % busy (ncu, docs/benchmarks-cuda.md rounds 8–9): the
 * main kernel is 14.4 µs of 17.0 on 4096×14336 K=3, DRAM well below its peak.
 * Small linears are latency-bound: the launch floor of three chained
 * launches and the memory latency of the input and output stages. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemv_int.cuh"

using namespace trellis_dev;

/* The input launch's work for 128-block beta of row r by one warp: u[e] =
 * (x ⊙ suh) at positions lane + 32e before the Hadamard. */
__device__ __forceinline__ void int_input_warp(float (&u)[4], int beta, int r, int k, uint32_t *__restrict__ bq,
                                               float *__restrict__ sa, int *__restrict__ ch,
                                               float *__restrict__ usb, int *__restrict__ pc)
{
    const int lane = threadIdx.x & 31, nb = k >> 7;
    had128_warp(u, lane);
    int q[4], kq[8];
    float as, su;
    warp_quant128(u, lane, q, as, su, kq);
    if (lane == 0) {
        sa[r * nb + beta] = as;
        usb[r * nb + beta] = su;
        ch[r * 2 * nb + 2 * beta] = 510 * ((kq[0] + kq[1]) + (kq[2] + kq[3]));
        ch[r * 2 * nb + 2 * beta + 1] = 510 * ((kq[4] + kq[5]) + (kq[6] + kq[7]));
        int acc = 0;
        pc[(r * nb + beta) * 9] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            acc += 510 * kq[j];
            pc[(r * nb + beta) * 9 + j + 1] = acc;
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) int_bq_store(bq, q[e], lane + 32 * e, beta, r, k >> 4);
}

/* Grid (⌈nb/4⌉, rows), 128 threads: one warp per 128-block (shuffles only, no
 * shared memory or barrier). Lets the main kernel start at once, loads suh,
 * then waits for the previous kernel (x may come from it). */
__global__ void __launch_bounds__(128) k_gemv_int_input(const float *__restrict__ x, const __half *__restrict__ suh,
                                                        uint32_t *__restrict__ bq, float *__restrict__ sa,
                                                        int *__restrict__ ch, float *__restrict__ usb,
                                                        int *__restrict__ pc, int k)
{
    griddep_launch();
    const int lane = threadIdx.x & 31, beta = blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y;
    if (beta >= (k >> 7)) return;
    float u[4];
#pragma unroll
    for (int e = 0; e < 4; e++) u[e] = __half2float(suh[(size_t)beta * 128 + lane + 32 * e]);
    griddep_wait();
#pragma unroll
    for (int e = 0; e < 4; e++) u[e] *= x[(size_t)r * k + (size_t)beta * 128 + lane + 32 * e];
    int_input_warp(u, beta, r, k, bq, sa, ch, usb, pc);
}

/* y[r·n + j] = had128(t + D·Σu_r)[j] ⊙ svh[j], then t = 0: grid (⌈n/512⌉,
 * rows), 128 threads, one warp per 128 columns. svh is loaded before the
 * wait for the main kernel in the source, but ptxas moves the wait above
 * those loads. The t loads are issued before the Σu loop: behind it they
 * waited for its loads and adds, a second L2 round trip after the main
 * kernel (lab v49–v51: 0.06–0.32 µs on every shape). */
__global__ void __launch_bounds__(128) k_gemv_int_output(float *__restrict__ t, const float *__restrict__ usb,
                                                         const __half *__restrict__ svh, float *__restrict__ y,
                                                         int n, int nb)
{
    griddep_launch(); /* the next launch may start; it waits before touching what this one reads */
    const int lane = threadIdx.x & 31, cb = blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y;
    if (cb >= (n >> 7)) return;
    float sv[4];
#pragma unroll
    for (int e = 0; e < 4; e++) sv[e] = __half2float(svh[cb * 128 + lane + 32 * e]);
    griddep_wait();
    float *tr = t + (size_t)r * n + cb * 128;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = tr[lane + 32 * e];
    float su = 0.0f;
    for (int b = lane; b < nb; b += 32) su += usb[r * nb + b];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        v[e] += INT_D * su;
        tr[lane + 32 * e] = 0.0f;
    }
    had128_warp(v, lane);
#pragma unroll
    for (int e = 0; e < 4; e++) y[(size_t)r * n + cb * 128 + lane + 32 * e] = v[e] * sv[e];
}

/* gemv_int_c2: items (pair of tile columns, step of 4 k tiles), next step's
 * words loaded ahead; per k tile and tile column a lane cuts 8 states, 8 IMAD
 * for h, 2 IMMA; per step (one 64-input half block) the int32 sums become
 * fp32: f += A·s_β · I. `ch`: 510·Σq per half block. */
template <int K>
__global__ void __launch_bounds__(256, 2)
    k_gemv_int_c2(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                  const float *__restrict__ sa, const int *__restrict__ ch, float *__restrict__ t, int k, int n,
                  int rows, int total_warps, uint32_t one)
{
    constexpr int NW = 2, U = 4, TW = 8 * K, NWD = lane_nwords<K, DEC_2W>();
    constexpr int D = DEC_2W | DEC_FMA;
    griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW, spg = ktiles / U, nb = k >> 7;
    const long long total = (long long)ngroups * spg;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool bok = (g >> 1) < rows;
    bool waited = false;
    while (q < q1) {
        const int grp = (int)(q / spg);
        const long long qend = min(q1, (long long)(grp + 1) * spg);
        const uint32_t *p = trellis + (size_t)grp * NW * TW;
        float f[1][NW][2]; /* one row group */
#pragma unroll
        for (int j = 0; j < NW; j++) f[0][j][0] = f[0][j][1] = 0.0f;
        uint32_t w[U][NW][NWD];
        words_load<K, NW, U, NWD>(p + (size_t)(q - (long long)grp * spg) * U * row_stride, row_stride, lr, w);
        if (!waited) {
            griddep_wait();
            waited = true;
        }
        for (; q < qend; q++) {
            const int kt = (int)(q - (long long)grp * spg) * U;
            uint32_t wn[U][NW][NWD];
            const int ktn = q + 1 < qend ? kt + U : kt;
            words_load<K, NW, U, NWD>(p + (size_t)ktn * row_stride, row_stride, lr, wn);
            uint32_t braw[U][4];
            const uint32_t *pb = bq + ((size_t)kt * 32 + lane) * 4;
#pragma unroll
            for (int u = 0; u < U; u++) {
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (bok) v = __ldg((const uint4 *)(pb + (size_t)u * 32 * 4));
                braw[u][0] = v.x;
                braw[u][1] = v.y;
                braw[u][2] = v.z;
                braw[u][3] = v.w;
            }
            const float s = __ldg(sa + c * nb + (kt >> 3));
            const int cq = __ldg(ch + c * 2 * nb + (kt >> 2));
            uint32_t acc[NW][2][4];
#pragma unroll
            for (int j = 0; j < NW; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[j][0][e] = acc[j][1][e] = 0u;
#pragma unroll
            for (int u = 0; u < U; u++) {
                uint32_t b[4];
#pragma unroll
                for (int e = 0; e < 4; e++) b[e] = braw[u][e];
#pragma unroll
                for (int j = 0; j < NW; j++) {
                    uint32_t x[8];
                    lane_hash_w<K, D, NWD>(w[u][j], lr.r, one, x);
                    tile_imma(x, b, acc[j][0], acc[j][1]);
                }
            }
#pragma unroll
            for (int j = 0; j < NW; j++) {
                const uint32_t h0 = acc[j][0][0] + acc[j][1][0], l0 = acc[j][0][1] + acc[j][1][1];
                const uint32_t h1 = acc[j][0][2] + acc[j][1][2], l1 = acc[j][0][3] + acc[j][1][3];
                const int i0 = (int)((h0 << 8) + l0 - (uint32_t)cq);
                const int i1 = (int)((h1 << 8) + l1 - (uint32_t)cq);
                f[0][j][0] = fmaf(s, (float)i0, f[0][j][0]);
                f[0][j][1] = fmaf(s, (float)i1, f[0][j][1]);
            }
            words_copy<NW, U, NWD>(w, wn);
        }
        int_flush<1, NW>(t, n, rows, 16 * grp * NW, g, c, f);
    }
}

/* The gemv_int_c8 kernels' body: items (group of 8 tile columns, k tile),
 * equal ranges per warp, one int2_segment per column group a range crosses.
 * `pc`: the per-block prefix sums of 510·Σq. */
template <int K>
__device__ __forceinline__ void gemv_int_c8_body(const uint32_t *__restrict__ trellis,
                                                 const uint32_t *__restrict__ bq, const float *__restrict__ sa,
                                                 const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                                                 int rows, int total_warps, uint32_t one)
{
    constexpr int NW = GEMV_INT_C8_NW;
    griddep_launch();
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ntiles = n >> 4, ktiles = k >> 4, ngroups = ntiles / NW;
    const long long total = (long long)ngroups * ktiles;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const int g = lane >> 2;
    const bool bok = (g >> 1) < rows;
    bool waited = false;
    while (q < q1) {
        const int grp = (int)(q / ktiles);
        const int kt0 = (int)(q - (long long)grp * ktiles);
        const int kt1 = (int)(min(q1, (long long)(grp + 1) * ktiles) - (long long)grp * ktiles);
        q += kt1 - kt0;
        int2_segment<K, false>(trellis, bq, sa, pc, t, k, n, rows, grp, kt0, kt1, lr, one, bok, waited);
    }
}

/* gemv_int_c8_w8: 256 threads, registers for 2 blocks a SM. */
template <int K>
__global__ void __launch_bounds__(256, 2)
    k_gemv_int_c8_w8(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                     const float *__restrict__ sa, const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                     int rows, int total_warps, uint32_t one)
{
    gemv_int_c8_body<K>(trellis, bq, sa, pc, t, k, n, rows, total_warps, one);
}

/* gemv_int_c8_w16: launched in 512-thread blocks, at most 120 registers a
 * thread so that one block of the small launches (≤ 32 registers × 128
 * threads) still fits beside it (nvcc takes __maxnreg__ or __launch_bounds__
 * on a kernel, not both). */
template <int K>
__global__ void __maxnreg__(120)
    k_gemv_int_c8_w16(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                      const float *__restrict__ sa, const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                      int rows, int total_warps, uint32_t one)
{
    gemv_int_c8_body<K>(trellis, bq, sa, pc, t, k, n, rows, total_warps, one);
}

typedef void (*gemv_int_fn)(const uint32_t *, const uint32_t *, const float *, const int *, float *, int, int, int,
                            int, uint32_t);

/* The main kernel of `kernel` for K, or NULL (gemv_int_c8_w16 exists for K =
 * 2..4 only). */
static gemv_int_fn gemv_int_pick(int K, trellis_cuda_gemm_kernel kernel)
{
    return with_k_cb(K, CB_MUL1, [&](auto k, auto) -> gemv_int_fn {
        constexpr int KK = decltype(k)::value;
        switch (kernel) {
        case TRELLIS_CUDA_GEMV_INT_C8_W16:
            if constexpr (KK >= 2 && KK <= 4) return k_gemv_int_c8_w16<KK>;
            return NULL;
        case TRELLIS_CUDA_GEMV_INT_C8_W8: return k_gemv_int_c8_w8<KK>;
        case TRELLIS_CUDA_GEMV_INT_C2: return k_gemv_int_c2<KK>;
        default: return NULL;
        }
    });
}

sparq_status gemv_int_launch(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                             trellis_cuda_ws *ws, void *stream, trellis_cuda_gemm_kernel kernel, unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    const char *kname = trellis_cuda_gemm_kernel_name(kernel);
    RETURN_IF(lin->cb != CB_MUL1, SPARQ_E_UNSUPPORTED, "%s: the integer CUDA gemv (%s) is for mul1 only", lin->name,
              kname);
    RETURN_IF(rows > GEMV_INT_MAX_ROWS, SPARQ_E_UNSUPPORTED, "%s: the integer CUDA gemv (%s) takes 1..%d rows, not %d",
              lin->name, kname, GEMV_INT_MAX_ROWS, rows);
    const gemv_int_fn fn = gemv_int_pick(lin->K, kernel);
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no integer CUDA gemv %s for K=%d", lin->name, kname, lin->K);
    const bool c8 = kernel != TRELLIS_CUDA_GEMV_INT_C2;
    const int tpb = kernel == TRELLIS_CUDA_GEMV_INT_C8_W16 ? 512 : 256, nb = lin->k / 128;
    const long long items = c8 ? (long long)(lin->n / 16 / GEMV_INT_C8_NW) * (lin->k / 16)
                               : (long long)(lin->n / 32) * (lin->k / 64);
    int blocks = 0, warps = 0;
    CUDA_RETURN_IF(balanced_grid((const void *)fn, tpb, items, &blocks, &warps), "%s: occupancy query", lin->name);
    cudaStream_t s = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    if (parts & TRELLIS_CUDA_PART_INPUT) {
        cfg.gridDim = dim3((nb + 3) / 4, rows);
        cfg.blockDim = dim3(128);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_gemv_int_input, x, (const __half *)lin->suh, ws->bq, ws->sa, ws->ch,
                                          ws->usb, ws->pc, lin->k),
                       "%s: integer input transform launch", lin->name);
    }
    if (parts & TRELLIS_CUDA_PART_MAIN) {
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(tpb);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fn, (const uint32_t *)lin->trellis, (const uint32_t *)ws->bq,
                                          (const float *)ws->sa, (const int *)(c8 ? ws->pc : ws->ch), ws->t, lin->k,
                                          lin->n, rows, warps, 1u),
                       "%s: integer gemv launch (%s, %d blocks, PDL)", lin->name, kname, blocks);
    }
    if (parts & TRELLIS_CUDA_PART_OUTPUT) {
        cfg.gridDim = dim3((lin->n / 128 + 3) / 4, rows);
        cfg.blockDim = dim3(128);
        CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_gemv_int_output, ws->t, (const float *)ws->usb,
                                          (const __half *)lin->svh, y, lin->n, nb),
                       "%s: integer output transform launch (PDL)", lin->name);
    }
    return SPARQ_OK;
}
