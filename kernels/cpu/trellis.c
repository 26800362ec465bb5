/* kernels/cpu/trellis.c — the EXL3 trellis codec's scalar reference and the
 * parts every code path shares: codebooks, tile permutation, pack/unpack, the
 * 128-point Hadamard, whole-linear decode, and the GEMM driver (input
 * transform, threading, output transform) around the per-path tile kernels.
 *
 * Canonical GEMM arithmetic (all paths produce these exact bits):
 *   u = had128(x ⊙ suh) per row;
 *   3inst, mcg: per tile column nt and batch row: acc[h][a][j] = 0 (h = 0..1,
 *   a = 0..3, j = 0..7); for kt ascending, step m = 0..31, segment j = 0..7
 *   (position p = 32j + m):
 *       acc[(m>>2)&1][m&3][j] = fma(value(p), u[16kt + step_row(m)], acc[...]);
 *   t[16nt + 8h + j] = (acc[h][0][j] + acc[h][1][j]) + (acc[h][2][j] + acc[h][3][j]);
 *   mul1 (integer; values are never formed):
 *     per 128-input block β of a row: m = max|u|, s = m / 32639 and
 *     q_i = clamp(rint(u_i · (32639 / m)), ±32639) (s = NaN if the block is
 *     not finite, s = q = 0 if it is all zero); b = byte sum of state·0x83DCD12D;
 *     I[β][col] = Σ_i b·q_i − 510·Σ_i q_i, exact in (wrapping) int32;
 *     f[col] = fma((float)I[β][col], A·s_β, f[col]) over β ascending;
 *     t[col] = f[col] + D·Σ_i u_i (the sum in input order).
 *   The codebook value is round_fp16(A·(b − 510) + D); the GEMM uses it
 *   without that last rounding (at most half an fp16 ulp per weight, 2.8e-4
 *   relative RMS: 1/500 of the 3-bit quantization noise) and with u to 16 bits
 *   per block, which makes the per-weight work a multiply, a byte-pair sum
 *   and one integer multiply-add, and makes every path bit-identical for free.
 *   y = had128(t) ⊙ svh.
 * Position 32j + m lies in column j + 8·((m>>2)&1) and row step_row(m) (see
 * trellis_impl.h); four accumulators per column break the FMA latency chain. */
#include "kernels/cpu/trellis.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "kernels/cpu/trellis_impl.h"

/* --- codebooks ------------------------------------------------------------ */

static const char *const cb_names[TRELLIS_CB_COUNT_] = {"3inst", "mcg", "mul1"};

const char *trellis_cb_name(trellis_codebook cb)
{
    return (unsigned)cb < TRELLIS_CB_COUNT_ ? cb_names[cb] : NULL;
}

bool trellis_cb_parse(const char *name, trellis_codebook *out)
{
    for (int i = 0; i < TRELLIS_CB_COUNT_; i++)
        if (name && strcmp(name, cb_names[i]) == 0) {
            *out = (trellis_codebook)i;
            return true;
        }
    return false;
}

/* fp16 add of the two masked halves: the fp32 sum of two fp16 values whose
 * exponents are within 3 of each other is exact, so one rounding to fp16
 * reproduces __hadd. */
static inline uint16_t lop_halves_sum(uint32_t x)
{
    x = (x & TRELLIS_LOP_MASK) ^ TRELLIS_LOP_XOR;
    const float s = sparq_f16_to_f32((uint16_t)(x & 0xFFFF)) + sparq_f16_to_f32((uint16_t)(x >> 16));
    return sparq_f32_to_f16(s);
}

uint16_t trellis_cb_value_f16(trellis_codebook cb, uint32_t state)
{
    uint32_t x = state & 0xFFFF;
    switch (cb) {
    case TRELLIS_CB_3INST:
        return lop_halves_sum(x * TRELLIS_3INST_MUL + TRELLIS_3INST_ADD);
    case TRELLIS_CB_MCG:
        return lop_halves_sum(x * TRELLIS_MCG_MUL);
    case TRELLIS_CB_MUL1: {
        x *= TRELLIS_MUL1_MUL;
        const uint32_t b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
        /* (1024 + b)·scale and the sum with bias are multiples of 2^-18
         * below 2^4, hence exact in fp32: one fp16 rounding, as __hfma. */
        const float r = (float)(1024 + b) * sparq_f16_to_f32(TRELLIS_MUL1_SCALE_F16) +
                        sparq_f16_to_f32(TRELLIS_MUL1_BIAS_F16);
        return sparq_f32_to_f16(r);
    }
    default:
        return 0x7E00; /* NaN: invalid codebook */
    }
}

float trellis_cb_value(trellis_codebook cb, uint32_t state)
{
    return sparq_f16_to_f32(trellis_cb_value_f16(cb, state));
}

void trellis_cb_table(trellis_codebook cb, float *out)
{
    for (uint32_t s = 0; s < 65536; s++) out[s] = trellis_cb_value(cb, s);
}

/* --- tile layout, pack, unpack --------------------------------------------- */

int trellis_rc_pos(int row, int col)
{
    /* invert trellis_pos_row/col: lane t = 4·(col % 8) + (row % 8)/2,
     * i = (row & 1) + 2·(row ≥ 8) + 4·(col ≥ 8) */
    const int t = 4 * (col & 7) + ((row & 7) >> 1);
    const int i = (row & 1) + 2 * (row >> 3) + 4 * (col >> 3);
    return 8 * t + i;
}

void trellis_tile_pack(const uint16_t *states, int K, uint16_t *words)
{
    /* 256·K bits, MSB-first, in 32-bit words stored as two little-endian int16 */
    const int nw = 8 * K;
    uint32_t ring[8 * TRELLIS_K_MAX];
    memset(ring, 0, sizeof ring);
    const uint32_t mask = (1u << K) - 1;
    for (int p = 0; p < TRELLIS_TILE_N; p++) {
        const uint32_t v = states[p] & mask;
        for (int b = 0; b < K; b++) {
            const int bit = p * K + b; /* stream bit, from the MSB of ring[0] */
            if (v & (1u << (K - 1 - b))) ring[bit >> 5] |= 1u << (31 - (bit & 31));
        }
    }
    for (int j = 0; j < nw; j++) {
        words[2 * j] = (uint16_t)(ring[j] & 0xFFFF);
        words[2 * j + 1] = (uint16_t)(ring[j] >> 16);
    }
}

void trellis_tile_unpack(const uint16_t *words, int K, uint16_t *states)
{
    uint32_t ext[TRELLIS_EXT_WORDS];
    trellis_ring_prepare(words, K, ext);
    for (int p = 0; p < TRELLIS_TILE_N; p++) states[p] = (uint16_t)trellis_ring_state(ext, K, p);
}

/* --- scalar path ------------------------------------------------------------ */

static void values_scalar(const uint16_t *words, int K, trellis_codebook cb, float *v)
{
    uint32_t ext[TRELLIS_EXT_WORDS];
    trellis_ring_prepare(words, K, ext);
    for (int p = 0; p < TRELLIS_TILE_N; p++) v[p] = trellis_cb_value(cb, trellis_ring_state(ext, K, p));
}

static void gemm_col_scalar(const trellis_gemm_job *job, int nt)
{
    const trellis_linear *lin = job->lin;
    const int K = lin->K, kt_count = lin->k / 16, nt_count = lin->n / 16;
    const size_t tile_words = (size_t)trellis_tile_words(K);
    float acc[TRELLIS_GEMM_MAX_ROWS][2][4][8];
    float v[TRELLIS_TILE_N];
    memset(acc, 0, sizeof acc);
    for (int kt = 0; kt < kt_count; kt++) {
        values_scalar(lin->trellis + ((size_t)kt * nt_count + nt) * tile_words, K, lin->cb, v);
        for (int r = 0; r < job->rows; r++) {
            const float *u = job->u + (size_t)r * lin->k + 16 * kt;
            for (int m = 0; m < 32; m++) {
                float *a = acc[r][(m >> 2) & 1][m & 3];
                const float x = u[trellis_step_row(m)];
                for (int j = 0; j < 8; j++) a[j] = fmaf(v[32 * j + m], x, a[j]);
            }
        }
    }
    for (int r = 0; r < job->rows; r++) {
        float *t = job->t + (size_t)r * lin->n + 16 * nt;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 8; j++)
                t[8 * h + j] = (acc[r][h][0][j] + acc[r][h][1][j]) + (acc[r][h][2][j] + acc[r][h][3][j]);
    }
}

static void gemm_col_scalar_mul1(const trellis_gemm_job *job, int nt)
{
    const trellis_linear *lin = job->lin;
    const int K = lin->K, kt_count = lin->k / 16, nt_count = lin->n / 16, nblk = lin->k / TRELLIS_Q_BLOCK;
    const size_t tile_words = (size_t)trellis_tile_words(K);
    uint32_t iacc[TRELLIS_GEMM_MAX_ROWS][16];
    float facc[TRELLIS_GEMM_MAX_ROWS][16];
    uint32_t b[TRELLIS_TILE_N];
    memset(iacc, 0, sizeof iacc);
    memset(facc, 0, sizeof facc);
    for (int kt = 0; kt < kt_count; kt++) {
        uint32_t ext[TRELLIS_EXT_WORDS];
        trellis_ring_prepare(lin->trellis + ((size_t)kt * nt_count + nt) * tile_words, K, ext);
        for (int p = 0; p < TRELLIS_TILE_N; p++) {
            const uint32_t x = trellis_ring_state(ext, K, p) * TRELLIS_MUL1_MUL;
            b[p] = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
        }
        for (int r = 0; r < job->rows; r++) {
            const int32_t *q = job->uq2 + (size_t)r * lin->k + 16 * kt;
            for (int p = 0; p < TRELLIS_TILE_N; p++)
                iacc[r][trellis_pos_col(p)] += b[p] * (uint32_t)(int16_t)q[trellis_pos_row(p)];
        }
        if ((kt + 1) % (TRELLIS_Q_BLOCK / 16)) continue;
        const int blk = kt / (TRELLIS_Q_BLOCK / 16);
        for (int r = 0; r < job->rows; r++) {
            const uint32_t bias = (uint32_t)job->bbias[(size_t)r * nblk + blk];
            const float scale = job->bscale[(size_t)r * nblk + blk];
            for (int c = 0; c < 16; c++) {
                facc[r][c] = fmaf((float)(int32_t)(iacc[r][c] - bias), scale, facc[r][c]);
                iacc[r][c] = 0;
            }
        }
    }
    for (int r = 0; r < job->rows; r++) memcpy(job->t + (size_t)r * lin->n + 16 * nt, facc[r], sizeof facc[r]);
}

static void gemm_col_scalar_any(const trellis_gemm_job *job, int nt)
{
    if (job->lin->cb == TRELLIS_CB_MUL1) gemm_col_scalar_mul1(job, nt);
    else gemm_col_scalar(job, nt);
}

static void viterbi_step_scalar(const float *cb, const float *cost_in, float *cost_out, uint8_t *back, int K,
                                float target, float weight)
{
    const int shift = 16 - K, nodes = 1 << shift, branches = 1 << K;
    for (int e = 0; e < nodes; e++) {
        float best = INFINITY;
        int arg = 0;
        for (int j = 0; j < branches; j++) {
            const int s = (j << shift) | e;
            const float d = cb[s] - target;
            float dd = d * d;
            if (weight != 1.0f) dd = dd * weight;
            const float c = cost_in[s >> K] + dd;
            if (c < best) {
                best = c;
                arg = j;
            }
        }
        cost_out[e] = best;
        back[e] = (uint8_t)arg;
    }
}

const trellis_path_impl trellis_impl_scalar = {
    .gemm_col = gemm_col_scalar_any,
    .cols_per_task = 1,
    .values = values_scalar,
    .viterbi_step = viterbi_step_scalar,
};

/* --- path selection ---------------------------------------------------------- */

/* Whether SIMD slot i runs on this CPU, asked once: CPUID is slow (in a VM it
 * traps to the hypervisor, microseconds per call) and tile decode asks per
 * tile. −1 = not asked yet; a race only repeats the same answer. */
_Static_assert(TRELLIS_SIMD_SLOTS == 2, "slot_ok initialiser");
static _Atomic int slot_ok[TRELLIS_SIMD_SLOTS] = {-1, -1};

static bool simd_slot_ok(int i)
{
    int ok = atomic_load_explicit(&slot_ok[i], memory_order_relaxed);
    if (ok < 0) {
        ok = trellis_simd[i].impl && trellis_simd[i].cpu_ok();
        atomic_store_explicit(&slot_ok[i], ok, memory_order_relaxed);
    }
    return ok;
}

static const trellis_path_impl *path_impl(trellis_path p)
{
    if (p == TRELLIS_PATH_SCALAR) return &trellis_impl_scalar;
    for (int i = 0; i < TRELLIS_SIMD_SLOTS; i++)
        if (trellis_simd[i].path == p && simd_slot_ok(i)) return trellis_simd[i].impl;
    return NULL;
}

static const char *const path_names[TRELLIS_PATH_COUNT_] = {"scalar", "avx2", "neon", "avx512"};

const char *trellis_path_name(trellis_path p)
{
    return (unsigned)p < TRELLIS_PATH_COUNT_ ? path_names[p] : NULL;
}

bool trellis_path_available(trellis_path p) { return path_impl(p) != NULL; }

trellis_path trellis_path_best(void)
{
    for (int i = 0; i < TRELLIS_SIMD_SLOTS; i++)
        if (simd_slot_ok(i)) return trellis_simd[i].path;
    return TRELLIS_PATH_SCALAR;
}

bool trellis_tile_decode_path(const uint16_t *words, int K, trellis_codebook cb, float *out,
                              trellis_path path)
{
    const trellis_path_impl *impl = path_impl(path);
    if (!impl || K < 1 || K > TRELLIS_K_MAX || (unsigned)cb >= TRELLIS_CB_COUNT_) return false;
    float v[TRELLIS_TILE_N];
    impl->values(words, K, cb, v);
    for (int p = 0; p < TRELLIS_TILE_N; p++) out[trellis_pos_row(p) * 16 + trellis_pos_col(p)] = v[p];
    return true;
}

void trellis_viterbi_step(const float *cb, const float *cost_in, float *cost_out, uint8_t *back, int K,
                          float target, float weight, trellis_path path)
{
    const trellis_path_impl *impl = path_impl(path);
    if (!impl || !impl->viterbi_step) impl = &trellis_impl_scalar;
    impl->viterbi_step(cb, cost_in, cost_out, back, K, target, weight);
}

void trellis_tile_decode(const uint16_t *words, int K, trellis_codebook cb, float *out)
{
    trellis_tile_decode_path(words, K, cb, out, trellis_path_best());
}

/* --- Hadamard ------------------------------------------------------------------ */

#define HAD_SCALE 0.08838834764831845f /* 1/sqrt(128) */

void trellis_had128(float *v, size_t n_blocks)
{
    for (size_t b = 0; b < n_blocks; b++, v += 128) {
        for (int h = 1; h < 128; h <<= 1)
            for (int i = 0; i < 128; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    const float a = v[j], c = v[j + h];
                    v[j] = a + c;
                    v[j + h] = a - c;
                }
        for (int j = 0; j < 128; j++) v[j] *= HAD_SCALE;
    }
}

void trellis_had128_left(float *m, size_t rows, size_t cols)
{
    /* the same butterflies, on whole rows: contiguous and vectorisable */
    for (size_t b = 0; b + 128 <= rows; b += 128) {
        float *blk = m + b * cols;
        for (size_t h = 1; h < 128; h <<= 1)
            for (size_t i = 0; i < 128; i += 2 * h)
                for (size_t j = i; j < i + h; j++) {
                    float *ra = blk + j * cols, *rc = blk + (j + h) * cols;
                    for (size_t e = 0; e < cols; e++) {
                        const float a = ra[e], c = rc[e];
                        ra[e] = a + c;
                        rc[e] = a - c;
                    }
                }
        for (size_t e = 0; e < 128 * cols; e++) blk[e] *= HAD_SCALE;
    }
}

/* --- whole linears ------------------------------------------------------------- */

sparq_status trellis_linear_check(const trellis_linear *lin, const char *name)
{
    if (!name) name = "trellis linear";
    RETURN_IF(!lin, SPARQ_E_ARG, "%s: no linear given", name);
    RETURN_IF(lin->K < 1 || lin->K > TRELLIS_K_MAX, SPARQ_E_UNSUPPORTED,
              "%s: %d bits per weight, expected 1..8 (trellis last dim = 16·K)", name, lin->K);
    RETURN_IF((unsigned)lin->cb >= TRELLIS_CB_COUNT_, SPARQ_E_ARG, "%s: codebook %d is not 3inst/mcg/mul1",
              name, (int)lin->cb);
    RETURN_IF(lin->k <= 0 || lin->n <= 0 || lin->k % 128 || lin->n % 128, SPARQ_E_SHAPE,
              "%s: shape (%d, %d) is not a positive multiple of 128 on both sides", name, lin->k, lin->n);
    RETURN_IF(!lin->trellis || !lin->suh || !lin->svh, SPARQ_E_ARG,
              "%s: missing trellis, suh or svh data", name);
    return SPARQ_OK;
}

typedef struct decode_ctx {
    const trellis_linear *lin;
    float *q;
} decode_ctx;

static void decode_band(void *vctx, size_t kt, int tid)
{
    (void)tid;
    const decode_ctx *ctx = vctx;
    const trellis_linear *lin = ctx->lin;
    const int nt_count = lin->n / 16;
    const size_t tile_words = (size_t)trellis_tile_words(lin->K);
    float tile[TRELLIS_TILE_N];
    for (int nt = 0; nt < nt_count; nt++) {
        trellis_tile_decode(lin->trellis + (kt * nt_count + nt) * tile_words, lin->K, lin->cb, tile);
        for (int r = 0; r < 16; r++)
            memcpy(ctx->q + (kt * 16 + r) * (size_t)lin->n + 16 * nt, tile + 16 * r, 16 * sizeof(float));
    }
}

sparq_status trellis_linear_decode_inner(const trellis_linear *lin, float *q, sparq_pool *pool)
{
    FORWARD_IF(trellis_linear_check(lin, NULL));
    RETURN_IF(!q, SPARQ_E_ARG, "trellis decode: no output buffer");
    decode_ctx ctx = {lin, q};
    sparq_pool_for(pool, (size_t)lin->k / 16, decode_band, &ctx);
    return SPARQ_OK;
}

typedef struct had_ctx {
    const trellis_linear *lin;
    float *w;
} had_ctx;

static void had_band(void *vctx, size_t kb, int tid)
{
    /* one 128-row band: left Hadamard, then right Hadamard and scales per row */
    (void)tid;
    const had_ctx *ctx = vctx;
    const trellis_linear *lin = ctx->lin;
    const size_t n = (size_t)lin->n;
    float *band = ctx->w + kb * 128 * n;
    trellis_had128_left(band, 128, n);
    for (size_t r = 0; r < 128; r++) {
        float *row = band + r * n;
        trellis_had128(row, n / 128);
        const float su = sparq_f16_to_f32(lin->suh[kb * 128 + r]);
        for (size_t j = 0; j < n; j++) row[j] = row[j] * su * sparq_f16_to_f32(lin->svh[j]);
    }
}

sparq_status trellis_linear_decode(const trellis_linear *lin, float *w, sparq_pool *pool)
{
    FORWARD_IF(trellis_linear_decode_inner(lin, w, pool));
    had_ctx ctx = {lin, w};
    sparq_pool_for(pool, (size_t)lin->k / 128, had_band, &ctx);
    return SPARQ_OK;
}

/* --- GEMM driver ----------------------------------------------------------------- */

/* mul1's input quantization (see the top of the file) of one row u (k
 * values): fills uq2, bscale and bbias; returns Σ u in input order. */
static float quantize_row(const float *u, size_t k, int32_t *uq2, float *bscale, int32_t *bbias)
{
    float sum = 0.0f;
    for (size_t b0 = 0; b0 < k; b0 += TRELLIS_Q_BLOCK) {
        float m = 0.0f;
        bool finite = true;
        for (size_t i = b0; i < b0 + TRELLIS_Q_BLOCK; i++) {
            const float a = fabsf(u[i]);
            sum += u[i];
            if (!(a <= FLT_MAX)) finite = false;
            else if (a > m) m = a;
        }
        const size_t blk = b0 / TRELLIS_Q_BLOCK;
        uint32_t qsum = 0;
        if (!finite || m == 0.0f) {
            for (size_t i = b0; i < b0 + TRELLIS_Q_BLOCK; i++) uq2[i] = 0;
            bscale[blk] = finite ? 0.0f : NAN;
        } else {
            const float inv = (float)TRELLIS_Q_MAX / m;
            for (size_t i = b0; i < b0 + TRELLIS_Q_BLOCK; i++) {
                long q = lrintf(u[i] * inv);
                q = q > TRELLIS_Q_MAX ? TRELLIS_Q_MAX : q < -TRELLIS_Q_MAX ? -TRELLIS_Q_MAX : q;
                uq2[i] = (int32_t)(((uint32_t)q & 0xFFFFu) | ((uint32_t)q << 16));
                qsum += (uint32_t)q;
            }
            bscale[blk] = TRELLIS_MUL1_A * (m / (float)TRELLIS_Q_MAX);
        }
        bbias[blk] = (int32_t)(510u * qsum);
    }
    return sum;
}

typedef struct gemm_ctx {
    trellis_gemm_job job;
    trellis_gemm_col_fn fn;
} gemm_ctx;

static void gemm_task(void *vctx, size_t nt, int tid)
{
    (void)tid;
    const gemm_ctx *ctx = vctx;
    ctx->fn(&ctx->job, (int)nt);
}

sparq_status trellis_linear_gemm_path(const trellis_linear *lin, const float *x, int rows, float *y,
                                      sparq_pool *pool, trellis_path path)
{
    FORWARD_IF(trellis_linear_check(lin, NULL));
    RETURN_IF(rows < 1 || rows > TRELLIS_GEMM_MAX_ROWS, SPARQ_E_ARG,
              "trellis gemm: %d rows, expected 1..%d (decode and use BLAS for more)", rows,
              TRELLIS_GEMM_MAX_ROWS);
    RETURN_IF(!x || !y, SPARQ_E_ARG, "trellis gemm: missing input or output");
    const trellis_path_impl *impl = path_impl(path);
    RETURN_IF(!impl, SPARQ_E_UNSUPPORTED, "trellis gemm: code path '%s' is not available here",
              trellis_path_name(path) ? trellis_path_name(path) : "?");

    const size_t k = (size_t)lin->k, n = (size_t)lin->n, nblk = k / TRELLIS_Q_BLOCK;
    const bool mul1 = lin->cb == TRELLIS_CB_MUL1;
    /* one allocation: u, t, and for mul1 uq2, bscale, bbias (all 4-byte items) */
    const size_t items = (size_t)rows * (k + n + (mul1 ? k + 2 * nblk : 0));
    float *u = sparq_aligned_alloc(64, items * sizeof(float));
    if (!u) return sparq_err(SPARQ_E_NOMEM, "trellis gemm: no memory for %d×%zu work buffers", rows, k + n);
    float *t = u + (size_t)rows * k;
    trellis_gemm_job job = {lin, rows, u, t, NULL, NULL, NULL};
    float dsum[TRELLIS_GEMM_MAX_ROWS] = {0};
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * k;
        float *ur = u + (size_t)r * k;
        for (size_t i = 0; i < k; i++) ur[i] = xr[i] * sparq_f16_to_f32(lin->suh[i]);
        trellis_had128(ur, k / 128);
    }
    if (mul1) {
        int32_t *uq2 = (int32_t *)(void *)(t + (size_t)rows * n);
        float *bscale = (float *)(void *)(uq2 + (size_t)rows * k);
        int32_t *bbias = (int32_t *)(void *)(bscale + (size_t)rows * nblk);
        for (int r = 0; r < rows; r++)
            dsum[r] = TRELLIS_MUL1_D * quantize_row(u + (size_t)r * k, k, uq2 + (size_t)r * k,
                                                    bscale + (size_t)r * nblk, bbias + (size_t)r * nblk);
        job.uq2 = uq2, job.bscale = bscale, job.bbias = bbias;
    }
    gemm_ctx ctx = {job, impl->gemm_col};
    sparq_pool_for(pool, n / 16 / (size_t)impl->cols_per_task, gemm_task, &ctx);
    for (int r = 0; r < rows; r++) {
        float *tr = t + (size_t)r * n, *yr = y + (size_t)r * n;
        if (mul1)
            for (size_t j = 0; j < n; j++) tr[j] += dsum[r];
        trellis_had128(tr, n / 128);
        for (size_t j = 0; j < n; j++) yr[j] = tr[j] * sparq_f16_to_f32(lin->svh[j]);
    }
    sparq_aligned_free(u);
    return SPARQ_OK;
}

sparq_status trellis_linear_gemm(const trellis_linear *lin, const float *x, int rows, float *y,
                                 sparq_pool *pool)
{
    return trellis_linear_gemm_path(lin, x, rows, y, pool, trellis_path_best());
}
