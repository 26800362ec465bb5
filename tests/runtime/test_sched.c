/* tests/runtime/test_sched.c — continuous batching (runtime/serve/sched.h) on the
 * fixture model with 2 KV slots: 5 greedy jobs submitted at once from 5
 * threads (so 3 wait for a slot) each give exactly the text of a one-sequence
 * session (runtime/serve/session.h) on the same prompt; stop strings cut the text
 * and end the job; max_new and max_new = 0; a cancelled job frees its slot (and is counted);
 * a full queue is refused; the prefix cache of a slot is reused; with a head padded past
 * the tokenizer, no path that samples (session, scheduler, sq_generate) picks a padding id. */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/tokenizer.h"
#include "runtime/dist/dist.h"
#include "runtime/generate.h"
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

typedef struct drain_arg {
    sq_job *j;
    char *text;
    sq_job_end end;
} drain_arg;

static void *drain_job(void *v)
{
    drain_arg *a = v;
    int n_new;
    a->text = drain(a->j, &a->end, &n_new);
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

enum { N_IDS = 300 };

/* The fixture's tokenizer.json with only the ids below n: the vocabulary, the merges
 * whose parts and result all stay, the added tokens below n. */
static sq_tokenizer *cut_tokenizer(const char *dir, int n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, "%s: %s\n", path, je.text);
        return NULL;
    }
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    const char *key;
    json_t *v, *kept = json_object();
    void *tmp;
    json_object_foreach_safe(vocab, tmp, key, v) {
        if (json_integer_value(v) < n) json_object_set(kept, key, v);
    }
    json_object_set_new(model, "vocab", kept);
    json_t *mk = json_array();
    size_t i;
    json_array_foreach(merges, i, v) {
        const char *m = json_string_value(v), *sp = m ? strchr(m, ' ') : NULL;
        if (!sp) continue;
        char a[256], whole[512];
        snprintf(a, sizeof a, "%.*s", (int)(sp - m), m);
        snprintf(whole, sizeof whole, "%s%s", a, sp + 1);
        if (json_object_get(kept, a) && json_object_get(kept, sp + 1) && json_object_get(kept, whole))
            json_array_append(mk, v);
    }
    json_object_set_new(model, "merges", mk);
    json_t *ak = json_array();
    json_array_foreach(added, i, v) {
        if (json_integer_value(json_object_get(v, "id")) < n) json_array_append(ak, v);
    }
    json_object_set_new(root, "added_tokens", ak);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    sq_tokenizer *tok = NULL;
    if (!text || sq_tokenizer_load_json(&tok, text, strlen(text), "tokenizer.json cut") != SPARQ_OK)
        fprintf(stderr, "cut tokenizer: %s\n", sparq_errmsg());
    free(text);
    return tok;
}

static bool all_below(const int32_t *ids, int n, int32_t lim)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= lim) return false;
    return true;
}

static bool keep_text(void *ctx, const char *text, size_t len)
{
    size_t *total = ctx;
    (void)text;
    *total += len;
    return true;
}

static sq_sampler_params every_id(float temp, uint64_t seed)
{
    sq_sampler_params p;
    sq_sampler_params_default(&p);
    p.temp = temp;
    p.top_k = 0; /* every id a candidate: the padding would be drawn if it were one */
    p.top_p = 1;
    p.min_p = 0;
    p.seed = seed;
    return p;
}

/* A head padded past the tokenizer (real checkpoints: Qwen3's vocab_size is 151,936 for
 * 151,669 tokenizer ids): the fixture's 4096 rows with its tokenizer cut to the first N_IDS
 * ids, so most of what the model would pick lies past the tokenizer. A session (run, chat),
 * the scheduler (serve) and sq_generate (run --parallel), greedy and at a temperature with
 * every id a candidate, must give only ids below N_IDS and decode them
 * (runtime/sampler.h, sq_sampler_vocab). */
static void test_padded_head(void)
{
    sq_tokenizer *cut = cut_tokenizer(t_data_path("tiny-qwen3moe"), N_IDS);
    CHECK(cut != NULL);
    if (!cut) return;
    int32_t *ids = NULL;
    int n = 0;
    const int V = (int)sq_dist_cfg(dist)->vocab_size;
    CHECK_EQ_INT(V, 4096);
    CHECK_EQ_INT(sq_tokenizer_vocab_size(cut), N_IDS);
    CHECK(sq_prompt_encode(cut, "The file system of the computer", false, &ids, &n) == SPARQ_OK);

    t_current_ = "session (run)";
    for (int k = 0; k < 2; k++) {
        const sq_sampler_params p = every_id(k ? 1.0f : 0.0f, 7);
        sq_session s;
        CHECK(sq_session_init(&s, dist, cut, &p, false) == SPARQ_OK);
        CHECK_EQ_INT(s.n_vocab, N_IDS);
        s.ignore_eos = true;
        size_t len = 0;
        sq_session_out o;
        const sparq_status st = sq_session_generate(&s, ids, n, N_NEW, 7, keep_text, &len, &o);
        CHECK_MSG(st == SPARQ_OK, "temp %d: %s", k, sparq_errmsg());
        CHECK_EQ_INT(o.n_new, N_NEW);
        CHECK_MSG(all_below(s.cached + n, o.n_new, N_IDS), "temp %d: an id at or past %d was sampled", k, N_IDS);
        CHECK(len > 0);
        sq_session_free(&s);
    }

    t_current_ = "scheduler (serve)";
    sq_sched *sc = NULL;
    CHECK(sq_sched_create(&sc, dist, cut, NULL, 0, 4) == SPARQ_OK);
    for (int k = 0; sc && k < 2; k++) {
        const sq_job_params jp = {ids, n, N_NEW, every_id(k ? 1.0f : 0.0f, 3), NULL, 0};
        sq_job *j = NULL;
        CHECK(sq_sched_submit(sc, &jp, &j) == SPARQ_OK);
        sq_job_update u = {0};
        int guard = 0;
        while (j && sq_job_next(j, 30, &u) == SPARQ_OK && ++guard < 1000) {
            sparq_free(u.text);
            if (u.end != SQ_JOB_RUNNING) break;
        }
        CHECK_MSG(u.end == SQ_JOB_LENGTH && u.n_new == N_NEW, "temp %d: job ended %d after %d tokens: %s", k,
                  (int)u.end, u.n_new, u.error);
        if (j) sq_job_release(j);
    }
    sq_sched_free(sc);

    t_current_ = "sq_generate (run --parallel)";
    for (int k = 0; k < 2; k++) {
        const sq_gen_opts o = {.n_seqs = 2, .n_new = N_NEW, .sampler = every_id(k ? 1.0f : 0.0f, 11),
                               .n_vocab = sq_sampler_vocab(V, sq_tokenizer_vocab_size(cut))};
        sq_gen_result r;
        CHECK(sq_generate(dist, ids, n, &o, &r) == SPARQ_OK);
        for (int i = 0; i < r.n_seqs; i++) {
            CHECK_EQ_INT(r.n_out[i], N_NEW);
            CHECK_MSG(all_below(r.out[i], r.n_out[i], N_IDS), "temp %d, sequence %d: an id at or past %d", k, i,
                      N_IDS);
            char *text = NULL;
            size_t len = 0;
            CHECK(sq_tokenizer_decode(cut, r.out[i], (size_t)r.n_out[i], true, &text, &len) == SPARQ_OK);
            sparq_free(text);
        }
        sq_gen_result_free(&r);
    }

    sparq_free(ids);
    sq_tokenizer_free(cut);
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
    /* a prompt of ~150 tokens */
    char long_text[2048] = "";
    for (int i = 0; i < 12; i++) strcat(long_text, "The file system keeps a journal of every block. ");
    int32_t *long_ids;
    int long_n;
    encode(long_text, &long_ids, &long_n);
    char *want_long = alone(&sess, long_text, 4);
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

    t_current_ = "prefill beside decode";
    {
        /* a long prompt runs in chunks of 16 tokens, each followed by a decode round of the
         * job already decoding: both texts stay what they are alone */
        sq_sched_set_prefill_chunk(sched, 16);
        sq_sched_get_stats(sched, &ss);
        const unsigned long long r0 = ss.rounds_beside_prefill, c0 = ss.prefill_chunks;
        int32_t *sid;
        int sn;
        encode(prompts[0], &sid, &sn);
        const sq_job_params sp = {sid, sn, N_NEW, greedy(), NULL, 0};
        drain_arg ra = {NULL, NULL, SQ_JOB_RUNNING};
        CHECK(sq_sched_submit(sched, &sp, &ra.j) == SPARQ_OK); /* first: it decodes while the long one runs */
        pthread_t tha;
        pthread_create(&tha, NULL, drain_job, &ra);
        sq_job_params lp = {long_ids, long_n, 4, greedy(), NULL, 0};
        sq_job *lj = NULL;
        sq_job_end le;
        int ln;
        CHECK(sq_sched_submit(sched, &lp, &lj) == SPARQ_OK);
        char *lt = drain(lj, &le, &ln);
        sq_job_release(lj);
        pthread_join(tha, NULL);
        sq_job_release(ra.j);
        sparq_free(sid);
        CHECK_MSG(strcmp(lt, want_long) == 0, "long prompt beside a decode: '%s' vs alone '%s'", lt, want_long);
        CHECK_MSG(ra.text && strcmp(ra.text, want[0]) == 0, "decode beside a long prompt: '%s' vs alone '%s'",
                  ra.text ? ra.text : "(none)", want[0]);
        sq_sched_get_stats(sched, &ss);
        printf("prefill beside decode: %d-token prompt in %llu chunks, %llu decode rounds beside them\n", long_n,
               ss.prefill_chunks - c0, ss.rounds_beside_prefill - r0);
        CHECK(ss.prefill_chunks - c0 >= (unsigned long long)(long_n / 16));
        /* the short job, submitted first, decodes between the long prompt's chunks */
        CHECK(ss.rounds_beside_prefill - r0 >= (unsigned long long)(long_n / 16 - 2));
        sparq_free(lt);
        sparq_free(ra.text);
        sq_sched_set_prefill_chunk(sched, 256);
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

    test_padded_head();

    sparq_free(ids);
    sparq_free(want_short);
    sparq_free(want_long);
    sparq_free(long_ids);
    for (int i = 0; i < N_JOBS; i++) sparq_free(want[i]);
    sq_dist_close(dist);
    sq_model_free(m);
    sq_tokenizer_free(tok);

    return t_summary();
}
