/* tools/bench/model_writer.c — the sharded output, generator and argument
 * helpers the random-model writers share (model_writer.h). */
#include "tools/bench/model_writer.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"

static uint64_t rng_state = 1;

void mw_seed(uint64_t seed) { rng_state = seed; }

uint64_t mw_rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float mw_gauss(float sd)
{
    const uint64_t r = mw_rnd();
    const double u = ((double)(r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48)) / 65536.0;
    return sd * (float)(u - 2.0) * 1.7320508f;
}

static const char *shard_name(int i)
{
    static char name[64];
    snprintf(name, sizeof name, "model-%05d.safetensors", i + 1);
    return name;
}

static sparq_status shard_flush(mw_job *j)
{
    if (!j->w) return SPARQ_OK;
    sparq_status st = sf_writer_finish(j->w);
    j->w = NULL;
    for (size_t i = 0; i < j->n_bufs; i++) sparq_free(j->bufs[i]);
    j->n_bufs = 0;
    j->shard_bytes = 0;
    return st;
}

sparq_status mw_begin(mw_job *j, const char *out, uint64_t shard_cap, bool sparse)
{
    memset(j, 0, sizeof *j);
    j->out = out;
    j->shard_cap = shard_cap;
    j->sparse = sparse;
    FORWARD_IF(sparq_mkdirs(out));
    j->index_tmp = sparq_path_join(out, "model.safetensors.index.json.partial");
    RETURN_IF(!j->index_tmp, SPARQ_E_NOMEM, "out of memory");
    j->map = fopen(j->index_tmp, "w");
    RETURN_IF(!j->map, SPARQ_E_IO, "%s: cannot write the index", j->index_tmp);
    fprintf(j->map, "{\n  \"weight_map\": {");
    return SPARQ_OK;
}

sparq_status mw_add(mw_job *j, const char *name, sf_dtype dt, int ndim, const uint64_t *shape, void *data,
                    uint64_t nbytes)
{
    RETURN_IF(!data && nbytes && !j->sparse, SPARQ_E_ARG, "%s: no data", name);
    if (j->w && j->shard_bytes + nbytes > j->shard_cap) FORWARD_IF(shard_flush(j));
    if (!j->w) {
        char *path = sparq_path_join(j->out, shard_name(j->n_shards));
        RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
        sparq_status st = sf_writer_create(&j->w, path);
        sparq_free(path);
        FORWARD_IF(st);
        j->shard = j->n_shards++;
    }
    if (data) {
        if (j->n_bufs == j->cap_bufs) {
            size_t cap = j->cap_bufs ? 2 * j->cap_bufs : 256;
            void **b = sparq_realloc(j->bufs, cap * sizeof *b);
            if (!b) {
                sparq_free(data);
                return sparq_err(SPARQ_E_NOMEM, "out of memory");
            }
            j->bufs = b;
            j->cap_bufs = cap;
        }
        j->bufs[j->n_bufs++] = data;
    }
    j->shard_bytes += nbytes;
    j->total_bytes += nbytes;
    fprintf(j->map, "%s\n    \"%s\": \"%s\"", j->n_map++ ? "," : "", name, shard_name(j->shard));
    return data ? sf_writer_add_ref(j->w, name, dt, ndim, shape, data, nbytes)
                : sf_writer_add_hole(j->w, name, dt, ndim, shape);
}

sparq_status mw_end(mw_job *j, sparq_status st)
{
    if (st == SPARQ_OK) st = shard_flush(j);
    sf_writer_free(j->w);
    j->w = NULL;
    for (size_t i = 0; i < j->n_bufs; i++) sparq_free(j->bufs[i]);
    sparq_free(j->bufs);
    j->bufs = NULL;
    char *final = sparq_path_join(j->out, "model.safetensors.index.json");
    if (j->map) {
        /* the weight map was written as tensors came; the total goes in a trailing metadata */
        fprintf(j->map, "\n  },\n  \"metadata\": {\"total_size\": %llu}\n}\n", (unsigned long long)j->total_bytes);
        if (fclose(j->map) && st == SPARQ_OK) st = sparq_err(SPARQ_E_IO, "%s: cannot write the index", j->out);
        j->map = NULL;
    }
    if (st == SPARQ_OK && (!final || rename(j->index_tmp, final)))
        st = sparq_err(SPARQ_E_IO, "%s: cannot rename the index", j->out);
    if (st != SPARQ_OK && j->index_tmp) remove(j->index_tmp);
    sparq_free(final);
    sparq_free(j->index_tmp);
    j->index_tmp = NULL;
    return st;
}

sparq_status mw_write_text(const char *dir, const char *file, const char *text)
{
    char *path = sparq_path_join(dir, file);
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sparq_status st = sparq_file_write_atomic(path, text, strlen(text));
    sparq_free(path);
    return st;
}

int mw_arg_int(const char *prog, int argc, char **argv, int *i, long lo, long hi)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", prog, argv[*i]);
        exit(2);
    }
    char *end;
    long v = strtol(argv[++*i], &end, 10);
    if (*end || end == argv[*i] || v < lo || v > hi) {
        fprintf(stderr, "%s: %s %s: want %ld..%ld\n", prog, argv[*i - 1], argv[*i], lo, hi);
        exit(2);
    }
    return (int)v;
}
