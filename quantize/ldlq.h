/* quantize/ldlq.h — calibrated EXL3 quantization of one linear layer:
 * Hessian preparation, weight regularisation, global-scale search and block
 * LDLQ with the trellis encoder, exactly the algorithm of reference.md §1.3
 * (exllamav3's `quantize_exl3`), written from the description.
 *
 * Two steps, because many linears share one input Hessian (q/k/v; gate/up of
 * every expert of a MoE layer):
 *   1. ldlq_hessian_prepare(): H (the mean of xᵀx) → damped (0.025·mean diag,
 *      more if Cholesky fails), rotated by random input signs su and the
 *      blockwise 128-Hadamard, factored H = L·D·Lᵀ with 16×16 blocks.
 *   2. ldlq_quantize(): for each weight W (in=k, out=n; the EXL3 orientation,
 *      i.e. the TRANSPOSE of an HF `[out, in]` weight):
 *      random output signs and per-output-channel RMS scales → svh; output
 *      Hadamard; per-input-channel RMS scales → suh (÷ −1.24371088); input
 *      Hadamard; global scale g by a coarse grid 0.1..1.9 then a fine grid and
 *      a parabolic step on a sample of tiles; block LDLQ from the last 16-row
 *      strip to the first, each strip's target = its rows + Lᵀ·(error of the
 *      later rows), every 16×16 tile Viterbi-encoded. Output: the packed
 *      trellis, suh and svh in the on-disk layout (reference.md §1.4) and the
 *      proxy error.
 *
 * Everything is deterministic given the seeds (and independent of the thread
 * count). An identity Hessian (h == NULL) gives the uncalibrated variant
 * (no error feedback): `--method trellis-nocalib`. */
#ifndef SPARQ_QUANTIZE_LDLQ_H
#define SPARQ_QUANTIZE_LDLQ_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "common/threadpool.h"
#include "kernels/cpu/trellis.h"
#include "quantize/viterbi.h"

/* exllamav3's codebook scale: suh carries 1 / (−1.24371088 · g). */
#define LDLQ_CODEBOOK_SCALE 1.24371088f
#define LDLQ_SIGMA_REG 0.025f

/* A prepared (damped, rotated, factored) Hessian for inputs of size k. */
typedef struct ldlq_hessian ldlq_hessian;

/* Prepare H for quantization. h: k×k row-major fp32, the MEAN of xᵀx over the
 * calibration rows (not modified), or NULL for the identity (uncalibrated).
 * k must be a multiple of 128. sigma_reg ≤ 0 means LDLQ_SIGMA_REG. seed picks
 * the random input signs su (shared by every weight quantized with this H).
 * `name` is used in messages. If Cholesky fails, damping is multiplied by 4
 * and retried (up to 8 times); ldlq_hessian_damping() tells what was used. A
 * non-finite H or one with a zero diagonal falls back to the identity and
 * says so through ldlq_hessian_is_identity(). */
sparq_status ldlq_hessian_prepare(ldlq_hessian **out, const float *h, int k, float sigma_reg, uint64_t seed,
                                  const char *name);
void ldlq_hessian_free(ldlq_hessian *hs);
int ldlq_hessian_k(const ldlq_hessian *hs);
bool ldlq_hessian_is_identity(const ldlq_hessian *hs);
/* The damping factor actually added (× mean diag), 0 for the identity. */
float ldlq_hessian_damping(const ldlq_hessian *hs);
/* The prepared arrays (NULL for the identity, except su): the damped rotated
 * Hr (k×k), its block-unit-lower factor L (k×k, Hr = L·D·Lᵀ with 16×16
 * blocks), diag(D) (k) and the input signs su (k, ±1). A GPU quantizer
 * uploads these. */
const float *ldlq_hessian_hr(const ldlq_hessian *hs);
const float *ldlq_hessian_l(const ldlq_hessian *hs);
const float *ldlq_hessian_d(const ldlq_hessian *hs);
const float *ldlq_hessian_su(const ldlq_hessian *hs);

/* A Hessian prepared elsewhere (on the GPU: kernels/cuda/ldlq_cuda.h) as
 * the CPU's regularisation needs it: its signs su, the damped diagonal
 * h_diag, whether it is the identity and the damping (copied). Its Hr / L /
 * D accessors return NULL, and ldlq_quantize / ldlq_finish with a wq cannot
 * use it (they need Hr): the recursion and the proxy run where it lives. */
sparq_status ldlq_hessian_wrap(ldlq_hessian **out, int k, const float *su, const float *h_diag, bool identity,
                               float damping);

/* The random ±1 signs every EXL3 quantization draws (s[0..n) from seed;
 * splitmix64, the top bit of each draw): the input signs su of a Hessian
 * (seed as given to ldlq_hessian_prepare) and the output signs of a weight
 * (opts.seed ^ 0x7A11). */
void ldlq_random_signs(float *s, int n, uint64_t seed);

typedef struct ldlq_opts {
    int K;                /* bits per weight, 1..8 */
    trellis_codebook cb;  /* must match the encoder's */
    uint64_t seed;        /* output signs */
    int out_scales;       /* -1: exllamav3's rule (on unless 2 % of input channels hold ≥ 15 % of
                             the RMS mass); 0 off; 1 on */
    bool weighted;        /* weight each row of a strip by diag(D) in the Viterbi search */
    double g_fixed;       /* > 0: use this global scale instead of searching (the driver reuses one
                             expert's scale for the other experts of a layer; tests use
                             ldlq_default_g to save time) */
} ldlq_opts;

/* A typical global scale for K and codebook (what the search finds on
 * regularised weights; measured on exllamav3's golden cases). */
double ldlq_default_g(int K, trellis_codebook cb);

void ldlq_opts_default(ldlq_opts *o, int K);

/* What one quantization produced. The three arrays are caller-allocated:
 * trellis (k/16)·(n/16)·16K uint16, suh k fp16 bits, svh n fp16 bits. */
typedef struct ldlq_result {
    uint16_t *trellis;
    uint16_t *suh;
    uint16_t *svh;
    float *w_hat;       /* optional (NULL): k×n, the weight the output decodes to (original basis) */
    double proxy_err;   /* tr(E H Eᵀ)/tr(W H Wᵀ) in the regularised space with the damped H —
                           exllamav3's definition (its `proxy_err`) */
    double g_scale;     /* the global scale chosen */
    double sample_mse;  /* the scale search's sample MSE at g */
    bool out_scales;    /* whether output-channel scales were applied */
} ldlq_result;

/* Quantize w (k×n row-major, fp32, not modified) with the prepared Hessian.
 * enc must be a viterbi encoder for opts->K / opts->cb with at least
 * sparq_pool_size(pool) slots (1 for a NULL pool). `name` is for messages. */
sparq_status ldlq_quantize(const ldlq_hessian *hs, const float *w, int n, const ldlq_opts *opts,
                           viterbi_enc *enc, sparq_pool *pool, const char *name, ldlq_result *res);

/* The three stages of ldlq_quantize, for a quantizer that runs the recursion
 * elsewhere (the GPU's, kernels/cuda/ldlq_cuda.h, many weights at once):
 *   ldlq_regularize: signs, channel scales, both Hadamards, the global scale
 *     (searched through `coder` unless opts->g_fixed > 0) → the scaled
 *     regularised weight wr, su (÷ g) and sv;
 *   the block LDLQ over wr (strip targets wr + Lᵀ·(wr − wq) of the later rows,
 *     each 16×16 tile Viterbi-encoded, weighted by diag(D) if opts->weighted);
 *   ldlq_finish: the proxy error (from wq, or the `proxy` computed elsewhere
 *     when wq is NULL), the fp16 scales and w_hat (needs wq). */
typedef struct ldlq_coder {
    /* encode n_tiles tiles of 256 stream-order targets (no weights): states and decoded values */
    sparq_status (*encode)(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded);
    void *ctx;
} ldlq_coder;

/* Where ldlq_regularize_on does its O(k·n) matrix work: on the CPU
 * (ldlq_reg_engine_cpu, what ldlq_regularize uses; the matrix is host memory)
 * or on a device (kernels/cuda/ldlq_cuda.h, ldlq_cuda_reg_*: the matrix stays
 * in device memory, ldlq_reg.dev, and the recursion reads it there). The
 * decisions between the steps (scales, signs, the scale search) are made on
 * the host from what the engine returns, so an engine that keeps the CPU's
 * arithmetic — sums of squares in double in the CPU's order, the same IEEE
 * divisions and products, the same butterflies — gives the CPU's floats bit
 * for bit. m is the engine's matrix (k×n, row-major). */
typedef struct ldlq_reg_engine {
    void *ctx;
    /* *m ← a copy of host w (k×n) */
    sparq_status (*load)(void *ctx, const float *w, int k, int n, void **m);
    /* dim 0: out[c] = Σ_r m[r][c]² (r ascending); dim 1: out[r] = Σ_c m[r][c]² (c ascending); in double */
    sparq_status (*sumsq)(void *ctx, void *m, int dim, double *out);
    /* dim 0: m[r][c] /= s[c], then every row ← row·H (hadamard_right); dim 1: m[r][c] *= s[r], then
     * every column ← H·column (hadamard_left) */
    sparq_status (*scale_had)(void *ctx, void *m, int dim, const float *s);
    /* out[ti·(n/16) + tj] = Σ m² over tile (ti, tj), its rows then columns ascending, in double */
    sparq_status (*tile_sumsq)(void *ctx, void *m, double *out);
    /* the tiles idx[i] = ti·(n/16) + tj in stream order (trellis_pos_row/col), 256 floats each, to host out */
    sparq_status (*tiles)(void *ctx, void *m, const int *idx, size_t count, float *out);
    /* m *= g */
    sparq_status (*scale)(void *ctx, void *m, float g);
    /* the host copy of m (k×n); NULL (the pointer, or what it returns) for an engine whose matrix is not
     * host memory */
    float *(*host)(void *ctx, void *m);
    void (*release)(void *ctx, void *m);
} ldlq_reg_engine;

extern const ldlq_reg_engine ldlq_reg_engine_cpu;

typedef struct ldlq_reg {
    int k, n;
    float *wr;       /* k×n row-major: the regularised weight, × g (host; NULL on a device engine) */
    void *dev;       /* the engine's matrix (== wr on the CPU's): on a device, its regularised weight */
    const ldlq_reg_engine *eng;
    float *su, *sv;  /* k, n: the scales suh / svh hold (su already ÷ g) */
    double g, smse;
    bool apply_out;
} ldlq_reg;

sparq_status ldlq_regularize(const ldlq_hessian *hs, const float *w, int n, const ldlq_opts *opts,
                             const ldlq_coder *coder, const char *name, ldlq_reg *out);
/* ldlq_regularize with the matrix work on eng (ldlq_reg_engine_cpu: ldlq_regularize). *out
 * keeps the pointer eng until ldlq_reg_free (which calls eng->release): eng must outlive it, so
 * never pass an engine that lives on a stack frame the ldlq_reg leaves. */
sparq_status ldlq_regularize_on(const ldlq_hessian *hs, const float *w, int n, const ldlq_opts *opts,
                                const ldlq_coder *coder, const ldlq_reg_engine *eng, const char *name,
                                ldlq_reg *out);
void ldlq_reg_free(ldlq_reg *r);
sparq_status ldlq_finish(const ldlq_hessian *hs, const ldlq_reg *r, const float *wq, double proxy, const char *name,
                         ldlq_result *res);

/* tr(Eᵀ H E) / tr(Wᵀ H W) with E = w − wq (k×n row-major each; h k×k, or
 * NULL for the identity). Used to compare a stored quantization with the
 * original weight in the original basis. Returns a negative value on
 * allocation failure. */
double ldlq_proxy_err(const float *h, int k, const float *w, const float *wq, int n);

#endif
