/* runtime/serve/conns.h — the stage of `sparq serve` that accepts connections
 * and reads their requests, before any of them takes a worker or a queue place.
 *
 * One thread (the caller of sq_conns_step) polls the listening socket and
 * every connection still sending its request, and reads each without
 * blocking (sq_http_reader), so a client that sends half a request and waits
 * costs a descriptor and a buffer, never a worker. Its callback sees a
 * request twice: when its headers are in (answer it there — /health, an API
 * key refused, an unknown path — and its body is never waited for) and when
 * it is whole (the callback then takes the socket for a worker, or answers).
 *
 * Limits: the headers must be in within header_timeout of the accept and the
 * whole request within request_timeout (else 408, or a silent close if
 * nothing came); at most max_open connections are held (read, or lingering
 * after an answer): one more closes the one open longest, answered 503.
 * After an answer the socket is shut for writing and what the client still
 * sends is read and dropped (up to 2 s, 16 MiB), so it gets the answer rather
 * than a reset (a 413 to a client still sending its body). Answers written
 * from this thread are small (under 2 KiB), which a socket's send buffer
 * always takes at once. */
#ifndef SPARQ_RUNTIME_CONNS_H
#define SPARQ_RUNTIME_CONNS_H

#include "common/status.h"
#include "runtime/serve/http.h"

typedef struct sq_conns sq_conns;

typedef struct sq_conns_opts {
    int max_open;           /* connections held at once (≥ 1) */
    double header_timeout;  /* seconds from the accept to the end of the headers */
    double request_timeout; /* seconds from the accept to the end of the body */
} sq_conns_opts;

typedef enum sq_conn_event {
    SQ_CONN_HEADERS, /* the headers are in (req has no body yet) */
    SQ_CONN_REQUEST, /* the whole request is in; *buf holds it (req->body points into it) */
} sq_conn_event;

typedef enum sq_conn_verdict {
    SQ_CONN_GO_ON,    /* HEADERS: read the body (a "100 Continue" is sent if the client asked) */
    SQ_CONN_ANSWERED, /* a response was written: close gracefully */
    SQ_CONN_TAKEN,    /* REQUEST: the callback owns fd and *buf now (closes and frees them) */
} sq_conn_verdict;

typedef sq_conn_verdict (*sq_conn_fn)(void *ctx, int fd, sq_conn_event ev, const sq_http_request *req, char **buf);

/* Serve the listening socket lfd (made non-blocking; the caller still owns
 * it) with callback fn(ctx, ...). */
sparq_status sq_conns_create(sq_conns **out, int lfd, const sq_conns_opts *o, sq_conn_fn fn, void *ctx);
/* One round: wait at most wait_s for a new connection, bytes or a deadline;
 * accept, read, answer, time out. A signal ends the wait early (SPARQ_OK). */
sparq_status sq_conns_step(sq_conns *c, double wait_s);
/* Connections held now (being read or lingering). */
int sq_conns_open(const sq_conns *c);
/* Close every connection held, free. Safe with NULL. */
void sq_conns_free(sq_conns *c);

#endif
