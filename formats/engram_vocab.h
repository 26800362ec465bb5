/* formats/engram_vocab.h — DeepSeek V4.1's Engram compressed vocabulary.
 *
 * The Engram hash (formats/engram.h) does not hash token ids but
 * "compressed" ids: a many-to-one map of the tokenizer's vocabulary that
 * merges tokens differing only in case, accents, compatibility forms or
 * surrounding whitespace. The rule is DeepSeek's (Engram demo,
 * CompressedTokenizer; docs/engram-format.md): for every id in order,
 *   text = the id decoded alone, special tokens kept (HF decode, no
 *          clean-up of tokenization spaces);
 *   key  = the token's own string (convert_ids_to_tokens) if text contains
 *          U+FFFD, else sq_engram_normalize(text), or text if that is empty;
 *   a key seen for the first time gets the next compressed id (0, 1, ...).
 * With the DeepSeek V4 tokenizer (129,280 ids) this gives 99,092 compressed
 * ids, and the pad id 2 maps to 2.
 *
 * Both functions are pure and thread-safe. */
#ifndef SPARQ_FORMATS_ENGRAM_VOCAB_H
#define SPARQ_FORMATS_ENGRAM_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/engram.h"
#include "formats/hfconfig.h"
#include "formats/tokenizer.h"

#define SQ_ENGRAM_V41_COMPRESSED 99092u /* compressed ids of the DeepSeek V4 tokenizer */

/* The Engram key normalizer, exactly HF tokenizers' (0.23.2) Sequence of
 * NFKC, NFD, StripAccents, Lowercase, Replace(/[ \t\r\n]+/, " "),
 * Replace(/^ $/, U+E000), Strip, Replace(U+E000, " "). In words: NFKD
 * (Unicode 9.0 data), drop General_Category M (Unicode 9.0), Rust's full
 * lowercase (Unicode 17.0; U+0130 -> "i\u0307"), collapse runs of
 * space/tab/CR/LF to one space; then a result of exactly " " stays " ",
 * anything else loses leading and trailing White_Space and has U+E000
 * replaced by a space. `len` bytes of UTF-8 (invalid -> SPARQ_E_UTF8 with
 * the offset). *out: a new NUL-terminated buffer (sparq_free it) of
 * *out_len bytes, possibly empty. Fuzz target. */
sparq_status sq_engram_normalize(const char *text, size_t len, char **out, size_t *out_len);

/* Build the compressed vocabulary of `tok`: *map_out (sparq_free it) gets
 * sq_tokenizer_vocab_size(tok) entries, map[id] = compressed id (added and
 * special tokens included); *n_compressed_out = the number of distinct
 * compressed ids. Runs at model load: 20-77 ms for DeepSeek V4's 129,280
 * ids on one core, measured on a shared 2-core machine
 * (tests/formats/test_engram_vocab.c prints the time). */
sparq_status sq_engram_vocab_build(const sq_tokenizer *tok, uint32_t **map_out, uint32_t *n_compressed_out);

/* The token map a model's Engram hash reads: sq_engram_vocab_build over
 * tok, its count checked against config.json's engram_compressed_vocab_size
 * and lay->n_compressed (the count the multipliers were drawn for), then
 * extended to the config's vocab_size (ids past the tokenizer's, padding
 * rows of the embedding, map to lay->pad_id). Sets lay->token_map =
 * *map_out (sparq_free it) and lay->n_tokens. `name` for messages. */
sparq_status sq_engram_token_map(const sq_tokenizer *tok, const sq_model_config *c, const char *name,
                                 uint32_t **map_out, sq_engram_layout *lay);

#endif
