/* tools/bench/model_writer.h — what the random-model writers (make_exl3_model,
 * make_v41_model) share: a seeded generator, a sharded safetensors output with
 * its model.safetensors.index.json written as tensors are added, and argument
 * parsing. A tensor added without data on a sparse job is left a hole
 * (sf_writer_add_hole), so a full-size checkpoint costs only its headers. */
#ifndef SPARQ_TOOLS_MODEL_WRITER_H
#define SPARQ_TOOLS_MODEL_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "formats/safetensors.h"

/* splitmix64, seeded by mw_seed: the same seed gives the same bytes */
void mw_seed(uint64_t seed);
uint64_t mw_rnd(void);
/* A value of mean 0 and standard deviation sd (a sum of 4 uniforms: bounded by ±2√3·sd). */
float mw_gauss(float sd);

typedef struct mw_job {
    const char *out;
    uint64_t shard_cap; /* bytes of tensor data per shard */
    bool sparse;        /* tensors added without data become holes */
    sf_writer *w;       /* the shard being filled */
    void **bufs;        /* the heap buffers it references */
    size_t n_bufs, cap_bufs;
    uint64_t shard_bytes, total_bytes;
    int shard, n_shards;
    FILE *map; /* the index's weight_map entries */
    int n_map;
    char *index_tmp;
} mw_job;

/* Create OUT and start its index. */
sparq_status mw_begin(mw_job *j, const char *out, uint64_t shard_cap, bool sparse);
/* Add a tensor; the job takes over `data` (heap). data NULL on a sparse job: a hole. */
sparq_status mw_add(mw_job *j, const char *name, sf_dtype dt, int ndim, const uint64_t *shape, void *data,
                    uint64_t nbytes);
/* Finish the last shard and the index (renamed into place only when st is OK and all went well); frees. */
sparq_status mw_end(mw_job *j, sparq_status st);

/* Write OUT/file atomically. */
sparq_status mw_write_text(const char *dir, const char *file, const char *text);

/* The integer value of argv[*i] (advancing *i) in lo..hi; exits 2 naming prog otherwise. */
int mw_arg_int(const char *prog, int argc, char **argv, int *i, long lo, long hi);

#endif
