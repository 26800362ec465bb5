/* tests/pack/test_engram.c — the Engram table file: the V4.1 prime list and
 * offsets against the row counts DeepSeek states, the hash against values
 * computed by hand, synthetic tables in the V4.1 layout (264-byte rows, 24
 * columns per layer, small bucket counts) written, sharded, read back through
 * the LRU cache, and damage detection (flipped byte, truncation, header). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "formats/engram.h"
#include "t.h"

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
    uint64_t b[24];
    /* position 3: tok = (99091, 30000, 2000, 100); h by hand (python ints):
     * h2 = 99091*76632096046245 ^ 30000*4839876093313, then ^ 2000*m2, ^ 100*m3 */
    sq_engram_v41_buckets(&lay, 0, ids, 4, 3, b);
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
    sq_engram_v41_buckets(&lay, 1, ids, 4, 0, b);
    h = 100ull * 67716810739261ull ^ 2ull * 51510806800915ull;
    CHECK_EQ_INT(b[3], h % lay.primes[1][3]);
    for (int c = 0; c < 24; c++) CHECK(b[c] < lay.primes[1][c]);
}

/* Deterministic synthetic row content. */
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
            rows[r * lay->row_bytes + i] = row_byte(layer, col, first + r, i);
    return SPARQ_OK;
}

static const char *shard_path(int s)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/engram-%d.bin", t_tmpdir(), s);
    return buf;
}

static void check_row(const uint8_t *row, const sq_engram_key *k, int *bad)
{
    for (uint32_t i = 0; i < 264; i++)
        if (row[i] != row_byte(k->layer, k->column, k->bucket, i)) {
            (*bad)++;
            return;
        }
}

static void test_roundtrip_sharded(void)
{
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, 100); /* primes 101, 103, ... : ~4 MB per layer */
    const int shards = 3;
    for (int s = 0; s < shards; s++)
        CHECK_EQ_INT(sq_engram_write(shard_path(s), &lay, (uint32_t)s, shards, 65536, fill_rows, &lay), SPARQ_OK);
    sq_engram_reader *r[3];
    for (int s = 0; s < shards; s++) {
        CHECK_EQ_INT(sq_engram_open(&r[s], shard_path(s), 64), SPARQ_OK);
        if (!r[s]) return;
        const sq_engram_header *h = sq_engram_reader_header(r[s]);
        CHECK_EQ_INT(h->shard_index, s);
        CHECK_EQ_INT(h->shard_count, 3);
        CHECK_EQ_INT(h->layout.primes[0][0], 101);
        CHECK_EQ_INT(sq_engram_verify(r[s]), SPARQ_OK);
    }
    /* random keys, each from the shard that holds its column */
    srand(1234);
    int bad = 0;
    uint8_t row[264];
    for (int i = 0; i < 3000; i++) {
        sq_engram_key k = {(uint32_t)(rand() % 2), (uint32_t)(rand() % 24), 0};
        k.bucket = (uint64_t)rand() % lay.primes[k.layer][k.column];
        if (i % 3 == 0) k.bucket %= 8; /* some hot rows for the cache */
        int s = (int)sq_engram_column_shard(k.column, shards);
        CHECK_EQ_INT(sq_engram_fetch(r[s], 1, &k, row), SPARQ_OK);
        check_row(row, &k, &bad);
    }
    CHECK_EQ_INT(bad, 0);
    /* a batch, read twice: the second time all from the cache */
    sq_engram_key keys[24];
    uint8_t rows[24 * 264];
    int nk = 0;
    for (uint32_t c = 0; c < 24; c++)
        if (sq_engram_column_shard(c, shards) == 1) keys[nk++] = (sq_engram_key){1, c, c * 3u};
    uint64_t h0, m0, h1, m1;
    sq_engram_cache_stats(r[1], &h0, &m0);
    CHECK_EQ_INT(sq_engram_fetch(r[1], (size_t)nk, keys, rows), SPARQ_OK);
    CHECK_EQ_INT(sq_engram_fetch(r[1], (size_t)nk, keys, rows), SPARQ_OK);
    sq_engram_cache_stats(r[1], &h1, &m1);
    CHECK(h1 - h0 >= (uint64_t)nk);
    for (int i = 0; i < nk; i++) check_row(rows + i * 264, &keys[i], &bad);
    CHECK_EQ_INT(bad, 0);
    /* wrong shard, out of range */
    sq_engram_key k = {0, 1, 0}; /* column 1 lives in shard 1 */
    CHECK_EQ_INT(sq_engram_fetch(r[0], 1, &k, row), SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "shard 1");
    k = (sq_engram_key){0, 0, 101};
    CHECK_EQ_INT(sq_engram_fetch(r[0], 1, &k, row), SPARQ_E_RANGE);
    for (int s = 0; s < shards; s++) sq_engram_close(r[s]);
}

/* The LRU keeps exactly the most recent `cap` rows. */
static void test_lru(void)
{
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, 100);
    const char *p = shard_path(9);
    CHECK_EQ_INT(sq_engram_write(p, &lay, 0, 1, 4096, fill_rows, &lay), SPARQ_OK);
    sq_engram_reader *r;
    CHECK_EQ_INT(sq_engram_open(&r, p, 4), SPARQ_OK);
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
        check_row(row, &k, &bad);
    }
    sq_engram_cache_stats(r, &h, &m);
    CHECK_EQ_INT(h, 4);
    CHECK_EQ_INT(m, 5);
    sq_engram_key k0 = {0, 5, 0}; /* was evicted: a miss, evicting bucket 1 (least recent) */
    CHECK_EQ_INT(sq_engram_fetch(r, 1, &k0, row), SPARQ_OK);
    check_row(row, &k0, &bad);
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
        check_row(row, &k, &bad);
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
    sq_engram_v41_layout(&lay, 100);
    const char *p = shard_path(7);
    CHECK_EQ_INT(sq_engram_write(p, &lay, 0, 1, 8192, fill_rows, &lay), SPARQ_OK);
    sq_engram_reader *r;
    CHECK_EQ_INT(sq_engram_open(&r, p, 0), SPARQ_OK);
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
    /* truncation */
    CHECK(truncate(p, (off_t)(file_size(p) - 100)) == 0);
    CHECK_EQ_INT(sq_engram_open(&r, p, 0), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    /* not an Engram file */
    uint8_t junk[4096] = "SQENGRAX";
    sq_engram_header hh;
    CHECK_EQ_INT(sq_engram_header_parse(&hh, junk, sizeof junk, sizeof junk, "junk"), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "bad magic");
}

static void test_bad_layout(void)
{
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, 100);
    lay.row_bytes = 263;
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 0, 1, 4096, fill_rows, &lay), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "row_bytes 263");
    sq_engram_v41_layout(&lay, 100);
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 2, 2, 4096, fill_rows, &lay), SPARQ_E_ARG);
    CHECK_EQ_INT(sq_engram_write(shard_path(8), &lay, 0, 1, 5000, fill_rows, &lay), SPARQ_E_ARG);
    CHECK(access(shard_path(8), F_OK) != 0); /* nothing written */
}

int main(void)
{
    RUN(test_v41_primes);
    RUN(test_v41_hash);
    RUN(test_roundtrip_sharded);
    RUN(test_lru);
    RUN(test_damage);
    RUN(test_bad_layout);
    return t_summary();
}
