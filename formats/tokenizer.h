/* formats/tokenizer.h — HF `tokenizer.json` byte-level BPE, streaming
 * detokenization and chat templates.
 *
 * What is supported (anything else in tokenizer.json is refused on load with
 * SPARQ_E_UNSUPPORTED naming the field, never silently approximated):
 *   - model: BPE with `vocab` + `merges` (either "a b" strings or [a, b]
 *     pairs), no dropout, no byte_fallback, no continuing/end-of-word affixes;
 *   - normalizer: null or NFC (Qwen2/Qwen3), or a Sequence of those;
 *   - pre_tokenizer: ByteLevel (with or without its GPT-2 regex), optionally
 *     after Split pre-tokenizers whose regexes are exactly the Qwen2/Qwen3 one,
 *     Llama 3's, or DeepSeek V3/V4's three (hand-written scanners over generated Unicode
 *     tables);
 *   - decoder: ByteLevel;
 *   - post_processor: TemplateProcessing / ByteLevel / Sequence / null (only
 *     used to tell whether a BOS is prepended: sq_tokenizer_add_bos());
 *   - model.ignore_merges; model.unk_token only when never needed;
 *   - added_tokens (special and not), split out of the text leftmost-longest.
 *
 * Encoding gives ids identical to HF tokenizers'
 * `Tokenizer.encode(text, add_special_tokens=False)` (the post-processor is
 * NOT applied: callers that want a BOS prepend sq_tokenizer_bos()).
 *
 * A loaded sq_tokenizer is immutable; encode/decode may be called from many
 * threads at once (each call uses its own scratch and its own pre-token
 * cache). Errors: see common/status.h.
 *
 * Unicode: \p{..} classes as in HF's regex engine (Unicode 16.0), NFC as in
 * HF's normalizer (Unicode 9.0 data); see formats/unicode_tables.h. */
#ifndef SPARQ_FORMATS_TOKENIZER_H
#define SPARQ_FORMATS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct sq_tokenizer sq_tokenizer;

/* Load a tokenizer. `path` is a model directory (reads tokenizer.json and, if
 * present, tokenizer_config.json and chat_template.jinja) or a tokenizer.json
 * file (then tokenizer_config.json / chat_template.jinja beside it are read
 * too, if present). tokenizer_config.json supplies eos/bos/pad tokens and the
 * chat template; chat_template.jinja, when present, overrides the latter.
 * On failure *out is NULL and the message names the file and field. */
sparq_status sq_tokenizer_load(sq_tokenizer **out, const char *path);

/* Same, from tokenizer.json text in memory (len bytes; no config, no chat
 * template). `name` is used in error messages. Used by fuzzers and tests. */
sparq_status sq_tokenizer_load_json(sq_tokenizer **out, const char *json, size_t len,
                                    const char *name);

/* Read `dir`/tokenizer_config.json (eos/bos/pad tokens, chat template) and
 * `dir`/chat_template.jinja, when present, into tok. sq_tokenizer_load does
 * this itself; call it after sq_tokenizer_load_json, before sharing tok
 * between threads. */
sparq_status sq_tokenizer_load_config(sq_tokenizer *tok, const char *dir);

void sq_tokenizer_free(sq_tokenizer *tok);

/* Encode `len` bytes of UTF-8 text into a new array *ids (sparq_free it) of
 * *n ids. parse_special: true splits special added tokens out of the text
 * ("<|im_end|>" -> its id, like HF by default); false encodes them as plain
 * text (HF's `encode_special_tokens=True`). Non-special added tokens are
 * always split out, as in HF. Invalid UTF-8 -> SPARQ_E_UTF8 with the byte
 * offset of the first bad byte. An empty text gives *n = 0 (*ids may be
 * NULL). */
sparq_status sq_tokenizer_encode(const sq_tokenizer *tok, const char *text, size_t len,
                                 bool parse_special, int32_t **ids, size_t *n);

/* Decode ids to text, into a new NUL-terminated buffer *text (sparq_free it)
 * of *len bytes. skip_special: leave out special added tokens. Byte
 * sequences that are not valid UTF-8 (possible with arbitrary ids) are
 * replaced with U+FFFD exactly as HF's decode does. An id out of range ->
 * SPARQ_E_RANGE. */
sparq_status sq_tokenizer_decode(const sq_tokenizer *tok, const int32_t *ids, size_t n,
                                 bool skip_special, char **text, size_t *len);

/* Raw bytes of one token after byte-level decoding (not NUL-terminated;
 * *len bytes valid as long as tok lives). An id out of range -> SPARQ_E_RANGE. */
sparq_status sq_tokenizer_token_bytes(const sq_tokenizer *tok, int32_t id, const uint8_t **bytes,
                                      size_t *len);

/* The token's string as tokenizer.json spells it: its model.vocab key
 * (byte-level form, e.g. "Ġthe") or, for an added token, its content — what
 * HF's convert_ids_to_tokens gives (not NUL-terminated; valid as long as tok
 * lives). An id that neither defines has length 0. Out of range -> SPARQ_E_RANGE. */
sparq_status sq_tokenizer_token_str(const sq_tokenizer *tok, int32_t id, const char **str, size_t *len);

/* Number of ids: max(id) + 1 over the BPE vocab and the added tokens. */
int32_t sq_tokenizer_vocab_size(const sq_tokenizer *tok);

/* Id of a token given its exact string (BPE vocab form, e.g. "Ġthe", or an
 * added token such as "<|im_end|>"), or -1. */
int32_t sq_tokenizer_token_id(const sq_tokenizer *tok, const char *token);

/* Is id a special added token? (false for out-of-range ids) */
bool sq_tokenizer_is_special(const sq_tokenizer *tok, int32_t id);

/* Special ids from tokenizer_config.json (eos_token, bos_token, pad_token),
 * -1 when not set. */
int32_t sq_tokenizer_eos(const sq_tokenizer *tok);
int32_t sq_tokenizer_bos(const sq_tokenizer *tok);
int32_t sq_tokenizer_pad(const sq_tokenizer *tok);
/* Does the tokenizer's post-processor prepend bos (DeepSeek does, Qwen not)? */
bool sq_tokenizer_add_bos(const sq_tokenizer *tok);

/* ---- streaming detokenization --------------------------------------------
 * For generation: push one id at a time; the bytes it makes available are
 * only ever whole UTF-8 characters (a multi-byte character split across
 * tokens is held back until complete). Bytes that can never form a valid
 * character are emitted as U+FFFD, the same way sq_tokenizer_decode does, so
 * the concatenation of all outputs plus sq_detok_flush() equals
 * sq_tokenizer_decode() of the same ids.
 *
 *   sq_detok d; sq_detok_init(&d, tok, true);
 *   for each id: { const char *s; size_t k; sq_detok_push(&d, id, &s, &k); fwrite(s,1,k,out); }
 *   sq_detok_flush(&d, &s, &k); fwrite(...); sq_detok_free(&d);
 */
typedef struct sq_detok {
    const sq_tokenizer *tok;
    bool skip_special;
    uint8_t pend[8]; /* an incomplete UTF-8 prefix held back (≤ 3 bytes) */
    size_t npend;
    char *out;       /* output buffer returned by push/flush, owned here */
    size_t out_cap;
} sq_detok;

void sq_detok_init(sq_detok *d, const sq_tokenizer *tok, bool skip_special);
/* Feed one id. *text, *len: the bytes ready now (may be 0; valid until the
 * next call). An id out of range -> SPARQ_E_RANGE (state unchanged). */
sparq_status sq_detok_push(sq_detok *d, int32_t id, const char **text, size_t *len);
/* End of stream: whatever is held back, as U+FFFD if incomplete. */
sparq_status sq_detok_flush(sq_detok *d, const char **text, size_t *len);
void sq_detok_free(sq_detok *d);

/* ---- chat templates --------------------------------------------------------
 * The tokenizer's chat template (tokenizer_config.json "chat_template" or
 * chat_template.jinja) is recognised as one of the families below by its
 * text; sparq renders it natively (no Jinja engine). A template it does not
 * recognise makes sq_chat_apply fail with SPARQ_E_UNSUPPORTED; no template at
 * all -> SPARQ_E_NOTFOUND.
 *   SQ_CHAT_CHATML:   "<|im_start|>{role}\n{content}<|im_end|>\n" per turn,
 *                     generation prompt "<|im_start|>assistant\n" (the plain
 *                     ChatML template of the test fixtures and Qwen2.5).
 *   SQ_CHAT_QWEN3:    Qwen3's template (system/user/assistant turns, thinking
 *                     handling of assistant turns as the template does it,
 *                     enable_thinking = true unless disabled).
 *   SQ_CHAT_DEEPSEEK: DeepSeek V3/R1's template (the variant that joins system
 *                     messages with "\n\n" and drops "…</think>" from
 *                     assistant turns): "{bos}{system}<｜User｜>{user}
 *                     <｜Assistant｜>{answer}<｜end▁of▁sentence｜>…", generation
 *                     prompt "<｜Assistant｜>"; needs bos_token in the config. */
typedef enum sq_chat_family {
    SQ_CHAT_NONE = 0,
    SQ_CHAT_UNKNOWN,
    SQ_CHAT_CHATML,
    SQ_CHAT_QWEN3,
    SQ_CHAT_DEEPSEEK,
} sq_chat_family;

typedef enum sq_chat_role { SQ_ROLE_SYSTEM = 0, SQ_ROLE_USER, SQ_ROLE_ASSISTANT } sq_chat_role;

typedef struct sq_chat_msg {
    sq_chat_role role;
    const char *content; /* UTF-8, NUL-terminated */
} sq_chat_msg;

/* The family of the loaded template (SQ_CHAT_NONE if there is none). */
sq_chat_family sq_tokenizer_chat_family(const sq_tokenizer *tok);
/* "chatml", "qwen3", "deepseek", "none", "unknown". */
const char *sq_chat_family_name(sq_chat_family f);

/* Render n messages as the model's template would (the rendered text is then
 * encoded with parse_special = true). *out: new NUL-terminated string
 * (sparq_free it). */
sparq_status sq_chat_apply(const sq_tokenizer *tok, const sq_chat_msg *msgs, int n,
                           bool add_generation_prompt, char **out);

#endif
