/* tools/bench/cuda_bench.c — benchmark of the CUDA trellis GEMV (issue 10):
 * batch-1 y = x·W at K = 2, 3, 4 (mul1) on the six (in, out) shapes,
 * against cuBLAS fp16 (cublasGemmEx, fp16 in/out, fp32 compute: what torch's
 * fp16 matmul runs) on the same shape in the same run, and against the memory
 * bound (trellis bytes ÷ the measured device-to-device copy bandwidth).
 *
 * Method (docs/benchmarks-cuda.md): each timing captures G = 20 calls into a
 * CUDA graph and times 25 replays with events, reporting the median ÷ G (no
 * launch gaps, no host overhead). "cold" rotates over enough copies of the
 * weights that they are > 4× the 60 MB L2 (what decode sees: each layer's
 * weights once per token); "hot" repeats one copy. Also: the main kernel
 * alone (no input/output transform), the lab kernel shapes, and 1..16 rows;
 * then the fused MoE decode layer against one GEMV of the same weight count.
 *
 * Usage: cuda_bench [--quick | --lab | --int [KxN,...] | --moe | --moe-profile | --moe-timeline | --profile [V,...]]
 * (prints a table;
 * exit 77 without a GPU). --lab: only the lab round-2 columns (v3, v4,
 * v6..v12 and the default, whole op and main kernel, + a rows sweep of the
 * default), no MoE; --moe: only the MoE section (every MoE lab version);
 * --int: lab round 3, the integer mul1 GEMM (v20..v23) against v10 (whole op and
 * main kernel), cuBLAS and the default, + a rows sweep; no MoE; with a list of
 * in x out shapes, those instead of the six benchmark shapes.
 * --profile [V,V,...]: a few launches of every version (or of the versions listed)
 *   on 4096x14336 K=3 for ncu, no timing;
 * --moe-profile: one plain call of MoE v20, v21, v23, v28 per MoE shape (for ncu's
 * per-kernel times), no timing; --moe-timeline: where each of the five
 * launches of MoE v56 and v66 (the default) starts, passes its wait and ends
 * within a call, and which main-kernel warps end last (%globaltimer marks;
 * needs trellis.cu built with -DSPARQ_MOE_TIMELINE, see moe_timeline). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/trellis.h"
#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_cuda_lab.h"

/* --int's columns: the integer versions timed, and those of the rows sweep */
#define INTV_LIST 22, 24, 31, 32, 33, 34, 35, 42, 44, 45
#define INTV_SWEEP "v22/v24/v32/v33/v35/v44/v45"
#define INTV_SWEEP_LIST 22, 24, 32, 33, 35, 44, 45
enum { NINTV = 1 + 10, NSWEEP = 7 + 2 }; /* v10 + INTV_LIST; v10 + INTV_SWEEP_LIST + default */

#define G 20
#define REPS 25
#define COLD_BYTES (256u << 20)

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "cuda_bench: %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define SK(x)                                                                                  \
    do {                                                                                       \
        if ((x) != SPARQ_OK) {                                                                 \
            fprintf(stderr, "cuda_bench: %s: %s\n", #x, sparq_errmsg());                        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int cmp_f(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* One benchmarked operation: call(i) queues the i-th call on stream s. */
typedef struct op {
    void (*call)(struct op *o, int i);
    cudaStream_t s;
    /* ours */
    trellis_cuda_linear **lins;
    int ncopies, rows, nw, unroll, version, chunk;
    unsigned parts;
    const float *x;
    float *y;
    trellis_cuda_ws *ws;
    /* fused MoE layer */
    trellis_cuda_moe *moe;
    int **ids;
    const float *rw;
    /* cuBLAS */
    cublasHandle_t h;
    void **w16;
    const void *x16;
    void *y16;
    int k, n;
} op;

static void call_ours(op *o, int i)
{
    if (o->version == 1) {
        SK(trellis_cuda_gemm(o->lins[i % o->ncopies], o->x, o->rows, o->y, o->ws, o->s));
        return;
    }
    if (o->version >= 6) {
        SK(trellis_cuda_gemm_labv(o->lins[i % o->ncopies], o->x, o->rows, o->y, o->ws, o->s, o->version, o->parts));
        return;
    }
    if (o->version == 4) {
        SK(trellis_cuda_gemm_bal(o->lins[i % o->ncopies], o->x, o->rows, o->y, o->ws, o->s, o->nw, o->parts));
        return;
    }
    if (o->version == 3) {
        SK(trellis_cuda_gemm_v3(o->lins[i % o->ncopies], o->x, o->rows, o->y, o->ws, o->s, o->chunk));
        return;
    }
    SK(trellis_cuda_gemm_lab(o->lins[i % o->ncopies], o->x, o->rows, o->y, o->ws, o->s, o->nw, o->unroll, 0,
                             o->parts));
}

static void call_cublas(op *o, int i);
static double time_op(op *o, int ncopies_used);

/* The launch floor: o->rows empty kernels, PDL-chained from the second on. */
static void call_empty(op *o, int i)
{
    (void)i;
    SK(trellis_cuda_lab_empty(o->s, o->rows));
}

/* Frees the nc device copies of one benchmarked linear and its host arrays. */
static void copies_free(trellis_cuda_linear **lins, int nc, uint16_t *tw, uint16_t *suh, uint16_t *svh)
{
    for (int c = 0; c < nc; c++) trellis_cuda_linear_free(lins[c]);
    free(lins);
    free(tw);
    free(suh);
    free(svh);
}

static void call_moe(op *o, int i)
{
    if (o->version == 0)
        SK(trellis_cuda_moe_forward(o->moe, o->x, 1, o->ids[i % o->ncopies], o->rw, o->y, o->s));
    else
        SK(trellis_cuda_moe_forward_lab(o->moe, o->x, 1, o->ids[i % o->ncopies], o->rw, o->y, o->s, o->version));
}

/* A random host trellis linear (mul1); the caller frees the three arrays. */
static trellis_linear rand_linear(int k, int n, int K)
{
    const size_t tbytes = (size_t)k * n * K / 8;
    uint16_t *tw = malloc(tbytes), *suh = malloc((size_t)k * 2), *svh = malloc((size_t)n * 2);
    for (size_t i = 0; i < tbytes / 2; i++) tw[i] = (uint16_t)rnd32();
    for (int i = 0; i < k; i++) suh[i] = sparq_f32_to_f16(rnd32() & 1 ? 0.9f : -1.1f);
    for (int i = 0; i < n; i++) svh[i] = sparq_f32_to_f16(rnd32() & 1 ? 0.01f : -0.012f);
    return (trellis_linear){k, n, K, TRELLIS_CB_MUL1, tw, suh, svh};
}

static void free_linear(trellis_linear *l)
{
    free((void *)l->trellis);
    free((void *)l->suh);
    free((void *)l->svh);
}

static int g_moe_profile;  /* --moe-profile */
static int g_moe_timeline; /* --moe-timeline */

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --moe-timeline (a build with -DSPARQ_MOE_TIMELINE): G calls of MoE
 * `version` in one graph, each with its own timeline record, one replay
 * recorded after three. Per launch and mark: the earliest, the median and the
 * latest block (warp in the main kernels), µs from the call's earliest input
 * block start, each the median over calls 2..G-1; and the call period (start
 * to the next call's start, which includes the one-thread kernel that points
 * the marks at the next record). */
static void moe_timeline(op *o, const char *name, int nsets, int version)
{
    enum { U = 4096, W = 5 * U * 3 };
    static const char *const ln[5] = {"input", "gate/up", "SwiGLU", "down", "output"};
    unsigned long long *rec, *host = malloc((size_t)G * W * sizeof *host);
    double *v = malloc(U * sizeof *v), q[5][3][3][G], t0[G];
    if (!host || !v) exit(1);
    CK(cudaMalloc((void **)&rec, (size_t)G * W * sizeof *host));
    o->ncopies = nsets;
    o->version = version;
    for (int i = 0; i < 3; i++) call_moe(o, i);
    CK(cudaStreamSynchronize(o->s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(o->s, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < G; c++) {
        SK(trellis_cuda_lab_timeline(rec + (size_t)c * W, o->s));
        call_moe(o, c);
    }
    SK(trellis_cuda_lab_timeline(NULL, o->s));
    CK(cudaStreamEndCapture(o->s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(exec, o->s));
    CK(cudaMemsetAsync(rec, 0, (size_t)G * W * sizeof *host, o->s));
    CK(cudaGraphLaunch(exec, o->s));
    CK(cudaStreamSynchronize(o->s));
    CK(cudaMemcpy(host, rec, (size_t)G * W * sizeof *host, cudaMemcpyDeviceToHost));
    for (int c = 0; c < G; c++) {
        unsigned long long m = ~0ull;
        for (int u = 0; u < U; u++)
            if (host[(size_t)c * W + u * 3] && host[(size_t)c * W + u * 3] < m) m = host[(size_t)c * W + u * 3];
        t0[c] = (double)m;
        for (int l = 0; l < 5; l++)
            for (int k = 0; k < 3; k++) {
                int nv = 0;
                for (int u = 0; u < U; u++) {
                    const unsigned long long x = host[(size_t)c * W + ((size_t)l * U + u) * 3 + k];
                    if (x) v[nv++] = ((double)x - t0[c]) * 1e-3;
                }
                qsort(v, (size_t)nv, sizeof v[0], cmp_d);
                q[l][k][0][c] = nv ? v[0] : 0.0;
                q[l][k][1][c] = nv ? v[nv / 2] : 0.0;
                q[l][k][2][c] = nv ? v[nv - 1] : 0.0;
            }
    }
    printf("%s, MoE v%d: µs from the call's first input block, first / median / last block (warp in the main "
           "kernels), median of calls 2..%d\n", name, version, G - 1);
    printf("  %-8s %22s %22s %22s\n", "launch", "start", "past wait", "end");
    for (int l = 0; l < 5; l++) {
        printf("  %-8s", ln[l]);
        for (int k = 0; k < 3; k++) {
            double m3[3];
            for (int e = 0; e < 3; e++) {
                double w[G];
                for (int c = 2; c < G; c++) w[c - 2] = q[l][k][e][c];
                qsort(w, G - 2, sizeof w[0], cmp_d);
                m3[e] = w[(G - 2) / 2];
            }
            printf(" %6.2f %6.2f %6.2f  ", m3[0], m3[1], m3[2]);
        }
        printf("\n");
    }
    /* where the main kernels' late warps are: mean end (µs) by warp of the
     * block, by block (first / second half of the grid: the SM's first or
     * second block) and by start quartile, over calls 2..G-1 */
    for (int l = 1; l <= 3; l += 2) {
        double bw_[8] = {0}, bh[2] = {0}, bq_[4] = {0};
        int nw_[8] = {0}, nh[2] = {0}, nq[4] = {0}, nwarps = 0;
        for (int u = 0; u < U; u++)
            if (host[(size_t)2 * W + ((size_t)l * U + u) * 3]) nwarps = u + 1;
        for (int c = 2; c < G; c++) {
            const unsigned long long *r = host + (size_t)c * W + (size_t)l * U * 3;
            double st[U];
            int ns = 0;
            for (int u = 0; u < nwarps; u++) st[ns++] = (double)r[u * 3];
            qsort(st, (size_t)ns, sizeof st[0], cmp_d);
            for (int u = 0; u < nwarps; u++) {
                if (!r[u * 3 + 2]) continue;
                const double e = ((double)r[u * 3 + 2] - t0[c]) * 1e-3;
                bw_[u & 7] += e, nw_[u & 7]++;
                bh[u >= nwarps / 2] += e, nh[u >= nwarps / 2]++;
                int qi = 0;
                while (qi < 3 && (double)r[u * 3] > st[ns * (qi + 1) / 4]) qi++;
                bq_[qi] += e, nq[qi]++;
            }
        }
        printf("  %s warps (%d): mean end by warp of block", ln[l], nwarps);
        for (int i = 0; i < 8; i++) printf(" %.2f", nw_[i] ? bw_[i] / nw_[i] : 0.0);
        printf("; by grid half %.2f %.2f; by start quartile", nh[0] ? bh[0] / nh[0] : 0.0, nh[1] ? bh[1] / nh[1] : 0.0);
        for (int i = 0; i < 4; i++) printf(" %.2f", nq[i] ? bq_[i] / nq[i] : 0.0);
        printf("\n");
    }
    double w[G];
    for (int c = 2; c + 1 < G; c++) w[c - 2] = (t0[c + 1] - t0[c]) * 1e-3;
    qsort(w, G - 3, sizeof w[0], cmp_d);
    printf("  call period %.2f µs (median; includes the record-switch kernel)\n", w[(G - 3) / 2]);
    fflush(stdout);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaFree(rec));
    free(host);
    free(v);
}

/* Fused MoE layer at batch 1 vs one GEMV over the same number of weights. */
static void bench_moe(cudaStream_t s, double bw, const char *name, int hidden, int inter, int top_k, int E)
{
    const int K = 3, nsets = 8;
    trellis_linear hg = rand_linear(hidden, inter, K), hd = rand_linear(inter, hidden, K);
    trellis_cuda_linear **l = calloc((size_t)3 * E, sizeof *l);
    for (int i = 0; i < 3 * E; i++) SK(trellis_cuda_linear_upload(i < 2 * E ? &hg : &hd, "expert", &l[i]));
    trellis_cuda_moe *moe = NULL;
    SK(trellis_cuda_moe_create(l, l + E, l + 2 * E, E, 1, top_k, &moe));
    int **ids = calloc(nsets, sizeof *ids);
    for (int c = 0; c < nsets; c++) {
        int h[64];
        for (int j = 0; j < top_k; j++) {
            int e, dup;
            do {
                e = (int)(rnd32() % (uint32_t)E);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= h[q] == e;
            } while (dup);
            h[j] = e;
        }
        CK(cudaMalloc((void **)&ids[c], (size_t)top_k * sizeof(int)));
        CK(cudaMemcpy(ids[c], h, (size_t)top_k * sizeof(int), cudaMemcpyHostToDevice));
    }
    float hw[64], *rw, *x, *out;
    for (int j = 0; j < top_k; j++) hw[j] = 1.0f / top_k;
    CK(cudaMalloc((void **)&rw, (size_t)top_k * 4));
    CK(cudaMemcpy(rw, hw, (size_t)top_k * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&x, (size_t)hidden * 4));
    CK(cudaMalloc((void **)&out, (size_t)hidden * 4));
    CK(cudaMemset(x, 0, (size_t)hidden * 4));
    CK(cudaMemset(out, 0, (size_t)hidden * 4));
    /* the default (version 0), then every MoE lab version, cold */
    static const int mver[] = {0,  5,  13, 14, 15, 16, 17, 18, 19, 20,  21,  22,
                               23, 24, 27, 28, 29, 30, 34, 40, 41, 50, 54, 55, 56, 65, 66, 231, 232, 233};
    enum { NMV = sizeof mver / sizeof mver[0] };
    double t_ver[NMV];
    op o = {.call = call_moe, .s = s, .moe = moe, .ids = ids, .rw = rw, .x = x, .y = out};
    if (g_moe_profile) { /* --moe-profile: one plain call of v20, v21, v23, v28 each (for ncu), no timing */
        static const int pv[] = {20, 21, 23, 28};
        o.ncopies = 1;
        for (int v = 0; v < 4; v++) {
            o.version = pv[v];
            call_moe(&o, 0);
        }
        CK(cudaStreamSynchronize(s));
        printf("%s: one call each of MoE v20, v21, v23, v28\n", name);
        goto done;
    }
    if (g_moe_timeline) {
        moe_timeline(&o, name, nsets, 56);
        moe_timeline(&o, name, nsets, 66);
        goto done;
    }
    for (int v = 0; v < NMV; v++) {
        o.version = mver[v];
        t_ver[v] = time_op(&o, nsets);
    }
    o.version = 0;
    const double t_moe = t_ver[0], t_moe_hot = time_op(&o, 1);
    /* one GEMV with the same number of weights: hidden × (top_k · 3 · inter), cold */
    const int gn = top_k * 3 * inter;
    const size_t gbytes = (size_t)hidden * gn * K / 8;
    int nc = (int)((COLD_BYTES + gbytes - 1) / gbytes);
    if (nc < 2) nc = 2;
    trellis_linear hb = rand_linear(hidden, gn, K);
    trellis_cuda_linear **gl = calloc((size_t)nc, sizeof *gl);
    for (int c = 0; c < nc; c++) SK(trellis_cuda_linear_upload(&hb, "gemv", &gl[c]));
    trellis_cuda_ws *ws = NULL;
    SK(trellis_cuda_ws_create(hidden, gn, &ws));
    float *gy;
    CK(cudaMalloc((void **)&gy, (size_t)gn * 4));
    /* the reference: the default GEMV (v10, version 1 here), and v3 (round 1's reference) */
    op g = {.call = call_ours, .s = s, .lins = gl, .rows = 1, .parts = TRELLIS_CUDA_PART_ALL, .x = x, .y = gy,
            .ws = ws, .version = 1};
    const double t_gemv = time_op(&g, nc);
    g.version = 3;
    const double t_gemv3 = time_op(&g, nc);
    const double bound = (double)gbytes / bw * 1e6;
    printf("%-22s %6d %6d %3d/%-3d %9.2f %9.2f %9.2f %9.2f %7.2fx %9.2f\n", name, hidden, inter, top_k, E, t_moe,
           t_moe_hot, t_gemv, t_gemv3, t_moe / t_gemv, bound);
    printf("  MoE lab versions (cold µs, ratio to gemv-v10):");
    for (int v = 1; v < NMV; v++) printf(" v%d %.2f (%.2fx)", mver[v], t_ver[v], t_ver[v] / t_gemv);
    printf("\n");
    fflush(stdout);
    for (int c = 0; c < nc; c++) trellis_cuda_linear_free(gl[c]);
    free(gl);
    trellis_cuda_ws_free(ws);
    CK(cudaFree(gy));
    free_linear(&hb);
done:
    trellis_cuda_moe_free(moe);
    for (int i = 0; i < 3 * E; i++) trellis_cuda_linear_free(l[i]);
    free(l);
    for (int c = 0; c < nsets; c++) CK(cudaFree(ids[c]));
    free(ids);
    CK(cudaFree(rw));
    CK(cudaFree(x));
    CK(cudaFree(out));
    free_linear(&hg);
    free_linear(&hd);
}

/* lab v1: decode Q to fp16 every call, then the cuBLAS GEMV on it */
static void call_v1(op *o, int i)
{
    SK(trellis_cuda_decode_inner(o->lins[i % o->ncopies], (uint16_t *)o->w16[0], o->s));
    const int saved = o->ncopies;
    o->ncopies = 1;
    call_cublas(o, 0);
    o->ncopies = saved;
}

static void call_cublas(op *o, int i)
{
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(o->h, CUBLAS_OP_N, CUBLAS_OP_N, o->n, o->rows, o->k, &one, o->w16[i % o->ncopies], CUDA_R_16F,
                     o->n, o->x16, CUDA_R_16F, o->k, &zero, o->y16, CUDA_R_16F, o->n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuda_bench: cublasGemmEx failed\n");
        exit(1);
    }
}

/* Median µs per call over REPS replays of a graph of G calls. */
static double time_op(op *o, int ncopies_used)
{
    const int saved = o->ncopies;
    o->ncopies = ncopies_used;
    for (int i = 0; i < 3; i++) o->call(o, i); /* warm-up outside the graph (cuBLAS workspace, modules) */
    CK(cudaStreamSynchronize(o->s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(o->s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < G; i++) o->call(o, i);
    CK(cudaStreamEndCapture(o->s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[REPS];
    CK(cudaGraphLaunch(exec, o->s));
    CK(cudaGraphLaunch(exec, o->s));
    for (int r = 0; r < REPS; r++) {
        CK(cudaEventRecord(e0, o->s));
        CK(cudaGraphLaunch(exec, o->s));
        CK(cudaEventRecord(e1, o->s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    CK(cudaGetLastError());
    qsort(t, REPS, sizeof t[0], cmp_f);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    o->ncopies = saved;
    return 1000.0 * t[REPS / 2] / G;
}

/* Device-to-device copy bandwidth (bytes read + written per second). */
static double copy_bandwidth(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[11];
    for (int i = 0; i < 3; i++) CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    for (int r = 0; r < 11; r++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t, 11, sizeof t[0], cmp_f);
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * bytes / (t[5] * 1e-3);
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const int profile = argc > 1 && strcmp(argv[1], "--profile") == 0;
    /* --lab: only the columns of the current lab round (v3, v4, v6..v9, cuBLAS) */
    const int lab = argc > 1 && strcmp(argv[1], "--lab") == 0;
    /* --moe: only the fused MoE layer section */
    g_moe_profile = argc > 1 && strcmp(argv[1], "--moe-profile") == 0;
    g_moe_timeline = argc > 1 && strcmp(argv[1], "--moe-timeline") == 0;
    const int moe_only = g_moe_profile || g_moe_timeline || (argc > 1 && strcmp(argv[1], "--moe") == 0);
    /* --int: lab round 3 (integer mul1 GEMM, v20..v23) */
    const int intm = argc > 1 && strcmp(argv[1], "--int") == 0;
    if (trellis_cuda_device_count() == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth();
    printf("device: %s, %d SMs, L2 %d MB; copy bandwidth %.0f GB/s (read+write)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e9);

    int shapes[16][2] = {{4096, 14336}, {8192, 8192}, {5120, 2304}, {2304, 5120}, {2048, 768}, {768, 2048}};
    int nshapes = moe_only ? 0 : quick ? 2 : 6;
    if (intm && argc > 2) { /* --int KxN,KxN,...: these shapes instead (multiples of 128) */
        nshapes = 0;
        for (const char *p = argv[2]; *p;) {
            char *e, *f;
            const long kk = strtol(p, &e, 10), nn = *e == 'x' ? strtol(e + 1, &f, 10) : 0;
            if (nshapes == 16 || *e != 'x' || f == e + 1 || (*f && *f != ',') || kk < 128 || nn < 128 || kk % 128 ||
                nn % 128 || kk > 65536 || nn > 65536) {
                fprintf(stderr, "cuda_bench: --int: bad shape list '%s' (want e.g. 4096x9216,5120x8192: in x out, "
                                "multiples of 128, at most 16)\n",
                        argv[2]);
                return 2;
            }
            shapes[nshapes][0] = (int)kk;
            shapes[nshapes][1] = (int)nn;
            nshapes++;
            p = *f == ',' ? f + 1 : f;
        }
    }
    if (profile) {
        /* a few launches of each version on 4096x14336 K=3, for ncu */
        const int k = 4096, n = 14336;
        const size_t tbytes = (size_t)k * n * 3 / 8;
        uint16_t *tw = malloc(tbytes), *suh = malloc((size_t)k * 2), *svh = malloc((size_t)n * 2);
        for (size_t i = 0; i < tbytes / 2; i++) tw[i] = (uint16_t)rnd32();
        for (int i = 0; i < k; i++) suh[i] = sparq_f32_to_f16(0.9f);
        for (int i = 0; i < n; i++) svh[i] = sparq_f32_to_f16(0.01f);
        const trellis_linear hl = {k, n, 3, TRELLIS_CB_MUL1, tw, suh, svh};
        trellis_cuda_linear *lin = NULL;
        trellis_cuda_ws *ws = NULL;
        float *x, *y;
        SK(trellis_cuda_linear_upload(&hl, "profile", &lin));
        SK(trellis_cuda_ws_create(k, n, &ws));
        CK(cudaMalloc((void **)&x, (size_t)k * 4));
        CK(cudaMalloc((void **)&y, (size_t)n * 4));
        CK(cudaMemset(x, 0, (size_t)k * 4));
        for (int i = 0; i < 2; i++) {
            SK(trellis_cuda_gemm_lab(lin, x, 1, y, ws, NULL, 0, 0, 0, TRELLIS_CUDA_PART_ALL));
            SK(trellis_cuda_gemm_v3(lin, x, 1, y, ws, NULL, 0));
            SK(trellis_cuda_gemm_bal(lin, x, 1, y, ws, NULL, 2, TRELLIS_CUDA_PART_ALL));
            SK(trellis_cuda_gemm_bal(lin, x, 1, y, ws, NULL, 6, TRELLIS_CUDA_PART_ALL));
            for (int v = 6; v <= 12; v++) SK(trellis_cuda_gemm_labv(lin, x, 1, y, ws, NULL, v, TRELLIS_CUDA_PART_ALL));
            if (argc > 2) { /* --profile V,V,...: only these versions (for ncu -k regex:k_gemm_int) */
                for (const char *p = argv[2]; *p;) {
                    char *e;
                    const long v = strtol(p, &e, 10);
                    if (e == p || (*e && *e != ',')) {
                        fprintf(stderr, "cuda_bench: --profile: bad version list '%s' (want e.g. 32,44)\n", argv[2]);
                        return 2;
                    }
                    SK(trellis_cuda_gemm_labv(lin, x, 1, y, ws, NULL, (int)v, TRELLIS_CUDA_PART_ALL));
                    p = *e == ',' ? e + 1 : e;
                }
                continue;
            }
            for (int v = 20; v <= 35; v++)
                if (v != 29) SK(trellis_cuda_gemm_labv(lin, x, 1, y, ws, NULL, v, TRELLIS_CUDA_PART_ALL));
        }
        SK(trellis_cuda_sync(NULL));
        printf("profile mode done\n");
        return 0;
    }
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    cublasSetStream(h, s);
    {
        static const int nl[] = {1, 2, 3, 5};
        op e = {.call = call_empty, .s = s};
        printf("launch floor (empty one-block kernels, PDL-chained from the second; median µs per call as below):");
        for (int i = 0; i < 4; i++) {
            e.rows = nl[i];
            printf(" %d launch%s %.2f", nl[i], nl[i] > 1 ? "es" : "", time_op(&e, 1));
        }
        printf("\n");
    }

    if (!moe_only) { /* the GEMV table's header */
        printf("\nbatch-1 GEMV, mul1, median µs per call (graph of %d calls, %d replays); cold = weights rotate "
               "over > 256 MB\n",
               G, REPS);
        if (intm) {
            static const int vs[] = {10, INTV_LIST};
            printf("%-12s %2s |", "in x out", "K");
            for (int vi = 0; vi < NINTV; vi++) printf("    v%-3d", vs[vi]);
            printf(" |");
            for (int vi = 0; vi < NINTV; vi++) printf("  v%d-m", vs[vi]);
            printf(" | %7s %7s | %7s %8s %8s %8s\n", "cublas", "default", "best", "spd-best", "spd-dflt", "membound");
        } else if (lab) {
            printf("%-12s %2s %7s %7s %7s | %7s %7s %7s %7s %7s %7s %7s | %7s %7s %7s %7s %7s | %7s %7s %8s %8s\n",
                   "in x out", "K", "v3", "v4", "v4-main", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v6-main",
                   "v7-main", "v8-main", "v10-main", "v12-main", "cublas", "best", "speedup", "membound");
            printf("  (last two columns: default = trellis_cuda_gemm, and cublas / default)\n");
        } else {
            printf("%-12s %2s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %8s %6s | %6s %6s %6s | %6s %6s %6s "
                   "%6s %6s | %7s\n",
                   "in x out", "K", "v3", "v3-hot", "v2", "v2-main", "v4", "v4-main", "v4m-b3", "v4m-b5", "v4m-b6",
                   "cublas", "cbl-hot", "speedup", "membound", "%bound", "v3c16", "v3c32", "v3c64", "v2-hot", "m:1x4",
                   "m:2x8", "m:4x4", "m:1x8", "v1");
        }
    }
    for (int si = 0; si < nshapes; si++) {
        const int k = shapes[si][0], n = shapes[si][1];
        /* cuBLAS fp16 once per shape */
        const size_t wbytes = (size_t)k * n * 2;
        int nc16 = (int)((COLD_BYTES + wbytes - 1) / wbytes);
        if (nc16 < 2) nc16 = 2;
        uint16_t *hw = malloc(wbytes);
        for (size_t i = 0; i < (size_t)k * n; i++)
            hw[i] = sparq_f32_to_f16(((float)(rnd32() >> 8) / 16777216.0f - 0.5f) * 0.05f);
        void **w16 = calloc((size_t)nc16, sizeof *w16);
        for (int c = 0; c < nc16; c++) {
            CK(cudaMalloc(&w16[c], wbytes));
            CK(cudaMemcpy(w16[c], hw, wbytes, cudaMemcpyHostToDevice));
        }
        free(hw);
        void *x16, *y16;
        float *x, *y;
        CK(cudaMalloc(&x16, (size_t)16 * k * 2));
        CK(cudaMalloc(&y16, (size_t)16 * n * 2));
        CK(cudaMalloc((void **)&x, (size_t)16 * k * 4));
        CK(cudaMalloc((void **)&y, (size_t)16 * n * 4));
        {
            uint16_t *hx = malloc((size_t)16 * k * 2);
            float *fx = malloc((size_t)16 * k * 4);
            for (int i = 0; i < 16 * k; i++) {
                fx[i] = (float)(rnd32() >> 8) / 16777216.0f - 0.5f;
                hx[i] = sparq_f32_to_f16(fx[i]);
            }
            CK(cudaMemcpy(x16, hx, (size_t)16 * k * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(x, fx, (size_t)16 * k * 4, cudaMemcpyHostToDevice));
            free(hx);
            free(fx);
        }
        op cb = {.call = call_cublas, .s = s, .rows = 1, .h = h, .w16 = w16, .x16 = x16, .y16 = y16, .k = k, .n = n};
        const double t_cublas = time_op(&cb, nc16), t_cublas_hot = time_op(&cb, 1);

        trellis_cuda_ws *ws = NULL;
        SK(trellis_cuda_ws_create(k, n, &ws));
        for (int K = 2; K <= 4; K++) {
            const size_t tbytes = (size_t)k * n * K / 8;
            int nc = (int)((COLD_BYTES + tbytes - 1) / tbytes);
            if (nc < 2) nc = 2;
            if (nc > 512) nc = 512;
            uint16_t *tw = malloc(tbytes), *suh = malloc((size_t)k * 2), *svh = malloc((size_t)n * 2);
            for (size_t i = 0; i < tbytes / 2; i++) tw[i] = (uint16_t)rnd32();
            for (int i = 0; i < k; i++) suh[i] = sparq_f32_to_f16(rnd32() & 1 ? 0.9f : -1.1f);
            for (int i = 0; i < n; i++) svh[i] = sparq_f32_to_f16(rnd32() & 1 ? 0.01f : -0.012f);
            const trellis_linear hl = {k, n, K, TRELLIS_CB_MUL1, tw, suh, svh};
            trellis_cuda_linear **lins = calloc((size_t)nc, sizeof *lins);
            for (int c = 0; c < nc; c++) SK(trellis_cuda_linear_upload(&hl, "bench", &lins[c]));
            op o = {.call = call_ours, .s = s, .lins = lins, .rows = 1, .parts = TRELLIS_CUDA_PART_ALL,
                    .x = x, .y = y, .ws = ws, .version = 3};
            if (intm) {
                static const int vs[] = {10, INTV_LIST};
                double tw_[NINTV], tm_[NINTV], best = INFINITY;
                int bestv = 0;
                for (int vi = 0; vi < NINTV; vi++) {
                    o.version = vs[vi];
                    o.parts = TRELLIS_CUDA_PART_ALL;
                    tw_[vi] = time_op(&o, nc);
                    if (tw_[vi] < best) best = tw_[vi], bestv = vs[vi];
                    o.parts = TRELLIS_CUDA_PART_MAIN;
                    tm_[vi] = time_op(&o, nc);
                }
                o.version = 1;
                o.parts = TRELLIS_CUDA_PART_ALL;
                const double t_def = time_op(&o, nc);
                printf("%5dx%-6d %2d |", k, n, K);
                for (int vi = 0; vi < NINTV; vi++) printf(" %7.2f", tw_[vi]);
                printf(" |");
                for (int vi = 0; vi < NINTV; vi++) printf(" %7.2f", tm_[vi]);
                printf(" | %7.2f %7.2f | %5.2f v%-2d %7.2fx %7.2fx %8.2f\n", t_cublas, t_def, best, bestv,
                       t_cublas / best, t_cublas / t_def, tbytes / bw * 1e6);
                fflush(stdout);
                if (si == 0 && K == 3) {
                    printf("  rows sweep (%dx%d K=3, cold, whole op), rows:v10/" INTV_SWEEP "/default µs:", k, n);
                    static const int rl[] = {1, 2, 4, 5, 8, 16};
                    for (int r = 0; r < 6; r++) {
                        o.rows = rl[r];
                        static const int sv[] = {10, INTV_SWEEP_LIST, 1};
                        printf(" %d:", rl[r]);
                        for (int q = 0; q < NSWEEP; q++) {
                            o.version = sv[q];
                            printf("%s%.2f", q ? "/" : "", time_op(&o, nc));
                        }
                    }
                    o.rows = 1;
                    printf("\n");
                    fflush(stdout);
                }
                copies_free(lins, nc, tw, suh, svh);
                continue;
            }
            if (lab) {
                double t_whole[13], t_mainv[13];
                static const int vs[] = {1, 3, 4, 6, 7, 8, 9, 10, 11, 12};
                double best = INFINITY;
                int bestv = 0;
                for (size_t vi = 0; vi < sizeof vs / sizeof vs[0]; vi++) {
                    o.version = vs[vi];
                    o.nw = vs[vi] == 4 ? 2 : 0;
                    o.parts = TRELLIS_CUDA_PART_ALL;
                    t_whole[vs[vi]] = time_op(&o, nc);
                    if (vs[vi] > 1 && t_whole[vs[vi]] < best) best = t_whole[vs[vi]], bestv = vs[vi];
                    t_mainv[vs[vi]] = NAN;
                    if (vs[vi] == 1 || vs[vi] == 3 || vs[vi] == 9 || vs[vi] == 11) continue;
                    o.parts = TRELLIS_CUDA_PART_MAIN;
                    t_mainv[vs[vi]] = time_op(&o, nc);
                }
                printf("%5dx%-6d %2d %7.2f %7.2f %7.2f | %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f | %7.2f %7.2f %7.2f "
                       "%7.2f %7.2f | %7.2f %5.2f v%-2d %7.2fx %8.2f | %7.2f %6.2fx\n",
                       k, n, K, t_whole[3], t_whole[4], t_mainv[4], t_whole[6], t_whole[7], t_whole[8], t_whole[9],
                       t_whole[10], t_whole[11], t_whole[12], t_mainv[6], t_mainv[7], t_mainv[8], t_mainv[10],
                       t_mainv[12], t_cublas, best,
                       bestv, t_cublas / best, tbytes / bw * 1e6, t_whole[1], t_cublas / t_whole[1]);
                fflush(stdout);
                if (si == 0 && K == 3) {
                    printf("  rows sweep (4096x14336 K=3, cold, whole op), rows:v4/default µs:");
                    static const int rl[] = {1, 2, 4, 8, 16};
                    o.parts = TRELLIS_CUDA_PART_ALL;
                    for (int r = 0; r < 5; r++) {
                        o.rows = rl[r];
                        o.version = 4;
                        o.nw = 2;
                        const double a = time_op(&o, nc);
                        o.version = 1;
                        printf(" %d:%.2f/%.2f", rl[r], a, time_op(&o, nc));
                    }
                    o.rows = 1;
                    printf("\n");
                    fflush(stdout);
                }
                copies_free(lins, nc, tw, suh, svh);
                continue;
            }
            const double t_v3 = time_op(&o, nc), t_v3_hot = time_op(&o, 1);
            double tc[3];
            for (int ci = 0; ci < 3; ci++) {
                o.chunk = 16 << ci;
                tc[ci] = time_op(&o, nc);
            }
            o.chunk = 0;
            o.version = 4;
            o.nw = 2;
            const double t_v4 = time_op(&o, nc);
            o.parts = TRELLIS_CUDA_PART_MAIN;
            const double t_v4m2 = time_op(&o, nc);
            o.nw = 3;
            const double t_v4m3 = time_op(&o, nc);
            o.nw = 5;
            const double t_v4m5 = time_op(&o, nc);
            o.nw = 6;
            const double t_v4m6 = time_op(&o, nc);
            o.nw = 0;
            o.parts = TRELLIS_CUDA_PART_ALL;
            o.version = 2;
            const double t_ours = time_op(&o, nc), t_hot = time_op(&o, 1);
            o.parts = TRELLIS_CUDA_PART_MAIN;
            const double t_main = time_op(&o, nc);
            static const int var[][2] = {{1, 4}, {2, 8}, {4, 4}, {1, 8}};
            double tv[4];
            for (int v = 0; v < 4; v++) {
                o.nw = var[v][0];
                o.unroll = var[v][1];
                tv[v] = time_op(&o, nc);
            }
            const double bound = tbytes / bw * 1e6; /* bw is DRAM traffic (read + write) per second */
            double t_v1 = NAN;
            if (K == 3) {
                op v1 = cb;
                v1.call = call_v1;
                v1.lins = lins;
                t_v1 = time_op(&v1, nc);
            }
            printf("%5dx%-6d %2d %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %6.2fx %8.2f %5.0f%% | %6.2f %6.2f %6.2f | %6.2f "
                   "%6.2f %6.2f %6.2f %6.2f | %7.2f\n",
                   k, n, K, t_v3, t_v3_hot, t_ours, t_main, t_v4, t_v4m2, t_v4m3, t_v4m5, t_v4m6, t_cublas, t_cublas_hot, t_cublas / t_v3, bound,
                   100.0 * bound / t_v3, tc[0], tc[1], tc[2], t_hot, tv[0], tv[1], tv[2], tv[3], t_v1);
            fflush(stdout);
            if (si == 0 && K == 3) {
                printf("  rows sweep (4096x14336 K=3, cold, whole op), rows:v2/v3/v4 µs:");
                o.parts = TRELLIS_CUDA_PART_ALL;
                o.nw = o.unroll = 0;
                static const int rl[] = {1, 2, 4, 8, 16};
                for (int r = 0; r < 5; r++) {
                    o.rows = rl[r];
                    o.version = 2;
                    const double a = time_op(&o, nc);
                    o.version = 3;
                    const double b = time_op(&o, nc);
                    o.version = 4;
                    printf(" %d:%.2f/%.2f/%.2f", rl[r], a, b, time_op(&o, nc));
                }
                o.version = 2;
                o.rows = 1;
                printf("\n");
                fflush(stdout);
            }
            copies_free(lins, nc, tw, suh, svh);
        }
        trellis_cuda_ws_free(ws);
        for (int c = 0; c < nc16; c++) CK(cudaFree(w16[c]));
        free(w16);
        CK(cudaFree(x16));
        CK(cudaFree(y16));
        CK(cudaFree(x));
        CK(cudaFree(y));
    }
    if (intm) {
        printf("\nv10 = round 2's fp16 path; v20 = integer mul1 GEMM (16-bit signed activations (|q| ≤ 32639), "
               "int32 sums of h bytes on the tensor core), v21 = v20 with packed B words, v22 = v20 + FMA-pipe "
               "masks, v23 = v21 + v22, v24 = one k tile x 8 tile columns per step + FMA masks, v25 = v24 without "
               "FMA masks, v26 = v24 compiled for 3 blocks/SM, v27 = v24 and v28 = v22 with the output transform "
               "in the main kernel (by the warp that completes each 128-column block), v30 = v24 and v31 = v22 "
               "with the input and output launches one warp per 128-block, v32 = v30 and v33 = v31 with the input "
               "launch PDL-chained to the previous kernel (suh loaded before its wait), v34 = v32 with the main "
               "kernel compiled for 1 block of 8 warps per SM (125 registers: two still run), v35 = v32 with round 4's loop (conversion inside one pass over "
               "a warp's k range, as v24; v30..v34 make one pass per 128-block), v42 = v32 with the main kernel in "
               "16-warp blocks at <= 120 registers (one a SM; 1..4 rows), v44 / v45 = v32 / v42 with the main loop "
               "unrolled by two (the next step's words loaded into the other of two word arrays, not copied; the default on large linears: v45 at one row, v44 at 2..4 rows); -m: main kernel alone (v27/v28: + the output transform); default = trellis_cuda_gemm; spd = cublas / (best | "
               "default), cold; membound = trellis bytes / copy bandwidth\n");
        cublasDestroy(h);
        return 0;
    }
    if (lab) {
        printf("\nv3 = one fused launch, v4 = three launches with a balanced grid (-main: its middle launch alone), "
               "v6 = v4 + two ring words per lane + loads one step ahead, v7 = v6 + mul1 byte sums on the tensor "
               "core, v8 = v7 + state masks on the FMA pipe, v9 = v3 with v7's decode, v10 = v8 with programmatic "
               "dependent launch, v11 = v3 with v8's decode, v12 = v10 with 4 tile columns x 2 k tiles per step; "
               "speedup = cublas / best "
               "(both cold); membound = trellis bytes / copy bandwidth\n");
        cublasDestroy(h);
        return 0;
    }
    printf("\nfused MoE decode layer, K=3 mul1, batch 1 (one token), µs per layer; cold = routing rotates over 8 "
           "expert sets of a layer with E experts\n");
    printf("%-22s %6s %6s %7s %9s %9s %9s %9s %8s %9s\n", "shapes", "hidden", "inter", "k/E", "layer", "layer-hot",
           "gemv-v10", "gemv-v3", "ratio", "membound");
    bench_moe(s, bw, "DeepSeek-V4.1-Flash", 5120, 2304, 6, 32);
    bench_moe(s, bw, "Qwen3-30B-A3B", 2048, 768, 8, 128);
    printf("layer = trellis_cuda_moe_forward (the default MoE version); gemv-v10 / gemv-v3 = one GEMV (default v10 / "
           "round-1 v3) of hidden x (k·3·inter) weights (the same count), cold; ratio = layer / gemv-v10; MoE lab: "
           "v5 = round 1 (v3 body), v13 = v9's decode, v14 = v13 + PDL down launch, v15 = v11's decode + PDL, "
           "v16 = v5 + PDL, v17 / v18 = v14 with k tiles per block fitted to one / two waves of resident blocks, v19 = v16 with v17's k tiles per block, v20 = v17 with the integer mul1 arithmetic, v21 = five PDL-chained launches with v24's balanced integer loop over all routed experts (gate/up, then down; SwiGLU + down input quantisation in one middle launch), v22 = v21 without FMA masks, v23 = v21 with the middle launch's loads before its wait and the output launch parallel over pairs, v24 = v23 at 1 block per SM, v27 = v23 with the input launch PDL-chained to the previous kernel, v28 = v27 with v24's main kernels, v29 / v30 = v28 / v27 without the PDL-chained input launch, v34 = v23 with 16-warp blocks (one per SM), v40 = v23 with both main kernels at <= 120 registers (room for a small launch's block beside two), v41 = v34's gate/up + v40's down, v50 = v40 with the middle launch's gate and up Hadamards through one set of barriers, v54 / v55 = v50 with the gate/up / both main kernels in 16-warp blocks (one a SM), v56 = v54 + v55's down kernel from 8 work items per resident warp, v65 = v56 with two loop steps a pass from an even k tile (no copy of the next words), v66 = v65 with the middle launch's t loads before its sums of usb, the default (21-24, 34, 40, 41, 50, 54-56, 65, 66: round 4's loop, 27-30: one pass per 128-block); v231 / v232 / v233 = v23's launches 1-2 / 3-5 / the two main kernels alone (timing only)\n");
    if (moe_only) {
        cublasDestroy(h);
        return 0;
    }

    printf("\nv3 = one fused launch (default chunk), v2 = three launches, v4 = v2 with a balanced grid (v4m-bN: "
           "its main kernel alone, compiled for N blocks/SM: 2, 3 of 256 threads, 5, 6 of 128 threads); v3cN = v3 with N k tiles per block; "
           "membound = trellis bytes / copy bandwidth (read+write bytes per s); speedup = cublas / v3 (both cold); "
           "m:AxB = main kernel alone with A tile columns per warp, B tiles loaded ahead; v1 = decode to fp16 + cuBLAS, every call (K=3)\n");
    cublasDestroy(h);
    return 0;
}
