/* runtime/serve/sched.h — continuous batching for `sparq serve`: many requests
 * share the model's KV slots (sq_model_opts.n_seq).
 *
 * One engine thread owns the model (runtime/dist/dist.h, one rank or several).
 * Any thread submits a job (prompt ids, sampling, stop strings) and reads
 * its text as it is produced. The engine loop: take queued jobs into free
 * slots (the slot whose cached ids share the longest prefix with the prompt,
 * so a chat's next turn only prefills its new tokens) and prefill them; then
 * one decode round: every active job's next token, split into
 * G = min(active, ranks) groups that are all in flight at once so every
 * pipeline stage works; sample each row with its job's sampler; repeat.
 * A prompt runs in chunks of at most 256 tokens, one chunk of each prompt
 * being run before each decode round, so a long new prompt delays the jobs
 * already decoding by one chunk a token, not by its whole prefill.
 *
 * A job's text is cut at the first stop string; while it runs, text that
 * could still begin a stop string is held back, so what a reader gets is
 * final. Decode rows are computed independently of the batch they share
 * (the CPU kernels' per-row arithmetic), so a greedy job gives the same text
 * as `sparq run`, whatever else runs beside it. */
#ifndef SPARQ_RUNTIME_SCHED_H
#define SPARQ_RUNTIME_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/tokenizer.h"
#include "runtime/dist/dist.h"
#include "runtime/sampler.h"

typedef struct sq_sched sq_sched;
typedef struct sq_job sq_job;

typedef struct sq_job_params {
    const int32_t *ids;         /* the prompt (copied) */
    int n_ids;
    int max_new;                /* tokens to generate at most; also ends at the context's end */
    sq_sampler_params sampler;
    const char *const *stop;    /* stop strings (copied; empty ones ignored) */
    int n_stop;
} sq_job_params;

typedef enum sq_job_end { SQ_JOB_RUNNING, SQ_JOB_STOP, SQ_JOB_LENGTH, SQ_JOB_ERROR } sq_job_end;

/* stop_ids: end-of-sequence ids (not emitted). max_queue: jobs that may wait
 * when every slot is busy; more are refused. The model's n_seq slots are all
 * used (at most 64, and at most its max_rows). */
sparq_status sq_sched_create(sq_sched **out, sq_dist *d, const sq_tokenizer *tok, const int32_t *stop_ids,
                             int n_stop_ids, int max_queue);
/* Finish the running jobs, fail the queued ones (SQ_JOB_ERROR: "stopping"),
 * stop the engine thread, free. Jobs still held by readers stay valid until
 * released. Safe with NULL. */
void sq_sched_free(sq_sched *s);
/* Whether the model failed (every job then ends with SQ_JOB_ERROR, and
 * further submissions are refused). */
bool sq_sched_failed(sq_sched *s);
/* Why it failed ("" if it did not). */
void sq_sched_fail_message(sq_sched *s, char *buf, size_t n);

/* Queue a job. SPARQ_E_RANGE: the prompt does not fit the context (or is
 * empty); SPARQ_E_FIT: the queue is full; SPARQ_E_STATE: the engine failed
 * or is stopping. The caller owns one reference: sq_job_release it. */
sparq_status sq_sched_submit(sq_sched *s, const sq_job_params *p, sq_job **out);

typedef struct sq_job_update {
    char *text;        /* new final text (sparq_malloc'ed, NUL-terminated; NULL if none) */
    size_t len;
    sq_job_end end;    /* SQ_JOB_RUNNING until the last update */
    int n_prompt;      /* prompt tokens; tokens generated so far */
    int n_new;
    char error[256];   /* SQ_JOB_ERROR: why */
} sq_job_update;

/* Wait (at most timeout_s) for new text or the end. SPARQ_E_TIMEOUT if
 * nothing came; otherwise *u holds what is new since the last call. */
sparq_status sq_job_next(sq_job *j, double timeout_s, sq_job_update *u);
/* The reader has gone: the engine ends the job at its next step. */
void sq_job_cancel(sq_job *j);
/* Drop the caller's reference (after the last sq_job_next, or to abandon it). */
void sq_job_release(sq_job *j);

typedef struct sq_sched_stats {
    int slots, active, queued;
    unsigned long long jobs_done, tokens, rounds;
    unsigned long long jobs_cancelled; /* of jobs_done: ended by sq_job_cancel (their reader went away) */
    unsigned long long prefill_tokens; /* prompt tokens run (the rest came from a slot's cache) */
    unsigned long long prefill_chunks; /* forward steps of prompts (PREFILL_CHUNK = 256 tokens at most) */
    unsigned long long prefill_chunks_done; /* prompts finished */
    unsigned long long rounds_beside_prefill; /* decode rounds run while a prompt was still being run */
    double t_decode, t_prefill;  /* seconds spent in decode rounds and in prefills */
} sq_sched_stats;
void sq_sched_get_stats(sq_sched *s, sq_sched_stats *st);

/* Prompt tokens run between two decode rounds (default 256; tests use fewer). */
void sq_sched_set_prefill_chunk(sq_sched *s, int n);

#endif
