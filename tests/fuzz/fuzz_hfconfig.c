/* tests/fuzz/fuzz_hfconfig.c — libFuzzer target for the config.json parser
 * (sq_config_parse_json). Accepted configs go through the MoE layer rule and
 * the parameter counter, which must not overflow or read out of bounds. */
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
    }
    sq_config_free(&c);
    return 0;
}
