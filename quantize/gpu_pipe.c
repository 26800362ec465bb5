/* quantize/gpu_pipe.c — the two-stage GPU pipeline (gpu_pipe.h). */
#include "quantize/gpu_pipe.h"

#include <stdbool.h>
#include <stdio.h>

#include "common/progress.h"

int qz_pipe_fit(const qz_pipe_room *r, int avail, void (*cost)(void *ctx, int m, qz_pipe_cost *c), void *ctx)
{
    const size_t room = r->dev_free + r->dev_held;
    for (int alone = 0; alone < 2 && !(alone && r->busy); alone++) {
        const size_t dcap = alone ? room : room / 2;
        const uint64_t hcap = alone ? r->host : r->host / 2;
        int m = 0;
        while (m < avail) {
            qz_pipe_cost c;
            cost(ctx, m + 1, &c);
            bool fits = c.dev <= dcap && c.host <= hcap;
            if (r->busy) fits = fits && c.dev_early <= r->dev_free && c.host + r->host_held <= r->host;
            if (!fits) break;
            m++;
        }
        if (m > 0) return m;
    }
    return 0;
}

/* Wait for *busy, finish it (if waiting went well) and release it. */
static sparq_status collect(const qz_pipe_ops *o, void **busy, qz_pipe_stats *z)
{
    double g = 0, t = sparq_now();
    sparq_status st = o->wait(o->ctx, *busy, &g);
    z->waited += sparq_now() - t;
    z->gpu += g;
    if (st == SPARQ_OK) {
        t = sparq_now();
        st = o->finish(o->ctx, *busy);
        z->finish += sparq_now() - t;
    }
    o->release(o->ctx, *busy);
    *busy = NULL;
    return st;
}

sparq_status qz_pipe_run(const qz_pipe_ops *o, int n, int overlap, qz_pipe_stats *stats)
{
    qz_pipe_stats z = {0};
    const double t_start = sparq_now();
    void *busy = NULL; /* submitted, not yet waited for */
    sparq_status st = SPARQ_OK;
    for (int next = 0; st == SPARQ_OK && (next < n || busy);) {
        void *b = NULL;
        if (next < n) {
            int m = 0;
            st = o->plan(o->ctx, next, busy, &m);
            if (st == SPARQ_OK && m == 0 && busy) { /* does not fit beside it: wait for it first */
                st = collect(o, &busy, &z);
                continue;
            }
            if (st == SPARQ_OK && (m < 1 || m > n - next))
                st = sparq_err(SPARQ_E_STATE, "gpu pipeline: a batch of %d items planned at item %d of %d", m, next, n);
            if (st == SPARQ_OK) {
                const double t = sparq_now();
                st = o->prepare(o->ctx, next, m, &b);
                z.prepare += sparq_now() - t;
                next += m;
            }
            if (st != SPARQ_OK) {
                if (b) o->release(o->ctx, b);
                break;
            }
        }
        if (busy) st = collect(o, &busy, &z);
        if (st == SPARQ_OK && b) {
            st = o->submit(o->ctx, b);
            if (st == SPARQ_OK) {
                busy = b, b = NULL;
                z.batches++;
                if (!overlap) st = collect(o, &busy, &z);
            }
        }
        if (b) o->release(o->ctx, b);
    }
    if (busy) { /* stopped by an error: the batch in flight ends, unused; the first message stays */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sparq_errmsg());
        double g = 0;
        o->wait(o->ctx, busy, &g);
        o->release(o->ctx, busy);
        sparq_err(st, "%s", msg);
    }
    z.wall = sparq_now() - t_start;
    if (stats) *stats = z;
    return st;
}
