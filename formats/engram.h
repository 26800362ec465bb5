/* formats/engram.h — the Engram table file kept on the SSD, its reader with
 * a small LRU row cache, an asynchronous row fetcher (pread workers), and the
 * DeepSeek V4.1 Engram hash.
 *
 * Engram (reference.md §3) adds, at a few layers, embeddings looked up by
 * hashed n-grams of the token ids: per layer (max_ngram - 1) x n_heads hash
 * columns (24 in V4.1: orders 2..4 x 8 heads), each column a segment of
 * `prime` rows of a huge table (~384M rows of 264 bytes per layer in V4.1:
 * 256 FP8-E4M3 values + 8 UE8M0 scales, one per group of 32). Rows depend only
 * on token ids, so they are fetched from the SSD (pread) before the forward
 * pass needs them. The hash reads compressed ids, not token ids: a map of
 * every token id to one of them (sq_engram_vocab_build, formats/engram_vocab.h;
 * 99,092 for DeepSeek V4's 129,280 ids; pad 2 -> 2).
 *
 * File (docs/engram-format.md; little-endian; version 2): a header padded to
 * a multiple of 4096 — magic "SQENGRAM", layout, every hash constant (per
 * table: model layer and multipliers; per column: prime, row offset, file
 * offset; max n-gram, heads, pad id; the whole token -> compressed id map),
 * XXH3-64 of the header —, then the rows grouped per table and per hash
 * column (bucket order), then one XXH3-128 per block of `block_bytes` data
 * bytes. A node can compute and read its rows from its file alone.
 *
 * Sharding is by layer: in a bundle, node K's file holds the tables of the
 * Engram layers node K runs (every column of each), so a pipeline node reads
 * its rows locally (docs/engram-format.md says why not by column).
 *
 * The reader's fetch (with the LRU cache) is not thread-safe; sq_engram_read
 * (no cache) and the fetcher are. */
#ifndef SPARQ_FORMATS_ENGRAM_H
#define SPARQ_FORMATS_ENGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/hfconfig.h"

#define SQ_ENGRAM_MAGIC "SQENGRAM"
#define SQ_ENGRAM_VERSION 2
#define SQ_ENGRAM_MAX_LAYERS 8
#define SQ_ENGRAM_MAX_COLUMNS 64
#define SQ_ENGRAM_ORDERS 4 /* at most max_ngram multipliers per layer: tokens t, t-1, t-2, t-3 */
#define SQ_ENGRAM_MAX_TOKENS (1u << 22) /* token-map entries a file may hold */

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

/* A set of tables and the hash that addresses them: everything a node needs
 * to turn token ids into rows. */
typedef struct sq_engram_layout {
    uint32_t row_bytes;       /* values_per_row * bytes(value) + scales_per_row * bytes(scale) */
    uint32_t value_dtype;     /* sq_engram_dtype */
    uint32_t values_per_row;  /* engram_head_dim: 256 in V4.1, 32 in the fixture */
    uint32_t scale_dtype;     /* sq_engram_dtype, NONE if no scales */
    uint32_t scales_per_row;  /* one per values_per_row / scales_per_row values, stored after them */
    uint32_t n_layers;        /* tables (model layers with Engram), <= SQ_ENGRAM_MAX_LAYERS */
    uint32_t n_columns;       /* hash columns per layer = (max_ngram - 1) * n_heads */
    uint32_t max_ngram;       /* 2..SQ_ENGRAM_ORDERS (4 in V4.1) */
    uint32_t n_heads;         /* hash heads per n-gram order (8 in V4.1) */
    uint32_t pad_id;          /* compressed id of a slot before the sequence start (2) */
    uint32_t n_compressed;    /* distinct compressed ids (99,092 in V4.1) */
    uint32_t n_tokens;        /* entries of token_map (0: none yet) */
    const uint32_t *token_map; /* [n_tokens] token id -> compressed id; not owned */
    int32_t layer_ids[SQ_ENGRAM_MAX_LAYERS];                       /* model layer of table i */
    uint64_t multipliers[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_ORDERS];   /* hash multipliers (odd; unused ones 0) */
    uint64_t primes[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_MAX_COLUMNS];   /* buckets of each column */
    uint64_t row_offset[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_MAX_COLUMNS]; /* running sum of earlier primes */
} sq_engram_layout;

/* Fill row_offset from primes (offset = sum of the earlier columns' primes
 * of the same layer) and check the layout; SPARQ_E_ARG naming what is wrong. */
sparq_status sq_engram_layout_finish(sq_engram_layout *lay);

/* Rows of table `layer` (sum of its primes). */
uint64_t sq_engram_layer_rows(const sq_engram_layout *lay, uint32_t layer);

/* The table index of model layer L in lay, or -1. */
int sq_engram_table_of(const sq_engram_layout *lay, int L);

/* The Engram layout a model's config.json implies — the one function pack,
 * the runtime and inspect use. Values per row = engram_head_dim (F8_E4M3),
 * one UE8M0 scale per 32 values; columns (engram_max_ngram_size - 1) x
 * engram_n_heads; bucket counts the consecutive primes >= engram_vocab_size
 * in (table, order, head) order, never reused (the vendor's
 * calculate_vocab_size_across_layers; the release's engram_vocab_size gives
 * the primes above 16,000,000); multipliers the released ones (layers 1 and
 * 14 with 99,092 compressed ids: the only layout sparq knows them for;
 * SPARQ_E_UNSUPPORTED otherwise). engram_num_embeddings, when given, must
 * equal each table's row count (SPARQ_E_FORMAT naming `name`). No token map
 * (n_tokens 0). A config without Engram layers gives n_layers 0. */
sparq_status sq_engram_layout_from_config(sq_engram_layout *lay, const sq_model_config *c, const char *name);

/* The tables of lay whose model layer is in [first, end), renumbered from 0
 * (n_layers may be 0): what node of a pipeline holding those layers reads. */
void sq_engram_layout_subset(const sq_engram_layout *lay, int first, int end, sq_engram_layout *out);

/* Do a and b describe the same tables and hash (every field but the token
 * map; with maps, the token maps too)? */
bool sq_engram_layout_equal(const sq_engram_layout *a, const sq_engram_layout *b, bool maps);

/* A parsed file header. */
typedef struct sq_engram_header {
    sq_engram_layout layout; /* token_map points into the parsed buffer (the reader keeps a copy) */
    uint32_t header_bytes;
    uint32_t node_index, node_count; /* the bundle node this file is for, of how many */
    uint32_t block_bytes;
    uint64_t data_offset, data_bytes, checksum_offset, n_blocks;
    uint64_t file_offset[SQ_ENGRAM_MAX_LAYERS][SQ_ENGRAM_MAX_COLUMNS]; /* column c of table l's bucket 0 */
} sq_engram_header;

/* The bytes of the fixed part of a header: enough to read header_bytes from. */
#define SQ_ENGRAM_FIXED_BYTES 112u

/* Parse and validate a header from the first `len` bytes of a file of
 * `file_size` bytes (every offset and size re-derived from the layout and
 * compared, with overflow checks; the token map's ids in first-appearance
 * order, n_compressed of them; the header's own XXH3-64 checked). `name` is
 * used in messages. Fuzz target. */
sparq_status sq_engram_header_parse(sq_engram_header *h, const uint8_t *buf, size_t len, uint64_t file_size,
                                    const char *name);

/* Source of row data for the writer: fill `n` rows (n * row_bytes bytes) of
 * table `layer`, column `column`, buckets [first, first + n). */
typedef sparq_status (*sq_engram_row_fn)(void *ctx, uint32_t layer, uint32_t column, uint64_t first, uint64_t n,
                                         uint8_t *rows);

/* Write every table of lay (with its token map: n_tokens >= 1) to path,
 * atomically, as the file of node `node` of `nodes`. block_bytes: checksum
 * block, a power of two >= 4096. */
sparq_status sq_engram_write(const char *path, const sq_engram_layout *lay, uint32_t node, uint32_t nodes,
                             uint32_t block_bytes, sq_engram_row_fn fn, void *ctx);

/* --- reader ------------------------------------------------------------- */

typedef struct sq_engram_reader sq_engram_reader;

typedef struct sq_engram_key {
    uint32_t layer;   /* table index (0..n_layers-1), not the model layer */
    uint32_t column;
    uint64_t bucket;  /* 0 .. primes[layer][column]-1 */
} sq_engram_key;

/* Open a table file; cache_rows = LRU capacity in rows (0: no cache). The
 * header is read and checked (sq_engram_header_parse), not the data blocks. */
sparq_status sq_engram_open(sq_engram_reader **out, const char *path, uint64_t cache_rows);
void sq_engram_close(sq_engram_reader *r);
const sq_engram_header *sq_engram_reader_header(const sq_engram_reader *r);

/* Fetch n rows into out (n * row_bytes): from the cache, else pread.
 * SPARQ_E_RANGE for a key outside the layout. Not thread-safe. */
sparq_status sq_engram_fetch(sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out);

/* Read n rows into out without the cache (pread, or a copy from a mapped
 * reader's tables): safe from several threads at once on one reader. */
sparq_status sq_engram_read(const sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out);

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

/* The cache alone, for a caller that reads the misses itself (the V4.1
 * runtime: its fetcher's workers read them with sq_engram_read while the
 * forward goes on). take: for each key the cache holds, its row to
 * out + i·row_bytes and hit[i] = 1 (the row becomes the most recent), else
 * hit[i] = 0; returns the misses (counted in the statistics with the hits).
 * put: store n rows (rows + i·row_bytes under keys[i]), evicting the least
 * recent. Both do nothing without a cache (cache_rows 0, a mapped reader);
 * not thread-safe, but sq_engram_read and the fetcher may run meanwhile
 * (they never touch the cache). */
size_t sq_engram_cache_take(sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out, uint8_t *hit);
void sq_engram_cache_put(sq_engram_reader *r, size_t n, const sq_engram_key *keys, const uint8_t *rows);
/* Rows a cache of `bytes` holds, its slots' keys, links and hash table counted: the capacity
 * to give sq_engram_open for a planned size (sparq plan's --engram-cache); and the bytes a
 * reader's cache holds (rows and bookkeeping; 0 without a cache). */
uint64_t sq_engram_cache_rows_for(uint64_t bytes, uint32_t row_bytes);
uint64_t sq_engram_cache_bytes(const sq_engram_reader *r);

/* Check every data block checksum; SPARQ_E_CHECKSUM names the file, block
 * and the table/column it falls in. */
sparq_status sq_engram_verify(sq_engram_reader *r);

/* --- the asynchronous fetcher ---------------------------------------- */

/* A few pread workers serving batches of row reads, so that the rows of a
 * whole step are read with many requests in flight (an NVMe drive needs a
 * queue depth of tens to reach its random-read rate) while the caller goes
 * on computing. Batches are served in submission order. */
typedef struct sq_engram_fetcher sq_engram_fetcher;

#define SQ_ENGRAM_FETCH_QUEUE 8 /* batches in flight at most */

/* n_threads workers (1..64) reading through r (sq_engram_read), which must
 * outlive the fetcher. */
sparq_status sq_engram_fetcher_create(sq_engram_fetcher **out, const sq_engram_reader *r, int n_threads);
/* Waits for the batches in flight, then stops the workers. */
void sq_engram_fetcher_free(sq_engram_fetcher *f);

/* Queue n reads of keys into out (both untouched until the batch is waited
 * for); *ticket identifies the batch. SPARQ_E_STATE when
 * SQ_ENGRAM_FETCH_QUEUE batches are already waiting. */
sparq_status sq_engram_fetcher_submit(sq_engram_fetcher *f, size_t n, const sq_engram_key *keys, uint8_t *out,
                                      int *ticket);

/* Block until batch `ticket` is read; its first error, if any. fetch_s (may
 * be NULL): seconds from its submission to its last row; wait_s: seconds
 * this call blocked (the part of the fetch the caller did not hide). */
sparq_status sq_engram_fetcher_wait(sq_engram_fetcher *f, int ticket, double *fetch_s, double *wait_s);

/* --- the hash (reference.md §3.1; DeepSeek V4.1) ------------------------ */

#define SQ_ENGRAM_V41_COLUMNS 24  /* orders 2,3,4 x 8 heads */
#define SQ_ENGRAM_V41_HEADS 8
#define SQ_ENGRAM_V41_PAD 2       /* compressed pad id */
#define SQ_ENGRAM_V41_PRIME_BASE 16000000ull

/* Smallest prime > n (n < 2^62). */
uint64_t sq_engram_next_prime(uint64_t n);

/* The released V4.1 layout with its bucket counts moved: tables for model
 * layers 1 and 14, the published multipliers, 264-byte rows (256 F8_E4M3 +
 * 8 UE8M0), orders 2..4 x 8 heads, pad 2, 99,092 compressed ids (no token
 * map), and as primes the consecutive primes above `prime_base`
 * (SQ_ENGRAM_V41_PRIME_BASE gives the release's: layer 1 takes the first 24,
 * layer 14 the next 24). Tests and benchmarks pass a small base to get small
 * tables of the same shape; a model's layout comes from
 * sq_engram_layout_from_config. */
void sq_engram_v41_layout(sq_engram_layout *lay, uint64_t prime_base);

/* Buckets of the n_columns columns of table `layer` for position t of a
 * sequence of compressed ids cids[0..n) (cids[i] = token_map[ids[i]]):
 * tok_k = cids[t-k] (pad_id for t-k < 0); h = tok_0*m_0, then for order
 * i = 1..max_ngram-1: h ^= tok_i*m_i and for each head j:
 * bucket[(i-1)*n_heads + j] = h mod primes[layer][(i-1)*n_heads + j]. The
 * global row is row_offset + bucket. */
void sq_engram_buckets(const sq_engram_layout *lay, uint32_t layer, const uint32_t *cids, size_t n, size_t t,
                       uint64_t bucket[SQ_ENGRAM_MAX_COLUMNS]);

#endif
