/* quantize/gpu_pipe.h — the two-stage pipeline that `sparq quantize --device
 * cuda` (quantize/layer_cuda.c) and tools/bench/quantize_layer_bench.c run
 * their GPU batches through: while the GPU runs batch b, the CPU prepares
 * batch b+1 (loads, Hessians, regularisation); then the pipeline waits for b,
 * finishes it on the CPU and submits b+1:
 *
 *     plan(b+1) · prepare(b+1) · wait(b) · finish(b) · submit(b+1) · plan(b+2) …
 *
 * So prepares run in batch order, each after the previous one (whatever one
 * batch's preparation decides — a shared scale — the next sees), finishes run
 * in batch order, and at most one batch is on the GPU while one more is being
 * prepared. Knows nothing of the GPU or of linears: the caller's callbacks do
 * the work. An error in any stage stops both: the batch in flight is waited
 * for (its result dropped), every batch is released, and the first error's
 * message is the one returned.
 *
 * Several devices (`--devices`, qz_pipe_run_multi): one such pipeline per
 * device, each on its own host thread, taking the next batch from one shared
 * queue of items: a pipeline plans and prepares its next batch at the queue's
 * head (plans and prepares run one at a time, in queue order, whichever
 * pipeline makes them; so a preparation still sees what the previous one
 * decided), and finishes run one at a time. A batch's results go to its items'
 * own slots, so the order in which the devices finish does not matter. The
 * first error in any pipeline stops them all the same way. */
#ifndef SPARQ_QUANTIZE_GPU_PIPE_H
#define SPARQ_QUANTIZE_GPU_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct qz_pipe_ops {
    void *ctx;
    /* How many items from `first` on the next batch takes (*count ≥ 1), with
     * `busy` the batch in flight beside which it will be prepared (NULL: none).
     * *count = 0 with busy set: it does not fit beside busy, the pipeline waits
     * for busy first and asks again. */
    sparq_status (*plan)(void *ctx, int first, const void *busy, int *count);
    /* The CPU stage before the GPU: items [first, first + count) into *batch
     * (set it even on failure when there is something to release). */
    sparq_status (*prepare)(void *ctx, int first, int count, void **batch);
    /* Queue the batch on the GPU; on failure nothing of it is in flight. */
    sparq_status (*submit)(void *ctx, void *batch);
    /* Wait for a submitted batch; *gpu_seconds = its GPU busy time. */
    sparq_status (*wait)(void *ctx, void *batch, double *gpu_seconds);
    /* The CPU stage after the GPU. */
    sparq_status (*finish)(void *ctx, void *batch);
    /* Free a batch at any stage (never one in flight). */
    void (*release)(void *ctx, void *batch);
    /* NULL, or what this pipeline is (e.g. "CUDA device 1"): its errors' context. */
    const char *name;
} qz_pipe_ops;

typedef struct qz_pipe_stats {
    double wall;            /* the whole run */
    double prepare, finish; /* the CPU stages, summed */
    double gpu;             /* the batches' GPU busy time, summed (wait's gpu_seconds) */
    double waited;          /* the host blocked in wait */
    int batches;
} qz_pipe_stats;

/* The batch-size rule both callers use. Two batches must fit at once — one
 * on the GPU, the next being prepared beside it — so a batch takes at most
 * half of the device room (free device memory, after the encoders, plus
 * what the batch in flight holds) and half of the host budget; beside a
 * batch in flight, what the next one holds while it is prepared (its
 * Hessians on the device) must fit in what is free now, and its host bytes
 * in what the budget has left. */
typedef struct qz_pipe_cost {
    size_t dev;       /* device bytes a batch holds once submitted (its allocation and Hessians) */
    size_t dev_early; /* of which it holds from its preparation on */
    uint64_t host;    /* host bytes it holds */
} qz_pipe_cost;

typedef struct qz_pipe_room {
    size_t dev_free;    /* free device memory now, less the caller's margin */
    size_t dev_held;    /* device bytes of the batch in flight (0: none) */
    uint64_t host;      /* the host budget */
    uint64_t host_held; /* host bytes of the batch in flight */
    int busy;           /* a batch is in flight */
} qz_pipe_room;

/* How many of the next avail items one batch takes under the rule; cost(ctx,
 * m, &c) gives what a batch of the first m holds (growing with m). With
 * nothing in flight and not even one item fitting in half, a batch may take
 * the whole room alone (no overlap for it). 0: nothing fits (beside the
 * batch in flight: wait for it and ask again; alone: too large). */
int qz_pipe_fit(const qz_pipe_room *r, int avail, void (*cost)(void *ctx, int m, qz_pipe_cost *c), void *ctx);

/* Runs n_items through the pipeline. overlap = 0: each batch is waited for
 * right after its submit (the sequential driver, for comparisons; the same
 * batches). stats may be NULL. */
sparq_status qz_pipe_run(const qz_pipe_ops *ops, int n_items, int overlap, qz_pipe_stats *stats);

/* The most pipelines qz_pipe_run_multi runs (and so the most `--devices`). */
#define QZ_PIPE_MAX 16

/* n_pipes (1..QZ_PIPE_MAX) pipelines, ops[i] the i-th (each its own ctx),
 * sharing one queue of n_items; pipeline 0 runs on the calling thread.
 * stats (may be NULL): n_pipes entries, each pipeline's own (its wall time,
 * its batches, its devices' busy seconds). n_pipes = 1 is qz_pipe_run. */
sparq_status qz_pipe_run_multi(const qz_pipe_ops *ops, int n_pipes, int n_items, int overlap, qz_pipe_stats *stats);

#endif
