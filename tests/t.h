/* tests/t.h — the tiny test harness every C test program uses.
 *
 *   static void test_x(void) { CHECK(1 + 1 == 2); CHECK_EQ_INT(a, b); }
 *   int main(void) { RUN(test_x); return t_summary(); }
 *
 * Each CHECK counts once; failures print file:line and the values. The
 * program ends with the plain line "N passed, N failed" and exits non-zero if
 * anything failed. T_SKIP("why") exits 77, which meson reports as skipped.
 * Test data lives in the source tree; tests find it through the SPARQ_TEST_DATA
 * environment variable that meson sets (t_data_path()). */
#ifndef SPARQ_TESTS_T_H
#define SPARQ_TESTS_T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_pass_, t_fail_;
static const char *t_current_ = "";

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (cond) t_pass_++;                                                            \
        else {                                                                          \
            t_fail_++;                                                                  \
            fprintf(stderr, "FAIL %s:%d [%s]: %s\n", __FILE__, __LINE__, t_current_, #cond); \
        }                                                                               \
    } while (0)

#define CHECK_MSG(cond, ...)                                                            \
    do {                                                                                \
        if (cond) t_pass_++;                                                            \
        else {                                                                          \
            t_fail_++;                                                                  \
            fprintf(stderr, "FAIL %s:%d [%s]: %s: ", __FILE__, __LINE__, t_current_, #cond); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
        }                                                                               \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                              \
    do {                                                                                \
        long long ta_ = (long long)(a), tb_ = (long long)(b);                           \
        CHECK_MSG(ta_ == tb_, "%s = %lld, %s = %lld", #a, ta_, #b, tb_);                \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                           \
    do {                                                                                \
        double ta_ = (double)(a), tb_ = (double)(b);                                    \
        CHECK_MSG(fabs(ta_ - tb_) <= (tol), "%s = %.9g, %s = %.9g (tol %g)", #a, ta_, #b, tb_, \
                  (double)(tol));                                                       \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                 \
    do {                                                                                \
        const char *th_ = (hay), *tn_ = (needle);                                       \
        CHECK_MSG(th_ && strstr(th_, tn_), "'%s' does not contain '%s'", th_ ? th_ : "(null)", tn_); \
    } while (0)

#define RUN(fn)                                                                         \
    do {                                                                                \
        t_current_ = #fn;                                                               \
        int f0_ = t_fail_;                                                              \
        fn();                                                                           \
        fprintf(stderr, "%s %s\n", t_fail_ == f0_ ? "ok  " : "FAIL", #fn);              \
    } while (0)

#define T_SKIP(...)                                                                     \
    do {                                                                                \
        fprintf(stdout, "SKIP: ");                                                      \
        fprintf(stdout, __VA_ARGS__);                                                   \
        fputc('\n', stdout);                                                            \
        exit(77);                                                                       \
    } while (0)

static inline int t_summary(void)
{
    printf("%d passed, %d failed\n", t_pass_, t_fail_);
    return t_fail_ ? 1 : 0;
}

/* Path of a file of the test data (static buffer, valid until the next call):
 * under $SPARQ_TEST_DATA, which meson sets to BUILD/tests/data — tests/data
 * with its packed files unpacked (tests/datapack.c); without it, the copy in
 * build/ (a test run by hand from the repository root). */
static inline const char *t_data_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("SPARQ_TEST_DATA");
    if (!root) root = "build/tests/data";
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

/* A fresh temporary directory for this test program (created once). */
static inline const char *t_tmpdir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/sparq-test-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            exit(2);
        }
    }
    return dir;
}

#endif
