/* quantize/recipe.c — `sparq quantize --recipe FILE`: the bits of chosen
 * tensors as lines "GLOB=K" (an fnmatch glob over tensor keys such as
 * "layers.1[89].ffn.experts.*", K in 1..8), '#' starting a comment, blank
 * lines ignored. The rules keep the file's order: the bits of a tensor are
 * those of the last rule whose glob matches its key (quantize/layer.c applies
 * them after the role defaults and the architecture's defaults, and before
 * --bits-for). A line that is not a rule is refused with FILE:LINE. */
#include <ctype.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "quantize/driver.h"

#define RECIPE_MAX_BYTES (1u << 20) /* a recipe is a few hundred lines; anything larger is not one */

void qz_recipe_free(qz_recipe *r)
{
    sparq_free(r->rules);
    sparq_free(r->text);
    memset(r, 0, sizeof *r);
}

sparq_status qz_recipe_parse(const char *name, const char *data, size_t n, qz_recipe *out)
{
    memset(out, 0, sizeof *out);
    RETURN_IF(n > RECIPE_MAX_BYTES, SPARQ_E_FORMAT, "%s: %zu bytes; a recipe is at most %u", name, n,
              RECIPE_MAX_BYTES);
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += data[i] == '\n';
    out->text = sparq_malloc(n + 1);
    out->rules = sparq_calloc(lines, sizeof *out->rules);
    if (!out->text || !out->rules) {
        qz_recipe_free(out);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    memcpy(out->text, data, n);
    out->text[n] = '\0';
    char *p = out->text, *end = out->text + n;
    for (int line = 1; p <= end; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        *e = '\0';
        char *hash = strchr(p, '#');
        if (hash) *hash = '\0', e = hash;
        while (p < e && isspace((unsigned char)*p)) p++;
        while (e > p && isspace((unsigned char)e[-1])) *--e = '\0';
        if (p < e) {
            if (memchr(p, '\0', (size_t)(e - p))) {
                sparq_status st = sparq_err(SPARQ_E_FORMAT, "%s:%d: a NUL byte in the line", name, line);
                qz_recipe_free(out);
                return st;
            }
            char *eq = strrchr(p, '=');
            char *k = eq ? eq + 1 : NULL;
            while (k && isspace((unsigned char)*k)) k++;
            char *ge = eq;
            while (ge && ge > p && isspace((unsigned char)ge[-1])) ge--;
            bool ok = eq && ge > p && k && k[0] >= '1' && k[0] <= '8' && k[1] == '\0';
            if (!ok) {
                sparq_status st = sparq_err(SPARQ_E_FORMAT, "%s:%d: expected GLOB=K with K in 1..8, got '%.80s'", name,
                                            line, p);
                qz_recipe_free(out);
                return st;
            }
            *ge = '\0';
            out->rules[out->n++] = (qz_bits_rule){p, k[0] - '0'};
        }
        if (!nl) break;
        p = nl + 1;
    }
    return SPARQ_OK;
}

sparq_status qz_recipe_load(const char *path, qz_recipe *out)
{
    memset(out, 0, sizeof *out);
    char *data = NULL;
    size_t n = 0;
    FORWARD_IF(sparq_file_read_all(path, RECIPE_MAX_BYTES + 1, &data, &n));
    sparq_status st = qz_recipe_parse(path, data, n, out);
    sparq_free(data);
    return st;
}
