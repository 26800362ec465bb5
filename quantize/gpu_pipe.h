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
 * message is the one returned. */
#ifndef SPARQ_QUANTIZE_GPU_PIPE_H
#define SPARQ_QUANTIZE_GPU_PIPE_H

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
} qz_pipe_ops;

typedef struct qz_pipe_stats {
    double wall;            /* the whole run */
    double prepare, finish; /* the CPU stages, summed */
    double gpu;             /* the batches' GPU busy time, summed (wait's gpu_seconds) */
    double waited;          /* the host blocked in wait */
    int batches;
} qz_pipe_stats;

/* Runs n_items through the pipeline. overlap = 0: each batch is waited for
 * right after its submit (the sequential driver, for comparisons; the same
 * batches). stats may be NULL. */
sparq_status qz_pipe_run(const qz_pipe_ops *ops, int n_items, int overlap, qz_pipe_stats *stats);

#endif
