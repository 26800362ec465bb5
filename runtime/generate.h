/* runtime/generate.h — several continuations of one prompt at once, kept
 * in flight as micro-batches so every pipeline stage works (runtime/dist/dist.h).
 *
 * N sequences (KV slots 0..N-1) are prefilled with the prompt, all chunks in
 * flight; then split into G = min(N, ranks) groups, each a decode step of
 * its live sequences. While group g is in later stages, rank 0 samples and
 * submits the others, so with G ≥ ranks no stage idles. Sequence i samples
 * with seed + i, so continuation i equals a single generation with that
 * seed. Used by `sparq run --parallel` and tools/bench/dist_bench.c. */
#ifndef SPARQ_RUNTIME_GENERATE_H
#define SPARQ_RUNTIME_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/dist/dist.h"
#include "runtime/sampler.h"

typedef struct sq_gen_opts {
    int n_seqs;                   /* continuations (≤ the model's n_seq) */
    int n_new;                    /* tokens each may generate */
    sq_sampler_params sampler;    /* seed is that of sequence 0 */
    int n_vocab;                  /* the ids sampled from: sq_sampler_vocab (0: all vocab_size) */
    const int32_t *stop;          /* end-of-sequence ids (not emitted) */
    int n_stop;
    bool ignore_stop;
} sq_gen_opts;

typedef struct sq_gen_result {
    int32_t **out;  /* [n_seqs] arrays of n_out[i] ids (owned; sq_gen_result_free) */
    int *n_out;
    int n_seqs;
    double t_prompt, t_decode;  /* seconds */
    long n_prompt, n_decode;    /* prompt tokens run, tokens sampled */
} sq_gen_result;

/* Rank 0 of d. On error everything allocated is freed. */
sparq_status sq_generate(sq_dist *d, const int32_t *prompt, int n_prompt, const sq_gen_opts *o, sq_gen_result *res);
void sq_gen_result_free(sq_gen_result *res);

#endif
