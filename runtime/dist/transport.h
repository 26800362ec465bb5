/* runtime/dist/transport.h — how the processes of a multi-box run talk.
 *
 * A run on N boxes is N processes (ranks), one per box, started by mpirun
 * (or, for tests, N threads of one process: sq_transport_threads).
 * runtime/dist/dist.h moves messages between them through this interface, so
 * the wire is swappable: MPI point-to-point here (CPU boxes, or GPU boxes
 * staging through host memory). When every rank is a GPU, the hidden states
 * themselves go over a device link instead (kernels/backend.h, link_open:
 * NCCL between processes), and this transport carries everything else, the
 * link's NCCL unique id included (rank 0 makes it and broadcasts it:
 * sq_transport_nccl_bootstrap).
 *
 * Semantics kept deliberately small:
 *  - messages are byte buffers with a tag; between two ranks, messages of one
 *    tag arrive in the order they were sent (MPI's non-overtaking rule);
 *  - isend() starts a send from one of SQ_TRANSPORT_SLOTS slots and returns
 *    at once; the buffer must stay untouched until wait_send() on that slot;
 *  - every wait (recv, wait_send) has a timeout, so a stalled or dead peer
 *    turns into SPARQ_E_TIMEOUT with a message naming the peer, never a hang.
 *    A negative timeout waits forever (a worker idling between requests);
 *  - while a rank waits it answers liveness pings, so that the rank that
 *    noticed a timeout can find out which peer stopped answering
 *    (find_silent) before it aborts the whole job;
 *  - rank 0 sends heartbeats (keepalive), so a worker waiting without a
 *    deadline for rank 0's next request still notices when rank 0 stops.
 * Time spent inside waits and the bytes moved are counted for the
 * per-token communication figures of tools/bench/dist_bench.c. */
#ifndef SPARQ_RUNTIME_TRANSPORT_H
#define SPARQ_RUNTIME_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define SQ_TRANSPORT_SLOTS 16

enum sq_transport_tag {
    SQ_TAG_STEP = 1,   /* a pipeline message to the next stage */
    SQ_TAG_RESULT = 2, /* logits from the last stage to rank 0 */
    SQ_TAG_INIT = 3,   /* start-up exchanges */
    SQ_TAG_STATS = 4,  /* a rank's figures to rank 0 (sq_dist_engram_stats) */
    SQ_TAG_GATHER = 5, /* the pieces of an all-gather (the experts split's combine) */
};

typedef struct sq_transport sq_transport;

typedef struct sq_transport_vt {
    sparq_status (*isend)(sq_transport *t, int dst, int tag, const void *buf, size_t n, int slot);
    sparq_status (*wait_send)(sq_transport *t, int slot, double timeout_s);
    /* Has the send from `slot` completed (or is the slot free)? Never blocks. */
    bool (*send_done)(sq_transport *t, int slot);
    /* Receive one message of `tag` from `src` into buf (cap bytes); *got = its size. */
    sparq_status (*recv)(sq_transport *t, int src, int tag, void *buf, size_t cap, size_t *got, double timeout_s);
    /* Every rank gets root's n bytes. */
    sparq_status (*bcast)(sq_transport *t, int root, void *buf, size_t n);
    /* Rank 0 gets every rank's n bytes in rank order in all[size * n]. */
    sparq_status (*gather)(sq_transport *t, const void *mine, size_t n, void *all);
    /* Every rank gets every rank's n bytes in rank order in all[size * n]
     * (all + rank * n is its own `mine`). Point-to-point underneath (tag
     * SQ_TAG_GATHER), never MPI's collectives: each wait has the deadline
     * timeout_s and a late piece names the rank it is missing from, so a
     * stopped or dead rank ends every other rank's wait within the timeout.
     * Every rank must call it the same number of times in the same order
     * (pieces of one tag from one rank arrive in order, so successive
     * all-gathers cannot mix). Callers that reduce the pieces add them in
     * rank order on every rank: the result is then bit-identical everywhere
     * and independent of arrival order (runtime/dist/dist.c). */
    sparq_status (*allgather)(sq_transport *t, const void *mine, size_t n, void *all, double timeout_s);
    /* Ping every other rank; the lowest rank that does not answer within
     * wait_s seconds, or -1 when all answer. */
    int (*find_silent)(sq_transport *t, double wait_s);
    /* End every rank of the job now (after the caller printed why). */
    void (*abort)(sq_transport *t, int code);
    void (*close)(sq_transport *t);
    /* Liveness of rank 0, for the waits that have no deadline (a worker idle
     * between requests): rank 0 tells every other rank that it is alive every
     * timeout_s / 4 seconds, from a thread of its own, so also while it waits
     * for a user or computes; every other rank then ends any wait with
     * SPARQ_E_TIMEOUT naming rank 0 once timeout_s pass without a word from
     * it (stopped, hung or dead). Every rank calls it once, with the same
     * timeout. NULL where ranks cannot stall on their own (local, threads). */
    void (*keepalive)(sq_transport *t, double timeout_s);
} sq_transport_vt;

struct sq_transport {
    const sq_transport_vt *vt;
    const char *name; /* "local", "mpi", "threads" */
    int rank, size;
    bool one_process; /* every rank is a thread of this process (threads, local): a pointer means the same everywhere */
    double t_wait;    /* seconds spent inside recv / wait_send */
    uint64_t bytes_sent, msgs_sent;
};

/* One process alone (size 1): every operation is trivial. */
sparq_status sq_transport_local(sq_transport **out);

/* `size` ranks inside this process, one thread each (runtime/dist/transport_threads.c):
 * out[r] is rank r's transport, to be used by one thread and closed by it.
 * Sends complete at once (the message is copied); find_silent always says
 * -1 and abort() aborts the process. For tests and benchmarks of the
 * pipeline where there is no MPI (the GPU machine). */
sparq_status sq_transport_threads(int size, sq_transport **out);

/* MPI_COMM_WORLD (MPI_Init_thread on the first call). SPARQ_E_UNSUPPORTED
 * when sparq was built without MPI. */
sparq_status sq_transport_mpi(sq_transport **out);

/* Were we started by mpirun (OpenMPI / PMIx / PMI environment)? */
bool sq_transport_launched_by_mpirun(void);

/* The transport a command should use: MPI when started by mpirun, else local. */
sparq_status sq_transport_auto(sq_transport **out);

void sq_transport_close(sq_transport *t);

/* Rank 0 makes a 128-byte id with make() and every rank receives it (a
 * failure of make() on rank 0 fails every rank, not just rank 0). */
sparq_status sq_transport_share_id(sq_transport *t, uint8_t id[128], sparq_status (*make)(uint8_t id[128]));

/* The NCCL seam: rank 0 creates the ncclUniqueId and every rank receives it
 * through this transport; the CUDA backend's device link then makes its
 * communicator from it (kernels/cuda/link_nccl.cu). SPARQ_E_UNSUPPORTED
 * without NCCL. */
sparq_status sq_transport_nccl_bootstrap(sq_transport *t, uint8_t id[128]);

#endif
