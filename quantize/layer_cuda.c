/* quantize/layer_cuda.c — `sparq quantize --device cuda`: a layer's linears
 * quantized through the GPU recursion (kernels/cuda/ldlq_cuda.h), many at a
 * time, with the CPU loop's results (layer.c) up to the order of the fp32
 * sums in the error feedback (ldlq_cuda.h says what that changes).
 *
 * The linears are grouped by (in, out, K) — in a MoE layer: every expert's
 * gate, every expert's up, every expert's down — keeping the quantizer's
 * order inside a group, and each group runs in batches sized by memory
 * (plan_batch: two batches must fit at once, see there). Per batch the CPU
 * prepares each distinct Hessian (on the GPU, kernels/cuda/hessian_cuda.h,
 * or with SPARQ_QUANT_GPU_HESSIAN=0 ldlq_hessian_prepare on the CPU; seeded
 * by the first linear that reads it, as the CPU loop) and regularises each
 * weight (ldlq_regularize_on with the CPU's engine, uploaded with the batch;
 * SPARQ_QUANT_GPU_REG=1: the GPU's, the matrix staying on the device for the
 * batch; the same floats; the scale search's tiles are encoded on the GPU;
 * with --scale-search shared the first expert's scale is reused, as on the
 * CPU); the GPU runs the recursion and the proxy; the CPU stores the fp16
 * scales. The batches go through quantize/gpu_pipe.h's pipeline, so the CPU
 * prepares batch b+1 while the GPU runs batch b (SPARQ_QUANT_GPU_OVERLAP=0:
 * one after the other); the batches, and so the output, are the same either
 * way, and a weight's words do not depend on its batch (ldlq_cuda.h).
 *
 * --devices LIST: one context per listed device (j->gdev), one pipeline each
 * on its own thread, all taking their next batch from one queue
 * (qz_pipe_run_multi); a device plans its batch from its own free memory.
 * The CPU stages stay in queue order (the pipe runs prepares one at a time),
 * each weight's results go to its own slot (ql[ref]), and its words do not
 * depend on the batch or the device that made them: the output is the one
 * GPU's, byte for byte (tests/gpu/test_quantize_devices.sh). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "quantize/gpu_pipe.h"
#include "quantize/job.h"

/* The scale search's coder: the context's encode_host, which the pool's threads may call
 * at once (it serialises them itself). */
typedef struct gpu_coder {
    qjob *j;
    ldlq_cuda *c; /* the device the search encodes on */
    int K;
} gpu_coder;

static sparq_status gpu_encode(void *ctx, const float *x, size_t n_tiles, uint16_t *states, float *decoded)
{
    const gpu_coder *g = ctx;
    return g->j->gops->encode_host(g->c, g->K, g->j->o->cb, x, n_tiles, states, decoded);
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
static uint64_t host_bytes(int k, int n, int K, int n_hess, int n_items, bool gpu_hess, bool gpu_reg)
{
    if (gpu_hess) n_hess = 0; /* only su and h_diag on the host */
    const uint64_t kn = (uint64_t)k * n;
    /* the fp32 weight as read and its regularised copy (on the host unless on the GPU) are both
     * held until the copy is made */
    return (uint64_t)n_items * ((gpu_reg ? 1 : 2) * kn * 4 + kn * K / 8 + 4ull * (k + n)) +
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

/* The regularisation's matrix work on the GPU with SPARQ_QUANT_GPU_REG=1, else on the CPU's
 * threads (the regularised weights uploaded with each batch); the same floats either way by
 * construction (tested on a GPU); opt-in: under the pipeline's overlap it gained 3-7 % of a
 * layer on a 16-core host for more GPU memory (docs/benchmarks-quantize.md §7.6). */
static bool gpu_reg(void)
{
    const char *e = getenv("SPARQ_QUANT_GPU_REG");
    return e && strcmp(e, "1") == 0;
}

/* The GPU regularisation engine of context c (quantize/ldlq.h, kernels/cuda/ldlq_cuda.h). */
static ldlq_reg_engine gpu_engine(const qjob *j, ldlq_cuda *c)
{
    const ldlq_cuda_ops *g = j->gops;
    return (ldlq_reg_engine){c,         g->reg_load, g->reg_sumsq, g->reg_scale_had, g->reg_tile_sumsq,
                             g->reg_tiles, g->reg_scale, NULL,    g->reg_release};
}

/* The batch's view of a regularised weight: the engine's device matrix, or the host copy. */
static const float *reg_weight(const qjob *j, const ldlq_reg *r)
{
    return r->wr ? r->wr : j->gops->reg_device(r->dev);
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
    const ldlq_reg_engine *eng; /* the GPU's, or NULL: the CPU's */
    sparq_status st;
    pthread_mutex_t lock; /* st and the error message of the first failure */
    char msg[512];
} reg_task;

static void reg_one(void *ctx, size_t i, int tid)
{
    (void)tid;
    reg_task *t = ctx;
    const gitem *it = &t->items[i];
    if (t->reg[i].dev) return; /* done before the others (a shared scale's search) */
    ldlq_opts lo;
    qz_ldlq_opts(t->j, it->key, it->K, &lo);
    if (t->g_fixed[i] > 0) lo.g_fixed = t->g_fixed[i];
    sparq_status st = ldlq_regularize_on(t->hs[t->hidx[i]], t->w[i], it->n, &lo, t->coder,
                                         t->eng ? t->eng : &ldlq_reg_engine_cpu, it->key, &t->reg[i]);
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

/* One GPU batch of a layer: items[0..m), one shape and K, from prepare to release. */
typedef struct gbatch {
    const gitem *items;
    int m, n_hess;
    ldlq_hessian **hs;
    ldlq_cuda_dhess **dh;
    ldlq_cuda_hess *gh;
    ldlq_reg *reg;
    ldlq_cuda_item *gi;
    float **w;
    int *hidx;
    double *gfix;
    ldlq_cuda_pending *pend;
    size_t dev_bytes;    /* device memory it holds from its preparation (Hessians) and submit to its release */
    uint64_t host_bytes; /* host memory it holds (host_bytes()) */
    char what[300];
} gbatch;

/* A layer's run through the pipeline (quantize/gpu_pipe.h). */
typedef struct glayer {
    qjob *j;
    const gitem *it;
    int n;
    qlin *ql;
    sparq_progress *pb;
    double (*g_shared)[TRELLIS_K_MAX + 1];
    bool gpu_hess, gpu_reg;
    int plan_first; /* the item plan_batch sizes a batch from (plans run one at a time) */
    int n_dev;      /* pipelines (--devices entries) */
} glayer;

_Static_assert(QZ_MAX_DEVICES <= QZ_PIPE_MAX, "a pipeline per --devices entry");

/* One device's pipeline over the layer: the callbacks' ctx. */
typedef struct gdev {
    glayer *L;
    ldlq_cuda *c;
    ldlq_reg_engine eng; /* its regularisation engine (glayer.gpu_reg) */
    int share;     /* the contexts on its GPU (a device listed twice: 2); each plans from its share */
    char name[48]; /* "CUDA device N": its errors' context */
} gdev;

/* The shape of a batch of items like it. */
static ldlq_cuda_shape batch_shape(const glayer *L, const gitem *it)
{
    return (ldlq_cuda_shape){it->k, it->n, it->K, L->j->o->cb, 0, L->gpu_reg};
}

/* Device bytes a batch of m items reading nh Hessians holds from its preparation: its Hessians
 * and its regularised weights (on the GPU: prepare makes both there). */
static size_t dev_early_bytes(const glayer *L, const ldlq_cuda_shape *s, int nh, int m)
{
    const ldlq_cuda_ops *g = L->j->gops;
    const size_t hess = L->gpu_hess ? (size_t)nh * g->hess_bytes(s->k) : 0;
    return hess + (L->gpu_reg ? (size_t)m * g->reg_bytes(s->k, s->n) : 0);
}

/* Device bytes a batch of m items reading nh Hessians holds in all (its allocation and the above). */
static size_t dev_bytes(const glayer *L, const ldlq_cuda_shape *s, int nh, int m)
{
    return L->j->gops->batch_bytes(s, L->gpu_hess ? 0 : nh, m, 0) + dev_early_bytes(L, s, nh, m);
}

/* What a batch of the first m items from L->plan_first holds (qz_pipe_fit's cost). */
static void batch_cost(void *ctx, int m, qz_pipe_cost *c)
{
    const glayer *L = ctx;
    const gitem *it = L->it + L->plan_first;
    int nh = 0;
    for (int i = 0; i < m; i++) nh += i == 0 || it[i].leader != it[i - 1].leader;
    const ldlq_cuda_shape s = batch_shape(L, &it[0]);
    c->dev = dev_bytes(L, &s, nh, m);
    c->dev_early = dev_early_bytes(L, &s, nh, m);
    c->host = host_bytes(s.k, s.n, s.K, nh, m, L->gpu_hess, L->gpu_reg);
}

/* Testing: SPARQ_QUANT_GPU_MAX_BATCH=N caps every batch at N weights (many small batches, so
 * that --devices spreads a small model's layer over every device); 0 or unset: no cap. */
static int max_batch(void)
{
    const char *e = getenv("SPARQ_QUANT_GPU_MAX_BATCH");
    return e ? atoi(e) : 0;
}

/* The batch sizes: qz_pipe_fit's rule (two batches at once; docs/cli-quantize.md, "On the
 * GPU") over the device's free memory after the encoders, less a margin, and the host
 * budget qz_cuda_host_budget (shared evenly by the --devices' pipelines, so that all of
 * them together stay within it), within the group of items[first] (one shape and K). */
static sparq_status plan_batch(void *ctx, int first, const void *busy_v, int *out)
{
    gdev *d = ctx;
    glayer *L = d->L;
    qjob *j = L->j;
    const gbatch *busy = busy_v;
    const gitem *it = L->it + first;
    int avail = 1;
    while (first + avail < L->n && it[avail].k == it[0].k && it[avail].n == it[0].n && it[avail].K == it[0].K)
        avail++;
    size_t fr = 0, tot = 0, enc = 0;
    FORWARD_IF(j->gops->encoder_bytes(d->c, it[0].K, j->o->cb, &enc));
    FORWARD_IF(j->gops->mem_info(d->c, &fr, &tot));
    const size_t margin = (size_t)512 << 20;
    /* contexts on one GPU see each other's memory: a batch planned by one and not yet submitted
     * is not taken from the free memory the other sees, so each plans from its share */
    fr /= (size_t)d->share;
    const qz_pipe_room r = {.dev_free = fr > margin ? fr - margin : 0, .dev_held = busy ? busy->dev_bytes : 0,
                            .host = qz_cuda_host_budget(j) / (uint64_t)L->n_dev, .host_held = busy ? busy->host_bytes : 0,
                            .busy = busy != NULL};
    L->plan_first = first;
    *out = qz_pipe_fit(&r, avail, batch_cost, L);
    const int cap = max_batch();
    if (cap > 0 && *out > cap) *out = cap;
    if (*out > 0 || busy) return SPARQ_OK;
    const ldlq_cuda_shape s = batch_shape(L, &it[0]);
    return sparq_err(SPARQ_E_FIT, "%s: one %d x %d weight needs %.2f GB of GPU memory, %.2f GB are free", it[0].key,
                     s.k, s.n, dev_bytes(L, &s, 1, 1) / 1e9, r.dev_free / 1e9);
}

static void release_batch(void *ctx, void *bv)
{
    glayer *L = ((gdev *)ctx)->L;
    gbatch *b = bv;
    if (!b) return;
    for (int i = 0; i < b->m; i++) {
        if (b->hs) ldlq_hessian_free(b->hs[i]);
        if (b->dh && b->dh[i]) L->j->gops->hess_free(b->dh[i]);
        if (b->reg) ldlq_reg_free(&b->reg[i]);
        if (b->w) sparq_free(b->w[i]);
    }
    sparq_free(b->hs);
    sparq_free(b->dh);
    sparq_free(b->gh);
    sparq_free(b->reg);
    sparq_free(b->gi);
    sparq_free(b->w);
    sparq_free(b->hidx);
    sparq_free(b->gfix);
    sparq_free(b);
}

/* The CPU stage: the Hessians prepared and the weights read in order, then regularised over
 * the pool (a shared scale's search first, by the slot's first expert). */
static sparq_status prepare_batch(void *ctx, int first, int m, void **out)
{
    gdev *d = ctx;
    glayer *L = d->L;
    qjob *j = L->j;
    const gitem *items = L->it + first;
    const int k = items[0].k, n = items[0].n, K = items[0].K;
    gbatch *b = sparq_calloc(1, sizeof *b);
    RETURN_IF(!b, SPARQ_E_NOMEM, "out of memory");
    *out = b;
    b->items = items;
    b->m = m;
    b->hs = sparq_calloc((size_t)m, sizeof *b->hs);
    b->dh = sparq_calloc((size_t)m, sizeof *b->dh);
    b->gh = sparq_calloc((size_t)m, sizeof *b->gh);
    b->reg = sparq_calloc((size_t)m, sizeof *b->reg);
    b->gi = sparq_calloc((size_t)m, sizeof *b->gi);
    b->w = sparq_calloc((size_t)m, sizeof *b->w);
    b->hidx = sparq_calloc((size_t)m, sizeof *b->hidx);
    b->gfix = sparq_calloc((size_t)m, sizeof *b->gfix);
    float *su = sparq_malloc((size_t)k * sizeof(float)), *hdiag = sparq_malloc((size_t)k * sizeof(float));
    sparq_status st = b->hs && b->dh && b->gh && b->reg && b->gi && b->w && b->hidx && b->gfix && su && hdiag
                          ? SPARQ_OK
                          : sparq_err(SPARQ_E_NOMEM, "out of memory");
    const bool on_gpu = L->gpu_hess;
    for (int i = 0; i < m && st == SPARQ_OK; i++) {
        const gitem *it = &items[i];
        if (i == 0 || it->leader != items[i - 1].leader) {
            char hname[600];
            snprintf(hname, sizeof hname, "%s (input Hessian)", it->leader_key);
            const uint64_t seed = qz_hash_str(j->o->seed, hname);
            const int h = b->n_hess++; /* freed by release whatever happened */
            if (on_gpu) {
                int ident = 0;
                float damp = 0;
                st = j->gops->hess_prepare(d->c, it->h, k, 0.0f, seed, hname, &b->dh[h], su, hdiag, &ident, &damp);
                if (st == SPARQ_OK) st = ldlq_hessian_wrap(&b->hs[h], k, su, hdiag, ident != 0, damp);
                if (st == SPARQ_OK) b->gh[h] = j->gops->hess_of(b->dh[h]);
            } else {
                st = ldlq_hessian_prepare(&b->hs[h], it->h, k, 0.0f, seed, hname);
                const ldlq_hessian *p = b->hs[h];
                if (st == SPARQ_OK)
                    b->gh[h] = (ldlq_cuda_hess){ldlq_hessian_hr(p), ldlq_hessian_l(p), ldlq_hessian_d(p), 0};
            }
            if (st != SPARQ_OK) break;
        }
        b->hidx[i] = b->n_hess - 1;
        int o, in;
        st = qz_load_weight(j, it->key, &o, &in, &b->w[i], true);
        if (st == SPARQ_OK && (in != k || o != n))
            st = sparq_err(SPARQ_E_STATE, "%s: %d -> %d, expected %d -> %d", it->key, in, o, k, n);
        if (st == SPARQ_OK) st = qlin_alloc(&L->ql[it->ref], it->key, K, k, n);
    }
    sparq_free(su);
    sparq_free(hdiag);
    const ldlq_cuda_shape s = batch_shape(L, &items[0]);
    b->dev_bytes = dev_bytes(L, &s, b->n_hess, m);
    b->host_bytes = host_bytes(k, n, K, b->n_hess, m, on_gpu, L->gpu_reg);
    gpu_coder gc = {j, d->c, K};
    const ldlq_coder coder = {gpu_encode, &gc};
    /* the global scales: fixed, the searched one of the slot's first expert (searched here first
     * when this batch holds it), or a search per weight */
    reg_task rt = {.j = j, .items = items, .w = b->w, .hidx = b->hidx, .hs = b->hs, .reg = b->reg,
                   .g_fixed = b->gfix, .coder = &coder, .eng = L->gpu_reg ? &d->eng : NULL, .st = SPARQ_OK,
                   .lock = PTHREAD_MUTEX_INITIALIZER};
    if (st == SPARQ_OK && j->o->scale_search == QZ_SCALE_SHARED) {
        for (int i = 0; i < m && rt.st == SPARQ_OK; i++) {
            if (items[i].role != SQ_ROLE_EXPERT) continue;
            double *gs = &L->g_shared[items[i].slot][K];
            if (!(*gs > 0)) { /* this slot's first expert: its search, before the others */
                reg_one(&rt, (size_t)i, 0);
                if (rt.st == SPARQ_OK) *gs = b->reg[i].g;
            }
            b->gfix[i] = *gs;
        }
    }
    if (st == SPARQ_OK && rt.st == SPARQ_OK) sparq_pool_for(j->pool, (size_t)m, reg_one, &rt);
    if (st == SPARQ_OK && rt.st != SPARQ_OK) st = sparq_err(rt.st, "%s", rt.msg);
    pthread_mutex_destroy(&rt.lock);
    for (int i = 0; i < m && st == SPARQ_OK; i++)
        b->gi[i] = (ldlq_cuda_item){.hess = b->hidx[i], .wr = reg_weight(j, &b->reg[i]),
                                    .trellis = L->ql[items[i].ref].trellis};
    snprintf(b->what, sizeof b->what, "%s .. (%d weights of %d x %d, K = %d)", items[0].key, m, k, n, K);
    return st;
}

static sparq_status submit_batch(void *ctx, void *bv)
{
    const gdev *d = ctx;
    const glayer *L = d->L;
    gbatch *b = bv;
    const ldlq_cuda_shape s = batch_shape(L, &b->items[0]);
    return L->j->gops->batch_submit(d->c, &s, b->gh, b->n_hess, b->gi, b->m, b->what, &b->pend);
}

static sparq_status wait_batch(void *ctx, void *bv, double *gpu_seconds)
{
    const glayer *L = ((gdev *)ctx)->L;
    gbatch *b = bv;
    const sparq_status st = L->j->gops->batch_wait(b->pend, gpu_seconds);
    b->pend = NULL;
    return st;
}

/* The CPU stage after the GPU: the fp16 scales and the runnable linears, in order. */
static sparq_status finish_batch(void *ctx, void *bv)
{
    glayer *L = ((gdev *)ctx)->L;
    gbatch *b = bv;
    sparq_status st = SPARQ_OK;
    for (int i = 0; i < b->m && st == SPARQ_OK; i++) {
        /* the identity Hessian's proxy comes from the GPU too (plain sums of squares) */
        st = qlin_finish(L->j, &L->ql[b->items[i].ref], b->hs[b->gi[i].hess], &b->reg[i], b->gi[i].proxy_err);
        sparq_progress_add(L->pb, 1);
    }
    return st;
}

/* Whether the CPU's part overlaps the GPU's (SPARQ_QUANT_GPU_OVERLAP=0: each batch waited for
 * right after its submit; the same batches, so the same output). */
static int gpu_overlap(void)
{
    const char *e = getenv("SPARQ_QUANT_GPU_OVERLAP");
    return !(e && strcmp(e, "0") == 0);
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
    glayer gl = {.j = j, .it = it, .n = n_lin, .ql = ql, .pb = pb, .g_shared = g_shared, .gpu_hess = gpu_hessians(),
                 .gpu_reg = gpu_reg()};
    const int nd = j->n_gdev;
    gl.n_dev = nd;
    gdev dv[QZ_PIPE_MAX];
    qz_pipe_ops ops[QZ_PIPE_MAX];
    for (int d = 0; d < nd; d++) {
        dv[d] = (gdev){.L = &gl, .c = j->gdev[d], .eng = gpu_engine(j, j->gdev[d])};
        for (int e = 0; e < nd; e++) dv[d].share += j->rep->devices[e] == j->rep->devices[d];
        snprintf(dv[d].name, sizeof dv[d].name, "CUDA device %d", j->rep->devices[d]);
        ops[d] = (qz_pipe_ops){&dv[d], plan_batch, prepare_batch, submit_batch, wait_batch, finish_batch,
                               release_batch, nd > 1 ? dv[d].name : NULL};
    }
    qz_pipe_stats ps[QZ_PIPE_MAX] = {{0}};
    const double t0 = sparq_now();
    if (st == SPARQ_OK) st = qz_pipe_run_multi(ops, nd, n_lin, gpu_overlap(), ps);
    for (int d = 0; d < nd; d++) {
        j->t_gpu += ps[d].gpu;
        j->t_gpu_dev[d] += ps[d].gpu;
    }
    j->t_quant += sparq_now() - t0;
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
    gpu_coder gc = {j, j->gctx, K};
    const ldlq_coder coder = {gpu_encode, &gc};
    ldlq_reg reg;
    const bool on_gpu = gpu_reg();
    const ldlq_reg_engine eng = gpu_engine(j, j->gctx);
    sparq_status st = ldlq_regularize_on(hs, w, out, &lo, &coder, on_gpu ? &eng : &ldlq_reg_engine_cpu, wkey, &reg);
    sparq_free(w);
    FORWARD_IF(st);
    st = qlin_alloc(q, key, K, in, out);
    ldlq_cuda_item gi = {.hess = 0, .wr = reg_weight(j, &reg), .trellis = q->trellis};
    const ldlq_cuda_hess gh = {ldlq_hessian_hr(hs), ldlq_hessian_l(hs), ldlq_hessian_d(hs), 0};
    const ldlq_cuda_shape s = {in, out, K, j->o->cb, 0, on_gpu};
    ldlq_cuda_pending *pend = NULL;
    double gpu_s = 0;
    if (st == SPARQ_OK) st = j->gops->batch_submit(j->gctx, &s, &gh, 1, &gi, 1, key, &pend);
    if (st == SPARQ_OK) st = j->gops->batch_wait(pend, &gpu_s);
    j->t_gpu += gpu_s;
    j->t_gpu_dev[0] += gpu_s; /* a single linear (lm_head) runs on the first device */
    if (st == SPARQ_OK) st = qlin_finish(j, q, hs, &reg, gi.proxy_err);
    ldlq_reg_free(&reg);
    j->t_quant += sparq_now() - t0;
    return st;
}
