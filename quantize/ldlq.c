/* quantize/ldlq.c — calibrated EXL3 quantization of one linear (see ldlq.h
 * for the algorithm). Dense linear algebra goes through OpenBLAS/LAPACK
 * (spotrf for the Cholesky factor, strsm/sgemm for the block LDL and the
 * error feedback); the tile searches go through quantize/viterbi.h over the
 * caller's thread pool.
 *
 * Notation: W is k×n (in×out). The regularised weight is
 *   Wr = g · Had_k · diag(1/su0) · Had ... — concretely, in order:
 *   W ← W ⊘ sv (per column); W ← W·Had (rows); W ← W ⊘ su (per row);
 *   W ← Had·W (columns); W ← g·W, su ← su / g,
 * so that W_orig = diag(su)·Had·Wr·Had·diag(sv) and the stored tensors are
 * suh = fp16(su), svh = fp16(sv). The Hessian is rotated with the same su
 * signs: Hr = Had·diag(s)·H·diag(s)·Had. */
#include "quantize/ldlq.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "quantize/hadamard.h"

/* LAPACK (Fortran ABI, provided by OpenBLAS). */
extern void spotrf_(const char *uplo, const int *n, float *a, const int *lda, int *info);

struct ldlq_hessian {
    int k;
    bool identity;
    float damping;
    float *hr;     /* k×k: the damped, rotated H (NULL for identity) */
    float *l;      /* k×k: block-unit-lower L of Hr = L·D·Lᵀ (NULL for identity) */
    float *d_diag; /* k: diagonal of the block-diagonal D (NULL for identity) */
    float *su;     /* k: input signs ±1 */
    float *h_diag; /* k: diagonal of the damped (unrotated) H, for the out-scale rule */
};

/* --- small helpers ---------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ldlq_random_signs(float *s, int n, uint64_t seed)
{
    uint64_t st = seed ^ 0x5EED5EED5EED5EEDull;
    for (int i = 0; i < n; i++) s[i] = (splitmix64(&st) >> 63) ? -1.0f : 1.0f;
}

void ldlq_opts_default(ldlq_opts *o, int K)
{
    memset(o, 0, sizeof *o);
    o->K = K;
    o->cb = TRELLIS_CB_MUL1;
    o->seed = 0;
    o->out_scales = -1;
    o->weighted = false;
}

double ldlq_default_g(int K, trellis_codebook cb)
{
    /* mul1: the search's results on the golden 512x256 case (sparq's run, seed 1234). */
    static const double mul1[TRELLIS_K_MAX + 1] = {0, 0.843, 0.786, 0.754, 0.733, 0.713, 0.695, 0.672, 0.649};
    if (K < 1 || K > TRELLIS_K_MAX) return 1.0;
    /* 3inst and mcg have RMS 1.24 like the codebook scale: the scale comes out near 0.94 at K = 3. */
    return cb == TRELLIS_CB_MUL1 ? mul1[K] : mul1[K] * 1.25;
}

int ldlq_hessian_k(const ldlq_hessian *hs) { return hs->k; }
bool ldlq_hessian_is_identity(const ldlq_hessian *hs) { return hs->identity; }
float ldlq_hessian_damping(const ldlq_hessian *hs) { return hs->damping; }
const float *ldlq_hessian_hr(const ldlq_hessian *hs) { return hs->hr; }
const float *ldlq_hessian_l(const ldlq_hessian *hs) { return hs->l; }
const float *ldlq_hessian_d(const ldlq_hessian *hs) { return hs->d_diag; }
const float *ldlq_hessian_su(const ldlq_hessian *hs) { return hs->su; }

void ldlq_hessian_free(ldlq_hessian *hs)
{
    if (!hs) return;
    sparq_aligned_free(hs->hr);
    sparq_aligned_free(hs->l);
    sparq_free(hs->d_diag);
    sparq_free(hs->su);
    sparq_free(hs->h_diag);
    sparq_free(hs);
}

/* --- Hessian ------------------------------------------------------------------ */

/* Factor hr (k×k, symmetric positive definite) into l (block-unit-lower) and
 * diag(D). Returns false when Cholesky fails. */
static bool block_ldl(const float *hr, int k, float *l, float *d_diag)
{
    memcpy(l, hr, (size_t)k * k * sizeof *l);
    int info = 0, kk = k;
    /* Row-major symmetric = column-major symmetric; 'U' in column-major is the
     * lower triangle C of the row-major array with Hr = C·Cᵀ. */
    spotrf_("U", &kk, l, &kk, &info);
    if (info != 0) return false;
    for (int r = 0; r < k; r++)
        for (int c = r + 1; c < k; c++) l[(size_t)r * k + c] = 0.0f;
    for (int b = 0; b < k; b += 16) {
        /* D_i = DL·DLᵀ (diagonal only); L[below, blk] ← C[below, blk]·DL⁻¹. */
        for (int r = 0; r < 16; r++) {
            double s = 0.0;
            for (int c = 0; c <= r; c++) {
                double v = l[(size_t)(b + r) * k + b + c];
                s += v * v;
            }
            d_diag[b + r] = (float)s;
        }
        int rest = k - b - 16;
        if (rest > 0)
            cblas_strsm(CblasRowMajor, CblasRight, CblasLower, CblasNoTrans, CblasNonUnit, rest, 16, 1.0f,
                        l + (size_t)b * k + b, k, l + (size_t)(b + 16) * k + b, k);
    }
    /* Unit diagonal blocks (the strict upper part of each block is already 0). */
    for (int b = 0; b < k; b += 16)
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) l[(size_t)(b + r) * k + b + c] = (r == c) ? 1.0f : 0.0f;
    return true;
}

sparq_status ldlq_hessian_prepare(ldlq_hessian **out, const float *h, int k, float sigma_reg, uint64_t seed,
                                  const char *name)
{
    *out = NULL;
    RETURN_IF(k <= 0 || k % 128 != 0, SPARQ_E_SHAPE, "%s: input size %d is not a multiple of 128", name, k);
    if (sigma_reg <= 0.0f) sigma_reg = LDLQ_SIGMA_REG;
    ldlq_hessian *hs = sparq_calloc(1, sizeof *hs);
    RETURN_IF(!hs, SPARQ_E_NOMEM, "%s: out of memory for the Hessian", name);
    hs->k = k;
    hs->su = sparq_malloc((size_t)k * sizeof(float));
    hs->h_diag = sparq_malloc((size_t)k * sizeof(float));
    if (!hs->su || !hs->h_diag) goto nomem;
    ldlq_random_signs(hs->su, k, seed);

    double diag_mean = 0.0;
    bool finite = true;
    if (h) {
        for (int i = 0; i < k; i++) diag_mean += h[(size_t)i * k + i];
        diag_mean /= k;
        for (size_t i = 0; i < (size_t)k * k && finite; i++) finite = isfinite(h[i]);
    }
    if (!h || !finite || !(diag_mean > 1e-20)) {
        /* Identity: no calibration (or nothing usable) — plain tile quantization. */
        hs->identity = true;
        for (int i = 0; i < k; i++) hs->h_diag[i] = 1.0f;
        *out = hs;
        return SPARQ_OK;
    }

    size_t kk = (size_t)k * k;
    hs->hr = sparq_aligned_alloc(64, kk * sizeof(float));
    hs->l = sparq_aligned_alloc(64, kk * sizeof(float));
    hs->d_diag = sparq_malloc((size_t)k * sizeof(float));
    if (!hs->hr || !hs->l || !hs->d_diag) goto nomem;

    float damp = sigma_reg;
    for (int attempt = 0; attempt < 9; attempt++, damp *= 4.0f) {
        /* Hr = Had·diag(s)·(H + damp·mean·I)·diag(s)·Had */
        float add = (float)(damp * diag_mean);
        for (int r = 0; r < k; r++) {
            const float *hrow = h + (size_t)r * k;
            float *dst = hs->hr + (size_t)r * k;
            float sr = hs->su[r];
            for (int c = 0; c < k; c++) dst[c] = hrow[c] * sr * hs->su[c];
            dst[r] += add;
            hs->h_diag[r] = hrow[r] + add;
        }
        sparq_status st = hadamard_right(hs->hr, (size_t)k, (size_t)k);
        if (st == SPARQ_OK) st = hadamard_left(hs->hr, (size_t)k, (size_t)k);
        if (st != SPARQ_OK) {
            ldlq_hessian_free(hs);
            return sparq_err_context(st, "%s", name);
        }
        if (block_ldl(hs->hr, k, hs->l, hs->d_diag)) {
            hs->damping = damp;
            *out = hs;
            return SPARQ_OK;
        }
    }
    ldlq_hessian_free(hs);
    return sparq_err(SPARQ_E_FORMAT, "%s: Hessian is not positive definite even with damping %.3g x mean(diag)",
                     name, (double)(damp / 4.0f));
nomem:
    ldlq_hessian_free(hs);
    return sparq_err(SPARQ_E_NOMEM, "%s: out of memory preparing a %d x %d Hessian", name, k, k);
}

sparq_status ldlq_hessian_wrap(ldlq_hessian **out, int k, const float *su, const float *h_diag, bool identity,
                               float damping)
{
    *out = NULL;
    ldlq_hessian *hs = sparq_calloc(1, sizeof *hs);
    RETURN_IF(!hs, SPARQ_E_NOMEM, "out of memory for a Hessian");
    hs->k = k;
    hs->identity = identity;
    hs->damping = damping;
    hs->su = sparq_malloc((size_t)k * sizeof(float));
    hs->h_diag = sparq_malloc((size_t)k * sizeof(float));
    if (!hs->su || !hs->h_diag) {
        ldlq_hessian_free(hs);
        return sparq_err(SPARQ_E_NOMEM, "out of memory for a Hessian");
    }
    memcpy(hs->su, su, (size_t)k * sizeof(float));
    memcpy(hs->h_diag, h_diag, (size_t)k * sizeof(float));
    *out = hs;
    return SPARQ_OK;
}

/* --- tiles ---------------------------------------------------------------------- */

/* Gather tile (ti, tj) of m (row stride n) into 256 values in stream order. */
static void tile_gather(const float *m, int n, int ti, int tj, float *t)
{
    const float *base = m + (size_t)ti * 16 * n + (size_t)tj * 16;
    for (int p = 0; p < 256; p++) t[p] = base[(size_t)trellis_pos_row(p) * n + trellis_pos_col(p)];
}

static void tile_scatter(float *m, int n, int ti, int tj, const float *t)
{
    float *base = m + (size_t)ti * 16 * n + (size_t)tj * 16;
    for (int p = 0; p < 256; p++) base[(size_t)trellis_pos_row(p) * n + trellis_pos_col(p)] = t[p];
}

/* Expected growth of the tiles the LDLQ recursion feeds the encoder over the
 * pre-feedback weight, by K (exllamav3's measured factors): the scale search
 * runs on the pre-feedback weight inflated by this much. */
static float ldlq_drift(int K)
{
    switch (K) {
    case 1: return 1.08f;
    case 2: return 1.018f;
    case 3: return 1.004f;
    default: return 1.0f;
    }
}

typedef struct tile_rms { float ms; int idx; } tile_rms;

static int cmp_tile_desc(const void *a, const void *b)
{
    const tile_rms *x = a, *y = b;
    if (x->ms != y->ms) return x->ms > y->ms ? -1 : 1;
    return x->idx - y->idx;
}

/* Sample tiles for the scale search: a wrapped diagonal `width` tiles wide
 * (every tile row and column at least once) plus the tiles of highest and
 * lowest RMS. Returns the count; *out (stream order, 256 each) is allocated. */
static sparq_status sample_scale_tiles(const ldlq_reg_engine *eng, void *m, int k, int n, float **out,
                                       size_t *count)
{
    const int width = 3;
    int tk = k / 16, tn = n / 16;
    int diag_len = tk > tn ? tk : tn;
    size_t n_tiles = (size_t)tk * tn;
    size_t num_x = (size_t)diag_len * width / 16;
    if (num_x < 8) num_x = 8;
    if (num_x > (n_tiles + 1) / 2) num_x = (n_tiles + 1) / 2;
    size_t total = (size_t)diag_len * width + 2 * num_x;
    float *t = sparq_malloc(total * 256 * sizeof(float));
    tile_rms *ms = sparq_malloc(n_tiles * sizeof *ms);
    double *sq = sparq_malloc(n_tiles * sizeof *sq);
    int *idx = sparq_malloc(total * sizeof *idx);
    sparq_status st = t && ms && sq && idx ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory sampling tiles");
    size_t c = 0;
    for (int ii = 0; ii < diag_len && st == SPARQ_OK; ii++)
        for (int ww = 0; ww < width; ww++) idx[c++] = (ii % tk) * tn + (ii + ww) % tn;
    if (st == SPARQ_OK) st = eng->tile_sumsq(eng->ctx, m, sq);
    if (st == SPARQ_OK) {
        for (size_t i = 0; i < n_tiles; i++) ms[i] = (tile_rms){(float)(sq[i] / 256.0), (int)i};
        qsort(ms, n_tiles, sizeof *ms, cmp_tile_desc);
        for (size_t i = 0; i < num_x; i++) idx[c++] = ms[i].idx;
        for (size_t i = 0; i < num_x; i++) idx[c++] = ms[n_tiles - 1 - i].idx;
        st = eng->tiles(eng->ctx, m, idx, c, t);
    }
    sparq_free(ms);
    sparq_free(sq);
    sparq_free(idx);
    if (st != SPARQ_OK) {
        sparq_free(t);
        return st;
    }
    *out = t;
    *count = c;
    return SPARQ_OK;
}

/* Mean squared error of quantizing tiles·s, measured back at scale 1. */
static sparq_status scale_mse(const ldlq_coder *coder, const float *tiles, size_t n_tiles, size_t stride, float s,
                              float *scratch, uint16_t *states, double *mse)
{
    size_t m = 0;
    for (size_t i = 0; i < n_tiles; i += stride, m++)
        for (int p = 0; p < 256; p++) scratch[m * 256 + p] = tiles[i * 256 + p] * s;
    float *dec = scratch + m * 256;
    FORWARD_IF(coder->encode(coder->ctx, scratch, m, states, dec));
    double e = 0.0;
    size_t j = 0;
    for (size_t i = 0; i < n_tiles; i += stride, j++)
        for (int p = 0; p < 256; p++) {
            double d = (double)dec[j * 256 + p] / s - tiles[i * 256 + p];
            e += d * d;
        }
    *mse = e / ((double)m * 256.0);
    return SPARQ_OK;
}

/* Global scale: coarse grid 0.1..1.9 on every third sample tile, a 5-point
 * fine grid (step 0.075) around the coarse minimum on all of them, then a
 * parabolic step clamped to ± half a grid step. */
static sparq_status g_scale_search(const ldlq_coder *coder, const ldlq_reg_engine *eng, void *m, int k, int n,
                                   int K, double *g_out, double *mse_out)
{
    float *tiles = NULL;
    size_t nt = 0;
    FORWARD_IF(sample_scale_tiles(eng, m, k, n, &tiles, &nt));
    float drift = ldlq_drift(K);
    for (size_t i = 0; i < nt * 256; i++) tiles[i] *= drift;
    float *scratch = sparq_malloc(nt * 2 * 256 * sizeof(float));
    uint16_t *states = sparq_malloc(nt * 256 * sizeof(uint16_t));
    sparq_status st = SPARQ_OK;
    if (!scratch || !states) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory in the scale search");
        goto done;
    }
    double best = INFINITY, center = 1.0;
    for (int i = 0; i < 10; i++) {
        double s = 0.1 + 0.2 * i, mse;
        st = scale_mse(coder, tiles, nt, 3, (float)s, scratch, states, &mse);
        if (st != SPARQ_OK) goto done;
        if (mse < best) best = mse, center = s;
    }
    const double step = 0.075;
    double y[5], sc[5];
    int bi = 0;
    for (int i = 0; i < 5; i++) {
        sc[i] = center + step * (i - 2);
        st = scale_mse(coder, tiles, nt, 1, (float)sc[i], scratch, states, &y[i]);
        if (st != SPARQ_OK) goto done;
        if (y[i] < y[bi]) bi = i;
    }
    double off = 0.0;
    if (bi > 0 && bi < 4) {
        double den = y[bi - 1] - 2.0 * y[bi] + y[bi + 1];
        off = den > 0 ? 0.5 * (y[bi - 1] - y[bi + 1]) / den : 0.0;
        if (off > 0.5) off = 0.5;
        if (off < -0.5) off = -0.5;
    }
    double g = sc[bi] + off * step;
    *g_out = g < 0.01 ? 0.01 : g;
    *mse_out = y[bi];
done:
    sparq_free(tiles);
    sparq_free(scratch);
    sparq_free(states);
    return st;
}

/* --- quantization ------------------------------------------------------------ */

double ldlq_proxy_err(const float *h, int k, const float *w, const float *wq, int n)
{
    size_t kn = (size_t)k * n;
    float *e = sparq_malloc(kn * sizeof(float));
    float *he = h ? sparq_malloc(kn * sizeof(float)) : NULL;
    if (!e || (h && !he)) {
        sparq_free(e);
        sparq_free(he);
        return -1.0;
    }
    double num = 0.0, den = 0.0;
    for (int pass = 0; pass < 2; pass++) {
        const float *x = w;
        if (pass == 0) {
            for (size_t i = 0; i < kn; i++) e[i] = w[i] - wq[i];
            x = e;
        }
        double acc = 0.0;
        if (h) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k, n, k, 1.0f, h, k, x, n, 0.0f, he, n);
            for (size_t i = 0; i < kn; i++) acc += (double)x[i] * he[i];
        } else {
            for (size_t i = 0; i < kn; i++) acc += (double)x[i] * x[i];
        }
        if (pass == 0) num = acc;
        else den = acc;
    }
    sparq_free(e);
    sparq_free(he);
    return num / (den > 1e-30 ? den : 1e-30);
}

/* --- the CPU engine (ldlq_reg_engine) ---------------------------------------- */

typedef struct cpu_mat {
    float *w;
    int k, n;
} cpu_mat;

static sparq_status cpu_load(void *ctx, const float *w, int k, int n, void **m)
{
    (void)ctx;
    cpu_mat *x = sparq_malloc(sizeof *x);
    float *c = sparq_aligned_alloc(64, (size_t)k * n * sizeof(float));
    if (!x || !c) {
        sparq_free(x);
        sparq_aligned_free(c);
        return sparq_err(SPARQ_E_NOMEM, "out of memory for a %d x %d weight", k, n);
    }
    memcpy(c, w, (size_t)k * n * sizeof(float));
    *x = (cpu_mat){c, k, n};
    *m = x;
    return SPARQ_OK;
}

static sparq_status cpu_sumsq(void *ctx, void *mv, int dim, double *out)
{
    (void)ctx;
    const cpu_mat *x = mv;
    const float *m = x->w;
    const int k = x->k, n = x->n;
    if (dim == 0) {
        for (int c = 0; c < n; c++) out[c] = 0.0;
        for (int r = 0; r < k; r++)
            for (int c = 0; c < n; c++) out[c] += (double)m[(size_t)r * n + c] * m[(size_t)r * n + c];
    } else {
        for (int r = 0; r < k; r++) {
            double s = 0.0;
            for (int c = 0; c < n; c++) s += (double)m[(size_t)r * n + c] * m[(size_t)r * n + c];
            out[r] = s;
        }
    }
    return SPARQ_OK;
}

static sparq_status cpu_scale_had(void *ctx, void *mv, int dim, const float *s)
{
    (void)ctx;
    const cpu_mat *x = mv;
    float *m = x->w;
    const int k = x->k, n = x->n;
    if (dim == 0) {
        for (int r = 0; r < k; r++)
            for (int c = 0; c < n; c++) m[(size_t)r * n + c] /= s[c];
        return hadamard_right(m, (size_t)k, (size_t)n);
    }
    for (int r = 0; r < k; r++)
        for (int c = 0; c < n; c++) m[(size_t)r * n + c] *= s[r];
    return hadamard_left(m, (size_t)k, (size_t)n);
}

static sparq_status cpu_tile_sumsq(void *ctx, void *mv, double *out)
{
    (void)ctx;
    const cpu_mat *x = mv;
    const int n = x->n, tk = x->k / 16, tn = n / 16;
    for (int ti = 0; ti < tk; ti++)
        for (int tj = 0; tj < tn; tj++) {
            const float *base = x->w + (size_t)ti * 16 * n + (size_t)tj * 16;
            double s = 0.0;
            for (int r = 0; r < 16; r++)
                for (int q = 0; q < 16; q++) s += (double)base[(size_t)r * n + q] * base[(size_t)r * n + q];
            out[(size_t)ti * tn + tj] = s;
        }
    return SPARQ_OK;
}

static sparq_status cpu_tiles(void *ctx, void *mv, const int *idx, size_t count, float *out)
{
    (void)ctx;
    const cpu_mat *x = mv;
    const int tn = x->n / 16;
    for (size_t i = 0; i < count; i++) tile_gather(x->w, x->n, idx[i] / tn, idx[i] % tn, out + 256 * i);
    return SPARQ_OK;
}

static sparq_status cpu_scale(void *ctx, void *mv, float g)
{
    (void)ctx;
    const cpu_mat *x = mv;
    for (size_t i = 0; i < (size_t)x->k * x->n; i++) x->w[i] *= g;
    return SPARQ_OK;
}

static float *cpu_host(void *ctx, void *mv)
{
    (void)ctx;
    return ((cpu_mat *)mv)->w;
}

static void cpu_release(void *ctx, void *mv)
{
    (void)ctx;
    cpu_mat *x = mv;
    if (!x) return;
    sparq_aligned_free(x->w);
    sparq_free(x);
}

const ldlq_reg_engine ldlq_reg_engine_cpu = {NULL,      cpu_load,  cpu_sumsq, cpu_scale_had, cpu_tile_sumsq,
                                             cpu_tiles, cpu_scale, cpu_host,  cpu_release};

/* exllamav3's rule for output-channel scales: skip them when the input is
 * very irregular (the top 2 % of channels hold ≥ 15 % of the RMS mass).
 * The answer in *want; false when its sort buffer cannot be allocated. */
static int cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static bool want_out_scales(const ldlq_hessian *hs, bool *want)
{
    *want = true;
    if (hs->identity) return true;
    int k = hs->k;
    float *d = sparq_malloc((size_t)k * sizeof *d);
    if (!d) return false;
    for (int i = 0; i < k; i++) d[i] = sqrtf(hs->h_diag[i] > 0 ? hs->h_diag[i] : 0.0f);
    qsort(d, (size_t)k, sizeof *d, cmp_float_desc);
    int cutoff = k / 50;
    double top = 0.0, all = 0.0;
    for (int i = 0; i < k; i++) {
        all += d[i];
        if (i < cutoff) top += d[i];
    }
    sparq_free(d);
    *want = all > 0 ? top / all < 0.15 : true;
    return true;
}

/* The CPU encoder as a coder: viterbi_encode_tiles over the pool. */
typedef struct cpu_coder {
    viterbi_enc *enc;
    sparq_pool *pool;
} cpu_coder;

static sparq_status cpu_encode(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded)
{
    const cpu_coder *c = ctx;
    return viterbi_encode_tiles(c->enc, x, NULL, n_tiles, states, decoded, NULL, c->pool);
}

void ldlq_reg_free(ldlq_reg *r)
{
    if (!r) return;
    if (r->dev) r->eng->release(r->eng->ctx, r->dev);
    sparq_free(r->su);
    sparq_free(r->sv);
    memset(r, 0, sizeof *r);
}

sparq_status ldlq_regularize(const ldlq_hessian *hs, const float *w, int n, const ldlq_opts *opts,
                             const ldlq_coder *coder, const char *name, ldlq_reg *out)
{
    return ldlq_regularize_on(hs, w, n, opts, coder, &ldlq_reg_engine_cpu, name, out);
}

sparq_status ldlq_regularize_on(const ldlq_hessian *hs, const float *w, int n, const ldlq_opts *opts,
                                const ldlq_coder *coder, const ldlq_reg_engine *eng, const char *name,
                                ldlq_reg *out)
{
    const int k = hs->k, K = opts->K;
    memset(out, 0, sizeof *out);
    RETURN_IF(n <= 0 || n % 128 != 0, SPARQ_E_SHAPE, "%s: output size %d is not a multiple of 128", name, n);
    RETURN_IF(K < 1 || K > TRELLIS_K_MAX, SPARQ_E_ARG, "%s: K = %d is outside 1..8", name, K);
    const size_t kn = (size_t)k * n;
    for (size_t i = 0; i < kn; i++)
        RETURN_IF(!isfinite(w[i]), SPARQ_E_FORMAT, "%s: weight has a non-finite value at (%zu, %zu)", name, i / n,
                  i % n);
    out->k = k, out->n = n;
    out->eng = eng;
    out->su = sparq_malloc((size_t)k * sizeof(float));
    out->sv = sparq_malloc((size_t)n * sizeof(float));
    float *tmp = sparq_malloc((size_t)(k > n ? k : n) * sizeof(float));
    double *acc = sparq_malloc((size_t)(k > n ? k : n) * sizeof(double));
    sparq_status st = SPARQ_OK;
    if (!out->su || !out->sv || !tmp || !acc) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory quantizing a %d x %d weight", name, k, n);
        goto out;
    }
    st = eng->load(eng->ctx, w, k, n, &out->dev);
    if (st != SPARQ_OK) goto out;
    void *m = out->dev;
    float *su = out->su, *sv = out->sv;

    /* Output signs and channel scales. */
    ldlq_random_signs(sv, n, opts->seed ^ 0x7A11ull);
    bool apply_out = opts->out_scales > 0;
    float *ocs = tmp;
    if (opts->out_scales < 0 && !want_out_scales(hs, &apply_out)) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory for the channel scales", name);
        goto out;
    }
    st = eng->sumsq(eng->ctx, m, 0, acc);
    if (st != SPARQ_OK) goto out;
    for (int c = 0; c < n; c++) ocs[c] = (float)sqrt(acc[c] / k);
    double mean = 0.0;
    for (int c = 0; c < n; c++) mean += ocs[c];
    mean /= n;
    bool zero_cols = !(mean > 1e-30);
    if (zero_cols) apply_out = true;
    for (int c = 0; c < n; c++) {
        float s = zero_cols ? 0.0f : (float)(ocs[c] / mean);
        bool z = fabsf(s) < 1e-30f;
        if (apply_out) sv[c] = sv[c] * (z ? 0.1f : s) + 1e-10f;
        ocs[c] = z ? 1.0f : 0.0f; /* remember zero columns */
    }
    st = eng->scale_had(eng->ctx, m, 0, sv); /* ÷ sv, then every row ·H */
    if (st != SPARQ_OK) goto out;
    for (int c = 0; c < n; c++)
        if (ocs[c] != 0.0f) sv[c] = 0.0f;

    /* Input signs and channel scales. */
    st = eng->sumsq(eng->ctx, m, 1, acc);
    if (st != SPARQ_OK) goto out;
    for (int r = 0; r < k; r++) {
        const float rms = (float)sqrt(acc[r] / n);
        float s = fabsf(rms) < 1e-30f ? 0.1f : rms;
        su[r] = hs->su[r] * s / -LDLQ_CODEBOOK_SCALE + 1e-10f;
        tmp[r] = 1.0f / su[r];
    }
    st = eng->scale_had(eng->ctx, m, 1, tmp); /* × 1/su, then H· every column */
    if (st != SPARQ_OK) goto out;

    /* Global scale. */
    double g = opts->g_fixed, smse = 0.0;
    if (!(g > 0)) {
        st = g_scale_search(coder, eng, m, k, n, K, &g, &smse);
        if (st != SPARQ_OK) goto out;
    }
    st = eng->scale(eng->ctx, m, (float)g);
    if (st != SPARQ_OK) goto out;
    for (int r = 0; r < k; r++) su[r] /= (float)g;
    out->wr = eng->host ? eng->host(eng->ctx, m) : NULL; /* a device engine has no host copy */
    out->g = g;
    out->smse = smse;
    out->apply_out = apply_out;
out:
    sparq_free(tmp);
    sparq_free(acc);
    if (st != SPARQ_OK) ldlq_reg_free(out);
    return st;
}

sparq_status ldlq_finish(const ldlq_hessian *hs, const ldlq_reg *r, const float *wq, double proxy, const char *name,
                         ldlq_result *res)
{
    const int k = r->k, n = r->n;
    const size_t kn = (size_t)k * n;
    RETURN_IF(wq && !hs->identity && !hs->hr, SPARQ_E_ARG, "%s: the Hessian was prepared elsewhere (no Hr here)", name);
    res->proxy_err = wq ? ldlq_proxy_err(hs->identity ? NULL : hs->hr, k, r->wr, wq, n) : proxy;
    RETURN_IF(res->proxy_err < 0, SPARQ_E_NOMEM, "%s: out of memory computing the proxy error", name);
    for (int i = 0; i < k; i++) res->suh[i] = sparq_f32_to_f16(r->su[i]);
    for (int c = 0; c < n; c++) res->svh[c] = sparq_f32_to_f16(r->sv[c]);
    if (res->w_hat) {
        RETURN_IF(!wq, SPARQ_E_ARG, "%s: w_hat needs the quantized weight", name);
        /* What a decoder reconstructs: diag(suh)·Had·Q·Had·diag(svh) with the fp16 scales. */
        memcpy(res->w_hat, wq, kn * sizeof(float));
        FORWARD_IF(hadamard_left(res->w_hat, (size_t)k, (size_t)n));
        FORWARD_IF(hadamard_right(res->w_hat, (size_t)k, (size_t)n));
        for (int i = 0; i < k; i++) {
            float su = sparq_f16_to_f32(res->suh[i]);
            for (int c = 0; c < n; c++) res->w_hat[(size_t)i * n + c] *= su * sparq_f16_to_f32(res->svh[c]);
        }
    }
    res->g_scale = r->g;
    res->sample_mse = r->smse;
    res->out_scales = r->apply_out;
    return SPARQ_OK;
}

sparq_status ldlq_quantize(const ldlq_hessian *hs, const float *w, int n, const ldlq_opts *opts,
                           viterbi_enc *enc, sparq_pool *pool, const char *name, ldlq_result *res)
{
    const int k = hs->k, K = opts->K;
    RETURN_IF(!res || !res->trellis || !res->suh || !res->svh, SPARQ_E_ARG, "%s: output arrays missing", name);
    RETURN_IF(!hs->identity && !hs->l, SPARQ_E_ARG, "%s: the Hessian was prepared elsewhere (no L here)", name);
    cpu_coder cc = {enc, pool};
    const ldlq_coder coder = {cpu_encode, &cc};
    ldlq_reg reg;
    FORWARD_IF(ldlq_regularize(hs, w, n, opts, &coder, name, &reg));
    const size_t kn = (size_t)k * n;
    const int tk = k / 16, tn = n / 16;
    float *wq = sparq_aligned_alloc(64, kn * sizeof(float));
    float *err = sparq_aligned_alloc(64, kn * sizeof(float));
    float *target = sparq_malloc((size_t)16 * n * sizeof(float));
    float *tiles = sparq_malloc((size_t)tn * 256 * sizeof(float));
    float *tw = sparq_malloc((size_t)tn * 256 * sizeof(float));
    float *dec = sparq_malloc((size_t)tn * 256 * sizeof(float));
    uint16_t *states = sparq_malloc((size_t)tn * 256 * sizeof(uint16_t));
    sparq_status st = SPARQ_OK;
    if (!wq || !err || !target || !tiles || !tw || !dec || !states) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory quantizing a %d x %d weight", name, k, n);
        goto out;
    }
    const float *wr = reg.wr;
    const bool weighted = opts->weighted && !hs->identity;

    /* Block LDLQ, last strip first. */
    const int words = trellis_tile_words(K);
    for (int ti = tk - 1; ti >= 0; ti--) {
        const int b = ti * 16, rest = k - b - 16;
        memcpy(target, wr + (size_t)b * n, (size_t)16 * n * sizeof(float));
        if (!hs->identity && rest > 0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 16, n, rest, 1.0f, hs->l + (size_t)(b + 16) * k + b,
                        k, err + (size_t)(b + 16) * n, n, 1.0f, target, n);
        for (int tj = 0; tj < tn; tj++) {
            tile_gather(target, n, 0, tj, tiles + (size_t)tj * 256);
            if (weighted)
                for (int p = 0; p < 256; p++) tw[(size_t)tj * 256 + p] = hs->d_diag[b + trellis_pos_row(p)];
        }
        st = viterbi_encode_tiles(enc, tiles, weighted ? tw : NULL, (size_t)tn, states, dec, NULL, pool);
        if (st != SPARQ_OK) goto out;
        for (int tj = 0; tj < tn; tj++) {
            tile_scatter(wq + (size_t)b * n, n, 0, tj, dec + (size_t)tj * 256);
            trellis_tile_pack(states + (size_t)tj * 256, K, res->trellis + ((size_t)ti * tn + tj) * (size_t)words);
        }
        for (size_t i = (size_t)b * n; i < (size_t)(b + 16) * n; i++) err[i] = wr[i] - wq[i];
    }
    st = ldlq_finish(hs, &reg, wq, 0.0, name, res);
out:
    ldlq_reg_free(&reg);
    sparq_aligned_free(wq);
    sparq_aligned_free(err);
    sparq_free(target);
    sparq_free(tiles);
    sparq_free(tw);
    sparq_free(dec);
    sparq_free(states);
    return st;
}
