/* tools/bench/cuda_bench.c — benchmark of the CUDA trellis product kernels
 * (docs/benchmarks-cuda.md): batch-1 y = x·W at K = 2, 3, 4 (mul1) on six
 * (in, out) shapes, each product kernel of trellis_cuda_gemm on its own
 * (gemm_tc, gemv_int_c2, gemv_int_c8_w8, gemv_int_c8_w16: whole op and main
 * kernel alone) and the default (trellis_cuda_gemm, which picks one of them),
 * against cuBLAS fp16 (cublasGemmEx, fp16 in/out, fp32 compute: what torch's
 * fp16 matmul runs) on the same shape in the same run, and against the memory
 * bound (trellis bytes ÷ the measured device-to-device copy bandwidth); a rows
 * sweep; then the fused MoE decode layer (trellis_cuda_moe_forward, K=3, one
 * token) at DeepSeek-V4.1 and Qwen3-30B shapes against one GEMV of the same
 * weight count.
 *
 * Method: each timing captures G = 20 calls into a CUDA graph and times 25
 * replays with events, reporting the median ÷ G (no launch gaps, no host
 * overhead). "cold" rotates over enough copies of the weights that they are
 * > 4× the 60 MB L2 (what decode sees: each layer's weights once per token);
 * "hot" repeats one copy.
 *
 * Usage: cuda_bench [--quick | --int [KxN,...] | --moe | --profile [NAME,...]]
 * (exit 77 without a GPU). No argument: the GEMV table, then the MoE table;
 * --quick: the first two GEMV shapes, then MoE; --int: the GEMV table only,
 * with a list of in x out shapes those instead of the six; --moe: the MoE
 * table only; --profile: a few launches of each product kernel (or of those
 * named) on 4096x14336 K=3 for ncu, no timing. New lab versions are timed
 * beside these from a lab build (kernels/cuda/lab/README.md). */
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
#include "kernels/cuda/trellis_cuda_internal.h"

/* tools/bench/cuda_launch_floor.cu */
sparq_status bench_cuda_empty(void *stream, int launches);

#define G 20
#define REPS 25
#define COLD_BYTES (256u << 20)
#define NKER TRELLIS_CUDA_GEMM_KERNELS
#define DEFAULT_KERNEL (-1)

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
    /* ours: kernel = a trellis_cuda_gemm_kernel, or DEFAULT_KERNEL */
    trellis_cuda_linear **lins;
    int ncopies, rows, kernel;
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
    trellis_cuda_linear *lin = o->lins[i % o->ncopies];
    if (o->kernel == DEFAULT_KERNEL) SK(trellis_cuda_gemm(lin, o->x, o->rows, o->y, o->ws, o->s));
    else
        SK(trellis_cuda_gemm_run(lin, o->x, o->rows, o->y, o->ws, o->s, (trellis_cuda_gemm_kernel)o->kernel,
                                 o->parts));
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

/* The launch floor: o->rows empty kernels, PDL-chained from the second on. */
static void call_empty(op *o, int i)
{
    (void)i;
    SK(bench_cuda_empty(o->s, o->rows));
}

static void call_moe(op *o, int i)
{
    SK(trellis_cuda_moe_forward(o->moe, o->x, 1, o->ids[i % o->ncopies], o->rw, o->y, o->s));
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

/* A random host trellis linear; the caller frees it with free_linear. */
static trellis_linear rand_linear(int k, int n, int K, trellis_codebook cb)
{
    const size_t tbytes = (size_t)k * n * K / 8;
    uint16_t *tw = malloc(tbytes), *suh = malloc((size_t)k * 2), *svh = malloc((size_t)n * 2);
    for (size_t i = 0; i < tbytes / 2; i++) tw[i] = (uint16_t)rnd32();
    for (int i = 0; i < k; i++) suh[i] = sparq_f32_to_f16(rnd32() & 1 ? 0.9f : -1.1f);
    for (int i = 0; i < n; i++) svh[i] = sparq_f32_to_f16(rnd32() & 1 ? 0.01f : -0.012f);
    return (trellis_linear){k, n, K, cb, tw, suh, svh};
}

static void free_linear(trellis_linear *l)
{
    free((void *)l->trellis);
    free((void *)l->suh);
    free((void *)l->svh);
}

/* nc device copies of one host linear (enough to rotate past the L2). */
static trellis_cuda_linear **copies_upload(const trellis_linear *hl, int nc, const char *name)
{
    trellis_cuda_linear **lins = calloc((size_t)nc, sizeof *lins);
    for (int c = 0; c < nc; c++) SK(trellis_cuda_linear_upload(hl, name, &lins[c]));
    return lins;
}

static void copies_free(trellis_cuda_linear **lins, int nc)
{
    for (int c = 0; c < nc; c++) trellis_cuda_linear_free(lins[c]);
    free(lins);
}

/* Copies of `bytes` of weights that exceed COLD_BYTES (at least 2, at most 512). */
static int cold_copies(size_t bytes)
{
    int nc = (int)((COLD_BYTES + bytes - 1) / bytes);
    return nc < 2 ? 2 : nc > 512 ? 512 : nc;
}

/* One MoE layer of E experts (K=3, codebook cb) for one token, with `nsets`
 * routings to rotate over (cold); *out: the layer, ids and weights. */
typedef struct moe_setup {
    trellis_linear hg, hd;
    trellis_cuda_linear **l;
    trellis_cuda_moe *moe;
    int **ids;
    float *rw;
    int E, nsets;
} moe_setup;

static void moe_setup_make(moe_setup *m, int hidden, int inter, int top_k, int E, trellis_codebook cb)
{
    m->E = E;
    m->nsets = 8;
    m->hg = rand_linear(hidden, inter, 3, cb);
    m->hd = rand_linear(inter, hidden, 3, cb);
    m->l = calloc((size_t)3 * E, sizeof *m->l);
    for (int i = 0; i < 3 * E; i++) SK(trellis_cuda_linear_upload(i < 2 * E ? &m->hg : &m->hd, "expert", &m->l[i]));
    SK(trellis_cuda_moe_create(m->l, m->l + E, m->l + 2 * E, E, 1, top_k, &m->moe));
    m->ids = calloc((size_t)m->nsets, sizeof *m->ids);
    for (int c = 0; c < m->nsets; c++) {
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
        CK(cudaMalloc((void **)&m->ids[c], (size_t)top_k * sizeof(int)));
        CK(cudaMemcpy(m->ids[c], h, (size_t)top_k * sizeof(int), cudaMemcpyHostToDevice));
    }
    float hw[64];
    for (int j = 0; j < top_k; j++) hw[j] = 1.0f / top_k;
    CK(cudaMalloc((void **)&m->rw, (size_t)top_k * 4));
    CK(cudaMemcpy(m->rw, hw, (size_t)top_k * 4, cudaMemcpyHostToDevice));
}

static void moe_setup_free(moe_setup *m)
{
    trellis_cuda_moe_free(m->moe);
    for (int i = 0; i < 3 * m->E; i++) trellis_cuda_linear_free(m->l[i]);
    free(m->l);
    for (int c = 0; c < m->nsets; c++) CK(cudaFree(m->ids[c]));
    free(m->ids);
    CK(cudaFree(m->rw));
    free_linear(&m->hg);
    free_linear(&m->hd);
}

/* The fused MoE layer at batch 1 (mul1: moe_int; and the same layer in mcg:
 * moe_fused) vs one default GEMV over the same number of weights. x = 0 (the
 * kernels do not branch on it, bar the quantisation of an all-zero block). */
static void bench_moe(cudaStream_t s, double bw, const char *name, int hidden, int inter, int top_k, int E)
{
    float *x, *out;
    CK(cudaMalloc((void **)&x, (size_t)hidden * 4));
    CK(cudaMalloc((void **)&out, (size_t)hidden * 4));
    CK(cudaMemset(x, 0, (size_t)hidden * 4));
    CK(cudaMemset(out, 0, (size_t)hidden * 4));
    moe_setup m;
    moe_setup_make(&m, hidden, inter, top_k, E, TRELLIS_CB_MUL1);
    op o = {.call = call_moe, .s = s, .moe = m.moe, .ids = m.ids, .rw = m.rw, .x = x, .y = out};
    const double t_moe = time_op(&o, m.nsets), t_moe_hot = time_op(&o, 1);
    moe_setup_free(&m);
    moe_setup_make(&m, hidden, inter, top_k, E, TRELLIS_CB_MCG);
    o.moe = m.moe;
    o.ids = m.ids;
    o.rw = m.rw;
    const double t_fused = time_op(&o, m.nsets);
    moe_setup_free(&m);
    /* one GEMV with the same number of weights: hidden × (top_k · 3 · inter), cold */
    const int gn = top_k * 3 * inter;
    const size_t gbytes = (size_t)hidden * gn * 3 / 8;
    const int nc = cold_copies(gbytes);
    trellis_linear hb = rand_linear(hidden, gn, 3, TRELLIS_CB_MUL1);
    trellis_cuda_linear **gl = copies_upload(&hb, nc, "gemv");
    trellis_cuda_ws *ws = NULL;
    SK(trellis_cuda_ws_create(hidden, gn, &ws));
    float *gy;
    CK(cudaMalloc((void **)&gy, (size_t)gn * 4));
    op g = {.call = call_ours, .s = s, .lins = gl, .rows = 1, .kernel = DEFAULT_KERNEL, .parts = TRELLIS_CUDA_PART_ALL,
            .x = x, .y = gy, .ws = ws};
    const double t_gemv = time_op(&g, nc);
    const double bound = (double)gbytes / bw * 1e6;
    printf("%-22s %6d %6d %3d/%-3d %9.2f %9.2f %9.2f %7.2fx %9.2f %10.2f  (gemv: %s)\n", name, hidden, inter, top_k, E,
           t_moe, t_moe_hot, t_gemv, t_moe / t_gemv, bound, t_fused,
           trellis_cuda_gemm_kernel_name(trellis_cuda_gemm_choice(gl[0], 1)));
    fflush(stdout);
    copies_free(gl, nc);
    trellis_cuda_ws_free(ws);
    CK(cudaFree(gy));
    free_linear(&hb);
    CK(cudaFree(x));
    CK(cudaFree(out));
}

/* --profile: two launches of each product kernel named in `list` (NULL: all)
 * on 4096x14336 K=3, one row, for ncu; no timing. */
static int profile(const char *list)
{
    const int k = 4096, n = 14336;
    trellis_linear hl = rand_linear(k, n, 3, TRELLIS_CB_MUL1);
    trellis_cuda_linear *lin = NULL;
    trellis_cuda_ws *ws = NULL;
    float *x, *y;
    SK(trellis_cuda_linear_upload(&hl, "profile", &lin));
    SK(trellis_cuda_ws_create(k, n, &ws));
    CK(cudaMalloc((void **)&x, (size_t)k * 4));
    CK(cudaMalloc((void **)&y, (size_t)n * 4));
    CK(cudaMemset(x, 0, (size_t)k * 4));
    int ran = 0;
    for (int kn = 0; kn < NKER; kn++) {
        const char *name = trellis_cuda_gemm_kernel_name((trellis_cuda_gemm_kernel)kn);
        if (list) {
            const char *p = strstr(list, name);
            const size_t l = strlen(name);
            if (!p || (p != list && p[-1] != ',') || (p[l] && p[l] != ',')) continue;
        }
        for (int i = 0; i < 2; i++)
            SK(trellis_cuda_gemm_run(lin, x, 1, y, ws, NULL, (trellis_cuda_gemm_kernel)kn, TRELLIS_CUDA_PART_ALL));
        ran++;
    }
    SK(trellis_cuda_sync(NULL));
    trellis_cuda_linear_free(lin);
    trellis_cuda_ws_free(ws);
    free_linear(&hl);
    if (!ran) {
        fprintf(stderr, "cuda_bench: --profile: no product kernel in '%s' (want e.g. gemv_int_c8_w16,gemm_tc)\n", list);
        return 2;
    }
    printf("profile mode done (%d kernels)\n", ran);
    return 0;
}

/* A product kernel's name without its family prefix, for column heads:
 * "c8_w16", "c8_w8", "c2", "tc". */
static const char *short_name(int kn)
{
    const char *name = trellis_cuda_gemm_kernel_name((trellis_cuda_gemm_kernel)kn);
    return name + (strncmp(name, "gemv_int_", 9) == 0 ? 9 : strncmp(name, "gemm_", 5) == 0 ? 5 : 0);
}

/* The GEMV table's rows for one (k, n): cuBLAS once, then K = 2..4. */
static void bench_gemv(cudaStream_t s, cublasHandle_t h, double bw, int k, int n, int sweep)
{
    const size_t wbytes = (size_t)k * n * 2;
    const int nc16 = cold_copies(wbytes);
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
    const double t_cublas = time_op(&cb, nc16);
    trellis_cuda_ws *ws = NULL;
    SK(trellis_cuda_ws_create(k, n, &ws));
    for (int K = 2; K <= 4; K++) {
        const size_t tbytes = (size_t)k * n * K / 8;
        const int nc = cold_copies(tbytes);
        trellis_linear hl = rand_linear(k, n, K, TRELLIS_CB_MUL1);
        trellis_cuda_linear **lins = copies_upload(&hl, nc, "bench");
        op o = {.call = call_ours, .s = s, .lins = lins, .rows = 1, .x = x, .y = y, .ws = ws};
        double tw[NKER], tm[NKER], best = INFINITY;
        int bestk = 0;
        for (int kn = 0; kn < NKER; kn++) {
            o.kernel = kn;
            o.parts = TRELLIS_CUDA_PART_ALL;
            tw[kn] = time_op(&o, nc);
            if (tw[kn] < best) best = tw[kn], bestk = kn;
            o.parts = TRELLIS_CUDA_PART_MAIN;
            tm[kn] = time_op(&o, nc);
        }
        o.kernel = DEFAULT_KERNEL;
        o.parts = TRELLIS_CUDA_PART_ALL;
        const double t_def = time_op(&o, nc);
        printf("%5dx%-6d %2d |", k, n, K);
        for (int kn = 0; kn < NKER; kn++) printf(" %8.2f", tw[kn]);
        printf(" |");
        for (int kn = 0; kn < NKER; kn++) printf(" %8.2f", tm[kn]);
        printf(" | %7.2f %7.2f %-15s | %-15s %7.2fx %7.2fx %8.2f\n", t_cublas, t_def,
               trellis_cuda_gemm_kernel_name(trellis_cuda_gemm_choice(lins[0], 1)),
               trellis_cuda_gemm_kernel_name((trellis_cuda_gemm_kernel)bestk), t_cublas / best, t_cublas / t_def,
               tbytes / bw * 1e6);
        fflush(stdout);
        if (sweep && K == 3) {
            printf("  rows sweep (%dx%d K=3, cold, whole op), rows:", k, n);
            for (int kn = 0; kn < NKER; kn++)
                printf("%s%s", kn ? "/" : "", trellis_cuda_gemm_kernel_name((trellis_cuda_gemm_kernel)kn));
            printf("/default µs (- = not for that row count):");
            static const int rl[] = {1, 2, 4, 5, 8, 16};
            for (int r = 0; r < 6; r++) {
                o.rows = rl[r];
                printf(" %d:", rl[r]);
                for (int q = 0; q <= NKER; q++) { /* the default last */
                    o.kernel = q == NKER ? DEFAULT_KERNEL : q;
                    if (q != NKER && q != TRELLIS_CUDA_GEMM_TC && rl[r] > 4) {
                        printf("%s-", q ? "/" : "");
                        continue;
                    }
                    printf("%s%.2f", q ? "/" : "", time_op(&o, nc));
                }
            }
            o.rows = 1;
            printf("\n");
            fflush(stdout);
        }
        copies_free(lins, nc);
        free_linear(&hl);
    }
    trellis_cuda_ws_free(ws);
    for (int c = 0; c < nc16; c++) CK(cudaFree(w16[c]));
    free(w16);
    CK(cudaFree(x16));
    CK(cudaFree(y16));
    CK(cudaFree(x));
    CK(cudaFree(y));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    const int quick = strcmp(mode, "--quick") == 0, moe_only = strcmp(mode, "--moe") == 0;
    const int gemv_only = strcmp(mode, "--int") == 0;
    if (*mode && !quick && !moe_only && !gemv_only && strcmp(mode, "--profile") != 0) {
        fprintf(stderr, "usage: cuda_bench [--quick | --int [KxN,...] | --moe | --profile [NAME,...]]\n");
        return 2;
    }
    if (trellis_cuda_device_count() == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    if (strcmp(mode, "--profile") == 0) return profile(argc > 2 ? argv[2] : NULL);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth();
    printf("device: %s, %d SMs, L2 %d MB; copy bandwidth %.0f GB/s (read+write)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e9);

    int shapes[16][2] = {{4096, 14336}, {8192, 8192}, {5120, 2304}, {2304, 5120}, {2048, 768}, {768, 2048}};
    int nshapes = moe_only ? 0 : quick ? 2 : 6;
    if (gemv_only && argc > 2) { /* --int KxN,KxN,...: these shapes instead (multiples of 128) */
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
    if (nshapes) {
        printf("\nbatch-1 GEMV, mul1, median µs per call (graph of %d calls, %d replays); cold = weights rotate "
               "over > 256 MB\n",
               G, REPS);
        printf("%-12s %2s |", "in x out", "K");
        for (int kn = 0; kn < NKER; kn++) printf(" %8s", short_name(kn));
        printf(" |");
        for (int kn = 0; kn < NKER; kn++) printf(" %6s-m", short_name(kn));
        printf(" | %7s %7s %-15s | %-15s %8s %8s %8s\n", "cublas", "default", "(its kernel)", "best", "spd-best",
               "spd-dflt", "membound");
        for (int si = 0; si < nshapes; si++) bench_gemv(s, h, bw, shapes[si][0], shapes[si][1], si == 0);
        printf("\ncolumns: the four product kernels of trellis_cuda_gemm, each run alone (trellis_cuda_gemm_run; "
               "c8_w16 / c8_w8 = gemv_int_c8_w16 / _w8, the integer GEMV with 8 tile columns x 1 k tile a step in "
               "16- / 8-warp blocks, c2 = gemv_int_c2, 2 tile columns x 4 k tiles a step, tc = gemm_tc, the fp16 "
               "tensor-core GEMM), whole op, then -m = the main kernel alone; default = trellis_cuda_gemm and the "
               "kernel it picks; spd = cublas / (best | default), cold; membound = trellis bytes / copy "
               "bandwidth\n");
    }
    if (!gemv_only) {
        printf("\nfused MoE decode layer, K=3, batch 1 (one token), µs per layer; cold = routing rotates over 8 "
               "expert sets of a layer with E experts\n");
        printf("%-22s %6s %6s %7s %9s %9s %9s %8s %9s %10s\n", "shapes", "hidden", "inter", "k/E", "layer",
               "layer-hot", "gemv", "ratio", "membound", "fused-mcg");
        bench_moe(s, bw, "DeepSeek-V4.1-Flash", 5120, 2304, 6, 32);
        bench_moe(s, bw, "Qwen3-30B-A3B", 2048, 768, 8, 128);
        printf("layer = trellis_cuda_moe_forward on mul1 experts (moe_int), cold; gemv = the default GEMV of hidden x "
               "(k·3·inter) weights (the same count), cold; ratio = layer / gemv; membound = those weights' bytes / "
               "copy bandwidth; fused-mcg = the same layer with mcg experts (moe_fused), cold\n");
    }
    cublasDestroy(h);
    return 0;
}
