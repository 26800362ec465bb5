/* runtime/models/blocks.c — the shared blocks of runtime/models/blocks.h. */
#include <string.h>

#include "runtime/models/blocks.h"

void sq_block_moe(sq_exec *ex, const sq_moe_layer *ml, int L, const sq_block_moe_slots *sl, int d,
                  const float *xn, int rows, const sq_block_moe_bufs *m, const sq_observer *obs)
{
    const sq_backend *be = ex->be;
    const bool moe = ml->router != NULL;
    const int K = moe ? ml->top_k : 1, E = ml->n_exp;
    if (be->moe) { /* device backend: router, grouping and experts on the device (no observers there) */
        const sq_moe_ws ws = {m->rl, m->rw, m->lw, m->xg, m->g, m->u, m->dn, m->ridx, m->rows_of};
        be->moe(ex, ml, xn, rows, m->mo, &ws);
        return;
    }
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
    const bool all = obs && obs->all_experts;
    for (int e = 0; e < E; e++) {
        const int first = m->cnt[e], n = m->cnt[e + 1] - first;
        if (n == 0 && !all) continue;
        const sq_linear *gl = &ml->gate[e], *ul = &ml->up[e], *dl = &ml->down[e];
        const int I = gl->out;
        if (all) {
            /* calibration: this expert on every row; keep its routed rows' outputs */
            sq_observe(obs, L, sl->gate, e, xn, rows, d);
            sq_observe(obs, L, sl->up, e, xn, rows, d);
            sq_linear_forward(ex, gl, xn, rows, m->g);
            sq_linear_forward(ex, ul, xn, rows, m->u);
            be->swiglu(ex, m->g, m->u, (size_t)rows * I, m->g);
            sq_observe(obs, L, sl->down, e, m->g, rows, I);
            sq_linear_forward(ex, dl, m->g, rows, m->dn);
            for (int j = 0; j < n; j++) {
                int r = m->rows_of[first + j];
                be->axpy(ex, m->lw[first + j], m->dn + (size_t)r * d, (size_t)d, m->mo + (size_t)r * d);
            }
            continue;
        }
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

