/* pack/verify.c — `sparq verify`: the bundle's files against its manifest
 * (formats/bundle.h, the very routine the runtime runs at load: the entries
 * that must be listed, sizes, files the manifest does not list, every block's
 * XXH3-128 in parallel), with every unlisted file in the bundle a problem. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "pack/pack.h"

sparq_status sq_verify_bundle(const char *dir, const sq_verify_options *o, sq_verify_report *r)
{
    memset(r, 0, sizeof *r);
    sq_manifest m;
    FORWARD_IF(sq_manifest_load(&m, dir));
    const sq_bundle_check_opts co = {
        .node = o->node, .quick = o->quick, .threads = o->threads, .all_files = true, .progress = "verify"};
    sparq_status st = sq_bundle_check(dir, &m, &co, r);
    if (st == SPARQ_OK) st = sq_bundle_report_status(dir, r);
    sq_manifest_free(&m);
    return st;
}

sparq_status sq_verify_read_baseline(const char *dir, int node, uint64_t *bytes, double *seconds)
{
    *bytes = 0;
    *seconds = 0;
    sq_manifest m;
    FORWARD_IF(sq_manifest_load(&m, dir));
    const size_t cap = 4 << 20;
    uint8_t *buf = sparq_aligned_alloc(4096, cap);
    sparq_status st = buf ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    double t0 = sparq_now();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < m.n_files && st == SPARQ_OK; i++) {
        if (!sq_manifest_file_for_node(&m.files[i], node)) continue;
        char *p = sparq_path_join(dir, m.files[i].path);
        int fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
        if (fd < 0) st = sparq_err(SPARQ_E_IO, "%s: cannot open", p ? p : "?");
        sparq_free(p);
        ssize_t r;
        while (fd >= 0 && (r = read(fd, buf, cap)) > 0) {
            *bytes += (uint64_t)r;
            sink ^= buf[r - 1];
        }
        if (fd >= 0) close(fd);
    }
    *seconds = sparq_now() - t0;
    (void)sink;
    sparq_aligned_free(buf);
    sq_manifest_free(&m);
    return st;
}
