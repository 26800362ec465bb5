/* tests/gpu/test_backend_cuda.c — every op of the CUDA backend
 * (kernels/cuda/backend_cuda.h) against the CPU backend's op on random
 * inputs, with shapes that are and are not multiples of the kernels' block
 * sizes (8-wide loads, 64×64 GEMM tiles, 16-row trellis GEMM). Most checks
 * are a normalised squared error, ‖gpu − cpu‖² / ‖cpu‖², against a bound that
 * fits the op: ~1e-12 for fp32 ops whose only difference is the order of
 * additions, looser where the GPU rounds inputs to fp16 (EXL3) or where
 * sin/cos/exp differ by an ulp; the router's and add_rmsnorm's are element by
 * element (ids exactly, ulps, bits). Exits 77 (skipped) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "gpu/gpu_probe.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/backend_cuda.h"
#include "t.h"

static sq_exec *cpu, *gpu;
static uint64_t rng = 0x243F6A8885A308D3ull;

static float rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *randv(size_t n, float scale)
{
    float *x = malloc(n * sizeof(float) + 16);
    for (size_t i = 0; i < n; i++) x[i] = rnd() * scale;
    return x;
}

/* device copy of n floats (or ints) */
static void *up(const void *h, size_t bytes)
{
    void *d = gpu->be->alloc(gpu, bytes);
    if (d && h) CHECK(sq_cuda_to_device(gpu, d, h, bytes) == SPARQ_OK);
    return d;
}

static void down(void *h, const void *d, size_t bytes) { CHECK(gpu->be->to_host(gpu, h, d, bytes) == SPARQ_OK); }

static double nmse(const float *a, const float *ref, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        s += (double)ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

static void check_nmse(const float *a, const float *ref, size_t n, double bound, const char *what)
{
    const double e = nmse(a, ref, n);
    CHECK_MSG(e <= bound, "%s: nmse %.3g > bound %.3g", what, e, bound);
}

/* a random dense weight [out, in] of kind k (kept alive: the backend keys its copies by address) */
static void *rand_weight(sq_linear_kind k, int out, int in)
{
    size_t n = (size_t)out * in;
    if (k == SQ_LINEAR_F32) return randv(n, 0.1f);
    uint16_t *w = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        w[i] = k == SQ_LINEAR_BF16 ? sparq_f32_to_bf16(rnd() * 0.1f) : sparq_f32_to_f16(rnd() * 0.1f);
    return w;
}

/* y on both backends for the same x; returns the nmse */
static double run_linear(const sq_linear *l, int rows)
{
    float *x = randv((size_t)rows * l->in, 1.0f), *yc = malloc((size_t)rows * l->out * 4),
          *yg = malloc((size_t)rows * l->out * 4);
    float *dx = up(x, (size_t)rows * l->in * 4), *dy = up(NULL, (size_t)rows * l->out * 4);
    sq_linear_forward(cpu, l, x, rows, yc);
    sq_linear_forward(gpu, l, dx, rows, dy);
    down(yg, dy, (size_t)rows * l->out * 4);
    double e = nmse(yg, yc, (size_t)rows * l->out);
    gpu->be->free(gpu, dx);
    gpu->be->free(gpu, dy);
    free(x), free(yc), free(yg);
    return e;
}

static void test_linear_dense(void)
{
    static const int shapes[][3] = {{64, 96, 1}, {100, 37, 3}, {256, 130, 8}, {72, 200, 9}, {128, 64, 70}, {33, 65, 2}};
    for (int k = SQ_LINEAR_F32; k <= SQ_LINEAR_F16; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            sq_linear l = {.kind = (sq_linear_kind)k, .in = shapes[s][0], .out = shapes[s][1], .name = "t"};
            l.w = rand_weight(l.kind, l.out, l.in);
            if (s == 2) l.bias = randv((size_t)l.out, 1.0f);
            double e = run_linear(&l, shapes[s][2]);
            CHECK_MSG(e < 1e-11, "linear %s %dx%d rows %d: nmse %.3g", sq_linear_kind_name(l.kind), l.in, l.out,
                      shapes[s][2], e);
        }
}

/* a random EXL3 linear (any trellis words decode to valid weights) */
static sq_linear exl3_linear(int k, int n, int K, trellis_codebook cb)
{
    trellis_linear *t = calloc(1, sizeof *t);
    uint16_t *tr = malloc((size_t)k * n / 256 * 16 * K * 2), *su = malloc((size_t)k * 2), *sv = malloc((size_t)n * 2);
    for (size_t i = 0; i < (size_t)k * n / 256 * 16 * K; i++) tr[i] = (uint16_t)(rnd(), rng >> 48);
    /* scales that give outputs of order 1, as in a model (tiny ones would
     * measure fp16 subnormals instead of the kernels) */
    for (int i = 0; i < k; i++) su[i] = sparq_f32_to_f16(rnd() < 0 ? -0.1f : 0.1f);
    for (int i = 0; i < n; i++) sv[i] = sparq_f32_to_f16(1.0f + 0.2f * rnd());
    *t = (trellis_linear){.k = k, .n = n, .K = K, .cb = cb, .trellis = tr, .suh = su, .svh = sv};
    sq_linear l = {.name = "exl3"};
    CHECK(sq_cpu_linear_exl3_bind(&l, t, "exl3") == SPARQ_OK);
    return l;
}

static void test_linear_exl3(void)
{
    static const int shapes[][4] = {{256, 128, 3, 1}, {128, 384, 2, 5}, {256, 256, 4, 16}, {384, 128, 3, 17}, {128, 256, 3, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        sq_linear l = exl3_linear(shapes[s][0], shapes[s][1], shapes[s][2], TRELLIS_CB_MUL1);
        double e = run_linear(&l, shapes[s][3]);
        CHECK_MSG(e < 1e-5, "exl3 %dx%d K=%d rows %d: nmse %.3g", shapes[s][0], shapes[s][1], shapes[s][2],
                  shapes[s][3], e);
    }
}

static void test_rmsnorm_rope_swiglu_axpy(void)
{
    const int rows = 5, dim = 200, nh = 3, hd = 64;
    float *x = randv((size_t)rows * dim, 2.0f), *w = randv(dim, 1.0f), *yc = malloc((size_t)rows * dim * 4),
          *yg = malloc((size_t)rows * dim * 4);
    float *dx = up(x, (size_t)rows * dim * 4), *dy = up(NULL, (size_t)rows * dim * 4);
    cpu->be->rmsnorm(cpu, x, rows, dim, w, 1e-6f, yc);
    gpu->be->rmsnorm(gpu, dx, rows, dim, w, 1e-6f, dy);
    down(yg, dy, (size_t)rows * dim * 4);
    check_nmse(yg, yc, (size_t)rows * dim, 1e-12, "rmsnorm");

    float *q = randv((size_t)rows * nh * hd, 1.0f), *inv = malloc(hd / 2 * 4);
    for (int i = 0; i < hd / 2; i++) inv[i] = 1.0f / powf(1e6f, (float)(2 * i) / hd);
    int pos[5] = {0, 1, 17, 999, 4095};
    float *dq = up(q, (size_t)rows * nh * hd * 4), *qg = malloc((size_t)rows * nh * hd * 4);
    cpu->be->rope(cpu, q, rows, nh, hd, pos, inv);
    gpu->be->rope(gpu, dq, rows, nh, hd, pos, inv);
    down(qg, dq, (size_t)rows * nh * hd * 4);
    check_nmse(qg, q, (size_t)rows * nh * hd, 1e-10, "rope");

    const size_t n = 1003;
    float *g = randv(n, 4.0f), *u = randv(n, 1.0f), *oc = malloc(n * 4), *og = malloc(n * 4);
    float *dg = up(g, n * 4), *du = up(u, n * 4);
    cpu->be->swiglu(cpu, g, u, n, oc);
    gpu->be->swiglu(gpu, dg, du, n, dg);
    down(og, dg, n * 4);
    check_nmse(og, oc, n, 1e-12, "swiglu");
    cpu->be->axpy(cpu, 0.37f, u, n, oc);
    gpu->be->axpy(gpu, 0.37f, du, n, dg);
    down(og, dg, n * 4);
    check_nmse(og, oc, n, 1e-12, "axpy");
    { /* sum_parts: the CPU's floats to the bit (rank order, one rounding a piece), 3 pieces of n */
        float *parts = randv(3 * n, 1.0f), *sc = malloc(n * 4), *sg = malloc(n * 4);
        for (size_t i = 0; i < n; i += 7) parts[i] = 16777216.0f, parts[2 * n + i] = -16777216.0f;
        float *dp = up(parts, 3 * n * 4), *ds = up(NULL, n * 4);
        cpu->be->sum_parts(cpu, parts, 3, n, sc);
        gpu->be->sum_parts(gpu, dp, 3, n, ds);
        down(sg, ds, n * 4);
        CHECK_MSG(!memcmp(sg, sc, n * 4), "sum_parts: the GPU's sums are not the CPU's to the bit");
        gpu->be->free(gpu, dp), gpu->be->free(gpu, ds);
        free(parts), free(sc), free(sg);
    }
    gpu->be->free(gpu, dx), gpu->be->free(gpu, dy), gpu->be->free(gpu, dq), gpu->be->free(gpu, dg),
        gpu->be->free(gpu, du);
    /* w and inv stay allocated: the backend keys its device copies by host address, and a
     * later test's vector at a freed address would get this one's copy */
    free(x), free(yc), free(yg), free(q), free(qg), free(g), free(u), free(oc), free(og);
}

/* add_rmsnorm (k_rmsnorm<true>) at a decode step's shapes (Qwen3's d 2048,
 * V4.1's 7168, 1 to 16 rows) against the CPU: h to the bit (one rounded add
 * on both), y within 1e-6 relative (the sums of squares differ in order
 * only); and to the bit the GPU's own axpy then rmsnorm, which it replaces. */
static void test_add_rmsnorm(void)
{
    static const int dims[] = {2048, 7168}, row_counts[] = {1, 4, 16};
    for (int di = 0; di < 2; di++) {
        const int dim = dims[di];
        float *w = randv((size_t)dim, 1.0f); /* kept alive: the backend keys its copy by the address */
        for (int ri = 0; ri < 3; ri++) {
            const int rows = row_counts[ri];
            const size_t n = (size_t)rows * dim, bytes = n * 4;
            float *x = randv(n, 1.0f), *h = randv(n, 2.0f), *hg = malloc(bytes), *yc = malloc(bytes),
                  *yg = malloc(bytes), *y2 = malloc(bytes);
            float *dx = up(x, bytes), *dh = up(h, bytes), *dh2 = up(h, bytes), *dy = up(NULL, bytes),
                  *dy2 = up(NULL, bytes);
            cpu->be->add_rmsnorm(cpu, x, h, rows, dim, w, 1e-6f, yc);
            gpu->be->add_rmsnorm(gpu, dx, dh, rows, dim, w, 1e-6f, dy);
            gpu->be->axpy(gpu, 1.0f, dx, n, dh2);
            gpu->be->rmsnorm(gpu, dh2, rows, dim, w, 1e-6f, dy2);
            down(hg, dh, bytes);
            down(yg, dy, bytes);
            down(y2, dy2, bytes);
            CHECK_MSG(memcmp(hg, h, bytes) == 0, "add_rmsnorm rows %d dim %d: h is not the CPU's", rows, dim);
            double worst = 0;
            for (size_t i = 0; i < n; i++)
                worst = fmax(worst, fabs((double)yg[i] - yc[i]) / fmax(fabs((double)yc[i]), 1e-30));
            CHECK_MSG(worst <= 1e-6, "add_rmsnorm rows %d dim %d: y %.3g relative from the CPU's", rows, dim, worst);
            CHECK_MSG(memcmp(yg, y2, bytes) == 0, "add_rmsnorm rows %d dim %d: not the GPU's axpy + rmsnorm", rows,
                      dim);
            gpu->be->free(gpu, dx), gpu->be->free(gpu, dh), gpu->be->free(gpu, dh2), gpu->be->free(gpu, dy),
                gpu->be->free(gpu, dy2);
            free(x), free(h), free(hg), free(yc), free(yg), free(y2);
        }
    }
}

/* o_proj and the post-attention add_rmsnorm fused (linear_add_rmsnorm,
 * trellis_cuda_gemv_add_rmsnorm): against the CPU's linear + add_rmsnorm and
 * the GPU's two ops, h and xn both, at Qwen3-30B's o_proj (4096 → 2048) and
 * -235B's (8192 → 4096), the 32-warp limit and small shapes, 1..4 rows and K
 * 2..5; 5 rows and 33 column blocks are declined. */
static void test_linear_add_rmsnorm(void)
{
    static const int shapes[][4] = {{4096, 2048, 4, 1}, {8192, 4096, 4, 2}, {256, 128, 3, 4},
                                    {384, 640, 2, 3},   {512, 256, 5, 1}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int k = shapes[c][0], n = shapes[c][1], rows = shapes[c][3];
        sq_linear l = exl3_linear(k, n, shapes[c][2], TRELLIS_CB_MUL1);
        CHECK(gpu->be->prepare_linear(gpu, &l) == SPARQ_OK);
        float *w = randv((size_t)n, 1.0f);
        const size_t nx = (size_t)rows * k, nh = (size_t)rows * n, bh = nh * 4;
        float *x = randv(nx, 1.0f), *h = randv(nh, 2.0f), *y = malloc(bh), *xc = malloc(bh), *hg = malloc(bh),
              *xg = malloc(bh), *h2 = malloc(bh), *x2 = malloc(bh);
        sq_linear_forward(cpu, &l, x, rows, y);
        float *dx = up(x, nx * 4), *dh = up(h, bh), *dh2 = up(h, bh), *dxn = up(NULL, bh), *dxn2 = up(NULL, bh),
              *dy = up(NULL, bh);
        cpu->be->add_rmsnorm(cpu, y, h, rows, n, w, 1e-6f, xc);
        CHECK_MSG(gpu->be->linear_add_rmsnorm(gpu, &l, dx, rows, dh, w, 1e-6f, dxn), "%dx%d rows %d: not fused", k,
                  n, rows);
        sq_linear_forward(gpu, &l, dx, rows, dy);
        gpu->be->add_rmsnorm(gpu, dy, dh2, rows, n, w, 1e-6f, dxn2);
        CHECK(gpu->be->sync(gpu) == SPARQ_OK);
        down(hg, dh, bh), down(xg, dxn, bh), down(h2, dh2, bh), down(x2, dxn2, bh);
        char msg[96];
        snprintf(msg, sizeof msg, "linear_add_rmsnorm %dx%d K=%d rows %d: h vs cpu", k, n, shapes[c][2], rows);
        check_nmse(hg, h, nh, 1e-5, msg);
        snprintf(msg, sizeof msg, "linear_add_rmsnorm %dx%d K=%d rows %d: xn vs cpu", k, n, shapes[c][2], rows);
        check_nmse(xg, xc, nh, 1e-5, msg);
        snprintf(msg, sizeof msg, "linear_add_rmsnorm %dx%d K=%d rows %d: h vs the two gpu ops", k, n,
                 shapes[c][2], rows);
        check_nmse(hg, h2, nh, 1e-10, msg);
        snprintf(msg, sizeof msg, "linear_add_rmsnorm %dx%d K=%d rows %d: xn vs the two gpu ops", k, n,
                 shapes[c][2], rows);
        check_nmse(xg, x2, nh, 1e-10, msg);
        CHECK(!gpu->be->linear_add_rmsnorm(gpu, &l, dx, 5, dh, w, 1e-6f, dxn)); /* more rows than the GEMV takes */
        gpu->be->free(gpu, dx), gpu->be->free(gpu, dh), gpu->be->free(gpu, dh2), gpu->be->free(gpu, dxn),
            gpu->be->free(gpu, dxn2), gpu->be->free(gpu, dy);
        free(x), free(h), free(y), free(xc), free(hg), free(xg), free(h2), free(x2);
    }
    sq_linear wide = exl3_linear(256, 4224, 3, TRELLIS_CB_MUL1); /* 33 column blocks: more than a block's warps */
    CHECK(gpu->be->prepare_linear(gpu, &wide) == SPARQ_OK);
    float *w = randv(4224, 1.0f), *dx = up(NULL, 256 * 4), *dh = up(NULL, 4224 * 4), *dxn = up(NULL, 4224 * 4);
    CHECK(!gpu->be->linear_add_rmsnorm(gpu, &wide, dx, 1, dh, w, 1e-6f, dxn));
    gpu->be->free(gpu, dx), gpu->be->free(gpu, dh), gpu->be->free(gpu, dxn);
}

/* Decode-sized attention over a KV cache (the split kernel, kernels/cuda/
 * backend_cuda.cu k_attn_split) for Qwen3-30B's heads (32 over 4 KV heads,
 * 128 wide), a head width that is not a multiple of 128, one head per KV head
 * and more query heads per KV head than the split kernel takes (the
 * one-block-a-head kernel), key counts from 1 to past several splits. */
static void test_attention_split(void)
{
    static const struct { int rows, nh, nkv, hd; } sh[] = {{1, 32, 4, 128}, {5, 32, 4, 128}, {16, 32, 4, 128},
                                                          {3, 6, 2, 96}, {2, 8, 8, 64}, {1, 64, 1, 512}};
    static const int lens[] = {1, 33, 300, 520, 700, 2100};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int rows = sh[s].rows, nh = sh[s].nh, nkv = sh[s].nkv, hd = sh[s].hd, L = lens[li];
            const size_t kvd = (size_t)nkv * hd, cache = (size_t)rows * L;
            float *kc = randv(cache * kvd, 1.0f), *vc = randv(cache * kvd, 1.0f), *q = randv((size_t)rows * nh * hd, 1.0f);
            int kvf[16], kvl[16];
            for (int r = 0; r < rows; r++) kvf[r] = r * L, kvl[r] = L - (r * 7) % (L > 8 ? 8 : 1);
            float *dkc = up(kc, cache * kvd * 4), *dvc = up(vc, cache * kvd * 4), *dq = up(q, (size_t)rows * nh * hd * 4);
            float *dout = up(NULL, (size_t)rows * nh * hd * 4);
            float *oc = malloc((size_t)rows * nh * hd * 4), *og = malloc((size_t)rows * nh * hd * 4);
            cpu->be->attention(cpu, q, rows, nh, nkv, hd, kc, vc, kvf, kvl, 0.0884f, oc);
            gpu->be->attention(gpu, dq, rows, nh, nkv, hd, dkc, dvc, kvf, kvl, 0.0884f, dout);
            down(og, dout, (size_t)rows * nh * hd * 4);
            char what[96];
            snprintf(what, sizeof what, "attention %d rows %d/%d heads x %d, %d keys", rows, nh, nkv, hd, L);
            check_nmse(og, oc, (size_t)rows * nh * hd, 1e-11, what);
            gpu->be->free(gpu, dkc), gpu->be->free(gpu, dvc), gpu->be->free(gpu, dq), gpu->be->free(gpu, dout);
            free(kc), free(vc), free(q), free(oc), free(og);
        }
}

/* Prefill-sized attention (more than 16 rows: the flash kernel, kernels/cuda/
 * attn_prefill.cu, for head widths 64 and 128; the one-block-a-head kernel for
 * others). One sequence's chunk after `past` cached keys (kv_first not a
 * multiple of the kernel's 64-key tiles, each row one key more), and rows of
 * three sequences interleaved, one with no keys, over a cache whose rows no
 * query row reads are NaN (a key tile that spans two sequences must not let
 * them into the output). */
static void test_attention_prefill(void)
{
    static const struct { int nh, nkv, hd; } sh[] = {{32, 4, 128}, {8, 8, 64}, {6, 2, 64}, {16, 1, 128}, {4, 2, 96}};
    static const int nrows[] = {17, 64, 100, 513};
    static const int pasts[] = {0, 200, 1000};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (int mixed = 0; mixed < 2; mixed++)
            for (size_t ri = 0; ri < sizeof nrows / sizeof nrows[0]; ri++)
                for (size_t pi = 0; pi < (mixed ? 1 : sizeof pasts / sizeof pasts[0]); pi++) {
                    const int rows = nrows[ri], nh = sh[s].nh, nkv = sh[s].nkv, hd = sh[s].hd, past = pasts[pi];
                    const int base = 37, seq_rows = 2000;
                    const size_t kvd = (size_t)nkv * hd, cache = mixed ? 3 * (size_t)seq_rows : (size_t)(base + past + rows);
                    int *kvf = malloc((size_t)rows * sizeof(int)), *kvl = malloc((size_t)rows * sizeof(int));
                    for (int r = 0; r < rows; r++) {
                        if (mixed) {
                            kvf[r] = (r % 3) * seq_rows + 11;
                            kvl[r] = r == 5 ? 0 : 1 + (r * 389) % 1500;
                        } else
                            kvf[r] = base, kvl[r] = past + r + 1;
                    }
                    float *kc = randv(cache * kvd, 1.0f), *vc = randv(cache * kvd, 1.0f);
                    if (mixed) { /* NaN in every cache row no query row reads */
                        char *read = calloc(cache, 1);
                        for (int r = 0; r < rows; r++)
                            for (int t = 0; t < kvl[r]; t++) read[kvf[r] + t] = 1;
                        for (size_t t = 0; t < cache; t++)
                            if (!read[t])
                                for (size_t i = 0; i < kvd; i++) kc[t * kvd + i] = vc[t * kvd + i] = NAN;
                        free(read);
                    }
                    float *q = randv((size_t)rows * nh * hd, 1.0f);
                    float *dkc = up(kc, cache * kvd * 4), *dvc = up(vc, cache * kvd * 4),
                          *dq = up(q, (size_t)rows * nh * hd * 4), *dout = up(NULL, (size_t)rows * nh * hd * 4);
                    float *oc = malloc((size_t)rows * nh * hd * 4), *og = malloc((size_t)rows * nh * hd * 4);
                    const float scale = 1.0f / sqrtf((float)hd);
                    cpu->be->attention(cpu, q, rows, nh, nkv, hd, kc, vc, kvf, kvl, scale, oc);
                    gpu->be->attention(gpu, dq, rows, nh, nkv, hd, dkc, dvc, kvf, kvl, scale, dout);
                    down(og, dout, (size_t)rows * nh * hd * 4);
                    char what[128];
                    snprintf(what, sizeof what, "prefill attention %d rows %d/%d heads x %d, %s", rows, nh, nkv, hd,
                             mixed ? "three sequences" : past ? "after cached keys" : "from position 0");
                    check_nmse(og, oc, (size_t)rows * nh * hd, 1e-11, what);
                    gpu->be->free(gpu, dkc), gpu->be->free(gpu, dvc), gpu->be->free(gpu, dq), gpu->be->free(gpu, dout);
                    free(kc), free(vc), free(q), free(oc), free(og), free(kvf), free(kvl);
                }
}

/* The KV append, then attention over the cache that includes the appended
 * rows, back to back, for heads of 64 (up to 259 keys) and Qwen3-30B's heads
 * (600..1000 keys). Both go through the split kernel (keys are counted in
 * 256-key buckets, so 259 counts as 512), which loads the older keys before
 * it waits for the append: the appended rows must come after the wait, and
 * the cache holds other values there before. */
static void test_attention_kv(void)
{
    static const struct { int nh, nkv, hd, cache, kvf[3], kvl[3]; } cs[] = {
        {4, 2, 64, 300, {0, 10, 40}, {1, 17, 259}},
        {32, 4, 128, 3000, {0, 1000, 2000}, {600, 777, 1000}},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int rows = 3, nh = cs[c].nh, nkv = cs[c].nkv, hd = cs[c].hd, cache = cs[c].cache;
        const size_t kvd = (size_t)nkv * hd;
        int kvf[3], kvl[3], pos[3];
        for (int r = 0; r < rows; r++) kvf[r] = cs[c].kvf[r], kvl[r] = cs[c].kvl[r], pos[r] = kvl[r] - 1;
        float *kc = randv(cache * kvd, 1.0f), *vc = randv(cache * kvd, 1.0f), *q = randv((size_t)rows * nh * hd, 1.0f);
        float *k = randv((size_t)rows * kvd, 1.0f), *v = randv((size_t)rows * kvd, 1.0f);
        float *dkc = up(kc, cache * kvd * 4), *dvc = up(vc, cache * kvd * 4), *dq = up(q, (size_t)rows * nh * hd * 4);
        float *dk = up(k, (size_t)rows * kvd * 4), *dv = up(v, (size_t)rows * kvd * 4);
        float *dout = up(NULL, (size_t)rows * nh * hd * 4);
        float *oc = malloc((size_t)rows * nh * hd * 4), *og = malloc((size_t)rows * nh * hd * 4);
        cpu->be->kv_store(cpu, k, v, rows, kvd, kvf, pos, kc, vc);
        cpu->be->attention(cpu, q, rows, nh, nkv, hd, kc, vc, kvf, kvl, 0.125f, oc);
        gpu->be->kv_store(gpu, dk, dv, rows, kvd, kvf, pos, dkc, dvc);
        gpu->be->attention(gpu, dq, rows, nh, nkv, hd, dkc, dvc, kvf, kvl, 0.125f, dout);
        down(og, dout, (size_t)rows * nh * hd * 4);
        char what[96];
        snprintf(what, sizeof what, "kv append then attention, %d/%d heads x %d, up to %d keys", nh, nkv, hd, kvl[2]);
        check_nmse(og, oc, (size_t)rows * nh * hd, 1e-11, what);
        float *kg = malloc(cache * kvd * 4), *vg = malloc(cache * kvd * 4);
        down(kg, dkc, cache * kvd * 4);
        down(vg, dvc, cache * kvd * 4);
        CHECK(memcmp(kg, kc, cache * kvd * 4) == 0 && memcmp(vg, vc, cache * kvd * 4) == 0);
        gpu->be->free(gpu, dkc), gpu->be->free(gpu, dvc), gpu->be->free(gpu, dq), gpu->be->free(gpu, dk),
            gpu->be->free(gpu, dv), gpu->be->free(gpu, dout);
        free(kc), free(vc), free(q), free(k), free(v), free(kg), free(vg), free(oc), free(og);
    }
}

/* The fused attention front (attn_front: the grouped q/k/v GEMV with the
 * input norm, head norms, rope and KV append folded in) against the same ops
 * one by one, on the GPU (the same arithmetic: only the GEMV's atomics add in
 * another order) and on the CPU (the reference); cache rows other than the
 * step's stay untouched. Shapes: small heads of 64 and 128, Qwen3-30B-A3B's
 * attention (2048 → 32 × 128 and 4 × 128, K = 4), 1..4 rows, with and
 * without a cache; and what it must refuse (5 rows, mixed K, head_dim 96). */
static void run_attn_front(int d, int nh, int nkv, int hd, int K, int rows, bool cached)
{
    const int qd = nh * hd, kvd = nkv * hd, ctx = 40;
    sq_linear lq = exl3_linear(d, qd, K, TRELLIS_CB_MUL1), lk = exl3_linear(d, kvd, K, TRELLIS_CB_MUL1),
              lv = exl3_linear(d, kvd, K, TRELLIS_CB_MUL1);
    float *norm = randv(d, 1.0f), *qn = randv(hd, 1.0f), *kn = randv(hd, 1.0f), *inv = malloc(hd / 2 * 4);
    for (int i = 0; i < hd / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hd);
    const sq_attn_front af = {.q = &lq, .k = &lk, .v = &lv, .norm = norm, .q_norm = qn, .k_norm = kn, .eps = 1e-6f,
                              .head_dim = hd, .inv_freq = inv};
    float *x = randv((size_t)rows * d, 3.0f);
    int pos[4], kvf[4];
    for (int r = 0; r < rows; r++) pos[r] = 3 + 7 * r, kvf[r] = r * ctx;
    const size_t cn = (size_t)rows * ctx * kvd;
    float *kc0 = randv(cn, 1.0f), *vc0 = randv(cn, 1.0f);
    /* the CPU's ops */
    float *xn = malloc((size_t)rows * d * 4), *q = malloc((size_t)rows * qd * 4), *k = malloc((size_t)rows * kvd * 4),
          *v = malloc((size_t)rows * kvd * 4), *kc = malloc(cn * 4), *vc = malloc(cn * 4);
    memcpy(kc, kc0, cn * 4), memcpy(vc, vc0, cn * 4);
    cpu->be->rmsnorm(cpu, x, rows, d, norm, af.eps, xn);
    sq_linear_forward(cpu, &lq, xn, rows, q);
    sq_linear_forward(cpu, &lk, xn, rows, k);
    sq_linear_forward(cpu, &lv, xn, rows, v);
    cpu->be->rmsnorm(cpu, q, rows * nh, hd, qn, af.eps, q);
    cpu->be->rmsnorm(cpu, k, rows * nkv, hd, kn, af.eps, k);
    cpu->be->rope(cpu, q, rows, nh, hd, pos, inv);
    cpu->be->rope(cpu, k, rows, nkv, hd, pos, inv);
    if (cached) cpu->be->kv_store(cpu, k, v, rows, kvd, kvf, pos, kc, vc);
    /* the GPU: op by op (o), then fused (f) */
    float *dx = up(x, (size_t)rows * d * 4), *dxn = up(NULL, (size_t)rows * d * 4);
    float *dq[2], *dk[2], *dv[2], *dkc[2], *dvc[2];
    for (int i = 0; i < 2; i++) {
        dq[i] = up(NULL, (size_t)rows * qd * 4), dk[i] = up(NULL, (size_t)rows * kvd * 4),
        dv[i] = up(NULL, (size_t)rows * kvd * 4);
        dkc[i] = up(kc0, cn * 4), dvc[i] = up(vc0, cn * 4);
    }
    gpu->be->rmsnorm(gpu, dx, rows, d, norm, af.eps, dxn);
    sq_linear_forward(gpu, &lq, dxn, rows, dq[0]);
    sq_linear_forward(gpu, &lk, dxn, rows, dk[0]);
    sq_linear_forward(gpu, &lv, dxn, rows, dv[0]);
    gpu->be->rmsnorm(gpu, dq[0], rows * nh, hd, qn, af.eps, dq[0]);
    gpu->be->rmsnorm(gpu, dk[0], rows * nkv, hd, kn, af.eps, dk[0]);
    gpu->be->rope(gpu, dq[0], rows, nh, hd, pos, inv);
    gpu->be->rope(gpu, dk[0], rows, nkv, hd, pos, inv);
    if (cached) gpu->be->kv_store(gpu, dk[0], dv[0], rows, kvd, kvf, pos, dkc[0], dvc[0]);
    CHECK(gpu->be->prepare_linear(gpu, &lq) == SPARQ_OK && gpu->be->prepare_linear(gpu, &lk) == SPARQ_OK &&
          gpu->be->prepare_linear(gpu, &lv) == SPARQ_OK);
    const bool took = gpu->be->attn_front(gpu, &af, dx, rows, pos, kvf, cached ? dkc[1] : NULL,
                                          cached ? dvc[1] : NULL, dq[1], dk[1], dv[1]);
    CHECK_MSG(took, "attn_front refused d %d, %d/%d heads of %d, K %d, %d rows", d, nh, nkv, hd, K, rows);
    char what[160];
    float *h = malloc(cn * 4 > (size_t)rows * qd * 4 ? cn * 4 : (size_t)rows * qd * 4);
    const struct {
        float *const *dev;
        const float *ref;
        size_t n;
        const char *name;
    } outs[] = {{dq, q, (size_t)rows * qd, "q"}, {dk, k, (size_t)rows * kvd, "k"}, {dv, v, (size_t)rows * kvd, "v"},
                {dkc, kc, cn, "k cache"}, {dvc, vc, cn, "v cache"}};
    float *ho = malloc(cn * 4 > (size_t)rows * qd * 4 ? cn * 4 : (size_t)rows * qd * 4);
    for (size_t o = 0; o < sizeof outs / sizeof *outs; o++) {
        down(ho, outs[o].dev[0], outs[o].n * 4);
        down(h, outs[o].dev[1], outs[o].n * 4);
        snprintf(what, sizeof what, "attn_front %s (d %d, %d/%d heads of %d, K %d, %d rows%s) vs the GPU's ops",
                 outs[o].name, d, nh, nkv, hd, K, rows, cached ? ", cached" : "");
        check_nmse(h, ho, outs[o].n, 1e-10, what);
        snprintf(what, sizeof what, "attn_front %s (d %d, %d/%d heads of %d, K %d, %d rows%s) vs the CPU's ops",
                 outs[o].name, d, nh, nkv, hd, K, rows, cached ? ", cached" : "");
        check_nmse(h, outs[o].ref, outs[o].n, 1e-5, what);
        if (o >= 3) { /* the rows the step did not write are the old ones, bit for bit */
            const float *c0 = o == 3 ? kc0 : vc0;
            size_t bad = 0;
            for (size_t i = 0; i < cn; i++) {
                const int row = (int)(i / (size_t)kvd), r = row / ctx;
                const bool written = cached && row % ctx == pos[r];
                if (!written && memcmp(&h[i], &c0[i], 4)) bad++;
            }
            CHECK_MSG(bad == 0, "attn_front %s: %zu values outside the step's rows changed", outs[o].name, bad);
        }
    }
    for (int i = 0; i < 2; i++)
        gpu->be->free(gpu, dq[i]), gpu->be->free(gpu, dk[i]), gpu->be->free(gpu, dv[i]), gpu->be->free(gpu, dkc[i]),
            gpu->be->free(gpu, dvc[i]);
    gpu->be->free(gpu, dx), gpu->be->free(gpu, dxn);
    free(h), free(ho), free(xn), free(q), free(k), free(v), free(kc), free(vc), free(kc0), free(vc0), free(x);
}

static void test_attn_front(void)
{
    CHECK(sq_exec_reserve(cpu, sq_exec_scratch_floats(4096, 512)) == SPARQ_OK);
    for (int rows = 1; rows <= 4; rows++) {
        run_attn_front(256, 4, 2, 128, 3, rows, rows != 2);
        run_attn_front(256, 4, 2, 64, 3, rows, rows != 3);
    }
    run_attn_front(384, 6, 2, 64, 2, 2, true);
    run_attn_front(2048, 32, 4, 128, 4, 1, true); /* Qwen3-30B-A3B: gemv_int_c2 over 5120 columns */
    run_attn_front(2048, 32, 4, 128, 4, 4, true);
    run_attn_front(4096, 64, 4, 128, 3, 1, true); /* Qwen3-235B-A22B: the 16-warp 8-column kernel */
    /* what the fused path must leave to the ops */
    sq_linear lq = exl3_linear(256, 256, 3, TRELLIS_CB_MUL1), lk = exl3_linear(256, 128, 3, TRELLIS_CB_MUL1),
              lv = exl3_linear(256, 128, 4, TRELLIS_CB_MUL1), lk96 = exl3_linear(256, 384, 3, TRELLIS_CB_MUL1);
    float *norm = randv(256, 1.0f), *inv = randv(64, 0.1f);
    CHECK(gpu->be->prepare_linear(gpu, &lq) == SPARQ_OK && gpu->be->prepare_linear(gpu, &lk) == SPARQ_OK &&
          gpu->be->prepare_linear(gpu, &lv) == SPARQ_OK && gpu->be->prepare_linear(gpu, &lk96) == SPARQ_OK);
    float *dx = up(NULL, 5 * 256 * 4), *dy = up(NULL, 5 * 256 * 4);
    const int pos[5] = {0, 1, 2, 3, 4};
    sq_attn_front mixed = {.q = &lq, .k = &lk, .v = &lv, .norm = norm, .eps = 1e-6f,
                           .head_dim = 128, .inv_freq = inv};
    CHECK(!gpu->be->attn_front(gpu, &mixed, dx, 1, pos, pos, NULL, NULL, dy, dy, dy));
    sq_attn_front five = mixed;
    five.v = &lk;
    CHECK(!gpu->be->attn_front(gpu, &five, dx, 5, pos, pos, NULL, NULL, dy, dy, dy));
    sq_attn_front h96 = {.q = &lk96, .k = &lk96, .v = &lk96, .norm = norm, .eps = 1e-6f,
                         .head_dim = 96, .inv_freq = inv};
    CHECK(!gpu->be->attn_front(gpu, &h96, dx, 1, pos, pos, NULL, NULL, dy, dy, dy));
    CHECK(gpu->be->sync(gpu) == SPARQ_OK);
    gpu->be->free(gpu, dx), gpu->be->free(gpu, dy);
    /* norm and inv stay allocated: the backend may key device copies by their address */
}

/* distance in ulps between two floats of the same sign */
static long long ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return llabs((long long)ia - ib);
}

/* Row r of a router case, one of four kinds: random; rounded to integers
 * (ties everywhere: the lower index wins); a third of the experts -inf; all
 * -inf but a few ±0 (the CPU ties -0 with +0, and the picks past those are
 * -inf experts, lowest index first: "taken" must not be a -inf logit). */
static void router_row(float *l, int E, int kind)
{
    for (int e = 0; e < E; e++) {
        l[e] = rnd() * 3.0f;
        if (kind == 1) l[e] = roundf(l[e]);
        if (kind == 2 && e % 3 == 1) l[e] = -INFINITY;
        if (kind == 3) l[e] = e % 97 == 5 ? (e & 1 ? -0.0f : 0.0f) : -INFINITY;
    }
}

/* The most the GPU's router weights may differ from the CPU's: CUDA's expf
 * is within 2 ulp, glibc's within 1, and the double sum differs in the order
 * of its additions only. */
#define ROUTER_ULPS 4

/* The router's top-k on the GPU chooses the CPU's experts: Qwen3's 128
 * experts top-8 and DeepSeek V4.1's 384 top-6 at 1 to 16 rows, the rows of
 * every kind above; then a size for each register width of the warp kernel
 * (k_topk_warp<4..32>), sizes not multiples of 32, and more experts than it
 * holds (the one-thread fallback). Ids exactly, weights to ROUTER_ULPS. */
static void test_router_embed(void)
{
    static const int shapes[][3] = {{1, 128, 8},  {2, 128, 8},  {16, 128, 8}, {1, 384, 6}, {3, 384, 6},
                                    {8, 384, 6},  {16, 384, 6}, {9, 20, 4},   {5, 256, 8}, {4, 300, 7},
                                    {5, 512, 8},  {4, 1000, 8}, {3, 1024, 32}, {3, 3000, 6}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int rows = shapes[sh][0], E = shapes[sh][1], K = shapes[sh][2];
        float *l = malloc((size_t)rows * E * 4);
        for (int r = 0; r < rows; r++) router_row(l + (size_t)r * E, E, (int)((r + sh) % 4));
        float *dl = up(l, (size_t)rows * E * 4);
        int *dix = up(NULL, (size_t)rows * K * 4);
        float *dw = up(NULL, (size_t)rows * K * 4);
        int *ic = malloc((size_t)rows * K * 4), *ig = malloc((size_t)rows * K * 4);
        float *wc = malloc((size_t)rows * K * 4), *wg = malloc((size_t)rows * K * 4);
        for (int norm = 0; norm < 2; norm++) {
            cpu->be->router_topk(cpu, l, rows, E, K, norm, ic, wc);
            gpu->be->router_topk(gpu, dl, rows, E, K, norm, dix, dw);
            down(ig, dix, (size_t)rows * K * 4);
            down(wg, dw, (size_t)rows * K * 4);
            int bad = -1;
            long long worst = 0;
            for (int i = 0; i < rows * K; i++) {
                if (ig[i] != ic[i] && bad < 0) bad = i;
                if (ulps(wg[i], wc[i]) > worst) worst = ulps(wg[i], wc[i]);
            }
            CHECK_MSG(bad < 0, "router %d rows top-%d of %d norm %d: row %d pick %d is expert %d, the CPU's %d", rows,
                      K, E, norm, bad / K, bad % K, ig[bad < 0 ? 0 : bad], ic[bad < 0 ? 0 : bad]);
            CHECK_MSG(worst <= ROUTER_ULPS, "router %d rows top-%d of %d norm %d: weights %lld ulp from the CPU's",
                      rows, K, E, norm, worst);
        }
        gpu->be->free(gpu, dl), gpu->be->free(gpu, dix), gpu->be->free(gpu, dw);
        free(l), free(ic), free(ig), free(wc), free(wg);
    }
    const int vocab = 50, d = 72, n = 7;
    for (int k = SQ_LINEAR_F32; k <= SQ_LINEAR_F16; k++) {
        void *table = rand_weight((sq_linear_kind)k, vocab, d);
        CHECK(gpu->be->prepare(gpu, table, (size_t)vocab * d * (k == SQ_LINEAR_F32 ? 4 : 2)) == SPARQ_OK);
        int32_t tok[7] = {0, 49, 3, 3, 17, 25, 8};
        float hc[7 * 72], hg[7 * 72], *dh = up(NULL, sizeof hg);
        cpu->be->embed(cpu, (sq_linear_kind)k, table, d, tok, n, hc);
        gpu->be->embed(gpu, (sq_linear_kind)k, table, d, tok, n, dh);
        down(hg, dh, sizeof hg);
        CHECK(memcmp(hc, hg, sizeof hg) == 0);
        gpu->be->free(gpu, dh);
    }
}

/* The CPU reference of the moe op, from CPU ops, one routed (row, expert) at
 * a time; the expert split (own_n > 1): only the experts ml holds. */
static void moe_ref(const sq_moe_layer *ml, const float *x, int rows, float *out)
{
    const int d = ml->gate[sq_moe_held(ml)].in, I = ml->gate[sq_moe_held(ml)].out, E = ml->n_exp, K = ml->top_k;
    float *rl = malloc((size_t)rows * E * 4), *w = malloc((size_t)rows * K * 4), *g = malloc(I * 4),
          *u = malloc(I * 4), *dn = malloc(d * 4);
    int *idx = malloc((size_t)rows * K * 4);
    sq_linear_forward(cpu, ml->router, x, rows, rl);
    cpu->be->router_topk(cpu, rl, rows, E, K, ml->norm_topk, idx, w);
    memset(out, 0, (size_t)rows * d * 4);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < K; j++) {
            const int e = idx[r * K + j];
            if (!sq_moe_holds(ml, e)) continue;
            sq_linear_forward(cpu, &ml->gate[e], x + (size_t)r * d, 1, g);
            sq_linear_forward(cpu, &ml->up[e], x + (size_t)r * d, 1, u);
            cpu->be->swiglu(cpu, g, u, (size_t)I, g);
            sq_linear_forward(cpu, &ml->down[e], g, 1, dn);
            cpu->be->axpy(cpu, w[r * K + j], dn, (size_t)d, out + (size_t)r * d);
        }
    free(rl), free(w), free(g), free(u), free(dn), free(idx);
}

static void run_moe1(const sq_moe_layer *ml, const int *row_counts, int n_counts, double bound, const char *what)
{
    const int d = ml->gate[sq_moe_held(ml)].in, I = ml->gate[sq_moe_held(ml)].out, E = ml->n_exp, K = ml->top_k,
              R = 64;
    CHECK(gpu->be->prepare_moe(gpu, ml, R) == SPARQ_OK);
    sq_moe_ws ws = {up(NULL, (size_t)R * E * 4), up(NULL, (size_t)R * K * 4), up(NULL, (size_t)R * K * 4),
                    up(NULL, (size_t)R * d * 4), up(NULL, (size_t)R * I * 4), up(NULL, (size_t)R * I * 4),
                    up(NULL, (size_t)R * d * 4), up(NULL, (size_t)R * K * 4), up(NULL, (size_t)R * K * 4)};
    for (int c = 0; c < n_counts; c++) {
        const int rows = row_counts[c];
        float *x = randv((size_t)rows * d, 1.0f), *oc = malloc((size_t)rows * d * 4), *og = malloc((size_t)rows * d * 4);
        float *dx = up(x, (size_t)rows * d * 4), *dout = up(NULL, (size_t)rows * d * 4);
        moe_ref(ml, x, rows, oc);
        gpu->be->moe(gpu, ml, dx, rows, dout, &ws, false);
        down(og, dout, (size_t)rows * d * 4);
        char msg[160];
        snprintf(msg, sizeof msg, "moe %s rows %d", what, rows);
        check_nmse(og, oc, (size_t)rows * d, bound, msg);
        gpu->be->free(gpu, dx), gpu->be->free(gpu, dout);
        free(x), free(oc), free(og);
    }
    void *bufs[] = {ws.rl, ws.rw, ws.lw, ws.xg, ws.g, ws.u, ws.dn, ws.ridx, ws.rows_of};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->be->free(gpu, bufs[i]);
}

/* The layer as it is, then as node 1 of 2 and node 0 of 3 of the expert
 * split hold it: the other experts' linears empty (as a split bundle binds
 * them), so prepare_moe must leave them out and every path skip their pairs. */
static void run_moe(const sq_moe_layer *ml, const int *row_counts, int n_counts, double bound, const char *what)
{
    run_moe1(ml, row_counts, n_counts, bound, what);
    static const int sets[][2] = {{2, 1}, {3, 0}};
    for (size_t c = 0; c < sizeof sets / sizeof *sets; c++) {
        const int E = ml->n_exp;
        sq_linear *lin = calloc((size_t)3 * E, sizeof *lin);
        sq_moe_layer own = *ml;
        own.own_n = sets[c][0];
        own.own_k = sets[c][1];
        for (int e = 0; e < E; e++)
            if (sq_moe_holds(&own, e)) lin[e] = ml->gate[e], lin[E + e] = ml->up[e], lin[2 * E + e] = ml->down[e];
        own.gate = lin, own.up = lin + E, own.down = lin + 2 * E;
        char w[96];
        snprintf(w, sizeof w, "%s, experts %d mod %d", what, own.own_k, own.own_n);
        run_moe1(&own, row_counts, n_counts, bound, w);
        /* lin stays: the backend keys its MoE tables by the arrays' addresses, which a later calloc could reuse */
    }
}

static void test_moe(void)
{
    const int counts[] = {1, 5, 16, 17, 40};
    { /* bf16 experts, d and I not multiples of 64 */
        const int E = 8, d = 72, I = 36; /* I: not a multiple of 8 (scalar loads) */
        sq_linear *gate = calloc(E, sizeof *gate), *upl = calloc(E, sizeof *upl), *dwn = calloc(E, sizeof *dwn);
        for (int e = 0; e < E; e++) {
            gate[e] = (sq_linear){.kind = SQ_LINEAR_BF16, .in = d, .out = I, .w = rand_weight(SQ_LINEAR_BF16, I, d)};
            upl[e] = (sq_linear){.kind = SQ_LINEAR_BF16, .in = d, .out = I, .w = rand_weight(SQ_LINEAR_BF16, I, d)};
            dwn[e] = (sq_linear){.kind = SQ_LINEAR_BF16, .in = I, .out = d, .w = rand_weight(SQ_LINEAR_BF16, d, I)};
        }
        sq_linear router = {.kind = SQ_LINEAR_BF16, .in = d, .out = E, .w = rand_weight(SQ_LINEAR_BF16, E, d)};
        sq_moe_layer ml = {.n_exp = E, .top_k = 2, .norm_topk = true, .router = &router, .gate = gate, .up = upl,
                           .down = dwn};
        run_moe(&ml, counts, 5, 1e-11, "bf16");
    }
    { /* EXL3 experts: fused path (≤ 16 rows) and grouped path (more) */
        const int E = 4, d = 256, I = 128;
        sq_linear *gate = calloc(E, sizeof *gate), *upl = calloc(E, sizeof *upl), *dwn = calloc(E, sizeof *dwn);
        for (int e = 0; e < E; e++) {
            gate[e] = exl3_linear(d, I, 3, TRELLIS_CB_MUL1);
            upl[e] = exl3_linear(d, I, 3, TRELLIS_CB_MUL1);
            dwn[e] = exl3_linear(I, d, 3, TRELLIS_CB_MUL1);
        }
        sq_linear router = {.kind = SQ_LINEAR_BF16, .in = d, .out = E, .w = rand_weight(SQ_LINEAR_BF16, E, d)};
        sq_moe_layer ml = {.n_exp = E, .top_k = 2, .norm_topk = false, .router = &router, .gate = gate, .up = upl,
                           .down = dwn};
        run_moe(&ml, counts, 5, 1e-5, "exl3");
    }
    /* EXL3 experts at a real router's width: 128 and 100 experts (top-k
     * lanes past n_exp), top-8, both renormalisations, the router's rows in
     * equal pairs so that half the logits tie (ties to the lower expert, as
     * the CPU); fused path to 16 rows, grouped beyond. */
    static const int shapes[][3] = {{128, 8, 1}, {100, 8, 0}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int E = shapes[c][0], d = 128, I = 128;
        sq_linear *gate = calloc(E, sizeof *gate), *upl = calloc(E, sizeof *upl), *dwn = calloc(E, sizeof *dwn);
        for (int e = 0; e < E; e++) {
            gate[e] = exl3_linear(d, I, 3, TRELLIS_CB_MUL1);
            upl[e] = exl3_linear(d, I, 3, TRELLIS_CB_MUL1);
            dwn[e] = exl3_linear(I, d, 3, TRELLIS_CB_MUL1);
        }
        uint16_t *rw = rand_weight(SQ_LINEAR_BF16, E, d);
        for (int e = 1; e < E; e += 2) memcpy(rw + (size_t)e * d, rw + (size_t)(e - 1) * d, (size_t)d * 2);
        sq_linear router = {.kind = SQ_LINEAR_BF16, .in = d, .out = E, .w = rw};
        sq_moe_layer ml = {.n_exp = E, .top_k = shapes[c][1], .norm_topk = shapes[c][2] != 0, .router = &router,
                           .gate = gate, .up = upl, .down = dwn};
        char what[48];
        snprintf(what, sizeof what, "exl3, %d experts top-%d", E, shapes[c][1]);
        run_moe(&ml, counts, 5, 1e-5, what);
    }
}

int main(void)
{
    const char *why = "";
    if (gpu_probe_count(&why) == 0) T_SKIP("gpu suite skipped: %s", why);
    if (sq_exec_create(&cpu, 2) != SPARQ_OK || sq_exec_reserve(cpu, sq_exec_scratch_floats(512, 512)) != SPARQ_OK ||
        sq_exec_create_cuda(&gpu, 1) != SPARQ_OK) {
        fprintf(stderr, "%s\n", sparq_errmsg());
        return 1;
    }
    RUN(test_linear_dense);
    RUN(test_linear_exl3);
    RUN(test_rmsnorm_rope_swiglu_axpy);
    RUN(test_add_rmsnorm);
    RUN(test_linear_add_rmsnorm);
    RUN(test_attention_kv);
    RUN(test_attention_split);
    RUN(test_attention_prefill);
    RUN(test_attn_front);
    RUN(test_router_embed);
    RUN(test_moe);
    CHECK(gpu->be->sync(gpu) == SPARQ_OK);
    sq_exec_free(gpu);
    sq_exec_free(cpu);
    return t_summary();
}
