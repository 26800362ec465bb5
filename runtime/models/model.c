/* runtime/models/model.c — the model core: loading what every architecture
 * has, and the public calls of runtime/model.h, which check their common
 * arguments and hand the forward pass to the architecture (sq_graph_ops).
 *
 * Load: a model directory or one node of a bundle (open_bundle: its files
 * checked against the manifest, every block's checksum included, and ctx ×
 * users × chunk from the plan it was packed for), the
 * config, the architecture's table row (runtime/arch.h), the mapped
 * checkpoint, then every layer's linears as its description names them —
 * dense, FP8 and MXFP4 matrices used in place (the FP8 block from the
 * config's quantization_config when it has one, every FP8/UE8M0 code checked
 * once), EXL3 ones through kernels/cpu/trellis.h —
 * and last the architecture's own load (norms, embeddings, head, KV cache,
 * workspace, device upload). Tensors stay in the mmap (sf_open); only small
 * vectors are widened to fp32 copies. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/bundle.h"
#include "formats/manifest.h"
#include "formats/weights.h"
#include "kernels/cpu/ops.h"
#include "runtime/memplan.h"
#include "runtime/sampler.h"
#include "runtime/models/model_impl.h"

void sq_model_opts_default(sq_model_opts *o)
{
    o->ctx = 0; /* 4096, or the bundle's planned ctx; capped at max_position_embeddings */
    o->n_seq = 1;
    o->max_rows = 512;
    o->n_threads = 0;
    o->node = 0;
    o->nodes = 1;
    o->device = SQ_DEVICE_CPU;
    o->no_verify = false;
    o->base_dir = NULL;
}

/* --- loading ------------------------------------------------------------------ */

sparq_status sq_mdl_find_tensor(const sq_model *m, const char *name, const sf_tensor **out)
{
    *out = sf_find(m->sf, name);
    RETURN_IF(!*out, SPARQ_E_NOTFOUND, "%s: tensor '%s' not found", sf_file_path(m->sf, 0), name);
    return SPARQ_OK;
}

sparq_status sq_mdl_check_shape(const sq_model *m, const sf_tensor *t, int ndim, uint64_t d0, uint64_t d1)
{
    bool ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (ok) return SPARQ_OK;
    if (ndim == 1)
        return sparq_err(SPARQ_E_SHAPE, "%s: tensor '%s': expected shape [%llu], got ndim %d [%llu ...]",
                         sf_file_path(m->sf, t->file), t->name, (unsigned long long)d0, t->ndim,
                         (unsigned long long)t->shape[0]);
    return sparq_err(SPARQ_E_SHAPE, "%s: tensor '%s': expected shape [%llu, %llu], got ndim %d [%llu, %llu]",
                     sf_file_path(m->sf, t->file), t->name, (unsigned long long)d0, (unsigned long long)d1,
                     t->ndim, (unsigned long long)t->shape[0],
                     (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0));
}

sparq_status sq_mdl_dense_kind(const sq_model *m, const sf_tensor *t, sq_linear_kind *k)
{
    switch (t->dtype) {
    case SF_BF16: *k = SQ_LINEAR_BF16; return SPARQ_OK;
    case SF_F16: *k = SQ_LINEAR_F16; return SPARQ_OK;
    case SF_F32: *k = SQ_LINEAR_F32; return SPARQ_OK;
    default:
        return sparq_err(SPARQ_E_UNSUPPORTED,
                         "%s: tensor '%s': dtype %s is not supported here (BF16, F16, F32; FP8 and MXFP4 "
                         "linears are bound by sq_mdl_bind_linear)",
                         sf_file_path(m->sf, t->file), t->name, sf_dtype_name(t->dtype));
    }
}

/* A small fp32 copy of a vector tensor [n]. */
sparq_status sq_mdl_bind_vec(sq_model *m, const char *name, int n, float **out)
{
    const sf_tensor *t;
    FORWARD_IF(sq_mdl_find_tensor(m, name, &t));
    FORWARD_IF(sq_mdl_check_shape(m, t, 1, (uint64_t)n, 0));
    *out = sparq_malloc((size_t)n * sizeof(float));
    RETURN_IF(!*out, SPARQ_E_NOMEM, "%s: out of memory", name);
    m->small_bytes += (uint64_t)n * sizeof(float);
    m->weights_bytes += t->nbytes;
    sparq_status st = sf_to_f32(t, *out);
    if (st != SPARQ_OK) return sparq_err_context(st, "tensor '%s'", name);
    return SPARQ_OK;
}

/* An EXL3 linear (reference.md §1.4): <key>.trellis int16 (k/16, n/16, 16K),
 * <key>.suh fp16 (k), <key>.svh fp16 (n), codebook from <key>.mul1 / .mcg
 * (absent: 3inst), optional <key>.bias fp16 (n). */
static sparq_status bind_exl3(sq_model *m, sq_linear *l, const char *key)
{
    char name[512];
    const sf_tensor *tr, *su, *sv;
    snprintf(name, sizeof name, "%s.trellis", key);
    FORWARD_IF(sq_mdl_find_tensor(m, name, &tr));
    snprintf(name, sizeof name, "%s.suh", key);
    FORWARD_IF(sq_mdl_find_tensor(m, name, &su));
    snprintf(name, sizeof name, "%s.svh", key);
    FORWARD_IF(sq_mdl_find_tensor(m, name, &sv));
    RETURN_IF(tr->dtype != SF_I16 || tr->ndim != 3 || su->dtype != SF_F16 || su->ndim != 1 || sv->dtype != SF_F16 ||
                  sv->ndim != 1 || tr->shape[2] % 16 || tr->shape[0] * 16 != su->shape[0] ||
                  tr->shape[1] * 16 != sv->shape[0] || su->shape[0] > (1u << 24) || sv->shape[0] > (1u << 24),
              SPARQ_E_SHAPE, "%s: EXL3 linear '%s': expected trellis I16 (k/16, n/16, 16K), suh F16 (k), svh F16 (n)",
              sf_file_path(m->sf, tr->file), key);
    trellis_linear *t = sparq_calloc(1, sizeof *t);
    RETURN_IF(!t, SPARQ_E_NOMEM, "%s: out of memory", key);
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = sparq_realloc(m->owned, (size_t)cap * sizeof *o);
        if (!o) {
            sparq_free(t);
            return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", key);
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = t;
    t->k = (int)su->shape[0];
    t->n = (int)sv->shape[0];
    t->K = (int)(tr->shape[2] / 16);
    snprintf(name, sizeof name, "%s.mul1", key);
    bool mul1 = sf_find(m->sf, name) != NULL;
    snprintf(name, sizeof name, "%s.mcg", key);
    t->cb = mul1 ? TRELLIS_CB_MUL1 : sf_find(m->sf, name) ? TRELLIS_CB_MCG : TRELLIS_CB_3INST;
    t->trellis = tr->data;
    t->suh = su->data;
    t->svh = sv->data;
    FORWARD_IF(sq_cpu_linear_exl3_bind(l, t, key));
    m->weights_bytes += tr->nbytes + su->nbytes + sv->nbytes;
    snprintf(name, sizeof name, "%s.bias", key);
    if (sf_find(m->sf, name)) {
        float *b;
        FORWARD_IF(sq_mdl_bind_vec(m, name, l->out, &b));
        l->bias = b;
    }
    return SPARQ_OK;
}

/* An FP8 (E4M3 + UE8M0 blocks) or MXFP4 (E2M1 pairs + UE8M0 groups of 32)
 * linear found by formats/weights.h, bound in place: w and scale point into
 * the mapping. Other FP8 storage (E5M2, DeepSeek V3's float
 * weight_scale_inv) is refused; every code is checked once here
 * (sq_cpu_linear_block_check) so the kernels never meet a NaN. */
static sparq_status bind_blocks(sq_model *m, sq_linear *l, const sf_weight *w)
{
    const char *path = sf_file_path(m->sf, w->w->file);
    if (w->kind == SF_WEIGHT_FP8) {
        RETURN_IF(w->w->dtype != SF_F8_E4M3, SPARQ_E_UNSUPPORTED,
                  "%s: tensor '%s': FP8 %s weights are not run in place (F8_E4M3 only); `sparq quantize` converts "
                  "them", path, w->w->name, sf_dtype_name(w->w->dtype));
        RETURN_IF(w->scale->dtype != SF_F8_E8M0, SPARQ_E_UNSUPPORTED,
                  "%s: tensor '%s': %s block scales are not run in place (UE8M0 '.scale' only, as DeepSeek V4.x "
                  "ships them); `sparq quantize` converts them", path, w->scale->name, sf_dtype_name(w->scale->dtype));
        l->kind = SQ_LINEAR_FP8;
        l->block_rows = w->block_rows;
        l->block_cols = w->block_cols;
    } else {
        l->kind = SQ_LINEAR_MXFP4;
        l->block_rows = 1;
        l->block_cols = 32;
    }
    l->w = w->w->data;
    l->scale = w->scale->data;
    const sparq_status st = sq_cpu_linear_block_check(l, w->w->name, w->scale->name);
    return st == SPARQ_OK ? st : sparq_err_context(st, "%s", path);
}

sparq_status sq_mdl_bind_linear(sq_model *m, sq_linear *l, const char *key, int out, int in)
{
    char name[512];
    memset(l, 0, sizeof *l);
    l->name = sparq_strdup(key);
    RETURN_IF(!l->name, SPARQ_E_NOMEM, "%s: out of memory", key);
    l->in = in;
    l->out = out;
    snprintf(name, sizeof name, "%s.weight", key);
    const sf_tensor *t = sf_find(m->sf, name);
    snprintf(name, sizeof name, "%s.trellis", key);
    if (!t && sf_find(m->sf, name)) {
        FORWARD_IF(bind_exl3(m, l, key));
        RETURN_IF(l->in != in || l->out != out, SPARQ_E_SHAPE,
                  "%s: EXL3 linear '%s' is %d -> %d, expected %d -> %d", sf_file_path(m->sf, 0), key, l->in,
                  l->out, in, out);
        return SPARQ_OK;
    }
    /* dense, FP8 or MXFP4 (formats/weights.h); the FP8 block from the config when it gives one */
    const sq_quant_config *q = &m->cfg.quant;
    sf_weight w;
    sparq_status st = sf_weight_find_block(m->sf, key, q->weight_block_size[0], q->weight_block_size[1], &w);
    RETURN_IF(st == SPARQ_E_NOTFOUND && !t, st, "%s: tensor '%s.weight' not found", sf_file_path(m->sf, 0), key);
    FORWARD_IF(st);
    if (w.kind == SF_WEIGHT_DENSE) {
        FORWARD_IF(sq_mdl_dense_kind(m, w.w, &l->kind));
        FORWARD_IF(sq_mdl_check_shape(m, w.w, 2, (uint64_t)out, (uint64_t)in));
        l->w = w.w->data;
    } else {
        RETURN_IF(w.out != (uint64_t)out || w.in != (uint64_t)in, SPARQ_E_SHAPE,
                  "%s: tensor '%s' holds a [%llu, %llu] weight, expected [%d, %d]", sf_file_path(m->sf, w.w->file),
                  w.w->name, (unsigned long long)w.out, (unsigned long long)w.in, out, in);
        FORWARD_IF(bind_blocks(m, l, &w));
    }
    m->weights_bytes += w.nbytes;
    snprintf(name, sizeof name, "%s.bias", key);
    if (m->cfg.attention_bias && sf_find(m->sf, name)) {
        float *b;
        FORWARD_IF(sq_mdl_bind_vec(m, name, out, &b));
        l->bias = b;
    }
    return SPARQ_OK;
}

void sq_mdl_free_linear(sq_linear *l)
{
    sparq_free((void *)l->name);
    sparq_free((void *)l->bias);
}

/* Bind every slot instance of layer L as its description names it. */
static sparq_status bind_layer(sq_model *m, int L)
{
    sq_layer_lin *ll = &m->layers[L];
    FORWARD_IF(sq_arch_layer(&m->cfg, L, &ll->desc));
    const sq_layer_desc *d = &ll->desc;
    ll->lin = sparq_calloc((size_t)d->n_slots, sizeof *ll->lin);
    RETURN_IF(!ll->lin, SPARQ_E_NOMEM, "layer %d: out of memory", L);
    for (int s = 0; s < d->n_slots; s++) {
        ll->lin[s] = sparq_calloc((size_t)d->slot[s].instances, sizeof(sq_linear));
        RETURN_IF(!ll->lin[s], SPARQ_E_NOMEM, "layer %d: out of memory", L);
    }
    char key[256];
    for (int s = 0; s < d->n_slots; s++)
        for (int e = 0; e < d->slot[s].instances; e++) {
            if (!sq_arch_holds_instance(&d->slot[s], e, m->own_n, m->own_k)) continue; /* another rank's expert */
            FORWARD_IF(sq_lin_key(&d->slot[s], L, e, key, sizeof key));
            FORWARD_IF(sq_mdl_bind_linear(m, &ll->lin[s][e], key, d->slot[s].out, d->slot[s].in));
        }
    return SPARQ_OK;
}

sparq_status sq_mdl_prepare_layer(sq_model *m, int L, unsigned roles)
{
    const sq_layer_lin *ll = &m->layers[L];
    for (int s = 0; s < ll->desc.n_slots; s++)
        if (roles & (1u << ll->desc.slot[s].role))
        for (int e = 0; e < ll->desc.slot[s].instances; e++)
            FORWARD_IF(m->ex->be->prepare_linear(m->ex, &ll->lin[s][e]));
    return SPARQ_OK;
}

/* A bundle written by `sparq pack` has manifest.json at its top, config and
 * tokenizer beside it, and node K's weights in node-K/. Before anything is
 * read, every file node K needs is checked against the manifest
 * (formats/bundle.h): present with its size, no unlisted file where the
 * runtime reads, and, unless o->no_verify, every block's XXH3-128 (the
 * hashing reads the files through the page cache the mapping then uses). The
 * KV cache and workspace are sized from the plan the bundle was packed for
 * (ctx × users, prefill chunk), as design.md asks: a bundle that plan said
 * fits is loaded with exactly the sizes that were planned (a smaller ctx
 * asked for is allowed, a larger one refused). A bundle
 * packed for N boxes runs as N processes (o->nodes), this one loading node
 * o->node: its layers, plus the embeddings on the first node and the final
 * norm and lm_head on the last. On success *weights_dir is the node's folder
 * (heap), *plan_threads the thread count the plan assumed, and m's layer
 * range and embed/head flags are set. */
/* Node o->node's files against the manifest: every block unless no_verify. */
static sparq_status check_bundle(const char *dir, const sq_manifest *man, const sq_model_opts *o)
{
    const sq_bundle_check_opts co = {
        .node = o->node, .quick = o->no_verify, .threads = o->n_threads, .progress = "verify"};
    sq_bundle_report r;
    sparq_status st = sq_bundle_check(dir, man, &co, &r);
    sq_bundle_report_free(&r);
    if (st != SPARQ_OK && st != SPARQ_E_NOMEM) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sparq_errmsg());
        st = sparq_err(st, "%s; `sparq verify %s` lists every problem%s", msg, dir,
                       o->no_verify ? "" : ", --no-verify skips the checksums");
    }
    return st;
}

static sparq_status open_bundle(sq_model *m, const char *dir, sq_model_opts *o, char **weights_dir,
                                int *plan_threads)
{
    sq_manifest man;
    FORWARD_IF(sq_manifest_load(&man, dir));
    sparq_status st = SPARQ_OK;
    if (man.boxes != o->nodes) {
        if (o->nodes == 1)
            st = sparq_err(SPARQ_E_UNSUPPORTED,
                           "%s: bundle packed for %d boxes; run it as %d processes, one per box "
                           "(mpirun -np %d sparq ...), or pack it again with --boxes 1",
                           dir, man.boxes, man.boxes, man.boxes);
        else
            st = sparq_err(SPARQ_E_UNSUPPORTED,
                           "%s: bundle packed for %d box%s but started on %d processes; start exactly %d "
                           "(mpirun -np %d), or pack it again with --boxes %d",
                           dir, man.boxes, man.boxes == 1 ? "" : "es", o->nodes, man.boxes, man.boxes, o->nodes);
    } else if (o->node < 0 || o->node >= man.boxes) {
        st = sparq_err(SPARQ_E_RANGE, "%s: node %d outside [0, %d)", dir, o->node, man.boxes);
    } else if (o->ctx > man.ctx) {
        st = sparq_err(SPARQ_E_ARG,
                       "%s: ctx %d exceeds the %lld the bundle was packed for (its plan sizes the KV cache); pack "
                       "it again with --ctx %d",
                       dir, o->ctx, (long long)man.ctx, o->ctx);
    } else if ((st = check_bundle(dir, &man, o)) == SPARQ_OK) {
        const sq_manifest_node *nd = &man.nodes[o->node];
        if (o->ctx <= 0) o->ctx = (int)man.ctx;
        o->n_seq = (int)man.users;
        o->max_rows = (int)man.chunk;
        *plan_threads = (int)man.threads;
        m->first = (int)nd->first_layer;
        m->end = (int)(nd->first_layer + nd->n_layers);
        m->has_embed = nd->has_embed;
        m->has_head = nd->has_head;
        if (man.split == SQ_MANIFEST_SPLIT_EXPERTS) { /* every layer here, the routed experts e mod boxes */
            m->own_n = man.boxes;
            m->own_k = o->node;
            m->own_listed = nd->n_expert_set;
            m->own_listed_max = nd->expert_set_max;
        }
        char sub[32];
        snprintf(sub, sizeof sub, "node-%d", o->node);
        *weights_dir = sparq_path_join(dir, sub);
        m->bundle = true;
        if (nd->engram_file[0]) m->engram_path = sparq_path_join(dir, nd->engram_file);
        m->engram_cache = nd->engram_cache;
        if (!*weights_dir || (nd->engram_file[0] && !m->engram_path))
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", dir);
    }
    sq_manifest_free(&man);
    return st;
}

sparq_status sq_model_load(sq_model **out, const char *dir, const sq_model_opts *opts)
{
    *out = NULL;
    sq_model *m = sparq_calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "model: out of memory");
    sparq_status st = SPARQ_OK;
    if (opts) m->opts = *opts;
    else sq_model_opts_default(&m->opts);
    m->dir = sparq_strdup(dir);
    if (!m->dir) {
        sparq_free(m);
        return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
#define TRY(expr)                    \
    do {                             \
        st = (expr);                 \
        if (st != SPARQ_OK) goto fail; \
    } while (0)
#define FAIL(code, ...)                        \
    do {                                       \
        st = sparq_err((code), __VA_ARGS__);   \
        goto fail;                             \
    } while (0)
    char *weights_dir = NULL;
    int plan_threads = 0;
    m->first = 0;
    m->end = -1; /* all layers, set below */
    m->has_embed = m->has_head = true;
    if (m->opts.nodes <= 0) m->opts.nodes = 1;
    const bool ctx_given = m->opts.ctx > 0;
    {
        char *mpath = sparq_path_join(dir, SQ_MANIFEST_NAME);
        if (!mpath) FAIL(SPARQ_E_NOMEM, "out of memory");
        const int is_bundle = sparq_path_exists(mpath);
        sparq_free(mpath);
        if (is_bundle) TRY(open_bundle(m, dir, &m->opts, &weights_dir, &plan_threads));
        else if (m->opts.nodes != 1)
            FAIL(SPARQ_E_UNSUPPORTED, "%s: a model directory runs in one process, not %d; pack it into a bundle "
                 "for %d boxes (sparq pack --boxes %d) to run it on several", dir, m->opts.nodes, m->opts.nodes,
                 m->opts.nodes);
    }
    TRY(sq_config_load(&m->cfg, dir));
    const sq_model_config *c = &m->cfg;
    m->arch = sq_arch_of(c);
    if (!m->arch || !m->arch->graph) FAIL(SPARQ_E_UNSUPPORTED, "%s: architecture '%s' not supported", dir, c->model_type);
    if (m->arch->check) TRY(m->arch->check(c, dir));
    m->n_layers = (int)c->num_hidden_layers;
    if (m->end < 0) m->end = m->n_layers;
    if (m->own_n > 0) { /* the expert split: the manifest's expert set must be the rule's over config.json */
        if (!m->arch->expert_split)
            FAIL(SPARQ_E_UNSUPPORTED, "%s: the bundle is split by experts, but %s cannot run that split: %s; pack it "
                 "again with --split pipeline", dir, c->model_type,
                 m->arch->expert_split_why ? m->arch->expert_split_why : "its graph has no expert ownership");
        const int64_t want = sq_memplan_experts_of_node(c->num_experts, m->own_n, m->own_k);
        if (m->own_listed != want || m->own_listed_max >= c->num_experts)
            FAIL(SPARQ_E_FORMAT, "%s/%s: plan node %d lists %lld routed experts (up to id %lld), but %lld experts "
                 "over %d boxes give it %lld (expert e on node e mod %d); `sparq verify %s`", dir, SQ_MANIFEST_NAME,
                 m->own_k, (long long)m->own_listed, (long long)m->own_listed_max, (long long)c->num_experts,
                 m->own_n, (long long)want, m->own_n, dir);
    }
    if (m->first < 0 || m->end > m->n_layers || m->first > m->end)
        FAIL(SPARQ_E_FORMAT, "%s: node %d holds layers [%d, %d), but the model has %d", dir, m->opts.node, m->first,
             m->end, m->n_layers);
    if (m->has_head && m->end != m->n_layers) /* a bundle's last node: its plan must end with the model */
        FAIL(SPARQ_E_FORMAT,
             "%s: node %d holds layers [%d, %d) and the head, but config.json has %d layers: the manifest's plan "
             "does not match the model (`sparq verify %s`)",
             dir, m->opts.node, m->first, m->end, m->n_layers, dir);
    if (c->max_position_embeddings > 0 && ctx_given && m->opts.ctx > c->max_position_embeddings)
        FAIL(SPARQ_E_ARG,
             "%s: ctx %d exceeds the model's max_position_embeddings %lld (sparq has no RoPE scaling: later "
             "positions were never trained); ask for at most %lld",
             dir, m->opts.ctx, (long long)c->max_position_embeddings, (long long)c->max_position_embeddings);
    if (m->opts.ctx <= 0) m->opts.ctx = 4096;
    if (c->max_position_embeddings > 0 && m->opts.ctx > c->max_position_embeddings)
        m->opts.ctx = (int)c->max_position_embeddings; /* the default, or a bundle's plan */
    if (m->opts.n_seq <= 0) m->opts.n_seq = 1;
    if (m->opts.max_rows <= 0) m->opts.max_rows = 512;

    if (m->opts.base_dir && !weights_dir) TRY(sf_open_overlay(&m->sf, dir, m->opts.base_dir));
    else TRY(sf_open(&m->sf, weights_dir ? weights_dir : dir));
    TRY(sq_arch_check_tensors(c, m->sf,
                              &(sq_arch_scope){m->first, m->end, m->has_embed, m->has_head, m->bundle, m->own_n,
                                               m->own_k},
                              dir, NULL));
    m->layers = sparq_calloc((size_t)m->n_layers, sizeof *m->layers);
    m->seq_len = sparq_calloc((size_t)m->opts.n_seq, sizeof(int));
    if (!m->layers || !m->seq_len) FAIL(SPARQ_E_NOMEM, "out of memory");
    TRY(m->arch->graph->load(m, plan_threads));
    if (m->dev_plan && m->ex->be->mem_info) { /* what the load took on the device */
        uint64_t fr = 0, tot = 0;
        if (m->ex->be->mem_info(m->ex, &fr, &tot) == SPARQ_OK && fr < m->dev_free0) m->dev_used = m->dev_free0 - fr;
    }
    sparq_free(weights_dir);
    *out = m;
    return SPARQ_OK;
fail:
    sparq_free(weights_dir);
    sq_model_free(m);
    return st;
#undef TRY
#undef FAIL
}

sparq_status sq_mdl_bind_layers(sq_model *m)
{
    for (int L = m->first; L < m->end; L++) FORWARD_IF(bind_layer(m, L));
    return SPARQ_OK;
}

void sq_model_free(sq_model *m)
{
    if (!m) return;
    if (m->arch && m->arch->graph) m->arch->graph->free(m);
    if (m->layers) {
        for (int L = 0; L < m->n_layers; L++) {
            sq_layer_lin *ll = &m->layers[L];
            for (int s = 0; ll->lin && s < ll->desc.n_slots; s++) {
                for (int e = 0; ll->lin[s] && e < ll->desc.slot[s].instances; e++) sq_mdl_free_linear(&ll->lin[s][e]);
                sparq_free(ll->lin[s]);
            }
            sparq_free(ll->lin);
        }
        sparq_free(m->layers);
    }
    sq_mdl_free_linear(&m->head);
    sparq_free(m->seq_len);
    sq_exec_free(m->ex);
    for (int i = 0; i < m->n_owned; i++) sparq_free(m->owned[i]);
    sparq_free(m->owned);
    if (m->sf) sf_close(m->sf);
    sq_config_free(&m->cfg);
    sparq_free(m->dir);
    sparq_free(m->engram_path);
    sparq_free(m);
}

const sq_model_config *sq_model_cfg(const sq_model *m) { return &m->cfg; }
const sq_model_opts *sq_model_options(const sq_model *m) { return &m->opts; }
sq_exec *sq_model_exec(sq_model *m) { return m->ex; }

void sq_model_engram_report(const sq_model *m, sq_model_engram_stats *out) { *out = m->engram; }

void sq_model_mem_report(const sq_model *m, sq_model_mem *out)
{
    out->weights = m->weights_bytes;
    out->kv = m->kv_bytes;
    out->workspace = m->ws_bytes + m->small_bytes + m->scratch_bytes;
    out->plan_kv = m->plan_kv;
    out->plan_workspace = m->plan_ws;
    out->device_plan = m->dev_plan;
    out->device_used = m->dev_used;
}

void sq_model_graph_counts(const sq_model *m, uint64_t *captured, uint64_t *replayed)
{
    *captured = *replayed = 0;
    if (m->ex->be->step_graphs) m->ex->be->step_graphs(m->ex, captured, replayed);
}

static void widest(const sq_linear *l, uint64_t *kn, uint64_t *k, uint64_t *n)
{
    if (l->kind != SQ_LINEAR_EXL3) return;
    const uint64_t v = (uint64_t)l->in * (uint64_t)l->out;
    if (v > *kn) *kn = v;
    if ((uint64_t)l->in > *k) *k = (uint64_t)l->in;
    if ((uint64_t)l->out > *n) *n = (uint64_t)l->out;
}

sparq_status sq_mdl_device_check(sq_model *m, uint64_t own_bytes)
{
    const sq_backend *be = m->ex->be;
    if (!be->device || !be->mem_info) return SPARQ_OK;
    uint64_t kn = 0, k = 0, n = 0;
    for (int L = m->first; L < m->end; L++) {
        const sq_layer_lin *ll = &m->layers[L];
        for (int s = 0; s < ll->desc.n_slots; s++)
            for (int e = 0; e < ll->desc.slot[s].instances; e++) widest(&ll->lin[s][e], &kn, &k, &n);
    }
    if (m->has_head) widest(&m->head, &kn, &k, &n);
    const uint64_t prefill = sq_memplan_cuda_prefill_bytes(kn, k, n);
    const uint64_t t[] = {m->weights_bytes, own_bytes, prefill, SQ_MEMPLAN_CUDA_FIXED};
    m->dev_plan = sq_memplan_sum(4, t);
    uint64_t total = 0;
    FORWARD_IF(be->mem_info(m->ex, &m->dev_free0, &total));
    const double G = 1024.0 * 1024.0 * 1024.0;
    RETURN_IF(m->dev_plan > m->dev_free0, SPARQ_E_NOMEM,
              "device %s: this process's part of the model needs %.2f GiB (weights %.2f, KV cache and workspace %.2f, "
              "prefill scratch %.2f, runtime %.2f) but %.2f GiB of the device's %.2f are free; refused before any "
              "upload (fewer users or a shorter context shrink the KV cache; more boxes split the weights)",
              be->name, m->dev_plan / G, m->weights_bytes / G, own_bytes / G, prefill / G,
              SQ_MEMPLAN_CUDA_FIXED / G, m->dev_free0 / G, total / G);
    return SPARQ_OK;
}

sq_linear *sq_model_head_linear(sq_model *m) { return &m->head; }

void sq_model_layer_range(const sq_model *m, int *first, int *end)
{
    *first = m->first;
    *end = m->end;
}
bool sq_model_has_embed(const sq_model *m) { return m->has_embed; }

int sq_model_expert_split(const sq_model *m) { return m->own_n; }

void sq_model_set_moe_combine(sq_model *m, sparq_status (*fn)(void *user, float *part, int rows, int d), void *user)
{
    m->combine.fn = fn;
    m->combine.user = user;
}
bool sq_model_has_head(const sq_model *m) { return m->has_head; }
float *sq_model_hidden_buffer(sq_model *m) { return m->arch->graph->hidden_buffer(m); }

const sq_layer_desc *sq_model_layer_desc(const sq_model *m, int layer)
{
    return layer >= m->first && layer < m->end ? &m->layers[layer].desc : NULL;
}

bool sq_model_layer_is_moe(const sq_model *m, int layer)
{
    return layer >= m->first && layer < m->end && m->layers[layer].desc.moe;
}

sq_linear *sq_model_linear(sq_model *m, int layer, int slot, int inst)
{
    if (layer < m->first || layer >= m->end) return NULL;
    const sq_layer_desc *d = &m->layers[layer].desc;
    if (slot < 0 || slot >= d->n_slots || inst < 0 || inst >= d->slot[slot].instances) return NULL;
    return &m->layers[layer].lin[slot][inst];
}

/* --- the forward pass: the architecture's graph ------------------------------- */

static sparq_status step_end(sq_model *m, sparq_status s);

sparq_status sq_model_embed(const sq_model *m, const int32_t *tokens, int n, float *hidden)
{
    RETURN_IF(!m->has_embed, SPARQ_E_UNSUPPORTED, "this process holds node %d (layers %d..%d), not the embeddings",
              m->opts.node, m->first, m->end - 1);
    return m->arch->graph->embed(m, tokens, n, hidden);
}

sparq_status sq_model_forward_layer(sq_model *m, int L, float *hidden, int rows, const int *pos, int seq,
                                    const sq_observer *obs)
{
    RETURN_IF(L < m->first || L >= m->end, SPARQ_E_RANGE, "layer %d outside [%d, %d), the layers this process holds",
              L, m->first, m->end);
    return m->arch->graph->forward_layer(m, L, hidden, rows, pos, seq, obs);
}

sparq_status sq_model_forward_rows(sq_model *m, float *hidden, int rows, const int *seqs, const int *pos)
{
    return m->arch->graph->forward_rows(m, hidden, rows, seqs, pos);
}

sparq_status sq_model_decode_batch(sq_model *m, int n, const int *seqs, const int32_t *tokens, float *logits)
{
    return m->arch->graph->decode_batch(m, n, seqs, tokens, logits);
}

/* Rows of one head call in a sampled decode step: runtime/dist's LOGIT_CHUNK, so a step's logits are
 * those of the same step through sq_dist_submit bit for bit (the CPU head may round differently for
 * other row counts). */
#define DECODE_HEAD_CHUNK 32

sparq_status sq_model_decode_sample(sq_model *m, int n, const int *seqs, const int32_t *tokens, sq_sampler *const *smp,
                                    float *logits, int32_t *ids, int *bad_row)
{
    *bad_row = -1;
    FORWARD_IF(sq_model_decode_batch(m, n, seqs, tokens, NULL)); /* the step stays open for the head */
    const float *x = sq_model_hidden_buffer(m);
    const size_t V = (size_t)m->cfg.vocab_size, d = (size_t)m->cfg.hidden_size;
    for (int r0 = 0; r0 < n; r0 += DECODE_HEAD_CHUNK) {
        const int k = n - r0 < DECODE_HEAD_CHUNK ? n - r0 : DECODE_HEAD_CHUNK;
        const sparq_status s = sq_model_head_sample(m, x + (size_t)r0 * d, k, smp + r0, logits + (size_t)r0 * V,
                                                    ids + r0, bad_row);
        if (s != SPARQ_OK) return step_end(m, s);
        if (*bad_row >= 0) {
            *bad_row += r0;
            break;
        }
    }
    return m->ex->be->sync(m->ex);
}

sparq_status sq_model_head(sq_model *m, const float *hidden, int rows, float *logits)
{
    RETURN_IF(!m->has_head, SPARQ_E_UNSUPPORTED, "this process holds node %d (layers %d..%d), not the lm_head",
              m->opts.node, m->first, m->end - 1);
    return m->arch->graph->head(m, hidden, rows, logits);
}

sparq_status sq_model_head_sample(sq_model *m, const float *hidden, int rows, sq_sampler *const *smp, float *logits,
                                  int32_t *ids, int *bad_row)
{
    RETURN_IF(!m->has_head, SPARQ_E_UNSUPPORTED, "this process holds node %d (layers %d..%d), not the lm_head",
              m->opts.node, m->first, m->end - 1);
    *bad_row = -1;
    const size_t V = (size_t)m->cfg.vocab_size, d = (size_t)m->cfg.hidden_size;
    sq_exec *ex = m->ex;
    if (!ex->be->device || !m->arch->graph->head_dev) { /* the logits on the host: the CPU's, in place */
        FORWARD_IF(sq_model_head(m, hidden, rows, logits));
        if (!ex->be->device) return sq_sampler_sample_rows(ex, smp, logits, rows, (int)V, NULL, ids, bad_row);
        return sq_sampler_sample_host(smp, logits, rows, (int)V, ids, bad_row);
    }
    for (int r0 = 0; r0 < rows;) {
        float *dl = NULL;
        int n = 0;
        FORWARD_IF(m->arch->graph->head_dev(m, hidden + (size_t)r0 * d, rows - r0, &dl, &n));
        FORWARD_IF(sq_sampler_sample_rows(ex, smp + r0, dl, n, (int)V, logits + (size_t)r0 * V, ids + r0, bad_row));
        if (*bad_row >= 0) {
            *bad_row += r0;
            return SPARQ_OK;
        }
        r0 += n;
    }
    return SPARQ_OK;
}

sparq_status sq_model_head_input(sq_model *m, const float *hidden, int rows, float *out)
{
    RETURN_IF(!m->has_head, SPARQ_E_UNSUPPORTED, "this process holds node %d (layers %d..%d), not the lm_head",
              m->opts.node, m->first, m->end - 1);
    RETURN_IF(!m->arch->graph->head_input, SPARQ_E_UNSUPPORTED, "%s: no head input of its own",
              m->arch->model_type);
    return m->arch->graph->head_input(m, hidden, rows, out);
}

sparq_status sq_model_forward(sq_model *m, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                              float *logits)
{
    RETURN_IF(seq < 0 || seq >= m->opts.n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seq, m->opts.n_seq);
    RETURN_IF(n < 0 || m->seq_len[seq] + n > m->opts.ctx, SPARQ_E_RANGE,
              "sequence %d: %d + %d tokens exceed the context of %d", seq, m->seq_len[seq], n, m->opts.ctx);
    return m->arch->graph->forward(m, seq, tokens, n, mode, logits);
}

/* --- graph steps the architectures share (model_impl.h) -------------------- */

sparq_status sq_mdl_check_rows(const sq_model *m, int rows, const int *seqs, const int *pos)
{
    RETURN_IF(rows < 0 || rows > m->opts.max_rows, SPARQ_E_RANGE, "%d rows in one step, at most %d (max_rows)", rows,
              m->opts.max_rows);
    for (int r = 0; r < rows; r++) {
        RETURN_IF(seqs[r] < 0 || seqs[r] >= m->opts.n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seqs[r],
                  m->opts.n_seq);
        int expect = m->seq_len[seqs[r]];
        for (int q = 0; q < r; q++) expect += seqs[q] == seqs[r];
        RETURN_IF(pos[r] != expect, SPARQ_E_ARG, "row %d of sequence %d has position %d, expected %d", r, seqs[r],
                  pos[r], expect);
        RETURN_IF(pos[r] >= m->opts.ctx, SPARQ_E_RANGE, "sequence %d: the context of %d is full", seqs[r],
                  m->opts.ctx);
    }
    return SPARQ_OK;
}

/* A device step: the backend may run it as a graph (kernels/backend.h). */
static void step_begin(sq_model *m, int rows, int max_keys)
{
    if (m->ex->be->step_begin) m->ex->be->step_begin(m->ex, rows, max_keys);
}

static sparq_status step_end(sq_model *m, sparq_status s)
{
    if (s != SPARQ_OK && m->ex->be->step_abort) m->ex->be->step_abort(m->ex);
    return s;
}

static sparq_status forward_chunk(sq_model *m, int seq, const int32_t *tokens, int rows, float *x, int *pos)
{
    FORWARD_IF(sq_model_embed(m, tokens, rows, x));
    const int len = m->seq_len[seq];
    for (int r = 0; r < rows; r++) pos[r] = len + r;
    for (int L = m->first; L < m->end; L++) FORWARD_IF(sq_model_forward_layer(m, L, x, rows, pos, seq, NULL));
    return sq_model_seq_advance(m, seq, rows);
}

sparq_status sq_mdl_forward_chunked(sq_model *m, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                                    float *logits, float *x, int *pos, int width)
{
    const int V = (int)m->cfg.vocab_size;
    for (int c0 = 0; c0 < n; c0 += m->opts.max_rows) {
        const int rows = n - c0 < m->opts.max_rows ? n - c0 : m->opts.max_rows;
        step_begin(m, rows, m->seq_len[seq] + rows);
        sparq_status s = forward_chunk(m, seq, tokens + c0, rows, x, pos);
        if (s == SPARQ_OK && mode == SQ_LOGITS_ALL) s = sq_model_head(m, x, rows, logits + (size_t)c0 * V);
        else if (s == SPARQ_OK && mode == SQ_LOGITS_LAST && c0 + rows == n)
            s = sq_model_head(m, x + (size_t)(rows - 1) * width, 1, logits);
        FORWARD_IF(step_end(m, s));
    }
    return m->ex->be->sync(m->ex); /* a device backend reports its errors here */
}

sparq_status sq_mdl_decode_batch(sq_model *m, int n, const int *seqs, const int32_t *tokens, float *logits, float *x,
                                 int *pos)
{
    RETURN_IF(n < 0 || n > m->opts.max_rows || n > m->opts.n_seq, SPARQ_E_RANGE,
              "decode_batch: %d rows (max_rows %d, sequences %d)", n, m->opts.max_rows, m->opts.n_seq);
    for (int r = 0; r < n; r++) {
        RETURN_IF(seqs[r] < 0 || seqs[r] >= m->opts.n_seq, SPARQ_E_RANGE, "decode_batch: sequence %d outside [0, %d)",
                  seqs[r], m->opts.n_seq);
        for (int q = 0; q < r; q++)
            RETURN_IF(seqs[q] == seqs[r], SPARQ_E_ARG, "decode_batch: sequence %d appears twice", seqs[r]);
        pos[r] = m->seq_len[seqs[r]];
    }
    if (n == 0) return SPARQ_OK;
    FORWARD_IF(sq_mdl_check_rows(m, n, seqs, pos));
    int max_keys = 0;
    for (int r = 0; r < n; r++) max_keys = pos[r] + 1 > max_keys ? pos[r] + 1 : max_keys;
    step_begin(m, n, max_keys);
    sparq_status s = sq_model_embed(m, tokens, n, x);
    if (s == SPARQ_OK) s = sq_model_forward_rows(m, x, n, seqs, pos);
    if (s == SPARQ_OK && logits) s = sq_model_head(m, x, n, logits);
    return step_end(m, s);
}

/* --- sequences ---------------------------------------------------------------- */

sparq_status sq_model_seq_advance(sq_model *m, int seq, int n)
{
    RETURN_IF(seq < 0 || seq >= m->opts.n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seq, m->opts.n_seq);
    RETURN_IF(n < 0 || m->seq_len[seq] + n > m->opts.ctx, SPARQ_E_RANGE, "sequence %d: cannot advance by %d", seq, n);
    m->seq_len[seq] += n;
    return SPARQ_OK;
}

int sq_model_seq_len(const sq_model *m, int seq)
{
    return seq >= 0 && seq < m->opts.n_seq ? m->seq_len[seq] : 0;
}

void sq_model_seq_reset(sq_model *m, int seq)
{
    if (seq >= 0 && seq < m->opts.n_seq) m->seq_len[seq] = 0;
}

void sq_model_seq_truncate(sq_model *m, int seq, int n)
{
    if (seq >= 0 && seq < m->opts.n_seq && n >= 0 && n < m->seq_len[seq]) m->seq_len[seq] = n;
}