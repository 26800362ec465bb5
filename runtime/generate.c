/* runtime/generate.c — micro-batched generation (see runtime/generate.h). */
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/generate.h"

static bool is_stop(const sq_gen_opts *o, int32_t t)
{
    if (o->ignore_stop) return false;
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop[i] == t) return true;
    return false;
}

typedef struct gen_state {
    sq_sampler **smp;
    bool *done;
    float *lg;    /* [N, V]: prefill logits of each sequence */
    float *glg;   /* [G, per, V]: a group's decode logits */
    int *gseq, *gn, *order, *rowseq;
    int32_t *gtok, *gid;  /* gid [N]: a sampled step's tokens */
    sq_sampler **rsmp;    /* [N]: a sampled step's samplers, row by row */
} gen_state;

static void state_free(gen_state *g, int N)
{
    for (int i = 0; g->smp && i < N; i++) sq_sampler_free(g->smp[i]);
    sparq_free(g->smp);
    sparq_free(g->done);
    sparq_free(g->lg);
    sparq_free(g->glg);
    sparq_free(g->gseq);
    sparq_free(g->gn);
    sparq_free(g->order);
    sparq_free(g->rowseq);
    sparq_free(g->gtok);
    sparq_free(g->gid);
    sparq_free(g->rsmp);
}

void sq_gen_result_free(sq_gen_result *r)
{
    for (int i = 0; r->out && i < r->n_seqs; i++) sparq_free(r->out[i]);
    sparq_free(r->out);
    sparq_free(r->n_out);
    memset(r, 0, sizeof *r);
}

/* Sequence i's next token is t; false when it ended. */
static bool take_id(const sq_gen_opts *o, gen_state *g, sq_gen_result *r, int i, int32_t t, int n_prompt, int ctx)
{
    r->n_decode++;
    if (is_stop(o, t)) return false;
    sq_sampler_accept(g->smp[i], t);
    r->out[i][r->n_out[i]++] = t;
    return r->n_out[i] < o->n_new && n_prompt + r->n_out[i] < ctx;
}

/* Sample sequence i's next token from host logits; false when it ended. */
static bool take(const sq_gen_opts *o, gen_state *g, sq_gen_result *r, int i, const float *logits, int n_prompt,
                 int ctx)
{
    return take_id(o, g, r, i, sq_sampler_sample(g->smp[i], logits), n_prompt, ctx);
}

/* One process: every active sequence in one sampled step a round (sq_dist_step_sample: on a device the
 * logits stay there), until all have ended. */
static sparq_status decode_sampled(sq_dist *d, const sq_gen_opts *o, gen_state *g, sq_gen_result *r, int N,
                                   int n_prompt, int ctx)
{
    for (;;) {
        int n = 0;
        for (int i = 0; i < N; i++)
            if (!g->done[i]) {
                g->gseq[n] = i;
                g->gtok[n] = r->out[i][r->n_out[i] - 1];
                g->rsmp[n] = g->smp[i];
                n++;
            }
        if (n == 0) return SPARQ_OK;
        FORWARD_IF(sq_dist_step_sample(d, n, g->gseq, g->gtok, g->rsmp, g->glg, g->gid));
        for (int j = 0; j < n; j++)
            if (!take_id(o, g, r, g->gseq[j], g->gid[j], n_prompt, ctx)) g->done[g->gseq[j]] = true;
    }
}

sparq_status sq_generate(sq_dist *d, const int32_t *prompt, int n_prompt, const sq_gen_opts *o, sq_gen_result *r)
{
    memset(r, 0, sizeof *r);
    const int N = o->n_seqs, V = (int)sq_dist_cfg(d)->vocab_size;
    const int ctx = sq_dist_options(d)->ctx, mr = sq_dist_options(d)->max_rows;
    RETURN_IF(N < 1 || N > sq_dist_options(d)->n_seq, SPARQ_E_ARG,
              "%d sequences at once, but the model has KV cache for %d", N, sq_dist_options(d)->n_seq);
    RETURN_IF(n_prompt < 1 || n_prompt >= ctx, SPARQ_E_RANGE, "prompt of %d tokens does not fit the context of %d",
              n_prompt, ctx);
    const int G = N < sq_dist_size(d) ? N : sq_dist_size(d);
    const int per = (N + G - 1) / G;
    gen_state g = {0};
    r->n_seqs = N;
    r->out = sparq_calloc((size_t)N, sizeof *r->out);
    r->n_out = sparq_calloc((size_t)N, sizeof *r->n_out);
    g.smp = sparq_calloc((size_t)N, sizeof *g.smp);
    g.done = sparq_calloc((size_t)N, sizeof *g.done);
    g.lg = sparq_malloc((size_t)N * (size_t)V * sizeof(float));
    g.glg = sparq_malloc((size_t)G * (size_t)per * (size_t)V * sizeof(float));
    g.gseq = sparq_malloc((size_t)G * (size_t)per * sizeof(int));
    g.gtok = sparq_malloc((size_t)G * (size_t)per * sizeof(int32_t));
    g.gn = sparq_calloc((size_t)G, sizeof(int));
    g.order = sparq_malloc((size_t)G * sizeof(int));
    g.rowseq = sparq_malloc((size_t)mr * sizeof(int));
    g.gid = sparq_malloc((size_t)N * sizeof(int32_t));
    g.rsmp = sparq_malloc((size_t)N * sizeof *g.rsmp);
    sparq_status st = SPARQ_OK;
    if (!r->out || !r->n_out || !g.smp || !g.done || !g.lg || !g.glg || !g.gseq || !g.gtok || !g.gn || !g.order ||
        !g.rowseq || !g.gid || !g.rsmp)
        st = sparq_err(SPARQ_E_NOMEM, "out of memory for %d sequences", N);
    for (int i = 0; st == SPARQ_OK && i < N; i++) {
        sq_sampler_params p = o->sampler;
        p.seed = o->sampler.seed + (uint64_t)i;
        st = sq_sampler_create(&g.smp[i], &p, o->n_vocab > 0 && o->n_vocab < V ? o->n_vocab : V);
        r->out[i] = sparq_malloc((size_t)(o->n_new > 0 ? o->n_new : 1) * sizeof(int32_t));
        if (st == SPARQ_OK && !r->out[i]) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        for (int k = 0; st == SPARQ_OK && k < n_prompt; k++) sq_sampler_accept(g.smp[i], prompt[k]);
    }
    /* prefill every sequence, all chunks in flight */
    double t0 = sparq_now();
    for (int i = 0; st == SPARQ_OK && i < N; i++) {
        st = sq_dist_seq_reset(d, i);
        for (int k = 0; k < mr; k++) g.rowseq[k] = i;
        for (int c0 = 0; st == SPARQ_OK && c0 < n_prompt; c0 += mr) {
            const int rows = n_prompt - c0 < mr ? n_prompt - c0 : mr;
            const bool last = c0 + rows == n_prompt;
            st = sq_dist_submit(d, rows, g.rowseq, prompt + c0, last ? SQ_LOGITS_LAST : SQ_LOGITS_NONE,
                                last ? g.lg + (size_t)i * V : NULL);
        }
    }
    while (st == SPARQ_OK && sq_dist_pending(d) > 0) st = sq_dist_wait(d);
    r->t_prompt = sparq_now() - t0;
    r->n_prompt = (long)n_prompt * N;
    /* first tokens from the prefill logits, then every group in flight */
    t0 = sparq_now();
    for (int i = 0; st == SPARQ_OK && i < N; i++)
        g.done[i] = o->n_new <= 0 || !take(o, &g, r, i, g.lg + (size_t)i * V, n_prompt, ctx);
    if (st == SPARQ_OK && sq_dist_size(d) == 1) {
        st = decode_sampled(d, o, &g, r, N, n_prompt, ctx);
        r->t_decode = sparq_now() - t0;
        state_free(&g, N);
        if (st != SPARQ_OK) sq_gen_result_free(r);
        return st;
    }
    int head = 0, inflight = 0;
    for (int k = 0; st == SPARQ_OK && k < G; k++) {
        for (int i = k; i < N; i += G)
            if (!g.done[i]) {
                g.gseq[k * per + g.gn[k]] = i;
                g.gtok[k * per + g.gn[k]] = r->out[i][r->n_out[i] - 1];
                g.gn[k]++;
            }
        if (g.gn[k] == 0) continue;
        st = sq_dist_submit(d, g.gn[k], g.gseq + k * per, g.gtok + k * per, SQ_LOGITS_ALL, g.glg + (size_t)k * per * V);
        g.order[(head + inflight++) % G] = k;
    }
    while (st == SPARQ_OK && inflight > 0) {
        st = sq_dist_wait(d);
        if (st != SPARQ_OK) break;
        const int k = g.order[head];
        head = (head + 1) % G;
        inflight--;
        int n = 0;
        for (int j = 0; j < g.gn[k]; j++) {
            const int i = g.gseq[k * per + j];
            if (!take(o, &g, r, i, g.glg + ((size_t)k * per + j) * V, n_prompt, ctx)) continue;
            g.gseq[k * per + n] = i;
            g.gtok[k * per + n] = r->out[i][r->n_out[i] - 1];
            n++;
        }
        g.gn[k] = n;
        if (n == 0) continue;
        st = sq_dist_submit(d, n, g.gseq + k * per, g.gtok + k * per, SQ_LOGITS_ALL, g.glg + (size_t)k * per * V);
        g.order[(head + inflight++) % G] = k;
    }
    r->t_decode = sparq_now() - t0;
    state_free(&g, N);
    if (st != SPARQ_OK) sq_gen_result_free(r);
    return st;
}
