/* tests/quantize/qtest.h — small helpers shared by the quantizer's tests
 * (test_driver.c, test_inputs.c, test_stream.c, test_v41.c): byte comparison of two
 * files, a private temporary directory and its removal, FP8 / FP4 encoders. */
#ifndef SPARQ_TESTS_QUANTIZE_QTEST_H
#define SPARQ_TESTS_QUANTIZE_QTEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <stdint.h>

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

/* Independent encoders / decoders (OCP FP8 E4M3FN, E2M1), written here from the format's
 * definition and not formats/weights.c's, so a test checks one against the other. */

static inline float e4m3_value(uint8_t c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return s ? -v : v;
}

static inline uint8_t e4m3_encode(float x)
{
    float a = fabsf(x);
    int best = 0;
    float bd = INFINITY;
    for (int c = 0; c < 0x7F; c++) { /* 0x7F is NaN */
        float d = fabsf(e4m3_value((uint8_t)c) - a);
        if (d < bd) bd = d, best = c;
    }
    return (uint8_t)(best | (x < 0 ? 0x80 : 0));
}

static const float k_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static inline uint8_t e2m1_encode(float x)
{
    float a = fabsf(x);
    int best = 0;
    for (int c = 1; c < 8; c++)
        if (fabsf(k_e2m1[c] - a) < fabsf(k_e2m1[best] - a)) best = c;
    return (uint8_t)(best | (x < 0 ? 8 : 0));
}

static inline float e2m1_value(uint8_t n) { return (n & 8) ? -k_e2m1[n & 7] : k_e2m1[n & 7]; }

#endif
