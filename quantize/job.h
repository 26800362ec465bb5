/* quantize/job.h — what the files of the quantization driver share (not a
 * public interface; quantize/driver.h is): the job state `qjob` that
 * qz_run sets up and every stage reads, the per-layer Hessian accumulators,
 * one quantized linear `qlin`, an output tensor entry, and each stage's entry
 * points. The stages, one file each: calib.c (calibration tokens), capture.c
 * (Hessians through the runtime's observer), layer.c (the per-layer loop and
 * lm_head), checkpoint.c (the work dir and --resume), skeleton.c (FP8/MXFP4
 * sources), output.c (the output directory), report.c (the report and its
 * files), memory.c (page release, resident set, the --max-mem estimate),
 * check.c (what the source must satisfy: config against tensors, no NaN / Inf);
 * driver.c runs them in order. */
#ifndef SPARQ_QUANTIZE_JOB_H
#define SPARQ_QUANTIZE_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/threadpool.h"
#include "formats/safetensors.h"
#include "formats/weights.h"
#include "kernels/cpu/trellis.h"
#include "common/progress.h"
#include "quantize/driver.h"
#include "quantize/ldlq.h"
#include "quantize/viterbi.h"
#include "runtime/model.h"

/* The trellis codebooks' multipliers, stored with every EXL3 linear (and in
 * quantization_config.json). */
#define MUL1_MULT 0x83DCD12Du
#define MCG_MULT 0xCBAC1FEDu

/* Seeds: a tensor's random draws derive from opts.seed and its name, not
 * from the order of the work, so a resumed run draws what an uninterrupted
 * one would. */
static inline uint64_t qz_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static inline uint64_t qz_hash_str(uint64_t seed, const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull ^ qz_mix64(seed);
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return qz_mix64(h);
}

/* One Hessian: the sum of xᵀx over the rows seen, then (qz_hess_finish) their mean. */
typedef struct hess_acc {
    float *h;   /* k×k, upper triangle accumulated (ssyrk) */
    int k;
    uint64_t count;
} hess_acc;

/* A layer's Hessians while its capture forward runs (the observer's user data);
 * st keeps the first failure, which the callback cannot return. */
typedef struct calib_moe calib_moe;
typedef struct layer_capture {
    int layer;
    const sq_layer_desc *desc;
    hess_acc *h[SQ_LAYER_MAX_SLOTS]; /* by group-leading slot: n_h[s] Hessians (one, or one per instance) */
    int n_h[SQ_LAYER_MAX_SLOTS];
    sparq_status st;
    int pass;       /* > 0: a later pass of a MoE capture in passes (calib_moe.c): linear_input counts nothing */
    calib_moe *moe; /* the all-experts hook's state (sq_observer.moe_all), or NULL */
} layer_capture;

/* --- the all-experts MoE capture through sq_observer.moe_all (calib_moe.c) ---
 * The hook groups the routed rows, resolves the Hessians the CPU loop's
 * linear_input reports would feed (qz_capture_target), and hands each call to
 * an engine: the GPU's (calib_gpu.c) or the CPU reference (the runtime's loop,
 * operation for operation, for tests). A layer whose experts do not fit the
 * device at once is captured in passes: the capture forward runs again for
 * each range [e0, e1) of experts, only pass 0 feeds the other Hessians, and
 * the routed outputs of each call are summed over the passes in expert order
 * (host buffers), so the last pass's output is the whole, in-order one
 * (earlier passes' outputs lack the later experts; the quantizer discards the
 * capture forward's output anyway). */
typedef struct qz_calib_call {
    const sq_calib_moe *job;
    int e0, e1;               /* the experts this pass accumulates */
    bool first;               /* the pass's first call (the GPU loads the pass's experts) */
    int n_hx;                 /* Hessians fed with xn this call (pass 0 only; else 0) */
    hess_acc *const *hx;
    hess_acc *const *hd;      /* [n_exp]: expert e's down Hessian, NULL: none */
    const int *cnt, *pairs;   /* the routed pairs by expert (sq_calib_moe_group) */
    float *out;               /* host [rows, d]: += the routed outputs of e0 .. e1 - 1, in expert order */
} qz_calib_call;

typedef struct qz_calib_engine {
    void *ctx;
    sparq_status (*run)(void *ctx, const qz_calib_call *c);
    /* the pass is over: its accumulators (c->hx[0..n_hx), c->hd[e0..e1)) into the host hess_acc */
    sparq_status (*end_pass)(void *ctx, const qz_calib_call *c);
    void (*free)(void *ctx);
} qz_calib_engine;

struct calib_moe {
    layer_capture *cap;
    qz_calib_engine eng;
    int n_exp, per_pass, n_pass, pass, e0, e1;
    int call;                  /* calls of the current pass so far */
    int n_calls;               /* calls of pass 0 (later passes must make the same) */
    float **acc;               /* passes > 1: per call, its output so far [rows, d] */
    int *acc_rows;
    int *cnt, *pairs, cap_pairs;
    bool resolved;             /* the targets below are set (first call) */
    int n_hx;
    hess_acc *hx[2];
    hess_acc **hd;             /* [n_exp] */
};

/* cm for layer capture cap (cap->moe = cm): n_exp experts, at most per_pass
 * at a time (≥ 1), run by eng (owned by cm from here, freed with it: call
 * qz_calib_moe_free whatever this returns). */
sparq_status qz_calib_moe_init(calib_moe *cm, layer_capture *cap, int n_exp, int per_pass, const qz_calib_engine *eng);
/* Before pass p's capture forward (0 ≤ p < cm->n_pass). */
void qz_calib_moe_pass(calib_moe *cm, int p);
/* After it: the pass's accumulators into the host Hessians. */
sparq_status qz_calib_moe_pass_end(calib_moe *cm);
void qz_calib_moe_free(calib_moe *cm);
/* The sq_observer.moe_all hook; user is the layer_capture. */
sparq_status qz_calib_moe_cb(void *user, int layer, const sq_calib_moe *job);
/* The CPU engine: the runtime's loop (runtime/models/blocks.c) on ex, for tests. */
sparq_status qz_calib_engine_cpu(sq_exec *ex, qz_calib_engine *out);
/* calib_gpu.c: the GPU engine on ops (kernels/cuda/calib_cuda.h) for dims dm (dm->slots experts resident),
 * dequantising over pool. */
struct calib_cuda_ops;
struct calib_cuda_dims;
sparq_status qz_calib_engine_gpu(const struct calib_cuda_ops *ops, const struct calib_cuda_dims *dm, sparq_pool *pool,
                                 qz_calib_engine *out);

/* The job: set up by qz_run, read and advanced by every stage. */
typedef struct qjob {
    const qz_opts *o;
    qz_report *rep;
    sq_model *m;
    const sq_model_config *cfg;
    const sq_arch_info *arch;   /* cfg's architecture (runtime/arch.h): its layers and tensor names */
    sf_model *src;
    sparq_pool *pool;
    viterbi_enc *enc[TRELLIS_K_MAX + 1];
    int d, n_layers, rows, T, batch_seqs;
    int w;        /* floats per row of hidden state (sq_arch_hidden_width: d, or V4.1's streams + mix + id) */
    int cmp;      /* of which the leading ones the per-layer metrics compare (the residual streams) */
    bool per_seq; /* sq_arch_info.calib_per_seq: each calibration row runs in a cache slot of its own,
                     rows 0.. for the reference path, rows.. 2·rows for the quantized path */
    int32_t *tokens;
    float *hq, *href, *tmp;
    int *pos;
    char *work;
    qz_recipe recipe;           /* o->recipe, parsed */
    double t_quant;
    /* Sources with FP8/MXFP4 linears: the runtime loads a skeleton (work/skeleton: 1-bit
     * zero placeholders for those linears, a dequantised embedding) over the source, and
     * the driver binds each layer's linears as fp32 (dequantised) while the layer runs. */
    bool skeleton;
    sf_model *skel;         /* the skeleton over the source (sf_open_overlay), for the output assembly */
    size_t page;
    /* Address spans of each finished layer's tensors in the source and model
     * mappings, released again after every layer: the kernel's fault-around
     * maps up to 64 KB of neighbouring (already released) pages on each fault. */
    uintptr_t (*spans)[2];
    int n_spans, cap_spans;
    /* --device cuda: the GPU quantizer (kernels/cuda/ldlq_cuda.h), one context per
     * --devices entry (gdev[i] on o->devices[i]); gctx = gdev[0], which also runs the
     * MoE capture (calib_gpu.c) and single linears (lm_head) */
    const struct ldlq_cuda_ops *gops;
    struct ldlq_cuda *gctx;
    struct ldlq_cuda *gdev[QZ_MAX_DEVICES];
    int n_gdev;
    double t_gpu;                     /* seconds in the GPU recursion, all devices (report) */
    double t_gpu_dev[QZ_MAX_DEVICES]; /* the same per --devices entry */
} qjob;

/* One quantized linear, as stored (EXL3 trellis + scales, or RTN's bf16) and
 * as the runtime runs it (tl). */
typedef struct qlin {
    char *key;
    int K, k, n;          /* k = in, n = out */
    uint16_t *trellis, *suh, *svh; /* EXL3 */
    uint16_t *bf16;       /* RTN: [out, in] */
    trellis_linear tl;
    double proxy;
} qlin;

/* One tensor of an output (or skeleton) shard. */
typedef struct out_entry {
    const sf_tensor *t;
    size_t shard;
    bool owned; /* t->data is heap memory (dequantised tensors) or none (placeholders) */
    bool hole;  /* written as a hole: all zero, ~no disk (skeleton placeholders) */
} out_entry;

/* calib.c */
/* Every --calib file opens as a regular file (checked before the work dir is made). */
sparq_status qz_check_calib_files(const qz_opts *o);
sparq_status qz_build_calib_tokens(const qz_opts *o, int vocab, int32_t **out, int *rows_out,
                                   int *random_out);

/* capture.c */
void qz_hess_free(hess_acc *h);
sparq_status qz_hess_init(hess_acc *h, int k);
void qz_hess_add(hess_acc *h, const float *x, int rows, int in);
void qz_hess_finish(hess_acc *h);
/* Set up the Hessians of layer L's groups (calibrated: allocate the shared ones now). */
sparq_status qz_capture_init(layer_capture *c, int layer, const sq_layer_desc *d, bool calibrated);
/* The Hessian instance `inst` of slot `slot` quantizes against (NULL if none). */
hess_acc *qz_capture_hessian(layer_capture *c, int slot, int inst);
/* The Hessian an input reported for (slot, inst) feeds, as qz_capture_cb counts it (made on first use,
 * in = its size), or NULL when that report counts nothing. */
hess_acc *qz_capture_target(layer_capture *c, int layer, int slot, int inst, int in);
void qz_capture_finish(layer_capture *c);
void qz_capture_cb(void *user, int layer, int slot, int inst, const float *x, int rows, int in);
void qz_capture_free(layer_capture *c);

/* layer.c */
/* K for tensor `key` of `layer` (-1: the head) whose role is `role`. */
int qz_bits_for(const qjob *j, const char *key, int layer, sq_lin_role role);
/* One linear of a layer, in the quantizer's order, with the Hessian it uses. */
typedef struct lin_ref {
    int slot, inst;
    hess_acc *h;
} lin_ref;
/* Linear `key` [out, in] from the source as fp32, (in, out) when `transpose`. */
sparq_status qz_load_weight(qjob *j, const char *key, int *out_n, int *in_n, float **w, bool transpose);
/* The ldlq_opts quantize gives tensor `key` at K bits (the global scale left to the caller). */
void qz_ldlq_opts(const qjob *j, const char *key, int K, ldlq_opts *lo);

/* calib_gpu.c: for --device cuda, set up cm (and cap->moe) for layer L when it has routed experts and
 * the GPU capture is on (SPARQ_QUANT_GPU_CALIB unset or not 0): the device memory planned against the free
 * memory, experts per pass from it (at most SPARQ_QUANT_CALIB_PASS_EXPERTS when set). *on: whether it
 * did. */
sparq_status qz_calib_gpu_setup(qjob *j, int L, const sq_layer_desc *desc, layer_capture *cap, calib_moe *cm, bool *on);
/* The host bytes the GPU capture holds for a layer (the pinned staging, the pass buffers), for the plan. */
uint64_t qz_calib_gpu_host_bytes(const qjob *j, const sq_layer_desc *desc);

/* layer_cuda.c */
/* Quantize the n_lin linears refs of layer L on the GPU, batched by shape and K, into ql
 * (as the CPU loop would); *psum / *pmax get the proxies' sum and maximum. */
sparq_status qz_quantize_layer_cuda(qjob *j, int L, const sq_layer_desc *desc, const lin_ref *refs, int n_lin,
                                    qlin *ql, sparq_progress *pb, double *psum, double *pmax);
/* The host bytes a GPU batch may hold: a quarter of --max-mem (at least 1 GiB), else 8 GiB. */
uint64_t qz_cuda_host_budget(const qjob *j);
/* Quantize one linear on the GPU with prepared Hessian hs (the head). */
sparq_status qz_quantize_linear_cuda(qjob *j, const char *key, const char *wkey, int K, const ldlq_hessian *hs,
                                     qlin *q);
sparq_status qz_do_layer(qjob *j, int L, int n_total);
sparq_status qz_replay_layer(qjob *j, int L);
sparq_status qz_do_head(qjob *j);

/* checkpoint.c */
sparq_status qz_add_qlin_tensors(sf_writer *w, const qlin *q, trellis_codebook cb);
sparq_status qz_meta_num(sf_writer *w, const char *prefix, const char *key, double v);
sparq_status qz_save_hidden(qjob *j, int layer);
sparq_status qz_load_hidden(qjob *j, int *layer);
char *qz_work_file(const qjob *j, int layer);
sparq_status qz_restore_layer_stats(qjob *j, int layer);
sparq_status qz_check_job(qjob *j, bool resume);

/* skeleton.c */
sparq_status qz_build_skeleton(qjob *j, char **dir_out);

/* output.c */
int qz_cmp_entry(const void *a, const void *b);
sparq_status qz_write_json(const char *path, json_t *v);
sparq_status qz_copy_file(const char *src_dir, const char *dst_dir, const char *name);
void qz_clear_dir_files(const char *dir);
uint64_t qz_shard_cap(const qjob *j);
sparq_status qz_write_shards(const qjob *j, const char *dir, out_entry *ent, size_t ne, uint64_t cap);
sparq_status qz_assemble_output(qjob *j);

/* report.c */
sparq_status qz_report_add_tensor(qz_report *r, const char *key, int K, int k, int n, double proxy);

/* check.c */
/* The config against the source's tensors, and the tensors kept as they are free of NaN / Inf. */
sparq_status qz_check_source(qjob *j);
/* Linear `key`, as read (n fp32 values), holds no NaN / Inf. */
sparq_status qz_check_finite(const qjob *j, const char *key, const float *w, uint64_t n);

/* memory.c */
void qz_release_mapped(const qjob *j, const void *p, uint64_t n);
void qz_span_add(qjob *j, const void *p, uint64_t n);
void qz_spans_release(qjob *j);
void qz_release_weight(qjob *j, const sf_weight *w);
uint64_t qz_peak_rss_bytes(void);
uint64_t qz_cur_rss_bytes(void);
void qz_memdbg(const char *what, int L);
void qz_mem_estimate(qjob *j, uint64_t base_rss);
sparq_status qz_mem_refuse(const qjob *j);

#endif
