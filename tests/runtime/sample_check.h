/* tests/runtime/sample_check.h — the split sampling path (runtime/sampler.h,
 * sq_sampler_sample_rows through a backend's `sample_select`) against the
 * whole-row sampler, draw by draw, on random logits full of ties (values on a
 * 1/8 grid, ±0 both present), for an exec of any backend: the CPU's in
 * tests/runtime/test_sampler.c, the CUDA one in tests/gpu/test_sample_cuda.c.
 * Each step samples 1..8 rows, each row with its own pair of samplers (same
 * parameters and seed): A on a host copy with sq_sampler_sample, B through
 * the exec; both accept A's token, so the repetition history grows alike.
 * The backend's op is wrapped to count its rows, so a run that silently fell
 * back to the host path is seen. Needs SPARQ_DEVICE_SAMPLING=1 (main sets it). */
#ifndef SPARQ_TESTS_SAMPLE_CHECK_H
#define SPARQ_TESTS_SAMPLE_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "runtime/sampler.h"
#include "t.h"

static uint64_t sc_rng = 0x9E3779B97F4A7C15ull;
static uint32_t sc_next(void)
{
    sc_rng = sc_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(sc_rng >> 32);
}

/* a row of ld logits: a 1/8 grid in [-8, 8) (many ties), -0 beside +0, a few large values */
static void sc_row(float *l, int ld)
{
    for (int i = 0; i < ld; i++) {
        const uint32_t u = sc_next();
        float v = (float)((int)(u % 128u) - 64) / 8.0f;
        if (v == 0.0f && (u & 0x100000u)) v = -0.0f;
        if ((u >> 24) == 0xFFu && (u & 0x80u)) v = 12.0f + (float)((u >> 8) % 4u); /* rare high ties */
        l[i] = v;
    }
}

static const sq_backend *sc_inner;
static long sc_op_rows;
static sparq_status sc_counting_select(sq_exec *ex, float *logits, int rows, int ld, const sq_sample_req *req,
                                       int32_t *const *ids, float *const *vals, uint8_t *bad)
{
    sc_op_rows += rows;
    return sc_inner->sample_select(ex, logits, rows, ld, req, ids, vals, bad);
}

/* `draws` draws at vocabulary n_vocab (rows of ld ≥ n_vocab) with parameters p; expect_op: every row must go
 * through the op (a setting the device serves). Returns the mismatches. */
static int sample_check(sq_exec *ex, int n_vocab, int ld, const sq_sampler_params *p, int draws, bool expect_op,
                        const char *what)
{
    enum { R = 8 };
    sq_backend wrapped = *ex->be;
    const sq_backend *orig = ex->be;
    sc_inner = orig;
    wrapped.sample_select = sc_counting_select;
    ex->be = &wrapped;
    sc_op_rows = 0;
    sq_sampler *A[R], *B[R];
    for (int r = 0; r < R; r++) {
        sq_sampler_params q = *p;
        q.seed = p->seed + 1000u * (uint64_t)r;
        CHECK(sq_sampler_create(&A[r], &q, n_vocab) == SPARQ_OK);
        CHECK(sq_sampler_create(&B[r], &q, n_vocab) == SPARQ_OK);
    }
    float *host = malloc((size_t)R * ld * sizeof(float)), *scratch = malloc((size_t)R * ld * sizeof(float));
    float *mem = orig->alloc(ex, (size_t)R * ld * sizeof(float));
    CHECK(host && scratch && mem);
    int bad_draws = 0, done = 0, step = 0;
    while (done < draws) {
        const int rows = 1 + step++ % R;
        for (int r = 0; r < rows; r++) sc_row(host + (size_t)r * ld, ld);
        CHECK(orig->to_device(ex, mem, host, (size_t)rows * ld * sizeof(float)) == SPARQ_OK);
        int32_t got[R], want[R];
        int bad = 0;
        CHECK(sq_sampler_sample_rows(ex, B, mem, rows, ld, scratch, got, &bad) == SPARQ_OK);
        CHECK_EQ_INT(bad, -1);
        for (int r = 0; r < rows; r++) {
            want[r] = sq_sampler_sample(A[r], host + (size_t)r * ld);
            if (got[r] != want[r] && bad_draws++ < 5)
                fprintf(stderr, "  %s: step %d row %d: split path %d, whole row %d\n", what, step, r, got[r], want[r]);
            sq_sampler_accept(A[r], want[r]);
            sq_sampler_accept(B[r], want[r]);
        }
        done += rows;
    }
    /* a NaN in row 2 of 3 is found, not sampled */
    for (int r = 0; r < 3; r++) sc_row(host + (size_t)r * ld, ld);
    host[(size_t)2 * ld + ld / 2] = NAN;
    CHECK(orig->to_device(ex, mem, host, (size_t)3 * ld * sizeof(float)) == SPARQ_OK);
    int32_t ids[3];
    int bad = -1;
    CHECK(sq_sampler_sample_rows(ex, B, mem, 3, ld, scratch, ids, &bad) == SPARQ_OK);
    CHECK_EQ_INT(bad, 2);
    if (expect_op) CHECK_MSG(sc_op_rows >= done, "%s: %ld of %d rows went through sample_select", what, sc_op_rows, done);
    else CHECK_MSG(sc_op_rows == 0, "%s: %ld rows went through sample_select, expected the host path", what, sc_op_rows);
    printf("  %-44s vocab %6d/%6d: %5d draws, %d differ%s\n", what, n_vocab, ld, done, bad_draws,
           expect_op ? "" : " (host path)");
    for (int r = 0; r < R; r++) sq_sampler_free(A[r]), sq_sampler_free(B[r]);
    orig->free(ex, mem);
    free(host);
    free(scratch);
    ex->be = orig;
    return bad_draws;
}

typedef struct sc_setting {
    const char *name;
    float temp;
    int top_k;
    float top_p, min_p, rep;
} sc_setting;

static const sc_setting sc_settings[] = {
    {"greedy", 0.0f, 40, 0.95f, 0.05f, 1.0f},
    {"greedy, repeat penalty 1.3", 0.0f, 0, 1.0f, 0.0f, 1.3f},
    {"defaults (T 0.8, k 40, p 0.95, min-p 0.05)", 0.8f, 40, 0.95f, 0.05f, 1.0f},
    {"top-k 1", 1.0f, 1, 1.0f, 0.0f, 1.0f},
    {"T 1.5, k 1024", 1.5f, 1024, 1.0f, 0.0f, 1.0f},
    {"T 0.7, k 100, p 0.5, min-p 0.1, penalty 1.1", 0.7f, 100, 0.5f, 0.1f, 1.1f},
    {"T 1, k 7, p 0.9, penalty 0.8", 1.0f, 7, 0.9f, 0.0f, 0.8f},
};

/* Every setting at vocabulary n_vocab (row length ld); the no-top-k setting (host path) with few draws. */
static void sample_check_all(sq_exec *ex, int n_vocab, int ld, int draws)
{
    for (size_t i = 0; i < sizeof sc_settings / sizeof sc_settings[0]; i++) {
        const sc_setting *c = &sc_settings[i];
        sq_sampler_params p;
        sq_sampler_params_default(&p);
        p.temp = c->temp, p.top_k = c->top_k, p.top_p = c->top_p, p.min_p = c->min_p, p.repeat_penalty = c->rep;
        p.seed = 17 + i;
        const int cands = p.top_k > 0 && p.top_k < n_vocab ? p.top_k : n_vocab; /* the sampler's rule */
        const bool op = p.temp <= 0 || cands <= SQ_SAMPLE_MAX_K;
        CHECK_EQ_INT(sample_check(ex, n_vocab, ld, &p, draws, op, c->name), 0);
    }
    sq_sampler_params p;
    sq_sampler_params_default(&p);
    p.top_k = 0, p.temp = 1.0f, p.top_p = 0.9f, p.min_p = 0.0f, p.seed = 99;
    CHECK_EQ_INT(sample_check(ex, n_vocab, ld, &p, n_vocab > SQ_SAMPLE_MAX_K ? 24 : draws,
                              n_vocab <= SQ_SAMPLE_MAX_K, "no top-k (T 1, p 0.9)"),
                 0);
}

#endif
