/* tests/fuzz/fuzz_fp8_import.c — libFuzzer target for the import of FP8 /
 * FP4 checkpoints (DeepSeek V4.1's layout): the input is a safetensors image;
 * every "<key>.weight" is looked up as a linear in any stored form
 * (formats/weights.h: FP8 with its block scales, MXFP4 with its group scales,
 * dense), small ones are widened to fp32 (scale and NaN codes refused, every
 * read in bounds under ASan), and the whole file is checked against a small
 * V4.1 config as `sparq inspect --check` does (runtime/arch.h). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "formats/weights.h"
#include "runtime/arch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Two layers of width 64 with every kind of layer the description has. */
static const char cfg_json[] =
    "{\"model_type\":\"deepseek_v41\",\"text_config\":{\"vocab_size\":64,\"hidden_size\":64,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":2,\"head_dim\":64,\"qk_rope_head_dim\":16,\"q_lora_rank\":32,\"o_groups\":2,"
    "\"o_lora_rank\":32,\"sliding_window\":8,\"compress_ratios\":[0,2],\"kv_source_layer_ids\":[1],"
    "\"index_source_layer_ids\":[1],\"index_n_heads\":2,\"index_head_dim\":32,\"index_topk\":4,"
    "\"n_routed_experts\":2,\"num_experts_per_tok\":1,\"moe_intermediate_size\":32,\"hc_mult\":2},"
    "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[32,32]}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sq_model_config cfg;
    static int cfg_ok = -1;
    if (cfg_ok < 0) cfg_ok = sq_config_parse_json(&cfg, cfg_json, sizeof cfg_json - 1, "fuzz/config.json") == SPARQ_OK;
    uint8_t *buf = sparq_malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    sf_model *m = NULL;
    if (sf_parse_buffer(&m, buf, size, "fuzz.safetensors") == SPARQ_OK) {
        for (size_t i = 0; i < sf_count(m); i++) {
            const char *name = sf_at(m, i)->name;
            const size_t n = strlen(name);
            if (n <= 7 || n > 500 || strcmp(name + n - 7, ".weight")) continue;
            char key[512];
            memcpy(key, name, n - 7);
            key[n - 7] = 0;
            sf_weight w;
            if (sf_weight_find(m, key, &w) != SPARQ_OK) continue;
            char desc[128];
            sf_weight_describe(&w, desc, sizeof desc);
            if (w.out * w.in > (1u << 16)) continue;
            float *out = sparq_malloc((size_t)(w.out * w.in) * sizeof(float) + 1);
            if (out) (void)sf_weight_to_f32(&w, out);
            sparq_free(out);
        }
        if (cfg_ok) {
            sq_arch_problems p;
            (void)sq_arch_check_tensors(&cfg, m, NULL, "fuzz", &p);
            sq_arch_problems_free(&p);
        }
        sf_close(m);
    }
    sparq_free(buf);
    return 0;
}
