/* formats/manifest.h — the bundle manifest (manifest.json) and its checksums.
 *
 * A bundle (written by `sparq pack`, docs/bundle-format.md) is a directory
 * holding manifest.json, node-K/model.safetensors per node, the model's
 * config and tokenizer files, and engram/ when the model has Engram tables.
 * The manifest lists every file with its size, its XXH3-128 (the same digest
 * `xxhsum -H2` prints) and the XXH3-128 of every block of `block_size` bytes
 * (the last block may be short), so a damaged byte is located, not just
 * detected. It also records the memory plan and node -> layers, and how the
 * model is split: a pipeline of layers (format_version 1, which every
 * bundle before the expert split is), or the routed experts divided with
 * every node running every layer (format_version 2, plan "split":
 * "experts", each node's "expert_set" listed).
 *
 * This module lives in formats/ (not pack/) because the runtime needs it at
 * load; formats/bundle.h checks a bundle's files against it, the one routine
 * behind the runtime's load check and `sparq verify` (pack/). */
#ifndef SPARQ_FORMATS_MANIFEST_H
#define SPARQ_FORMATS_MANIFEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define SQ_MANIFEST_FORMAT "sparq-bundle"
#define SQ_MANIFEST_VERSION 1         /* a pipeline bundle */
#define SQ_MANIFEST_VERSION_EXPERTS 2 /* an expert-split bundle (a version-1 reader refuses it by number) */
#define SQ_MANIFEST_NAME "manifest.json"
#define SQ_MANIFEST_MAX_SIZE ((size_t)256 << 20)
#define SQ_BLOCK_SIZE_DEFAULT ((uint64_t)4 << 20)

/* A 128-bit digest in canonical (big-endian) byte order, as xxhsum prints it. */
typedef struct sq_digest {
    uint8_t b[16];
} sq_digest;

/* 32 lowercase hex digits + NUL. */
void sq_digest_hex(const sq_digest *d, char out[33]);
/* false unless exactly 32 hex digits. */
bool sq_digest_parse(const char *hex, sq_digest *out);
/* XXH3-128 of a buffer. */
void sq_digest_of(const void *data, size_t n, sq_digest *out);

/* XXH3-128 of bytes [off, off + n) of an open file, read with pread through
 * `scratch` (scratch_size bytes; one read and a one-shot hash when n fits).
 * SPARQ_E_IO names `path`. */
sparq_status sq_digest_file_range(int fd, uint64_t off, uint64_t n, uint8_t *scratch, size_t scratch_size,
                                  sq_digest *out, const char *path);

typedef struct sq_manifest_file {
    char *path;          /* relative, '/'-separated, no "..", no leading '/' */
    int node;            /* node that needs it; -1 = every node (config, tokenizer) */
    uint64_t size;
    sq_digest hash;      /* whole file */
    uint64_t n_blocks;   /* ceil(size / block_size) (0 for an empty file) */
    sq_digest *blocks;   /* [n_blocks] */
} sq_manifest_file;

typedef struct sq_manifest_node {
    int node;
    int64_t first_layer, n_layers;
    bool has_embed, has_head;
    uint64_t total_bytes;  /* the plan's per-node need */
    char engram_file[128]; /* the Engram table file this node reads ("engram_file"), "" if none */
    uint64_t engram_cache; /* the plan's Engram row cache of this node ("engram_cache", bytes; 0 if absent) */
    /* the expert split: the routed experts of every MoE layer this node holds ("expert_set": ids in
     * increasing order, each e with e mod boxes == node); 0 / -1 in a pipeline bundle */
    int64_t n_expert_set, expert_set_max;
} sq_manifest_node;

/* The plan's "split" (the values of runtime/memplan.h's sq_memplan_split). */
enum { SQ_MANIFEST_SPLIT_PIPELINE = 0, SQ_MANIFEST_SPLIT_EXPERTS = 1 };

typedef struct sq_manifest {
    int format_version;
    char tool[64];
    uint64_t block_size;
    /* run parameters the plan was made for (the runtime sizes KV/workspace from them) */
    int boxes;
    int64_t ctx, users, chunk, logits_rows;
    int64_t threads;           /* threads the workspace was planned for */
    char kv_dtype[8];
    int split;                 /* SQ_MANIFEST_SPLIT_* ("split" absent: the pipeline) */
    sq_manifest_node *nodes;   /* [boxes] */
    sq_manifest_file *files;   /* [n_files], in manifest order */
    size_t n_files;
} sq_manifest;

/* Parse manifest JSON text (len bytes). `name` is used in messages. Every
 * field is validated (types, ranges, paths, block counts vs sizes, node
 * indices, layers tiling [0, L) contiguously for the pipeline, every node
 * holding all of [0, L) and an expert set of its own for the expert split).
 * Fuzz target entry point.
 * On failure *m is left empty (sq_manifest_free is safe). */
sparq_status sq_manifest_parse(sq_manifest *m, const char *json, size_t len, const char *name);
/* Read <bundle_dir>/manifest.json. */
sparq_status sq_manifest_load(sq_manifest *m, const char *bundle_dir);
void sq_manifest_free(sq_manifest *m);

/* The file entry with this path, or NULL. */
const sq_manifest_file *sq_manifest_find(const sq_manifest *m, const char *path);

/* Does node `node` load file f (node -1: every file is wanted)? Its own files
 * and those every node needs (f->node == -1). */
bool sq_manifest_file_for_node(const sq_manifest_file *f, int node);

/* Hash the file at `path` (size, whole-file XXH3-128, one digest per block).
 * Fills f->size/hash/n_blocks/blocks (f->path and f->node are untouched). */
sparq_status sq_manifest_hash_file(sq_manifest_file *f, const char *path, uint64_t block_size);

/* The JSON object of one file entry (new reference; NULL on OOM). */
json_t *sq_manifest_file_json(const sq_manifest_file *f);

#endif
