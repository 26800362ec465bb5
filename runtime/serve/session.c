/* runtime/serve/session.c — see session.h. The generation loop that `sparq run`
 * streams to stdout, with the output made a callback. */
#include "runtime/serve/session.h"

#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"

sparq_status sq_session_init(sq_session *s, sq_dist *model, const sq_tokenizer *tok, const sq_sampler_params *sp,
                             bool chat_stop)
{
    memset(s, 0, sizeof *s);
    s->model = model;
    s->tok = tok;
    const sq_model_config *cfg = sq_dist_cfg(model);
    const int V = (int)cfg->vocab_size;
    s->n_vocab = sq_sampler_vocab(cfg->vocab_size, sq_tokenizer_vocab_size(tok));
    FORWARD_IF(sq_sampler_create(&s->sampler, sp, s->n_vocab));
    s->logits = sparq_malloc((size_t)V * sizeof(float));
    s->cached = sparq_malloc((size_t)sq_dist_options(model)->ctx * sizeof(int32_t));
    if (!s->logits || !s->cached) {
        sq_session_free(s);
        return sparq_err(SPARQ_E_NOMEM, "out of memory for the logits and the context's ids");
    }
    for (int i = 0; i < cfg->n_eos_token_ids && s->n_stop < SQ_MAX_EOS_IDS; i++)
        s->stop[s->n_stop++] = (int32_t)cfg->eos_token_ids[i];
    if (sq_tokenizer_eos(tok) >= 0) s->stop[s->n_stop++] = sq_tokenizer_eos(tok);
    if (chat_stop && sq_tokenizer_token_id(tok, "<|im_end|>") >= 0)
        s->stop[s->n_stop++] = sq_tokenizer_token_id(tok, "<|im_end|>");
    return SPARQ_OK;
}

void sq_session_free(sq_session *s)
{
    sq_sampler_free(s->sampler);
    sparq_free(s->logits);
    sparq_free(s->cached);
    s->sampler = NULL;
    s->logits = NULL;
    s->cached = NULL;
}

sparq_status sq_session_set_sampler(sq_session *s, const sq_sampler_params *sp)
{
    sq_sampler *n = NULL;
    FORWARD_IF(sq_sampler_create(&n, sp, s->n_vocab));
    sq_sampler_free(s->sampler);
    s->sampler = n;
    return SPARQ_OK;
}

sparq_status sq_prompt_encode(const sq_tokenizer *tok, const char *text, bool add_bos, int32_t **ids, int *n)
{
    int32_t *raw = NULL;
    size_t nraw = 0;
    FORWARD_IF(sq_tokenizer_encode(tok, text, strlen(text), true, &raw, &nraw));
    const int32_t bos = sq_tokenizer_bos(tok);
    const int extra = add_bos && bos >= 0 ? 1 : 0;
    *ids = sparq_malloc((nraw + 1) * sizeof(int32_t));
    if (!*ids) {
        sparq_free(raw);
        return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    if (extra) (*ids)[0] = bos;
    if (nraw) memcpy(*ids + extra, raw, nraw * sizeof(int32_t));
    *n = (int)nraw + extra;
    sparq_free(raw);
    return SPARQ_OK;
}

static bool is_stop(const sq_session *s, int32_t t)
{
    for (int i = 0; i < s->n_stop; i++)
        if (s->stop[i] == t) return true;
    return false;
}

sparq_status sq_session_generate(sq_session *s, const int32_t *ids, int n_ids, int n_new, uint64_t seed,
                                 sq_emit_fn emit, void *ctx, sq_session_out *out)
{
    memset(out, 0, sizeof *out);
    const int max_ctx = sq_dist_options(s->model)->ctx;
    RETURN_IF(n_ids < 1, SPARQ_E_ARG, "the prompt is empty");
    RETURN_IF(n_ids >= max_ctx, SPARQ_E_RANGE, "prompt of %d tokens does not fit the context of %d (--ctx)", n_ids,
              max_ctx);
    int keep = 0;
    while (keep < s->n_cached && keep < n_ids && s->cached[keep] == ids[keep]) keep++;
    /* the last sampled token of a generation that ended on its length was never
     * run, so it is in `cached` but not in the KV cache */
    if (keep > sq_dist_seq_len(s->model, 0)) keep = sq_dist_seq_len(s->model, 0);
    if (keep == n_ids) keep--; /* always run at least one token to get logits */
    FORWARD_IF(sq_dist_seq_truncate(s->model, 0, keep));
    s->n_cached = keep;
    sq_sampler_reset(s->sampler, seed);
    for (int i = 0; i < n_ids; i++) sq_sampler_accept(s->sampler, ids[i]);
    double t0 = sparq_now();
    FORWARD_IF(sq_dist_forward(s->model, 0, ids + keep, n_ids - keep, SQ_LOGITS_LAST, s->logits));
    s->t_prompt += sparq_now() - t0;
    s->n_prompt += n_ids - keep;
    memcpy(s->cached, ids, (size_t)n_ids * sizeof(int32_t));
    s->n_cached = n_ids;
    s->last_prompt_len = n_ids;

    sq_detok d;
    sq_detok_init(&d, s->tok, true);
    const char *txt;
    size_t len;
    sparq_status st = SPARQ_OK;
    t0 = sparq_now();
    /* one process: the decode steps sample where the logits are (a device keeps them) */
    const bool sampled_steps = sq_dist_size(s->model) == 1;
    int32_t t = n_new > 0 ? sq_sampler_sample(s->sampler, s->logits) : 0;
    for (int i = 0; i < n_new && s->n_cached < max_ctx; i++) {
        if (!s->ignore_eos && is_stop(s, t)) {
            out->eos = true;
            break;
        }
        sq_sampler_accept(s->sampler, t);
        st = sq_detok_push(&d, t, &txt, &len);
        if (st != SPARQ_OK) break;
        s->n_decode++;
        out->n_new++;
        s->cached[s->n_cached++] = t;
        if (len && !emit(ctx, txt, len)) {
            out->halted = true;
            break;
        }
        if (i + 1 == n_new || s->n_cached >= max_ctx) break; /* no logits needed for a token we will not sample */
        if (sampled_steps) {
            const int seq0 = 0;
            int32_t next = 0;
            st = sq_dist_step_sample(s->model, 1, &seq0, &t, &s->sampler, s->logits, &next);
            t = next;
        } else {
            st = sq_dist_forward(s->model, 0, &t, 1, SQ_LOGITS_LAST, s->logits);
            if (st == SPARQ_OK) t = sq_sampler_sample(s->sampler, s->logits);
        }
        if (st != SPARQ_OK) break;
    }
    s->t_decode += sparq_now() - t0;
    if (st == SPARQ_OK && !out->halted && sq_detok_flush(&d, &txt, &len) == SPARQ_OK && len) emit(ctx, txt, len);
    sq_detok_free(&d);
    return st;
}
