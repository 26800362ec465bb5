/* formats/weights.c — recognise a linear's stored form (dense, FP8 with
 * block scales, MXFP4) and widen it to fp32 (see weights.h). The decoding
 * itself is sf_dequant_fp8 / sf_dequant_mxfp4 / sf_to_f32 in safetensors.c;
 * this file checks the shapes against each other and infers the FP8 block. */
#include "formats/weights.h"

#include <stdio.h>
#include <string.h>

static const sf_tensor *find2(const sf_model *m, const char *key, const char *suffix)
{
    char name[600];
    snprintf(name, sizeof name, "%s%s", key, suffix);
    return sf_find(m, name);
}

/* The FP8 scale block: the given one (a config's weight_block_size), whose
 * grid the scale must have, or inferred from the scale's shape. */
static sparq_status fp8_block(const sf_model *m, sf_weight *o, const char *key, int br, int bc)
{
    const sf_tensor *s = o->scale;
    uint64_t O = o->out, I = o->in;
    RETURN_IF(s->ndim != 2, SPARQ_E_SHAPE, "%s: scale '%s' of FP8 weight '%s.weight' must be 2-D",
              sf_file_path(m, s->file), s->name, key);
    if (br > 0 && bc > 0) {
        const uint64_t r = (O + (uint64_t)br - 1) / (uint64_t)br, c = (I + (uint64_t)bc - 1) / (uint64_t)bc;
        RETURN_IF(s->shape[0] != r || s->shape[1] != c, SPARQ_E_SHAPE,
                  "%s: scale '%s' is [%llu, %llu], but FP8 weight '%s.weight' [%llu, %llu] in blocks of %dx%d "
                  "(quantization_config.weight_block_size) needs [%llu, %llu]",
                  sf_file_path(m, s->file), s->name, (unsigned long long)s->shape[0],
                  (unsigned long long)s->shape[1], key, (unsigned long long)O, (unsigned long long)I, br, bc,
                  (unsigned long long)r, (unsigned long long)c);
        o->block_rows = br, o->block_cols = bc;
        return SPARQ_OK;
    }
    static const int blocks[2] = {128, 32};
    for (int i = 0; i < 2; i++) {
        uint64_t B = (uint64_t)blocks[i];
        if (s->shape[0] == (O + B - 1) / B && s->shape[1] == (I + B - 1) / B) {
            o->block_rows = o->block_cols = blocks[i];
            return SPARQ_OK;
        }
    }
    if (s->shape[0] == O && s->shape[1] == (I + 31) / 32) {
        o->block_rows = 1, o->block_cols = 32;
        return SPARQ_OK;
    }
    return sparq_err(SPARQ_E_SHAPE,
                     "%s: scale '%s' [%llu, %llu] fits no known block (128x128, 32x32, 1x32) of FP8 weight "
                     "'%s.weight' [%llu, %llu]",
                     sf_file_path(m, s->file), s->name, (unsigned long long)s->shape[0],
                     (unsigned long long)s->shape[1], key, (unsigned long long)O, (unsigned long long)I);
}

sparq_status sf_weight_find(const sf_model *m, const char *key, sf_weight *o)
{
    return sf_weight_find_block(m, key, 0, 0, o);
}

sparq_status sf_weight_find_block(const sf_model *m, const char *key, int block_rows, int block_cols, sf_weight *o)
{
    memset(o, 0, sizeof *o);
    const sf_tensor *w = find2(m, key, ".weight");
    if (!w) {
        /* gpt-oss per-matrix MXFP4 naming */
        const sf_tensor *b = find2(m, key, "_blocks"), *s = find2(m, key, "_scales");
        RETURN_IF(!b, SPARQ_E_NOTFOUND, "%s: tensor '%s.weight' not found (nor '%s_blocks')", sf_file_path(m, 0),
                  key, key);
        RETURN_IF(!s, SPARQ_E_NOTFOUND, "%s: MXFP4 tensor '%s_blocks' has no '%s_scales'", sf_file_path(m, b->file),
                  key, key);
        RETURN_IF(b->ndim != 3 || b->shape[2] != 16 || (b->dtype != SF_U8 && b->dtype != SF_I8) || s->ndim != 2 ||
                      s->shape[0] != b->shape[0] || s->shape[1] != b->shape[1] ||
                      (s->dtype != SF_U8 && s->dtype != SF_F8_E8M0),
                  SPARQ_E_SHAPE,
                  "%s: MXFP4 '%s_blocks' must be U8 [out, in/32, 16] and '%s_scales' U8 [out, in/32]",
                  sf_file_path(m, b->file), key, key);
        o->kind = SF_WEIGHT_MXFP4;
        o->view_w = *b;
        o->view_w.ndim = 2;
        o->view_w.shape[1] = b->shape[1] * 16;
        o->view_w.shape[2] = 0;
        o->view_s = *s;
        o->view_s.dtype = SF_F8_E8M0;
        o->w = &o->view_w;
        o->scale = &o->view_s;
        o->out = b->shape[0];
        o->in = b->shape[1] * 32;
        o->nbytes = b->nbytes + s->nbytes;
        return SPARQ_OK;
    }
    RETURN_IF(w->ndim != 2, SPARQ_E_SHAPE, "%s: tensor '%s' is not a matrix", sf_file_path(m, w->file), w->name);
    o->w = w;
    o->out = w->shape[0];
    o->in = w->shape[1];
    o->nbytes = w->nbytes;
    switch (w->dtype) {
    case SF_BF16:
    case SF_F16:
    case SF_F32:
        o->kind = SF_WEIGHT_DENSE;
        return SPARQ_OK;
    case SF_F8_E4M3:
    case SF_F8_E5M2: {
        const sf_tensor *s = find2(m, key, ".weight_scale_inv");
        if (!s) s = find2(m, key, ".scale");
        RETURN_IF(!s, SPARQ_E_NOTFOUND, "%s: FP8 tensor '%s' has no '%s.weight_scale_inv' or '%s.scale'",
                  sf_file_path(m, w->file), w->name, key, key);
        o->kind = SF_WEIGHT_FP8;
        o->scale = s;
        o->nbytes += s->nbytes;
        return fp8_block(m, o, key, block_rows, block_cols);
    }
    case SF_I8:
    case SF_U8:
    case SF_F4: {
        const sf_tensor *s = find2(m, key, ".scale");
        RETURN_IF(!s, SPARQ_E_NOTFOUND, "%s: MXFP4 tensor '%s' (%s) has no '%s.scale'", sf_file_path(m, w->file),
                  w->name, sf_dtype_name(w->dtype), key);
        o->kind = SF_WEIGHT_MXFP4;
        o->scale = s;
        o->nbytes += s->nbytes;
        if (w->dtype != SF_F4) o->in = w->shape[1] * 2;
        RETURN_IF(s->ndim != 2 || s->shape[0] != o->out || s->shape[1] != (o->in + 31) / 32 ||
                      (s->dtype != SF_F8_E8M0 && s->dtype != SF_U8),
                  SPARQ_E_SHAPE, "%s: scale '%s' (%s [%llu, %llu]) of MXFP4 weight '%s' [%llu, %llu] must be F8_E8M0 "
                  "[%llu, %llu] (one per row and 32 columns)",
                  sf_file_path(m, s->file), s->name, sf_dtype_name(s->dtype), (unsigned long long)s->shape[0],
                  (unsigned long long)(s->ndim > 1 ? s->shape[1] : 0), w->name, (unsigned long long)o->out,
                  (unsigned long long)o->in, (unsigned long long)o->out, (unsigned long long)(o->in + 31) / 32);
        return SPARQ_OK;
    }
    default:
        return sparq_err(SPARQ_E_UNSUPPORTED,
                         "%s: tensor '%s' has dtype %s; a linear's weight must be BF16, F16, F32, FP8 (+ scales) "
                         "or MXFP4 (+ scales)",
                         sf_file_path(m, w->file), w->name, sf_dtype_name(w->dtype));
    }
}

sparq_status sf_weight_to_f32(const sf_weight *w, float *out)
{
    switch (w->kind) {
    case SF_WEIGHT_DENSE: return sf_to_f32(w->w, out);
    case SF_WEIGHT_FP8: return sf_dequant_fp8(w->w, w->scale, w->block_rows, w->block_cols, out);
    case SF_WEIGHT_MXFP4: return sf_dequant_mxfp4(w->w, w->scale, out);
    }
    return sparq_err(SPARQ_E_ARG, "unknown weight kind");
}

void sf_weight_describe(const sf_weight *w, char *buf, size_t size)
{
    switch (w->kind) {
    case SF_WEIGHT_DENSE: snprintf(buf, size, "%s", sf_dtype_name(w->w->dtype)); break;
    case SF_WEIGHT_FP8:
        snprintf(buf, size, "%s %dx%d (%s)", sf_dtype_name(w->w->dtype), w->block_rows, w->block_cols,
                 strstr(w->scale->name, "weight_scale_inv") ? "weight_scale_inv" : "scale");
        break;
    case SF_WEIGHT_MXFP4: snprintf(buf, size, "MXFP4"); break;
    }
}
