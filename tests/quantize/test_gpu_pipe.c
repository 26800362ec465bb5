/* tests/quantize/test_gpu_pipe.c — the two-stage pipeline of quantize --device
 * cuda (quantize/gpu_pipe.h) with fake stages that log every call: the order
 * of the stages (batch b+1 prepared before b is waited for, finishes in batch
 * order, at most one batch in flight), the sequential mode, a plan that does
 * not fit beside the batch in flight, a plan larger than what is left, and
 * errors in each stage (the batch in flight waited for, everything released
 * once, the first message kept); and the batch-size rule (qz_pipe_fit).
 * Then several pipelines on one queue (qz_pipe_run_multi, `--devices`), each
 * with its own batch size: every item in exactly one batch, prepares in
 * queue order, every pipeline given work, results by index, an error on one
 * device naming it and stopping all, with everything released. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "quantize/gpu_pipe.h"
#include "t.h"

typedef struct fake_batch {
    int id, first, count, submitted;
} fake_batch;

typedef struct fake {
    char log[2048];
    int size;          /* items per batch */
    int n;             /* items in all */
    int no_room_at;    /* plan says 0 beside a busy batch when first == this (-1: never) */
    const char *fail;  /* stage to fail ("prepare", "submit", "wait", "finish") */
    int fail_batch;
    int next_id, in_flight, max_in_flight, live;
    fake_batch pool[64];
} fake;

static void logf_(fake *f, const char *what, int id)
{
    char s[32];
    snprintf(s, sizeof s, "%s%d ", what, id);
    strncat(f->log, s, sizeof f->log - strlen(f->log) - 1);
}

static int fails(fake *f, const char *stage, int id) { return f->fail && !strcmp(f->fail, stage) && f->fail_batch == id; }

static sparq_status plan(void *ctx, int first, const void *busy, int *count)
{
    fake *f = ctx;
    const int left = f->n - first;
    *count = busy && first == f->no_room_at ? 0 : f->size < left ? f->size : left;
    return SPARQ_OK;
}

static sparq_status prepare(void *ctx, int first, int count, void **out)
{
    fake *f = ctx;
    fake_batch *b = &f->pool[f->next_id];
    *b = (fake_batch){f->next_id++, first, count, 0};
    *out = b;
    f->live++;
    logf_(f, "p", b->id);
    if (fails(f, "prepare", b->id)) return sparq_err(SPARQ_E_FORMAT, "prepare %d failed", b->id);
    return SPARQ_OK;
}

static sparq_status submit(void *ctx, void *bv)
{
    fake *f = ctx;
    fake_batch *b = bv;
    logf_(f, "s", b->id);
    if (fails(f, "submit", b->id)) return sparq_err(SPARQ_E_NOMEM, "submit %d failed", b->id);
    b->submitted = 1;
    if (++f->in_flight > f->max_in_flight) f->max_in_flight = f->in_flight;
    return SPARQ_OK;
}

static sparq_status wait_(void *ctx, void *bv, double *gpu)
{
    fake *f = ctx;
    fake_batch *b = bv;
    logf_(f, "w", b->id);
    CHECK(b->submitted);
    f->in_flight--;
    *gpu = 1.0;
    if (fails(f, "wait", b->id)) return sparq_err(SPARQ_E_STATE, "wait %d failed", b->id);
    return SPARQ_OK;
}

static sparq_status finish(void *ctx, void *bv)
{
    fake *f = ctx;
    fake_batch *b = bv;
    logf_(f, "f", b->id);
    if (fails(f, "finish", b->id)) return sparq_err(SPARQ_E_FORMAT, "finish %d failed", b->id);
    return SPARQ_OK;
}

static void release(void *ctx, void *bv)
{
    fake *f = ctx;
    fake_batch *b = bv;
    logf_(f, "r", b->id);
    f->live--;
}

static sparq_status run(fake *f, int n, int overlap, qz_pipe_stats *ps)
{
    const qz_pipe_ops ops = {f, plan, prepare, submit, wait_, finish, release};
    f->n = n;
    return qz_pipe_run(&ops, n, overlap, ps);
}

static fake make(int size)
{
    fake f;
    memset(&f, 0, sizeof f);
    f.size = size;
    f.no_room_at = -1;
    return f;
}

static void test_order(void)
{
    fake f = make(4);
    qz_pipe_stats ps;
    CHECK(run(&f, 10, 1, &ps) == SPARQ_OK); /* batches of 4, 4, 2 */
    CHECK_STR_CONTAINS(f.log, "p0 s0 p1 w0 f0 r0 s1 p2 w1 f1 r1 s2 w2 f2 r2 ");
    CHECK(strlen(f.log) == strlen("p0 s0 p1 w0 f0 r0 s1 p2 w1 f1 r1 s2 w2 f2 r2 "));
    CHECK_EQ_INT(ps.batches, 3);
    CHECK_EQ_INT(f.max_in_flight, 1);
    CHECK_EQ_INT(f.live, 0);
    CHECK(ps.gpu == 3.0);
    CHECK_EQ_INT(f.pool[2].first, 8);
    CHECK_EQ_INT(f.pool[2].count, 2);
}

static void test_sequential(void)
{
    fake f = make(5);
    CHECK(run(&f, 10, 0, NULL) == SPARQ_OK);
    CHECK(strcmp(f.log, "p0 s0 w0 f0 r0 p1 s1 w1 f1 r1 ") == 0);
}

static void test_no_room(void)
{
    fake f = make(3);
    f.no_room_at = 3; /* the second batch does not fit beside the first: wait for it, then plan again */
    CHECK(run(&f, 6, 1, NULL) == SPARQ_OK);
    CHECK(strcmp(f.log, "p0 s0 w0 f0 r0 p1 s1 w1 f1 r1 ") == 0);
}

/* A plan past the last item is the caller's bug: an error, nothing left behind. */
static sparq_status plan_too_many(void *ctx, int first, const void *busy, int *count)
{
    (void)ctx, (void)first, (void)busy;
    *count = 7;
    return SPARQ_OK;
}

static void test_bad_plan(void)
{
    fake f = make(0);
    const qz_pipe_ops ops = {&f, plan_too_many, prepare, submit, wait_, finish, release};
    CHECK(qz_pipe_run(&ops, 10, 1, NULL) == SPARQ_E_STATE); /* 7, then 7 of the 3 left */
    CHECK(strcmp(f.log, "p0 s0 w0 r0 ") == 0);
    CHECK_EQ_INT(f.live, 0);
}

static void test_errors(void)
{
    const char *stages[] = {"prepare", "submit", "wait", "finish"};
    const char *expect[] = {"p0 s0 p1 r1 w0 r0 ", "p0 s0 p1 w0 f0 r0 s1 r1 ", "p0 s0 p1 w0 r0 r1 ",
                            "p0 s0 p1 w0 f0 r0 r1 "};
    const int fail_at[] = {1, 1, 0, 0};
    const char *msg[] = {"prepare 1 failed", "submit 1 failed", "wait 0 failed", "finish 0 failed"};
    for (int i = 0; i < 4; i++) {
        fake f = make(2);
        f.fail = stages[i];
        f.fail_batch = fail_at[i];
        CHECK(run(&f, 6, 1, NULL) != SPARQ_OK);
        CHECK_MSG(strcmp(f.log, expect[i]) == 0, "%s: %s", stages[i], f.log);
        CHECK_MSG(strcmp(sparq_errmsg(), msg[i]) == 0, "%s: message %s", stages[i], sparq_errmsg());
        CHECK_EQ_INT(f.live, 0);
        CHECK_EQ_INT(f.in_flight, 0);
    }
}

/* qz_pipe_fit's rule on a linear cost: 10 device bytes an item, 2 of them from the preparation on, 5 host bytes. */
static void lin_cost(void *ctx, int m, qz_pipe_cost *c)
{
    (void)ctx;
    c->dev = (size_t)10 * m, c->dev_early = (size_t)2 * m, c->host = (uint64_t)5 * m;
}

static void test_fit(void)
{
    qz_pipe_room r = {.dev_free = 100, .host = 100};
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 5);  /* half the device room */
    CHECK_EQ_INT(qz_pipe_fit(&r, 3, lin_cost, NULL), 3);   /* what there is */
    r = (qz_pipe_room){.dev_free = 40, .dev_held = 60, .host = 100, .host_held = 80, .busy = 1};
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 4);  /* the host budget's rest beside the busy batch */
    r.host_held = 0, r.dev_free = 6, r.dev_held = 94;
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 3);  /* its Hessians in what is free now */
    r.dev_free = 1;
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 0);  /* nothing beside it: wait */
    r = (qz_pipe_room){.dev_free = 15, .host = 100};
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 1);  /* too large for half: alone */
    r.dev_free = 9;
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 0);  /* too large at all */
    r = (qz_pipe_room){.dev_free = 1000, .host = 30};
    CHECK_EQ_INT(qz_pipe_fit(&r, 20, lin_cost, NULL), 3);  /* half the host budget */
}

/* --- several pipelines ------------------------------------------------------------ */

#define MULTI_ITEMS 40

typedef struct mshared {
    int owner[MULTI_ITEMS];  /* the pipeline that prepared each item (-1: none) */
    int result[MULTI_ITEMS]; /* written by finish, by index */
    int expect_first;        /* prepares come in queue order */
    int out_of_order;
    int n_pipes;
    atomic_int live, in_flight;
    atomic_int started; /* pipelines that have submitted a batch */
} mshared;

typedef struct mpipe {
    mshared *sh;
    int id, size, fail_wait_at; /* fail the wait of this pipeline's n-th batch (-1: never) */
    int batches;
    fake_batch pool[MULTI_ITEMS];
} mpipe;

static sparq_status m_plan(void *ctx, int first, const void *busy, int *count)
{
    (void)busy;
    const mpipe *p = ctx;
    const int left = MULTI_ITEMS - first;
    *count = p->size < left ? p->size : left;
    return SPARQ_OK;
}

static sparq_status m_prepare(void *ctx, int first, int count, void **out)
{
    mpipe *p = ctx;
    mshared *sh = p->sh;
    if (first != sh->expect_first) sh->out_of_order = 1; /* no lock: the pipe runs prepares one at a time */
    sh->expect_first = first + count;
    for (int i = first; i < first + count; i++) sh->owner[i] = sh->owner[i] < 0 ? p->id : 99;
    fake_batch *b = &p->pool[p->batches];
    *b = (fake_batch){p->batches++, first, count, 0};
    atomic_fetch_add(&sh->live, 1);
    *out = b;
    return SPARQ_OK;
}

static sparq_status m_submit(void *ctx, void *bv)
{
    mpipe *p = ctx;
    fake_batch *b = bv;
    b->submitted = 1;
    atomic_fetch_add(&p->sh->in_flight, 1);
    if (b->id == 0) atomic_fetch_add(&p->sh->started, 1);
    return SPARQ_OK;
}

static sparq_status m_wait(void *ctx, void *bv, double *gpu)
{
    mpipe *p = ctx;
    fake_batch *b = bv;
    usleep(3000); /* the "GPU" */
    /* A pipeline's first batch ends only once every pipeline has one (so each takes some, also
     * on a loaded machine where a thread may not run for a while; 10 s at most). */
    for (int t = 0; b->id == 0 && atomic_load(&p->sh->started) < p->sh->n_pipes && t < 10000; t++) usleep(1000);
    atomic_fetch_sub(&p->sh->in_flight, 1);
    *gpu = 0.5;
    if (b->id == p->fail_wait_at) return sparq_err(SPARQ_E_STATE, "wait of batch %d failed", b->id);
    return SPARQ_OK;
}

static sparq_status m_finish(void *ctx, void *bv)
{
    mpipe *p = ctx;
    const fake_batch *b = bv;
    for (int i = b->first; i < b->first + b->count; i++) p->sh->result[i] = 1000 + i;
    return SPARQ_OK;
}

static void m_release(void *ctx, void *bv)
{
    (void)bv;
    atomic_fetch_sub(&((mpipe *)ctx)->sh->live, 1);
}

static sparq_status run_multi(mshared *sh, mpipe *p, int n_pipes, qz_pipe_stats *ps)
{
    static const char *names[] = {"dev0", "dev1", "dev2"};
    qz_pipe_ops ops[3];
    memset(sh, 0, sizeof *sh);
    for (int i = 0; i < MULTI_ITEMS; i++) sh->owner[i] = -1;
    sh->n_pipes = n_pipes;
    for (int i = 0; i < n_pipes; i++) {
        p[i].sh = sh, p[i].id = i, p[i].batches = 0;
        ops[i] = (qz_pipe_ops){&p[i], m_plan, m_prepare, m_submit, m_wait, m_finish, m_release, names[i]};
    }
    return qz_pipe_run_multi(ops, n_pipes, MULTI_ITEMS, 1, ps);
}

static void test_multi(void)
{
    mshared sh;
    mpipe p[3] = {{.size = 3, .fail_wait_at = -1}, {.size = 2, .fail_wait_at = -1}, {.size = 5, .fail_wait_at = -1}};
    qz_pipe_stats ps[3];
    CHECK(run_multi(&sh, p, 3, ps) == SPARQ_OK);
    CHECK(!sh.out_of_order);
    for (int i = 0; i < MULTI_ITEMS; i++) {
        CHECK_MSG(sh.owner[i] >= 0 && sh.owner[i] < 3, "item %d: owner %d", i, sh.owner[i]);
        CHECK_MSG(sh.result[i] == 1000 + i, "item %d: result %d", i, sh.result[i]);
    }
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(ps[i].batches > 0, "pipeline %d took no batch", i);
        CHECK(ps[i].gpu == 0.5 * ps[i].batches);
    }
    CHECK_EQ_INT(atomic_load(&sh.live), 0);
    CHECK_EQ_INT(atomic_load(&sh.in_flight), 0);
    /* one pipeline is qz_pipe_run */
    CHECK(run_multi(&sh, p, 1, ps) == SPARQ_OK);
    CHECK_EQ_INT(ps[0].batches, (MULTI_ITEMS + 2) / 3);
    CHECK(qz_pipe_run_multi(NULL, 0, 1, 1, NULL) == SPARQ_E_ARG);
}

static void test_multi_error(void)
{
    mshared sh;
    mpipe p[2] = {{.size = 2, .fail_wait_at = -1}, {.size = 2, .fail_wait_at = 0}};
    CHECK(run_multi(&sh, p, 2, NULL) == SPARQ_E_STATE);
    CHECK_MSG(strstr(sparq_errmsg(), "dev1") && strstr(sparq_errmsg(), "wait of batch 0 failed"), "message: %s",
              sparq_errmsg());
    int done = 0;
    for (int i = 0; i < MULTI_ITEMS; i++) done += sh.owner[i] >= 0;
    CHECK_MSG(done < MULTI_ITEMS, "the error stopped nothing (%d items prepared)", done);
    CHECK_EQ_INT(atomic_load(&sh.live), 0);
    CHECK_EQ_INT(atomic_load(&sh.in_flight), 0);
}

int main(void)
{
    RUN(test_fit);
    RUN(test_order);
    RUN(test_sequential);
    RUN(test_no_room);
    RUN(test_bad_plan);
    RUN(test_errors);
    RUN(test_multi);
    RUN(test_multi_error);
    return t_summary();
}
