/* runtime/models/qwen3moe.c — the Qwen3-MoE graph (transformers' Qwen3MoeForCausalLM),
 * composed from the backend ops of kernels/backend.h and the MoE block of
 * runtime/models/blocks.h; its row of the architecture table (runtime/arch.h:
 * the layer description, the memory terms, the graph).
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
 * Linear slots (q3_layer): q/k/v/o_proj, then the router `gate` and the
 * experts' gate/up/down_proj, or a dense layer's gate/up/down_proj. The
 * model core (model.c) binds them; this file binds the norms and the rest.
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
#include "formats/safetensors.h"
#include "kernels/cpu/ops.h"
#include "runtime/models/blocks.h"
#include "runtime/models/model_impl.h"

/* --- the description (runtime/arch.h) ------------------------------------------ */

/* Slots of a layer: attention, then the router and the experts of a MoE layer
 * or the dense MLP of an mlp_only layer. */
enum { S_Q = 0, S_K, S_V, S_O, S_ROUTER, S_GATE, S_UP, S_DOWN };
enum { S_MLP_GATE = 4, S_MLP_UP, S_MLP_DOWN };

static sparq_status q3_check(const sq_model_config *c, const char *dir)
{
    if (c->hidden_size <= 0 || c->hidden_size > 65536 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 ||
        c->num_attention_heads % c->num_key_value_heads || c->head_dim <= 0 || c->head_dim > 1024 ||
        c->head_dim % 2 || c->vocab_size <= 0 || c->vocab_size > (1 << 24) || c->num_hidden_layers <= 0 ||
        c->num_hidden_layers > 4096 || c->num_experts < 0 || c->num_experts > 65536 ||
        c->moe_intermediate_size < 0 || c->moe_intermediate_size > (1 << 20) || c->intermediate_size < 0 ||
        c->intermediate_size > (1 << 22) || (c->num_experts > 0 && (c->num_experts_per_tok <= 0 ||
                                                                    c->num_experts_per_tok > c->num_experts)))
        return sparq_err(SPARQ_E_FORMAT, "%s: config.json: inconsistent sizes (hidden %lld, heads %lld/%lld, head_dim "
                         "%lld, experts %lld top-%lld)", dir, (long long)c->hidden_size,
                         (long long)c->num_attention_heads, (long long)c->num_key_value_heads, (long long)c->head_dim,
                         (long long)c->num_experts, (long long)c->num_experts_per_tok);
    RETURN_IF(strcmp(c->hidden_act, "silu") != 0, SPARQ_E_UNSUPPORTED, "%s: hidden_act '%s' not supported", dir,
              c->hidden_act);
    return SPARQ_OK;
}

static sparq_status q3_layer(const sq_model_config *c, int L, sq_layer_desc *out)
{
    memset(out, 0, sizeof *out);
    const int d = (int)c->hidden_size, qd = (int)(c->num_attention_heads * c->head_dim);
    const int kvd = (int)(c->num_key_value_heads * c->head_dim);
    sq_lin_desc *s = out->slot;
    s[S_Q] = (sq_lin_desc){"q_proj", "model.layers.{L}.self_attn.q_proj", SQ_ROLE_ATTN, d, qd, 1, S_Q, false, true};
    s[S_K] = (sq_lin_desc){"k_proj", "model.layers.{L}.self_attn.k_proj", SQ_ROLE_ATTN, d, kvd, 1, S_Q, false, true};
    s[S_V] = (sq_lin_desc){"v_proj", "model.layers.{L}.self_attn.v_proj", SQ_ROLE_ATTN, d, kvd, 1, S_Q, false, true};
    s[S_O] = (sq_lin_desc){"o_proj", "model.layers.{L}.self_attn.o_proj", SQ_ROLE_ATTN, qd, d, 1, S_O, false, true};
    if (sq_config_is_moe_layer(c, L)) {
        const int E = (int)c->num_experts, I = (int)c->moe_intermediate_size;
        out->moe = true;
        out->n_experts = E;
        out->n_slots = 8;
        s[S_ROUTER] = (sq_lin_desc){"gate", "model.layers.{L}.mlp.gate", SQ_ROLE_ROUTER, d, E, 1, S_ROUTER, false,
                                    false};
        s[S_GATE] = (sq_lin_desc){"experts.gate_proj", "model.layers.{L}.mlp.experts.{E}.gate_proj", SQ_ROLE_EXPERT,
                                  d, I, E, S_GATE, false, true};
        s[S_UP] = (sq_lin_desc){"experts.up_proj", "model.layers.{L}.mlp.experts.{E}.up_proj", SQ_ROLE_EXPERT, d, I,
                                E, S_GATE, false, true};
        s[S_DOWN] = (sq_lin_desc){"experts.down_proj", "model.layers.{L}.mlp.experts.{E}.down_proj", SQ_ROLE_EXPERT,
                                  I, d, E, S_DOWN, true, true};
    } else {
        const int I = (int)c->intermediate_size;
        out->n_slots = 7;
        s[S_MLP_GATE] = (sq_lin_desc){"gate_proj", "model.layers.{L}.mlp.gate_proj", SQ_ROLE_MLP, d, I, 1,
                                      S_MLP_GATE, false, true};
        s[S_MLP_UP] = (sq_lin_desc){"up_proj", "model.layers.{L}.mlp.up_proj", SQ_ROLE_MLP, d, I, 1, S_MLP_GATE,
                                    false, true};
        s[S_MLP_DOWN] = (sq_lin_desc){"down_proj", "model.layers.{L}.mlp.down_proj", SQ_ROLE_MLP, I, d, 1,
                                      S_MLP_DOWN, false, true};
    }
    return SPARQ_OK;
}

/* The tensors besides the slots: the norms load_layer and q3_load bind. */
static const sq_tensor_desc q3_tensors[] = {
    {"model.embed_tokens.weight", SQ_PLACE_EMBED, 2, {SQ_DIM_VOCAB, SQ_DIM_HIDDEN}, false, false},
    {"model.norm.weight", SQ_PLACE_HEAD, 1, {SQ_DIM_HIDDEN}, false, false},
    {"lm_head", SQ_PLACE_HEAD, 2, {SQ_DIM_VOCAB, SQ_DIM_HIDDEN}, true, true},
    {"model.layers.{L}.input_layernorm.weight", SQ_PLACE_LAYER, 1, {SQ_DIM_HIDDEN}, false, false},
    {"model.layers.{L}.post_attention_layernorm.weight", SQ_PLACE_LAYER, 1, {SQ_DIM_HIDDEN}, false, false},
    {"model.layers.{L}.self_attn.q_norm.weight", SQ_PLACE_LAYER, 1, {SQ_DIM_HEAD_DIM}, false, false},
    {"model.layers.{L}.self_attn.k_norm.weight", SQ_PLACE_LAYER, 1, {SQ_DIM_HEAD_DIM}, false, false},
};

/* --- the memory its graph allocates (runtime/memplan.h documents the terms) ---- */

/* KV cache: 2 (K and V) * layers * KV heads * head_dim * ctx * users * bytes. */
static uint64_t q3_kv_bytes(const sq_model_config *cfg, int64_t first, int64_t n_layers, const sq_memplan_params *p)
{
    (void)first; /* every layer keeps the same cache */
    const uint64_t f[] = {2, sq_memplan_pos(n_layers), sq_memplan_pos(cfg->num_key_value_heads),
                          sq_memplan_pos(cfg->head_dim), sq_memplan_pos(p->ctx), sq_memplan_pos(p->users),
                          sq_kv_dtype_bytes(p->kv_dtype)};
    return sq_memplan_prod(7, f);
}

/* The widest MLP of any layer (at least 1). */
static uint64_t widest_mlp(const sq_model_config *cfg)
{
    uint64_t w = 1;
    for (int64_t l = 0; l < cfg->num_hidden_layers; l++) {
        uint64_t i = sq_memplan_pos(sq_config_is_moe_layer(cfg, l) ? cfg->moe_intermediate_size
                                                                    : cfg->intermediate_size);
        if (i > w) w = i;
    }
    return w;
}

/* The workspace carve() below lays out, term by term. */
static void q3_workspace_terms(const sq_model_config *cfg, const sq_memplan_params *p, bool has_head,
                               sq_memplan_workspace *out)
{
    memset(out, 0, sizeof *out);
    const uint64_t R = sq_memplan_pos(sq_memplan_rows(p)), d = sq_memplan_pos(cfg->hidden_size);
    const uint64_t H = sq_memplan_pos(cfg->num_attention_heads), KV = sq_memplan_pos(cfg->num_key_value_heads);
    const uint64_t hd = sq_memplan_pos(cfg->head_dim);
    const uint64_t E = cfg->num_experts > 0 ? (uint64_t)cfg->num_experts : 1;
    const uint64_t k = cfg->num_experts_per_tok > 0 ? (uint64_t)cfg->num_experts_per_tok : 1;
    const uint64_t I = widest_mlp(cfg), f4 = 4;
#define MUL sparq_sat_mul_u64
#define ADD sparq_sat_add_u64
    out->hidden = sq_memplan_prod(4, (const uint64_t[]){6, R, d, f4});
    out->attn = sq_memplan_prod(4, (const uint64_t[]){R, ADD(MUL(2, H), MUL(2, KV)), hd, f4});
    out->moe = MUL(sq_memplan_sum(3, (const uint64_t[]){MUL(R, E), sq_memplan_prod(3, (const uint64_t[]){4, R, k}),
                                                         sq_memplan_prod(3, (const uint64_t[]){2, R, I})}),
                   f4);
    out->misc = ADD(MUL(ADD(MUL(3, R), MUL(2, E + 1)), f4), SQ_MEMPLAN_WS_SLACK);
    out->norms = MUL(ADD(MUL(sq_memplan_pos(cfg->num_hidden_layers), ADD(MUL(2, d), MUL(2, hd))), d), f4);
    uint64_t max_in = d > I ? d : I;
    if (MUL(H, hd) > max_in) max_in = MUL(H, hd);
    uint64_t per_thread = MUL(64, max_in) > sq_memplan_pos(p->ctx) ? MUL(64, max_in) : sq_memplan_pos(p->ctx);
    out->scratch = sq_memplan_prod(3, (const uint64_t[]){p->threads > 0 ? (uint64_t)p->threads : 1, per_thread, f4});
    if (has_head) {
        uint64_t lr = p->logits_rows > 0 ? (uint64_t)p->logits_rows : sq_memplan_pos(p->users);
        out->logits = sq_memplan_prod(3, (const uint64_t[]){lr, sq_memplan_pos(cfg->vocab_size), f4});
    }
#undef MUL
#undef ADD
    out->total = sq_memplan_sum(7, (const uint64_t[]){out->hidden, out->attn, out->moe, out->misc, out->norms,
                                                       out->scratch, out->logits});
}

/* --- the loaded model ------------------------------------------------------------ */

typedef struct layer_w {
    sq_linear *q, *k, *v, *o, *router; /* the core's linears (router NULL for a dense layer) */
    float *in_norm, *post_norm, *q_norm, *k_norm;
    bool moe;
    int n_exp;                    /* experts (1 for a dense MLP layer) */
    sq_linear *gate, *up, *down;  /* [n_exp] */
    sq_moe_layer ml;              /* the same, for a device backend's `moe` op (set by device_setup) */
} layer_w;

typedef struct q3 {
    sq_model *c;               /* the core (runtime/models/model_impl.h) */
    int d, nh, nkv, hd, vocab, n_exp, top_k, inter_max;
    float eps;
    const sf_tensor *embed;
    float *final_norm;
    float *inv_freq;
    layer_w *layers;
    /* KV cache: [n_seq][end - first][ctx][nkv*hd] for K and for V */
    float *kv_k, *kv_v;
    /* workspace (one allocation) */
    void *ws;
    int *host_idx;     /* device exec: kvf, kvl, pos live here on the host (the graph fills them) */
    float *dlog;       /* device exec: logits of up to dlog_rows rows before the copy to the host */
    int dlog_rows;
    float *x, *xn, *proj, *q, *k, *v, *ao, *rl, *rw, *g, *u, *xg, *dn, *mo, *lw;
    int *ridx, *kvf, *kvl, *pos, *rows_of, *cnt, *off;
} q3;

static sparq_status load_layer(q3 *m, int L)
{
    layer_w *w = &m->layers[L];
    char key[256];
    const int d = m->d;
    sq_model *c = m->c;
#define KEY(...) (snprintf(key, sizeof key, __VA_ARGS__), key)
    w->q = sq_mdl_lin(c, L, S_Q, 0);
    w->k = sq_mdl_lin(c, L, S_K, 0);
    w->v = sq_mdl_lin(c, L, S_V, 0);
    w->o = sq_mdl_lin(c, L, S_O, 0);
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("model.layers.%d.self_attn.q_norm.weight", L), m->hd, &w->q_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("model.layers.%d.self_attn.k_norm.weight", L), m->hd, &w->k_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("model.layers.%d.input_layernorm.weight", L), d, &w->in_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("model.layers.%d.post_attention_layernorm.weight", L), d, &w->post_norm));
#undef KEY
    w->moe = c->layers[L].desc.moe;
    w->n_exp = w->moe ? m->n_exp : 1;
    if (w->moe) {
        w->router = sq_mdl_lin(c, L, S_ROUTER, 0);
        w->gate = sq_mdl_lin(c, L, S_GATE, 0);
        w->up = sq_mdl_lin(c, L, S_UP, 0);
        w->down = sq_mdl_lin(c, L, S_DOWN, 0);
    } else {
        w->gate = sq_mdl_lin(c, L, S_MLP_GATE, 0);
        w->up = sq_mdl_lin(c, L, S_MLP_UP, 0);
        w->down = sq_mdl_lin(c, L, S_MLP_DOWN, 0);
    }
    w->ml = (sq_moe_layer){.n_exp = w->n_exp, .top_k = w->moe ? m->top_k : 1, .norm_topk = c->cfg.norm_topk_prob,
                           .router = w->router, .gate = w->gate, .up = w->up, .down = w->down,
                           .own_n = w->moe ? c->own_n : 0, .own_k = c->own_k, .combine = w->moe ? &c->combine : NULL};
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
static size_t carve(q3 *m, char *base)
{
    size_t o = 0;
    const size_t R = (size_t)m->c->opts.max_rows, d = (size_t)m->d;
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


/* A device exec (kernels/backend.h, `device`): the index arrays the graph
 * fills on the host (kvf, kvl, pos) move to host memory, a logits buffer is
 * made in device memory, and every weight this process uses is uploaded now
 * (so the first step does not pay for it), each layer's MoE included. */
static sparq_status device_setup(q3 *m)
{
    sq_exec *ex = m->c->ex;
    const sq_backend *be = ex->be;
    const size_t R = (size_t)m->c->opts.max_rows;
    m->host_idx = sparq_malloc(3 * R * sizeof(int));
    RETURN_IF(!m->host_idx, SPARQ_E_NOMEM, "out of memory");
    m->kvf = m->host_idx;
    m->kvl = m->host_idx + R;
    m->pos = m->host_idx + 2 * R;
    m->dlog_rows = m->c->opts.max_rows < 64 ? m->c->opts.max_rows : 64;
    m->dlog = be->alloc(ex, (size_t)m->dlog_rows * (size_t)m->vocab * sizeof(float));
    RETURN_IF(!m->dlog, SPARQ_E_NOMEM, "%s: cannot allocate %d rows of logits", be->name, m->dlog_rows);
    const size_t es = m->embed ? (m->embed->dtype == SF_F32 ? 4 : 2) : 0;
    if (m->embed) FORWARD_IF(be->prepare(ex, m->embed->data, (size_t)m->vocab * (size_t)m->d * es));
    if (m->c->has_head) {
        FORWARD_IF(be->prepare_linear(ex, &m->c->head));
        FORWARD_IF(be->prepare(ex, m->final_norm, (size_t)m->d * sizeof(float)));
    }
    FORWARD_IF(be->prepare(ex, m->inv_freq, (size_t)(m->hd / 2) * sizeof(float)));
    for (int L = m->c->first; L < m->c->end; L++) {
        layer_w *w = &m->layers[L];
        FORWARD_IF(sq_mdl_prepare_layer(m->c, L, 1u << SQ_ROLE_ATTN)); /* the rest through prepare_moe */
        FORWARD_IF(be->prepare(ex, w->in_norm, (size_t)m->d * sizeof(float)));
        FORWARD_IF(be->prepare(ex, w->post_norm, (size_t)m->d * sizeof(float)));
        FORWARD_IF(be->prepare(ex, w->q_norm, (size_t)m->hd * sizeof(float)));
        FORWARD_IF(be->prepare(ex, w->k_norm, (size_t)m->hd * sizeof(float)));
        FORWARD_IF(be->prepare_moe(ex, &w->ml, m->c->opts.max_rows));
    }
    return be->sync(ex);
}

/* With a device exec the hidden states live in device memory: the public
 * layer-at-a-time calls accept only rows of the model's own workspace there. */
static sparq_status check_mem(const q3 *m, const void *p, const char *what)
{
    if (!m->c->ex->be->device) return SPARQ_OK;
    const char *b = m->ws, *q = p;
    RETURN_IF(q < b || q >= b + m->c->ws_bytes, SPARQ_E_UNSUPPORTED,
              "%s: on device %s the hidden states must be the model's own rows (layer-at-a-time calls with host "
              "buffers need a CPU model)", what, m->c->ex->be->name);
    return SPARQ_OK;
}

static void q3_free(sq_model *c);

static sparq_status q3_load(sq_model *c, int plan_threads)
{
    q3 *m = sparq_calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "model: out of memory");
    c->impl = m;
    m->c = c;
    const sq_model_config *cfg = &c->cfg;
    m->d = (int)cfg->hidden_size;
    m->nh = (int)cfg->num_attention_heads;
    m->nkv = (int)cfg->num_key_value_heads;
    m->hd = (int)cfg->head_dim;
    m->vocab = (int)cfg->vocab_size;
    m->n_exp = (int)cfg->num_experts;
    m->top_k = (int)cfg->num_experts_per_tok;
    m->eps = (float)cfg->rms_norm_eps;
    m->inter_max = 1;
    for (int L = 0; L < c->n_layers; L++) {
        int I = (int)(sq_config_is_moe_layer(cfg, L) ? cfg->moe_intermediate_size : cfg->intermediate_size);
        if (I > m->inter_max) m->inter_max = I;
    }
    const bool tied = cfg->tie_word_embeddings && !sf_find(c->sf, "lm_head.weight") && !sf_find(c->sf, "lm_head.trellis");
    if (c->has_embed || (c->has_head && tied)) {
        FORWARD_IF(sq_mdl_find_tensor(c, "model.embed_tokens.weight", &m->embed));
        FORWARD_IF(sq_mdl_check_shape(c, m->embed, 2, (uint64_t)m->vocab, (uint64_t)m->d));
        sq_linear_kind k;
        FORWARD_IF(sq_mdl_dense_kind(c, m->embed, &k));
        c->weights_bytes += m->embed->nbytes;
    }
    if (!c->has_head) {
        /* a first or middle node: no final norm, no lm_head */
    } else if (tied) {
        sq_linear_kind k;
        FORWARD_IF(sq_mdl_dense_kind(c, m->embed, &k));
        c->head = (sq_linear){.kind = k, .in = m->d, .out = m->vocab, .w = m->embed->data,
                              .name = sparq_strdup("lm_head (tied to model.embed_tokens)")};
        RETURN_IF(!c->head.name, SPARQ_E_NOMEM, "out of memory");
    } else {
        FORWARD_IF(sq_mdl_bind_linear(c, &c->head, "lm_head", m->vocab, m->d));
    }
    if (c->has_head) FORWARD_IF(sq_mdl_bind_vec(c, "model.norm.weight", m->d, &m->final_norm));
    m->layers = sparq_calloc((size_t)c->n_layers, sizeof *m->layers);
    RETURN_IF(!m->layers, SPARQ_E_NOMEM, "out of memory");
    FORWARD_IF(sq_mdl_bind_layers(c));
    for (int L = c->first; L < c->end; L++) FORWARD_IF(load_layer(m, L));

    m->inv_freq = sparq_malloc((size_t)(m->hd / 2) * sizeof(float));
    RETURN_IF(!m->inv_freq, SPARQ_E_NOMEM, "out of memory");
    for (int i = 0; i < m->hd / 2; i++)
        m->inv_freq[i] = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)m->hd);

    /* Sizes from the memory plan; the runtime allocates at least that. */
    sq_memplan_params p;
    sq_memplan_params_default(&p);
    p.ctx = c->opts.ctx;
    p.users = c->opts.n_seq;
    p.chunk = c->opts.max_rows;
    p.logits_rows = 0;
    p.kv_dtype = SQ_KV_F32;
    if (plan_threads > 0) p.threads = plan_threads;
    const int n_local = c->end - c->first;
    c->plan_kv = sq_memplan_kv_bytes_range(cfg, c->first, n_local, &p);
    c->plan_ws = sq_memplan_workspace_bytes(cfg, &p, c->has_head);

    const size_t kvd = (size_t)m->nkv * m->hd;
    uint64_t kv_floats;
    RETURN_IF(!sparq_mul_u64((uint64_t)c->opts.n_seq * (uint64_t)n_local, (uint64_t)c->opts.ctx * kvd, &kv_floats) ||
                  kv_floats > ((uint64_t)1 << 40) ||
                  (uint64_t)c->opts.n_seq * (uint64_t)n_local * (uint64_t)c->opts.ctx > (uint64_t)INT32_MAX,
              SPARQ_E_RANGE, "KV cache of %d sequences x %d tokens is too large", c->opts.n_seq, c->opts.ctx);
    c->kv_bytes = 2 * kv_floats * sizeof(float);
    FORWARD_IF(sq_exec_create_on(&c->ex, c->opts.device, c->opts.n_threads));
    const sq_backend *be = c->ex->be; /* KV cache and workspace in its memory (device memory for CUDA) */
    if (be->device) { /* the plan against the device's free memory, before any upload */
        const uint64_t dlog = (uint64_t)(c->opts.max_rows < 64 ? c->opts.max_rows : 64) * (uint64_t)m->vocab * 4;
        FORWARD_IF(sq_mdl_device_check(c, c->kv_bytes + carve(m, NULL) + dlog));
    }
    m->kv_k = be->alloc(c->ex, (size_t)(kv_floats ? kv_floats : 1) * sizeof(float));
    m->kv_v = be->alloc(c->ex, (size_t)(kv_floats ? kv_floats : 1) * sizeof(float));
    RETURN_IF(!m->kv_k || !m->kv_v, SPARQ_E_NOMEM, "cannot allocate the KV cache (%llu bytes)",
              (unsigned long long)c->kv_bytes);

    c->ws_bytes = carve(m, NULL);
    m->ws = be->alloc(c->ex, (size_t)c->ws_bytes);
    RETURN_IF(!m->ws, SPARQ_E_NOMEM, "cannot allocate the workspace (%llu bytes)", (unsigned long long)c->ws_bytes);
    carve(m, m->ws);
    if (be->device) FORWARD_IF(device_setup(m));

    int max_in = m->d > m->inter_max ? m->d : m->inter_max;
    if (m->nh * m->hd > max_in) max_in = m->nh * m->hd;
    size_t sf = sq_exec_scratch_floats(max_in, c->opts.ctx);
    FORWARD_IF(sq_exec_reserve(c->ex, sf));
    c->scratch_bytes = (uint64_t)sf * sizeof(float) * (uint64_t)c->ex->n_threads;
    return SPARQ_OK;
}

static void q3_free(sq_model *c)
{
    q3 *m = c->impl;
    if (!m) return;
    if (m->layers) {
        for (int L = 0; L < c->n_layers; L++) {
            layer_w *w = &m->layers[L];
            sparq_free(w->in_norm);
            sparq_free(w->post_norm);
            sparq_free(w->q_norm);
            sparq_free(w->k_norm);
        }
        sparq_free(m->layers);
    }
    sparq_free(m->final_norm);
    sparq_free(m->inv_freq);
    if (c->ex) { /* KV cache and workspace came from the exec's backend */
        c->ex->be->free(c->ex, m->kv_k);
        c->ex->be->free(c->ex, m->kv_v);
        c->ex->be->free(c->ex, m->ws);
        c->ex->be->free(c->ex, m->dlog);
    }
    sparq_free(m->host_idx);
    sparq_free(m);
    c->impl = NULL;
}

/* --- the graph ----------------------------------------------------------------- */

static sparq_status q3_embed(const sq_model *mc, const int32_t *tokens, int n, float *hidden)
{
    const q3 *m = mc->impl;
    sq_linear_kind k = m->embed->dtype == SF_BF16 ? SQ_LINEAR_BF16
                       : m->embed->dtype == SF_F16 ? SQ_LINEAR_F16 : SQ_LINEAR_F32;
    const size_t es = k == SQ_LINEAR_F32 ? 4 : 2;
    if (m->c->ex->be->device) {
        FORWARD_IF(check_mem(m, hidden, "embed"));
        for (int i = 0; i < n; i++)
            RETURN_IF(tokens[i] < 0 || tokens[i] >= m->vocab, SPARQ_E_RANGE,
                      "token id %d at %d outside vocabulary [0, %d)", (int)tokens[i], i, m->vocab);
        m->c->ex->be->embed(m->c->ex, k, m->embed->data, m->d, tokens, n, hidden);
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

/* hidden[rows, d] += MoE (or dense MLP) of xn: runtime/models/blocks.h. */
static void moe_block(q3 *m, int L, const float *xn, int rows, const sq_observer *obs, float *hidden)
{
    const layer_w *w = &m->layers[L];
    const sq_block_moe_bufs b = {m->rl, m->rw, m->lw, m->xg, m->g, m->u, m->dn, m->mo,
                                 m->ridx, m->rows_of, m->cnt, m->off};
    const sq_block_moe_slots sl = w->moe ? (sq_block_moe_slots){S_ROUTER, S_GATE, S_UP, S_DOWN}
                                         : (sq_block_moe_slots){-1, S_MLP_GATE, S_MLP_UP, S_MLP_DOWN};
    sq_block_moe(m->c->ex, &w->ml, L, &sl, m->d, xn, rows, &b, obs, hidden);
}

/* One decoder layer on rows whose key ranges are already in m->kvf / m->kvl.
 * cached == false: no cache, keys are the batch's own k/v rows; true: kvf[r]
 * is kv_row0(sequence of row r, L), an index in rows of KV from the start of
 * the whole cache, and the row's K/V are stored there at pos[r]. */
static void layer_core(q3 *m, int L, float *hidden, int rows, const int *pos, bool cached,
                       const sq_observer *obs)
{
    sq_exec *ex = m->c->ex;
    const sq_backend *be = ex->be;
    layer_w *w = &m->layers[L];
    const int d = m->d, hd = m->hd;
    const size_t kvd = (size_t)m->nkv * hd;

    /* attention: the backend's fused front where it has one (not while observed: the
     * observers read xn), else op by op — the same computation */
    const sq_attn_front af = {.q = w->q, .k = w->k, .v = w->v, .norm = w->in_norm, .q_norm = w->q_norm,
                              .k_norm = w->k_norm, .eps = m->eps, .head_dim = hd, .inv_freq = m->inv_freq};
    if (obs || !be->attn_front ||
        !be->attn_front(ex, &af, hidden, rows, pos, m->kvf, cached ? m->kv_k : NULL, cached ? m->kv_v : NULL, m->q,
                        m->k, m->v)) {
        be->rmsnorm(ex, hidden, rows, d, w->in_norm, m->eps, m->xn);
        sq_observe(obs, L, S_Q, 0, m->xn, rows, d);
        sq_observe(obs, L, S_K, 0, m->xn, rows, d);
        sq_observe(obs, L, S_V, 0, m->xn, rows, d);
        sq_linear_forward(ex, w->q, m->xn, rows, m->q);
        sq_linear_forward(ex, w->k, m->xn, rows, m->k);
        sq_linear_forward(ex, w->v, m->xn, rows, m->v);
        be->rmsnorm(ex, m->q, rows * m->nh, hd, w->q_norm, m->eps, m->q);
        be->rmsnorm(ex, m->k, rows * m->nkv, hd, w->k_norm, m->eps, m->k);
        be->rope(ex, m->q, rows, m->nh, hd, pos, m->inv_freq);
        be->rope(ex, m->k, rows, m->nkv, hd, pos, m->inv_freq);
        if (cached) be->kv_store(ex, m->k, m->v, rows, kvd, m->kvf, pos, m->kv_k, m->kv_v);
    }
    const float *kb = cached ? m->kv_k : m->k, *vb = cached ? m->kv_v : m->v;
    be->attention(ex, m->q, rows, m->nh, m->nkv, hd, kb, vb, m->kvf, m->kvl, 1.0f / sqrtf((float)hd), m->ao);
    sq_observe(obs, L, S_O, 0, m->ao, rows, m->nh * hd);
    /* o_proj, its add into the residual and the post-attention norm (one op where the backend
     * fuses them); then the MoE / MLP on that norm, adding into the residual */
    if (!be->linear_add_rmsnorm ||
        !be->linear_add_rmsnorm(ex, w->o, m->ao, rows, hidden, w->post_norm, m->eps, m->xn)) {
        sq_linear_forward(ex, w->o, m->ao, rows, m->proj);
        be->add_rmsnorm(ex, m->proj, hidden, rows, d, w->post_norm, m->eps, m->xn);
    }
    moe_block(m, L, m->xn, rows, obs, hidden);
}

/* First KV row of (seq, layer) in the whole cache, in rows of nkv*hd floats. */
static int kv_row0(const q3 *m, int seq, int L)
{
    return (seq * (m->c->end - m->c->first) + (L - m->c->first)) * m->c->opts.ctx;
}

static sparq_status q3_forward_layer(sq_model *mc, int L, float *hidden, int rows, const int *pos, int seq,
                                    const sq_observer *obs)
{
    q3 *m = mc->impl;
    RETURN_IF(L < m->c->first || L >= m->c->end, SPARQ_E_RANGE, "layer %d outside [%d, %d), the layers this process holds",
              L, m->c->first, m->c->end);
    FORWARD_IF(check_mem(m, hidden, "forward_layer"));
    RETURN_IF(obs && m->c->ex->be->device, SPARQ_E_UNSUPPORTED, "forward_layer: observers need a CPU model");
    RETURN_IF(rows < 0 || rows > m->c->opts.max_rows, SPARQ_E_RANGE, "forward_layer: %d rows, at most %d (max_rows)",
              rows, m->c->opts.max_rows);
    RETURN_IF(seq >= m->c->opts.n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seq, m->c->opts.n_seq);
    if (rows == 0) return SPARQ_OK;
    /* positions → key ranges */
    if (seq >= 0) {
        const int len = m->c->seq_len[seq];
        RETURN_IF(len + rows > m->c->opts.ctx, SPARQ_E_RANGE,
                  "sequence %d: %d + %d tokens exceed the context of %d", seq, len, rows, m->c->opts.ctx);
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
    return sq_exec_take_error(m->c->ex);
}


static sparq_status q3_forward_rows(sq_model *mc, float *hidden, int rows, const int *seqs, const int *pos)
{
    q3 *m = mc->impl;
    FORWARD_IF(sq_mdl_check_rows(mc, rows, seqs, pos));
    if (rows == 0) return SPARQ_OK;
    FORWARD_IF(check_mem(m, hidden, "forward_rows"));
    for (int r = 0; r < rows; r++) m->kvl[r] = pos[r] + 1;
    for (int L = m->c->first; L < m->c->end; L++) {
        for (int r = 0; r < rows; r++) m->kvf[r] = kv_row0(m, seqs[r], L);
        layer_core(m, L, hidden, rows, pos, true, NULL);
    }
    FORWARD_IF(sq_exec_take_error(m->c->ex)); /* the sequences do not advance over a failed step */
    for (int r = 0; r < rows; r++) m->c->seq_len[seqs[r]]++;
    return SPARQ_OK;
}

static sparq_status q3_decode_batch(sq_model *mc, int n, const int *seqs, const int32_t *tokens, float *logits)
{
    q3 *m = mc->impl;
    return sq_mdl_decode_batch(mc, n, seqs, tokens, logits, m->x, m->pos);
}


static sparq_status q3_head(sq_model *mc, const float *hidden, int rows, float *logits)
{
    q3 *m = mc->impl;
    if (m->c->ex->be->device) { /* on the device in chunks of dlog_rows, then to the host */
        FORWARD_IF(check_mem(m, hidden, "head"));
        for (int r0 = 0; r0 < rows; r0 += m->dlog_rows) {
            const int n = rows - r0 < m->dlog_rows ? rows - r0 : m->dlog_rows;
            m->c->ex->be->rmsnorm(m->c->ex, hidden + (size_t)r0 * m->d, n, m->d, m->final_norm, m->eps, m->xn);
            sq_linear_forward(m->c->ex, &m->c->head, m->xn, n, m->dlog);
            FORWARD_IF(m->c->ex->be->to_host(m->c->ex, logits + (size_t)r0 * m->vocab, m->dlog,
                                          (size_t)n * (size_t)m->vocab * sizeof(float)));
        }
        return SPARQ_OK;
    }
    for (int r0 = 0; r0 < rows; r0 += m->c->opts.max_rows) {
        int n = rows - r0 < m->c->opts.max_rows ? rows - r0 : m->c->opts.max_rows;
        m->c->ex->be->rmsnorm(m->c->ex, hidden + (size_t)r0 * m->d, n, m->d, m->final_norm, m->eps, m->xn);
        sq_linear_forward(m->c->ex, &m->c->head, m->xn, n, logits + (size_t)r0 * m->vocab);
    }
    return sq_exec_take_error(m->c->ex);
}

/* The head on the device into dlog, up to dlog_rows rows, left there (sq_model_head_sample). */
static sparq_status q3_head_dev(sq_model *mc, const float *hidden, int rows, float **out, int *n)
{
    q3 *m = mc->impl;
    RETURN_IF(!m->c->ex->be->device || !m->dlog, SPARQ_E_STATE, "head_dev: not a device exec");
    FORWARD_IF(check_mem(m, hidden, "head"));
    *n = rows < m->dlog_rows ? rows : m->dlog_rows;
    m->c->ex->be->rmsnorm(m->c->ex, hidden, *n, m->d, m->final_norm, m->eps, m->xn);
    sq_linear_forward(m->c->ex, &m->c->head, m->xn, *n, m->dlog);
    *out = m->dlog;
    return SPARQ_OK;
}

static sparq_status q3_forward(sq_model *mc, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                              float *logits)
{
    q3 *m = mc->impl;
    return sq_mdl_forward_chunked(mc, seq, tokens, n, mode, logits, m->x, m->pos, m->d);
}

static float *q3_hidden_buffer(sq_model *mc) { return ((q3 *)mc->impl)->x; }

static const sq_graph_ops q3_graph = {
    .load = q3_load,
    .free = q3_free,
    .embed = q3_embed,
    .forward_layer = q3_forward_layer,
    .forward_rows = q3_forward_rows,
    .head = q3_head,
    .head_dev = q3_head_dev,
    .forward = q3_forward,
    .decode_batch = q3_decode_batch,
    .hidden_buffer = q3_hidden_buffer,
};

const sq_arch_info sq_arch_qwen3moe = {
    .id = SQ_ARCH_QWEN3_MOE,
    .model_type = "qwen3_moe",
    .layer_prefix = "model.layers.",
    .embed_key = "model.embed_tokens",
    .head_key = "lm_head",
    .norm_key = "model.norm",
    .check = q3_check,
    .layer = q3_layer,
    .tensors = q3_tensors,
    .n_tensors = (int)(sizeof q3_tensors / sizeof q3_tensors[0]),
    .kv_bytes = q3_kv_bytes,
    .workspace_terms = q3_workspace_terms,
    .expert_split = true,
    .graph = &q3_graph,
};
