/* kernels/link_hub.h — the host side of a same-process device link (the
 * hub of kernels/backend.h's link_hub_make): which of a pair's two buffers
 * holds what, and the waits with their deadlines. A backend keeps one
 * sq_hub_box per ordered pair of ranks next to its buffers and does the
 * copies itself: kernels/cuda/link_cuda.cu with CUDA copies and events,
 * tests/runtime/fake_link.h with memcpy (so the unit suite runs this code).
 *
 * A send: sq_hub_claim_send (waits until fewer than two messages are unread,
 * gives the buffer to fill), the copy in, sq_hub_sent. A receive:
 * sq_hub_claim_recv (waits for a message, gives its buffer and size), the
 * copy out, sq_hub_taken. Buffer i of a pair is used by messages i, i + 2,
 * ...; between sq_hub_claim_* and the matching call that ends it only the
 * claimer touches the buffer. Static inline, C and C++ (the CUDA module
 * includes it; it must not depend on libsparq symbols the executable may
 * not carry). */
#ifndef SPARQ_KERNELS_LINK_HUB_H
#define SPARQ_KERNELS_LINK_HUB_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct sq_hub_box {
    uint64_t sent, taken; /* messages put / taken so far: the next buffer is count % 2 */
    size_t bytes[2];      /* the message in buffer i */
} sq_hub_box;

typedef struct sq_hub_core {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, refs; /* ranks; references left (one per rank's link_open) */
} sq_hub_core;

static inline void sq_hub_init(sq_hub_core *h, int size)
{
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->size = h->refs = size;
}

/* Drop one reference; true for the last (the caller then frees its buffers and calls sq_hub_destroy). */
static inline bool sq_hub_release(sq_hub_core *h)
{
    pthread_mutex_lock(&h->mu);
    const bool last = --h->refs == 0;
    pthread_mutex_unlock(&h->mu);
    return last;
}

static inline void sq_hub_destroy(sq_hub_core *h)
{
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
}

static inline bool sq_hub_has_room_(const sq_hub_box *b) { return b->sent - b->taken < 2; }
static inline bool sq_hub_has_mail_(const sq_hub_box *b) { return b->sent > b->taken; }

/* Wait under mu until the box is ready for a send (room) or a receive (mail),
 * or timeout_s pass (negative: forever); false on timeout. */
static inline bool sq_hub_wait_(sq_hub_core *h, const sq_hub_box *b, bool send, double timeout_s)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* pthread_cond_timedwait's clock */
    const double s = timeout_s < 0 ? 1e9 : timeout_s;
    until.tv_sec += (time_t)s;
    until.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    while (!(send ? sq_hub_has_room_(b) : sq_hub_has_mail_(b)) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&h->cv, &h->mu, &until);
    return send ? sq_hub_has_room_(b) : sq_hub_has_mail_(b);
}

/* The buffer (0 or 1) the next send fills, once one is free; -1 on timeout. */
static inline int sq_hub_claim_send(sq_hub_core *h, sq_hub_box *b, double timeout_s)
{
    pthread_mutex_lock(&h->mu);
    const int i = sq_hub_wait_(h, b, true, timeout_s) ? (int)(b->sent % 2) : -1;
    pthread_mutex_unlock(&h->mu);
    return i;
}

/* The claimed buffer now holds a message of `bytes` (and, for a device, what
 * the receiver must wait for is recorded). */
static inline void sq_hub_sent(sq_hub_core *h, sq_hub_box *b, int i, size_t bytes)
{
    pthread_mutex_lock(&h->mu);
    b->bytes[i] = bytes;
    b->sent++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Would a send go without waiting? Never blocks. */
static inline bool sq_hub_room(sq_hub_core *h, const sq_hub_box *b)
{
    pthread_mutex_lock(&h->mu);
    const bool room = sq_hub_has_room_(b);
    pthread_mutex_unlock(&h->mu);
    return room;
}

/* The buffer of the oldest unread message and its size, once there is one; -1 on timeout. */
static inline int sq_hub_claim_recv(sq_hub_core *h, sq_hub_box *b, double timeout_s, size_t *bytes)
{
    pthread_mutex_lock(&h->mu);
    const int i = sq_hub_wait_(h, b, false, timeout_s) ? (int)(b->taken % 2) : -1;
    if (i >= 0) *bytes = b->bytes[i];
    pthread_mutex_unlock(&h->mu);
    return i;
}

/* The claimed message is read (for a device: what the next sender into this buffer waits for is recorded). */
static inline void sq_hub_taken(sq_hub_core *h, sq_hub_box *b)
{
    pthread_mutex_lock(&h->mu);
    b->taken++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* The messages of a send that timed out and of a receive that did, the same for every backend. */
#define SQ_HUB_SEND_TIMEOUT_FMT                                                                                        \
    "rank %d: rank %d has not taken what was sent to it over the device link within %.1f s (the --timeout): "       \
    "rank %d is stopped, hung or dead"
#define SQ_HUB_RECV_TIMEOUT_FMT                                                                                        \
    "rank %d: nothing from rank %d over the device link within %.1f s (the --timeout): rank %d is stopped, "         \
    "hung or dead"

#endif
