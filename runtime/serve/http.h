/* runtime/serve/http.h — the small HTTP/1.1 subset `sparq serve` speaks.
 *
 * One request per connection (every response says `Connection: close`),
 * bodies only with Content-Length (chunked request bodies are refused with
 * 501), `Expect: 100-continue` answered, headers and body bounded. The parser
 * is a pure function over a byte buffer, so it can be fuzzed
 * (tests/fuzz/fuzz_http.c); the socket helpers around it add timeouts and
 * full writes. Responses are either whole (Content-Length) or a server-sent
 * event stream ended by closing the connection. */
#ifndef SPARQ_RUNTIME_HTTP_H
#define SPARQ_RUNTIME_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

#define SQ_HTTP_MAX_HEADER (16u * 1024) /* request line + headers */
#define SQ_HTTP_MAX_BODY (4u << 20)

typedef struct sq_http_request {
    char method[16];      /* "GET", "POST", ... */
    char path[1024];      /* the target without its query string */
    int minor;            /* HTTP/1.minor */
    size_t content_length;
    bool expect_continue; /* the client waits for "100 Continue" before the body */
    char auth[512];       /* the Authorization header's value ("" if none) */
    const char *body;     /* into the parsed buffer; body_len bytes (not NUL-terminated) */
    size_t body_len;
    size_t header_len;    /* bytes of request line and headers, blank line included */
} sq_http_request;

/* Parse one request from buf[0..len). Returns the request's total size in
 * bytes (> 0) when it is complete; 0 when more bytes are needed (if the
 * headers are complete, req is filled and req->expect_continue may be set);
 * or −status (−400, −413, −414, −431, −501, −505) when it is malformed, with
 * *why a static message saying what is wrong. An unfinished line is refused
 * as soon as no ending could make it valid (a control byte, a bad method), so
 * a prefix of a good request is always 0. */
long sq_http_parse(const char *buf, size_t len, sq_http_request *req, const char **why);

/* The reason phrase of a status code ("OK", "Bad Request", ...). */
const char *sq_http_reason(int status);

/* One request read without blocking: what the server's connection loop
 * (conns.h) keeps for each connection, and what sq_http_read drives with poll. */
typedef struct sq_http_reader {
    char *buf;          /* sparq_malloc'ed, n bytes read (NUL-terminated once done) */
    size_t n, cap;
    bool headers_seen;  /* SQ_HTTP_HEADERS was returned */
    sq_http_request req;
} sq_http_reader;

typedef enum sq_http_progress {
    SQ_HTTP_MORE,    /* nothing more to read now: wait until fd is readable, then step again */
    SQ_HTTP_HEADERS, /* the headers are in (req filled but the body): returned once; step again */
    SQ_HTTP_DONE,    /* the whole request is in req (its body inside buf) */
    SQ_HTTP_BAD,     /* malformed, too large, out of memory, or the client closed its side
                      * mid-request: answer *status (*why says why) */
    SQ_HTTP_GONE,    /* closed before sending a byte, or the socket failed: nothing to answer */
} sq_http_progress;

/* Read what fd has now (recv with MSG_DONTWAIT, a few times at most) into the
 * reader r (zeroed to start) and say how far the request is. */
sq_http_progress sq_http_reader_step(sq_http_reader *r, int fd, int *status, const char **why);
/* Free r's buffer and zero it. */
void sq_http_reader_free(sq_http_reader *r);
/* The interim "100 Continue" a client that sent `Expect: 100-continue` waits for. */
sparq_status sq_http_continue(int fd);

/* Read one request from socket fd into *buf (grown as needed; the caller
 * frees it with sparq_free), waiting at most timeout_s in total. Returns
 * SPARQ_OK with req filled; SPARQ_E_FORMAT with *status set (400...) for a
 * malformed request; SPARQ_E_TIMEOUT, or SPARQ_E_IO when the peer closed or
 * the socket failed (*status 0: nothing to answer). */
sparq_status sq_http_read(int fd, double timeout_s, char **buf, sq_http_request *req, int *status);

/* Write all of data (retrying short writes and EINTR, never raising SIGPIPE). */
sparq_status sq_http_send(int fd, const void *data, size_t len);
/* A whole response: status line, Content-Type, Content-Length, Connection: close, body. */
sparq_status sq_http_respond(int fd, int status, const char *content_type, const char *body, size_t len);
/* Start a server-sent event stream (200, text/event-stream), then send events
 * as "data: <text>\n\n"; the stream ends when the connection is closed. */
sparq_status sq_http_sse_begin(int fd);
sparq_status sq_http_sse_event(int fd, const char *text);

#endif
