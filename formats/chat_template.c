/* formats/chat_template.c — native rendering of the chat templates sparq
 * recognises (no Jinja engine).
 *
 * A template is recognised by its text: the plain ChatML template (exact
 * text, whitespace-insensitive) or Qwen3's template (by the statements that
 * define its behaviour for system/user/assistant turns). Each renderer below
 * reproduces what the Jinja template outputs for messages that have only a
 * role and string content; tests compare it with jinja2's rendering of the
 * real template text (tools/tokenizer/make_golden.py). Anything else is
 * SQ_CHAT_UNKNOWN and sq_chat_apply refuses it. */
#include <string.h>

#include "common/alloc.h"
#include "formats/tokenizer_priv.h"
#include "formats/unicode_tables.h"

/* ---- recognition ---------------------------------------------------------------- */

/* Compare ignoring all whitespace outside quotes is overkill; templates in
 * the wild differ in indentation and in "{%-" vs "{%" only. We strip ASCII
 * whitespace and '-' trim markers next to braces. */
static size_t squeeze(const char *s, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; s[i] && j + 1 < cap; i++) {
        char c = s[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        if (c == '-' && j && (out[j - 1] == '%' || out[j - 1] == '{') && (i == 0 || s[i - 1] == '%' || s[i - 1] == '{'))
            continue;
        if (c == '-' && (s[i + 1] == '%' || s[i + 1] == '}')) continue;
        out[j++] = c;
    }
    out[j] = 0;
    return j;
}

/* The plain ChatML template (test fixtures; no system default, no tools). */
static const char chatml_tmpl[] =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char chatml_tmpl2[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
/* The same with `| trim` on the content (the tiny-qwen3moe fixtures). */
static const char chatml_trim_tmpl[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/* Statements of Qwen3's template that fix its output for plain turns. */
static const char *const qwen3_marks[] = {
    "{%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + "
    "'<|im_end|>\\n' }}",
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- "
    "'<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}",
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}",
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}",
    "{%- if loop.index0 > ns.last_query_index %}",
    "{%- if loop.last or (not loop.last and reasoning_content) %}",
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
    "content.lstrip('\\n') }}",
    "{{- '<|im_end|>\\n' }}",
    "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        "
    "{{- '<think>\\n\\n</think>\\n\\n' }}",
    NULL};

/* Statements of DeepSeek V3/R1's template (the variant shipped with the
 * V3-0324/R1 tokenizer_config.json) that fix its output for plain turns. */
static const char *const deepseek_marks[] = {
    "{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set "
    "ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + "
    "message['content'] %}{%- endif %}",
    "{{ bos_token }}{{ ns.system_prompt }}",
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + "
    "message['content']}}{%- endif %}",
    "{% set content = message['content'] %}{% if '</think>' in content %}{% set content = "
    "content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + "
    "'<｜end▁of▁sentence｜>'}}",
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}",
    NULL};

static bool contains_squeezed(const char *hay_sq, const char *needle)
{
    char buf[1024];
    squeeze(needle, buf, sizeof buf);
    return strstr(hay_sq, buf) != NULL;
}

sparq_status tok_chat_detect(const char *tmpl, sq_chat_family *family, bool *trim)
{
    *trim = false;
    *family = SQ_CHAT_NONE;
    if (!tmpl) return SPARQ_OK;
    size_t n = strlen(tmpl);
    char *sq = sparq_malloc(n + 1);
    RETURN_IF(!sq, SPARQ_E_NOMEM, "tokenizer: out of memory reading the chat template");
    squeeze(tmpl, sq, n + 1);
    sq_chat_family f = SQ_CHAT_UNKNOWN;
    char buf[512];
    squeeze(chatml_tmpl, buf, sizeof buf);
    if (!strcmp(sq, buf)) f = SQ_CHAT_CHATML;
    squeeze(chatml_tmpl2, buf, sizeof buf);
    if (!strcmp(sq, buf)) f = SQ_CHAT_CHATML;
    squeeze(chatml_trim_tmpl, buf, sizeof buf);
    if (!strcmp(sq, buf)) {
        f = SQ_CHAT_CHATML;
        *trim = true;
    }
    if (f == SQ_CHAT_UNKNOWN) {
        bool all = true;
        for (int i = 0; qwen3_marks[i] && all; i++) all = contains_squeezed(sq, qwen3_marks[i]);
        if (all) f = SQ_CHAT_QWEN3;
    }
    if (f == SQ_CHAT_UNKNOWN) {
        bool all = true;
        for (int i = 0; deepseek_marks[i] && all; i++) all = contains_squeezed(sq, deepseek_marks[i]);
        if (all) f = SQ_CHAT_DEEPSEEK;
    }
    sparq_free(sq);
    *family = f;
    return SPARQ_OK;
}

const char *sq_chat_family_name(sq_chat_family f)
{
    switch (f) {
    case SQ_CHAT_NONE: return "none";
    case SQ_CHAT_CHATML: return "chatml";
    case SQ_CHAT_QWEN3: return "qwen3";
    case SQ_CHAT_DEEPSEEK: return "deepseek";
    default: return "unknown";
    }
}

/* ---- rendering -------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (tok_buf_reserve(&b->p, &b->cap, b->n + n + 1) != SPARQ_OK) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

static const char *const role_name[] = {"system", "user", "assistant"};

/* Python str.strip('\n')-style trims on [*s, *e). */
static void lstrip_nl(const char **s, const char *e)
{
    while (*s < e && **s == '\n') (*s)++;
}
static void rstrip_nl(const char *s, const char **e)
{
    while (*e > s && (*e)[-1] == '\n') (*e)--;
}

static const char *find_last(const char *s, const char *e, const char *needle)
{
    size_t nl = strlen(needle);
    const char *best = NULL;
    for (const char *p = s; p + nl <= e; p++)
        if (!memcmp(p, needle, nl)) best = p;
    return best;
}

static void render_qwen3(sbuf *b, const sq_chat_msg *m, int n, bool gen)
{
    if (n > 0 && m[0].role == SQ_ROLE_SYSTEM) {
        sb_add(b, "<|im_start|>system\n");
        sb_add(b, m[0].content);
        sb_add(b, "<|im_end|>\n");
    }
    /* the last user turn that is not a tool response */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        if (m[i].role != SQ_ROLE_USER) continue;
        const char *c = m[i].content;
        size_t cl = strlen(c);
        bool tool = cl >= 15 && !strncmp(c, "<tool_response>", 15) && cl >= 16 &&
                    !strcmp(c + cl - 16, "</tool_response>");
        if (!tool) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const char *c = m[i].content;
        if (m[i].role == SQ_ROLE_USER || (m[i].role == SQ_ROLE_SYSTEM && i > 0)) {
            sb_add(b, "<|im_start|>");
            sb_add(b, role_name[m[i].role]);
            sb_add(b, "\n");
            sb_add(b, c);
            sb_add(b, "<|im_end|>\n");
        } else if (m[i].role == SQ_ROLE_ASSISTANT) {
            const char *cs = c, *ce = c + strlen(c);
            const char *rs = "", *re = rs;
            const char *close = strstr(c, "</think>");
            if (close) {
                /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                rs = c;
                re = close;
                rstrip_nl(rs, &re);
                const char *open = find_last(rs, re, "<think>");
                if (open) rs = open + 7;
                lstrip_nl(&rs, re);
                /* content = content.split('</think>')[-1].lstrip('\n') */
                cs = find_last(c, ce, "</think>") + 8;
                lstrip_nl(&cs, ce);
            }
            sb_add(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || re > rs)) {
                const char *s2 = rs, *e2 = re;
                lstrip_nl(&s2, e2);
                rstrip_nl(s2, &e2);
                sb_add(b, "<think>\n");
                sb_addn(b, s2, (size_t)(e2 - s2));
                sb_add(b, "\n</think>\n\n");
                lstrip_nl(&cs, ce);
            }
            sb_addn(b, cs, (size_t)(ce - cs));
            sb_add(b, "<|im_end|>\n");
        }
    }
    if (gen) sb_add(b, "<|im_start|>assistant\n");
}

/* Python's str.isspace() (what Jinja's `trim` strips): White_Space plus
 * U+001C..U+001F. */
static bool py_isspace(uint32_t cp)
{
    return (cp >= 0x1C && cp <= 0x1F) || (uni_flags_of(cp) & UNI_WS);
}

static void add_trimmed(sbuf *b, const char *s)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t n = strlen(s), a = 0, e = n;
    int len;
    while (a < n && py_isspace(tok_utf8_next(u, a, &len))) a += (size_t)len;
    while (e > a) {
        size_t k = e - 1; /* back to the start of the last character */
        while (k > a && (u[k] & 0xC0) == 0x80) k--;
        if (!py_isspace(tok_utf8_next(u, k, &len))) break;
        e = k;
    }
    sb_addn(b, s + a, e - a);
}

#define DS_USER "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"
#define DS_EOS "<｜end▁of▁sentence｜>"

static void render_deepseek(sbuf *b, const char *bos, const sq_chat_msg *m, int n, bool gen)
{
    sb_add(b, bos);
    bool first = true; /* system messages, joined by a blank line, go first */
    for (int i = 0; i < n; i++) {
        if (m[i].role != SQ_ROLE_SYSTEM) continue;
        if (!first) sb_add(b, "\n\n");
        sb_add(b, m[i].content);
        first = false;
    }
    for (int i = 0; i < n; i++) {
        if (m[i].role == SQ_ROLE_USER) {
            sb_add(b, DS_USER);
            sb_add(b, m[i].content);
        } else if (m[i].role == SQ_ROLE_ASSISTANT) {
            /* content.split('</think>')[-1] */
            const char *c = m[i].content, *ce = c + strlen(c);
            const char *last = find_last(c, ce, "</think>");
            sb_add(b, DS_ASSISTANT);
            sb_add(b, last ? last + 8 : c);
            sb_add(b, DS_EOS);
        }
    }
    if (gen) sb_add(b, DS_ASSISTANT);
}

static void render_chatml(sbuf *b, const sq_chat_msg *m, int n, bool gen, bool trim)
{
    for (int i = 0; i < n; i++) {
        sb_add(b, "<|im_start|>");
        sb_add(b, role_name[m[i].role]);
        sb_add(b, "\n");
        if (trim) add_trimmed(b, m[i].content);
        else sb_add(b, m[i].content);
        sb_add(b, "<|im_end|>\n");
    }
    if (gen) sb_add(b, "<|im_start|>assistant\n");
}

sparq_status sq_chat_apply(const sq_tokenizer *tok, const sq_chat_msg *msgs, int n, bool add_generation_prompt,
                           char **out)
{
    *out = NULL;
    RETURN_IF(n < 0 || (n > 0 && !msgs), SPARQ_E_ARG, "chat: bad message list");
    for (int i = 0; i < n; i++)
        RETURN_IF((unsigned)msgs[i].role > SQ_ROLE_ASSISTANT || !msgs[i].content, SPARQ_E_ARG,
                  "chat: message %d has an invalid role or no content", i);
    sbuf b = {0};
    switch (tok->chat) {
    case SQ_CHAT_NONE:
        return sparq_err(SPARQ_E_NOTFOUND, "chat: the tokenizer has no chat template (tokenizer_config.json "
                                           "chat_template or chat_template.jinja)");
    case SQ_CHAT_CHATML:
        render_chatml(&b, msgs, n, add_generation_prompt, tok->chat_trim);
        break;
    case SQ_CHAT_QWEN3:
        /* the template reads messages[0]: Jinja fails on an empty list */
        RETURN_IF(n == 0, SPARQ_E_ARG, "chat: Qwen3's template needs at least one message");
        render_qwen3(&b, msgs, n, add_generation_prompt);
        break;
    case SQ_CHAT_DEEPSEEK: {
        int32_t bos = sq_tokenizer_bos(tok);
        RETURN_IF(bos < 0, SPARQ_E_UNSUPPORTED,
                  "chat: DeepSeek's template starts with bos_token, and tokenizer_config.json sets none");
        const char *bs = tok->str_pool + tok->str_off[bos];
        render_deepseek(&b, bs, msgs, n, add_generation_prompt);
        break;
    }
    default:
        return sparq_err(SPARQ_E_UNSUPPORTED,
                         "chat: the model's chat template is not one sparq can render (supported: plain ChatML, "
                         "Qwen3, DeepSeek V3/R1); template starts \"%.80s\"",
                         tok->chat_template ? tok->chat_template : "");
    }
    if (b.oom || !b.p) {
        sparq_free(b.p);
        if (b.oom) return sparq_err(SPARQ_E_NOMEM, "chat: out of memory");
        b.p = sparq_strdup("");
        RETURN_IF(!b.p, SPARQ_E_NOMEM, "chat: out of memory");
    }
    *out = b.p;
    return SPARQ_OK;
}
