/* tests/common/test_common.c — status messages, allocation fault injection,
 * thread pool, atomic files, progress formatting. */
#include <stdatomic.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/threadpool.h"
#include "t.h"

static sparq_status fails_in_parser(const char *path)
{
    RETURN_IF(1, SPARQ_E_FORMAT, "tensor 'w': expected F32");
    (void)path;
    return SPARQ_OK;
}

static void test_status(void)
{
    CHECK_EQ_INT(SPARQ_OK, 0);
    CHECK(!strcmp(sparq_status_str(SPARQ_E_FORMAT), "format error"));
    CHECK(!strcmp(sparq_status_str((sparq_status)999), "unknown status"));
    for (int s = 0; s < SPARQ_STATUS_COUNT_; s++) CHECK(sparq_status_str((sparq_status)s)[0] != 0);
    sparq_status st = fails_in_parser("x");
    CHECK_EQ_INT(st, SPARQ_E_FORMAT);
    sparq_err_context(st, "%s", "model.safetensors");
    CHECK(!strcmp(sparq_errmsg(), "model.safetensors: tensor 'w': expected F32"));
    sparq_err_clear();
    CHECK(sparq_errmsg()[0] == 0);
}

static void test_alloc_faults(void)
{
    void *p = sparq_malloc(10);
    CHECK(p != NULL);
    sparq_free(p);
    sparq_alloc_fail_at(2, false);
    void *a = sparq_malloc(8), *b = sparq_malloc(8), *c = sparq_malloc(8);
    CHECK(a != NULL);
    CHECK(b == NULL);
    CHECK(c != NULL);
    sparq_free(a);
    sparq_free(c);
    sparq_alloc_fail_at(1, true);
    CHECK(sparq_malloc(1) == NULL);
    CHECK(sparq_calloc(1, 1) == NULL);
    sparq_alloc_fail_at(0, false);
    CHECK(sparq_calloc(SIZE_MAX / 2, 4) == NULL); /* overflow */
    void *al = sparq_aligned_alloc(4096, 100);
    CHECK(al && ((uintptr_t)al & 4095) == 0);
    sparq_aligned_free(al);
    uint64_t r;
    CHECK(!sparq_mul_u64(UINT64_MAX / 2, 3, &r));
    CHECK(sparq_mul_u64(1u << 20, 1u << 20, &r) && r == (1ull << 40));
    CHECK(!sparq_add_u64(UINT64_MAX, 1, &r));
}

typedef struct {
    atomic_long sum;
    atomic_int seen[1000];
    int nthreads;
    atomic_int bad_tid;
} pool_ctx;

static void pool_item(void *vctx, size_t i, int tid)
{
    pool_ctx *c = vctx;
    atomic_fetch_add(&c->sum, (long)i);
    atomic_fetch_add(&c->seen[i], 1);
    if (tid < 0 || tid >= c->nthreads) atomic_store(&c->bad_tid, 1);
}

static void test_pool(void)
{
    for (int nt = 1; nt <= 4; nt++) {
        sparq_pool *pool;
        CHECK_EQ_INT(sparq_pool_create(&pool, nt), SPARQ_OK);
        CHECK_EQ_INT(sparq_pool_size(pool), nt);
        for (int rep = 0; rep < 20; rep++) {
            static pool_ctx c;
            memset(&c, 0, sizeof c);
            c.nthreads = nt;
            sparq_pool_for(pool, 1000, pool_item, &c);
            CHECK_EQ_INT(atomic_load(&c.sum), 999 * 1000 / 2);
            int once = 1;
            for (int i = 0; i < 1000; i++) once &= atomic_load(&c.seen[i]) == 1;
            CHECK(once);
            CHECK(!atomic_load(&c.bad_tid));
        }
        sparq_pool_free(pool);
    }
    CHECK(sparq_cpu_count() >= 1);
}

static void test_atomic_file(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/out.bin", t_tmpdir());
    sparq_atomic_file f;
    CHECK_EQ_INT(sparq_atomic_open(&f, path), SPARQ_OK);
    CHECK_EQ_INT(sparq_atomic_write(&f, "hello", 5), SPARQ_OK);
    CHECK(!sparq_path_exists(path)); /* not visible before commit */
    CHECK_EQ_INT(sparq_atomic_commit(&f), SPARQ_OK);
    char *buf;
    size_t n;
    CHECK_EQ_INT(sparq_file_read_all(path, 0, &buf, &n), SPARQ_OK);
    CHECK(n == 5 && !memcmp(buf, "hello", 5));
    sparq_free(buf);
    /* abort leaves the old file untouched and no temporary behind */
    CHECK_EQ_INT(sparq_atomic_open(&f, path), SPARQ_OK);
    CHECK_EQ_INT(sparq_atomic_write(&f, "XX", 2), SPARQ_OK);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", f.tmp_path);
    sparq_atomic_abort(&f);
    CHECK(!sparq_path_exists(tmp));
    CHECK_EQ_INT(sparq_file_read_all(path, 0, &buf, &n), SPARQ_OK);
    CHECK(n == 5);
    sparq_free(buf);
    CHECK_EQ_INT(sparq_file_read_all(path, 3, &buf, &n), SPARQ_E_RANGE);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/nope", t_tmpdir());
    CHECK_EQ_INT(sparq_file_read_all(missing, 0, &buf, &n), SPARQ_E_IO);
    CHECK_STR_CONTAINS(sparq_errmsg(), "nope");
    sparq_mmap m;
    CHECK_EQ_INT(sparq_mmap_open(&m, path), SPARQ_OK);
    CHECK(m.size == 5 && m.data[0] == 'h');
    sparq_mmap_close(&m);
    char deep[600];
    snprintf(deep, sizeof deep, "%s/a/b/c", t_tmpdir());
    CHECK_EQ_INT(sparq_mkdirs(deep), SPARQ_OK);
    CHECK(sparq_path_is_dir(deep));
    char *j = sparq_path_join("a/", "b");
    CHECK(!strcmp(j, "a/b"));
    sparq_free(j);
}

static void test_progress_format(void)
{
    char b[32];
    sparq_format_duration(b, sizeof b, 3725);
    CHECK(!strcmp(b, "1h02m"));
    sparq_format_duration(b, sizeof b, 185);
    CHECK(!strcmp(b, "3m05s"));
    sparq_format_duration(b, sizeof b, -1);
    CHECK(!strcmp(b, "--"));
    sparq_format_bytes(b, sizeof b, 1.5e9);
    CHECK(!strcmp(b, "1.50 GB"));
    /* in a test (stderr not a tty, SPARQ_NO_PROGRESS set) nothing is drawn */
    sparq_progress p;
    sparq_progress_begin(&p, "x", 10, SPARQ_PROGRESS_ITEMS);
    CHECK(!p.active);
    sparq_progress_add(&p, 5);
    CHECK_EQ_INT(atomic_load(&p.done), 5);
    sparq_progress_end(&p);
}

int main(void)
{
    RUN(test_status);
    RUN(test_alloc_faults);
    RUN(test_pool);
    RUN(test_atomic_file);
    RUN(test_progress_format);
    return t_summary();
}
