/* tests/quantize/exl3_cases.h — reading exllamav3's golden linears
 * (tests/data/exl3/cases.safetensors and quant-cases.safetensors: weights,
 * Hessian sums, counts and exllamav3's outputs), shared by the CPU quantizer's
 * golden test (test_ldlq.c) and the GPU one's (tests/gpu/test_ldlq_cuda.c).
 * The including file opens g_cases and g_extra. */
#ifndef SPARQ_TESTS_QUANTIZE_EXL3_CASES_H
#define SPARQ_TESTS_QUANTIZE_EXL3_CASES_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "formats/safetensors.h"
#include "kernels/cpu/trellis.h"

static sf_model *g_cases, *g_extra;

static const sf_tensor *find2(const char *name)
{
    const sf_tensor *t = sf_find(g_cases, name);
    return t ? t : sf_find(g_extra, name);
}

/* A symmetric k×k matrix stored as its upper triangle (row-major, diagonal
 * included: k(k+1)/2 values) under "<name>_upper", expanded to full. The
 * 768×768 golden Hessian is kept that way to save 1.2 MB of test data. */
static float *load_sym_upper(const char *name, uint64_t *numel)
{
    char key[160];
    snprintf(key, sizeof key, "%s_upper", name);
    const sf_tensor *t = find2(key);
    if (!t || t->ndim != 1) return NULL;
    uint64_t k = 0;
    while (k * (k + 1) / 2 < t->numel) k++;
    if (k * (k + 1) / 2 != t->numel) return NULL;
    float *tri = sparq_malloc(t->numel * sizeof(float)), *v = sparq_malloc(k * k * sizeof(float));
    if (!tri || !v || sf_to_f32(t, tri) != SPARQ_OK) {
        sparq_free(tri), sparq_free(v);
        return NULL;
    }
    const float *p = tri;
    for (uint64_t i = 0; i < k; i++)
        for (uint64_t j = i; j < k; j++, p++) v[i * k + j] = v[j * k + i] = *p;
    sparq_free(tri);
    if (numel) *numel = k * k;
    return v;
}

static float *load_f32(const char *name, uint64_t *numel)
{
    const sf_tensor *t = find2(name);
    if (!t) return load_sym_upper(name, numel);
    float *v = sparq_malloc(t->numel * sizeof(float));
    if (v && sf_to_f32(t, v) != SPARQ_OK) {
        sparq_free(v);
        return NULL;
    }
    if (numel) *numel = t->numel;
    return v;
}

/* Golden case c ("KxN.K<bits>.<codebook>", an entry of the "cases" list): its shape, bits,
 * codebook, the weight w (k×n) and the MEAN Hessian h (k×k: the stored sum ÷ the count), both
 * allocated. False (nothing allocated) when the name does not parse or data is missing. */
static bool exl3_case_load(const char *c, int *k, int *n, int *K, trellis_codebook *cb, float **w, float **h)
{
    char cbname[16] = {0}, name[128];
    *w = *h = NULL;
    if (sscanf(c, "%dx%d.K%d.%15s", k, n, K, cbname) != 4 || !trellis_cb_parse(cbname, cb)) return false;
    snprintf(name, sizeof name, "%dx%d.weight", *k, *n);
    *w = load_f32(name, NULL);
    snprintf(name, sizeof name, "%dx%d.hessian_sum", *k, *n);
    *h = load_f32(name, NULL);
    snprintf(name, sizeof name, "%dx%d.count", *k, *n);
    const char *cnt = sf_metadata(g_cases, name);
    if (!cnt) cnt = sf_metadata(g_extra, name);
    if (!*w || !*h || !cnt) {
        sparq_free(*w), sparq_free(*h);
        *w = *h = NULL;
        return false;
    }
    const double count = atof(cnt);
    for (size_t i = 0; i < (size_t)*k * *k; i++) (*h)[i] = (float)((*h)[i] / count);
    return true;
}

#endif
