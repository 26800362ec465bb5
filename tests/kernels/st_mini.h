/* tests/kernels/st_mini.h — a deliberately tiny safetensors reader for the
 * trellis tests, so they depend only on the trellis code (the aarch64
 * cross-test compiles them without the rest of libsparq). It trusts its
 * input: it only ever reads the files in tests/data/exl3, whose headers are
 * compact JSON written by safetensors / tests/data/exl3/make_data.py. */
#ifndef SPARQ_TESTS_ST_MINI_H
#define SPARQ_TESTS_ST_MINI_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct st_mini {
    char *buf;      /* whole file */
    size_t size;
    char *header;   /* NUL-terminated copy of the JSON header */
    size_t data0;   /* offset of the data buffer */
} st_mini;

static inline int st_mini_open(st_mini *st, const char *path)
{
    memset(st, 0, sizeof *st);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    st->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    st->buf = malloc(st->size ? st->size : 1);
    if (!st->buf || fread(st->buf, 1, st->size, f) != st->size) {
        fclose(f);
        return -1;
    }
    fclose(f);
    uint64_t n;
    memcpy(&n, st->buf, 8);
    st->header = malloc(n + 1);
    memcpy(st->header, st->buf + 8, n);
    st->header[n] = 0;
    st->data0 = 8 + n;
    return 0;
}

static inline void st_mini_close(st_mini *st)
{
    free(st->buf);
    free(st->header);
    memset(st, 0, sizeof *st);
}

/* Data of tensor `name` (NULL if absent); *nbytes set. */
static inline const void *st_mini_get(const st_mini *st, const char *name, size_t *nbytes)
{
    char key[512];
    snprintf(key, sizeof key, "\"%s\":{", name);
    const char *p = strstr(st->header, key);
    if (!p) return NULL;
    const char *o = strstr(p, "\"data_offsets\":[");
    if (!o) return NULL;
    o += strlen("\"data_offsets\":[");
    unsigned long long a = strtoull(o, (char **)&o, 10);
    unsigned long long b = strtoull(o + 1, NULL, 10);
    if (nbytes) *nbytes = (size_t)(b - a);
    return st->buf + st->data0 + a;
}

/* Value of a __metadata__ string (copied into out); 0 on success. */
static inline int st_mini_meta(const st_mini *st, const char *key, char *out, size_t cap)
{
    char k[512];
    snprintf(k, sizeof k, "\"%s\":\"", key);
    const char *p = strstr(st->header, k);
    if (!p) return -1;
    p += strlen(k);
    const char *e = strchr(p, '"');
    if (!e || (size_t)(e - p) >= cap) return -1;
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = 0;
    return 0;
}

#endif
