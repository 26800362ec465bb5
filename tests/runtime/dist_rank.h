/* tests/runtime/dist_rank.h — what the thread-rank tests of runtime/dist
 * (test_dist_threads.c, test_dist_experts.c) share: packing the fixture, and
 * opening one rank of a bundle or model folder with the sizes the test
 * packed it for. */
#ifndef SPARQ_TESTS_RUNTIME_DIST_RANK_H
#define SPARQ_TESTS_RUNTIME_DIST_RANK_H

#include "pack/pack.h"
#include "runtime/dist/dist.h"

/* Pack `model` into `out` for `boxes` boxes split as `split`, planned for ctx × users sequences of chunk rows. */
static inline sparq_status dist_rank_pack(const char *model, const char *out, int boxes, sq_memplan_split split,
                                          int ctx, int users, int chunk)
{
    sq_pack_options o;
    sq_pack_options_default(&o);
    o.boxes = boxes;
    o.params.ctx = ctx;
    o.params.users = users;
    o.params.chunk = chunk;
    o.params.split = split;
    return sq_pack_bundle(model, out, &o);
}

/* Rank t->rank of `path` on one thread of `device`, ctx × users sequences of
 * chunk rows (what a bundle was packed for; a model folder needs them
 * given), every wait's deadline timeout_s. */
static inline sparq_status dist_rank_open(sq_dist **d, const char *path, sq_transport *t, sq_device device, int ctx,
                                          int users, int chunk, double timeout_s)
{
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.n_threads = 1;
    mo.device = device;
    mo.ctx = ctx;
    mo.n_seq = users;
    mo.max_rows = chunk;
    sq_dist_opts dop;
    sq_dist_opts_default(&dop);
    dop.timeout_s = timeout_s;
    bool reported = false;
    return sq_dist_open(d, path, &mo, &dop, t, &reported);
}

#endif
