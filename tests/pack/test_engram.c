/* tests/pack/test_engram.c — the Engram table file: the V4.1 prime list and
 * offsets against the row counts DeepSeek states, the hash against values
 * computed by hand, synthetic tables in the V4.1 layout (264-byte rows, 24
 * columns per layer, small bucket counts) written per node by layer, read back
 * through the LRU cache and the fetcher, the layout from config.json, and damage
 * detection (flipped byte, truncation, header fields re-derived). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "formats/engram.h"
#include "formats/hfconfig.h"
#include "t.h"
#define XXH_INLINE_ALL
#include <xxhash.h>

static void test_v41_primes(void)
{
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, SQ_ENGRAM_V41_PRIME_BASE);
    CHECK_EQ_INT(lay.primes[0][0], 16000057);
    CHECK_EQ_INT(lay.primes[0][23], 16000463);
    CHECK_EQ_INT(lay.primes[1][0], 16000477);
    CHECK_EQ_INT(lay.primes[1][23], 16000889);
    /* the offsets' totals are the row counts of layers.{1,14}.engram.embed.weight */
    CHECK_EQ_INT(sq_engram_layer_rows(&lay, 0), 384006168);
    CHECK_EQ_INT(sq_engram_layer_rows(&lay, 1), 384016682);
    CHECK_EQ_INT(lay.row_offset[0][1], 16000057);
    CHECK_EQ_INT(lay.row_offset[0][23] + lay.primes[0][23], 384006168);
    CHECK_EQ_INT(lay.layer_ids[0], 1);
    CHECK_EQ_INT(lay.layer_ids[1], 14);
    CHECK_EQ_INT(lay.row_bytes, 264);
    CHECK_EQ_INT(sq_engram_layout_finish(&lay), SPARQ_OK);
    /* strictly increasing and all distinct */
    for (int c = 1; c < 24; c++) CHECK(lay.primes[0][c] > lay.primes[0][c - 1]);
    CHECK_EQ_INT(sq_engram_next_prime(1), 2);
    CHECK_EQ_INT(sq_engram_next_prime(13), 17);
    CHECK_EQ_INT(sq_engram_next_prime(1000000), 1000003);
    CHECK_EQ_INT(sq_engram_next_prime(4294967291ull), 4294967311ull); /* across 2^32 */
}

static void test_v41_hash(void)
{
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, SQ_ENGRAM_V41_PRIME_BASE);
    const uint32_t ids[] = {100, 2000, 30000, 99091};
    uint64_t b[SQ_ENGRAM_MAX_COLUMNS];
    /* position 3: tok = (99091, 30000, 2000, 100); h by hand (python ints):
     * h2 = 99091*76632096046245 ^ 30000*4839876093313, then ^ 2000*m2, ^ 100*m3 */
    sq_engram_buckets(&lay, 0, ids, 4, 3, b);
    uint64_t h = 99091ull * 76632096046245ull;
    h ^= 30000ull * 4839876093313ull;
    CHECK_EQ_INT(b[0], h % 16000057ull);
    CHECK_EQ_INT(b[7], h % lay.primes[0][7]);
    h ^= 2000ull * 35959672319349ull;
    CHECK_EQ_INT(b[8], h % lay.primes[0][8]);
    h ^= 100ull * 73987337458391ull;
    CHECK_EQ_INT(b[23], h % 16000463ull);
    /* one literal, computed independently: (99091*m0 ^ 30000*m1) mod 16000057 */
    CHECK_EQ_INT(b[0], 1366601);
    /* position 0: the three older slots are pad (2) */
    sq_engram_buckets(&lay, 1, ids, 4, 0, b);
    h = 100ull * 67716810739261ull ^ 2ull * 51510806800915ull;
    CHECK_EQ_INT(b[3], h % lay.primes[1][3]);
    for (int c = 0; c < 24; c++) CHECK(b[c] < lay.primes[1][c]);
}

/* Deterministic synthetic row content of model layer `layer`. */
static uint8_t row_byte(uint32_t layer, uint32_t col, uint64_t bucket, uint32_t i)
{
    uint64_t x = (uint64_t)layer * 1000003u + col * 7919u + bucket * 104729u + i * 31u;
    x ^= x >> 13;
    x *= 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> 56);
}

static sparq_status fill_rows(void *ctx, uint32_t layer, uint32_t col, uint64_t first, uint64_t n, uint8_t *rows)
{
    const sq_engram_layout *lay = ctx;
    for (uint64_t r = 0; r < n; r++)
        for (uint32_t i = 0; i < lay->row_bytes; i++)
            rows[r * lay->row_bytes + i] = row_byte((uint32_t)lay->layer_ids[layer], col, first + r, i);
    return SPARQ_OK;
}

/* A token map in first-appearance order: ids i and i + 99092 share compressed id i. */
static uint32_t token_map[2 * 99092];

/* The V4.1 layout with primes above base and that token map. */
static void small_layout(sq_engram_layout *lay, uint64_t base)
{
    for (uint32_t i = 0; i < 2 * 99092; i++) token_map[i] = i % 99092;
    sq_engram_v41_layout(lay, base);
    lay->token_map = token_map;
    lay->n_tokens = 2 * 99092;
}

static const char *shard_path(int s)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/engram-%d.bin", t_tmpdir(), s);
    return buf;
}

/* Write the small layout as file `s` (one node) and open it; NULL on failure. */
static sq_engram_reader *write_small(sq_engram_layout *lay, int s, uint32_t block, uint64_t cache)
{
    small_layout(lay, 100);
    CHECK_EQ_INT(sq_engram_write(shard_path(s), lay, 0, 1, block, fill_rows, lay), SPARQ_OK);
    sq_engram_reader *r = NULL;
    CHECK_EQ_INT(sq_engram_open(&r, shard_path(s), cache), SPARQ_OK);
    return r;
}

/* k's table is model layer `layer` */
static void check_row(const uint8_t *row, const sq_engram_key *k, uint32_t layer, int *bad)
{
    for (uint32_t i = 0; i < 264; i++)
        if (row[i] != row_byte(layer, k->column, k->bucket, i)) {
            (*bad)++;
            return;
        }
}

/* Sharded by layer: node 0 holds layer 1's table, node 1 layer 14's; each
 * file carries the hash constants and the token map. */
static void test_roundtrip_by_layer(void)
{
    sq_engram_layout lay, sub[2];
    small_layout(&lay, 100); /* primes 101, 103, ... : ~4 MB per layer */
    sq_engram_layout_subset(&lay, 0, 10, &sub[0]);
    sq_engram_layout_subset(&lay, 10, 16, &sub[1]);
    CHECK_EQ_INT(sub[0].n_layers, 1);
    CHECK_EQ_INT(sub[1].n_layers, 1);
    CHECK_EQ_INT(sub[1].layer_ids[0], 14);
    CHECK_EQ_INT(sub[1].primes[0][0], lay.primes[1][0]);
    CHECK_EQ_INT(sq_engram_table_of(&lay, 14), 1);
    CHECK_EQ_INT(sq_engram_table_of(&sub[1], 1), -1);
    for (int s = 0; s < 2; s++)
        CHECK_EQ_INT(sq_engram_write(shard_path(s), &sub[s], (uint32_t)s, 2, 65536, fill_rows, &sub[s]), SPARQ_OK);
    sq_engram_reader *r[2];
    for (int s = 0; s < 2; s++) {
        CHECK_EQ_INT(sq_engram_open(&r[s], shard_path(s), 64), SPARQ_OK);
        if (!r[s]) return;
        const sq_engram_header *h = sq_engram_reader_header(r[s]);
        CHECK_EQ_INT(h->node_index, s);
        CHECK_EQ_INT(h->node_count, 2);
        CHECK_EQ_INT(h->layout.layer_ids[0], s ? 14 : 1);
        CHECK_EQ_INT(h->layout.primes[0][0], s ? lay.primes[1][0] : 101);
        CHECK_EQ_INT(h->layout.multipliers[0][3], lay.multipliers[s][3]);
        CHECK_EQ_INT(h->layout.pad_id, 2);
        CHECK_EQ_INT(h->layout.max_ngram, 4);
        CHECK_EQ_INT(h->layout.n_heads, 8);
        CHECK_EQ_INT(h->layout.n_compressed, 99092);
        CHECK_EQ_INT(h->layout.n_tokens, 2 * 99092);
        CHECK(h->layout.token_map && !memcmp(h->layout.token_map, token_map, sizeof token_map));
        CHECK_EQ_INT(sq_engram_verify(r[s]), SPARQ_OK);
    }
    /* random keys, each from the node file that holds its layer */
    srand(1234);
    int bad = 0;
    uint8_t row[264];
    for (int i = 0; i < 3000; i++) {
        const int s = rand() % 2;
        sq_engram_key k = {0, (uint32_t)(rand() % 24), 0};
        k.bucket = (uint64_t)rand() % sub[s].primes[0][k.column];
        if (i % 3 == 0) k.bucket %= 8; /* some hot rows for the cache */
        CHECK_EQ_INT(sq_engram_fetch(r[s], 1, &k, row), SPARQ_OK);
        check_row(row, &k, s ? 14 : 1, &bad);
    }
    CHECK_EQ_INT(bad, 0);
    /* a batch, read twice: the second time all from the cache */
    sq_engram_key keys[24];
    uint8_t rows[24 * 264];
    for (uint32_t c = 0; c < 24; c++) keys[c] = (sq_engram_key){0, c, c * 3u};
    uint64_t h0, m0, h1, m1;
    sq_engram_cache_stats(r[1], &h0, &m0);
    CHECK_EQ_INT(sq_engram_fetch(r[1], 24, keys, rows), SPARQ_OK);
    CHECK_EQ_INT(sq_engram_fetch(r[1], 24, keys, rows), SPARQ_OK);
    sq_engram_cache_stats(r[1], &h1, &m1);
    CHECK(h1 - h0 >= 24);
    for (int i = 0; i < 24; i++) check_row(rows + i * 264, &keys[i], 14, &bad);
    CHECK_EQ_INT(bad, 0);
    /* out of range: a table this file does not hold, a bucket past the prime */
    sq_engram_key k = {1, 0, 0};
    CHECK_EQ_INT(sq_engram_fetch(r[0], 1, &k, row), SPARQ_E_RANGE);
    k = (sq_engram_key){0, 0, 101};
    CHECK_EQ_INT(sq_engram_fetch(r[0], 1, &k, row), SPARQ_E_RANGE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "bucket 101");
    for (int s = 0; s < 2; s++) sq_engram_close(r[s]);
}

/* The fetcher: several batches in flight, rows as the cached reader gives
 * them, an error in one batch reported by its wait with its message. */
static void test_fetcher(void)
{
    sq_engram_layout lay;
    sq_engram_reader *r = write_small(&lay, 5, 65536, 0);
    if (!r) return;
    sq_engram_fetcher *f;
    CHECK_EQ_INT(sq_engram_fetcher_create(&f, r, 4), SPARQ_OK);
    enum { N = 500, B = 3 };
    static sq_engram_key keys[B][N];
    static uint8_t out[B][N * 264];
    srand(7);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) {
            sq_engram_key *k = &keys[b][i];
            *k = (sq_engram_key){(uint32_t)(rand() % 2), (uint32_t)(rand() % 24), 0};
            k->bucket = (uint64_t)rand() % lay.primes[k->layer][k->column];
        }
    keys[2][N - 1].bucket = 1u << 30; /* out of range: batch 2 fails */
    int tk[B];
    for (int b = 0; b < B; b++) CHECK_EQ_INT(sq_engram_fetcher_submit(f, N, keys[b], out[b], &tk[b]), SPARQ_OK);
    double fs = -1, ws = -1;
    int bad = 0;
    for (int b = 0; b < 2; b++) {
        CHECK_EQ_INT(sq_engram_fetcher_wait(f, tk[b], &fs, &ws), SPARQ_OK);
        CHECK(fs >= 0 && ws >= 0);
        for (int i = 0; i < N; i++)
            check_row(out[b] + (size_t)i * 264, &keys[b][i], keys[b][i].layer ? 14 : 1, &bad);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(sq_engram_fetcher_wait(f, tk[2], NULL, NULL), SPARQ_E_RANGE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "outside the layout");
    CHECK_EQ_INT(sq_engram_fetcher_wait(f, tk[2], NULL, NULL), SPARQ_E_STATE); /* waited for already */
    /* a full queue is refused, not blocked on */
    int t;
    for (int b = 0; b < SQ_ENGRAM_FETCH_QUEUE; b++) CHECK_EQ_INT(sq_engram_fetcher_submit(f, 0, NULL, NULL, &t), SPARQ_OK);
    CHECK_EQ_INT(sq_engram_fetcher_submit(f, 0, NULL, NULL, &t), SPARQ_E_STATE);
    sq_engram_fetcher_free(f); /* with batches never waited for */
    sq_engram_close(r);
}

/* The layout config.json implies: the fixture's (head_dim 32, primes from
 * engram_vocab_size 500, as tools/fixtures/dsv41 draws them) and a row count
 * that contradicts it. */
static void test_from_config(void)
{
    sq_model_config c;
    CHECK_EQ_INT(sq_config_load(&c, t_data_path("tiny-dsv41")), SPARQ_OK);
    sq_engram_layout lay;
    CHECK_EQ_INT(sq_engram_layout_from_config(&lay, &c, "tiny-dsv41"), SPARQ_OK);
    CHECK_EQ_INT(lay.n_layers, 2);
    CHECK_EQ_INT(lay.values_per_row, 32);
    CHECK_EQ_INT(lay.scales_per_row, 1);
    CHECK_EQ_INT(lay.row_bytes, 33);
    CHECK_EQ_INT(lay.primes[0][0], 503);           /* the first prime >= 500 */
    CHECK_EQ_INT(sq_engram_layer_rows(&lay, 0), 14032); /* engram_num_embeddings */
    CHECK_EQ_INT(sq_engram_layer_rows(&lay, 1), 17774);
    CHECK_EQ_INT(lay.multipliers[1][0], 67716810739261ull);
    c.v41.engram_rows[1]++;
    CHECK_EQ_INT(sq_engram_layout_from_config(&lay, &c, "tiny-dsv41"), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "engram_num_embeddings[1] is 17775");
    c.v41.engram_rows[1]--;
    c.v41.engram_layer[1] = 13;
    CHECK_EQ_INT(sq_engram_layout_from_config(&lay, &c, "tiny-dsv41"), SPARQ_E_UNSUPPORTED);
    sq_config_free(&c);
    /* the release's engram_vocab_size gives the primes above 16,000,000 */
    sq_engram_layout rel;
    sq_engram_v41_layout(&rel, SQ_ENGRAM_V41_PRIME_BASE);
    sq_model_config r = {0};
    r.arch = SQ_ARCH_DEEPSEEK_V41;
    r.v41.n_engram = 2;
    r.v41.engram_layer[0] = 1;
    r.v41.engram_layer[1] = 14;
    r.v41.engram_rows[0] = 384006168;
    r.v41.engram_rows[1] = 384016682;
    r.v41.engram_max_ngram = 4;
    r.v41.engram_n_heads = 8;
    r.v41.engram_head_dim = 256;
    r.v41.engram_vocab_size = 16000001;
    r.v41.engram_pad_id = 2;
    CHECK_EQ_INT(sq_engram_layout_from_config(&lay, &r, "release"), SPARQ_OK);
    CHECK(!memcmp(lay.primes, rel.primes, sizeof lay.primes));
    CHECK_EQ_INT(lay.row_bytes, 264);
}

/* The LRU keeps exactly the most recent `cap` rows. */
static void test_lru(void)
{
    sq_engram_layout lay;
    sq_engram_reader *r = write_small(&lay, 9, 4096, 4);
    if (!r) return;
    uint8_t row[264];
    uint64_t h, m;
    int bad = 0;
    for (uint64_t b = 0; b < 5; b++) { /* 0..4: 0 is evicted */
        sq_engram_key k = {0, 5, b};
        CHECK_EQ_INT(sq_engram_fetch(r, 1, &k, row), SPARQ_OK);
    }
    for (uint64_t b = 1; b < 5; b++) { /* all hits */
        sq_engram_key k = {0, 5, b};
        CHECK_EQ_INT(sq_engram_fetch(r, 1, &k, row), SPARQ_OK);
        check_row(row, &k, 1, &bad);
    }
    sq_engram_cache_stats(r, &h, &m);
    CHECK_EQ_INT(h, 4);
    CHECK_EQ_INT(m, 5);
    sq_engram_key k0 = {0, 5, 0}; /* was evicted: a miss, evicting bucket 1 (least recent) */
    CHECK_EQ_INT(sq_engram_fetch(r, 1, &k0, row), SPARQ_OK);
    check_row(row, &k0, 1, &bad);
    sq_engram_cache_stats(r, &h, &m);
    CHECK_EQ_INT(m, 6);
    sq_engram_key k2 = {0, 5, 2};
    CHECK_EQ_INT(sq_engram_fetch(r, 1, &k2, row), SPARQ_OK);
    sq_engram_cache_stats(r, &h, &m);
    CHECK_EQ_INT(h, 5);
    /* stress: many keys through a small cache still return right rows */
    srand(99);
    for (int i = 0; i < 20000; i++) {
        sq_engram_key k = {(uint32_t)(rand() % 2), (uint32_t)(rand() % 24), (uint64_t)(rand() % 12)};
        CHECK_EQ_INT(sq_engram_fetch(r, 1, &k, row), SPARQ_OK);
        check_row(row, &k, k.layer ? 14 : 1, &bad);
    }
    CHECK_EQ_INT(bad, 0);
    sq_engram_close(r);
}

static uint64_t file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void flip_byte(const char *p, uint64_t off)
{
    int fd = open(p, O_RDWR);
    unsigned char c;
    if (pread(fd, &c, 1, (off_t)off) == 1) {
        c ^= 0x5A;
        if (pwrite(fd, &c, 1, (off_t)off) != 1) perror("pwrite");
    }
    close(fd);
}

static void test_damage(void)
{
    sq_engram_layout lay;
    const char *p = shard_path(7);
    sq_engram_reader *r = write_small(&lay, 7, 8192, 0);
    if (!r) return;
    const sq_engram_header h = *sq_engram_reader_header(r);
    sq_engram_close(r);
    /* a data byte: verify names the block */
    uint64_t off = h.data_offset + 8192 * 5 + 17;
    flip_byte(p, off);
    CHECK_EQ_INT(sq_engram_open(&r, p, 0), SPARQ_OK);
    CHECK_EQ_INT(sq_engram_verify(r), SPARQ_E_CHECKSUM);
    CHECK_STR_CONTAINS(sparq_errmsg(), "data block 5 ");
    sq_engram_close(r);
    flip_byte(p, off);
    /* a header byte: the header checksum catches it */
    flip_byte(p, 200);
    CHECK_EQ_INT(sq_engram_open(&r, p, 0), SPARQ_E_CHECKSUM);
    CHECK_STR_CONTAINS(sparq_errmsg(), "header checksum");
    flip_byte(p, 200);
    /* fields a checksum cannot vouch for: re-derived, so a header with its
     * checksum recomputed is still refused */
    uint8_t *hb = malloc(h.header_bytes);
    int fd = open(p, O_RDONLY);
    CHECK(pread(fd, hb, h.header_bytes, 0) == (ssize_t)h.header_bytes);
    close(fd);
    const struct {
        size_t at;
        uint8_t x;
        const char *what;
    } edits[] = {{112 + 40 + 8 * 24 * 3 + 4 * 50 + 24 * 24 * 2, 0x01, "token map entry"}, /* in the map */
                 {112 + 8, 0x01, "multiplier 0"},                                         /* even multiplier */
                 {98, 0x7F, "pad id"},
                 {92, 0x01, "columns"}};
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        uint8_t *c = malloc(h.header_bytes);
        memcpy(c, hb, h.header_bytes);
        c[edits[e].at] ^= edits[e].x;
        const uint64_t x = XXH3_64bits(c, h.header_bytes - 8);
        for (int i = 0; i < 8; i++) c[h.header_bytes - 8 + i] = (uint8_t)(x >> (8 * i));
        sq_engram_header hh;
        CHECK_EQ_INT(sq_engram_header_parse(&hh, c, h.header_bytes, file_size(p), "edited"), SPARQ_E_FORMAT);
        CHECK_STR_CONTAINS(sparq_errmsg(), edits[e].what);
        free(c);
    }
    free(hb);
    /* truncation, inside the data and inside the header */
    CHECK(truncate(p, (off_t)(file_size(p) - 100)) == 0);
    CHECK_EQ_INT(sq_engram_open(&r, p, 0), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    CHECK(truncate(p, 5000) == 0);
    CHECK_EQ_INT(sq_engram_open(&r, p, 0), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    CHECK_STR_CONTAINS(sparq_errmsg(), p);
    /* not an Engram file */
    uint8_t junk[4096] = "SQENGRAX";
    sq_engram_header hh;
    CHECK_EQ_INT(sq_engram_header_parse(&hh, junk, sizeof junk, sizeof junk, "junk"), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "bad magic");
}

static void test_bad_layout(void)
{
    sq_engram_layout lay;
    small_layout(&lay, 100);
    lay.row_bytes = 263;
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 0, 1, 4096, fill_rows, &lay), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "row_bytes 263");
    small_layout(&lay, 100);
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 2, 2, 4096, fill_rows, &lay), SPARQ_E_ARG);
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 0, 1, 5000, fill_rows, &lay), SPARQ_E_ARG);
    lay.n_tokens = 0; /* no token map */
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 0, 1, 4096, fill_rows, &lay), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "token");
    CHECK(access(shard_path(8), F_OK) != 0); /* nothing written */
}

/* The cache alone (what the V4.1 runtime uses around its fetcher): take finds only what was put,
 * byte for byte, put evicts the least recent, the sizing helper counts the bookkeeping. */
static void test_cache_take_put(void)
{
    sq_engram_layout lay;
    sq_engram_reader *r = write_small(&lay, 12, 4096, 3);
    if (!r) return;
    sq_engram_key k[4];
    uint8_t rows[4 * 264], out[4 * 264], hit[4];
    for (int i = 0; i < 4; i++) k[i] = (sq_engram_key){0, 7, (uint64_t)(10 + i)};
    CHECK_EQ_INT(sq_engram_read(r, 4, k, rows), SPARQ_OK);
    memset(out, 0xAB, sizeof out);
    CHECK_EQ_INT(sq_engram_cache_take(r, 4, k, out, hit), 4); /* empty: all misses, out untouched */
    CHECK(!hit[0] && !hit[3] && out[0] == 0xAB && out[4 * 264 - 1] == 0xAB);
    sq_engram_cache_put(r, 3, k, rows); /* rows 10, 11, 12 */
    CHECK_EQ_INT(sq_engram_cache_take(r, 4, k, out, hit), 1);
    CHECK(hit[0] && hit[1] && hit[2] && !hit[3]);
    CHECK(!memcmp(out, rows, 3 * 264) && out[3 * 264] == 0xAB);
    sq_engram_cache_put(r, 1, &k[3], rows + 3 * 264); /* full: evicts 10, the least recent after the take */
    CHECK_EQ_INT(sq_engram_cache_take(r, 4, k, out, hit), 1);
    CHECK(!hit[0] && hit[1] && hit[2] && hit[3] && !memcmp(out + 264, rows + 264, 3 * 264));
    uint64_t h, m;
    sq_engram_cache_stats(r, &h, &m);
    CHECK_EQ_INT(h, 6);
    CHECK_EQ_INT(m, 6);
    CHECK(sq_engram_cache_bytes(r) >= 3 * 264);
    sq_engram_close(r);
    /* sizing: 2 GiB of V4.1 rows (264 bytes) with the bookkeeping, never more than the bytes given */
    const uint64_t n = sq_engram_cache_rows_for(2ull << 30, 264);
    CHECK(n > 6000000 && n * (264 + 24 + 32) <= (2ull << 30));
    CHECK_EQ_INT(sq_engram_cache_rows_for(100, 264), 0);
}

int main(void)
{
    RUN(test_v41_primes);
    RUN(test_v41_hash);
    RUN(test_roundtrip_by_layer);
    RUN(test_fetcher);
    RUN(test_from_config);
    RUN(test_lru);
    RUN(test_cache_take_put);
    RUN(test_damage);
    RUN(test_bad_layout);
    return t_summary();
}
