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
 * and logits always give the same token, on any machine and thread count. */
#ifndef SPARQ_RUNTIME_SAMPLER_H
#define SPARQ_RUNTIME_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

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

#endif
