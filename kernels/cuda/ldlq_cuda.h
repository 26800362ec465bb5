/* kernels/cuda/ldlq_cuda.h — the block-LDLQ recursion of EXL3 quantization
 * (quantize/ldlq.h) on an NVIDIA GPU, for many weights of one shape at once:
 * all the experts' gate (or up, or down) projections of a MoE layer in one
 * batch, so that each 16-row strip step encodes (weights × n/16) tiles in one
 * launch of the GPU Viterbi (trellis_encode.h). Plain C, no CUDA types:
 * device pointers are plain pointers.
 *
 * What runs where (quantize/layer_cuda.c drives it): each Hessian is prepared
 * on the GPU (ldlq_cuda_hess_prepare) and each weight regularised with its
 * matrix work on the GPU (ldlq_cuda_reg_*: quantize/ldlq.h's ldlq_reg_engine;
 * the host makes the decisions between the steps, bit-exact with the CPU
 * quantizer, the scale search's tiles encoded on the GPU through
 * ldlq_cuda_encode_host), the regularised weight staying in device memory
 * for the batch; the GPU runs, per strip
 * from the last to the first, the targets T = wr[strip] + L[later, strip]ᵀ ·
 * (wr − wq)[later] (cuBLAS SGEMM, batched over the weights, fp32, no TF32),
 * the gather into stream order, the Viterbi over every tile of the strip,
 * the error update and the packing of the states into trellis words; then the
 * proxy error tr(E·Hr·Eᵀ)/tr(W·Hr·Wᵀ) (SGEMM + a reduction in double).
 *
 * Exactness: the last strip has no feedback, so its tiles are the CPU's bit
 * for bit (the encoder is bit-exact); for the other strips the SGEMM sums in
 * another order than OpenBLAS, so targets differ in the last bits and a tile
 * may take another path of equal quality: the proxy error agrees with the
 * CPU's to ~1e-5 relative (tests/gpu/test_ldlq_cuda.c). With an identity
 * Hessian (uncalibrated) every tile is the CPU's.
 *
 * Memory: ldlq_cuda_batch_bytes() says what one batch allocates (plus the
 * encoders' workspaces, fixed at create); the caller sizes its batches from
 * it and ldlq_cuda_mem_info().
 *
 * Asynchronous: ldlq_cuda_batch_submit queues a batch and returns,
 * ldlq_cuda_batch_wait collects it, so the CPU can prepare the next batch
 * (ldlq_cuda_hess_prepare and the search's ldlq_cuda_encode_host run beside
 * it) while the GPU runs this one (quantize/layer_cuda.c's pipeline). */
#ifndef SPARQ_KERNELS_CUDA_LDLQ_CUDA_H
#define SPARQ_KERNELS_CUDA_LDLQ_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/cpu/trellis.h"

typedef struct ldlq_cuda ldlq_cuda;

/* The shape every weight of a batch has. */
typedef struct ldlq_cuda_shape {
    int k, n;             /* in, out: multiples of 128 */
    int K;                /* 1..8 */
    trellis_codebook cb;
    int weighted;         /* weight each tile row by diag(D) (ldlq_opts.weighted) */
    int wr_device;        /* every item's wr is device memory (ldlq_cuda_reg_device), read in place */
} ldlq_cuda_shape;

/* A prepared Hessian: host arrays (from ldlq_hessian_hr / _l / _d), or with
 * `device` set device arrays (ldlq_cuda_hess_of, prepared on the GPU); all
 * NULL for the identity (no feedback, plain sums of squares for the proxy). */
typedef struct ldlq_cuda_hess {
    const float *hr, *l, *d;
    int device;
} ldlq_cuda_hess;

/* A Hessian prepared on the GPU (kernels/cuda/hessian_cuda.h: the same
 * decisions as ldlq_hessian_prepare, Hr bit for bit, L to fp32 rounding). */
typedef struct ldlq_cuda_dhess ldlq_cuda_dhess;

typedef struct ldlq_cuda_item {
    int hess;            /* index into the batch's Hessians */
    const float *wr;     /* k×n: ldlq_reg.wr on the host, or (shape.wr_device) the device matrix */
    uint16_t *trellis;   /* host out: (k/16)·(n/16) tiles of 16K words, the on-disk layout */
    float *wq;           /* host out k×n (the codebook values, regularised basis) or NULL */
    double proxy_err;    /* out */
} ldlq_cuda_item;

/* A context on CUDA device `device` (an ordinal; one out of range or unusable
 * is refused, naming it): every entry point below runs on that device
 * whichever host thread calls it (cudaSetDevice per call), so contexts on
 * several devices — or several on one device — can be driven from different
 * threads (`sparq quantize --devices`, quantize/layer_cuda.c). Streams, two cuBLAS handles, the batch
 * encoders (one per K and codebook in use, fixed workspaces of enc_workspace
 * bytes; 0: a quarter of the free memory at create, at most 4 GiB) and the
 * scale search's own encoder (the same workspace, at most 1 GiB).
 *
 * Threads and overlap: one thread (the submitting one) calls everything but
 * ldlq_cuda_encode_host, which any number of threads may call at once (the
 * context serialises them on its own stream and encoder). A batch runs on its
 * own streams (uploads and downloads on one, the recursion on another), the
 * Hessian preparation and the search's encodes on theirs, each with its own
 * device buffers, so both run while batches are in flight and neither waits
 * for them. Device memory is allocated in stream order (cudaMallocAsync)
 * where the device supports it, so freeing never waits for the device; a
 * change of K or codebook for the search frees its encoder with cudaFree,
 * which does wait for the work in flight. */
sparq_status ldlq_cuda_create(int device, size_t enc_workspace, ldlq_cuda **out);
/* Every batch submitted must have been waited for first. */
void ldlq_cuda_free(ldlq_cuda *c);
/* Free and total device memory (after the encoders' workspaces, if made). */
sparq_status ldlq_cuda_mem_info(ldlq_cuda *c, size_t *free_bytes, size_t *total_bytes);
/* Device bytes one batch allocates (besides the encoders) from submit to wait:
 * n_hess counts the host Hessians it uploads (device ones are used in place). */
size_t ldlq_cuda_batch_bytes(const ldlq_cuda_shape *s, int n_hess, int n_items, int want_wq);
/* The workspaces of the batch encoder and of the search's encoder for K / cb
 * (creating both), for plans. */
sparq_status ldlq_cuda_encoder_bytes(ldlq_cuda *c, int K, trellis_codebook cb, size_t *bytes);

/* Prepare the host mean Hessian h (k×k; NULL: the identity) on the GPU as
 * ldlq_hessian_prepare would (seed, sigma_reg, name as there). Writes the
 * input signs su (k) and diag of the damped H h_diag (k) to the host, and
 * *identity / *damping, for the CPU's regularisation (ldlq_hessian_wrap).
 * Synchronous, on the context's preparation stream: it runs while batches are
 * in flight. Free it only after the batches that read it were waited for. */
sparq_status ldlq_cuda_hess_prepare(ldlq_cuda *c, const float *h, int k, float sigma_reg, uint64_t seed,
                                    const char *name, ldlq_cuda_dhess **out, float *su, float *h_diag, int *identity,
                                    float *damping);
void ldlq_cuda_hess_free(ldlq_cuda_dhess *h);
ldlq_cuda_hess ldlq_cuda_hess_of(const ldlq_cuda_dhess *h);
/* Device bytes one prepared Hessian holds (with its upload buffer, held
 * during the preparation). */
size_t ldlq_cuda_hess_bytes(int k);

/* Encode n_tiles tiles of host targets (stream order, no weights) on the
 * GPU: the scale search's coder (ldlq_coder). Synchronous; thread-safe. */
sparq_status ldlq_cuda_encode_host(ldlq_cuda *c, int K, trellis_codebook cb, const float *x, size_t n_tiles,
                                   uint16_t *states, float *decoded);

/* The regularisation's matrix work on the GPU: the functions of quantize/ldlq.h's
 * ldlq_reg_engine (ctx: the ldlq_cuda; the matrix m is opaque, its device data
 * ldlq_cuda_reg_device(m)), with the CPU engine's arithmetic: the sums of
 * squares in double, one thread per column, row or tile adding in the CPU's
 * order; IEEE divisions and products; the 128-point butterflies in the CPU's
 * stages, then × 1/√128. So wr is the CPU's bit for bit (test_ldlq_cuda).
 * Any number of threads may call them at once: they run one at a time on the
 * context's own high-priority stream (the recursion's launches fill every SM;
 * priority makes this work go first where one ends), each synchronous. The
 * matrix is allocated by load in stream order (k·n floats,
 * ldlq_cuda_reg_bytes) and freed by release, which the caller does only after
 * the batches reading it were waited for. */
sparq_status ldlq_cuda_reg_load(void *c, const float *w, int k, int n, void **m);
sparq_status ldlq_cuda_reg_sumsq(void *c, void *m, int dim, double *out);
sparq_status ldlq_cuda_reg_scale_had(void *c, void *m, int dim, const float *s);
sparq_status ldlq_cuda_reg_tile_sumsq(void *c, void *m, double *out);
sparq_status ldlq_cuda_reg_tiles(void *c, void *m, const int *idx, size_t count, float *out);
sparq_status ldlq_cuda_reg_scale(void *c, void *m, float g);
void ldlq_cuda_reg_release(void *c, void *m);
const float *ldlq_cuda_reg_device(const void *m);
/* Device bytes one regularised k×n weight holds from load to release. */
size_t ldlq_cuda_reg_bytes(int k, int n);
/* quantize/ldlq.h's ldlq_reg_engine of context c, in that struct's field order (ctx, load,
 * sumsq, scale_had, tile_sumsq, tiles, scale, host: NULL, the matrix is not host memory,
 * release), for code that links these functions directly:
 *     const ldlq_reg_engine e = LDLQ_CUDA_REG_ENGINE(c); */
#define LDLQ_CUDA_REG_ENGINE(c)                                                                              \
    {(c), ldlq_cuda_reg_load, ldlq_cuda_reg_sumsq, ldlq_cuda_reg_scale_had, ldlq_cuda_reg_tile_sumsq,        \
     ldlq_cuda_reg_tiles, ldlq_cuda_reg_scale, NULL, ldlq_cuda_reg_release}

/* A batch in flight. */
typedef struct ldlq_cuda_pending ldlq_cuda_pending;

/* Start quantizing n_items regularised weights of shape s: allocates the
 * batch's device memory, uploads the host Hessians and the weights, queues
 * the whole recursion and the proxies, and returns without waiting for the
 * GPU (*out; NULL for n_items = 0). Until ldlq_cuda_batch_wait the caller
 * keeps valid and unchanged: `items` (the array: wait writes into it), every
 * item's wr and trellis (and wq), the host Hessians' arrays and the device
 * Hessians. Uploads from pageable memory return once copied (the call blocks
 * for the copy itself, never for other GPU work: they have their own
 * stream); from pinned memory (cudaHostRegister) they run asynchronously too.
 * The launches are made by a thread of the batch's own (thousands of them:
 * more than the launch queue holds, so making them blocks until the GPU has
 * run most), which wait joins. Several batches may be in flight; they are
 * enqueued and run in submission order. On error nothing of it is left in
 * flight and *out is NULL; an error while enqueueing comes back from wait. */
sparq_status ldlq_cuda_batch_submit(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                                    ldlq_cuda_item *items, int n_items, const char *name,
                                    ldlq_cuda_pending **out);
/* Wait for p, download each item's trellis (and wq) and proxy_err, free the
 * batch's device memory and p (also on error; p NULL does nothing).
 * gpu_seconds (may be NULL): the batch's GPU busy time, its uploads and its
 * recursion and proxies by CUDA events plus its downloads. */
sparq_status ldlq_cuda_batch_wait(ldlq_cuda_pending *p, double *gpu_seconds);

/* Submit and wait: synchronous; `name` is for messages. */
sparq_status ldlq_cuda_batch(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                             ldlq_cuda_item *items, int n_items, const char *name);

/* The functions above as a table: the sparq binary opens the CUDA module with
 * dlopen and takes this (kernels/cpu/ops_device.c, sq_cuda_ldlq_ops). */
typedef struct ldlq_cuda_ops {
    sparq_status (*create)(int device, size_t enc_workspace, ldlq_cuda **out);
    void (*free)(ldlq_cuda *c);
    sparq_status (*mem_info)(ldlq_cuda *c, size_t *free_bytes, size_t *total_bytes);
    size_t (*batch_bytes)(const ldlq_cuda_shape *s, int n_hess, int n_items, int want_wq);
    sparq_status (*encoder_bytes)(ldlq_cuda *c, int K, trellis_codebook cb, size_t *bytes);
    sparq_status (*encode_host)(ldlq_cuda *c, int K, trellis_codebook cb, const float *x, size_t n_tiles,
                                uint16_t *states, float *decoded);
    sparq_status (*batch)(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                          ldlq_cuda_item *items, int n_items, const char *name);
    sparq_status (*hess_prepare)(ldlq_cuda *c, const float *h, int k, float sigma_reg, uint64_t seed,
                                 const char *name, ldlq_cuda_dhess **out, float *su, float *h_diag, int *identity,
                                 float *damping);
    void (*hess_free)(ldlq_cuda_dhess *h);
    ldlq_cuda_hess (*hess_of)(const ldlq_cuda_dhess *h);
    size_t (*hess_bytes)(int k);
    sparq_status (*batch_submit)(ldlq_cuda *c, const ldlq_cuda_shape *s, const ldlq_cuda_hess *hs, int n_hess,
                                 ldlq_cuda_item *items, int n_items, const char *name, ldlq_cuda_pending **out);
    sparq_status (*batch_wait)(ldlq_cuda_pending *p, double *gpu_seconds);
    sparq_status (*reg_load)(void *c, const float *w, int k, int n, void **m);
    sparq_status (*reg_sumsq)(void *c, void *m, int dim, double *out);
    sparq_status (*reg_scale_had)(void *c, void *m, int dim, const float *s);
    sparq_status (*reg_tile_sumsq)(void *c, void *m, double *out);
    sparq_status (*reg_tiles)(void *c, void *m, const int *idx, size_t count, float *out);
    sparq_status (*reg_scale)(void *c, void *m, float g);
    void (*reg_release)(void *c, void *m);
    const float *(*reg_device)(const void *m);
    size_t (*reg_bytes)(int k, int n);
} ldlq_cuda_ops;

const ldlq_cuda_ops *ldlq_cuda_get_ops(void);

/* For C code in any build (kernels/cpu/ops_device.c): the table of the linked
 * or dlopen-ed CUDA module, or NULL with the reason set (sparq_err) when
 * there is none (a build without CUDA, the module missing). */
const ldlq_cuda_ops *sq_cuda_ldlq_ops(void);

#ifdef __cplusplus
}
#endif

#endif
