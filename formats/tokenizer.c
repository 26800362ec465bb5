/* formats/tokenizer.c — loading tokenizer.json, BPE encode, decode and the
 * streaming detokenizer.
 *
 * Representation: BPE runs in the byte domain. Byte-level BPE maps every
 * input byte to one printable character and merges characters; we keep the
 * vocab as ids, resolve every merge "a b" to (id_a, id_b) -> (rank, id_ab) at
 * load time, and start a word from byte_id[byte]. No strings are touched
 * while encoding.
 *
 * Encode pipeline (mirrors HF tokenizers' order exactly):
 *   1. split out added tokens that are not `normalized` (leftmost-longest;
 *      a special token found while parse_special is false stays text);
 *   2. normalize each remaining piece (NFC if configured);
 *   3. split out `normalized` added tokens in the normalized piece;
 *   4. pre-tokenize: each Split regex in turn, each applying to the pieces of
 *      the previous one (behavior Isolated);
 *   5. BPE each pre-token: lowest merge rank first, leftmost on ties — a
 *      plain scan for short words, a binary heap over a linked list for long
 *      ones (no quadratic blow-up); results cached per call by pre-token.
 *
 * Decode: each id's bytes are precomputed at load (ByteLevel decoder: a token
 * whose characters are all in the byte map becomes those bytes, otherwise its
 * own UTF-8), concatenated, then repaired like Rust's from_utf8_lossy. */
#include "formats/tokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/tokenizer_internal.h"
#include "formats/tokenizer_priv.h"

#define TOK_MAX_IDS (1 << 24)
#define TOK_MAX_JSON ((size_t)1 << 31)
#define TOK_SHORT_WORD 24

enum { ID_ADDED = 1, ID_SPECIAL = 2, ID_PRESENT = 4 };

/* ---- small hash helpers ---------------------------------------------------- */

static inline uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* string (token text as in tokenizer.json) -> id; open addressing over ids */
static int32_t strmap_find(const sq_tokenizer *t, const char *s, size_t n)
{
    size_t mask = t->strmap_cap - 1, h = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        int32_t id = t->strmap[h];
        if (id < 0) return -1;
        if (t->str_len[id] == n && !memcmp(t->str_pool + t->str_off[id], s, n)) return id;
        h = (h + 1) & mask;
    }
}

static void strmap_put(sq_tokenizer *t, int32_t id)
{
    const char *s = t->str_pool + t->str_off[id];
    size_t n = t->str_len[id];
    size_t mask = t->strmap_cap - 1, h = (size_t)hash_bytes(s, n) & mask;
    while (t->strmap[h] >= 0) {
        int32_t o = t->strmap[h];
        if (t->str_len[o] == n && !memcmp(t->str_pool + t->str_off[o], s, n)) {
            t->strmap[h] = id; /* an added token replaces a vocab entry of the same text */
            return;
        }
        h = (h + 1) & mask;
    }
    t->strmap[h] = id;
}

/* merges: (a, b) -> (rank, id) */
static const tok_merge *merge_find(const sq_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->merge_cap - 1, h = (size_t)mix64(key) & mask;
    for (;;) {
        const tok_merge *m = &t->merges[h];
        if (m->key == UINT64_MAX) return NULL;
        if (m->key == key) return m;
        h = (h + 1) & mask;
    }
}

/* ---- byte-level map --------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order. */
static void bytelevel_tables(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    int n = 0;
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* ---- loading ------------------------------------------------------------------ */

typedef struct loader {
    sq_tokenizer *t;
    const char *name;
    /* growing string pool */
    size_t pool_len, pool_cap;
} loader;

static sparq_status pool_add(loader *L, const char *s, size_t n, uint32_t *off)
{
    sq_tokenizer *t = L->t;
    if (L->pool_len + n + 1 > L->pool_cap) {
        size_t nc = L->pool_cap ? L->pool_cap : 4096;
        while (nc < L->pool_len + n + 1) nc *= 2;
        RETURN_IF(nc > UINT32_MAX, SPARQ_E_RANGE, "%s: token strings exceed 4 GB", L->name);
        char *p = sparq_realloc(t->str_pool, nc);
        RETURN_IF(!p, SPARQ_E_NOMEM, "%s: out of memory for token strings", L->name);
        t->str_pool = p;
        L->pool_cap = nc;
    }
    memcpy(t->str_pool + L->pool_len, s, n);
    t->str_pool[L->pool_len + n] = 0;
    *off = (uint32_t)L->pool_len;
    L->pool_len += n + 1;
    return SPARQ_OK;
}

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* field must be absent, null, or equal to `ok_bool` / empty string */
static sparq_status want_off(const loader *L, const json_t *obj, const char *where, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v)) return SPARQ_OK;
    if (json_is_string(v) && json_string_length(v) == 0) return SPARQ_OK;
    return sparq_err(SPARQ_E_UNSUPPORTED, "%s: %s.%s is set; sparq's tokenizer does not support it", L->name,
                     where, key);
}

static sparq_status get_type(const loader *L, const json_t *obj, const char *where, const char **type)
{
    RETURN_IF(!json_is_object(obj), SPARQ_E_FORMAT, "%s: %s must be an object, not %s", L->name, where,
              jtype(obj));
    const json_t *ty = json_object_get(obj, "type");
    RETURN_IF(!json_is_string(ty), SPARQ_E_FORMAT, "%s: %s.type is missing or not a string", L->name, where);
    *type = json_string_value(ty);
    return SPARQ_OK;
}

typedef sparq_status (*load_fn)(loader *L, const json_t *obj, const char *where);

/* A "Sequence": obj[key] must be an array; fn loads each element. */
static sparq_status load_sequence(loader *L, const json_t *obj, const char *where, const char *key,
                                  const char *elem_where, load_fn fn)
{
    const json_t *list = json_object_get(obj, key);
    RETURN_IF(!json_is_array(list), SPARQ_E_FORMAT, "%s: %s.%s must be an array", L->name, where, key);
    size_t i;
    const json_t *e;
    json_array_foreach(list, i, e) FORWARD_IF(fn(L, e, elem_where));
    return SPARQ_OK;
}

static sparq_status load_normalizer(loader *L, const json_t *n, const char *where)
{
    if (!n || json_is_null(n)) return SPARQ_OK;
    const char *type = "";
    FORWARD_IF(get_type(L, n, where, &type));
    if (!strcmp(type, "NFC")) {
        L->t->nfc = true;
        return SPARQ_OK;
    }
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, n, where, "normalizers", "normalizer.normalizers[]", load_normalizer);
    return sparq_err(SPARQ_E_UNSUPPORTED, "%s: %s type \"%s\" is not supported (only NFC)", L->name, where, type);
}

static sparq_status load_bytelevel(loader *L, const json_t *p, const char *where, bool pre)
{
    const json_t *aps = json_object_get(p, "add_prefix_space");
    RETURN_IF(pre && json_is_true(aps), SPARQ_E_UNSUPPORTED,
              "%s: %s.add_prefix_space = true is not supported", L->name, where);
    if (pre) {
        const json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            RETURN_IF(L->t->n_splits >= TOK_MAX_SPLITS, SPARQ_E_UNSUPPORTED, "%s: too many pre-tokenizers",
                      L->name);
            L->t->splits[L->t->n_splits++] = TOK_SPLIT_GPT2;
        }
        L->t->bytelevel = true;
    }
    return SPARQ_OK;
}

static sparq_status load_pretok(loader *L, const json_t *p, const char *where)
{
    sq_tokenizer *t = L->t;
    RETURN_IF(!p || json_is_null(p), SPARQ_E_UNSUPPORTED,
              "%s: pre_tokenizer is null; only byte-level tokenizers are supported", L->name);
    const char *type = "";
    FORWARD_IF(get_type(L, p, where, &type));
    RETURN_IF(t->bytelevel, SPARQ_E_UNSUPPORTED, "%s: %s \"%s\" after ByteLevel is not supported", L->name,
              where, type);
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, p, where, "pretokenizers", "pre_tokenizer.pretokenizers[]", load_pretok);
    if (!strcmp(type, "ByteLevel")) return load_bytelevel(L, p, where, true);
    if (!strcmp(type, "Split")) {
        const json_t *pat = json_object_get(p, "pattern");
        const json_t *re = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
        RETURN_IF(!json_is_string(re), SPARQ_E_UNSUPPORTED,
                  "%s: %s.pattern must be {\"Regex\": ...} (String patterns are not supported)", L->name, where);
        const json_t *beh = json_object_get(p, "behavior");
        RETURN_IF(!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated"), SPARQ_E_UNSUPPORTED,
                  "%s: %s.behavior must be \"Isolated\"", L->name, where);
        FORWARD_IF(want_off(L, p, where, "invert"));
        tok_split_kind k;
        RETURN_IF(!tok_split_kind_of(json_string_value(re), &k), SPARQ_E_UNSUPPORTED,
                  "%s: %s.pattern.Regex is not one of the regexes sparq implements (Qwen2/Qwen3, Llama 3, "
                  "DeepSeek V3/V4, GPT-2): %.120s",
                  L->name, where, json_string_value(re));
        RETURN_IF(t->n_splits >= TOK_MAX_SPLITS, SPARQ_E_UNSUPPORTED, "%s: too many pre-tokenizers", L->name);
        t->splits[t->n_splits++] = k;
        return SPARQ_OK;
    }
    return sparq_err(SPARQ_E_UNSUPPORTED, "%s: %s type \"%s\" is not supported", L->name, where, type);
}

static sparq_status load_post(loader *L, const json_t *p, const char *where)
{
    if (!p || json_is_null(p)) return SPARQ_OK;
    const char *type = "";
    FORWARD_IF(get_type(L, p, where, &type));
    if (!strcmp(type, "ByteLevel")) return SPARQ_OK;
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, p, where, "processors", "post_processor.processors[]", load_post);
    if (!strcmp(type, "TemplateProcessing")) {
        const json_t *single = json_object_get(p, "single");
        const json_t *first = json_is_array(single) ? json_array_get(single, 0) : NULL;
        const json_t *sp = first ? json_object_get(first, "SpecialToken") : NULL;
        const json_t *id = sp ? json_object_get(sp, "id") : NULL;
        if (json_is_string(id)) {
            L->t->add_bos = true;
            L->t->post_bos = strmap_find(L->t, json_string_value(id), json_string_length(id));
        }
        return SPARQ_OK;
    }
    return sparq_err(SPARQ_E_UNSUPPORTED, "%s: %s type \"%s\" is not supported", L->name, where, type);
}

typedef struct pending_added {
    int32_t id;
    const json_t *content;
    bool special, normalized;
} pending_added;

static sparq_status set_id_string(loader *L, int32_t id, const char *s, size_t n)
{
    uint32_t off = 0;
    FORWARD_IF(pool_add(L, s, n, &off));
    L->t->str_off[id] = off;
    L->t->str_len[id] = (uint32_t)n;
    return SPARQ_OK;
}

/* Build the byte trie of one added-token set. */
static sparq_status build_trie(loader *L, tok_trie *tr, const tok_added *toks, size_t n)
{
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) cap += toks[i].len;
    tr->nodes = sparq_calloc(cap, sizeof *tr->nodes);
    RETURN_IF(!tr->nodes, SPARQ_E_NOMEM, "%s: out of memory for the added-token trie", L->name);
    tr->n = 1;
    tr->nodes[0].child = tr->nodes[0].sibling = -1;
    tr->nodes[0].tok = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t cur = 0;
        const uint8_t *s = (const uint8_t *)L->t->str_pool + toks[i].off;
        for (uint32_t k = 0; k < toks[i].len; k++) {
            int32_t c = tr->nodes[cur].child;
            while (c >= 0 && tr->nodes[c].byte != s[k]) c = tr->nodes[c].sibling;
            if (c < 0) {
                c = (int32_t)tr->n++;
                tr->nodes[c].byte = s[k];
                tr->nodes[c].child = -1;
                tr->nodes[c].tok = -1;
                tr->nodes[c].sibling = tr->nodes[cur].child;
                tr->nodes[cur].child = c;
            }
            cur = c;
        }
        if (tr->nodes[cur].tok < 0) tr->nodes[cur].tok = toks[i].id; /* first listed wins */
        tr->first[s[0]] = 1;
    }
    return SPARQ_OK;
}

static sparq_status load_added(loader *L, const json_t *list, pending_added **out, size_t *n_out, int32_t *max_id)
{
    *out = NULL;
    *n_out = 0;
    if (!list || json_is_null(list)) return SPARQ_OK;
    RETURN_IF(!json_is_array(list), SPARQ_E_FORMAT, "%s: added_tokens must be an array, not %s", L->name,
              jtype(list));
    size_t n = json_array_size(list);
    if (!n) return SPARQ_OK;
    pending_added *pa = sparq_calloc(n, sizeof *pa);
    RETURN_IF(!pa, SPARQ_E_NOMEM, "%s: out of memory for %zu added tokens", L->name, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(list, i);
        const json_t *id = json_object_get(e, "id"), *c = json_object_get(e, "content");
        sparq_status st = SPARQ_OK;
        if (!json_is_object(e)) st = sparq_err(SPARQ_E_FORMAT, "%s: added_tokens[%zu] is not an object", L->name, i);
        else if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_IDS)
            st = sparq_err(SPARQ_E_FORMAT, "%s: added_tokens[%zu].id is missing or not an integer in [0, %d)",
                           L->name, i, TOK_MAX_IDS);
        else if (!json_is_string(c) || json_string_length(c) == 0)
            st = sparq_err(SPARQ_E_FORMAT, "%s: added_tokens[%zu].content is missing or not a non-empty string",
                           L->name, i);
        else {
            static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
            for (int f = 0; f < 3 && st == SPARQ_OK; f++) {
                const json_t *v = json_object_get(e, flags[f]);
                if (v && !json_is_boolean(v))
                    st = sparq_err(SPARQ_E_FORMAT, "%s: added_tokens[%zu].%s must be a boolean", L->name, i,
                                   flags[f]);
                else if (json_is_true(v))
                    st = sparq_err(SPARQ_E_UNSUPPORTED, "%s: added_tokens[%zu] (\"%s\"): %s = true is not supported",
                                   L->name, i, json_string_value(c), flags[f]);
            }
            const json_t *sp = json_object_get(e, "special"), *no = json_object_get(e, "normalized");
            if (st == SPARQ_OK && ((sp && !json_is_boolean(sp)) || (no && !json_is_boolean(no))))
                st = sparq_err(SPARQ_E_FORMAT, "%s: added_tokens[%zu].special/normalized must be booleans",
                               L->name, i);
            pa[i].id = (int32_t)json_integer_value(id);
            pa[i].content = c;
            pa[i].special = json_is_true(sp);
            /* HF's default for `normalized` is !special */
            pa[i].normalized = no ? json_is_true(no) : !pa[i].special;
            if (pa[i].id > *max_id) *max_id = pa[i].id;
        }
        if (st != SPARQ_OK) {
            sparq_free(pa);
            return st;
        }
    }
    *out = pa;
    *n_out = n;
    return SPARQ_OK;
}

static sparq_status load_merges(loader *L, const json_t *merges)
{
    sq_tokenizer *t = L->t;
    RETURN_IF(!json_is_array(merges), SPARQ_E_FORMAT, "%s: model.merges must be an array, not %s", L->name,
              merges ? jtype(merges) : "missing");
    size_t n = json_array_size(merges);
    RETURN_IF(n >= TOK_MAX_IDS, SPARQ_E_RANGE, "%s: model.merges has %zu entries (limit %d)", L->name, n,
              TOK_MAX_IDS);
    t->merge_cap = pow2_at_least(2 * n + 2);
    t->merges = sparq_malloc(t->merge_cap * sizeof *t->merges);
    RETURN_IF(!t->merges, SPARQ_E_NOMEM, "%s: out of memory for %zu merges", L->name, n);
    for (size_t i = 0; i < t->merge_cap; i++) t->merges[i].key = UINT64_MAX;
    char *buf = NULL;
    size_t buf_cap = 0;
    sparq_status st = SPARQ_OK;
    for (size_t i = 0; i < n && st == SPARQ_OK; i++) {
        const json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == a || !sp[1]) {
                st = sparq_err(SPARQ_E_FORMAT, "%s: model.merges[%zu] \"%.60s\" is not two tokens separated by "
                                               "one space",
                               L->name, i, a);
                break;
            }
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = strlen(b);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            na = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            nb = json_string_length(json_array_get(e, 1));
        } else {
            st = sparq_err(SPARQ_E_FORMAT, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"], not %s",
                           L->name, i, jtype(e));
            break;
        }
        int32_t ia = strmap_find(t, a, na), ib = strmap_find(t, b, nb);
        if (ia < 0 || ib < 0) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in the vocab", L->name, i,
                           (int)(ia < 0 ? (na > 60 ? 60 : na) : (nb > 60 ? 60 : nb)), ia < 0 ? a : b);
            break;
        }
        if (na + nb > buf_cap) {
            buf_cap = 2 * (na + nb) + 16;
            char *p = sparq_realloc(buf, buf_cap);
            if (!p) {
                st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory reading merges", L->name);
                break;
            }
            buf = p;
        }
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
        int32_t iab = strmap_find(t, buf, na + nb);
        if (iab < 0) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: model.merges[%zu]: merged token \"%.*s\" is not in the vocab",
                           L->name, i, (int)(na + nb > 60 ? 60 : na + nb), buf);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        size_t mask = t->merge_cap - 1, h = (size_t)mix64(key) & mask;
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key) h = (h + 1) & mask;
        /* a repeated pair: the later rank wins, as in HF's HashMap collect */
        t->merges[h].key = key;
        t->merges[h].rank = (int32_t)i;
        t->merges[h].id = iab;
    }
    sparq_free(buf);
    return st;
}

static sparq_status load_model(loader *L, const json_t *model, pending_added *pa, size_t n_added, int32_t max_added)
{
    sq_tokenizer *t = L->t;
    RETURN_IF(!json_is_object(model), SPARQ_E_FORMAT, "%s: \"model\" is missing or not an object", L->name);
    const json_t *type = json_object_get(model, "type");
    RETURN_IF(type && !json_is_string(type), SPARQ_E_FORMAT, "%s: model.type must be a string", L->name);
    RETURN_IF(type && strcmp(json_string_value(type), "BPE"), SPARQ_E_UNSUPPORTED,
              "%s: model.type \"%s\" is not supported (only BPE)", L->name, json_string_value(type));
    FORWARD_IF(want_off(L, model, "model", "dropout"));
    FORWARD_IF(want_off(L, model, "model", "continuing_subword_prefix"));
    FORWARD_IF(want_off(L, model, "model", "end_of_word_suffix"));
    FORWARD_IF(want_off(L, model, "model", "byte_fallback"));
    const json_t *im = json_object_get(model, "ignore_merges");
    RETURN_IF(im && !json_is_boolean(im), SPARQ_E_FORMAT, "%s: model.ignore_merges must be a boolean", L->name);
    t->ignore_merges = json_is_true(im);
    const json_t *unk = json_object_get(model, "unk_token");
    RETURN_IF(unk && !json_is_null(unk) && !json_is_string(unk), SPARQ_E_FORMAT,
              "%s: model.unk_token must be a string or null", L->name);

    const json_t *vocab = json_object_get(model, "vocab");
    RETURN_IF(!json_is_object(vocab), SPARQ_E_FORMAT, "%s: model.vocab is missing or not an object", L->name);
    int32_t max_id = max_added;
    const char *key;
    size_t klen;
    const json_t *v;
    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        RETURN_IF(!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_IDS,
                  SPARQ_E_FORMAT, "%s: model.vocab[\"%.60s\"] is not an integer id in [0, %d)", L->name, key,
                  TOK_MAX_IDS);
        RETURN_IF(klen == 0, SPARQ_E_FORMAT, "%s: model.vocab has an empty token", L->name);
        if (json_integer_value(v) > max_id) max_id = (int32_t)json_integer_value(v);
    }
    RETURN_IF(max_id < 0, SPARQ_E_FORMAT, "%s: the vocab is empty", L->name);
    t->n_ids = max_id + 1;
    size_t n = (size_t)t->n_ids;
    t->str_off = sparq_calloc(n, sizeof *t->str_off);
    t->str_len = sparq_calloc(n, sizeof *t->str_len);
    t->id_flags = sparq_calloc(n, 1);
    t->strmap_cap = pow2_at_least(2 * (json_object_size(vocab) + n_added) + 2);
    t->strmap = sparq_malloc(t->strmap_cap * sizeof *t->strmap);
    RETURN_IF(!t->str_off || !t->str_len || !t->id_flags || !t->strmap, SPARQ_E_NOMEM,
              "%s: out of memory for a vocab of %zu ids", L->name, n);
    memset(t->strmap, 0xFF, t->strmap_cap * sizeof *t->strmap);
    json_object_keylen_foreach((json_t *)vocab, key, klen, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        RETURN_IF(t->id_flags[id] & ID_PRESENT, SPARQ_E_FORMAT,
                  "%s: model.vocab: id %d is used by \"%.60s\" and \"%.60s\"", L->name, id,
                  t->str_pool + t->str_off[id], key);
        FORWARD_IF(set_id_string(L, id, key, klen));
        t->id_flags[id] = ID_PRESENT;
        strmap_put(t, id);
    }
    /* merges refer to the model's vocab, so resolve them before added tokens
     * (which may reuse a vocab id) take over their ids' text */
    FORWARD_IF(load_merges(L, json_object_get(model, "merges")));
    /* added tokens: their text is what an id decodes to and what token_id finds */
    for (size_t i = 0; i < n_added; i++) {
        int32_t id = pa[i].id;
        FORWARD_IF(set_id_string(L, id, json_string_value(pa[i].content), json_string_length(pa[i].content)));
        t->id_flags[id] = (uint8_t)(ID_PRESENT | ID_ADDED | (pa[i].special ? ID_SPECIAL : 0));
        strmap_put(t, id);
    }

    /* added-token tries: raw (matched before normalization) and normalized */
    if (n_added) {
        tok_added *raw = sparq_calloc(n_added, sizeof *raw), *nrm = sparq_calloc(n_added, sizeof *nrm);
        if (!raw || !nrm) {
            sparq_free(raw);
            sparq_free(nrm);
            return sparq_err(SPARQ_E_NOMEM, "%s: out of memory for added tokens", L->name);
        }
        size_t nr = 0, nn = 0;
        for (size_t i = 0; i < n_added; i++) {
            tok_added a = {t->str_off[pa[i].id], t->str_len[pa[i].id], pa[i].id};
            if (pa[i].normalized) nrm[nn++] = a;
            else raw[nr++] = a;
        }
        /* equal contents: the first listed wins (build_trie keeps the first) */
        sparq_status st = build_trie(L, &t->trie_raw, raw, nr);
        if (st == SPARQ_OK) st = build_trie(L, &t->trie_norm, nrm, nn);
        sparq_free(raw);
        sparq_free(nrm);
        FORWARD_IF(st);
    }

    /* byte -> id of its one-character token; per-id decoded bytes */
    uint32_t b2c[256];
    int16_t c2b[324];
    bytelevel_tables(b2c, c2b);
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        int k = tok_utf8_put(b2c[b], u);
        t->byte_id[b] = strmap_find(t, (const char *)u, (size_t)k);
        if (t->byte_id[b] >= 0 && (t->id_flags[t->byte_id[b]] & ID_ADDED)) t->byte_id[b] = -1;
        missing += t->byte_id[b] < 0;
    }
    RETURN_IF(missing && unk && json_is_string(unk), SPARQ_E_UNSUPPORTED,
              "%s: model.unk_token is set and %d byte characters are missing from the vocab; unknown-token "
              "handling is not supported",
              L->name, missing);
    t->bytes_off = sparq_calloc(n + 1, sizeof *t->bytes_off);
    t->bytes_pool = sparq_malloc(L->pool_len + 1);
    RETURN_IF(!t->bytes_off || !t->bytes_pool, SPARQ_E_NOMEM, "%s: out of memory for decoded tokens", L->name);
    size_t bp = 0;
    for (size_t id = 0; id < n; id++) {
        t->bytes_off[id] = (uint32_t)bp;
        if (!(t->id_flags[id] & ID_PRESENT)) continue;
        const uint8_t *s = (const uint8_t *)t->str_pool + t->str_off[id];
        size_t sl = t->str_len[id], i = 0, start = bp;
        bool all = tok_utf8_check(s, sl) == sl;
        while (all && i < sl) {
            int len;
            uint32_t cp = tok_utf8_next(s, i, &len);
            if (cp >= 324 || c2b[cp] < 0) all = false;
            else t->bytes_pool[bp++] = (uint8_t)c2b[cp];
            i += (size_t)len;
        }
        if (!all) {
            bp = start;
            memcpy(t->bytes_pool + bp, s, sl);
            bp += sl;
        }
    }
    t->bytes_off[n] = (uint32_t)bp;
    if (t->ignore_merges) {
        /* raw bytes -> id, for the whole-word shortcut */
        t->bmap_cap = pow2_at_least(2 * n + 2);
        t->bmap = sparq_malloc(t->bmap_cap * sizeof *t->bmap);
        RETURN_IF(!t->bmap, SPARQ_E_NOMEM, "%s: out of memory", L->name);
        memset(t->bmap, 0xFF, t->bmap_cap * sizeof *t->bmap);
        for (size_t id = 0; id < n; id++) {
            if ((t->id_flags[id] & (ID_PRESENT | ID_ADDED)) != ID_PRESENT) continue;
            const uint8_t *s = t->bytes_pool + t->bytes_off[id];
            size_t sl = t->bytes_off[id + 1] - t->bytes_off[id];
            size_t mask = t->bmap_cap - 1, h = (size_t)hash_bytes(s, sl) & mask;
            while (t->bmap[h] >= 0) h = (h + 1) & mask;
            t->bmap[h] = (int32_t)id;
        }
    }
    return SPARQ_OK;
}

static const char *const known_top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                        "pre_tokenizer", "post_processor", "decoder", "model", NULL};

static sparq_status load_root(loader *L, const json_t *root)
{
    sq_tokenizer *t = L->t;
    RETURN_IF(!json_is_object(root), SPARQ_E_FORMAT, "%s: top level is %s, not an object", L->name, jtype(root));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v)
    {
        bool known = false;
        for (int i = 0; known_top[i]; i++) known |= !strcmp(key, known_top[i]);
        RETURN_IF(!known, SPARQ_E_UNSUPPORTED, "%s: unknown top-level field \"%.60s\"", L->name, key);
    }
    FORWARD_IF(want_off(L, root, "tokenizer", "truncation"));
    pending_added *pa;
    size_t n_added;
    int32_t max_added = -1;
    FORWARD_IF(load_added(L, json_object_get(root, "added_tokens"), &pa, &n_added, &max_added));
    sparq_status st = load_model(L, json_object_get(root, "model"), pa, n_added, max_added);
    sparq_free(pa);
    FORWARD_IF(st);
    FORWARD_IF(load_normalizer(L, json_object_get(root, "normalizer"), "normalizer"));
    FORWARD_IF(load_pretok(L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer"));
    RETURN_IF(!t->bytelevel, SPARQ_E_UNSUPPORTED,
              "%s: pre_tokenizer has no ByteLevel step; only byte-level BPE is supported", L->name);
    const json_t *dec = json_object_get(root, "decoder");
    const char *type = "";
    RETURN_IF(!dec || json_is_null(dec), SPARQ_E_UNSUPPORTED, "%s: decoder is null; only ByteLevel is supported",
              L->name);
    FORWARD_IF(get_type(L, dec, "decoder", &type));
    RETURN_IF(strcmp(type, "ByteLevel"), SPARQ_E_UNSUPPORTED,
              "%s: decoder type \"%s\" is not supported (only ByteLevel)", L->name, type);
    FORWARD_IF(load_post(L, json_object_get(root, "post_processor"), "post_processor"));
    return SPARQ_OK;
}

sparq_status sq_tokenizer_load_json(sq_tokenizer **out, const char *json, size_t len, const char *name)
{
    *out = NULL;
    if (!name) name = "tokenizer.json";
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    RETURN_IF(!root, SPARQ_E_FORMAT, "%s: invalid JSON at line %d, column %d: %s", name, jerr.line, jerr.column,
              jerr.text);
    sq_tokenizer *t = sparq_calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    t->eos = t->bos = t->pad = t->post_bos = -1;
    loader L = {t, name, 0, 0};
    sparq_status st = load_root(&L, root);
    json_decref(root);
    if (st != SPARQ_OK) {
        sq_tokenizer_free(t);
        return st;
    }
    *out = t;
    return SPARQ_OK;
}

/* tokenizer_config.json: "eos_token": "<x>" or {"content": "<x>"} */
static int32_t config_token(const sq_tokenizer *t, const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    return strmap_find(t, json_string_value(v), json_string_length(v));
}

sparq_status sq_tokenizer_load_config(sq_tokenizer *t, const char *dir)
{
    char *path = sparq_path_join(dir, "tokenizer_config.json");
    RETURN_IF(!path, SPARQ_E_NOMEM, "tokenizer: out of memory");
    sparq_status st = SPARQ_OK;
    if (sparq_path_exists(path)) {
        char *buf;
        size_t n;
        st = sparq_file_read_all(path, 64u << 20, &buf, &n);
        if (st == SPARQ_OK) {
            json_error_t jerr;
            json_t *cfg = json_loadb(buf, n, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
            sparq_free(buf);
            if (!cfg || !json_is_object(cfg)) {
                st = sparq_err(SPARQ_E_FORMAT, "%s: invalid JSON at line %d, column %d: %s", path, jerr.line,
                               jerr.column, cfg ? "not an object" : jerr.text);
            } else {
                t->eos = config_token(t, cfg, "eos_token");
                t->bos = config_token(t, cfg, "bos_token");
                t->pad = config_token(t, cfg, "pad_token");
                const json_t *ct = json_object_get(cfg, "chat_template");
                if (json_is_array(ct)) { /* [{"name": "default", "template": "..."}, ...] */
                    size_t i;
                    const json_t *e, *pick = NULL;
                    json_array_foreach(ct, i, e)
                    {
                        const json_t *nm = json_object_get(e, "name");
                        if (json_is_string(nm) && !strcmp(json_string_value(nm), "default"))
                            pick = json_object_get(e, "template");
                    }
                    ct = pick;
                }
                if (json_is_string(ct)) {
                    sparq_free(t->chat_template);
                    t->chat_template = sparq_strdup(json_string_value(ct));
                    if (!t->chat_template) st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
                }
            }
            if (cfg) json_decref(cfg);
        }
    }
    sparq_free(path);
    if (st != SPARQ_OK) return st;
    path = sparq_path_join(dir, "chat_template.jinja");
    RETURN_IF(!path, SPARQ_E_NOMEM, "tokenizer: out of memory");
    if (sparq_path_exists(path)) {
        char *buf;
        size_t n;
        st = sparq_file_read_all(path, 16u << 20, &buf, &n);
        if (st == SPARQ_OK) {
            sparq_free(t->chat_template);
            t->chat_template = buf;
        }
    }
    sparq_free(path);
    if (st == SPARQ_OK) st = tok_chat_detect(t->chat_template, &t->chat, &t->chat_trim);
    return st;
}

sparq_status sq_tokenizer_load(sq_tokenizer **out, const char *path)
{
    *out = NULL;
    char *dir, *file;
    if (sparq_path_is_dir(path)) {
        dir = sparq_strdup(path);
        file = sparq_path_join(path, "tokenizer.json");
    } else {
        dir = sparq_strdup(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (dir) {
            if (slash) *slash = 0;
            else strcpy(dir, ".");
        }
        file = sparq_strdup(path);
    }
    if (!dir || !file) {
        sparq_free(dir);
        sparq_free(file);
        return sparq_err(SPARQ_E_NOMEM, "tokenizer: out of memory");
    }
    char *buf = NULL;
    size_t n = 0;
    sparq_status st = sparq_file_read_all(file, TOK_MAX_JSON, &buf, &n);
    sq_tokenizer *t = NULL;
    if (st == SPARQ_OK) st = sq_tokenizer_load_json(&t, buf, n, file);
    sparq_free(buf);
    if (st == SPARQ_OK) {
        st = sq_tokenizer_load_config(t, dir);
        if (st != SPARQ_OK) {
            sq_tokenizer_free(t);
            t = NULL;
        }
    }
    sparq_free(dir);
    sparq_free(file);
    *out = t;
    return st;
}

void sq_tokenizer_free(sq_tokenizer *t)
{
    if (!t) return;
    sparq_free(t->str_pool);
    sparq_free(t->str_off);
    sparq_free(t->str_len);
    sparq_free(t->id_flags);
    sparq_free(t->strmap);
    sparq_free(t->merges);
    sparq_free(t->bytes_off);
    sparq_free(t->bytes_pool);
    sparq_free(t->bmap);
    sparq_free(t->trie_raw.nodes);
    sparq_free(t->trie_norm.nodes);
    sparq_free(t->chat_template);
    sparq_free(t);
}

/* ---- accessors ------------------------------------------------------------------ */

int32_t sq_tokenizer_vocab_size(const sq_tokenizer *t) { return t->n_ids; }
int32_t sq_tokenizer_eos(const sq_tokenizer *t) { return t->eos; }
int32_t sq_tokenizer_bos(const sq_tokenizer *t) { return t->bos >= 0 ? t->bos : t->post_bos; }
int32_t sq_tokenizer_pad(const sq_tokenizer *t) { return t->pad; }
bool sq_tokenizer_add_bos(const sq_tokenizer *t) { return t->add_bos; }
sq_chat_family sq_tokenizer_chat_family(const sq_tokenizer *t) { return t->chat; }

int32_t sq_tokenizer_token_id(const sq_tokenizer *t, const char *token)
{
    return token ? strmap_find(t, token, strlen(token)) : -1;
}

bool sq_tokenizer_is_special(const sq_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->id_flags[id] & ID_SPECIAL);
}

sparq_status sq_tokenizer_token_bytes(const sq_tokenizer *t, int32_t id, const uint8_t **bytes, size_t *len)
{
    RETURN_IF(id < 0 || id >= t->n_ids, SPARQ_E_RANGE, "token id %d is out of range [0, %d)", id, t->n_ids);
    *bytes = t->bytes_pool + t->bytes_off[id];
    *len = t->bytes_off[id + 1] - t->bytes_off[id];
    return SPARQ_OK;
}

sparq_status sq_tokenizer_token_str(const sq_tokenizer *t, int32_t id, const char **str, size_t *len)
{
    RETURN_IF(id < 0 || id >= t->n_ids, SPARQ_E_RANGE, "token id %d is out of range [0, %d)", id, t->n_ids);
    bool present = t->id_flags[id] & ID_PRESENT;
    *str = present ? t->str_pool + t->str_off[id] : "";
    *len = present ? t->str_len[id] : 0;
    return SPARQ_OK;
}

/* ---- encoding ---------------------------------------------------------------------- */

typedef struct cache_ent {
    uint64_t h;
    uint32_t key_off, key_len, ids_off, ids_n;
} cache_ent;

typedef struct enc {
    const sq_tokenizer *t;
    bool parse_special;
    /* output */
    int32_t *ids;
    size_t n, cap;
    /* pre-token cache: open addressing over cache_ent indices */
    uint32_t *slots;
    size_t slot_cap;
    cache_ent *ents;
    size_t n_ents, ents_cap;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    /* BPE scratch */
    int32_t *sym;
    size_t sym_cap;
    struct hent { int32_t rank, pos, id; } *heap;
    size_t heap_cap;
} enc;

static sparq_status grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return SPARQ_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = sparq_realloc(*p, nc * elem);
    RETURN_IF(!q, SPARQ_E_NOMEM, "tokenizer: out of memory (%zu x %zu bytes)", nc, elem);
    *p = q;
    *cap = nc;
    return SPARQ_OK;
}

static inline sparq_status emit(enc *e, int32_t id)
{
    if (e->n == e->cap) FORWARD_IF(grow((void **)&e->ids, &e->cap, e->n + 1, sizeof *e->ids));
    e->ids[e->n++] = id;
    return SPARQ_OK;
}

static inline bool heap_less(const struct hent *a, const struct hent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static sparq_status heap_push(enc *e, size_t *hn, int32_t rank, int32_t pos, int32_t id)
{
    FORWARD_IF(grow((void **)&e->heap, &e->heap_cap, *hn + 1, sizeof *e->heap));
    size_t i = (*hn)++;
    struct hent x = {rank, pos, id};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&x, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = x;
    return SPARQ_OK;
}

static struct hent heap_pop(enc *e, size_t *hn)
{
    struct hent top = e->heap[0], x = e->heap[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!heap_less(&e->heap[c], &x)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = x;
    return top;
}

/* BPE of one pre-token; appends its ids to e->ids. */
static sparq_status bpe_word(enc *e, const uint8_t *s, size_t len)
{
    const sq_tokenizer *t = e->t;
    if (t->ignore_merges) {
        size_t mask = t->bmap_cap - 1, h = (size_t)hash_bytes(s, len) & mask;
        for (int32_t id; (id = t->bmap[h]) >= 0; h = (h + 1) & mask)
            if (t->bytes_off[id + 1] - t->bytes_off[id] == len && !memcmp(t->bytes_pool + t->bytes_off[id], s, len))
                return emit(e, id);
    }
    FORWARD_IF(grow((void **)&e->sym, &e->sym_cap, len, sizeof *e->sym));
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) e->sym[n++] = id; /* a byte with no token is dropped, as HF does without unk */
    }
    if (n <= TOK_SHORT_WORD) {
        /* short word: repeatedly merge the lowest-ranked adjacent pair; the
         * pair ranks are kept in an array and only the two pairs around a
         * merge are looked up again */
        int32_t *sym = e->sym, rank[TOK_SHORT_WORD], nid[TOK_SHORT_WORD];
        for (size_t i = 0; i + 1 < n; i++) {
            const tok_merge *m = merge_find(t, sym[i], sym[i + 1]);
            rank[i] = m ? m->rank : INT32_MAX;
            nid[i] = m ? m->id : -1;
        }
        while (n > 1) {
            size_t bi = 0;
            for (size_t i = 1; i + 1 < n; i++)
                if (rank[i] < rank[bi]) bi = i;
            if (rank[bi] == INT32_MAX) break;
            sym[bi] = nid[bi];
            memmove(sym + bi + 1, sym + bi + 2, (n - bi - 2) * sizeof *sym);
            memmove(rank + bi + 1, rank + bi + 2, (n - bi - 2 > 0 ? n - bi - 3 : 0) * sizeof *rank);
            memmove(nid + bi + 1, nid + bi + 2, (n - bi - 2 > 0 ? n - bi - 3 : 0) * sizeof *nid);
            n--;
            for (size_t i = bi ? bi - 1 : 0; i <= bi && i + 1 < n; i++) {
                const tok_merge *m = merge_find(t, sym[i], sym[i + 1]);
                rank[i] = m ? m->rank : INT32_MAX;
                nid[i] = m ? m->id : -1;
            }
        }
        for (size_t i = 0; i < n; i++) FORWARD_IF(emit(e, sym[i]));
        return SPARQ_OK;
    }
    /* long word: heap of candidate merges over a doubly linked list */
    int32_t *prev = sparq_malloc(2 * n * sizeof *prev);
    RETURN_IF(!prev, SPARQ_E_NOMEM, "tokenizer: out of memory for a %zu-byte word", len);
    int32_t *next = prev + n, *sym = e->sym;
    size_t hn = 0;
    sparq_status st = SPARQ_OK;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n && st == SPARQ_OK; i++) {
        const tok_merge *m = merge_find(t, sym[i], sym[i + 1]);
        if (m) st = heap_push(e, &hn, m->rank, (int32_t)i, m->id);
    }
    while (hn && st == SPARQ_OK) {
        struct hent x = heap_pop(e, &hn);
        int32_t p = x.pos;
        if (sym[p] < 0) continue; /* merged away */
        int32_t q = next[p];
        if (q < 0) continue;
        const tok_merge *m = merge_find(t, sym[p], sym[q]);
        if (!m || m->id != x.id) continue; /* stale */
        sym[p] = x.id;
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            const tok_merge *l = merge_find(t, sym[prev[p]], sym[p]);
            if (l) st = heap_push(e, &hn, l->rank, prev[p], l->id);
        }
        if (st == SPARQ_OK && next[p] >= 0) {
            const tok_merge *r = merge_find(t, sym[p], sym[next[p]]);
            if (r) st = heap_push(e, &hn, r->rank, p, r->id);
        }
    }
    for (int32_t i = 0; i >= 0 && st == SPARQ_OK; i = next[i]) st = emit(e, sym[i]);
    sparq_free(prev);
    return st;
}

/* Cached BPE: a pre-token seen before in this call reuses its ids. */
static sparq_status bpe_cached(enc *e, const uint8_t *s, size_t len)
{
    if (len == 1 && e->t->byte_id[s[0]] >= 0) return emit(e, e->t->byte_id[s[0]]);
    if (len > 256) return bpe_word(e, s, len); /* long words are rare; do not bloat the cache */
    uint64_t h = hash_bytes(s, len);
    if (!e->slots) {
        e->slot_cap = 256;
        e->slots = sparq_malloc(e->slot_cap * sizeof *e->slots);
        RETURN_IF(!e->slots, SPARQ_E_NOMEM, "tokenizer: out of memory for the word cache");
        memset(e->slots, 0xFF, e->slot_cap * sizeof *e->slots);
    }
    size_t mask = e->slot_cap - 1, i = (size_t)h & mask;
    for (uint32_t k; (k = e->slots[i]) != UINT32_MAX; i = (i + 1) & mask) {
        const cache_ent *c = &e->ents[k];
        if (c->h == h && c->key_len == len && !memcmp(e->keys + c->key_off, s, len)) {
            FORWARD_IF(grow((void **)&e->ids, &e->cap, e->n + c->ids_n, sizeof *e->ids));
            /* the cached ids live in e->ids itself, at the first place they were emitted */
            memcpy(e->ids + e->n, e->ids + c->ids_off, c->ids_n * sizeof *e->ids);
            e->n += c->ids_n;
            return SPARQ_OK;
        }
    }
    size_t start = e->n;
    FORWARD_IF(bpe_word(e, s, len));
    /* cache full, or offsets would not fit the 32-bit entries; or 3/4 of the slots taken, which only
     * happens after a failed rehash: a table with no free slot would make the probe above loop forever */
    if (e->n_ents >= (1u << 22) || e->keys_len + len > UINT32_MAX / 2 || e->n > UINT32_MAX / 2 ||
        4 * ((size_t)e->n_ents + 1) > 3 * e->slot_cap)
        return SPARQ_OK;
    FORWARD_IF(grow((void **)&e->ents, &e->ents_cap, e->n_ents + 1, sizeof *e->ents));
    FORWARD_IF(grow((void **)&e->keys, &e->keys_cap, e->keys_len + len, 1));
    memcpy(e->keys + e->keys_len, s, len);
    e->ents[e->n_ents] = (cache_ent){h, (uint32_t)e->keys_len, (uint32_t)len, (uint32_t)start,
                                     (uint32_t)(e->n - start)};
    e->keys_len += len;
    e->slots[i] = (uint32_t)e->n_ents++;
    if (2 * e->n_ents > e->slot_cap) { /* rehash */
        size_t nc = e->slot_cap * 2;
        uint32_t *ns = sparq_malloc(nc * sizeof *ns);
        if (!ns) return SPARQ_OK; /* keep the old table; the cache is only an optimisation */
        memset(ns, 0xFF, nc * sizeof *ns);
        for (size_t k = 0; k < e->n_ents; k++) {
            size_t j = (size_t)e->ents[k].h & (nc - 1);
            while (ns[j] != UINT32_MAX) j = (j + 1) & (nc - 1);
            ns[j] = (uint32_t)k;
        }
        sparq_free(e->slots);
        e->slots = ns;
        e->slot_cap = nc;
    }
    return SPARQ_OK;
}

/* Pre-tokenize s[a..b) with split level `lvl` onwards; each final piece goes
 * to fn (BPE when encoding, a collector in tests). */
static sparq_status split_walk(const sq_tokenizer *t, const uint8_t *s, size_t a, size_t b, int lvl, tok_piece_fn fn,
                               void *ctx)
{
    if (a >= b) return SPARQ_OK;
    if (lvl == t->n_splits) return fn(ctx, s + a, b - a);
    tok_split_kind k = t->splits[lvl];
    size_t pos = a, gap = a;
    while (pos < b) {
        size_t m = tok_split_match(k, s, pos, b);
        if (m) {
            if (gap < pos) FORWARD_IF(split_walk(t, s, gap, pos, lvl + 1, fn, ctx));
            FORWARD_IF(split_walk(t, s, pos, pos + m, lvl + 1, fn, ctx));
            pos += m;
            gap = pos;
        } else {
            uint8_t c = s[pos];
            pos += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        }
    }
    if (gap < b) FORWARD_IF(split_walk(t, s, gap, b, lvl + 1, fn, ctx));
    return SPARQ_OK;
}

sparq_status tok_pretokenize(const sq_tokenizer *t, const uint8_t *s, size_t n, tok_piece_fn fn, void *ctx)
{
    return split_walk(t, s, 0, n, 0, fn, ctx);
}

static sparq_status bpe_piece(void *ctx, const uint8_t *s, size_t n) { return bpe_cached(ctx, s, n); }

static sparq_status pretok(enc *e, const uint8_t *s, size_t a, size_t b, int lvl)
{
    return split_walk(e->t, s, a, b, lvl, bpe_piece, e);
}

/* Leftmost-longest added token in s[from..n): *at, *len, *id; false if none.
 * A special token while !parse_special is skipped over (stays text). */
static bool trie_find(const enc *e, const tok_trie *tr, const uint8_t *s, size_t from, size_t n, size_t *at,
                      size_t *len, int32_t *id)
{
    if (!tr->n) return false;
    for (size_t i = from; i < n; i++) {
        if (!tr->first[s[i]]) continue;
        int32_t cur = 0, best = -1;
        size_t best_len = 0;
        for (size_t j = i; j < n; j++) {
            int32_t c = tr->nodes[cur].child;
            while (c >= 0 && tr->nodes[c].byte != s[j]) c = tr->nodes[c].sibling;
            if (c < 0) break;
            cur = c;
            if (tr->nodes[c].tok >= 0) {
                best = tr->nodes[c].tok;
                best_len = j + 1 - i;
            }
        }
        if (best < 0) continue;
        if (!e->parse_special && (e->t->id_flags[best] & ID_SPECIAL)) {
            i += best_len - 1; /* non-overlapping search resumes after it */
            continue;
        }
        *at = i;
        *len = best_len;
        *id = best;
        return true;
    }
    return false;
}

static sparq_status encode_normalized(enc *e, const uint8_t *s, size_t n)
{
    size_t pos = 0, at, len;
    int32_t id;
    while (trie_find(e, &e->t->trie_norm, s, pos, n, &at, &len, &id)) {
        FORWARD_IF(pretok(e, s, pos, at, 0));
        FORWARD_IF(emit(e, id));
        pos = at + len;
    }
    return pretok(e, s, pos, n, 0);
}

static sparq_status encode_piece(enc *e, const uint8_t *s, size_t n)
{
    if (!n) return SPARQ_OK;
    if (!e->t->nfc) return encode_normalized(e, s, n);
    uint8_t *norm;
    size_t nn;
    FORWARD_IF(tok_nfc(s, n, &norm, &nn));
    if (!norm) return encode_normalized(e, s, n);
    sparq_status st = encode_normalized(e, norm, nn);
    sparq_free(norm);
    return st;
}

sparq_status sq_tokenizer_encode(const sq_tokenizer *t, const char *text, size_t len, bool parse_special,
                                 int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t bad = tok_utf8_check(s, len);
    if (bad < len) {
        char hex[16] = "";
        for (size_t k = 0; k < 4 && bad + k < len; k++) snprintf(hex + 3 * k, 4, "%02X ", s[bad + k]);
        return sparq_err(SPARQ_E_UTF8, "text is not valid UTF-8 at byte offset %zu (bytes %s...)", bad, hex);
    }
    enc e = {.t = t, .parse_special = parse_special};
    sparq_status st = SPARQ_OK;
    size_t pos = 0, at, alen;
    int32_t id;
    while (st == SPARQ_OK && trie_find(&e, &t->trie_raw, s, pos, len, &at, &alen, &id)) {
        st = encode_piece(&e, s + pos, at - pos);
        if (st == SPARQ_OK) st = emit(&e, id);
        pos = at + alen;
    }
    if (st == SPARQ_OK) st = encode_piece(&e, s + pos, len - pos);
    sparq_free(e.slots);
    sparq_free(e.ents);
    sparq_free(e.keys);
    sparq_free(e.sym);
    sparq_free(e.heap);
    if (st != SPARQ_OK) {
        sparq_free(e.ids);
        return st;
    }
    *ids = e.ids;
    *n = e.n;
    return SPARQ_OK;
}

/* ---- decoding ---------------------------------------------------------------------- */

sparq_status sq_tokenizer_decode(const sq_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                                 char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    size_t raw_n = 0;
    for (size_t i = 0; i < n; i++) {
        RETURN_IF(ids[i] < 0 || ids[i] >= t->n_ids, SPARQ_E_RANGE, "decode: token id %d at position %zu is out of "
                                                                   "range [0, %d)",
                  ids[i], i, t->n_ids);
        raw_n += t->bytes_off[ids[i] + 1] - t->bytes_off[ids[i]];
    }
    uint8_t *raw = sparq_malloc(raw_n + 1);
    RETURN_IF(!raw, SPARQ_E_NOMEM, "decode: out of memory for %zu bytes", raw_n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && (t->id_flags[ids[i]] & ID_SPECIAL)) continue;
        size_t bl = t->bytes_off[ids[i] + 1] - t->bytes_off[ids[i]];
        memcpy(raw + k, t->bytes_pool + t->bytes_off[ids[i]], bl);
        k += bl;
    }
    char *out = NULL;
    size_t olen = 0, cap = 0;
    sparq_status st = tok_utf8_lossy_append(raw, k, &out, &olen, &cap);
    sparq_free(raw);
    if (st != SPARQ_OK) return st;
    *text = out;
    *len = olen;
    return SPARQ_OK;
}

/* ---- streaming detokenizer --------------------------------------------------------- */

void sq_detok_init(sq_detok *d, const sq_tokenizer *tok, bool skip_special)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
}

sparq_status sq_detok_push(sq_detok *d, int32_t id, const char **text, size_t *len)
{
    const sq_tokenizer *t = d->tok;
    *text = "";
    *len = 0;
    RETURN_IF(id < 0 || id >= t->n_ids, SPARQ_E_RANGE, "detokenizer: token id %d is out of range [0, %d)", id,
              t->n_ids);
    if (d->skip_special && (t->id_flags[id] & ID_SPECIAL)) return SPARQ_OK;
    const uint8_t *b = t->bytes_pool + t->bytes_off[id];
    size_t bl = t->bytes_off[id + 1] - t->bytes_off[id];
    /* pending prefix + this token's bytes; hold back an incomplete tail */
    size_t tot = d->npend + bl;
    uint8_t stackbuf[256];
    uint8_t *all = tot <= sizeof stackbuf ? stackbuf : sparq_malloc(tot);
    RETURN_IF(!all, SPARQ_E_NOMEM, "detokenizer: out of memory");
    memcpy(all, d->pend, d->npend);
    memcpy(all + d->npend, b, bl);
    size_t hold = tok_utf8_incomplete_tail(all, tot);
    size_t olen = 0;
    sparq_status st = tok_utf8_lossy_append(all, tot - hold, &d->out, &olen, &d->out_cap);
    if (st == SPARQ_OK) {
        memcpy(d->pend, all + tot - hold, hold);
        d->npend = hold;
        *text = d->out;
        *len = olen;
    }
    if (all != stackbuf) sparq_free(all);
    return st;
}

sparq_status sq_detok_flush(sq_detok *d, const char **text, size_t *len)
{
    size_t olen = 0;
    *text = "";
    *len = 0;
    FORWARD_IF(tok_utf8_lossy_append(d->pend, d->npend, &d->out, &olen, &d->out_cap));
    d->npend = 0;
    *text = d->out;
    *len = olen;
    return SPARQ_OK;
}

void sq_detok_free(sq_detok *d)
{
    sparq_free(d->out);
    d->out = NULL;
    d->out_cap = 0;
}
