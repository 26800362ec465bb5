/* cli/cmd_serve.c — `sparq serve MODEL`: an OpenAI-compatible HTTP server.
 *
 * Endpoints: GET /health, GET /v1/models, POST /v1/completions and
 * POST /v1/chat/completions (whole responses or server-sent event streams).
 * The HTTP subset is runtime/serve/http.h, the request and response JSON
 * runtime/serve/openai.h, generation runtime/serve/sched.h: requests run concurrently in
 * the model's KV slots (--parallel), batched into one decode step, and a
 * chat's next turn only prefills its new messages.
 *
 * Threads: the main thread accepts connections and reads their requests
 * without blocking (runtime/serve/conns.h), answering at once what needs no
 * model (/health, /v1/models, errors, a refused API key) when the headers are
 * in; only a whole completion request gets a thread, which tokenizes, submits
 * a job and writes what the scheduler's engine thread produces. So clients
 * that send half a request hold no worker; completions beyond slots + queue
 * are answered 503.
 *
 * Under mpirun (a bundle packed for N boxes) rank 0 listens and the other
 * ranks serve their pipeline stage (or share of the experts), as for
 * `sparq run`. SIGINT / SIGTERM
 * stop accepting, let the running requests finish, then stop; a model error
 * ends the requests with 500 and the server with status 1. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_cli.h"
#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/serve/conns.h"
#include "runtime/serve/http.h"
#include "runtime/serve/openai.h"
#include "runtime/serve/sched.h"
#include "runtime/serve/session.h"

enum { O_HOST, O_PORT, O_NAME, O_MAXTOK, O_PARALLEL, O_QUEUE, O_CTX, O_THREADS, O_DEVICE, O_TIMEOUT, O_REQTIMEOUT,
       O_HDRTIMEOUT, O_MAXCONN, O_API_KEY, O_NO_VERIFY };
static const cli_opt opts[] = {
    [O_HOST] = {"host", 0, "ADDR", "address to listen on (default 127.0.0.1; 0.0.0.0 = every interface)"},
    [O_PORT] = {"port", 0, "N", "TCP port (default 8080; 0 = any free port, printed at start)"},
    [O_NAME] = {"model-name", 0, "NAME", "the model id /v1/models and responses report; requests may name any (default: MODEL's directory name)"},
    [O_MAXTOK] = {"max-tokens", 'n', "N", "tokens to generate when a request gives no max_tokens (default 512)"},
    [O_PARALLEL] = {"parallel", 0, "N", "requests generated at once, each in its own KV slot (default 4; a bundle: "
                                        "the users it was packed for, at most)"},
    [O_QUEUE] = {"queue", 0, "N", "requests that may wait for a slot; more completion requests get 503 (default 64)"},
    [O_CTX] = {"ctx", 'c', "N", "context length of each KV slot (default 4096, or a bundle's planned ctx, capped at "
                                "the model's max_position_embeddings; a larger N is refused)"},
    [O_THREADS] = {"threads", 't', "N", "worker threads (default: all CPUs)"},
    [O_DEVICE] = {"device", 0, "cpu|cuda", "where the forward pass runs (default cpu; cuda: GPU 0, needs a CUDA build)"},
    [O_TIMEOUT] = {"timeout", 0, "SECONDS", "multi-process runs: longest wait for another rank before every rank "
                                            "stops with an error naming it (default 60)"},
    [O_REQTIMEOUT] = {"request-timeout", 0, "SECONDS", "time a client has to send its whole request (default 30; then 408)"},
    [O_HDRTIMEOUT] = {"header-timeout", 0, "SECONDS", "time a client has to send its request line and headers "
                                                      "(default 5; then 408)"},
    [O_MAXCONN] = {"max-connections", 0, "N", "connections still sending their request held at once; one more closes "
                                              "the one open longest with 503 (default 1024; lowered to fit the open-file limit)"},
    [O_API_KEY] = {"api-key", 0, "KEY", "require 'Authorization: Bearer KEY' on /v1 requests (default: the "
                                        "SPARQ_API_KEY environment variable; none = open)"},
    [O_NO_VERIFY] = {"no-verify", 0, NULL, "a bundle: skip the XXH3 check of every block at load (for a copy already "
                                           "checked with `sparq verify`; sizes are still checked)"},
    {0}};
static const cli_spec spec = {
    "serve", "MODEL [options]",
    "Serve MODEL (a Hugging Face model directory, an EXL3 model, or a bundle from `sparq pack`) over HTTP with "
    "the OpenAI API: /v1/completions, /v1/chat/completions (both with \"stream\": true), /v1/models, and /health. "
    "Requests run concurrently, batched (--parallel). A bundle packed for N boxes runs as N processes: "
    "`mpirun -np N sparq serve BUNDLE`. docs/cli-serve.md lists the request fields.",
    opts,
    "examples:\n  sparq serve build/tests/data/tiny-qwen3moe --port 8080\n"
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
    sq_sched *sched;
    sq_tokenizer *tok;
    const char *name;
    const char *api_key;
    int default_max;
    pthread_mutex_t mu;        /* workers, served */
    pthread_cond_t cv;
    int workers, max_workers;  /* threads writing a completion: at most slots + queue */
    unsigned long long n_served, n_ids;
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

/* How often a worker looks whether its client has gone (docs/cli-serve.md promises half a second). */
#define GONE_CHECK_S 0.1

/* Whether the client has closed its end (a pending EOF or error). */
static bool client_gone(int fd)
{
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* --- one completion ------------------------------------------------------- */

static sparq_status prompt_ids(server *sv, const sq_oai_request *rq, int32_t **ids, int *n)
{
    if (rq->kind == SQ_OAI_COMPLETION) return sq_prompt_encode(sv->tok, rq->prompt, sq_tokenizer_add_bos(sv->tok), ids, n);
    char *text = NULL;
    FORWARD_IF(sq_chat_apply(sv->tok, rq->msgs, rq->n_msgs, true, &text));
    const sparq_status st = sq_prompt_encode(sv->tok, text, false, ids, n);
    sparq_free(text);
    return st;
}

static sq_oai_finish finish_of(sq_job_end e) { return e == SQ_JOB_LENGTH ? SQ_OAI_FINISH_LENGTH : SQ_OAI_FINISH_STOP; }

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
    sq_job *job = NULL;
    pthread_mutex_lock(&sv->mu);
    const unsigned long long serial = ++sv->n_ids;
    pthread_mutex_unlock(&sv->mu);
    st = prompt_ids(sv, &rq, &ids, &n_ids);
    if (st == SPARQ_OK) {
        if (!rq.has_seed) rq.sampler.seed = (uint64_t)time(NULL) ^ (serial * 0x9E3779B97F4A7C15ull);
        const sq_job_params jp = {ids, n_ids, rq.max_tokens >= 0 ? rq.max_tokens : sv->default_max, rq.sampler,
                                  (const char *const *)rq.stop, rq.n_stop};
        st = sq_sched_submit(sv->sched, &jp, &job);
    }
    sparq_free(ids);
    if (st != SPARQ_OK) {
        const int status = st == SPARQ_E_FIT || st == SPARQ_E_STATE ? 503 : st == SPARQ_E_NOMEM ? 500 : 400;
        respond_error(fd, status, sparq_errmsg(), status == 400 ? (kind == SQ_OAI_CHAT ? "messages" : "prompt") : NULL);
        sq_oai_request_free(&rq);
        return;
    }
    char id[48];
    snprintf(id, sizeof id, "%s-%llx%04llx", kind == SQ_OAI_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             serial & 0xFFFF);
    const sq_oai_meta meta = {id, sv->name, (long long)time(NULL)};
    bool alive = !rq.stream || sq_http_sse_begin(fd) == SPARQ_OK, first = true;
    char *all = NULL;
    size_t len = 0;
    sq_job_update u;
    double next_check = sparq_now() + GONE_CHECK_S;
    for (;;) {
        st = sq_job_next(job, GONE_CHECK_S, &u);
        const double now = sparq_now();
        if ((st == SPARQ_OK || st == SPARQ_E_TIMEOUT) && now >= next_check) { /* also while text flows */
            next_check = now + GONE_CHECK_S;
            if (client_gone(fd)) {
                if (st == SPARQ_OK) sparq_free(u.text);
                alive = false;
                sq_job_cancel(job);
                break;
            }
        }
        if (st == SPARQ_E_TIMEOUT) continue;
        if (st != SPARQ_OK) break;
        if (u.len && rq.stream) {
            char *chunk = sq_oai_chunk(kind, &meta, u.text, u.len, first, SQ_OAI_FINISH_NONE, false, 0, 0);
            alive = chunk && sq_http_sse_event(fd, chunk) == SPARQ_OK;
            sparq_free(chunk);
            first = false;
        } else if (u.len) {
            char *na = sparq_realloc(all, len + u.len + 1);
            if (na) {
                memcpy(na + len, u.text, u.len);
                all = na, len += u.len;
                all[len] = 0;
            } else {
                sparq_free(u.text);
                st = sparq_err(SPARQ_E_NOMEM, "out of memory for a %zu-byte completion", len + u.len);
                break;
            }
        }
        sparq_free(u.text);
        if (!alive) {
            sq_job_cancel(job);
            break;
        }
        if (u.end != SQ_JOB_RUNNING) break;
    }
    if (alive && st != SPARQ_OK) { /* out of memory while collecting the text */
        sq_job_cancel(job);
        if (!rq.stream) respond_error(fd, 500, sparq_errmsg(), NULL);
    } else if (alive && u.end == SQ_JOB_ERROR) {
        char *err = sq_oai_error(500, u.error, NULL);
        if (rq.stream && err) (void)sq_http_sse_event(fd, err);
        else respond_json(fd, 500, err), err = NULL;
        sparq_free(err);
    } else if (alive && !rq.stream) {
        respond_json(fd, 200, sq_oai_response(kind, &meta, all ? all : "", len, finish_of(u.end), u.n_prompt, u.n_new));
    } else if (alive) {
        char *last = sq_oai_chunk(kind, &meta, "", 0, first, finish_of(u.end), false, 0, 0);
        char *usage = rq.include_usage ? sq_oai_chunk(kind, &meta, "", 0, false, finish_of(u.end), true, u.n_prompt, u.n_new)
                                       : NULL;
        if (last && sq_http_sse_event(fd, last) == SPARQ_OK && (!usage || sq_http_sse_event(fd, usage) == SPARQ_OK))
            (void)sq_http_sse_event(fd, "[DONE]");
        sparq_free(last);
        sparq_free(usage);
    }
    sparq_free(all);
    sq_job_release(job);
    sq_oai_request_free(&rq);
}

/* --- one connection ------------------------------------------------------- */

typedef struct client {
    server *sv;
    int fd;
    char *buf;
    sq_http_request hr;
    sq_oai_kind kind;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    const struct timeval tv = {30, 0}; /* a client that stops reading cannot hold its thread forever */
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    complete(c->sv, c->fd, &c->hr, c->kind);
    close(c->fd);
    pthread_mutex_lock(&c->sv->mu);
    c->sv->workers--;
    c->sv->n_served++;
    pthread_cond_broadcast(&c->sv->cv);
    pthread_mutex_unlock(&c->sv->mu);
    sparq_free(c->buf);
    sparq_free(c);
    return NULL;
}

/* Give a whole completion request a worker thread (which then owns fd and
 * *buf); false when there are slots + queue workers already (nothing taken). */
static bool dispatch(server *sv, int fd, const sq_http_request *hr, char **buf, sq_oai_kind kind)
{
    pthread_mutex_lock(&sv->mu);
    const bool room = sv->workers < sv->max_workers;
    if (room) sv->workers++;
    pthread_mutex_unlock(&sv->mu);
    client *c = room ? sparq_malloc(sizeof *c) : NULL;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (c) *c = (client){sv, fd, *buf, *hr, kind};
    const bool ok = c && pthread_create(&th, &at, client_main, c) == 0;
    pthread_attr_destroy(&at);
    if (ok) {
        *buf = NULL;
        return true;
    }
    sparq_free(c);
    if (room) {
        pthread_mutex_lock(&sv->mu);
        sv->workers--;
        pthread_mutex_unlock(&sv->mu);
    }
    return false;
}

static bool workers_full(server *sv)
{
    pthread_mutex_lock(&sv->mu);
    const bool full = sv->workers >= sv->max_workers;
    pthread_mutex_unlock(&sv->mu);
    return full;
}

static void respond_busy(int fd)
{
    respond_error(fd, 503, "the server is busy: every slot is generating and the queue is full; try again", NULL);
}

/* The connection loop's callback (conns.h): everything but a completion is
 * answered as soon as its headers are in, from this thread; a completion
 * reads its body (unless the API key is wrong or every worker is busy) and
 * then gets a worker. */
static sq_conn_verdict on_request(void *ctx, int fd, sq_conn_event ev, const sq_http_request *hr, char **buf)
{
    server *sv = ctx;
    const bool get = !strcmp(hr->method, "GET"), post = !strcmp(hr->method, "POST");
    const bool v1 = !strncmp(hr->path, "/v1/", 4);
    const bool chat = !strcmp(hr->path, "/v1/chat/completions"), compl = !strcmp(hr->path, "/v1/completions");
    if (ev == SQ_CONN_REQUEST) { /* only completions read their body */
        if (dispatch(sv, fd, hr, buf, chat ? SQ_OAI_CHAT : SQ_OAI_COMPLETION)) return SQ_CONN_TAKEN;
        respond_busy(fd);
        return SQ_CONN_ANSWERED;
    }
    char want[600];
    snprintf(want, sizeof want, "Bearer %s", sv->api_key ? sv->api_key : "");
    if (!strcmp(hr->path, "/health") && get) {
        sq_sched_stats ss;
        sq_sched_get_stats(sv->sched, &ss);
        char body[320];
        const int n = snprintf(body, sizeof body,
                               "{\"status\":\"%s\",\"slots\":%d,\"active\":%d,\"queued\":%d,\"completed\":%llu,"
                               "\"cancelled\":%llu,\"tokens\":%llu}",
                               sq_sched_failed(sv->sched) ? "failed" : "ok", ss.slots, ss.active, ss.queued,
                               ss.jobs_done, ss.jobs_cancelled, ss.tokens);
        (void)sq_http_respond(fd, sq_sched_failed(sv->sched) ? 503 : 200, "application/json", body, (size_t)n);
    } else if (v1 && sv->api_key && strcmp(hr->auth, want) != 0) {
        respond_error(fd, 401, hr->auth[0] ? "wrong API key" : "this server needs 'Authorization: Bearer <key>'", NULL);
    } else if (!strcmp(hr->path, "/v1/models") && get) {
        respond_json(fd, 200, sq_oai_models(sv->name, (long long)time(NULL)));
    } else if ((compl || chat) && post) {
        if (!workers_full(sv)) return SQ_CONN_GO_ON;
        respond_busy(fd);
    } else if (!strcmp(hr->path, "/health") || !strcmp(hr->path, "/v1/models") || compl || chat) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s is not allowed on %s", hr->method, hr->path);
        respond_error(fd, 405, msg, NULL);
    } else {
        char msg[1100];
        snprintf(msg, sizeof msg, "no such endpoint: %s (try /v1/completions, /v1/chat/completions, /v1/models)",
                 hr->path);
        respond_error(fd, 404, msg, NULL);
    }
    pthread_mutex_lock(&sv->mu);
    sv->n_served++;
    pthread_mutex_unlock(&sv->mu);
    return SQ_CONN_ANSWERED;
}

/* Descriptors for max_conns connections and the workers: raise the soft
 * open-file limit up to the hard one, else lower max_conns to fit (said). */
static int fit_fd_limit(int max_conns, int workers)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return max_conns;
    const rlim_t need = (rlim_t)max_conns + (rlim_t)workers + 64; /* 64: the model's files, stdio, MPI */
    if (rl.rlim_cur < need) {
        struct rlimit up = {rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl.rlim_cur = up.rlim_cur;
    }
    if (rl.rlim_cur >= need) return max_conns;
    const long fit = (long)rl.rlim_cur - workers - 64 > 16 ? (long)rl.rlim_cur - workers - 64 : 16;
    fprintf(stderr, "sparq serve: --max-connections %d lowered to %ld to fit the open-file limit (ulimit -n %llu)\n",
            max_conns, fit, (unsigned long long)rl.rlim_cur);
    return (int)fit;
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
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
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
    long long port = 8080, max_tok = 512, ctx = 0, threads = 0, parallel = 0, queue = 64, max_conns = 1024;
    bool no_verify = false;
    double timeout = 60, req_timeout = 30, hdr_timeout = 5;
    sq_device device = SQ_DEVICE_CPU;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        bool ok = true;
        switch (id) {
        case O_HOST: host = v; break;
        case O_PORT: ok = cli_parse_int(&spec, "port", v, 0, 65535, &port); break;
        case O_NAME: name = v; break;
        case O_MAXTOK: ok = cli_parse_int(&spec, "max-tokens", v, 1, 1 << 24, &max_tok); break;
        case O_PARALLEL: ok = cli_parse_int(&spec, "parallel", v, 1, 64, &parallel); break;
        case O_QUEUE: ok = cli_parse_int(&spec, "queue", v, 0, 4096, &queue); break;
        case O_CTX: ok = cli_parse_int(&spec, "ctx", v, 2, 1 << 24, &ctx); break;
        case O_THREADS: ok = cli_parse_int(&spec, "threads", v, 1, 4096, &threads); break;
        case O_DEVICE: ok = sq_device_parse(v, &device) == SPARQ_OK || cli_usage_error(&spec, "--device: expected cpu or cuda") != 2; break;
        case O_TIMEOUT: ok = cli_parse_double(&spec, "timeout", v, 0.1, 1e6, &timeout); break;
        case O_REQTIMEOUT: ok = cli_parse_double(&spec, "request-timeout", v, 0.1, 1e6, &req_timeout); break;
        case O_HDRTIMEOUT: ok = cli_parse_double(&spec, "header-timeout", v, 0.1, 1e6, &hdr_timeout); break;
        case O_MAXCONN: ok = cli_parse_int(&spec, "max-connections", v, 1, 1 << 20, &max_conns); break;
        case O_API_KEY: api_key = v; break;
        case O_NO_VERIFY: no_verify = true; break;
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

    const cli_model_args ma = {(int)ctx, (int)threads, parallel ? (int)parallel : 4, device, timeout, no_verify};
    server sv = {.name = name, .api_key = api_key, .default_max = (int)max_tok};
    sq_transport *tr = NULL;
    sq_dist *model = NULL;
    const int started = cli_dist_start(&spec, dir, &ma, &tr, &model, &sv.tok);
    if (started >= 0) return started;

    sparq_status st = SPARQ_OK;
    if (parallel > sq_dist_options(model)->n_seq)
        st = sparq_err(SPARQ_E_ARG, "%s: --parallel %lld, but the bundle was planned for %d users (sparq pack --users)",
                       dir, parallel, sq_dist_options(model)->n_seq);
    int32_t stops[SQ_MAX_EOS_IDS + 2];
    int n_stops = 0;
    const sq_model_config *cfg = sq_dist_cfg(model);
    for (int i = 0; i < cfg->n_eos_token_ids && n_stops < SQ_MAX_EOS_IDS; i++) stops[n_stops++] = (int32_t)cfg->eos_token_ids[i];
    if (sq_tokenizer_eos(sv.tok) >= 0) stops[n_stops++] = sq_tokenizer_eos(sv.tok);
    if (sq_tokenizer_token_id(sv.tok, "<|im_end|>") >= 0) stops[n_stops++] = sq_tokenizer_token_id(sv.tok, "<|im_end|>");
    if (st == SPARQ_OK) st = sq_sched_create(&sv.sched, model, sv.tok, stops, n_stops, (int)queue);
    char portstr[16], shown[300];
    snprintf(portstr, sizeof portstr, "%lld", port);
    const int lfd = st == SPARQ_OK ? listen_on(host, portstr, shown, sizeof shown) : -1;
    if (st == SPARQ_OK && lfd < 0) st = SPARQ_E_IO;
    int rc = 0;
    sq_sched_stats ss;
    sq_conns *conns = NULL;
    if (st == SPARQ_OK) {
        sq_sched_get_stats(sv.sched, &ss);
        sv.max_workers = ss.slots + (int)queue;
        const sq_conns_opts co = {fit_fd_limit((int)max_conns, sv.max_workers), hdr_timeout, req_timeout};
        st = sq_conns_create(&conns, lfd, &co, on_request, &sv);
    }
    if (st == SPARQ_OK) {
        pthread_mutex_init(&sv.mu, NULL);
        pthread_cond_init(&sv.cv, NULL);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop; /* no SA_RESTART: poll returns EINTR */
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        fprintf(stderr, "sparq serve: %s on http://%s (pid %d; %d slots; OpenAI API under /v1; Ctrl-C stops)\n", name,
                shown, (int)getpid(), ss.slots);
        while (!stop_requested && !sq_sched_failed(sv.sched) && st == SPARQ_OK) st = sq_conns_step(conns, 0.5);
        sq_conns_free(conns); /* requests still being sent are dropped */
        close(lfd);
        pthread_mutex_lock(&sv.mu); /* the running requests finish (or fail, if the model did) */
        while (sv.workers > 0) pthread_cond_wait(&sv.cv, &sv.mu);
        pthread_mutex_unlock(&sv.mu);
        sq_sched_get_stats(sv.sched, &ss);
        if (st != SPARQ_OK) {
            rc = cli_dist_fail(&spec, tr, st);
        } else if (sq_sched_failed(sv.sched)) {
            char why[256];
            sq_sched_fail_message(sv.sched, why, sizeof why);
            rc = cli_dist_fail(&spec, tr, sparq_err(SPARQ_E_STATE, "the model failed (%s); the server stopped", why));
        } else {
            fprintf(stderr, "sparq serve: stopped after %llu requests; %llu tokens in %llu decode rounds (%.3f s), "
                            "prefill %.3f s\n",
                    sv.n_served, ss.tokens, ss.rounds, ss.t_decode, ss.t_prefill);
        }
        pthread_mutex_destroy(&sv.mu);
        pthread_cond_destroy(&sv.cv);
    } else {
        if (lfd >= 0) close(lfd);
        rc = cli_dist_fail(&spec, tr, st);
    }
    sq_sched_free(sv.sched);
    sq_dist_close(model);
    sq_tokenizer_free(sv.tok);
    sq_transport_close(tr);
    return rc;
}
