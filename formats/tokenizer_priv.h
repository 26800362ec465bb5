/* formats/tokenizer_priv.h — the sq_tokenizer struct, shared by
 * formats/tokenizer.c (load, encode, decode) and formats/chat_template.c.
 * Not a public interface. */
#ifndef SPARQ_FORMATS_TOKENIZER_PRIV_H
#define SPARQ_FORMATS_TOKENIZER_PRIV_H

#include "formats/tokenizer.h"
#include "formats/tokenizer_internal.h"

#define TOK_MAX_SPLITS 8

typedef struct tok_merge {
    uint64_t key; /* (id_a << 32) | id_b; UINT64_MAX = empty slot */
    int32_t rank; /* position in model.merges: lower merges first */
    int32_t id;   /* id of the merged token */
} tok_merge;

typedef struct tok_added {
    uint32_t off, len; /* content in str_pool */
    int32_t id;
} tok_added;

/* Byte trie of added-token contents (children as sibling lists). */
typedef struct tok_trie_node {
    int32_t child, sibling, tok; /* tok: id ending here or -1 */
    uint8_t byte;
} tok_trie_node;
typedef struct tok_trie {
    tok_trie_node *nodes;
    size_t n;
    uint8_t first[256]; /* can a token start with this byte? */
} tok_trie;

struct sq_tokenizer {
    int32_t n_ids;
    /* per id: text as in tokenizer.json, decoded bytes, flags */
    char *str_pool;
    uint32_t *str_off, *str_len;
    uint32_t *bytes_off; /* n_ids + 1 entries into bytes_pool */
    uint8_t *bytes_pool;
    uint8_t *id_flags;
    /* text -> id */
    int32_t *strmap;
    size_t strmap_cap;
    /* decoded bytes -> id (only with ignore_merges) */
    int32_t *bmap;
    size_t bmap_cap;
    /* merges */
    tok_merge *merges;
    size_t merge_cap;
    int32_t byte_id[256];
    bool ignore_merges;
    /* normalizer / pre-tokenizer */
    bool nfc, bytelevel;
    int n_splits;
    tok_split_kind splits[TOK_MAX_SPLITS];
    /* added tokens: matched on raw text / on normalized text */
    tok_trie trie_raw, trie_norm;
    /* special ids */
    int32_t eos, bos, pad, post_bos;
    bool add_bos;
    /* chat */
    char *chat_template;
    sq_chat_family chat;
    bool chat_trim; /* ChatML variant that trims each message's content */
};

/* Run only the pre-tokenizer's Split steps over valid UTF-8 s[0..n) (no
 * added tokens, no normalization): fn gets each piece in order. Used by
 * encoding and by the tests that compare piece boundaries with HF's. */
typedef sparq_status (*tok_piece_fn)(void *ctx, const uint8_t *s, size_t n);
sparq_status tok_pretokenize(const sq_tokenizer *t, const uint8_t *s, size_t n, tok_piece_fn fn, void *ctx);

/* Recognise the family of a chat template text (NULL -> SQ_CHAT_NONE).
 * SPARQ_E_NOMEM only: a template it does not know is SQ_CHAT_UNKNOWN. */
sparq_status tok_chat_detect(const char *tmpl, sq_chat_family *family, bool *trim);

#endif
