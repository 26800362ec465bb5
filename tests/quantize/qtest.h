/* tests/quantize/qtest.h — small helpers shared by the quantizer's tests
 * (test_driver.c, test_inputs.c, test_stream.c): byte comparison of two
 * files, a private temporary directory and its removal. */
#ifndef SPARQ_TESTS_QUANTIZE_QTEST_H
#define SPARQ_TESTS_QUANTIZE_QTEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"

/* True when both files can be read and hold the same bytes. */
static inline bool qt_files_equal(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool eq = sparq_file_read_all(a, 0, &x, &nx) == SPARQ_OK && sparq_file_read_all(b, 0, &y, &ny) == SPARQ_OK &&
              nx == ny && memcmp(x, y, nx) == 0;
    sparq_free(x);
    sparq_free(y);
    return eq;
}

/* Create "$TMPDIR/<prefix>-XXXXXX" (TMPDIR default /tmp) into buf. */
static inline bool qt_tmpdir(char *buf, size_t size, const char *prefix)
{
    const char *t = getenv("TMPDIR");
    snprintf(buf, size, "%s/%s-XXXXXX", t ? t : "/tmp", prefix);
    return mkdtemp(buf) != NULL;
}

/* rm -rf dir (a directory qt_tmpdir made). */
static inline void qt_rmtree(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

#endif
