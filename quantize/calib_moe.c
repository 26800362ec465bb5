/* quantize/calib_moe.c — the all-experts MoE capture handed to an engine
 * (sq_observer.moe_all; job.h says how passes and outputs work): the hook
 * groups each call's routed rows by expert, resolves once the Hessians that
 * the runtime's own loop would feed through linear_input (the gate/up
 * group's leader with xn, each expert's down with its activation: the rules
 * of qz_capture_cb), and hands the call to the engine. Also here: the CPU
 * engine, the runtime's loop (runtime/models/blocks.c, sq_block_moe_all)
 * operation for operation, so a test can check this bookkeeping bit for bit
 * without a GPU. The GPU engine is calib_gpu.c. */
#include <string.h>

#include "common/alloc.h"
#include "quantize/job.h"
#include "runtime/models/blocks.h"

sparq_status qz_calib_moe_init(calib_moe *cm, layer_capture *cap, int n_exp, int per_pass, const qz_calib_engine *eng)
{
    memset(cm, 0, sizeof *cm);
    cm->eng = *eng;
    RETURN_IF(n_exp < 1 || per_pass < 1, SPARQ_E_ARG, "MoE calibration: %d experts, %d a pass", n_exp, per_pass);
    cm->cap = cap;
    cm->n_exp = n_exp;
    cm->per_pass = per_pass < n_exp ? per_pass : n_exp;
    cm->n_pass = (n_exp + cm->per_pass - 1) / cm->per_pass;
    cm->hd = sparq_calloc((size_t)n_exp, sizeof *cm->hd);
    cm->cnt = sparq_malloc((size_t)(n_exp + 1) * sizeof(int));
    RETURN_IF(!cm->hd || !cm->cnt, SPARQ_E_NOMEM, "MoE calibration: out of memory");
    cap->moe = cm;
    return SPARQ_OK;
}

void qz_calib_moe_pass(calib_moe *cm, int p)
{
    cm->pass = p;
    cm->cap->pass = p;
    cm->e0 = p * cm->per_pass;
    cm->e1 = cm->e0 + cm->per_pass < cm->n_exp ? cm->e0 + cm->per_pass : cm->n_exp;
    cm->call = 0;
}

static qz_calib_call pass_call(const calib_moe *cm)
{
    return (qz_calib_call){.e0 = cm->e0, .e1 = cm->e1, .n_hx = cm->pass == 0 ? cm->n_hx : 0, .hx = cm->hx,
                           .hd = cm->hd};
}

sparq_status qz_calib_moe_pass_end(calib_moe *cm)
{
    RETURN_IF(cm->pass > 0 && cm->call != cm->n_calls, SPARQ_E_STATE,
              "layer %d: MoE calibration pass %d made %d calls, pass 0 made %d", cm->cap->layer, cm->pass, cm->call,
              cm->n_calls);
    if (cm->pass == 0) cm->n_calls = cm->call;
    if (!cm->resolved || !cm->eng.end_pass) return SPARQ_OK; /* no call: nothing accumulated */
    const qz_calib_call c = pass_call(cm);
    return cm->eng.end_pass(cm->eng.ctx, &c);
}

void qz_calib_moe_free(calib_moe *cm)
{
    if (cm->eng.free) cm->eng.free(cm->eng.ctx);
    for (int i = 0; cm->acc && i < cm->n_calls; i++) sparq_free(cm->acc[i]);
    sparq_free(cm->acc);
    sparq_free(cm->acc_rows);
    sparq_free(cm->hd);
    sparq_free(cm->cnt);
    sparq_free(cm->pairs);
    if (cm->cap && cm->cap->moe == cm) cm->cap->moe = NULL, cm->cap->pass = 0;
    memset(cm, 0, sizeof *cm);
}

/* The Hessians the runtime's loop would feed (its reports for every expert's gate, up and down). */
static sparq_status resolve(calib_moe *cm, int layer, const sq_calib_moe *job)
{
    layer_capture *c = cm->cap;
    for (int e = 0; e < job->n_exp; e++) {
        hess_acc *t[2] = {qz_capture_target(c, layer, job->slot_gate, e, job->d),
                          qz_capture_target(c, layer, job->slot_up, e, job->d)};
        for (int i = 0; i < 2; i++) {
            if (!t[i]) continue;
            RETURN_IF(cm->n_hx == 2, SPARQ_E_UNSUPPORTED,
                      "layer %d: the experts' gate/up inputs feed more than two Hessians (one per expert?); the "
                      "MoE calibration hook takes at most two", layer);
            cm->hx[cm->n_hx++] = t[i];
        }
        cm->hd[e] = qz_capture_target(c, layer, job->slot_down, e, job->inter);
    }
    FORWARD_IF(c->st);
    cm->resolved = true;
    return SPARQ_OK;
}

/* The output buffer of this call: the runtime's own with one pass; with passes, the call's sum over them. */
static sparq_status call_out(calib_moe *cm, const sq_calib_moe *job, float **out)
{
    *out = job->out;
    if (cm->n_pass == 1) return SPARQ_OK;
    const size_t n = (size_t)job->rows * job->d;
    if (cm->pass == 0) {
        float **a = sparq_realloc(cm->acc, (size_t)(cm->call + 1) * sizeof *a);
        if (a) cm->acc = a;
        int *r = sparq_realloc(cm->acc_rows, (size_t)(cm->call + 1) * sizeof *r);
        if (r) cm->acc_rows = r;
        RETURN_IF(!a || !r, SPARQ_E_NOMEM, "MoE calibration: out of memory");
        a[cm->call] = sparq_malloc(n * sizeof(float));
        RETURN_IF(!a[cm->call], SPARQ_E_NOMEM, "MoE calibration: out of memory for a call's output");
        memcpy(a[cm->call], job->out, n * sizeof(float));
        r[cm->call] = job->rows;
        cm->n_calls = cm->call + 1; /* freed by qz_calib_moe_free */
    } else {
        RETURN_IF(cm->call >= cm->n_calls || cm->acc_rows[cm->call] != job->rows, SPARQ_E_STATE,
                  "layer %d: MoE calibration pass %d: call %d (%d rows) differs from pass 0's", cm->cap->layer,
                  cm->pass, cm->call, job->rows);
    }
    *out = cm->acc[cm->call];
    return SPARQ_OK;
}

sparq_status qz_calib_moe_cb(void *user, int layer, const sq_calib_moe *job)
{
    layer_capture *c = user;
    calib_moe *cm = c->moe;
    RETURN_IF(!cm || layer != c->layer, SPARQ_E_STATE, "MoE calibration hook: layer %d while capturing layer %d",
              layer, c->layer);
    RETURN_IF(job->n_exp != cm->n_exp || job->rows < 0 || job->top_k < 1, SPARQ_E_SHAPE,
              "layer %d: MoE calibration: %d experts (planned %d), %d rows, top-%d", layer, job->n_exp, cm->n_exp,
              job->rows, job->top_k);
    if (!cm->resolved) FORWARD_IF(resolve(cm, layer, job));
    const int np = job->rows * job->top_k;
    if (np > cm->cap_pairs) {
        int *p = sparq_realloc(cm->pairs, (size_t)np * sizeof(int));
        RETURN_IF(!p, SPARQ_E_NOMEM, "MoE calibration: out of memory");
        cm->pairs = p, cm->cap_pairs = np;
    }
    FORWARD_IF(sq_calib_moe_group(job, cm->cnt, cm->pairs));
    qz_calib_call cc = pass_call(cm);
    cc.job = job;
    cc.first = cm->call == 0;
    cc.cnt = cm->cnt;
    cc.pairs = cm->pairs;
    FORWARD_IF(call_out(cm, job, &cc.out));
    FORWARD_IF(cm->eng.run(cm->eng.ctx, &cc));
    if (cm->n_pass > 1 && cm->pass == cm->n_pass - 1)
        memcpy(job->out, cc.out, (size_t)job->rows * job->d * sizeof(float));
    cm->call++;
    return SPARQ_OK;
}

/* --- the CPU engine ------------------------------------------------------------------------------ */

typedef struct cpu_engine {
    sq_exec *ex;
    float *g, *u, *dn;
    size_t cap_g, cap_u, cap_dn;
} cpu_engine;

static sparq_status grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap) return SPARQ_OK;
    float *q = sparq_realloc(*p, n * sizeof(float));
    RETURN_IF(!q, SPARQ_E_NOMEM, "MoE calibration: out of memory");
    *p = q, *cap = n;
    return SPARQ_OK;
}

static sparq_status cpu_run(void *ctx, const qz_calib_call *c)
{
    cpu_engine *ce = ctx;
    sq_exec *ex = ce->ex;
    const sq_backend *be = ex->be;
    const sq_calib_moe *jb = c->job;
    const int rows = jb->rows, d = jb->d, I = jb->inter, K = jb->top_k;
    FORWARD_IF(grow(&ce->g, &ce->cap_g, (size_t)rows * I));
    FORWARD_IF(grow(&ce->u, &ce->cap_u, (size_t)rows * I));
    FORWARD_IF(grow(&ce->dn, &ce->cap_dn, (size_t)rows * d));
    for (int i = 0; i < c->n_hx; i++) qz_hess_add(c->hx[i], jb->xn, rows, d);
    for (int e = c->e0; e < c->e1; e++) {
        sq_linear_forward(ex, &jb->gate[e], jb->xn, rows, ce->g);
        sq_linear_forward(ex, &jb->up[e], jb->xn, rows, ce->u);
        if (jb->limit > 0) sq_swiglu_limit(ce->g, ce->u, (size_t)rows * I, jb->limit, ce->g);
        else be->swiglu(ex, ce->g, ce->u, (size_t)rows * I, ce->g);
        if (c->hd[e]) qz_hess_add(c->hd[e], ce->g, rows, I);
        sq_linear_forward(ex, &jb->down[e], ce->g, rows, ce->dn);
        for (int j = c->cnt[e]; j < c->cnt[e + 1]; j++) {
            const int p = c->pairs[j], r = p / K;
            be->axpy(ex, jb->w[p], ce->dn + (size_t)r * d, (size_t)d, c->out + (size_t)r * d);
        }
    }
    return sq_exec_take_error(ex);
}

static void cpu_free(void *ctx)
{
    cpu_engine *ce = ctx;
    if (!ce) return;
    sparq_free(ce->g);
    sparq_free(ce->u);
    sparq_free(ce->dn);
    sparq_free(ce);
}

sparq_status qz_calib_engine_cpu(sq_exec *ex, qz_calib_engine *out)
{
    cpu_engine *ce = sparq_calloc(1, sizeof *ce);
    RETURN_IF(!ce, SPARQ_E_NOMEM, "out of memory");
    ce->ex = ex;
    *out = (qz_calib_engine){.ctx = ce, .run = cpu_run, .end_pass = NULL, .free = cpu_free};
    return SPARQ_OK;
}
