/* tests/runtime/test_http.c — the HTTP request parser (runtime/serve/http.h) on
 * whole, partial, pipelined and malformed requests (unfinished lines no ending
 * can save refused at once), the socket readers over a socketpair (timeouts,
 * Expect: 100-continue, a peer that hangs up or shuts its side mid-body), and
 * the connection loop (runtime/serve/conns.h) over loopback: a request taken
 * whole, the header and request timeouts, the connection cap, and an answer a
 * client still sending its body receives without a reset. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/serve/conns.h"
#include "runtime/serve/http.h"
#include "t.h"

static long parse(const char *s, sq_http_request *r)
{
    const char *why;
    return sq_http_parse(s, strlen(s), r, &why);
}

static void test_whole(void)
{
    sq_http_request r;
    const char *req = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                      "authorization:   Bearer k  \r\n\r\nhelloEXTRA";
    const long n = parse(req, &r);
    CHECK_EQ_INT(n, (long)strlen(req) - 5); /* pipelined bytes after the body are not part of it */
    CHECK(strcmp(r.method, "POST") == 0);
    CHECK(strcmp(r.path, "/v1/completions") == 0);
    CHECK_EQ_INT(r.minor, 1);
    CHECK_EQ_INT(r.body_len, 5);
    CHECK(memcmp(r.body, "hello", 5) == 0);
    CHECK(strcmp(r.auth, "Bearer k") == 0);
    CHECK(!r.expect_continue);
    /* LF-only line ends and HTTP/1.0, no body */
    CHECK_EQ_INT(parse("GET /health HTTP/1.0\n\n", &r), 22);
    CHECK(strcmp(r.path, "/health") == 0);
    CHECK_EQ_INT(r.minor, 0);
    CHECK_EQ_INT(r.body_len, 0);
}

static void test_partial(void)
{
    sq_http_request r;
    const char *req = "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\nabcd";
    const size_t len = strlen(req);
    const char *why;
    for (size_t cut = 0; cut < len; cut++) {
        const long n = sq_http_parse(req, cut, &r, &why);
        CHECK_MSG(n == 0, "prefix of %zu bytes: %ld", cut, n);
        if (cut >= len - 4) CHECK(r.expect_continue && r.header_len == len - 4); /* headers complete */
    }
    CHECK_EQ_INT(sq_http_parse(req, len, &r, &why), (long)len);
}

static void test_malformed(void)
{
#define C(req, want) {req, sizeof req - 1, want}
    static const struct {
        const char *req;
        size_t len; /* sizeof: a NUL may be part of the request */
        long want;
    } cases[] = {
        C("get / HTTP/1.1\r\n\r\n", -400),
        C("GET\r\n\r\n", -400),
        C("GET  / HTTP/1.1\r\n\r\n", -400),
        C("GET nope HTTP/1.1\r\n\r\n", -400),
        C("GET / HTTP/2.0\r\n\r\n", -505),
        C("GET / FTP/1.1\r\n\r\n", -400),
        C("GET /\x01 HTTP/1.1\r\n\r\n", -400),
        C("POST / HTTP/1.1\r\nContent-Length: 12a\r\n\r\n", -400),
        C("POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", -413),
        C("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", -400),
        C("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", -501),
        C("POST / HTTP/1.1\r\nExpect: something\r\n\r\n", -417),
        C("GET / HTTP/1.1\r\nNo colon here\r\n\r\n", -400),
        C("GET / HTTP/1.1\r\n: empty name\r\n\r\n", -400),
        C("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", -400),
        C("GET / HTTP/1.1\r\nA: b\x7f\r\n\r\n", -400),
        C("\r\nGET / HTTP/1.1\r\n\r\n", -400),
        C("GET / HTTP/1.1\t\r\n\r\n", -400),
        /* unfinished lines that no ending can make valid: refused at once */
        C("\0\0\0\0", -400),
        C("garbage", -400),
        C("GETTINGVERYLONGMETHOD", -400),
        C("GET /\0", -400),
        C("GET / HTTP/1.1\r\nHost: a\0", -400),
        C("GET / HTTP/1.1\r\n folded", -400),
        C("GET / HTTP/1.1\r\nA: b\rc", -400),
    };
#undef C
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sq_http_request r;
        const char *why = NULL;
        const long n = sq_http_parse(cases[i].req, cases[i].len, &r, &why);
        CHECK_MSG(n == cases[i].want, "case %zu: got %ld, want %ld", i, n, cases[i].want);
        CHECK(why && why[0]);
    }
    /* a path of 1024 bytes: 414; headers over 16 KiB: 431 */
    char *big = sparq_malloc(SQ_HTTP_MAX_HEADER + 64);
    memset(big, 'a', SQ_HTTP_MAX_HEADER + 63);
    memcpy(big, "GET /", 5);
    strcpy(big + 5 + 1023, " HTTP/1.1\r\n\r\n"); /* a path of 1024 bytes */
    sq_http_request r;
    CHECK_EQ_INT(parse(big, &r), -414);
    memset(big, 'a', SQ_HTTP_MAX_HEADER + 63);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    big[SQ_HTTP_MAX_HEADER + 63] = 0;
    CHECK_EQ_INT(parse(big, &r), -431);
    sparq_free(big);
    CHECK(strcmp(sq_http_reason(413), "Content Too Large") == 0);
}

static void test_read(void)
{
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    /* Expect: 100-continue gets its interim answer before the body is sent */
    const char head[] = "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n";
    CHECK(write(sv[1], head, sizeof head - 1) == (ssize_t)(sizeof head - 1));
    pid_t pid = fork();
    if (pid == 0) { /* the client: wait for 100 Continue, then send the body */
        char got[64] = {0};
        struct pollfd p = {sv[1], POLLIN, 0};
        if (poll(&p, 1, 5000) == 1 && read(sv[1], got, sizeof got - 1) > 0 && strstr(got, "100 Continue"))
            (void)!write(sv[1], "{}", 2);
        _exit(0);
    }
    char *buf = NULL;
    sq_http_request r;
    int status = -1;
    CHECK(sq_http_read(sv[0], 5, &buf, &r, &status) == SPARQ_OK);
    waitpid(pid, NULL, 0);
    CHECK_EQ_INT(r.body_len, 2);
    CHECK(r.body && memcmp(r.body, "{}", 2) == 0);
    sparq_free(buf);
    /* a client that sends half a request and waits: 408 after the timeout */
    CHECK(write(sv[1], "GET /he", 7) == 7);
    buf = NULL;
    CHECK(sq_http_read(sv[0], 0.2, &buf, &r, &status) == SPARQ_E_TIMEOUT);
    CHECK_EQ_INT(status, 408);
    CHECK(buf == NULL);
    /* a client that hangs up mid-request: nothing to answer */
    close(sv[1]);
    CHECK(sq_http_read(sv[0], 1, &buf, &r, &status) == SPARQ_E_IO);
    CHECK_EQ_INT(status, 0);
    /* a malformed request: its status */
    int sp2[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp2) == 0);
    CHECK(write(sp2[1], "GET / HTTP/3\r\n\r\n", 16) == 16);
    CHECK(sq_http_read(sp2[0], 1, &buf, &r, &status) == SPARQ_E_FORMAT);
    CHECK_EQ_INT(status, 505);
    /* a response is written whole */
    CHECK(sq_http_respond(sp2[0], 404, "application/json", "{}", 2) == SPARQ_OK);
    char out[256] = {0};
    CHECK(read(sp2[1], out, sizeof out - 1) > 0);
    CHECK(strncmp(out, "HTTP/1.1 404 Not Found\r\n", 24) == 0);
    CHECK(strstr(out, "Content-Length: 2\r\n") && strstr(out, "\r\n\r\n{}"));
    close(sp2[0]);
    close(sp2[1]);
    close(sv[0]);
}

static void test_reader(void)
{
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    sq_http_reader r;
    memset(&r, 0, sizeof r);
    int status;
    const char *why;
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_MORE); /* nothing yet: never blocks */
    const char head[] = "POST /v1/completions HTTP/1.1\r\nContent-Length: 6\r\n\r\n{\"a\"";
    CHECK(write(sv[1], head, sizeof head - 1) == (ssize_t)(sizeof head - 1));
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_HEADERS);
    CHECK(r.req.content_length == 6 && strcmp(r.req.path, "/v1/completions") == 0);
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_MORE);
    CHECK(write(sv[1], ":1}", 3) == 3);
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_DONE);
    CHECK(r.req.body_len == 6 && memcmp(r.req.body, "{\"a\":1}", 6) == 0);
    sq_http_reader_free(&r);
    /* the client shuts its side with the body short of its Content-Length: 400, not silence */
    CHECK(write(sv[1], head, sizeof head - 1) == (ssize_t)(sizeof head - 1));
    shutdown(sv[1], SHUT_WR);
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_HEADERS);
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_BAD);
    CHECK_EQ_INT(status, 400);
    CHECK(strstr(why, "Content-Length"));
    sq_http_reader_free(&r);
    close(sv[0]);
    close(sv[1]);
    /* NUL bytes only: 400 at once */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK(write(sv[1], "\0\0\0\0\0\0\0\0", 8) == 8);
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_BAD);
    CHECK_EQ_INT(status, 400);
    sq_http_reader_free(&r);
    /* the peer closes before a byte: nothing to answer */
    close(sv[1]);
    CHECK(sq_http_reader_step(&r, sv[0], &status, &why) == SQ_HTTP_GONE);
    CHECK_EQ_INT(status, 0);
    sq_http_reader_free(&r);
    close(sv[0]);
}

/* --- the connection loop (conns.h) over loopback ------------------------- */

typedef struct seen {
    int headers, requests;
    char body[64];
    int taken_fd;
} seen;

/* /answer is answered at its headers (413), /take is taken whole, the rest read on. */
static sq_conn_verdict on_conn(void *ctx, int fd, sq_conn_event ev, const sq_http_request *req, char **buf)
{
    seen *s = ctx;
    if (ev == SQ_CONN_HEADERS) {
        s->headers++;
        if (strcmp(req->path, "/answer") != 0) return SQ_CONN_GO_ON;
        (void)sq_http_respond(fd, 413, "text/plain", "no\n", 3);
        return SQ_CONN_ANSWERED;
    }
    s->requests++;
    snprintf(s->body, sizeof s->body, "%.*s", (int)req->body_len, req->body);
    if (strcmp(req->path, "/take") != 0) {
        (void)sq_http_respond(fd, 200, "text/plain", "ok\n", 3);
        return SQ_CONN_ANSWERED;
    }
    s->taken_fd = fd;
    sparq_free(*buf);
    *buf = NULL;
    return SQ_CONN_TAKEN;
}

static int loopback_listener(int *port)
{
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static int dial(int port, const char *data, size_t len)
{
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    if (len && write(fd, data, len) != (ssize_t)len) return -1;
    return fd;
}

/* What the server sent until it closed ("" if nothing; "<reset>" appended on a reset). */
static void reply(int fd, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 3000) != 1) break;
        char tmp[4096];
        const ssize_t got = read(fd, tmp, sizeof tmp);
        if (got < 0) snprintf(out + n, cap - n, "<reset>");
        if (got <= 0) break;
        const size_t k = (size_t)got < cap - 1 - n ? (size_t)got : cap - 1 - n;
        memcpy(out + n, tmp, k);
        n += k;
        out[n] = 0;
    }
    close(fd);
}

static void steps(sq_conns *cs, double seconds)
{
    const double end = sparq_now() + seconds;
    while (sparq_now() < end) CHECK(sq_conns_step(cs, 0.02) == SPARQ_OK);
}

static void test_conns(void)
{
    int port = 0;
    const int lfd = loopback_listener(&port);
    CHECK(lfd >= 0);
    seen s = {0, 0, "", -1};
    sq_conns *cs = NULL;
    const sq_conns_opts o = {4, 0.3, 0.6};
    CHECK(sq_conns_create(&cs, lfd, &o, on_conn, &s) == SPARQ_OK);
    char out[8192];

    /* a whole request is taken by the callback with its body; a silent connection is closed
     * without an answer at the header timeout, a half-open one answered 408 */
    const char req[] = "POST /take HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    const int a = dial(port, req, sizeof req - 1);
    const int silent = dial(port, NULL, 0);
    const int half = dial(port, "GET /x HTTP/1.1\r\n", 17);
    const int body = dial(port, "POST /x HTTP/1.1\r\nContent-Length: 9\r\n\r\nab", 43);
    steps(cs, 0.1);
    CHECK(s.requests == 1 && s.taken_fd >= 0 && strcmp(s.body, "hello") == 0);
    CHECK_EQ_INT(sq_conns_open(cs), 3);
    if (s.taken_fd >= 0) {
        (void)sq_http_respond(s.taken_fd, 200, "text/plain", "taken\n", 6);
        close(s.taken_fd);
    }
    reply(a, out, sizeof out);
    CHECK(strstr(out, "200 OK") && strstr(out, "taken"));
    const double t0 = sparq_now();
    steps(cs, 0.4);
    reply(half, out, sizeof out);
    CHECK_MSG(strncmp(out, "HTTP/1.1 408", 12) == 0 && strstr(out, "--header-timeout"), "%s", out);
    CHECK(sparq_now() - t0 < 1.0);
    reply(silent, out, sizeof out);
    CHECK_MSG(out[0] == 0, "a silent connection gets nothing: %s", out);
    steps(cs, 0.3); /* the body's deadline: --request-timeout */
    reply(body, out, sizeof out);
    CHECK_MSG(strncmp(out, "HTTP/1.1 408", 12) == 0 && strstr(out, "--request-timeout"), "%s", out);
    steps(cs, 0.05);

    /* full (4): one more closes the one open longest, answered 503 */
    int c[5];
    for (int i = 0; i < 5; i++) {
        c[i] = dial(port, "GET /x HTTP/1.1\r\n", 17);
        steps(cs, 0.02);
    }
    CHECK_EQ_INT(sq_conns_open(cs), 4);
    reply(c[0], out, sizeof out);
    CHECK_MSG(strncmp(out, "HTTP/1.1 503", 12) == 0 && strstr(out, "max-connections"), "%s", out);
    for (int i = 1; i < 5; i++) close(c[i]);
    steps(cs, 0.05);
    CHECK_EQ_INT(sq_conns_open(cs), 0);

    /* answered at its headers while the client still sends a 2 MiB body: the client can send
     * it all and reads the answer, no reset */
    const pid_t pid = fork();
    if (pid == 0) {
        static char big[2u << 20];
        memset(big, 'x', sizeof big);
        char h[128];
        const int hl = snprintf(h, sizeof h, "POST /answer HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", sizeof big);
        const int fd = dial(port, h, (size_t)hl);
        size_t sent = 0;
        while (fd >= 0 && sent < sizeof big) {
            const ssize_t w = send(fd, big + sent, sizeof big - sent, MSG_NOSIGNAL);
            if (w <= 0) break;
            sent += (size_t)w;
        }
        char got[256];
        reply(fd, got, sizeof got);
        _exit(sent == sizeof big && strncmp(got, "HTTP/1.1 413", 12) == 0 && !strstr(got, "<reset>") ? 0 : 1);
    }
    int wst = -1;
    for (int i = 0; i < 200 && waitpid(pid, &wst, WNOHANG) == 0; i++) steps(cs, 0.02);
    CHECK_MSG(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "a 413 to a client still sending: status %d", wst);
    sq_conns_free(cs);
    close(lfd);
}

int main(void)
{
    RUN(test_whole);
    RUN(test_partial);
    RUN(test_malformed);
    RUN(test_read);
    RUN(test_reader);
    RUN(test_conns);
    return t_summary();
}
