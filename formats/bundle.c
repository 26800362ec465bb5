/* formats/bundle.c — a bundle's files against its manifest (see bundle.h).
 *
 * Work items are (file, block) pairs handed to the thread pool; each worker
 * hashes one block straight from a read-only mapping of the file (no copy:
 * measured ~1.6x faster per thread than pread into a buffer, see
 * docs/benchmarks-pack.md), or, if a file cannot be mapped, preads it into
 * its own buffer. As everywhere sparq maps files (the runtime maps weights),
 * a file truncated by someone else *while* it is being checked ends the
 * process with SIGBUS; truncation before the check is reported by name. A
 * file whose blocks all match has the recorded content (the whole-file
 * digest in the manifest is for users' own tools, `xxhsum -H2`), so it is not
 * hashed a second time. */
#include "formats/bundle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "common/threadpool.h"

const char *const sq_bundle_shared_files[] = {
    "config.json",           "generation_config.json",  "quantization_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",      "vocab.json",
    "merges.txt",            NULL};

#define MAX_PROBLEMS 100
#define MAX_DEPTH 16

/* ---- the report ---- */

static void report_vadd(sq_bundle_report *r, sparq_status st, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    r->n_bad++;
    if (r->first == SPARQ_OK) {
        r->first = st;
        snprintf(r->first_msg, sizeof r->first_msg, "%s", line);
    }
    if (r->problems && r->n_problems < MAX_PROBLEMS) {
        char *s = sparq_strdup(line);
        if (s) r->problems[r->n_problems++] = s;
    }
}

void sq_bundle_report_add(sq_bundle_report *r, sparq_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report_vadd(r, st, fmt, ap);
    va_end(ap);
}

void sq_bundle_report_free(sq_bundle_report *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_problems; i++) sparq_free(r->problems[i]);
    sparq_free(r->problems);
    memset(r, 0, sizeof *r);
}

sparq_status sq_bundle_report_status(const char *dir, const sq_bundle_report *r)
{
    if (!r->n_bad) return SPARQ_OK;
    if (r->n_bad > 1)
        return sparq_err(r->first, "%s: %s (and %llu more problem%s)", dir, r->first_msg,
                         (unsigned long long)(r->n_bad - 1), r->n_bad > 2 ? "s" : "");
    return sparq_err(r->first, "%s: %s", dir, r->first_msg);
}

/* ---- what is checked ---- */

/* 1. the entries every check needs: the shard of each node checked, config.json */
static void check_required(const sq_manifest *m, int node, sq_bundle_report *r)
{
    for (int k = node < 0 ? 0 : node; k < (node < 0 ? m->boxes : node + 1); k++) {
        char rel[64];
        snprintf(rel, sizeof rel, "node-%d/model.safetensors", k);
        const sq_manifest_file *f = sq_manifest_find(m, rel);
        if (!f)
            sq_bundle_report_add(r, SPARQ_E_NOTFOUND, "%s: not listed in %s (entry removed?): it cannot be checked",
                                 rel, SQ_MANIFEST_NAME);
        else if (f->node != k)
            sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: listed for node %d in %s, but it is node %d's shard", rel,
                                 f->node, SQ_MANIFEST_NAME, k);
    }
    const sq_manifest_file *c = sq_manifest_find(m, "config.json");
    if (!c)
        sq_bundle_report_add(r, SPARQ_E_NOTFOUND, "config.json: not listed in %s (entry removed?): it cannot be checked",
                             SQ_MANIFEST_NAME);
    else if (c->node != -1)
        sq_bundle_report_add(r, SPARQ_E_FORMAT, "config.json: listed for node %d in %s, but every node reads it",
                             c->node, SQ_MANIFEST_NAME);
}

/* 2. present, regular, the recorded size: opens fds[i] for each file checked */
static sparq_status open_files(const char *dir, const sq_manifest *m, int node, int *fds, sq_bundle_report *r,
                               uint64_t *n_blocks, uint64_t *bytes)
{
    for (size_t i = 0; i < m->n_files; i++) {
        const sq_manifest_file *f = &m->files[i];
        if (!sq_manifest_file_for_node(f, node)) continue;
        r->files++;
        char *p = sparq_path_join(dir, f->path);
        RETURN_IF(!p, SPARQ_E_NOMEM, "out of memory");
        struct stat sb;
        if (stat(p, &sb) != 0) {
            sq_bundle_report_add(r, SPARQ_E_NOTFOUND, "%s: missing (%s)", f->path, strerror(errno));
            sparq_free(p);
            continue;
        }
        uint64_t size = 0;
        int fd = -1;
        sparq_status st = sparq_open_regular(p, &fd, &size);
        if (st != SPARQ_OK) {
            /* the message starts with the path we gave; the report names the file in the bundle */
            const char *why = sparq_errmsg();
            const size_t pl = strlen(p);
            if (!strncmp(why, p, pl) && !strncmp(why + pl, ": ", 2)) why += pl + 2;
            sq_bundle_report_add(r, st, "%s: %s", f->path, why);
            sparq_free(p);
            continue;
        }
        sparq_free(p);
        if (size != f->size) {
            sq_bundle_report_add(r, SPARQ_E_FORMAT, "%s: %llu bytes but the manifest says %llu (%s)", f->path,
                                 (unsigned long long)size, (unsigned long long)f->size,
                                 size < f->size ? "truncated" : "replaced or appended to");
            close(fd);
            continue;
        }
        fds[i] = fd;
        *n_blocks += f->n_blocks;
        *bytes += f->size;
    }
    return SPARQ_OK;
}

/* 3. files on disk that the manifest does not list */
typedef struct walk_ctx {
    const sq_manifest *m;
    int node;
    bool all;
    sq_bundle_report *r;
    char node_dir[32]; /* "node-K/" */
} walk_ctx;

static bool matters(const walk_ctx *w, const char *rel)
{
    if (w->all) return true;
    if (w->node >= 0 && !strncmp(rel, w->node_dir, strlen(w->node_dir))) return true;
    if (w->node < 0 && !strncmp(rel, "node-", 5)) return true;
    for (const char *const *s = sq_bundle_shared_files; *s; s++)
        if (!strcmp(rel, *s)) return true;
    return false;
}

static sparq_status walk(walk_ctx *w, const char *dir, const char *rel, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return SPARQ_OK; /* the files it should hold are reported missing */
    sparq_status st = SPARQ_OK;
    struct dirent *e;
    while (st == SPARQ_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *sub = sparq_path_join(rel, e->d_name);
        char *path = sparq_path_join(dir, e->d_name);
        if (!sub || !path) {
            st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        } else {
            const char *name = rel[0] ? sub : e->d_name;
            struct stat sb;
            if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                if (depth < MAX_DEPTH) st = walk(w, path, name, depth + 1);
            } else if (!(depth == 0 && !strcmp(name, SQ_MANIFEST_NAME)) && !sq_manifest_find(w->m, name) &&
                       matters(w, name)) {
                sq_bundle_report_add(w->r, SPARQ_E_FORMAT,
                                     "%s: not listed in %s (a file `sparq pack` did not write, or an entry removed)",
                                     name, SQ_MANIFEST_NAME);
            }
        }
        sparq_free(sub);
        sparq_free(path);
    }
    closedir(d);
    return st;
}

/* 4. every block */
typedef struct vitem {
    uint32_t file;
    uint64_t block;
} vitem;

typedef struct hctx {
    const sq_manifest *m;
    const int *fds;
    const vitem *items;
    uint8_t **bufs;       /* per thread, for files that could not be mapped */
    const uint8_t **maps; /* per file, NULL if not mapped */
    sparq_progress *pr;
    sq_bundle_report *r;
    pthread_mutex_t mu;
} hctx;

static void locked_add(hctx *c, sparq_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void locked_add(hctx *c, sparq_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&c->mu);
    report_vadd(c->r, st, fmt, ap);
    pthread_mutex_unlock(&c->mu);
    va_end(ap);
}

static void hash_one(void *vc, size_t i, int tid)
{
    hctx *c = vc;
    const vitem *it = &c->items[i];
    const sq_manifest_file *f = &c->m->files[it->file];
    const uint64_t bs = c->m->block_size, off = it->block * bs;
    const uint64_t want = f->size - off < bs ? f->size - off : bs;
    sq_digest d;
    if (c->maps[it->file]) {
        sq_digest_of(c->maps[it->file] + off, (size_t)want, &d);
    } else if (sq_digest_file_range(c->fds[it->file], off, want, c->bufs[tid], (size_t)bs, &d, f->path) !=
               SPARQ_OK) {
        locked_add(c, SPARQ_E_IO, "%s: block %llu: %s", f->path, (unsigned long long)it->block, sparq_errmsg());
        return;
    }
    if (memcmp(&d, &f->blocks[it->block], sizeof d))
        locked_add(c, SPARQ_E_CHECKSUM, "%s: block %llu (bytes %llu..%llu): checksum mismatch (damaged data)",
                   f->path, (unsigned long long)it->block, (unsigned long long)off,
                   (unsigned long long)(off + want - 1));
    if (c->pr) sparq_progress_add(c->pr, want);
}

static sparq_status hash_blocks(const sq_manifest *m, const int *fds, uint64_t n_items, uint64_t total,
                                const sq_bundle_check_opts *o, sq_bundle_report *r)
{
    vitem *items = sparq_calloc((size_t)n_items, sizeof *items);
    const uint8_t **maps = sparq_calloc(m->n_files, sizeof *maps);
    sparq_pool *pool = NULL;
    uint8_t **bufs = NULL;
    sparq_status st = items && maps ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    if (st == SPARQ_OK) st = sparq_pool_create(&pool, o->threads);
    const int nt = sparq_pool_size(pool);
    if (st == SPARQ_OK && !(bufs = sparq_calloc((size_t)nt, sizeof *bufs)))
        st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    /* a buffer per thread only when some file cannot be mapped */
    for (size_t i = 0; st == SPARQ_OK && i < m->n_files; i++) {
        if (fds[i] < 0 || !m->files[i].size) continue;
        void *p = m->files[i].size <= SIZE_MAX
                      ? sparq_io_mmap(fds[i], (size_t)m->files[i].size, MAP_SHARED)
                      : MAP_FAILED;
        if (p != MAP_FAILED) {
            madvise(p, (size_t)m->files[i].size, MADV_SEQUENTIAL);
            maps[i] = p;
            continue;
        }
        for (int t = 0; t < nt && st == SPARQ_OK; t++)
            if (!bufs[t] && !(bufs[t] = sparq_aligned_alloc(4096, (size_t)m->block_size)))
                st = sparq_err(SPARQ_E_NOMEM, "out of memory for %d buffers of %llu bytes", nt,
                               (unsigned long long)m->block_size);
    }
    if (st == SPARQ_OK) {
        size_t k = 0;
        for (size_t i = 0; i < m->n_files; i++)
            if (fds[i] >= 0)
                for (uint64_t b = 0; b < m->files[i].n_blocks; b++) items[k++] = (vitem){(uint32_t)i, b};
        sparq_progress pr;
        if (o->progress) sparq_progress_begin(&pr, o->progress, total, SPARQ_PROGRESS_BYTES);
        hctx c = {.m = m, .fds = fds, .items = items, .bufs = bufs, .maps = maps, .pr = o->progress ? &pr : NULL,
                  .r = r};
        pthread_mutex_init(&c.mu, NULL);
        double t0 = sparq_now();
        sparq_pool_for(pool, (size_t)n_items, hash_one, &c);
        r->seconds = sparq_now() - t0;
        pthread_mutex_destroy(&c.mu);
        if (o->progress) sparq_progress_end(&pr);
        r->blocks = n_items;
        r->bytes = total;
    }
    for (size_t i = 0; maps && i < m->n_files; i++)
        if (maps[i]) munmap((void *)maps[i], (size_t)m->files[i].size);
    for (int t = 0; bufs && t < nt; t++) sparq_aligned_free(bufs[t]);
    sparq_free(bufs);
    sparq_pool_free(pool);
    sparq_free(maps);
    sparq_free(items);
    return st;
}

sparq_status sq_bundle_check(const char *dir, const sq_manifest *m, const sq_bundle_check_opts *o,
                             sq_bundle_report *r)
{
    memset(r, 0, sizeof *r);
    r->problems = sparq_calloc(MAX_PROBLEMS, sizeof *r->problems);
    RETURN_IF(!r->problems, SPARQ_E_NOMEM, "out of memory");
    RETURN_IF(o->node < -1 || o->node >= m->boxes, SPARQ_E_ARG, "%s: node %d but the bundle has %d nodes (0..%d)",
              dir, o->node, m->boxes, m->boxes - 1);
    int *fds = sparq_malloc((m->n_files ? m->n_files : 1) * sizeof *fds);
    RETURN_IF(!fds, SPARQ_E_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_files; i++) fds[i] = -1;
    check_required(m, o->node, r);
    uint64_t n_blocks = 0, bytes = 0;
    sparq_status st = open_files(dir, m, o->node, fds, r, &n_blocks, &bytes);
    walk_ctx w = {.m = m, .node = o->node, .all = o->all_files, .r = r};
    snprintf(w.node_dir, sizeof w.node_dir, "node-%d/", o->node);
    if (st == SPARQ_OK) st = walk(&w, dir, "", 0);
    if (st == SPARQ_OK && !o->quick && n_blocks) st = hash_blocks(m, fds, n_blocks, bytes, o, r);
    for (size_t i = 0; i < m->n_files; i++)
        if (fds[i] >= 0) close(fds[i]);
    sparq_free(fds);
    if (st != SPARQ_OK) return st;
    return sq_bundle_report_status(dir, r);
}

sparq_status sq_bundle_check_quick(const char *dir, const sq_manifest *m, int node)
{
    const sq_bundle_check_opts o = {.node = node, .quick = true};
    sq_bundle_report r;
    sparq_status st = sq_bundle_check(dir, m, &o, &r);
    sq_bundle_report_free(&r);
    return st;
}
