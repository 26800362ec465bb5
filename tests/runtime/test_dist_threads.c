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
 *   test_runtime_dist_link fakedev           (built with -DSQ_TEST_FAKE_DEVICE)
 *
 * With `cuda` every rank runs its layers on GPU 0 and hidden states go from
 * rank to rank over the device link (runtime/dist/dist.h: the CUDA backend's
 * same-process mailboxes, device to device on the streams): the logits are
 * those of one rank to the bit, every rank but the last sent link bytes and
 * no hidden state through host memory; then again with
 * SPARQ_DIST_DEVICE_LINK=0, which stages them through host memory as before,
 * with the same logits; and a rank that stops (3 ranks, rank 2 never serves,
 * --timeout 1) ends rank 1's send over the link with a timeout naming rank
 * 2. The GPU suite runs it that way (it skips without a GPU). On the CPU the
 * hidden states are staged (link bytes 0). `fakedev` runs the `cuda` checks
 * on the CPU with tests/runtime/fake_link.h's stand-in device and link, so
 * the unit suite covers dist.c's link path (not the CUDA one), and one more:
 * when the last rank cannot open its end of the link, every rank stages
 * through host memory, with the same logits, and says why. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "dist_rank.h"
#include "gpu/gpu_probe.h"
#include "pack/pack.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/transport.h"
#include "t.h"
#ifdef SQ_TEST_FAKE_DEVICE
#include "fake_link.h" /* `fakedev`: the device-link path on the CPU */
#endif

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
    sq_dist_stats stats;             /* this rank's figures at the end */
    char path[64], why[300];         /* sq_dist_hidden_path */
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
    if (d) {
        const char *why;
        sq_dist_get_stats(d, &a->stats);
        snprintf(a->path, sizeof a->path, "%s", sq_dist_hidden_path(d, &why));
        snprintf(a->why, sizeof a->why, "%s", why);
    }
    sq_dist_close(d);
    sq_transport_close(a->t);
    return NULL;
}

/* How the last run_stats's ranks handed hidden states on (rank r: last_run[r]). */
static rank_arg last_run[4];
static int last_ranks;

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
    memcpy(last_run, a, sizeof a[0] * (size_t)ranks);
    last_ranks = ranks;
    *n = a[0].n_logits;
    if (engram) memcpy(engram, a[0].engram, sizeof a[0].engram);
    return a[0].logits;
}

static float *run(const char *bundle, int ranks, size_t *n) { return run_stats(bundle, ranks, n, NULL); }

/* The last run's ranks handed their hidden states on as `link` says: over the
 * device link (bytes on it, none staged) or through host memory (the
 * reverse); the last rank hands none on. */
static void check_hidden_path(const char *name, bool link)
{
    for (int r = 0; r < last_ranks; r++) {
        const rank_arg *a = &last_run[r];
        const bool sends = r < last_ranks - 1;
        CHECK_MSG(!strcmp(a->path, link ? "device link (same process)" : "host memory"),
                  "%s: %d ranks, rank %d: hidden states via %s (%s)", name, last_ranks, r, a->path, a->why);
        CHECK_MSG(link ? (a->stats.link_bytes > 0) == sends && a->stats.staged_bytes == 0
                       : a->stats.link_bytes == 0 && (a->stats.staged_bytes > 0) == sends,
                  "%s: %d ranks, rank %d: %llu bytes over the link, %llu staged", name, last_ranks, r,
                  (unsigned long long)a->stats.link_bytes, (unsigned long long)a->stats.staged_bytes);
    }
}

/* A stopped rank on the device link: 3 ranks, --timeout 1; rank 2 opens and
 * never serves (it closes after 3 s), so rank 1's third send finds both of
 * its buffers towards rank 2 unread and fails naming rank 2 (on mpirun rank
 * 1 then prints that and ends every rank). Rank 0's wait for a result times
 * out too (on threads it cannot name a rank: find_silent has no one to ping). */
static void *stop_main(void *v)
{
    rank_arg *a = v;
    sq_dist *d = NULL;
    a->st = dist_rank_open(&d, a->bundle, a->t, device, CTX, USERS, CHUNK, 1.0);
    if (a->st == SPARQ_OK && a->t->rank == 0) {
        const int V = (int)sq_dist_cfg(d)->vocab_size;
        float *lg = sparq_malloc(sizeof(float) * (size_t)V * 4);
        a->st = lg ? SPARQ_OK : SPARQ_E_NOMEM;
        /* three steps, paced so that rank 1 has taken step 0 before step 2 needs its buffer (rank 0
         * would otherwise wait for a result, which never comes, and rank 1 never see step 2) */
        for (int i = 0; i < 3 && a->st == SPARQ_OK; i++) {
            const int seq = i % USERS;
            const int32_t tok = 100 + i;
            if (i) usleep(300 * 1000);
            a->st = sq_dist_submit(d, 1, &seq, &tok, SQ_LOGITS_LAST, lg + (size_t)i * V);
        }
        while (a->st == SPARQ_OK && sq_dist_pending(d)) a->st = sq_dist_wait(d);
        if (a->st != SPARQ_OK) snprintf(a->err, sizeof a->err, "%s", sparq_errmsg());
        sq_dist_close(d); /* gives up on the steps in flight after one more timeout */
        sparq_free(lg);
    } else if (a->st == SPARQ_OK && a->t->rank == 1) {
        a->st = sq_dist_serve(d);
        if (a->st != SPARQ_OK) snprintf(a->err, sizeof a->err, "%s", sparq_errmsg());
        sq_dist_close(d);
    } else {
        if (a->st != SPARQ_OK) snprintf(a->err, sizeof a->err, "%s", sparq_errmsg());
        sleep(3);
        sq_dist_close(d);
    }
    sq_transport_close(a->t);
    return NULL;
}

static void check_stopped_rank(const char *bundle)
{
    sq_transport *t[3];
    CHECK(sq_transport_threads(3, t) == SPARQ_OK);
    rank_arg a[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        a[r] = (rank_arg){.bundle = bundle, .t = t[r]};
        pthread_create(&th[r], NULL, stop_main, &a[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    CHECK_MSG(a[2].st == SPARQ_OK, "rank 2: %s", a[2].err);
    CHECK_MSG(a[1].st == SPARQ_E_TIMEOUT && strstr(a[1].err, "rank 2 is stopped") && strstr(a[1].err, "device link"),
              "rank 1: status %d: %s", (int)a[1].st, a[1].err);
    CHECK_MSG(a[0].st == SPARQ_E_TIMEOUT, "rank 0: status %d: %s", (int)a[0].st, a[0].err);
}

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
        check_hidden_path(name, device == SQ_DEVICE_CUDA);
        if (device == SQ_DEVICE_CUDA) { /* the switch: staged through host memory, the same logits */
            setenv("SPARQ_DIST_DEVICE_LINK", "0", 1);
            size_t ns = 0;
            float *ls = run(bundle[b], b, &ns);
            unsetenv("SPARQ_DIST_DEVICE_LINK");
            CHECK_MSG(ls && ns == n1 && l1 && memcmp(l1, ls, n1 * sizeof(float)) == 0,
                      "%s: cuda: %d ranks staged through the host: logits differ from one rank", name, b);
            check_hidden_path(name, false);
            CHECK_MSG(strstr(last_run[0].why, "SPARQ_DIST_DEVICE_LINK=0"), "rank 0 says %s", last_run[0].why);
            sparq_free(ls);
#ifdef SQ_TEST_FAKE_DEVICE
            /* the last rank cannot open its end of the link: every rank stages, the same logits */
            setenv("FAKE_LINK_FAIL_RANK", b == 2 ? "1" : "2", 1);
            ls = run(bundle[b], b, &ns);
            unsetenv("FAKE_LINK_FAIL_RANK");
            CHECK_MSG(ls && ns == n1 && l1 && memcmp(l1, ls, n1 * sizeof(float)) == 0,
                      "%s: %d ranks, one without a link: logits differ from one rank", name, b);
            check_hidden_path(name, false);
            CHECK_MSG(strstr(last_run[0].why, "another rank could not open"), "rank 0 says %s", last_run[0].why);
            CHECK_MSG(strstr(last_run[b - 1].why, "refuses its end"), "rank %d says %s", b - 1, last_run[b - 1].why);
            sparq_free(ls);
#endif
        }
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
    if (device == SQ_DEVICE_CUDA && max_boxes >= 3) check_stopped_rank(bundle[3]);
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
#ifdef SQ_TEST_FAKE_DEVICE
    if (argc > 1 && !strcmp(argv[1], "fakedev")) device = SQ_DEVICE_CUDA; /* fake_link.h's exec: no GPU */
#endif
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        device = SQ_DEVICE_CUDA;
        const char *why;
        if (gpu_probe_count(&why) == 0) T_SKIP("gpu suite skipped: %s", why);
    }
    check_fixture("tiny-qwen3moe", 3);
    if (device == SQ_DEVICE_CPU) check_fixture("tiny-dsv41", 2); /* V4.1 runs on the CPU only */
    return t_summary();
}
