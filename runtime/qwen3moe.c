/* runtime/qwen3moe.c — the Qwen3-MoE graph (transformers' Qwen3MoeForCausalLM),
 * composed from the backend ops of kernels/backend.h, and the model loader.
 *
 * One decoder layer, as transformers computes it (fp32 here throughout):
 *   h  = x + o_proj(attn(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n)))
 *        with n = input_layernorm(x); q_norm/k_norm are RMSNorms over head_dim,
 *        per head; GQA (query head h reads KV head h / (H / KV)); causal;
 *        scale 1/sqrt(head_dim); RoPE rotate-half with theta = rope_theta.
 *   x' = h + moe(post_attention_layernorm(h))
 *        moe(n) = Σ_{e ∈ topk(softmax(gate(n)))} w_e · down_e(silu(gate_e(n)) ⊙ up_e(n)),
 *        w renormalised to sum 1 when norm_topk_prob; a layer in mlp_only_layers
 *        (or off the decoder_sparse_step) is a dense SwiGLU MLP instead —
 *        here treated as a single "expert" with weight 1.
 * logits = lm_head(norm(x)); lm_head is embed_tokens when tie_word_embeddings.
 *
 * MoE dispatch groups the rows of a step by expert (counting sort), runs each
 * expert once on its gathered rows (GEMM when many, GEMV when few) and
 * scatter-adds the weighted outputs in expert order, as transformers does.
 *
 * Memory: tensors stay in the mmap (sf_open); norm vectors are widened to
 * fp32 copies; the KV cache and one workspace are allocated at load with the
 * sizes of runtime/memplan.h, and carved into fixed buffers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/file.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"
#include "kernels/cpu/ops.h"
#include "runtime/memplan.h"
#include "runtime/model.h"

typedef struct layer_w {
    sq_linear q, k, v, o, router;
    float *in_norm, *post_norm, *q_norm, *k_norm;
    bool moe;
    int n_exp;                    /* experts (1 for a dense MLP layer) */
    sq_linear *gate, *up, *down;  /* [n_exp] */
    sq_moe_layer ml;              /* the same, for a device backend's `moe` op (set by device_setup) */
} layer_w;

struct sq_model {
    sq_model_config cfg;
    sq_model_opts opts;
    sf_model *sf;
    sq_exec *ex;
    int d, nh, nkv, hd, vocab, n_layers, n_exp, top_k, inter_max;
    int first, end;            /* layers this process holds: [first, end) (all, unless a node of a bundle) */
    bool has_embed, has_head;  /* embeddings (first node) / final norm + lm_head (last node) */
    float eps;
    const sf_tensor *embed;
    sq_linear head;
    float *final_norm;
    float *inv_freq;
    layer_w *layers;
    /* KV cache: [n_seq][end - first][ctx][nkv*hd] for K and for V */
    float *kv_k, *kv_v;
    int *seq_len;
    /* workspace (one allocation) */
    void *ws;
    int *host_idx;     /* device exec: kvf, kvl, pos live here on the host (the graph fills them) */
    float *dlog;       /* device exec: logits of up to dlog_rows rows before the copy to the host */
    int dlog_rows;
    float *x, *xn, *proj, *q, *k, *v, *ao, *rl, *rw, *g, *u, *xg, *dn, *mo, *lw;
    int *ridx, *kvf, *kvl, *pos, *rows_of, *cnt, *off;
    void **owned;      /* per-linear state the model allocated (EXL3 descriptors) */
    int n_owned, cap_owned;
    uint64_t weights_bytes, small_bytes, ws_bytes, kv_bytes, scratch_bytes;
    uint64_t plan_kv, plan_ws;
};

void sq_model_opts_default(sq_model_opts *o)
{
    o->ctx = 4096;
    o->n_seq = 1;
    o->max_rows = 512;
    o->n_threads = 0;
    o->node = 0;
    o->nodes = 1;
    o->device = SQ_DEVICE_CPU;
}

const char *sq_lin_id_name(sq_lin_id id)
{
    static const char *const n[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate", "gate_proj", "up_proj",
                                    "down_proj"};
    return (unsigned)id < SQ_LIN_COUNT_ ? n[id] : "?";
}

/* --- loading ------------------------------------------------------------------ */

static sparq_status find_tensor(const sq_model *m, const char *name, const sf_tensor **out)
{
    *out = sf_find(m->sf, name);
    RETURN_IF(!*out, SPARQ_E_NOTFOUND, "%s: tensor '%s' not found", sf_file_path(m->sf, 0), name);
    return SPARQ_OK;
}

static sparq_status check_shape(const sq_model *m, const sf_tensor *t, int ndim, uint64_t d0, uint64_t d1)
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

static sparq_status dense_kind(const sq_model *m, const sf_tensor *t, sq_linear_kind *k)
{
    switch (t->dtype) {
    case SF_BF16: *k = SQ_LINEAR_BF16; return SPARQ_OK;
    case SF_F16: *k = SQ_LINEAR_F16; return SPARQ_OK;
    case SF_F32: *k = SQ_LINEAR_F32; return SPARQ_OK;
    default:
        return sparq_err(SPARQ_E_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported (BF16, F16, F32)",
                         sf_file_path(m->sf, t->file), t->name, sf_dtype_name(t->dtype));
    }
}

/* A small fp32 copy of a vector tensor [n]. */
static sparq_status bind_vec(sq_model *m, const char *name, int n, float **out)
{
    const sf_tensor *t;
    FORWARD_IF(find_tensor(m, name, &t));
    FORWARD_IF(check_shape(m, t, 1, (uint64_t)n, 0));
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
    FORWARD_IF(find_tensor(m, name, &tr));
    snprintf(name, sizeof name, "%s.suh", key);
    FORWARD_IF(find_tensor(m, name, &su));
    snprintf(name, sizeof name, "%s.svh", key);
    FORWARD_IF(find_tensor(m, name, &sv));
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
        FORWARD_IF(bind_vec(m, name, l->out, &b));
        l->bias = b;
    }
    return SPARQ_OK;
}

static sparq_status bind_linear(sq_model *m, sq_linear *l, const char *key, int out, int in)
{
    char name[512];
    memset(l, 0, sizeof *l);
    l->name = sparq_strdup(key);
    RETURN_IF(!l->name, SPARQ_E_NOMEM, "%s: out of memory", key);
    l->in = in;
    l->out = out;
    snprintf(name, sizeof name, "%s.weight", key);
    const sf_tensor *t = sf_find(m->sf, name);
    if (!t) {
        snprintf(name, sizeof name, "%s.trellis", key);
        RETURN_IF(!sf_find(m->sf, name), SPARQ_E_NOTFOUND, "%s: tensor '%s.weight' not found",
                  sf_file_path(m->sf, 0), key);
        FORWARD_IF(bind_exl3(m, l, key));
        RETURN_IF(l->in != in || l->out != out, SPARQ_E_SHAPE,
                  "%s: EXL3 linear '%s' is %d -> %d, expected %d -> %d", sf_file_path(m->sf, 0), key, l->in,
                  l->out, in, out);
        return SPARQ_OK;
    }
    FORWARD_IF(dense_kind(m, t, &l->kind));
    FORWARD_IF(check_shape(m, t, 2, (uint64_t)out, (uint64_t)in));
    l->w = t->data;
    m->weights_bytes += t->nbytes;
    snprintf(name, sizeof name, "%s.bias", key);
    if (m->cfg.attention_bias && sf_find(m->sf, name)) {
        float *b;
        FORWARD_IF(bind_vec(m, name, out, &b));
        l->bias = b;
    }
    return SPARQ_OK;
}

static void free_linear(sq_linear *l)
{
    sparq_free((void *)l->name);
    sparq_free((void *)l->bias);
}

static sparq_status load_layer(sq_model *m, int L)
{
    layer_w *w = &m->layers[L];
    char key[256];
    const int d = m->d, qd = m->nh * m->hd, kvd = m->nkv * m->hd;
#define KEY(...) (snprintf(key, sizeof key, __VA_ARGS__), key)
    FORWARD_IF(bind_linear(m, &w->q, KEY("model.layers.%d.self_attn.q_proj", L), qd, d));
    FORWARD_IF(bind_linear(m, &w->k, KEY("model.layers.%d.self_attn.k_proj", L), kvd, d));
    FORWARD_IF(bind_linear(m, &w->v, KEY("model.layers.%d.self_attn.v_proj", L), kvd, d));
    FORWARD_IF(bind_linear(m, &w->o, KEY("model.layers.%d.self_attn.o_proj", L), d, qd));
    FORWARD_IF(bind_vec(m, KEY("model.layers.%d.self_attn.q_norm.weight", L), m->hd, &w->q_norm));
    FORWARD_IF(bind_vec(m, KEY("model.layers.%d.self_attn.k_norm.weight", L), m->hd, &w->k_norm));
    FORWARD_IF(bind_vec(m, KEY("model.layers.%d.input_layernorm.weight", L), d, &w->in_norm));
    FORWARD_IF(bind_vec(m, KEY("model.layers.%d.post_attention_layernorm.weight", L), d, &w->post_norm));
    w->moe = sq_config_is_moe_layer(&m->cfg, L);
    w->n_exp = w->moe ? m->n_exp : 1;
    w->gate = sparq_calloc((size_t)w->n_exp, sizeof(sq_linear));
    w->up = sparq_calloc((size_t)w->n_exp, sizeof(sq_linear));
    w->down = sparq_calloc((size_t)w->n_exp, sizeof(sq_linear));
    RETURN_IF(!w->gate || !w->up || !w->down, SPARQ_E_NOMEM, "layer %d: out of memory", L);
    if (w->moe) {
        const int I = (int)m->cfg.moe_intermediate_size;
        FORWARD_IF(bind_linear(m, &w->router, KEY("model.layers.%d.mlp.gate", L), m->n_exp, d));
        for (int e = 0; e < w->n_exp; e++) {
            FORWARD_IF(bind_linear(m, &w->gate[e], KEY("model.layers.%d.mlp.experts.%d.gate_proj", L, e), I, d));
            FORWARD_IF(bind_linear(m, &w->up[e], KEY("model.layers.%d.mlp.experts.%d.up_proj", L, e), I, d));
            FORWARD_IF(bind_linear(m, &w->down[e], KEY("model.layers.%d.mlp.experts.%d.down_proj", L, e), d, I));
        }
    } else {
        const int I = (int)m->cfg.intermediate_size;
        FORWARD_IF(bind_linear(m, &w->gate[0], KEY("model.layers.%d.mlp.gate_proj", L), I, d));
        FORWARD_IF(bind_linear(m, &w->up[0], KEY("model.layers.%d.mlp.up_proj", L), I, d));
        FORWARD_IF(bind_linear(m, &w->down[0], KEY("model.layers.%d.mlp.down_proj", L), d, I));
    }
#undef KEY
    return SPARQ_OK;
}

/* Carve the workspace. With base == NULL only counts bytes. Every buffer is
 * 64-byte aligned. The layout (rows R = max_rows):
 *   x, xn, proj, xg, dn, mo        [R, d]      residual, normed, sublayer out, expert in/out, MoE sum
 *   q, ao [R, H*hd]; k, v [R, KV*hd]
 *   rl [R, E] router logits; rw, lw [R, k] weights; ridx [R, k]; rows_of [R*k]
 *   g, u [R, I_max]                             expert / MLP gate and up
 *   kvf, kvl, pos [R]; cnt, off [E + 1]
 * runtime/memplan.h (sq_memplan_workspace_terms) mirrors this layout term by
 * term: change both together (tests/pack/test_plan_runtime.c compares them).                                               */
static size_t carve(sq_model *m, char *base)
{
    size_t o = 0;
    const size_t R = (size_t)m->opts.max_rows, d = (size_t)m->d;
    const size_t E = (size_t)(m->n_exp > 0 ? m->n_exp : 1), K = (size_t)(m->top_k > 0 ? m->top_k : 1);
#define TAKE(ptr, type, n)                                        \
    do {                                                          \
        if (base) m->ptr = (type *)(void *)(base + o);            \
        o += (((n) * sizeof(type)) + 63) & ~(size_t)63;           \
    } while (0)
    TAKE(x, float, R * d);
    TAKE(xn, float, R * d);
    TAKE(proj, float, R * d);
    TAKE(xg, float, R * d);
    TAKE(dn, float, R * d);
    TAKE(mo, float, R * d);
    TAKE(q, float, R * (size_t)m->nh * m->hd);
    TAKE(ao, float, R * (size_t)m->nh * m->hd);
    TAKE(k, float, R * (size_t)m->nkv * m->hd);
    TAKE(v, float, R * (size_t)m->nkv * m->hd);
    TAKE(rl, float, R * E);
    TAKE(rw, float, R * K);
    TAKE(lw, float, R * K);
    TAKE(ridx, int, R * K);
    TAKE(rows_of, int, R * K);
    TAKE(g, float, R * (size_t)m->inter_max);
    TAKE(u, float, R * (size_t)m->inter_max);
    TAKE(kvf, int, R);
    TAKE(kvl, int, R);
    TAKE(pos, int, R);
    TAKE(cnt, int, E + 1);
    TAKE(off, int, E + 1);
#undef TAKE
    return o;
}

/* A bundle written by `sparq pack` has manifest.json at its top, config and
 * tokenizer beside it, and node K's weights in node-K/. The quick check
 * (sizes of every file the node needs) runs before anything is mapped, and
 * the KV cache and workspace are sized from the plan the bundle was packed
 * for (ctx × users, prefill chunk), as design.md asks: a bundle that plan
 * said fits is loaded with exactly the sizes that were planned. A bundle
 * packed for N boxes runs as N processes (o->nodes), this one loading node
 * o->node: its layers, plus the embeddings on the first node and the final
 * norm and lm_head on the last. On success *weights_dir is the node's folder
 * (heap), *plan_threads the thread count the plan assumed, and m's layer
 * range and embed/head flags are set. */
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
    } else if ((st = sq_bundle_check_quick(dir, &man, o->node)) == SPARQ_OK) {
        const sq_manifest_node *nd = &man.nodes[o->node];
        o->ctx = (int)man.ctx;
        o->n_seq = (int)man.users;
        o->max_rows = (int)man.chunk;
        *plan_threads = (int)man.threads;
        m->first = (int)nd->first_layer;
        m->end = (int)(nd->first_layer + nd->n_layers);
        m->has_embed = nd->has_embed;
        m->has_head = nd->has_head;
        char sub[32];
        snprintf(sub, sizeof sub, "node-%d", o->node);
        *weights_dir = sparq_path_join(dir, sub);
        if (!*weights_dir) st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", dir);
    }
    sq_manifest_free(&man);
    return st;
}

/* A device exec (kernels/backend.h, `device`): the index arrays the graph
 * fills on the host (kvf, kvl, pos) move to host memory, a logits buffer is
 * made in device memory, and every weight this process uses is uploaded now
 * (so the first step does not pay for it), each layer's MoE included. */
static sparq_status device_setup(sq_model *m)
{
    sq_exec *ex = m->ex;
    const sq_backend *be = ex->be;
    const size_t R = (size_t)m->opts.max_rows;
    m->host_idx = sparq_malloc(3 * R * sizeof(int));
    RETURN_IF(!m->host_idx, SPARQ_E_NOMEM, "out of memory");
    m->kvf = m->host_idx;
    m->kvl = m->host_idx + R;
    m->pos = m->host_idx + 2 * R;
    m->dlog_rows = m->opts.max_rows < 64 ? m->opts.max_rows : 64;
    m->dlog = be->alloc(ex, (size_t)m->dlog_rows * (size_t)m->vocab * sizeof(float));
    RETURN_IF(!m->dlog, SPARQ_E_NOMEM, "%s: cannot allocate %d rows of logits", be->name, m->dlog_rows);
    const size_t es = m->embed ? (m->embed->dtype == SF_F32 ? 4 : 2) : 0;
    if (m->embed) FORWARD_IF(be->prepare(ex, m->embed->data, (size_t)m->vocab * (size_t)m->d * es));
    if (m->has_head) {
        FORWARD_IF(be->prepare_linear(ex, &m->head));
        FORWARD_IF(be->prepare(ex, m->final_norm, (size_t)m->d * sizeof(float)));
    }
    FORWARD_IF(be->prepare(ex, m->inv_freq, (size_t)(m->hd / 2) * sizeof(float)));
    for (int L = m->first; L < m->end; L++) {
        layer_w *w = &m->layers[L];
        FORWARD_IF(be->prepare_linear(ex, &w->q));
        FORWARD_IF(be->prepare_linear(ex, &w->k));
        FORWARD_IF(be->prepare_linear(ex, &w->v));
        FORWARD_IF(be->prepare_linear(ex, &w->o));
        FORWARD_IF(be->prepare(ex, w->in_norm, (size_t)m->d * sizeof(float)));
        FORWARD_IF(be->prepare(ex, w->post_norm, (size_t)m->d * sizeof(float)));
        FORWARD_IF(be->prepare(ex, w->q_norm, (size_t)m->hd * sizeof(float)));
        FORWARD_IF(be->prepare(ex, w->k_norm, (size_t)m->hd * sizeof(float)));
        w->ml = (sq_moe_layer){.n_exp = w->n_exp, .top_k = w->moe ? m->top_k : 1, .norm_topk = m->cfg.norm_topk_prob,
                               .router = w->moe ? &w->router : NULL, .gate = w->gate, .up = w->up, .down = w->down};
        FORWARD_IF(be->prepare_moe(ex, &w->ml, m->opts.max_rows));
    }
    return be->sync(ex);
}

/* With a device exec the hidden states live in device memory: the public
 * layer-at-a-time calls accept only rows of the model's own workspace there. */
static sparq_status check_mem(const sq_model *m, const void *p, const char *what)
{
    if (!m->ex->be->device) return SPARQ_OK;
    const char *b = m->ws, *q = p;
    RETURN_IF(q < b || q >= b + m->ws_bytes, SPARQ_E_UNSUPPORTED,
              "%s: on device %s the hidden states must be the model's own rows (layer-at-a-time calls with host "
              "buffers need a CPU model)", what, m->ex->be->name);
    return SPARQ_OK;
}

sparq_status sq_model_load(sq_model **out, const char *dir, const sq_model_opts *opts)
{
    *out = NULL;
    sq_model *m = sparq_calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "model: out of memory");
    sparq_status st = SPARQ_OK;
    if (opts) m->opts = *opts;
    else sq_model_opts_default(&m->opts);
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
    if (c->arch != SQ_ARCH_QWEN3_MOE) FAIL(SPARQ_E_UNSUPPORTED, "%s: architecture '%s' not supported", dir, c->model_type);
    if (c->hidden_size <= 0 || c->hidden_size > 65536 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 ||
        c->num_attention_heads % c->num_key_value_heads || c->head_dim <= 0 || c->head_dim > 1024 ||
        c->head_dim % 2 || c->vocab_size <= 0 || c->vocab_size > (1 << 24) || c->num_hidden_layers <= 0 ||
        c->num_hidden_layers > 4096 || c->num_experts < 0 || c->num_experts > 65536 ||
        c->moe_intermediate_size < 0 || c->moe_intermediate_size > (1 << 20) || c->intermediate_size < 0 ||
        c->intermediate_size > (1 << 22) || (c->num_experts > 0 && (c->num_experts_per_tok <= 0 ||
                                                                    c->num_experts_per_tok > c->num_experts)))
        FAIL(SPARQ_E_FORMAT, "%s: config.json: inconsistent sizes (hidden %lld, heads %lld/%lld, head_dim %lld, "
             "experts %lld top-%lld)", dir, (long long)c->hidden_size, (long long)c->num_attention_heads,
             (long long)c->num_key_value_heads, (long long)c->head_dim, (long long)c->num_experts,
             (long long)c->num_experts_per_tok);
    if (strcmp(c->hidden_act, "silu") != 0) FAIL(SPARQ_E_UNSUPPORTED, "%s: hidden_act '%s' not supported", dir, c->hidden_act);
    m->d = (int)c->hidden_size;
    m->nh = (int)c->num_attention_heads;
    m->nkv = (int)c->num_key_value_heads;
    m->hd = (int)c->head_dim;
    m->vocab = (int)c->vocab_size;
    m->n_layers = (int)c->num_hidden_layers;
    m->n_exp = (int)c->num_experts;
    m->top_k = (int)c->num_experts_per_tok;
    m->eps = (float)c->rms_norm_eps;
    if (m->end < 0) m->end = m->n_layers;
    if (m->first < 0 || m->end > m->n_layers || m->first > m->end)
        FAIL(SPARQ_E_FORMAT, "%s: node %d holds layers [%d, %d), but the model has %d", dir, m->opts.node, m->first,
             m->end, m->n_layers);
    m->inter_max = 1;
    for (int L = 0; L < m->n_layers; L++) {
        int I = (int)(sq_config_is_moe_layer(c, L) ? c->moe_intermediate_size : c->intermediate_size);
        if (I > m->inter_max) m->inter_max = I;
    }
    if (m->opts.ctx <= 0) m->opts.ctx = 4096;
    if (c->max_position_embeddings > 0 && m->opts.ctx > c->max_position_embeddings)
        m->opts.ctx = (int)c->max_position_embeddings;
    if (m->opts.n_seq <= 0) m->opts.n_seq = 1;
    if (m->opts.max_rows <= 0) m->opts.max_rows = 512;

    TRY(sf_open(&m->sf, weights_dir ? weights_dir : dir));
    const bool tied = c->tie_word_embeddings && !sf_find(m->sf, "lm_head.weight") && !sf_find(m->sf, "lm_head.trellis");
    if (m->has_embed || (m->has_head && tied)) {
        TRY(find_tensor(m, "model.embed_tokens.weight", &m->embed));
        TRY(check_shape(m, m->embed, 2, (uint64_t)m->vocab, (uint64_t)m->d));
        sq_linear_kind k;
        TRY(dense_kind(m, m->embed, &k));
        m->weights_bytes += m->embed->nbytes;
    }
    if (!m->has_head) {
        /* a first or middle node: no final norm, no lm_head */
    } else if (tied) {
        sq_linear_kind k;
        TRY(dense_kind(m, m->embed, &k));
        m->head = (sq_linear){.kind = k, .in = m->d, .out = m->vocab, .w = m->embed->data,
                              .name = sparq_strdup("lm_head (tied to model.embed_tokens)")};
        if (!m->head.name) FAIL(SPARQ_E_NOMEM, "out of memory");
    } else {
        TRY(bind_linear(m, &m->head, "lm_head", m->vocab, m->d));
    }
    if (m->has_head) TRY(bind_vec(m, "model.norm.weight", m->d, &m->final_norm));
    m->layers = sparq_calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) FAIL(SPARQ_E_NOMEM, "out of memory");
    for (int L = m->first; L < m->end; L++) TRY(load_layer(m, L));

    m->inv_freq = sparq_malloc((size_t)(m->hd / 2) * sizeof(float));
    if (!m->inv_freq) FAIL(SPARQ_E_NOMEM, "out of memory");
    for (int i = 0; i < m->hd / 2; i++)
        m->inv_freq[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)m->hd);

    /* Sizes from the memory plan; the runtime allocates at least that. */
    sq_memplan_params p;
    sq_memplan_params_default(&p);
    p.ctx = m->opts.ctx;
    p.users = m->opts.n_seq;
    p.chunk = m->opts.max_rows;
    p.logits_rows = 0;
    p.kv_dtype = SQ_KV_F32;
    if (plan_threads > 0) p.threads = plan_threads;
    const int n_local = m->end - m->first;
    m->plan_kv = sq_memplan_kv_bytes(c, n_local, &p);
    m->plan_ws = sq_memplan_workspace_bytes(c, &p, m->has_head);

    const size_t kvd = (size_t)m->nkv * m->hd;
    uint64_t kv_floats;
    if (!sparq_mul_u64((uint64_t)m->opts.n_seq * (uint64_t)n_local, (uint64_t)m->opts.ctx * kvd, &kv_floats) ||
        kv_floats > ((uint64_t)1 << 40) ||
        (uint64_t)m->opts.n_seq * (uint64_t)n_local * (uint64_t)m->opts.ctx > (uint64_t)INT32_MAX)
        FAIL(SPARQ_E_RANGE, "KV cache of %d sequences x %d tokens is too large", m->opts.n_seq, m->opts.ctx);
    m->kv_bytes = 2 * kv_floats * sizeof(float);
    TRY(sq_exec_create_on(&m->ex, m->opts.device, m->opts.n_threads));
    const sq_backend *be = m->ex->be; /* KV cache and workspace in its memory (device memory for CUDA) */
    m->kv_k = be->alloc(m->ex, (size_t)(kv_floats ? kv_floats : 1) * sizeof(float));
    m->kv_v = be->alloc(m->ex, (size_t)(kv_floats ? kv_floats : 1) * sizeof(float));
    m->seq_len = sparq_calloc((size_t)m->opts.n_seq, sizeof(int));
    if (!m->kv_k || !m->kv_v || !m->seq_len)
        FAIL(SPARQ_E_NOMEM, "cannot allocate the KV cache (%llu bytes)", (unsigned long long)m->kv_bytes);

    m->ws_bytes = carve(m, NULL);
    m->ws = be->alloc(m->ex, (size_t)m->ws_bytes);
    if (!m->ws) FAIL(SPARQ_E_NOMEM, "cannot allocate the workspace (%llu bytes)", (unsigned long long)m->ws_bytes);
    carve(m, m->ws);
    if (be->device) TRY(device_setup(m));

    int max_in = m->d > m->inter_max ? m->d : m->inter_max;
    if (m->nh * m->hd > max_in) max_in = m->nh * m->hd;
    size_t sf = sq_exec_scratch_floats(max_in, m->opts.ctx);
    TRY(sq_exec_reserve(m->ex, sf));
    m->scratch_bytes = (uint64_t)sf * sizeof(float) * (uint64_t)m->ex->n_threads;
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

void sq_model_free(sq_model *m)
{
    if (!m) return;
    if (m->layers) {
        for (int L = 0; L < m->n_layers; L++) {
            layer_w *w = &m->layers[L];
            free_linear(&w->q);
            free_linear(&w->k);
            free_linear(&w->v);
            free_linear(&w->o);
            free_linear(&w->router);
            for (int e = 0; e < w->n_exp; e++) {
                if (w->gate) free_linear(&w->gate[e]);
                if (w->up) free_linear(&w->up[e]);
                if (w->down) free_linear(&w->down[e]);
            }
            sparq_free(w->gate);
            sparq_free(w->up);
            sparq_free(w->down);
            sparq_free(w->in_norm);
            sparq_free(w->post_norm);
            sparq_free(w->q_norm);
            sparq_free(w->k_norm);
        }
        sparq_free(m->layers);
    }
    free_linear(&m->head);
    sparq_free(m->final_norm);
    sparq_free(m->inv_freq);
    if (m->ex) { /* KV cache and workspace came from the exec's backend */
        m->ex->be->free(m->ex, m->kv_k);
        m->ex->be->free(m->ex, m->kv_v);
        m->ex->be->free(m->ex, m->ws);
        m->ex->be->free(m->ex, m->dlog);
    }
    sparq_free(m->host_idx);
    sparq_free(m->seq_len);
    sq_exec_free(m->ex);
    for (int i = 0; i < m->n_owned; i++) sparq_free(m->owned[i]);
    sparq_free(m->owned);
    if (m->sf) sf_close(m->sf);
    sq_config_free(&m->cfg);
    sparq_free(m);
}

const sq_model_config *sq_model_cfg(const sq_model *m) { return &m->cfg; }
const sq_model_opts *sq_model_options(const sq_model *m) { return &m->opts; }
sq_exec *sq_model_exec(sq_model *m) { return m->ex; }

void sq_model_mem_report(const sq_model *m, sq_model_mem *out)
{
    out->weights = m->weights_bytes;
    out->kv = m->kv_bytes;
    out->workspace = m->ws_bytes + m->small_bytes + m->scratch_bytes;
    out->plan_kv = m->plan_kv;
    out->plan_workspace = m->plan_ws;
}

sq_linear *sq_model_head_linear(sq_model *m) { return &m->head; }

void sq_model_layer_range(const sq_model *m, int *first, int *end)
{
    *first = m->first;
    *end = m->end;
}
bool sq_model_has_embed(const sq_model *m) { return m->has_embed; }
float *sq_model_hidden_buffer(sq_model *m) { return m->x; }
bool sq_model_has_head(const sq_model *m) { return m->has_head; }

bool sq_model_layer_is_moe(const sq_model *m, int layer)
{
    return layer >= m->first && layer < m->end && m->layers[layer].moe;
}

sq_linear *sq_model_linear(sq_model *m, int layer, sq_lin_id which, int expert)
{
    if (layer < m->first || layer >= m->end) return NULL;
    layer_w *w = &m->layers[layer];
    switch (which) {
    case SQ_LIN_Q: return &w->q;
    case SQ_LIN_K: return &w->k;
    case SQ_LIN_V: return &w->v;
    case SQ_LIN_O: return &w->o;
    case SQ_LIN_ROUTER: return w->moe ? &w->router : NULL;
    case SQ_LIN_GATE: return expert >= 0 && expert < w->n_exp ? &w->gate[expert] : NULL;
    case SQ_LIN_UP: return expert >= 0 && expert < w->n_exp ? &w->up[expert] : NULL;
    case SQ_LIN_DOWN: return expert >= 0 && expert < w->n_exp ? &w->down[expert] : NULL;
    default: return NULL;
    }
}

/* --- the graph ----------------------------------------------------------------- */

sparq_status sq_model_embed(const sq_model *m, const int32_t *tokens, int n, float *hidden)
{
    RETURN_IF(!m->has_embed, SPARQ_E_UNSUPPORTED, "this process holds node %d (layers %d..%d), not the embeddings",
              m->opts.node, m->first, m->end - 1);
    sq_linear_kind k = m->embed->dtype == SF_BF16 ? SQ_LINEAR_BF16
                       : m->embed->dtype == SF_F16 ? SQ_LINEAR_F16 : SQ_LINEAR_F32;
    const size_t es = k == SQ_LINEAR_F32 ? 4 : 2;
    if (m->ex->be->device) {
        FORWARD_IF(check_mem(m, hidden, "embed"));
        for (int i = 0; i < n; i++)
            RETURN_IF(tokens[i] < 0 || tokens[i] >= m->vocab, SPARQ_E_RANGE,
                      "token id %d at %d outside vocabulary [0, %d)", (int)tokens[i], i, m->vocab);
        m->ex->be->embed(m->ex, k, m->embed->data, m->d, tokens, n, hidden);
        return SPARQ_OK;
    }
    for (int i = 0; i < n; i++) {
        RETURN_IF(tokens[i] < 0 || tokens[i] >= m->vocab, SPARQ_E_RANGE, "token id %d at %d outside vocabulary [0, %d)",
                  (int)tokens[i], i, m->vocab);
        sq_cpu_to_f32(k, (const char *)m->embed->data + (size_t)tokens[i] * (size_t)m->d * es, (size_t)m->d,
                      hidden + (size_t)i * m->d);
    }
    return SPARQ_OK;
}

static inline void observe(const sq_observer *obs, int L, sq_lin_id which, int e, const float *x, int rows, int in)
{
    if (obs && obs->linear_input) obs->linear_input(obs->user, L, which, e, x, rows, in);
}

/* moe_out[rows, d] = MoE (or dense MLP) of xn. */
static void moe_block(sq_model *m, int L, const float *xn, int rows, const sq_observer *obs)
{
    sq_exec *ex = m->ex;
    const sq_backend *be = ex->be;
    layer_w *w = &m->layers[L];
    const int d = m->d, K = w->moe ? m->top_k : 1, E = w->n_exp;
    if (be->moe) { /* device backend: router, grouping and experts on the device (no observers there) */
        const sq_moe_ws ws = {m->rl, m->rw, m->lw, m->xg, m->g, m->u, m->dn, m->ridx, m->rows_of};
        be->moe(ex, &w->ml, xn, rows, m->mo, &ws);
        return;
    }
    memset(m->mo, 0, (size_t)rows * d * sizeof(float));
    if (w->moe) {
        observe(obs, L, SQ_LIN_ROUTER, -1, xn, rows, d);
        sq_linear_forward(ex, &w->router, xn, rows, m->rl);
        be->router_topk(ex, m->rl, rows, E, K, m->cfg.norm_topk_prob, m->ridx, m->rw);
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
        const sq_linear *gl = &w->gate[e], *ul = &w->up[e], *dl = &w->down[e];
        const int I = gl->out;
        if (all) {
            /* calibration: this expert on every row; keep its routed rows' outputs */
            observe(obs, L, SQ_LIN_GATE, e, xn, rows, d);
            observe(obs, L, SQ_LIN_UP, e, xn, rows, d);
            sq_linear_forward(ex, gl, xn, rows, m->g);
            sq_linear_forward(ex, ul, xn, rows, m->u);
            be->swiglu(ex, m->g, m->u, (size_t)rows * I, m->g);
            observe(obs, L, SQ_LIN_DOWN, e, m->g, rows, I);
            sq_linear_forward(ex, dl, m->g, rows, m->dn);
            for (int j = 0; j < n; j++) {
                int r = m->rows_of[first + j];
                be->axpy(ex, m->lw[first + j], m->dn + (size_t)r * d, (size_t)d, m->mo + (size_t)r * d);
            }
            continue;
        }
        for (int j = 0; j < n; j++)
            memcpy(m->xg + (size_t)j * d, xn + (size_t)m->rows_of[first + j] * d, (size_t)d * sizeof(float));
        observe(obs, L, SQ_LIN_GATE, e, m->xg, n, d);
        observe(obs, L, SQ_LIN_UP, e, m->xg, n, d);
        sq_linear_forward(ex, gl, m->xg, n, m->g);
        sq_linear_forward(ex, ul, m->xg, n, m->u);
        be->swiglu(ex, m->g, m->u, (size_t)n * I, m->g);
        observe(obs, L, SQ_LIN_DOWN, e, m->g, n, I);
        sq_linear_forward(ex, dl, m->g, n, m->dn);
        for (int j = 0; j < n; j++)
            be->axpy(ex, m->lw[first + j], m->dn + (size_t)j * d, (size_t)d,
                     m->mo + (size_t)m->rows_of[first + j] * d);
    }
}

/* One decoder layer on rows whose key ranges are already in m->kvf / m->kvl.
 * cached == false: no cache, keys are the batch's own k/v rows; true: kvf[r]
 * is kv_row0(sequence of row r, L), an index in rows of KV from the start of
 * the whole cache, and the row's K/V are stored there at pos[r]. */
static void layer_core(sq_model *m, int L, float *hidden, int rows, const int *pos, bool cached,
                       const sq_observer *obs)
{
    sq_exec *ex = m->ex;
    const sq_backend *be = ex->be;
    layer_w *w = &m->layers[L];
    const int d = m->d, hd = m->hd;
    const size_t kvd = (size_t)m->nkv * hd;

    /* attention */
    be->rmsnorm(ex, hidden, rows, d, w->in_norm, m->eps, m->xn);
    observe(obs, L, SQ_LIN_Q, -1, m->xn, rows, d);
    observe(obs, L, SQ_LIN_K, -1, m->xn, rows, d);
    observe(obs, L, SQ_LIN_V, -1, m->xn, rows, d);
    sq_linear_forward(ex, &w->q, m->xn, rows, m->q);
    sq_linear_forward(ex, &w->k, m->xn, rows, m->k);
    sq_linear_forward(ex, &w->v, m->xn, rows, m->v);
    be->rmsnorm(ex, m->q, rows * m->nh, hd, w->q_norm, m->eps, m->q);
    be->rmsnorm(ex, m->k, rows * m->nkv, hd, w->k_norm, m->eps, m->k);
    be->rope(ex, m->q, rows, m->nh, hd, pos, m->inv_freq);
    be->rope(ex, m->k, rows, m->nkv, hd, pos, m->inv_freq);
    const float *kb = m->k, *vb = m->v;
    if (cached) {
        be->kv_store(ex, m->k, m->v, rows, kvd, m->kvf, pos, m->kv_k, m->kv_v);
        kb = m->kv_k;
        vb = m->kv_v;
    }
    be->attention(ex, m->q, rows, m->nh, m->nkv, hd, kb, vb, m->kvf, m->kvl, 1.0f / sqrtf((float)hd), m->ao);
    observe(obs, L, SQ_LIN_O, -1, m->ao, rows, m->nh * hd);
    sq_linear_forward(ex, &w->o, m->ao, rows, m->proj);
    be->axpy(ex, 1.0f, m->proj, (size_t)rows * d, hidden);

    /* MoE / MLP */
    be->rmsnorm(ex, hidden, rows, d, w->post_norm, m->eps, m->xn);
    moe_block(m, L, m->xn, rows, obs);
    be->axpy(ex, 1.0f, m->mo, (size_t)rows * d, hidden);
}

/* First KV row of (seq, layer) in the whole cache, in rows of nkv*hd floats. */
static int kv_row0(const sq_model *m, int seq, int L)
{
    return (seq * (m->end - m->first) + (L - m->first)) * m->opts.ctx;
}

sparq_status sq_model_forward_layer(sq_model *m, int L, float *hidden, int rows, const int *pos, int seq,
                                    const sq_observer *obs)
{
    RETURN_IF(L < m->first || L >= m->end, SPARQ_E_RANGE, "layer %d outside [%d, %d), the layers this process holds",
              L, m->first, m->end);
    FORWARD_IF(check_mem(m, hidden, "forward_layer"));
    RETURN_IF(obs && m->ex->be->device, SPARQ_E_UNSUPPORTED, "forward_layer: observers need a CPU model");
    RETURN_IF(rows < 0 || rows > m->opts.max_rows, SPARQ_E_RANGE, "forward_layer: %d rows, at most %d (max_rows)",
              rows, m->opts.max_rows);
    RETURN_IF(seq >= m->opts.n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seq, m->opts.n_seq);
    if (rows == 0) return SPARQ_OK;
    /* positions → key ranges */
    if (seq >= 0) {
        const int len = m->seq_len[seq];
        RETURN_IF(len + rows > m->opts.ctx, SPARQ_E_RANGE,
                  "sequence %d: %d + %d tokens exceed the context of %d", seq, len, rows, m->opts.ctx);
        for (int r = 0; r < rows; r++) {
            RETURN_IF(pos[r] != len + r, SPARQ_E_ARG, "forward_layer: row %d has position %d, expected %d", r,
                      pos[r], len + r);
            m->kvf[r] = kv_row0(m, seq, L);
            m->kvl[r] = pos[r] + 1;
        }
    } else {
        for (int r = 0; r < rows; r++) {
            RETURN_IF(pos[r] < 0 || pos[r] > r || (pos[r] > 0 && pos[r - 1] != pos[r] - 1), SPARQ_E_ARG,
                      "forward_layer: positions must be runs 0, 1, 2, ... (row %d has %d)", r, pos[r]);
            m->kvf[r] = r - pos[r];
            m->kvl[r] = pos[r] + 1;
        }
    }
    layer_core(m, L, hidden, rows, pos, seq >= 0, obs);
    return SPARQ_OK;
}

/* Check that rows continue their sequences: row r is at len(seqs[r]) plus the
 * number of earlier rows of the same sequence, and fits the context. */
static sparq_status check_rows(const sq_model *m, int rows, const int *seqs, const int *pos)
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

sparq_status sq_model_forward_rows(sq_model *m, float *hidden, int rows, const int *seqs, const int *pos)
{
    FORWARD_IF(check_rows(m, rows, seqs, pos));
    if (rows == 0) return SPARQ_OK;
    FORWARD_IF(check_mem(m, hidden, "forward_rows"));
    for (int r = 0; r < rows; r++) m->kvl[r] = pos[r] + 1;
    for (int L = m->first; L < m->end; L++) {
        for (int r = 0; r < rows; r++) m->kvf[r] = kv_row0(m, seqs[r], L);
        layer_core(m, L, hidden, rows, pos, true, NULL);
    }
    for (int r = 0; r < rows; r++) m->seq_len[seqs[r]]++;
    return SPARQ_OK;
}

sparq_status sq_model_decode_batch(sq_model *m, int n, const int *seqs, const int32_t *tokens, float *logits)
{
    RETURN_IF(n < 0 || n > m->opts.max_rows || n > m->opts.n_seq, SPARQ_E_RANGE,
              "decode_batch: %d rows (max_rows %d, sequences %d)", n, m->opts.max_rows, m->opts.n_seq);
    for (int r = 0; r < n; r++) {
        RETURN_IF(seqs[r] < 0 || seqs[r] >= m->opts.n_seq, SPARQ_E_RANGE, "decode_batch: sequence %d outside [0, %d)",
                  seqs[r], m->opts.n_seq);
        for (int q = 0; q < r; q++)
            RETURN_IF(seqs[q] == seqs[r], SPARQ_E_ARG, "decode_batch: sequence %d appears twice", seqs[r]);
        m->pos[r] = m->seq_len[seqs[r]];
    }
    if (n == 0) return SPARQ_OK;
    FORWARD_IF(check_rows(m, n, seqs, m->pos));
    FORWARD_IF(sq_model_embed(m, tokens, n, m->x));
    FORWARD_IF(sq_model_forward_rows(m, m->x, n, seqs, m->pos));
    if (logits) FORWARD_IF(sq_model_head(m, m->x, n, logits));
    return SPARQ_OK;
}

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

sparq_status sq_model_head(sq_model *m, const float *hidden, int rows, float *logits)
{
    RETURN_IF(!m->has_head, SPARQ_E_UNSUPPORTED, "this process holds node %d (layers %d..%d), not the lm_head",
              m->opts.node, m->first, m->end - 1);
    if (m->ex->be->device) { /* on the device in chunks of dlog_rows, then to the host */
        FORWARD_IF(check_mem(m, hidden, "head"));
        for (int r0 = 0; r0 < rows; r0 += m->dlog_rows) {
            const int n = rows - r0 < m->dlog_rows ? rows - r0 : m->dlog_rows;
            m->ex->be->rmsnorm(m->ex, hidden + (size_t)r0 * m->d, n, m->d, m->final_norm, m->eps, m->xn);
            sq_linear_forward(m->ex, &m->head, m->xn, n, m->dlog);
            FORWARD_IF(m->ex->be->to_host(m->ex, logits + (size_t)r0 * m->vocab, m->dlog,
                                          (size_t)n * (size_t)m->vocab * sizeof(float)));
        }
        return SPARQ_OK;
    }
    for (int r0 = 0; r0 < rows; r0 += m->opts.max_rows) {
        int n = rows - r0 < m->opts.max_rows ? rows - r0 : m->opts.max_rows;
        m->ex->be->rmsnorm(m->ex, hidden + (size_t)r0 * m->d, n, m->d, m->final_norm, m->eps, m->xn);
        sq_linear_forward(m->ex, &m->head, m->xn, n, logits + (size_t)r0 * m->vocab);
    }
    return SPARQ_OK;
}

sparq_status sq_model_forward(sq_model *m, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                              float *logits)
{
    RETURN_IF(seq < 0 || seq >= m->opts.n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seq, m->opts.n_seq);
    RETURN_IF(n < 0 || m->seq_len[seq] + n > m->opts.ctx, SPARQ_E_RANGE,
              "sequence %d: %d + %d tokens exceed the context of %d", seq, m->seq_len[seq], n, m->opts.ctx);
    for (int c0 = 0; c0 < n; c0 += m->opts.max_rows) {
        const int rows = n - c0 < m->opts.max_rows ? n - c0 : m->opts.max_rows;
        FORWARD_IF(sq_model_embed(m, tokens + c0, rows, m->x));
        const int len = m->seq_len[seq];
        for (int r = 0; r < rows; r++) m->pos[r] = len + r;
        for (int L = m->first; L < m->end; L++) FORWARD_IF(sq_model_forward_layer(m, L, m->x, rows, m->pos, seq, NULL));
        FORWARD_IF(sq_model_seq_advance(m, seq, rows));
        if (mode == SQ_LOGITS_ALL) FORWARD_IF(sq_model_head(m, m->x, rows, logits + (size_t)c0 * m->vocab));
        else if (mode == SQ_LOGITS_LAST && c0 + rows == n)
            FORWARD_IF(sq_model_head(m, m->x + (size_t)(rows - 1) * m->d, 1, logits));
    }
    return m->ex->be->sync(m->ex); /* a device backend reports its errors here */
}
