/* runtime/memplan.c — the memory plan (see memplan.h for every formula).
 *
 * Arithmetic saturates at UINT64_MAX instead of wrapping: a term that
 * overflows can never fit, and the verdict says so instead of lying. */
#include "runtime/memplan.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/arch.h"

uint64_t sq_memplan_pos(int64_t v) { return v > 0 ? (uint64_t)v : 0; }

uint64_t sq_memplan_sum(int n, const uint64_t *v)
{
    uint64_t r = 0;
    for (int i = 0; i < n; i++) r = sparq_sat_add_u64(r, v[i]);
    return r;
}

uint64_t sq_memplan_prod(int n, const uint64_t *v)
{
    uint64_t r = 1;
    for (int i = 0; i < n; i++) r = sparq_sat_mul_u64(r, v[i]);
    return r;
}

/* ---- parameters ---- */

uint64_t sq_kv_dtype_bytes(sq_kv_dtype dt) { return dt == SQ_KV_F16 ? 2 : 4; }

const char *sq_kv_dtype_name(sq_kv_dtype dt) { return dt == SQ_KV_F16 ? "f16" : "f32"; }

bool sq_kv_dtype_parse(const char *s, sq_kv_dtype *out)
{
    if (!strcmp(s, "f32") || !strcmp(s, "fp32")) *out = SQ_KV_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16")) *out = SQ_KV_F16;
    else return false;
    return true;
}

const char *sq_memplan_split_name(sq_memplan_split s) { return s == SQ_SPLIT_EXPERTS ? "experts" : "pipeline"; }

bool sq_memplan_split_parse(const char *s, sq_memplan_split *out)
{
    if (!strcmp(s, "pipeline")) *out = SQ_SPLIT_PIPELINE;
    else if (!strcmp(s, "experts")) *out = SQ_SPLIT_EXPERTS;
    else return false;
    return true;
}

void sq_memplan_params_default(sq_memplan_params *p)
{
    memset(p, 0, sizeof *p);
    p->ctx = 32768;
    p->users = 6;
    p->chunk = 512;
    p->logits_rows = 0;
    p->threads = 32;
    p->kv_dtype = SQ_KV_F32;
}

int64_t sq_memplan_rows(const sq_memplan_params *p)
{
    int64_t r = p->chunk > p->users ? p->chunk : p->users;
    return r > 0 ? r : 1;
}

/* ---- terms ---- */

uint64_t sq_memplan_kv_bytes_range(const sq_model_config *cfg, int64_t first, int64_t n_layers,
                                   const sq_memplan_params *p)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    return a && a->kv_bytes ? a->kv_bytes(cfg, first, n_layers, p) : UINT64_MAX;
}

uint64_t sq_memplan_kv_bytes(const sq_model_config *cfg, int64_t n_layers, const sq_memplan_params *p)
{
    return sq_memplan_kv_bytes_range(cfg, 0, n_layers, p);
}

void sq_memplan_workspace_terms(const sq_model_config *cfg, const sq_memplan_params *p, bool has_head,
                                sq_memplan_workspace *out)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    if (a && a->workspace_terms) {
        a->workspace_terms(cfg, p, has_head, out);
        return;
    }
    memset(out, 0, sizeof *out);
    out->total = UINT64_MAX; /* an architecture sparq cannot run never fits */
}

uint64_t sq_memplan_workspace_bytes(const sq_model_config *cfg, const sq_memplan_params *p, bool has_head)
{
    sq_memplan_workspace w;
    sq_memplan_workspace_terms(cfg, p, has_head, &w);
    return w.total;
}

static uint64_t up256(uint64_t b) { return sparq_sat_add_u64(b, 255) & ~(uint64_t)255; }

uint64_t sq_memplan_cuda_prefill_bytes(uint64_t max_kn, uint64_t max_k, uint64_t max_n)
{
    if (max_kn == 0) return 0;
    const uint64_t t[] = {up256(sparq_sat_mul_u64(2, max_kn)), up256(sparq_sat_mul_u64(256, max_k)),
                          up256(sparq_sat_mul_u64(512, max_n)), (uint64_t)32 << 20};
    return sq_memplan_sum(4, t);
}

uint64_t sq_memplan_comm_bytes(const sq_model_config *cfg, const sq_memplan_params *p, int boxes)
{
    if (boxes <= 1) return 0;
    if (p->split == SQ_SPLIT_EXPERTS) {
        const uint64_t rows = sq_memplan_pos(sq_memplan_rows(p));
        const uint64_t t[] = {sq_memplan_prod(4, (const uint64_t[]){(uint64_t)boxes, rows,
                                                                    sq_memplan_pos(sq_arch_hidden_width(cfg)), 4}),
                              sparq_sat_mul_u64(rows, 12), 64, SQ_MEMPLAN_COMM_FIXED};
        return sq_memplan_sum(4, t);
    }
    /* a row is what the stages exchange: hidden_width floats (V4.1: 4 streams + mix + id) */
    uint64_t bufs = sq_memplan_prod(5, (const uint64_t[]){2, 2, sq_memplan_pos(sq_memplan_rows(p)),
                                                         sq_memplan_pos(sq_arch_hidden_width(cfg)), 4});
    return sparq_sat_add_u64(bufs, SQ_MEMPLAN_COMM_FIXED);
}

void sq_memplan_traffic_per_token(const sq_model_config *cfg, int boxes, sq_memplan_split split,
                                  sq_memplan_traffic *out)
{
    memset(out, 0, sizeof *out);
    if (boxes <= 1) return;
    const uint64_t N = (uint64_t)boxes, W = sq_memplan_pos(sq_arch_hidden_width(cfg)) * 4;
    if (split == SQ_SPLIT_PIPELINE) {
        const uint64_t V = sq_memplan_pos(cfg->vocab_size) * 4;
        out->bytes = (N - 1) * W + V;
        out->bytes_max_node = W > V ? W : V; /* a middle node sends W, the last V */
        out->messages = N;
        return;
    }
    int64_t M = 0;
    for (int64_t l = 0; l < cfg->num_hidden_layers; l++) M += sq_config_is_moe_layer(cfg, l);
    out->collectives = M;
    out->bytes = (N - 1) * 12 + (uint64_t)M * N * (N - 1) * W;
    out->bytes_max_node = (N - 1) * (12 + (uint64_t)M * W);
    out->messages = (N - 1) * (1 + (uint64_t)M * N);
}

/* ---- budget ---- */

void sq_memplan_budget_default(sq_memplan_budget *b)
{
    memset(b, 0, sizeof *b);
    const uint64_t G = (uint64_t)1 << 30;
    b->mem_per_box = 128 * G;
    b->reserve_os = 6 * G;
    b->display_reserve = 2 * G;
    b->unlock_display = 7 * G / 4; /* 1.75 GiB */
    b->gpu_util = 0.92;
    b->margin = (uint64_t)512 << 20;
    b->engram_cache = 2 * G;
}

sparq_status sq_memplan_usable(const sq_memplan_budget *b, uint64_t *out)
{
    *out = 0;
    RETURN_IF(!(b->gpu_util > 0 && b->gpu_util <= 1), SPARQ_E_ARG, "gpu-util %g is not in (0, 1]", b->gpu_util);
    RETURN_IF(b->unlock_display > b->display_reserve, SPARQ_E_ARG,
              "unlock-display (%llu bytes) is larger than display-reserve (%llu bytes)",
              (unsigned long long)b->unlock_display, (unsigned long long)b->display_reserve);
    uint64_t reserved = sparq_sat_add_u64(b->reserve_os, b->display_reserve);
    RETURN_IF(reserved > b->mem_per_box, SPARQ_E_ARG,
              "reserve-os + display-reserve (%llu bytes) exceed mem-per-box (%llu bytes)",
              (unsigned long long)reserved, (unsigned long long)b->mem_per_box);
    uint64_t avail = b->mem_per_box - reserved + b->unlock_display;
    /* exact for gpu_util == 1; long double keeps 64-bit integers exact */
    long double u = (long double)avail * (long double)b->gpu_util;
    *out = b->gpu_util >= 1.0 ? avail : (uint64_t)floorl(u);
    return SPARQ_OK;
}

/* ---- classification ---- */

/* Parse "<prefix><digits>." at s; returns the char after the dot or NULL. */
static const char *parse_layer(const char *s, const char *prefix, int64_t *layer)
{
    size_t n = strlen(prefix);
    if (strncmp(s, prefix, n)) return NULL;
    s += n;
    if (!isdigit((unsigned char)*s)) return NULL;
    int64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        if (v > 100000000) return NULL;
        v = v * 10 + (*s++ - '0');
    }
    if (*s != '.') return NULL;
    *layer = v;
    return s + 1;
}

sq_tensor_class sq_memplan_classify(const char *name, int64_t *layer, bool *is_expert)
{
    int64_t l = -1;
    bool ex = false;
    sq_tensor_class c = SQ_TENSOR_OTHER;
    const char *rest = parse_layer(name, "model.layers.", &l);
    if (!rest) rest = parse_layer(name, "layers.", &l);
    if (rest) {
        c = !strncmp(rest, "engram.embed.", 13) ? SQ_TENSOR_ENGRAM_TABLE : SQ_TENSOR_LAYER;
        ex = strstr(rest, "experts.") != NULL && strstr(rest, "shared_experts.") == NULL;
    } else if (!strncmp(name, "model.embed_tokens.", 19) || !strncmp(name, "embed.", 6)) {
        c = SQ_TENSOR_EMBED;
    } else if (!strncmp(name, "lm_head.", 8) || !strncmp(name, "head.", 5)) {
        c = SQ_TENSOR_HEAD;
    } else if (!strncmp(name, "model.norm.", 11) || !strncmp(name, "norm.", 5)) {
        c = SQ_TENSOR_FINAL_NORM;
    } else if (!strncmp(name, "mtp.", 4)) {
        c = SQ_TENSOR_LAST_OTHER;
    }
    if (layer) *layer = (c == SQ_TENSOR_LAYER || c == SQ_TENSOR_ENGRAM_TABLE) ? l : -1;
    if (is_expert) *is_expert = ex;
    return c;
}

int64_t sq_memplan_expert_of(const char *name)
{
    int64_t l;
    bool ex;
    if (sq_memplan_classify(name, &l, &ex) != SQ_TENSOR_LAYER || !ex) return -1;
    const char *p = strstr(name, "experts.");
    while (p && p > name && p[-1] != '.') p = strstr(p + 1, "experts."); /* "shared_experts." is no expert */
    if (!p || !isdigit((unsigned char)p[8])) return -1;
    int64_t e = 0;
    for (p += 8; isdigit((unsigned char)*p) && e < 100000000; p++) e = e * 10 + (*p - '0');
    return *p == '.' ? e : -1;
}

/* ---- plan ---- */

typedef struct model_sums {
    int64_t L;
    uint64_t *layer_bytes;   /* [L] */
    double *layer_work;      /* [L] bytes read per decoded token */
    uint64_t *layer_engram;  /* [L] bytes of the layer's Engram tables */
    uint64_t embed, head, norm, last_other, other, engram_tables;
    bool has_lm_head;
} model_sums;

static void sums_free(model_sums *s)
{
    sparq_free(s->layer_bytes);
    sparq_free(s->layer_work);
    sparq_free(s->layer_engram);
    memset(s, 0, sizeof *s);
}

static sparq_status sums_build(model_sums *s, const sq_model_config *cfg, const sq_memplan_tensor *t, size_t n)
{
    memset(s, 0, sizeof *s);
    s->L = cfg->num_hidden_layers;
    RETURN_IF(s->L < 1, SPARQ_E_FORMAT, "model config has %lld layers", (long long)s->L);
    s->layer_bytes = sparq_calloc((size_t)s->L, sizeof *s->layer_bytes);
    s->layer_work = sparq_calloc((size_t)s->L, sizeof *s->layer_work);
    s->layer_engram = sparq_calloc((size_t)s->L, sizeof *s->layer_engram);
    if (!s->layer_bytes || !s->layer_work || !s->layer_engram) {
        sums_free(s);
        return sparq_err(SPARQ_E_NOMEM, "memory plan: out of memory");
    }
    const double frac = cfg->num_experts > 0 ? (double)cfg->num_experts_per_tok / (double)cfg->num_experts : 1.0;
    for (size_t i = 0; i < n; i++) {
        int64_t l;
        bool ex;
        sq_tensor_class c = sq_memplan_classify(t[i].name, &l, &ex);
        if ((c == SQ_TENSOR_LAYER || c == SQ_TENSOR_ENGRAM_TABLE) && l >= s->L) {
            sums_free(s);
            return sparq_err(SPARQ_E_FORMAT, "tensor '%s': layer %lld but the config has %lld layers", t[i].name,
                             (long long)l, (long long)cfg->num_hidden_layers);
        }
        switch (c) {
        case SQ_TENSOR_LAYER:
            s->layer_bytes[l] = sparq_sat_add_u64(s->layer_bytes[l], t[i].nbytes);
            s->layer_work[l] += (double)t[i].nbytes * (ex ? frac : 1.0);
            break;
        case SQ_TENSOR_ENGRAM_TABLE:
            s->layer_engram[l] = sparq_sat_add_u64(s->layer_engram[l], t[i].nbytes);
            s->engram_tables = sparq_sat_add_u64(s->engram_tables, t[i].nbytes);
            break;
        case SQ_TENSOR_EMBED: s->embed = sparq_sat_add_u64(s->embed, t[i].nbytes); break;
        case SQ_TENSOR_HEAD:
            s->head = sparq_sat_add_u64(s->head, t[i].nbytes);
            s->has_lm_head = true;
            break;
        case SQ_TENSOR_FINAL_NORM: s->norm = sparq_sat_add_u64(s->norm, t[i].nbytes); break;
        case SQ_TENSOR_LAST_OTHER: s->last_other = sparq_sat_add_u64(s->last_other, t[i].nbytes); break;
        case SQ_TENSOR_OTHER: s->other = sparq_sat_add_u64(s->other, t[i].nbytes); break;
        }
    }
    return SPARQ_OK;
}

/* Bytes the last node holds beyond its layers (head, norm, mtp, tied copy). */
static uint64_t last_extra(const model_sums *s, bool tied)
{
    uint64_t b = sparq_sat_add_u64(sparq_sat_add_u64(s->head, s->norm), s->last_other);
    return tied ? sparq_sat_add_u64(b, s->embed) : b;
}

/* Contiguous split minimising the largest node cost (DP, O(boxes * L^2)). */
static sparq_status split_layers(const model_sums *s, const sq_model_config *cfg, const sq_memplan_params *p,
                                 bool tied, int boxes, int64_t *first)
{
    const int64_t L = s->L;
    double *cost = sparq_calloc((size_t)L + 1, sizeof(double)); /* prefix sums */
    double *dp = sparq_calloc((size_t)(boxes + 1) * (size_t)(L + 1), sizeof(double));
    int64_t *cut = sparq_calloc((size_t)(boxes + 1) * (size_t)(L + 1), sizeof(int64_t));
    if (!cost || !dp || !cut) {
        sparq_free(cost);
        sparq_free(dp);
        sparq_free(cut);
        return sparq_err(SPARQ_E_NOMEM, "memory plan: out of memory");
    }
    /* a layer's own state: shipped copies belong to a node, not to a layer */
    const bool ship = p->ship_sources;
    sq_memplan_params own = *p;
    own.ship_sources = false;
    p = &own;
    double mem_total = (double)s->embed + (double)last_extra(s, tied) + (double)s->other;
    double work_total = (double)(tied ? s->embed : s->head);
    for (int64_t l = 0; l < L; l++) {
        mem_total += (double)s->layer_bytes[l] + (double)sq_memplan_kv_bytes_range(cfg, l, 1, p);
        work_total += s->layer_work[l];
    }
    if (mem_total <= 0) mem_total = 1;
    if (work_total <= 0) work_total = 1;
    for (int64_t l = 0; l < L; l++)
        cost[l + 1] = cost[l] + ((double)s->layer_bytes[l] + (double)sq_memplan_kv_bytes_range(cfg, l, 1, p)) /
                                    mem_total + s->layer_work[l] / work_total;
    const double extra0 = ((double)s->embed + (double)s->other) / mem_total;
    const double extra_last = (double)last_extra(s, tied) / mem_total + (double)(tied ? s->embed : s->head) / work_total;
#define DP(k, j) dp[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
#define CUT(k, j) cut[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    /* DP(k, j): best max cost placing layers [0, j) on nodes [0, k). */
    for (int k = 0; k <= boxes; k++)
        for (int64_t j = 0; j <= L; j++) DP(k, j) = INFINITY;
    DP(0, 0) = 0;
    for (int k = 1; k <= boxes; k++) {
        for (int64_t j = k; j <= L - (boxes - k); j++) {
            for (int64_t i = k - 1; i < j; i++) {
                if (DP(k - 1, i) == INFINITY) continue;
                /* layers past i read a source before it (unless its caches are shipped) */
                if (i > 0 && !ship && !sq_arch_split_ok(cfg, (int)i)) continue;
                double c = cost[j] - cost[i];
                if (k == 1) c += extra0;
                if (k == boxes) c += extra_last;
                double m = DP(k - 1, i) > c ? DP(k - 1, i) : c;
                /* strict '<' keeps the earliest cut: deterministic */
                if (m < DP(k, j)) {
                    DP(k, j) = m;
                    CUT(k, j) = i;
                }
            }
        }
    }
    if (DP(boxes, L) == INFINITY) {
        sparq_free(cost);
        sparq_free(dp);
        sparq_free(cut);
        return sparq_err(SPARQ_E_UNSUPPORTED, "memory plan: %s cannot be split into %d pipeline nodes: its layers "
                         "read caches of earlier layers (sq_arch_info.split_ok) at every other cut", cfg->model_type,
                         boxes);
    }
    int64_t j = L;
    for (int k = boxes; k >= 1; k--) {
        first[k - 1] = CUT(k, j);
        j = CUT(k, j);
    }
#undef DP
#undef CUT
    sparq_free(cost);
    sparq_free(dp);
    sparq_free(cut);
    return SPARQ_OK;
}

static void node_total(sq_memplan_node *nd, uint64_t usable)
{
    const uint64_t t = sq_memplan_sum(6, (const uint64_t[]){nd->weights, nd->kv, nd->workspace, nd->engram_cache, nd->comm,
                                                  nd->margin});
    nd->total = t;
    if (t >= usable) {
        uint64_t over = t - usable;
        nd->headroom = over > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)over;
    } else {
        uint64_t h = usable - t;
        nd->headroom = h > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)h;
    }
}

static const char *blame_of(const sq_memplan_node *nd)
{
    static const char *const names[] = {"weights", "kv", "workspace", "engram_cache", "comm", "margin"};
    const uint64_t v[] = {nd->weights, nd->kv, nd->workspace, nd->engram_cache, nd->comm, nd->margin};
    int best = 0;
    for (int i = 1; i < 6; i++)
        if (v[i] > v[best]) best = i;
    return names[best];
}

/* Every node's total and headroom, then the verdict: fits, the worst node, its largest term. */
static void plan_verdict(sq_memplan *plan)
{
    plan->fits = true;
    plan->worst_node = 0;
    for (int k = 0; k < plan->boxes; k++) {
        sq_memplan_node *nd = &plan->nodes[k];
        node_total(nd, plan->usable);
        if (nd->headroom < 0) plan->fits = false;
        if (nd->headroom < plan->nodes[plan->worst_node].headroom) plan->worst_node = k;
    }
    plan->blame = plan->fits ? "" : blame_of(&plan->nodes[plan->worst_node]);
}

/* What both splits start a plan with: the model's sums, the parameters and
 * the zeroed nodes. On failure nothing is left allocated. */
static sparq_status plan_begin(sq_memplan *plan, model_sums *s, const sq_model_config *cfg,
                               const sq_memplan_tensor *tensors, size_t n_tensors, int boxes,
                               const sq_memplan_params *p, const sq_memplan_budget *b, uint64_t usable)
{
    FORWARD_IF(sums_build(s, cfg, tensors, n_tensors));
    plan->boxes = boxes;
    plan->params = *p;
    plan->budget = *b;
    plan->usable = usable;
    plan->n_layers = s->L;
    plan->tied_head = !s->has_lm_head && cfg->tie_word_embeddings;
    plan->engram_table_bytes = s->engram_tables;
    plan->has_engram = s->engram_tables > 0;
    plan->nodes = sparq_calloc((size_t)boxes, sizeof *plan->nodes);
    if (!plan->nodes) {
        sums_free(s);
        return sparq_err(SPARQ_E_NOMEM, "memory plan: out of memory");
    }
    return SPARQ_OK;
}

/* The expert split (memplan.h): every node every layer, experts e mod boxes. */
static sparq_status build_experts(sq_memplan *plan, const sq_model_config *cfg, const sq_memplan_tensor *tensors,
                                  size_t n_tensors, int boxes, const sq_memplan_params *p,
                                  const sq_memplan_budget *b, uint64_t usable)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    RETURN_IF(!a, SPARQ_E_UNSUPPORTED, "architecture '%s' not supported", cfg->model_type);
    RETURN_IF(!a->expert_split, SPARQ_E_UNSUPPORTED,
              "%s cannot be split by experts yet: %s; use --split pipeline", cfg->model_type,
              a->expert_split_why ? a->expert_split_why : "its graph has no expert ownership");
    RETURN_IF(cfg->num_experts < 1, SPARQ_E_UNSUPPORTED,
              "--split experts: the model has no routed experts (num_experts %lld); use --split pipeline",
              (long long)cfg->num_experts);
    RETURN_IF(boxes > cfg->num_experts, SPARQ_E_ARG,
              "--split experts: %d boxes but the model has only %lld routed experts per layer (each node needs "
              "at least one)", boxes, (long long)cfg->num_experts);
    model_sums s;
    FORWARD_IF(plan_begin(plan, &s, cfg, tensors, n_tensors, boxes, p, b, usable));
    plan->n_experts = cfg->num_experts;
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < s.L; l++) moe_layers += sq_config_is_moe_layer(cfg, l);
    for (int k = 0; k < boxes; k++) {
        sq_memplan_node *nd = &plan->nodes[k];
        nd->node = k;
        nd->first_layer = 0;
        nd->n_layers = s.L;
        nd->has_embed = true;
        nd->has_head = k == 0;
        nd->experts = moe_layers * sq_memplan_experts_of_node(cfg->num_experts, boxes, k);
    }
    uint64_t wt = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        if (sq_memplan_classify(tensors[i].name, NULL, NULL) == SQ_TENSOR_ENGRAM_TABLE) continue;
        wt = sparq_sat_add_u64(wt, tensors[i].nbytes);
        for (int k = 0; k < boxes; k++)
            if (sq_memplan_tensor_on_node(plan, tensors[i].name, k))
                plan->nodes[k].weights = sparq_sat_add_u64(plan->nodes[k].weights, tensors[i].nbytes);
    }
    plan->weights_total = wt;
    for (int k = 0; k < boxes; k++) {
        sq_memplan_node *nd = &plan->nodes[k];
        nd->kv = sq_memplan_kv_bytes_range(cfg, 0, s.L, p);
        nd->workspace = sq_memplan_workspace_bytes(cfg, p, nd->has_head);
        nd->comm = sq_memplan_comm_bytes(cfg, p, boxes);
        nd->margin = b->margin;
    }
    plan_verdict(plan);
    sums_free(&s);
    return SPARQ_OK;
}

sparq_status sq_memplan_build(sq_memplan *plan, const sq_model_config *cfg, const sq_memplan_tensor *tensors,
                              size_t n_tensors, int boxes, const sq_memplan_params *p,
                              const sq_memplan_budget *b)
{
    memset(plan, 0, sizeof *plan);
    RETURN_IF(boxes < 1, SPARQ_E_ARG, "--boxes must be at least 1 (got %d)", boxes);
    RETURN_IF(p->ctx < 1 || p->users < 1 || p->chunk < 1, SPARQ_E_ARG,
              "ctx, users and chunk must be positive (got %lld, %lld, %lld)", (long long)p->ctx,
              (long long)p->users, (long long)p->chunk);
    uint64_t usable;
    FORWARD_IF(sq_memplan_usable(b, &usable));
    if (p->split == SQ_SPLIT_EXPERTS) return build_experts(plan, cfg, tensors, n_tensors, boxes, p, b, usable);
    RETURN_IF(boxes > cfg->num_hidden_layers, SPARQ_E_ARG,
              "%d boxes but the model has only %lld layers (each node needs at least one)", boxes,
              (long long)cfg->num_hidden_layers);
    model_sums s;
    FORWARD_IF(plan_begin(plan, &s, cfg, tensors, n_tensors, boxes, p, b, usable));
    int64_t *first = sparq_calloc((size_t)boxes, sizeof *first);
    if (!first) {
        sums_free(&s);
        sq_memplan_free(plan);
        return sparq_err(SPARQ_E_NOMEM, "memory plan: out of memory");
    }
    sparq_status st = split_layers(&s, cfg, p, plan->tied_head, boxes, first);
    if (st != SPARQ_OK) {
        sparq_free(first);
        sums_free(&s);
        sq_memplan_free(plan);
        return st;
    }
    uint64_t wt = sparq_sat_add_u64(sparq_sat_add_u64(s.embed, s.other), last_extra(&s, false));
    for (int64_t l = 0; l < s.L; l++) wt = sparq_sat_add_u64(wt, s.layer_bytes[l]);
    plan->weights_total = wt;
    for (int k = 0; k < boxes; k++) {
        sq_memplan_node *nd = &plan->nodes[k];
        nd->node = k;
        nd->first_layer = first[k];
        nd->n_layers = (k + 1 < boxes ? first[k + 1] : s.L) - first[k];
        nd->has_embed = k == 0;
        nd->has_head = k == boxes - 1;
        for (int64_t l = nd->first_layer; l < nd->first_layer + nd->n_layers; l++) {
            nd->weights = sparq_sat_add_u64(nd->weights, s.layer_bytes[l]);
            if (s.layer_engram[l]) nd->has_engram = true;
            nd->engram_ssd = sparq_sat_add_u64(nd->engram_ssd, s.layer_engram[l]);
            if (sq_config_is_moe_layer(cfg, l)) nd->experts += cfg->num_experts;
        }
        if (nd->has_embed) nd->weights = sparq_sat_add_u64(nd->weights, sparq_sat_add_u64(s.embed, s.other));
        if (nd->has_head) nd->weights = sparq_sat_add_u64(nd->weights, last_extra(&s, plan->tied_head));
        nd->kv = sq_memplan_kv_bytes_range(cfg, nd->first_layer, nd->n_layers, p);
        nd->workspace = sq_memplan_workspace_bytes(cfg, p, nd->has_head);
        nd->engram_cache = nd->has_engram ? b->engram_cache : 0;
        nd->comm = sq_memplan_comm_bytes(cfg, p, boxes);
        nd->margin = b->margin;
    }
    plan_verdict(plan);
    sparq_free(first);
    sums_free(&s);
    return SPARQ_OK;
}

void sq_memplan_free(sq_memplan *plan)
{
    if (!plan) return;
    sparq_free(plan->nodes);
    memset(plan, 0, sizeof *plan);
}

int sq_memplan_tensor_node(const sq_memplan *plan, const char *name, int *also)
{
    int64_t l;
    bool ex;
    const int last = plan->boxes - 1;
    if (also) *also = -1;
    const sq_tensor_class c = sq_memplan_classify(name, &l, &ex);
    if (plan->params.split == SQ_SPLIT_EXPERTS) {
        const int64_t e = sq_memplan_expert_of(name);
        if (c == SQ_TENSOR_ENGRAM_TABLE) return -1;
        if (e >= 0) return sq_memplan_expert_owner(e, plan->boxes);
        if (c == SQ_TENSOR_HEAD || c == SQ_TENSOR_FINAL_NORM || c == SQ_TENSOR_LAST_OTHER) return 0;
        if (also && plan->boxes > 1) *also = SQ_MEMPLAN_EVERY_NODE;
        return 0;
    }
    switch (c) {
    case SQ_TENSOR_LAYER:
        for (int k = 0; k < plan->boxes; k++)
            if (l >= plan->nodes[k].first_layer && l < plan->nodes[k].first_layer + plan->nodes[k].n_layers)
                return k;
        return -1;
    case SQ_TENSOR_EMBED:
        if (plan->tied_head && also && last != 0) *also = last;
        return 0;
    case SQ_TENSOR_HEAD:
    case SQ_TENSOR_FINAL_NORM:
    case SQ_TENSOR_LAST_OTHER: return last;
    case SQ_TENSOR_ENGRAM_TABLE: return -1;
    case SQ_TENSOR_OTHER: return 0;
    }
    return -1;
}

bool sq_memplan_tensor_on_node(const sq_memplan *plan, const char *name, int k)
{
    int also;
    const int n = sq_memplan_tensor_node(plan, name, &also);
    return n == k || also == k || (also == SQ_MEMPLAN_EVERY_NODE && k >= 0 && k < plan->boxes);
}

sparq_status sq_memplan_suggest(const sq_memplan *plan, const sq_model_config *cfg,
                                const sq_memplan_tensor *tensors, size_t n_tensors, int *min_boxes,
                                int64_t *max_ctx)
{
    *min_boxes = 0;
    *max_ctx = 0;
    sq_memplan t;
    const int64_t most = plan->params.split == SQ_SPLIT_EXPERTS ? cfg->num_experts : plan->n_layers;
    for (int nb = plan->boxes + 1; nb <= most && nb <= 1024; nb++) {
        sparq_status st = sq_memplan_build(&t, cfg, tensors, n_tensors, nb, &plan->params, &plan->budget);
        if (st == SPARQ_E_UNSUPPORTED) { /* no split into nb nodes respects the architecture's cuts */
            sparq_err_clear();
            continue;
        }
        FORWARD_IF(st);
        bool ok = t.fits;
        sq_memplan_free(&t);
        if (ok) {
            *min_boxes = nb;
            break;
        }
    }
    /* largest ctx in [1, ctx] that fits: every term grows with ctx (monotone) */
    int64_t lo = 0, hi = plan->params.ctx;
    sq_memplan_params pp = plan->params;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        pp.ctx = mid;
        FORWARD_IF(sq_memplan_build(&t, cfg, tensors, n_tensors, plan->boxes, &pp, &plan->budget));
        bool ok = t.fits;
        sq_memplan_free(&t);
        if (ok) lo = mid;
        else hi = mid - 1;
    }
    *max_ctx = lo;
    return SPARQ_OK;
}
