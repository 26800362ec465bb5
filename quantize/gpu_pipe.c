/* quantize/gpu_pipe.c — the two-stage GPU pipeline (gpu_pipe.h), one per
 * device, the devices' pipelines sharing one queue of items. */
#include "quantize/gpu_pipe.h"

#include <pthread.h>
#include <stdatomic.h>
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

/* What the pipelines share: the next item, the CPU stages' locks (plans and prepares run
 * one at a time in queue order, so whatever a preparation decides the next one sees,
 * whichever pipeline runs it; finishes one at a time), and the first error, which
 * stops them all. */
typedef struct pipe_queue {
    pthread_mutex_t prep, fin, err;
    int next, n, overlap;
    atomic_int stop;
    sparq_status st;
    char msg[1024];
} pipe_queue;

/* Wait for *busy, finish it (if waiting went well) and release it. */
static sparq_status collect(const qz_pipe_ops *o, pipe_queue *q, void **busy, qz_pipe_stats *z)
{
    double g = 0, t = sparq_now();
    sparq_status st = o->wait(o->ctx, *busy, &g);
    z->waited += sparq_now() - t;
    z->gpu += g;
    if (st == SPARQ_OK) {
        pthread_mutex_lock(&q->fin);
        t = sparq_now();
        st = o->finish(o->ctx, *busy);
        z->finish += sparq_now() - t;
        pthread_mutex_unlock(&q->fin);
    }
    o->release(o->ctx, *busy);
    *busy = NULL;
    return st;
}

/* One pipeline: claims batches from q until it is empty or stopped. */
static sparq_status pipe_loop(const qz_pipe_ops *o, pipe_queue *q, qz_pipe_stats *z)
{
    const double t_start = sparq_now();
    void *busy = NULL; /* submitted, not yet waited for */
    sparq_status st = SPARQ_OK;
    while (st == SPARQ_OK && !atomic_load(&q->stop)) {
        void *b = NULL;
        bool claimed = false, wait_first = false;
        pthread_mutex_lock(&q->prep);
        if (q->next < q->n && !atomic_load(&q->stop)) {
            int m = 0;
            const int next = q->next, n = q->n;
            st = o->plan(o->ctx, next, busy, &m);
            if (st == SPARQ_OK && m == 0 && busy) wait_first = true; /* does not fit beside it: wait for it first */
            else if (st == SPARQ_OK && (m < 1 || m > n - next))
                st = sparq_err(SPARQ_E_STATE, "gpu pipeline: a batch of %d items planned at item %d of %d", m, next, n);
            if (st == SPARQ_OK && !wait_first) {
                q->next += m;
                claimed = true;
                const double t = sparq_now();
                st = o->prepare(o->ctx, next, m, &b);
                z->prepare += sparq_now() - t;
            }
        }
        pthread_mutex_unlock(&q->prep);
        if (st == SPARQ_OK && wait_first) {
            st = collect(o, q, &busy, z);
            continue;
        }
        if (st != SPARQ_OK) {
            if (b) o->release(o->ctx, b);
            break;
        }
        if (!claimed && !busy) break; /* the queue is empty and nothing is in flight */
        if (busy) st = collect(o, q, &busy, z);
        if (st == SPARQ_OK && b) {
            st = o->submit(o->ctx, b);
            if (st == SPARQ_OK) {
                busy = b, b = NULL;
                z->batches++;
                if (!q->overlap) st = collect(o, q, &busy, z);
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
        if (st != SPARQ_OK) sparq_err(st, "%s", msg);
    }
    if (st != SPARQ_OK && o->name) st = sparq_err_context(st, "%s", o->name);
    if (st != SPARQ_OK) {
        pthread_mutex_lock(&q->err);
        if (q->st == SPARQ_OK) {
            q->st = st;
            snprintf(q->msg, sizeof q->msg, "%s", sparq_errmsg());
        }
        pthread_mutex_unlock(&q->err);
        atomic_store(&q->stop, 1);
    }
    z->wall = sparq_now() - t_start;
    return st;
}

typedef struct pipe_thread {
    const qz_pipe_ops *o;
    pipe_queue *q;
    qz_pipe_stats z;
    pthread_t th;
    bool started;
} pipe_thread;

static void *pipe_main(void *arg)
{
    pipe_thread *p = arg;
    pipe_loop(p->o, p->q, &p->z);
    return NULL;
}

sparq_status qz_pipe_run_multi(const qz_pipe_ops *ops, int n_pipes, int n, int overlap, qz_pipe_stats *stats)
{
    RETURN_IF(n_pipes < 1 || n_pipes > QZ_PIPE_MAX, SPARQ_E_ARG, "gpu pipeline: %d pipelines (1..%d)", n_pipes,
              QZ_PIPE_MAX);
    pipe_queue q = {.prep = PTHREAD_MUTEX_INITIALIZER, .fin = PTHREAD_MUTEX_INITIALIZER,
                    .err = PTHREAD_MUTEX_INITIALIZER, .n = n, .overlap = overlap, .st = SPARQ_OK};
    atomic_init(&q.stop, 0);
    pipe_thread pt[QZ_PIPE_MAX] = {{0}};
    /* pipeline 0 on this thread, the others on their own; one whose thread cannot be
     * made just takes no batches (the queue gives them to the others) */
    for (int i = 0; i < n_pipes; i++) pt[i] = (pipe_thread){.o = &ops[i], .q = &q};
    for (int i = 1; i < n_pipes; i++) pt[i].started = pthread_create(&pt[i].th, NULL, pipe_main, &pt[i]) == 0;
    pipe_loop(&ops[0], &q, &pt[0].z);
    for (int i = 1; i < n_pipes; i++)
        if (pt[i].started) pthread_join(pt[i].th, NULL);
    pthread_mutex_destroy(&q.prep);
    pthread_mutex_destroy(&q.fin);
    pthread_mutex_destroy(&q.err);
    for (int i = 0; stats && i < n_pipes; i++) stats[i] = pt[i].z;
    return q.st == SPARQ_OK ? SPARQ_OK : sparq_err(q.st, "%s", q.msg);
}

sparq_status qz_pipe_run(const qz_pipe_ops *o, int n, int overlap, qz_pipe_stats *stats)
{
    return qz_pipe_run_multi(o, 1, n, overlap, stats);
}
