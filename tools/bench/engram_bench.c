/* tools/bench/engram_bench.c — Engram random-row reads per second.
 *
 *   engram_bench [--base P] [--tokens N] [--cache ROWS] [--dir D]
 *
 * Writes one shard holding both tables of the DeepSeek V4.1 layout (264-byte
 * rows, 24 columns per table) with the primes above P as bucket counts
 * (default 20000: ~254 MB), then looks up the rows of N synthetic tokens the
 * way the runtime will: V4.1 hash of random compressed ids -> 48 rows per
 * token, fetched as one batch. Reported for the page cache warm (file just
 * written) and cold (posix_fadvise DONTNEED first: reads hit the disk), with
 * no row cache, and warm with an LRU of --cache rows on a Zipf-like id stream. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "formats/engram.h"

static sparq_status fill(void *ctx, uint32_t l, uint32_t c, uint64_t first, uint64_t n, uint8_t *rows)
{
    (void)ctx;
    for (uint64_t i = 0; i < n * 264; i++) rows[i] = (uint8_t)(l * 131 + c * 17 + first + i);
    return SPARQ_OK;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_rand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* ids: uniform over 99,092 compressed ids, or skewed (x^3 toward small ids). */
static void make_ids(uint32_t *ids, size_t n, int skewed)
{
    for (size_t i = 0; i < n; i++) {
        double u = (double)next_rand() / 4294967296.0;
        ids[i] = (uint32_t)((skewed ? u * u * u : u) * 99092.0);
    }
}

static double run(const char *path, const sq_engram_layout *lay, const uint32_t *ids, size_t n, uint64_t cache,
                  uint64_t *hits, uint64_t *misses)
{
    sq_engram_reader *r;
    if (sq_engram_open(&r, path, cache) != SPARQ_OK) {
        fprintf(stderr, "engram_bench: %s\n", sparq_errmsg());
        exit(1);
    }
    sq_engram_key keys[48];
    uint8_t rows[48 * 264];
    uint64_t b[SQ_ENGRAM_MAX_COLUMNS];
    double t0 = sparq_now();
    for (size_t t = 0; t < n; t++) {
        for (uint32_t l = 0; l < 2; l++) {
            sq_engram_buckets(lay, l, ids, n, t, b);
            for (int c = 0; c < 24; c++) keys[l * 24 + c] = (sq_engram_key){l, (uint32_t)c, b[c]};
        }
        if (sq_engram_fetch(r, 48, keys, rows) != SPARQ_OK) {
            fprintf(stderr, "engram_bench: %s\n", sparq_errmsg());
            exit(1);
        }
    }
    double s = sparq_now() - t0;
    sq_engram_cache_stats(r, hits, misses);
    sq_engram_close(r);
    return s;
}

int main(int argc, char **argv)
{
    uint64_t base = 20000, cache = 65536;
    size_t tokens = 20000;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--base")) base = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--tokens")) tokens = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--cache")) cache = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else {
            fprintf(stderr, "usage: engram_bench [--base P] [--tokens N] [--cache ROWS] [--dir D]\n");
            return 2;
        }
    }
    char path[600];
    snprintf(path, sizeof path, "%s/engram_bench.%d.bin", dir, (int)getpid());
    sq_engram_layout lay;
    sq_engram_v41_layout(&lay, base);
    static uint32_t token_map[99092]; /* identity: the bench hashes compressed ids directly */
    for (uint32_t i = 0; i < 99092; i++) token_map[i] = i;
    lay.token_map = token_map;
    lay.n_tokens = 99092;
    double t0 = sparq_now();
    if (sq_engram_write(path, &lay, 0, 1, 4 << 20, fill, NULL) != SPARQ_OK) {
        fprintf(stderr, "engram_bench: %s\n", sparq_errmsg());
        return 1;
    }
    double tw = sparq_now() - t0;
    const double rows = (double)(sq_engram_layer_rows(&lay, 0) + sq_engram_layer_rows(&lay, 1));
    printf("table: 2 x 24 columns, %.0f rows of 264 B = %.1f MB; write %.2f s (%.2f GB/s incl. checksums)\n", rows,
           rows * 264 / 1e6, tw, rows * 264 / tw / 1e9);
    uint32_t *ids = sparq_malloc(tokens * sizeof *ids);
    uint64_t h, m;
    make_ids(ids, tokens, 0);
    double s = run(path, &lay, ids, tokens, 0, &h, &m);
    printf("warm page cache, no row cache: %zu tokens x 48 rows: %.0f rows/s (%.0f tokens/s)\n", tokens,
           48.0 * (double)tokens / s, (double)tokens / s);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    make_ids(ids, tokens, 0);
    s = run(path, &lay, ids, tokens, 0, &h, &m);
    printf("cold page cache, no row cache: %.0f rows/s (%.0f tokens/s, %.1f MB/s of rows)\n",
           48.0 * (double)tokens / s, (double)tokens / s, 48.0 * 264 * (double)tokens / s / 1e6);
    make_ids(ids, tokens, 1);
    s = run(path, &lay, ids, tokens, cache, &h, &m);
    printf("warm, LRU of %llu rows, skewed ids: %.0f rows/s, hit rate %.1f %%\n", (unsigned long long)cache,
           48.0 * (double)tokens / s, 100.0 * (double)h / (double)(h + m));
    sparq_free(ids);
    unlink(path);
    return 0;
}
