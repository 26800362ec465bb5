/* kernels/cpu/ops.c — the CPU backend: every op of kernels/backend.h in
 * plain C, with AVX2/FMA/F16C inner loops where the CPU has them.
 *
 * Linear layers, the only heavy op:
 *  - few rows (decode, ≤ SQ_CPU_GEMV_MAX_ROWS): a GEMV that reads each bf16 /
 *    fp16 weight row once, widening lanes to fp32 in registers; items are
 *    blocks of output rows spread over the pool.
 *  - many rows (prefill, calibration): each pool item converts a tile of
 *    SQ_CPU_GEMM_TILE weight rows to fp32 into its thread's scratch and calls
 *    single-threaded cblas_sgemm on it, so OpenBLAS never starts threads of its
 *    own that would fight the pool, and weights stay bf16 in the mmap.
 * FP8 and MXFP4 weights (ops_fp8.c) have a GEMV of their own and share the
 * GEMM, which asks sq_cpu_block_to_f32 for their fp32 tiles.
 * The SIMD variants are compiled with function-level target attributes and
 * picked at run time (cpuid), so one binary runs on any x86-64 and on other
 * architectures the scalar code is used. Reductions have a fixed order for a
 * given path, so results do not depend on the thread count. */
#include "kernels/cpu/ops.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/ops_topk.h"

/* --- SIMD detection -------------------------------------------------------- */

static atomic_int force_scalar_;

bool sq_cpu_have_avx2(void)
{
#if SQ_X86
    static int have = -1;
    if (have < 0) {
        /* avx2/fma through the compiler (it also checks the OS saves YMM state);
         * F16C from CPUID leaf 1, ECX bit 29 (clang has no "f16c" feature string) */
        unsigned a = 0, b = 0, c = 0, d = 0;
        __builtin_cpu_init();
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    }
    return have;
#else
    return false;
#endif
}

void sq_cpu_force_scalar(bool on) { atomic_store(&force_scalar_, on ? 1 : 0); }

static inline bool use_avx2(void) { return !atomic_load_explicit(&force_scalar_, memory_order_relaxed) && sq_cpu_have_avx2(); }

bool sq_cpu_use_avx2(void) { return use_avx2(); }

/* --- scalar kernels ------------------------------------------------------------ */

/* Eight partial sums in a fixed order (not the SIMD path's association, but
 * deterministic), enough ILP for the compiler. LOAD(w, i) widens weight i. */
#define SQ_DOT_SCALAR(fname, wtype, LOAD)                                                    \
    static float fname(const float *x, const wtype *w, size_t n)                            \
    {                                                                                       \
        float s[8] = {0};                                                                   \
        size_t i = 0;                                                                       \
        for (; i + 8 <= n; i += 8)                                                          \
            for (int j = 0; j < 8; j++) s[j] += x[i + j] * LOAD(w, i + j);                  \
        float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));        \
        for (; i < n; i++) t += x[i] * LOAD(w, i);                                          \
        return t;                                                                           \
    }
#define LOAD_F32(w, i) ((w)[i])
#define LOAD_BF16(w, i) sparq_bf16_to_f32((w)[i])
#define LOAD_F16(w, i) sparq_f16_to_f32((w)[i])
SQ_DOT_SCALAR(dot_f32_scalar, float, LOAD_F32)
SQ_DOT_SCALAR(dot_bf16_scalar, uint16_t, LOAD_BF16)
SQ_DOT_SCALAR(dot_f16_scalar, uint16_t, LOAD_F16)

/* --- AVX2 kernels -------------------------------------------------------------- */

#if SQ_X86

SQ_AVX2 static inline __m256 load_bf16x8(const uint16_t *w)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

SQ_AVX2 static inline __m256 load_f16x8(const uint16_t *w)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
}

SQ_AVX2 static inline __m256 load_f32x8(const float *w) { return _mm256_loadu_ps(w); }

/* Two 8-lane FMA accumulators, then a scalar tail. LOAD8 widens 8 weights,
 * LOAD1 one. */
#define SQ_DOT_AVX2(fname, wtype, LOAD8, LOAD1)                                              \
    SQ_AVX2 static float fname(const float *x, const wtype *w, size_t n)                    \
    {                                                                                       \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                          \
        size_t i = 0;                                                                       \
        for (; i + 16 <= n; i += 16) {                                                      \
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), LOAD8(w + i), a0);                 \
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), LOAD8(w + i + 8), a1);         \
        }                                                                                   \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), LOAD8(w + i), a0); \
        float t = sq_hsum256(_mm256_add_ps(a0, a1));                                        \
        for (; i < n; i++) t += x[i] * LOAD1(w, i);                                         \
        return t;                                                                           \
    }
SQ_DOT_AVX2(dot_f32_avx2, float, load_f32x8, LOAD_F32)
SQ_DOT_AVX2(dot_bf16_avx2, uint16_t, load_bf16x8, LOAD_BF16)
SQ_DOT_AVX2(dot_f16_avx2, uint16_t, load_f16x8, LOAD_F16)

/* Four weight rows (stride `ld` elements) against one x, with each row's sums
 * associated exactly as dot_bf16_avx2 does (so results are identical), but
 * four independent streams and eight accumulators in flight: the decode GEMV
 * is then bound by memory, not by the FMA latency chain of one row. */
SQ_AVX2 static void dot4_bf16_avx2(const float *x, const uint16_t *w, size_t ld, size_t n, float *out)
{
    __m256 a[4][2];
    for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int r = 0; r < 4; r++) {
            a[r][0] = _mm256_fmadd_ps(x0, load_bf16x8(w + r * ld + i), a[r][0]);
            a[r][1] = _mm256_fmadd_ps(x1, load_bf16x8(w + r * ld + i + 8), a[r][1]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 x0 = _mm256_loadu_ps(x + i);
        for (int r = 0; r < 4; r++) a[r][0] = _mm256_fmadd_ps(x0, load_bf16x8(w + r * ld + i), a[r][0]);
    }
    for (int r = 0; r < 4; r++) {
        float t = sq_hsum256(_mm256_add_ps(a[r][0], a[r][1]));
        for (size_t k = i; k < n; k++) t += x[k] * sparq_bf16_to_f32(w[r * ld + k]);
        out[r] = t;
    }
}

SQ_AVX2 static void bf16_to_f32_avx2(const uint16_t *w, size_t n, float *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_bf16x8(w + i));
    for (; i < n; i++) out[i] = sparq_bf16_to_f32(w[i]);
}

SQ_AVX2 static void f16_to_f32_avx2(const uint16_t *w, size_t n, float *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_f16x8(w + i));
    for (; i < n; i++) out[i] = sparq_f16_to_f32(w[i]);
}

SQ_AVX2 static void axpy_avx2(float a, const float *x, size_t n, float *y)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

/* --- dispatch ---------------------------------------------------------------- */

float sq_cpu_dot_f32(const float *x, const float *w, size_t n)
{
#if SQ_X86
    if (use_avx2()) return dot_f32_avx2(x, w, n);
#endif
    return dot_f32_scalar(x, w, n);
}

float sq_cpu_dot_bf16(const float *x, const uint16_t *w, size_t n)
{
#if SQ_X86
    if (use_avx2()) return dot_bf16_avx2(x, w, n);
#endif
    return dot_bf16_scalar(x, w, n);
}

float sq_cpu_dot_f16(const float *x, const uint16_t *w, size_t n)
{
#if SQ_X86
    if (use_avx2()) return dot_f16_avx2(x, w, n);
#endif
    return dot_f16_scalar(x, w, n);
}

void sq_cpu_to_f32(sq_linear_kind kind, const void *w, size_t n, float *out)
{
    const uint16_t *h = w;
    switch (kind) {
    case SQ_LINEAR_F32: memcpy(out, w, n * sizeof(float)); return;
    case SQ_LINEAR_BF16:
#if SQ_X86
        if (use_avx2()) {
            bf16_to_f32_avx2(h, n, out);
            return;
        }
#endif
        for (size_t i = 0; i < n; i++) out[i] = sparq_bf16_to_f32(h[i]);
        return;
    case SQ_LINEAR_F16:
#if SQ_X86
        if (use_avx2()) {
            f16_to_f32_avx2(h, n, out);
            return;
        }
#endif
        for (size_t i = 0; i < n; i++) out[i] = sparq_f16_to_f32(h[i]);
        return;
    default: return; /* not a dense kind: callers check */
    }
}

static void axpy_any(float a, const float *x, size_t n, float *y)
{
#if SQ_X86
    if (use_avx2()) {
        axpy_avx2(a, x, n, y);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

static size_t elem_size(sq_linear_kind k) { return k == SQ_LINEAR_F32 ? 4 : 2; }

/* --- linear ------------------------------------------------------------------ */

typedef struct {
    sq_exec *ex;
    const sq_linear *l;
    const float *x;
    int rows;
    float *y;
    int block;
} lin_job;

#define GEMV_BLOCK 16

static void gemv_item(void *ctx, size_t item, int tid)
{
    (void)tid;
    const lin_job *j = ctx;
    const sq_linear *l = j->l;
    const size_t in = (size_t)l->in, out = (size_t)l->out;
    size_t o0 = item * GEMV_BLOCK, o1 = o0 + GEMV_BLOCK < out ? o0 + GEMV_BLOCK : out;
#if SQ_X86
    if (l->kind == SQ_LINEAR_BF16 && use_avx2()) {
        /* four output rows at a time (same numbers as one at a time) */
        for (; o0 + 4 <= o1; o0 += 4)
            for (int r = 0; r < j->rows; r++) {
                float d[4];
                dot4_bf16_avx2(j->x + (size_t)r * in, (const uint16_t *)l->w + o0 * in, in, in, d);
                for (int q = 0; q < 4; q++) j->y[(size_t)r * out + o0 + q] = d[q] + (l->bias ? l->bias[o0 + q] : 0.0f);
            }
    }
#endif
    for (size_t o = o0; o < o1; o++) {
        const char *wrow = (const char *)l->w + o * in * elem_size(l->kind);
        for (int r = 0; r < j->rows; r++) {
            const float *xr = j->x + (size_t)r * in;
            float d;
            if (l->kind == SQ_LINEAR_BF16) d = sq_cpu_dot_bf16(xr, (const uint16_t *)wrow, in);
            else if (l->kind == SQ_LINEAR_F16) d = sq_cpu_dot_f16(xr, (const uint16_t *)wrow, in);
            else d = sq_cpu_dot_f32(xr, (const float *)wrow, in);
            j->y[(size_t)r * out + o] = d + (l->bias ? l->bias[o] : 0.0f);
        }
    }
}

static void gemm_item(void *ctx, size_t item, int tid)
{
    const lin_job *j = ctx;
    const sq_linear *l = j->l;
    const size_t in = (size_t)l->in, out = (size_t)l->out;
    size_t o0 = item * SQ_CPU_GEMM_TILE;
    size_t nt = o0 + SQ_CPU_GEMM_TILE < out ? SQ_CPU_GEMM_TILE : out - o0;
    const float *wt;
    if (l->kind == SQ_LINEAR_F32) {
        wt = (const float *)l->w + o0 * in;
    } else {
        float *s = j->ex->scratch[tid];
        if (l->kind == SQ_LINEAR_FP8 || l->kind == SQ_LINEAR_MXFP4) sq_cpu_block_to_f32(l, (int)o0, (int)nt, s);
        else sq_cpu_to_f32(l->kind, (const char *)l->w + o0 * in * 2, nt * in, s);
        wt = s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->rows, (int)nt, (int)in, 1.0f, j->x, (int)in, wt,
                (int)in, 0.0f, j->y + o0, (int)out);
    if (l->bias)
        for (int r = 0; r < j->rows; r++)
            for (size_t o = o0; o < o0 + nt; o++) j->y[(size_t)r * out + o] += l->bias[o];
}

static void cpu_linear(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    if (rows <= 0) return;
    lin_job j = {ex, l, x, rows, y, 0};
    size_t out = (size_t)l->out;
    const bool blocks = l->kind == SQ_LINEAR_FP8 || l->kind == SQ_LINEAR_MXFP4;
    if (blocks && rows <= SQ_CPU_BLOCK_GEMV_MAX_ROWS) {
        sq_cpu_block_gemv(ex, l, x, rows, y);
    } else if (!blocks && rows <= SQ_CPU_GEMV_MAX_ROWS) {
        const size_t items = (out + GEMV_BLOCK - 1) / GEMV_BLOCK;
        /* a small GEMV costs less than waking the pool: run it on this thread */
        if ((size_t)rows * (size_t)l->in * out < SQ_CPU_SERIAL_MACS) {
            for (size_t i = 0; i < items; i++) gemv_item(&j, i, 0);
            return;
        }
        sparq_pool_for(ex->pool, items, gemv_item, &j);
    } else {
        sparq_pool_for(ex->pool, (out + SQ_CPU_GEMM_TILE - 1) / SQ_CPU_GEMM_TILE, gemm_item, &j);
    }
}

/* --- rmsnorm ------------------------------------------------------------------- */

typedef struct {
    const float *x; /* rmsnorm's input; with h: the vectors added to h first */
    float *h;       /* add_rmsnorm's residual (NULL: plain rmsnorm of x) */
    int dim;
    const float *w;
    float eps;
    float *y;
} norm_job;

static void rmsnorm_row(const float *x, int dim, const float *w, float eps, float *y)
{
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = 0; i < dim; i++) y[i] = w[i] * (x[i] * inv);
}

static void norm_item(void *ctx, size_t r, int tid)
{
    (void)tid;
    const norm_job *j = ctx;
    const size_t dim = (size_t)j->dim;
    const float *x = j->x + r * dim;
    if (j->h) { /* h + x rounds as axpy's fmaf(1, x, h) does: one rounding */
        float *h = j->h + r * dim;
        for (size_t i = 0; i < dim; i++) h[i] += x[i];
        x = h;
    }
    rmsnorm_row(x, j->dim, j->w, j->eps, j->y + r * dim);
}

static void norm_rows(sq_exec *ex, norm_job *j, int rows)
{
    if (rows < 64) {
        for (int r = 0; r < rows; r++) norm_item(j, (size_t)r, 0);
        return;
    }
    sparq_pool_for(ex->pool, (size_t)rows, norm_item, j);
}

static void cpu_rmsnorm(sq_exec *ex, const float *x, int rows, int dim, const float *w, float eps, float *y)
{
    norm_rows(ex, &(norm_job){x, NULL, dim, w, eps, y}, rows);
}

static void cpu_add_rmsnorm(sq_exec *ex, const float *x, float *h, int rows, int dim, const float *w, float eps,
                            float *y)
{
    norm_rows(ex, &(norm_job){x, h, dim, w, eps, y}, rows);
}

/* --- rope ------------------------------------------------------------------------ */

static void cpu_rope(sq_exec *ex, float *x, int rows, int n_heads, int head_dim, const int *pos,
                     const float *inv_freq)
{
    (void)ex;
    const int half = head_dim / 2;
    for (int r = 0; r < rows; r++) {
        float c[512], s[512]; /* head_dim ≤ 1024 is checked at model load */
        for (int i = 0; i < half; i++) {
            float f = (float)pos[r] * inv_freq[i];
            c[i] = cosf(f);
            s[i] = sinf(f);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)r * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* --- attention --------------------------------------------------------------------- */

typedef struct {
    sq_exec *ex;
    const float *q, *k, *v;
    int n_heads, n_kv, hd;
    const int *kv_first, *kv_len;
    float scale;
    float *out;
} attn_job;

static void attn_item(void *ctx, size_t item, int tid)
{
    const attn_job *j = ctx;
    const int r = (int)(item / (size_t)j->n_heads), h = (int)(item % (size_t)j->n_heads);
    const int g = h / (j->n_heads / j->n_kv);
    const size_t kvd = (size_t)j->n_kv * j->hd;
    const float *qh = j->q + ((size_t)r * j->n_heads + h) * j->hd;
    float *oh = j->out + ((size_t)r * j->n_heads + h) * j->hd;
    float *sc = j->ex->scratch[tid];
    const int n = j->kv_len[r];
    const float *kb = j->k + (size_t)j->kv_first[r] * kvd + (size_t)g * j->hd;
    const float *vb = j->v + (size_t)j->kv_first[r] * kvd + (size_t)g * j->hd;
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) {
        sc[t] = sq_cpu_dot_f32(qh, kb + (size_t)t * kvd, (size_t)j->hd) * j->scale;
        if (sc[t] > mx) mx = sc[t];
    }
    double sum = 0;
    for (int t = 0; t < n; t++) {
        sc[t] = expf(sc[t] - mx);
        sum += sc[t];
    }
    const float inv = (float)(1.0 / sum);
    memset(oh, 0, (size_t)j->hd * sizeof(float));
    for (int t = 0; t < n; t++) axpy_any(sc[t] * inv, vb + (size_t)t * kvd, (size_t)j->hd, oh);
}

static void cpu_attention(sq_exec *ex, const float *q, int rows, int n_heads, int n_kv, int hd, const float *k,
                          const float *v, const int *kv_first, const int *kv_len, float scale, float *out)
{
    attn_job j = {ex, q, k, v, n_heads, n_kv, hd, kv_first, kv_len, scale, out};
    size_t macs = 0;
    for (int r = 0; r < rows; r++) macs += (size_t)kv_len[r] * (size_t)n_heads * (size_t)hd * 2;
    if (macs < SQ_CPU_SERIAL_MACS) { /* decode at a short context: not worth waking the pool */
        for (size_t i = 0; i < (size_t)rows * (size_t)n_heads; i++) attn_item(&j, i, 0);
        return;
    }
    sparq_pool_for(ex->pool, (size_t)rows * (size_t)n_heads, attn_item, &j);
}

/* --- router -------------------------------------------------------------------------- */

static void cpu_router_topk(sq_exec *ex, const float *logits, int rows, int n_exp, int k, bool norm, int *idx,
                            float *w)
{
    (void)ex;
    for (int r = 0; r < rows; r++)
        sq_topk_row(logits + (size_t)r * n_exp, n_exp, k, norm, idx + (size_t)r * k, w + (size_t)r * k);
}

/* --- elementwise ----------------------------------------------------------------------- */

static void cpu_swiglu(sq_exec *ex, const float *gate, const float *up, size_t n, float *out)
{
    (void)ex;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_axpy(sq_exec *ex, float a, const float *x, size_t n, float *y)
{
    (void)ex;
    axpy_any(a, x, n, y);
}

static void cpu_sum_parts(sq_exec *ex, const float *parts, int n_parts, size_t n, float *out)
{
    (void)ex;
    if (n_parts < 1) return;
    memcpy(out, parts, n * sizeof(float));
    for (int r = 1; r < n_parts; r++) {
        const float *p = parts + (size_t)r * n;
        for (size_t i = 0; i < n; i++) out[i] += p[i];
    }
}

/* --- memory and former graph steps (host memory: plain copies) ------------------------------- */

static void *cpu_alloc(sq_exec *ex, size_t bytes)
{
    (void)ex;
    return sparq_aligned_alloc(64, bytes ? bytes : 64);
}

static void cpu_free(sq_exec *ex, void *p)
{
    (void)ex;
    sparq_aligned_free(p);
}

static sparq_status cpu_to_host(sq_exec *ex, void *host, const void *mem, size_t bytes)
{
    (void)ex;
    if (host != mem && bytes) memmove(host, mem, bytes);
    return SPARQ_OK;
}

static sparq_status cpu_to_device(sq_exec *ex, void *mem, const void *host, size_t bytes)
{
    return cpu_to_host(ex, mem, host, bytes);
}

static sparq_status cpu_sync(sq_exec *ex) { return sq_exec_take_error(ex); }

static sparq_status cpu_prepare(sq_exec *ex, const void *host, size_t bytes)
{
    (void)ex, (void)host, (void)bytes;
    return SPARQ_OK;
}

static sparq_status cpu_prepare_linear(sq_exec *ex, const sq_linear *l)
{
    (void)ex, (void)l;
    return SPARQ_OK;
}

static void cpu_embed(sq_exec *ex, sq_linear_kind kind, const void *table, int d, const int32_t *tokens, int n,
                      float *hidden)
{
    (void)ex;
    const size_t es = kind == SQ_LINEAR_F32 ? 4 : 2;
    for (int i = 0; i < n; i++)
        sq_cpu_to_f32(kind, (const char *)table + (size_t)tokens[i] * (size_t)d * es, (size_t)d,
                      hidden + (size_t)i * d);
}

static void cpu_kv_store(sq_exec *ex, const float *k, const float *v, int rows, size_t width, const int *kv_first,
                         const int *pos, float *kc, float *vc)
{
    (void)ex;
    for (int r = 0; r < rows; r++) {
        const size_t at = ((size_t)kv_first[r] + (size_t)pos[r]) * width;
        memcpy(kc + at, k + (size_t)r * width, width * sizeof(float));
        memcpy(vc + at, v + (size_t)r * width, width * sizeof(float));
    }
}

static const sq_backend cpu_backend = {
    .name = "cpu",
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .router_topk = cpu_router_topk,
    .swiglu = cpu_swiglu,
    .axpy = cpu_axpy,
    .sum_parts = cpu_sum_parts,
    .add_rmsnorm = cpu_add_rmsnorm,
    .device = false,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_to_host,
    .to_device = cpu_to_device,
    .sync = cpu_sync,
    .prepare = cpu_prepare,
    .prepare_linear = cpu_prepare_linear,
    .embed = cpu_embed,
    .kv_store = cpu_kv_store,
    .moe = NULL, /* the graph runs the MoE on the host (runtime/models/qwen3moe.c) */
    .prepare_moe = NULL,
    .sample_select = sq_cpu_sample_select,
};

const sq_backend *sq_backend_cpu(void) { return &cpu_backend; }

const char *sq_linear_kind_name(sq_linear_kind k)
{
    static const char *const names[] = {"f32", "bf16", "f16", "exl3", "fp8", "mxfp4"};
    _Static_assert(sizeof names / sizeof names[0] == SQ_LINEAR_KIND_COUNT_, "a name for every kind");
    return (unsigned)k < SQ_LINEAR_KIND_COUNT_ ? names[k] : "?";
}

/* --- exec ------------------------------------------------------------------------------------ */

size_t sq_exec_scratch_floats(int max_in, int max_ctx)
{
    size_t a = (size_t)SQ_CPU_GEMM_TILE * (size_t)(max_in > 0 ? max_in : 0);
    size_t b = (size_t)(max_ctx > 0 ? max_ctx : 0);
    return a > b ? a : b;
}

sparq_status sq_exec_create(sq_exec **out, int n_threads)
{
    *out = NULL;
    sq_exec *ex = sparq_calloc(1, sizeof *ex);
    RETURN_IF(!ex, SPARQ_E_NOMEM, "exec: out of memory");
    ex->be = sq_backend_cpu();
    sparq_status st = sparq_pool_create(&ex->pool, n_threads);
    if (st != SPARQ_OK) {
        sparq_free(ex);
        return st;
    }
    ex->n_threads = sparq_pool_size(ex->pool);
    ex->scratch = sparq_calloc((size_t)ex->n_threads, sizeof *ex->scratch);
    if (!ex->scratch) {
        sq_exec_free(ex);
        return sparq_err(SPARQ_E_NOMEM, "exec: out of memory");
    }
    openblas_set_num_threads(1);
    *out = ex;
    return SPARQ_OK;
}

sparq_status sq_exec_reserve(sq_exec *ex, size_t floats)
{
    if (floats <= ex->scratch_floats) return SPARQ_OK;
    for (int t = 0; t < ex->n_threads; t++) {
        sparq_aligned_free(ex->scratch[t]);
        ex->scratch[t] = sparq_aligned_alloc(64, floats * sizeof(float));
        if (!ex->scratch[t]) {
            ex->scratch_floats = 0;
            for (int u = 0; u < t; u++) {
                sparq_aligned_free(ex->scratch[u]);
                ex->scratch[u] = NULL;
            }
            return sparq_err(SPARQ_E_NOMEM, "exec: cannot allocate %zu floats of scratch per thread", floats);
        }
    }
    ex->scratch_floats = floats;
    return SPARQ_OK;
}

void sq_exec_free(sq_exec *ex)
{
    if (!ex) return;
    if (ex->be && ex->be->exec_free) ex->be->exec_free(ex);
    if (ex->scratch)
        for (int t = 0; t < ex->n_threads; t++) sparq_aligned_free(ex->scratch[t]);
    sparq_free(ex->scratch);
    sparq_pool_free(ex->pool);
    sparq_free(ex);
}
