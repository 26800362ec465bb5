/* runtime/models/registry.c — the table of architectures (runtime/arch.h) and
 * the walks over their descriptions that the rest of the chain uses: slot
 * lookup, tensor keys from "{L}" / "{E}" patterns, and whether a tensor key
 * names a linear the quantizer converts. A new architecture is one row of
 * `archs` and one file beside this one. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/weights.h"
#include "runtime/models/model_impl.h"

static const sq_arch_info *const archs[] = {&sq_arch_qwen3moe, &sq_arch_deepseek_v41};

const char *sq_lin_role_name(sq_lin_role r)
{
    static const char *const n[SQ_ROLE_COUNT_] = {"attn", "router", "expert", "shared", "mlp", "engram"};
    return (unsigned)r < SQ_ROLE_COUNT_ ? n[r] : "?";
}

const sq_arch_info *sq_arch_of(const sq_model_config *cfg)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (archs[i]->id == cfg->arch) return archs[i];
    return NULL;
}

sparq_status sq_arch_layer(const sq_model_config *cfg, int layer, sq_layer_desc *out)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    RETURN_IF(!a, SPARQ_E_UNSUPPORTED, "architecture '%s' not supported", cfg->model_type);
    RETURN_IF(layer < 0 || layer >= cfg->num_hidden_layers, SPARQ_E_RANGE, "layer %d outside [0, %lld)", layer,
              (long long)cfg->num_hidden_layers);
    return a->layer(cfg, layer, out);
}

int sq_layer_find(const sq_layer_desc *d, const char *name)
{
    for (int s = 0; s < d->n_slots; s++)
        if (strcmp(d->slot[s].name, name) == 0) return s;
    return -1;
}

sparq_status sq_lin_key(const sq_lin_desc *lin, int layer, int inst, char *buf, size_t n)
{
    size_t o = 0;
    for (const char *p = lin->key; *p; p++) {
        char num[24];
        const char *put = NULL;
        size_t len = 1;
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}') {
            snprintf(num, sizeof num, "%d", p[1] == 'L' ? layer : inst);
            put = num;
            len = strlen(num);
            p += 2;
        } else {
            put = p;
        }
        RETURN_IF(o + len >= n, SPARQ_E_RANGE, "tensor key of '%s' (layer %d) longer than %zu bytes", lin->name, layer,
                  n);
        memcpy(buf + o, put, len);
        o += len;
    }
    buf[o] = 0;
    return SPARQ_OK;
}

/* Does key match pattern, "{L}" and "{E}" standing for decimal numbers?
 * *layer / *inst get them (-1 if absent). */
static bool key_match(const char *pat, const char *key, long *layer, long *inst)
{
    *layer = *inst = -1;
    while (*pat) {
        if (pat[0] == '{' && (pat[1] == 'L' || pat[1] == 'E') && pat[2] == '}') {
            if (!isdigit((unsigned char)*key)) return false;
            long v = 0;
            while (isdigit((unsigned char)*key) && v < 100000000) v = v * 10 + (*key++ - '0');
            *(pat[1] == 'L' ? layer : inst) = v;
            pat += 3;
        } else if (*pat++ != *key++) {
            return false;
        }
    }
    return *key == 0;
}

bool sq_arch_is_quant_linear(const sq_model_config *cfg, const char *key, int *layer)
{
    return sq_arch_quant_linear_role(cfg, key, layer, NULL);
}

bool sq_arch_quant_linear_role(const sq_model_config *cfg, const char *key, int *layer, sq_lin_role *role)
{
    if (layer) *layer = -1;
    const sq_arch_info *a = sq_arch_of(cfg);
    const size_t np = a ? strlen(a->layer_prefix) : 0;
    if (!a || strncmp(key, a->layer_prefix, np) != 0 || !isdigit((unsigned char)key[np])) return false;
    long L = 0;
    for (const char *p = key + np; isdigit((unsigned char)*p) && L < 100000000; p++) L = L * 10 + (*p - '0');
    sq_layer_desc d;
    if (L >= cfg->num_hidden_layers || sq_arch_layer(cfg, (int)L, &d) != SPARQ_OK) return false;
    for (int s = 0; s < d.n_slots; s++) {
        long kl, ki;
        if (!d.slot[s].quantize || !key_match(d.slot[s].key, key, &kl, &ki)) continue;
        if (kl != L || ki >= d.slot[s].instances) continue;
        if (layer) *layer = (int)L;
        if (role) *role = d.slot[s].role;
        return true;
    }
    return false;
}

/* --- config against tensors (sq_arch_check_tensors) ----------------------------- */

int64_t sq_dim_size(const sq_model_config *cfg, sq_dim dim)
{
    switch (dim) {
    case SQ_DIM_HIDDEN: return cfg->hidden_size;
    case SQ_DIM_HEAD_DIM: return cfg->head_dim;
    case SQ_DIM_VOCAB: return cfg->vocab_size;
    case SQ_DIM_NONE: break;
    }
    return 0;
}

const char *sq_arch_skipped(const sq_model_config *cfg, const char *name)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    if (!a || !a->skipped_prefixes) return NULL;
    for (const char *const *p = a->skipped_prefixes; *p; p++)
        if (!strncmp(name, *p, strlen(*p))) return *p;
    return NULL;
}

bool sq_arch_split_ok(const sq_model_config *cfg, int layer)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    return !a || !a->split_ok || a->split_ok(cfg, layer);
}

int64_t sq_arch_hidden_width(const sq_model_config *cfg)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    return a && a->hidden_width ? a->hidden_width(cfg) : cfg->hidden_size;
}

void sq_arch_problems_free(sq_arch_problems *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n_lines; i++) sparq_free(p->line[i]);
    sparq_free(p->line);
    memset(p, 0, sizeof *p);
}

typedef struct tcheck {
    const sq_model_config *cfg;
    const sq_arch_info *a;
    const sf_model *sf;
    bool *used;           /* [sf_count]: read by what the scope describes */
    sq_arch_problems *p;
    sparq_status first;   /* status of the first problem */
    bool nomem;
    bool no_engram;       /* the Engram tables are not expected (a bundle node) */
    int own_n, own_k;     /* the expert split: the routed experts expected (sq_arch_holds_instance) */
} tcheck;

static void problem(tcheck *c, sparq_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem(tcheck *c, sparq_status st, const char *fmt, ...)
{
    if (c->p->n++ == 0) c->first = st;
    if (c->p->n_lines >= SQ_ARCH_PROBLEMS_KEPT || c->nomem) return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **nl = sparq_realloc(c->p->line, (c->p->n_lines + 1) * sizeof *nl);
    char *s = nl ? sparq_strdup(buf) : NULL;
    if (nl) c->p->line = nl;
    if (!s) {
        c->nomem = true;
        return;
    }
    c->p->line[c->p->n_lines++] = s;
}

static const sf_tensor *use(tcheck *c, const char *name)
{
    const sf_tensor *t = sf_find(c->sf, name);
    if (t) c->used[t - sf_at(c->sf, 0)] = true;
    return t;
}

static const sf_tensor *use2(tcheck *c, const char *key, const char *suffix)
{
    char name[600];
    snprintf(name, sizeof name, "%s%s", key, suffix);
    return use(c, name);
}

static void shape_text(char *buf, size_t cap, int ndim, const uint64_t *shape)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %llu" : "%llu", (unsigned long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* The linear `key` of shape [out, in] in any stored form; `what` says whose it is. */
static void check_linear(tcheck *c, const char *key, int64_t out, int64_t in, const char *what)
{
    const sf_model *sf = c->sf;
    char name[600];
    snprintf(name, sizeof name, "%s.weight", key);
    const sf_tensor *tr = sf_find(sf, name) ? NULL : use2(c, key, ".trellis");
    if (tr) { /* EXL3 (reference.md §1.4) */
        const sf_tensor *su = use2(c, key, ".suh"), *sv = use2(c, key, ".svh");
        use2(c, key, ".mul1");
        use2(c, key, ".mcg");
        const bool ok = tr->dtype == SF_I16 && tr->ndim == 3 && tr->shape[2] % 16 == 0 && tr->shape[2] >= 16 &&
                        tr->shape[2] <= 16 * 8 && su && sv && su->ndim == 1 && sv->ndim == 1 &&
                        su->dtype == SF_F16 && sv->dtype == SF_F16;
        if (!ok) {
            problem(c, SPARQ_E_SHAPE,
                    "%s: EXL3 linear '%s' (%s): expected '%s.trellis' I16 [in/16, out/16, 16*K], '.suh' F16 [in], "
                    "'.svh' F16 [out]", sf_file_path(sf, tr->file), key, what, key);
        } else if ((int64_t)su->shape[0] != in || (int64_t)sv->shape[0] != out ||
                   (int64_t)tr->shape[0] * 16 != in || (int64_t)tr->shape[1] * 16 != out) {
            problem(c, SPARQ_E_SHAPE, "%s: EXL3 linear '%s' (%s) is %llu -> %llu, expected %lld -> %lld",
                    sf_file_path(sf, tr->file), key, what, (unsigned long long)su->shape[0],
                    (unsigned long long)sv->shape[0], (long long)in, (long long)out);
        }
        const sf_tensor *b = use2(c, key, ".bias");
        if (b && (b->ndim != 1 || (int64_t)b->shape[0] != out))
            problem(c, SPARQ_E_SHAPE, "%s: tensor '%s.bias': expected [%lld]", sf_file_path(sf, b->file), key,
                    (long long)out);
        return;
    }
    sf_weight w; /* an FP8 scale block as the bind takes it: the config's, else inferred */
    const sq_quant_config *q = &c->cfg->quant;
    sparq_status st = sf_weight_find_block(sf, key, q->weight_block_size[0], q->weight_block_size[1], &w);
    if (st == SPARQ_E_NOTFOUND && !sf_find(sf, name)) {
        sparq_err_clear();
        problem(c, st, "%s: tensor '%s.weight' (%s, [%lld, %lld]) not found", sf_file_path(sf, 0), key, what,
                (long long)out, (long long)in);
        return;
    }
    use(c, name);
    if (st != SPARQ_OK) {
        problem(c, st, "%s", sparq_errmsg());
        sparq_err_clear();
        return;
    }
    use(c, w.w->name);
    if (w.scale) use(c, w.scale->name);
    if ((int64_t)w.out != out || (int64_t)w.in != in)
        problem(c, SPARQ_E_SHAPE, "%s: tensor '%s' (%s): shape [%llu, %llu], expected [%lld, %lld]",
                sf_file_path(sf, w.w->file), w.w->name, what, (unsigned long long)w.out, (unsigned long long)w.in,
                (long long)out, (long long)in);
    const sf_tensor *b = use2(c, key, ".bias");
    if (b && (b->ndim != 1 || (int64_t)b->shape[0] != out))
        problem(c, SPARQ_E_SHAPE, "%s: tensor '%s.bias': expected [%lld]", sf_file_path(sf, b->file), key,
                (long long)out);
}

/* One of the architecture's other tensors (layer L, or -1). Returns whether it is present. */
static bool check_desc(tcheck *c, const sq_tensor_desc *td, int L, bool optional)
{
    char key[512], what[64];
    sq_lin_desc pat = {.name = td->key, .key = td->key};
    if (sq_lin_key(&pat, L, 0, key, sizeof key) != SPARQ_OK) {
        sparq_err_clear();
        problem(c, SPARQ_E_RANGE, "tensor name '%s' too long", td->key);
        return false;
    }
    const int64_t d0 = sq_dim_size(c->cfg, td->dim[0]), d1 = td->ndim > 1 ? sq_dim_size(c->cfg, td->dim[1]) : 0;
    if (L >= 0) snprintf(what, sizeof what, "layer %d", L);
    else snprintf(what, sizeof what, "%s", td->place == SQ_PLACE_EMBED ? "the embeddings" : "the head");
    if (td->linear) {
        char name[600];
        snprintf(name, sizeof name, "%s.weight", key);
        const bool present = sf_find(c->sf, name) || use2(c, key, ".trellis") || use2(c, key, "_blocks");
        if (present || !optional) check_linear(c, key, d0, d1, what);
        return present;
    }
    const sf_tensor *t = use(c, key);
    if (!t) {
        if (!optional) {
            char sh[64];
            const uint64_t s[2] = {(uint64_t)d0, (uint64_t)d1};
            shape_text(sh, sizeof sh, td->ndim, s);
            problem(c, SPARQ_E_NOTFOUND, "%s: tensor '%s' (%s, %s) not found", sf_file_path(c->sf, 0), key, what,
                    sh);
        }
        return false;
    }
    if (t->ndim != td->ndim || (int64_t)t->shape[0] != d0 || (td->ndim > 1 && (int64_t)t->shape[1] != d1)) {
        char got[160], want[64];
        const uint64_t s[2] = {(uint64_t)d0, (uint64_t)d1};
        shape_text(got, sizeof got, t->ndim, t->shape);
        shape_text(want, sizeof want, td->ndim, s);
        problem(c, SPARQ_E_SHAPE, "%s: tensor '%s' (%s): shape %s, expected %s", sf_file_path(c->sf, t->file), key,
                what, got, want);
    }
    return true;
}

/* The layer a tensor name belongs to (prefix + digits + '.'), or -1. */
static long name_layer(const sq_arch_info *a, const char *name)
{
    const size_t np = strlen(a->layer_prefix);
    if (strncmp(name, a->layer_prefix, np) != 0 || !isdigit((unsigned char)name[np])) return -1;
    long L = 0;
    const char *p = name + np;
    while (isdigit((unsigned char)*p) && L < 100000000) L = L * 10 + (*p++ - '0');
    return *p == '.' ? L : -1;
}

static void check_layer(tcheck *c, int L)
{
    sq_layer_desc d;
    sparq_status st = c->a->layer(c->cfg, L, &d);
    if (st != SPARQ_OK) {
        problem(c, st, "layer %d: %s", L, sparq_errmsg());
        sparq_err_clear();
        return;
    }
    char key[256], what[128];
    for (int s = 0; s < d.n_slots; s++)
        for (int e = 0; e < d.slot[s].instances; e++) {
            if (!sq_arch_holds_instance(&d.slot[s], e, c->own_n, c->own_k)) continue; /* another node's expert */
            if (sq_lin_key(&d.slot[s], L, e, key, sizeof key) != SPARQ_OK) {
                problem(c, SPARQ_E_RANGE, "layer %d: %s", L, sparq_errmsg());
                sparq_err_clear();
                continue;
            }
            if (d.slot[s].instances > 1) snprintf(what, sizeof what, "layer %d %s %d", L, d.slot[s].name, e);
            else snprintf(what, sizeof what, "layer %d %s", L, d.slot[s].name);
            check_linear(c, key, d.slot[s].out, d.slot[s].in, what);
        }
    for (int i = 0; i < c->a->n_tensors; i++)
        if (c->a->tensors[i].place == SQ_PLACE_LAYER) check_desc(c, &c->a->tensors[i], L, false);
    if (!c->a->layer_tensors) return;
    sq_tensor_shape ts[SQ_LAYER_MAX_TENSORS];
    const int n = c->a->layer_tensors(c->cfg, L, ts);
    for (int i = 0; i < n; i++) {
        if (c->no_engram && sq_memplan_classify(ts[i].key, NULL, NULL) == SQ_TENSOR_ENGRAM_TABLE) continue;
        const sf_tensor *t = use(c, ts[i].key);
        char want[64];
        shape_text(want, sizeof want, ts[i].ndim, ts[i].shape);
        if (!t) {
            problem(c, SPARQ_E_NOTFOUND, "%s: tensor '%s' (layer %d, %s) not found", sf_file_path(c->sf, 0),
                    ts[i].key, L, want);
        } else if (t->ndim != ts[i].ndim || t->shape[0] != ts[i].shape[0] ||
                   (ts[i].ndim > 1 && t->shape[1] != ts[i].shape[1])) {
            char got[160];
            shape_text(got, sizeof got, t->ndim, t->shape);
            problem(c, SPARQ_E_SHAPE, "%s: tensor '%s' (layer %d): shape %s, expected %s",
                    sf_file_path(c->sf, t->file), ts[i].key, L, got, want);
        }
    }
}

sparq_status sq_arch_check_tensors(const sq_model_config *cfg, const sf_model *sf, const sq_arch_scope *scope,
                                   const char *where, sq_arch_problems *report)
{
    sq_arch_problems local = {0};
    sq_arch_problems *p = report ? report : &local;
    memset(p, 0, sizeof *p);
    const sq_arch_info *a = sq_arch_of(cfg);
    RETURN_IF(!a, SPARQ_E_UNSUPPORTED, "%s: architecture '%s' not supported", where, cfg->model_type);
    if (a->check) FORWARD_IF(a->check(cfg, where));
    const int n_layers = (int)cfg->num_hidden_layers;
    const sq_arch_scope all = {0, n_layers, true, true};
    const sq_arch_scope *sc = scope ? scope : &all;
    RETURN_IF(sc->first < 0 || sc->end > n_layers || sc->first > sc->end, SPARQ_E_RANGE,
              "%s: layers [%d, %d) outside the model's %d", where, sc->first, sc->end, n_layers);
    const size_t n = sf_count(sf);
    tcheck c = {.cfg = cfg, .a = a, .sf = sf, .p = p, .first = SPARQ_OK, .no_engram = sc->no_engram,
                .own_n = sc->own_n, .own_k = sc->own_k};
    c.used = sparq_calloc(n ? n : 1, sizeof *c.used);
    int *count = sparq_calloc((size_t)(sc->end - sc->first) + 1, sizeof *count); /* tensors per layer in scope */
    if (!c.used || !count) {
        sparq_free(c.used);
        sparq_free(count);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", where);
    }
    /* the layer count first: layers in scope without tensors, tensors beyond the count */
    long beyond_lo = -1, beyond_hi = -1;
    const char *beyond_name = NULL;
    for (size_t i = 0; i < n; i++) {
        const sf_tensor *t = sf_at(sf, i);
        const long L = name_layer(a, t->name);
        if (L < 0) continue;
        if (L >= sc->first && L < sc->end) count[L - sc->first]++;
        if (L >= n_layers && sq_memplan_classify(t->name, NULL, NULL) != SQ_TENSOR_ENGRAM_TABLE) {
            if (beyond_lo < 0 || L < beyond_lo) beyond_lo = L, beyond_name = t->name;
            if (L > beyond_hi) beyond_hi = L;
        }
    }
    for (int L = sc->first; L < sc->end;) {
        if (count[L - sc->first]) {
            L++;
            continue;
        }
        int e = L;
        while (e + 1 < sc->end && !count[e + 1 - sc->first]) e++;
        if (e > L)
            problem(&c, SPARQ_E_NOTFOUND, "%s: layers %d..%d have no tensors (config.json: num_hidden_layers %d)",
                    sf_file_path(sf, 0), L, e, n_layers);
        else
            problem(&c, SPARQ_E_NOTFOUND, "%s: layer %d has no tensors (config.json: num_hidden_layers %d)",
                    sf_file_path(sf, 0), L, n_layers);
        L = e + 1;
    }
    if (beyond_lo >= 0) {
        char layers[64];
        if (beyond_hi > beyond_lo) snprintf(layers, sizeof layers, "layers %ld..%ld", beyond_lo, beyond_hi);
        else snprintf(layers, sizeof layers, "layer %ld", beyond_lo);
        problem(&c, SPARQ_E_FORMAT, "%s: the tensors of %s ('%s', ...) are left unused: config.json says "
                "num_hidden_layers %d", sf_file_path(sf, 0), layers, beyond_name, n_layers);
    }
    for (int L = sc->first; L < sc->end; L++)
        if (count[L - sc->first]) check_layer(&c, L);
    /* the embeddings and the head; a tied head reads the embedding */
    bool need_embed = sc->embed, tied_absent = false;
    for (int i = 0; i < a->n_tensors; i++) {
        const sq_tensor_desc *td = &a->tensors[i];
        if (td->place != SQ_PLACE_HEAD || !sc->head) continue;
        const bool optional = td->tied && cfg->tie_word_embeddings;
        if (!check_desc(&c, td, -1, optional) && optional) tied_absent = true;
    }
    if (tied_absent) need_embed = true;
    for (int i = 0; i < a->n_tensors && need_embed; i++)
        if (a->tensors[i].place == SQ_PLACE_EMBED) check_desc(&c, &a->tensors[i], -1, false);
    /* anything else is left unused */
    for (size_t i = 0; i < n; i++) {
        if (c.used[i]) continue;
        const sf_tensor *t = sf_at(sf, i);
        const long L = name_layer(a, t->name);
        if (sq_memplan_classify(t->name, NULL, NULL) == SQ_TENSOR_ENGRAM_TABLE) continue;
        if (sq_arch_skipped(cfg, t->name)) continue; /* MTP, vision: shipped, not read */
        if (L >= n_layers) continue; /* said above, once */
        if (L >= 0 && (L < sc->first || L >= sc->end))
            problem(&c, SPARQ_E_FORMAT, "%s: tensor '%s' of layer %ld, which is not among the layers %d..%d read "
                    "here: left unused", sf_file_path(sf, t->file), t->name, L, sc->first, sc->end - 1);
        else
            problem(&c, SPARQ_E_FORMAT, "%s: tensor '%s' is not one the architecture %s reads: left unused",
                    sf_file_path(sf, t->file), t->name, a->model_type);
    }
    sparq_free(c.used);
    sparq_free(count);
    if (c.nomem) {
        sq_arch_problems_free(p);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", where);
    }
    if (p->n == 0) return SPARQ_OK;
    char msg[900];
    size_t o = (size_t)snprintf(msg, sizeof msg, "%s: config.json and the tensors disagree (%zu problem%s): ", where,
                                p->n, p->n == 1 ? "" : "s");
    for (size_t i = 0; i < p->n_lines && i < 3 && o < sizeof msg; i++)
        o += (size_t)snprintf(msg + o, sizeof msg - o, "%s%s", i ? "; " : "", p->line[i]);
    if (p->n > 3 && o < sizeof msg) snprintf(msg + o, sizeof msg - o, "; and %zu more", p->n - 3);
    const sparq_status st = c.first;
    if (!report) sq_arch_problems_free(&local);
    return sparq_err(st, "%s", msg);
}
