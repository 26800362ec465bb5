/* runtime/serve/sched.c — see sched.h. One mutex guards the queue, the slots'
 * job pointers, every job's shared fields (text, end, cancel flag,
 * references) and the statistics; the engine thread drops it around model
 * calls. Readers wait on one condition variable that the engine broadcasts
 * whenever a job gains text or ends. slot_ids / slot_len always describe
 * what is in the slot's KV cache. */
#include "runtime/serve/sched.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"

struct sq_job {
    sq_sched *s;
    int refs;                /* the reader's + the engine's while queued or active */
    int32_t *ids;
    int n_ids, max_new;
    sq_sampler_params sp;
    char **stop;
    int n_stop;
    size_t hold;             /* longest stop string − 1 */
    /* engine only */
    int slot;
    sq_sampler *smp;
    sq_detok dt;
    bool dt_live;
    int32_t next;            /* sampled, to be forwarded */
    bool prefilling;         /* its prompt is still being run, a chunk a round */
    int pf_at;               /* prompt tokens in the slot's cache so far */
    /* shared */
    char *text;
    size_t len, cap, safe, taken;
    int n_new, n_prompt;
    sq_job_end end;
    char err[256];
    bool cancelled;
    sq_job *qnext;
};

struct sq_sched {
    sq_dist *d;
    const sq_tokenizer *tok;
    int32_t stop_ids[32];
    int n_stop_ids;
    int V, ctx, slots, ranks, max_queue;
    int n_vocab;             /* the ids sampled from: sq_sampler_vocab (the V rows of the head may be padded) */
    pthread_t th;
    bool th_live;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, out_cv;
    sq_job *q_head, *q_tail;
    int n_queued;
    sq_job **slot_job;
    int32_t **slot_ids;
    int *slot_len;
    bool stopping, failed;
    char fail_msg[256];
    float *plog;             /* [V]: prefill logits */
    float *dlog;             /* [slots, V]: a decode round's logits */
    int *gseq;
    int32_t *gtok;
    sq_job **grow;           /* the job of each row of a round */
    int32_t *gid;            /* [slots]: a sampled round's tokens (one process) */
    sq_sampler **rsmp;       /* [slots]: its samplers, row by row */
    sq_sched_stats stats;
    int pf_chunk;            /* prompt tokens a chunk (PREFILL_CHUNK; sq_sched_set_prefill_chunk) */
};

static void job_free(sq_job *j)
{
    for (int i = 0; i < j->n_stop; i++) sparq_free(j->stop[i]);
    sparq_free(j->stop);
    sparq_free(j->ids);
    sparq_free(j->text);
    sparq_free(j);
}

/* under mu */
static void unref_locked(sq_job *j)
{
    if (--j->refs == 0) job_free(j);
}

/* Append generated text (under mu): cut at a stop string, move `safe`. */
static bool append_locked(sq_job *j, const char *piece, size_t n)
{
    if (j->len + n + 1 > j->cap) {
        size_t nc = j->cap ? j->cap : 256;
        while (nc < j->len + n + 1) nc *= 2;
        char *t = sparq_realloc(j->text, nc);
        if (!t) return false;
        j->text = t, j->cap = nc;
    }
    const size_t from = j->len > j->hold ? j->len - j->hold : 0; /* a stop string may start before the piece */
    memcpy(j->text + j->len, piece, n);
    j->len += n;
    j->text[j->len] = 0;
    bool hit = false;
    for (int i = 0; i < j->n_stop; i++) {
        /* a cut by an earlier stop string lies at or after `from`: the search stays in the text */
        const char *p = strstr(j->text + from, j->stop[i]);
        if (p) {
            j->len = (size_t)(p - j->text);
            j->text[j->len] = 0;
            hit = true;
        }
    }
    size_t safe = j->len > j->hold ? j->len - j->hold : 0;
    while (safe > j->safe && safe < j->len && (j->text[safe] & 0xC0) == 0x80) safe--; /* whole characters */
    if (safe > j->safe) j->safe = safe;
    return !hit;
}

/* End a job (under mu): all its text becomes final, its slot is free. */
static void finish_locked(sq_sched *s, sq_job *j, sq_job_end end, const char *err)
{
    j->end = end;
    j->safe = j->len;
    if (err) snprintf(j->err, sizeof j->err, "%s", err);
    if (j->slot >= 0) s->slot_job[j->slot] = NULL;
    j->slot = -1;
    sq_sampler_free(j->smp);
    j->smp = NULL;
    if (j->dt_live) sq_detok_free(&j->dt);
    j->dt_live = false;
    s->stats.jobs_done++;
    pthread_cond_broadcast(&s->out_cv);
    unref_locked(j); /* the engine's reference */
}

static bool is_stop_id(const sq_sched *s, int32_t t)
{
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == t) return true;
    return false;
}

/* A sampled token of job j (engine thread): emit it or end the job. Returns
 * true if the job goes on (its token is then j->next). */
static bool take_token(sq_sched *s, sq_job *j, int32_t t)
{
    const char *piece = NULL;
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    s->stats.tokens++;
    if (is_stop_id(s, t)) {
        if (sq_detok_flush(&j->dt, &piece, &n) == SPARQ_OK && n) append_locked(j, piece, n);
        finish_locked(s, j, SQ_JOB_STOP, NULL);
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    sq_sampler_accept(j->smp, t);
    j->n_new++;
    bool go = true;
    sparq_status st = sq_detok_push(&j->dt, t, &piece, &n);
    if (st == SPARQ_OK && n) go = append_locked(j, piece, n);
    if (st != SPARQ_OK) {
        finish_locked(s, j, SQ_JOB_ERROR, sparq_errmsg());
        go = false;
    } else if (!go) {
        finish_locked(s, j, SQ_JOB_STOP, NULL);
    } else if (j->n_new >= j->max_new || s->slot_len[j->slot] + 1 >= s->ctx) {
        if (sq_detok_flush(&j->dt, &piece, &n) == SPARQ_OK && n) go = append_locked(j, piece, n);
        finish_locked(s, j, go ? SQ_JOB_LENGTH : SQ_JOB_STOP, NULL);
        go = false;
    } else {
        j->next = t;
        pthread_cond_broadcast(&s->out_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return go;
}

static void fail_all_locked(sq_sched *s, const char *msg)
{
    s->failed = true;
    snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
    for (int i = 0; i < s->slots; i++)
        if (s->slot_job[i]) finish_locked(s, s->slot_job[i], SQ_JOB_ERROR, msg);
    while (s->q_head) {
        sq_job *j = s->q_head;
        s->q_head = j->qnext;
        s->n_queued--;
        finish_locked(s, j, SQ_JOB_ERROR, msg);
    }
    s->q_tail = NULL;
}

/* Prompt tokens a prefill runs before the next decode round: a long prompt
 * does not stall the jobs already decoding (they get a token between its
 * chunks), and each chunk is still big enough for the model's batched path. */
#define PREFILL_CHUNK 256

/* Start job j's prefill in its slot (engine thread, nothing in flight): the
 * part of its prompt the slot already holds is kept. */
static sparq_status prefill_start(sq_sched *s, sq_job *j)
{
    const int slot = j->slot;
    int keep = 0;
    while (keep < s->slot_len[slot] && keep < j->n_ids && s->slot_ids[slot][keep] == j->ids[keep]) keep++;
    if (keep == j->n_ids) keep--; /* always run one token, for the logits */
    FORWARD_IF(sq_sampler_create(&j->smp, &j->sp, s->n_vocab));
    for (int i = 0; i < j->n_ids; i++) sq_sampler_accept(j->smp, j->ids[i]);
    sq_detok_init(&j->dt, s->tok, true);
    j->dt_live = true;
    FORWARD_IF(sq_dist_seq_truncate(s->d, slot, keep));
    s->slot_len[slot] = keep;
    j->pf_at = keep;
    pthread_mutex_lock(&s->mu);
    j->prefilling = true;
    pthread_mutex_unlock(&s->mu);
    return SPARQ_OK;
}

/* Run the next chunk of job j's prompt; after the last one sample its first
 * token (engine thread, nothing in flight). */
static sparq_status prefill_step(sq_sched *s, sq_job *j)
{
    pthread_mutex_lock(&s->mu);
    const int chunk = s->pf_chunk;
    pthread_mutex_unlock(&s->mu);
    const int slot = j->slot, n = j->n_ids - j->pf_at < chunk ? j->n_ids - j->pf_at : chunk;
    const bool last = j->pf_at + n == j->n_ids;
    const double t0 = sparq_now();
    FORWARD_IF(sq_dist_forward(s->d, slot, j->ids + j->pf_at, n, last ? SQ_LOGITS_LAST : SQ_LOGITS_NONE, s->plog));
    memcpy(s->slot_ids[slot] + j->pf_at, j->ids + j->pf_at, (size_t)n * sizeof(int32_t));
    j->pf_at += n;
    s->slot_len[slot] = j->pf_at;
    pthread_mutex_lock(&s->mu);
    s->stats.t_prefill += sparq_now() - t0;
    s->stats.prefill_tokens += (unsigned long long)n;
    if (last) {
        j->prefilling = false;
        j->n_prompt = j->n_ids;
        s->stats.prefill_chunks_done++;
    }
    s->stats.prefill_chunks++;
    pthread_mutex_unlock(&s->mu);
    if (!last) return SPARQ_OK;
    if (j->max_new == 0) {
        pthread_mutex_lock(&s->mu);
        finish_locked(s, j, SQ_JOB_LENGTH, NULL);
        pthread_mutex_unlock(&s->mu);
        return SPARQ_OK;
    }
    take_token(s, j, sq_sampler_sample(j->smp, s->plog));
    return SPARQ_OK;
}

/* One decode round over the active jobs, G groups in flight (engine thread). */
static sparq_status decode_round(sq_sched *s)
{
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->slots; i++)
        if (s->slot_job[i] && !s->slot_job[i]->prefilling) s->grow[n++] = s->slot_job[i];
    pthread_mutex_unlock(&s->mu);
    if (n == 0) return SPARQ_OK;
    int G = n < s->ranks ? n : s->ranks;
    const int per = (n + G - 1) / G;
    const double t0 = sparq_now();
    /* group k = jobs k, k + G, ...: rows k·per .. of the buffers */
    int rows[64];
    if (s->ranks == 1) { /* one process: one sampled step (on a device the logits stay there) */
        for (int i = 0; i < n; i++) {
            s->gseq[i] = s->grow[i]->slot;
            s->gtok[i] = s->grow[i]->next;
            s->rsmp[i] = s->grow[i]->smp;
        }
        FORWARD_IF(sq_dist_step_sample(s->d, n, s->gseq, s->gtok, s->rsmp, s->dlog, s->gid));
        for (int i = 0; i < n; i++) {
            s->slot_ids[s->gseq[i]][s->slot_len[s->gseq[i]]++] = s->gtok[i];
            take_token(s, s->grow[i], s->gid[i]);
        }
        G = 0; /* no groups in flight */
    }
    for (int k = 0; k < G; k++) {
        rows[k] = 0;
        for (int i = k; i < n; i += G) {
            const int r = k * per + rows[k]++;
            s->gseq[r] = s->grow[i]->slot;
            s->gtok[r] = s->grow[i]->next;
        }
        FORWARD_IF(sq_dist_submit(s->d, rows[k], s->gseq + k * per, s->gtok + k * per, SQ_LOGITS_ALL,
                                  s->dlog + (size_t)k * per * s->V));
    }
    for (int k = 0; k < G; k++) {
        FORWARD_IF(sq_dist_wait(s->d));
        for (int r = 0; r < rows[k]; r++) {
            sq_job *j = s->grow[k + r * G];
            const int slot = s->gseq[k * per + r];
            s->slot_ids[slot][s->slot_len[slot]++] = s->gtok[k * per + r];
            take_token(s, j, sq_sampler_sample(j->smp, s->dlog + ((size_t)k * per + r) * s->V));
        }
    }
    pthread_mutex_lock(&s->mu);
    s->stats.rounds++;
    for (int i = 0; i < s->slots; i++)
        if (s->slot_job[i] && s->slot_job[i]->prefilling) {
            s->stats.rounds_beside_prefill++;
            break;
        }
    s->stats.t_decode += sparq_now() - t0;
    pthread_mutex_unlock(&s->mu);
    return SPARQ_OK;
}

static int pick_slot_locked(const sq_sched *s, const sq_job *j)
{
    int best = -1, best_keep = -1;
    for (int i = 0; i < s->slots; i++) {
        if (s->slot_job[i]) continue;
        int keep = 0;
        while (keep < s->slot_len[i] && keep < j->n_ids && s->slot_ids[i][keep] == j->ids[keep]) keep++;
        if (keep > best_keep) best = i, best_keep = keep;
    }
    return best;
}

static void *engine(void *arg)
{
    sq_sched *s = arg;
    sq_job *admitted[64];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        bool active = false;
        for (int i = 0; i < s->slots; i++) {
            sq_job *j = s->slot_job[i];
            if (j && j->cancelled) {
                s->stats.jobs_cancelled++;
                finish_locked(s, j, SQ_JOB_ERROR, "cancelled");
            } else if (j) {
                active = true;
            }
        }
        if (s->stopping)
            while (s->q_head) {
                sq_job *j = s->q_head;
                s->q_head = j->qnext;
                s->n_queued--;
                finish_locked(s, j, SQ_JOB_ERROR, "the server is stopping");
            }
        if (!active && !s->q_head) {
            s->q_tail = NULL;
            if (s->stopping) break;
            pthread_cond_wait(&s->work_cv, &s->mu);
            continue;
        }
        int n_adm = 0;
        for (int slot; s->q_head && n_adm < 64 && (slot = pick_slot_locked(s, s->q_head)) >= 0;) {
            sq_job *j = s->q_head;
            s->q_head = j->qnext;
            if (!s->q_head) s->q_tail = NULL;
            s->n_queued--;
            if (j->cancelled) {
                s->stats.jobs_cancelled++;
                finish_locked(s, j, SQ_JOB_ERROR, "cancelled");
                continue;
            }
            j->slot = slot;
            s->slot_job[slot] = j;
            admitted[n_adm++] = j;
        }
        pthread_mutex_unlock(&s->mu);
        sparq_status st = SPARQ_OK;
        for (int i = 0; st == SPARQ_OK && i < n_adm; i++) st = prefill_start(s, admitted[i]);
        /* one chunk of every prompt being run, then one token of every job decoding */
        int n_pf = 0;
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->slots; i++)
            if (s->slot_job[i] && s->slot_job[i]->prefilling) admitted[n_pf++] = s->slot_job[i];
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; st == SPARQ_OK && i < n_pf; i++) st = prefill_step(s, admitted[i]);
        if (st == SPARQ_OK) st = decode_round(s);
        pthread_mutex_lock(&s->mu);
        if (st != SPARQ_OK) {
            fail_all_locked(s, sparq_errmsg());
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

sparq_status sq_sched_create(sq_sched **out, sq_dist *d, const sq_tokenizer *tok, const int32_t *stop_ids,
                             int n_stop_ids, int max_queue)
{
    *out = NULL;
    sq_sched *s = sparq_calloc(1, sizeof *s);
    RETURN_IF(!s, SPARQ_E_NOMEM, "out of memory");
    s->d = d;
    s->tok = tok;
    s->pf_chunk = PREFILL_CHUNK;
    for (int i = 0; i < n_stop_ids && i < 32; i++) s->stop_ids[s->n_stop_ids++] = stop_ids[i];
    s->V = (int)sq_dist_cfg(d)->vocab_size;
    s->n_vocab = sq_sampler_vocab(sq_dist_cfg(d)->vocab_size, sq_tokenizer_vocab_size(tok));
    s->ctx = sq_dist_options(d)->ctx;
    s->slots = sq_dist_options(d)->n_seq;
    s->ranks = sq_dist_size(d);
    s->max_queue = max_queue;
    if (s->slots > 64) s->slots = 64; /* a round's bookkeeping arrays; more slots than this would not batch well on a CPU */
    if (s->slots > sq_dist_options(d)->max_rows) s->slots = sq_dist_options(d)->max_rows;
    s->slot_job = sparq_calloc((size_t)s->slots, sizeof *s->slot_job);
    s->slot_ids = sparq_calloc((size_t)s->slots, sizeof *s->slot_ids);
    s->slot_len = sparq_calloc((size_t)s->slots, sizeof *s->slot_len);
    s->plog = sparq_malloc((size_t)s->V * sizeof(float));
    s->dlog = sparq_malloc((size_t)s->slots * (size_t)s->V * sizeof(float));
    s->gseq = sparq_malloc((size_t)s->slots * sizeof(int));
    s->gtok = sparq_malloc((size_t)s->slots * sizeof(int32_t));
    s->grow = sparq_malloc((size_t)s->slots * sizeof(sq_job *));
    s->gid = sparq_malloc((size_t)s->slots * sizeof(int32_t));
    s->rsmp = sparq_malloc((size_t)s->slots * sizeof(sq_sampler *));
    bool ok = s->slot_job && s->slot_ids && s->slot_len && s->plog && s->dlog && s->gseq && s->gtok && s->grow &&
              s->gid && s->rsmp;
    for (int i = 0; ok && i < s->slots; i++) ok = (s->slot_ids[i] = sparq_malloc((size_t)s->ctx * sizeof(int32_t)));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->out_cv, NULL);
    if (!ok) {
        sq_sched_free(s);
        return sparq_err(SPARQ_E_NOMEM, "out of memory for %d request slots", s->slots);
    }
    for (int i = 0; i < s->slots; i++) FORWARD_IF(sq_dist_seq_reset(d, i));
    if (pthread_create(&s->th, NULL, engine, s) != 0) {
        sq_sched_free(s);
        return sparq_err(SPARQ_E_STATE, "cannot start the scheduler thread");
    }
    s->th_live = true;
    *out = s;
    return SPARQ_OK;
}

void sq_sched_free(sq_sched *s)
{
    if (!s) return;
    if (s->th_live) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    for (int i = 0; s->slot_ids && i < s->slots; i++) sparq_free(s->slot_ids[i]);
    sparq_free(s->slot_ids);
    sparq_free(s->slot_job);
    sparq_free(s->slot_len);
    sparq_free(s->plog);
    sparq_free(s->dlog);
    sparq_free(s->gseq);
    sparq_free(s->gtok);
    sparq_free(s->gid);
    sparq_free(s->rsmp);
    sparq_free(s->grow);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->out_cv);
    sparq_free(s);
}

bool sq_sched_failed(sq_sched *s)
{
    pthread_mutex_lock(&s->mu);
    const bool f = s->failed;
    pthread_mutex_unlock(&s->mu);
    return f;
}

void sq_sched_fail_message(sq_sched *s, char *buf, size_t n)
{
    pthread_mutex_lock(&s->mu);
    snprintf(buf, n, "%s", s->fail_msg);
    pthread_mutex_unlock(&s->mu);
}

sparq_status sq_sched_submit(sq_sched *s, const sq_job_params *p, sq_job **out)
{
    *out = NULL;
    RETURN_IF(p->n_ids < 1, SPARQ_E_RANGE, "the prompt is empty");
    RETURN_IF(p->n_ids >= s->ctx, SPARQ_E_RANGE, "the prompt is %d tokens; the context is %d", p->n_ids, s->ctx);
    sq_job *j = sparq_calloc(1, sizeof *j);
    RETURN_IF(!j, SPARQ_E_NOMEM, "out of memory");
    j->s = s;
    j->slot = -1;
    j->n_ids = p->n_ids;
    j->max_new = p->max_new < 0 ? 0 : p->max_new;
    j->sp = p->sampler;
    j->ids = sparq_malloc((size_t)p->n_ids * sizeof(int32_t));
    j->stop = p->n_stop ? sparq_calloc((size_t)p->n_stop, sizeof(char *)) : NULL;
    bool ok = j->ids && (!p->n_stop || j->stop);
    for (int i = 0; ok && i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0]) continue;
        ok = (j->stop[j->n_stop] = sparq_strdup(p->stop[i])) != NULL;
        const size_t l = strlen(p->stop[i]);
        if (ok && l - 1 > j->hold) j->hold = l - 1;
        if (ok) j->n_stop++;
    }
    if (!ok) {
        job_free(j);
        return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    memcpy(j->ids, p->ids, (size_t)p->n_ids * sizeof(int32_t));
    j->refs = 2;
    pthread_mutex_lock(&s->mu);
    sparq_status st = SPARQ_OK;
    if (s->failed) st = sparq_err(SPARQ_E_STATE, "the model failed earlier: %s", s->fail_msg);
    else if (s->stopping) st = sparq_err(SPARQ_E_STATE, "the server is stopping");
    else {
        int free_slots = s->slots;
        for (int i = 0; i < s->slots; i++) free_slots -= s->slot_job[i] != NULL;
        if (s->n_queued >= s->max_queue + free_slots)
            st = sparq_err(SPARQ_E_FIT, "all %d slots are busy and %d requests are already waiting", s->slots,
                           s->n_queued);
    }
    if (st == SPARQ_OK) {
        if (s->q_tail) s->q_tail->qnext = j;
        else s->q_head = j;
        s->q_tail = j;
        s->n_queued++;
        pthread_cond_signal(&s->work_cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (st != SPARQ_OK) {
        job_free(j);
        return st;
    }
    *out = j;
    return SPARQ_OK;
}

sparq_status sq_job_next(sq_job *j, double timeout_s, sq_job_update *u)
{
    memset(u, 0, sizeof *u);
    sq_sched *s = j->s;
    const struct timespec until = sparq_deadline_after(timeout_s);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (j->safe == j->taken && j->end == SQ_JOB_RUNNING && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->out_cv, &s->mu, &until);
    sparq_status st = SPARQ_OK;
    if (j->safe > j->taken) {
        u->len = j->safe - j->taken;
        u->text = sparq_malloc(u->len + 1);
        if (u->text) {
            memcpy(u->text, j->text + j->taken, u->len);
            u->text[u->len] = 0;
            j->taken = j->safe;
        } else {
            u->len = 0;
            st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        }
    } else if (j->end == SQ_JOB_RUNNING) {
        st = sparq_err(SPARQ_E_TIMEOUT, "no new text within %.1f s", timeout_s);
    }
    if (j->taken == j->len) u->end = j->end;
    u->n_prompt = j->n_prompt;
    u->n_new = j->n_new;
    snprintf(u->error, sizeof u->error, "%s", j->err);
    pthread_mutex_unlock(&s->mu);
    return st;
}

void sq_job_cancel(sq_job *j)
{
    sq_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    j->cancelled = true;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

void sq_job_release(sq_job *j)
{
    if (!j) return;
    sq_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    unref_locked(j);
    pthread_mutex_unlock(&s->mu);
}

void sq_sched_set_prefill_chunk(sq_sched *s, int n)
{
    pthread_mutex_lock(&s->mu);
    s->pf_chunk = n < 1 ? 1 : n;
    pthread_mutex_unlock(&s->mu);
}

void sq_sched_get_stats(sq_sched *s, sq_sched_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->slots = s->slots;
    st->queued = s->n_queued;
    st->active = 0;
    for (int i = 0; i < s->slots; i++) st->active += s->slot_job[i] != NULL;
    pthread_mutex_unlock(&s->mu);
}
