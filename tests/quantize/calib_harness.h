/* tests/quantize/calib_harness.h — a random routed-expert layer and the two
 * ways of capturing it, for test_calib_moe.c (the CPU engine, bit for bit)
 * and tests/gpu/test_calib_cuda.c (the GPU engine, to fp32 rounding):
 *  - the reference: the runtime's own all-experts loop (sq_block_moe_all
 *    without a hook) reporting to qz_capture_cb;
 *  - the hook: the same calls through sq_observer.moe_all = qz_calib_moe_cb
 *    with an engine, in passes of `per_pass` experts.
 * Both run the same calls (several batches of rows, as forward_all makes);
 * ch_compare returns the worst relative (Frobenius) differences of the
 * outputs and of every Hessian, and whether all are bit-identical. */
#ifndef SPARQ_TESTS_QUANTIZE_CALIB_HARNESS_H
#define SPARQ_TESTS_QUANTIZE_CALIB_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "quantize/job.h"
#include "runtime/models/blocks.h"

#define CH_MAX_CALLS 4

typedef struct ch_layer {
    int E, d, I, K, n_calls, rows[CH_MAX_CALLS];
    float limit;
    sq_linear_kind kind;
    sq_layer_desc desc;
    sq_linear *gate, *up, *down;
    void **mem; /* each linear's weight and scale storage */
    int n_mem;
    float *xn[CH_MAX_CALLS];
    int *idx[CH_MAX_CALLS];
    float *w[CH_MAX_CALLS];
} ch_layer;

static uint64_t ch_rs = 12345;
static float ch_u(void) /* uniform [-1, 1) */
{
    ch_rs = ch_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(ch_rs >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static uint8_t ch_byte(void)
{
    ch_rs = ch_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(ch_rs >> 56);
}

static void *ch_keep(ch_layer *L, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    L->mem = realloc(L->mem, (size_t)(L->n_mem + 1) * sizeof *L->mem);
    L->mem[L->n_mem++] = p;
    return p;
}

/* A random [out, in] linear of kind k, values ~ scale. */
static void ch_linear(ch_layer *L, sq_linear *l, int out, int in, float scale, const char *name)
{
    memset(l, 0, sizeof *l);
    l->kind = L->kind, l->in = in, l->out = out, l->name = name;
    const size_t n = (size_t)out * in;
    if (L->kind == SQ_LINEAR_F32) {
        float *w = ch_keep(L, n * 4);
        for (size_t i = 0; i < n; i++) w[i] = scale * ch_u();
        l->w = w;
    } else if (L->kind == SQ_LINEAR_BF16 || L->kind == SQ_LINEAR_F16) {
        uint16_t *w = ch_keep(L, n * 2);
        for (size_t i = 0; i < n; i++)
            w[i] = L->kind == SQ_LINEAR_BF16 ? sparq_f32_to_bf16(scale * ch_u()) : sparq_f32_to_f16(scale * ch_u());
        l->w = w;
    } else { /* MXFP4: two E2M1 codes a byte, one UE8M0 scale per row and 32 columns (2^-3 .. 2^0 · scale) */
        uint8_t *w = ch_keep(L, n / 2), *s = ch_keep(L, (size_t)out * (in / 32));
        for (size_t i = 0; i < n / 2; i++) w[i] = ch_byte();
        const int e0 = 127 + (int)floorf(log2f(scale)) - 2;
        for (size_t i = 0; i < (size_t)out * (in / 32); i++) s[i] = (uint8_t)(e0 - (int)((ch_u() + 1.0f) * 1.5f));
        l->w = w, l->scale = s, l->block_rows = 1, l->block_cols = 32;
    }
}

/* E experts of d → I → d, top-K routing, calls of the given row counts. */
static void ch_make(ch_layer *L, sq_linear_kind kind, int E, int d, int I, int K, const int *rows, int n_calls,
                    float limit)
{
    memset(L, 0, sizeof *L);
    L->kind = kind, L->E = E, L->d = d, L->I = I, L->K = K, L->n_calls = n_calls, L->limit = limit;
    sq_layer_desc *D = &L->desc;
    D->n_slots = 4, D->moe = true, D->n_experts = E;
    D->slot[0] = (sq_lin_desc){"router", "r", SQ_ROLE_ROUTER, d, E, 1, 0, false, false};
    D->slot[1] = (sq_lin_desc){"experts.gate_proj", "g{E}", SQ_ROLE_EXPERT, d, I, E, 1, false, true};
    D->slot[2] = (sq_lin_desc){"experts.up_proj", "u{E}", SQ_ROLE_EXPERT, d, I, E, 1, false, true};
    D->slot[3] = (sq_lin_desc){"experts.down_proj", "d{E}", SQ_ROLE_EXPERT, I, d, E, 3, true, true};
    L->gate = calloc((size_t)E, sizeof *L->gate);
    L->up = calloc((size_t)E, sizeof *L->up);
    L->down = calloc((size_t)E, sizeof *L->down);
    for (int e = 0; e < E; e++) {
        ch_linear(L, &L->gate[e], I, d, 1.0f / sqrtf((float)d) * 2, "gate");
        ch_linear(L, &L->up[e], I, d, 1.0f / sqrtf((float)d) * 2, "up");
        ch_linear(L, &L->down[e], d, I, 1.0f / sqrtf((float)I), "down");
    }
    for (int c = 0; c < n_calls; c++) {
        const int R = L->rows[c] = rows[c];
        L->xn[c] = malloc((size_t)R * d * sizeof(float) + 1);
        L->idx[c] = malloc((size_t)R * K * sizeof(int) + 1);
        L->w[c] = malloc((size_t)R * K * sizeof(float) + 1);
        for (size_t i = 0; i < (size_t)R * d; i++) L->xn[c][i] = 2.0f * ch_u();
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) {
                int e;
                bool taken;
                do { /* distinct experts in a row */
                    e = (int)((ch_u() + 1.0f) * 0.5f * E) % E;
                    taken = false;
                    for (int q = 0; q < k; q++) taken |= L->idx[c][r * K + q] == e;
                } while (taken);
                L->idx[c][r * K + k] = e;
                L->w[c][r * K + k] = 0.1f + 0.45f * (ch_u() + 1.0f);
            }
    }
}

static void ch_free(ch_layer *L)
{
    for (int i = 0; i < L->n_mem; i++) free(L->mem[i]);
    free(L->mem);
    free(L->gate), free(L->up), free(L->down);
    for (int c = 0; c < L->n_calls; c++) free(L->xn[c]), free(L->idx[c]), free(L->w[c]);
}

static sq_calib_moe ch_job(const ch_layer *L, int c, float *out)
{
    return (sq_calib_moe){.rows = L->rows[c], .d = L->d, .inter = L->I, .n_exp = L->E, .top_k = L->K, .xn = L->xn[c],
                          .gate = L->gate, .up = L->up, .down = L->down, .slot_gate = 1, .slot_up = 2, .slot_down = 3,
                          .idx = L->idx[c], .w = L->w[c], .limit = L->limit, .out = out};
}

/* The capture's outputs: out[c] [rows, d] after the (last) pass. */
typedef struct ch_result {
    layer_capture cap;
    float *out[CH_MAX_CALLS];
} ch_result;

static int ch_max_rows(const ch_layer *L)
{
    int m = 0;
    for (int c = 0; c < L->n_calls; c++) m = L->rows[c] > m ? L->rows[c] : m;
    return m;
}

/* eng NULL: the runtime's loop reporting to qz_capture_cb; else the hook with eng in passes of per_pass. */
static sparq_status ch_run(sq_exec *ex, const ch_layer *L, const qz_calib_engine *eng, int per_pass, ch_result *res)
{
    memset(res, 0, sizeof *res);
    FORWARD_IF(qz_capture_init(&res->cap, 7, &L->desc, true));
    const int R = ch_max_rows(L);
    sq_calib_moe_ws ws = {malloc((size_t)R * L->I * 4), malloc((size_t)R * L->I * 4), malloc((size_t)R * L->d * 4),
                          malloc((size_t)(L->E + 1) * 4), malloc((size_t)R * L->K * 4)};
    for (int c = 0; c < L->n_calls; c++) res->out[c] = malloc((size_t)L->rows[c] * L->d * 4);
    calib_moe cm;
    sparq_status st = SPARQ_OK;
    int n_pass = 1;
    if (eng) {
        st = qz_calib_moe_init(&cm, &res->cap, L->E, per_pass, eng);
        n_pass = cm.n_pass;
    }
    sq_observer obs = {.user = &res->cap, .linear_input = qz_capture_cb, .moe_all = eng ? qz_calib_moe_cb : NULL,
                       .all_experts = true};
    for (int p = 0; p < n_pass && st == SPARQ_OK; p++) {
        if (eng) qz_calib_moe_pass(&cm, p);
        for (int c = 0; c < L->n_calls && st == SPARQ_OK; c++) {
            /* the runtime's output starts as zeros (sq_block_moe's memset), every pass */
            memset(res->out[c], 0, (size_t)L->rows[c] * L->d * 4);
            const sq_calib_moe job = ch_job(L, c, res->out[c]);
            st = sq_block_moe_all(ex, 7, &job, &obs, &ws);
        }
        if (st == SPARQ_OK && eng) st = qz_calib_moe_pass_end(&cm);
    }
    if (st == SPARQ_OK) st = res->cap.st;
    if (eng) qz_calib_moe_free(&cm);
    free(ws.g), free(ws.u), free(ws.dn), free(ws.cnt), free(ws.pairs);
    return st;
}

static void ch_result_free(ch_layer *L, ch_result *r)
{
    for (int c = 0; c < L->n_calls; c++) free(r->out[c]);
    qz_capture_free(&r->cap);
}

static double ch_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Worst relative differences of t against ref: outputs (*d_out), Hessians (*d_h); counts must match
 * (*counts_ok); *same: everything bit-identical. */
static void ch_compare(const ch_layer *L, ch_result *t, ch_result *ref, double *d_out, double *d_h, bool *counts_ok,
                       bool *same)
{
    *d_out = *d_h = 0;
    *counts_ok = *same = true;
    for (int c = 0; c < L->n_calls; c++) {
        const size_t n = (size_t)L->rows[c] * L->d;
        const double r = ch_rel(t->out[c], ref->out[c], n);
        *d_out = r > *d_out ? r : *d_out;
        *same &= memcmp(t->out[c], ref->out[c], n * 4) == 0;
    }
    for (int s = 1; s <= 3; s += 2) {
        const int insts = s == 3 ? L->E : 1;
        for (int e = 0; e < insts; e++) {
            hess_acc *a = qz_capture_hessian(&t->cap, s, e), *b = qz_capture_hessian(&ref->cap, s, e);
            if (!a || !b || !a->h || !b->h || a->k != b->k) {
                *counts_ok = *same = false;
                continue;
            }
            *counts_ok &= a->count == b->count;
            const size_t n = (size_t)a->k * a->k;
            const double r = ch_rel(a->h, b->h, n);
            *d_h = r > *d_h ? r : *d_h;
            *same &= memcmp(a->h, b->h, n * 4) == 0;
        }
    }
}

#endif
