/* common/file.c — see file.h. The sparq_io_* wrappers are the only callers of
 * the system calls they wrap, so the fault hook sits in one place each. */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fault.h"

/* --- the system calls -------------------------------------------------------------- */

/* Nonzero (and errno set) when an injected fault fails this operation. */
static int faulted(int natural_errno)
{
    const int e = sparq_fault_io(natural_errno);
    if (e) errno = e;
    return e;
}

int sparq_io_open(const char *path, int flags, mode_t mode)
{
    if (faulted((flags & (O_WRONLY | O_RDWR | O_CREAT)) ? ENOSPC : EIO)) return -1;
    return open(path, flags, mode);
}

ssize_t sparq_io_read(int fd, void *buf, size_t n)
{
    if (faulted(EIO)) return -1;
    return read(fd, buf, n);
}

ssize_t sparq_io_pread(int fd, void *buf, size_t n, uint64_t off)
{
    if (faulted(EIO)) return -1;
    return pread(fd, buf, n, (off_t)off);
}

int sparq_io_rename(const char *from, const char *to)
{
    if (faulted(ENOSPC)) return -1;
    return rename(from, to);
}

void *sparq_io_mmap(int fd, size_t n, int flags)
{
    if (faulted(EIO)) return MAP_FAILED;
    return mmap(NULL, n, PROT_READ, flags, fd, 0);
}

static FILE *io_fopen_write(const char *path)
{
    if (faulted(ENOSPC)) return NULL;
    return fopen(path, "wbe");
}

static size_t io_fwrite(const void *buf, size_t n, FILE *fp)
{
    if (faulted(ENOSPC)) return 0;
    return fwrite(buf, 1, n, fp);
}

/* fflush + fsync: where a full disk or a failing device shows up. */
static int io_flush_sync(FILE *fp)
{
    if (faulted(ENOSPC)) return -1;
    return fflush(fp) != 0 || fsync(fileno(fp)) != 0 ? -1 : 0;
}

static int io_mkdir(const char *path, mode_t mode)
{
    if (faulted(ENOSPC)) return -1;
    return mkdir(path, mode);
}

sparq_status sparq_pread_full(int fd, void *buf, uint64_t n, uint64_t off, const char *path)
{
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = sparq_io_pread(fd, (uint8_t *)buf + got, (size_t)(n - got), off + got);
        if (r < 0 && errno == EINTR) continue;
        RETURN_IF(r <= 0, SPARQ_E_IO, "%s: read of %llu bytes at %llu failed: %s", path, (unsigned long long)n,
                  (unsigned long long)off, r < 0 ? strerror(errno) : "unexpected end of file (file shrank?)");
        got += (uint64_t)r;
    }
    return SPARQ_OK;
}

/* --- reading ----------------------------------------------------------------------- */

static const char *file_kind(mode_t m)
{
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
}

sparq_status sparq_open_regular(const char *path, int *fd_out, uint64_t *size)
{
    *fd_out = -1;
    if (size) *size = 0;
    /* O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; it does
     * nothing to a regular file, and is cleared below anyway */
    int fd = sparq_io_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0);
    RETURN_IF(fd < 0, SPARQ_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sparq_err(SPARQ_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sparq_err(SPARQ_E_IO, "%s: not a regular file (%s); give a file", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size) *size = (uint64_t)st.st_size;
    return SPARQ_OK;
}

sparq_status sparq_file_read_all(const char *path, size_t max_size, char **out, size_t *out_len)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    int fd;
    uint64_t fsize;
    FORWARD_IF(sparq_open_regular(path, &fd, &fsize));
    if (max_size && fsize > max_size) {
        close(fd);
        return sparq_err(SPARQ_E_RANGE, "%s: file is %llu bytes, more than the %zu allowed", path,
                         (unsigned long long)fsize, max_size);
    }
    size_t n = (size_t)fsize;
    char *buf = sparq_malloc(n + 1);
    if (!buf) {
        close(fd);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = sparq_io_read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            sparq_free(buf);
            return sparq_err(SPARQ_E_IO, "%s: read failed at byte %zu: %s", path, got,
                             r < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (out_len) *out_len = n;
    return SPARQ_OK;
}

sparq_status sparq_mmap_open(sparq_mmap *m, const char *path)
{
    m->data = NULL;
    m->size = 0;
    int fd;
    uint64_t size;
    FORWARD_IF(sparq_open_regular(path, &fd, &size));
    if (size == 0) {
        close(fd);
        return SPARQ_OK;
    }
    void *p = sparq_io_mmap(fd, (size_t)size, MAP_PRIVATE);
    int e = errno;
    close(fd);
    RETURN_IF(p == MAP_FAILED, SPARQ_E_IO, "%s: mmap failed: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)size;
    return SPARQ_OK;
}

void sparq_mmap_close(sparq_mmap *m)
{
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

/* --- writing ----------------------------------------------------------------------- */

sparq_status sparq_atomic_open(sparq_atomic_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    size_t n = strlen(path) + 32;
    f->path = sparq_strdup(path);
    f->tmp_path = sparq_malloc(n);
    if (!f->path || !f->tmp_path) {
        sparq_free(f->path);
        sparq_free(f->tmp_path);
        memset(f, 0, sizeof *f);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->fp = io_fopen_write(f->tmp_path);
    if (!f->fp) {
        int e = errno;
        sparq_free(f->path);
        sparq_free(f->tmp_path);
        memset(f, 0, sizeof *f);
        return sparq_err(SPARQ_E_IO, "%s: cannot create temporary file: %s", path, strerror(e));
    }
    return SPARQ_OK;
}

sparq_status sparq_atomic_write(sparq_atomic_file *f, const void *buf, size_t n)
{
    RETURN_IF(!f->fp, SPARQ_E_STATE, "atomic write on a closed file");
    if (n && io_fwrite(buf, n, f->fp) != n)
        return sparq_err(SPARQ_E_IO, "%s: write failed: %s", f->path, strerror(errno));
    return SPARQ_OK;
}

sparq_status sparq_atomic_skip(sparq_atomic_file *f, uint64_t n)
{
    RETURN_IF(!f->fp, SPARQ_E_STATE, "atomic skip on a closed file");
    if (!n) return SPARQ_OK;
    /* flush what is buffered, then extend the file (ftruncate leaves a hole) and move past it */
    off_t at;
    if (fflush(f->fp) != 0 || (at = ftello(f->fp)) < 0 || n > (uint64_t)INT64_MAX - (uint64_t)at ||
        faulted(ENOSPC) || ftruncate(fileno(f->fp), at + (off_t)n) != 0 || fseeko(f->fp, at + (off_t)n, SEEK_SET) != 0)
        return sparq_err(SPARQ_E_IO, "%s: cannot extend by %llu bytes: %s", f->path, (unsigned long long)n,
                         strerror(errno));
    return SPARQ_OK;
}

static void atomic_release(sparq_atomic_file *f)
{
    sparq_free(f->path);
    sparq_free(f->tmp_path);
    memset(f, 0, sizeof *f);
}

sparq_status sparq_atomic_commit(sparq_atomic_file *f)
{
    RETURN_IF(!f->fp, SPARQ_E_STATE, "atomic commit on a closed file");
    sparq_status st = SPARQ_OK;
    if (io_flush_sync(f->fp) != 0)
        st = sparq_err(SPARQ_E_IO, "%s: flush failed: %s", f->path, strerror(errno));
    if (fclose(f->fp) != 0 && st == SPARQ_OK)
        st = sparq_err(SPARQ_E_IO, "%s: close failed: %s", f->path, strerror(errno));
    f->fp = NULL;
    if (st == SPARQ_OK && sparq_io_rename(f->tmp_path, f->path) != 0)
        st = sparq_err(SPARQ_E_IO, "%s: rename from %s failed: %s", f->path, f->tmp_path,
                       strerror(errno));
    if (st != SPARQ_OK) unlink(f->tmp_path);
    atomic_release(f);
    return st;
}

void sparq_atomic_abort(sparq_atomic_file *f)
{
    if (f->fp) fclose(f->fp);
    if (f->tmp_path) unlink(f->tmp_path);
    atomic_release(f);
}

sparq_status sparq_file_write_atomic(const char *path, const void *buf, size_t n)
{
    sparq_atomic_file f;
    FORWARD_IF(sparq_atomic_open(&f, path));
    sparq_status st = sparq_atomic_write(&f, buf, n);
    if (st != SPARQ_OK) {
        sparq_atomic_abort(&f);
        return st;
    }
    return sparq_atomic_commit(&f);
}

/* --- paths ------------------------------------------------------------------------- */

int sparq_path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int sparq_path_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

sparq_status sparq_mkdirs(const char *path)
{
    char *p = sparq_strdup(path);
    RETURN_IF(!p, SPARQ_E_NOMEM, "%s: out of memory", path);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (io_mkdir(p, 0755) != 0 && errno != EEXIST) {
                int e = errno;
                sparq_status st = sparq_err(SPARQ_E_IO, "%s: cannot create directory: %s", p, strerror(e));
                sparq_free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    sparq_free(p);
    return SPARQ_OK;
}

char *sparq_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *r = sparq_malloc(a + b + 2);
    if (!r) return NULL;
    memcpy(r, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') r[o++] = '/';
    memcpy(r + o, name, b + 1);
    return r;
}
