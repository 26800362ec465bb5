/* tests/fuzz/fuzz_hfconfig.c — libFuzzer target for the config.json parser
 * (sq_config_parse_json), quantization_config (EXL3, FP8) included. Accepted
 * configs go through the MoE layer rule and the parameter counter, which must
 * not overflow or read out of bounds, and an FP8 block is checked sane. */
#include <stddef.h>
#include <stdint.h>

#include "formats/hfconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sq_model_config c;
    if (sq_config_parse_json(&c, (const char *)data, size, "fuzz/config.json") == SPARQ_OK) {
        int64_t moe = 0;
        for (int64_t L = 0; L < c.num_hidden_layers && L < 4096; L++) moe += sq_config_is_moe_layer(&c, L);
        uint64_t total = 0, active = 0;
        if (c.num_hidden_layers <= 4096) sq_config_param_counts(&c, &total, &active);
        if (active > total || moe > c.num_hidden_layers) __builtin_trap();
        /* an FP8 quantization_config's block: both sizes given (1..65536) or neither */
        const int *b = c.quant.weight_block_size;
        if (b[0] < 0 || b[0] > 65536 || b[1] < 0 || b[1] > 65536 || (b[0] == 0) != (b[1] == 0)) __builtin_trap();
    }
    sq_config_free(&c);
    return 0;
}
