/* formats/engram.h — the Engram table file kept on the SSD, its reader with
 * a small LRU row cache, and the DeepSeek V4.1 Engram hash.
 *
 * Engram (reference.md §3) adds, at a few layers, embeddings looked up by
 * hashed n-grams of the token ids: per layer 24 hash columns (n-gram orders
 * 2..4 x 8 heads), each column a segment of `prime` rows of a huge table
 * (~384M rows of 264 bytes per layer in V4.1: 256 FP8-E4M3 values + 8 UE8M0
 * scales, one per group of 32). Rows depend only on token ids, so they are
 * fetched from the SSD (pread) before the forward pass needs them. The hash
 * reads compressed ids, not token ids: sq_engram_vocab_build
 * (formats/engram_vocab.h) maps every token id of the tokenizer to one of
 * them once, at load (99,092 for DeepSeek V4's 129,280 ids; pad 2 -> 2).
 *
 * File (docs/engram-format.md; little-endian): a header padded to a multiple
 * of 4096 (magic "SQENGRAM", layout, per-layer multipliers, per-column prime
 * / global row offset / file offset, XXH3-64 of the header), then the rows
 * grouped per layer and per hash column (bucket order), then one XXH3-128
 * per block of `block_bytes` data bytes. A model's tables are sharded over
 * the nodes by hash column: shard s of S holds the columns c with
 * c % S == s, so every node serves an equal share of each token's lookups.
 *
 * The reader is not thread-safe (one per thread, or a lock around fetch). */
#ifndef SPARQ_FORMATS_ENGRAM_H
#define SPARQ_FORMATS_ENGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define SQ_ENGRAM_MAGIC "SQENGRAM"
#define SQ_ENGRAM_VERSION 1
#define SQ_ENGRAM_MAX_LAYERS 8
#define SQ_ENGRAM_MAX_COLUMNS 64
#define SQ_ENGRAM_ORDERS 4 /* multipliers per layer: tokens t, t-1, t-2, t-3 */

/* Element types of the row values and scales. */
typedef enum sq_engram_dtype {
    SQ_ENGRAM_NONE = 0,    /* no scales */
    SQ_ENGRAM_F8_E4M3 = 1, /* values (V4.1) */
    SQ_ENGRAM_UE8M0 = 2,   /* scales 2^(b-127) (V4.1) */
    SQ_ENGRAM_F16 = 3,
    SQ_ENGRAM_BF16 = 4,
    SQ_ENGRAM_F32 = 5,
} sq_engram_dtype;

/* Bytes per element (0 for NONE or an unknown value). */
uint32_t sq_engram_dtype_bytes(sq_engram_dtype dt);

/* The layout of a set of tables (all columns, whatever the shard), plus, once
 * parsed from a file, where this shard's columns are. */
typedef struct sq_engram_layout {
    uint32_t row_bytes;       /* values_per_row * bytes(value) + scales_per_row * bytes(scale) */
    uint32_t value_dtype;     /* sq_engram_dtype */
    uint32_t values_per_row;  /* 256 */
    uint32_t scale_dtype;     /* sq_engram_dtype, NONE if no scales */
    uint32_t scales_per_row;  /* 8: one per values_per_row / scales_per_row values, stored after them */
    uint32_t n_layers;        /* tables (model layers with Engram), <= SQ_ENGRAM_MAX_LAYERS */
    uint32_t n_columns;       /* hash columns per layer, <= SQ_ENGRAM_MAX_COLUMNS */
    int32_t layer_ids[SQ_ENGRAM_MAX_LAYERS];                       /* model layer of table i */
    uint64_t multipliers[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_ORDERS];   /* hash multipliers */
    uint64_t primes[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_MAX_COLUMNS];   /* buckets of each column */
    uint64_t row_offset[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_MAX_COLUMNS]; /* running sum of earlier primes */
} sq_engram_layout;

/* Fill row_offset from primes (offset = sum of the earlier columns' primes
 * of the same layer) and check the layout; SPARQ_E_ARG naming what is wrong. */
sparq_status sq_engram_layout_finish(sq_engram_layout *lay);

/* Rows of table `layer` (sum of its primes). */
uint64_t sq_engram_layer_rows(const sq_engram_layout *lay, uint32_t layer);

/* A parsed file header. */
typedef struct sq_engram_header {
    sq_engram_layout layout;
    uint32_t header_bytes;
    uint32_t shard_index, shard_count;
    uint32_t block_bytes;
    uint64_t data_offset, data_bytes, checksum_offset, n_blocks;
    /* byte offset in the file of column c of table l's bucket 0, or
     * UINT64_MAX when another shard holds that column */
    uint64_t file_offset[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_MAX_COLUMNS];
} sq_engram_header;

/* Parse and validate a header from the first `len` bytes of a file of
 * `file_size` bytes (every offset and size checked, with overflow checks;
 * the header's own XXH3-64 checked). `name` is used in messages. Fuzz target. */
sparq_status sq_engram_header_parse(sq_engram_header *h, const uint8_t *buf, size_t len, uint64_t file_size,
                                    const char *name);

/* Source of row data for the writer: fill `n` rows (n * row_bytes bytes) of
 * table `layer`, column `column`, buckets [first, first + n). */
typedef sparq_status (*sq_engram_row_fn)(void *ctx, uint32_t layer, uint32_t column, uint64_t first, uint64_t n,
                                         uint8_t *rows);

/* Write shard `shard` of `shards` of the tables to path (atomically).
 * block_bytes: checksum block, a power of two >= 4096. */
sparq_status sq_engram_write(const char *path, const sq_engram_layout *lay, uint32_t shard, uint32_t shards,
                             uint32_t block_bytes, sq_engram_row_fn fn, void *ctx);

/* Which shard of `shards` holds column c. */
static inline uint32_t sq_engram_column_shard(uint32_t column, uint32_t shards) { return column % shards; }

/* --- reader ------------------------------------------------------------- */

typedef struct sq_engram_reader sq_engram_reader;

typedef struct sq_engram_key {
    uint32_t layer;   /* table index (0..n_layers-1), not the model layer */
    uint32_t column;
    uint64_t bucket;  /* 0 .. primes[layer][column]-1 */
} sq_engram_key;

/* Open a shard file; cache_rows = LRU capacity in rows (0: no cache). */
sparq_status sq_engram_open(sq_engram_reader **out, const char *path, uint64_t cache_rows);
void sq_engram_close(sq_engram_reader *r);
const sq_engram_header *sq_engram_reader_header(const sq_engram_reader *r);

/* Fetch n rows into out (n * row_bytes): from the cache, else pread.
 * SPARQ_E_RANGE for a key outside the layout, SPARQ_E_NOTFOUND for a column
 * another shard holds. */
sparq_status sq_engram_fetch(sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out);

/* A reader over tables already in memory — a checkpoint's mapped
 * `layers.L.engram.embed.weight` (F8_E4M3 [rows, values_per_row]) and
 * `.embed.scale` (UE8M0 [rows, scales_per_row]) for each table of `lay` —
 * so that the forward fetches rows the same way from a checkpoint as from a
 * packed file: sq_engram_fetch returns row_bytes per key (values, then
 * scales). No cache (the mapping is the page cache); `name` for messages. */
sparq_status sq_engram_open_mapped(sq_engram_reader **out, const sq_engram_layout *lay, const uint8_t *const *values,
                                   const uint8_t *const *scales, const char *name);

/* Widen one fetched F8_E4M3 row (with its UE8M0 scales, one per group of
 * values_per_row / scales_per_row values) to fp32: values_per_row floats. */
void sq_engram_row_to_f32(const sq_engram_layout *lay, const uint8_t *row, float *out);

/* Cache statistics since open. */
void sq_engram_cache_stats(const sq_engram_reader *r, uint64_t *hits, uint64_t *misses);

/* Check every data block checksum; SPARQ_E_CHECKSUM names the file, block
 * and the table/column it falls in. */
sparq_status sq_engram_verify(sq_engram_reader *r);

/* --- DeepSeek V4.1 hash (reference.md §3.1) ----------------------------- */

#define SQ_ENGRAM_V41_COLUMNS 24  /* orders 2,3,4 x 8 heads */
#define SQ_ENGRAM_V41_HEADS 8
#define SQ_ENGRAM_V41_PAD 2       /* compressed pad id */
#define SQ_ENGRAM_V41_PRIME_BASE 16000000ull

/* Smallest prime > n (n < 2^62). */
uint64_t sq_engram_next_prime(uint64_t n);

/* The V4.1 layout: tables for model layers 1 and 14, multipliers as
 * published, 264-byte rows (256 F8_E4M3 + 8 UE8M0), and as primes the
 * consecutive primes above `prime_base` (SQ_ENGRAM_V41_PRIME_BASE for the
 * real model: layer 1 takes the first 24, layer 14 the next 24; tests pass a
 * small base to get small tables of the same shape). */
void sq_engram_v41_layout(sq_engram_layout *lay, uint64_t prime_base);

/* Buckets of the 24 columns of table `layer` for position t of a sequence of
 * compressed ids cids[0..n) (cids[i] = map[ids[i]], map from
 * sq_engram_vocab_build): tok_k = cids[t-k] (pad for t-k < 0);
 * h = tok_0*m_0, then for order i = 1..3: h ^= tok_i*m_i and for each head
 * j: bucket[(i-1)*8 + j] = h mod primes[layer][(i-1)*8 + j]. The global row
 * is row_offset + bucket. */
void sq_engram_v41_buckets(const sq_engram_layout *lay, uint32_t layer, const uint32_t *cids, size_t n, size_t t,
                           uint64_t bucket[SQ_ENGRAM_V41_COLUMNS]);

#endif
