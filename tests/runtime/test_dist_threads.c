/* tests/runtime/test_dist_threads.c — the multi-rank pipeline (runtime/dist/dist.h)
 * with ranks as threads of one process (sq_transport_threads): the Qwen3-MoE
 * fixture packed for 1, 2 and 3 boxes and the DeepSeek V4.1 fixture (Engram
 * rows from the node files) for 1 and 2 give logits bit for bit equal to one
 * rank and to the model folder run directly,
 * for a prefill of several chunks, batched decode steps of several
 * sequences in flight, a truncate and a reset travelling down the pipe; and
 * rank 0 gathers every rank's Engram reads (sq_dist_engram_stats), which add
 * up to one rank's.
 *
 *   test_runtime_dist_threads [cpu|cuda]     (default cpu)
 *
 * With `cuda` every rank runs its layers on GPU 0 and hidden states are
 * staged through host memory between ranks, as on GPU boxes; the GPU suite
 * runs it that way (it skips without a GPU). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "dist_rank.h"
#include "gpu/gpu_probe.h"
#include "pack/pack.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/transport.h"
#include "t.h"

enum { CTX = 256, USERS = 3, CHUNK = 16, N_PROMPT = 40, N_STEPS = 6 };

static sq_device device = SQ_DEVICE_CPU;
static int vocab;

typedef struct rank_arg {
    const char *bundle;
    sq_transport *t;
    float *logits; /* rank 0: what it computed; NULL on the others */
    size_t n_logits;
    sparq_status st;
    char err[512];
    sq_model_engram_stats engram[4]; /* rank 0: every rank's Engram reads (sq_dist_engram_stats) */
} rank_arg;

/* What rank 0 runs: USERS prompts (chunked prefill, all in flight), then
 * N_STEPS decode steps of all sequences in 2 groups in flight, then a truncate
 * of sequence 1 and its re-run, and a reset of sequence 2 and a new prompt.
 * Every logit row goes to out (n floats at most). */
static sparq_status leader(sq_dist *d, float *out, size_t *n_out)
{
    const int V = vocab;
    size_t at = 0;
    int32_t prompt[USERS][N_PROMPT];
    for (int u = 0; u < USERS; u++)
        for (int i = 0; i < N_PROMPT; i++) prompt[u][i] = (int32_t)((i * 7919 + u * 104729 + 13) % 4000 + 10);
    int seqs[CHUNK];
    for (int u = 0; u < USERS; u++) {
        for (int i = 0; i < CHUNK; i++) seqs[i] = u;
        for (int c0 = 0; c0 < N_PROMPT; c0 += CHUNK) {
            const int rows = N_PROMPT - c0 < CHUNK ? N_PROMPT - c0 : CHUNK;
            FORWARD_IF(sq_dist_submit(d, rows, seqs, prompt[u] + c0, SQ_LOGITS_ALL, out + at));
            at += (size_t)rows * V;
        }
    }
    while (sq_dist_pending(d)) FORWARD_IF(sq_dist_wait(d));
    int32_t tok[USERS];
    for (int s = 0; s < N_STEPS; s++) {
        /* group A = sequences 0, 1; group B = sequence 2; both in flight */
        const int ga[2] = {0, 1}, gb[1] = {2};
        for (int u = 0; u < USERS; u++) tok[u] = (int32_t)(100 + s * 31 + u);
        FORWARD_IF(sq_dist_submit(d, 2, ga, tok, SQ_LOGITS_ALL, out + at));
        at += 2 * (size_t)V;
        FORWARD_IF(sq_dist_submit(d, 1, gb, tok + 2, SQ_LOGITS_LAST, out + at));
        at += (size_t)V;
        while (sq_dist_pending(d)) FORWARD_IF(sq_dist_wait(d));
    }
    FORWARD_IF(sq_dist_seq_truncate(d, 1, 20));
    FORWARD_IF(sq_dist_forward(d, 1, prompt[0], 5, SQ_LOGITS_LAST, out + at));
    at += (size_t)V;
    FORWARD_IF(sq_dist_seq_reset(d, 2));
    FORWARD_IF(sq_dist_forward(d, 2, prompt[1] + 3, 17, SQ_LOGITS_ALL, out + at));
    at += 17 * (size_t)V;
    *n_out = at;
    return SPARQ_OK;
}

static void *rank_main(void *v)
{
    rank_arg *a = v;
    sq_dist *d = NULL;
    a->st = dist_rank_open(&d, a->bundle, a->t, device, CTX, USERS, CHUNK, 300);
    if (a->st == SPARQ_OK) {
        if (a->t->rank == 0) {
            vocab = (int)sq_dist_cfg(d)->vocab_size;
            a->logits = sparq_malloc(sizeof(float) * (size_t)vocab * 400);
            a->st = a->logits ? leader(d, a->logits, &a->n_logits) : SPARQ_E_NOMEM;
            if (a->st == SPARQ_OK) a->st = sq_dist_engram_stats(d, a->engram);
        } else {
            a->st = sq_dist_serve(d);
        }
    }
    if (a->st != SPARQ_OK) snprintf(a->err, sizeof a->err, "%s", sparq_errmsg());
    sq_dist_close(d);
    sq_transport_close(a->t);
    return NULL;
}

/* Run the bundle on `ranks` threads; rank 0's logits (and, if engram, every rank's Engram reads). */
static float *run_stats(const char *bundle, int ranks, size_t *n, sq_model_engram_stats *engram)
{
    sq_transport *t[4];
    CHECK(sq_transport_threads(ranks, t) == SPARQ_OK);
    rank_arg a[4];
    pthread_t th[4];
    for (int r = 0; r < ranks; r++) {
        a[r] = (rank_arg){.bundle = bundle, .t = t[r]};
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < ranks; r++)
        CHECK_MSG(a[r].st == SPARQ_OK, "%d ranks, rank %d: %s", ranks, r, a[r].err);
    *n = a[0].n_logits;
    if (engram) memcpy(engram, a[0].engram, sizeof a[0].engram);
    return a[0].logits;
}

static float *run(const char *bundle, int ranks, size_t *n) { return run_stats(bundle, ranks, n, NULL); }

/* The fixture packed for 1..max_boxes boxes: every rank count gives the
 * logits of one rank, bit for bit, and one rank the logits of the model
 * folder itself (for V4.1: Engram rows read from the node files equal those
 * read from the checkpoint's mapped tables). */
static void check_fixture(const char *name, int max_boxes)
{
    const char *fixture = t_data_path(name);
    char dir[] = "/tmp/sparq-dist-threads-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char bundle[4][600];
    for (int b = 1; b <= max_boxes; b++) {
        snprintf(bundle[b], sizeof bundle[b], "%s/b%d", dir, b);
        const sparq_status st = dist_rank_pack(fixture, bundle[b], b, SQ_SPLIT_PIPELINE, CTX, USERS, CHUNK);
        CHECK_MSG(st == SPARQ_OK, "%s: pack %d boxes: %s", name, b, sparq_errmsg());
    }
    size_t n1 = 0, nd = 0;
    sq_model_engram_stats e1[4] = {{0}};
    float *l1 = run_stats(bundle[1], 1, &n1, e1);
    CHECK(l1 && n1 == (size_t)vocab * (3 * N_PROMPT + 3 * N_STEPS + 1 + 17));
    for (int b = 2; b <= max_boxes; b++) {
        size_t nb = 0;
        sq_model_engram_stats eb[4] = {{0}};
        float *lb = run_stats(bundle[b], b, &nb, eb);
        CHECK_MSG(lb && nb == n1 && l1 && memcmp(l1, lb, n1 * sizeof(float)) == 0,
                  "%s: %s: %d ranks: logits differ from one rank", name, device == SQ_DEVICE_CUDA ? "cuda" : "cpu", b);
        /* the Engram reads of all ranks add up to one rank's; with V4.1 on 2 boxes each holds one of the two
         * Engram layers (1 and 14), so each reads half of them */
        uint64_t rows = 0, uniq = 0;
        for (int r = 0; r < b; r++) rows += eb[r].rows, uniq += eb[r].unique;
        CHECK_MSG(rows == e1[0].rows && uniq == e1[0].unique, "%s: %d ranks read %llu rows (%llu distinct), one rank %llu (%llu)",
                  name, b, (unsigned long long)rows, (unsigned long long)uniq, (unsigned long long)e1[0].rows,
                  (unsigned long long)e1[0].unique);
        for (int r = 0; e1[0].rows && r < b; r++)
            CHECK_MSG(eb[r].rows == e1[0].rows / 2, "%s: rank %d of %d read %llu Engram rows, expected %llu", name, r, b,
                      (unsigned long long)eb[r].rows, (unsigned long long)e1[0].rows / 2);
        sparq_free(lb);
    }
    if (!strcmp(name, "tiny-dsv41")) CHECK_MSG(e1[0].rows > 0, "%s: no Engram rows read", name);
    else CHECK_EQ_INT(e1[0].rows, 0);
    if (device == SQ_DEVICE_CPU) {
        float *ld = run(fixture, 1, &nd);
        CHECK_MSG(ld && nd == n1 && l1 && memcmp(l1, ld, n1 * sizeof(float)) == 0,
                  "%s: the 1-box bundle's logits differ from the model folder's", name);
        sparq_free(ld);
    }
    sparq_free(l1);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        device = SQ_DEVICE_CUDA;
        const char *why;
        if (gpu_probe_count(&why) == 0) T_SKIP("gpu suite skipped: %s", why);
    }
    check_fixture("tiny-qwen3moe", 3);
    if (device == SQ_DEVICE_CPU) check_fixture("tiny-dsv41", 2); /* V4.1 runs on the CPU only */
    return t_summary();
}
