/* tools/bench/load_bench.c — what checking a bundle at load costs: the time of
 * sq_model_load() of one node with every block's XXH3-128 checked (the
 * default of `sparq run / serve / eval`) and with --no-verify (sizes only),
 * alternated in the same process, page cache warm and cold.
 *
 *   load_bench BUNDLE [--node K] [--rounds N] [--threads T]
 *
 * "Cold" drops the node's files from the page cache (posix_fadvise DONTNEED)
 * before each load; a cold --no-verify load then reads the weights later, on
 * first touch, so the cold rows also time one forward step (`first token`:
 * the first decode after the load, which touches every expert the router
 * picks) to show where the reading went. Prints the median load time and
 * the node's bytes over it (with --no-verify most bytes are not read yet). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "formats/manifest.h"
#include "runtime/model.h"

static uint64_t node_bytes(const sq_manifest *m, int node, bool drop, const char *bundle)
{
    uint64_t total = 0;
    for (size_t i = 0; i < m->n_files; i++) {
        if (!sq_manifest_file_for_node(&m->files[i], node)) continue;
        total += m->files[i].size;
        if (!drop) continue;
        char *p = sparq_path_join(bundle, m->files[i].path);
        int fd = p ? open(p, O_RDONLY) : -1;
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        sparq_free(p);
    }
    return total;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: load_bench BUNDLE [--node K] [--rounds N] [--threads T]\n");
        return 2;
    }
    const char *bundle = argv[1];
    int node = 0, rounds = 5, threads = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--node")) node = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (rounds < 1 || rounds > 64) rounds = 5;
    sq_manifest man;
    if (sq_manifest_load(&man, bundle) != SPARQ_OK) {
        fprintf(stderr, "load_bench: %s\n", sparq_errmsg());
        return 1;
    }
    const uint64_t bytes = node_bytes(&man, node, false, bundle);
    double la[3] = {0, 0, 0};
    getloadavg(la, 3);
    printf("bundle %s node %d of %d: %.3f GB; threads %d; load average %.2f\n", bundle, node, man.boxes,
           (double)bytes / 1e9, threads, la[0]);
    double t[2][2][64], first[2][2][64]; /* [cold][verify][round] */
    for (int cold = 0; cold < 2; cold++)
        for (int r = 0; r < rounds; r++)
            for (int v = 1; v >= 0; v--) {
                if (cold) node_bytes(&man, node, true, bundle);
                sq_model_opts o;
                sq_model_opts_default(&o);
                o.node = node;
                o.nodes = man.boxes;
                o.n_threads = threads;
                o.no_verify = !v;
                sq_model *m = NULL;
                double t0 = sparq_now();
                if (sq_model_load(&m, bundle, &o) != SPARQ_OK) {
                    fprintf(stderr, "load_bench: %s\n", sparq_errmsg());
                    return 1;
                }
                t[cold][v][r] = sparq_now() - t0;
                first[cold][v][r] = 0;
                if (man.boxes == 1) {
                    const int32_t tok = 1;
                    float *logits = sparq_malloc((size_t)sq_model_cfg(m)->vocab_size * sizeof(float));
                    t0 = sparq_now();
                    if (!logits || sq_model_forward(m, 0, &tok, 1, SQ_LOGITS_LAST, logits) != SPARQ_OK) {
                        fprintf(stderr, "load_bench: forward: %s\n", sparq_errmsg());
                        return 1;
                    }
                    first[cold][v][r] = sparq_now() - t0;
                    sparq_free(logits);
                }
                sq_model_free(m);
            }
    printf("%-5s %-10s %12s %10s %16s\n", "cache", "check", "load (med)", "GB/load s", "first token");
    for (int cold = 0; cold < 2; cold++)
        for (int v = 1; v >= 0; v--) {
            qsort(t[cold][v], (size_t)rounds, sizeof(double), cmp_double);
            qsort(first[cold][v], (size_t)rounds, sizeof(double), cmp_double);
            const double med = t[cold][v][rounds / 2];
            printf("%-5s %-10s %10.1f ms %10.2f %13.1f ms   (load min %.1f, max %.1f ms)\n", cold ? "cold" : "warm",
                   v ? "verify" : "no-verify", med * 1e3, (double)bytes / med / 1e9, first[cold][v][rounds / 2] * 1e3,
                   t[cold][v][0] * 1e3, t[cold][v][rounds - 1] * 1e3);
        }
    sq_manifest_free(&man);
    return 0;
}
