/* formats/engram_vocab.c — the Engram key normalizer and the compressed
 * vocabulary of DeepSeek V4.1 (rule and references: engram_vocab.h).
 *
 * The normalizer is HF's eight-step Sequence, collapsed into one pass per
 * code point followed by one pass over the result:
 *   - NFKC then NFD is NFKD: NFD(NFKC(x)) = NFD(NFKD(x)) = NFKD(x), since
 *     composition is undone by canonical decomposition. Neither canonical
 *     ordering nor composition can show in the result, because every
 *     character with a nonzero combining class is a mark (Unicode 9.0; the
 *     table generator asserts it) and StripAccents drops all marks. So each
 *     character is replaced by its full compatibility decomposition
 *     (uni_kdecomp; Hangul syllables algorithmically) and marks are dropped;
 *   - Lowercase maps each remaining character (uni_lower; ASCII inline);
 *   - the pass over the result collapses runs of space/tab/CR/LF to one
 *     space, keeps a lone " " as it is (the U+E000 sentinel of the HF
 *     sequence exists only to protect it from Strip), otherwise strips
 *     White_Space at both ends and turns U+E000 into a space.
 * Lowercase and the whitespace steps commute (no lowercase mapping involves
 * whitespace or U+E000), so the order inside the passes does not matter.
 *
 * The vocabulary builder decodes every id alone (its byte-level bytes:
 * sq_tokenizer_decode of one id is those bytes with invalid UTF-8 replaced
 * by U+FFFD, so invalid bytes mean "contains U+FFFD"), normalizes it into a
 * reused scratch buffer and numbers the distinct keys with an open-addressing
 * hash table. */
#include "formats/engram_vocab.h"

#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "formats/tokenizer_internal.h"
#include "formats/unicode_tables.h"

#define SENTINEL 0xE000u
/* code points one character can become: its decomposition (at most 18, U+FDFA;
 * the table generator asserts it) with each part lowercased (at most 2) */
#define MAX_EXPANSION (18 * 2)

/* Reused buffers: code points of the result, then its UTF-8. */
typedef struct norm_scratch {
    uint32_t *cp;
    size_t cp_cap;
    char *out;
    size_t out_cap;
} norm_scratch;

static const uni_decomp_entry *entry_find(const uni_decomp_entry *tab, size_t count, uint32_t cp)
{
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tab[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < count && tab[lo].cp == cp ? &tab[lo] : NULL;
}

/* Append cp lowercased, unless it is a mark (StripAccents). */
static inline size_t put_lower(uint32_t *o, size_t m, uint32_t cp)
{
    if (cp < 0x80) {
        o[m++] = cp - 'A' < 26 ? cp + 32 : cp;
        return m;
    }
    unsigned fl = uni_norm_of(cp);
    if (fl & UNI_N_MARK) return m;
    const uni_decomp_entry *e = (fl & UNI_N_LOWER) ? entry_find(uni_lower, uni_lower_count, cp) : NULL;
    if (!e) {
        o[m++] = cp;
        return m;
    }
    for (uint32_t k = 0; k < e->len; k++) o[m++] = uni_lower_pool[e->off + k];
    return m;
}

static inline bool collapsible(uint32_t cp) { return cp == ' ' || cp == '\t' || cp == '\r' || cp == '\n'; }

/* Normalize valid UTF-8 s[0..n) into w->out (NUL-terminated), *out_n bytes. */
static sparq_status normalize_into(norm_scratch *w, const uint8_t *s, size_t n, size_t *out_n)
{
    size_t need = n * MAX_EXPANSION + 1;
    if (w->cp_cap < need) {
        uint32_t *p = sparq_realloc(w->cp, need * sizeof *p);
        RETURN_IF(!p, SPARQ_E_NOMEM, "engram normalizer: out of memory for %zu bytes of text", n);
        w->cp = p;
        w->cp_cap = need;
    }
    uint32_t *o = w->cp;
    size_t m = 0;
    int len;
    for (size_t i = 0; i < n; i += (size_t)len) {
        uint32_t cp = tok_utf8_next(s, i, &len);
        int h = tok_hangul_decompose(cp, o + m); /* jamo are neither marks nor cased */
        if (h) {
            m += (size_t)h;
            continue;
        }
        const uni_decomp_entry *d =
            cp >= 0x80 && (uni_norm_of(cp) & UNI_N_KDECOMP) ? entry_find(uni_kdecomp, uni_kdecomp_count, cp) : NULL;
        if (!d) {
            m = put_lower(o, m, cp);
            continue;
        }
        for (uint32_t k = 0; k < d->len; k++) m = put_lower(o, m, uni_kdecomp_pool[d->off + k]);
    }
    /* Replace([ \t\r\n]+ -> " "), in place */
    size_t c = 0;
    for (size_t k = 0; k < m; k++) {
        if (collapsible(o[k])) {
            if (c && o[c - 1] == ' ') continue; /* every ' ' kept so far came from a collapsed run */
            o[c++] = ' ';
        } else {
            o[c++] = o[k];
        }
    }
    /* Replace(^ $ -> U+E000), Strip, Replace(U+E000 -> " ") */
    size_t a = 0, b = c;
    if (!(c == 1 && o[0] == ' ')) {
        while (a < b && (uni_flags_of(o[a]) & UNI_WS)) a++;
        while (b > a && (uni_flags_of(o[b - 1]) & UNI_WS)) b--;
    }
    need = 4 * (b - a) + 1;
    if (w->out_cap < need) {
        char *p = sparq_realloc(w->out, need);
        RETURN_IF(!p, SPARQ_E_NOMEM, "engram normalizer: out of memory for %zu bytes of text", n);
        w->out = p;
        w->out_cap = need;
    }
    size_t on = 0;
    for (size_t k = a; k < b; k++) {
        uint32_t cp = o[k] == SENTINEL ? ' ' : o[k];
        if (cp < 0x80) w->out[on++] = (char)cp;
        else on += (size_t)tok_utf8_put(cp, (uint8_t *)w->out + on);
    }
    w->out[on] = 0;
    *out_n = on;
    return SPARQ_OK;
}

static void scratch_free(norm_scratch *w)
{
    sparq_free(w->cp);
    sparq_free(w->out);
}

sparq_status sq_engram_normalize(const char *text, size_t len, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t bad = tok_utf8_check(s, len);
    RETURN_IF(bad < len, SPARQ_E_UTF8, "engram normalizer: text is not valid UTF-8 at byte offset %zu", bad);
    norm_scratch w = {0};
    sparq_status st = normalize_into(&w, s, len, out_len);
    sparq_free(w.cp);
    if (st != SPARQ_OK) {
        sparq_free(w.out);
        *out_len = 0;
        return st;
    }
    *out = w.out;
    return SPARQ_OK;
}

/* ---- the compressed vocabulary ---- */

typedef struct key_slot {
    uint64_t hash;
    uint32_t off, len; /* key bytes in the pool */
    uint32_t id;       /* compressed id; UINT32_MAX = empty */
} key_slot;

typedef struct key_table {
    key_slot *slots;
    size_t cap; /* power of two */
    char *pool;
    size_t pool_len, pool_cap;
    uint32_t n; /* keys so far = next compressed id */
} key_table;

/* The compressed id of key[0..len), a new one if the key is new. */
static sparq_status key_id(key_table *t, const char *key, size_t len, uint32_t *id)
{
    uint64_t h = XXH3_64bits(key, len);
    size_t mask = t->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        key_slot *sl = &t->slots[i];
        if (sl->id == UINT32_MAX) {
            if (t->pool_len + len > t->pool_cap) {
                size_t cap = 2 * t->pool_cap + len;
                char *p = sparq_realloc(t->pool, cap);
                RETURN_IF(!p, SPARQ_E_NOMEM, "engram vocabulary: out of memory for keys (%zu bytes)", cap);
                t->pool = p;
                t->pool_cap = cap;
            }
            memcpy(t->pool + t->pool_len, key, len);
            *sl = (key_slot){h, (uint32_t)t->pool_len, (uint32_t)len, t->n++};
            t->pool_len += len;
            *id = sl->id;
            return SPARQ_OK;
        }
        if (sl->hash == h && sl->len == len && !memcmp(t->pool + sl->off, key, len)) {
            *id = sl->id;
            return SPARQ_OK;
        }
    }
}

static bool has_replacement_char(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i + 2 < n; i++)
        if (s[i] == 0xEF && s[i + 1] == 0xBF && s[i + 2] == 0xBD) return true;
    return false;
}

static sparq_status build(const sq_tokenizer *tok, size_t n, uint32_t *map, key_table *t, norm_scratch *w)
{
    for (size_t id = 0; id < n; id++) {
        const uint8_t *b;
        size_t bl;
        FORWARD_IF(sq_tokenizer_token_bytes(tok, (int32_t)id, &b, &bl));
        const char *key = (const char *)b;
        size_t kl = bl;
        if (tok_utf8_check(b, bl) < bl || has_replacement_char(b, bl)) {
            FORWARD_IF(sq_tokenizer_token_str(tok, (int32_t)id, &key, &kl));
        } else {
            size_t nl;
            FORWARD_IF(normalize_into(w, b, bl, &nl));
            if (nl) {
                key = w->out;
                kl = nl;
            }
        }
        RETURN_IF(kl > UINT32_MAX / 2, SPARQ_E_RANGE, "engram vocabulary: token %zu is %zu bytes long", id, kl);
        FORWARD_IF(key_id(t, key, kl, &map[id]));
    }
    return SPARQ_OK;
}

sparq_status sq_engram_vocab_build(const sq_tokenizer *tok, uint32_t **map_out, uint32_t *n_compressed_out)
{
    *map_out = NULL;
    *n_compressed_out = 0;
    int32_t nv = sq_tokenizer_vocab_size(tok);
    RETURN_IF(nv <= 0, SPARQ_E_ARG, "engram vocabulary: the tokenizer has no ids");
    size_t n = (size_t)nv;
    key_table t = {.cap = 16};
    while (t.cap < 2 * n) t.cap *= 2;
    uint32_t *map = sparq_malloc(n * sizeof *map);
    t.slots = sparq_malloc(t.cap * sizeof *t.slots);
    t.pool_cap = 8 * n;
    t.pool = sparq_malloc(t.pool_cap);
    norm_scratch w = {0};
    sparq_status st = SPARQ_OK;
    if (!map || !t.slots || !t.pool) {
        st = sparq_err(SPARQ_E_NOMEM, "engram vocabulary: out of memory for %zu ids", n);
    } else {
        for (size_t i = 0; i < t.cap; i++) t.slots[i].id = UINT32_MAX;
        st = build(tok, n, map, &t, &w);
    }
    scratch_free(&w);
    sparq_free(t.slots);
    sparq_free(t.pool);
    if (st != SPARQ_OK) {
        sparq_free(map);
        return st;
    }
    *map_out = map;
    *n_compressed_out = t.n;
    return SPARQ_OK;
}

sparq_status sq_engram_token_map(const sq_tokenizer *tok, const sq_model_config *c, const char *name,
                                 uint32_t **map_out, sq_engram_layout *lay)
{
    *map_out = NULL;
    uint32_t *map = NULL, nc = 0;
    FORWARD_IF(sq_engram_vocab_build(tok, &map, &nc));
    const size_t nt = (size_t)sq_tokenizer_vocab_size(tok);
    const int64_t want = c->v41.engram_compressed_vocab;
    sparq_status st = SPARQ_OK;
    if ((want && (int64_t)nc != want) || nc != lay->n_compressed)
        st = sparq_err(SPARQ_E_FORMAT, "%s: the tokenizer gives %u compressed ids for the Engram hash, config.json "
                       "says engram_compressed_vocab_size %lld (the hash's multipliers are for %u)", name, nc,
                       (long long)want, lay->n_compressed);
    else if (c->vocab_size > (int64_t)SQ_ENGRAM_MAX_TOKENS)
        st = sparq_err(SPARQ_E_RANGE, "%s: vocab_size %lld is more ids than an Engram token map holds (%u)", name,
                       (long long)c->vocab_size, SQ_ENGRAM_MAX_TOKENS);
    if (st == SPARQ_OK && (int64_t)nt < c->vocab_size) {
        /* ids past the tokenizer's vocabulary (padding rows of the embedding) hash as pad */
        uint32_t *nm = sparq_realloc(map, (size_t)c->vocab_size * sizeof *nm);
        if (!nm) {
            st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        } else {
            map = nm;
            for (size_t i = nt; i < (size_t)c->vocab_size; i++) map[i] = lay->pad_id;
        }
    }
    if (st != SPARQ_OK) {
        sparq_free(map);
        return st;
    }
    lay->token_map = *map_out = map;
    lay->n_tokens = (uint32_t)((int64_t)nt > c->vocab_size ? (int64_t)nt : c->vocab_size);
    return SPARQ_OK;
}
