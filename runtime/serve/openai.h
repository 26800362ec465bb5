/* runtime/serve/openai.h — the OpenAI API subset `sparq serve` answers: request
 * bodies of /v1/completions and /v1/chat/completions parsed and checked
 * (every error names the field), and the JSON of responses, stream chunks,
 * the model list and errors. No I/O here: cli/cmd_serve.c moves the bytes,
 * tests/fuzz/fuzz_openai.c fuzzes the parser. docs/cli-serve.md lists the
 * fields. */
#ifndef SPARQ_RUNTIME_OPENAI_H
#define SPARQ_RUNTIME_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/tokenizer.h"
#include "runtime/sampler.h"

typedef enum sq_oai_kind { SQ_OAI_COMPLETION, SQ_OAI_CHAT } sq_oai_kind;

#define SQ_OAI_MAX_STOP 4
#define SQ_OAI_MAX_MSGS 256

typedef struct sq_oai_request {
    sq_oai_kind kind;
    char *prompt;                       /* completions: the prompt (owned) */
    sq_chat_msg msgs[SQ_OAI_MAX_MSGS];  /* chat: the messages (contents owned) */
    int n_msgs;
    int max_tokens;                     /* −1: not given */
    sq_sampler_params sampler;          /* OpenAI defaults (temperature 1, top_p 1, no top-k/min-p) + the request */
    bool has_seed;
    char *stop[SQ_OAI_MAX_STOP];        /* stop strings (owned) */
    int n_stop;
    bool stream;
    bool include_usage;                 /* stream_options.include_usage */
} sq_oai_request;

/* Parse a request body of the given kind. SPARQ_E_FORMAT for bad JSON or a
 * field of the wrong type or range, SPARQ_E_UNSUPPORTED for a field sparq
 * does not implement (n > 1, logprobs, tools, ...); the message names the
 * field and *param (if not NULL) points at its name (a static string).
 * Unknown fields are ignored, as OpenAI clients send extras. */
sparq_status sq_oai_parse(const char *body, size_t len, sq_oai_kind kind, sq_oai_request *req, const char **param);
void sq_oai_request_free(sq_oai_request *req);

/* Why a completion ended. */
typedef enum sq_oai_finish { SQ_OAI_FINISH_NONE, SQ_OAI_FINISH_STOP, SQ_OAI_FINISH_LENGTH } sq_oai_finish;

typedef struct sq_oai_meta {
    const char *id;     /* "cmpl-…" / "chatcmpl-…" */
    const char *model;  /* the served model's name */
    long long created;  /* Unix time */
} sq_oai_meta;

/* The JSON texts below are new NUL-terminated strings (sparq_free them), or
 * NULL when out of memory. */

/* A whole response: text, finish reason, token counts. */
char *sq_oai_response(sq_oai_kind kind, const sq_oai_meta *m, const char *text, size_t len, sq_oai_finish fin,
                      int prompt_tokens, int completion_tokens);
/* One stream chunk: a piece of text (chat: the first chunk also carries the
 * role), or with fin set the final chunk (empty delta, finish reason), or with
 * usage set the usage chunk (no choices). */
char *sq_oai_chunk(sq_oai_kind kind, const sq_oai_meta *m, const char *text, size_t len, bool first,
                   sq_oai_finish fin, bool usage, int prompt_tokens, int completion_tokens);
/* GET /v1/models. */
char *sq_oai_models(const char *model, long long created);
/* {"error": {"message", "type", "param", "code"}}; type from the status. */
char *sq_oai_error(int status, const char *message, const char *param);

#endif
