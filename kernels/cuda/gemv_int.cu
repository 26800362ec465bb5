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

/* A warp's 128 output columns before svh: v = had128(t + D·Σu) from the
 * main kernel's partial sums tr (lane l: columns l + 32e) and the row's Σu per
 * 128-block (usb_r, nb of them); tr = 0 again. The t loads go out before the
 * Σu loop. */
__device__ __forceinline__ void output_block(float *__restrict__ tr, const float *__restrict__ usb_r, int nb, int lane,
                                             float (&v)[4])
{
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = tr[lane + 32 * e];
    float su = 0.0f;
    for (int b = lane; b < nb; b += 32) su += usb_r[b];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        v[e] += INT_D * su;
        tr[lane + 32 * e] = 0.0f;
    }
    had128_warp(v, lane);
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
    output_block(tr, usb + r * nb, nb, lane, v);
#pragma unroll
    for (int e = 0; e < 4; e++) y[(size_t)r * n + cb * 128 + lane + 32 * e] = v[e] * sv[e];
}

/* gemv_int_c2: items (pair of tile columns, step of 4 k tiles), next step's
 * words loaded ahead; per k tile and tile column a lane cuts 8 states, 8 IMAD
 * for h, 2 IMMA; per step (one 64-input half block) the int32 sums become
 * fp32: f += A·s_β · I. `ch`: 510·Σq per half block. */
template <int K>
__device__ __forceinline__ void c2_range(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                                         const float *__restrict__ sa, const int *__restrict__ ch,
                                         float *__restrict__ t, int k, int n, int rows, long long q,
                                         const long long q1, const lane_ring &lr, uint32_t one, bool &waited)
{
    constexpr int NW = 2, U = 4, TW = 8 * K, NWD = lane_nwords<K, DEC_2W>();
    constexpr int D = DEC_2W | DEC_FMA;
    const int lane = threadIdx.x & 31;
    const int ntiles = n >> 4, ktiles = k >> 4, spg = ktiles / U, nb = k >> 7;
    const size_t row_stride = (size_t)ntiles * TW;
    const int g = lane >> 2, c = lane & 3;
    const bool bok = (g >> 1) < rows;
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

/* Work items [*q0, *q1) of `total` for this warp of `total_warps`: equal shares. */
__device__ __forceinline__ void warp_share(long long total, int total_warps, long long *q0, long long *q1)
{
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    *q0 = total * warp / total_warps;
    *q1 = total * (warp + 1) / total_warps;
}

template <int K>
__global__ void __launch_bounds__(256, 2)
    k_gemv_int_c2(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                  const float *__restrict__ sa, const int *__restrict__ ch, float *__restrict__ t, int k, int n,
                  int rows, int total_warps, uint32_t one)
{
    griddep_launch();
    long long q, q1;
    warp_share((long long)(n >> 5) * (k >> 6), total_warps, &q, &q1);
    bool waited = false;
    c2_range<K>(trellis, bq, sa, ch, t, k, n, rows, q, q1, lane_ring_make(K, threadIdx.x & 31), one, waited);
}

/* The gemv_int_c8 kernels' body: items (group of 8 tile columns, k tile),
 * equal ranges per warp, one int2_segment per column group a range crosses.
 * `pc`: the per-block prefix sums of 510·Σq. */
template <int K>
__device__ __forceinline__ void c8_range(const uint32_t *__restrict__ trellis, const uint32_t *__restrict__ bq,
                                         const float *__restrict__ sa, const int *__restrict__ pc,
                                         float *__restrict__ t, int k, int n, int rows, long long q,
                                         const long long q1, const lane_ring &lr, uint32_t one, bool &waited)
{
    const int ktiles = k >> 4;
    const bool bok = ((threadIdx.x & 31) >> 3) < rows;
    while (q < q1) {
        const int grp = (int)(q / ktiles);
        const int kt0 = (int)(q - (long long)grp * ktiles);
        const int kt1 = (int)(min(q1, (long long)(grp + 1) * ktiles) - (long long)grp * ktiles);
        q += kt1 - kt0;
        int2_segment<K, false>(trellis, bq, sa, pc, t, k, n, rows, grp, kt0, kt1, lr, one, bok, waited);
    }
}

template <int K>
__device__ __forceinline__ void gemv_int_c8_body(const uint32_t *__restrict__ trellis,
                                                 const uint32_t *__restrict__ bq, const float *__restrict__ sa,
                                                 const int *__restrict__ pc, float *__restrict__ t, int k, int n,
                                                 int rows, int total_warps, uint32_t one)
{
    griddep_launch();
    long long q, q1;
    warp_share((long long)(n / 16 / GEMV_INT_C8_NW) * (k >> 4), total_warps, &q, &q1);
    bool waited = false;
    c8_range<K>(trellis, bq, sa, pc, t, k, n, rows, q, q1, lane_ring_make(K, threadIdx.x & 31), one, waited);
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

struct gemv_group;
typedef void (*group_main_fn)(const gemv_group, int);

/* The main kernels of `kernel` for K, the single GEMV's and the group's, or
 * NULLs (gemv_int_c8_w16 exists for K = 2..4 only). Defined below the group's kernels. */
struct main_fns {
    gemv_int_fn single;
    group_main_fn group;
};
static main_fns main_pick(int K, trellis_cuda_gemm_kernel kernel);

sparq_status gemv_int_launch(const trellis_cuda_linear *lin, const float *x, int rows, float *y,
                             trellis_cuda_ws *ws, void *stream, trellis_cuda_gemm_kernel kernel, unsigned parts)
{
    FORWARD_IF(gemm_args_check(lin, x, rows, y, ws));
    const char *kname = trellis_cuda_gemm_kernel_name(kernel);
    RETURN_IF(lin->cb != CB_MUL1, SPARQ_E_UNSUPPORTED, "%s: the integer CUDA gemv (%s) is for mul1 only", lin->name,
              kname);
    RETURN_IF(rows > GEMV_INT_MAX_ROWS, SPARQ_E_UNSUPPORTED, "%s: the integer CUDA gemv (%s) takes 1..%d rows, not %d",
              lin->name, kname, GEMV_INT_MAX_ROWS, rows);
    const gemv_int_fn fn = main_pick(lin->K, kernel).single;
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

/* --- the GEMV with the residual add and the next RMSNorm (trellis_cuda_gemv_add_rmsnorm) --- */

/* Grid (rows), n/128 warps (≤ 32): warp cb's 128 columns y as
 * k_gemv_int_output makes them, then h += y (each sum rounded once, as the
 * add_rmsnorm op) and xn = w ⊙ (h · inv), inv = 1/√(Σh²/n + eps) with the sum
 * in double, as k_rmsnorm. The whole row is one block, so the norm needs no
 * further launch; h and t are loaded in one round trip after the wait. */
__global__ void __launch_bounds__(1024) k_gemv_int_output_norm(float *__restrict__ t, const float *__restrict__ usb,
                                                               const __half *__restrict__ svh, float *__restrict__ h,
                                                               const float *__restrict__ w, float eps,
                                                               float *__restrict__ xn, int n, int nb)
{
    __shared__ double part[32];
    griddep_launch();
    const int lane = threadIdx.x & 31, cb = threadIdx.x >> 5, r = blockIdx.x, nw = blockDim.x >> 5;
    float sv[4], wn[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        sv[e] = __half2float(svh[cb * 128 + lane + 32 * e]);
        wn[e] = w[cb * 128 + lane + 32 * e];
    }
    griddep_wait();
    float *hr = h + (size_t)r * n + cb * 128;
    float hv[4], v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) hv[e] = hr[lane + 32 * e];
    output_block(t + (size_t)r * n + cb * 128, usb + r * nb, nb, lane, v);
    double ss = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        hv[e] += v[e] * sv[e];
        hr[lane + 32 * e] = hv[e];
        ss += (double)hv[e] * hv[e];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if (lane == 0) part[cb] = ss;
    __syncthreads();
    ss = 0;
    for (int i = 0; i < nw; i++) ss += part[i];
    const float inv = (float)(1.0 / sqrt(ss / n + eps));
#pragma unroll
    for (int e = 0; e < 4; e++) xn[(size_t)r * n + cb * 128 + lane + 32 * e] = wn[e] * (hv[e] * inv);
}

bool trellis_cuda_gemv_add_rmsnorm_ok(const trellis_cuda_linear *lin, int rows, const trellis_cuda_ws *ws)
{
    return lin && ws && lin->cb == CB_MUL1 && rows >= 1 && rows <= GEMV_INT_MAX_ROWS && lin->n % 128 == 0 &&
           lin->n / 128 <= 32 && lin->k % 128 == 0 && lin->k <= ws->max_k && lin->n <= ws->max_n &&
           main_pick(lin->K, trellis_cuda_gemm_choice(lin, rows)).single;
}

sparq_status trellis_cuda_gemv_add_rmsnorm(const trellis_cuda_linear *lin, const float *x, int rows, float *h,
                                           const float *w, float eps, float *xn, trellis_cuda_ws *ws, void *stream)
{
    RETURN_IF(!trellis_cuda_gemv_add_rmsnorm_ok(lin, rows, ws), SPARQ_E_UNSUPPORTED,
              "%s: no fused integer gemv + add_rmsnorm at %d rows", lin ? lin->name : "cuda gemv", rows);
    RETURN_IF(!h || !w || !xn, SPARQ_E_ARG, "%s: gemv + add_rmsnorm without its residual, weight or output",
              lin->name);
    const trellis_cuda_gemm_kernel kernel = trellis_cuda_gemm_choice(lin, rows);
    FORWARD_IF(gemv_int_launch(lin, x, rows, xn, ws, stream, kernel, TRELLIS_CUDA_PART_INPUT | TRELLIS_CUDA_PART_MAIN));
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, (cudaStream_t)stream);
    cfg.gridDim = dim3(rows);
    cfg.blockDim = dim3(lin->n / 128 * 32);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_gemv_int_output_norm, ws->t, (const float *)ws->usb,
                                      (const __half *)lin->svh, h, w, eps, xn, lin->n, lin->k / 128),
                   "%s: integer output transform + add_rmsnorm launch (PDL)", lin->name);
    return SPARQ_OK;
}

/* --- a group of linears on one input (trellis_cuda_gemv_group) ------------------------ */

/* The group as the kernels see it (a kernel parameter: ~400 bytes). */
struct gemv_group {
    int n_lin, k, rows, hd;
    const uint32_t *trellis[TRELLIS_CUDA_GROUP_MAX];
    const __half *suh[TRELLIS_CUDA_GROUP_MAX], *svh[TRELLIS_CUDA_GROUP_MAX];
    int n[TRELLIS_CUDA_GROUP_MAX];
    long long item0[TRELLIS_CUDA_GROUP_MAX + 1]; /* the main kernel's work items, prefix sums */
    int cb0[TRELLIS_CUDA_GROUP_MAX + 1];         /* 128-column blocks, prefix sums */
    ws_input in[TRELLIS_CUDA_GROUP_MAX];
    float *t[TRELLIS_CUDA_GROUP_MAX]; /* rows × n_g partial sums each, zero between calls */
    float *y[TRELLIS_CUDA_GROUP_MAX];
    const float *norm;
    float eps;
    const float *head_norm[TRELLIS_CUDA_GROUP_MAX];
    bool rope[TRELLIS_CUDA_GROUP_MAX];
    const float *inv_freq;
    const int *pos, *kv_first;
    float *cache[TRELLIS_CUDA_GROUP_MAX];
};

/* Grid (⌈nb/4⌉, rows, n_lin), 128 threads: k_gemv_int_input for linear
 * blockIdx.z, on rmsnorm(x) ⊙ norm when norm is set (every block sums its
 * row's squares itself, in double as k_rmsnorm: 4k bytes from L2). */
__global__ void __launch_bounds__(128) k_group_input(const float *__restrict__ x, const gemv_group gp)
{
    griddep_launch();
    const int lane = threadIdx.x & 31, beta = blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y, g = blockIdx.z;
    const int k = gp.k;
    const bool live = beta < (k >> 7);
    float u[4];
#pragma unroll
    for (int e = 0; e < 4; e++) u[e] = live ? __half2float(gp.suh[g][(size_t)beta * 128 + lane + 32 * e]) : 0.0f;
    griddep_wait();
    const float *xr = x + (size_t)r * k;
    float inv = 1.0f;
    if (gp.norm) {
        __shared__ double part[4];
        double ss = 0;
        for (int i = threadIdx.x; i < k; i += 128) ss += (double)xr[i] * xr[i];
#pragma unroll
        for (int h = 16; h > 0; h >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, h);
        if (lane == 0) part[threadIdx.x >> 5] = ss;
        __syncthreads();
        ss = (part[0] + part[1]) + (part[2] + part[3]);
        inv = (float)(1.0 / sqrt(ss / k + gp.eps));
    }
    if (!live) return;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int i = beta * 128 + lane + 32 * e;
        u[e] *= gp.norm ? gp.norm[i] * (xr[i] * inv) : xr[i];
    }
    int_input_warp(u, beta, r, k, gp.in[g].bq, gp.in[g].sa, gp.in[g].ch, gp.in[g].usb, gp.in[g].pc);
}

/* The main kernel over the group's concatenated work items: a warp's equal
 * share may span two linears. C8: gemv_int_c8's loop, else gemv_int_c2's. */
template <int K, bool C8>
__device__ __forceinline__ void group_main(const gemv_group &gp, int total_warps)
{
    griddep_launch();
    long long q, q1;
    warp_share(gp.item0[gp.n_lin], total_warps, &q, &q1);
    const lane_ring lr = lane_ring_make(K, threadIdx.x & 31);
    bool waited = false;
    for (int g = 0; g < gp.n_lin && q < q1; g++) {
        const long long a = gp.item0[g], b = gp.item0[g + 1];
        if (q >= b) continue;
        const long long e = min(q1, b);
        if constexpr (C8)
            c8_range<K>(gp.trellis[g], gp.in[g].bq, gp.in[g].sa, gp.in[g].pc, gp.t[g], gp.k, gp.n[g], gp.rows, q - a,
                        e - a, lr, 1u, waited);
        else
            c2_range<K>(gp.trellis[g], gp.in[g].bq, gp.in[g].sa, gp.in[g].ch, gp.t[g], gp.k, gp.n[g], gp.rows, q - a,
                        e - a, lr, 1u, waited);
        q = e;
    }
}

template <int K>
__global__ void __launch_bounds__(256, 2) k_group_c2(const gemv_group gp, int total_warps)
{
    group_main<K, false>(gp, total_warps);
}
template <int K>
__global__ void __launch_bounds__(256, 2) k_group_c8_w8(const gemv_group gp, int total_warps)
{
    group_main<K, true>(gp, total_warps);
}
template <int K>
__global__ void __maxnreg__(120) k_group_c8_w16(const gemv_group gp, int total_warps)
{
    group_main<K, true>(gp, total_warps);
}

/* Grid (⌈Σ n_g/512⌉, rows), 128 threads: k_gemv_int_output for the group's
 * 128-column blocks, then the heads' epilogue on the warp's registers (lane
 * l holds columns l + 32e of its block: a head of 128 is the block, pairs
 * (e, e + 2); a head of 64 is e ∈ {0, 1} or {2, 3}, pairs (e, e + 1)). */
__global__ void __launch_bounds__(128) k_group_output(const gemv_group gp)
{
    griddep_launch();
    const int lane = threadIdx.x & 31, cbg = blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y;
    if (cbg >= gp.cb0[gp.n_lin]) return;
    int g = 0;
    while (cbg >= gp.cb0[g + 1]) g++;
    const int cb = cbg - gp.cb0[g], n = gp.n[g], nb = gp.k >> 7;
    float sv[4];
#pragma unroll
    for (int e = 0; e < 4; e++) sv[e] = __half2float(gp.svh[g][cb * 128 + lane + 32 * e]);
    griddep_wait();
    float *tr = gp.t[g] + (size_t)r * n + cb * 128;
    float v[4];
    output_block(tr, gp.in[g].usb + r * nb, nb, lane, v);
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] *= sv[e];
    const int he = gp.hd >> 5; /* a lane's values per head: 2 or 4 */
    if (gp.head_norm[g]) { /* per head: y = w ⊙ (v · 1/sqrt(mean(v²) + eps)), the sum in double */
        double s0 = (double)v[0] * v[0] + (double)v[1] * v[1], s1 = (double)v[2] * v[2] + (double)v[3] * v[3];
#pragma unroll
        for (int h = 16; h > 0; h >>= 1) {
            s0 += __shfl_xor_sync(0xFFFFFFFFu, s0, h);
            s1 += __shfl_xor_sync(0xFFFFFFFFu, s1, h);
        }
        if (he == 4) s0 = s1 = s0 + s1;
        const float i0 = (float)(1.0 / sqrt(s0 / gp.hd + gp.eps)), i1 = (float)(1.0 / sqrt(s1 / gp.hd + gp.eps));
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = lane + 32 * (he == 4 ? e : e & 1);
            v[e] = gp.head_norm[g][i] * (v[e] * (e < 2 ? i0 : i1));
        }
    }
    const int pr = gp.pos ? gp.pos[r] : 0;
    if (gp.rope[g]) { /* rotate-half: (a, b) at (i, i + hd/2) → (a·c − b·s, b·c + a·s), angle pos·inv_freq[i] */
        const int half = he >> 1;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if ((e % he) >= half) continue;
            const int i = lane + 32 * (e % he);
            const float f = (float)pr * gp.inv_freq[i];
            const float c = cosf(f), s = sinf(f);
            const float a = v[e], b = v[e + half];
            v[e] = a * c - b * s;
            v[e + half] = b * c + a * s;
        }
    }
    float *yr = gp.y[g] + (size_t)r * n + cb * 128;
#pragma unroll
    for (int e = 0; e < 4; e++) yr[lane + 32 * e] = v[e];
    if (gp.cache[g]) {
        float *cr = gp.cache[g] + ((size_t)gp.kv_first[r] + (size_t)pr) * n + cb * 128;
#pragma unroll
        for (int e = 0; e < 4; e++) cr[lane + 32 * e] = v[e];
    }
}

static main_fns main_pick(int K, trellis_cuda_gemm_kernel kernel)
{
    return with_k_cb(K, CB_MUL1, [&](auto k, auto) -> main_fns {
        constexpr int KK = decltype(k)::value;
        switch (kernel) {
        case TRELLIS_CUDA_GEMV_INT_C8_W16:
            if constexpr (KK >= 2 && KK <= 4) return {k_gemv_int_c8_w16<KK>, k_group_c8_w16<KK>};
            return {NULL, NULL};
        case TRELLIS_CUDA_GEMV_INT_C8_W8: return {k_gemv_int_c8_w8<KK>, k_group_c8_w8<KK>};
        case TRELLIS_CUDA_GEMV_INT_C2: return {k_gemv_int_c2<KK>, k_group_c2<KK>};
        default: return {NULL, NULL};
        }
    });
}

extern "C" bool trellis_cuda_gemv_group_ok(const trellis_cuda_linear *const *lin, int n_lin, int rows, int head_dim,
                                           const trellis_cuda_ws *ws)
{
    if (!lin || n_lin < 1 || n_lin > TRELLIS_CUDA_GROUP_MAX || rows < 1 || rows > GEMV_INT_MAX_ROWS || !ws ||
        (head_dim != 64 && head_dim != 128))
        return false;
    long long sum_n = 0;
    for (int g = 0; g < n_lin; g++) {
        const trellis_cuda_linear *l = lin[g];
        if (!l || l->cb != CB_MUL1 || l->K != lin[0]->K || l->k != lin[0]->k || l->k % 128 || l->n % 128 ||
            l->k > ws->max_k)
            return false;
        sum_n += l->n;
    }
    return sum_n * rows <= (long long)TRELLIS_GEMM_MAX_ROWS * ws->max_n;
}

extern "C" sparq_status trellis_cuda_gemv_group(const trellis_cuda_linear *const *lin, int n_lin, const float *x,
                                                int rows, float *const *y, const trellis_cuda_group_opts *o,
                                                trellis_cuda_ws *ws, void *stream)
{
    RETURN_IF(!o || !x || !y, SPARQ_E_ARG, "cuda gemv group: missing argument");
    RETURN_IF(!trellis_cuda_gemv_group_ok(lin, n_lin, rows, o->head_dim, ws), SPARQ_E_UNSUPPORTED,
              "cuda gemv group: these %d linears at %d rows (head_dim %d) are not a group the integer GEMV takes",
              n_lin, rows, o->head_dim);
    gemv_group gp = {};
    gp.n_lin = n_lin;
    gp.k = lin[0]->k;
    gp.rows = rows;
    gp.hd = o->head_dim;
    gp.norm = o->norm;
    gp.eps = o->eps;
    gp.inv_freq = o->inv_freq;
    gp.pos = o->pos;
    gp.kv_first = o->kv_first;
    float *t = ws->t;
    for (int g = 0; g < n_lin; g++) {
        const trellis_cuda_linear *l = lin[g];
        RETURN_IF(!y[g], SPARQ_E_ARG, "%s: no output", l->name);
        RETURN_IF((o->head_norm[g] || o->rope[g]) && l->n % o->head_dim, SPARQ_E_ARG,
                  "%s: %d outputs are not heads of %d", l->name, l->n, o->head_dim);
        RETURN_IF((o->rope[g] && (!o->inv_freq || !o->pos)) || (o->cache[g] && (!o->kv_first || !o->pos)), SPARQ_E_ARG,
                  "%s: rope or the cache without positions", l->name);
        gp.trellis[g] = (const uint32_t *)l->trellis;
        gp.suh[g] = l->suh;
        gp.svh[g] = l->svh;
        gp.n[g] = l->n;
        gp.item0[g + 1] = gp.item0[g] + (long long)(l->n / 128) * (l->k / 16); /* c8 and c2 count the same */
        gp.cb0[g + 1] = gp.cb0[g] + l->n / 128;
        gp.in[g] = ws_input_set(ws, g);
        gp.t[g] = t;
        t += (size_t)rows * l->n;
        gp.y[g] = y[g];
        gp.head_norm[g] = o->head_norm[g];
        gp.rope[g] = o->rope[g];
        gp.cache[g] = o->cache[g];
    }
    /* the single GEMV's choice for a linear of all the group's columns */
    trellis_cuda_linear all = *lin[0];
    all.n = gp.cb0[n_lin] * 128;
    const trellis_cuda_gemm_kernel kernel = trellis_cuda_gemm_choice(&all, rows);
    const group_main_fn fn = main_pick(lin[0]->K, kernel).group;
    RETURN_IF(!fn, SPARQ_E_UNSUPPORTED, "%s: no grouped integer gemv for K=%d", lin[0]->name, lin[0]->K);
    const int tpb = kernel == TRELLIS_CUDA_GEMV_INT_C8_W16 ? 512 : 256;
    int blocks = 0, warps = 0;
    CUDA_RETURN_IF(balanced_grid((const void *)fn, tpb, gp.item0[n_lin], &blocks, &warps), "%s: occupancy query",
                   lin[0]->name);
    cudaStream_t s = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    cfg.gridDim = dim3((gp.k / 128 + 3) / 4, rows, n_lin);
    cfg.blockDim = dim3(128);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_group_input, x, gp), "%s: grouped input transform launch", lin[0]->name);
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(tpb);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fn, gp, warps), "%s: grouped integer gemv launch (%s, %d blocks)",
                   lin[0]->name, trellis_cuda_gemm_kernel_name(kernel), blocks);
    cfg.gridDim = dim3((gp.cb0[n_lin] + 3) / 4, rows);
    cfg.blockDim = dim3(128);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_group_output, gp), "%s: grouped output transform launch", lin[0]->name);
    return SPARQ_OK;
}
