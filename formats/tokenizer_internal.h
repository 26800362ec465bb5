/* formats/tokenizer_internal.h — pieces of the tokenizer shared between its
 * source files (not a public interface): UTF-8 helpers, the pre-tokenizer
 * regex scanners, NFC, and the lossy UTF-8 repair used by decode.
 *
 * All functions here assume the text is valid UTF-8 unless they say
 * otherwise (encode validates once, up front). */
#ifndef SPARQ_FORMATS_TOKENIZER_INTERNAL_H
#define SPARQ_FORMATS_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The Split regexes we implement exactly (see tok_split_match). */
typedef enum tok_split_kind {
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    TOK_SPLIT_QWEN2 = 0,
    /* \p{N}{1,3} */
    TOK_SPLIT_DS_DIGITS,
    /* [一-龥぀-ゟ゠-ヿ]+ */
    TOK_SPLIT_DS_CJK,
    /* [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
       ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    TOK_SPLIT_DS_MAIN,
    /* Llama 3: the Qwen2 regex with \p{N}{1,3} instead of \p{N} */
    TOK_SPLIT_LLAMA3,
    /* GPT-2's ByteLevel regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    TOK_SPLIT_GPT2,
    TOK_SPLIT_COUNT_
} tok_split_kind;

/* Which kind a tokenizer.json regex string is; false if not one we know. */
bool tok_split_kind_of(const char *regex, tok_split_kind *out);

/* Length in bytes of the match of regex k that starts at s[pos], treating
 * s[end] as the end of the subject (as HF does: each piece from an earlier
 * split is its own subject); 0 if the regex does not match at pos. */
size_t tok_split_match(tok_split_kind k, const uint8_t *s, size_t pos, size_t end);

/* Decode the code point at s[i] (valid UTF-8); *len = its byte length. */
static inline uint32_t tok_utf8_next(const uint8_t *s, size_t i, int *len)
{
    uint32_t c = s[i];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (c < 0xF0) {
        *len = 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *len = 4;
    return ((c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6) |
           (s[i + 3] & 0x3F);
}

/* Canonical decomposition of a Hangul syllable (algorithmic, UAX #15): its 2
 * or 3 conjoining jamo into out; returns how many, 0 if cp is not one. */
static inline int tok_hangul_decompose(uint32_t cp, uint32_t out[3])
{
    enum { S = 0xAC00, L = 0x1100, V = 0x1161, T = 0x11A7, NC = 21 * 28, TC = 28, SC = 19 * 21 * 28 };
    if (cp < S || cp >= S + SC) return 0;
    uint32_t si = cp - S;
    out[0] = L + si / NC;
    out[1] = V + (si % NC) / TC;
    if (!(si % TC)) return 2;
    out[2] = T + si % TC;
    return 3;
}

/* Encode cp as UTF-8 into out (≥ 4 bytes); returns the length. */
int tok_utf8_put(uint32_t cp, uint8_t *out);

/* Strict UTF-8 validation (no overlongs, surrogates or > U+10FFFF). Returns n
 * if valid, else the offset of the first byte of the first bad sequence. */
size_t tok_utf8_check(const uint8_t *s, size_t n);

/* Length of the longest valid-but-incomplete UTF-8 prefix at the END of s
 * (0..3): bytes a streaming decoder must hold back. */
size_t tok_utf8_incomplete_tail(const uint8_t *s, size_t n);

/* Append s[0..n) to *out (capacity *cap, length *len) with each maximal
 * invalid subsequence replaced by U+FFFD, exactly like Rust's
 * String::from_utf8_lossy. */
sparq_status tok_utf8_lossy_append(const uint8_t *s, size_t n, char **out, size_t *len, size_t *cap);

/* Grow a heap buffer (sparq_realloc, doubling) to hold at least `need` bytes. */
sparq_status tok_buf_reserve(char **buf, size_t *cap, size_t need);

/* NFC. If s[0..n) is already NFC by the quick check, *out = NULL (use s);
 * otherwise *out is a new buffer (sparq_free it) of *out_n bytes. */
sparq_status tok_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_n);

#endif
