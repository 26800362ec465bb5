/* common/threadpool.c — see threadpool.h.
 *
 * Workers sleep on a condition variable between jobs. A job is published by
 * bumping a generation counter; each worker (and the caller) then claims
 * items with an atomic fetch-add until the range is exhausted. The caller
 * waits until every worker has checked out of the generation. */
#include "common/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/alloc.h"

struct sparq_pool {
    int n;                 /* total threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    unsigned long gen;
    int busy;              /* workers still in the current job */
    int quit;
    /* current job */
    sparq_pool_fn fn;
    void *ctx;
    size_t count;
    atomic_size_t next;
};

typedef struct {
    sparq_pool *pool;
    int tid;
} worker_arg;

static void run_items(sparq_pool *p, int tid)
{
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->count) break;
        p->fn(p->ctx, i, tid);
    }
}

static void *worker_main(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    sparq_free(arg);
    sparq_pool *p = wa.pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->cv_job, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_items(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int sparq_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

sparq_status sparq_pool_create(sparq_pool **out, int n_threads)
{
    *out = NULL;
    if (n_threads <= 0) {
        const char *e = getenv("SPARQ_THREADS");
        n_threads = e ? atoi(e) : 0;
        if (n_threads <= 0) n_threads = sparq_cpu_count();
    }
    sparq_pool *p = sparq_calloc(1, sizeof *p);
    RETURN_IF(!p, SPARQ_E_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->threads = sparq_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            p->n = 1; /* no workers to join */
            sparq_pool_free(p);
            return sparq_err(SPARQ_E_NOMEM, "thread pool: out of memory");
        }
        for (int t = 1; t < n_threads; t++) {
            worker_arg *wa = sparq_malloc(sizeof *wa);
            if (wa) {
                wa->pool = p;
                wa->tid = t;
            }
            if (!wa || pthread_create(&p->threads[t - 1], NULL, worker_main, wa)) {
                sparq_free(wa);
                p->n = t; /* only t-1 workers exist */
                sparq_pool_free(p);
                return sparq_err(SPARQ_E_NOMEM, "thread pool: cannot start thread %d", t);
            }
        }
    }
    *out = p;
    return SPARQ_OK;
}

void sparq_pool_free(sparq_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->threads[t - 1], NULL);
    sparq_free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_job);
    pthread_cond_destroy(&p->cv_done);
    sparq_free(p);
}

int sparq_pool_size(const sparq_pool *p) { return p ? p->n : 1; }

void sparq_pool_for(sparq_pool *p, size_t n, sparq_pool_fn fn, void *ctx)
{
    if (!p || p->n == 1 || n <= 1) {
        for (size_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
