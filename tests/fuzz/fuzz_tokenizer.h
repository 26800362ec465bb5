/* tests/fuzz/fuzz_tokenizer.h — a check both tokenizer fuzz targets share:
 * streaming the ids through the detokenizer must give exactly decode()'s
 * text (out, on), chunk by chunk. Traps otherwise. */
#ifndef SPARQ_TESTS_FUZZ_TOKENIZER_H
#define SPARQ_TESTS_FUZZ_TOKENIZER_H

#include <string.h>

#include "formats/tokenizer.h"

static inline void fuzz_check_stream(const sq_tokenizer *t, const int32_t *ids, size_t n, const char *out, size_t on)
{
    sq_detok d;
    sq_detok_init(&d, t, false);
    size_t total = 0;
    const char *s;
    size_t k;
    for (size_t i = 0; i < n; i++) {
        if (sq_detok_push(&d, ids[i], &s, &k) != SPARQ_OK) __builtin_trap();
        if (total + k > on || memcmp(out + total, s, k)) __builtin_trap();
        total += k;
    }
    if (sq_detok_flush(&d, &s, &k) != SPARQ_OK || total + k != on || memcmp(out + total, s, k)) __builtin_trap();
    sq_detok_free(&d);
}

#endif
