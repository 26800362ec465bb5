/* formats/json.c — see json.h. jansson reports parse errors with a line and
 * column; we keep them and prefix the file name.
 *
 * jansson keeps its own malloc: its lexer ignores a failed allocation while
 * saving a string (2.14 load.c lex_save) and would hand back a silently
 * shortened key, so routing it through the fault injector tests jansson's
 * bugs, not ours. */
#include "formats/json.h"

#include <string.h>

#include "common/alloc.h"
#include "common/file.h"

sparq_status sq_json_parse(json_t **out, const char *text, size_t len, const char *name)
{
    *out = NULL;
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        if (json_error_code(&err) == json_error_out_of_memory)
            return sparq_err(SPARQ_E_NOMEM, "%s: out of memory parsing JSON", name);
        return sparq_err(SPARQ_E_FORMAT, "%s: invalid JSON at line %d column %d: %s", name, err.line,
                         err.column, err.text);
    }
    *out = root;
    return SPARQ_OK;
}

sparq_status sq_json_load_file(json_t **out, const char *path, size_t max_size)
{
    char *text;
    size_t len;
    *out = NULL;
    FORWARD_IF(sparq_file_read_all(path, max_size, &text, &len));
    sparq_status st = sq_json_parse(out, text, len, path);
    sparq_free(text);
    return st;
}

/* The member, or NULL when absent or JSON null. */
static const json_t *member(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

sparq_status sq_json_get_int(const json_t *obj, const char *key, int64_t *out, const char *name)
{
    const json_t *v = member(obj, key);
    if (!v) return SPARQ_OK;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return SPARQ_OK;
    }
    /* 4096.0 is an integer in Python's eyes; accept integral reals. */
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d > -9.2e18 && d < 9.2e18 && d == (double)(int64_t)d) { /* range first: the cast */
            *out = (int64_t)d;
            return SPARQ_OK;
        }
    }
    return sparq_err(SPARQ_E_FORMAT, "%s: '%s' must be an integer", name, key);
}

sparq_status sq_json_get_double(const json_t *obj, const char *key, double *out, const char *name)
{
    const json_t *v = member(obj, key);
    if (!v) return SPARQ_OK;
    RETURN_IF(!json_is_number(v), SPARQ_E_FORMAT, "%s: '%s' must be a number", name, key);
    *out = json_number_value(v);
    return SPARQ_OK;
}

sparq_status sq_json_get_bool(const json_t *obj, const char *key, bool *out, const char *name)
{
    const json_t *v = member(obj, key);
    if (!v) return SPARQ_OK;
    RETURN_IF(!json_is_boolean(v), SPARQ_E_FORMAT, "%s: '%s' must be true or false", name, key);
    *out = json_is_true(v);
    return SPARQ_OK;
}

sparq_status sq_json_get_str(const json_t *obj, const char *key, char *buf, size_t cap, const char *name)
{
    const json_t *v = member(obj, key);
    if (!v) return SPARQ_OK;
    RETURN_IF(!json_is_string(v), SPARQ_E_FORMAT, "%s: '%s' must be a string", name, key);
    size_t n = json_string_length(v);
    RETURN_IF(n >= cap, SPARQ_E_FORMAT, "%s: '%s' is too long (%zu bytes, at most %zu)", name, key, n, cap - 1);
    memcpy(buf, json_string_value(v), n + 1);
    return SPARQ_OK;
}
