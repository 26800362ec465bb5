/* tests/fuzz/fuzz_reflp.c — the reference log-prob file reader
 * (runtime/eval.h, `sparq eval --ref-logits`) on arbitrary bytes: open, read
 * every row, close. The input is handed over as a file (memfd), as the
 * reader only takes paths. Vocabularies above 65536 are not row-read here to
 * keep each input fast (the header checks still run). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/eval.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("reflp", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    sq_reflp_reader *r = NULL;
    if (sq_reflp_open(&r, path) == SPARQ_OK) {
        int64_t n;
        (void)sq_reflp_tokens(r, &n);
        if (sq_reflp_vocab(r) <= 65536) {
            float *row = malloc((size_t)sq_reflp_vocab(r) * sizeof(float));
            for (int64_t i = 0; row && i < sq_reflp_rows(r) && i < 4096; i++)
                if (sq_reflp_read_row(r, row) != SPARQ_OK) break;
            free(row);
        }
        sq_reflp_close(r);
    }
    close(fd);
    return 0;
}
