/* tests/runtime/test_openai.c — request parsing (runtime/serve/openai.h): fields
 * read, OpenAI's defaults, every error naming its field; and the response,
 * chunk, model-list and error JSON read back with jansson. */
#include <jansson.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/serve/openai.h"
#include "t.h"

static sparq_status parse(const char *body, sq_oai_kind kind, sq_oai_request *r, const char **param)
{
    return sq_oai_parse(body, strlen(body), kind, r, param);
}

static void test_completion(void)
{
    sq_oai_request r;
    const char *param;
    CHECK(parse("{\"model\": \"x\", \"prompt\": \"Hi \\u00e9\", \"max_tokens\": 7, \"temperature\": 0.5, "
                "\"top_p\": 0.9, \"top_k\": 20, \"min_p\": 0.1, \"repeat_penalty\": 1.1, \"seed\": 42, "
                "\"stop\": [\"\\n\\n\", \"END\", \"\"], \"stream\": true, \"stream_options\": {\"include_usage\": true}, "
                "\"user\": \"ignored\", \"n\": 1, \"presence_penalty\": 0}",
                SQ_OAI_COMPLETION, &r, &param) == SPARQ_OK);
    CHECK(strcmp(r.prompt, "Hi \xc3\xa9") == 0);
    CHECK_EQ_INT(r.max_tokens, 7);
    CHECK_NEAR(r.sampler.temp, 0.5, 1e-7);
    CHECK_NEAR(r.sampler.top_p, 0.9, 1e-7);
    CHECK_EQ_INT(r.sampler.top_k, 20);
    CHECK_NEAR(r.sampler.min_p, 0.1, 1e-7);
    CHECK_NEAR(r.sampler.repeat_penalty, 1.1, 1e-6);
    CHECK(r.has_seed && r.sampler.seed == 42);
    CHECK_EQ_INT(r.n_stop, 2); /* the empty stop string is dropped */
    CHECK(strcmp(r.stop[0], "\n\n") == 0 && strcmp(r.stop[1], "END") == 0);
    CHECK(r.stream && r.include_usage);
    sq_oai_request_free(&r);
    /* defaults: OpenAI's (temperature 1, top_p 1), no top-k / min-p, max_tokens unset */
    CHECK(parse("{\"prompt\": [\"one\"]}", SQ_OAI_COMPLETION, &r, &param) == SPARQ_OK);
    CHECK(strcmp(r.prompt, "one") == 0);
    CHECK_EQ_INT(r.max_tokens, -1);
    CHECK_NEAR(r.sampler.temp, 1.0, 0);
    CHECK_NEAR(r.sampler.top_p, 1.0, 0);
    CHECK_EQ_INT(r.sampler.top_k, 0);
    CHECK_NEAR(r.sampler.min_p, 0.0, 0);
    CHECK(!r.has_seed && !r.stream && r.n_stop == 0);
    sq_oai_request_free(&r);
}

static void test_chat(void)
{
    sq_oai_request r;
    const char *param;
    CHECK(parse("{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
                "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}, "
                "{\"role\": \"assistant\", \"content\": null}], \"max_completion_tokens\": 3, \"stop\": \"x\"}",
                SQ_OAI_CHAT, &r, &param) == SPARQ_OK);
    CHECK_EQ_INT(r.n_msgs, 3);
    CHECK(r.msgs[0].role == SQ_ROLE_SYSTEM && strcmp(r.msgs[0].content, "Be brief.") == 0);
    CHECK(r.msgs[1].role == SQ_ROLE_USER && strcmp(r.msgs[1].content, "ab") == 0);
    CHECK(r.msgs[2].role == SQ_ROLE_ASSISTANT && strcmp(r.msgs[2].content, "") == 0);
    CHECK_EQ_INT(r.max_tokens, 3);
    CHECK(r.n_stop == 1 && strcmp(r.stop[0], "x") == 0);
    sq_oai_request_free(&r);
}

static void test_errors(void)
{
    static const struct {
        sq_oai_kind kind;
        const char *body, *param, *msg;
        sparq_status st;
    } cases[] = {
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\"", NULL, "not valid JSON", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "[1]", NULL, "JSON object", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": 3}", "prompt", "expected a string", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{}", "prompt", "prompt", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt", "one prompt", SPARQ_E_UNSUPPORTED},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": -1}", "max_tokens", "outside", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 1.5}", "max_tokens", "integer", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"temperature\": \"hot\"}", "temperature", "number", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"top_p\": 0}", "top_p", "outside", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"seed\": -2}", "seed", "non-negative", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"n\": 2}", "n", "one completion", SPARQ_E_UNSUPPORTED},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 3}", "logprobs", "not supported", SPARQ_E_UNSUPPORTED},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"echo\": true}", "echo", "not supported", SPARQ_E_UNSUPPORTED},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"frequency_penalty\": 0.5}", "frequency_penalty", "repeat_penalty",
         SPARQ_E_UNSUPPORTED},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", "stop", "at most 4",
         SPARQ_E_RANGE},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"stop\": [1]}", "stop", "strings", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"stream\": 1}", "stream", "true or false", SPARQ_E_FORMAT},
        {SQ_OAI_COMPLETION, "{\"prompt\": \"a\", \"prompt\": \"b\"}", NULL, "duplicate", SPARQ_E_FORMAT},
        {SQ_OAI_CHAT, "{\"messages\": []}", "messages", "non-empty", SPARQ_E_FORMAT},
        {SQ_OAI_CHAT, "{\"messages\": [{\"content\": \"a\"}]}", "messages", "role", SPARQ_E_FORMAT},
        {SQ_OAI_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"a\"}]}", "messages", "role must be",
         SPARQ_E_UNSUPPORTED},
        {SQ_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages",
         "only text parts", SPARQ_E_UNSUPPORTED},
        {SQ_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages", "string", SPARQ_E_FORMAT},
        {SQ_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": []}", "tools",
         "not supported", SPARQ_E_UNSUPPORTED},
        {SQ_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"response_format\": {\"type\": \"json_object\"}}",
         "response_format", "text", SPARQ_E_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sq_oai_request r;
        const char *param = "unset";
        const sparq_status st = parse(cases[i].body, cases[i].kind, &r, &param);
        CHECK_MSG(st == cases[i].st, "case %zu (%s): status %d", i, cases[i].body, (int)st);
        CHECK_MSG(cases[i].param ? param && strcmp(param, cases[i].param) == 0 : param == NULL,
                  "case %zu: param %s", i, param ? param : "(null)");
        CHECK_STR_CONTAINS(sparq_errmsg(), cases[i].msg);
        CHECK(r.prompt == NULL && r.n_msgs == 0 && r.n_stop == 0); /* freed on error */
    }
}

static json_t *load(char *s)
{
    CHECK(s != NULL);
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    CHECK(j != NULL);
    sparq_free(s);
    return j;
}

static void test_responses(void)
{
    const sq_oai_meta m = {"cmpl-1", "tiny", 1700000000};
    json_t *j = load(sq_oai_response(SQ_OAI_COMPLETION, &m, "ab\"c", 4, SQ_OAI_FINISH_LENGTH, 3, 5));
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(strcmp(json_string_value(json_object_get(j, "object")), "text_completion") == 0);
    CHECK(strcmp(json_string_value(json_object_get(c0, "text")), "ab\"c") == 0);
    CHECK(strcmp(json_string_value(json_object_get(c0, "finish_reason")), "length") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 8);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "created")), 1700000000);
    json_decref(j);
    j = load(sq_oai_response(SQ_OAI_CHAT, &m, "hi", 2, SQ_OAI_FINISH_STOP, 1, 1));
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(strcmp(json_string_value(json_object_get(j, "object")), "chat.completion") == 0);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(c0, "message"), "content")), "hi") == 0);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(c0, "message"), "role")), "assistant") == 0);
    CHECK(strcmp(json_string_value(json_object_get(c0, "finish_reason")), "stop") == 0);
    json_decref(j);
    /* chat chunks: role only in the first, content until the end, then an empty delta with the reason */
    j = load(sq_oai_chunk(SQ_OAI_CHAT, &m, "x", 1, true, SQ_OAI_FINISH_NONE, false, 0, 0));
    json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    CHECK(json_string_value(json_object_get(d, "role")) && strcmp(json_string_value(json_object_get(d, "content")), "x") == 0);
    CHECK(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason")));
    CHECK(strcmp(json_string_value(json_object_get(j, "object")), "chat.completion.chunk") == 0);
    json_decref(j);
    j = load(sq_oai_chunk(SQ_OAI_CHAT, &m, "", 0, false, SQ_OAI_FINISH_STOP, false, 0, 0));
    d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    CHECK(json_object_size(d) == 0);
    json_decref(j);
    j = load(sq_oai_chunk(SQ_OAI_COMPLETION, &m, "", 0, false, SQ_OAI_FINISH_LENGTH, true, 4, 6));
    CHECK(json_array_size(json_object_get(j, "choices")) == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 6);
    json_decref(j);
    j = load(sq_oai_models("tiny", 5));
    CHECK(strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "tiny") == 0);
    json_decref(j);
    j = load(sq_oai_error(401, "no key", NULL));
    json_t *e = json_object_get(j, "error");
    CHECK(strcmp(json_string_value(json_object_get(e, "type")), "authentication_error") == 0);
    CHECK(strcmp(json_string_value(json_object_get(e, "message")), "no key") == 0);
    CHECK(json_is_null(json_object_get(e, "param")));
    json_decref(j);
    j = load(sq_oai_error(400, "bad", "top_p"));
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "param")), "top_p") == 0);
    json_decref(j);
}

int main(void)
{
    RUN(test_completion);
    RUN(test_chat);
    RUN(test_errors);
    RUN(test_responses);
    return t_summary();
}
