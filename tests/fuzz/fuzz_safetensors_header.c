/* tests/fuzz/fuzz_safetensors_header.c — libFuzzer target for the
 * safetensors image parser (sf_parse_buffer: header length, JSON header,
 * dtypes, shapes, offsets). Every tensor it accepts is looked up by name and
 * its bytes are read, so ASan catches any data pointer the parser gets wrong.
 * Neighbouring tensor pairs are also tried as (weight, scale) for the FP8 and
 * MXFP4 dequantisers, whose shape checks must keep every read in bounds. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy: sanitizers then see reads past the image as overflows. */
    uint8_t *buf = sparq_malloc(size);
    if (!buf) return 0;
    memcpy(buf, data, size);
    sf_model *m = NULL;
    if (sf_parse_buffer(&m, buf, size, "fuzz.safetensors") == SPARQ_OK) {
        float tmp[64];
        for (size_t i = 0; i < sf_count(m); i++) {
            const sf_tensor *t = sf_at(m, i);
            if (sf_find(m, t->name) != t) __builtin_trap();
            volatile uint8_t sum = 0;
            const uint8_t *p = t->data;
            for (uint64_t b = 0; b < t->nbytes; b++) sum += p[b];
            const uint64_t n = t->numel < 64 ? t->numel : 64;
            (void)sf_to_f32_range(t, t->numel - n, n, tmp);
        }
        /* (weight, scale) pairs: small weights only, output sized for MXFP4's 2 values per byte */
        for (size_t i = 0; i + 1 < sf_count(m); i++) {
            const sf_tensor *w = sf_at(m, i), *sc = sf_at(m, i + 1);
            if (w->numel > (1u << 16)) continue;
            float *out = sparq_malloc((size_t)w->numel * 2 * sizeof(float) + 1);
            if (!out) continue;
            (void)sf_dequant_fp8(w, sc, 128, 128, out);
            (void)sf_dequant_fp8(w, sc, 32, 32, out);
            (void)sf_dequant_fp8(w, sc, 1, 32, out);
            (void)sf_dequant_mxfp4(w, sc, out);
            sparq_free(out);
        }
        (void)sf_metadata(m, "format");
        sf_close(m);
    }
    sparq_free(buf);
    return 0;
}
