/* tests/npy.h — a tiny header-only reader of NumPy .npy files for tests.
 *
 * Supports what the golden data uses: format version 1.x/2.x/3.x,
 * little-endian '<f4', '<f2' (widened to fp32 on load, so callers always
 * see 4-byte floats), '<i4', '<i8', '<u4' (and '|i1'/'|u1'), C order
 * (fortran_order False). Anything else fails with a message on stderr, so a
 * test never silently reads garbage.
 *
 *   npy_array a;
 *   if (npy_load(t_data_path("exl3-model/ids.npy"), &a) != 0) ...;
 *   // a.dtype == 'f' / 'i', a.itemsize, a.ndim, a.shape[], a.count, a.data
 *   npy_free(&a);
 */
#ifndef SPARQ_TESTS_NPY_H
#define SPARQ_TESTS_NPY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"

#define NPY_MAX_DIMS 8

typedef struct npy_array {
    char kind;        /* 'f' float, 'i' signed int, 'u' unsigned int */
    int itemsize;     /* bytes per element */
    int ndim;
    uint64_t shape[NPY_MAX_DIMS];
    uint64_t count;   /* product of shape */
    void *data;       /* count * itemsize bytes, malloc'ed */
} npy_array;

static inline void npy_free(npy_array *a)
{
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* 0 on success; -1 with a message on stderr otherwise. */
static inline int npy_load(const char *path, npy_array *a)
{
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "npy: %s: cannot open\n", path);
        return -1;
    }
    unsigned char pre[12];
    char *hdr = NULL;
    int ok = 0;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "npy: %s: not a .npy file\n", path);
        goto out;
    }
    uint32_t hlen;
    if (pre[6] == 1) {
        hlen = (uint32_t)pre[8] | ((uint32_t)pre[9] << 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) goto trunc;
        hlen = (uint32_t)pre[8] | ((uint32_t)pre[9] << 8) | ((uint32_t)pre[10] << 16) | ((uint32_t)pre[11] << 24);
    } else {
        fprintf(stderr, "npy: %s: unsupported format version %d\n", path, pre[6]);
        goto out;
    }
    if (hlen > (1u << 20)) {
        fprintf(stderr, "npy: %s: header of %u bytes is too large\n", path, hlen);
        goto out;
    }
    hdr = calloc(1, hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) goto trunc;
    const char *d = strstr(hdr, "'descr':");
    const char *fo = strstr(hdr, "'fortran_order':");
    const char *sh = strstr(hdr, "'shape':");
    if (!d || !fo || !sh) {
        fprintf(stderr, "npy: %s: header lacks descr/fortran_order/shape\n", path);
        goto out;
    }
    d = strchr(d + 8, '\'');
    if (!d) goto bad_descr;
    d++;
    int half = 0;
    if (!strncmp(d, "<f4'", 4)) a->kind = 'f', a->itemsize = 4;
    else if (!strncmp(d, "<f2'", 4)) a->kind = 'f', a->itemsize = 4, half = 1;
    else if (!strncmp(d, "<i4'", 4)) a->kind = 'i', a->itemsize = 4;
    else if (!strncmp(d, "<i8'", 4)) a->kind = 'i', a->itemsize = 8;
    else if (!strncmp(d, "<u4'", 4)) a->kind = 'u', a->itemsize = 4;
    else if (!strncmp(d, "|i1'", 4)) a->kind = 'i', a->itemsize = 1;
    else if (!strncmp(d, "|u1'", 4)) a->kind = 'u', a->itemsize = 1;
    else goto bad_descr;
    fo += 16;
    while (*fo == ' ') fo++;
    if (strncmp(fo, "False", 5) != 0) {
        fprintf(stderr, "npy: %s: Fortran order is not supported\n", path);
        goto out;
    }
    const char *p = strchr(sh, '(');
    if (!p) goto bad_shape;
    p++;
    a->count = 1;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || a->ndim == NPY_MAX_DIMS) goto bad_shape;
        a->shape[a->ndim++] = v;
        a->count *= v;
        p = end;
    }
    size_t bytes = (size_t)a->count * (size_t)a->itemsize;
    a->data = malloc(bytes ? bytes : 1);
    if (!a->data) goto trunc;
    if (half) {
        /* read the fp16 values into the upper half of the buffer, widen in place */
        uint16_t *h = (uint16_t *)((char *)a->data + bytes / 2);
        if (fread(h, 2, (size_t)a->count, f) != (size_t)a->count) goto trunc;
        float *o = a->data;
        for (uint64_t i = 0; i < a->count; i++) o[i] = sparq_f16_to_f32(h[i]);
    } else if (fread(a->data, 1, bytes, f) != bytes)
        goto trunc;
    ok = 1;
    goto out;
bad_descr:
    fprintf(stderr, "npy: %s: unsupported dtype (want <f4, <f2, <i4, <i8, |i1 or |u1)\n", path);
    goto out;
bad_shape:
    fprintf(stderr, "npy: %s: cannot read the shape\n", path);
    goto out;
trunc:
    fprintf(stderr, "npy: %s: truncated\n", path);
out:
    free(hdr);
    fclose(f);
    if (!ok) {
        free(a->data);
        memset(a, 0, sizeof *a);
        return -1;
    }
    return 0;
}

#endif
