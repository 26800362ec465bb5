/* runtime/serve/conns.c — see conns.h. The connections live in one array
 * (removal swaps in the last); each round builds the poll set from it (the
 * listening socket first), services the ready ones and those past their
 * deadline from the end backwards (so a removal never skips one), then
 * accepts. */
#include "runtime/serve/conns.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/serve/openai.h"

#define LINGER_S 2.0
#define LINGER_BYTES (16u << 20)
#define ACCEPTS_PER_ROUND 64

typedef struct conn {
    int fd;
    bool lingering;        /* answered: dropping what the client still sends */
    double t_open, t_end;  /* the accept; the end of lingering */
    size_t dropped;
    sq_http_reader rd;
} conn;

struct sq_conns {
    int lfd;
    sq_conns_opts o;
    sq_conn_fn fn;
    void *ctx;
    conn *c;
    int n;
    struct pollfd *pfd;    /* [max_open + 1] */
    double accept_after;   /* out of descriptors: accept again from then on */
};

static void drop(sq_conns *cs, int i, bool close_fd)
{
    if (close_fd) close(cs->c[i].fd);
    sq_http_reader_free(&cs->c[i].rd);
    cs->c[i] = cs->c[--cs->n];
}

static void answer(int fd, int status, const char *msg)
{
    char *json = sq_oai_error(status, msg, NULL);
    if (json) (void)sq_http_respond(fd, status, "application/json", json, strlen(json));
    sparq_free(json);
}

/* After an answer: no more writing; read and drop what comes until the client closes. */
static void linger(sq_conns *cs, int i, double now)
{
    conn *c = &cs->c[i];
    shutdown(c->fd, SHUT_WR);
    sq_http_reader_free(&c->rd);
    c->lingering = true;
    c->t_end = now + LINGER_S;
}

static double deadline(const sq_conns *cs, const conn *c)
{
    if (c->lingering) return c->t_end;
    return c->t_open + (c->rd.headers_seen ? cs->o.request_timeout : cs->o.header_timeout);
}

/* Read and drop; false when the client has closed (or failed) or sent too much. */
static bool drain(conn *c)
{
    char scratch[16384];
    for (int k = 0; k < 16; k++) {
        const ssize_t got = recv(c->fd, scratch, sizeof scratch, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
        if (got == 0) return false;
        c->dropped += (size_t)got;
        if (c->dropped > LINGER_BYTES) return false;
    }
    return true;
}

/* Connection i is readable: read on, and hand what completes to the callback. */
static void progress(sq_conns *cs, int i, double now)
{
    conn *c = &cs->c[i];
    if (c->lingering) {
        if (!drain(c)) drop(cs, i, true);
        return;
    }
    for (;;) {
        int status;
        const char *why;
        const sq_http_progress p = sq_http_reader_step(&c->rd, c->fd, &status, &why);
        if (p == SQ_HTTP_MORE) return;
        if (p == SQ_HTTP_GONE) {
            drop(cs, i, true);
            return;
        }
        if (p == SQ_HTTP_BAD) {
            answer(c->fd, status, why);
            linger(cs, i, now);
            return;
        }
        if (p == SQ_HTTP_HEADERS) {
            if (cs->fn(cs->ctx, c->fd, SQ_CONN_HEADERS, &c->rd.req, NULL) == SQ_CONN_ANSWERED) {
                linger(cs, i, now);
                return;
            }
            if (c->rd.req.expect_continue && sq_http_continue(c->fd) != SPARQ_OK) {
                drop(cs, i, true);
                return;
            }
            continue;
        }
        /* SQ_HTTP_DONE */
        if (cs->fn(cs->ctx, c->fd, SQ_CONN_REQUEST, &c->rd.req, &c->rd.buf) == SQ_CONN_TAKEN) {
            c->rd.buf = NULL;
            drop(cs, i, false);
        } else {
            linger(cs, i, now);
        }
        return;
    }
}

static void expire(sq_conns *cs, int i, double now)
{
    conn *c = &cs->c[i];
    if (c->lingering || c->rd.n == 0) { /* nothing to answer */
        drop(cs, i, true);
        return;
    }
    char msg[160];
    if (c->rd.headers_seen)
        snprintf(msg, sizeof msg, "the request's body did not arrive within %g s (--request-timeout)", cs->o.request_timeout);
    else
        snprintf(msg, sizeof msg, "the request's headers did not arrive within %g s (--header-timeout)",
                 cs->o.header_timeout);
    answer(c->fd, 408, msg);
    linger(cs, i, now);
}

/* Room for one more: close a lingering connection, else the one open longest (answered 503). */
static void make_room(sq_conns *cs)
{
    int pick = 0;
    for (int i = 1; i < cs->n; i++) {
        const conn *a = &cs->c[i], *b = &cs->c[pick];
        if (a->lingering != b->lingering ? a->lingering : a->t_open < b->t_open) pick = i;
    }
    if (!cs->c[pick].lingering) {
        char msg[160];
        snprintf(msg, sizeof msg, "the server holds --max-connections %d connections; the one open longest was closed",
                 cs->o.max_open);
        answer(cs->c[pick].fd, 503, msg);
    }
    drop(cs, pick, true);
}

static void accept_some(sq_conns *cs, double now)
{
    for (int k = 0; k < ACCEPTS_PER_ROUND; k++) {
        const int fd = accept4(cs->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                cs->accept_after = now + 0.1; /* the listening socket stays readable: do not spin */
            return;
        }
        if (cs->n == cs->o.max_open) make_room(cs);
        conn *c = &cs->c[cs->n++];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->t_open = now;
    }
}

sparq_status sq_conns_step(sq_conns *cs, double wait_s)
{
    double now = sparq_now(), until = now + wait_s;
    const bool listen = now >= cs->accept_after;
    if (!listen && cs->accept_after < until) until = cs->accept_after;
    int np = 0;
    if (listen) cs->pfd[np++] = (struct pollfd){cs->lfd, POLLIN, 0};
    const int base = np;
    for (int i = 0; i < cs->n; i++) {
        const double d = deadline(cs, &cs->c[i]);
        if (d < until) until = d;
        cs->pfd[np++] = (struct pollfd){cs->c[i].fd, POLLIN, 0};
    }
    const double ms = (until - now) * 1000;
    const int pr = poll(cs->pfd, (nfds_t)np, ms <= 0 ? 0 : ms > 1e6 ? 1000000 : (int)ms + 1);
    if (pr < 0 && errno == EINTR) return SPARQ_OK;
    RETURN_IF(pr < 0, SPARQ_E_IO, "serve: poll over %d connections failed: %s", np, strerror(errno));
    now = sparq_now();
    for (int i = cs->n - 1; i >= 0; i--) { /* the poll set's order: i + base */
        if (cs->pfd[base + i].revents) progress(cs, i, now);
        if (i < cs->n && cs->c[i].fd == cs->pfd[base + i].fd && now >= deadline(cs, &cs->c[i])) expire(cs, i, now);
    }
    if (listen && (cs->pfd[0].revents & POLLIN)) accept_some(cs, now);
    return SPARQ_OK;
}

sparq_status sq_conns_create(sq_conns **out, int lfd, const sq_conns_opts *o, sq_conn_fn fn, void *ctx)
{
    *out = NULL;
    RETURN_IF(o->max_open < 1 || o->header_timeout <= 0 || o->request_timeout <= 0, SPARQ_E_ARG,
              "serve: bad connection limits (%d connections, %g s, %g s)", o->max_open, o->header_timeout,
              o->request_timeout);
    const int fl = fcntl(lfd, F_GETFL);
    RETURN_IF(fl < 0 || fcntl(lfd, F_SETFL, fl | O_NONBLOCK) != 0, SPARQ_E_IO, "serve: listening socket: %s",
              strerror(errno));
    sq_conns *cs = sparq_calloc(1, sizeof *cs);
    RETURN_IF(!cs, SPARQ_E_NOMEM, "out of memory");
    cs->c = sparq_calloc((size_t)o->max_open, sizeof *cs->c);
    cs->pfd = sparq_calloc((size_t)o->max_open + 1, sizeof *cs->pfd);
    if (!cs->c || !cs->pfd) {
        sq_conns_free(cs);
        return sparq_err(SPARQ_E_NOMEM, "out of memory for %d connections", o->max_open);
    }
    cs->lfd = lfd;
    cs->o = *o;
    if (cs->o.header_timeout > o->request_timeout) cs->o.header_timeout = o->request_timeout;
    cs->fn = fn;
    cs->ctx = ctx;
    *out = cs;
    return SPARQ_OK;
}

int sq_conns_open(const sq_conns *cs) { return cs->n; }

void sq_conns_free(sq_conns *cs)
{
    if (!cs) return;
    while (cs->n) drop(cs, cs->n - 1, true);
    sparq_free(cs->c);
    sparq_free(cs->pfd);
    sparq_free(cs);
}
