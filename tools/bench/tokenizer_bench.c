/* tools/bench/tokenizer_bench.c — encode throughput of sparq's tokenizer,
 * one thread: `tokenizer_bench TOKENIZER TEXT [REPEATS [chunks]]` prints the
 * best MB/s over REPEATS (default 3) encodes of the whole TEXT file — or,
 * with "chunks", of each "\n\n"-separated paragraph encoded on its own (many
 * short calls, as a server sees them) — and the id count (so the driver
 * script can check it against HF). Run through
 * tools/bench/tokenizer_bench.py, which times HF tokenizers on the same file
 * in the same run and prints the ratio. A .zst TOKENIZER is not accepted
 * here: the script decompresses it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_bench TOKENIZER(.json or dir) TEXT [REPEATS]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    int chunks = argc > 4 && !strcmp(argv[4], "chunks");
    sq_tokenizer *t;
    double t0 = now();
    if (sq_tokenizer_load(&t, argv[1]) != SPARQ_OK) {
        fprintf(stderr, "tokenizer_bench: %s\n", sparq_errmsg());
        return 1;
    }
    double load_s = now() - t0;
    char *text;
    size_t n;
    if (sparq_file_read_all(argv[2], 0, &text, &n) != SPARQ_OK) {
        fprintf(stderr, "tokenizer_bench: %s\n", sparq_errmsg());
        return 1;
    }
    double best = 1e30;
    size_t nid = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        size_t pos = 0;
        nid = 0;
        t0 = now();
        while (pos < n) {
            const char *sep = chunks ? memmem(text + pos, n - pos, "\n\n", 2) : NULL;
            size_t end = sep ? (size_t)(sep - text) : n, k;
            if (sq_tokenizer_encode(t, text + pos, end - pos, true, &ids, &k) != SPARQ_OK) {
                fprintf(stderr, "tokenizer_bench: %s\n", sparq_errmsg());
                return 1;
            }
            nid += k;
            sparq_free(ids);
            pos = sep ? end + 2 : n;
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("bytes %zu ids %zu load_s %.3f encode_s %.4f mb_per_s %.2f\n", n, nid, load_s, best,
           (double)n / best / 1e6);
    sparq_free(text);
    sq_tokenizer_free(t);
    return 0;
}
