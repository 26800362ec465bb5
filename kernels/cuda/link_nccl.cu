/* kernels/cuda/link_nccl.cu — the NCCL device link (kernels/cuda/link_cuda.h):
 * one process per GPU (mpirun), one communicator over every rank. Built only
 * when meson found NCCL; link_cuda.cu has the stubs otherwise.
 *
 * Every NCCL call of this end goes on one side stream, in the order dist.c
 * makes them, which is the same step order on every rank (NCCL's rule for
 * point-to-point: matching calls in the same order; the pipeline sends only
 * to higher ranks, so there is no cycle). The exec's stream and the side
 * stream are joined by events:
 *  - send: wait on the host (deadline) until the older of the peer's two
 *    send buffers has gone out, copy the hidden states into it on the exec's
 *    stream, record; the side stream waits for that record, ncclSend, and
 *    records `out`. The exec's stream never waits for the peer, so rank 0's
 *    next step (and any host sync in it) does not depend on rank 1 having
 *    posted its receive;
 *  - recv: the side stream waits for the exec's stream (the buffer's last
 *    user), ncclRecv into the caller's buffer, records `in`; the exec's
 *    stream waits for `in`; the host polls `in` with ncclCommGetAsyncError
 *    until the deadline, and on expiry aborts the communicator
 *    (ncclCommAbort) and fails naming the peer, so a dead or stopped sender
 *    ends this rank's wait as a host transport's timeout would.
 * The communicator is made nonblocking (ncclConfig_t.blocking = 0), so its
 * set-up also has the deadline: a rank that never joins is a timeout, not a
 * hang.
 *
 * UNTESTED on the machines this was written on (one GPU: NCCL refuses two
 * ranks on one device); the hub path (link_cuda.cu) is what the GPU suite
 * runs. docs/runtime.md, "The device link", says what a two-GPU run must
 * check. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/link_cuda.h"

extern "C" {
#include "common/alloc.h"
/* common/progress.h's clocks (the header itself is C only: <stdatomic.h>) */
double sparq_now(void);
struct timespec sparq_deadline_after(double seconds);
}

typedef struct nccl_peer {
    char *buf;             /* 2 × max_bytes, made by the first send to this peer */
    cudaEvent_t ready[2], out[2];
    uint64_t sent;
} nccl_peer;

struct nccl_end {
    ncclComm_t comm;
    cudaStream_t side;
    cudaEvent_t joined, in;
    int rank, size;
    size_t max_bytes;
    bool aborted;
    nccl_peer *peer; /* [size] */
};

static sparq_status nccl_status(ncclResult_t r, const char *what)
{
    if (r == ncclSuccess) return SPARQ_OK;
    return sparq_err(SPARQ_E_COMM, "device link (NCCL): %s: %s", what, ncclGetErrorString(r));
}

static void nap(void)
{
    const struct timespec ts = {0, 20000}; /* 20 µs: a decode step's hand-over is ~0.1 ms */
    nanosleep(&ts, NULL);
}

static sparq_status end_abort(nccl_end *e)
{
    if (e->comm && !e->aborted) ncclCommAbort(e->comm);
    e->aborted = true;
    return SPARQ_E_TIMEOUT;
}

/* Poll until `ev` has completed (ev NULL: until the communicator's pending
 * calls have settled, in nonblocking mode), watching the communicator's
 * asynchronous error. Past the deadline the communicator is aborted. */
static sparq_status end_wait(nccl_end *e, cudaEvent_t ev, double timeout_s, int peer, const char *what)
{
    const double t_end = sparq_now() + (timeout_s < 0 ? 1e9 : timeout_s);
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(e->comm, &ar);
        if (r != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress)) {
            end_abort(e);
            return sparq_err(SPARQ_E_COMM, "rank %d: device link (NCCL): %s rank %d failed: %s", e->rank, what, peer,
                             ncclGetErrorString(r != ncclSuccess ? r : ar));
        }
        if (ev) {
            const cudaError_t q = cudaEventQuery(ev);
            if (q == cudaSuccess) return SPARQ_OK;
            if (q != cudaErrorNotReady) return link_cuda_status(q, what);
        } else if (ar == ncclSuccess) {
            return SPARQ_OK;
        }
        if (sparq_now() > t_end) {
            end_abort(e);
            if (peer < 0) /* a collective: NCCL does not say which rank is missing */
                return sparq_err(SPARQ_E_TIMEOUT, "rank %d: device link (NCCL): %s every rank did not complete within "
                                 "%.1f s (the --timeout): another rank is stopped, hung or dead", e->rank, what,
                                 timeout_s);
            return sparq_err(SPARQ_E_TIMEOUT, "rank %d: device link (NCCL): %s rank %d did not complete within %.1f s "
                             "(the --timeout): rank %d is stopped, hung or dead", e->rank, what, peer, timeout_s, peer);
        }
        nap();
    }
}

sparq_status nccl_link_open(const sq_link_spec *spec, nccl_end **out)
{
    *out = NULL;
    nccl_end *e = (nccl_end *)sparq_calloc(1, sizeof *e);
    RETURN_IF(!e, SPARQ_E_NOMEM, "device link: out of memory");
    e->rank = spec->rank;
    e->size = spec->size;
    e->max_bytes = spec->max_bytes;
    e->peer = (nccl_peer *)sparq_calloc((size_t)spec->size, sizeof *e->peer);
    sparq_status st = e->peer ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "device link: out of memory");
    if (st == SPARQ_OK) st = link_cuda_status(cudaStreamCreateWithFlags(&e->side, cudaStreamNonBlocking), "stream");
    if (st == SPARQ_OK) st = link_cuda_status(cudaEventCreateWithFlags(&e->joined, cudaEventDisableTiming), "event");
    if (st == SPARQ_OK) st = link_cuda_status(cudaEventCreateWithFlags(&e->in, cudaEventDisableTiming), "event");
    if (st == SPARQ_OK) {
        ncclUniqueId id;
        memcpy(&id, spec->nccl_id, sizeof id);
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        const ncclResult_t r = ncclCommInitRankConfig(&e->comm, spec->size, id, spec->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) st = nccl_status(r, "ncclCommInitRankConfig");
        else st = end_wait(e, NULL, spec->timeout_s, 0, "setting up the communicator with");
    }
    if (st != SPARQ_OK) {
        nccl_link_close(e);
        return st;
    }
    *out = e;
    return SPARQ_OK;
}

sparq_status nccl_link_send(nccl_end *e, cudaStream_t s, int peer, const void *mem, size_t bytes, double timeout_s)
{
    RETURN_IF(e->aborted, SPARQ_E_COMM, "rank %d: device link (NCCL): aborted after an earlier failure", e->rank);
    nccl_peer *p = &e->peer[peer];
    if (!p->buf) { /* the first send to this peer */
        cudaEvent_t ev[4];
        char *bufs;
        FORWARD_IF(link_cuda_buffers(2 * e->max_bytes, &bufs, ev));
        p->ready[0] = ev[0], p->ready[1] = ev[1], p->out[0] = ev[2], p->out[1] = ev[3];
        p->buf = bufs;
    }
    const int b = (int)(p->sent % 2);
    char *buf = p->buf + (size_t)b * e->max_bytes;
    FORWARD_IF(end_wait(e, p->out[b], timeout_s, peer, "the send of hidden states to")); /* its last send went out */
    FORWARD_IF(link_cuda_status(cudaMemcpyAsync(buf, mem, bytes, cudaMemcpyDeviceToDevice, s), "send copy"));
    FORWARD_IF(link_cuda_status(cudaEventRecord(p->ready[b], s), "event record"));
    FORWARD_IF(link_cuda_status(cudaStreamWaitEvent(e->side, p->ready[b], 0), "side stream wait"));
    ncclResult_t r = ncclSend(buf, bytes, ncclUint8, peer, e->comm, e->side);
    if (r == ncclInProgress) FORWARD_IF(end_wait(e, NULL, timeout_s, peer, "queueing a send to"));
    else FORWARD_IF(nccl_status(r, "ncclSend"));
    FORWARD_IF(link_cuda_status(cudaEventRecord(p->out[b], e->side), "event record"));
    p->sent++;
    return SPARQ_OK;
}

bool nccl_link_send_ready(nccl_end *e, int peer)
{
    const nccl_peer *p = &e->peer[peer];
    return e->aborted || !p->buf || cudaEventQuery(p->out[p->sent % 2]) != cudaErrorNotReady;
}

/* A call that fills the caller's buffer (a receive, an all-gather) runs on
 * the side stream behind the exec's stream's work (the buffer's last user):
 * side_join before it; side_done after it queues the exec's stream behind
 * it and polls it on the host against the deadline (peer < 0: a collective). */
static sparq_status side_join(nccl_end *e, cudaStream_t s)
{
    RETURN_IF(e->aborted, SPARQ_E_COMM, "rank %d: device link (NCCL): aborted after an earlier failure", e->rank);
    FORWARD_IF(link_cuda_status(cudaEventRecord(e->joined, s), "event record"));
    return link_cuda_status(cudaStreamWaitEvent(e->side, e->joined, 0), "side stream wait");
}

static sparq_status side_done(nccl_end *e, cudaStream_t s, ncclResult_t r, const char *call, double timeout_s,
                              int peer, const char *queueing, const char *what)
{
    if (r == ncclInProgress) FORWARD_IF(end_wait(e, NULL, timeout_s, peer, queueing));
    else FORWARD_IF(nccl_status(r, call));
    FORWARD_IF(link_cuda_status(cudaEventRecord(e->in, e->side), "event record"));
    FORWARD_IF(link_cuda_status(cudaStreamWaitEvent(s, e->in, 0), "stream wait"));
    return end_wait(e, e->in, timeout_s, peer, what);
}

sparq_status nccl_link_recv(nccl_end *e, cudaStream_t s, int peer, void *mem, size_t bytes, double timeout_s)
{
    FORWARD_IF(side_join(e, s));
    return side_done(e, s, ncclRecv(mem, bytes, ncclUint8, peer, e->comm, e->side), "ncclRecv", timeout_s, peer,
                     "queueing a receive from", "the receive of hidden states from");
}

/* One ncclAllGather, joined to the exec's stream like a receive. */
sparq_status nccl_link_allgather(nccl_end *e, cudaStream_t s, const void *mine, void *all, size_t bytes,
                                 double timeout_s)
{
    FORWARD_IF(side_join(e, s));
    return side_done(e, s, ncclAllGather(mine, all, bytes, ncclUint8, e->comm, e->side), "ncclAllGather", timeout_s,
                     -1, "queueing the all-gather with", "the all-gather of the MoE partial sums with");
}

void nccl_link_close(nccl_end *e)
{
    if (!e) return;
    if (e->side && !e->aborted) (void)cudaStreamSynchronize(e->side);
    if (e->comm) {
        if (e->aborted) {
            /* ncclCommAbort freed it */
        } else {
            ncclCommFinalize(e->comm);
            ncclResult_t ar = ncclInProgress;
            const double t_end = sparq_now() + 10.0; /* a peer gone mid-way must not hang the close */
            while (ncclCommGetAsyncError(e->comm, &ar) == ncclSuccess && ar == ncclInProgress && sparq_now() < t_end)
                nap();
            if (ar == ncclSuccess) ncclCommDestroy(e->comm);
            else ncclCommAbort(e->comm);
        }
    }
    for (int i = 0; e->peer && i < e->size; i++) {
        nccl_peer *p = &e->peer[i];
        if (!p->buf) continue;
        cudaFree(p->buf);
        for (int b = 0; b < 2; b++) cudaEventDestroy(p->ready[b]), cudaEventDestroy(p->out[b]);
    }
    if (e->joined) cudaEventDestroy(e->joined);
    if (e->in) cudaEventDestroy(e->in);
    if (e->side) cudaStreamDestroy(e->side);
    sparq_free(e->peer);
    sparq_free(e);
}
