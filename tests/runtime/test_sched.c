/* tests/runtime/test_sched.c — continuous batching (runtime/serve/sched.h) on the
 * fixture model with 2 KV slots: 5 greedy jobs submitted at once from 5
 * threads (so 3 wait for a slot) each give exactly the text of a one-sequence
 * session (runtime/serve/session.h) on the same prompt; stop strings cut the text
 * and end the job; max_new and max_new = 0; a cancelled job frees its slot (and is counted);
 * a full queue is refused; the prefix cache of a slot is reused. */
#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/tokenizer.h"
#include "runtime/dist/dist.h"
#include "runtime/serve/sched.h"
#include "runtime/serve/session.h"
#include "t.h"

static const char *const prompts[] = {"The file system", "A journal file", "Memory allocation", "The SQLite library",
                                      "The file system"};
enum { N_JOBS = 5, N_NEW = 20 };

static sq_tokenizer *tok;
static sq_dist *dist;
static sq_sched *sched;

static sq_sampler_params greedy(void)
{
    sq_sampler_params p;
    sq_sampler_params_default(&p);
    p.temp = 0;
    return p;
}

static void encode(const char *text, int32_t **ids, int *n)
{
    size_t nn = 0;
    CHECK(sq_tokenizer_encode(tok, text, strlen(text), true, ids, &nn) == SPARQ_OK);
    *n = (int)nn;
}

/* the whole text of a job */
static char *drain(sq_job *j, sq_job_end *end, int *n_new)
{
    char *all = sparq_calloc(1, 1);
    size_t len = 0;
    sq_job_update u;
    for (;;) {
        const sparq_status st = sq_job_next(j, 30, &u);
        if (st != SPARQ_OK) break;
        if (u.len) {
            all = sparq_realloc(all, len + u.len + 1);
            memcpy(all + len, u.text, u.len + 1);
            len += u.len;
        }
        sparq_free(u.text);
        if (u.end != SQ_JOB_RUNNING) break;
    }
    *end = u.end;
    *n_new = u.n_new;
    return all;
}

typedef struct run_arg {
    int i;
    char *text;
    sq_job_end end;
} run_arg;

static void *run_job(void *v)
{
    run_arg *a = v; /* no CHECK here: the counters belong to the main thread */
    int32_t *ids = NULL;
    size_t nn = 0;
    if (sq_tokenizer_encode(tok, prompts[a->i], strlen(prompts[a->i]), true, &ids, &nn) != SPARQ_OK) return NULL;
    const int n = (int)nn;
    const sq_job_params p = {ids, n, N_NEW, greedy(), NULL, 0};
    sq_job *j = NULL;
    if (sq_sched_submit(sched, &p, &j) == SPARQ_OK) {
        int n_new;
        a->text = drain(j, &a->end, &n_new);
        sq_job_release(j);
    }
    sparq_free(ids);
    return NULL;
}

static bool collect(void *ctx, const char *text, size_t len)
{
    char **acc = ctx;
    const size_t have = strlen(*acc);
    *acc = sparq_realloc(*acc, have + len + 1);
    memcpy(*acc + have, text, len);
    (*acc)[have + len] = 0;
    return true;
}

/* What one sequence alone generates (run before the scheduler exists). */
static char *alone(sq_session *s, const char *prompt, int n_new)
{
    int32_t *ids;
    int n;
    encode(prompt, &ids, &n);
    char *acc = sparq_calloc(1, 1);
    sq_session_out o;
    CHECK(sq_session_generate(s, ids, n, n_new, 0, collect, &acc, &o) == SPARQ_OK);
    sparq_free(ids);
    return acc;
}

int main(void)
{
    const char *dir = t_data_path("tiny-qwen3moe");
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = 256;
    mo.n_seq = 2;
    mo.n_threads = 1;
    sq_model *m = NULL;
    if (sq_model_load(&m, dir, &mo) != SPARQ_OK || sq_tokenizer_load(&tok, dir) != SPARQ_OK) {
        fprintf(stderr, "fixture: %s\n", sparq_errmsg());
        return 1;
    }
    CHECK(sq_dist_wrap(&dist, m) == SPARQ_OK);
    const sq_sampler_params gp = greedy();
    sq_session sess;
    CHECK(sq_session_init(&sess, dist, tok, &gp, false) == SPARQ_OK);
    char *want[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) want[i] = alone(&sess, prompts[i], N_NEW);
    char *want_short = alone(&sess, prompts[0], 7);
    const int32_t stop_ids[] = {(int32_t)sq_tokenizer_eos(tok)};
    sq_session_free(&sess);

    t_current_ = "concurrent";
    CHECK(sq_sched_create(&sched, dist, tok, stop_ids, stop_ids[0] >= 0, 8) == SPARQ_OK);
    pthread_t th[N_JOBS];
    run_arg args[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        args[i] = (run_arg){i, NULL, SQ_JOB_RUNNING};
        pthread_create(&th[i], NULL, run_job, &args[i]);
    }
    for (int i = 0; i < N_JOBS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_JOBS; i++) {
        CHECK_MSG(args[i].text && strcmp(args[i].text, want[i]) == 0, "job %d: '%s' vs alone '%s'", i,
                  args[i].text ? args[i].text : "(none)", want[i]);
        CHECK(args[i].end == SQ_JOB_LENGTH || args[i].end == SQ_JOB_STOP);
        sparq_free(args[i].text);
    }
    sq_sched_stats ss;
    sq_sched_get_stats(sched, &ss);
    CHECK_EQ_INT(ss.slots, 2);
    CHECK(ss.jobs_done == N_JOBS && ss.active == 0 && ss.queued == 0);
    CHECK(ss.rounds < (unsigned long long)N_JOBS * N_NEW); /* rows were batched */

    t_current_ = "prefix cache";
    {
        int32_t *pid;
        int pn;
        encode(prompts[3], &pid, &pn);
        for (int rep = 0; rep < 2; rep++) {
            sq_sched_get_stats(sched, &ss);
            const unsigned long long before = ss.prefill_tokens;
            sq_job_params pp = {pid, pn, 4, greedy(), NULL, 0};
            sq_job *jj = NULL;
            sq_job_end e;
            int nn;
            CHECK(sq_sched_submit(sched, &pp, &jj) == SPARQ_OK);
            sparq_free(drain(jj, &e, &nn));
            sq_job_release(jj);
            sq_sched_get_stats(sched, &ss);
            /* the second time, the slot that holds the first run's ids is picked: only the
             * prompt's last token runs again (for its logits) */
            if (rep == 1)
                CHECK_MSG(ss.prefill_tokens - before == 1, "%llu prompt tokens run", ss.prefill_tokens - before);
            else
                CHECK(ss.prefill_tokens - before >= 1 && ss.prefill_tokens - before <= (unsigned long long)pn);
        }
        sparq_free(pid);
    }

    t_current_ = "limits and stops";
    int32_t *ids;
    int n;
    encode(prompts[0], &ids, &n);
    sq_job *j = NULL;
    sq_job_end end;
    int n_new;
    sq_job_params p = {ids, n, 7, gp, NULL, 0};
    CHECK(sq_sched_submit(sched, &p, &j) == SPARQ_OK);
    char *t = drain(j, &end, &n_new);
    CHECK_MSG(strcmp(t, want_short) == 0, "max_new 7: '%s' vs '%s'", t, want_short);
    CHECK(end == SQ_JOB_LENGTH && n_new == 7);
    sq_job_release(j);
    sparq_free(t);
    /* a stop string from the middle of the greedy text */
    const char *mid = want[0] + strlen(want[0]) / 2;
    char stop[8];
    snprintf(stop, sizeof stop, "%.5s", mid);
    const char *stops[] = {"", "never-there", stop};
    p = (sq_job_params){ids, n, N_NEW, gp, stops, 3};
    CHECK(sq_sched_submit(sched, &p, &j) == SPARQ_OK);
    t = drain(j, &end, &n_new);
    const size_t cut = (size_t)(strstr(want[0], stop) - want[0]);
    CHECK_MSG(strlen(t) == cut && strncmp(t, want[0], cut) == 0, "stop '%s': '%s'", stop, t);
    CHECK(end == SQ_JOB_STOP && n_new < N_NEW);
    sq_job_release(j);
    sparq_free(t);
    p = (sq_job_params){ids, n, 0, gp, NULL, 0};
    CHECK(sq_sched_submit(sched, &p, &j) == SPARQ_OK);
    t = drain(j, &end, &n_new);
    CHECK(t[0] == 0 && end == SQ_JOB_LENGTH && n_new == 0);
    sq_job_release(j);
    sparq_free(t);

    t_current_ = "cancel and queue";
    p = (sq_job_params){ids, n, 200, gp, NULL, 0};
    sq_job *a = NULL, *b = NULL;
    CHECK(sq_sched_submit(sched, &p, &a) == SPARQ_OK);
    sq_job_cancel(a);
    sq_job_update u;
    int guard = 0;
    do {
        CHECK(sq_job_next(a, 30, &u) == SPARQ_OK);
        sparq_free(u.text);
    } while (u.end == SQ_JOB_RUNNING && ++guard < 1000);
    CHECK(u.end == SQ_JOB_ERROR && strstr(u.error, "cancelled"));
    sq_job_release(a);
    sq_sched_stats cs;
    sq_sched_get_stats(sched, &cs);
    CHECK(cs.jobs_cancelled == 1); /* what /health reports as "cancelled" */
    /* the slot is free again: another job runs to its end */
    p.max_new = 5;
    CHECK(sq_sched_submit(sched, &p, &b) == SPARQ_OK);
    t = drain(b, &end, &n_new);
    CHECK(end == SQ_JOB_LENGTH && n_new == 5);
    sq_job_release(b);
    sparq_free(t);
    /* prompts that do not fit, an empty one */
    int32_t *big = sparq_calloc(300, sizeof(int32_t));
    p = (sq_job_params){big, 256, 4, gp, NULL, 0};
    CHECK(sq_sched_submit(sched, &p, &a) == SPARQ_E_RANGE);
    p.n_ids = 0;
    CHECK(sq_sched_submit(sched, &p, &a) == SPARQ_E_RANGE);
    sparq_free(big);
    sq_sched_free(sched);
    /* no queue: of three jobs on two slots, the third is refused (each runs for ~100 ms) */
    CHECK(sq_sched_create(&sched, dist, tok, stop_ids, 0, 0) == SPARQ_OK);
    sq_job *q[3] = {0};
    p = (sq_job_params){ids, n, 150, gp, NULL, 0};
    int refused = 0;
    char why[256] = "";
    for (int i = 0; i < 3; i++)
        if (sq_sched_submit(sched, &p, &q[i]) == SPARQ_E_FIT) {
            refused++;
            snprintf(why, sizeof why, "%s", sparq_errmsg());
        }
    CHECK_EQ_INT(refused, 1);
    CHECK_STR_CONTAINS(why, "all 2 slots are busy");
    for (int i = 0; i < 3; i++)
        if (q[i]) {
            sq_job_cancel(q[i]);
            sq_job_release(q[i]);
        }
    sq_sched_free(sched);

    sparq_free(ids);
    sparq_free(want_short);
    for (int i = 0; i < N_JOBS; i++) sparq_free(want[i]);
    sq_dist_close(dist);
    sq_model_free(m);
    sq_tokenizer_free(tok);

    return t_summary();
}
