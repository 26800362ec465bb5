/* pack/verify.c — `sparq verify`: the bundle's files against its manifest
 * (formats/bundle.h, the very routine the runtime runs at load: sizes, files
 * the manifest does not list, every block's XXH3-128 in parallel), then what
 * checksums cannot see, as the manifest carries no checksum of itself: its
 * model config, layer count and plan against config.json and the shards.
 *
 * Those last checks run once every file matched (a damaged file is reported
 * as such, not as a dozen disagreements): the manifest's copy of the config
 * must equal config.json; its layer count and the plan's layer split must be
 * config.json's; each node's recorded KV, workspace and communication bytes
 * must be what runtime/memplan.h gives for the plan's ctx, users, chunk and
 * threads (an edited ctx shows here), its terms must add up to its total; and
 * each shard must hold exactly its node's tensors (sq_memplan_tensor_node,
 * the rule pack wrote them by), every layer the plan gives it, and the bytes
 * the plan counts as the node's weights; a node with Engram layers must name
 * its Engram file, whose tables, hash constants and token map must be those
 * config.json and the tokenizer give (the blocks are checked with the rest). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "formats/engram_vocab.h"
#include "formats/json.h"
#include "pack/pack.h"

/* An integer member of a plan node, or -1 when absent. */
static int64_t node_int(const json_t *n, const char *key)
{
    const json_t *v = json_object_get(n, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

/* Node k's recorded terms against the memory plan's formulas and its total. */
static void check_node_terms(const sq_manifest *m, const sq_model_config *cfg, const json_t *n, int k,
                             sq_bundle_report *r)
{
    const sq_manifest_node *nd = &m->nodes[k];
    sq_memplan_params p;
    sq_memplan_params_default(&p);
    p.ctx = m->ctx;
    p.users = m->users;
    p.chunk = m->chunk;
    p.logits_rows = m->logits_rows;
    p.threads = m->threads;
    p.split = m->split == SQ_MANIFEST_SPLIT_EXPERTS ? SQ_SPLIT_EXPERTS : SQ_SPLIT_PIPELINE;
    sq_kv_dtype_parse(m->kv_dtype, &p.kv_dtype);
    const struct {
        const char *name;
        uint64_t want;
    } terms[] = {{"kv", sq_memplan_kv_bytes_range(cfg, nd->first_layer, nd->n_layers, &p)},
                 {"workspace", sq_memplan_workspace_bytes(cfg, &p, nd->has_head)},
                 {"comm", sq_memplan_comm_bytes(cfg, &p, m->boxes)}};
    for (size_t i = 0; i < sizeof terms / sizeof terms[0]; i++) {
        const int64_t have = node_int(n, terms[i].name);
        if (have >= 0 && (uint64_t)have == terms[i].want) continue;
        sq_bundle_report_add(r, SPARQ_E_FORMAT,
                             "%s: plan node %d records %s %lld bytes, but ctx %lld x %lld users (chunk %lld, %s KV, "
                             "%lld threads) give %llu for its %lld layers: the plan was changed after pack",
                             SQ_MANIFEST_NAME, k, terms[i].name, (long long)have, (long long)m->ctx,
                             (long long)m->users, (long long)m->chunk, m->kv_dtype, (long long)m->threads,
                             (unsigned long long)terms[i].want, (long long)nd->n_layers);
    }
    static const char *const parts[] = {"weights", "kv", "workspace", "engram_cache", "comm", "margin"};
    uint64_t sum = 0;
    bool all = true;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const int64_t v = node_int(n, parts[i]);
        all &= v >= 0;
        sum += (uint64_t)(v > 0 ? v : 0);
    }
    if (!all || sum != nd->total_bytes)
        sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: plan node %d records total %llu bytes, but its terms add up to %llu",
                             SQ_MANIFEST_NAME, k, (unsigned long long)nd->total_bytes, (unsigned long long)sum);
}

/* Node k's shard against the plan: its tensors, layers and weight bytes. */
static sparq_status check_node_shard(const char *dir, const sq_manifest *m, const sq_memplan *pl,
                                     const sq_model_config *cfg, const json_t *n, int k, sq_bundle_report *r)
{
    char rel[64];
    snprintf(rel, sizeof rel, "node-%d/model.safetensors", k);
    char *path = sparq_path_join(dir, rel);
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sf_model *sf = NULL;
    sparq_status st = sf_open(&sf, path);
    sparq_free(path);
    if (st == SPARQ_E_NOMEM) return st;
    if (st != SPARQ_OK) {
        sq_bundle_report_add(r, st, "%s", sparq_errmsg());
        return SPARQ_OK;
    }
    const sq_manifest_node *nd = &m->nodes[k];
    const bool esplit = pl->params.split == SQ_SPLIT_EXPERTS;
    const int64_t E = esplit && cfg->num_experts > 0 ? cfg->num_experts : 0;
    bool *seen = sparq_calloc((size_t)nd->n_layers + 1, sizeof *seen);
    bool *seen_exp = sparq_calloc((size_t)(nd->n_layers * E) + 1, sizeof *seen_exp); /* [layer][expert] */
    if (!seen || !seen_exp) {
        sparq_free(seen);
        sparq_free(seen_exp);
        sf_close(sf);
        return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    uint64_t bytes = 0, misplaced = 0;
    const char *first_bad = NULL;
    int first_bad_node = -1;
    bool embed = false, head = false;
    for (size_t i = 0; i < sf_count(sf); i++) {
        const sf_tensor *t = sf_at(sf, i);
        bytes += t->nbytes;
        int also;
        const int at = sq_memplan_tensor_node(pl, t->name, &also);
        if (!sq_memplan_tensor_on_node(pl, t->name, k)) {
            if (!misplaced++) first_bad = t->name, first_bad_node = at;
            continue;
        }
        int64_t layer;
        bool ex;
        const int64_t e = esplit ? sq_memplan_expert_of(t->name) : -1;
        switch (sq_memplan_classify(t->name, &layer, &ex)) {
        case SQ_TENSOR_LAYER:
            seen[layer - nd->first_layer] = true;
            if (e >= 0 && e < E) seen_exp[(layer - nd->first_layer) * E + e] = true;
            break;
        case SQ_TENSOR_EMBED: embed |= at == k || also == SQ_MEMPLAN_EVERY_NODE; break;
        case SQ_TENSOR_HEAD:
        case SQ_TENSOR_FINAL_NORM: head = true; break;
        default: break;
        }
    }
    if (misplaced) {
        char where[48] = "no node of the plan holds it";
        if (first_bad_node >= 0) snprintf(where, sizeof where, "the plan puts it on node %d", first_bad_node);
        sq_bundle_report_add(r, SPARQ_E_FORMAT,
                             "%s: %llu tensors the plan does not give node %d (layers [%lld, %lld)), e.g. '%s' (%s)",
                             rel, (unsigned long long)misplaced, k, (long long)nd->first_layer,
                             (long long)(nd->first_layer + nd->n_layers), first_bad, where);
    }
    for (int64_t L = 0; L < nd->n_layers; L++)
        if (!seen[L]) {
            sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: no tensor of layer %lld, which the plan gives node %d", rel,
                                 (long long)(nd->first_layer + L), k);
            break;
        }
    if (esplit) { /* its expert set: the rule's, listed in the plan, every one present in every MoE layer */
        const int64_t want = sq_memplan_experts_of_node(E, m->boxes, k);
        if (nd->n_expert_set != want || nd->expert_set_max >= E)
            sq_bundle_report_add(r, SPARQ_E_FORMAT,
                                 "%s: plan node %d lists %lld experts (up to id %lld), but %lld experts over %d boxes "
                                 "give it %lld (expert e on node e mod %d)", SQ_MANIFEST_NAME, k,
                                 (long long)nd->n_expert_set, (long long)nd->expert_set_max, (long long)E, m->boxes,
                                 (long long)want, m->boxes);
        bool missing = false;
        for (int64_t L = 0; L < nd->n_layers && !missing; L++) {
            if (!sq_config_is_moe_layer(cfg, nd->first_layer + L)) continue;
            for (int64_t x = k; x < E && !missing; x += m->boxes)
                if (!seen_exp[L * E + x]) {
                    missing = true;
                    sq_bundle_report_add(r, SPARQ_E_FORMAT,
                                         "%s: no tensor of expert %lld of layer %lld, which the expert split gives "
                                         "node %d", rel, (long long)x, (long long)(nd->first_layer + L), k);
                }
        }
    }
    sparq_free(seen_exp);
    if (embed != nd->has_embed || head != nd->has_head)
        sq_bundle_report_add(r, SPARQ_E_FORMAT,
                             "%s: %s the embeddings and %s the final norm / lm_head, but the plan says has_embed %s, "
                             "has_head %s",
                             rel, embed ? "holds" : "lacks", head ? "holds" : "lacks", nd->has_embed ? "true" : "false",
                             nd->has_head ? "true" : "false");
    const int64_t w = node_int(n, "weights");
    if (w < 0 || (uint64_t)w != bytes)
        sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: holds %llu bytes of tensors, but the plan records weights %lld",
                             rel, (unsigned long long)bytes, (long long)w);
    sparq_free(seen);
    sf_close(sf);
    return SPARQ_OK;
}

/* Node k's Engram file (what checksums cannot see): named exactly when the
 * node holds Engram layers, holding the tables and hash constants config.json
 * gives those layers, and the token map the bundle's tokenizer gives. */
static sparq_status check_node_engram(const char *dir, const sq_manifest *m, const sq_model_config *cfg, int k,
                                      sq_bundle_report *r)
{
    const sq_manifest_node *nd = &m->nodes[k];
    sq_engram_layout all, want;
    if (sq_engram_layout_from_config(&all, cfg, "config.json") != SPARQ_OK) {
        sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s", sparq_errmsg());
        return SPARQ_OK;
    }
    sq_engram_layout_subset(&all, (int)nd->first_layer, (int)(nd->first_layer + nd->n_layers), &want);
    if (!want.n_layers || !nd->engram_file[0]) {
        if (want.n_layers || nd->engram_file[0])
            sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: plan node %d %s, but it holds %u Engram layers",
                                 SQ_MANIFEST_NAME, k, nd->engram_file[0] ? "names an Engram file" : "names no Engram file",
                                 want.n_layers);
        return SPARQ_OK;
    }
    char *path = sparq_path_join(dir, nd->engram_file);
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sq_engram_reader *rd = NULL;
    sq_tokenizer *tok = NULL;
    uint32_t *map = NULL;
    sparq_status st = sq_engram_open(&rd, path, 0);
    if (st == SPARQ_OK) st = sq_tokenizer_load(&tok, dir);
    if (st == SPARQ_OK) st = sq_engram_token_map(tok, cfg, dir, &map, &want);
    if (st == SPARQ_E_NOMEM) goto done;
    if (st != SPARQ_OK) {
        sq_bundle_report_add(r, st, "%s", sparq_errmsg());
        st = SPARQ_OK;
    } else if (!sq_engram_layout_equal(&sq_engram_reader_header(rd)->layout, &want, true)) {
        sq_bundle_report_add(r, SPARQ_E_FORMAT,
                             "%s: its tables, hash constants or token map are not those config.json and the tokenizer "
                             "give node %d's Engram layers", nd->engram_file, k);
    }
done:
    sparq_free(map);
    sq_tokenizer_free(tok);
    sq_engram_close(rd);
    sparq_free(path);
    return st;
}

/* The manifest against config.json and the shards (every file matched). */
static sparq_status check_manifest(const char *dir, const sq_manifest *m, int node, sq_bundle_report *r)
{
    json_t *root = NULL, *cfg_json = NULL;
    sq_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    sq_memplan_node *pn = NULL;
    char *mpath = sparq_path_join(dir, SQ_MANIFEST_NAME), *cpath = sparq_path_join(dir, "config.json");
    sparq_status st = mpath && cpath ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    if (st == SPARQ_OK) st = sq_json_load_file(&root, mpath, SQ_MANIFEST_MAX_SIZE);
    if (st != SPARQ_OK) goto done;
    st = sq_json_load_file(&cfg_json, cpath, 1 << 24);
    if (st == SPARQ_OK) st = sq_config_load(&cfg, dir);
    if (st != SPARQ_OK) {
        /* a config.json that does not parse is the bundle's problem; no memory or a failed read is not */
        if (st != SPARQ_E_NOMEM && st != SPARQ_E_IO) {
            sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s", sparq_errmsg());
            st = SPARQ_OK;
        }
        goto done;
    }
    const json_t *model = json_object_get(root, "model"), *plan = json_object_get(root, "plan");
    if (!json_equal(json_object_get(model, "config"), cfg_json))
        sq_bundle_report_add(r, SPARQ_E_FORMAT,
                             "%s: model.config differs from config.json (one of them was changed after pack)",
                             SQ_MANIFEST_NAME);
    const json_t *nl = json_object_get(model, "n_layers");
    if (!json_is_integer(nl) || json_integer_value(nl) != cfg.num_hidden_layers)
        sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: model.n_layers %lld, but config.json has num_hidden_layers %lld",
                             SQ_MANIFEST_NAME, json_is_integer(nl) ? (long long)json_integer_value(nl) : -1LL,
                             (long long)cfg.num_hidden_layers);
    const sq_manifest_node *last = &m->nodes[m->boxes - 1];
    const int64_t end = last->first_layer + last->n_layers, pl_n = node_int(plan, "n_layers");
    if (end != cfg.num_hidden_layers || pl_n != cfg.num_hidden_layers) {
        sq_bundle_report_add(r, SPARQ_E_FORMAT,
                             "%s: the plan's nodes hold layers [0, %lld) (plan.n_layers %lld), but config.json has "
                             "%lld",
                             SQ_MANIFEST_NAME, (long long)end, (long long)pl_n, (long long)cfg.num_hidden_layers);
    }
    /* the plan as pack used it to place tensors */
    pn = sparq_calloc((size_t)m->boxes, sizeof *pn);
    if (!pn) {
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto done;
    }
    for (int k = 0; k < m->boxes; k++) {
        pn[k].node = k;
        pn[k].first_layer = m->nodes[k].first_layer;
        pn[k].n_layers = m->nodes[k].n_layers;
    }
    sq_memplan pl = {.boxes = m->boxes, .n_layers = end, .tied_head = json_is_true(json_object_get(plan, "tied_head")),
                     .nodes = pn};
    if (m->split == SQ_MANIFEST_SPLIT_EXPERTS) {
        pl.params.split = SQ_SPLIT_EXPERTS;
        pl.n_experts = cfg.num_experts;
    }
    const json_t *nodes = json_object_get(plan, "nodes");
    for (int k = 0; k < m->boxes && st == SPARQ_OK; k++) {
        if (node >= 0 && k != node) continue;
        const json_t *n = json_array_get(nodes, (size_t)k);
        check_node_terms(m, &cfg, n, k, r);
        st = check_node_shard(dir, m, &pl, &cfg, n, k, r);
        if (st == SPARQ_OK) st = check_node_engram(dir, m, &cfg, k, r);
    }
done:
    sparq_free(pn);
    sq_config_free(&cfg);
    json_decref(cfg_json);
    json_decref(root);
    sparq_free(mpath);
    sparq_free(cpath);
    return st;
}

sparq_status sq_verify_bundle(const char *dir, const sq_verify_options *o, sq_verify_report *r)
{
    memset(r, 0, sizeof *r);
    sq_manifest m;
    FORWARD_IF(sq_manifest_load(&m, dir));
    const sq_bundle_check_opts co = {
        .node = o->node, .quick = o->quick, .threads = o->threads, .all_files = true, .progress = "verify"};
    sparq_status st = sq_bundle_check(dir, &m, &co, r);
    if (st == SPARQ_OK) st = check_manifest(dir, &m, o->node, r);
    if (st == SPARQ_OK) st = sq_bundle_report_status(dir, r);
    sq_manifest_free(&m);
    return st;
}

sparq_status sq_verify_read_baseline(const char *dir, int node, uint64_t *bytes, double *seconds)
{
    *bytes = 0;
    *seconds = 0;
    sq_manifest m;
    FORWARD_IF(sq_manifest_load(&m, dir));
    const size_t cap = 4 << 20;
    uint8_t *buf = sparq_aligned_alloc(4096, cap);
    sparq_status st = buf ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    double t0 = sparq_now();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < m.n_files && st == SPARQ_OK; i++) {
        if (!sq_manifest_file_for_node(&m.files[i], node)) continue;
        char *p = sparq_path_join(dir, m.files[i].path);
        int fd = p ? sparq_io_open(p, O_RDONLY | O_CLOEXEC, 0) : -1;
        if (!p) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        else if (fd < 0) st = sparq_err(SPARQ_E_IO, "%s: cannot open: %s", p, strerror(errno));
        ssize_t r = 0;
        while (fd >= 0 && ((r = sparq_io_read(fd, buf, cap)) > 0 || (r < 0 && errno == EINTR))) {
            if (r < 0) continue;
            *bytes += (uint64_t)r;
            sink ^= buf[r - 1];
        }
        if (fd >= 0 && r < 0) st = sparq_err(SPARQ_E_IO, "%s: read failed: %s", p, strerror(errno));
        sparq_free(p);
        if (fd >= 0) close(fd);
    }
    *seconds = sparq_now() - t0;
    (void)sink;
    sparq_aligned_free(buf);
    sq_manifest_free(&m);
    return st;
}
