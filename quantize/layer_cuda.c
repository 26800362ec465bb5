/* quantize/layer_cuda.c — `sparq quantize --device cuda`: a layer's linears
 * quantized through the GPU recursion (kernels/cuda/ldlq_cuda.h), many at a
 * time, with the CPU loop's results (layer.c) up to the order of the fp32
 * sums in the error feedback (ldlq_cuda.h says what that changes).
 *
 * The linears are grouped by (in, out, K) — in a MoE layer: every expert's
 * gate, every expert's up, every expert's down — keeping the quantizer's
 * order inside a group, and each group runs in batches sized by memory: the
 * device's free memory (after the encoder's workspace, less a margin) and a
 * host bound (a quarter of --max-mem, else 8 GiB) on the regularised weights
 * and prepared Hessians a batch holds. Per batch the CPU prepares each
 * distinct Hessian (on the GPU, kernels/cuda/hessian_cuda.h, or with
 * SPARQ_QUANT_GPU_HESSIAN=0 ldlq_hessian_prepare on the CPU; seeded by the first
 * linear that reads it, as the CPU loop) and regularises each weight (ldlq_regularize;
 * the scale search's tiles are encoded on the GPU; with --scale-search shared
 * the first expert's scale is reused, as on the CPU); the GPU runs the
 * recursion and the proxy; the CPU stores the fp16 scales. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "quantize/job.h"

typedef struct gpu_coder {
    qjob *j;
    int K;
    pthread_mutex_t *lock; /* the pool's threads share the context's encoder */
} gpu_coder;

static sparq_status gpu_encode(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded)
{
    const gpu_coder *g = ctx;
    if (g->lock) pthread_mutex_lock(g->lock);
    sparq_status st = g->j->gops->encode_host(g->j->gctx, g->K, g->j->o->cb, x, n_tiles, states, decoded);
    if (g->lock) pthread_mutex_unlock(g->lock);
    return st;
}

typedef struct gitem {
    int ref;                 /* index into the layer's refs (and ql) */
    int leader;              /* the first ref, in the quantizer's order, reading the same Hessian */
    int k, n, K, slot;
    sq_lin_role role;
    const char *key;         /* the linear's name */
    const char *leader_key;  /* the leader's name: the Hessian's seed */
    const float *h;          /* the mean Hessian (NULL: uncalibrated) */
} gitem;

static int cmp_gitem(const void *a, const void *b)
{
    const gitem *x = a, *y = b;
    if (x->k != y->k) return x->k - y->k;
    if (x->n != y->n) return x->n - y->n;
    if (x->K != y->K) return x->K - y->K;
    return x->ref - y->ref; /* the quantizer's order inside a group */
}

/* Host bytes a batch holds: regularised weights, their trellis, the prepared Hessians. */
static uint64_t host_bytes(int k, int n, int K, int n_hess, int n_items, bool gpu_hess)
{
    if (gpu_hess) n_hess = 0; /* only su and h_diag on the host */
    const uint64_t kn = (uint64_t)k * n;
    /* the fp32 weight as read and its regularised copy are both held until the copy is made */
    return (uint64_t)n_items * (2 * kn * 4 + kn * K / 8 + 4ull * (k + n)) +
           (uint64_t)n_hess * (2 * 4ull * k * k + 24ull * k);
}

uint64_t qz_cuda_host_budget(const qjob *j)
{
    const uint64_t floor = 1ull << 30;
    if (!j->o->max_mem) return 8ull << 30;
    return j->o->max_mem / 4 > floor ? j->o->max_mem / 4 : floor;
}

/* The Hessians are prepared on the GPU too unless SPARQ_QUANT_GPU_HESSIAN=0 (then
 * ldlq_hessian_prepare on the CPU, uploaded with each batch). */
static bool gpu_hessians(void)
{
    const char *e = getenv("SPARQ_QUANT_GPU_HESSIAN");
    return !(e && strcmp(e, "0") == 0);
}

/* How many items from it[0] (avail of one shape and K) one batch takes. */
static sparq_status batch_size(qjob *j, const gitem *it, int avail, int *out)
{
    size_t fr = 0, tot = 0, enc = 0;
    FORWARD_IF(j->gops->encoder_bytes(j->gctx, it[0].K, j->o->cb, &enc));
    FORWARD_IF(j->gops->mem_info(j->gctx, &fr, &tot));
    const size_t margin = (size_t)512 << 20;
    const size_t dev = fr > margin ? fr - margin : 0;
    const uint64_t host = qz_cuda_host_budget(j);
    const ldlq_cuda_shape s = {it[0].k, it[0].n, it[0].K, j->o->cb, 0};
    const bool gh = gpu_hessians();
    int m = 0, n_hess = 0;
    while (m < avail) {
        const int nh = n_hess + (m == 0 || it[m].leader != it[m - 1].leader);
        const size_t dbytes = gh ? j->gops->batch_bytes(&s, 0, m + 1, 0) + (size_t)nh * j->gops->hess_bytes(s.k)
                                 : j->gops->batch_bytes(&s, nh, m + 1, 0);
        if (dbytes > dev || host_bytes(s.k, s.n, s.K, nh, m + 1, gh) > host) break;
        n_hess = nh;
        m++;
    }
    RETURN_IF(m == 0, SPARQ_E_FIT, "%s: one %d x %d weight needs %.2f GB of GPU memory, %.2f GB are free",
              it[0].key, s.k, s.n, j->gops->batch_bytes(&s, 1, 1, 0) / 1e9, dev / 1e9);
    *out = m;
    return SPARQ_OK;
}

/* q's key and output arrays for a k×n linear at K bits. */
static sparq_status qlin_alloc(qlin *q, const char *key, int K, int k, int n)
{
    q->key = sparq_strdup(key);
    q->K = K, q->k = k, q->n = n;
    q->trellis = sparq_malloc((size_t)k * n / 256 * 16 * K * sizeof(uint16_t));
    q->suh = sparq_malloc((size_t)k * sizeof(uint16_t));
    q->svh = sparq_malloc((size_t)n * sizeof(uint16_t));
    RETURN_IF(!q->key || !q->trellis || !q->suh || !q->svh, SPARQ_E_NOMEM, "%s: out of memory", key);
    return SPARQ_OK;
}

/* After the GPU wrote q->trellis: the fp16 scales, the proxy the GPU computed, the runnable linear. */
static sparq_status qlin_finish(qjob *j, qlin *q, const ldlq_hessian *hs, const ldlq_reg *reg, double proxy)
{
    ldlq_result res = {.trellis = q->trellis, .suh = q->suh, .svh = q->svh};
    FORWARD_IF(ldlq_finish(hs, reg, NULL, proxy, q->key, &res));
    q->proxy = res.proxy_err;
    q->tl = (trellis_linear){.k = q->k, .n = q->n, .K = q->K, .cb = j->o->cb, .trellis = q->trellis, .suh = q->suh,
                             .svh = q->svh};
    j->rep->n_weights += (uint64_t)q->k * q->n;
    return SPARQ_OK;
}

/* The regularisation of a batch's weights, one per pool task. */
typedef struct reg_task {
    qjob *j;
    const gitem *items;
    float **w;          /* per item: the fp32 weight (freed here) */
    int *hidx;          /* per item: its prepared Hessian */
    ldlq_hessian **hs;
    ldlq_reg *reg;
    double *g_fixed;    /* per item: > 0 to skip the search */
    const ldlq_coder *coder;
    sparq_status st;
    pthread_mutex_t lock; /* st and the error message of the first failure */
    char msg[512];
} reg_task;

static void reg_one(void *ctx, size_t i, int tid)
{
    (void)tid;
    reg_task *t = ctx;
    const gitem *it = &t->items[i];
    if (t->reg[i].wr) return; /* done before the others (a shared scale's search) */
    ldlq_opts lo;
    qz_ldlq_opts(t->j, it->key, it->K, &lo);
    if (t->g_fixed[i] > 0) lo.g_fixed = t->g_fixed[i];
    sparq_status st = ldlq_regularize(t->hs[t->hidx[i]], t->w[i], it->n, &lo, t->coder, it->key, &t->reg[i]);
    sparq_free(t->w[i]);
    t->w[i] = NULL;
    if (st != SPARQ_OK) {
        pthread_mutex_lock(&t->lock);
        if (t->st == SPARQ_OK) {
            t->st = st;
            snprintf(t->msg, sizeof t->msg, "%s", sparq_errmsg());
        }
        pthread_mutex_unlock(&t->lock);
    }
}

/* Quantize items[0..m) (one shape and K) as one GPU batch into ql: the Hessians prepared
 * and the weights read in order, regularised over the pool, then the GPU recursion. */
static sparq_status run_batch(qjob *j, const gitem *items, int m, double g_shared[][TRELLIS_K_MAX + 1], qlin *ql,
                              sparq_progress *pb)
{
    const int k = items[0].k, n = items[0].n, K = items[0].K;
    ldlq_hessian **hs = sparq_calloc((size_t)m, sizeof *hs);
    ldlq_cuda_dhess **dh = sparq_calloc((size_t)m, sizeof *dh);
    ldlq_cuda_hess *gh = sparq_calloc((size_t)m, sizeof *gh);
    float *su = sparq_malloc((size_t)k * sizeof(float)), *hdiag = sparq_malloc((size_t)k * sizeof(float));
    const bool on_gpu = gpu_hessians();
    ldlq_reg *reg = sparq_calloc((size_t)m, sizeof *reg);
    ldlq_cuda_item *gi = sparq_calloc((size_t)m, sizeof *gi);
    float **w = sparq_calloc((size_t)m, sizeof *w);
    int *hidx = sparq_calloc((size_t)m, sizeof *hidx);
    double *gfix = sparq_calloc((size_t)m, sizeof *gfix);
    sparq_status st = hs && dh && gh && su && hdiag && reg && gi && w && hidx && gfix
                          ? SPARQ_OK
                          : sparq_err(SPARQ_E_NOMEM, "out of memory");
    int n_hess = 0;
    pthread_mutex_t enc_lock = PTHREAD_MUTEX_INITIALIZER;
    gpu_coder gc = {j, K, &enc_lock};
    const ldlq_coder coder = {gpu_encode, &gc};
    const double t0 = sparq_now();
    for (int i = 0; i < m && st == SPARQ_OK; i++) {
        const gitem *it = &items[i];
        if (i == 0 || it->leader != items[i - 1].leader) {
            char hname[600];
            snprintf(hname, sizeof hname, "%s (input Hessian)", it->leader_key);
            const uint64_t seed = qz_hash_str(j->o->seed, hname);
            if (on_gpu) {
                int ident = 0;
                float damp = 0;
                st = j->gops->hess_prepare(j->gctx, it->h, k, 0.0f, seed, hname, &dh[n_hess], su, hdiag, &ident, &damp);
                if (st == SPARQ_OK) st = ldlq_hessian_wrap(&hs[n_hess], k, su, hdiag, ident != 0, damp);
                if (st == SPARQ_OK) gh[n_hess] = j->gops->hess_of(dh[n_hess]);
            } else {
                st = ldlq_hessian_prepare(&hs[n_hess], it->h, k, 0.0f, seed, hname);
                const ldlq_hessian *p = hs[n_hess];
                if (st == SPARQ_OK) gh[n_hess] = (ldlq_cuda_hess){ldlq_hessian_hr(p), ldlq_hessian_l(p), ldlq_hessian_d(p), 0};
            }
            n_hess++; /* freed below whatever happened */
            if (st != SPARQ_OK) break;
        }
        hidx[i] = n_hess - 1;
        int out, in;
        st = qz_load_weight(j, it->key, &out, &in, &w[i], true);
        if (st == SPARQ_OK && (in != k || out != n))
            st = sparq_err(SPARQ_E_STATE, "%s: %d -> %d, expected %d -> %d", it->key, in, out, k, n);
        if (st == SPARQ_OK) st = qlin_alloc(&ql[it->ref], it->key, K, k, n);
    }
    /* the global scales: fixed, the searched one of the slot's first expert (searched here first
     * when this batch holds it), or a search per weight */
    reg_task rt = {.j = j, .items = items, .w = w, .hidx = hidx, .hs = hs, .reg = reg, .g_fixed = gfix,
                   .coder = &coder, .st = SPARQ_OK, .lock = PTHREAD_MUTEX_INITIALIZER};
    if (st == SPARQ_OK && j->o->scale_search == QZ_SCALE_SHARED) {
        for (int i = 0; i < m && rt.st == SPARQ_OK; i++) {
            if (items[i].role != SQ_ROLE_EXPERT) continue;
            double *gs = &g_shared[items[i].slot][K];
            if (!(*gs > 0)) { /* this slot's first expert: its search, before the others */
                reg_one(&rt, (size_t)i, 0);
                if (rt.st == SPARQ_OK) *gs = reg[i].g;
            }
            gfix[i] = *gs;
        }
    }
    if (st == SPARQ_OK && rt.st == SPARQ_OK) sparq_pool_for(j->pool, (size_t)m, reg_one, &rt);
    if (st == SPARQ_OK && rt.st != SPARQ_OK) st = sparq_err(rt.st, "%s", rt.msg);
    for (int i = 0; i < m && st == SPARQ_OK; i++)
        gi[i] = (ldlq_cuda_item){.hess = hidx[i], .wr = reg[i].wr, .trellis = ql[items[i].ref].trellis};
    const double t1 = sparq_now();
    if (st == SPARQ_OK) {
        const ldlq_cuda_shape s = {k, n, K, j->o->cb, 0};
        char what[300];
        snprintf(what, sizeof what, "%s .. (%d weights of %d x %d, K = %d)", items[0].key, m, k, n, K);
        st = j->gops->batch(j->gctx, &s, gh, n_hess, gi, m, what);
    }
    j->t_gpu += sparq_now() - t1;
    for (int i = 0; i < m && st == SPARQ_OK; i++) {
        /* the identity Hessian's proxy comes from the GPU too (plain sums of squares) */
        st = qlin_finish(j, &ql[items[i].ref], hs[gi[i].hess], &reg[i], gi[i].proxy_err);
        sparq_progress_add(pb, 1);
    }
    j->t_quant += sparq_now() - t0;
    for (int i = 0; i < m; i++) {
        if (hs) ldlq_hessian_free(hs[i]);
        if (dh && dh[i]) j->gops->hess_free(dh[i]);
        if (reg) ldlq_reg_free(&reg[i]);
        if (w) sparq_free(w[i]);
    }
    sparq_free(dh);
    sparq_free(su);
    sparq_free(hdiag);
    pthread_mutex_destroy(&rt.lock);
    pthread_mutex_destroy(&enc_lock);
    sparq_free(hs);
    sparq_free(gh);
    sparq_free(reg);
    sparq_free(gi);
    sparq_free(w);
    sparq_free(hidx);
    sparq_free(gfix);
    return st;
}

sparq_status qz_quantize_layer_cuda(qjob *j, int L, const sq_layer_desc *desc, const lin_ref *refs, int n_lin,
                                    qlin *ql, sparq_progress *pb, double *psum, double *pmax)
{
    const bool calibrated = j->o->method == QZ_METHOD_TRELLIS;
    gitem *it = sparq_calloc((size_t)n_lin, sizeof *it);
    RETURN_IF(!it, SPARQ_E_NOMEM, "out of memory");
    sparq_status st = SPARQ_OK;
    for (int i = 0; i < n_lin; i++) {
        const sq_linear *l = sq_model_linear(j->m, L, refs[i].slot, refs[i].inst);
        if (!l) {
            st = sparq_err(SPARQ_E_STATE, "layer %d: linear %s/%d missing", L, desc->slot[refs[i].slot].name,
                           refs[i].inst);
            break;
        }
        /* as the CPU loop: a Hessian is prepared again whenever the next linear reads another one */
        const int leader = (i > 0 && refs[i].h == refs[i - 1].h) ? it[i - 1].leader : i;
        const sq_lin_role role = desc->slot[refs[i].slot].role;
        it[i] = (gitem){.ref = i, .leader = leader, .k = l->in, .n = l->out, .slot = refs[i].slot, .role = role,
                        .key = l->name, .K = qz_bits_for(j, l->name, L, role),
                        .h = calibrated && refs[i].h ? refs[i].h->h : NULL};
        it[i].leader_key = it[leader].key;
    }
    if (st == SPARQ_OK) qsort(it, (size_t)n_lin, sizeof *it, cmp_gitem);
    double g_shared[SQ_LAYER_MAX_SLOTS][TRELLIS_K_MAX + 1] = {{0}};
    for (int g0 = 0; g0 < n_lin && st == SPARQ_OK;) {
        int g1 = g0 + 1;
        while (g1 < n_lin && it[g1].k == it[g0].k && it[g1].n == it[g0].n && it[g1].K == it[g0].K) g1++;
        for (int b0 = g0; b0 < g1 && st == SPARQ_OK;) {
            int m = 0;
            st = batch_size(j, it + b0, g1 - b0, &m);
            if (st == SPARQ_OK) st = run_batch(j, it + b0, m, g_shared, ql, pb);
            b0 += m;
        }
        g0 = g1;
    }
    for (int i = 0; i < n_lin && st == SPARQ_OK; i++) {
        *psum += ql[i].proxy;
        if (ql[i].proxy > *pmax) *pmax = ql[i].proxy;
    }
    sparq_free(it);
    return st;
}

sparq_status qz_quantize_linear_cuda(qjob *j, const char *key, const char *wkey, int K, const ldlq_hessian *hs,
                                     qlin *q)
{
    memset(q, 0, sizeof *q);
    const double t0 = sparq_now();
    float *w = NULL;
    int out, in;
    FORWARD_IF(qz_load_weight(j, wkey, &out, &in, &w, true));
    ldlq_opts lo;
    qz_ldlq_opts(j, wkey, K, &lo);
    gpu_coder gc = {j, K};
    const ldlq_coder coder = {gpu_encode, &gc};
    ldlq_reg reg;
    sparq_status st = ldlq_regularize(hs, w, out, &lo, &coder, wkey, &reg);
    sparq_free(w);
    FORWARD_IF(st);
    st = qlin_alloc(q, key, K, in, out);
    ldlq_cuda_item gi = {.hess = 0, .wr = reg.wr, .trellis = q->trellis};
    const ldlq_cuda_hess gh = {ldlq_hessian_hr(hs), ldlq_hessian_l(hs), ldlq_hessian_d(hs), 0};
    const ldlq_cuda_shape s = {in, out, K, j->o->cb, 0};
    const double t1 = sparq_now();
    if (st == SPARQ_OK) st = j->gops->batch(j->gctx, &s, &gh, 1, &gi, 1, key);
    j->t_gpu += sparq_now() - t1;
    if (st == SPARQ_OK) st = qlin_finish(j, q, hs, &reg, gi.proxy_err);
    ldlq_reg_free(&reg);
    j->t_quant += sparq_now() - t0;
    return st;
}
