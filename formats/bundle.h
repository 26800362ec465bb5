/* formats/bundle.h — a bundle's files checked against its manifest: the one
 * routine behind both the runtime's load check (runtime/models/model.c, every
 * `run`, `serve`, `eval` of a bundle unless --no-verify) and `sparq verify`
 * (pack/verify.c, which adds its checks of the manifest against the shards).
 *
 * In this order, each problem one line in the report:
 *   1. node range; the entries that must be listed (node-K/model.safetensors of
 *      every node checked, config.json): "node-0/model.safetensors: not listed
 *      in manifest.json (entry removed?)";
 *   2. every file checked exists, is a regular file (never opened blocking:
 *      common/file.h) and has the recorded size;
 *   3. files on disk the manifest does not list: anywhere (all_files, verify),
 *      or (the runtime) those the runtime would read — anything under node-K/
 *      and the shared config/tokenizer names at the top — so nothing is loaded
 *      unchecked: "tokenizer.json: not listed in manifest.json";
 *   4. unless quick: the XXH3-128 of every block, in parallel (thread pool),
 *      hashed straight from a read-only mapping of the file (pread when it
 *      cannot be mapped): "node-0/model.safetensors: block 729 (bytes
 *      2985984..2990079): checksum mismatch (damaged data)".
 * The runtime maps the same files next, so the pages the check read are the
 * page cache the load then uses: the check costs the hash (~10 GB/s a core,
 * docs/benchmarks-pack.md), not a second read from the disk. */
#ifndef SPARQ_FORMATS_BUNDLE_H
#define SPARQ_FORMATS_BUNDLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/manifest.h"

/* The model files `sparq pack` copies into the bundle's top folder when the
 * model has them (config, generation and quantization configs, tokenizer);
 * NULL-terminated. */
extern const char *const sq_bundle_shared_files[];

typedef struct sq_bundle_check_opts {
    int node;       /* -1: every file; K: the files node K loads (its shard, its Engram shard, the shared files) */
    bool quick;     /* sizes only, no hashing */
    int threads;    /* hashing threads; <= 0: all CPUs */
    bool all_files; /* an unlisted file anywhere is a problem (verify); false: only one the runtime would read */
    const char *progress; /* label of the progress bar (common/progress.h), NULL: none */
} sq_bundle_check_opts;

typedef struct sq_bundle_report {
    uint64_t files, blocks, bytes;   /* checked */
    double seconds;                  /* hashing wall time */
    uint64_t n_bad;                  /* problems found */
    char **problems;                 /* one line each, at most 100 kept; n_bad counts all */
    size_t n_problems;
    sparq_status first;              /* status of the first problem (SPARQ_OK: none) */
    char first_msg[512];
} sq_bundle_report;

/* Check bundle_dir against m (loaded from it). SPARQ_OK when nothing is wrong;
 * otherwise the first problem's status (SPARQ_E_CHECKSUM for a damaged
 * block, SPARQ_E_FORMAT for a size or an unlisted file, SPARQ_E_NOTFOUND for
 * a missing file or entry) with the message "BUNDLE: <first problem> (and N
 * more problems)", every problem in r. SPARQ_E_ARG for a node outside the
 * bundle, SPARQ_E_NOMEM. Free r with sq_bundle_report_free either way. */
sparq_status sq_bundle_check(const char *bundle_dir, const sq_manifest *m, const sq_bundle_check_opts *o,
                             sq_bundle_report *r);
void sq_bundle_report_free(sq_bundle_report *r);

/* Record one more problem (printf-style; not thread-safe), for checks of
 * their own (pack/verify.c). */
void sq_bundle_report_add(sq_bundle_report *r, sparq_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* SPARQ_OK when r holds no problem, else the first one's status with the
 * message sq_bundle_check sets. */
sparq_status sq_bundle_report_status(const char *bundle_dir, const sq_bundle_report *r);

/* The sizes-only check of what `node` loads (steps 1-3), for callers that
 * skip the checksums: sq_bundle_check with quick set, no report kept. */
sparq_status sq_bundle_check_quick(const char *bundle_dir, const sq_manifest *m, int node);

#endif
