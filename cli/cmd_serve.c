/* cli/cmd_serve.c — `sparq serve MODEL`: an OpenAI-compatible HTTP server.
 *
 * Endpoints: GET /health, GET /v1/models, POST /v1/completions and
 * POST /v1/chat/completions (whole responses or server-sent event streams).
 * The HTTP subset is runtime/http.h, the request and response JSON
 * runtime/openai.h, generation runtime/session.h — so a chat's next turn only
 * prefills its new messages. Requests are served one at a time, in order of
 * arrival (the others wait in the listen queue): one model, one KV slot.
 *
 * Under mpirun (a bundle packed for N boxes) rank 0 listens and the other
 * ranks serve their pipeline stage, as for `sparq run`. SIGINT / SIGTERM
 * finish the request in progress, then stop; a model error answers 500 and
 * ends the server (the model's state can no longer be trusted). */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_cli.h"
#include "common/alloc.h"
#include "runtime/http.h"
#include "runtime/openai.h"
#include "runtime/session.h"

enum { O_HOST, O_PORT, O_NAME, O_MAXTOK, O_CTX, O_THREADS, O_DEVICE, O_TIMEOUT, O_REQTIMEOUT, O_API_KEY };
static const cli_opt opts[] = {
    [O_HOST] = {"host", 0, "ADDR", "address to listen on (default 127.0.0.1; 0.0.0.0 = every interface)"},
    [O_PORT] = {"port", 0, "N", "TCP port (default 8080; 0 = any free port, printed at start)"},
    [O_NAME] = {"model-name", 0, "NAME", "the model id /v1/models and responses report; requests may name any (default: MODEL's directory name)"},
    [O_MAXTOK] = {"max-tokens", 'n', "N", "tokens to generate when a request gives no max_tokens (default 512)"},
    [O_CTX] = {"ctx", 'c', "N", "context length to allocate the KV cache for (default 4096)"},
    [O_THREADS] = {"threads", 't', "N", "worker threads (default: all CPUs)"},
    [O_DEVICE] = {"device", 0, "cpu|cuda", "where the forward pass runs (default cpu; cuda: GPU 0, needs a CUDA build)"},
    [O_TIMEOUT] = {"timeout", 0, "SECONDS", "multi-process runs: longest wait for another rank before every rank "
                                            "stops with an error naming it (default 60)"},
    [O_REQTIMEOUT] = {"request-timeout", 0, "SECONDS", "time a client has to send its whole request (default 30)"},
    [O_API_KEY] = {"api-key", 0, "KEY", "require 'Authorization: Bearer KEY' on /v1 requests (default: the "
                                        "SPARQ_API_KEY environment variable; none = open)"},
    {0}};
static const cli_spec spec = {
    "serve", "MODEL [options]",
    "Serve MODEL (a Hugging Face model directory, an EXL3 model, or a bundle from `sparq pack`) over HTTP with "
    "the OpenAI API: /v1/completions, /v1/chat/completions (both with \"stream\": true), /v1/models, and /health. "
    "One request runs at a time. A bundle packed for N boxes runs as N processes: "
    "`mpirun -np N sparq serve BUNDLE`. docs/cli-serve.md lists the request fields.",
    opts,
    "examples:\n  sparq serve tests/data/tiny-qwen3moe --port 8080\n"
    "  curl -s localhost:8080/v1/completions -d '{\"prompt\": \"The file system\", \"max_tokens\": 32, "
    "\"temperature\": 0}'\n"
    "  mpirun -np 2 sparq serve bundle-2box --host 0.0.0.0\n"};

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

typedef struct server {
    sq_session sess;
    sq_tokenizer *tok;
    const char *name;
    const char *api_key;
    int default_max;
    double req_timeout;
    unsigned long long n_served;
    bool fatal;         /* a model error: stop serving */
} server;

static void respond_json(int fd, int status, char *json)
{
    if (json) (void)sq_http_respond(fd, status, "application/json", json, strlen(json));
    else (void)sq_http_respond(fd, 500, "text/plain", "out of memory\n", 14);
    sparq_free(json);
}

static void respond_error(int fd, int status, const char *msg, const char *param)
{
    respond_json(fd, status, sq_oai_error(status, msg, param));
}

/* --- one completion ------------------------------------------------------- */

typedef struct emitter {
    int fd;
    const sq_oai_request *req;
    const sq_oai_meta *meta;
    char *text;        /* everything generated so far (stop strings cut it) */
    size_t len, cap;
    size_t sent;       /* bytes of text already streamed */
    size_t hold;       /* longest stop string − 1: bytes held back while streaming */
    bool first;        /* the next chunk is the first */
    bool stopped;      /* a stop string ended it */
    bool io_failed;    /* the client went away */
} emitter;

static bool stream_upto(emitter *e, size_t upto)
{
    while (upto > e->sent && upto < e->len && (e->text[upto] & 0xC0) == 0x80) upto--; /* whole characters */
    if (upto <= e->sent) return true;
    char *chunk = sq_oai_chunk(e->req->kind, e->meta, e->text + e->sent, upto - e->sent, e->first,
                               SQ_OAI_FINISH_NONE, false, 0, 0);
    const bool ok = chunk && sq_http_sse_event(e->fd, chunk) == SPARQ_OK;
    sparq_free(chunk);
    e->first = false;
    e->sent = upto;
    if (!ok) e->io_failed = true;
    return ok;
}

static bool on_text(void *ctx, const char *piece, size_t n)
{
    emitter *e = ctx;
    if (e->len + n + 1 > e->cap) {
        size_t nc = e->cap ? e->cap : 256;
        while (nc < e->len + n + 1) nc *= 2;
        char *nt = sparq_realloc(e->text, nc);
        if (!nt) {
            e->io_failed = true;
            return false;
        }
        e->text = nt, e->cap = nc;
    }
    const size_t from = e->len > e->hold + n ? e->len - e->hold - n : 0; /* a stop string may start before piece */
    memcpy(e->text + e->len, piece, n);
    e->len += n;
    e->text[e->len] = 0;
    for (int i = 0; i < e->req->n_stop; i++) {
        const char *hit = strstr(e->text + from, e->req->stop[i]);
        if (hit) {
            e->len = (size_t)(hit - e->text);
            e->text[e->len] = 0;
            e->stopped = true;
        }
    }
    if (e->stopped) return false;
    if (e->req->stream && e->len > e->hold) return stream_upto(e, e->len - e->hold);
    return true;
}

static sparq_status prompt_ids(server *sv, const sq_oai_request *rq, int32_t **ids, int *n)
{
    if (rq->kind == SQ_OAI_COMPLETION)
        return sq_session_encode(&sv->sess, rq->prompt, sq_tokenizer_add_bos(sv->tok), ids, n);
    char *text = NULL;
    FORWARD_IF(sq_chat_apply(sv->tok, rq->msgs, rq->n_msgs, true, &text));
    const sparq_status st = sq_session_encode(&sv->sess, text, false, ids, n);
    sparq_free(text);
    return st;
}

static void complete(server *sv, int fd, const sq_http_request *hr, sq_oai_kind kind)
{
    sq_oai_request rq;
    const char *param = NULL;
    sparq_status st = sq_oai_parse(hr->body, hr->body_len, kind, &rq, &param);
    if (st != SPARQ_OK) {
        respond_error(fd, st == SPARQ_E_NOMEM ? 500 : 400, sparq_errmsg(), param);
        return;
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    st = prompt_ids(sv, &rq, &ids, &n_ids);
    const int ctx = sq_dist_options(sv->sess.model)->ctx;
    if (st == SPARQ_OK && n_ids == 0) st = sparq_err(SPARQ_E_ARG, "the prompt is empty");
    if (st == SPARQ_OK && n_ids >= ctx)
        st = sparq_err(SPARQ_E_RANGE, "the prompt is %d tokens; the server's context is %d (sparq serve --ctx)",
                       n_ids, ctx);
    if (st != SPARQ_OK) {
        respond_error(fd, st == SPARQ_E_NOMEM ? 500 : 400, sparq_errmsg(), kind == SQ_OAI_CHAT ? "messages" : "prompt");
        sparq_free(ids);
        sq_oai_request_free(&rq);
        return;
    }
    const int max_new = rq.max_tokens >= 0 ? rq.max_tokens : sv->default_max;
    if (!rq.has_seed) rq.sampler.seed = (uint64_t)time(NULL) ^ (sv->n_served * 0x9E3779B97F4A7C15ull);

    char id[48];
    snprintf(id, sizeof id, "%s-%llx%04llx", kind == SQ_OAI_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             sv->n_served & 0xFFFF);
    const sq_oai_meta meta = {id, sv->name, (long long)time(NULL)};
    emitter e = {.fd = fd, .req = &rq, .meta = &meta, .first = true};
    for (int i = 0; i < rq.n_stop; i++) {
        const size_t l = strlen(rq.stop[i]);
        if (l - 1 > e.hold) e.hold = l - 1;
    }
    sq_session_out out = {0};
    st = sq_session_set_sampler(&sv->sess, &rq.sampler);
    if (st == SPARQ_OK && rq.stream && sq_http_sse_begin(fd) != SPARQ_OK) e.io_failed = true;
    if (st == SPARQ_OK && !e.io_failed)
        st = max_new > 0 ? sq_session_generate(&sv->sess, ids, n_ids, max_new, rq.sampler.seed, on_text, &e, &out)
                         : SPARQ_OK;
    const sq_oai_finish fin = e.stopped || out.eos ? SQ_OAI_FINISH_STOP : SQ_OAI_FINISH_LENGTH;
    if (st != SPARQ_OK) {
        sv->fatal = st != SPARQ_E_RANGE;
        if (!rq.stream) respond_error(fd, 500, sparq_errmsg(), NULL);
        else if (!e.io_failed) {
            char *err = sq_oai_error(500, sparq_errmsg(), NULL);
            if (err) (void)sq_http_sse_event(fd, err);
            sparq_free(err);
        }
    } else if (!rq.stream) {
        respond_json(fd, 200, sq_oai_response(kind, &meta, e.text ? e.text : "", e.len, fin, n_ids, out.n_new));
    } else if (!e.io_failed && stream_upto(&e, e.len)) {
        char *last = sq_oai_chunk(kind, &meta, "", 0, e.first, fin, false, 0, 0);
        char *usage = rq.include_usage ? sq_oai_chunk(kind, &meta, "", 0, false, fin, true, n_ids, out.n_new) : NULL;
        if (last && sq_http_sse_event(fd, last) == SPARQ_OK && (!usage || sq_http_sse_event(fd, usage) == SPARQ_OK))
            (void)sq_http_sse_event(fd, "[DONE]");
        sparq_free(last);
        sparq_free(usage);
    }
    sparq_free(e.text);
    sparq_free(ids);
    sq_oai_request_free(&rq);
}

/* --- one connection ------------------------------------------------------- */

static void handle(server *sv, int fd)
{
    const struct timeval tv = {30, 0}; /* a client that stops reading cannot hold the server forever */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char *buf = NULL;
    sq_http_request hr;
    int status = 0;
    if (sq_http_read(fd, sv->req_timeout, &buf, &hr, &status) != SPARQ_OK) {
        if (status) respond_error(fd, status, sparq_errmsg(), NULL);
        return;
    }
    const bool get = !strcmp(hr.method, "GET"), post = !strcmp(hr.method, "POST");
    const bool v1 = !strncmp(hr.path, "/v1/", 4);
    char want[600];
    snprintf(want, sizeof want, "Bearer %s", sv->api_key ? sv->api_key : "");
    if (!strcmp(hr.path, "/health") && get) {
        static const char ok[] = "{\"status\":\"ok\"}";
        (void)sq_http_respond(fd, 200, "application/json", ok, sizeof ok - 1);
    } else if (v1 && sv->api_key && strcmp(hr.auth, want) != 0) {
        respond_error(fd, 401, hr.auth[0] ? "wrong API key" : "this server needs 'Authorization: Bearer <key>'", NULL);
    } else if (!strcmp(hr.path, "/v1/models") && get) {
        respond_json(fd, 200, sq_oai_models(sv->name, (long long)time(NULL)));
    } else if (!strcmp(hr.path, "/v1/completions") && post) {
        complete(sv, fd, &hr, SQ_OAI_COMPLETION);
    } else if (!strcmp(hr.path, "/v1/chat/completions") && post) {
        complete(sv, fd, &hr, SQ_OAI_CHAT);
    } else if (!strcmp(hr.path, "/health") || !strcmp(hr.path, "/v1/models") || !strcmp(hr.path, "/v1/completions") ||
               !strcmp(hr.path, "/v1/chat/completions")) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s is not allowed on %s", hr.method, hr.path);
        respond_error(fd, 405, msg, NULL);
    } else {
        char msg[1100];
        snprintf(msg, sizeof msg, "no such endpoint: %s (try /v1/completions, /v1/chat/completions, /v1/models)",
                 hr.path);
        respond_error(fd, 404, msg, NULL);
    }
    sv->n_served++;
    sparq_free(buf);
}

static int listen_on(const char *host, const char *port, char *shown, size_t shown_len)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    const int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) {
        sparq_err(SPARQ_E_ARG, "--host %s --port %s: %s", host, port, gai_strerror(gai));
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        sparq_err(SPARQ_E_IO, "cannot listen on %s port %s: %s", host, port, strerror(err));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char hbuf[NI_MAXHOST], pbuf[NI_MAXSERV];
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, hbuf, sizeof hbuf, pbuf, sizeof pbuf, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(shown, shown_len, strchr(hbuf, ':') ? "[%s]:%s" : "%s:%s", hbuf, pbuf);
    else
        snprintf(shown, shown_len, "%s:%s", host, port);
    return fd;
}

int cmd_serve(int argc, char **argv)
{
    cli_args a;
    const char *v;
    int id;
    const char *host = "127.0.0.1", *name = NULL, *api_key = getenv("SPARQ_API_KEY");
    long long port = 8080, max_tok = 512, ctx = 4096, threads = 0;
    double timeout = 60, req_timeout = 30;
    sq_device device = SQ_DEVICE_CPU;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        bool ok = true;
        switch (id) {
        case O_HOST: host = v; break;
        case O_PORT: ok = cli_parse_int(&spec, "port", v, 0, 65535, &port); break;
        case O_NAME: name = v; break;
        case O_MAXTOK: ok = cli_parse_int(&spec, "max-tokens", v, 1, 1 << 24, &max_tok); break;
        case O_CTX: ok = cli_parse_int(&spec, "ctx", v, 2, 1 << 24, &ctx); break;
        case O_THREADS: ok = cli_parse_int(&spec, "threads", v, 1, 4096, &threads); break;
        case O_DEVICE: ok = sq_device_parse(v, &device) == SPARQ_OK || cli_usage_error(&spec, "--device: expected cpu or cuda") != 2; break;
        case O_TIMEOUT: ok = cli_parse_double(&spec, "timeout", v, 0.1, 1e6, &timeout); break;
        case O_REQTIMEOUT: ok = cli_parse_double(&spec, "request-timeout", v, 0.1, 1e6, &req_timeout); break;
        case O_API_KEY: api_key = v; break;
        }
        if (!ok) return 2;
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expected one MODEL directory");
    if (api_key && (!api_key[0] || strlen(api_key) > 500)) return cli_usage_error(&spec, "--api-key: 1 to 500 characters");
    const char *dir = a.pos[0];
    char dname[256];
    if (!name) {
        size_t l = strlen(dir);
        while (l > 1 && dir[l - 1] == '/') l--;
        size_t b = l;
        while (b > 0 && dir[b - 1] != '/') b--;
        snprintf(dname, sizeof dname, "%.*s", (int)(l - b), dir + b);
        name = dname;
    }

    const cli_model_args ma = {(int)ctx, (int)threads, 1, device, timeout};
    server sv = {.name = name, .api_key = api_key, .default_max = (int)max_tok, .req_timeout = req_timeout};
    sq_transport *tr = NULL;
    sq_dist *model = NULL;
    const int started = cli_dist_start(&spec, dir, &ma, &tr, &model, &sv.tok);
    if (started >= 0) return started;

    sq_sampler_params sp;
    sq_sampler_params_default(&sp);
    sparq_status st = sq_session_init(&sv.sess, model, sv.tok, &sp, true);
    char portstr[16], shown[300];
    snprintf(portstr, sizeof portstr, "%lld", port);
    const int lfd = st == SPARQ_OK ? listen_on(host, portstr, shown, sizeof shown) : -1;
    if (st == SPARQ_OK && lfd < 0) st = SPARQ_E_IO;
    int rc = 0;
    if (st == SPARQ_OK) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop; /* no SA_RESTART: poll returns EINTR */
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        fprintf(stderr, "sparq serve: %s on http://%s (OpenAI API under /v1; Ctrl-C stops)\n", name, shown);
        while (!stop_requested && !sv.fatal) {
            struct pollfd pfd = {lfd, POLLIN, 0};
            if (poll(&pfd, 1, 1000) <= 0) continue;
            const int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (cfd < 0) continue;
            handle(&sv, cfd);
            close(cfd);
        }
        close(lfd);
        if (sv.fatal) rc = cli_dist_fail(&spec, tr, SPARQ_E_STATE);
        else fprintf(stderr, "sparq serve: stopped after %llu requests; decode %ld tokens in %.3f s\n", sv.n_served,
                     sv.sess.n_decode, sv.sess.t_decode);
    } else {
        rc = cli_dist_fail(&spec, tr, st);
    }
    sq_session_free(&sv.sess);
    sq_dist_close(model);
    sq_tokenizer_free(sv.tok);
    sq_transport_close(tr);
    return rc;
}
