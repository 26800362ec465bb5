/* tests/gpu/test_link_nccl.c — the NCCL device link (kernels/cuda/link_nccl.cu)
 * as far as one GPU allows: NCCL refuses two ranks on one device, but a
 * communicator of one rank is legal, so this runs the link's set-up (the
 * unique id through the local transport, the nonblocking communicator and its
 * deadline), link_allgather (one ncclAllGather on the side stream, joined to
 * the exec's stream both ways and polled on the host) at sizes from 4 bytes to
 * the link's max_bytes, with the data checked to the byte and the ops queued
 * after it seeing it, a piece over max_bytes refused, and the close
 * (ncclCommFinalize, destroy). The send / receive pair and the timeouts need a
 * second GPU (docs/runtime.md, "The device link"). Exits 77 without a GPU or
 * in a build without NCCL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_probe.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "runtime/dist/transport.h"
#include "t.h"

enum { MAX_BYTES = 1 << 20 };

int main(void)
{
    const char *why = "";
    if (gpu_probe_count(&why) == 0) T_SKIP("gpu suite skipped: %s", why);
    sq_exec *ex = NULL;
    sq_transport *t = NULL;
    if (sq_exec_create_cuda(&ex, 1) != SPARQ_OK || sq_transport_local(&t) != SPARQ_OK) {
        fprintf(stderr, "%s\n", sparq_errmsg());
        return 1;
    }
    uint8_t id[128];
    sparq_status st = sq_transport_nccl_bootstrap(t, id);
    if (st == SPARQ_E_UNSUPPORTED) T_SKIP("no NCCL in this build: %s", sparq_errmsg());
    CHECK_MSG(st == SPARQ_OK, "nccl id: %s", sparq_errmsg());
    const sq_backend *be = ex->be;
    const sq_link_spec spec = {.rank = 0, .size = 1, .max_bytes = MAX_BYTES, .timeout_s = 30, .nccl_id = id};
    sq_link *l = NULL;
    st = be->link_open(ex, &spec, &l);
    CHECK_MSG(st == SPARQ_OK, "a one-rank NCCL link: %s", sparq_errmsg());
    if (st != SPARQ_OK) return t_summary();
    float *mine = be->alloc(ex, MAX_BYTES), *all = be->alloc(ex, MAX_BYTES), *sum = be->alloc(ex, MAX_BYTES);
    float *h = malloc(MAX_BYTES), *back = malloc(MAX_BYTES);
    static const size_t sizes[] = {4, 1024, 8192, 65536, 1000 * 4, MAX_BYTES};
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        const size_t n = sizes[c] / 4;
        for (int rep = 0; rep < 20; rep++) {
            for (size_t i = 0; i < n; i++) h[i] = (float)(c * 1000003 + rep * 7919 + i) * 0.5f;
            CHECK(be->to_device(ex, mine, h, n * 4) == SPARQ_OK);
            st = be->link_allgather(ex, l, mine, all, n * 4, 30);
            CHECK_MSG(st == SPARQ_OK, "all-gather of %zu bytes: %s", n * 4, sparq_errmsg());
            be->sum_parts(ex, all, 1, n, sum); /* a kernel queued after it must see the gathered piece */
            CHECK(be->to_host(ex, back, sum, n * 4) == SPARQ_OK);
            CHECK_MSG(!memcmp(back, h, n * 4), "all-gather of %zu bytes, repeat %d: the piece differs", n * 4, rep);
        }
    }
    st = be->link_allgather(ex, l, mine, all, MAX_BYTES + 4, 30);
    CHECK_MSG(st == SPARQ_E_RANGE, "a piece over max_bytes: %s (%s)", sparq_status_str(st), sparq_errmsg());
    be->link_close(ex, l);
    CHECK(be->sync(ex) == SPARQ_OK);
    be->free(ex, mine), be->free(ex, all), be->free(ex, sum);
    free(h), free(back);
    sq_transport_close(t);
    sq_exec_free(ex);
    return t_summary();
}
