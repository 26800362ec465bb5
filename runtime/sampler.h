/* runtime/sampler.h — choosing the next token from logits.
 *
 * The chain, in this fixed order (llama.cpp's usual one):
 *   1. repetition penalty over the last `repeat_last_n` accepted tokens
 *      (CTRL / transformers rule: a positive logit is divided by the penalty,
 *      a negative one multiplied); 1.0 = off;
 *   2. temp ≤ 0: greedy — the highest logit, ties to the lowest id; stop;
 *   3. top-k (k > 0 keeps the k highest logits; 0 = off);
 *   4. temperature: logits / temp, softmax over the survivors;
 *   5. top-p (nucleus): the smallest prefix, by descending probability, whose
 *      mass reaches top_p (always ≥ 1 token); 1.0 = off;
 *   6. min-p: drop tokens with p < min_p · p_max; 0 = off;
 *   7. renormalise and draw with the sampler's own PRNG (xoshiro256**,
 *      seeded through splitmix64).
 * Candidates are ordered by (logit descending, id ascending), so a given seed
 * and logits always give the same token, on any machine and thread count.
 *
 * Sampling on a device (issue 21, sq_sampler_sample_rows): steps 1-3 (the
 * penalty, the argmax or the top-k candidates in that order) run where the
 * logits are, the backend's `sample_select` op (kernels/backend.h), and only
 * the k candidates and their logits come back; steps 4-7 run here on them
 * (sq_sampler_finish), the same code, in double, with the same PRNG stream,
 * so the device picks the token the whole-row path picks, bit for bit.
 * Without top-k (0, or more than SQ_SAMPLE_MAX_K = 1024 candidates) the whole
 * sorted row would be needed for the softmax's sum: those rows go to the host
 * as before. */
#ifndef SPARQ_RUNTIME_SAMPLER_H
#define SPARQ_RUNTIME_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

typedef struct sq_sampler_params {
    float temp;           /* default 0.8; ≤ 0 = greedy */
    int top_k;            /* default 40; 0 = off */
    float top_p;          /* default 0.95; 1 = off */
    float min_p;          /* default 0.05; 0 = off */
    float repeat_penalty; /* default 1.0 = off */
    int repeat_last_n;    /* default 64 */
    uint64_t seed;        /* default 0 */
} sq_sampler_params;

void sq_sampler_params_default(sq_sampler_params *p);

typedef struct sq_sampler sq_sampler;

/* A sampler choosing among the ids 0..n_vocab-1. Allocates its scratch here.
 * Give it sq_sampler_vocab(), not the head's row count: see there. */
sparq_status sq_sampler_create(sq_sampler **out, const sq_sampler_params *p, int n_vocab);
void sq_sampler_free(sq_sampler *s);

/* Choose a token from logits[0..n_vocab-1] (not modified), greedy included: a
 * row may be longer (the head's padding rows), and what lies past n_vocab is
 * never read, as if its logits were -inf. Does not accept the token. */
int32_t sq_sampler_sample(sq_sampler *s, const float *logits);

/* The ids to sample from, for a head of head_rows rows (config.json's vocab_size)
 * and a tokenizer of tokenizer_ids ids (sq_tokenizer_vocab_size; ≤ 0: unknown):
 * the smaller. Checkpoints pad the head past the tokenizer (Qwen3: vocab_size
 * 151,936 for 151,669 ids, for GEMM-friendly shapes); a padding row's logit is
 * no token, and one sampled could not be decoded. */
int sq_sampler_vocab(int64_t head_rows, int32_t tokenizer_ids);

/* Record a token in the repetition history (prompt tokens and generated). */
void sq_sampler_accept(sq_sampler *s, int32_t token);

/* Forget the history and reseed the PRNG. */
void sq_sampler_reset(sq_sampler *s, uint64_t seed);

/* The PRNG, exposed for tests: the next uniform double in [0, 1). */
double sq_sampler_uniform(sq_sampler *s);

/* --- the split path (device sampling) ------------------------------------- */

/* The chain's steps 4-7 on candidates cand[0..n) in the sampler's order
 * (logit descending, id ascending) with their penalised logits val[0..n):
 * what sq_sampler_sample does after its top-k, sort included. Greedy: cand[0].
 * Draws from the PRNG exactly when sq_sampler_sample would. */
int32_t sq_sampler_finish(sq_sampler *s, const int32_t *cand, const float *val, int n);

/* The device request for the next draw of s (the penalty's distinct ids point
 * into s); false when its candidates would be more than SQ_SAMPLE_MAX_K
 * (no top-k, or a larger one, at temp > 0): then the whole row is needed. */
bool sq_sampler_request(sq_sampler *s, sq_sample_req *req);

/* SPARQ_DEVICE_SAMPLING: -1 unset (a device exec samples on the device, a
 * CPU exec with sq_sampler_sample), 0 never (the logits are downloaded as
 * before issue 21), 1 through `sample_select` wherever the backend has it,
 * the CPU's included (what the unit tests and the cli test use to run the
 * split path without a GPU). */
int sq_device_sampling_mode(void);

/* Choose one token for each of `rows` rows of logits [rows, ld] (backend
 * memory of ex: device memory on a device, the host's on the CPU), row r with
 * smp[r] (not accepted). Through the backend's `sample_select` when
 * sq_device_sampling_mode() asks for it and every row's request fits
 * (sq_sampler_request), in groups of 32 rows; otherwise the logits are
 * copied to host[rows, ld] (a device exec; unused on the CPU) and sampled
 * there. The logits may be modified (the penalty in place). *bad_row: the
 * first row whose logits hold a NaN or Inf (its draw and the later rows' are
 * not made), else -1. */
/* The whole-row path on host logits [rows, ld]: every row checked finite
 * first (*bad_row as below), then sq_sampler_sample for each. */
sparq_status sq_sampler_sample_host(sq_sampler *const *smp, const float *logits, int rows, int ld, int32_t *ids,
                                    int *bad_row);

sparq_status sq_sampler_sample_rows(sq_exec *ex, sq_sampler *const *smp, float *logits, int rows, int ld,
                                    float *host, int32_t *ids, int *bad_row);

#endif
