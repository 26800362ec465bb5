/* kernels/cuda/link_cuda.cu — the CUDA backend's device links
 * (kernels/cuda/link_cuda.h): the vtable ops, and the same-process hub.
 *
 * The hub's mailbox src -> dst has two device buffers, used in turn. A send
 * waits on the host until fewer than two messages are unread (the deadline:
 * a receiver that stopped is named), then, on the sender's stream, waits for
 * the event the buffer's last reader recorded, copies in and records the
 * buffer's `full` event; only then does the host count it as sent. A receive
 * waits on the host for a sent message, then, on the receiver's stream, waits
 * for `full`, copies out and records `read`; only then does the host count it
 * as taken. So every cudaStreamWaitEvent names an event whose record was
 * queued before (a wait on a never-recorded event is a no-op: the first use
 * of each buffer), and neither host ever waits for the GPU. Buffers and
 * events of a mailbox are made by its sender's first send (one cudaMalloc
 * of 2 × max_bytes), and freed by the last rank that closes. The host's
 * bookkeeping is kernels/link_hub.h's (shared with the unit suite's
 * stand-in device, tests/runtime/fake_link.h). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/link_cuda.h"
#include "kernels/link_hub.h"
#include "sparq_version.h"

extern "C" {
#include "common/alloc.h"
}

enum { LINK_HUB = 1, LINK_NCCL };

typedef struct mailbox {
    sq_hub_box box;           /* which buffer holds what (kernels/link_hub.h) */
    char *buf;                /* device, 2 × max_bytes: buffer i at buf + i * max_bytes */
    cudaEvent_t full[2], read[2];
} mailbox;

typedef struct hub {
    sq_hub_core core;
    mailbox *mb; /* [src * size + dst] */
} hub;

struct sq_link {
    int kind, rank, size;
    size_t max_bytes;
    hub *h;
    nccl_end *nccl;
};

sparq_status link_cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return SPARQ_OK;
    (void)cudaGetLastError();
    return sparq_err(e == cudaErrorMemoryAllocation ? SPARQ_E_NOMEM : SPARQ_E_STATE, "device link: %s: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

void *cuda_link_hub_make(int size)
{
    if (size < 1) return NULL;
    hub *h = (hub *)sparq_calloc(1, sizeof *h);
    if (!h) return NULL;
    h->mb = (mailbox *)sparq_calloc((size_t)size * (size_t)size, sizeof *h->mb);
    if (!h->mb) {
        sparq_free(h);
        return NULL;
    }
    sq_hub_init(&h->core, size);
    return h;
}

/* Drop one reference; the last frees the mailboxes (every other rank has
 * waited for its stream in its close, so nothing queued still uses them). */
static void hub_release(hub *h)
{
    if (!sq_hub_release(&h->core)) return;
    for (int i = 0; i < h->core.size * h->core.size; i++) {
        mailbox *m = &h->mb[i];
        if (!m->buf) continue;
        cudaFree(m->buf);
        for (int b = 0; b < 2; b++) cudaEventDestroy(m->full[b]), cudaEventDestroy(m->read[b]);
    }
    sq_hub_destroy(&h->core);
    sparq_free(h->mb);
    sparq_free(h);
}

sparq_status link_cuda_buffers(size_t bytes, char **buf, cudaEvent_t ev[4])
{
    char *b = NULL;
    cudaEvent_t e[4] = {0};
    sparq_status st = link_cuda_status(cudaMalloc((void **)&b, bytes), "the link's buffers");
    for (int i = 0; i < 4 && st == SPARQ_OK; i++)
        st = link_cuda_status(cudaEventCreateWithFlags(&e[i], cudaEventDisableTiming), "event");
    if (st != SPARQ_OK) {
        for (int i = 0; i < 4; i++)
            if (e[i]) cudaEventDestroy(e[i]);
        cudaFree(b);
        return st;
    }
    memcpy(ev, e, sizeof e);
    *buf = b;
    return SPARQ_OK;
}

/* A mailbox's two buffers and four events (m->buf set last: all or nothing). */
static sparq_status mailbox_make(mailbox *m, size_t max_bytes)
{
    cudaEvent_t ev[4];
    char *buf;
    FORWARD_IF(link_cuda_buffers(2 * max_bytes, &buf, ev));
    m->full[0] = ev[0], m->full[1] = ev[1], m->read[0] = ev[2], m->read[1] = ev[3];
    m->buf = buf;
    return SPARQ_OK;
}

static sparq_status hub_send(sq_link *l, cudaStream_t s, int peer, const void *mem, size_t bytes, double timeout_s)
{
    hub *h = l->h;
    mailbox *m = &h->mb[l->rank * h->core.size + peer];
    if (!m->buf) FORWARD_IF(mailbox_make(m, l->max_bytes)); /* only this rank writes this mailbox's buffers */
    const int b = sq_hub_claim_send(&h->core, &m->box, timeout_s);
    RETURN_IF(b < 0, SPARQ_E_TIMEOUT, SQ_HUB_SEND_TIMEOUT_FMT, l->rank, peer, timeout_s, peer);
    char *dst = m->buf + (size_t)b * l->max_bytes;
    FORWARD_IF(link_cuda_status(cudaStreamWaitEvent(s, m->read[b], 0), "waiting for the buffer's last reader"));
    FORWARD_IF(link_cuda_status(cudaMemcpyAsync(dst, mem, bytes, cudaMemcpyDeviceToDevice, s), "mailbox copy in"));
    FORWARD_IF(link_cuda_status(cudaEventRecord(m->full[b], s), "event record"));
    sq_hub_sent(&h->core, &m->box, b, bytes);
    return SPARQ_OK;
}

static sparq_status hub_recv(sq_link *l, cudaStream_t s, int peer, void *mem, size_t bytes, double timeout_s)
{
    hub *h = l->h;
    mailbox *m = &h->mb[peer * h->core.size + l->rank];
    size_t got = 0;
    const int b = sq_hub_claim_recv(&h->core, &m->box, timeout_s, &got);
    RETURN_IF(b < 0, SPARQ_E_TIMEOUT, SQ_HUB_RECV_TIMEOUT_FMT, l->rank, peer, timeout_s, peer);
    RETURN_IF(got != bytes, SPARQ_E_COMM, "rank %d: %zu bytes from rank %d over the device link, "
              "expected %zu", l->rank, got, peer, bytes);
    const char *src = m->buf + (size_t)b * l->max_bytes;
    FORWARD_IF(link_cuda_status(cudaStreamWaitEvent(s, m->full[b], 0), "waiting for the sender's copy"));
    FORWARD_IF(link_cuda_status(cudaMemcpyAsync(mem, src, bytes, cudaMemcpyDeviceToDevice, s), "mailbox copy out"));
    FORWARD_IF(link_cuda_status(cudaEventRecord(m->read[b], s), "event record"));
    sq_hub_taken(&h->core, &m->box);
    return SPARQ_OK;
}

/* --- the vtable's ops ----------------------------------------------------------------- */

sparq_status cuda_link_open(sq_exec *ex, const sq_link_spec *spec, sq_link **out)
{
    (void)ex;
    *out = NULL;
    hub *h = (hub *)spec->hub;
    sparq_status st = SPARQ_OK;
    if (!h && !spec->nccl_id) st = sparq_err(SPARQ_E_ARG, "device link: neither a hub nor an NCCL id");
    else if (h && h->core.size != spec->size)
        st = sparq_err(SPARQ_E_ARG, "device link: a hub of %d ranks for a link of %d", h->core.size, spec->size);
    else if (spec->rank < 0 || spec->rank >= spec->size || spec->max_bytes == 0)
        st = sparq_err(SPARQ_E_ARG, "device link: rank %d of %d, %zu bytes", spec->rank, spec->size, spec->max_bytes);
    sq_link *l = NULL;
    if (st == SPARQ_OK && !(l = (sq_link *)sparq_calloc(1, sizeof *l)))
        st = sparq_err(SPARQ_E_NOMEM, "device link: out of memory");
    if (st == SPARQ_OK) {
        l->kind = h ? LINK_HUB : LINK_NCCL;
        l->rank = spec->rank;
        l->size = spec->size;
        l->max_bytes = spec->max_bytes;
        l->h = h;
        if (!h) st = nccl_link_open(spec, &l->nccl);
    }
    if (st != SPARQ_OK) {
        if (h) hub_release(h); /* the reference this open owned */
        sparq_free(l);
        return st;
    }
    *out = l;
    return SPARQ_OK;
}

static sparq_status check_peer(const sq_link *l, int peer, size_t bytes)
{
    RETURN_IF(peer < 0 || peer >= l->size || peer == l->rank, SPARQ_E_ARG, "device link: rank %d to rank %d of %d",
              l->rank, peer, l->size);
    RETURN_IF(bytes > l->max_bytes, SPARQ_E_RANGE, "device link: a %zu-byte message for %zu-byte buffers", bytes,
              l->max_bytes);
    return SPARQ_OK;
}

sparq_status cuda_link_send(sq_exec *ex, sq_link *l, int peer, const void *mem, size_t bytes, double timeout_s)
{
    FORWARD_IF(check_peer(l, peer, bytes));
    cudaStream_t s = sq_cuda_link_stream(ex);
    if (l->kind == LINK_HUB) return hub_send(l, s, peer, mem, bytes, timeout_s);
    return nccl_link_send(l->nccl, s, peer, mem, bytes, timeout_s);
}

bool cuda_link_send_ready(sq_exec *ex, sq_link *l, int peer)
{
    (void)ex;
    if (peer < 0 || peer >= l->size || peer == l->rank) return true; /* link_send says what is wrong */
    if (l->kind == LINK_NCCL) return nccl_link_send_ready(l->nccl, peer);
    hub *h = l->h;
    return sq_hub_room(&h->core, &h->mb[l->rank * h->core.size + peer].box);
}

sparq_status cuda_link_recv(sq_exec *ex, sq_link *l, int peer, void *mem, size_t bytes, double timeout_s)
{
    FORWARD_IF(check_peer(l, peer, bytes));
    cudaStream_t s = sq_cuda_link_stream(ex);
    if (l->kind == LINK_HUB) return hub_recv(l, s, peer, mem, bytes, timeout_s);
    return nccl_link_recv(l->nccl, s, peer, mem, bytes, timeout_s);
}

/* The hub's all-gather: this rank's piece into its own place, then sent
 * to every other rank and each other rank's piece received, over the
 * mailboxes (a send waits for nothing on the GPU, so all ranks sending
 * first cannot deadlock). NCCL: one ncclAllGather. */
sparq_status cuda_link_allgather(sq_exec *ex, sq_link *l, const void *mine, void *all, size_t bytes,
                                 double timeout_s)
{
    RETURN_IF(bytes > l->max_bytes, SPARQ_E_RANGE, "device link: a %zu-byte all-gather piece for %zu-byte buffers",
              bytes, l->max_bytes);
    cudaStream_t s = sq_cuda_link_stream(ex);
    if (l->kind == LINK_NCCL) return nccl_link_allgather(l->nccl, s, mine, all, bytes, timeout_s);
    char *a = (char *)all;
    FORWARD_IF(link_cuda_status(cudaMemcpyAsync(a + (size_t)l->rank * bytes, mine, bytes, cudaMemcpyDeviceToDevice, s),
                                "all-gather: own piece"));
    for (int p = 0; p < l->size; p++)
        if (p != l->rank) FORWARD_IF(hub_send(l, s, p, mine, bytes, timeout_s));
    for (int p = 0; p < l->size; p++)
        if (p != l->rank) FORWARD_IF(hub_recv(l, s, p, a + (size_t)p * bytes, bytes, timeout_s));
    return SPARQ_OK;
}

void cuda_link_close(sq_exec *ex, sq_link *l)
{
    if (!l) return;
    (void)cudaStreamSynchronize(sq_cuda_link_stream(ex)); /* nothing queued here still reads or writes a buffer */
    (void)cudaGetLastError();
    if (l->kind == LINK_HUB) hub_release(l->h);
    else nccl_link_close(l->nccl);
    sparq_free(l);
}

#if !SPARQ_HAVE_NCCL
/* A build without NCCL: only the hub. */
sparq_status nccl_link_open(const sq_link_spec *spec, nccl_end **out)
{
    (void)spec;
    *out = NULL;
    return sparq_err(SPARQ_E_UNSUPPORTED, "device link: this sparq was built without NCCL");
}
sparq_status nccl_link_send(nccl_end *e, cudaStream_t s, int peer, const void *mem, size_t bytes, double timeout_s)
{
    (void)e, (void)s, (void)peer, (void)mem, (void)bytes, (void)timeout_s;
    return SPARQ_E_STATE;
}
bool nccl_link_send_ready(nccl_end *e, int peer)
{
    (void)e, (void)peer;
    return true;
}
sparq_status nccl_link_recv(nccl_end *e, cudaStream_t s, int peer, void *mem, size_t bytes, double timeout_s)
{
    (void)e, (void)s, (void)peer, (void)mem, (void)bytes, (void)timeout_s;
    return SPARQ_E_STATE;
}
sparq_status nccl_link_allgather(nccl_end *e, cudaStream_t s, const void *mine, void *all, size_t bytes,
                                 double timeout_s)
{
    (void)e, (void)s, (void)mine, (void)all, (void)bytes, (void)timeout_s;
    return SPARQ_E_STATE;
}
void nccl_link_close(nccl_end *e) { (void)e; }
#endif
