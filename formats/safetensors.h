/* formats/safetensors.h — safetensors files and sharded HF model directories.
 *
 * Reading maps each file read-only (mmap) and points into it: tensor data is
 * never copied. Every rule of the format is enforced on open (header length
 * cap of 100 MB and not past EOF, JSON object, no duplicate keys, string-only
 * __metadata__, known dtypes, sizes computed in bits with overflow checks,
 * data offsets that tile the data buffer exactly with no holes or overlaps).
 * A sharded directory is opened through model.safetensors.index.json; every
 * shard it names must exist and hold exactly the tensors the index maps to it.
 *
 * Writing (sf_writer) produces hole-free files whose data buffer starts on a
 * 4096-byte boundary (the JSON header is padded with spaces, as the spec
 * allows), written under a temporary name and renamed when complete.
 *
 * Errors name the file (and tensor) and what was expected; see
 * common/status.h. */
#ifndef SPARQ_FORMATS_SAFETENSORS_H
#define SPARQ_FORMATS_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum sf_dtype {
    SF_BOOL = 0,
    SF_U8, SF_I8, SF_U16, SF_I16, SF_U32, SF_I32, SF_U64, SF_I64,
    SF_F16, SF_BF16, SF_F32, SF_F64,
    SF_F8_E4M3,  /* "F8_E4M3" (e4m3fn: no inf, NaN = S.1111.111) */
    SF_F8_E5M2,  /* "F8_E5M2" */
    SF_F8_E8M0,  /* "F8_E8M0": unsigned power of two, 2^(b-127) */
    SF_F4,       /* "F4": FP4 E2M1, two per byte, low nibble first */
    SF_DTYPE_COUNT
} sf_dtype;

/* "F32", "BF16", ... (NULL for an invalid value). */
const char *sf_dtype_name(sf_dtype dt);
/* Parse a dtype name; false if unknown. */
bool sf_dtype_parse(const char *name, sf_dtype *out);
/* Bits per element: 1 for BOOL is NOT used — BOOL is stored as one byte (8). F4 = 4. */
unsigned sf_dtype_bits(sf_dtype dt);

#define SF_MAX_DIMS 8

typedef struct sf_tensor {
    const char *name;
    sf_dtype dtype;
    int ndim;
    uint64_t shape[SF_MAX_DIMS];
    uint64_t numel;       /* product of shape (1 for a scalar) */
    uint64_t nbytes;      /* data size in bytes */
    const void *data;     /* points into the mapped file */
    int file;             /* index of the shard holding it */
} sf_tensor;

typedef struct sf_model sf_model;

/* Open a .safetensors file, a directory holding model.safetensors.index.json
 * (sharded), or a directory holding exactly one *.safetensors file. */
sparq_status sf_open(sf_model **out, const char *path);
void sf_close(sf_model *m);

/* One view of two checkpoints (a file or model directory each, opened as
 * sf_open does): every tensor of `top`, and each tensor of `base` whose
 * module `top` does not have. A tensor's module is its name without the last
 * ".part" ("layers.0.ffn.experts.0.w1" of ".weight", ".scale" or
 * ".trellis"), or for a name ending "_blocks" / "_scales" (gpt-oss MXFP4)
 * without that suffix: so a module top stores in another form (an EXL3
 * placeholder over an FP8 weight and its scale) hides all of base's parts of
 * it. Both stay mapped; sf_file_path names top's files first, then base's.
 * sparq quantize's work skeleton is read this way over its source
 * (quantize/skeleton.c), so that it holds only what differs from it. */
sparq_status sf_open_overlay(sf_model **out, const char *top, const char *base);

/* Tensors, sorted by name (strcmp order). */
size_t sf_count(const sf_model *m);
const sf_tensor *sf_at(const sf_model *m, size_t i);
/* Lookup by exact name; NULL if absent (no error set). */
const sf_tensor *sf_find(const sf_model *m, const char *name);
/* Path of shard i (for messages). */
const char *sf_file_path(const sf_model *m, int file);
int sf_file_count(const sf_model *m);
/* __metadata__ value of the first shard that has the key, or NULL. */
const char *sf_metadata(const sf_model *m, const char *key);

/* Parse one in-memory safetensors image (header and data). `name` is used in
 * messages. Exposed for the fuzz target and tests; sf_open uses it. On success
 * *out owns copies of names but points into `buf` for data: buf must outlive it. */
sparq_status sf_parse_buffer(sf_model **out, const uint8_t *buf, size_t size, const char *name);

/* --- conversion --------------------------------------------------------- */

/* Convert a float tensor (F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0) to
 * fp32. `out` holds t->numel floats. Integer and F4 tensors: SPARQ_E_UNSUPPORTED. */
sparq_status sf_to_f32(const sf_tensor *t, float *out);
/* The same for a contiguous range of elements [first, first + n). */
sparq_status sf_to_f32_range(const sf_tensor *t, uint64_t first, uint64_t n, float *out);

/* How many of t's values are NaN and how many ±Inf (by their bits; 0 for
 * integer, BOOL and F4 tensors, which have neither). Reads all of t->data. */
void sf_count_nonfinite(const sf_tensor *t, uint64_t *n_nan, uint64_t *n_inf);

/* Single-value decoders (exact). */
float sf_e4m3_to_f32(uint8_t b);  /* NaN for S.1111.111 */
float sf_e5m2_to_f32(uint8_t b);
float sf_e8m0_to_f32(uint8_t b);  /* 2^(b-127); 0 -> 2^-127; 255 -> NaN */
float sf_e2m1_to_f32(uint8_t nibble);

/* Dequantise a 2-D FP8 weight [O, I] with block scales to fp32 [O, I]:
 *  - DeepSeek V3 style: `scale` is F32/BF16 `weight_scale_inv` [ceil(O/B), ceil(I/B)], B = 128;
 *  - DeepSeek V4.x style: `scale` is F8_E8M0 [ceil(O/B), ceil(I/B)] (B = 32 for V4.1 dense) or
 *    [O, ceil(I/32)] (per-row groups of 32).
 * block_rows/block_cols give the block (128x128, 32x32, 1x32). The scale shape
 * is checked against them. */
sparq_status sf_dequant_fp8(const sf_tensor *w, const sf_tensor *scale, int block_rows, int block_cols,
                            float *out);
/* Dequantise MXFP4 experts: `w` is I8/U8 [O, I/2] (or F4 [O, I]) holding two
 * E2M1 values per byte, low nibble first; `scale` F8_E8M0 [O, I/32]. */
sparq_status sf_dequant_mxfp4(const sf_tensor *w, const sf_tensor *scale, float *out);

/* --- writing ------------------------------------------------------------ */

typedef struct sf_writer sf_writer;

sparq_status sf_writer_create(sf_writer **out, const char *path);
/* Add a tensor. `data` (nbytes, must match dtype × shape) is copied into the
 * writer's buffer or, with sf_writer_add_ref, referenced until finish. */
sparq_status sf_writer_add(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape,
                           const void *data, uint64_t nbytes);
sparq_status sf_writer_add_ref(sf_writer *w, const char *name, sf_dtype dt, int ndim,
                               const uint64_t *shape, const void *data, uint64_t nbytes);
/* Add a tensor whose bytes are left a hole in the file (they read as zeros and
 * take no disk where the file system has sparse files): a header-only
 * checkpoint that plan / inspect can read at full size (tools/bench/make_v41_model). */
sparq_status sf_writer_add_hole(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape);
sparq_status sf_writer_set_metadata(sf_writer *w, const char *key, const char *value);
/* A tensor referenced like sf_writer_add_ref, written in pieces reported to
 * the sf_writer_on_written hook. */
sparq_status sf_writer_add_streamed(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape,
                                    const void *data, uint64_t nbytes);
/* Write each streamed (sf_writer_add_streamed) tensor in pieces of at most
 * `piece` bytes and call written(user, p, n) after each piece [p, p + n) is
 * written: a caller copying from a mapped file drops the pages it has written
 * (madvise), so a tensor of any size is streamed through a bounded resident
 * set (sparq quantize's Engram tables, ~100 GB each). Other tensors are
 * written whole and not reported (heap memory must not be madvised). */
void sf_writer_on_written(sf_writer *w, uint64_t piece, void (*written)(void *user, const void *p, uint64_t n),
                          void *user);
/* Write header (padded so data starts at a multiple of 4096) and data to
 * "<path>.tmp.<pid>", fsync, rename. Frees the writer either way. */
sparq_status sf_writer_finish(sf_writer *w);
/* Discard without writing anything. */
void sf_writer_free(sf_writer *w);

#endif
