/* runtime/serve/http.c — see http.h. The parser walks the request line and the
 * header lines once, keeps only what the server needs, and decides every
 * malformed case with a status code and a message; the socket helpers add a
 * deadline (poll) and full writes (send with MSG_NOSIGNAL). */
#include "runtime/serve/http.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "common/alloc.h"
#include "common/progress.h"

static bool is_tchar(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static long fail(const char **why, const char *msg, int status)
{
    *why = msg;
    return -(long)status;
}

/* A control byte where none may be: anywhere on the request line, in a header
 * line anything below 0x20 but tab (a CR only as the line's last byte). */
static bool bad_ctl(const char *s, size_t l, bool request_line)
{
    for (size_t i = 0; i < l; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == 0x7F || (c < 0x20 && !(c == '\t' && !request_line))) return true;
    }
    return false;
}

/* The start of a line whose end has not arrived: malformed already? Only what
 * the whole line would be refused for with 400 whatever follows (so a prefix of
 * a good request always waits for more): a control byte, a method that is not
 * 1..15 capital letters, a folded header line. A NUL-only request is answered at once. */
static long partial_line(const char *s, size_t l, bool request_line, const char **why)
{
    if (l && s[l - 1] == '\r') l--; /* the LF may follow */
    if (bad_ctl(s, l, request_line))
        return fail(why, request_line ? "control character in the request line" : "control character in a header line", 400);
    if (!request_line) return l && (s[0] == ' ' || s[0] == '\t') ? fail(why, "folded header lines are not allowed", 400) : 0;
    size_t i = 0;
    while (i < l && i < 16 && s[i] >= 'A' && s[i] <= 'Z') i++;
    if (i < l && (i == 0 || i >= 16 || s[i] != ' '))
        return fail(why, "malformed request line: expected METHOD /path HTTP/1.x", 400);
    return 0;
}

static long parse_request_line(const char *s, size_t l, sq_http_request *req, const char **why)
{
    if (bad_ctl(s, l, true)) return fail(why, "control character in the request line", 400);
    size_t i = 0;
    while (i < l && s[i] >= 'A' && s[i] <= 'Z') i++;
    if (i == 0 || i >= sizeof req->method || i >= l || s[i] != ' ')
        return fail(why, "malformed request line: expected METHOD /path HTTP/1.x", 400);
    memcpy(req->method, s, i);
    const size_t t0 = ++i;
    while (i < l && s[i] != ' ') {
        if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7F) return fail(why, "control character in the request target", 400);
        i++;
    }
    const size_t tl = i - t0;
    if (tl == 0 || s[t0] != '/') return fail(why, "the request target must be a path starting with '/'", 400);
    if (i >= l) return fail(why, "malformed request line: no HTTP version", 400);
    size_t pl = 0;
    while (pl < tl && s[t0 + pl] != '?') pl++;
    if (pl >= sizeof req->path) return fail(why, "request path longer than 1023 bytes", 414);
    memcpy(req->path, s + t0, pl);
    const char *v = s + i + 1;
    const size_t vl = l - i - 1;
    if (vl == 8 && memcmp(v, "HTTP/1.", 7) == 0 && (v[7] == '0' || v[7] == '1')) {
        req->minor = v[7] - '0';
        return 0;
    }
    if (vl >= 5 && memcmp(v, "HTTP/", 5) == 0) return fail(why, "only HTTP/1.0 and HTTP/1.1 are supported", 505);
    return fail(why, "malformed request line: bad HTTP version", 400);
}

static bool name_is(const char *name, size_t nl, const char *want)
{
    return strlen(want) == nl && strncasecmp(name, want, nl) == 0;
}

static long parse_header(const char *s, size_t l, sq_http_request *req, bool *have_length, const char **why)
{
    if (s[0] == ' ' || s[0] == '\t') return fail(why, "folded header lines are not allowed", 400);
    size_t nl = 0;
    while (nl < l && s[nl] != ':') {
        if (!is_tchar((unsigned char)s[nl])) return fail(why, "malformed header name", 400);
        nl++;
    }
    if (nl == 0 || nl == l) return fail(why, "malformed header line: expected 'Name: value'", 400);
    size_t v0 = nl + 1, v1 = l;
    while (v0 < v1 && (s[v0] == ' ' || s[v0] == '\t')) v0++;
    while (v1 > v0 && (s[v1 - 1] == ' ' || s[v1 - 1] == '\t')) v1--;
    for (size_t i = v0; i < v1; i++)
        if (((unsigned char)s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7F)
            return fail(why, "control character in a header value", 400);
    const char *v = s + v0;
    const size_t vl = v1 - v0;
    if (name_is(s, nl, "content-length")) {
        if (vl == 0 || vl > 18) return fail(why, "bad Content-Length", vl > 18 ? 413 : 400);
        size_t n = 0;
        for (size_t i = 0; i < vl; i++) {
            if (v[i] < '0' || v[i] > '9') return fail(why, "bad Content-Length: not a decimal number", 400);
            n = n * 10 + (size_t)(v[i] - '0');
        }
        if (*have_length && n != req->content_length) return fail(why, "two different Content-Length headers", 400);
        if (n > SQ_HTTP_MAX_BODY) return fail(why, "request body larger than 4 MiB", 413);
        req->content_length = n;
        *have_length = true;
    } else if (name_is(s, nl, "transfer-encoding")) {
        return fail(why, "chunked request bodies are not supported: send Content-Length", 501);
    } else if (name_is(s, nl, "expect")) {
        if (!(vl == 12 && strncasecmp(v, "100-continue", 12) == 0))
            return fail(why, "unsupported Expect header (only 100-continue)", 417);
        req->expect_continue = true;
    } else if (name_is(s, nl, "authorization")) {
        if (vl >= sizeof req->auth) return fail(why, "Authorization header longer than 511 bytes", 431);
        memcpy(req->auth, v, vl);
        req->auth[vl] = 0;
    }
    return 0;
}

long sq_http_parse(const char *buf, size_t len, sq_http_request *req, const char **why)
{
    static const char *const none = "";
    memset(req, 0, sizeof *req);
    *why = none;
    const size_t lim = len < SQ_HTTP_MAX_HEADER ? len : SQ_HTTP_MAX_HEADER;
    size_t pos = 0;
    bool have_length = false;
    for (int line = 0;; line++) {
        const char *nl = memchr(buf + pos, '\n', lim - pos);
        if (!nl) {
            const long r = partial_line(buf + pos, lim - pos, line == 0, why);
            if (r < 0) return r;
            return len >= SQ_HTTP_MAX_HEADER ? fail(why, "request headers longer than 16 KiB", 431) : 0;
        }
        const size_t end = (size_t)(nl - buf);
        size_t l = end - pos;
        if (l && buf[end - 1] == '\r') l--;
        const char *s = buf + pos;
        pos = end + 1;
        long r;
        if (line == 0) r = parse_request_line(s, l, req, why);
        else if (l == 0) break;
        else r = parse_header(s, l, req, &have_length, why);
        if (r < 0) return r;
    }
    req->header_len = pos;
    if (len - pos < req->content_length) return 0;
    req->body = buf + pos;
    req->body_len = req->content_length;
    return (long)(pos + req->content_length);
}

const char *sq_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

sparq_status sq_http_send(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        const ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        RETURN_IF(w <= 0, SPARQ_E_IO, "http: sending the response failed: %s", w < 0 ? strerror(errno) : "closed");
        p += w;
        len -= (size_t)w;
    }
    return SPARQ_OK;
}

sparq_status sq_http_continue(int fd)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    return sq_http_send(fd, cont, sizeof cont - 1);
}

void sq_http_reader_free(sq_http_reader *r)
{
    sparq_free(r->buf);
    memset(r, 0, sizeof *r);
}

sq_http_progress sq_http_reader_step(sq_http_reader *r, int fd, int *status, const char **why)
{
    *status = 0;
    *why = "";
    for (int reads = 0;; reads++) {
        sq_http_request *q = &r->req;
        if (!r->headers_seen || r->n >= q->header_len + q->content_length) {
            const long p = sq_http_parse(r->buf ? r->buf : "", r->n, q, why);
            if (p < 0) {
                *status = (int)-p;
                return SQ_HTTP_BAD;
            }
            if (q->header_len && !r->headers_seen) {
                r->headers_seen = true;
                return SQ_HTTP_HEADERS;
            }
            if (p > 0) {
                r->buf[r->n] = 0;
                return SQ_HTTP_DONE;
            }
        }
        if (reads == 4) return SQ_HTTP_MORE; /* the others' turn; the socket stays readable */
        const size_t need = r->headers_seen ? q->header_len + q->content_length : r->n + 4096;
        if (need + 1 > r->cap) {
            size_t nc = r->cap ? r->cap : 2048;
            while (nc < need + 1) nc *= 2;
            char *nb = sparq_realloc(r->buf, nc);
            if (!nb) {
                *status = 500;
                *why = "out of memory for the request";
                return SQ_HTTP_BAD;
            }
            r->buf = nb, r->cap = nc;
        }
        const ssize_t got = recv(fd, r->buf + r->n, r->cap - 1 - r->n, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return SQ_HTTP_MORE;
        if (got < 0) {
            *why = "the client's connection failed";
            return SQ_HTTP_GONE;
        }
        if (got == 0 && r->n == 0) {
            *why = "the client closed the connection";
            return SQ_HTTP_GONE;
        }
        if (got == 0) {
            *status = 400;
            *why = r->headers_seen ? "the client closed its side before the whole body (Content-Length)"
                                   : "the client closed its side before the end of the headers";
            return SQ_HTTP_BAD;
        }
        r->n += (size_t)got;
    }
}

sparq_status sq_http_read(int fd, double timeout_s, char **buf, sq_http_request *req, int *status)
{
    sq_http_reader r;
    memset(&r, 0, sizeof r);
    *buf = NULL;
    const double deadline = sparq_now() + timeout_s;
    for (;;) {
        const char *why;
        const sq_http_progress p = sq_http_reader_step(&r, fd, status, &why);
        sparq_status st = SPARQ_OK;
        if (p == SQ_HTTP_DONE) {
            *req = r.req;
            *buf = r.buf;
            return SPARQ_OK;
        } else if (p == SQ_HTTP_HEADERS) {
            if (!r.req.expect_continue || (st = sq_http_continue(fd)) == SPARQ_OK) continue;
        } else if (p == SQ_HTTP_BAD) {
            st = sparq_err(*status == 500 ? SPARQ_E_NOMEM : SPARQ_E_FORMAT, "http: %s", why);
        } else if (p == SQ_HTTP_GONE) {
            st = sparq_err(SPARQ_E_IO, "http: %s", why);
        } else {
            const double left = deadline - sparq_now();
            struct pollfd pfd = {fd, POLLIN, 0};
            const int pr = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
            if (pr != 0) continue; /* readable, EINTR, or an error the next read reports */
            *status = r.n ? 408 : 0;
            st = sparq_err(SPARQ_E_TIMEOUT, "http: no complete request within %.0f s", timeout_s);
        }
        sq_http_reader_free(&r);
        return st;
    }
}

sparq_status sq_http_respond(int fd, int status, const char *content_type, const char *body, size_t len)
{
    char head[256];
    const int hl = snprintf(head, sizeof head,
                            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n"
                            "Server: sparq\r\n\r\n",
                            status, sq_http_reason(status), content_type, len);
    FORWARD_IF(sq_http_send(fd, head, (size_t)hl));
    return len ? sq_http_send(fd, body, len) : SPARQ_OK;
}

sparq_status sq_http_sse_begin(int fd)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                               "Connection: close\r\nServer: sparq\r\n\r\n";
    return sq_http_send(fd, head, sizeof head - 1);
}

sparq_status sq_http_sse_event(int fd, const char *text)
{
    FORWARD_IF(sq_http_send(fd, "data: ", 6));
    FORWARD_IF(sq_http_send(fd, text, strlen(text)));
    return sq_http_send(fd, "\n\n", 2);
}
