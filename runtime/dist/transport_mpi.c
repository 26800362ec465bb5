/* runtime/dist/transport_mpi.c — the transport over MPI (OpenMPI from Debian).
 *
 * Point-to-point only, on a private duplicate of MPI_COMM_WORLD with
 * MPI_ERRORS_RETURN, so a failure becomes a sparq_status with a message
 * instead of MPI's default abort. Waits are MPI_Test loops with a deadline:
 * they spin briefly (latency), then sleep 50 µs between tests, so an idle
 * rank does not steal a core from a busy one on an oversubscribed box (the
 * mpi test suite runs 3 ranks on 2 cores). While any rank other than 0
 * waits, it answers rank 0's liveness pings; rank 0 uses them after a
 * timeout to name the rank that stopped answering. The other direction:
 * after keepalive(), a thread of rank 0 sends every other rank a heartbeat
 * every timeout / 4 (MPI_THREAD_MULTIPLE), and a rank that has heard nothing
 * from rank 0 for a whole timeout ends its wait naming it — even the idle
 * wait for the next request, which has no deadline of its own. allgather is
 * one Isend / Irecv per peer (tag SQ_TAG_GATHER) and the same kind of test
 * loop over all of them, so a piece that does not come names its rank. */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/dist/transport.h"

enum { TAG_PING = 100, TAG_PONG = 101, TAG_HEARTBEAT = 102 };

typedef struct mpi_transport {
    sq_transport base;
    MPI_Comm comm;
    MPI_Request send_req[SQ_TRANSPORT_SLOTS];
    int send_dst[SQ_TRANSPORT_SLOTS];
    MPI_Request ping_req; /* ranks > 0: a posted receive for rank 0's ping */
    int ping_buf;
    bool we_initialized;
    bool thread_multiple; /* MPI_THREAD_MULTIPLE provided: keepalive can run */
    /* keepalive, ranks > 0: a posted receive of rank 0's heartbeat, when it last came */
    double live_timeout;  /* > 0: expect rank 0's heartbeat */
    double last_heard;
    MPI_Request hb_req;
    int hb_buf;
    /* keepalive, rank 0: the heartbeat thread and its sends (one per rank) */
    pthread_t hb_thread;
    bool hb_running, hb_stop;
    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cv;
    double hb_period;
    MPI_Request *hb_send;
    MPI_Request *ag_req;  /* allgather: [size] receives, then [size] sends */
} mpi_transport;

static const char *mpi_errstr(int rc, char buf[MPI_MAX_ERROR_STRING])
{
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return buf;
}

#define MPI_TRY(call, ...)                                                                        \
    do {                                                                                          \
        int rc_ = (call);                                                                         \
        if (rc_ != MPI_SUCCESS) {                                                                 \
            char eb_[MPI_MAX_ERROR_STRING];                                                       \
            char what_[256];                                                                      \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                           \
            return sparq_err(SPARQ_E_COMM, "rank %d: %s: %s", t->base.rank, what_, mpi_errstr(rc_, eb_)); \
        }                                                                                         \
    } while (0)

static void service_pings(mpi_transport *t)
{
    if (t->hb_req != MPI_REQUEST_NULL) { /* rank 0's heartbeat */
        int got = 0;
        while (t->hb_req != MPI_REQUEST_NULL && MPI_Test(&t->hb_req, &got, MPI_STATUS_IGNORE) == MPI_SUCCESS && got) {
            t->last_heard = sparq_now();
            MPI_Irecv(&t->hb_buf, 1, MPI_INT, 0, TAG_HEARTBEAT, t->comm, &t->hb_req);
        }
    }
    if (t->ping_req == MPI_REQUEST_NULL) return;
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&t->ping_req, &flag, &st) != MPI_SUCCESS || !flag) return;
    int pong = t->base.rank;
    MPI_Send(&pong, 1, MPI_INT, st.MPI_SOURCE, TAG_PONG, t->comm);
    MPI_Irecv(&t->ping_buf, 1, MPI_INT, 0, TAG_PING, t->comm, &t->ping_req);
}

/* Between tests of a pending request: spin for the first 50 µs (a reply
 * between boxes is often that close), then yield the core until 2 ms (an
 * oversubscribed box runs another rank meanwhile; a dedicated one comes
 * straight back), then sleep 50 µs at a time (an idle rank costs nothing). */
static void nap(double waited_s)
{
    if (waited_s < 50e-6) return;
    if (waited_s < 2e-3) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

/* Wait for *r with a deadline (timeout_s < 0: none), answering pings. */
static sparq_status wait_req(mpi_transport *t, MPI_Request *r, MPI_Status *st, double timeout_s, const char *what,
                             int peer)
{
    const double t0 = sparq_now();
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(r, &flag, st);
        if (rc != MPI_SUCCESS) {
            char eb[MPI_MAX_ERROR_STRING];
            t->base.t_wait += sparq_now() - t0;
            return sparq_err(SPARQ_E_COMM, "rank %d: %s rank %d failed: %s", t->base.rank, what, peer,
                             mpi_errstr(rc, eb));
        }
        if (flag) break;
        service_pings(t);
        const double el = sparq_now() - t0;
        if (t->live_timeout > 0 && sparq_now() - t->last_heard > t->live_timeout) {
            t->base.t_wait += el;
            return sparq_err(SPARQ_E_TIMEOUT,
                             "rank %d: %s rank %d: rank 0 has said nothing for %.1f s (no heartbeat within the "
                             "--timeout of %.1f s): rank 0 is stopped, hung or dead", t->base.rank, what, peer,
                             sparq_now() - t->last_heard, t->live_timeout);
        }
        if (timeout_s >= 0 && el > timeout_s) {
            t->base.t_wait += el;
            return sparq_err(SPARQ_E_TIMEOUT, "rank %d: %s rank %d: nothing after %.1f s (the --timeout)",
                             t->base.rank, what, peer, el);
        }
        nap(el);
    }
    t->base.t_wait += sparq_now() - t0;
    return SPARQ_OK;
}

static sparq_status m_isend(sq_transport *bt, int dst, int tag, const void *buf, size_t n, int slot)
{
    mpi_transport *t = (mpi_transport *)bt;
    RETURN_IF(slot < 0 || slot >= SQ_TRANSPORT_SLOTS || t->send_req[slot] != MPI_REQUEST_NULL, SPARQ_E_STATE,
              "rank %d: send slot %d busy", bt->rank, slot);
    RETURN_IF(n > (size_t)INT32_MAX, SPARQ_E_RANGE, "rank %d: message of %zu bytes is too large", bt->rank, n);
    MPI_TRY(MPI_Isend(buf, (int)n, MPI_BYTE, dst, tag, t->comm, &t->send_req[slot]), "send %zu bytes to rank %d", n,
            dst);
    t->send_dst[slot] = dst;
    bt->bytes_sent += n;
    bt->msgs_sent++;
    return SPARQ_OK;
}

static sparq_status m_wait_send(sq_transport *bt, int slot, double timeout_s)
{
    mpi_transport *t = (mpi_transport *)bt;
    if (slot < 0 || slot >= SQ_TRANSPORT_SLOTS || t->send_req[slot] == MPI_REQUEST_NULL) return SPARQ_OK;
    MPI_Status st;
    return wait_req(t, &t->send_req[slot], &st, timeout_s, "sending to", t->send_dst[slot]);
}

static bool m_send_done(sq_transport *bt, int slot)
{
    mpi_transport *t = (mpi_transport *)bt;
    if (slot < 0 || slot >= SQ_TRANSPORT_SLOTS || t->send_req[slot] == MPI_REQUEST_NULL) return true;
    int flag = 0;
    if (MPI_Test(&t->send_req[slot], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true; /* wait_send reports it */
    service_pings(t);
    return flag != 0;
}

static sparq_status m_recv(sq_transport *bt, int src, int tag, void *buf, size_t cap, size_t *got, double timeout_s)
{
    mpi_transport *t = (mpi_transport *)bt;
    MPI_Request r;
    MPI_Status st;
    int ncap = cap > (size_t)INT32_MAX ? INT32_MAX : (int)cap;
    MPI_TRY(MPI_Irecv(buf, ncap, MPI_BYTE, src, tag, t->comm, &r), "receive from rank %d", src);
    sparq_status s = wait_req(t, &r, &st, timeout_s, "waiting for", src);
    if (s != SPARQ_OK) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
        return s;
    }
    /* (a message larger than cap fails in MPI_Test with MPI_ERR_TRUNCATE, reported by wait_req) */
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    *got = (size_t)count;
    return SPARQ_OK;
}

static sparq_status m_bcast(sq_transport *bt, int root, void *buf, size_t n)
{
    mpi_transport *t = (mpi_transport *)bt;
    RETURN_IF(n > (size_t)INT32_MAX, SPARQ_E_RANGE, "broadcast of %zu bytes is too large", n);
    MPI_TRY(MPI_Bcast(buf, (int)n, MPI_BYTE, root, t->comm), "broadcast from rank %d", root);
    return SPARQ_OK;
}

static sparq_status m_gather(sq_transport *bt, const void *mine, size_t n, void *all)
{
    mpi_transport *t = (mpi_transport *)bt;
    RETURN_IF(n > (size_t)INT32_MAX, SPARQ_E_RANGE, "gather of %zu bytes is too large", n);
    MPI_TRY(MPI_Gather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, 0, t->comm), "gather to rank 0");
    return SPARQ_OK;
}

static sparq_status m_allgather(sq_transport *bt, const void *mine, size_t n, void *all, double timeout_s)
{
    mpi_transport *t = (mpi_transport *)bt;
    const int N = bt->size, me = bt->rank;
    RETURN_IF(n > (size_t)INT32_MAX, SPARQ_E_RANGE, "rank %d: all-gather of %zu bytes is too large", me, n);
    char *const base = all;
    memmove(base + (size_t)me * n, mine, n);
    if (N == 1) return SPARQ_OK;
    MPI_Request *rq = t->ag_req;
    for (int r = 0; r < N; r++) {
        rq[r] = rq[N + r] = MPI_REQUEST_NULL;
        if (r == me) continue;
        MPI_TRY(MPI_Irecv(base + (size_t)r * n, (int)n, MPI_BYTE, r, SQ_TAG_GATHER, t->comm, &rq[r]),
                "all-gather: receive from rank %d", r);
        MPI_TRY(MPI_Isend(base + (size_t)me * n, (int)n, MPI_BYTE, r, SQ_TAG_GATHER, t->comm, &rq[N + r]),
                "all-gather: send to rank %d", r);
    }
    bt->bytes_sent += (uint64_t)n * (uint64_t)(N - 1);
    bt->msgs_sent += (uint64_t)(N - 1);
    const double t0 = sparq_now();
    sparq_status st = SPARQ_OK;
    for (;;) {
        int missing = -1; /* the lowest rank whose piece (or whose receipt of ours) is still pending */
        for (int i = 0; i < 2 * N && st == SPARQ_OK; i++) {
            if (rq[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            const int rc = MPI_Test(&rq[i], &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) {
                char eb[MPI_MAX_ERROR_STRING];
                st = sparq_err(SPARQ_E_COMM, "rank %d: all-gather with rank %d failed: %s", me, i % N,
                               mpi_errstr(rc, eb));
            } else if (!flag && (missing < 0 || i % N < missing)) {
                missing = i % N;
            }
        }
        if (st != SPARQ_OK || missing < 0) break;
        service_pings(t);
        const double el = sparq_now() - t0;
        if (t->live_timeout > 0 && sparq_now() - t->last_heard > t->live_timeout)
            st = sparq_err(SPARQ_E_TIMEOUT,
                           "rank %d: all-gather: rank 0 has said nothing for %.1f s (no heartbeat within the "
                           "--timeout of %.1f s): rank 0 is stopped, hung or dead", me, sparq_now() - t->last_heard,
                           t->live_timeout);
        else if (timeout_s >= 0 && el > timeout_s)
            st = sparq_err(SPARQ_E_TIMEOUT, "rank %d: all-gather of %zu bytes: nothing from rank %d after %.1f s "
                           "(the --timeout): rank %d is stopped, hung or dead", me, n, missing, el, missing);
        if (st != SPARQ_OK) break;
        nap(el);
    }
    bt->t_wait += sparq_now() - t0;
    if (st != SPARQ_OK) /* the job is about to end: drop what is still pending */
        for (int i = 0; i < 2 * N; i++)
            if (rq[i] != MPI_REQUEST_NULL) {
                if (i < N) MPI_Cancel(&rq[i]);
                MPI_Request_free(&rq[i]);
            }
    return st;
}

static int m_find_silent(sq_transport *bt, double wait_s)
{
    mpi_transport *t = (mpi_transport *)bt;
    const int n = bt->size;
    if (bt->rank != 0 || n <= 1) return -1;
    MPI_Request *rq = sparq_calloc((size_t)n * 2, sizeof *rq);
    int *pong = sparq_calloc((size_t)n, sizeof *pong);
    if (!rq || !pong) {
        sparq_free(rq);
        sparq_free(pong);
        return -1;
    }
    int ping = 0;
    for (int r = 1; r < n; r++) {
        MPI_Isend(&ping, 1, MPI_INT, r, TAG_PING, t->comm, &rq[2 * r]);
        MPI_Irecv(&pong[r], 1, MPI_INT, r, TAG_PONG, t->comm, &rq[2 * r + 1]);
    }
    const double t0 = sparq_now();
    int silent = -1;
    for (;;) {
        silent = -1;
        for (int r = n - 1; r >= 1; r--) {
            int flag = 1;
            if (rq[2 * r + 1] != MPI_REQUEST_NULL) MPI_Test(&rq[2 * r + 1], &flag, MPI_STATUS_IGNORE);
            if (!flag) silent = r;
        }
        const double el = sparq_now() - t0;
        if (silent < 0 || el > wait_s) break;
        nap(el);
    }
    /* the job is about to be aborted: leave the unanswered requests */
    sparq_free(rq);
    sparq_free(pong);
    return silent;
}

/* Rank 0's heartbeat thread: a one-int message to every other rank each
 * period (a rank whose previous heartbeat is still undelivered is skipped). */
static void *heartbeat_main(void *arg)
{
    mpi_transport *t = arg;
    static const int beat = 0;
    pthread_mutex_lock(&t->hb_mu);
    while (!t->hb_stop) {
        for (int r = 1; r < t->base.size; r++) {
            int done = 1;
            if (t->hb_send[r] != MPI_REQUEST_NULL) MPI_Test(&t->hb_send[r], &done, MPI_STATUS_IGNORE);
            if (done) MPI_Isend(&beat, 1, MPI_INT, r, TAG_HEARTBEAT, t->comm, &t->hb_send[r]);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + t->hb_period;
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        while (!t->hb_stop && pthread_cond_timedwait(&t->hb_cv, &t->hb_mu, &ts) == 0) {}
    }
    pthread_mutex_unlock(&t->hb_mu);
    return NULL;
}

static void m_keepalive(sq_transport *bt, double timeout_s)
{
    mpi_transport *t = (mpi_transport *)bt;
    if (bt->size <= 1 || !(timeout_s > 0) || !t->thread_multiple || t->live_timeout > 0 || t->hb_running) return;
    if (bt->rank != 0) {
        t->live_timeout = timeout_s;
        t->last_heard = sparq_now();
        MPI_Irecv(&t->hb_buf, 1, MPI_INT, 0, TAG_HEARTBEAT, t->comm, &t->hb_req);
        return;
    }
    t->hb_send = sparq_malloc((size_t)bt->size * sizeof *t->hb_send);
    if (!t->hb_send) return; /* no heartbeat: the others would stop after a timeout, so they must not expect one */
    for (int r = 0; r < bt->size; r++) t->hb_send[r] = MPI_REQUEST_NULL;
    t->hb_period = timeout_s / 4;
    pthread_mutex_init(&t->hb_mu, NULL);
    pthread_cond_init(&t->hb_cv, NULL);
    t->hb_running = pthread_create(&t->hb_thread, NULL, heartbeat_main, t) == 0;
}

/* Rank 0: stop the heartbeat thread and settle its sends. */
static void heartbeat_stop(mpi_transport *t)
{
    if (t->hb_running) {
        pthread_mutex_lock(&t->hb_mu);
        t->hb_stop = true;
        pthread_cond_signal(&t->hb_cv);
        pthread_mutex_unlock(&t->hb_mu);
        pthread_join(t->hb_thread, NULL);
        t->hb_running = false;
        pthread_cond_destroy(&t->hb_cv);
        pthread_mutex_destroy(&t->hb_mu);
    }
    for (int r = 0; t->hb_send && r < t->base.size; r++) {
        const double t0 = sparq_now();
        int done = 0;
        while (t->hb_send[r] != MPI_REQUEST_NULL && MPI_Test(&t->hb_send[r], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
               !done && sparq_now() - t0 < 2.0)
            nap(sparq_now() - t0);
        if (t->hb_send[r] != MPI_REQUEST_NULL) {
            MPI_Cancel(&t->hb_send[r]);
            MPI_Request_free(&t->hb_send[r]);
        }
    }
    sparq_free(t->hb_send);
    t->hb_send = NULL;
}

static void m_abort(sq_transport *bt, int code)
{
    (void)bt;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void m_close(sq_transport *bt)
{
    mpi_transport *t = (mpi_transport *)bt;
    heartbeat_stop(t);
    for (int s = 0; s < SQ_TRANSPORT_SLOTS; s++)
        if (t->send_req[s] != MPI_REQUEST_NULL) MPI_Wait(&t->send_req[s], MPI_STATUS_IGNORE);
    /* every rank reaches close; after this barrier no ping or heartbeat can be sent */
    MPI_Barrier(t->comm);
    if (t->ping_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&t->ping_req);
        MPI_Wait(&t->ping_req, MPI_STATUS_IGNORE);
    }
    if (t->hb_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&t->hb_req);
        MPI_Wait(&t->hb_req, MPI_STATUS_IGNORE);
    }
    for (int flag = 1; t->live_timeout > 0 && flag;) { /* heartbeats nobody received */
        flag = 0;
        if (MPI_Iprobe(0, TAG_HEARTBEAT, t->comm, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (flag) MPI_Recv(&t->hb_buf, 1, MPI_INT, 0, TAG_HEARTBEAT, t->comm, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&t->comm);
    int fin = 0;
    MPI_Finalized(&fin);
    if (t->we_initialized && !fin) MPI_Finalize();
    sparq_free(t->ag_req);
    sparq_free(t);
}

static const sq_transport_vt mpi_vt = {.isend = m_isend, .wait_send = m_wait_send, .send_done = m_send_done,
                                       .recv = m_recv, .bcast = m_bcast, .gather = m_gather,
                                       .allgather = m_allgather, .find_silent = m_find_silent, .abort = m_abort,
                                       .close = m_close, .keepalive = m_keepalive};

sparq_status sq_transport_mpi(sq_transport **out)
{
    *out = NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    bool we = false;
    if (!inited) {
        /* MULTIPLE: rank 0's heartbeat thread sends while the main thread works */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return sparq_err(SPARQ_E_COMM, "MPI_Init_thread failed (was this started by mpirun?)");
        we = true;
    } else {
        MPI_Query_thread(&provided);
    }
    mpi_transport *t = sparq_calloc(1, sizeof *t);
    RETURN_IF(!t, SPARQ_E_NOMEM, "transport: out of memory");
    t->base.vt = &mpi_vt;
    t->base.name = "mpi";
    t->we_initialized = we;
    t->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    for (int s = 0; s < SQ_TRANSPORT_SLOTS; s++) t->send_req[s] = MPI_REQUEST_NULL;
    t->ping_req = MPI_REQUEST_NULL;
    t->hb_req = MPI_REQUEST_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
    MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(t->comm, &t->base.rank);
    MPI_Comm_size(t->comm, &t->base.size);
    t->ag_req = sparq_calloc(2 * (size_t)t->base.size, sizeof *t->ag_req);
    if (!t->ag_req) {
        MPI_Comm_free(&t->comm);
        sparq_free(t);
        return sparq_err(SPARQ_E_NOMEM, "transport: out of memory");
    }
    if (t->base.rank != 0) MPI_Irecv(&t->ping_buf, 1, MPI_INT, 0, TAG_PING, t->comm, &t->ping_req);
    *out = &t->base;
    return SPARQ_OK;
}
