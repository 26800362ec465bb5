/* runtime/dist/transport_threads.c — N ranks inside one process, one thread per
 * rank: the pipeline of runtime/dist/dist.h without MPI, for tests (several CPU
 * or GPU ranks on a machine that has no MPI) and benchmarks.
 *
 * A hub holds one FIFO per (destination, tag); isend copies the message into
 * the destination's queue, so every send has completed when it returns.
 * recv waits on the hub's condition variable with its deadline. bcast and
 * gather are built from tagged point-to-point messages (tag SQ_TAG_INIT, as
 * the MPI transport's start-up exchanges are collective and ordered), and
 * allgather likewise (tag SQ_TAG_GATHER, with the caller's deadline). The
 * hub is freed when the last rank closes it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/dist/transport.h"

enum { N_TAGS = 6 }; /* SQ_TAG_STEP .. SQ_TAG_GATHER */

typedef struct tmsg {
    struct tmsg *next;
    int src;
    size_t n;
    char data[];
} tmsg;

typedef struct hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, open;
    tmsg **head, **tail; /* [size * N_TAGS] */
} hub;

typedef struct tt {
    sq_transport t;
    hub *h;
} tt;

static hub *hub_of(sq_transport *t) { return ((tt *)t)->h; }

static sparq_status th_isend(sq_transport *t, int dst, int tag, const void *buf, size_t n, int slot)
{
    (void)slot;
    hub *h = hub_of(t);
    RETURN_IF(dst < 0 || dst >= h->size || tag < 0 || tag >= N_TAGS, SPARQ_E_ARG, "threads transport: rank %d tag %d",
              dst, tag);
    tmsg *m = sparq_malloc(sizeof *m + n);
    RETURN_IF(!m, SPARQ_E_NOMEM, "threads transport: out of memory for a %zu-byte message", n);
    m->next = NULL;
    m->src = t->rank;
    m->n = n;
    if (n) memcpy(m->data, buf, n);
    pthread_mutex_lock(&h->mu);
    const int q = dst * N_TAGS + tag;
    if (h->tail[q]) h->tail[q]->next = m;
    else h->head[q] = m;
    h->tail[q] = m;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    t->bytes_sent += n;
    t->msgs_sent++;
    return SPARQ_OK;
}

static sparq_status th_wait_send(sq_transport *t, int slot, double timeout_s)
{
    (void)t, (void)slot, (void)timeout_s;
    return SPARQ_OK;
}

static bool th_send_done(sq_transport *t, int slot)
{
    (void)t, (void)slot;
    return true;
}

/* The first message from src in queue q (under mu), unlinked. */
static tmsg *take_from(hub *h, int q, int src)
{
    tmsg *prev = NULL;
    for (tmsg *m = h->head[q]; m; prev = m, m = m->next)
        if (m->src == src) {
            if (prev) prev->next = m->next;
            else h->head[q] = m->next;
            if (h->tail[q] == m) h->tail[q] = prev;
            return m;
        }
    return NULL;
}

static sparq_status th_recv(sq_transport *t, int src, int tag, void *buf, size_t cap, size_t *got, double timeout_s)
{
    hub *h = hub_of(t);
    RETURN_IF(src < 0 || src >= h->size || tag < 0 || tag >= N_TAGS, SPARQ_E_ARG, "threads transport: rank %d tag %d",
              src, tag);
    const double t0 = sparq_now();
    const struct timespec until = sparq_deadline_after(timeout_s < 0 ? 1e9 : timeout_s);
    pthread_mutex_lock(&h->mu);
    tmsg *m;
    int rc = 0;
    while (!(m = take_from(h, t->rank * N_TAGS + tag, src)) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&h->cv, &h->mu, &until);
    pthread_mutex_unlock(&h->mu);
    t->t_wait += sparq_now() - t0;
    RETURN_IF(!m, SPARQ_E_TIMEOUT, "rank %d: nothing from rank %d within %.1f s", t->rank, src, timeout_s);
    sparq_status st = SPARQ_OK;
    if (m->n > cap) st = sparq_err(SPARQ_E_RANGE, "rank %d: a %zu-byte message from rank %d for a %zu-byte buffer",
                                   t->rank, m->n, src, cap);
    else memcpy(buf, m->data, m->n);
    *got = m->n;
    sparq_free(m);
    return st;
}

static sparq_status th_bcast(sq_transport *t, int root, void *buf, size_t n)
{
    if (t->rank == root) {
        for (int r = 0; r < t->size; r++)
            if (r != root) FORWARD_IF(th_isend(t, r, SQ_TAG_INIT, buf, n, 0));
        return SPARQ_OK;
    }
    size_t got;
    FORWARD_IF(th_recv(t, root, SQ_TAG_INIT, buf, n, &got, 600));
    RETURN_IF(got != n, SPARQ_E_COMM, "rank %d: broadcast of %zu bytes, got %zu", t->rank, n, got);
    return SPARQ_OK;
}

static sparq_status th_gather(sq_transport *t, const void *mine, size_t n, void *all)
{
    if (t->rank != 0) return th_isend(t, 0, SQ_TAG_INIT, mine, n, 0);
    memmove(all, mine, n);
    for (int r = 1; r < t->size; r++) {
        size_t got;
        FORWARD_IF(th_recv(t, r, SQ_TAG_INIT, (char *)all + (size_t)r * n, n, &got, 600));
        RETURN_IF(got != n, SPARQ_E_COMM, "gather: %zu bytes from rank %d, expected %zu", got, r, n);
    }
    return SPARQ_OK;
}

/* Send mine to every other rank, then take each rank's piece in rank order. */
static sparq_status th_allgather(sq_transport *t, const void *mine, size_t n, void *all, double timeout_s)
{
    for (int r = 0; r < t->size; r++)
        if (r != t->rank) FORWARD_IF(th_isend(t, r, SQ_TAG_GATHER, mine, n, 0));
    memmove((char *)all + (size_t)t->rank * n, mine, n);
    for (int r = 0; r < t->size; r++) {
        if (r == t->rank) continue;
        size_t got = 0;
        const sparq_status st = th_recv(t, r, SQ_TAG_GATHER, (char *)all + (size_t)r * n, n, &got, timeout_s);
        RETURN_IF(st == SPARQ_E_TIMEOUT, st, "rank %d: all-gather of %zu bytes: nothing from rank %d within %.1f s "
                  "(the --timeout): rank %d is stopped, hung or dead", t->rank, n, r, timeout_s, r);
        FORWARD_IF(st);
        RETURN_IF(got != n, SPARQ_E_COMM, "rank %d: all-gather: %zu bytes from rank %d, expected %zu", t->rank, got,
                  r, n);
    }
    return SPARQ_OK;
}

static int th_find_silent(sq_transport *t, double wait_s)
{
    (void)t, (void)wait_s;
    return -1; /* threads of one process do not stop one by one */
}

static void th_abort(sq_transport *t, int code)
{
    (void)t, (void)code;
    abort();
}

static void th_close(sq_transport *t)
{
    hub *h = hub_of(t);
    pthread_mutex_lock(&h->mu);
    const bool last = --h->open == 0;
    pthread_mutex_unlock(&h->mu);
    sparq_free(t);
    if (!last) return;
    for (int q = 0; q < h->size * N_TAGS; q++)
        for (tmsg *m = h->head[q], *nx; m; m = nx) {
            nx = m->next;
            sparq_free(m);
        }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    sparq_free(h->head);
    sparq_free(h->tail);
    sparq_free(h);
}

static const sq_transport_vt threads_vt = {.isend = th_isend, .wait_send = th_wait_send,
                                           .send_done = th_send_done, .recv = th_recv, .bcast = th_bcast,
                                           .gather = th_gather, .allgather = th_allgather,
                                           .find_silent = th_find_silent, .abort = th_abort, .close = th_close};

sparq_status sq_transport_threads(int size, sq_transport **out)
{
    RETURN_IF(size < 1 || size > 64, SPARQ_E_ARG, "threads transport: %d ranks (1..64)", size);
    hub *h = sparq_calloc(1, sizeof *h);
    if (h) {
        h->head = sparq_calloc((size_t)size * N_TAGS, sizeof *h->head);
        h->tail = sparq_calloc((size_t)size * N_TAGS, sizeof *h->tail);
    }
    if (!h || !h->head || !h->tail) {
        if (h) sparq_free(h->head), sparq_free(h->tail);
        sparq_free(h);
        return sparq_err(SPARQ_E_NOMEM, "threads transport: out of memory");
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->size = size;
    for (int r = 0; r < size; r++) {
        tt *x = sparq_calloc(1, sizeof *x);
        if (!x) {
            for (int q = 0; q < r; q++) th_close(out[q]); /* the last one frees the hub */
            if (r == 0) {
                pthread_mutex_destroy(&h->mu);
                pthread_cond_destroy(&h->cv);
                sparq_free(h->head), sparq_free(h->tail), sparq_free(h);
            }
            return sparq_err(SPARQ_E_NOMEM, "threads transport: out of memory");
        }
        x->t.vt = &threads_vt;
        x->t.name = "threads";
        x->t.one_process = true;
        x->t.rank = r;
        x->t.size = size;
        x->h = h;
        h->open++;
        out[r] = &x->t;
    }
    return SPARQ_OK;
}
