/* quantize/calib_gpu.c — the GPU engine of the all-experts MoE capture
 * (calib_moe.c; the device side is kernels/cuda/calib_cuda.h), used with
 * `--device cuda`.
 *
 * Memory is planned before the layer: per resident expert its three fp32
 * weights and its down accumulator (inter² floats), plus the xn accumulator,
 * the row buffers and the routing (calib_cuda_plan), against the device's
 * free memory less a reserve for the LDLQ context (its Viterbi workspace,
 * at most 4 GiB, made or not yet, and 512 MB). As many experts as fit are
 * resident in a pass; the rest wait for the next pass (the capture forward
 * runs again). In a pass's first call the CPU dequantises expert e + 1 into
 * one pinned staging buffer (over the pool) while the GPU uploads and runs
 * expert e from the other; later calls find the weights resident. At a
 * pass's end the accumulators are downloaded into the host hess_acc, so
 * qz_capture_finish and the Hessian preparation see what the CPU capture
 * would have made (to fp32 summation order). With --devices it runs on the
 * first device listed (the LDLQ's batches are shared over all of them). */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/trellis.h"
#include "kernels/cuda/calib_cuda.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "quantize/job.h"

typedef struct gpu_engine {
    const calib_cuda_ops *ops;
    calib_cuda *dev;
    calib_cuda_dims dm;
    sparq_pool *pool;
    float *stage[2];  /* pinned: gate, up, down of one expert each */
    int *prow;        /* [max_rows·top_k] the pass's routed pairs: row, weight */
    float *pw;
} gpu_engine;

/* --- the weights as fp32 [out, in] ----------------------------------------------------------------- */

typedef struct deq_task {
    const sq_linear *l;
    float *out;
} deq_task;

#define DEQ_ROWS 128 /* a multiple of every FP8 block height */

static void deq_rows(void *ctx, size_t i, int tid)
{
    (void)tid;
    const deq_task *t = ctx;
    const sq_linear *l = t->l;
    const int r0 = (int)i * DEQ_ROWS, n = l->out - r0 < DEQ_ROWS ? l->out - r0 : DEQ_ROWS;
    float *o = t->out + (size_t)r0 * l->in;
    if (l->kind == SQ_LINEAR_FP8 || l->kind == SQ_LINEAR_MXFP4) sq_cpu_block_to_f32(l, r0, n, o);
    else sq_cpu_to_f32(l->kind, (const char *)l->w + (size_t)r0 * l->in * (l->kind == SQ_LINEAR_F32 ? 4 : 2),
                       (size_t)n * l->in, o);
}

/* out [l->out, l->in] = l's weight as the CPU linear uses it */
static sparq_status linear_to_f32(const sq_linear *l, float *out, sparq_pool *pool)
{
    RETURN_IF(l->bias, SPARQ_E_UNSUPPORTED, "%s: an expert with a bias (the MoE calibration hook has none)",
              l->name ? l->name : "expert");
    if (l->kind == SQ_LINEAR_EXL3) {
        const trellis_linear *t = l->impl;
        RETURN_IF(!t, SPARQ_E_STATE, "%s: EXL3 linear without its tensors", l->name ? l->name : "expert");
        float *w = sparq_malloc((size_t)t->k * t->n * sizeof(float)); /* [in, out] */
        RETURN_IF(!w, SPARQ_E_NOMEM, "%s: out of memory", l->name ? l->name : "expert");
        sparq_status st = trellis_linear_decode(t, w, pool);
        for (int r = 0; st == SPARQ_OK && r < t->n; r++)
            for (int c = 0; c < t->k; c++) out[(size_t)r * t->k + c] = w[(size_t)c * t->n + r];
        sparq_free(w);
        return st;
    }
    RETURN_IF(!l->w || l->forward || l->kind >= SQ_LINEAR_KIND_COUNT_, SPARQ_E_UNSUPPORTED,
              "%s: a %s linear the MoE calibration hook cannot read", l->name ? l->name : "expert",
              sq_linear_kind_name(l->kind));
    deq_task t = {l, out};
    sparq_pool_for(pool, (size_t)(l->out + DEQ_ROWS - 1) / DEQ_ROWS, deq_rows, &t);
    return SPARQ_OK;
}

/* --- the engine ------------------------------------------------------------------------------------ */

static sparq_status gpu_run(void *ctx, const qz_calib_call *c)
{
    gpu_engine *g = ctx;
    const calib_cuda_ops *ops = g->ops;
    const sq_calib_moe *jb = c->job;
    const int K = jb->top_k, d = jb->d, I = jb->inter;
    RETURN_IF(d != g->dm.d || I != g->dm.inter || jb->rows > g->dm.max_rows || K > g->dm.top_k ||
                  c->e1 - c->e0 > g->dm.slots || c->n_hx > g->dm.n_xacc,
              SPARQ_E_STATE, "MoE calibration: a call of %d rows, d %d, inter %d, top-%d, %d experts, %d xn Hessians "
              "beyond the GPU plan (%d, %d, %d, %d, %d, %d)", jb->rows, d, I, K, c->e1 - c->e0, c->n_hx,
              g->dm.max_rows, g->dm.d, g->dm.inter, g->dm.top_k, g->dm.slots, g->dm.n_xacc);
    const int p0 = c->cnt[c->e0], np = c->cnt[c->e1] - p0;
    for (int j = 0; j < np; j++) {
        const int p = c->pairs[p0 + j];
        g->prow[j] = p / K;
        g->pw[j] = jb->w[p];
    }
    FORWARD_IF(ops->begin(g->dev, jb->xn, jb->rows, c->out, np, g->prow, g->pw, (1u << c->n_hx) - 1u));
    for (int i = 0; i < c->n_hx; i++) c->hx[i]->count += (uint64_t)jb->rows;
    const size_t dI = (size_t)d * I;
    for (int e = c->e0; e < c->e1; e++) {
        const int slot = e - c->e0;
        if (c->first) {
            const int s = slot & 1;
            FORWARD_IF(ops->stage_wait(g->dev, s)); /* the upload two experts back is done with it */
            FORWARD_IF(linear_to_f32(&jb->gate[e], g->stage[s], g->pool));
            FORWARD_IF(linear_to_f32(&jb->up[e], g->stage[s] + dI, g->pool));
            FORWARD_IF(linear_to_f32(&jb->down[e], g->stage[s] + 2 * dI, g->pool));
            FORWARD_IF(ops->load(g->dev, slot, s, g->stage[s], g->stage[s] + dI, g->stage[s] + 2 * dI));
        }
        FORWARD_IF(ops->expert(g->dev, slot, c->hd[e] != NULL, c->cnt[e] - p0, c->cnt[e + 1] - c->cnt[e], jb->limit));
        if (c->hd[e]) c->hd[e]->count += (uint64_t)jb->rows;
    }
    return ops->end(g->dev, c->out);
}

/* The device accumulators replace the host ones: only this engine feeds them (the runtime reports none of
 * the hook's inputs through linear_input). */
static sparq_status gpu_end_pass(void *ctx, const qz_calib_call *c)
{
    gpu_engine *g = ctx;
    for (int i = 0; i < c->n_hx; i++) FORWARD_IF(g->ops->acc_get(g->dev, -1 - i, c->hx[i]->h));
    for (int e = c->e0; e < c->e1; e++)
        if (c->hd[e]) FORWARD_IF(g->ops->acc_get(g->dev, e - c->e0, c->hd[e]->h));
    return SPARQ_OK;
}

static void gpu_free(void *ctx)
{
    gpu_engine *g = ctx;
    if (!g) return;
    g->ops->free(g->dev);
    for (int i = 0; i < 2; i++) g->ops->host_free(g->stage[i]);
    sparq_free(g->prow);
    sparq_free(g->pw);
    sparq_free(g);
}

sparq_status qz_calib_engine_gpu(const calib_cuda_ops *ops, const calib_cuda_dims *dm, sparq_pool *pool,
                                 qz_calib_engine *out)
{
    memset(out, 0, sizeof *out);
    gpu_engine *g = sparq_calloc(1, sizeof *g);
    RETURN_IF(!g, SPARQ_E_NOMEM, "out of memory");
    g->ops = ops;
    g->dm = *dm;
    g->pool = pool;
    const size_t sb = 3 * (size_t)dm->d * dm->inter * sizeof(float);
    g->stage[0] = ops->host_alloc(sb);
    g->stage[1] = ops->host_alloc(sb);
    g->prow = sparq_malloc((size_t)dm->max_rows * dm->top_k * sizeof(int));
    g->pw = sparq_malloc((size_t)dm->max_rows * dm->top_k * sizeof(float));
    sparq_status st = g->stage[0] && g->stage[1] && g->prow && g->pw
                          ? SPARQ_OK
                          : sparq_err(SPARQ_E_NOMEM, "out of (pinned) host memory for the GPU calibration");
    if (st == SPARQ_OK) st = ops->create(dm, &g->dev);
    if (st != SPARQ_OK) {
        gpu_free(g);
        return st;
    }
    *out = (qz_calib_engine){.ctx = g, .run = gpu_run, .end_pass = gpu_end_pass, .free = gpu_free};
    return SPARQ_OK;
}

/* --- the plan -------------------------------------------------------------------------------------- */

/* The layer's routed-expert shape from its description: d (gate/up in), inter (down in), the xn Hessians
 * (expert slots leading a group with a shared input). false: no routed experts to capture this way. */
static bool moe_dims(const qjob *j, const sq_layer_desc *desc, calib_cuda_dims *dm)
{
    memset(dm, 0, sizeof *dm);
    if (!desc->moe || desc->n_experts < 1) return false;
    for (int s = 0; s < desc->n_slots; s++) {
        const sq_lin_desc *l = &desc->slot[s];
        if (l->role != SQ_ROLE_EXPERT || l->instances != desc->n_experts) continue;
        if (l->own_input) dm->inter = l->in;
        else {
            dm->d = l->in;
            if (l->group == s) dm->n_xacc++;
        }
    }
    dm->max_rows = j->batch_seqs * j->T;
    dm->top_k = j->cfg->num_experts_per_tok > 0 ? (int)j->cfg->num_experts_per_tok : 1;
    if (dm->top_k > desc->n_experts) dm->top_k = desc->n_experts;
    return dm->d > 0 && dm->inter > 0 && dm->n_xacc <= 2;
}

static bool gpu_calib_on(void)
{
    const char *e = getenv("SPARQ_QUANT_GPU_CALIB");
    return !(e && strcmp(e, "0") == 0);
}

uint64_t qz_calib_gpu_host_bytes(const qjob *j, const sq_layer_desc *desc)
{
    calib_cuda_dims dm;
    if (!j->o || j->o->device != QZ_DEVICE_CUDA || !gpu_calib_on() || !moe_dims(j, desc, &dm)) return 0;
    const uint64_t stage = 2ull * 3 * (uint64_t)dm.d * dm.inter * 4;
    const uint64_t pairs = (uint64_t)dm.max_rows * dm.top_k * 8;
    const uint64_t passes = (uint64_t)j->rows * j->T * (uint64_t)dm.d * 4; /* the per-call outputs, with passes */
    return stage + pairs + passes;
}

sparq_status qz_calib_gpu_setup(qjob *j, int L, const sq_layer_desc *desc, layer_capture *cap, calib_moe *cm, bool *on)
{
    *on = false;
    calib_cuda_dims dm;
    if (!j->gctx || !gpu_calib_on() || !moe_dims(j, desc, &dm)) return SPARQ_OK;
    const calib_cuda_ops *ops = sq_cuda_calib_ops();
    if (!ops) return sparq_err_context(SPARQ_E_UNSUPPORTED, "layer %d: the GPU calibration", L);
    size_t fixed = 0, per = 0, fr = 0, tot = 0;
    /* on the first --devices entry: an ldlq call sets this thread's device to its context's
     * (making the other entries' contexts left it on the last), and the capture's calls all
     * come from this thread */
    FORWARD_IF(j->gops->mem_info(j->gctx, &fr, &tot));
    FORWARD_IF(ops->mem_info(&fr, &tot));
    ops->plan(&dm, &fixed, &per);
    const size_t reserve = ((size_t)512 << 20) + ((size_t)4 << 30);
    const size_t avail = fr > reserve + fixed ? fr - reserve - fixed : 0;
    int n = (int)(avail / per < (size_t)desc->n_experts ? avail / per : (size_t)desc->n_experts);
    const char *cap_env = getenv("SPARQ_QUANT_CALIB_PASS_EXPERTS");
    if (cap_env && atoi(cap_env) > 0 && atoi(cap_env) < n) n = atoi(cap_env);
    RETURN_IF(n < 1, SPARQ_E_FIT, "layer %d: one expert's calibration needs %.2f GB of GPU memory (%.2f GB fixed), "
              "%.2f GB are free (%.2f GB kept for the LDLQ context)", L, per / 1e9, fixed / 1e9, fr / 1e9,
              reserve / 1e9);
    dm.slots = n;
    qz_calib_engine eng;
    FORWARD_IF(qz_calib_engine_gpu(ops, &dm, j->pool, &eng));
    sparq_status st = qz_calib_moe_init(cm, cap, desc->n_experts, n, &eng); /* cm owns the engine from here */
    if (st != SPARQ_OK) {
        qz_calib_moe_free(cm);
        return st;
    }
    if (cm->n_pass > 1)
        sparq_log(SPARQ_LOG_INFO, "layer %d: MoE calibration in %d passes of %d experts (%.2f GB of GPU memory each)", L,
                       cm->n_pass, n, (fixed + (size_t)n * per) / 1e9);
    *on = true;
    return SPARQ_OK;
}
