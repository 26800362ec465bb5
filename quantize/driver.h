/* quantize/driver.h — the streaming quantization driver behind
 * `sparq quantize`: one decoder layer at a time, calibrated EXL3 output in
 * exllamav3's on-disk layout, resumable, with a quality report.
 *
 * Per layer L (reference.md §1.3):
 *   1. capture Hessians: the calibration hidden states go through layer L
 *      with the runtime's observer in all_experts mode (every token reaches
 *      every expert); q/k/v share the layer-input H, o_proj gets its own,
 *      gate/up of every expert share the post-attention-norm H, each expert's
 *      down_proj gets its own;
 *   2. the reference hidden states (never quantized) go through the
 *      original layer L;
 *   3. every linear of L is quantized (quantize/ldlq.h) and swapped into the
 *      model (sq_model_linear + the runtime's EXL3 sq_linear);
 *   4. the quantized-path hidden states go through the quantized layer with
 *      normal routing; rel. error / cosine / SQNR against the reference rows
 *      are recorded;
 *   5. the layer's tensors, metrics and both hidden-state sets are written to
 *      the work dir atomically: that is the checkpoint `--resume` restarts
 *      from (same seed ⇒ byte-identical output).
 * Then lm_head (head_bits, Hessian of the final-normed hidden states), and the
 * output directory is assembled from the source's unquantized tensors and the
 * work dir's quantized ones: sharded safetensors (+ index), config.json with
 * quantization_config, quantization_config.json, tokenizer files — written
 * to OUT.partial and renamed to OUT.
 *
 * Streaming (docs/quantization.md "Memory"): a layer's weights are touched
 * only while it runs — the model's and the source's mapped pages are released
 * with madvise(MADV_DONTNEED) after use — so the peak resident set is about
 * one layer plus the calibration hidden states, whatever the model's size.
 * `max_mem` is checked against an itemised estimate before any work and the
 * measured peak (VmHWM) is reported.
 *
 * Sources: a linear may be stored dense, as FP8 with block scales or as
 * MXFP4 (formats/weights.h). The runtime reads dense and EXL3 only, so for a
 * source with FP8/MXFP4 tensors the runtime model is loaded from a skeleton
 * written to the work dir (1-bit zero EXL3 placeholders for those linears)
 * and each layer's FP8/MXFP4 linears are bound as fp32 while it runs. The
 * quantizer sees the exact decoded values either way.
 *
 * Bits (exllamav3's defaults): routed experts K = floor(bits), attention
 * K+2, dense MLP and shared experts K+1, lm_head head_bits; embeddings, norms
 * and the router stay unquantized. A fractional `bits` upgrades an evenly
 * spread share of the layers by one bit. Then, each a list of `GLOB=K` rules
 * (fnmatch on the tensor key, last match wins, each list overriding the one
 * before): the architecture's defaults (sq_arch_info.default_bits; DeepSeek
 * V4.1: attention 5, shared experts 4, engram.wkv 4), the --recipe file, the
 * --bits-for rules.
 *
 * Baselines: method TRELLIS_NOCALIB (identity Hessian, same format) and RTN
 * (round-to-nearest with per-group asymmetric scales; written DEQUANTISED to
 * bf16 in an ordinary HF layout, so any loader can evaluate it; its
 * quantization_config.json says quant_method "rtn"). */
#ifndef SPARQ_QUANTIZE_DRIVER_H
#define SPARQ_QUANTIZE_DRIVER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/cpu/trellis.h"

typedef enum qz_method {
    QZ_METHOD_TRELLIS = 0,     /* calibrated EXL3 (default) */
    QZ_METHOD_TRELLIS_NOCALIB, /* EXL3 with an identity Hessian */
    QZ_METHOD_RTN,             /* round-to-nearest baseline, stored dequantised (bf16) */
} qz_method;

/* "trellis", "trellis-nocalib", "rtn"; parse returns false if unknown. */
const char *qz_method_name(qz_method m);
bool qz_method_parse(const char *s, qz_method *out);

#define QZ_MAX_RULES 32
#define QZ_MAX_CALIB 16

/* How each linear's global scale g is found (ldlq.h). */
typedef enum qz_scale_search {
    QZ_SCALE_FULL = 0, /* default, as exllamav3: a coarse grid (0.1..1.9), a fine grid and a parabolic
                          refinement on a sample of tiles, for every tensor (reference.md §1.3) */
    QZ_SCALE_SHARED,   /* search for expert 0 of each projection and K in a MoE layer and reuse its g
                          for the layer's other experts: faster (the search costs several times the
                          quantization of a small matrix; regularised experts have near-identical
                          statistics); docs/benchmarks-quantize.md compares time and KLD */
    QZ_SCALE_FIXED,    /* no search: ldlq_default_g(K, codebook) (fast; for tests) */
} qz_scale_search;

/* Where the quantization's recursion runs (the calibration forward and the
 * Hessians are on the CPU either way for now). */
typedef enum qz_device {
    QZ_DEVICE_CPU = 0,
    QZ_DEVICE_CUDA, /* the GPUs of qz_opts.devices: the Viterbi, the LDLQ feedback and the proxies
                       (quantize/layer_cuda.c) */
} qz_device;

/* --devices: at most this many entries (one CUDA context and pipeline each). */
#define QZ_MAX_DEVICES 16

/* Parse a --devices LIST: comma-separated CUDA device ordinals (0..999), each
 * non-empty, the same one allowed more than once (two contexts on one GPU),
 * 1..QZ_MAX_DEVICES of them. Returns SPARQ_E_ARG with a message naming the
 * bad entry. Whether a device exists is checked when the run starts. */
sparq_status qz_devices_parse(const char *list, int *devices, int *n_devices);

typedef struct qz_bits_rule {
    const char *pattern; /* fnmatch pattern on the tensor key, e.g. "*.down_proj" */
    int K;
} qz_bits_rule;

/* A recipe file (quantize/recipe.c): "GLOB=K" lines, '#' comments; rules in the file's order,
 * patterns pointing into `text`. */
typedef struct qz_recipe {
    qz_bits_rule *rules;
    int n;
    char *text;
} qz_recipe;

/* Parse n bytes of a recipe called `name` (for messages: "name:LINE: ..."). */
sparq_status qz_recipe_parse(const char *name, const char *data, size_t n, qz_recipe *out);
sparq_status qz_recipe_load(const char *path, qz_recipe *out);
void qz_recipe_free(qz_recipe *r);

typedef struct qz_opts {
    const char *model_dir;  /* source HF directory: linears BF16/F16/F32, FP8 + block scales or
                               MXFP4 (formats/weights.h); other tensors BF16/F16/F32 (or FP8) */
    const char *out_dir;    /* created; must not exist */
    const char *work_dir;   /* NULL: "<out_dir>.work" */
    double bits;            /* expert base bits, 1..8, fractional allowed (default 3) */
    int head_bits;          /* lm_head bits (default 6) */
    const char *recipe;     /* a recipe file (qz_recipe) or NULL; its rules apply before `rules` */
    qz_bits_rule rules[QZ_MAX_RULES]; /* --bits-for */
    int n_rules;
    const char *calib[QZ_MAX_CALIB]; /* text files; *.jsonl: the "text" field of every line */
    int n_calib;
    int calib_rows;          /* rows of calib_len tokens (default 16) */
    int calib_len;           /* tokens per row (default 256) */
    double random_rows_frac; /* share of rows of uniform random token ids (default 0.15) */
    trellis_codebook cb;     /* default mul1 */
    qz_method method;
    int rtn_group;           /* RTN group size along the input dim (default 128) */
    qz_scale_search scale_search; /* default QZ_SCALE_FULL */
    bool resume;             /* continue from work_dir's checkpoint */
    uint64_t max_mem;        /* bytes; 0 = no limit. A bound on the peak resident set: the run is
                                refused up front when the estimate exceeds it, and streams one layer
                                at a time (mapped pages released after use) to stay under it */
    uint64_t shard_bytes;    /* max bytes per output shard (default 4 GiB) */
    uint64_t seed;           /* default 0 */
    int threads;             /* ≤ 0: all CPUs */
    qz_device device;        /* default QZ_DEVICE_CPU */
    int devices[QZ_MAX_DEVICES]; /* QZ_DEVICE_CUDA: the CUDA ordinals to share the work (qz_devices_parse) */
    int n_devices;           /* 0: device 0 alone */
    int stop_after_layer;    /* testing: return SPARQ_E_INTERRUPTED after this layer's checkpoint (-1 off) */
} qz_opts;

void qz_opts_default(qz_opts *o);

/* Per-tensor and per-layer results. */
typedef struct qz_tensor_stat {
    char key[192];
    int K;           /* bits (RTN: its bits) */
    int k, n;        /* in, out */
    double proxy_err;/* regularised-space proxy (trellis); relative H-weighted error (RTN) */
} qz_tensor_stat;

typedef struct qz_layer_stat {
    int layer;
    double rel_err;  /* ‖h_q − h_ref‖ / ‖h_ref‖ over all calibration rows after this layer */
    double cosine;   /* mean per-row cosine similarity */
    double sqnr_db;  /* 10·log10(‖h_ref‖² / ‖h_q − h_ref‖²) */
    double mean_proxy, max_proxy;
    double seconds;  /* wall time of the layer (0 if restored from the checkpoint) */
    uint64_t n_weights;    /* weights quantized in this layer (0 if restored) */
    double quant_seconds;  /* time inside the quantizer for them (weights/s = n_weights / quant_seconds) */
    bool resumed;
} qz_layer_stat;

/* One term of the memory estimate (see qz_run / docs/quantization.md). */
typedef struct qz_mem_part {
    const char *what; /* static string, e.g. "calibration hidden states" */
    uint64_t bytes;
} qz_mem_part;
#define QZ_MEM_PARTS 10

typedef struct qz_report {
    qz_tensor_stat *tensors;
    int n_tensors, cap_tensors;
    qz_layer_stat *layers;
    int n_layers;
    uint64_t n_weights;      /* weights quantized in this run (not restored ones) */
    double quant_seconds;    /* time spent inside the quantizer in this run */
    double gpu_seconds;      /* --device cuda: the GPU's busy time in the batches (uploads, recursion and
                              * proxies by CUDA events, downloads); it overlaps the CPU's part. All
                              * devices together; per --devices entry below */
    double gpu_seconds_dev[QZ_MAX_DEVICES];
    int devices[QZ_MAX_DEVICES], n_devices; /* the ordinals gpu_seconds_dev is for (0: not on the GPU) */
    double total_seconds;
    uint64_t peak_rss;       /* bytes: the process's measured peak resident set (VmHWM), file-backed
                                pages of the mapped checkpoint included */
    uint64_t mem_estimate;   /* bytes: the driver's upper estimate of that peak (checked against
                                --max-mem before any work) */
    qz_mem_part mem_parts[QZ_MEM_PARTS]; /* its terms (they add up to mem_estimate) */
    int n_mem_parts;
    bool skeleton;           /* FP8/MXFP4 source: ran on a skeleton with fp32 binding per layer */
    int calib_rows, calib_len, random_rows;
    int resumed_layers;
    /* The result against the source on the text calibration rows (qz_do_head): the source
     * model's logits (reference path, source head) against the output's (quantized path,
     * quantized head), per token: mean KL(source ‖ output), top-1 agreement, and the
     * perplexity of the next calibration token under each. quality_tokens 0: not measured
     * (rtn, or a head restored by --resume from a run without it). */
    double quality_kld, quality_top1, quality_ppl_source, quality_ppl_output;
    long quality_tokens;
} qz_report;

void qz_report_free(qz_report *r);

/* Run the whole job. `rep` (zeroed by the caller) receives the report even
 * on some failures (whatever was done). */
sparq_status qz_run(const qz_opts *o, qz_report *rep);

/* Write the report as JSON / as an SVG plot of the per-layer error. */
sparq_status qz_report_write_json(const qz_report *r, const qz_opts *o, const char *path);
sparq_status qz_report_write_svg(const qz_report *r, const char *path);

#endif
