/* tools/bench/engram_bench.c — Engram random-row reads per second.
 *
 *   engram_bench [--base P] [--tokens N] [--cache ROWS] [--dir D]
 *   engram_bench --disk PATH [--columns C] [--seconds S] [--base P] [--keep]
 *
 * --disk: random 264-byte row reads from a file of real-dimension rows, as
 * the runtime issues them (formats/engram.h). Unless PATH exists, writes it
 * first: one table of C columns (default 12) with the release's bucket
 * counts (the consecutive primes above 16,000,000, or P: 12 columns are ~192M rows,
 * ~50.7 GB, a half of one real table), then reads through O_DIRECT (the
 * aligned 4 KiB block(s) holding the row: the page cache never answers) at
 * queue depth 1, 8 and 64 (that many threads, one pread each in flight) for S
 * seconds each (default 10): reads/s, p50 and p99 latency; then the rows of
 * one prefill chunk — 512 tokens x 48 rows of uniformly random buckets (what
 * the hash gives), deduplicated, through sq_engram_fetcher with 16 and 64
 * workers, page cache dropped first (posix_fadvise DONTNEED; the file is
 * larger than 2x RAM for the misses to reach the disk). The file is deleted
 * at the end unless --keep.
 *
 * Writes one shard holding both tables of the DeepSeek V4.1 layout (264-byte
 * rows, 24 columns per table) with the primes above P as bucket counts
 * (default 20000: ~254 MB), then looks up the rows of N synthetic tokens the
 * way the runtime will: V4.1 hash of random compressed ids -> 48 rows per
 * token, fetched as one batch. Reported for the page cache warm (file just
 * written) and cold (posix_fadvise DONTNEED first: reads hit the disk), with
 * no row cache, and warm with an LRU of --cache rows on a Zipf-like id stream. */
#include <fcntl.h>
#include <pthread.h>
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

/* ---- --disk: a real-dimension file, queue depths, a prefill chunk ---- */

static sparq_status fill_fast(void *ctx, uint32_t l, uint32_t c, uint64_t first, uint64_t n, uint8_t *rows)
{
    (void)ctx;
    for (uint64_t i = 0; i < n; i++) memset(rows + i * 264, (int)((l * 131 + c * 17 + first + i) & 0x7F), 264);
    return SPARQ_OK;
}

typedef struct qd_arg {
    int fd;
    const sq_engram_header *h;
    double until;
    uint64_t seed, n;
    double *lat; /* [cap] seconds */
    size_t cap;
    int err;
} qd_arg;

/* One thread of queue depth d: O_DIRECT reads of the aligned block(s) holding a random row. */
static void *qd_worker(void *v)
{
    qd_arg *a = v;
    uint8_t *buf = sparq_aligned_alloc(4096, 8192);
    uint64_t x = a->seed;
    const sq_engram_layout *lay = &a->h->layout;
    while (buf) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint32_t c = (uint32_t)(x % lay->n_columns);
        const uint64_t b = (x >> 8) % lay->primes[0][c];
        const uint64_t off = a->h->file_offset[0][c] + b * 264, al = off & ~(uint64_t)4095;
        const size_t len = off + 264 - al > 4096 ? 8192 : 4096;
        const double t0 = sparq_now();
        const ssize_t got = pread(a->fd, buf, len, (off_t)al); /* short only at the end of the file */
        if (got < (ssize_t)(off + 264 - al)) {
            a->err = 1;
            break;
        }
        const double t1 = sparq_now();
        if (a->n < a->cap) a->lat[a->n] = t1 - t0;
        a->n++;
        if (t1 > a->until) break;
    }
    sparq_aligned_free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_qd(const char *path, const sq_engram_header *h, int qd, double seconds)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    qd_arg a[64];
    pthread_t th[64];
    const double until = sparq_now() + seconds, t0 = sparq_now();
    for (int i = 0; i < qd; i++) {
        a[i] = (qd_arg){.fd = fd, .h = h, .until = until, .seed = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) + (uint64_t)qd,
                        .cap = 1 << 20};
        a[i].lat = sparq_malloc(a[i].cap * sizeof(double));
        pthread_create(&th[i], NULL, qd_worker, &a[i]);
    }
    uint64_t n = 0;
    size_t nl = 0;
    for (int i = 0; i < qd; i++) {
        pthread_join(th[i], NULL);
        n += a[i].n;
        nl += a[i].n < a[i].cap ? a[i].n : a[i].cap;
        if (a[i].err) fprintf(stderr, "engram_bench: a read failed\n");
    }
    const double el = sparq_now() - t0;
    double *all = sparq_malloc((nl ? nl : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < qd; i++) {
        const size_t m = a[i].n < a[i].cap ? a[i].n : a[i].cap;
        memcpy(all + k, a[i].lat, m * sizeof *all);
        k += m;
        sparq_free(a[i].lat);
    }
    qsort(all, nl, sizeof *all, cmp_double);
    printf("O_DIRECT random rows, queue depth %2d: %8.0f reads/s (%6.1f MB/s of rows), latency p50 %7.1f us, p99 %7.1f us "
           "(%llu reads in %.1f s)\n",
           qd, (double)n / el, (double)n * 264 / el / 1e6, nl ? all[nl / 2] * 1e6 : 0, nl ? all[nl * 99 / 100] * 1e6 : 0,
           (unsigned long long)n, el);
    sparq_free(all);
    close(fd);
}

static int key_cmp(const void *a, const void *b)
{
    const sq_engram_key *x = a, *y = b;
    if (x->column != y->column) return x->column < y->column ? -1 : 1;
    return x->bucket < y->bucket ? -1 : x->bucket > y->bucket;
}

/* The rows of a 512-token prefill chunk (48 per token), deduplicated, through the fetcher. */
static void run_chunk(const char *path, const sq_engram_reader *r, int workers, int rep)
{
    const sq_engram_layout *lay = &sq_engram_reader_header(r)->layout;
    enum { TOK = 512, PER = 48 };
    static sq_engram_key keys[TOK * PER];
    static uint8_t rows[TOK * PER * 264];
    uint64_t x = 0x2545F4914F6CDD1Dull * (uint64_t)(workers + 7 * rep);
    for (int i = 0; i < TOK * PER; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint32_t c = (uint32_t)(x % lay->n_columns);
        keys[i] = (sq_engram_key){0, c, (x >> 8) % lay->primes[0][c]};
    }
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    const double t0 = sparq_now();
    qsort(keys, TOK * PER, sizeof *keys, key_cmp);
    size_t u = 0;
    for (size_t i = 0; i < TOK * PER; i++)
        if (!u || key_cmp(&keys[i], &keys[u - 1])) keys[u++] = keys[i];
    const double t1 = sparq_now();
    sq_engram_fetcher *f;
    int tk;
    double fs = 0;
    if (sq_engram_fetcher_create(&f, r, workers) != SPARQ_OK ||
        sq_engram_fetcher_submit(f, u, keys, rows, &tk) != SPARQ_OK ||
        sq_engram_fetcher_wait(f, tk, &fs, NULL) != SPARQ_OK) {
        fprintf(stderr, "engram_bench: %s\n", sparq_errmsg());
        exit(1);
    }
    sq_engram_fetcher_free(f);
    printf("prefill chunk: 512 tokens x 48 rows -> %zu distinct, dedupe %.2f ms, fetch with %2d workers %.1f ms "
           "(%.0f rows/s, cold page cache)\n",
           u, (t1 - t0) * 1e3, workers, fs * 1e3, (double)u / fs);
}

static int disk_mode(const char *path, uint32_t columns, uint64_t prime_base, double seconds, bool keep)
{
    if (access(path, F_OK) != 0) {
        sq_engram_layout lay;
        memset(&lay, 0, sizeof lay);
        lay.value_dtype = SQ_ENGRAM_F8_E4M3;
        lay.values_per_row = 256;
        lay.scale_dtype = SQ_ENGRAM_UE8M0;
        lay.scales_per_row = 8;
        lay.row_bytes = 264;
        lay.n_layers = 1;
        lay.n_columns = columns;
        lay.max_ngram = 4; /* columns = 3 orders x columns/3 heads */
        lay.n_heads = columns / 3;
        lay.pad_id = 2;
        lay.n_compressed = 99092;
        static uint32_t map[99092];
        for (uint32_t i = 0; i < 99092; i++) map[i] = i;
        lay.token_map = map;
        lay.n_tokens = 99092;
        lay.layer_ids[0] = 1;
        const uint64_t m[4] = {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull};
        memcpy(lay.multipliers[0], m, sizeof m);
        uint64_t p = prime_base;
        for (uint32_t c = 0; c < columns; c++) lay.primes[0][c] = p = sq_engram_next_prime(p);
        if (columns % 3 || sq_engram_layout_finish(&lay) != SPARQ_OK) {
            fprintf(stderr, "engram_bench: --columns %u (a multiple of 3, <= 63): %s\n", columns, sparq_errmsg());
            return 2;
        }
        const double t0 = sparq_now();
        if (sq_engram_write(path, &lay, 0, 1, 4 << 20, fill_fast, NULL) != SPARQ_OK) {
            fprintf(stderr, "engram_bench: %s\n", sparq_errmsg());
            return 1;
        }
        const double rows = (double)sq_engram_layer_rows(&lay, 0), tw = sparq_now() - t0;
        printf("wrote %s: 1 table x %u columns, %.0f rows of 264 B = %.1f GB in %.0f s (%.2f GB/s incl. XXH3 + fsync)\n",
               path, columns, rows, rows * 264 / 1e9, tw, rows * 264 / tw / 1e9);
    }
    sq_engram_reader *r;
    if (sq_engram_open(&r, path, 0) != SPARQ_OK) {
        fprintf(stderr, "engram_bench: %s\n", sparq_errmsg());
        return 1;
    }
    const sq_engram_header *h = sq_engram_reader_header(r);
    printf("file: %.1f GB, %llu rows\n", (double)h->data_bytes / 1e9,
           (unsigned long long)sq_engram_layer_rows(&h->layout, 0));
    fflush(stdout);
    const int depths[] = {1, 8, 64};
    for (int i = 0; i < 3; i++) {
        run_qd(path, h, depths[i], seconds);
        fflush(stdout);
    }
    for (int rep = 0; rep < 3; rep++) {
        run_chunk(path, r, 16, rep);
        run_chunk(path, r, 64, rep);
        fflush(stdout);
    }
    sq_engram_close(r);
    if (!keep) unlink(path);
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t base = 20000, cache = 65536;
    size_t tokens = 20000;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", *disk = NULL;
    uint32_t columns = 12;
    double seconds = 10;
    bool keep = false, base_given = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--keep")) {
            keep = true;
            memmove(argv + i, argv + i + 1, (size_t)(argc - i - 1) * sizeof *argv);
            argc--;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--disk")) disk = argv[i + 1];
        else if (!strcmp(argv[i], "--columns")) columns = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seconds")) seconds = strtod(argv[i + 1], NULL);
        else if (!strcmp(argv[i], "--base")) base = strtoull(argv[i + 1], NULL, 10), base_given = true;
        else if (!strcmp(argv[i], "--tokens")) tokens = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--cache")) cache = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else {
            fprintf(stderr, "usage: engram_bench [--base P] [--tokens N] [--cache ROWS] [--dir D]\n"
                            "       engram_bench --disk PATH [--columns C] [--seconds S] [--keep]\n");
            return 2;
        }
    }
    if (disk) return disk_mode(disk, columns, base_given ? base : SQ_ENGRAM_V41_PRIME_BASE, seconds, keep);
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
