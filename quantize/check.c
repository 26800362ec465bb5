/* quantize/check.c — what the quantizer refuses in its source before it
 * spends hours on it: a config.json that contradicts the tensors
 * (runtime/arch.h, sq_arch_check_tensors), and NaN / Inf weights. Each
 * linear it quantizes is checked as it is read (qz_check_finite, on the fp32
 * values the quantizer sees, whatever the stored form), the tensors it keeps
 * as they are (norms, embeddings, routers) once before the layer loop. */
#include <stdio.h>
#include <string.h>

#include "quantize/job.h"

static sparq_status nonfinite(const qjob *j, const char *file, const char *name, uint64_t nan, uint64_t inf)
{
    return sparq_err(SPARQ_E_FORMAT,
                     "%s: tensor '%s' holds %llu NaN and %llu Inf values; refusing to quantize non-finite weights "
                     "(`sparq inspect --check %s` lists every such tensor)",
                     file, name, (unsigned long long)nan, (unsigned long long)inf, j->o->model_dir);
}

sparq_status qz_check_finite(const qjob *j, const char *key, const float *w, uint64_t n)
{
    const sf_tensor view = {.name = key, .dtype = SF_F32, .ndim = 1, .shape = {n}, .numel = n, .data = w};
    uint64_t nan, inf;
    sf_count_nonfinite(&view, &nan, &inf);
    if (nan || inf) {
        char name[600];
        snprintf(name, sizeof name, "%s.weight", key);
        return nonfinite(j, j->o->model_dir, name, nan, inf);
    }
    return SPARQ_OK;
}

/* Is x stored as part of a linear the driver quantizes (checked when read)? */
static bool quantized_part(const sq_model_config *cfg, const sq_arch_info *a, const char *name)
{
    char key[512];
    const size_t n = strlen(name);
    const char *dot = strrchr(name, '.');
    size_t stem = dot ? (size_t)(dot - name) : n;
    if (n > 7 && (!strcmp(name + n - 7, "_blocks") || !strcmp(name + n - 7, "_scales"))) stem = n - 7;
    if (stem >= sizeof key) return false;
    memcpy(key, name, stem);
    key[stem] = 0;
    return sq_arch_is_quant_linear(cfg, key, NULL) || !strcmp(key, a->head_key);
}

sparq_status qz_check_source(qjob *j)
{
    sq_model_config cfg;
    FORWARD_IF(sq_config_load(&cfg, j->o->model_dir));
    sparq_status st = sq_arch_check_tensors(&cfg, j->src, NULL, j->o->model_dir, NULL);
    const sq_arch_info *a = sq_arch_of(&cfg);
    for (size_t i = 0; st == SPARQ_OK && a && i < sf_count(j->src); i++) {
        const sf_tensor *t = sf_at(j->src, i);
        if (quantized_part(&cfg, a, t->name)) continue;
        uint64_t nan, inf;
        sf_count_nonfinite(t, &nan, &inf);
        qz_release_mapped(j, t->data, t->nbytes);
        if (nan || inf) st = nonfinite(j, sf_file_path(j->src, t->file), t->name, nan, inf);
    }
    sq_config_free(&cfg);
    return st;
}
