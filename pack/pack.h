/* pack/pack.h — planning, packing and verifying bundles (the library side of
 * `sparq plan`, `sparq pack` and `sparq verify`).
 *
 * A bundle is a model laid out for N boxes (docs/bundle-format.md): one
 * safetensors shard per node holding only that node's tensors, the model's
 * config and tokenizer files, and a manifest with the memory plan and
 * checksums of every file and every block. pack refuses, before writing a
 * byte, a layout the memory plan (runtime/memplan.h) says will not fit.
 * Writing goes to OUT.partial/ (each file itself written atomically) and is
 * renamed to OUT when the manifest is complete, so a bundle that exists is
 * finished; `resume` picks an interrupted OUT.partial up again and produces
 * the very same bytes (the manifest holds no timestamps).
 *
 * Engram tables (`layers.L.engram.embed.weight` F8_E4M3 [rows, head_dim]
 * and `.embed.scale` F8_E8M0 [rows, head_dim / 32], in the hash layout
 * config.json implies: sq_engram_layout_from_config) go to
 * engram/engram-node-K.bin instead of the node shards: node K's file holds
 * the tables of the Engram layers node K runs, with the hash constants and
 * the tokenizer's compressed-id map (formats/engram.h); the manifest's plan
 * node K names it ("engram_file"). */
#ifndef SPARQ_PACK_PACK_H
#define SPARQ_PACK_PACK_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/bundle.h"
#include "formats/engram.h"
#include "formats/hfconfig.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"
#include "runtime/memplan.h"

/* A model opened for planning: config, tensors and the memplan tensor list. */
typedef struct sq_pack_model {
    sq_model_config cfg;
    sf_model *sf;
    sq_memplan_tensor *tensors; /* [n_tensors], names point into sf */
    size_t n_tensors;
} sq_pack_model;

/* Open MODEL (an HF-layout directory with config.json and safetensors). */
sparq_status sq_pack_model_open(sq_pack_model *m, const char *model_dir);
void sq_pack_model_close(sq_pack_model *m);

/* The plan as JSON (the "plan" object of manifest.json; `sparq plan --json`
 * prints it wrapped with the verdict). New reference, NULL on OOM. */
json_t *sq_pack_plan_json(const sq_memplan *plan);

/* One line on the tightest node, into buf: when the plan does not fit
 * "node 1 needs 130.20 GiB but 112.01 GiB is usable per box (over by 18.19
 * GiB (19531... bytes)); largest term: kv", else "tightest node 1 needs ...
 * of ... usable". */
void sq_pack_plan_reason(const sq_memplan *plan, char *buf, size_t cap);

typedef struct sq_pack_options {
    int boxes;
    sq_memplan_params params;
    sq_memplan_budget budget;
    uint64_t block_size;  /* checksum block, power of two >= 4096 (default 4 MiB) */
    bool resume;          /* continue OUT.partial */
} sq_pack_options;

void sq_pack_options_default(sq_pack_options *o);

/* Pack model_dir into out_dir. SPARQ_E_FIT (nothing written, out_dir
 * untouched) when the plan does not fit; SPARQ_E_ARG when out_dir exists, or
 * out_dir.partial exists and resume is false, or it was started with other
 * options. Draws a progress bar (common/progress.h). */
sparq_status sq_pack_bundle(const char *model_dir, const char *out_dir, const sq_pack_options *o);

/* --- verify ------------------------------------------------------------- */

typedef struct sq_verify_options {
    int node;     /* -1: every file; K: files node K needs (its shard + shared files) */
    bool quick;   /* sizes and unlisted files only, no hashing */
    int threads;  /* <= 0: all CPUs */
} sq_verify_options;

/* files, blocks, bytes checked, hashing seconds, and every problem, one line
 * each ("node-1/model.safetensors: block 3 (bytes ...): checksum mismatch"). */
typedef sq_bundle_report sq_verify_report;

/* Check a bundle: its files against the manifest (formats/bundle.h, what the
 * runtime checks at load, with every unlisted file a problem), then — when
 * they all match — the manifest's model config, layer count and plan against
 * config.json and the shards (pack/verify.c says which). SPARQ_OK when
 * everything matches; otherwise the first problem's status
 * (SPARQ_E_CHECKSUM, SPARQ_E_FORMAT, SPARQ_E_NOTFOUND) with it as the
 * message and all of them in the report. Draws a progress bar. */
sparq_status sq_verify_bundle(const char *bundle_dir, const sq_verify_options *o, sq_verify_report *r);
static inline void sq_verify_report_free(sq_verify_report *r) { sq_bundle_report_free(r); }

/* Sequential read of the same files (the baseline of the verify benchmark):
 * bytes read and seconds, one thread, no hashing. */
sparq_status sq_verify_read_baseline(const char *bundle_dir, int node, uint64_t *bytes, double *seconds);

#endif
