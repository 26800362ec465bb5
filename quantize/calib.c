/* quantize/calib.c — the calibration input: the text of the --calib files
 * (plain text, or the "text" field of every line of a .jsonl) tokenized with
 * the source model's tokenizer and cut into rows of calib_len tokens spread
 * over the whole text, plus a share of rows of uniform random token ids
 * (--random-rows-frac; seeded, so a resumed run rebuilds the same rows). The
 * rows are built once per run; layer 0's input is their embedding. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/tokenizer.h"
#include "quantize/job.h"

static sparq_status append_text(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 3 > *cap) {
        size_t c = (*cap ? *cap * 2 : 1 << 16);
        while (c < *len + n + 3) c *= 2;
        char *b = sparq_realloc(*buf, c);
        RETURN_IF(!b, SPARQ_E_NOMEM, "out of memory reading calibration text");
        *buf = b, *cap = c;
    }
    if (*len) {
        memcpy(*buf + *len, "\n\n", 2);
        *len += 2;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return SPARQ_OK;
}

static sparq_status read_calib_text(const qz_opts *o, char **out, size_t *out_len)
{
    char *all = NULL;
    size_t len = 0, cap = 0;
    for (int f = 0; f < o->n_calib; f++) {
        char *data = NULL;
        size_t n = 0;
        sparq_status st = sparq_file_read_all(o->calib[f], (size_t)1 << 31, &data, &n);
        if (st != SPARQ_OK) {
            sparq_free(all);
            return st;
        }
        size_t pl = strlen(o->calib[f]);
        bool jsonl = pl > 6 && strcmp(o->calib[f] + pl - 6, ".jsonl") == 0;
        if (!jsonl) {
            st = append_text(&all, &len, &cap, data, n);
        } else {
            size_t line_no = 0;
            for (char *line = data, *end; line && *line && st == SPARQ_OK; line = end ? end + 1 : NULL) {
                end = strchr(line, '\n');
                if (end) *end = 0;
                line_no++;
                if (!*line) continue;
                json_error_t jerr;
                json_t *j = json_loads(line, 0, &jerr);
                const char *t = j ? json_string_value(json_object_get(j, "text")) : NULL;
                if (!t)
                    st = sparq_err(SPARQ_E_FORMAT, "%s:%zu: expected a JSON object with a \"text\" string",
                                   o->calib[f], line_no);
                else
                    st = append_text(&all, &len, &cap, t, strlen(t));
                json_decref(j);
            }
        }
        sparq_free(data);
        if (st != SPARQ_OK) {
            sparq_free(all);
            return st;
        }
    }
    RETURN_IF(!all, SPARQ_E_ARG, "no calibration text (give --calib FILE)");
    *out = all;
    *out_len = len;
    return SPARQ_OK;
}

sparq_status qz_check_calib_files(const qz_opts *o)
{
    RETURN_IF(o->n_calib == 0, SPARQ_E_ARG, "no calibration text (give --calib FILE)");
    for (int f = 0; f < o->n_calib; f++) {
        int fd;
        sparq_status st = sparq_open_regular(o->calib[f], &fd, NULL);
        if (st != SPARQ_OK) return sparq_err_context(st, "calibration text");
        close(fd);
    }
    return SPARQ_OK;
}

/* rows × len token ids: text rows first, then uniform random rows. */
sparq_status qz_build_calib_tokens(const qz_opts *o, int vocab, int32_t **out, int *rows_out,
                                   int *random_out)
{
    int T = o->calib_len;
    int n_random = (int)lround(o->calib_rows * o->random_rows_frac);
    if (n_random >= o->calib_rows) n_random = o->calib_rows - 1;
    int n_text = o->calib_rows - n_random;
    char *text = NULL;
    size_t tlen = 0;
    FORWARD_IF(read_calib_text(o, &text, &tlen));
    sq_tokenizer *tok = NULL;
    sparq_status st = sq_tokenizer_load(&tok, o->model_dir);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (st == SPARQ_OK) st = sq_tokenizer_encode(tok, text, tlen, false, &ids, &n_ids);
    sq_tokenizer_free(tok);
    sparq_free(text);
    FORWARD_IF(st);
    if ((size_t)n_text * T > n_ids) n_text = (int)(n_ids / (size_t)T);
    if (n_text < 1) {
        sparq_free(ids);
        return sparq_err(SPARQ_E_ARG, "calibration text has %zu tokens, fewer than one row of --calib-len %d",
                         n_ids, T);
    }
    int rows = n_text + n_random;
    int32_t *tk = sparq_malloc((size_t)rows * T * sizeof *tk);
    if (!tk) {
        sparq_free(ids);
        return sparq_err(SPARQ_E_NOMEM, "out of memory for calibration tokens");
    }
    /* Spread the text rows over the whole text. */
    size_t stride = n_ids / (size_t)n_text;
    for (int r = 0; r < n_text; r++) memcpy(tk + (size_t)r * T, ids + (size_t)r * stride, (size_t)T * sizeof *tk);
    uint64_t s = qz_mix64(o->seed ^ 0xCA11B4A7ull);
    for (size_t i = (size_t)n_text * T; i < (size_t)rows * T; i++) {
        s = qz_mix64(s);
        tk[i] = (int32_t)(s % (uint64_t)vocab);
    }
    sparq_free(ids);
    *out = tk;
    *rows_out = rows;
    *random_out = n_random;
    return SPARQ_OK;
}
