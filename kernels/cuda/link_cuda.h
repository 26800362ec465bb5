/* kernels/cuda/link_cuda.h — the CUDA backend's device links (backend.h,
 * "device links"; internal to kernels/cuda). A link moves a pipeline's
 * hidden states from one rank's device buffer to the next rank's on the
 * execs' streams, so they never cross host memory (runtime/dist/dist.c).
 *
 * Two kinds behind the one set of vtable ops:
 *  - the hub (link_cuda.cu): ranks that are threads of one process (tests and
 *    benchmarks on one GPU, where NCCL refuses two ranks on one device). Per
 *    ordered pair of ranks a mailbox of two device buffers; a send copies
 *    into the next buffer on the sender's stream and records an event, a
 *    receive makes its stream wait for that event and copies out, recording
 *    an event the sender's stream waits for before it reuses the buffer.
 *    Which buffer holds what is agreed on the host (a mutex, a condition
 *    variable, the deadlines);
 *  - NCCL (link_nccl.cu, only in builds with NCCL): one process per GPU, one
 *    communicator over all ranks; sends copy into one of two device buffers
 *    per peer and go out with ncclSend on a side stream, receives run
 *    ncclRecv on that side stream, joined to the exec's stream by events,
 *    and are polled on the host against the deadline.
 * The exec's stream comes from backend_cuda.cu, which first ends the step
 * in flight (a captured decode step is launched), as every hand-over does. */
#ifndef SPARQ_KERNELS_CUDA_LINK_CUDA_H
#define SPARQ_KERNELS_CUDA_LINK_CUDA_H

#include <cuda_runtime.h>

extern "C" {
#include "kernels/backend.h"
}

/* backend_cuda.cu: the stream every op of ex runs on, the step in flight ended. */
cudaStream_t sq_cuda_link_stream(sq_exec *ex);

/* The vtable's link ops (link_cuda.cu), for either kind. */
sparq_status cuda_link_open(sq_exec *ex, const sq_link_spec *spec, sq_link **out);
sparq_status cuda_link_send(sq_exec *ex, sq_link *l, int peer, const void *mem, size_t bytes, double timeout_s);
bool cuda_link_send_ready(sq_exec *ex, sq_link *l, int peer);
sparq_status cuda_link_recv(sq_exec *ex, sq_link *l, int peer, void *mem, size_t bytes, double timeout_s);
sparq_status cuda_link_allgather(sq_exec *ex, sq_link *l, const void *mine, void *all, size_t bytes,
                                 double timeout_s);
void cuda_link_close(sq_exec *ex, sq_link *l);
void *cuda_link_hub_make(int size);

/* The NCCL kind (link_nccl.cu); without NCCL, open says so and the others are never reached. */
typedef struct nccl_end nccl_end;
sparq_status nccl_link_open(const sq_link_spec *spec, nccl_end **out);
sparq_status nccl_link_send(nccl_end *e, cudaStream_t s, int peer, const void *mem, size_t bytes, double timeout_s);
bool nccl_link_send_ready(nccl_end *e, int peer);
sparq_status nccl_link_recv(nccl_end *e, cudaStream_t s, int peer, void *mem, size_t bytes, double timeout_s);
sparq_status nccl_link_allgather(nccl_end *e, cudaStream_t s, const void *mine, void *all, size_t bytes,
                                 double timeout_s);
void nccl_link_close(nccl_end *e);

/* A CUDA error as a status naming `what` (both kinds). */
sparq_status link_cuda_status(cudaError_t e, const char *what);

/* bytes of device memory and four events (timing off), or nothing and the reason (both kinds). */
sparq_status link_cuda_buffers(size_t bytes, char **buf, cudaEvent_t ev[4]);

#endif
