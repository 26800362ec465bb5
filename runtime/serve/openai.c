/* runtime/serve/openai.c — see openai.h. Requests are read with jansson and
 * copied into a plain struct, so nothing of the JSON tree outlives the
 * parse; responses are built as jansson objects and dumped compact. */
#include "runtime/serve/openai.h"

#include <jansson.h>
#include <string.h>

#include "common/alloc.h"

static sparq_status bad(const char **param, const char *name, sparq_status code, const char *what)
{
    if (param) *param = name;
    return sparq_err(code, "%s: %s", name, what);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = sparq_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* A string, or an array of {"type": "text", "text": ...} parts joined. */
static sparq_status content_text(json_t *c, const char *name, char **out, const char **param)
{
    if (json_is_string(c)) {
        *out = dup_n(json_string_value(c), json_string_length(c));
        return *out ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    if (!json_is_array(c)) return bad(param, name, SPARQ_E_FORMAT, "expected a string or an array of text parts");
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return bad(param, name, SPARQ_E_UNSUPPORTED, "only text parts are supported");
        if (!json_is_string(text)) return bad(param, name, SPARQ_E_FORMAT, "a text part without a \"text\" string");
        total += json_string_length(text);
    }
    char *s = sparq_malloc(total + 1);
    if (!s) return sparq_err(SPARQ_E_NOMEM, "out of memory");
    size_t at = 0;
    json_array_foreach(c, i, p) {
        json_t *text = json_object_get(p, "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = 0;
    *out = s;
    return SPARQ_OK;
}

/* Optional number field in [lo, hi] (integer if want_int). */
static sparq_status get_num(json_t *root, const char *name, double lo, double hi, bool want_int, bool *present,
                            double *out, const char **param)
{
    json_t *v = json_object_get(root, name);
    *present = v && !json_is_null(v);
    if (!*present) return SPARQ_OK;
    if (want_int ? !json_is_integer(v) : !json_is_number(v))
        return bad(param, name, SPARQ_E_FORMAT, want_int ? "expected an integer" : "expected a number");
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        if (param) *param = name;
        return sparq_err(SPARQ_E_FORMAT, "%s: %g is outside [%g, %g]", name, x, lo, hi);
    }
    *out = x;
    return SPARQ_OK;
}

/* Fields sparq does not implement: present with a non-default value is an error. */
static sparq_status check_unsupported(json_t *root, const char **param)
{
    json_t *v;
    if ((v = json_object_get(root, "n")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return bad(param, "n", SPARQ_E_UNSUPPORTED, "only one completion per request is supported");
    if ((v = json_object_get(root, "best_of")) && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return bad(param, "best_of", SPARQ_E_UNSUPPORTED, "only 1 is supported");
    static const char *const off_fields[] = {"logprobs", "top_logprobs", "echo", "suffix", "tools", "functions",
                                             "tool_choice", "function_call"};
    for (size_t i = 0; i < sizeof off_fields / sizeof *off_fields; i++)
        if ((v = json_object_get(root, off_fields[i])) && !json_is_null(v) && !json_is_false(v))
            return bad(param, off_fields[i], SPARQ_E_UNSUPPORTED, "not supported by sparq serve");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(root, penalties[i])) && !json_is_null(v) &&
            !(json_is_number(v) && json_number_value(v) == 0.0))
            return bad(param, penalties[i], SPARQ_E_UNSUPPORTED, "not supported (use repeat_penalty)");
    if ((v = json_object_get(root, "logit_bias")) && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0))
        return bad(param, "logit_bias", SPARQ_E_UNSUPPORTED, "not supported by sparq serve");
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return bad(param, "response_format", SPARQ_E_UNSUPPORTED, "only {\"type\": \"text\"} is supported");
    }
    return SPARQ_OK;
}

static sparq_status parse_messages(json_t *root, sq_oai_request *req, const char **param)
{
    json_t *ms = json_object_get(root, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return bad(param, "messages", SPARQ_E_FORMAT, "expected a non-empty array of messages");
    if (json_array_size(ms) > SQ_OAI_MAX_MSGS) return bad(param, "messages", SPARQ_E_RANGE, "more than 256 messages");
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role))
            return bad(param, "messages", SPARQ_E_FORMAT, "every message needs a \"role\" string");
        const char *r = json_string_value(role);
        sq_chat_role cr;
        if (!strcmp(r, "system") || !strcmp(r, "developer")) cr = SQ_ROLE_SYSTEM;
        else if (!strcmp(r, "user")) cr = SQ_ROLE_USER;
        else if (!strcmp(r, "assistant")) cr = SQ_ROLE_ASSISTANT;
        else return bad(param, "messages", SPARQ_E_UNSUPPORTED, "role must be system, developer, user or assistant");
        json_t *c = json_object_get(m, "content");
        char *text = NULL;
        if (json_is_null(c) || !c) text = dup_n("", 0);
        else FORWARD_IF(content_text(c, "messages", &text, param));
        if (!text) return sparq_err(SPARQ_E_NOMEM, "out of memory");
        req->msgs[req->n_msgs++] = (sq_chat_msg){cr, text};
    }
    return SPARQ_OK;
}

static sparq_status parse_prompt(json_t *root, sq_oai_request *req, const char **param)
{
    json_t *p = json_object_get(root, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_array(p)) return bad(param, "prompt", SPARQ_E_UNSUPPORTED, "one prompt string per request");
    if (!json_is_string(p)) return bad(param, "prompt", SPARQ_E_FORMAT, "expected a string");
    req->prompt = dup_n(json_string_value(p), json_string_length(p));
    return req->prompt ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
}

static sparq_status parse_stop(json_t *root, sq_oai_request *req, const char **param)
{
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s)) return SPARQ_OK;
    if (json_is_string(s)) {
        if (json_string_length(s) == 0) return SPARQ_OK;
        req->stop[req->n_stop] = dup_n(json_string_value(s), json_string_length(s));
        return req->stop[req->n_stop++] ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    if (!json_is_array(s)) return bad(param, "stop", SPARQ_E_FORMAT, "expected a string or an array of strings");
    if (json_array_size(s) > SQ_OAI_MAX_STOP) return bad(param, "stop", SPARQ_E_RANGE, "at most 4 stop strings");
    size_t i;
    json_t *v;
    json_array_foreach(s, i, v) {
        if (!json_is_string(v)) return bad(param, "stop", SPARQ_E_FORMAT, "expected an array of strings");
        if (json_string_length(v) == 0) continue;
        req->stop[req->n_stop] = dup_n(json_string_value(v), json_string_length(v));
        if (!req->stop[req->n_stop++]) return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    return SPARQ_OK;
}

static sparq_status parse_fields(json_t *root, sq_oai_request *req, const char **param)
{
    FORWARD_IF(check_unsupported(root, param));
    FORWARD_IF(req->kind == SQ_OAI_CHAT ? parse_messages(root, req, param) : parse_prompt(root, req, param));
    bool has;
    double x;
    FORWARD_IF(get_num(root, "max_tokens", 0, 1 << 24, true, &has, &x, param));
    if (has) req->max_tokens = (int)x;
    FORWARD_IF(get_num(root, "max_completion_tokens", 0, 1 << 24, true, &has, &x, param));
    if (has) req->max_tokens = (int)x;
    sq_sampler_params *sp = &req->sampler;
    FORWARD_IF(get_num(root, "temperature", 0, 100, false, &has, &x, param));
    if (has) sp->temp = (float)x;
    FORWARD_IF(get_num(root, "top_p", 1e-9, 1, false, &has, &x, param));
    if (has) sp->top_p = (float)x;
    FORWARD_IF(get_num(root, "top_k", 0, 1 << 24, true, &has, &x, param));
    if (has) sp->top_k = (int)x;
    FORWARD_IF(get_num(root, "min_p", 0, 1, false, &has, &x, param));
    if (has) sp->min_p = (float)x;
    FORWARD_IF(get_num(root, "repeat_penalty", 1e-3, 100, false, &has, &x, param));
    if (has) sp->repeat_penalty = (float)x;
    json_t *seed = json_object_get(root, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0)
            return bad(param, "seed", SPARQ_E_FORMAT, "expected a non-negative integer");
        sp->seed = (uint64_t)json_integer_value(seed);
        req->has_seed = true;
    }
    FORWARD_IF(parse_stop(root, req, param));
    json_t *st = json_object_get(root, "stream");
    if (st && !json_is_null(st)) {
        if (!json_is_boolean(st)) return bad(param, "stream", SPARQ_E_FORMAT, "expected true or false");
        req->stream = json_is_true(st);
    }
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        json_t *iu = json_object_get(so, "include_usage");
        if (!json_is_object(so) || (iu && !json_is_boolean(iu)))
            return bad(param, "stream_options", SPARQ_E_FORMAT, "expected {\"include_usage\": true|false}");
        req->include_usage = json_is_true(iu);
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return bad(param, "model", SPARQ_E_FORMAT, "expected a string");
    return SPARQ_OK;
}

sparq_status sq_oai_parse(const char *body, size_t len, sq_oai_kind kind, sq_oai_request *req, const char **param)
{
    memset(req, 0, sizeof *req);
    req->kind = kind;
    req->max_tokens = -1;
    sq_sampler_params_default(&req->sampler);
    req->sampler.temp = 1.0f; /* OpenAI's defaults */
    req->sampler.top_p = 1.0f;
    req->sampler.top_k = 0;
    req->sampler.min_p = 0.0f;
    req->sampler.repeat_penalty = 1.0f;
    if (param) *param = NULL;
    json_error_t e;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e);
    if (!root) return sparq_err(SPARQ_E_FORMAT, "request body is not valid JSON: %s (line %d, column %d)", e.text,
                                e.line, e.column);
    sparq_status st = json_is_object(root) ? parse_fields(root, req, param)
                                           : sparq_err(SPARQ_E_FORMAT, "request body must be a JSON object");
    json_decref(root);
    if (st != SPARQ_OK) sq_oai_request_free(req);
    return st;
}

void sq_oai_request_free(sq_oai_request *req)
{
    sparq_free(req->prompt);
    for (int i = 0; i < req->n_msgs; i++) sparq_free((char *)req->msgs[i].content);
    for (int i = 0; i < req->n_stop; i++) sparq_free(req->stop[i]);
    req->prompt = NULL;
    req->n_msgs = req->n_stop = 0;
}

/* --- responses --------------------------------------------------------------- */

static json_t *text_value(const char *text, size_t len)
{
    json_t *s = json_stringn(text, len);
    return s ? s : json_stringn_nocheck(text, len); /* never expected: the detokenizer emits whole characters */
}

static const char *finish_name(sq_oai_finish f)
{
    return f == SQ_OAI_FINISH_STOP ? "stop" : f == SQ_OAI_FINISH_LENGTH ? "length" : NULL;
}

static json_t *finish_value(sq_oai_finish f)
{
    return f == SQ_OAI_FINISH_NONE ? json_null() : json_string(finish_name(f));
}

static char *dump(json_t *root)
{
    if (!root) return NULL;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s; /* malloc'ed by jansson: sparq_free (= free) releases it */
}

static json_t *envelope(sq_oai_kind kind, const sq_oai_meta *m, bool chunk)
{
    const char *object = kind == SQ_OAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", object, "created", (json_int_t)m->created,
                     "model", m->model);
}

static json_t *usage(int prompt_tokens, int completion_tokens)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt_tokens, "completion_tokens", completion_tokens,
                     "total_tokens", prompt_tokens + completion_tokens);
}

char *sq_oai_response(sq_oai_kind kind, const sq_oai_meta *m, const char *text, size_t len, sq_oai_finish fin,
                      int prompt_tokens, int completion_tokens)
{
    json_t *root = envelope(kind, m, false);
    json_t *choice = kind == SQ_OAI_CHAT
                         ? json_pack("{s:i, s:{s:s, s:o}, s:o}", "index", 0, "message", "role", "assistant",
                                     "content", text_value(text, len), "finish_reason", finish_value(fin))
                         : json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "text", text_value(text, len), "logprobs",
                                     "finish_reason", finish_value(fin));
    if (!root || !choice) {
        json_decref(root);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    json_object_set_new(root, "usage", usage(prompt_tokens, completion_tokens));
    return dump(root);
}

char *sq_oai_chunk(sq_oai_kind kind, const sq_oai_meta *m, const char *text, size_t len, bool first,
                   sq_oai_finish fin, bool with_usage, int prompt_tokens, int completion_tokens)
{
    json_t *root = envelope(kind, m, true);
    if (!root) return NULL;
    if (with_usage) {
        json_object_set_new(root, "choices", json_array());
        json_object_set_new(root, "usage", usage(prompt_tokens, completion_tokens));
        return dump(root);
    }
    json_t *choice;
    if (kind == SQ_OAI_CHAT) {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (fin == SQ_OAI_FINISH_NONE) json_object_set_new(delta, "content", text_value(text, len));
        choice = json_pack("{s:i, s:o, s:o}", "index", 0, "delta", delta, "finish_reason", finish_value(fin));
    } else {
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "text",
                           text_value(fin == SQ_OAI_FINISH_NONE ? text : "", fin == SQ_OAI_FINISH_NONE ? len : 0),
                           "logprobs", "finish_reason", finish_value(fin));
    }
    if (!choice) {
        json_decref(root);
        return NULL;
    }
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    return dump(root);
}

char *sq_oai_models(const char *model, long long created)
{
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model, "object",
                          "model", "created", (json_int_t)created, "owned_by", "sparq"));
}

char *sq_oai_error(int status, const char *message, const char *param)
{
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    return dump(json_pack("{s:{s:s, s:s, s:s?, s:n}}", "error", "message", message, "type", type, "param", param,
                          "code"));
}
