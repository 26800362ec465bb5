/* tests/fuzz/fuzz_engram_normalize.c — libFuzzer target for the Engram key
 * normalizer (sq_engram_normalize): arbitrary bytes as text. Invalid UTF-8
 * must be refused with SPARQ_E_UTF8 and nothing returned; valid text must
 * give valid UTF-8 that holds none of what the normalizer removes (tab, CR,
 * LF, U+E000, General_Category M, characters with a compatibility
 * decomposition), which must in turn normalize without error. The normalizer
 * is not idempotent (a U+E000 next to the end becomes a space that a second
 * pass strips), so only these properties are checked. */
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/engram_vocab.h"
#include "formats/tokenizer_internal.h"
#include "formats/unicode_tables.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *out = NULL;
    size_t on = 0;
    bool valid = tok_utf8_check(data, size) == size;
    sparq_status st = sq_engram_normalize((const char *)data, size, &out, &on);
    if (!valid) {
        if (st != SPARQ_E_UTF8 || out || on) __builtin_trap();
        return 0;
    }
    if (st == SPARQ_E_NOMEM) return 0;
    if (st != SPARQ_OK || !out || out[on] != 0) __builtin_trap();
    const uint8_t *o = (const uint8_t *)out;
    if (tok_utf8_check(o, on) != on) __builtin_trap();
    int len;
    for (size_t i = 0; i < on; i += (size_t)len) {
        uint32_t cp = tok_utf8_next(o, i, &len);
        if (cp == '\t' || cp == '\r' || cp == '\n' || cp == 0xE000) __builtin_trap();
        if (uni_norm_of(cp) & (UNI_N_MARK | UNI_N_KDECOMP)) __builtin_trap();
        if (cp >= 0xAC00 && cp < 0xAC00 + 11172) __builtin_trap(); /* Hangul syllables decompose */
    }
    char *again = NULL;
    size_t an = 0;
    st = sq_engram_normalize(out, on, &again, &an);
    if (st != SPARQ_OK && st != SPARQ_E_NOMEM) __builtin_trap();
    sparq_free(again);
    sparq_free(out);
    return 0;
}
