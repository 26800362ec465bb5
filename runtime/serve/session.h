/* runtime/serve/session.h — one conversation on sequence slot 0 of a model
 * (runtime/dist/dist.h, one rank or several): the tokenizer, a sampler, and the
 * ids in the KV cache, so a new prompt that starts like the last one
 * (a chat's next turn) only prefills what is new. Text is handed out as it
 * is decoded, whole UTF-8 characters at a time, through a callback.
 * `sparq run` and `sparq serve` generate through it. */
#ifndef SPARQ_RUNTIME_SESSION_H
#define SPARQ_RUNTIME_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/tokenizer.h"
#include "runtime/dist/dist.h"
#include "runtime/sampler.h"

/* Receives each piece of generated text; returns false to stop generating. */
typedef bool (*sq_emit_fn)(void *ctx, const char *text, size_t len);

typedef struct sq_session {
    sq_dist *model;              /* borrowed */
    const sq_tokenizer *tok;     /* borrowed */
    sq_sampler *sampler;
    int n_vocab;                 /* the ids sampled from: sq_sampler_vocab (the head may be padded) */
    float *logits;               /* [vocab_size]: the head's row */
    int32_t *cached;             /* ids in the KV cache (ctx of them at most) */
    int n_cached;
    int last_prompt_len;         /* the last prompt's ids; the generated ones follow in `cached` */
    int32_t stop[SQ_MAX_EOS_IDS + 2];
    int n_stop;
    bool ignore_eos;
    double t_prompt, t_decode;   /* totals over all generations */
    long n_prompt, n_decode;
} sq_session;

/* Stop ids: the config's eos_token_ids, the tokenizer's eos, and with
 * chat_stop also <|im_end|> when the vocabulary has it. */
sparq_status sq_session_init(sq_session *s, sq_dist *model, const sq_tokenizer *tok, const sq_sampler_params *sp,
                             bool chat_stop);
void sq_session_free(sq_session *s);
/* New sampling parameters for the following generations. */
sparq_status sq_session_set_sampler(sq_session *s, const sq_sampler_params *sp);

/* Encode text (special tokens parsed), with the tokenizer's BOS first if
 * add_bos and it has one. *ids: sparq_malloc'ed. */
sparq_status sq_prompt_encode(const sq_tokenizer *tok, const char *text, bool add_bos, int32_t **ids, int *n);

typedef struct sq_session_out {
    int n_new;        /* tokens generated */
    bool eos;         /* ended on a stop id */
    bool halted;      /* the callback asked to stop */
} sq_session_out;

/* Prefill ids (reusing the cached prefix; at least one token runs, for the
 * logits), then sample up to n_new tokens with the sampler reset to seed,
 * until a stop id (unless ignore_eos), the context's end, or emit returning
 * false. SPARQ_E_RANGE if the prompt does not fit the context. */
sparq_status sq_session_generate(sq_session *s, const int32_t *ids, int n_ids, int n_new, uint64_t seed,
                                 sq_emit_fn emit, void *ctx, sq_session_out *out);

#endif
