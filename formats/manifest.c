/* formats/manifest.c — manifest.json parsing, file hashing and the quick
 * bundle check (see manifest.h and docs/bundle-format.md).
 *
 * The parser trusts nothing: it is a fuzz target, and the runtime feeds it
 * whatever a user copied onto a box. */
#include "formats/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
/* Inline, so the compiler vectorises XXH3 here: ~10 GB/s against ~6 GB/s
 * through the Debian shared library on the same machine (docs/benchmarks-pack.md). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/json.h"

/* ---- digests ---- */

static void digest_from(XXH128_hash_t h, sq_digest *out)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out->b, c.digest, 16);
}

void sq_digest_of(const void *data, size_t n, sq_digest *out) { digest_from(XXH3_128bits(data, n), out); }

void sq_digest_hex(const sq_digest *d, char out[33])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[d->b[i] >> 4];
        out[2 * i + 1] = hex[d->b[i] & 15];
    }
    out[32] = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool sq_digest_parse(const char *hex, sq_digest *out)
{
    for (int i = 0; i < 16; i++) {
        int a = hexval(hex[2 * i]);
        if (a < 0) return false;
        int b = hexval(hex[2 * i + 1]);
        if (b < 0) return false;
        out->b[i] = (uint8_t)(a << 4 | b);
    }
    return hex[32] == 0;
}

/* ---- parsing ---- */

void sq_manifest_free(sq_manifest *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n_files; i++) {
        sparq_free(m->files[i].path);
        sparq_free(m->files[i].blocks);
    }
    sparq_free(m->files);
    sparq_free(m->nodes);
    memset(m, 0, sizeof *m);
}

/* A safe relative path: non-empty segments, no ".", "..", or backslashes. */
static bool path_ok(const char *p)
{
    if (!*p || *p == '/' || strlen(p) > 1024) return false;
    const char *s = p;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
        for (size_t i = 0; i < n; i++)
            if (s[i] == '\\' || (unsigned char)s[i] < 0x20) return false;
        if (!e) break;
        s = e + 1;
    }
    return true;
}

static sparq_status get_req_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                                const char *name)
{
    const json_t *v = json_object_get(o, key);
    RETURN_IF(!v || !json_is_integer(v), SPARQ_E_FORMAT, "%s: '%s' must be an integer", name, key);
    int64_t x = (int64_t)json_integer_value(v);
    RETURN_IF(x < lo || x > hi, SPARQ_E_FORMAT, "%s: '%s' = %lld is outside [%lld, %lld]", name, key,
              (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return SPARQ_OK;
}

/* Node k's "expert_set" under the expert split: increasing ids, each e with e mod boxes == k. */
static sparq_status parse_expert_set(const sq_manifest *m, sq_manifest_node *nd, const json_t *set, int k,
                                     const char *name)
{
    RETURN_IF(!set, SPARQ_E_FORMAT,
              "%s: plan node %d has no 'expert_set' (an expert-split bundle lists the routed experts each node "
              "holds)", name, k);
    RETURN_IF(!json_is_array(set) || json_array_size(set) == 0 || json_array_size(set) > (1u << 20), SPARQ_E_FORMAT,
              "%s: plan node %d: 'expert_set' must be a non-empty array of expert ids", name, k);
    int64_t prev = -1;
    for (size_t i = 0; i < json_array_size(set); i++) {
        const json_t *v = json_array_get(set, i);
        const int64_t e = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
        RETURN_IF(e <= prev || e >= (1 << 20) || e % m->boxes != k, SPARQ_E_FORMAT,
                  "%s: plan node %d: 'expert_set' entry %zu is not an expert id above %lld with id mod %d == %d "
                  "(expert e lives on node e mod boxes)", name, k, i, (long long)prev, m->boxes, k);
        prev = e;
    }
    nd->n_expert_set = (int64_t)json_array_size(set);
    nd->expert_set_max = prev;
    return SPARQ_OK;
}

static sparq_status parse_plan(sq_manifest *m, const json_t *plan, const char *name)
{
    RETURN_IF(!json_is_object(plan), SPARQ_E_FORMAT, "%s: 'plan' must be an object", name);
    int64_t v = 0;
    FORWARD_IF(get_req_int(plan, "boxes", 1, 4096, &v, name));
    m->boxes = (int)v;
    FORWARD_IF(get_req_int(plan, "ctx", 1, INT64_MAX / 2, &m->ctx, name));
    FORWARD_IF(get_req_int(plan, "users", 1, 1 << 20, &m->users, name));
    FORWARD_IF(get_req_int(plan, "chunk", 1, 1 << 24, &m->chunk, name));
    FORWARD_IF(get_req_int(plan, "logits_rows", 0, 1 << 24, &m->logits_rows, name));
    FORWARD_IF(get_req_int(plan, "threads", 1, 4096, &m->threads, name));
    const json_t *kd = json_object_get(plan, "kv_dtype");
    RETURN_IF(!json_is_string(kd) || (strcmp(json_string_value(kd), "f32") && strcmp(json_string_value(kd), "f16")),
              SPARQ_E_FORMAT, "%s: plan 'kv_dtype' must be \"f32\" or \"f16\"", name);
    strcpy(m->kv_dtype, json_string_value(kd));
    const json_t *sp = json_object_get(plan, "split");
    m->split = SQ_MANIFEST_SPLIT_PIPELINE;
    if (sp) {
        RETURN_IF(!json_is_string(sp) || (strcmp(json_string_value(sp), "pipeline") &&
                                          strcmp(json_string_value(sp), "experts")),
                  SPARQ_E_FORMAT, "%s: plan 'split' must be \"pipeline\" or \"experts\"", name);
        if (!strcmp(json_string_value(sp), "experts")) m->split = SQ_MANIFEST_SPLIT_EXPERTS;
    }
    const bool experts = m->split == SQ_MANIFEST_SPLIT_EXPERTS;
    RETURN_IF(experts != (m->format_version == SQ_MANIFEST_VERSION_EXPERTS), SPARQ_E_FORMAT,
              "%s: plan 'split' is \"%s\" but format_version is %d (%d is the expert split's, %d the pipeline's)",
              name, experts ? "experts" : "pipeline", m->format_version, SQ_MANIFEST_VERSION_EXPERTS,
              SQ_MANIFEST_VERSION);
    const json_t *nodes = json_object_get(plan, "nodes");
    RETURN_IF(!json_is_array(nodes) || json_array_size(nodes) != (size_t)m->boxes, SPARQ_E_FORMAT,
              "%s: plan 'nodes' must be an array of %d nodes", name, m->boxes);
    m->nodes = sparq_calloc((size_t)m->boxes, sizeof *m->nodes);
    RETURN_IF(!m->nodes, SPARQ_E_NOMEM, "%s: out of memory", name);
    int64_t next = 0;
    for (int k = 0; k < m->boxes; k++) {
        const json_t *n = json_array_get(nodes, (size_t)k);
        RETURN_IF(!json_is_object(n), SPARQ_E_FORMAT, "%s: plan node %d must be an object", name, k);
        sq_manifest_node *nd = &m->nodes[k];
        FORWARD_IF(get_req_int(n, "node", k, k, &v, name));
        nd->node = k;
        if (experts) { /* every node every layer: the same count on each */
            FORWARD_IF(get_req_int(n, "first_layer", 0, 0, &nd->first_layer, name));
            FORWARD_IF(get_req_int(n, "n_layers", k ? m->nodes[0].n_layers : 1, k ? m->nodes[0].n_layers : 1 << 20,
                                   &nd->n_layers, name));
            FORWARD_IF(parse_expert_set(m, nd, json_object_get(n, "expert_set"), k, name));
        } else {
            FORWARD_IF(get_req_int(n, "first_layer", next, next, &nd->first_layer, name));
            FORWARD_IF(get_req_int(n, "n_layers", 1, 1 << 20, &nd->n_layers, name));
            RETURN_IF(json_object_get(n, "expert_set"), SPARQ_E_FORMAT,
                      "%s: plan node %d lists an 'expert_set', but the bundle is split as a pipeline", name, k);
            nd->expert_set_max = -1;
        }
        next += nd->n_layers;
        FORWARD_IF(get_req_int(n, "total", 0, INT64_MAX, &v, name));
        nd->total_bytes = (uint64_t)v;
        const json_t *e = json_object_get(n, "has_embed"), *h = json_object_get(n, "has_head");
        RETURN_IF(!json_is_boolean(e) || !json_is_boolean(h), SPARQ_E_FORMAT,
                  "%s: plan node %d: 'has_embed' and 'has_head' must be booleans", name, k);
        nd->has_embed = json_is_true(e);
        nd->has_head = json_is_true(h);
        if (json_object_get(n, "engram_cache")) {
            FORWARD_IF(get_req_int(n, "engram_cache", 0, INT64_MAX, &v, name));
            nd->engram_cache = (uint64_t)v;
        }
        const json_t *ef = json_object_get(n, "engram_file");
        if (ef) {
            RETURN_IF(!json_is_string(ef) || !path_ok(json_string_value(ef)) ||
                          strlen(json_string_value(ef)) >= sizeof nd->engram_file,
                      SPARQ_E_FORMAT, "%s: plan node %d: 'engram_file' must be a relative path without '..'", name, k);
            strcpy(nd->engram_file, json_string_value(ef));
        }
    }
    return SPARQ_OK;
}

static sparq_status parse_file(sq_manifest *m, sq_manifest_file *f, const json_t *o, size_t i, const char *name)
{
    RETURN_IF(!json_is_object(o), SPARQ_E_FORMAT, "%s: files[%zu] must be an object", name, i);
    const json_t *p = json_object_get(o, "path");
    RETURN_IF(!json_is_string(p) || !path_ok(json_string_value(p)), SPARQ_E_FORMAT,
              "%s: files[%zu]: 'path' must be a relative path without '..'", name, i);
    f->path = sparq_strdup(json_string_value(p));
    RETURN_IF(!f->path, SPARQ_E_NOMEM, "%s: out of memory", name);
    int64_t v = 0;
    FORWARD_IF(get_req_int(o, "node", -1, m->boxes - 1, &v, name));
    f->node = (int)v;
    FORWARD_IF(get_req_int(o, "size", 0, INT64_MAX, &v, name));
    f->size = (uint64_t)v;
    const json_t *h = json_object_get(o, "xxh3_128");
    RETURN_IF(!json_is_string(h) || !sq_digest_parse(json_string_value(h), &f->hash), SPARQ_E_FORMAT,
              "%s: %s: 'xxh3_128' must be 32 hex digits", name, f->path);
    const json_t *b = json_object_get(o, "blocks");
    uint64_t want = f->size / m->block_size + (f->size % m->block_size != 0);
    RETURN_IF(!json_is_array(b) || json_array_size(b) != want, SPARQ_E_FORMAT,
              "%s: %s: 'blocks' must list %llu block digests (size %llu, block size %llu)", name, f->path,
              (unsigned long long)want, (unsigned long long)f->size, (unsigned long long)m->block_size);
    f->n_blocks = want;
    if (want) {
        f->blocks = sparq_calloc((size_t)want, sizeof *f->blocks);
        RETURN_IF(!f->blocks, SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    for (uint64_t k = 0; k < want; k++) {
        const json_t *d = json_array_get(b, (size_t)k);
        RETURN_IF(!json_is_string(d) || !sq_digest_parse(json_string_value(d), &f->blocks[k]), SPARQ_E_FORMAT,
                  "%s: %s: block %llu digest must be 32 hex digits", name, f->path, (unsigned long long)k);
    }
    return SPARQ_OK;
}

static sparq_status parse_root(sq_manifest *m, const json_t *root, const char *name)
{
    RETURN_IF(!json_is_object(root), SPARQ_E_FORMAT, "%s: manifest must be a JSON object", name);
    const json_t *fmt = json_object_get(root, "format");
    RETURN_IF(!json_is_string(fmt) || strcmp(json_string_value(fmt), SQ_MANIFEST_FORMAT), SPARQ_E_FORMAT,
              "%s: 'format' must be \"%s\" (not a sparq bundle manifest?)", name, SQ_MANIFEST_FORMAT);
    int64_t v = 0;
    FORWARD_IF(get_req_int(root, "format_version", 1, 1 << 20, &v, name));
    RETURN_IF(v != SQ_MANIFEST_VERSION && v != SQ_MANIFEST_VERSION_EXPERTS, SPARQ_E_UNSUPPORTED,
              "%s: format_version %lld; this sparq reads versions %d and %d (repack with this version)", name,
              (long long)v, SQ_MANIFEST_VERSION, SQ_MANIFEST_VERSION_EXPERTS);
    m->format_version = (int)v;
    FORWARD_IF(sq_json_get_str(root, "tool", m->tool, sizeof m->tool, name));
    FORWARD_IF(get_req_int(root, "block_size", 4096, (int64_t)1 << 40, &v, name));
    RETURN_IF(v & (v - 1), SPARQ_E_FORMAT, "%s: 'block_size' %lld is not a power of two", name, (long long)v);
    m->block_size = (uint64_t)v;
    FORWARD_IF(parse_plan(m, json_object_get(root, "plan"), name));
    const json_t *files = json_object_get(root, "files");
    RETURN_IF(!json_is_array(files), SPARQ_E_FORMAT, "%s: 'files' must be an array", name);
    size_t n = json_array_size(files);
    if (n) {
        m->files = sparq_calloc(n, sizeof *m->files);
        RETURN_IF(!m->files, SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    for (size_t i = 0; i < n; i++) {
        m->n_files = i + 1;
        FORWARD_IF(parse_file(m, &m->files[i], json_array_get(files, i), i, name));
        for (size_t j = 0; j < i; j++)
            RETURN_IF(!strcmp(m->files[j].path, m->files[i].path), SPARQ_E_FORMAT, "%s: file '%s' listed twice",
                      name, m->files[i].path);
    }
    for (int k = 0; k < m->boxes; k++) { /* a node's Engram file is one of its files */
        const char *ef = m->nodes[k].engram_file;
        if (!*ef) continue;
        const sq_manifest_file *f = sq_manifest_find(m, ef);
        RETURN_IF(!f || f->node != k, SPARQ_E_FORMAT, "%s: plan node %d reads Engram file '%s', which 'files' %s",
                  name, k, ef, f ? "gives another node" : "does not list");
    }
    return SPARQ_OK;
}

sparq_status sq_manifest_parse(sq_manifest *m, const char *json, size_t len, const char *name)
{
    memset(m, 0, sizeof *m);
    json_t *root;
    FORWARD_IF(sq_json_parse(&root, json, len, name));
    sparq_status st = parse_root(m, root, name);
    json_decref(root);
    if (st != SPARQ_OK) sq_manifest_free(m);
    return st;
}

sparq_status sq_manifest_load(sq_manifest *m, const char *bundle_dir)
{
    memset(m, 0, sizeof *m);
    char *path = sparq_path_join(bundle_dir, SQ_MANIFEST_NAME);
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    char *text;
    size_t len;
    sparq_status st = sparq_file_read_all(path, SQ_MANIFEST_MAX_SIZE, &text, &len);
    if (st == SPARQ_OK) {
        st = sq_manifest_parse(m, text, len, path);
        sparq_free(text);
    } else if (!sparq_path_exists(path)) {
        st = sparq_err(SPARQ_E_NOTFOUND, "%s: no manifest.json: not a sparq bundle (or an unfinished pack)",
                       bundle_dir);
    }
    sparq_free(path);
    return st;
}

bool sq_manifest_file_for_node(const sq_manifest_file *f, int node)
{
    return node < 0 || f->node < 0 || f->node == node;
}

const sq_manifest_file *sq_manifest_find(const sq_manifest *m, const char *path)
{
    for (size_t i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].path, path)) return &m->files[i];
    return NULL;
}

/* ---- hashing ---- */

sparq_status sq_digest_file_range(int fd, uint64_t off, uint64_t n, uint8_t *scratch, size_t scratch_size,
                                  sq_digest *out, const char *path)
{
    if (n <= scratch_size) { /* one read, one-shot hash */
        FORWARD_IF(sparq_pread_full(fd, scratch, n, off, path));
        digest_from(XXH3_128bits(scratch, (size_t)n), out);
        return SPARQ_OK;
    }
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < scratch_size ? n - done : scratch_size;
        FORWARD_IF(sparq_pread_full(fd, scratch, k, off + done, path));
        XXH3_128bits_update(&st, scratch, (size_t)k);
        done += k;
    }
    digest_from(XXH3_128bits_digest(&st), out);
    return SPARQ_OK;
}

sparq_status sq_manifest_hash_file(sq_manifest_file *f, const char *path, uint64_t block_size)
{
    RETURN_IF(block_size < 4096 || (block_size & (block_size - 1)), SPARQ_E_ARG,
              "block size %llu is not a power of two >= 4096", (unsigned long long)block_size);
    int fd;
    uint64_t size;
    FORWARD_IF(sparq_open_regular(path, &fd, &size));
    const uint64_t nb = size / block_size + (size % block_size != 0);
    sq_digest *blocks = nb ? sparq_calloc((size_t)nb, sizeof *blocks) : NULL;
    uint8_t *buf = block_size <= SIZE_MAX ? sparq_aligned_alloc(4096, (size_t)block_size) : NULL;
    sparq_status rc = SPARQ_OK;
    if ((nb && !blocks) || !buf) {
        rc = sparq_err(SPARQ_E_NOMEM, "%s: out of memory hashing", path);
        goto done;
    }
    /* one pass: each block is hashed on its own and feeds the file's state */
    XXH3_state_t whole;
    XXH3_INITSTATE(&whole);
    XXH3_128bits_reset(&whole);
    for (uint64_t k = 0; k < nb; k++) {
        const uint64_t off = k * block_size, want = size - off < block_size ? size - off : block_size;
        rc = sparq_pread_full(fd, buf, want, off, path);
        if (rc != SPARQ_OK) goto done;
        digest_from(XXH3_128bits(buf, (size_t)want), &blocks[k]);
        XXH3_128bits_update(&whole, buf, (size_t)want);
    }
    digest_from(XXH3_128bits_digest(&whole), &f->hash);
    sparq_free(f->blocks);
    f->size = size;
    f->n_blocks = nb;
    f->blocks = blocks;
    blocks = NULL;
done:
    sparq_aligned_free(buf);
    sparq_free(blocks);
    close(fd);
    return rc;
}

json_t *sq_manifest_file_json(const sq_manifest_file *f)
{
    char hex[33];
    json_t *o = json_object(), *b = json_array();
    if (!o || !b) goto fail;
    sq_digest_hex(&f->hash, hex);
    if (json_object_set_new(o, "path", json_string(f->path)) || json_object_set_new(o, "node", json_integer(f->node)) ||
        json_object_set_new(o, "size", json_integer((json_int_t)f->size)) ||
        json_object_set_new(o, "xxh3_128", json_string(hex)))
        goto fail;
    for (uint64_t k = 0; k < f->n_blocks; k++) {
        sq_digest_hex(&f->blocks[k], hex);
        if (json_array_append_new(b, json_string(hex))) goto fail;
    }
    if (json_object_set_new(o, "blocks", b)) {
        b = NULL;
        goto fail;
    }
    return o;
fail:
    json_decref(b);
    json_decref(o);
    return NULL;
}
