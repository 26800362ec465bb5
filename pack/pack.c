/* pack/pack.c — open a model for planning, the plan as JSON, and
 * `sparq pack`: node shards + shared files + manifest, atomically, resumable.
 *
 * Order of work (each step safe to interrupt):
 *   1. plan; refuse if it does not fit (nothing written);
 *   2. OUT.partial/ with .pack-state.json (options + plan + source sizes), or
 *      on --resume check that file matches and delete stale *.tmp.* files;
 *   3. node-K/model.safetensors for every node not already present (each
 *      written to a temporary name and renamed, so a present file is whole);
 *   4. shared files (config, tokenizer, ...) copied the same way;
 *   5. hash everything, write manifest.json, drop .pack-state.json, rename
 *      OUT.partial -> OUT.
 * Everything written is a function of the inputs and options only, so a
 * resumed pack produces the same bytes as an uninterrupted one. */
#include "pack/pack.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "formats/engram_vocab.h"
#include "formats/json.h"
#include "formats/tokenizer.h"
#include "runtime/arch.h"
#include "sparq_version.h"

#define STATE_NAME ".pack-state.json"

/* ---- model ---- */

sparq_status sq_pack_model_open(sq_pack_model *m, const char *model_dir)
{
    memset(m, 0, sizeof *m);
    RETURN_IF(!sparq_path_is_dir(model_dir), SPARQ_E_ARG, "%s: not a directory (MODEL is an HF-layout model folder)",
              model_dir);
    FORWARD_IF(sq_config_load(&m->cfg, model_dir));
    sparq_status st = sf_open(&m->sf, model_dir);
    if (st != SPARQ_OK) {
        sq_config_free(&m->cfg);
        return st;
    }
    /* the config must describe exactly these tensors (headers only: nothing is read) */
    st = sq_arch_check_tensors(&m->cfg, m->sf, NULL, model_dir, NULL);
    if (st != SPARQ_OK) {
        sq_pack_model_close(m);
        return st;
    }
    m->n_tensors = sf_count(m->sf);
    m->tensors = sparq_calloc(m->n_tensors ? m->n_tensors : 1, sizeof *m->tensors);
    if (!m->tensors) {
        sq_pack_model_close(m);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", model_dir);
    }
    for (size_t i = 0; i < m->n_tensors; i++) {
        const sf_tensor *t = sf_at(m->sf, i);
        m->tensors[i].name = t->name;
        m->tensors[i].nbytes = t->nbytes;
    }
    return SPARQ_OK;
}

void sq_pack_model_close(sq_pack_model *m)
{
    if (!m) return;
    sparq_free(m->tensors);
    if (m->sf) sf_close(m->sf);
    sq_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

/* ---- plan JSON ---- */

static int set_u64(json_t *o, const char *k, uint64_t v)
{
    return json_object_set_new(o, k, json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v));
}

json_t *sq_pack_plan_json(const sq_memplan *p)
{
    json_t *o = json_object(), *b = json_object(), *nodes = json_array();
    int e = !o || !b || !nodes;
    if (e) goto fail;
    e |= json_object_set_new(o, "boxes", json_integer(p->boxes));
    e |= set_u64(o, "ctx", (uint64_t)p->params.ctx);
    e |= set_u64(o, "users", (uint64_t)p->params.users);
    e |= set_u64(o, "chunk", (uint64_t)p->params.chunk);
    e |= set_u64(o, "logits_rows", (uint64_t)(p->params.logits_rows > 0 ? p->params.logits_rows : 0));
    e |= json_object_set_new(o, "kv_dtype", json_string(sq_kv_dtype_name(p->params.kv_dtype)));
    e |= set_u64(o, "threads", (uint64_t)p->params.threads);
    e |= json_object_set_new(o, "split", json_string(sq_memplan_split_name(p->params.split)));
    e |= set_u64(b, "mem_per_box", p->budget.mem_per_box);
    e |= set_u64(b, "reserve_os", p->budget.reserve_os);
    e |= set_u64(b, "display_reserve", p->budget.display_reserve);
    e |= set_u64(b, "unlock_display", p->budget.unlock_display);
    e |= json_object_set_new(b, "gpu_util", json_real(p->budget.gpu_util));
    e |= set_u64(b, "margin", p->budget.margin);
    e |= set_u64(b, "engram_cache", p->budget.engram_cache);
    e |= set_u64(b, "usable", p->usable);
    e |= json_object_set(o, "budget", b);
    e |= json_object_set_new(o, "n_layers", json_integer(p->n_layers));
    e |= json_object_set_new(o, "tied_head", json_boolean(p->tied_head));
    e |= set_u64(o, "weights_total", p->weights_total);
    e |= set_u64(o, "engram_table_bytes", p->engram_table_bytes);
    e |= json_object_set_new(o, "fits", json_boolean(p->fits));
    e |= json_object_set_new(o, "worst_node", json_integer(p->worst_node));
    e |= json_object_set_new(o, "blame", p->fits ? json_null() : json_string(p->blame));
    for (int k = 0; k < p->boxes && !e; k++) {
        const sq_memplan_node *nd = &p->nodes[k];
        json_t *n = json_object();
        if (!n) goto fail;
        e |= json_object_set_new(n, "node", json_integer(k));
        e |= json_object_set_new(n, "first_layer", json_integer(nd->first_layer));
        e |= json_object_set_new(n, "n_layers", json_integer(nd->n_layers));
        e |= json_object_set_new(n, "has_embed", json_boolean(nd->has_embed));
        e |= json_object_set_new(n, "has_head", json_boolean(nd->has_head));
        e |= json_object_set_new(n, "has_engram", json_boolean(nd->has_engram));
        e |= json_object_set_new(n, "experts", json_integer(nd->experts));
        if (p->params.split == SQ_SPLIT_EXPERTS) { /* the routed experts of every MoE layer it holds */
            json_t *set = json_array();
            e |= !set;
            for (int64_t x = k; set && !e && x < p->n_experts; x += p->boxes)
                e |= json_array_append_new(set, json_integer(x));
            e |= !set || json_object_set_new(n, "expert_set", set);
        }
        e |= set_u64(n, "weights", nd->weights);
        e |= set_u64(n, "kv", nd->kv);
        e |= set_u64(n, "workspace", nd->workspace);
        e |= set_u64(n, "engram_cache", nd->engram_cache);
        e |= set_u64(n, "comm", nd->comm);
        e |= set_u64(n, "margin", nd->margin);
        e |= set_u64(n, "total", nd->total);
        e |= json_object_set_new(n, "headroom", json_integer(nd->headroom));
        e |= json_array_append_new(nodes, n);
    }
    e |= json_object_set(o, "nodes", nodes);
    if (e) goto fail;
    json_decref(b);
    json_decref(nodes);
    return o;
fail:
    json_decref(b);
    json_decref(nodes);
    json_decref(o);
    return NULL;
}

void sq_pack_plan_reason(const sq_memplan *p, char *buf, size_t cap)
{
    const sq_memplan_node *nd = &p->nodes[p->worst_node];
    char need[32], use[32], over[80];
    const double G = 1024.0 * 1024.0 * 1024.0;
    snprintf(need, sizeof need, "%.2f GiB", (double)nd->total / G);
    snprintf(use, sizeof use, "%.2f GiB", (double)p->usable / G);
    snprintf(over, sizeof over, "%.2f GiB (%lld bytes)", -(double)nd->headroom / G, -(long long)nd->headroom);
    if (p->fits)
        snprintf(buf, cap, "tightest node %d needs %s of %s usable", nd->node, need, use);
    else
        snprintf(buf, cap, "node %d needs %s but %s is usable per box (over by %s); largest term: %s",
                 nd->node, need, use, over, p->blame);
}

/* ---- pack ---- */

void sq_pack_options_default(sq_pack_options *o)
{
    memset(o, 0, sizeof *o);
    o->boxes = 1;
    sq_memplan_params_default(&o->params);
    sq_memplan_budget_default(&o->budget);
    o->block_size = SQ_BLOCK_SIZE_DEFAULT;
}

/* Test hook: SPARQ_PACK_TEST_SLEEP_MS=N sleeps N ms after each file written,
 * so tests can kill -9 a pack in the middle (tests/pack/test_pack_resume.sh). */
static void test_pause(void)
{
    const char *s = getenv("SPARQ_PACK_TEST_SLEEP_MS");
    if (!s) return;
    long ms = atol(s);
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Remove leftover "<name>.tmp.<pid>" files of an interrupted run in dir. */
static void remove_stale_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".tmp.")) continue;
        char *p = sparq_path_join(dir, e->d_name);
        if (p) unlink(p);
        sparq_free(p);
    }
    closedir(d);
}

static sparq_status copy_file(const char *src, const char *dst)
{
    char *buf;
    size_t n;
    FORWARD_IF(sparq_file_read_all(src, 0, &buf, &n));
    sparq_status st = sparq_file_write_atomic(dst, buf, n);
    sparq_free(buf);
    return st;
}

typedef struct pack_ctx {
    const char *model_dir, *out_dir;
    const sq_pack_options *o;
    sq_pack_model model;
    sq_memplan plan;
    char *partial;
    json_t *plan_json;
    char *state; /* the text of OUT.partial/.pack-state.json */
    struct engram_src *engram; /* NULL when the model has no Engram tables */
} pack_ctx;

static char *node_rel(int k)
{
    char buf[64];
    snprintf(buf, sizeof buf, "node-%d/model.safetensors", k);
    return sparq_strdup(buf);
}

/* The state file: what this OUT.partial is being built from. */
static char *state_text(pack_ctx *c)
{
    json_t *s = json_object(), *src = json_array();
    int e = !s || !src;
    e |= !s || json_object_set_new(s, "tool", json_string("sparq " SPARQ_VERSION));
    e |= !s || json_object_set_new(s, "block_size", json_integer((json_int_t)c->o->block_size));
    e |= !s || json_object_set(s, "plan", c->plan_json);
    for (int i = 0; i < sf_file_count(c->model.sf) && !e; i++) {
        struct stat st;
        json_t *f = json_object();
        const char *p = sf_file_path(c->model.sf, i);
        e |= !f || json_object_set_new(f, "path", json_string(p));
        e |= !f || json_object_set_new(f, "size", json_integer(stat(p, &st) == 0 ? (json_int_t)st.st_size : -1));
        e |= !f || json_array_append_new(src, f);
    }
    e |= !s || !src || json_object_set(s, "source", src);
    char *t = e ? NULL : json_dumps(s, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    json_decref(src);
    json_decref(s);
    return t;
}

/* Does dir hold nothing but leftover temporary files? */
static bool only_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool only = true;
    struct dirent *e;
    while (only && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !strstr(e->d_name, ".tmp.")) only = false;
    closedir(d);
    return only;
}

static sparq_status prepare_partial(pack_ctx *c)
{
    char *want = state_text(c);
    RETURN_IF(!want, SPARQ_E_NOMEM, "out of memory");
    char *state_path = sparq_path_join(c->partial, STATE_NAME);
    sparq_status st = SPARQ_OK;
    if (!state_path) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    } else if (sparq_path_exists(c->partial)) {
        if (!c->o->resume) {
            st = sparq_err(SPARQ_E_ARG, "%s exists (an interrupted pack?): rerun with --resume, or remove it",
                           c->partial);
        } else if (!sparq_path_exists(state_path) && only_tmp_files(c->partial)) {
            /* interrupted between creating the folder and writing the state */
            st = sparq_file_write_atomic(state_path, want, strlen(want));
        } else {
            char *have = NULL;
            size_t n;
            if (sparq_file_read_all(state_path, 1 << 24, &have, &n) != SPARQ_OK || strcmp(have, want))
                st = sparq_err(SPARQ_E_ARG,
                               "%s was started from another model or with other options; remove it to start over",
                               c->partial);
            sparq_free(have);
        }
    } else {
        st = sparq_mkdirs(c->partial);
        if (st == SPARQ_OK) st = sparq_file_write_atomic(state_path, want, strlen(want));
    }
    c->state = want; /* kept to put the state back if the final rename fails */
    sparq_free(state_path);
    return st;
}

static sparq_status write_node(pack_ctx *c, int k, sparq_progress *pr)
{
    char *rel = node_rel(k), *path = rel ? sparq_path_join(c->partial, rel) : NULL;
    char dir[64];
    snprintf(dir, sizeof dir, "node-%d", k);
    char *dpath = sparq_path_join(c->partial, dir);
    sparq_status st = SPARQ_OK;
    sf_writer *w = NULL;
    if (!rel || !path || !dpath) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto done;
    }
    st = sparq_mkdirs(dpath);
    if (st != SPARQ_OK) goto done;
    remove_stale_tmp(dpath);
    uint64_t bytes = 0;
    if (sparq_path_exists(path)) goto count; /* finished by an earlier run */
    st = sf_writer_create(&w, path);
    if (st != SPARQ_OK) goto done;
    char meta[32];
    snprintf(meta, sizeof meta, "%d", k);
    st = sf_writer_set_metadata(w, "sparq.node", meta);
    for (size_t i = 0; i < sf_count(c->model.sf) && st == SPARQ_OK; i++) {
        const sf_tensor *t = sf_at(c->model.sf, i);
        if (!sq_memplan_tensor_on_node(&c->plan, t->name, k)) continue;
        st = sf_writer_add_ref(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    }
    if (st == SPARQ_OK) {
        st = sf_writer_finish(w);
        w = NULL;
    }
    if (st != SPARQ_OK) goto done;
    test_pause();
count:
    for (size_t i = 0; i < sf_count(c->model.sf); i++) {
        const sf_tensor *t = sf_at(c->model.sf, i);
        if (sq_memplan_tensor_on_node(&c->plan, t->name, k)) bytes += t->nbytes;
    }
    sparq_progress_add(pr, bytes);
done:
    if (w) sf_writer_free(w);
    sparq_free(rel);
    sparq_free(path);
    sparq_free(dpath);
    return st;
}

/* ---- Engram tables ---- */

/* The model's tables (the layout its config implies, with the token map of
 * its tokenizer) and where their rows are in the checkpoint. */
struct engram_src {
    sq_engram_layout lay;
    uint32_t *token_map;
    const sf_tensor *w[SQ_ENGRAM_MAX_LAYERS], *s[SQ_ENGRAM_MAX_LAYERS];
};
typedef struct engram_src engram_src;

/* One node's file: its tables (a subset of e->lay), table k being e's full[k]. */
typedef struct engram_node_src {
    const engram_src *e;
    sq_engram_layout lay;
    int full[SQ_ENGRAM_MAX_LAYERS];
} engram_node_src;

static sparq_status engram_rows(void *ctx, uint32_t l, uint32_t c, uint64_t first, uint64_t n, uint8_t *rows)
{
    const engram_node_src *ns = ctx;
    const engram_src *e = ns->e;
    const int t = ns->full[l];
    const uint32_t nv = e->lay.values_per_row, nsc = e->lay.scales_per_row, rb = e->lay.row_bytes;
    const uint64_t r0 = e->lay.row_offset[t][c] + first;
    for (uint64_t i = 0; i < n; i++) {
        memcpy(rows + i * rb, (const uint8_t *)e->w[t]->data + (r0 + i) * nv, nv);
        memcpy(rows + i * rb + nv, (const uint8_t *)e->s[t]->data + (r0 + i) * nsc, nsc);
    }
    return SPARQ_OK;
}

/* The tables' layout from config.json (formats/engram.h), their tensors
 * checked against it, and the token map from the tokenizer. */
static sparq_status engram_prepare(pack_ctx *c, engram_src *e)
{
    memset(e, 0, sizeof *e);
    FORWARD_IF(sq_engram_layout_from_config(&e->lay, &c->model.cfg, c->model_dir));
    for (size_t i = 0; i < sf_count(c->model.sf); i++) {
        const sf_tensor *t = sf_at(c->model.sf, i);
        int64_t layer;
        bool ex;
        if (sq_memplan_classify(t->name, &layer, &ex) != SQ_TENSOR_ENGRAM_TABLE) continue;
        const int k = sq_engram_table_of(&e->lay, (int)layer);
        RETURN_IF(k < 0, SPARQ_E_FORMAT, "%s: %s: config.json gives layer %lld no Engram table", c->model_dir,
                  t->name, (long long)layer);
        const char *suffix = strstr(t->name, "engram.embed.") + 13;
        if (strcmp(suffix, "weight")) continue;
        char sname[512];
        snprintf(sname, sizeof sname, "%.*sscale", (int)(suffix - t->name), t->name);
        const sf_tensor *sc = sf_find(c->model.sf, sname);
        RETURN_IF(!sc, SPARQ_E_NOTFOUND, "%s: Engram table without its scales '%s'", t->name, sname);
        const uint64_t rows = sq_engram_layer_rows(&e->lay, (uint32_t)k);
        RETURN_IF(t->dtype != SF_F8_E4M3 || t->ndim != 2 || t->shape[1] != e->lay.values_per_row, SPARQ_E_SHAPE,
                  "%s: Engram values must be F8_E4M3 [rows, %u] (engram_head_dim)", t->name, e->lay.values_per_row);
        RETURN_IF(sc->dtype != SF_F8_E8M0 || sc->ndim != 2 || sc->shape[1] != e->lay.scales_per_row ||
                      sc->shape[0] != t->shape[0],
                  SPARQ_E_SHAPE, "%s: Engram scales must be F8_E8M0 [%llu, %u]", sname,
                  (unsigned long long)t->shape[0], e->lay.scales_per_row);
        RETURN_IF(t->shape[0] != rows, SPARQ_E_SHAPE,
                  "%s: %llu rows, but the hash layout of config.json (%u primes from engram_vocab_size %lld) has "
                  "%llu", t->name, (unsigned long long)t->shape[0], e->lay.n_columns,
                  (long long)c->model.cfg.v41.engram_vocab_size, (unsigned long long)rows);
        e->w[k] = t;
        e->s[k] = sc;
    }
    for (uint32_t k = 0; k < e->lay.n_layers; k++)
        RETURN_IF(!e->w[k], SPARQ_E_NOTFOUND, "%s: config.json gives layer %d an Engram table, but there is no "
                  "'layers.%d.engram.embed.weight'", c->model_dir, e->lay.layer_ids[k], e->lay.layer_ids[k]);
    sq_tokenizer *tok = NULL;
    FORWARD_IF(sq_tokenizer_load(&tok, c->model_dir));
    sparq_status st = sq_engram_token_map(tok, &c->model.cfg, c->model_dir, &e->token_map, &e->lay);
    sq_tokenizer_free(tok);
    return st;
}

static void engram_rel(int k, char *rel, size_t cap) { snprintf(rel, cap, "engram/engram-node-%d.bin", k); }

/* Node k's Engram file (the tables of the layers it holds), if it holds any;
 * *written tells. */
static sparq_status write_engram(pack_ctx *c, const engram_src *e, int k, bool *written)
{
    const sq_memplan_node *nd = &c->plan.nodes[k];
    engram_node_src ns = {.e = e};
    sq_engram_layout_subset(&e->lay, (int)nd->first_layer, (int)(nd->first_layer + nd->n_layers), &ns.lay);
    *written = ns.lay.n_layers > 0;
    if (!*written) return SPARQ_OK;
    for (uint32_t l = 0; l < ns.lay.n_layers; l++) ns.full[l] = sq_engram_table_of(&e->lay, ns.lay.layer_ids[l]);
    char rel[64];
    engram_rel(k, rel, sizeof rel);
    char *dir = sparq_path_join(c->partial, "engram"), *path = sparq_path_join(c->partial, rel);
    sparq_status st = (dir && path) ? sparq_mkdirs(dir) : sparq_err(SPARQ_E_NOMEM, "out of memory");
    if (st == SPARQ_OK) remove_stale_tmp(dir);
    if (st == SPARQ_OK && !sparq_path_exists(path)) {
        uint32_t bb = c->o->block_size > ((uint64_t)1 << 30) ? 1u << 30 : (uint32_t)c->o->block_size;
        st = sq_engram_write(path, &ns.lay, (uint32_t)k, (uint32_t)c->plan.boxes, bb, engram_rows, &ns);
        if (st == SPARQ_OK) test_pause();
    }
    sparq_free(dir);
    sparq_free(path);
    return st;
}

static sparq_status write_manifest(pack_ctx *c, sq_manifest_file *files, size_t nf)
{
    json_t *root = json_object(), *model = json_object(), *arr = json_array(), *cfg = NULL;
    sparq_status st = SPARQ_OK;
    if (!root || !model || !arr) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto done;
    }
    char *cfg_path = sparq_path_join(c->model_dir, "config.json");
    st = cfg_path ? sq_json_load_file(&cfg, cfg_path, 1 << 24) : sparq_err(SPARQ_E_NOMEM, "out of memory");
    sparq_free(cfg_path);
    if (st != SPARQ_OK) goto done;
    int e = 0; /* jansson returns -1 on allocation failure: collect, then fail once */
    e |= json_object_set_new(root, "format", json_string(SQ_MANIFEST_FORMAT));
    e |= json_object_set_new(root, "format_version",
                             json_integer(c->plan.params.split == SQ_SPLIT_EXPERTS ? SQ_MANIFEST_VERSION_EXPERTS
                                                                                   : SQ_MANIFEST_VERSION));
    e |= json_object_set_new(root, "tool", json_string("sparq " SPARQ_VERSION));
    e |= json_object_set_new(root, "checksum", json_string("xxh3-128"));
    e |= json_object_set_new(root, "block_size", json_integer((json_int_t)c->o->block_size));
    e |= json_object_set_new(model, "architecture", json_string(sq_arch_name(c->model.cfg.arch)));
    e |= json_object_set_new(model, "n_layers", json_integer(c->model.cfg.num_hidden_layers));
    e |= json_object_set_new(model, "n_tensors", json_integer((json_int_t)c->model.n_tensors));
    e |= json_object_set_new(model, "weights_bytes", json_integer((json_int_t)c->plan.weights_total));
    json_t *q = json_object_get(cfg, "quantization_config");
    e |= json_object_set(model, "quantization", q ? q : json_null());
    e |= json_object_set(model, "config", cfg);
    e |= json_object_set(root, "model", model);
    e |= json_object_set(root, "plan", c->plan_json);
    for (size_t i = 0; i < nf && !e; i++) {
        json_t *f = sq_manifest_file_json(&files[i]);
        e |= !f || json_array_append_new(arr, f);
    }
    e |= json_object_set(root, "files", arr);
    char *text = e ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    if (!text) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory writing the manifest");
        goto done;
    }
    /* what we write must read back: the runtime and verify depend on it */
    sq_manifest check;
    st = sq_manifest_parse(&check, text, strlen(text), SQ_MANIFEST_NAME);
    sq_manifest_free(&check);
    if (st != SPARQ_OK) {
        sparq_free(text);
        if (st != SPARQ_E_NOMEM) st = sparq_err(SPARQ_E_STATE, "the manifest just built does not parse: %s", sparq_errmsg());
        goto done;
    }
    char *mpath = sparq_path_join(c->partial, SQ_MANIFEST_NAME);
    size_t tl = strlen(text);
    text[tl] = '\n'; /* replace the NUL: the file ends with a newline */
    st = mpath ? sparq_file_write_atomic(mpath, text, tl + 1) : sparq_err(SPARQ_E_NOMEM, "out of memory");
    sparq_free(text);
    sparq_free(mpath);
done:
    json_decref(cfg);
    json_decref(arr);
    json_decref(model);
    json_decref(root);
    return st;
}

/* List rel (a new string, NULL when its allocation failed) as the next file of the manifest. */
static sparq_status list_file(sq_manifest_file *files, size_t *nf, char *rel, int node)
{
    files[*nf].path = rel;
    files[(*nf)++].node = node;
    return rel ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
}

static sparq_status pack_files(pack_ctx *c)
{
    const int boxes = c->plan.boxes;
    size_t nshared_max = 0;
    while (sq_bundle_shared_files[nshared_max]) nshared_max++;
    sq_manifest_file *files = sparq_calloc(2 * (size_t)boxes + nshared_max, sizeof *files);
    RETURN_IF(!files, SPARQ_E_NOMEM, "out of memory");
    size_t nf = 0;
    sparq_status st = SPARQ_OK;
    sparq_progress pr;
    uint64_t shard_bytes = 0; /* the expert split writes the replicated part once per node */
    for (int k = 0; k < boxes; k++) shard_bytes = sparq_sat_add_u64(shard_bytes, c->plan.nodes[k].weights);
    sparq_progress_begin(&pr, "pack: shards", shard_bytes, SPARQ_PROGRESS_BYTES);
    for (int k = 0; k < boxes && st == SPARQ_OK; k++) {
        st = write_node(c, k, &pr);
        if (st == SPARQ_OK) st = list_file(files, &nf, node_rel(k), k);
    }
    sparq_progress_end(&pr);
    for (int k = 0; c->engram && k < boxes && st == SPARQ_OK; k++) {
        bool written = false;
        st = write_engram(c, c->engram, k, &written);
        char rel[64];
        engram_rel(k, rel, sizeof rel);
        if (st == SPARQ_OK && written) st = list_file(files, &nf, sparq_strdup(rel), k);
    }
    /* the model's config and tokenizer files (formats/bundle.h), those it has */
    for (const char *const *s = sq_bundle_shared_files; *s && st == SPARQ_OK; s++) {
        char *src = sparq_path_join(c->model_dir, *s), *dst = sparq_path_join(c->partial, *s);
        if (!src || !dst) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        else if (sparq_path_exists(src)) {
            if (!sparq_path_exists(dst)) {
                st = copy_file(src, dst);
                if (st == SPARQ_OK) test_pause();
            }
            if (st == SPARQ_OK) st = list_file(files, &nf, sparq_strdup(*s), -1);
        }
        sparq_free(src);
        sparq_free(dst);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < nf && st == SPARQ_OK; i++) {
        struct stat sb;
        char *p = sparq_path_join(c->partial, files[i].path);
        if (!p) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        else if (stat(p, &sb) == 0) total += (uint64_t)sb.st_size;
        sparq_free(p);
    }
    sparq_progress_begin(&pr, "pack: checksums", total, SPARQ_PROGRESS_BYTES);
    for (size_t i = 0; i < nf && st == SPARQ_OK; i++) {
        char *p = sparq_path_join(c->partial, files[i].path);
        st = p ? sq_manifest_hash_file(&files[i], p, c->o->block_size) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        if (st == SPARQ_OK) sparq_progress_add(&pr, files[i].size);
        sparq_free(p);
    }
    sparq_progress_end(&pr);
    if (st == SPARQ_OK) st = write_manifest(c, files, nf);
    for (size_t i = 0; i < nf; i++) {
        sparq_free(files[i].path);
        sparq_free(files[i].blocks);
    }
    sparq_free(files);
    return st;
}

/* The bundle's tokenizer must load (run and serve read it first), and its ids
 * must index the embedding. */
static sparq_status check_tokenizer(const char *model_dir, const sq_model_config *cfg)
{
    sq_tokenizer *tok = NULL;
    sparq_status st = sq_tokenizer_load(&tok, model_dir);
    if (st != SPARQ_OK) return sparq_err_context(st, "%s: the tokenizer does not load; nothing written", model_dir);
    const int32_t n = sq_tokenizer_vocab_size(tok);
    sq_tokenizer_free(tok);
    RETURN_IF(n < 1 || n > cfg->vocab_size, SPARQ_E_FORMAT,
              "%s: tokenizer.json has ids 0..%d, but config.json's vocab_size is %lld; nothing written", model_dir,
              (int)n - 1, (long long)cfg->vocab_size);
    return SPARQ_OK;
}

/* Name, in each plan node of the manifest, the Engram file that node reads
 * ("engram_file", absent for a node without Engram layers); -1 on OOM. */
static int engram_name_files(pack_ctx *c)
{
    json_t *nodes = json_object_get(c->plan_json, "nodes");
    for (int k = 0; k < c->plan.boxes; k++) {
        const sq_memplan_node *nd = &c->plan.nodes[k];
        sq_engram_layout sub;
        sq_engram_layout_subset(&c->engram->lay, (int)nd->first_layer, (int)(nd->first_layer + nd->n_layers), &sub);
        if (!sub.n_layers) continue;
        char rel[64];
        engram_rel(k, rel, sizeof rel);
        if (json_object_set_new(json_array_get(nodes, (size_t)k), "engram_file", json_string(rel))) return -1;
    }
    return 0;
}

sparq_status sq_pack_bundle(const char *model_dir, const char *out_dir, const sq_pack_options *o)
{
    pack_ctx c;
    memset(&c, 0, sizeof c);
    c.model_dir = model_dir;
    c.out_dir = out_dir;
    c.o = o;
    RETURN_IF(o->block_size < 4096 || (o->block_size & (o->block_size - 1)), SPARQ_E_ARG,
              "block size %llu is not a power of two >= 4096", (unsigned long long)o->block_size);
    FORWARD_IF(sq_pack_model_open(&c.model, model_dir));
    sparq_status st = check_tokenizer(model_dir, &c.model.cfg);
    if (st != SPARQ_OK) goto done;
    st = sq_memplan_build(&c.plan, &c.model.cfg, c.model.tensors, c.model.n_tensors, o->boxes,
                                       &o->params, &o->budget);
    if (st != SPARQ_OK) goto done;
    if (!c.plan.fits) {
        char why[256];
        sq_pack_plan_reason(&c.plan, why, sizeof why);
        st = sparq_err(SPARQ_E_FIT, "%s: %s; nothing written (see `sparq plan`)", model_dir, why);
        goto done;
    }
    if (c.plan.has_engram) { /* check the tables before writing anything */
        c.engram = sparq_calloc(1, sizeof *c.engram);
        st = c.engram ? engram_prepare(&c, c.engram) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        if (st != SPARQ_OK) goto done;
    }
    c.plan_json = sq_pack_plan_json(&c.plan);
    if (!c.plan_json || (c.engram && engram_name_files(&c) != 0)) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto done;
    }
    if (sparq_path_exists(out_dir)) {
        st = sparq_err(SPARQ_E_ARG, "%s already exists; choose another OUT or remove it", out_dir);
        goto done;
    }
    size_t n = strlen(out_dir);
    while (n > 1 && out_dir[n - 1] == '/') n--;
    c.partial = sparq_malloc(n + 16);
    if (!c.partial) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto done;
    }
    memcpy(c.partial, out_dir, n);
    strcpy(c.partial + n, ".partial");
    st = prepare_partial(&c);
    if (st != SPARQ_OK) goto done;
    remove_stale_tmp(c.partial);
    st = pack_files(&c);
    if (st != SPARQ_OK) goto done;
    /* the state file must go: the finished bundle holds only what its manifest lists */
    char *state_path = sparq_path_join(c.partial, STATE_NAME);
    if (!state_path) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto done;
    }
    unlink(state_path);
    char final_out[4096];
    snprintf(final_out, sizeof final_out, "%.*s", (int)n, out_dir);
    if (sparq_io_rename(c.partial, final_out) != 0) {
        char why[1024];
        sparq_err(SPARQ_E_IO, "%s: rename from %s failed: %s", final_out, c.partial, strerror(errno));
        snprintf(why, sizeof why, "%s", sparq_errmsg());
        /* without its state OUT.partial could not be resumed, only removed */
        if (sparq_file_write_atomic(state_path, c.state, strlen(c.state)) == SPARQ_OK)
            st = sparq_err(SPARQ_E_IO, "%s (rerun with --resume to finish)", why);
        else
            st = sparq_err(SPARQ_E_IO, "%s; and putting back %s failed: %s", why, state_path, sparq_errmsg());
    }
    sparq_free(state_path);
done:
    free(c.state); /* json_dumps' buffer: jansson's malloc (formats/json.c) */
    if (c.engram) sparq_free(c.engram->token_map);
    sparq_free(c.engram);
    json_decref(c.plan_json);
    sparq_free(c.partial);
    sq_memplan_free(&c.plan);
    sq_pack_model_close(&c.model);
    return st;
}
