/* tests/fuzz/fuzz_tokenizer_load.c — libFuzzer target for the tokenizer.json
 * loader (sq_tokenizer_load_json). A file that loads is then used: encode a
 * fixed text with and without special tokens, decode the ids, and stream
 * them through the detokenizer; nothing may crash, leak or read out of
 * bounds, and decode must accept every id encode produced. */
#include <stddef.h>
#include <stdint.h>

#include "common/alloc.h"
#include "formats/tokenizer.h"
#include "fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sq_tokenizer *t = NULL;
    if (sq_tokenizer_load_json(&t, (const char *)data, size, "fuzz/tokenizer.json") != SPARQ_OK) {
        if (t) __builtin_trap();
        return 0;
    }
    static const char text[] = "Hello world, it's caf\xC3\xA9 \xF0\x9F\x98\x80 <|im_end|> 12345\r\n  \t x";
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (sq_tokenizer_encode(t, text, sizeof text - 1, special, &ids, &n) != SPARQ_OK) __builtin_trap();
        char *out = NULL;
        size_t on = 0;
        if (sq_tokenizer_decode(t, ids, n, false, &out, &on) != SPARQ_OK) __builtin_trap();
        fuzz_check_stream(t, ids, n, out, on);
        sparq_free(out);
        sparq_free(ids);
    }
    sq_tokenizer_free(t);
    return 0;
}
