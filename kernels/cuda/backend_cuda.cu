/* kernels/cuda/backend_cuda.cu — the CUDA backend (kernels/cuda/backend_cuda.h):
 * every sq_backend op as a CUDA kernel on device memory, and the exec state
 * that holds the device copies of the weights.
 *
 * Why it looks like this: the graph (runtime/models/qwen3moe.c) keeps calling the
 * vtable with the host pointers the loader made (sq_linear.w, norm vectors);
 * this backend maps each such pointer to its device copy through a small hash
 * table filled by prepare / prepare_linear at load (or on first use). The EXL3
 * kernels are the "cudalab" helper's (kernels/cuda/trellis_cuda.h), called
 * through their public API only. Small host index arrays (positions, KV row
 * ranges, token ids) go through a pinned staging ring, so nothing here waits
 * for the GPU except to_host / sync and the MoE's expert grouping when the
 * fused EXL3 path does not apply (docs/cuda.md). Numerics: fp32 throughout,
 * weights widened exactly; only the order of additions differs from the CPU. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/attn_prefill.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/link_cuda.h"
#include "kernels/cuda/sample_cuda.h"
#include "kernels/cuda/trellis_cuda.h"
#include "kernels/cuda/trellis_decode.cuh" /* griddep_launch / griddep_wait */

#include "kernels/cpu/ops_topk.h"

extern "C" {
#include "common/alloc.h"
}

/* --- state ------------------------------------------------------------------------- */

enum { ENT_RAW = 1, ENT_EXL3, ENT_MOE, ENT_DMOE };

/* A layer of dense experts for the small-batch MoE kernels: device tables of
 * the experts' weight pointers (gate[E], up[E], down[E]). */
typedef struct dense_moe {
    const void **tab; /* device, 3·E pointers */
    sq_linear_kind kind;
    int max_slots;    /* rows·top_k the workspace holds */
} dense_moe;

typedef struct ent {
    const void *key;
    void *dev;
    int type;
} ent;

#define STAGE_INTS (1 << 20) /* pinned staging ring for host index arrays */
/* Rows of one cuBLAS call of the EXL3 prefill path (longer steps run in
 * chunks): its input/output buffers are SQ_CUDA_PREFILL_ROWS × the widest
 * linear, shared by all linears (trellis_cuda_prefill_ws). */
#define SQ_CUDA_PREFILL_ROWS 128

/* Decode steps as CUDA graphs (docs/cuda.md, "The decode step as a graph").
 * The model brackets a small step with step_begin(rows, max keys); the first
 * step of a shape runs as usual, the second is captured on the exec's stream,
 * later ones replay the capture: the host still walks the graph code, but the
 * ops only copy their index arrays into the same pinned offsets the capture's
 * upload nodes read, and launch nothing. The step ends (the graph launches) at
 * the next to_host, to_device, sync or step_begin. Each op folds its launch
 * arguments into `sig`; a replay whose arguments differ from its capture is
 * an error, never a silent wrong result. */
enum { G_OFF = 0, G_PLAIN, G_CAPTURE, G_REPLAY };
#define GRAPH_SLOTS 32
#define GRAPH_STAGE_INTS (1 << 16)  /* the pinned ring's tail, kept for graph steps */
#define GRAPH_KV_BUCKET 256         /* attention's shared memory grows in steps of this many keys */
typedef struct step_graph {
    uint64_t key, sig, used;
    cudaGraphExec_t exec; /* NULL: seen once, not captured yet */
} step_graph;
typedef struct step_graphs {
    int mode;             /* G_OFF: not in a step; G_PLAIN: a step run as usual */
    bool disabled;        /* SPARQ_CUDA_GRAPHS=0, or a capture failed */
    step_graph slot[GRAPH_SLOTS];
    step_graph *cur;
    uint64_t sig, clock;
    size_t stage_at;      /* next free int of the graph staging area */
    struct {
        const int *host;
        size_t n, at;
    } staged[8];          /* this step's staged arrays, by host pointer: a later op reuses the copy */
    int n_staged;
    uint64_t n_capture, n_replay;
    int max_rows;         /* largest step every layer runs without a host round trip (set by prepare_moe) */
    bool pending;         /* a graph was launched and nothing has waited for it yet */
} step_graphs;

typedef struct cuda_state {
    ent *tab;
    size_t cap, n;
    int *h_stage, *d_stage; /* ring of STAGE_INTS ints, host pinned / device */
    size_t stage_at;
    struct {
        size_t at, n;
    } recent[4]; /* the last staged arrays, reused when the same indices come again */
    int recent_i;
    trellis_cuda_ws *tws;
    int tws_k, tws_n;
    trellis_cuda_prefill_ws *pws; /* the prefill path's one workspace and cuBLAS handle */
    /* weight slabs: device copies of weights are carved from these, 256-byte
     * aligned (one cudaMalloc per slab, not per tensor) */
    char **slab;
    size_t n_slab, cap_slab, slab_left;
    char *slab_at;
    uint64_t slab_bytes, weight_bytes; /* allocated in slabs / handed out */
    size_t pws_kn;
    int pws_k, pws_n;
    trellis_cuda_moe *moe_first; /* the first fused MoE layer: the others share its scratch */
    int *h_ids, *h_rows, *h_cnt; /* MoE grouping on the host (pinned) */
    float *h_w, *h_lw;
    size_t h_cap, cnt_cap;
    sparq_status err; /* first error any op met */
    char errmsg[512];
    float *attn_part; /* ATTN_SPLIT_SCRATCH bytes: the split attention's partial results */
    cudaStream_t s; /* every op runs on this one stream (a graph cannot capture the legacy stream) */
    step_graphs graph;
    bool no_fuse; /* SPARQ_CUDA_FUSED=0: the attention front op by op */
    bool no_stage_reuse; /* SPARQ_CUDA_STAGE_REUSE=0: a graph step copies every staged array (benchmarks) */
    bool no_attn_prefill; /* SPARQ_CUDA_ATTN_PREFILL=0: prefill chunks through the one-block-a-head kernel */
    bool no_linear_norm; /* SPARQ_CUDA_LINEAR_NORM=0: o_proj, then add_rmsnorm as its own launch */
    /* sample_select: the request on the host (staged), the results on the device and their pinned mirror */
    int *smp_req;
    size_t smp_req_cap;
    char *smp_dev, *smp_host;
    size_t smp_cap;
} cuda_state;

static cuda_state *state_of(sq_exec *ex) { return (cuda_state *)ex->dev; }

/* SPARQ_CUDA_MEMLOG=1: device memory in use at each growth step, on stderr
 * (docs/cuda.md: where a model's GPU bytes go). */
static void memlog(const char *what, size_t bytes)
{
    static int on = -1;
    static size_t last;
    if (on < 0) on = getenv("SPARQ_CUDA_MEMLOG") != NULL;
    if (!on) return;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    const ssize_t delta = (ssize_t)(tot - fr - last);
    if (!bytes && delta < ((ssize_t)1 << 20) && delta > -((ssize_t)1 << 20)) return;
    fprintf(stderr, "[cuda mem] %-28s %10zu bytes asked; in use %12zu (+%zd)\n", what, bytes, tot - fr,
            (ssize_t)(tot - fr - last));
    last = tot - fr;
}

/* Keep the first error (with its message) for to_host / sync. */
static void keep_err(cuda_state *st, sparq_status s)
{
    if (s == SPARQ_OK || st->err != SPARQ_OK) return;
    st->err = s;
    snprintf(st->errmsg, sizeof st->errmsg, "%s", sparq_errmsg());
}

static sparq_status cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return SPARQ_OK;
    return sparq_err(e == cudaErrorMemoryAllocation ? SPARQ_E_NOMEM : SPARQ_E_STATE, "cuda backend: %s: %s (%s)",
                     what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static void check(cuda_state *st, cudaError_t e, const char *what)
{
    if (e != cudaSuccess) keep_err(st, cuda_status(e, what));
}

/* The backend's own kernels are launched with programmatic dependent launch
 * (as the trellis kernels are): a kernel may start while the previous one on
 * the stream drains, and waits for it (its writes visible) in pdl_enter(),
 * its first statement (k_gemv prefetches its weights before the wait). In a
 * decode step of ~20 small launches a layer that hides part of each
 * hand-over. SPARQ_CUDA_PDL=0 launches them in plain stream order. */
using trellis_dev::griddep_launch;
using trellis_dev::griddep_wait;
__device__ __forceinline__ void pdl_enter()
{
    griddep_launch();
    griddep_wait();
}
template <typename... P, typename... A>
static void launch(cudaStream_t s, cuda_state *st, void (*k)(P...), dim3 grid, dim3 block, size_t smem, A... a)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    static int pdl = -1; /* SPARQ_CUDA_PDL=0: plain stream order (benchmarks) */
    if (pdl < 0) pdl = !(getenv("SPARQ_CUDA_PDL") && strcmp(getenv("SPARQ_CUDA_PDL"), "0") == 0);
    cfg.attrs = attr;
    cfg.numAttrs = pdl;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k, (P)a...);
    if (st && e != cudaSuccess) { /* the launch's shape, to tell which kernel it was */
        char what[96];
        snprintf(what, sizeof what, "kernel launch (grid %ux%u, block %u, %zu bytes of shared memory)", grid.x, grid.y,
                 block.x, smem);
        check(st, e, what);
    }
}

/* --- decode steps as graphs ------------------------------------------------------- */

static uint64_t mix64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xbf58476d1ce4e5b9ull;
}

/* In a captured or replayed step, fold an op's launch arguments into the
 * step's signature; true when the op must not launch (a replay: the graph
 * does its work). Ops call it after staging their index arrays. */
static bool replaying(cuda_state *st, uint64_t op, uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0,
                      uint64_t e = 0)
{
    step_graphs *g = &st->graph;
    if (g->mode != G_CAPTURE && g->mode != G_REPLAY) return false;
    g->sig = mix64(mix64(mix64(mix64(mix64(mix64(g->sig, op), a), b), c), d), e);
    return g->mode == G_REPLAY;
}
#define P(x) ((uint64_t)(uintptr_t)(x))

static uint64_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* End the step: a capture becomes a graph and launches, a replay launches
 * its graph. Called by everything that hands data to the host or waits. */
static void graph_finish(cuda_state *st)
{
    step_graphs *g = &st->graph;
    const int mode = g->mode;
    g->mode = G_OFF;
    if (mode == G_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        cudaError_t e = cudaStreamEndCapture(st->s, &graph);
        if (e == cudaSuccess && st->err == SPARQ_OK) e = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (e != cudaSuccess || st->err != SPARQ_OK) { /* the captured work never ran: the step fails */
            if (exec) cudaGraphExecDestroy(exec);
            g->disabled = true;
            (void)cudaGetLastError();
            if (e != cudaSuccess)
                keep_err(st, cuda_status(e, "capturing the decode step as a graph (SPARQ_CUDA_GRAPHS=0 runs without)"));
            return;
        }
        g->cur->exec = exec;
        g->cur->sig = g->sig;
        g->n_capture++;
    } else if (mode == G_REPLAY) {
        if (g->sig != g->cur->sig) {
            keep_err(st, sparq_err(SPARQ_E_STATE,
                                   "cuda backend: a decode step of %llu rows launched other kernels than its captured "
                                   "graph (a bug; SPARQ_CUDA_GRAPHS=0 runs without graphs)",
                                   (unsigned long long)(g->cur->key >> 32)));
            return;
        }
        g->n_replay++;
    } else {
        return;
    }
    check(st, cudaGraphLaunch(g->cur->exec, st->s), "decode step graph launch");
    g->pending = true;
}

/* The model starts a step of `rows` rows whose rows attend to at most
 * `max_keys` keys (backend.h). */
static void cuda_step_begin(sq_exec *ex, int rows, int max_keys)
{
    cuda_state *st = state_of(ex);
    step_graphs *g = &st->graph;
    graph_finish(st);
    if (g->disabled || rows < 1 || rows > g->max_rows || st->err != SPARQ_OK) return;
    const uint64_t key = (uint64_t)rows << 32 | (uint64_t)((max_keys + GRAPH_KV_BUCKET - 1) / GRAPH_KV_BUCKET);
    step_graph *hit = NULL, *lru = &g->slot[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (g->slot[i].used && g->slot[i].key == key) hit = &g->slot[i];
        if (g->slot[i].used < lru->used) lru = &g->slot[i];
    }
    g->clock++;
    if (!hit) { /* first time: run it as usual (first uses upload and size things), capture the next one */
        if (lru->exec) cudaGraphExecDestroy(lru->exec);
        *lru = (step_graph){key, 0, g->clock, NULL};
        return;
    }
    hit->used = g->clock;
    if (g->pending) { /* the staging area is about to be rewritten: the last graph must have read it */
        check(st, cudaStreamSynchronize(st->s), "decode step graph");
        g->pending = false;
    }
    g->cur = hit;
    g->sig = 0;
    g->stage_at = 0;
    g->n_staged = 0;
    if (hit->exec) {
        g->mode = G_REPLAY;
        return;
    }
    if (cudaStreamBeginCapture(st->s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        g->disabled = true;
        return;
    }
    g->mode = G_CAPTURE;
}

/* The step failed on the host before it ended: drop what it captured. */
static void cuda_step_abort(sq_exec *ex)
{
    cuda_state *st = state_of(ex);
    step_graphs *g = &st->graph;
    if (g->mode == G_CAPTURE) {
        cudaGraph_t graph = NULL;
        if (cudaStreamEndCapture(st->s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
    }
    g->mode = G_OFF;
}

static size_t hash_ptr(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static ent *find_ent(cuda_state *st, const void *key)
{
    if (!st->cap) return NULL;
    for (size_t i = hash_ptr(key, st->cap);; i = (i + 1) & (st->cap - 1)) {
        if (st->tab[i].key == key) return &st->tab[i];
        if (!st->tab[i].key) return NULL;
    }
}

static sparq_status add_ent(cuda_state *st, const void *key, void *dev, int type)
{
    if (2 * (st->n + 1) > st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 1024;
        ent *t = (ent *)sparq_calloc(cap, sizeof *t);
        RETURN_IF(!t, SPARQ_E_NOMEM, "cuda backend: out of memory (weight table)");
        for (size_t i = 0; i < st->cap; i++) {
            if (!st->tab[i].key) continue;
            size_t j = hash_ptr(st->tab[i].key, cap);
            while (t[j].key) j = (j + 1) & (cap - 1);
            t[j] = st->tab[i];
        }
        sparq_free(st->tab);
        st->tab = t;
        st->cap = cap;
    }
    size_t j = hash_ptr(key, st->cap);
    while (st->tab[j].key) j = (j + 1) & (st->cap - 1);
    st->tab[j] = (ent){key, dev, type};
    st->n++;
    return SPARQ_OK;
}

/* A weight slab's size: large enough that cudaMalloc's rounding and the
 * unused tail are small against the weights (at most one slab a process). */
#define SLAB_BYTES ((size_t)256 << 20)

/* `bytes` of device memory for a weight, from the current slab or a new one
 * (its own allocation when it is larger than a slab). Freed with the exec. */
static sparq_status weight_mem(cuda_state *st, size_t bytes, void **out)
{
    bytes = (bytes + 255) & ~(size_t)255;
    if (bytes > st->slab_left) {
        const size_t sz = bytes > SLAB_BYTES ? bytes : SLAB_BYTES;
        if (st->n_slab == st->cap_slab) {
            size_t cap = st->cap_slab ? 2 * st->cap_slab : 64;
            char **t = (char **)sparq_realloc(st->slab, cap * sizeof *t);
            RETURN_IF(!t, SPARQ_E_NOMEM, "cuda backend: out of memory (slab table)");
            st->slab = t;
            st->cap_slab = cap;
        }
        char *p = NULL;
        FORWARD_IF(cuda_status(cudaMalloc((void **)&p, sz), "cudaMalloc of a weight slab"));
        st->slab[st->n_slab++] = p;
        st->slab_bytes += sz;
        memlog("weight slab", sz);
        if (sz > SLAB_BYTES) { /* a tensor of its own: the current slab stays current */
            st->weight_bytes += bytes;
            *out = p;
            return SPARQ_OK;
        }
        st->slab_at = p;
        st->slab_left = sz;
    }
    *out = st->slab_at;
    st->slab_at += bytes;
    st->slab_left -= bytes;
    st->weight_bytes += bytes;
    return SPARQ_OK;
}

/* The device copy of `bytes` of constant host data, uploaded on first use. */
static sparq_status raw_get(cuda_state *st, const void *host, size_t bytes, void **dev)
{
    ent *e = find_ent(st, host);
    if (e) {
        *dev = e->dev;
        return SPARQ_OK;
    }
    void *d = NULL;
    FORWARD_IF(weight_mem(st, bytes ? bytes : 1, &d));
    FORWARD_IF(cuda_status(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "weight upload"));
    FORWARD_IF(add_ent(st, host, d, ENT_RAW)); /* the slab keeps d either way */
    *dev = d;
    return SPARQ_OK;
}

static sparq_status exl3_get(cuda_state *st, const sq_linear *l, trellis_cuda_linear **out)
{
    ent *e = find_ent(st, l->impl);
    if (e) {
        *out = (trellis_cuda_linear *)e->dev;
        return SPARQ_OK;
    }
    trellis_cuda_linear *lin;
    const trellis_linear *h = (const trellis_linear *)l->impl;
    void *mem = NULL;
    FORWARD_IF(weight_mem(st, trellis_cuda_linear_bytes(h), &mem));
    FORWARD_IF(trellis_cuda_linear_upload_into(h, l->name ? l->name : "exl3", mem, &lin));
    sparq_status s = add_ent(st, l->impl, lin, ENT_EXL3);
    if (s != SPARQ_OK) {
        trellis_cuda_linear_free(lin);
        return s;
    }
    if (l->in > st->tws_k || l->out > st->tws_n) { /* grow the GEMM workspace (syncs: load time) */
        const int k = l->in > st->tws_k ? l->in : st->tws_k, n = l->out > st->tws_n ? l->out : st->tws_n;
        trellis_cuda_ws_free(st->tws);
        st->tws = NULL;
        st->tws_k = st->tws_n = 0;
        FORWARD_IF(trellis_cuda_ws_create(k, n, &st->tws));
        memlog("gemm workspace", 0);
        st->tws_k = k;
        st->tws_n = n;
    }
    const size_t kn = (size_t)l->in * (size_t)l->out;
    if (kn > st->pws_kn || l->in > st->pws_k || l->out > st->pws_n) { /* grow the prefill workspace (load time) */
        const size_t mkn = kn > st->pws_kn ? kn : st->pws_kn;
        const int k = l->in > st->pws_k ? l->in : st->pws_k, n = l->out > st->pws_n ? l->out : st->pws_n;
        if (st->pws) FORWARD_IF(cuda_status(cudaDeviceSynchronize(), "prefill workspace"));
        trellis_cuda_prefill_ws_free(st->pws);
        st->pws = NULL;
        st->pws_kn = 0, st->pws_k = st->pws_n = 0;
        FORWARD_IF(trellis_cuda_prefill_ws_create(mkn, k, n, SQ_CUDA_PREFILL_ROWS, &st->pws));
        memlog("prefill workspace", trellis_cuda_prefill_ws_bytes(mkn, k, n, SQ_CUDA_PREFILL_ROWS));
        st->pws_kn = mkn, st->pws_k = k, st->pws_n = n;
    }
    *out = lin;
    return SPARQ_OK;
}

/* Copy n host ints to the device through the pinned ring; returns the device
 * copy (valid for ops queued after this call). */
static const int *stage(cuda_state *st, const int *host, size_t n)
{
    if (n > STAGE_INTS - GRAPH_STAGE_INTS) {
        keep_err(st, sparq_err(SPARQ_E_RANGE, "cuda backend: %zu indices exceed the staging ring", n));
        return NULL;
    }
    step_graphs *g = &st->graph;
    if (g->mode == G_CAPTURE || g->mode == G_REPLAY) { /* the same offsets every time the step runs */
        /* The layers stage the same arrays (positions, key ranges) again and
         * again: each copy would be a memcpy node on the step's critical path
         * between two kernels (no programmatic hand-over across it), so an
         * array staged earlier in the step, same host pointer and contents,
         * is reused. Which calls reuse depends on the code path only, so a
         * replay takes the offsets its capture took (the signature checks). */
        for (int i = 0; i < g->n_staged && !st->no_stage_reuse; i++)
            if (g->staged[i].host == host && g->staged[i].n == n &&
                memcmp(st->h_stage + STAGE_INTS - GRAPH_STAGE_INTS + g->staged[i].at, host, n * sizeof(int)) == 0)
                return st->d_stage + STAGE_INTS - GRAPH_STAGE_INTS + g->staged[i].at;
        if (g->stage_at + n > GRAPH_STAGE_INTS) {
            keep_err(st, sparq_err(SPARQ_E_RANGE, "cuda backend: a graph step stages more than %d indices",
                                   GRAPH_STAGE_INTS));
            return NULL;
        }
        const size_t at = STAGE_INTS - GRAPH_STAGE_INTS + g->stage_at;
        memcpy(st->h_stage + at, host, n * sizeof(int));
        if (g->n_staged < 8) {
            g->staged[g->n_staged].host = host;
            g->staged[g->n_staged].n = n;
            g->staged[g->n_staged++].at = g->stage_at;
        }
        if (g->mode == G_CAPTURE)
            check(st, cudaMemcpyAsync(st->d_stage + at, st->h_stage + at, n * sizeof(int), cudaMemcpyHostToDevice, st->s),
                  "index upload");
        g->stage_at += (n + 31) & ~(size_t)31;
        return st->d_stage + at;
    }
    for (int i = 0; i < 4; i++) /* positions, key ranges: often the same as one op ago */
        if (st->recent[i].n == n && n && memcmp(st->h_stage + st->recent[i].at, host, n * sizeof(int)) == 0)
            return st->d_stage + st->recent[i].at;
    if (st->stage_at + n > STAGE_INTS - GRAPH_STAGE_INTS) { /* wrap: earlier copies must have landed */
        check(st, cudaStreamSynchronize(st->s), "staging ring wrap");
        st->stage_at = 0;
        memset(st->recent, 0, sizeof st->recent);
    }
    int *h = st->h_stage + st->stage_at, *d = st->d_stage + st->stage_at;
    memcpy(h, host, n * sizeof(int));
    check(st, cudaMemcpyAsync(d, h, n * sizeof(int), cudaMemcpyHostToDevice, st->s), "index upload");
    st->recent[st->recent_i].at = st->stage_at;
    st->recent[st->recent_i].n = n;
    st->recent_i = (st->recent_i + 1) % 4;
    st->stage_at += (n + 31) & ~(size_t)31;
    return d;
}

/* --- element conversion ---------------------------------------------------------- */

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); } /* bf16 */
struct f16_t {
    uint16_t b;
};
__device__ __forceinline__ float to_f(f16_t v) { return __half2float(__ushort_as_half(v.b)); }

/* 8 consecutive weights from a 16-byte-aligned address. */
__device__ __forceinline__ void load8(const float *p, float *o)
{
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
__device__ __forceinline__ void load8(const uint16_t *p, float *o)
{
    uint4 v = *(const uint4 *)p;
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = __uint_as_float(w[i] << 16);
        o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void load8(const f16_t *p, float *o)
{
    uint4 v = *(const uint4 *)p;
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffff)));
        o[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* --- dense linears ------------------------------------------------------------------ */

/* y[r, o] = Σ_i x[r, i]·W[o, i] for rows ≤ R: one warp per output o, the
 * weight row read once (8 elements a lane when in % 8 == 0). 256 threads. */
template <typename T, int R>
__global__ void __launch_bounds__(256) k_gemv(const T *__restrict__ W, const float *__restrict__ x,
                                              float *__restrict__ y, int in, int out, int rows, bool vec)
{
    const int o = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    griddep_launch();
    const T *w = W + (size_t)o * in;
    /* the weights do not depend on the previous kernel: into L2 while it ends */
    if (o < out)
        for (size_t b = (size_t)lane * 128; b < (size_t)in * sizeof(T); b += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)w + b));
    griddep_wait();
    if (o >= out) return;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (vec) {
        for (int i = lane * 8; i < in; i += 256) {
            float wv[8];
            load8(w + i, wv);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r >= rows) break;
                float xv[8];
                load8(x + (size_t)r * in + i, xv);
#pragma unroll
                for (int j = 0; j < 8; j++) acc[r] = fmaf(wv[j], xv[j], acc[r]);
            }
        }
    } else {
        for (int i = lane; i < in; i += 32) {
            const float wv = to_f(w[i]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r >= rows) break;
                acc[r] = fmaf(wv, x[(size_t)r * in + i], acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r < rows) y[(size_t)r * out + o] = s;
    }
}

/* Tiled fp32 GEMM for many rows: 64 rows × 64 outputs a block, k-steps of 16,
 * 4×4 outputs a thread. 256 threads; grid (ceil(out/64), ceil(rows/64)). */
template <typename T>
__global__ void __launch_bounds__(256) k_gemm(const T *__restrict__ W, const float *__restrict__ x,
                                              float *__restrict__ y, int in, int out, int rows)
{
    __shared__ float xs[16][68], ws[16][68];
    const int r0 = blockIdx.y * 64, o0 = blockIdx.x * 64;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < in; k0 += 16) {
        for (int i = threadIdx.x; i < 64 * 16; i += 256) {
            const int rr = i / 16, kk = i % 16, k = k0 + kk;
            const int r = r0 + rr, o = o0 + rr;
            xs[kk][rr] = (r < rows && k < in) ? x[(size_t)r * in + k] : 0.f;
            ws[kk][rr] = (o < out && k < in) ? to_f(W[(size_t)o * in + k]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i], b[i] = ws[kk][tx * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + ty * 4 + i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int o = o0 + tx * 4 + j;
            if (o < out) y[(size_t)r * out + o] = acc[i][j];
        }
    }
}

__global__ void k_add_bias(float *y, const float *b, int out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % out];
}

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

/* Rows up to which dense() runs the warp-per-output GEMV in chunks of 8 rows
 * rather than the 64×64-tile GEMM: a decode step of 16 users through a
 * 2048 → 128 router is 2 GEMM blocks (267 µs a layer on an H200, ncu) but
 * 2 × 16 GEMV blocks. */
#define DENSE_GEMV_ROWS 64

template <typename T>
static void dense(const T *W, const float *x, float *y, int in, int out, int rows, cudaStream_t s)
{
    if (rows > 8 && rows <= DENSE_GEMV_ROWS) { /* each row's sum is the same in any chunk */
        for (int r0 = 0; r0 < rows; r0 += 8)
            dense(W, x + (size_t)r0 * in, y + (size_t)r0 * out, in, out, rows - r0 < 8 ? rows - r0 : 8, s);
        return;
    }
    if (rows <= 8) {
        const unsigned g = (unsigned)((out + 7) / 8);
        /* 8-wide loads need 16-byte aligned rows of W (cudaMalloc'd) and x */
        const bool vec = in % 8 == 0 && (uintptr_t)x % 16 == 0;
        if (rows == 1) launch(s, nullptr, k_gemv<T, 1>, g, 256, 0, W, x, y, in, out, rows, vec);
        else if (rows == 2) launch(s, nullptr, k_gemv<T, 2>, g, 256, 0, W, x, y, in, out, rows, vec);
        else if (rows <= 4) launch(s, nullptr, k_gemv<T, 4>, g, 256, 0, W, x, y, in, out, rows, vec);
        else launch(s, nullptr, k_gemv<T, 8>, g, 256, 0, W, x, y, in, out, rows, vec);
    } else {
        dim3 g((unsigned)((out + 63) / 64), (unsigned)((rows + 63) / 64));
        k_gemm<T><<<g, 256, 0, s>>>(W, x, y, in, out, rows);
    }
}

/* FP8 / MXFP4 linears have no CUDA kernel yet: refused at upload, so a model
 * holding them fails to load on the GPU with a message, never at a launch. */
static bool block_scaled(const sq_linear *l) { return l->kind == SQ_LINEAR_FP8 || l->kind == SQ_LINEAR_MXFP4; }

static sparq_status refuse_block_scaled(const sq_linear *l)
{
    return sparq_err(SPARQ_E_UNSUPPORTED,
                     "device cuda: linear '%s' is %s, which runs on the CPU only for now (--device cpu, or `sparq "
                     "quantize` it to EXL3)",
                     l->name ? l->name : "(unnamed)", sq_linear_kind_name(l->kind));
}

static void cuda_linear(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y)
{
    cuda_state *st = state_of(ex);
    if (rows <= 0 || replaying(st, 1, P(l), P(x), P(y), (uint64_t)rows)) return;
    if (block_scaled(l)) { /* prepare_linear refused it; an unprepared call keeps the error for sync */
        keep_err(st, refuse_block_scaled(l));
        return;
    }
    if (l->kind == SQ_LINEAR_EXL3) {
        trellis_cuda_linear *lin;
        sparq_status s = exl3_get(st, l, &lin);
        if (s == SPARQ_OK && rows <= 16) s = trellis_cuda_gemm(lin, x, rows, y, st->tws, st->s);
        else if (s == SPARQ_OK) s = trellis_cuda_gemm_prefill(lin, x, rows, y, st->pws, st->s);
        keep_err(st, s);
    } else {
        const size_t es = l->kind == SQ_LINEAR_F32 ? 4 : 2;
        void *w;
        sparq_status s = raw_get(st, l->w, (size_t)l->in * (size_t)l->out * es, &w);
        if (s != SPARQ_OK) {
            keep_err(st, s);
            return;
        }
        if (l->kind == SQ_LINEAR_F32) dense((const float *)w, x, y, l->in, l->out, rows, st->s);
        else if (l->kind == SQ_LINEAR_BF16) dense((const uint16_t *)w, x, y, l->in, l->out, rows, st->s);
        else dense((const f16_t *)w, x, y, l->in, l->out, rows, st->s);
    }
    if (l->bias) {
        void *b;
        sparq_status s = raw_get(st, l->bias, (size_t)l->out * sizeof(float), &b);
        if (s != SPARQ_OK) {
            keep_err(st, s);
            return;
        }
        const size_t n = (size_t)rows * l->out;
        k_add_bias<<<grid_for(n, 256), 256, 0, st->s>>>(y, (const float *)b, l->out, n);
    }
}

/* --- norms, rope, attention ------------------------------------------------------- */

/* Block sum of a double over blockDim.x ≤ 1024 threads; all threads get it. */
__device__ double block_sum_d(double v)
{
    __shared__ double part[32];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}

__device__ float block_max_f(float v)
{
    __shared__ float part[32];
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : -INFINITY;
        for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}

/* One row a block: the sum of squares in double, as the CPU. ADD (the
 * add_rmsnorm op): h += x first, each sum rounded once as k_axpy's
 * fmaf(1, x, h), and h is the row normalised; one kernel for both so that
 * add_rmsnorm is axpy then rmsnorm to the bit. */
template <bool ADD>
__global__ void __launch_bounds__(1024) k_rmsnorm(const float *x, float *h, int dim, const float *w, float eps,
                                                  float *y)
{
    pdl_enter();
    const size_t off = (size_t)blockIdx.x * dim;
    const float *xr = ADD ? h + off : x + off;
    float *yr = y + off;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (ADD) {
            v += x[off + i];
            h[off + i] = v;
        }
        ss += (double)v * v;
    }
    ss = block_sum_d(ss);
    const float inv = (float)(1.0 / sqrt(ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

/* rmsnorm (h NULL) or add_rmsnorm of the rows. */
static void rmsnorm_launch(sq_exec *ex, const float *x, float *h, int rows, int dim, const float *w, float eps,
                           float *y)
{
    cuda_state *st = state_of(ex);
    void *dw;
    sparq_status s = raw_get(st, w, (size_t)dim * sizeof(float), &dw);
    if (s != SPARQ_OK || rows <= 0) {
        keep_err(st, s);
        return;
    }
    if (replaying(st, h ? 12 : 2, P(x), P(dw), P(y), (uint64_t)rows << 32 | (uint32_t)dim, P(h))) return;
    /* about two elements a thread: a row's loads (and add_rmsnorm's store to h, which the
     * compiler keeps in order with them) are then ~2 memory round trips, not dim/256
     * (8.7 µs for one 2048 row in 256 threads, ncu) */
    int threads = (dim / 2 + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads > 1024 ? 1024 : threads;
    launch(st->s, st, h ? k_rmsnorm<true> : k_rmsnorm<false>, rows, threads, 0, x, h, dim, (const float *)dw, eps, y);
}

static void cuda_rmsnorm(sq_exec *ex, const float *x, int rows, int dim, const float *w, float eps, float *y)
{
    rmsnorm_launch(ex, x, NULL, rows, dim, w, eps, y);
}

static void cuda_add_rmsnorm(sq_exec *ex, const float *x, float *h, int rows, int dim, const float *w, float eps,
                             float *y)
{
    rmsnorm_launch(ex, x, h, rows, dim, w, eps, y);
}

/* Block (row, head); thread i rotates the pair (i, i + hd/2). */
__global__ void k_rope(float *x, int n_heads, int hd, const int *pos, const float *inv_freq)
{
    pdl_enter();
    const int r = blockIdx.x / n_heads, half = hd / 2;
    float *v = x + (size_t)blockIdx.x * hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float f = (float)pos[r] * inv_freq[i];
        const float c = cosf(f), s = sinf(f);
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

static void cuda_rope(sq_exec *ex, float *x, int rows, int n_heads, int head_dim, const int *pos,
                      const float *inv_freq)
{
    cuda_state *st = state_of(ex);
    void *df;
    sparq_status s = raw_get(st, inv_freq, (size_t)(head_dim / 2) * sizeof(float), &df);
    if (s != SPARQ_OK || rows <= 0) {
        keep_err(st, s);
        return;
    }
    const int *dp = stage(st, pos, (size_t)rows);
    if (!dp || replaying(st, 3, P(x), P(dp), P(df), (uint64_t)rows << 32 | (uint32_t)(n_heads * head_dim))) return;
    launch(st->s, st, k_rope, rows * n_heads, 64, 0, x, n_heads, head_dim, dp, (const float *)df);
}

/* Block (row, head), 128 threads: scores in shared memory (hd + kv_len
 * floats), max, exp and sum, then one output element a thread. */
__global__ void __launch_bounds__(128) k_attention(const float *q, int n_heads, int n_kv, int hd, const float *k,
                                                   const float *v, const int *kv_first, const int *kv_len,
                                                   float scale, float *out)
{
    pdl_enter();
    extern __shared__ float sm[];
    float *qs = sm, *sc = sm + hd;
    const int r = blockIdx.x / n_heads, h = blockIdx.x % n_heads, g = h / (n_heads / n_kv);
    const size_t kvd = (size_t)n_kv * hd;
    const float *qh = q + ((size_t)r * n_heads + h) * hd;
    const float *kb = k + (size_t)kv_first[r] * kvd + (size_t)g * hd;
    const float *vb = v + (size_t)kv_first[r] * kvd + (size_t)g * hd;
    const int n = kv_len[r];
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qh[i];
    __syncthreads();
    float mx = -INFINITY;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const float *kt = kb + (size_t)t * kvd;
        float s = 0.f;
        for (int i = 0; i < hd; i++) s = fmaf(qs[i], kt[i], s);
        s *= scale;
        sc[t] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max_f(mx);
    double sum = 0;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const float e = expf(sc[t] - mx);
        sc[t] = e;
        sum += e;
    }
    sum = block_sum_d(sum); /* also orders the sc writes before the reads below */
    const float inv = (float)(1.0 / sum);
    float *oh = out + ((size_t)r * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float a = 0.f;
        for (int t = 0; t < n; t++) a = fmaf(sc[t] * inv, vb[(size_t)t * kvd + i], a);
        oh[i] = a;
    }
}

#define ATTN_SMEM_MAX (200 * 1024)

/* Decode attention (≤ ATTN_SPLIT_ROWS query rows), split over the keys as
 * flash-decoding does: block (row, KV head, split) takes the query heads of
 * its KV head together (their keys and values are read once) and a range of
 * at most ATTN_SPLIT_KEYS·k keys; a warp takes one key at a time, its lanes 4
 * dimensions each (coalesced, one warp sum a query head); then the split's
 * max, exp and sum per head and its unnormalised output. k_attn_combine
 * merges the splits in order (deterministic). A split's first keys go
 * through shared memory, the older of them loaded before the wait (the step
 * cannot have written them), and every thread's loads of a batch are issued
 * before its stores (a loop of dependent loads costs a memory round trip an
 * iteration on the step's critical path: the query copy was eight such
 * loads a thread, the combine three loops over the splits, 48 at 768 keys;
 * docs/benchmarks-cuda.md, "Round trips off the decode step"). The old
 * kernel (above) runs one
 * block per (row, head) with a thread per key: 32 blocks on 132 SMs at batch 1
 * and uncoalesced key loads. */
#define ATTN_SPLIT_ROWS 16
#define ATTN_SPLIT_GMAX 16       /* query heads per KV head */
#define ATTN_SPLIT_HDMAX 512
#define ATTN_SPLIT_MIN_KEYS 16   /* keys per split at least */
#define ATTN_SPLIT_FROM 512      /* fewer keys (rounded up to GRAPH_KV_BUCKET): the one-block-a-head kernel,
                                    measured faster there (docs/benchmarks-cuda.md) */
#define ATTN_SPLIT_MAX 64        /* splits per (row, KV head) at most */
#define ATTN_SPLIT_SCRATCH ((size_t)2 << 20)
#define ATTN_PRE_KEYS 64         /* keys a split stages in shared memory at most (the older before its wait) */
#define ATTN_PRE_FLOATS 8192     /* and at most this many floats of keys (as many of values) */

/* Key and value rows t0 .. t1 − 1 of a split (row stride kvd floats, h4
 * float4s each) into ks / vs, by a 128-thread block: each thread's loads of a
 * batch (four float4 of keys and four of values) are issued before any store,
 * so a batch costs one memory round trip, not one a load. */
__device__ __forceinline__ void stage_rows4(const float *kb, const float *vb, int kvd, int t0, int t1, int h4,
                                            float4 *ks, float4 *vs)
{
    const int end = t1 * h4;
    for (int base = t0 * h4; base < end; base += 4 * 128) {
        float4 a[4], b[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int x = base + j * 128 + threadIdx.x;
            if (x < end) {
                const int t = x / h4, c = x - t * h4;
                a[j] = *(const float4 *)(kb + (size_t)t * kvd + 4 * c);
                b[j] = *(const float4 *)(vb + (size_t)t * kvd + 4 * c);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int x = base + j * 128 + threadIdx.x;
            if (x < end) ks[x] = a[j], vs[x] = b[j];
        }
    }
}

template <int G>
__global__ void __launch_bounds__(128) k_attn_split(const float *q, int n_heads, int n_kv, int hd, const float *k,
                                                    const float *v, const int *kv_first, const int *kv_len,
                                                    float scale, int per_split, int splits, int pre, int fresh,
                                                    float *part)
{
    extern __shared__ float sm[];
    const int kvd = n_kv * hd;
    const int split = blockIdx.x % splits, hk = (blockIdx.x / splits) % n_kv, r = blockIdx.x / (splits * n_kv);
    /* kv_first / kv_len come from a staging copy before this kernel in stream order (no kernel
     * writes them): readable before the wait */
    const int n = kv_len[r], t0 = split * per_split, t1 = min(n, t0 + per_split), nt = max(t1 - t0, 0);
    float *qs = sm;                                  /* [G][hd] */
    float *sc = sm + (size_t)G * hd;                 /* [G][per_split] */
    float *ks = sc + (size_t)G * per_split;          /* [pre][hd], 16-byte aligned (hd % 4 == 0) */
    float *vs = ks + (size_t)pre * hd;               /* [pre][hd] */
    const float *kb = k + ((size_t)kv_first[r] + t0) * kvd + (size_t)hk * hd;
    const float *vb = v + ((size_t)kv_first[r] + t0) * kvd + (size_t)hk * hd;
    /* The split's first `pre` keys go through shared memory, and
     * those the ops before cannot have written (below kv_len − fresh, fresh
     * = the step's rows: each row appends one key, backend.h) are loaded
     * before the wait, while the attention front still runs: their loads
     * leave the step's critical path. */
    const int npre = min(nt, pre), nold = max(0, min(npre, n - fresh - t0)), h4 = hd / 4;
    stage_rows4(kb, vb, kvd, 0, nold, h4, (float4 *)ks, (float4 *)vs);
    pdl_enter();
    stage_rows4(kb, vb, kvd, nold, npre, h4, (float4 *)ks, (float4 *)vs);
    {   /* the queries of the block's heads, four float4 loads a thread in flight */
        const float4 *q4 = (const float4 *)(q + ((size_t)r * n_heads + (size_t)hk * G) * hd);
        const int nq = G * h4;
        for (int base = 0; base < nq; base += 4 * 128) {
            float4 t4[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (base + j * 128 + (int)threadIdx.x < nq) t4[j] = q4[base + j * 128 + threadIdx.x];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (base + j * 128 + (int)threadIdx.x < nq) ((float4 *)qs)[base + j * 128 + threadIdx.x] = t4[j];
        }
    }
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int t = warp; t < nt; t += nw) {
        const float *kt = t < npre ? ks + (size_t)t * hd : kb + (size_t)t * kvd;
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++) s[g] = 0.f;
        for (int i = lane * 4; i < hd; i += 128) {
            const float4 kv4 = *(const float4 *)(kt + i);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float4 q4 = *(const float4 *)(qs + (size_t)g * hd + i);
                s[g] = fmaf(q4.x, kv4.x, fmaf(q4.y, kv4.y, fmaf(q4.z, kv4.z, fmaf(q4.w, kv4.w, s[g]))));
            }
        }
#pragma unroll
        for (int o = 16; o; o >>= 1)
#pragma unroll
            for (int g = 0; g < G; g++) s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
        if (lane < G) {
            float mine = s[0];
#pragma unroll
            for (int g = 1; g < G; g++) mine = lane == g ? s[g] : mine;
            sc[(size_t)lane * per_split + t] = mine * scale;
        }
    }
    __syncthreads();
    /* per head: max and sum over the split (a warp a head, heads in turn) */
    __shared__ float mx_s[G], sum_s[G];
    for (int g = warp; g < G; g += nw) {
        float m = -INFINITY;
        for (int t = lane; t < nt; t += 32) m = fmaxf(m, sc[(size_t)g * per_split + t]);
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float su = 0.f;
        for (int t = lane; t < nt; t += 32) {
            const float e = expf(sc[(size_t)g * per_split + t] - m);
            sc[(size_t)g * per_split + t] = e;
            su += e;
        }
        for (int o = 16; o; o >>= 1) su += __shfl_xor_sync(0xffffffffu, su, o);
        if (lane == 0) mx_s[g] = m, sum_s[g] = su;
    }
    __syncthreads();
    /* unnormalised output: thread i owns dimensions i, i + 128, ... of every head */
    /* part: the unnormalised outputs [rows][heads][splits][hd], then each split's max and sum [rows][heads][splits][2] */
    const size_t hs = ((size_t)r * n_heads + (size_t)hk * G) * splits + split; /* (row, first head, split) */
    float *pb = part + hs * hd;
    float *pml = part + (size_t)(gridDim.x / (splits * n_kv)) * n_heads * splits * hd + 2 * hs;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc[G];
#pragma unroll
        for (int g = 0; g < G; g++) acc[g] = 0.f;
        int t = 0;
        for (; t < npre; t++) {
            const float vv = vs[(size_t)t * hd + i];
#pragma unroll
            for (int g = 0; g < G; g++) acc[g] = fmaf(sc[(size_t)g * per_split + t], vv, acc[g]);
        }
        for (; t + 4 <= nt; t += 4) { /* four value loads in flight */
            float vv[4];
#pragma unroll
            for (int j = 0; j < 4; j++) vv[j] = vb[(size_t)(t + j) * kvd + i];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int g = 0; g < G; g++) acc[g] = fmaf(sc[(size_t)g * per_split + t + j], vv[j], acc[g]);
        }
        for (; t < nt; t++) {
            const float vv = vb[(size_t)t * kvd + i];
#pragma unroll
            for (int g = 0; g < G; g++) acc[g] = fmaf(sc[(size_t)g * per_split + t], vv, acc[g]);
        }
#pragma unroll
        for (int g = 0; g < G; g++) pb[(size_t)g * splits * hd + i] = acc[g];
    }
    if (threadIdx.x < G) {
        pml[(size_t)threadIdx.x * splits * 2] = mx_s[threadIdx.x];
        pml[(size_t)threadIdx.x * splits * 2 + 1] = sum_s[threadIdx.x];
    }
}

/* Block (row, head), 128 threads: out = Σ_s e^(m_s − M) o_s / Σ_s e^(m_s − M) l_s.
 * Every load goes out in one round trip: warp w holds splits w, w + 4, ...
 * (a float4 of dimensions a lane) and thread s split s's max and sum; the
 * block reduces M and the denominator, each warp sums its splits, the four
 * warps' sums add in a fixed order (deterministic). */
__global__ void __launch_bounds__(128) k_attn_combine(const float *part, int n_heads, int hd, int splits, float *out)
{
    __shared__ float w_s[ATTN_SPLIT_MAX];
    __shared__ float red[4];
    __shared__ float4 acc_s[4][ATTN_SPLIT_HDMAX / 4];
    pdl_enter();
    const int i = threadIdx.x, lane = i & 31, warp = i >> 5, h4 = hd >> 2;
    const float *pv = part + (size_t)blockIdx.x * splits * hd;
    const float *pml = part + (size_t)gridDim.x * splits * hd + (size_t)blockIdx.x * splits * 2;
    constexpr int J = ATTN_SPLIT_MAX / 4;
    float4 v[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int sp = warp + 4 * j;
        v[j] = sp < splits && lane < h4 ? *(const float4 *)(pv + (size_t)sp * hd + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = -INFINITY, l = 0.f;
    if (i < splits) {
        l = pml[2 * i + 1];
        m = l > 0.f ? pml[2 * i] : -INFINITY;
    }
    float M = m;
    for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) red[warp] = M;
    __syncthreads();
    M = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    const float w = l > 0.f ? expf(m - M) : 0.f;
    if (i < splits) w_s[i] = w;
    float L = w * l;
    for (int o = 16; o; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    __syncthreads(); /* red's maxima read by every thread; w_s written */
    if (lane == 0) red[warp] = L;
    for (int c = lane; c < h4; c += 32) {
        if (c != lane) /* head widths past 128: the next float4 column of the warp's splits */
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int sp = warp + 4 * j;
                if (sp < splits) v[j] = *(const float4 *)(pv + (size_t)sp * hd + 4 * c);
            }
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int sp = warp + 4 * j;
            if (sp < splits) {
                const float ws = w_s[sp];
                a.x = fmaf(ws, v[j].x, a.x), a.y = fmaf(ws, v[j].y, a.y);
                a.z = fmaf(ws, v[j].z, a.z), a.w = fmaf(ws, v[j].w, a.w);
            }
        }
        acc_s[warp][c] = a;
    }
    __syncthreads();
    const float inv = 1.0f / ((red[0] + red[1]) + (red[2] + red[3]));
    float *o = out + (size_t)blockIdx.x * hd;
    for (int c = i; c < h4; c += 128) {
        const float4 a0 = acc_s[0][c], a1 = acc_s[1][c], a2 = acc_s[2][c], a3 = acc_s[3][c];
        float4 t;
        t.x = ((a0.x + a1.x) + (a2.x + a3.x)) * inv, t.y = ((a0.y + a1.y) + (a2.y + a3.y)) * inv;
        t.z = ((a0.z + a1.z) + (a2.z + a3.z)) * inv, t.w = ((a0.w + a1.w) + (a2.w + a3.w)) * inv;
        *(float4 *)(o + 4 * c) = t;
    }
}

/* Keys k_attn_split stages in shared memory: all of a split up to ATTN_PRE_KEYS and ATTN_PRE_FLOATS. */
static int attn_pre_keys(int hd, int per_split)
{
    int pre = ATTN_PRE_FLOATS / hd;
    if (pre > ATTN_PRE_KEYS) pre = ATTN_PRE_KEYS;
    return pre < per_split ? pre : per_split;
}

/* k_attn_split's shared memory: the queries and scores of its heads, the staged keys and values. */
static size_t attn_split_smem(int G, int hd, int per_split)
{
    return ((size_t)G * (size_t)(hd + per_split) + 2 * (size_t)attn_pre_keys(hd, per_split) * hd) * sizeof(float);
}

/* The split kernel's launch for these rows, or false (the one-block-a-head kernel serves them). */
static bool attn_split_shape(int rows, int n_heads, int n_kv, int hd, int mx, int *per_split, int *splits)
{
    const int G = n_kv > 0 ? n_heads / n_kv : 0;
    if (rows > ATTN_SPLIT_ROWS || n_kv <= 0 || n_heads % n_kv || (G != 1 && G != 2 && G != 4 && G != 8 && G != 16) ||
        hd % 4 ||
        hd > ATTN_SPLIT_HDMAX || mx < ATTN_SPLIT_FROM)
        return false;
    const size_t per = (size_t)rows * n_heads * (size_t)(hd + 2) * sizeof(float);
    int sp = (mx + ATTN_SPLIT_MIN_KEYS - 1) / ATTN_SPLIT_MIN_KEYS;
    if (sp > ATTN_SPLIT_MAX) sp = ATTN_SPLIT_MAX;
    while (sp > 1 && (size_t)sp * per > ATTN_SPLIT_SCRATCH) sp--;
    if ((size_t)sp * per > ATTN_SPLIT_SCRATCH) return false;
    *per_split = (mx + sp - 1) / sp;
    *splits = (mx + *per_split - 1) / *per_split;
    return attn_split_smem(n_heads / n_kv, hd, *per_split) <= ATTN_SMEM_MAX;
}

static void cuda_attention(sq_exec *ex, const float *q, int rows, int n_heads, int n_kv, int hd, const float *k,
                           const float *v, const int *kv_first, const int *kv_len, float scale, float *out)
{
    cuda_state *st = state_of(ex);
    if (rows <= 0) return;
    int mx = 0;
    for (int r = 0; r < rows; r++)
        if (kv_len[r] > mx) mx = kv_len[r];
    /* in steps of GRAPH_KV_BUCKET keys, so a graph step's launch holds for the keys of its bucket */
    mx = (mx + GRAPH_KV_BUCKET - 1) / GRAPH_KV_BUCKET * GRAPH_KV_BUCKET;
    const size_t smem = ((size_t)hd + (size_t)mx) * sizeof(float);
    const int *df = stage(st, kv_first, (size_t)rows), *dl = stage(st, kv_len, (size_t)rows);
    if (!df || !dl || replaying(st, 4, P(q), P(k), P(out), (uint64_t)rows << 32 | (uint32_t)smem, P(df) ^ P(dl) << 1))
        return;
    /* prefill chunks (more rows than a graph step has): flash attention, attn_prefill.h */
    if (rows > ATTN_SPLIT_ROWS && !st->no_attn_prefill && sq_cuda_attn_prefill_ok(n_heads, n_kv, hd, q, k, v, out)) {
        sq_cuda_attn_prefill(st->s, q, rows, n_heads, n_kv, hd, k, v, df, dl, scale, out);
        check(st, cudaGetLastError(), "prefill attention launch");
        return;
    }
    int per_split, splits;
    if (st->attn_part && (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0 && (uintptr_t)q % 16 == 0 &&
        (uintptr_t)out % 16 == 0 &&
        attn_split_shape(rows, n_heads, n_kv, hd, mx, &per_split, &splits)) {
        const size_t sm2 = attn_split_smem(n_heads / n_kv, hd, per_split);
        const unsigned blocks = (unsigned)(rows * n_kv * splits);
        switch (n_heads / n_kv) {
#define ATTN_SPLIT_CASE(G)                                                                                          \
    case G:                                                                                                         \
        launch(st->s, st, k_attn_split<G>, blocks, 128, sm2, q, n_heads, n_kv, hd, k, v, df, dl, scale, per_split,  \
               splits, attn_pre_keys(hd, per_split), rows, st->attn_part);                                          \
        break;
            ATTN_SPLIT_CASE(1)
            ATTN_SPLIT_CASE(2)
            ATTN_SPLIT_CASE(4)
            ATTN_SPLIT_CASE(8)
            ATTN_SPLIT_CASE(16)
#undef ATTN_SPLIT_CASE
        }
        launch(st->s, st, k_attn_combine, rows * n_heads, 128, 0, st->attn_part, n_heads, hd, splits, out);
        return;
    }
    if (smem > ATTN_SMEM_MAX) {
        keep_err(st, sparq_err(SPARQ_E_UNSUPPORTED, "cuda attention: %d keys exceed this kernel's %d", mx,
                               (int)(ATTN_SMEM_MAX / sizeof(float)) - hd));
        return;
    }
    launch(st->s, st, k_attention, rows * n_heads, 128, smem, q, n_heads, n_kv, hd, k, v, df, dl, scale, out);
}

/* --- router, elementwise, embed, KV ----------------------------------------------- */

/* One row a thread, the CPU's code (kernels/cpu/ops_topk.h): the fallback for
 * rows the warp kernel below does not hold. */
__global__ void k_topk(const float *logits, int rows, int n_exp, int k, bool norm, int *idx, float *w)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) sq_topk_row(logits + (size_t)r * n_exp, n_exp, k, norm, idx + (size_t)r * k, w + (size_t)r * k);
}

/* A logit as an unsigned key in the floats' order (NaN aside), -0 made +0
 * first because the CPU's '>' ties them; 0 is below every logit's key, -inf's
 * included, so it stands for "nothing left". */
__device__ __forceinline__ unsigned topk_key(float v)
{
    const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float topk_logit(unsigned key)
{
    return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

/* The same rule with one warp a row (TOPK_WARPS rows a block) and the row in
 * registers: lane j holds experts j, j + 32, … (NPL slots, those past n_exp
 * marked taken from the start). The max and the softmax sum (double, each
 * lane's slots then a butterfly) are warp reductions. Each of the k picks is
 * the largest key not taken: each lane offers its best, __reduce_max_sync
 * finds the largest, __reduce_min_sync the lowest expert holding it (ties to
 * the lower index, as sq_topk_row), and the owner marks that slot in its
 * bitmask (a bit, not -inf: a logit may be -inf and must stay selectable).
 * Lane i keeps pick i, computes its weight as the CPU does and writes it;
 * the renormalisation adds the k weights in pick order, as the CPU. The
 * double sum differs from the CPU's only in its order of additions, and
 * CUDA's expf from glibc's by up to 2 ulp, so the weights agree to a few ulp
 * and the ids exactly. On the H200 one thread a row read the row k + 2 times from global
 * memory: 201 µs a call for 128 experts top-8; a warp with the row in shared
 * memory, lane 0 summing the softmax and dividing each pick's weight: 10.1 µs. */
#define TOPK_WARPS 4
#define TOPK_WARP_MAX_EXP (32 * 32) /* 32 slots a lane: the taken bitmask's width */
#define TOPK_WARP_MAX_K 32          /* one pick a lane */
template <int NPL>
__global__ void __launch_bounds__(32 * TOPK_WARPS) k_topk_warp(const float *logits, int rows, int n_exp, int k, bool norm,
                                                              int *idx, float *w)
{
    pdl_enter();
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x % 32, r = blockIdx.x * TOPK_WARPS + threadIdx.x / 32;
    if (r >= rows) return;
    const float *lr = logits + (size_t)r * n_exp;
    float l[NPL];
    unsigned taken = 0, key[NPL];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        const int e = lane + 32 * j;
        l[j] = e < n_exp ? lr[e] : -INFINITY;
        taken |= (unsigned)(e >= n_exp) << j;
        mx = fmaxf(mx, l[j]);
    }
    mx = topk_logit(__reduce_max_sync(all, topk_key(mx)));
    double sum = 0;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        if (!(taken >> j & 1)) sum += expf(l[j] - mx);
        key[j] = topk_key(l[j]);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(all, sum, o);
    unsigned pick_key = 0;
    int pick = 0;
    for (int i = 0; i < k; i++) {
        unsigned bk = 0;
        int be = INT_MAX;
#pragma unroll
        for (int j = 0; j < NPL; j++)
            if (!(taken >> j & 1) && key[j] > bk) bk = key[j], be = lane + 32 * j;
        const unsigned gk = __reduce_max_sync(all, bk);
        const int ge = __reduce_min_sync(all, bk == gk ? be : INT_MAX);
        if (lane == (ge & 31)) taken |= 1u << (ge >> 5);
        if (lane == i) pick_key = gk, pick = ge;
    }
    float wi = lane < k ? (float)(expf(topk_logit(pick_key) - mx) / sum) : 0.0f;
    if (norm) {
        float s = 0;
        for (int i = 0; i < k; i++) s += __shfl_sync(all, wi, i);
        wi /= s;
    }
    if (lane < k) {
        idx[(size_t)r * k + lane] = pick;
        w[(size_t)r * k + lane] = wi;
    }
}

static void cuda_router_topk(sq_exec *ex, const float *logits, int rows, int n_exp, int k, bool norm, int *idx,
                             float *w)
{
    cuda_state *st = state_of(ex);
    if (rows <= 0 || replaying(st, 5, P(logits), P(idx), P(w), (uint64_t)rows << 32 | (uint32_t)(n_exp << 8 | k)))
        return;
    if (n_exp <= TOPK_WARP_MAX_EXP && k <= TOPK_WARP_MAX_K && k <= n_exp) {
        const int npl = (n_exp + 31) / 32; /* slots a lane; the kernel with the fewest that hold them */
        void (*kern)(const float *, int, int, int, bool, int *, float *) =
            npl <= 4 ? k_topk_warp<4> : npl <= 8 ? k_topk_warp<8> : npl <= 12 ? k_topk_warp<12>
                                    : npl <= 16 ? k_topk_warp<16> : k_topk_warp<32>;
        launch(st->s, st, kern, (rows + TOPK_WARPS - 1) / TOPK_WARPS, 32 * TOPK_WARPS, 0, logits, rows, n_exp, k, norm,
               idx, w);
        return;
    }
    k_topk<<<(unsigned)((rows + 63) / 64), 64, 0, st->s>>>(logits, rows, n_exp, k, norm, idx, w);
}

__global__ void k_swiglu(const float *gate, const float *up, size_t n, float *out)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cuda_swiglu(sq_exec *ex, const float *gate, const float *up, size_t n, float *out)
{
    cuda_state *st = state_of(ex);
    if (n && !replaying(st, 6, P(gate), P(up), P(out), n))
        launch(st->s, st, k_swiglu, grid_for(n, 256), 256, 0, gate, up, n, out);
}

__global__ void k_axpy(float a, const float *x, size_t n, float *y)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = fmaf(a, x[i], y[i]);
}

static void cuda_axpy(sq_exec *ex, float a, const float *x, size_t n, float *y)
{
    cuda_state *st = state_of(ex);
    if (n && !replaying(st, 7, P(x), P(y), n, float_bits(a)))
        launch(st->s, st, k_axpy, grid_for(n, 256), 256, 0, a, x, n, y);
}

/* out[i] = parts[0][i] + ... + parts[np - 1][i] in that order (the CPU's). */
__global__ void k_sum_parts(const float *parts, int np, size_t n, float *out)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float a = parts[i];
        for (int r = 1; r < np; r++) a += parts[(size_t)r * n + i];
        out[i] = a;
    }
}

static void cuda_sum_parts(sq_exec *ex, const float *parts, int n_parts, size_t n, float *out)
{
    cuda_state *st = state_of(ex);
    if (n && n_parts > 0 && !replaying(st, 14, P(parts), P(out), n, (uint64_t)n_parts))
        launch(st->s, st, k_sum_parts, grid_for(n, 256), 256, 0, parts, n_parts, n, out);
}

template <typename T>
__global__ void k_embed(const T *table, int d, const int *tokens, float *hidden)
{
    pdl_enter();
    const T *row = table + (size_t)tokens[blockIdx.x] * d;
    float *o = hidden + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = to_f(row[i]);
}

static void cuda_embed(sq_exec *ex, sq_linear_kind kind, const void *table, int d, const int32_t *tokens, int n,
                       float *hidden)
{
    cuda_state *st = state_of(ex);
    if (n <= 0) return;
    /* the table's size is not known here: it must have been prepared */
    ent *e = find_ent(st, table);
    if (!e) {
        keep_err(st, sparq_err(SPARQ_E_STATE, "cuda embed: the embedding table was not prepared"));
        return;
    }
    const int *dt = stage(st, (const int *)tokens, (size_t)n);
    if (!dt || replaying(st, 8, P(e->dev), P(dt), P(hidden), (uint64_t)n << 32 | (uint32_t)d)) return;
    if (kind == SQ_LINEAR_F32) launch(st->s, st, k_embed<float>, n, 256, 0, (const float *)e->dev, d, dt, hidden);
    else if (kind == SQ_LINEAR_BF16)
        launch(st->s, st, k_embed<uint16_t>, n, 256, 0, (const uint16_t *)e->dev, d, dt, hidden);
    else launch(st->s, st, k_embed<f16_t>, n, 256, 0, (const f16_t *)e->dev, d, dt, hidden);
}

__global__ void k_kv_store(const float *k, const float *v, size_t width, const int *kv_first, const int *pos,
                           float *kc, float *vc)
{
    pdl_enter();
    const size_t at = ((size_t)kv_first[blockIdx.x] + (size_t)pos[blockIdx.x]) * width;
    const size_t from = (size_t)blockIdx.x * width;
    for (size_t i = threadIdx.x; i < width; i += blockDim.x) {
        kc[at + i] = k[from + i];
        vc[at + i] = v[from + i];
    }
}

static void cuda_kv_store(sq_exec *ex, const float *k, const float *v, int rows, size_t width, const int *kv_first,
                          const int *pos, float *kc, float *vc)
{
    cuda_state *st = state_of(ex);
    if (rows <= 0) return;
    const int *df = stage(st, kv_first, (size_t)rows), *dp = stage(st, pos, (size_t)rows);
    if (!df || !dp || replaying(st, 9, P(k) ^ P(v) << 1, P(kc) ^ P(vc) << 1, P(df) ^ P(dp) << 1, (uint64_t)rows << 32 | width))
        return;
    launch(st->s, st, k_kv_store, rows, 256, 0, k, v, width, df, dp, kc, vc);
}

/* o_proj and the post-attention add_rmsnorm in the integer GEMV's three
 * launches (trellis_cuda_gemv_add_rmsnorm): EXL3 mul1 without bias, 1..4
 * rows, out a multiple of 128 up to 4096; SPARQ_CUDA_FUSED=0 or
 * SPARQ_CUDA_LINEAR_NORM=0 turns it off. */
static bool cuda_linear_add_rmsnorm(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *h,
                                    const float *w, float eps, float *xn)
{
    cuda_state *st = state_of(ex);
    if (st->no_fuse || st->no_linear_norm || rows < 1 || !st->tws || l->kind != SQ_LINEAR_EXL3 || l->bias)
        return false;
    const ent *e = find_ent(st, l->impl);
    if (!e) return false;
    const trellis_cuda_linear *lin = (const trellis_cuda_linear *)e->dev;
    if (!trellis_cuda_gemv_add_rmsnorm_ok(lin, rows, st->tws)) return false;
    void *dw;
    sparq_status s = raw_get(st, w, (size_t)l->out * sizeof(float), &dw);
    if (s != SPARQ_OK) {
        keep_err(st, s);
        return true;
    }
    if (replaying(st, 15, P(l), P(x), P(h), (uint64_t)rows, P(dw) ^ P(xn) << 1)) return true;
    keep_err(st, trellis_cuda_gemv_add_rmsnorm(lin, x, rows, h, (const float *)dw, eps, xn, st->tws, st->s));
    return true;
}

/* The attention front as one grouped integer GEMV (trellis_cuda_gemv_group):
 * the input norm in its input launch, q/k/v in one main launch, the head
 * norms, rope and the KV append in its output launch — 3 launches where the
 * ops take 15. Taken for EXL3 mul1 q/k/v of one K without bias at 1..4 rows
 * and head_dim 64 or 128; SPARQ_CUDA_FUSED=0 turns it off (benchmarks). */
static bool cuda_attn_front(sq_exec *ex, const sq_attn_front *a, const float *x, int rows, const int *pos,
                            const int *kv_first, float *kc, float *vc, float *q, float *k, float *v)
{
    cuda_state *st = state_of(ex);
    if (st->no_fuse || rows < 1 || !st->tws) return false;
    const sq_linear *l3[3] = {a->q, a->k, a->v};
    trellis_cuda_linear *lin[3];
    for (int g = 0; g < 3; g++) {
        if (l3[g]->kind != SQ_LINEAR_EXL3 || l3[g]->bias) return false;
        const ent *e = find_ent(st, l3[g]->impl); /* uploaded at load (prepare_linear) */
        if (!e) return false;
        lin[g] = (trellis_cuda_linear *)e->dev;
    }
    if (!trellis_cuda_gemv_group_ok(lin, 3, rows, a->head_dim, st->tws)) return false;
    const int hd = a->head_dim;
    void *dn = NULL, *dq = NULL, *dk = NULL, *df = NULL;
    sparq_status s = raw_get(st, a->norm, (size_t)a->q->in * sizeof(float), &dn);
    if (s == SPARQ_OK && a->q_norm) s = raw_get(st, a->q_norm, (size_t)hd * sizeof(float), &dq);
    if (s == SPARQ_OK && a->k_norm) s = raw_get(st, a->k_norm, (size_t)hd * sizeof(float), &dk);
    if (s == SPARQ_OK) s = raw_get(st, a->inv_freq, (size_t)(hd / 2) * sizeof(float), &df);
    if (s != SPARQ_OK) {
        keep_err(st, s);
        return true;
    }
    const int *dp = stage(st, pos, (size_t)rows), *dkf = kc ? stage(st, kv_first, (size_t)rows) : NULL;
    if (!dp || (kc && !dkf) ||
        replaying(st, 13, P(a->q) ^ P(a->k) << 1 ^ P(a->v) << 2, P(x), P(q) ^ P(k) << 1 ^ P(v) << 2,
                  P(kc) ^ P(vc) << 1 ^ (uint64_t)rows << 48, P(dp) ^ P(dkf) << 1))
        return true;
    trellis_cuda_group_opts o = {};
    o.norm = (const float *)dn;
    o.eps = a->eps;
    o.head_dim = hd;
    o.head_norm[0] = (const float *)dq;
    o.head_norm[1] = (const float *)dk;
    o.rope[0] = o.rope[1] = true;
    o.inv_freq = (const float *)df;
    o.pos = dp;
    o.cache[1] = kc;
    o.cache[2] = kc ? vc : NULL;
    o.kv_first = dkf;
    float *y[3] = {q, k, v};
    keep_err(st, trellis_cuda_gemv_group(lin, 3, x, rows, y, &o, st->tws, st->s));
    return true;
}

/* --- MoE ------------------------------------------------------------------------------ */

/* xg[j] = xn[rows_of[j]], j < n; one row a block. */
__global__ void k_gather(const float *xn, int d, const int *rows_of, float *xg)
{
    const float *s = xn + (size_t)rows_of[blockIdx.x] * d;
    float *o = xg + (size_t)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = s[i];
}

/* out[rows_of[j]] += lw[j] · dn[j]; the rows of one expert are distinct. */
__global__ void k_scatter(const float *dn, int d, const int *rows_of, const float *lw, float *out)
{
    const float a = lw[blockIdx.x];
    const float *s = dn + (size_t)blockIdx.x * d;
    float *o = out + (size_t)rows_of[blockIdx.x] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = fmaf(a, s[i], o[i]);
}

/* own_n > 1 (the expert split): only the slots of experts e % own_n ==
 * own_k; the others' tables may be NULL and their dn is not written. */
__device__ __forceinline__ bool moe_owns(int e, int own_n, int own_k) { return own_n <= 1 || e % own_n == own_k; }

/* Small-batch MoE on dense experts, routing read on the device (no host
 * round trip). Slot s = (row s / K, its j-th expert ids[s]).
 * h[s, o] = silu(x·gate_e[o]) · (x·up_e[o]): one warp per (slot, o). */
template <typename T>
__global__ void __launch_bounds__(256) k_moe_gateup(const void *const *tab, int E, const float *__restrict__ x,
                                                    const int *ids, int K, int d, int I, float *h, bool vec,
                                                    int own_n, int own_k)
{
    const int slot = blockIdx.y, o = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    const int e = ids[slot];
    if (o >= I || !moe_owns(e, own_n, own_k)) return;
    const float *xr = x + (size_t)(slot / K) * d;
    const T *g = (const T *)tab[e] + (size_t)o * d, *u = (const T *)tab[E + e] + (size_t)o * d;
    float ag = 0.f, au = 0.f;
    if (vec) {
        for (int i = lane * 8; i < d; i += 256) {
            float gv[8], uv[8], xv[8];
            load8(g + i, gv);
            load8(u + i, uv);
            load8(xr + i, xv);
#pragma unroll
            for (int j = 0; j < 8; j++) ag = fmaf(gv[j], xv[j], ag), au = fmaf(uv[j], xv[j], au);
        }
    } else {
        for (int i = lane; i < d; i += 32) ag = fmaf(to_f(g[i]), xr[i], ag), au = fmaf(to_f(u[i]), xr[i], au);
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane == 0) h[(size_t)slot * I + o] = ag / (1.0f + expf(-ag)) * au;
}

/* dn[s, o] = h[s]·down_e[o]: one warp per (slot, o). */
template <typename T>
__global__ void __launch_bounds__(256) k_moe_down(const void *const *tab, int E, const float *__restrict__ h,
                                                  const int *ids, int I, int d, float *dn, bool vec, int own_n,
                                                  int own_k)
{
    const int slot = blockIdx.y, o = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (o >= d || !moe_owns(ids[slot], own_n, own_k)) return;
    const T *w = (const T *)tab[2 * E + ids[slot]] + (size_t)o * I;
    const float *hr = h + (size_t)slot * I;
    float a = 0.f;
    if (vec) {
        for (int i = lane * 8; i < I; i += 256) {
            float wv[8], hv[8];
            load8(w + i, wv);
            load8(hr + i, hv);
#pragma unroll
            for (int j = 0; j < 8; j++) a = fmaf(wv[j], hv[j], a);
        }
    } else {
        for (int i = lane; i < I; i += 32) a = fmaf(to_f(w[i]), hr[i], a);
    }
    a = warp_sum(a);
    if (lane == 0) dn[(size_t)slot * d + o] = a;
}

/* out[r] (+)= Σ_j w[r·K + j] · dn[r·K + j], in slot order (deterministic),
 * over the slots of experts this GPU holds. */
__global__ void k_moe_combine(const float *dn, const float *w, const int *ids, int K, int d, bool add, float *out,
                              int own_n, int own_k)
{
    const int r = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.f;
        for (int j = 0; j < K; j++)
            if (moe_owns(ids[r * K + j], own_n, own_k)) a = fmaf(w[r * K + j], dn[((size_t)r * K + j) * d + i], a);
        out[(size_t)r * d + i] = add ? out[(size_t)r * d + i] + a : a;
    }
}

template <typename T>
static void dense_moe_run(const dense_moe *dm, const sq_moe_layer *ml, const float *xn, int rows, int d, int I,
                          const sq_moe_ws *ws, float *out, bool add, cudaStream_t s)
{
    const int E = ml->n_exp, K = ml->top_k, slots = rows * K, on = ml->own_n, ok = ml->own_k;
    const bool vd = d % 8 == 0 && (uintptr_t)xn % 16 == 0, vi = I % 8 == 0 && (uintptr_t)ws->g % 16 == 0;
    k_moe_gateup<T><<<dim3((unsigned)((I + 7) / 8), (unsigned)slots), 256, 0, s>>>(dm->tab, E, xn, ws->ridx, K, d, I,
                                                                               ws->g, vd, on, ok);
    k_moe_down<T><<<dim3((unsigned)((d + 7) / 8), (unsigned)slots), 256, 0, s>>>(dm->tab, E, ws->g, ws->ridx, I, d,
                                                                             ws->dn, vi, on, ok);
    k_moe_combine<<<(unsigned)rows, 256, 0, s>>>(ws->dn, ws->rw, ws->ridx, K, d, add, out, on, ok);
}

static sparq_status host_grow(cuda_state *st, size_t slots, size_t cnt)
{
    if (slots > st->h_cap) {
        cudaFreeHost(st->h_ids);
        cudaFreeHost(st->h_rows);
        cudaFreeHost(st->h_w);
        cudaFreeHost(st->h_lw);
        st->h_ids = st->h_rows = NULL;
        st->h_w = st->h_lw = NULL;
        st->h_cap = 0;
        FORWARD_IF(cuda_status(cudaMallocHost((void **)&st->h_ids, slots * sizeof(int)), "pinned MoE buffers"));
        FORWARD_IF(cuda_status(cudaMallocHost((void **)&st->h_rows, slots * sizeof(int)), "pinned MoE buffers"));
        FORWARD_IF(cuda_status(cudaMallocHost((void **)&st->h_w, slots * sizeof(float)), "pinned MoE buffers"));
        FORWARD_IF(cuda_status(cudaMallocHost((void **)&st->h_lw, slots * sizeof(float)), "pinned MoE buffers"));
        st->h_cap = slots;
    }
    if (cnt > st->cnt_cap) {
        sparq_free(st->h_cnt);
        st->h_cnt = (int *)sparq_malloc(cnt * sizeof(int));
        st->cnt_cap = st->h_cnt ? cnt : 0;
        RETURN_IF(!st->h_cnt, SPARQ_E_NOMEM, "cuda moe: out of memory");
    }
    return SPARQ_OK;
}

static void cuda_moe(sq_exec *ex, const sq_moe_layer *ml, const float *xn, int rows, float *out,
                     const sq_moe_ws *ws, bool add)
{
    cuda_state *st = state_of(ex);
    if (rows <= 0) return;
    const sq_linear *g0 = &ml->gate[ml->router ? sq_moe_held(ml) : 0]; /* a held expert's shapes */
    const int d = g0->in, I = g0->out;
    if (!ml->router) { /* dense MLP */
        cuda_linear(ex, &ml->gate[0], xn, rows, ws->g);
        cuda_linear(ex, &ml->up[0], xn, rows, ws->u);
        cuda_swiglu(ex, ws->g, ws->u, (size_t)rows * I, ws->g);
        cuda_linear(ex, &ml->down[0], ws->g, rows, add ? ws->dn : out);
        if (add) cuda_axpy(ex, 1.0f, ws->dn, (size_t)rows * d, out);
        return;
    }
    const int E = ml->n_exp, K = ml->top_k;
    cuda_linear(ex, ml->router, xn, rows, ws->rl);
    cuda_router_topk(ex, ws->rl, rows, E, K, ml->norm_topk, ws->ridx, ws->rw);
    const uint64_t own = (uint64_t)(ml->own_n > 1 ? ml->own_n : 0) << 32 | (uint32_t)ml->own_k;
    ent *fused = find_ent(st, ml->gate);
    if (fused && rows <= 16) { /* adds into out */
        if (replaying(st, 10, P(fused->dev), P(xn), P(out), (uint64_t)rows << 1 | add,
                      P(ws->ridx) ^ P(ws->rw) << 1 ^ own << 3))
            return;
        if (!add) check(st, cudaMemsetAsync(out, 0, (size_t)rows * d * sizeof(float), st->s), "moe: clear");
        keep_err(st, trellis_cuda_moe_forward_own((trellis_cuda_moe *)fused->dev, xn, rows, ws->ridx, ws->rw, out,
                                                  ml->own_n, ml->own_k, st->s));
        return;
    }
    ent *dense = find_ent(st, ml->up);
    if (dense && rows <= 8 && rows * K <= ((dense_moe *)dense->dev)->max_slots) {
        const dense_moe *dm = (const dense_moe *)dense->dev;
        if (replaying(st, 11, P(dm), P(xn), P(out), (uint64_t)rows << 1 | add, P(ws) ^ own << 3)) return;
        if (dm->kind == SQ_LINEAR_F32) dense_moe_run<float>(dm, ml, xn, rows, d, I, ws, out, add, st->s);
        else if (dm->kind == SQ_LINEAR_BF16) dense_moe_run<uint16_t>(dm, ml, xn, rows, d, I, ws, out, add, st->s);
        else dense_moe_run<f16_t>(dm, ml, xn, rows, d, I, ws, out, add, st->s);
        check(st, cudaGetLastError(), "dense moe launches");
        return;
    }
    if (st->graph.mode == G_CAPTURE || st->graph.mode == G_REPLAY) { /* prepare_moe keeps such steps out of graphs */
        keep_err(st, sparq_err(SPARQ_E_STATE, "cuda moe: %d rows need the host's expert grouping inside a graph step",
                               rows));
        return;
    }
    if (!add) check(st, cudaMemsetAsync(out, 0, (size_t)rows * d * sizeof(float), st->s), "moe: clear");
    /* group (row, slot) pairs by expert on the host: rows·K ids come back */
    const size_t slots = (size_t)rows * K;
    sparq_status s = host_grow(st, slots, (size_t)E + 1);
    if (s != SPARQ_OK) {
        keep_err(st, s);
        return;
    }
    check(st, cudaMemcpyAsync(st->h_ids, ws->ridx, slots * sizeof(int), cudaMemcpyDeviceToHost, st->s), "moe ids");
    check(st, cudaMemcpyAsync(st->h_w, ws->rw, slots * sizeof(float), cudaMemcpyDeviceToHost, st->s), "moe weights");
    check(st, cudaStreamSynchronize(st->s), "moe routing");
    if (st->err != SPARQ_OK) return;
    int *cnt = st->h_cnt;
    memset(cnt, 0, ((size_t)E + 1) * sizeof(int));
    for (size_t i = 0; i < slots; i++) cnt[st->h_ids[i] + 1]++;
    for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    for (size_t i = 0; i < slots; i++) { /* stable: slots of an expert in row order, as the CPU */
        const int e = st->h_ids[i];
        int j = cnt[e]++;
        st->h_rows[j] = (int)(i / (size_t)K);
        st->h_lw[j] = st->h_w[i];
    }
    for (int e = E; e > 0; e--) cnt[e] = cnt[e - 1]; /* back to starts */
    cnt[0] = 0;
    check(st, cudaMemcpyAsync(ws->rows_of, st->h_rows, slots * sizeof(int), cudaMemcpyHostToDevice, st->s), "moe rows");
    check(st, cudaMemcpyAsync(ws->lw, st->h_lw, slots * sizeof(float), cudaMemcpyHostToDevice, st->s), "moe rows");
    for (int e = 0; e < E; e++) {
        const int first = cnt[e], n = cnt[e + 1] - first;
        if (n <= 0 || !sq_moe_holds(ml, e)) continue; /* the expert split: another rank's expert */
        k_gather<<<(unsigned)n, 256, 0, st->s>>>(xn, d, ws->rows_of + first, ws->xg);
        cuda_linear(ex, &ml->gate[e], ws->xg, n, ws->g);
        cuda_linear(ex, &ml->up[e], ws->xg, n, ws->u);
        cuda_swiglu(ex, ws->g, ws->u, (size_t)n * I, ws->g);
        cuda_linear(ex, &ml->down[e], ws->g, n, ws->dn);
        k_scatter<<<(unsigned)n, 256, 0, st->s>>>(ws->dn, d, ws->rows_of + first, ws->lw + first, out);
    }
}

/* Device pointer tables for a layer of dense experts of one kind, no biases
 * (keyed by the up array); anything else keeps to the grouped path. */
static sparq_status dense_moe_make(cuda_state *st, const sq_moe_layer *ml, int max_rows)
{
    const int E = ml->n_exp;
    const sq_linear_kind kind = ml->gate[sq_moe_held(ml)].kind;
    for (int e = 0; e < E; e++) {
        if (!sq_moe_holds(ml, e)) continue;
        const sq_linear *l[3] = {&ml->gate[e], &ml->up[e], &ml->down[e]};
        for (int i = 0; i < 3; i++)
            if (l[i]->kind != kind || kind == SQ_LINEAR_EXL3 || l[i]->bias) return SPARQ_OK;
    }
    const void **h = (const void **)sparq_calloc(3 * (size_t)E, sizeof *h);
    dense_moe *dm = (dense_moe *)sparq_calloc(1, sizeof *dm);
    sparq_status s = h && dm ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "cuda moe: out of memory");
    const size_t es = kind == SQ_LINEAR_F32 ? 4 : 2;
    for (int e = 0; s == SPARQ_OK && e < E; e++) {
        if (!sq_moe_holds(ml, e)) continue; /* NULL entries: never routed here */
        void *p;
        const size_t gu = (size_t)ml->gate[e].in * ml->gate[e].out * es, dn = (size_t)ml->down[e].in * ml->down[e].out * es;
        if ((s = raw_get(st, ml->gate[e].w, gu, &p)) == SPARQ_OK) h[e] = p;
        if (s == SPARQ_OK && (s = raw_get(st, ml->up[e].w, gu, &p)) == SPARQ_OK) h[E + e] = p;
        if (s == SPARQ_OK && (s = raw_get(st, ml->down[e].w, dn, &p)) == SPARQ_OK) h[2 * E + e] = p;
    }
    if (s == SPARQ_OK) s = cuda_status(cudaMalloc((void **)&dm->tab, 3 * (size_t)E * sizeof *h), "moe tables");
    if (s == SPARQ_OK)
        s = cuda_status(cudaMemcpy(dm->tab, h, 3 * (size_t)E * sizeof *h, cudaMemcpyHostToDevice), "moe tables");
    sparq_free(h);
    if (s == SPARQ_OK) {
        dm->kind = kind;
        dm->max_slots = max_rows;
        s = add_ent(st, ml->up, dm, ENT_DMOE);
    }
    if (s != SPARQ_OK && dm) {
        cudaFree(dm->tab);
        sparq_free(dm);
    }
    return s;
}

static sparq_status prepare_fused_moe(cuda_state *st, const sq_moe_layer *ml, bool exl3);

/* Upload a layer's linears; for EXL3 experts of one K and codebook, build the
 * fused decode layer (keyed by the gate array). */
static sparq_status cuda_prepare_moe(sq_exec *ex, const sq_moe_layer *ml, int max_rows)
{
    memlog("layer's linears uploaded", 0);
    (void)max_rows;
    cuda_state *st = state_of(ex);
    const int E = ml->router ? ml->n_exp : 1;
    if (ml->router) FORWARD_IF(ex->be->prepare_linear(ex, ml->router));
    bool exl3 = ml->router != NULL;
    for (int e = 0; e < E; e++) {
        if (ml->router && !sq_moe_holds(ml, e)) continue; /* the expert split: not held here */
        FORWARD_IF(ex->be->prepare_linear(ex, &ml->gate[e]));
        FORWARD_IF(ex->be->prepare_linear(ex, &ml->up[e]));
        FORWARD_IF(ex->be->prepare_linear(ex, &ml->down[e]));
        exl3 &= ml->gate[e].kind == SQ_LINEAR_EXL3 && ml->up[e].kind == SQ_LINEAR_EXL3 &&
                ml->down[e].kind == SQ_LINEAR_EXL3 && !ml->gate[e].bias && !ml->up[e].bias && !ml->down[e].bias;
    }
    if (ml->router && !exl3 && !find_ent(st, ml->up)) FORWARD_IF(dense_moe_make(st, ml, max_rows));
    FORWARD_IF(prepare_fused_moe(st, ml, exl3));
    if (ml->router) { /* the largest step this layer runs on the device alone (cuda_moe's paths) */
        const ent *de = find_ent(st, ml->up);
        /* the fused EXL3 path takes ≤ 16 rows, the dense one ≤ 8 (and its slots) */
        const int dl = de ? ((dense_moe *)de->dev)->max_slots / ml->top_k : 0;
        const int lim = find_ent(st, ml->gate) ? 16 : de ? (dl < 8 ? dl : 8) : 0;
        if (lim < st->graph.max_rows) st->graph.max_rows = lim;
    }
    return SPARQ_OK;
}

static sparq_status prepare_fused_moe(cuda_state *st, const sq_moe_layer *ml, bool exl3)
{
    const int E = ml->n_exp;
    if (!exl3 || find_ent(st, ml->gate) || ml->top_k > 16) return SPARQ_OK;
    trellis_cuda_linear **h = (trellis_cuda_linear **)sparq_malloc(3 * (size_t)E * sizeof *h);
    RETURN_IF(!h, SPARQ_E_NOMEM, "cuda moe: out of memory");
    for (int e = 0; e < E; e++) {
        h[e] = h[E + e] = h[2 * E + e] = NULL; /* an expert not held (the expert split): no tables */
        if (!sq_moe_holds(ml, e)) continue;
        (void)exl3_get(st, &ml->gate[e], &h[e]);
        (void)exl3_get(st, &ml->up[e], &h[E + e]);
        (void)exl3_get(st, &ml->down[e], &h[2 * E + e]);
    }
    trellis_cuda_moe *moe = NULL;
    sparq_status s = trellis_cuda_moe_create(h, h + E, h + 2 * E, E, 16, ml->top_k, &moe);
    sparq_free(h);
    if (s != SPARQ_OK) return SPARQ_OK; /* e.g. experts of mixed K: the grouped path serves them */
    s = add_ent(st, ml->gate, moe, ENT_MOE);
    if (s != SPARQ_OK) {
        trellis_cuda_moe_free(moe);
        return s;
    }
    /* layers run one after another on this exec's stream: one set of scratch for all
     * (a layer of other shapes keeps its own) */
    if (!st->moe_first) st->moe_first = moe;
    else (void)trellis_cuda_moe_share(moe, st->moe_first);
    return SPARQ_OK;
}

/* --- memory ----------------------------------------------------------------------------- */

static void *cuda_alloc(sq_exec *ex, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        keep_err(state_of(ex), cuda_status(e, "cudaMalloc"));
        return NULL;
    }
    return p;
}

static void cuda_free_mem(sq_exec *ex, void *p)
{
    (void)ex;
    if (p) cudaFree(p);
}

static sparq_status take_err(cuda_state *st)
{
    if (st->err == SPARQ_OK) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) keep_err(st, cuda_status(e, "kernel launch"));
    }
    if (st->err == SPARQ_OK) return SPARQ_OK;
    sparq_status s = sparq_err(st->err, "%s", st->errmsg);
    st->err = SPARQ_OK; /* reported once */
    return s;
}

static sparq_status cuda_mem_info(sq_exec *ex, uint64_t *free_bytes, uint64_t *total_bytes)
{
    (void)ex;
    size_t f = 0, t = 0;
    FORWARD_IF(cuda_status(cudaMemGetInfo(&f, &t), "device memory info"));
    *free_bytes = f, *total_bytes = t;
    return SPARQ_OK;
}

static sparq_status cuda_sync(sq_exec *ex)
{
    memlog("sync", 0);
    cuda_state *st = state_of(ex);
    graph_finish(st);
    check(st, cudaStreamSynchronize(st->s), "synchronize");
    st->graph.pending = false;
    return take_err(st);
}

static sparq_status cuda_to_host(sq_exec *ex, void *host, const void *mem, size_t bytes)
{
    cuda_state *st = state_of(ex);
    graph_finish(st);
    if (bytes) check(st, cudaMemcpyAsync(host, mem, bytes, cudaMemcpyDeviceToHost, st->s), "download");
    check(st, cudaStreamSynchronize(st->s), "download");
    st->graph.pending = false;
    return take_err(st);
}

static sparq_status cuda_to_device(sq_exec *ex, void *mem, const void *host, size_t bytes)
{
    cuda_state *st = state_of(ex);
    graph_finish(st);
    if (bytes) check(st, cudaMemcpyAsync(mem, host, bytes, cudaMemcpyHostToDevice, st->s), "upload");
    check(st, cudaStreamSynchronize(st->s), "upload");
    st->graph.pending = false;
    return take_err(st);
}

static sparq_status cuda_prepare(sq_exec *ex, const void *host, size_t bytes)
{
    void *d;
    return raw_get(state_of(ex), host, bytes, &d);
}

static sparq_status cuda_prepare_linear(sq_exec *ex, const sq_linear *l)
{
    cuda_state *st = state_of(ex);
    if (block_scaled(l)) return refuse_block_scaled(l);
    if (l->kind == SQ_LINEAR_EXL3) {
        trellis_cuda_linear *lin;
        FORWARD_IF(exl3_get(st, l, &lin));
    } else {
        void *w;
        FORWARD_IF(raw_get(st, l->w, (size_t)l->in * (size_t)l->out * (l->kind == SQ_LINEAR_F32 ? 4 : 2), &w));
    }
    if (l->bias) FORWARD_IF(cuda_prepare(ex, l->bias, (size_t)l->out * sizeof(float)));
    return SPARQ_OK;
}

static void cuda_step_graphs(sq_exec *ex, uint64_t *captured, uint64_t *replayed)
{
    const cuda_state *st = state_of(ex);
    *captured = st->graph.n_capture;
    *replayed = st->graph.n_replay;
}

static void cuda_exec_free(sq_exec *ex)
{
    cuda_state *st = state_of(ex);
    if (!st) return;
    cuda_step_abort(ex);
    cudaDeviceSynchronize();
    for (int i = 0; i < GRAPH_SLOTS; i++)
        if (st->graph.slot[i].exec) cudaGraphExecDestroy(st->graph.slot[i].exec);
    if (st->s) cudaStreamDestroy(st->s);
    for (int pass = 0; pass < 3; pass++) /* fused layers before the linears they use */
        for (size_t i = 0; i < st->cap; i++) {
            ent *e = &st->tab[i];
            if (!e->key) continue;
            if (pass == 0 && e->type == ENT_MOE) trellis_cuda_moe_free((trellis_cuda_moe *)e->dev);
            if (pass == 0 && e->type == ENT_DMOE) {
                cudaFree(((dense_moe *)e->dev)->tab);
                sparq_free(e->dev);
            }
            if (pass == 1 && e->type == ENT_EXL3) trellis_cuda_linear_free((trellis_cuda_linear *)e->dev);
            /* pass 2: ENT_RAW copies live in the slabs */
        }
    sparq_free(st->tab);
    for (size_t i = 0; i < st->n_slab; i++) cudaFree(st->slab[i]);
    sparq_free(st->slab);
    trellis_cuda_ws_free(st->tws);
    trellis_cuda_prefill_ws_free(st->pws);
    cudaFreeHost(st->h_stage);
    cudaFree(st->d_stage);
    cudaFree(st->attn_part);
    cudaFreeHost(st->h_ids);
    cudaFreeHost(st->h_rows);
    cudaFreeHost(st->h_w);
    cudaFreeHost(st->h_lw);
    sparq_free(st->h_cnt);
    sparq_free(st->smp_req);
    cudaFree(st->smp_dev);
    cudaFreeHost(st->smp_host);
    sparq_free(st);
    ex->dev = NULL;
}

/* --- sampling (kernels/cuda/sample_cuda.h) ------------------------------------------------ */

static sparq_status cuda_sample_select(sq_exec *ex, float *logits, int rows, int ld, const sq_sample_req *req,
                                       int32_t *const *ids, float *const *vals, uint8_t *bad)
{
    cuda_state *st = state_of(ex);
    graph_finish(st); /* the step that made the logits ends here; the sampling runs as plain launches */
    if (rows < 1) return take_err(st);
    int stride = 1;
    size_t n_req = (size_t)rows * SQ_CUDA_SAMPLE_PARAM_INTS;
    for (int r = 0; r < rows; r++) {
        const sq_sample_req *q = &req[r];
        RETURN_IF(q->n_vocab < 1 || q->n_vocab > ld || q->k < 0 || q->k > q->n_vocab || q->k > SQ_SAMPLE_MAX_K ||
                      q->n_pen < 0 || q->n_pen > q->n_vocab,
                  SPARQ_E_ARG, "sample_select: row %d asks for %d of %d ids (row length %d, %d penalised)", r, q->k,
                  q->n_vocab, ld, q->n_pen);
        if (q->k > stride) stride = q->k;
        n_req += (size_t)(q->penalty != 1.0f ? q->n_pen : 0);
    }
    if (n_req > st->smp_req_cap) {
        int *t = (int *)sparq_realloc(st->smp_req, n_req * sizeof(int));
        RETURN_IF(!t, SPARQ_E_NOMEM, "cuda backend: out of memory (sampling request)");
        st->smp_req = t;
        st->smp_req_cap = n_req;
    }
    size_t at = (size_t)rows * SQ_CUDA_SAMPLE_PARAM_INTS;
    for (int r = 0; r < rows; r++) {
        const sq_sample_req *q = &req[r];
        int *pr = st->smp_req + (size_t)r * SQ_CUDA_SAMPLE_PARAM_INTS;
        const int np = q->penalty != 1.0f ? q->n_pen : 0;
        pr[0] = q->n_vocab, pr[1] = q->k, pr[2] = (int)float_bits(q->penalty), pr[3] = np, pr[4] = (int)at;
        for (int j = 0; j < np; j++) {
            RETURN_IF(q->pen[j] < 0 || q->pen[j] >= q->n_vocab, SPARQ_E_ARG,
                      "sample_select: row %d penalises id %d outside [0, %d)", r, (int)q->pen[j], q->n_vocab);
            st->smp_req[at++] = q->pen[j];
        }
    }
    const size_t n_out = (size_t)rows * (size_t)stride;
    const size_t bytes = n_out * (sizeof(int) + sizeof(float)) + (size_t)rows * sizeof(int);
    if (bytes > st->smp_cap) {
        cudaFree(st->smp_dev);
        cudaFreeHost(st->smp_host);
        st->smp_dev = st->smp_host = NULL;
        st->smp_cap = 0;
        FORWARD_IF(cuda_status(cudaMalloc((void **)&st->smp_dev, bytes), "sampling results"));
        FORWARD_IF(cuda_status(cudaMallocHost((void **)&st->smp_host, bytes), "sampling results"));
        st->smp_cap = bytes;
    }
    const int *d_req = stage(st, st->smp_req, n_req);
    int *d_ids = (int *)st->smp_dev;
    float *d_vals = (float *)(st->smp_dev + n_out * sizeof(int));
    int *d_bad = (int *)(st->smp_dev + n_out * (sizeof(int) + sizeof(float)));
    if (d_req) sq_cuda_sample_launch(st->s, logits, rows, ld, d_req, stride, d_ids, d_vals, d_bad);
    check(st, cudaGetLastError(), "sampling kernel");
    check(st, cudaMemcpyAsync(st->smp_host, st->smp_dev, bytes, cudaMemcpyDeviceToHost, st->s), "sampling results");
    check(st, cudaStreamSynchronize(st->s), "sampling");
    st->graph.pending = false;
    FORWARD_IF(take_err(st));
    const int *h_ids = (const int *)st->smp_host;
    const float *h_vals = (const float *)(st->smp_host + n_out * sizeof(int));
    const int *h_bad = (const int *)(st->smp_host + n_out * (sizeof(int) + sizeof(float)));
    for (int r = 0; r < rows; r++) {
        bad[r] = h_bad[r] != 0;
        const int n = req[r].k > 0 ? req[r].k : 1;
        if (bad[r]) continue;
        memcpy(ids[r], h_ids + (size_t)r * stride, (size_t)n * sizeof(int32_t));
        memcpy(vals[r], h_vals + (size_t)r * stride, (size_t)n * sizeof(float));
    }
    return SPARQ_OK;
}

/* --- device links (kernels/cuda/link_cuda.h) ---------------------------------------------- */

/* A link op is a hand-over like to_host: the step in flight ends (its graph
 * launches) and the link's copies queue behind it; unlike to_host nothing
 * waits here. */
cudaStream_t sq_cuda_link_stream(sq_exec *ex)
{
    cuda_state *st = state_of(ex);
    graph_finish(st);
    return st->s;
}

static const sq_backend cuda_backend = {
    .name = "cuda",
    .linear = cuda_linear,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .attention = cuda_attention,
    .router_topk = cuda_router_topk,
    .swiglu = cuda_swiglu,
    .axpy = cuda_axpy,
    .sum_parts = cuda_sum_parts,
    .add_rmsnorm = cuda_add_rmsnorm,
    .device = true,
    .alloc = cuda_alloc,
    .free = cuda_free_mem,
    .to_host = cuda_to_host,
    .to_device = cuda_to_device,
    .sync = cuda_sync,
    .prepare = cuda_prepare,
    .prepare_linear = cuda_prepare_linear,
    .embed = cuda_embed,
    .kv_store = cuda_kv_store,
    .moe = cuda_moe,
    .prepare_moe = cuda_prepare_moe,
    .mem_info = cuda_mem_info,
    .exec_free = cuda_exec_free,
    .step_begin = cuda_step_begin,
    .step_abort = cuda_step_abort,
    .step_graphs = cuda_step_graphs,
    .sample_select = cuda_sample_select,
    .attn_front = cuda_attn_front,
    .linear_add_rmsnorm = cuda_linear_add_rmsnorm,
    .link_open = cuda_link_open,
    .link_send = cuda_link_send,
    .link_send_ready = cuda_link_send_ready,
    .link_recv = cuda_link_recv,
    .link_allgather = cuda_link_allgather,
    .link_close = cuda_link_close,
    .link_hub_make = cuda_link_hub_make,
};

extern "C" const sq_backend *sq_backend_cuda(void) { return &cuda_backend; }

extern "C" sparq_status sq_cuda_to_device(sq_exec *ex, void *dev, const void *host, size_t bytes)
{
    return cuda_to_device(ex, dev, host, bytes);
}

extern "C" sparq_status sq_exec_create_cuda(sq_exec **out, int n_threads)
{
    *out = NULL;
    RETURN_IF(trellis_cuda_device_count() <= 0, SPARQ_E_UNSUPPORTED, "device cuda: no usable CUDA GPU (driver or device missing)");
    sq_exec *ex;
    FORWARD_IF(sq_exec_create(&ex, n_threads));
    cuda_state *st = (cuda_state *)sparq_calloc(1, sizeof *st);
    if (!st) {
        sq_exec_free(ex);
        return sparq_err(SPARQ_E_NOMEM, "cuda exec: out of memory");
    }
    ex->dev = st;
    ex->be = &cuda_backend;
    sparq_status s = cuda_status(cudaMallocHost((void **)&st->h_stage, STAGE_INTS * sizeof(int)), "staging ring");
    if (s == SPARQ_OK) s = cuda_status(cudaMalloc((void **)&st->d_stage, STAGE_INTS * sizeof(int)), "staging ring");
    if (s == SPARQ_OK) s = cuda_status(cudaStreamCreate(&st->s), "stream");
    if (s == SPARQ_OK) s = cuda_status(cudaMalloc((void **)&st->attn_part, ATTN_SPLIT_SCRATCH), "attention scratch");
    if (s == SPARQ_OK && getenv("SPARQ_CUDA_ATTN_SPLIT") && strcmp(getenv("SPARQ_CUDA_ATTN_SPLIT"), "0") == 0) {
        cudaFree(st->attn_part); /* the one-block-a-head kernel only (tests, comparisons) */
        st->attn_part = NULL;
    }
    const void *split_fns[] = {(const void *)k_attn_split<1>, (const void *)k_attn_split<2>,
                               (const void *)k_attn_split<4>, (const void *)k_attn_split<8>,
                               (const void *)k_attn_split<16>};
    for (int i = 0; i < 5 && s == SPARQ_OK; i++)
        s = cuda_status(cudaFuncSetAttribute(split_fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, ATTN_SMEM_MAX),
                        "attention shared memory");
    st->graph.max_rows = 16; /* the fused MoE's limit; prepare_moe lowers it for other experts */
    const char *fe = getenv("SPARQ_CUDA_FUSED");
    st->no_fuse = fe && strcmp(fe, "0") == 0;
    const char *ae = getenv("SPARQ_CUDA_ATTN_PREFILL");
    st->no_attn_prefill = ae && strcmp(ae, "0") == 0;
    const char *ne = getenv("SPARQ_CUDA_LINEAR_NORM");
    st->no_linear_norm = ne && strcmp(ne, "0") == 0;
    if (s == SPARQ_OK) s = sq_cuda_attn_prefill_init();
    const char *re = getenv("SPARQ_CUDA_STAGE_REUSE");
    st->no_stage_reuse = re && strcmp(re, "0") == 0;
    const char *ge = getenv("SPARQ_CUDA_GRAPHS");
    st->graph.disabled = ge && strcmp(ge, "0") == 0;
    if (s == SPARQ_OK)
        s = cuda_status(cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, ATTN_SMEM_MAX),
                        "attention shared memory");
    if (s != SPARQ_OK) {
        sq_exec_free(ex);
        return s;
    }
    memlog("exec created", 1);
    *out = ex;
    return SPARQ_OK;
}
