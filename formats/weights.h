/* formats/weights.h — find a linear layer's weight in a checkpoint in any of
 * the stored forms sparq reads, and widen it to fp32.
 *
 * Checkpoints ship a linear `<key>` as one of:
 *  - dense: `<key>.weight` BF16 / F16 / F32 [out, in];
 *  - FP8 with block scales: `<key>.weight` F8_E4M3 (or F8_E5M2) [out, in] and
 *    either `<key>.weight_scale_inv` (DeepSeek-V3: F32/BF16/F16, 128×128
 *    blocks) or `<key>.scale` (DeepSeek-V4.x: F8_E8M0, 128×128, 32×32 or
 *    1×32 blocks); the block is inferred from the scale's shape;
 *  - MXFP4: `<key>.weight` I8/U8 [out, in/2] (two E2M1 values per byte, low
 *    nibble first) or F4 [out, in] with `<key>.scale` F8_E8M0 [out, in/32]
 *    (DeepSeek-V4.1 routed experts), or gpt-oss's per-matrix naming
 *    `<key>_blocks` U8 [out, in/32, 16] with `<key>_scales` U8 (E8M0 bytes)
 *    [out, in/32].
 * The runtime (runtime/models/model.c sq_mdl_bind_linear) runs FP8 E4M3 with
 * UE8M0 `.scale` blocks and MXFP4 in place from the mapping, as the kinds
 * SQ_LINEAR_FP8 / SQ_LINEAR_MXFP4 of kernels/backend.h (E5M2 and float
 * weight_scale_inv are refused there); it finds them here, the FP8 block
 * taken from the config's quantization_config.weight_block_size when there is
 * one (sf_weight_find_block) and inferred from the scale's shape otherwise.
 * The quantizer (quantize/layer.c, quantize/skeleton.c) dequantises any of
 * these to fp32 and sees exactly the values the checkpoint encodes (every
 * decode here is exact).
 * The arithmetic is formats/safetensors.c's sf_dequant_fp8/_mxfp4; this file
 * only recognises the layouts and their companion tensors (shape checks of
 * the scales included). */
#ifndef SPARQ_FORMATS_WEIGHTS_H
#define SPARQ_FORMATS_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/safetensors.h"

typedef enum sf_weight_kind {
    SF_WEIGHT_DENSE = 0, /* BF16 / F16 / F32 */
    SF_WEIGHT_FP8,       /* FP8 + block scales */
    SF_WEIGHT_MXFP4,     /* E2M1 pairs + E8M0 group-of-32 scales */
} sf_weight_kind;

typedef struct sf_weight {
    sf_weight_kind kind;
    const sf_tensor *w;      /* the data tensor */
    const sf_tensor *scale;  /* NULL for DENSE */
    int block_rows, block_cols; /* FP8 scale blocks */
    uint64_t out, in;        /* logical shape [out, in] */
    uint64_t nbytes;         /* stored bytes (data + scales) */
    sf_tensor view_w, view_s; /* gpt-oss naming: 2-D views of _blocks / _scales */
} sf_weight;

/* Look up linear `key` (without ".weight") in m. SPARQ_E_NOTFOUND (message
 * naming the key) when no known form is present; SPARQ_E_SHAPE /
 * SPARQ_E_UNSUPPORTED when a form is present but inconsistent. The result
 * points into m (and into itself for gpt-oss views: do not copy it by value
 * after the lookup — use it in place). */
sparq_status sf_weight_find(const sf_model *m, const char *key, sf_weight *out);

/* sf_weight_find with the FP8 scale block known (block_rows, block_cols > 0,
 * e.g. a config's quantization_config.weight_block_size): an FP8 weight's
 * scale must then be [ceil(out / block_rows), ceil(in / block_cols)], else
 * SPARQ_E_SHAPE naming the scale, its shape and the one expected. 0, 0: the
 * block is inferred from the scale's shape (128x128, 32x32, 1x32). Other
 * forms are found as sf_weight_find finds them. */
sparq_status sf_weight_find_block(const sf_model *m, const char *key, int block_rows, int block_cols, sf_weight *out);

/* Widen to fp32, row-major [out, in] (out * in floats). */
sparq_status sf_weight_to_f32(const sf_weight *w, float *out);

/* "BF16", "F8_E4M3 128x128 (weight_scale_inv)", "MXFP4", ... for messages and reports. */
void sf_weight_describe(const sf_weight *w, char *buf, size_t size);

#endif
