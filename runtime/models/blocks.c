/* runtime/models/blocks.c — the shared blocks of runtime/models/blocks.h. */
#include <math.h>
#include <string.h>

#include "runtime/models/blocks.h"

/* sq_block_moe on the host: b->mo = the MoE's output. */
static void moe_host(sq_exec *ex, const sq_moe_layer *ml, int L, const sq_block_moe_slots *sl, int d, const float *xn,
                     int rows, const sq_block_moe_bufs *m, const sq_observer *obs)
{
    const sq_backend *be = ex->be;
    const bool moe = ml->router != NULL;
    const int K = moe ? ml->top_k : 1, E = ml->n_exp;
    memset(m->mo, 0, (size_t)rows * d * sizeof(float));
    if (moe) {
        sq_observe(obs, L, sl->router, 0, xn, rows, d);
        sq_linear_forward(ex, ml->router, xn, rows, m->rl);
        be->router_topk(ex, m->rl, rows, E, K, ml->norm_topk, m->ridx, m->rw);
        if (obs && obs->router) obs->router(obs->user, L, rows, K, m->ridx, m->rw);
    } else {
        for (int r = 0; r < rows; r++) {
            m->ridx[r] = 0;
            m->rw[r] = 1.0f;
        }
    }
    if (moe && obs && obs->all_experts) {
        /* calibration: every expert on every row (a hook's or the loop below) */
        const sq_calib_moe job = {.rows = rows, .d = d, .inter = ml->gate[0].out, .n_exp = E, .top_k = K, .xn = xn,
                                  .gate = ml->gate, .up = ml->up, .down = ml->down, .slot_gate = sl->gate,
                                  .slot_up = sl->up, .slot_down = sl->down, .idx = m->ridx, .w = m->rw,
                                  .limit = 0.0f, .out = m->mo};
        const sq_calib_moe_ws ws = {m->g, m->u, m->dn, m->cnt, m->rows_of};
        const sparq_status st = sq_block_moe_all(ex, L, &job, obs, &ws);
        if (st != SPARQ_OK) sq_exec_set_error(ex, st);
        return;
    }
    /* counting sort of (row, slot) pairs by expert */
    memset(m->cnt, 0, (size_t)(E + 1) * sizeof(int));
    for (int i = 0; i < rows * K; i++) m->cnt[m->ridx[i] + 1]++;
    for (int e = 0; e < E; e++) m->cnt[e + 1] += m->cnt[e];
    memcpy(m->off, m->cnt, (size_t)(E + 1) * sizeof(int));
    for (int i = 0; i < rows * K; i++) {
        int slot = m->off[m->ridx[i]]++;
        m->rows_of[slot] = i / K;
        m->lw[slot] = m->rw[i];
    }
    for (int e = 0; e < E; e++) {
        const int first = m->cnt[e], n = m->cnt[e + 1] - first;
        if (n == 0 || (ml->own_n > 1 && e % ml->own_n != ml->own_k)) continue; /* another rank's expert */
        const sq_linear *gl = &ml->gate[e], *ul = &ml->up[e], *dl = &ml->down[e];
        const int I = gl->out;
        for (int j = 0; j < n; j++)
            memcpy(m->xg + (size_t)j * d, xn + (size_t)m->rows_of[first + j] * d, (size_t)d * sizeof(float));
        sq_observe(obs, L, sl->gate, e, m->xg, n, d);
        sq_observe(obs, L, sl->up, e, m->xg, n, d);
        sq_linear_forward(ex, gl, m->xg, n, m->g);
        sq_linear_forward(ex, ul, m->xg, n, m->u);
        be->swiglu(ex, m->g, m->u, (size_t)n * I, m->g);
        sq_observe(obs, L, sl->down, e, m->g, n, I);
        sq_linear_forward(ex, dl, m->g, n, m->dn);
        for (int j = 0; j < n; j++)
            be->axpy(ex, m->lw[first + j], m->dn + (size_t)j * d, (size_t)d,
                     m->mo + (size_t)m->rows_of[first + j] * d);
    }
}

void sq_block_moe(sq_exec *ex, const sq_moe_layer *ml, int L, const sq_block_moe_slots *sl, int d,
                  const float *xn, int rows, const sq_block_moe_bufs *m, const sq_observer *obs, float *residual)
{
    const sq_backend *be = ex->be;
    const bool split = ml->combine && ml->combine->fn;
    if (be->moe) { /* device backend: router, grouping and experts on the device (no observers there) */
        const sq_moe_ws ws = {m->rl, m->rw, m->lw, m->xg, m->g, m->u, m->dn, m->ridx, m->rows_of};
        if (!split) {
            be->moe(ex, ml, xn, rows, residual ? residual : m->mo, &ws, residual != NULL);
            return;
        }
        be->moe(ex, ml, xn, rows, m->mo, &ws, false); /* this rank's experts; the others' come from the combine */
    } else {
        moe_host(ex, ml, L, sl, d, xn, rows, m, obs);
    }
    if (split) { /* the expert split: every rank's experts, summed in rank order */
        const sparq_status st = ml->combine->fn(ml->combine->user, m->mo, rows, d);
        if (st != SPARQ_OK) {
            sq_exec_set_error(ex, st);
            return;
        }
    }
    if (residual) be->axpy(ex, 1.0f, m->mo, (size_t)rows * d, residual);
}

void sq_swiglu_limit(const float *g, const float *u, size_t n, float limit, float *out)
{
    for (size_t i = 0; i < n; i++) {
        float a = g[i], b = u[i];
        if (limit > 0) {
            a = a < limit ? a : limit;
            b = b < -limit ? -limit : b > limit ? limit : b;
        }
        out[i] = a / (1.0f + expf(-a)) * b;
    }
}

sparq_status sq_calib_moe_group(const sq_calib_moe *job, int *cnt, int *pairs)
{
    const int E = job->n_exp, n = job->rows * job->top_k;
    memset(cnt, 0, (size_t)(E + 1) * sizeof(int));
    for (int i = 0; i < n; i++) {
        const int e = job->idx[i];
        RETURN_IF(e < 0 || e >= E, SPARQ_E_RANGE, "MoE calibration: row %d routes to expert %d of %d", i / job->top_k,
                  e, E);
        cnt[e + 1]++;
    }
    for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    for (int i = 0; i < n; i++) pairs[cnt[job->idx[i]]++] = i; /* cnt[e] ends as the start of e + 1 */
    for (int e = E; e > 0; e--) cnt[e] = cnt[e - 1];
    cnt[0] = 0;
    return SPARQ_OK;
}

sparq_status sq_block_moe_all(sq_exec *ex, int L, const sq_calib_moe *job, const sq_observer *obs,
                              const sq_calib_moe_ws *ws)
{
    if (obs && obs->moe_all) return obs->moe_all(obs->user, L, job);
    const sq_backend *be = ex->be;
    const int rows = job->rows, d = job->d, I = job->inter, K = job->top_k;
    FORWARD_IF(sq_calib_moe_group(job, ws->cnt, ws->pairs));
    for (int e = 0; e < job->n_exp; e++) {
        sq_observe(obs, L, job->slot_gate, e, job->xn, rows, d);
        sq_observe(obs, L, job->slot_up, e, job->xn, rows, d);
        sq_linear_forward(ex, &job->gate[e], job->xn, rows, ws->g);
        sq_linear_forward(ex, &job->up[e], job->xn, rows, ws->u);
        if (job->limit > 0) sq_swiglu_limit(ws->g, ws->u, (size_t)rows * I, job->limit, ws->g);
        else be->swiglu(ex, ws->g, ws->u, (size_t)rows * I, ws->g);
        sq_observe(obs, L, job->slot_down, e, ws->g, rows, I);
        sq_linear_forward(ex, &job->down[e], ws->g, rows, ws->dn);
        for (int j = ws->cnt[e]; j < ws->cnt[e + 1]; j++) {
            const int p = ws->pairs[j], r = p / K;
            be->axpy(ex, job->w[p], ws->dn + (size_t)r * d, (size_t)d, job->out + (size_t)r * d);
        }
    }
    return SPARQ_OK;
}
