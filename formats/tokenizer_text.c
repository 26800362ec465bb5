/* formats/tokenizer_text.c — the text side of the tokenizer: strict and lossy
 * UTF-8, NFC, and hand-written scanners for the exact pre-tokenizer regexes
 * of Qwen2/Qwen3, DeepSeek V3/V4 and GPT-2.
 *
 * Why hand-written scanners: the regexes are fixed strings in tokenizer.json,
 * and HF tokenizers runs them with Oniguruma (backtracking, leftmost
 * alternative wins). Each scanner below is that regex unrolled by hand: at a
 * position it tries the alternatives in order and returns the length the
 * backtracking engine would match. Character classes come from the generated
 * Unicode tables (formats/unicode_tables.c), so \p{L} etc. are exact for the
 * table's Unicode version. Oniguruma's \s is White_Space. */
#include <string.h>

#include "common/alloc.h"
#include "formats/tokenizer_internal.h"
#include "formats/unicode_tables.h"

/* ---- UTF-8 ---------------------------------------------------------------- */

int tok_utf8_put(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the well-formed sequence at s[i] (Unicode Table 3-7), or -k where
 * k ≥ 1 is the length of the maximal valid-but-broken prefix (the part
 * from_utf8_lossy replaces with one U+FFFD). `complete` is false when the
 * prefix was cut by the end of the buffer rather than by a bad byte. */
static int utf8_seq(const uint8_t *s, size_t i, size_t n, bool *complete)
{
    uint8_t b = s[i];
    *complete = true;
    if (b < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if (i + (size_t)k >= n) {
            *complete = false;
            return -k;
        }
        uint8_t c = s[i + (size_t)k];
        if (c < lo || c > hi) return -k;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

size_t tok_utf8_check(const uint8_t *s, size_t n)
{
    size_t i = 0;
    bool complete;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        int k = utf8_seq(s, i, n, &complete);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

size_t tok_utf8_incomplete_tail(const uint8_t *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back;
        if ((s[i] & 0xC0) == 0x80) continue; /* continuation byte: keep looking for a lead */
        bool complete;
        int k = utf8_seq(s, i, n, &complete);
        return (k < 0 && !complete && (size_t)(-k) == back) ? back : 0;
    }
    return 0;
}

sparq_status tok_buf_reserve(char **out, size_t *cap, size_t need)
{
    if (need <= *cap) return SPARQ_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    char *p = sparq_realloc(*out, nc);
    RETURN_IF(!p, SPARQ_E_NOMEM, "tokenizer: out of memory (%zu bytes of text)", nc);
    *out = p;
    *cap = nc;
    return SPARQ_OK;
}

sparq_status tok_utf8_lossy_append(const uint8_t *s, size_t n, char **out, size_t *len, size_t *cap)
{
    /* worst case: every byte becomes U+FFFD (3 bytes); +1 for a NUL */
    FORWARD_IF(tok_buf_reserve(out, cap, *len + 3 * n + 1));
    uint8_t *o = (uint8_t *)*out;
    size_t j = *len, i = 0;
    bool complete;
    while (i < n) {
        int k = utf8_seq(s, i, n, &complete);
        if (k > 0) {
            memcpy(o + j, s + i, (size_t)k);
            j += (size_t)k;
            i += (size_t)k;
        } else {
            o[j++] = 0xEF;
            o[j++] = 0xBF;
            o[j++] = 0xBD;
            i += (size_t)(-k);
        }
    }
    o[j] = 0;
    *len = j;
    return SPARQ_OK;
}

/* ---- NFC (UAX #15: decompose, canonical order, compose) ------------------- */

enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7, HANGUL_LC = 19,
       HANGUL_VC = 21, HANGUL_TC = 28, HANGUL_NC = 21 * 28, HANGUL_SC = 19 * 21 * 28 };

static const uni_decomp_entry *decomp_find(uint32_t cp)
{
    size_t lo = 0, hi = uni_decomp_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uni_decomp[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < uni_decomp_count && uni_decomp[lo].cp == cp ? &uni_decomp[lo] : NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LC && b >= HANGUL_V && b < HANGUL_V + HANGUL_VC)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VC + (b - HANGUL_V)) * HANGUL_TC;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SC && (a - HANGUL_S) % HANGUL_TC == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_TC)
        return a + (b - HANGUL_T);
    uint64_t key = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = uni_comp_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uni_comp[mid].key < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < uni_comp_count && uni_comp[lo].key == key ? uni_comp[lo].cp : 0;
}

sparq_status tok_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    size_t i = 0;
    int len;
    bool stable = true;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp = tok_utf8_next(s, i, &len);
        if (uni_flags_of(cp) & (UNI_NFCQC | UNI_CCC)) {
            stable = false;
            break;
        }
        i += (size_t)len;
    }
    if (stable) return SPARQ_OK;

    /* Decompose everything: at most 18 code points per input character
     * (the longest full decomposition), and never more than 4 per byte. */
    size_t cap = 4 * n + 4;
    uint32_t *cps = sparq_malloc(cap * sizeof *cps);
    RETURN_IF(!cps, SPARQ_E_NOMEM, "tokenizer: out of memory normalizing %zu bytes", n);
    size_t m = 0;
    for (i = 0; i < n; i += (size_t)len) {
        uint32_t cp = tok_utf8_next(s, i, &len);
        int h = tok_hangul_decompose(cp, cps + m);
        if (h) {
            m += (size_t)h;
            continue;
        }
        const uni_decomp_entry *d = cp >= 0xC0 ? decomp_find(cp) : NULL;
        if (d) {
            for (uint32_t k = 0; k < d->len; k++) cps[m++] = uni_decomp_pool[d->off + k];
        } else {
            cps[m++] = cp;
        }
    }
    /* canonical ordering: stable insertion sort of each run of non-starters */
    for (size_t k = 1; k < m; k++) {
        unsigned c = uni_ccc_of(cps[k]);
        if (!c) continue;
        size_t j = k;
        uint32_t v = cps[k];
        while (j > 0) {
            unsigned p = uni_ccc_of(cps[j - 1]);
            if (p <= c) break;
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = v;
    }
    /* canonical composition: a char composes with the last starter unless
     * blocked, i.e. unless a char between them (the last one kept suffices,
     * they are in canonical order) has a class >= its own. */
    size_t w = 0;
    long starter = -1;
    for (size_t k = 0; k < m; k++) {
        uint32_t cp = cps[k];
        unsigned c = uni_ccc_of(cp);
        if (starter >= 0) {
            bool blocked = (long)w - 1 > starter && uni_ccc_of(cps[w - 1]) >= c;
            uint32_t comp = blocked ? 0 : compose_pair(cps[starter], cp);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (c == 0) starter = (long)w;
        cps[w++] = cp;
    }
    uint8_t *o = sparq_malloc(4 * w + 1);
    if (!o) {
        sparq_free(cps);
        return sparq_err(SPARQ_E_NOMEM, "tokenizer: out of memory normalizing %zu bytes", n);
    }
    size_t on = 0;
    for (size_t k = 0; k < w; k++) on += (size_t)tok_utf8_put(cps[k], o + on);
    o[on] = 0;
    sparq_free(cps);
    *out = o;
    *out_n = on;
    return SPARQ_OK;
}

/* ---- pre-tokenizer scanners ------------------------------------------------ */

typedef struct {
    const uint8_t *s;
    size_t end;
} subj;

/* Code point and flags at i (i < end); *len = its byte length. */
static inline uint32_t at(const subj *t, size_t i, unsigned *fl, int *len)
{
    uint32_t cp = tok_utf8_next(t->s, i, len);
    *fl = uni_flags_of(cp);
    return cp;
}

/* End offset of the run of chars from i whose flags intersect `want` (any
 * flags if want is 0) and none of `stop`. */
static size_t run_while(const subj *t, size_t i, unsigned want, unsigned stop)
{
    unsigned fl;
    int len;
    while (i < t->end) {
        at(t, i, &fl, &len);
        if ((want && !(fl & want)) || (fl & stop)) break;
        i += (size_t)len;
    }
    return i;
}
static size_t run_of(const subj *t, size_t i, unsigned want) { return run_while(t, i, want, 0); }
/* Run of chars that are none of the classes in `not_want` and not \s. */
static size_t run_other(const subj *t, size_t i, unsigned not_want) { return run_while(t, i, 0, not_want | UNI_WS); }

static size_t run_crlf(const subj *t, size_t i)
{
    while (i < t->end && (t->s[i] == '\r' || t->s[i] == '\n')) i++;
    return i;
}

/* The whitespace alternatives these regexes end with: \s*[\r\n]+ (only if
 * `nl`; GPT-2 lacks it) | \s+(?!\S) | \s+ . pos is at a \s char. */
static size_t ws_tail(const subj *t, size_t pos, bool nl)
{
    size_t i = pos, last_nl = 0, prev = pos;
    bool have_nl = false;
    unsigned fl;
    int len;
    while (i < t->end) {
        uint32_t cp = at(t, i, &fl, &len);
        if (!(fl & UNI_WS)) break;
        if (cp == '\r' || cp == '\n') {
            have_nl = true;
            last_nl = i + 1;
        }
        prev = i;
        i += (size_t)len;
    }
    /* \s*[\r\n]+: \s* backs off to the last \r/\n of the run */
    if (nl && have_nl) return last_nl - pos;
    /* \s+(?!\S): the whole run if it ends the subject, else all but its last char */
    if (i == t->end) return i - pos;
    if (prev > pos) return prev - pos;
    /* \s+ */
    return i - pos;
}

static inline bool is_ascii_alpha(uint8_t c) { return (uint8_t)((c | 0x20) - 'a') < 26; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at pos (s[pos] == '\''): length or 0. Under
 * Unicode case folding 's' also matches U+017F LATIN SMALL LETTER LONG S. */
static size_t contraction(const subj *t, size_t pos, bool icase)
{
    size_t i = pos + 1;
    if (i >= t->end) return 0;
    uint8_t c = t->s[i];
    if (icase && c == 0xC5 && i + 1 < t->end && t->s[i + 1] == 0xBF) return 3; /* ſ */
    if (icase && c >= 'A' && c <= 'Z') c = (uint8_t)(c | 0x20);
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
    if (i + 1 >= t->end) return 0;
    uint8_t d = t->s[i + 1];
    if (icase && d >= 'A' && d <= 'Z') d = (uint8_t)(d | 0x20);
    if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
    return 0;
}

/* Qwen2's regex; max_digits 3 gives Llama 3's (\p{N}{1,3}). */
static size_t match_qwen2(const subj *t, size_t pos, int max_digits)
{
    unsigned f0, f1;
    int l0, l1;
    uint32_t c0 = at(t, pos, &f0, &l0);
    size_t n1 = pos + (size_t)l0;
    if (c0 == '\'') {
        size_t k = contraction(t, pos, true);
        if (k) return k;
    }
    if (f0 & UNI_L) return run_of(t, pos, UNI_L) - pos;
    if (c0 != '\r' && c0 != '\n' && !(f0 & UNI_N) && n1 < t->end) {
        at(t, n1, &f1, &l1);
        if (f1 & UNI_L) return run_of(t, n1, UNI_L) - pos;
    }
    if (f0 & UNI_N) {
        size_t i = n1;
        unsigned fl;
        int len;
        for (int d = 1; d < max_digits && i < t->end; d++) {
            at(t, i, &fl, &len);
            if (!(fl & UNI_N)) break;
            i += (size_t)len;
        }
        return i - pos;
    }
    /* ?[^\s\p{L}\p{N}]+[\r\n]* */
    if (c0 == ' ' && n1 < t->end) {
        at(t, n1, &f1, &l1);
        if (!(f1 & (UNI_WS | UNI_L | UNI_N))) return run_crlf(t, run_other(t, n1, UNI_L | UNI_N)) - pos;
    }
    if (!(f0 & (UNI_WS | UNI_L | UNI_N))) return run_crlf(t, run_other(t, pos, UNI_L | UNI_N)) - pos;
    return ws_tail(t, pos, true);
}

static size_t match_gpt2(const subj *t, size_t pos)
{
    unsigned f0, f1;
    int l0, l1;
    uint32_t c0 = at(t, pos, &f0, &l0);
    size_t n1 = pos + (size_t)l0;
    if (c0 == '\'') {
        size_t k = contraction(t, pos, false);
        if (k) return k;
    }
    size_t start = pos;
    if (c0 == ' ' && n1 < t->end) {
        at(t, n1, &f1, &l1);
        if (!(f1 & UNI_WS)) {
            start = n1;
            f0 = f1;
        }
    }
    if (f0 & UNI_L) return run_of(t, start, UNI_L) - pos;
    if (f0 & UNI_N) return run_of(t, start, UNI_N) - pos;
    if (!(f0 & (UNI_WS | UNI_L | UNI_N))) return run_other(t, start, UNI_L | UNI_N) - pos;
    return ws_tail(t, pos, false);
}

static bool ds_ascii_punct(uint8_t c)
{
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}

static size_t match_ds_main(const subj *t, size_t pos)
{
    unsigned f0, f1;
    int l0, l1;
    uint32_t c0 = at(t, pos, &f0, &l0);
    size_t n1 = pos + (size_t)l0;
    /* [!"#...~][A-Za-z]+ */
    if (c0 < 0x80 && ds_ascii_punct((uint8_t)c0) && n1 < t->end && is_ascii_alpha(t->s[n1])) {
        size_t i = n1;
        while (i < t->end && is_ascii_alpha(t->s[i])) i++;
        return i - pos;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ */
    if (c0 != '\r' && c0 != '\n' && !(f0 & (UNI_L | UNI_P | UNI_S)) && n1 < t->end) {
        at(t, n1, &f1, &l1);
        if (f1 & (UNI_L | UNI_M)) return run_of(t, n1, UNI_L | UNI_M) - pos;
    }
    if (f0 & (UNI_L | UNI_M)) return run_of(t, pos, UNI_L | UNI_M) - pos;
    /* ?[\p{P}\p{S}]+[\r\n]* */
    if (c0 == ' ' && n1 < t->end) {
        at(t, n1, &f1, &l1);
        if (f1 & (UNI_P | UNI_S)) return run_crlf(t, run_of(t, n1, UNI_P | UNI_S)) - pos;
    }
    if (f0 & (UNI_P | UNI_S)) return run_crlf(t, run_of(t, pos, UNI_P | UNI_S)) - pos;
    if (f0 & UNI_WS) return ws_tail(t, pos, true);
    return 0; /* e.g. a digit or a control char: left in a gap */
}

static bool ds_cjk(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) || (cp >= 0x30A0 && cp <= 0x30FF);
}

size_t tok_split_match(tok_split_kind k, const uint8_t *s, size_t pos, size_t end)
{
    const subj t = {s, end};
    switch (k) {
    case TOK_SPLIT_QWEN2:
        return match_qwen2(&t, pos, 1);
    case TOK_SPLIT_LLAMA3:
        return match_qwen2(&t, pos, 3);
    case TOK_SPLIT_GPT2:
        return match_gpt2(&t, pos);
    case TOK_SPLIT_DS_MAIN:
        return match_ds_main(&t, pos);
    case TOK_SPLIT_DS_DIGITS: {
        size_t i = pos;
        unsigned fl;
        int len;
        for (int d = 0; d < 3 && i < end; d++) {
            at(&t, i, &fl, &len);
            if (!(fl & UNI_N)) break;
            i += (size_t)len;
        }
        return i - pos;
    }
    case TOK_SPLIT_DS_CJK: {
        size_t i = pos;
        int len;
        while (i < end && ds_cjk(tok_utf8_next(s, i, &len))) i += (size_t)len;
        return i - pos;
    }
    default:
        return 0;
    }
}

/* The regex strings as they appear in tokenizer.json (after JSON decoding).
 * Some files spell \r \n as escapes, some as the literal characters; both
 * are accepted (same regex). */
static const char *const split_regex[TOK_SPLIT_COUNT_] = {
    [TOK_SPLIT_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                        "?[^\\s\\p{L}\\p{N}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    [TOK_SPLIT_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                         "?[^\\s\\p{L}\\p{N}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    [TOK_SPLIT_DS_DIGITS] = "\\p{N}{1,3}",
    [TOK_SPLIT_DS_CJK] = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",
    [TOK_SPLIT_DS_MAIN] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
                          "\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    [TOK_SPLIT_GPT2] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
};

bool tok_split_kind_of(const char *regex, tok_split_kind *out)
{
    /* canonical form: "\r" and "\n" escapes -> literal characters */
    size_t n = strlen(regex);
    if (n > 1024) return false;
    char buf[1025];
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (regex[i] == '\\' && i + 1 < n && (regex[i + 1] == 'r' || regex[i + 1] == 'n')) {
            buf[j++] = regex[i + 1] == 'r' ? '\r' : '\n';
            i++;
        } else if (regex[i] == '\\' && i + 1 < n) {
            buf[j++] = regex[i];
            buf[j++] = regex[++i];
        } else {
            buf[j++] = regex[i];
        }
    }
    buf[j] = 0;
    for (int k = 0; k < TOK_SPLIT_COUNT_; k++)
        if (!strcmp(buf, split_regex[k])) {
            *out = (tok_split_kind)k;
            return true;
        }
    return false;
}
