/* tests/runtime/test_dist_experts.c — the expert split (runtime/dist/dist.h)
 * with ranks as threads of one process (sq_transport_threads): the Qwen3-MoE
 * fixture packed with --split experts for 1, 2 and 3 boxes.
 *  - one box: logits bit for bit those of the model folder (nothing is
 *    combined, the arithmetic is sq_model_forward's);
 *  - 2 and 3 boxes: the greedy continuation (64 tokens) is one box's token
 *    for token, every logit is within the bound below of one box's, and every
 *    rank ends every step with the same hidden states to the bit (each rank's
 *    running hash of them, sq_dist_stats.hidden_hash, is the same);
 *  - a truncate, a reset and a two-sequence decode step reach every rank;
 *  - a rank that stops taking part (it never serves) ends rank 0's and the
 *    other worker's step within the timeout, both naming it.
 *
 *   test_runtime_dist_experts [cpu|cuda]     (default cpu)
 *   test_runtime_dist_experts_link fakedev   (built with -DSQ_TEST_FAKE_DEVICE)
 *
 * With `cuda` (the gpu suite; skipped without a GPU) every rank runs on GPU
 * 0: the MoE of each rank computes only its experts on the device, and the
 * partial sums are all-gathered over the device link (the CUDA backend's
 * same-process mailboxes) and added in rank order by its sum_parts kernel.
 * The checks above hold against one GPU rank, every rank sent link bytes
 * and staged none; then with SPARQ_DIST_DEVICE_LINK=0 the pieces go through
 * host memory instead, with the same logits to the bit. `fakedev` runs those
 * checks on the CPU with tests/runtime/fake_link.h's stand-in device and
 * link, and one more: its logits are the CPU ranks' to the bit (dist.c's
 * device path adds the same floats in the same order as its host path).
 *
 * The bound. One box adds a row's K = top_k expert outputs w_k·d_k into the
 * sum in expert order; N boxes add them per rank, then the N partial sums in
 * rank order: the same K terms in another association. Each order's fp32
 * sum is within (K-1)·u·Σ|w_k d_k| of the exact one (u = 2^-24), so the two
 * differ by at most 2(K-1)·u·Σ|w_k d_k| per element and layer — a relative
 * change of the MoE output of 6u ≈ 3.6e-7 for K = 4. It enters the residual
 * stream, passes RMS norms (scale invariant) and the next layers; with L
 * layers and a per-layer gain g of a perturbation it reaches the logits as at
 * most L·g·6u relative. We allow g = 10 (the fixture's layers amplify
 * relative changes by far less: the test prints the ratio seen, 0.2 when it
 * was written): |Δz| ≤ L·10·6u·max|z| = 4·10·6·2^-24·max|z| ≈ 1.4e-5·max|z|,
 * 3.1e-4 for the fixture's largest logit of 21.8 (6.2e-6 seen). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "dist_rank.h"
#include "gpu/gpu_probe.h"
#include "pack/pack.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/transport.h"
#include "t.h"
#ifdef SQ_TEST_FAKE_DEVICE
#include "fake_link.h" /* `fakedev`: the device path on the CPU */
#endif

enum { CTX = 256, USERS = 2, CHUNK = 16, N_PROMPT = 40, N_GEN = 64, N_BATCH = 4 };
/* every wait's deadline in the runs that must succeed: far above a step of the fixture (≤ 0.1 s on
 * this machine's CPUs), short enough that a broken run fails in seconds, not minutes */
#define T_STEP 20.0
/* logit rows rank 0 records: the prompt's last, each greedy step's, then two per batched step */
enum { N_ROWS = 1 + N_GEN + 2 * N_BATCH };

static int vocab;
static sq_device device = SQ_DEVICE_CPU;

typedef struct rank_arg {
    const char *bundle;
    sq_device dev;
    sq_transport *t;
    double timeout_s;
    bool idle;       /* open, then never serve (a rank that stopped) */
    float *logits;   /* rank 0: [N_ROWS, vocab] */
    int32_t gen[N_GEN];
    sparq_status st;
    char err[600];
    double secs;     /* from the first step until this rank's call returned */
    sq_dist_stats stats;
} rank_arg;

static int argmax(const float *z, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (z[i] > z[b]) b = i;
    return b;
}

/* Rank 0: sequence 0's prompt, N_GEN greedy tokens; then sequence 0 cut back
 * to 10 tokens, sequence 1 reset and given 3, and N_BATCH steps of both. */
static sparq_status leader(sq_dist *d, rank_arg *a)
{
    const int V = vocab;
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % 4000 + 10);
    float *z = a->logits;
    FORWARD_IF(sq_dist_forward(d, 0, prompt, N_PROMPT, SQ_LOGITS_LAST, z));
    const int seq0 = 0;
    for (int s = 0; s < N_GEN; s++) {
        a->gen[s] = (int32_t)argmax(z, V);
        z += V;
        FORWARD_IF(sq_dist_submit(d, 1, &seq0, &a->gen[s], SQ_LOGITS_LAST, z));
        FORWARD_IF(sq_dist_wait(d));
    }
    z += V;
    FORWARD_IF(sq_dist_seq_truncate(d, 0, 10));
    FORWARD_IF(sq_dist_seq_reset(d, 1));
    FORWARD_IF(sq_dist_forward(d, 1, prompt + 5, 3, SQ_LOGITS_NONE, NULL));
    const int both[2] = {0, 1};
    for (int s = 0; s < N_BATCH; s++) {
        const int32_t tok[2] = {(int32_t)(100 + s), (int32_t)(200 + s)};
        FORWARD_IF(sq_dist_submit(d, 2, both, tok, SQ_LOGITS_ALL, z));
        FORWARD_IF(sq_dist_wait(d));
        z += 2 * (size_t)V;
    }
    return SPARQ_OK;
}

static void *rank_main(void *v)
{
    rank_arg *a = v;
    sq_dist *d = NULL;
    a->st = dist_rank_open(&d, a->bundle, a->t, a->dev, CTX, USERS, CHUNK, a->timeout_s);
    const double t0 = sparq_now();
    if (a->st == SPARQ_OK) {
        if (a->t->rank == 0) {
            vocab = (int)sq_dist_cfg(d)->vocab_size;
            a->logits = sparq_calloc((size_t)vocab * N_ROWS, sizeof(float));
            a->st = a->logits ? leader(d, a) : SPARQ_E_NOMEM;
        } else if (a->idle) {
            usleep((useconds_t)(a->timeout_s * 3e6)); /* stopped: the others must not wait for it */
        } else {
            a->st = sq_dist_serve(d);
        }
    }
    a->secs = sparq_now() - t0;
    if (a->st != SPARQ_OK) snprintf(a->err, sizeof a->err, "%s", sparq_errmsg());
    if (d) sq_dist_get_stats(d, &a->stats);
    sq_dist_close(d);
    sq_transport_close(a->t);
    return NULL;
}

/* The bundle on `ranks` threads of `dev` (rank `idle` never serves; -1: none). */
static void run_on(sq_device dev, const char *bundle, int ranks, int idle, double timeout_s, rank_arg *a)
{
    sq_transport *t[4];
    CHECK(sq_transport_threads(ranks, t) == SPARQ_OK);
    pthread_t th[4];
    for (int r = 0; r < ranks; r++) {
        a[r] = (rank_arg){.bundle = bundle, .dev = dev, .t = t[r], .timeout_s = timeout_s, .idle = r == idle};
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL);
}

static void run(const char *bundle, int ranks, int idle, double timeout_s, rank_arg *a)
{
    run_on(device, bundle, ranks, idle, timeout_s, a);
}

/* GPU ranks (or the stand-in): the pieces went over the link, or (staged) through host memory, on every rank. */
static void check_path(const rank_arg *a, int b, bool staged)
{
    for (int r = 0; r < b; r++) {
        const sq_dist_stats *s = &a[r].stats;
        CHECK_MSG(staged ? s->staged_bytes > 0 && s->link_bytes == 0 : s->link_bytes > 0 && s->staged_bytes == 0,
                  "%d boxes, rank %d, %s: %llu bytes over the link, %llu staged", b, r,
                  staged ? "SPARQ_DIST_DEVICE_LINK=0" : "the device link", (unsigned long long)s->link_bytes,
                  (unsigned long long)s->staged_bytes);
    }
}

static bool same_logits(const rank_arg *x, const rank_arg *y)
{
    return x->logits && y->logits && !memcmp(x->logits, y->logits, (size_t)vocab * N_ROWS * sizeof(float));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
#ifdef SQ_TEST_FAKE_DEVICE
    if (!strcmp(mode, "fakedev")) device = SQ_DEVICE_CUDA; /* fake_link.h's exec: no GPU */
#endif
    if (!strcmp(mode, "cuda")) {
        device = SQ_DEVICE_CUDA;
        const char *why;
        if (gpu_probe_count(&why) == 0) T_SKIP("gpu suite skipped: %s", why);
    }
    const char *fixture = t_data_path("tiny-qwen3moe");
    char dir[] = "/tmp/sparq-dist-experts-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char bundle[4][600];
    for (int b = 1; b <= 3; b++) {
        snprintf(bundle[b], sizeof bundle[b], "%s/e%d", dir, b);
        const sparq_status st = dist_rank_pack(fixture, bundle[b], b, SQ_SPLIT_EXPERTS, CTX, USERS, CHUNK);
        CHECK_MSG(st == SPARQ_OK, "pack %d boxes --split experts: %s", b, sparq_errmsg());
    }
    rank_arg one[1], folder[1];
    run(bundle[1], 1, -1, T_STEP, one);
    CHECK_MSG(one[0].st == SPARQ_OK, "1 box: %s", one[0].err);
    run(fixture, 1, -1, T_STEP, folder);
    CHECK_MSG(folder[0].st == SPARQ_OK, "the model folder: %s", folder[0].err);
    const size_t n = (size_t)vocab * N_ROWS;
    CHECK_MSG(one[0].logits && folder[0].logits && !memcmp(one[0].logits, folder[0].logits, n * sizeof(float)),
              "the 1-box expert-split bundle's logits differ from the model folder's");
    float zmax = 0;
    for (size_t i = 0; one[0].logits && i < n; i++) {
        const float z = one[0].logits[i] < 0 ? -one[0].logits[i] : one[0].logits[i];
        if (z > zmax) zmax = z;
    }
    const double u = 1.0 / (1 << 24), K = 4, L = 4, gain = 10;
    const double bound = L * gain * 2 * (K - 1) * u * zmax;
    for (int b = 2; b <= 3 && one[0].logits; b++) {
        rank_arg a[3];
        run(bundle[b], b, -1, T_STEP, a);
        for (int r = 0; r < b; r++) CHECK_MSG(a[r].st == SPARQ_OK, "%d boxes, rank %d: %s", b, r, a[r].err);
        if (!a[0].logits) continue;
        CHECK_MSG(!memcmp(a[0].gen, one[0].gen, sizeof a[0].gen), "%d boxes: the greedy continuation differs from "
                  "one box's", b);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            const double dz = a[0].logits[i] > one[0].logits[i] ? a[0].logits[i] - one[0].logits[i]
                                                                : one[0].logits[i] - a[0].logits[i];
            if (dz > worst) worst = dz;
        }
        printf("%d boxes: max |logit - one box's| = %.3g (max |logit| %.3g, bound %.3g; seen gain %.3g)\n", b,
               worst, zmax, bound, worst / (L * 2 * (K - 1) * u * zmax));
        CHECK_MSG(worst <= bound, "%d boxes: a logit %.3g from one box's, over the bound %.3g", b, worst, bound);
        if (device != SQ_DEVICE_CPU) {
            check_path(a, b, false);
            rank_arg h[3];
            setenv("SPARQ_DIST_DEVICE_LINK", "0", 1);
            run(bundle[b], b, -1, T_STEP, h);
            unsetenv("SPARQ_DIST_DEVICE_LINK");
            for (int r = 0; r < b; r++) CHECK_MSG(h[r].st == SPARQ_OK, "%d boxes staged, rank %d: %s", b, r, h[r].err);
            check_path(h, b, true);
            CHECK_MSG(same_logits(&h[0], &a[0]), "%d boxes: the logits staged through host memory differ from "
                      "those over the device link", b);
            for (int r = 0; r < b; r++) sparq_free(h[r].logits);
        }
        if (!strcmp(mode, "fakedev")) { /* the device path of dist.c adds what its host path adds */
            rank_arg c[3];
            run_on(SQ_DEVICE_CPU, bundle[b], b, -1, T_STEP, c);
            CHECK_MSG(same_logits(&c[0], &a[0]), "%d boxes: the stand-in device's logits differ from the CPU's", b);
            for (int r = 0; r < b; r++) sparq_free(c[r].logits);
        }
        for (int r = 1; r < b; r++)
            CHECK_MSG(a[r].stats.hidden_hash == a[0].stats.hidden_hash && a[0].stats.hidden_hash != 0 &&
                          a[r].stats.steps == a[0].stats.steps,
                      "%d boxes: rank %d's hidden states differ from rank 0's (hash %016llx vs %016llx, %llu vs %llu "
                      "steps)", b, r, (unsigned long long)a[r].stats.hidden_hash,
                      (unsigned long long)a[0].stats.hidden_hash, (unsigned long long)a[r].stats.steps,
                      (unsigned long long)a[0].stats.steps);
        for (int r = 0; r < b; r++) sparq_free(a[r].logits);
    }
    /* rank 2 of 3 stops taking part: rank 0 and rank 1 end their first step's all-gather naming it */
    {
        const double timeout = 1.0;
        rank_arg a[3];
        run(bundle[3], 3, 2, timeout, a);
        for (int r = 0; r < 2; r++) { /* the transport's all-gather, or the link's send or receive, names it */
            const bool named = device == SQ_DEVICE_CPU ? strstr(a[r].err, "nothing from rank 2") != NULL
                                                       : strstr(a[r].err, "over the device link") != NULL;
            CHECK_MSG(a[r].st == SPARQ_E_TIMEOUT && named && strstr(a[r].err, "rank 2 is stopped, hung or dead"),
                      "rank %d with rank 2 stopped: %s (%s)", r, sparq_status_str(a[r].st), a[r].err);
            CHECK_MSG(a[r].secs < timeout + 5, "rank %d ended %.1f s after the step began (timeout %.1f s)", r,
                      a[r].secs, timeout);
        }
        printf("rank 2 stopped: rank 0 said: %s\n", a[0].err);
        for (int r = 0; r < 3; r++) sparq_free(a[r].logits);
    }
    sparq_free(one[0].logits);
    sparq_free(folder[0].logits);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return t_summary();
}
