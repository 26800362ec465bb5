/* kernels/cuda/moe_decode.cu — the fused MoE decode layer behind
 * trellis_cuda_moe_create / _share / _forward: out[t] += Σ_j w_j ·
 * down_e(silu(gate_e(x_t)) ⊙ up_e(x_t)) for all routed (token, expert) pairs
 * at once, routing read on the device. One path per codebook family
 * (trellis_cuda_moe_forward):
 *
 * moe_int (mul1; lab MoE v66): five launches, chained by programmatic
 * dependent launch from the second on:
 *   k_moe_int_input   grid (hidden/128, 2·pairs): job 2·pair + {0 gate, 1 up}:
 *                     quantised had128(x[token] ⊙ suh) (B words, A·s_β,
 *                     per-block prefix sums of 510·Σq, Σu), as the GEMV's
 *                     input launch; plain (it rewrites scratch the previous
 *                     call read), lets the rest start at once;
 *   k_moe_int_c8<GU>  one balanced grid of exactly the resident warps over the
 *                     work items (job, group of 8 tile columns, k tile) of ALL
 *                     jobs, equal ranges per warp (a range may cross jobs):
 *                     int2_segment (gemv_int.cuh, the one-pass form) per (job,
 *                     group) piece, partial sums into t_gu[job]; 16-warp blocks
 *                     at ≤ 120 registers, one a SM;
 *   k_moe_int_swiglu  grid (inter/128, pairs): output transform of gate and up
 *                     (had128(t + D·Σu) ⊙ svh, t = 0; both jobs' t loads first,
 *                     one Σu loop, the two Hadamards through one set of
 *                     barriers), SwiGLU, and the down input transform of the
 *                     same 128 values;
 *   k_moe_int_c8<!GU> the same balanced grid over the down jobs, into
 *                     t_down[pair]; 16-warp blocks where it has ≥
 *                     MOE_B512_ITEMS work items per resident warp, else two
 *                     8-warp blocks a SM;
 *   k_moe_int_output  grid (hidden/128, pairs): out[token] += w · had128(t_down +
 *                     D·Σu) ⊙ svh_down, t_down = 0, one pair per block (atomics).
 * What bounds it: the two loops are the integer GEMV's (issue-bound), but
 * each warp gets only ~6 gate/up and ~3 down work items, so their first loads
 * are exposed, and the three small launches with four hand-overs add ~6 µs
 * of latency (docs/benchmarks-cuda.md rounds 6–8: 58.3–58.9 µs on
 * DeepSeek-V4.1 shapes = 1.20× one GEMV of the same weights, 19.1–19.3 µs on
 * Qwen3-30B's = 1.53×).
 *
 * moe_fused (3inst, mcg; lab MoE v17): two launches of moe_fused.cuh's block
 * body, the down launch PDL-chained, k tiles per block fitted to one wave of
 * resident blocks (moe_chunk_fit). */
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemv_int.cuh"
#include "kernels/cuda/moe_fused.cuh"

using namespace trellis_dev;

/* The quantised input transform of 128-input block beta of row r, 128 threads
 * (thread i holds input i of the block, u = x ⊙ suh before the Hadamard;
 * valid: uniform per block). Writes the B words (bq), A·s_β (sa), 510·Σq per
 * 64-input half block (ch), the prefix sums of 510·Σq per k tile (pc) and Σu
 * (usb), as the GEMV's warp-per-block input launch does. */
__device__ __forceinline__ void int_input_block(float u, bool valid, int beta, int r, int k,
                                                uint32_t *__restrict__ bq, float *__restrict__ sa,
                                                int *__restrict__ ch, float *__restrict__ usb, int *__restrict__ pc)
{
    __shared__ float sm[128];
    __shared__ float red_m[4], red_s[4];
    __shared__ int red_q[4], red_bad[4], red_kt[8];
    const int i = threadIdx.x, wid = i >> 5;
    const int nb = k >> 7, ktiles = k >> 4;
    if (valid) u = had128_block(u, sm); /* uniform per block: had128_block synchronises */
    else u = 0.0f;
    int bad = !isfinite(u);
    float m = bad ? 0.0f : fabsf(u), su = u;
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, h));
        su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
        bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, h);
    }
    if ((i & 31) == 0) {
        red_m[wid] = m;
        red_s[wid] = su;
        red_bad[wid] = bad;
    }
    __syncthreads();
    m = fmaxf(fmaxf(red_m[0], red_m[1]), fmaxf(red_m[2], red_m[3]));
    bad = red_bad[0] | red_bad[1] | red_bad[2] | red_bad[3];
    float s;
    int q = 0;
    if (bad) {
        s = __int_as_float(0x7FC00000);
    } else if (m == 0.0f) {
        s = 0.0f;
    } else {
        const float inv = (float)INT_QMAX / m;
        s = m / (float)INT_QMAX;
        q = __float2int_rn(u * inv);
        q = max(-INT_QMAX, min(INT_QMAX, q));
    }
    int sq = q;
#pragma unroll
    for (int h = 8; h > 0; h >>= 1) sq += __shfl_xor_sync(0xFFFFFFFFu, sq, h);
    if ((i & 15) == 0) red_kt[i >> 4] = sq; /* Σq of k tile 8β + i/16 */
    sq += __shfl_xor_sync(0xFFFFFFFFu, sq, 16);
    if ((i & 31) == 0) red_q[wid] = sq;
    __syncthreads();
    if (i == 0) {
        sa[r * nb + beta] = INT_A * s;
        usb[r * nb + beta] = (red_s[0] + red_s[1]) + (red_s[2] + red_s[3]);
        ch[r * 2 * nb + 2 * beta] = 510 * (red_q[0] + red_q[1]);
        ch[r * 2 * nb + 2 * beta + 1] = 510 * (red_q[2] + red_q[3]);
        /* pc[row][β][j] = 510·Σq over k tiles 8β .. 8β + j − 1 (j = 0..8) */
        int acc = 0;
        for (int j = 0; j <= 8; j++) {
            pc[(r * nb + beta) * 9 + j] = acc;
            if (j < 8) acc += 510 * red_kt[j];
        }
    }
    int_bq_store(bq, q, i, beta, r, ktiles);
}

/* The expert split (trellis_cuda_moe_forward_own): k_moe_select lists the
 * step's pairs whose expert this GPU holds, sel[0] of them, in pair order at
 * sel[1..]; every later launch works on those "slots" only (its scratch
 * indexed by slot), and its blocks past sel[0] wait and leave. sel NULL:
 * slot = pair, every pair. One warp, pairs in rounds of 32 by ballot. */
__global__ void k_moe_select(const int *__restrict__ ids, int pairs, int own_n, int own_k, int *__restrict__ sel)
{
    const int lane = threadIdx.x;
    int n = 0;
    for (int p0 = 0; p0 < pairs; p0 += 32) {
        const int p = p0 + lane;
        const bool mine = p < pairs && ids[p] % own_n == own_k;
        const unsigned m = __ballot_sync(0xFFFFFFFFu, mine);
        if (mine) sel[1 + n + __popc(m & ((1u << lane) - 1u))] = p;
        n += __popc(m);
    }
    if (lane == 0) sel[0] = n;
}

__device__ __forceinline__ int sel_count(const int *__restrict__ sel, int pairs) { return sel ? sel[0] : pairs; }
__device__ __forceinline__ int sel_pair(const int *__restrict__ sel, int slot) { return sel ? sel[1 + slot] : slot; }

__global__ void __launch_bounds__(128) k_moe_int_input(moe_proj gate, moe_proj up, const int *__restrict__ ids,
                                                       const int *__restrict__ sel,
                                                       const float *__restrict__ x, uint32_t *__restrict__ bq,
                                                       float *__restrict__ sa, int *__restrict__ ch,
                                                       float *__restrict__ usb, int *__restrict__ pc, int hidden,
                                                       int top_k)
{
    griddep_launch();
    const int job = blockIdx.y;
    if (job >> 1 >= sel_count(sel, gridDim.y >> 1)) return; /* a plain launch: nothing to wait for */
    const int pair = sel_pair(sel, job >> 1), token = pair / top_k, e = ids[pair], beta = blockIdx.x;
    const int i = threadIdx.x, nb = hidden >> 7, ktiles = hidden >> 4;
    const __half *suh = (job & 1) ? up.suh[e] : gate.suh[e];
    const float u = x[(size_t)token * hidden + beta * 128 + i] * __half2float(suh[beta * 128 + i]);
    int_input_block(u, true, beta, 0, hidden, bq + (size_t)job * ktiles * 128, sa + (size_t)job * nb,
                    ch + (size_t)job * 2 * nb, usb + (size_t)job * nb, pc + (size_t)job * nb * 9);
}

/* The two main kernels: GU = gate/up (jobs 2·pair + {0, 1}, weights pa / pb),
 * else down (job = pair, weights pa). At most 120 registers a thread (122 were
 * allocated as 128: two 256-thread blocks then filled the register file, and
 * the next launch's blocks waited for them to leave); launched in 512- or
 * 256-thread blocks (moe_int_forward). */
template <int K, bool GU>
__global__ void __maxnreg__(120)
    k_moe_int_c8(moe_proj pa, moe_proj pb, const int *__restrict__ ids, const int *__restrict__ sel,
                 const uint32_t *__restrict__ bq, const float *__restrict__ sa, const int *__restrict__ pc,
                 float *__restrict__ t, int k, int n, int jobs, int total_warps, uint32_t one)
{
    constexpr int NW = GEMV_INT_C8_NW;
    griddep_launch();
    if (sel) jobs = (GU ? 2 : 1) * sel[0]; /* the selected slots' jobs, balanced over every warp */
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int ktiles = k >> 4, ngroups = (n >> 4) / NW, nb = k >> 7;
    const long long per_job = (long long)ngroups * ktiles, total = per_job * jobs;
    long long q = total * warp / total_warps;
    const long long q1 = total * (warp + 1) / total_warps;
    const lane_ring lr = lane_ring_make(K, lane);
    const bool bok = lane < 8; /* one row: B lanes g = 0 (hi), 1 (lo) */
    bool waited = false;
    while (q < q1) {
        const int job = (int)(q / per_job);
        const long long qj = q - (long long)job * per_job;
        const int grp = (int)(qj / ktiles);
        const int kt0 = (int)(qj - (long long)grp * ktiles);
        const int kt1 =
            (int)(min(q1 - (long long)job * per_job, (long long)(grp + 1) * ktiles) - (long long)grp * ktiles);
        q += kt1 - kt0;
        const int e = __ldg(ids + sel_pair(sel, GU ? job >> 1 : job));
        const uint32_t *tr = (GU && (job & 1)) ? pb.tr[e] : pa.tr[e];
        int2_segment<K, true>(tr, bq + (size_t)job * ktiles * 128, sa + (size_t)job * nb, pc + (size_t)job * nb * 9,
                              t + (size_t)job * n, k, n, 1, grp, kt0, kt1, lr, one, bok, waited);
    }
    if (!waited) griddep_wait(); /* a warp without work (few selected pairs) still ends after the previous launch */
}

/* Σ over the nb entries s[0..nb) by a 128-thread block (red: 4 floats). */
__device__ __forceinline__ float block_sum128(const float *__restrict__ s, int nb, float *red)
{
    const int i = threadIdx.x;
    float su = 0.0f;
    for (int b = i; b < nb; b += 128) su += s[b];
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) su += __shfl_xor_sync(0xFFFFFFFFu, su, h);
    __syncthreads(); /* red may still be read from the previous call */
    if ((i & 31) == 0) red[i >> 5] = su;
    __syncthreads();
    return (red[0] + red[1]) + (red[2] + red[3]);
}

/* had128_block on two values a thread at once (one set of barriers for both;
 * each value sees had128_block's operations in its order: bit-identical). */
__device__ __forceinline__ void had128_block2(float &v0, float &v1, float2 *sm)
{
    const int i = threadIdx.x;
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        const float p0 = __shfl_xor_sync(0xFFFFFFFFu, v0, h), p1 = __shfl_xor_sync(0xFFFFFFFFu, v1, h);
        v0 = (i & h) ? p0 - v0 : v0 + p0;
        v1 = (i & h) ? p1 - v1 : v1 + p1;
    }
#pragma unroll
    for (int h = 32; h < 128; h <<= 1) {
        sm[i] = make_float2(v0, v1);
        __syncthreads();
        const float2 p = sm[i ^ h];
        __syncthreads();
        v0 = (i & h) ? p.x - v0 : v0 + p.x;
        v1 = (i & h) ? p.y - v1 : v1 + p.y;
    }
    v0 *= 0.08838834764831845f;
    v1 *= 0.08838834764831845f;
}

/* Every load that does not depend on the previous launch (the expert id, its
 * svh / suh values) is issued before griddep_wait; then both jobs' t loads,
 * then one Σu loop loading both jobs' terms (one L2 round trip after the
 * wait, not three), and the gate and up Hadamards through one set of
 * barriers (had128_block2). */
__global__ void __launch_bounds__(128)
    k_moe_int_swiglu(moe_proj gate, moe_proj up, moe_proj down, const int *__restrict__ ids,
                     const int *__restrict__ sel, float *__restrict__ t_gu, const float *__restrict__ usb_gu,
                     uint32_t *__restrict__ bq, float *__restrict__ sa, int *__restrict__ ch, float *__restrict__ usb,
                     int *__restrict__ pc, int hidden, int inter)
{
    griddep_launch();
    const int pair = blockIdx.y, beta = blockIdx.x, i = threadIdx.x; /* pair: the slot (sel) */
    if (pair >= sel_count(sel, gridDim.y)) {
        griddep_wait();
        return;
    }
    const int e = ids[sel_pair(sel, pair)];
    const int nbh = hidden >> 7, nbi = inter >> 7, kti = inter >> 4;
    const size_t j = (size_t)beta * 128 + i;
    float v[2];
    const float sg = __half2float(gate.svh[e][j]), su_ = __half2float(up.svh[e][j]);
    const float sd = __half2float(down.suh[e][j]);
    griddep_wait();
    float a[2], us[2] = {0.0f, 0.0f};
    a[0] = t_gu[(size_t)(2 * pair) * inter + j];
    a[1] = t_gu[(size_t)(2 * pair + 1) * inter + j];
    for (int b = i; b < nbh; b += 128) {
        us[0] += usb_gu[(size_t)(2 * pair) * nbh + b];
        us[1] += usb_gu[(size_t)(2 * pair + 1) * nbh + b];
    }
#pragma unroll
    for (int w = 0; w < 2; w++) t_gu[(size_t)(2 * pair + w) * inter + j] = 0.0f;
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) {
        us[0] += __shfl_xor_sync(0xFFFFFFFFu, us[0], h);
        us[1] += __shfl_xor_sync(0xFFFFFFFFu, us[1], h);
    }
    __shared__ float red2[2][4];
    if ((i & 31) == 0) {
        red2[0][i >> 5] = us[0];
        red2[1][i >> 5] = us[1];
    }
    __syncthreads();
    __shared__ float2 sm2[128];
    float w0 = a[0] + INT_D * ((red2[0][0] + red2[0][1]) + (red2[0][2] + red2[0][3]));
    float w1 = a[1] + INT_D * ((red2[1][0] + red2[1][1]) + (red2[1][2] + red2[1][3]));
    had128_block2(w0, w1, sm2);
    v[0] = w0 * sg;
    v[1] = w1 * su_;
    const float z = v[0] / (1.0f + __expf(-v[0])) * v[1];
    int_input_block(z * sd, true, beta, 0, inter, bq + (size_t)pair * kti * 128, sa + (size_t)pair * nbi,
                    ch + (size_t)pair * 2 * nbi, usb + (size_t)pair * nbi, pc + (size_t)pair * nbi * 9);
}

/* Grid (hidden/128, pairs), one pair per block, added into out with atomics;
 * the expert's svh and the routing weight are loaded before the wait. */
__global__ void __launch_bounds__(128) k_moe_int_output(moe_proj down, const int *__restrict__ ids,
                                                        const int *__restrict__ sel,
                                                        const float *__restrict__ weights, float *__restrict__ t_d,
                                                        const float *__restrict__ usb_d, float *__restrict__ out,
                                                        int hidden, int inter, int top_k)
{
    __shared__ float sm[128];
    __shared__ float red[4];
    const int slot = blockIdx.y, i = threadIdx.x, nbi = inter >> 7;
    if (slot >= sel_count(sel, gridDim.y)) {
        griddep_wait();
        return;
    }
    const int pair = sel_pair(sel, slot), token = pair / top_k, e = ids[pair];
    const size_t j = (size_t)blockIdx.x * 128 + i;
    const float sv = weights[pair] * __half2float(down.svh[e][j]);
    griddep_wait();
    const float a = t_d[(size_t)slot * hidden + j];
    const float su = block_sum128(usb_d + (size_t)slot * nbi, nbi, red);
    t_d[(size_t)slot * hidden + j] = 0.0f;
    atomicAdd(out + (size_t)token * hidden + j, had128_block(a + INT_D * su, sm) * sv);
}

/* --- handles ---------------------------------------------------------------------- */

/* The transient device buffers of an MoE layer (gu, t_gu, t_down, the
 * counters and the moe_int scratch): per forward only, so the layers of one
 * model, which run one after another on one stream, can share them
 * (trellis_cuda_moe_share); freed with the last handle that uses them. */
typedef struct moe_bufs {
    int refs;
    void *gu, *t_gu, *t_down, *c_gu, *c_down, *iscr;
    int *sel; /* k_moe_select's list: 1 + pairs ints */
} moe_bufs;

/* Resident warps of the moe_int main kernels, by kernel and block size. */
enum { MOE_WARPS_GU16, MOE_WARPS_DOWN8, MOE_WARPS_DOWN16, MOE_WARPS_N };

struct trellis_cuda_moe {
    int n_experts, hidden, inter, K, cb, max_tokens, top_k;
    moe_bufs *bufs;   /* what gu .. pc_d below point into */
    moe_proj proj[3]; /* gate, up, down: device pointer tables */
    void *tables;     /* one device allocation behind the nine tables */
    float *gu;        /* pairs × 2 × inter (moe_fused) */
    float *t_gu;      /* pairs × 2 × inter, zero between calls */
    float *t_down;    /* pairs × hidden, zero between calls */
    unsigned *c_gu, *c_down;
    /* moe_chunk_fit's answers by [launch: 0 gate/up, 1 down][tokens] (0 =
     * not asked yet): the occupancy query runs once */
    int chunk_fit[2][TRELLIS_GEMM_MAX_ROWS + 1];
    /* moe_int (mul1; else NULL): the input transform's outputs per gate/up
     * job (2·pairs, k = hidden) and per down job (pairs, k = inter), one
     * allocation */
    void *iscr;
    uint32_t *bq_gu, *bq_d;
    float *sa_gu, *sa_d, *usb_gu, *usb_d;
    int *ch_gu, *ch_d, *pc_gu, *pc_d;
    int int_warps[MOE_WARPS_N]; /* 0: not asked yet */
};

/* Carve the moe_int scratch for `jobs` jobs of k inputs out of base (or only
 * count its bytes when base is NULL). */
static size_t moe_int_carve(char *base, size_t off, int jobs, int k, uint32_t **bq, float **sa, int **ch,
                            float **usb, int **pc)
{
    const size_t nb = (size_t)k / 128, kt = (size_t)k / 16;
    const size_t sz[5] = {kt * 128 * 4, nb * 4, 2 * nb * 4, nb * 4, 9 * nb * 4};
    void **dst[5] = {(void **)bq, (void **)sa, (void **)ch, (void **)usb, (void **)pc};
    for (int i = 0; i < 5; i++) {
        if (base) *dst[i] = base + off;
        off += ((sz[i] * (size_t)jobs + 255) / 256) * 256;
    }
    return off;
}

/* k tiles per block of moe_fused's kernel fn, fitted to its resident blocks
 * (occupancy query: `cap` blocks at once on the whole GPU), so the last wave
 * is not a sliver (a fixed chunk gave 540 blocks = 2.05 waves for DeepSeek's
 * gate/up): the most splits whose blocks all fit in max_waves waves (ties:
 * more blocks). Rows are 1..16 tokens' worth of one row each, so shared
 * memory stays small: chunk ≤ MOE_MAX_CHUNK. */
#define MOE_MAX_CHUNK 512
static int moe_chunk_fit(const void *fn, int k, int n, int n_jobs, int max_waves)
{
    const int ktiles = k / 16, nbc = (n + FUSED_COLS - 1) / FUSED_COLS;
    const long long per_split = (long long)nbc * n_jobs;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, fused_smem_bytes(MOE_MAX_CHUNK, 1)) !=
            cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        per_sm = 1;
    }
    const long long cap = (long long)per_sm * sm_count();
    int best = ((ktiles + 7) / 8) * 8;
    double best_fill = -1.0;
    long long best_blocks = 0;
    for (int chunk = 8; chunk <= ktiles + 7 && chunk <= MOE_MAX_CHUNK; chunk += 8) {
        const long long blocks = per_split * ((ktiles + chunk - 1) / chunk);
        const long long waves = (blocks + cap - 1) / cap;
        if (waves > max_waves) continue;
        const double fill = (double)blocks / (double)(waves * cap);
        if (fill > best_fill + 1e-9 || (fill > best_fill - 1e-9 && blocks > best_blocks)) {
            best_fill = fill;
            best_blocks = blocks;
            best = chunk;
        }
    }
    if (best > MOE_MAX_CHUNK) best = MOE_MAX_CHUNK;
    return best;
}

static void moe_bufs_release(moe_bufs *b)
{
    if (!b || --b->refs > 0) return;
    cudaFree(b->gu);
    cudaFree(b->t_gu);
    cudaFree(b->t_down);
    cudaFree(b->c_gu);
    cudaFree(b->c_down);
    cudaFree(b->iscr);
    cudaFree(b->sel);
    free(b);
}

/* m's buffer pointers from b (the moe_int scratch carved as create does). */
static void moe_point_at(trellis_cuda_moe *m, moe_bufs *b, size_t gu_end)
{
    m->bufs = b;
    m->gu = (float *)b->gu;
    m->t_gu = (float *)b->t_gu;
    m->t_down = (float *)b->t_down;
    m->c_gu = (unsigned *)b->c_gu;
    m->c_down = (unsigned *)b->c_down;
    m->iscr = b->iscr;
    if (b->iscr) {
        const int pairs = m->max_tokens * m->top_k;
        moe_int_carve((char *)b->iscr, 0, 2 * pairs, m->hidden, &m->bq_gu, &m->sa_gu, &m->ch_gu, &m->usb_gu,
                      &m->pc_gu);
        moe_int_carve((char *)b->iscr, gu_end, pairs, m->inter, &m->bq_d, &m->sa_d, &m->ch_d, &m->usb_d, &m->pc_d);
    }
}

/* --- moe_int: the five launches --------------------------------------------------- */

/* moe_int's down kernel runs 16-warp blocks from this many work items per
 * resident warp (counted as two 8-warp blocks a SM). DeepSeek-V4.1 shapes:
 * 16.4 at one token, where 16-warp down blocks were 0.3–0.8 µs faster than
 * 8-warp ones; Qwen3-30B: 2.9, 0.05–0.1 µs slower (lab runs 56–57). */
#define MOE_B512_ITEMS 8

typedef void (*moe_int_fn)(moe_proj, moe_proj, const int *, const int *, const uint32_t *, const float *,
                           const int *, float *, int, int, int, int, uint32_t);

static sparq_status moe_int_forward(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                    const int *sel, const float *weights, float *out, void *stream)
{
    moe_int_fn fg = NULL, fd = NULL;
    with_k_cb(m->K, CB_MUL1, [&](auto k, auto) -> int {
        constexpr int KK = decltype(k)::value;
        fg = k_moe_int_c8<KK, true>;
        fd = k_moe_int_c8<KK, false>;
        return 0;
    });
    RETURN_IF(!fg || !fd || !m->iscr, SPARQ_E_UNSUPPORTED, "cuda moe: no integer MoE path for K=%d codebook %d, %dx%d",
              m->K, m->cb, m->hidden, m->inter);
    const int pairs = tokens * m->top_k, H = m->hidden, I = m->inter, nw = GEMV_INT_C8_NW;
    const long long items[2] = {2LL * pairs * (I / 16 / nw) * (H / 16), (long long)pairs * (H / 16 / nw) * (I / 16)};
    /* gate/up always in 16-warp blocks; down from MOE_B512_ITEMS work items per resident warp */
    const bool b512[2] = {true, items[1] >= (long long)MOE_B512_ITEMS * sm_count() * 16};
    const int tpb[2] = {b512[0] ? 512 : 256, b512[1] ? 512 : 256}, wpb[2] = {tpb[0] / 32, tpb[1] / 32};
    const int sl[2] = {MOE_WARPS_GU16, b512[1] ? MOE_WARPS_DOWN16 : MOE_WARPS_DOWN8};
    int *wc = m->int_warps;
    for (int l = 0; l < 2; l++)
        if (!wc[sl[l]]) {
            int per_sm = 0;
            CUDA_RETURN_IF(
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)(l ? fd : fg), tpb[l], 0),
                "moe: occupancy query");
            wc[sl[l]] = (per_sm < 1 ? 1 : per_sm) * sm_count() * wpb[l];
        }
    int warps[2], blocks[2];
    for (int l = 0; l < 2; l++) {
        long long w = wc[sl[l]] < items[l] ? wc[sl[l]] : items[l];
        blocks[l] = (int)((w + wpb[l] - 1) / wpb[l]);
        warps[l] = blocks[l] * wpb[l];
    }
    cudaStream_t s = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    cfg.gridDim = dim3(H / 128, 2 * pairs);
    cfg.blockDim = dim3(128);
    cfg.numAttrs = 0; /* plain: it rewrites the scratch the previous call read */
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_moe_int_input, m->proj[0], m->proj[1], ids, sel, x, m->bq_gu, m->sa_gu,
                                      m->ch_gu, m->usb_gu, m->pc_gu, H, m->top_k),
                   "moe input launch (%d pairs)", pairs);
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(blocks[0]);
    cfg.blockDim = dim3(tpb[0]);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fg, m->proj[0], m->proj[1], ids, sel, (const uint32_t *)m->bq_gu,
                                      (const float *)m->sa_gu, (const int *)m->pc_gu, m->t_gu, H, I, 2 * pairs,
                                      warps[0], 1u),
                   "moe gate/up launch (%d blocks, PDL)", blocks[0]);
    cfg.gridDim = dim3(I / 128, pairs);
    cfg.blockDim = dim3(128);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_moe_int_swiglu, m->proj[0], m->proj[1], m->proj[2], ids, sel, m->t_gu,
                                      (const float *)m->usb_gu, m->bq_d, m->sa_d, m->ch_d, m->usb_d, m->pc_d, H, I),
                   "moe SwiGLU launch (PDL)");
    cfg.gridDim = dim3(blocks[1]);
    cfg.blockDim = dim3(tpb[1]);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, fd, m->proj[2], m->proj[2], ids, sel, (const uint32_t *)m->bq_d,
                                      (const float *)m->sa_d, (const int *)m->pc_d, m->t_down, I, H, pairs, warps[1],
                                      1u),
                   "moe down launch (%d blocks, PDL)", blocks[1]);
    cfg.gridDim = dim3(H / 128, pairs);
    cfg.blockDim = dim3(128);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, k_moe_int_output, m->proj[2], ids, sel, weights, m->t_down,
                                      (const float *)m->usb_d, out, H, I, m->top_k),
                   "moe output launch (PDL)");
    return SPARQ_OK;
}

/* --- moe_fused: the two launches --------------------------------------------------- */

typedef void (*moe_gu_fn)(moe_proj, moe_proj, const int *, const int *, const float *, float *, float *, unsigned *,
                          int, int, int, int);
typedef void (*moe_down_fn)(moe_proj, const int *, const int *, const float *, const float *, float *, float *,
                            unsigned *, int, int, int, int);

static sparq_status moe_fused_forward(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                      const int *sel, const float *weights, float *out, void *stream)
{
    moe_gu_fn gu = NULL;
    moe_down_fn dn = NULL;
    with_k_cb(m->K, m->cb, [&](auto k, auto c) -> int {
        constexpr int KK = decltype(k)::value, CC = decltype(c)::value;
        if constexpr (CC != CB_MUL1) { /* mul1 layers run moe_int */
            gu = k_moe_fused_gate_up<KK, CC>;
            dn = k_moe_fused_down<KK, CC>;
        }
        return 0;
    });
    RETURN_IF(!gu || !dn, SPARQ_E_UNSUPPORTED, "cuda moe: no fused kernel for K=%d codebook %d", m->K, m->cb);
    cudaStream_t s = (cudaStream_t)stream;
    const int pairs = tokens * m->top_k;
    int *f = m->chunk_fit[0] + tokens, *fd = m->chunk_fit[1] + tokens;
    if (!*f) {
        *f = moe_chunk_fit((const void *)gu, m->hidden, m->inter, 2 * pairs, 1);
        *fd = moe_chunk_fit((const void *)dn, m->inter, m->hidden, pairs, 1);
    }
    const int c1 = *f, c2 = *fd;
    const int nbc1 = (m->inter + FUSED_COLS - 1) / FUSED_COLS, nbc2 = (m->hidden + FUSED_COLS - 1) / FUSED_COLS;
    const int sp1 = (m->hidden / 16 + c1 - 1) / c1, sp2 = (m->inter / 16 + c2 - 1) / c2;
    gu<<<dim3(nbc1 * sp1, 2 * pairs), 256, fused_smem_bytes(c1, 1), s>>>(
        m->proj[0], m->proj[1], ids, sel, x, m->gu, m->t_gu, m->c_gu, m->hidden, m->inter, m->top_k, c1);
    CUDA_RETURN_IF(cudaGetLastError(), "moe gate/up launch (%d pairs)", pairs);
    /* down may start while gate/up runs: it waits (griddepcontrol.wait)
     * before reading gu */
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = pdl_config(attr, s);
    cfg.gridDim = dim3(nbc2 * sp2, pairs);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = fused_smem_bytes(c2, 1);
    CUDA_RETURN_IF(cudaLaunchKernelEx(&cfg, dn, m->proj[2], ids, sel, weights, (const float *)m->gu, out, m->t_down,
                                      m->c_down, m->hidden, m->inter, m->top_k, c2),
                   "moe down launch (%d pairs, PDL)", pairs);
    return SPARQ_OK;
}

extern "C" {

void trellis_cuda_moe_free(trellis_cuda_moe *m)
{
    if (!m) return;
    cudaFree(m->tables);
    moe_bufs_release(m->bufs);
    free(m);
}

sparq_status trellis_cuda_moe_share(trellis_cuda_moe *m, trellis_cuda_moe *donor)
{
    RETURN_IF(!m || !donor, SPARQ_E_ARG, "cuda moe share: missing layer");
    if (m->bufs == donor->bufs) return SPARQ_OK;
    RETURN_IF(m->hidden != donor->hidden || m->inter != donor->inter || m->max_tokens != donor->max_tokens ||
                  m->top_k != donor->top_k || (m->bufs->iscr != NULL) != (donor->bufs->iscr != NULL),
              SPARQ_E_SHAPE, "cuda moe share: layers of %dx%d, %d tokens, top-%d and %dx%d, %d tokens, top-%d",
              m->hidden, m->inter, m->max_tokens, m->top_k, donor->hidden, donor->inter, donor->max_tokens,
              donor->top_k);
    moe_bufs_release(m->bufs);
    donor->bufs->refs++;
    const size_t gu_end = moe_int_carve(NULL, 0, 2 * m->max_tokens * m->top_k, m->hidden, NULL, NULL, NULL, NULL, NULL);
    moe_point_at(m, donor->bufs, gu_end);
    return SPARQ_OK;
}

sparq_status trellis_cuda_moe_create(trellis_cuda_linear *const *gate, trellis_cuda_linear *const *up,
                                     trellis_cuda_linear *const *down, int n_experts, int max_tokens, int top_k,
                                     trellis_cuda_moe **out)
{
    RETURN_IF(!out || !gate || !up || !down, SPARQ_E_ARG, "cuda moe: missing expert tables or output");
    *out = NULL;
    RETURN_IF(n_experts < 1 || max_tokens < 1 || max_tokens > TRELLIS_GEMM_MAX_ROWS || top_k < 1 ||
                  top_k > n_experts,
              SPARQ_E_ARG, "cuda moe: %d experts, %d tokens, top-%d (tokens 1..%d, top-k ≤ experts)", n_experts,
              max_tokens, top_k, TRELLIS_GEMM_MAX_ROWS);
    const trellis_cuda_linear *g0 = NULL;
    for (int e = 0; e < n_experts && !g0; e++) g0 = gate[e];
    RETURN_IF(!g0, SPARQ_E_ARG, "cuda moe: none of the %d experts has a gate projection", n_experts);
    const int hidden = g0->k, inter = g0->n;
    for (int e = 0; e < n_experts; e++) {
        const trellis_cuda_linear *l[3] = {gate[e], up[e], down[e]};
        if (!l[0] && !l[1] && !l[2]) continue; /* an expert this GPU does not hold (the expert split) */
        for (int j = 0; j < 3; j++) {
            RETURN_IF(!l[j], SPARQ_E_ARG, "cuda moe: expert %d lacks its %s projection", e,
                      j == 0 ? "gate" : j == 1 ? "up" : "down");
            const int wk = j == 2 ? inter : hidden, wn = j == 2 ? hidden : inter;
            RETURN_IF(l[j]->k != wk || l[j]->n != wn || l[j]->K != g0->K || l[j]->cb != g0->cb, SPARQ_E_SHAPE,
                      "cuda moe: %s is %dx%d K=%d codebook %d, expected %dx%d K=%d codebook %d like %s",
                      l[j]->name, l[j]->k, l[j]->n, l[j]->K, l[j]->cb, wk, wn, g0->K, g0->cb, g0->name);
        }
    }
    trellis_cuda_moe *m = (trellis_cuda_moe *)calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "cuda moe: no host memory");
    m->n_experts = n_experts;
    m->hidden = hidden;
    m->inter = inter;
    m->K = g0->K;
    m->cb = g0->cb;
    m->max_tokens = max_tokens;
    m->top_k = top_k;
    const size_t E = (size_t)n_experts, pairs = (size_t)max_tokens * top_k;
    const size_t nbc_gu = (inter + FUSED_COLS - 1) / FUSED_COLS, nbc_d = (hidden + FUSED_COLS - 1) / FUSED_COLS;
    void **host = (void **)calloc(9 * E, sizeof(void *));
    if (!host) {
        free(m);
        return sparq_err(SPARQ_E_NOMEM, "cuda moe: no host memory for %d expert tables", n_experts);
    }
    for (size_t e = 0; e < E; e++) {
        const trellis_cuda_linear *l[3] = {gate[e], up[e], down[e]};
        for (int j = 0; j < 3 && l[0]; j++) { /* an expert not held keeps NULL entries: never routed here */
            host[(3 * j + 0) * E + e] = l[j]->trellis;
            host[(3 * j + 1) * E + e] = l[j]->suh;
            host[(3 * j + 2) * E + e] = l[j]->svh;
        }
    }
    cudaError_t err = cudaMalloc(&m->tables, 9 * E * sizeof(void *));
    if (err == cudaSuccess) err = cudaMemcpy(m->tables, host, 9 * E * sizeof(void *), cudaMemcpyHostToDevice);
    free(host);
    moe_bufs *b = (moe_bufs *)calloc(1, sizeof *b);
    if (!b) {
        trellis_cuda_moe_free(m);
        return sparq_err(SPARQ_E_NOMEM, "cuda moe: no host memory");
    }
    b->refs = 1;
    m->bufs = b;
    if (err == cudaSuccess) err = cudaMalloc(&b->gu, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->t_gu, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->t_down, pairs * hidden * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->c_gu, pairs * 2 * nbc_gu * 4);
    if (err == cudaSuccess) err = cudaMalloc(&b->c_down, pairs * nbc_d * 4);
    if (err == cudaSuccess) err = cudaMalloc((void **)&b->sel, (1 + pairs) * sizeof(int));
    if (err == cudaSuccess) err = cudaMemset(b->t_gu, 0, pairs * 2 * inter * 4);
    if (err == cudaSuccess) err = cudaMemset(b->t_down, 0, pairs * hidden * 4);
    if (err == cudaSuccess) err = cudaMemset(b->c_gu, 0, pairs * 2 * nbc_gu * 4);
    if (err == cudaSuccess) err = cudaMemset(b->c_down, 0, pairs * nbc_d * 4);
    const size_t gu_end = moe_int_carve(NULL, 0, 2 * (int)pairs, hidden, NULL, NULL, NULL, NULL, NULL);
    /* moe_int's scratch (every linear's widths are multiples of 128: trellis_linear_check) */
    if (err == cudaSuccess && m->cb == CB_MUL1) {
        const size_t bytes = moe_int_carve(NULL, gu_end, (int)pairs, inter, NULL, NULL, NULL, NULL, NULL);
        err = cudaMalloc(&b->iscr, bytes);
        if (err == cudaSuccess) err = cudaMemset(b->iscr, 0, bytes);
    }
    if (err != cudaSuccess) {
        trellis_cuda_moe_free(m);
        return cuda_status(err, "moe workspace allocation");
    }
    moe_point_at(m, b, gu_end);
    void **t = (void **)m->tables;
    for (int j = 0; j < 3; j++)
        m->proj[j] = moe_proj{(const uint32_t *const *)(t + (3 * j + 0) * E),
                              (const __half *const *)(t + (3 * j + 1) * E), (const __half *const *)(t + (3 * j + 2) * E)};
    *out = m;
    return SPARQ_OK;
}

/* mul1 layers run moe_int (docs/benchmarks-cuda.md round 8: 58.3–58.8 /
 * 19.1 µs on DeepSeek / Qwen3 shapes at K=3), the other codebooks moe_fused. */
sparq_status trellis_cuda_moe_forward(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                      const float *weights, float *out, void *stream)
{
    return trellis_cuda_moe_forward_own(m, x, tokens, ids, weights, out, 0, 0, stream);
}

sparq_status trellis_cuda_moe_forward_own(trellis_cuda_moe *m, const float *x, int tokens, const int *ids,
                                          const float *weights, float *out, int own_n, int own_k, void *stream)
{
    RETURN_IF(!m, SPARQ_E_ARG, "cuda moe forward: no layer");
    RETURN_IF(!x || !ids || !weights || !out, SPARQ_E_ARG, "cuda moe forward: missing argument");
    RETURN_IF(tokens < 1 || tokens > m->max_tokens, SPARQ_E_ARG, "cuda moe forward: %d tokens, created for 1..%d",
              tokens, m->max_tokens);
    RETURN_IF(own_n > 1 && (own_k < 0 || own_k >= own_n), SPARQ_E_ARG, "cuda moe forward: expert set %d of %d",
              own_k, own_n);
    const int *sel = NULL;
    if (own_n > 1) { /* plain, like the first launch after it: it rewrites the list the previous call read */
        k_moe_select<<<1, 32, 0, (cudaStream_t)stream>>>(ids, tokens * m->top_k, own_n, own_k, m->bufs->sel);
        CUDA_RETURN_IF(cudaGetLastError(), "moe pair selection launch");
        sel = m->bufs->sel;
    }
    if (m->cb == CB_MUL1) return moe_int_forward(m, x, tokens, ids, sel, weights, out, stream);
    return moe_fused_forward(m, x, tokens, ids, sel, weights, out, stream);
}

const char *trellis_cuda_moe_kernel_name(const trellis_cuda_moe *m)
{
    return !m ? "?" : m->cb == CB_MUL1 ? "moe_int" : "moe_fused";
}

} /* extern "C" */
