/* tools/bench/dist_bench.c — throughput of the multi-process runtime
 * (runtime/dist/dist.h), a pipeline or an expert-split bundle (the bundle
 * says which), run under mpirun like `sparq run`:
 *
 *   mpirun -np R dist_bench BUNDLE [--tokens T] [--users 1,2,4] [--threads N] [--reps K] [--device cpu|cuda]
 *   dist_bench BUNDLE --ranks R [same options]       R ranks as threads of this process
 *
 * --device cuda runs every rank on its GPU: the hidden states then go over
 * the device link (NCCL between processes; with --ranks, the CUDA backend's
 * same-process mailboxes, every rank on GPU 0), or through host memory with
 * SPARQ_DIST_DEVICE_LINK=0 (the two to compare); a line says which the run
 * took. The wire figures below are the host transport's in either case.
 *
 * Rank 0 first measures the wire: one-way time of a one-row step message
 * (hidden state + ids) between neighbours and of a logits row from the last
 * rank back, by ping-pong (median of 2000). Then, for each user count U, it
 * generates T greedy tokens for U sequences at once (micro-batched,
 * runtime/generate.h; best of K) and prints aggregate and per-sequence
 * tokens/s, the ratio to U = 1 measured in the same run, and the
 * communication part of one token: step hops + 1 logits message.
 * An expert-split bundle: the wire is rank 0's message of a one-row step to
 * rank 1 and the all-gather of one row's partial MoE sums (median of 2000),
 * and one token's communication is the step message + one all-gather per
 * MoE layer. tools/bench/dist_bench.sh runs it on 1, 2 and 3 ranks, both
 * splits, and adds the ratio to one rank. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "runtime/dist/dist.h"
#include "runtime/generate.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median time of an all-gather of n bytes from every rank. */
static double allgather_time(sq_transport *t, size_t n, int reps)
{
    char *mine = sparq_calloc(1, n), *all = sparq_calloc((size_t)t->size, n);
    double *dt = sparq_malloc((size_t)reps * sizeof(double));
    for (int i = 0; i < reps; i++) {
        const double t0 = sparq_now();
        t->vt->allgather(t, mine, n, all, 10);
        dt[i] = sparq_now() - t0;
    }
    qsort(dt, (size_t)reps, sizeof(double), cmp_d);
    const double med = dt[reps / 2];
    sparq_free(mine);
    sparq_free(all);
    sparq_free(dt);
    return med;
}

/* Median one-way time of an n-byte message between ranks a and b. */
static double pingpong(sq_transport *t, int a, int b, size_t n, int reps)
{
    if (t->rank != a && t->rank != b) return 0;
    char *buf = sparq_calloc(1, n);
    double *dt = sparq_malloc((size_t)reps * sizeof(double));
    const int peer = t->rank == a ? b : a;
    size_t got;
    for (int i = 0; i < reps; i++) {
        double t0 = sparq_now();
        if (t->rank == a) {
            t->vt->isend(t, peer, SQ_TAG_INIT, buf, n, 0);
            t->vt->wait_send(t, 0, 10);
            t->vt->recv(t, peer, SQ_TAG_INIT, buf, n, &got, 10);
        } else {
            t->vt->recv(t, peer, SQ_TAG_INIT, buf, n, &got, 10);
            t->vt->isend(t, peer, SQ_TAG_INIT, buf, n, 0);
            t->vt->wait_send(t, 0, 10);
        }
        dt[i] = (sparq_now() - t0) / 2;
    }
    qsort(dt, (size_t)reps, sizeof(double), cmp_d);
    double med = dt[reps / 2];
    sparq_free(buf);
    sparq_free(dt);
    return med;
}

typedef struct bench_args {
    const char *path, *users_s;
    int T, threads, reps;
    sq_device device;
} bench_args;

static int bench_rank(const bench_args *a, sq_transport *t);

typedef struct rank_job {
    const bench_args *a;
    sq_transport *t;
    int rc;
} rank_job;

static void *rank_thread(void *v)
{
    rank_job *j = v;
    j->rc = bench_rank(j->a, j->t);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *users_s = "1,2,4";
    int T = 64, threads = 1, reps = 3, ranks = 0;
    sq_device device = SQ_DEVICE_CPU;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--users") && i + 1 < argc) users_s = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc && sq_device_parse(argv[i + 1], &device) == SPARQ_OK) i++;
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc && atoi(argv[i + 1]) >= 1) ranks = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "usage: [mpirun -np R] dist_bench BUNDLE [--tokens T] [--users 1,2,4] [--threads N] "
                            "[--reps K] [--device cpu|cuda] [--ranks R]\n");
            return 2;
        }
    }
    if (!path) return fprintf(stderr, "dist_bench: give a BUNDLE\n"), 2;
    const bench_args a = {path, users_s, T, threads, reps, device};
    if (ranks == 0) { /* one rank of mpirun's (or the only one) */
        sq_transport *t;
        sparq_status st = sq_transport_auto(&t);
        if (st != SPARQ_OK) return fprintf(stderr, "dist_bench: %s\n", sparq_errmsg()), 1;
        return bench_rank(&a, t);
    }
    sq_transport **t = sparq_calloc((size_t)ranks, sizeof *t);
    rank_job *job = sparq_calloc((size_t)ranks, sizeof *job);
    pthread_t *th = sparq_calloc((size_t)ranks, sizeof *th);
    if (!t || !job || !th || sq_transport_threads(ranks, t) != SPARQ_OK)
        return fprintf(stderr, "dist_bench: %d thread ranks: %s\n", ranks, sparq_errmsg()), 1;
    for (int r = 0; r < ranks; r++) {
        job[r] = (rank_job){&a, t[r], 0};
        pthread_create(&th[r], NULL, rank_thread, &job[r]);
    }
    int rc = 0;
    for (int r = 0; r < ranks; r++) {
        pthread_join(th[r], NULL);
        if (job[r].rc) rc = job[r].rc;
    }
    sparq_free(t);
    sparq_free(job);
    sparq_free(th);
    return rc;
}

/* One rank: open, measure the wire, then rank 0 generates and the others serve. Closes t. */
static int bench_rank(const bench_args *a, sq_transport *t)
{
    const char *path = a->path;
    const int T = a->T, threads = a->threads, reps = a->reps;
    sparq_status st;
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.n_threads = threads;
    mo.device = a->device;
    sq_dist *d = NULL;
    bool reported = false;
    st = sq_dist_open(&d, path, &mo, NULL, t, &reported);
    if (st != SPARQ_OK) {
        if (!reported) fprintf(stderr, "dist_bench: %s\n", sparq_errmsg());
        sq_transport_close(t);
        return 1;
    }
    const int R = t->size, D = (int)sq_dist_cfg(d)->hidden_size, V = (int)sq_dist_cfg(d)->vocab_size;
    const bool esplit = sq_model_expert_split(sq_dist_model(d)) > 0;
    int M = 0; /* MoE layers: one all-gather each under the expert split */
    for (int l = 0; l < (int)sq_dist_cfg(d)->num_hidden_layers; l++) M += sq_config_is_moe_layer(sq_dist_cfg(d), l);
    /* the wire, before the steps start: every neighbour pair, then last -> 0 (the pipeline); rank 0 -> 1 and
     * the all-gather of one row (the expert split) */
    const size_t step_msg = esplit ? 32 + 12 : 32 + 8 + (size_t)D * 4, logit_msg = (size_t)V * 4;
    double hop = 0, back = 0, gather = 0;
    for (int k = 0; k + 1 < R && !esplit; k++) {
        double h = pingpong(t, k, k + 1, step_msg, 2000);
        if (t->rank == k) hop = h; /* rank k measured its own hop */
    }
    if (R > 1 && !esplit) back = pingpong(t, R - 1, 0, logit_msg, 2000);
    if (R > 1 && esplit) {
        hop = pingpong(t, 0, 1, step_msg, 2000);
        gather = allgather_time(t, (size_t)D * 4, 2000);
    }
    if (t->rank != 0) {
        st = sq_dist_serve(d);
        if (st != SPARQ_OK) fprintf(stderr, "dist_bench: %s\n", sparq_errmsg());
        sq_dist_close(d);
        sq_transport_close(t);
        return st == SPARQ_OK ? 0 : 1;
    }
    /* per-token communication: assume every hop like rank 0's (one box type) */
    const double comm = esplit ? (R > 1 ? hop + M * gather : 0) : (R - 1) * hop + back;
    printf("dist_bench: %s, %d rank%s, %d thread(s) each, hidden %d, vocab %d, split %s\n", path, R,
           R == 1 ? "" : "s", threads, D, V, esplit ? "experts" : "pipeline");
    if (esplit)
        printf("wire: step message %zu B one-way %.1f us; all-gather of %d B per rank %.1f us, %d per token "
               "(MoE layers); per token %.1f us\n", step_msg, hop * 1e6, D * 4, gather * 1e6, M, comm * 1e6);
    else
        printf("wire: step message %zu B one-way %.1f us; logits message %zu B one-way %.1f us; per token %.1f us\n",
               step_msg, hop * 1e6, logit_msg, back * 1e6, comm * 1e6);
    const char *why;
    const char *via = sq_dist_hidden_path(d, &why);
    printf("hidden states: %s%s%s%s\n", via, why[0] ? " (" : "", why, why[0] ? ")" : "");
    printf("%-6s %-6s %-12s %-12s %-10s %-14s\n", "ranks", "users", "agg tok/s", "per-seq", "vs 1 user",
           "comm/token us");
    const int32_t prompt[] = {1, 2, 3, 4, 5, 6, 7, 8};
    double base = 0;
    char *users = sparq_strdup(a->users_s), *save = NULL;
    for (char *tok = strtok_r(users, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const int U = atoi(tok);
        double best = 0;
        for (int k = 0; k < reps; k++) {
            sq_gen_opts o = {.n_seqs = U, .n_new = T, .ignore_stop = true};
            sq_sampler_params_default(&o.sampler);
            o.sampler.temp = 0;
            sq_gen_result r;
            st = sq_generate(d, prompt, 8, &o, &r);
            if (st != SPARQ_OK) break;
            double rate = r.t_decode > 0 ? (double)r.n_decode / r.t_decode : 0;
            if (rate > best) best = rate;
            sq_gen_result_free(&r);
        }
        if (st != SPARQ_OK) {
            fprintf(stderr, "dist_bench: %d users: %s\n", U, sparq_errmsg());
            break;
        }
        if (base == 0) base = best;
        printf("%-6d %-6d %-12.1f %-12.1f %-10.2f %-14.1f\n", R, U, best, best / U, best / base, comm * 1e6);
    }
    sparq_free(users);
    sq_dist_close(d);
    sq_transport_close(t);
    return st == SPARQ_OK ? 0 : 1;
}
