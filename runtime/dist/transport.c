/* runtime/dist/transport.c — the local (one-process) transport, transport
 * selection and the NCCL id exchange. The MPI transport is in
 * runtime/dist/transport_mpi.c (built only when meson found MPI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/dist/transport.h"
#include "sparq_version.h"

#if SPARQ_HAVE_NCCL
#include <nccl.h>
#endif

/* --- local: size 1 ------------------------------------------------------- */

static sparq_status local_isend(sq_transport *t, int dst, int tag, const void *buf, size_t n, int slot)
{
    (void)t, (void)tag, (void)buf, (void)n, (void)slot;
    return sparq_err(SPARQ_E_STATE, "local transport: no rank %d to send to", dst);
}
static sparq_status local_wait_send(sq_transport *t, int slot, double timeout_s)
{
    (void)t, (void)slot, (void)timeout_s;
    return SPARQ_OK;
}
static bool local_send_done(sq_transport *t, int slot)
{
    (void)t, (void)slot;
    return true;
}
static sparq_status local_recv(sq_transport *t, int src, int tag, void *buf, size_t cap, size_t *got,
                               double timeout_s)
{
    (void)t, (void)tag, (void)buf, (void)cap, (void)got, (void)timeout_s;
    return sparq_err(SPARQ_E_STATE, "local transport: no rank %d to receive from", src);
}
static sparq_status local_bcast(sq_transport *t, int root, void *buf, size_t n)
{
    (void)t, (void)root, (void)buf, (void)n;
    return SPARQ_OK;
}
static sparq_status local_gather(sq_transport *t, const void *mine, size_t n, void *all)
{
    (void)t;
    memmove(all, mine, n);
    return SPARQ_OK;
}
static sparq_status local_allgather(sq_transport *t, const void *mine, size_t n, void *all, double timeout_s)
{
    (void)t, (void)timeout_s;
    memmove(all, mine, n);
    return SPARQ_OK;
}
static int local_find_silent(sq_transport *t, double wait_s)
{
    (void)t, (void)wait_s;
    return -1;
}
static void local_abort(sq_transport *t, int code)
{
    (void)t;
    exit(code);
}
static void local_close(sq_transport *t) { sparq_free(t); }

static const sq_transport_vt local_vt = {.isend = local_isend, .wait_send = local_wait_send,
                                         .send_done = local_send_done, .recv = local_recv, .bcast = local_bcast,
                                         .gather = local_gather, .allgather = local_allgather,
                                         .find_silent = local_find_silent, .abort = local_abort,
                                         .close = local_close};

sparq_status sq_transport_local(sq_transport **out)
{
    sq_transport *t = sparq_calloc(1, sizeof *t);
    RETURN_IF(!t, SPARQ_E_NOMEM, "transport: out of memory");
    t->vt = &local_vt;
    t->name = "local";
    t->rank = 0;
    t->size = 1;
    t->one_process = true;
    *out = t;
    return SPARQ_OK;
}

#if !SPARQ_HAVE_MPI
sparq_status sq_transport_mpi(sq_transport **out)
{
    *out = NULL;
    return sparq_err(SPARQ_E_UNSUPPORTED, "this sparq was built without MPI (install libopenmpi-dev and rebuild) "
                                          "and cannot run as several processes");
}
#endif

bool sq_transport_launched_by_mpirun(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    return false;
}

sparq_status sq_transport_auto(sq_transport **out)
{
    if (sq_transport_launched_by_mpirun()) return sq_transport_mpi(out);
    return sq_transport_local(out);
}

void sq_transport_close(sq_transport *t)
{
    if (t) t->vt->close(t);
}

sparq_status sq_transport_share_id(sq_transport *t, uint8_t id[128], sparq_status (*make)(uint8_t id[128]))
{
    int ok = 1;
    if (t->rank == 0 && make(id) != SPARQ_OK) ok = 0;
    uint8_t msg[129];
    msg[0] = (uint8_t)ok;
    if (t->rank == 0) memcpy(msg + 1, id, 128);
    FORWARD_IF(t->vt->bcast(t, 0, msg, sizeof msg));
    if (!msg[0]) /* rank 0 has the reason in its error message; the others say where it failed */
        return t->rank == 0 ? SPARQ_E_COMM : sparq_err(SPARQ_E_COMM, "rank 0 could not create the shared id");
    memcpy(id, msg + 1, 128);
    return SPARQ_OK;
}

#if SPARQ_HAVE_NCCL
static sparq_status nccl_make_id(uint8_t id[128])
{
    ncclUniqueId uid;
    _Static_assert(sizeof uid == 128, "ncclUniqueId is 128 bytes");
    ncclResult_t r = ncclGetUniqueId(&uid);
    RETURN_IF(r != ncclSuccess, SPARQ_E_COMM, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &uid, 128);
    return SPARQ_OK;
}
#endif

sparq_status sq_transport_nccl_bootstrap(sq_transport *t, uint8_t id[128])
{
#if SPARQ_HAVE_NCCL
    return sq_transport_share_id(t, id, nccl_make_id);
#else
    (void)t, (void)id;
    return sparq_err(SPARQ_E_UNSUPPORTED, "this sparq was built without NCCL");
#endif
}
