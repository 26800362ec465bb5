/* tests/fuzz/fuzz_tokenizer_encode.c — libFuzzer target for the encoder:
 * random bytes as text. The first byte picks the tokenizer (Qwen2 regex +
 * NFC, or DeepSeek's three Split regexes) and parse_special; the rest is the
 * text. Invalid UTF-8 must be refused with SPARQ_E_UTF8; valid text must
 * encode, decode back to itself (to its NFC form for the NFC tokenizer: we
 * check that decoding is stable under a second round trip), and stream
 * through the detokenizer to the same bytes. The tokenizers are built once,
 * in memory: a vocab of the 256 byte characters, a few merges and special
 * tokens. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/tokenizer.h"
#include "fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const qwen2_re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char *const ds_re = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?["
                                 "\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

static json_t *split(const char *re)
{
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", re, "behavior", "Isolated",
                     "invert", 0);
}

static sq_tokenizer *build(int kind)
{
    json_t *vocab = json_object();
    int id = 0, n = 0;
    char tok[8];
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        unsigned cp = keep ? (unsigned)b : 256u + (unsigned)n++;
        int k = 0;
        if (cp < 0x80) tok[k++] = (char)cp;
        else {
            tok[k++] = (char)(0xC0 | (cp >> 6));
            tok[k++] = (char)(0x80 | (cp & 0x3F));
        }
        tok[k] = 0;
        json_object_set_new(vocab, tok, json_integer(id++));
    }
    static const char *const merges[][2] = {{"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "n"},
                                            {"\xC4\xA0", "\xC4\xA0"}, {"e", "r"}, {"1", "2"}, {"\xC3\xA4", "\xC2\xB8"}};
    json_t *ml = json_array();
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        char m[16];
        snprintf(m, sizeof m, "%s%s", merges[i][0], merges[i][1]);
        if (!json_object_get(vocab, m)) json_object_set_new(vocab, m, json_integer(id++));
        json_array_append_new(ml, json_pack("[s,s]", merges[i][0], merges[i][1]));
    }
    json_t *added = json_pack("[{s:i,s:s,s:b,s:b},{s:i,s:s,s:b,s:b},{s:i,s:s,s:b,s:b}]", "id", id, "content",
                              "<|im_end|>", "special", 1, "normalized", 0, "id", id + 1, "content", "<|im_start|>",
                              "special", 1, "normalized", 0, "id", id + 2, "content", "her", "special", 0,
                              "normalized", 1);
    json_t *pre = json_array();
    if (kind == 0) json_array_append_new(pre, split(qwen2_re));
    else {
        json_array_append_new(pre, split("\\p{N}{1,3}"));
        json_array_append_new(
            pre, split("[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+"));
        json_array_append_new(pre, split(ds_re));
    }
    json_array_append_new(pre, json_pack("{s:s,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0));
    json_t *root = json_pack("{s:o, s:o, s:{s:s,s:o}, s:{s:s}, s:{s:s,s:o,s:o}}", "added_tokens", added, "normalizer",
                             kind == 0 ? json_pack("{s:s}", "type", "NFC") : json_null(), "pre_tokenizer", "type",
                             "Sequence", "pretokenizers", pre, "decoder", "type", "ByteLevel", "model", "type", "BPE",
                             "vocab", vocab, "merges", ml);
    char *js = json_dumps(root, 0);
    json_decref(root);
    sq_tokenizer *t = NULL;
    if (sq_tokenizer_load_json(&t, js, strlen(js), "fuzz-builtin") != SPARQ_OK) abort();
    free(js);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sq_tokenizer *toks[2];
    if (!toks[0]) {
        toks[0] = build(0);
        toks[1] = build(1);
    }
    if (size < 1) return 0;
    const sq_tokenizer *t = toks[data[0] & 1];
    bool special = data[0] & 2;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids = NULL;
    size_t n = 0;
    sparq_status st = sq_tokenizer_encode(t, text, len, special, &ids, &n);
    if (st == SPARQ_E_UTF8) return 0;
    if (st != SPARQ_OK) __builtin_trap();
    char *out = NULL;
    size_t on = 0;
    if (sq_tokenizer_decode(t, ids, n, false, &out, &on) != SPARQ_OK) __builtin_trap();
    /* no normalizer: exact round trip; NFC: the decoded text is NFC, so it
     * must survive a second round trip unchanged */
    if (t == toks[1] && (on != len || memcmp(out, text, len))) __builtin_trap();
    if (t == toks[0]) {
        int32_t *ids2;
        size_t n2;
        char *out2;
        size_t on2;
        if (sq_tokenizer_encode(t, out, on, special, &ids2, &n2) != SPARQ_OK) __builtin_trap();
        if (sq_tokenizer_decode(t, ids2, n2, false, &out2, &on2) != SPARQ_OK) __builtin_trap();
        if (on2 != on || memcmp(out, out2, on)) __builtin_trap();
        sparq_free(ids2);
        sparq_free(out2);
    }
    fuzz_check_stream(t, ids, n, out, on);
    sparq_free(out);
    sparq_free(ids);
    return 0;
}
