/* common/threadpool.h — a fixed pool of worker threads running parallel-for
 * jobs.
 *
 * One job at a time: sparq_pool_for(pool, n, fn, ctx) calls fn(ctx, i, tid)
 * for every i in [0, n) across the workers and the calling thread, and
 * returns when all are done. Work is handed out by an atomic counter, so
 * uneven items balance themselves. tid is in [0, sparq_pool_size(pool)) and
 * can index per-thread scratch buffers. A NULL pool runs serially with tid 0.
 *
 * Not reentrant: fn must not call sparq_pool_for on the same pool. */
#ifndef SPARQ_COMMON_THREADPOOL_H
#define SPARQ_COMMON_THREADPOOL_H

#include <stddef.h>

#include "common/status.h"

typedef struct sparq_pool sparq_pool;
typedef void (*sparq_pool_fn)(void *ctx, size_t i, int tid);

/* n_threads ≤ 0 means one per online CPU (or SPARQ_THREADS if set). */
sparq_status sparq_pool_create(sparq_pool **out, int n_threads);
void sparq_pool_free(sparq_pool *pool);
int sparq_pool_size(const sparq_pool *pool);
void sparq_pool_for(sparq_pool *pool, size_t n, sparq_pool_fn fn, void *ctx);

/* Number of CPUs this process may use (affinity-aware, ≥ 1). */
int sparq_cpu_count(void);

#endif
