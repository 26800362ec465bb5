/* tests/datapack.c — how the large files of tests/data are stored, and the
 * build step that makes the tree the tests read.
 *
 * A file NAME that is stored packed is committed as NAME.zst (plain zstd: any
 * `zstd -d` gives NAME back) or NAME.bsW.zst (W = 2 or 4): the file's header
 * (safetensors: 8 + the JSON length; npy: magic, version and header) is kept
 * as it is and the rest is split into W byte planes (byte 0 of every W-byte
 * element, then byte 1, ...; a tail shorter than W is kept at the end) before
 * zstd. The planes of bf16 / fp32 numbers compress far better than the
 * interleaved bytes (the exponent bytes are nearly constant), e.g.
 * tiny-qwen3moe's model.safetensors: 18.4 MB, 14.3 MB as plain zstd -19,
 * 12.5 MB as .bs2.zst.
 *
 *   datapack pack [--keep] FILE...   store each FILE packed: tries W = 1, 2, 4
 *                                    (2 and 4 for safetensors / npy only) at
 *                                    zstd level 19, keeps the smallest,
 *                                    checks that it unpacks to FILE, then
 *                                    removes FILE (unless --keep)
 *   datapack unpack PACKED OUT       unpack one file
 *   datapack tree SRC DST STAMP      make DST a copy of SRC with every packed
 *                                    file unpacked under its plain name (the
 *                                    .zst itself is not copied), remove from
 *                                    DST what SRC no longer has, touch STAMP
 *
 * `tree` is what the build runs (tests/meson.build: build/tests/data from
 * tests/data, on every ninja run); a file is rewritten only when its source's
 * size or mtime changed (the copy carries the source's mtime). Having both
 * NAME and NAME.zst (or two packed forms of NAME) in SRC is an error. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <zstd.h>

#define MARKER ".datapack-tree" /* in DST: this tool made it (pruning only happens there) */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("datapack: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p) die("out of memory");
    return p;
}

static char *join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = xmalloc(na + nb + 2);
    memcpy(p, a, na);
    p[na] = '/';
    memcpy(p + na + 1, b, nb + 1);
    return p;
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) die("cannot stat %s: %s", path, strerror(errno));
    uint8_t *buf = xmalloc((size_t)st.st_size);
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) die("cannot read %s", path);
    fclose(f);
    *n = (size_t)st.st_size;
    return buf;
}

/* Write path atomically (path.tmp.PID, then rename); mode 0644. */
static void write_file(const char *path, const void *buf, size_t n)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) die("cannot create %s: %s", tmp, strerror(errno));
    if (fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        unlink(tmp);
        die("cannot write %s", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        die("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
}

/* Length of the part kept unshuffled: the safetensors or npy header, 0 when the
 * file is neither (then only W = 1 applies). */
static size_t header_len(const uint8_t *b, size_t n)
{
    if (n >= 10 && memcmp(b, "\x93NUMPY", 6) == 0) {
        size_t h = b[6] == 1 ? 10 + (size_t)(b[8] | b[9] << 8)
                             : n >= 12 ? 12 + ((size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24)
                                       : n + 1;
        return h <= n ? h : 0;
    }
    if (n >= 9) {
        uint64_t h = 0;
        for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
        if (h <= n - 8 && b[8] == '{') return 8 + (size_t)h;
    }
    return 0;
}

/* dst = the W byte planes of src (n bytes; the last n % W bytes stay last). */
static void shuffle(uint8_t *dst, const uint8_t *src, size_t n, int w)
{
    size_t m = n / (size_t)w;
    for (int p = 0; p < w; p++)
        for (size_t i = 0; i < m; i++) dst[(size_t)p * m + i] = src[i * (size_t)w + (size_t)p];
    memcpy(dst + m * (size_t)w, src + m * (size_t)w, n - m * (size_t)w);
}

static void unshuffle(uint8_t *dst, const uint8_t *src, size_t n, int w)
{
    size_t m = n / (size_t)w;
    for (int p = 0; p < w; p++)
        for (size_t i = 0; i < m; i++) dst[i * (size_t)w + (size_t)p] = src[(size_t)p * m + i];
    memcpy(dst + m * (size_t)w, src + m * (size_t)w, n - m * (size_t)w);
}

/* W of a packed name (NAME.zst: 1, NAME.bsW.zst: W); 0 if the name is not packed.
 * *base_len = the length of NAME. */
static int packed_width(const char *name, size_t *base_len)
{
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".zst") != 0) return 0;
    n -= 4;
    *base_len = n;
    if (n >= 5 && name[n - 4] == '.' && name[n - 3] == 'b' && name[n - 2] == 's' &&
        (name[n - 1] == '2' || name[n - 1] == '4')) {
        *base_len = n - 4;
        return name[n - 1] - '0';
    }
    return 1;
}

/* Decompress a zstd stream of any number of frames (content size known or not). */
static uint8_t *zstd_decompress(const char *what, const uint8_t *z, size_t zn, size_t *out_n)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    if (!d) die("out of memory");
    unsigned long long want = ZSTD_getFrameContentSize(z, zn);
    size_t cap = want != ZSTD_CONTENTSIZE_ERROR && want != ZSTD_CONTENTSIZE_UNKNOWN ? (size_t)want + 1 : zn * 4 + 1024;
    uint8_t *out = xmalloc(cap);
    ZSTD_inBuffer in = {z, zn, 0};
    ZSTD_outBuffer ob = {out, cap, 0};
    for (;;) {
        if (ob.pos == ob.size) {
            cap *= 2;
            out = realloc(out, cap);
            if (!out) die("out of memory");
            ob.dst = out;
            ob.size = cap;
        }
        size_t r = ZSTD_decompressStream(d, &ob, &in);
        if (ZSTD_isError(r)) die("%s: %s", what, ZSTD_getErrorName(r));
        if (in.pos == in.size && r == 0) break;                         /* every frame complete */
        if (in.pos == in.size && ob.pos < ob.size) die("%s: truncated zstd data", what);
    }
    ZSTD_freeDCtx(d);
    *out_n = ob.pos;
    return out;
}

/* Unpack the contents of a packed file of width w. */
static uint8_t *unpack_buf(const char *what, const uint8_t *z, size_t zn, int w, size_t *out_n)
{
    size_t n;
    uint8_t *raw = zstd_decompress(what, z, zn, &n);
    if (w > 1) {
        size_t h = header_len(raw, n);
        if (h == 0) die("%s: .bs%d.zst but not a safetensors or npy file", what, w);
        uint8_t *out = xmalloc(n);
        memcpy(out, raw, h);
        unshuffle(out + h, raw + h, n - h, w);
        free(raw);
        raw = out;
    }
    *out_n = n;
    return raw;
}

static int cmd_unpack(const char *in, const char *out)
{
    size_t base, zn, n;
    int w = packed_width(in, &base);
    if (!w) die("%s: not a packed name (NAME.zst or NAME.bsW.zst)", in);
    uint8_t *z = read_file(in, &zn);
    uint8_t *raw = unpack_buf(in, z, zn, w, &n);
    write_file(out, raw, n);
    free(z);
    free(raw);
    return 0;
}

/* ---- pack ---------------------------------------------------------------- */

static uint8_t *pack_buf(const uint8_t *b, size_t n, int w, size_t *zn)
{
    const uint8_t *src = b;
    uint8_t *tmp = NULL;
    if (w > 1) {
        size_t h = header_len(b, n);
        tmp = xmalloc(n);
        memcpy(tmp, b, h);
        shuffle(tmp + h, b + h, n - h, w);
        src = tmp;
    }
    size_t cap = ZSTD_compressBound(n);
    uint8_t *z = xmalloc(cap);
    size_t r = ZSTD_compress(z, cap, src, n, 19);
    if (ZSTD_isError(r)) die("zstd: %s", ZSTD_getErrorName(r));
    free(tmp);
    *zn = r;
    return z;
}

static int cmd_pack(int argc, char **argv)
{
    int keep = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--keep") == 0) {
            keep = 1;
            continue;
        }
        const char *path = argv[i];
        size_t base;
        if (packed_width(path, &base)) die("%s is packed already", path);
        size_t n;
        uint8_t *b = read_file(path, &n);
        int ws[3] = {1, 2, 4}, nw = header_len(b, n) ? 3 : 1, best = 0;
        uint8_t *bz = NULL;
        size_t bzn = 0;
        for (int k = 0; k < nw; k++) {
            size_t zn;
            uint8_t *z = pack_buf(b, n, ws[k], &zn);
            if (!bz || zn < bzn) {
                free(bz);
                bz = z;
                bzn = zn;
                best = ws[k];
            } else {
                free(z);
            }
        }
        size_t rn;
        uint8_t *back = unpack_buf(path, bz, bzn, best, &rn);
        if (rn != n || memcmp(back, b, n) != 0) die("%s: does not unpack to itself (W=%d)", path, best);
        free(back);
        char out[4096];
        const char *forms[3] = {".zst", ".bs2.zst", ".bs4.zst"};
        for (int k = 0; k < 3; k++) { /* no stale packed form left beside the new one */
            snprintf(out, sizeof out, "%s%s", path, forms[k]);
            unlink(out);
        }
        snprintf(out, sizeof out, "%s%s", path, best == 1 ? ".zst" : best == 2 ? ".bs2.zst" : ".bs4.zst");
        write_file(out, bz, bzn);
        printf("%s: %zu -> %zu bytes (%.1f %%)\n", out, n, bzn, 100.0 * (double)bzn / (double)n);
        if (!keep && unlink(path) != 0) die("cannot remove %s: %s", path, strerror(errno));
        free(bz);
        free(b);
    }
    return 0;
}

/* ---- tree ---------------------------------------------------------------- */

typedef struct {
    char **v;
    size_t n, cap;
} strlist;

static void sl_add(strlist *l, const char *s)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) die("out of memory");
    }
    l->v[l->n++] = xstrdup(s);
}

static int sl_has(const strlist *l, const char *s)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i], s) == 0) return 1;
    return 0;
}

static int scmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int mkdir_p(const char *path)
{
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) die("cannot create %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) die("cannot create %s: %s", p, strerror(errno));
    free(p);
    return 0;
}

/* Is dst a regular file carrying src's mtime and the given size (SIZE_MAX: unknown)? */
static int up_to_date(const char *dst, const struct stat *src, size_t size)
{
    struct stat d;
    if (lstat(dst, &d) != 0 || !S_ISREG(d.st_mode)) return 0;
    if (size != SIZE_MAX && (size_t)d.st_size != size) return 0;
    return d.st_mtim.tv_sec == src->st_mtim.tv_sec && d.st_mtim.tv_nsec == src->st_mtim.tv_nsec;
}

static void set_mtime(const char *path, const struct stat *src)
{
    struct timespec ts[2] = {src->st_atim, src->st_mtim};
    if (utimensat(AT_FDCWD, path, ts, 0) != 0) die("cannot set the time of %s: %s", path, strerror(errno));
}

/* Mirror SRC/rel into DST/rel; every output path (relative) goes into made. */
static void tree_dir(const char *src, const char *dst, const char *rel, strlist *made, int *n_unpacked)
{
    char *sdir = rel[0] ? join(src, rel) : xstrdup(src);
    char *ddir = rel[0] ? join(dst, rel) : xstrdup(dst);
    mkdir_p(ddir);
    DIR *d = opendir(sdir);
    if (!d) die("cannot open %s: %s", sdir, strerror(errno));
    strlist names = {0};
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        sl_add(&names, e->d_name);
    }
    closedir(d);
    qsort(names.v, names.n, sizeof *names.v, scmp);
    for (size_t i = 0; i < names.n; i++) {
        const char *name = names.v[i];
        char *sp = join(sdir, name);
        char *r = rel[0] ? join(rel, name) : xstrdup(name);
        struct stat st;
        if (stat(sp, &st) != 0) die("cannot stat %s: %s", sp, strerror(errno));
        if (S_ISDIR(st.st_mode)) {
            sl_add(made, r);
            tree_dir(src, dst, r, made, n_unpacked);
        } else if (S_ISREG(st.st_mode)) {
            size_t base;
            int w = packed_width(name, &base);
            char *out_rel = xstrdup(r);
            if (w) out_rel[strlen(r) - (strlen(name) - base)] = 0;
            if (sl_has(made, out_rel)) die("%s is in %s twice (plain and packed, or packed twice)", out_rel, src);
            sl_add(made, out_rel);
            char *dp = join(dst, out_rel);
            if (w) {
                /* the unpacked size is not known before unpacking: compare the mtime only */
                if (!up_to_date(dp, &st, SIZE_MAX)) {
                    size_t zn, n;
                    uint8_t *z = read_file(sp, &zn);
                    uint8_t *raw = unpack_buf(sp, z, zn, w, &n);
                    unlink(dp);
                    write_file(dp, raw, n);
                    set_mtime(dp, &st);
                    free(z);
                    free(raw);
                    ++*n_unpacked;
                }
            } else if (!up_to_date(dp, &st, (size_t)st.st_size)) {
                size_t n;
                uint8_t *b = read_file(sp, &n);
                unlink(dp);
                write_file(dp, b, n);
                set_mtime(dp, &st);
                free(b);
            }
            free(dp);
            free(out_rel);
        } /* sockets, fifos: not test data, not copied */
        free(sp);
        free(r);
    }
    for (size_t i = 0; i < names.n; i++) free(names.v[i]);
    free(names.v);
    free(sdir);
    free(ddir);
}

/* Remove from DST/rel whatever the mirror did not make. */
static void prune(const char *dst, const char *rel, const strlist *made)
{
    char *ddir = rel[0] ? join(dst, rel) : xstrdup(dst);
    DIR *d = opendir(ddir);
    if (!d) die("cannot open %s: %s", ddir, strerror(errno));
    strlist names = {0};
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!rel[0] && strcmp(e->d_name, MARKER) == 0) continue;
        sl_add(&names, e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < names.n; i++) {
        char *r = rel[0] ? join(rel, names.v[i]) : xstrdup(names.v[i]);
        char *p = join(dst, r);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            prune(dst, r, made);
            if (!sl_has(made, r) && rmdir(p) != 0) die("cannot remove %s: %s", p, strerror(errno));
        } else if (!sl_has(made, r)) {
            if (unlink(p) != 0) die("cannot remove %s: %s", p, strerror(errno));
        }
        free(p);
        free(r);
        free(names.v[i]);
    }
    free(names.v);
    free(ddir);
}

/* The absolute path of a path whose last components may not exist yet: the
 * longest existing prefix resolved by realpath, the rest appended as given. */
static char *resolve_missing(const char *path)
{
    char *p = xstrdup(path);
    size_t n = strlen(p);
    for (;;) {
        char *r = realpath(n ? p : ".", NULL);
        if (r) {
            char *out = n < strlen(path) ? join(r, path + n + (path[n] == '/')) : xstrdup(r);
            free(r);
            free(p);
            return out;
        }
        while (n > 0 && p[n - 1] != '/') n--; /* drop the last component */
        while (n > 0 && p[n - 1] == '/') n--;
        p[n] = 0;
        if (n == 0 && path[0] == '/') die("%s: %s", path, strerror(errno));
    }
}

static int cmd_tree(const char *src_arg, const char *dst, const char *stamp)
{
    char *src = realpath(src_arg, NULL);
    if (!src) die("%s: %s", src_arg, strerror(errno));
    char *rdst = resolve_missing(dst);
    size_t ns = strlen(src);
    if (strncmp(rdst, src, ns) == 0 && (rdst[ns] == 0 || rdst[ns] == '/')) die("%s is inside %s", dst, src_arg);
    mkdir_p(dst);
    char *marker = join(dst, MARKER);
    DIR *d = opendir(dst);
    int empty = 1;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = 0;
    if (d) closedir(d);
    if (!empty && access(marker, F_OK) != 0) die("%s is not empty and was not made by datapack; not touching it", dst);
    write_file(marker, "made by tests/datapack.c (datapack tree)\n", 41);
    strlist made = {0};
    int n_unpacked = 0;
    tree_dir(src, dst, "", &made, &n_unpacked);
    prune(dst, "", &made);
    write_file(stamp, "", 0);
    if (n_unpacked) printf("datapack: %s: %d packed files unpacked\n", dst, n_unpacked);
    for (size_t i = 0; i < made.n; i++) free(made.v[i]);
    free(made.v);
    free(marker);
    free(src);
    free(rdst);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "pack") == 0) return cmd_pack(argc - 2, argv + 2);
    if (argc == 4 && strcmp(argv[1], "unpack") == 0) return cmd_unpack(argv[2], argv[3]);
    if (argc == 5 && strcmp(argv[1], "tree") == 0) return cmd_tree(argv[2], argv[3], argv[4]);
    fprintf(stderr, "usage: datapack pack [--keep] FILE... | unpack PACKED OUT | tree SRC DST STAMP\n"
                    "(tests/datapack.c says how tests/data's large files are stored)\n");
    return 2;
}
