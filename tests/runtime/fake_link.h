/* tests/runtime/fake_link.h — a stand-in "device" for the device-link path of
 * runtime/dist/dist.c on a machine without a GPU: the CPU backend's ops,
 * flagged `device` (so dist.c and the model treat its memory as backend
 * memory, as with CUDA), with a same-process device link whose two buffers
 * per pair of ranks are host memory, copied with memcpy, and whose
 * bookkeeping and deadlines are the CUDA hub's own (kernels/link_hub.h). It
 * takes the place of the CUDA exec (sq_exec_create_cuda, which
 * kernels/cpu/ops_device.c prefers to its module when the program defines
 * it), so `--device cuda` gets it; include it in one file of a test program
 * that does not link kernels/cuda. What it cannot check is the CUDA side
 * (streams, events): tests/gpu's test_dist_threads_cuda runs the real link. */
#ifndef SPARQ_TESTS_RUNTIME_FAKE_LINK_H
#define SPARQ_TESTS_RUNTIME_FAKE_LINK_H

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kernels/backend.h"
#include "kernels/link_hub.h"

typedef struct fake_hub {
    sq_hub_core core;
    size_t max_bytes;
    sq_hub_box *box; /* [src * size + dst] */
    char **buf;      /* [src * size + dst]: 2 × max_bytes, made by the first send */
} fake_hub;

struct sq_link {
    fake_hub *h;
    int rank;
};

static void *fake_hub_make(int size)
{
    fake_hub *h = sparq_calloc(1, sizeof *h);
    const size_t n = (size_t)size * (size_t)size;
    if (h) h->box = sparq_calloc(n, sizeof *h->box), h->buf = sparq_calloc(n, sizeof *h->buf);
    if (!h || !h->box || !h->buf) {
        if (h) sparq_free(h->box), sparq_free(h->buf);
        sparq_free(h);
        return NULL;
    }
    sq_hub_init(&h->core, size);
    return h;
}

static void fake_hub_release(fake_hub *h)
{
    if (!sq_hub_release(&h->core)) return;
    for (int i = 0; i < h->core.size * h->core.size; i++) sparq_free(h->buf[i]);
    sq_hub_destroy(&h->core);
    sparq_free(h->box);
    sparq_free(h->buf);
    sparq_free(h);
}

/* FAKE_LINK_FAIL_RANK=r: rank r cannot open its end (the others must then all stage through host memory). */
static sparq_status fake_link_open(sq_exec *ex, const sq_link_spec *spec, sq_link **out)
{
    (void)ex;
    fake_hub *h = spec->hub;
    const char *fail = getenv("FAKE_LINK_FAIL_RANK");
    sq_link *l = h && !(fail && atoi(fail) == spec->rank) ? sparq_calloc(1, sizeof *l) : NULL;
    if (!l) {
        if (h) fake_hub_release(h);
        return sparq_err(SPARQ_E_UNSUPPORTED, "fake link: rank %d refuses its end", spec->rank);
    }
    pthread_mutex_lock(&h->core.mu); /* every rank opens at once, with the same size */
    h->max_bytes = spec->max_bytes;
    pthread_mutex_unlock(&h->core.mu);
    l->h = h;
    l->rank = spec->rank;
    *out = l;
    return SPARQ_OK;
}

static sparq_status fake_link_send(sq_exec *ex, sq_link *l, int peer, const void *mem, size_t bytes, double timeout_s)
{
    (void)ex;
    fake_hub *h = l->h;
    const int p = l->rank * h->core.size + peer;
    if (!h->buf[p]) h->buf[p] = sparq_malloc(2 * h->max_bytes); /* only this rank writes this pair's buffers */
    RETURN_IF(!h->buf[p] || bytes > h->max_bytes, SPARQ_E_NOMEM, "fake link: %zu bytes", bytes);
    const int i = sq_hub_claim_send(&h->core, &h->box[p], timeout_s);
    RETURN_IF(i < 0, SPARQ_E_TIMEOUT, SQ_HUB_SEND_TIMEOUT_FMT, l->rank, peer, timeout_s, peer);
    memcpy(h->buf[p] + (size_t)i * h->max_bytes, mem, bytes);
    sq_hub_sent(&h->core, &h->box[p], i, bytes);
    return SPARQ_OK;
}

static bool fake_link_send_ready(sq_exec *ex, sq_link *l, int peer)
{
    (void)ex;
    return sq_hub_room(&l->h->core, &l->h->box[l->rank * l->h->core.size + peer]);
}

static sparq_status fake_link_recv(sq_exec *ex, sq_link *l, int peer, void *mem, size_t bytes, double timeout_s)
{
    (void)ex;
    fake_hub *h = l->h;
    const int p = peer * h->core.size + l->rank;
    size_t got = 0;
    const int i = sq_hub_claim_recv(&h->core, &h->box[p], timeout_s, &got);
    RETURN_IF(i < 0, SPARQ_E_TIMEOUT, SQ_HUB_RECV_TIMEOUT_FMT, l->rank, peer, timeout_s, peer);
    RETURN_IF(got != bytes, SPARQ_E_COMM, "fake link: %zu bytes from rank %d, expected %zu", got, peer, bytes);
    memcpy(mem, h->buf[p] + (size_t)i * h->max_bytes, bytes);
    sq_hub_taken(&h->core, &h->box[p]);
    return SPARQ_OK;
}

/* As the CUDA hub's: own piece, send to every other rank, then receive from each. */
static sparq_status fake_link_allgather(sq_exec *ex, sq_link *l, const void *mine, void *all, size_t bytes,
                                        double timeout_s)
{
    const int size = l->h->core.size;
    char *a = all;
    memcpy(a + (size_t)l->rank * bytes, mine, bytes);
    for (int p = 0; p < size; p++)
        if (p != l->rank) FORWARD_IF(fake_link_send(ex, l, p, mine, bytes, timeout_s));
    for (int p = 0; p < size; p++)
        if (p != l->rank) FORWARD_IF(fake_link_recv(ex, l, p, a + (size_t)p * bytes, bytes, timeout_s));
    return SPARQ_OK;
}

static void fake_link_close(sq_exec *ex, sq_link *l)
{
    (void)ex;
    if (!l) return;
    fake_hub_release(l->h);
    sparq_free(l);
}

static sparq_status fake_prepare_moe(sq_exec *ex, const sq_moe_layer *ml, int max_rows)
{
    (void)ex, (void)ml, (void)max_rows;
    return SPARQ_OK;
}

static sq_backend fake_device;
static pthread_once_t fake_device_once = PTHREAD_ONCE_INIT;

/* The CPU's ops, in "device" memory that is host memory. */
static void fake_device_init(void)
{
    fake_device = *sq_backend_cpu();
    fake_device.name = "fake-device";
    fake_device.device = true;
    fake_device.prepare_moe = fake_prepare_moe;
    fake_device.link_open = fake_link_open;
    fake_device.link_send = fake_link_send;
    fake_device.link_send_ready = fake_link_send_ready;
    fake_device.link_recv = fake_link_recv;
    fake_device.link_allgather = fake_link_allgather;
    fake_device.link_close = fake_link_close;
    fake_device.link_hub_make = fake_hub_make;
}

sparq_status sq_exec_create_cuda(sq_exec **out, int n_threads);
sparq_status sq_exec_create_cuda(sq_exec **out, int n_threads)
{
    FORWARD_IF(sq_exec_create(out, n_threads));
    pthread_once(&fake_device_once, fake_device_init);
    (*out)->be = &fake_device;
    return SPARQ_OK;
}

#endif
