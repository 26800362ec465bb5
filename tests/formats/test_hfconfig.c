/* tests/formats/test_hfconfig.c — config.json parsing: both transformers
 * styles, Qwen3MoeConfig defaults, the MoE layer rule, parameter counts, the
 * EXL3 and FP8 quantization_configs, every rejected input with its status and
 * message, and allocation faults. */
#include "common/alloc.h"
#include "common/file.h"
#include "formats/hfconfig.h"
#include "t.h"

/* The sizes a config must state (hfconfig.h), as Qwen3MoeConfig's defaults have them. */
#define SIZES "\"vocab_size\":151936,\"hidden_size\":2048,\"num_hidden_layers\":24,\"num_attention_heads\":32,"

static sparq_status parse(sq_model_config *c, const char *json)
{
    return sq_config_parse_json(c, json, strlen(json), "config.json");
}

static void expect_bad(const char *json, sparq_status want, const char *needle)
{
    sq_model_config c;
    sparq_status st = parse(&c, json);
    CHECK_MSG(st == want, "status %d (%s), want %d, for %s", st, sparq_errmsg(), want, json);
    CHECK_STR_CONTAINS(sparq_errmsg(), "config.json");
    CHECK_STR_CONTAINS(sparq_errmsg(), needle);
    CHECK(c.mlp_only_layers == NULL && c.arch == SQ_ARCH_UNKNOWN);
    sq_config_free(&c);
}

/* The exllamav3 model's config: transformers-5 keys plus the 4.x duplicates
 * exllamav3 adds, and an EXL3 quantization_config. */
static void test_golden_exl3_config(void)
{
    sq_model_config c;
    CHECK_EQ_INT(sq_config_load(&c, t_data_path("exl3-model/exl3-3.0bpw")), SPARQ_OK);
    CHECK_EQ_INT(c.arch, SQ_ARCH_QWEN3_MOE);
    CHECK(!strcmp(sq_arch_name(c.arch), "qwen3_moe"));
    CHECK_EQ_INT(c.vocab_size, 4096);
    CHECK_EQ_INT(c.hidden_size, 256);
    CHECK_EQ_INT(c.num_hidden_layers, 4);
    CHECK_EQ_INT(c.num_attention_heads, 4);
    CHECK_EQ_INT(c.num_key_value_heads, 2);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.intermediate_size, 768);
    CHECK_EQ_INT(c.moe_intermediate_size, 128);
    CHECK_EQ_INT(c.num_experts, 16);
    CHECK_EQ_INT(c.num_experts_per_tok, 4);
    CHECK(c.norm_topk_prob);
    CHECK(c.tie_word_embeddings);
    CHECK(!c.attention_bias);
    CHECK_EQ_INT(c.max_position_embeddings, 4096);
    CHECK(c.rope_theta == 10000.0 && !strcmp(c.rope_type, "default"));
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK_EQ_INT(c.bos_token_id, -1);
    CHECK_EQ_INT(c.pad_token_id, 0);
    CHECK_EQ_INT(c.n_eos_token_ids, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 2);
    CHECK_EQ_INT(c.torch_dtype, SQ_DTYPE_BFLOAT16);
    CHECK(c.quant.present);
    CHECK(!strcmp(c.quant.quant_method, "exl3") && !strcmp(c.quant.version, "1.4.1"));
    CHECK(c.quant.bits == 3.0 && c.quant.head_bits == 6.0);
    CHECK(!strcmp(c.quant.codebook, "mul1") && !strcmp(c.quant.out_scales, "always"));
    CHECK(c.quant.calibration_rows == 250 && c.quant.calibration_cols == 2048);
    for (int L = 0; L < 4; L++) CHECK(is_moe_layer(&c, L));
    /* 8,145,664: the sum of the original bf16 checkpoint's tensor sizes (tied lm_head) */
    uint64_t total, active;
    sq_config_param_counts(&c, &total, &active);
    CHECK_EQ_INT(total, 8145664);
    /* per MoE layer 12 of 16 experts (3 x 256 x 128 each) are idle */
    CHECK_EQ_INT(active, 8145664 - 4ull * 12 * 3 * 256 * 128);
    sq_config_free(&c);
    CHECK(c.mlp_only_layers == NULL);
    sq_config_free(NULL);
}

static void test_transformers5_style(void)
{
    sq_model_config c;
    CHECK_EQ_INT(parse(&c, "{\"model_type\":\"qwen3_moe\"," SIZES "\"num_local_experts\":8,\"num_experts_per_tok\":2,"
                           "\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"},"
                           "\"dtype\":\"float16\",\"eos_token_id\":[5,7],\"bos_token_id\":1}"),
                 SPARQ_OK);
    CHECK_EQ_INT(c.num_experts, 8);
    CHECK_EQ_INT(c.num_experts_per_tok, 2);
    CHECK(c.rope_theta == 1e6);
    CHECK_EQ_INT(c.torch_dtype, SQ_DTYPE_FLOAT16);
    CHECK(c.n_eos_token_ids == 2 && c.eos_token_ids[0] == 5 && c.eos_token_ids[1] == 7);
    CHECK_EQ_INT(c.bos_token_id, 1);
    CHECK(!c.quant.present);
    sq_config_free(&c);
}

static void test_transformers4_style(void)
{
    sq_model_config c;
    CHECK_EQ_INT(parse(&c, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":151936,\"num_experts\":64,\"rope_theta\":500000,"
                           "\"rope_scaling\":null,\"torch_dtype\":\"bfloat16\",\"hidden_size\":1024,"
                           "\"num_attention_heads\":16,\"num_key_value_heads\":4,\"num_hidden_layers\":6,"
                           "\"decoder_sparse_step\":2,\"mlp_only_layers\":[5,0],\"eos_token_id\":151645,"
                           "\"attention_bias\":true}"),
                 SPARQ_OK);
    CHECK_EQ_INT(c.num_experts, 64);
    CHECK(c.rope_theta == 500000.0);
    CHECK_EQ_INT(c.head_dim, 64); /* 1024 / 16 */
    CHECK(c.attention_bias);
    CHECK(c.n_mlp_only_layers == 2 && c.mlp_only_layers[0] == 0 && c.mlp_only_layers[1] == 5);
    /* transformers' rule: not in mlp_only_layers and (L+1) % 2 == 0 */
    const bool want[6] = {false, true, false, true, false, false};
    for (int L = 0; L < 6; L++) CHECK_MSG(is_moe_layer(&c, L) == want[L], "layer %d", L);
    sq_config_free(&c);
}

/* Missing fields take Qwen3MoeConfig's defaults, except the sizes that fix
 * the tensors' shapes: without one of them the config is refused. */
static void test_defaults(void)
{
    sq_model_config c;
    CHECK_EQ_INT(parse(&c, "{\"model_type\":\"qwen3_moe\"," SIZES "\"architectures\":[]}"), SPARQ_OK);
    CHECK_EQ_INT(c.vocab_size, 151936);
    CHECK_EQ_INT(c.hidden_size, 2048);
    CHECK_EQ_INT(c.intermediate_size, 6144);
    CHECK_EQ_INT(c.num_hidden_layers, 24);
    CHECK_EQ_INT(c.num_attention_heads, 32);
    CHECK_EQ_INT(c.num_key_value_heads, 4);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.max_position_embeddings, 32768);
    CHECK_EQ_INT(c.moe_intermediate_size, 768);
    CHECK_EQ_INT(c.num_experts, 128);
    CHECK_EQ_INT(c.num_experts_per_tok, 8);
    CHECK(!c.norm_topk_prob);
    CHECK_EQ_INT(c.decoder_sparse_step, 1);
    CHECK_EQ_INT(c.n_mlp_only_layers, 0);
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.rope_theta == 10000.0);
    CHECK(!c.tie_word_embeddings && !c.attention_bias);
    CHECK(c.bos_token_id == -1 && c.pad_token_id == -1 && c.n_eos_token_ids == 0);
    CHECK_EQ_INT(c.torch_dtype, SQ_DTYPE_UNSPECIFIED);
    CHECK(!strcmp(c.hidden_act, "silu"));
    sq_config_free(&c);
    /* head_dim explicitly different from hidden/heads (Qwen3-30B-A3B: 2048 / 32 heads x 128) */
    CHECK_EQ_INT(parse(&c, "{\"model_type\":\"qwen3_moe\"," SIZES "\"head_dim\":128}"), SPARQ_OK);
    CHECK_EQ_INT(c.head_dim, 128);
    sq_config_free(&c);
    /* a 256-wide checkpoint must not be read as transformers' 2048 */
    expect_bad("{\"model_type\":\"qwen3_moe\",\"vocab_size\":4096,\"num_hidden_layers\":4,"
               "\"num_attention_heads\":4,\"head_dim\":64}", SPARQ_E_FORMAT, "no 'hidden_size'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"hidden_size\":256,\"num_hidden_layers\":4,"
               "\"num_attention_heads\":4}", SPARQ_E_FORMAT, "no 'vocab_size'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"vocab_size\":4096,\"hidden_size\":256,"
               "\"num_attention_heads\":4}", SPARQ_E_FORMAT, "no 'num_hidden_layers'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"vocab_size\":4096,\"hidden_size\":256,"
               "\"num_hidden_layers\":4,\"num_attention_heads\":null}", SPARQ_E_FORMAT, "no 'num_attention_heads'");
}

static void test_bad_configs(void)
{
    expect_bad("{\"model_type\":\"qwen3_moe\",", SPARQ_E_FORMAT, "invalid JSON");
    expect_bad("[]", SPARQ_E_FORMAT, "JSON object");
    expect_bad("{\"model_type\":\"llama\"}", SPARQ_E_UNSUPPORTED, "model_type 'llama' is not supported (supported: qwen3_moe, deepseek_v41)");
    expect_bad("{\"hidden_size\":256}", SPARQ_E_FORMAT, "no 'model_type'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"model_type\":\"qwen3_moe\"}", SPARQ_E_FORMAT, "duplicate");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"hidden_size\":\"256\"}", SPARQ_E_FORMAT, "'hidden_size' must be an integer");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"hidden_size\":0}", SPARQ_E_FORMAT, "'hidden_size' is 0");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"num_experts\":16,\"num_local_experts\":8}", SPARQ_E_FORMAT,
               "num_experts 16 and num_local_experts 8 disagree");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4}}",
               SPARQ_E_UNSUPPORTED, "rope_type 'yarn' is not supported");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}",
               SPARQ_E_UNSUPPORTED, "rope_scaling.rope_type 'linear'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"rope_theta\":1e6,\"rope_parameters\":{\"rope_theta\":1e4}}",
               SPARQ_E_FORMAT, "disagree");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"quantization_config\":{\"quant_method\":\"gptq\"}}",
               SPARQ_E_UNSUPPORTED, "quant_method 'gptq'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"quantization_config\":{\"quant_method\":\"exl3\",\"bits\":12}}",
               SPARQ_E_FORMAT, "bits 12");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":4,\"mlp_only_layers\":[4]}", SPARQ_E_FORMAT,
               "mlp_only_layers entry 4");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"mlp_only_layers\":[\"1\"]}", SPARQ_E_FORMAT, "mlp_only_layers'[0]");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"num_experts\":4,\"num_experts_per_tok\":5}", SPARQ_E_FORMAT,
               "num_experts_per_tok 5");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"eos_token_id\":10}", SPARQ_E_FORMAT,
               "eos_token_id 10");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"eos_token_id\":\"x\"}", SPARQ_E_FORMAT, "eos_token_id");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"hidden_size\":100,\"num_attention_heads\":3}", SPARQ_E_FORMAT,
               "not a multiple of num_attention_heads");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"hidden_size\":96,\"num_attention_heads\":6,\"num_key_value_heads\":4}", SPARQ_E_FORMAT,
               "not a multiple of num_key_value_heads");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"hidden_act\":\"gelu\"}", SPARQ_E_UNSUPPORTED, "hidden_act 'gelu'");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"use_sliding_window\":true}", SPARQ_E_UNSUPPORTED, "sliding");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"tie_word_embeddings\":1}", SPARQ_E_FORMAT, "true or false");
    expect_bad("{\"model_type\":\"qwen3_moe\",\"dtype\":\"int4\"}", SPARQ_E_UNSUPPORTED, "dtype 'int4'");

    sq_model_config c;
    CHECK_EQ_INT(sq_config_load(&c, "/nonexistent/dir/config.json"), SPARQ_E_IO);
    CHECK_STR_CONTAINS(sparq_errmsg(), "/nonexistent/dir/config.json");
    /* a directory is read as DIR/config.json: the name appears in messages */
    CHECK_EQ_INT(sq_config_load(&c, t_data_path("exl3-model")), SPARQ_E_IO);
    CHECK_STR_CONTAINS(sparq_errmsg(), "exl3-model/config.json");
}

/* DeepSeek V4.1's released config (tests/data/deepseek-v41/config.json):
 * every structural field, and the parameter counts the release states
 * (552B backbone + ~197B Engram, ~16B active per decoded token). */
static void test_deepseek_v41(void)
{
    sq_model_config c;
    CHECK_MSG(sq_config_load(&c, t_data_path("deepseek-v41")) == SPARQ_OK, "%s", sparq_errmsg());
    const sq_v41_config *v = &c.v41;
    CHECK(c.arch == SQ_ARCH_DEEPSEEK_V41);
    CHECK_EQ_INT(c.vocab_size, 129280);
    CHECK_EQ_INT(c.hidden_size, 5120);
    CHECK_EQ_INT(c.num_hidden_layers, 40);
    CHECK_EQ_INT(c.head_dim, 512);
    CHECK_EQ_INT(c.num_experts, 384);
    CHECK_EQ_INT(c.num_experts_per_tok, 6);
    CHECK_EQ_INT(v->rope_dim, 64);
    CHECK_EQ_INT(v->window, 128);
    CHECK_EQ_INT(v->compress_ratio[0], 0);
    CHECK_EQ_INT(v->compress_ratio[2], 2);
    CHECK_EQ_INT(v->compress_ratio[19], 2);
    CHECK_EQ_INT(v->compress_ratio[20], 1);
    CHECK(v->kv_source[2] && v->kv_source[20] && !v->kv_source[21]);
    CHECK(v->index_source[24] && !v->index_source[25]);
    CHECK_EQ_INT(v->candidate_source, 20);
    CHECK_EQ_INT(v->hc_mult, 4);
    CHECK_EQ_INT(v->n_engram, 2);
    CHECK_EQ_INT(v->engram_layer[1], 14);
    CHECK_EQ_INT(v->engram_rows[0], 384006168);
    CHECK_EQ_INT(c.quant.weight_block_size[0], 32);
    CHECK_EQ_INT(c.quant.weight_block_size[1], 32);
    CHECK(!strcmp(c.rope_type, "yarn") && v->rope_factor == 16 && v->rope_original == 65536);
    CHECK_EQ_INT(c.bos_token_id, 0);
    CHECK(c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 1);
    uint64_t total = 0, active = 0;
    sq_config_param_counts(&c, &total, &active);
    const double engram = 2.0 * 384.0e6 * 256; /* ~197B of tables */
    CHECK_MSG(total > 540e9 + engram && total < 565e9 + engram, "total %.1fB", total / 1e9);
    CHECK_MSG(active > 12e9 && active < 18e9, "active %.1fB", active / 1e9);
    sq_config_free(&c);

    /* contradictions are refused, naming the field */
    char *json = NULL;
    size_t len = 0;
    CHECK_MSG(sparq_file_read_all(t_data_path("deepseek-v41/config.json"), 1 << 20, &json, &len) == SPARQ_OK, "%s", sparq_errmsg());
    static const struct {
        const char *from, *to, *needle;
        sparq_status st;
    } bad[] = {
        {"\"compress_ratios\": [\n      0,", "\"compress_ratios\": [\n      0, 0,", "compress_ratios has 41 entries for 40 layers (and 3 MTP stages)",
         SPARQ_E_FORMAT},
        {"\"kv_source_layer_ids\": [\n      2,", "\"kv_source_layer_ids\": [\n      3,", "no kv source", SPARQ_E_FORMAT},
        {"\"scoring_func\": \"sqrtsoftplus\"", "\"scoring_func\": \"softmax\"", "scoring_func 'softmax'",
         SPARQ_E_UNSUPPORTED},
        {"\"rope_type\": \"yarn\"", "\"rope_type\": \"ntk\"", "rope_type 'ntk'", SPARQ_E_UNSUPPORTED},
        {"\"hidden_size\": 5120,", "", "no text_config.hidden_size", SPARQ_E_FORMAT},
        {"\"candidate_source_layer_id\": 20", "\"candidate_source_layer_id\": 21", "not an index source",
         SPARQ_E_FORMAT},
        {"\"weight_block_size\": [\n      32,\n      32\n    ]", "\"weight_block_size\": 32", "weight_block_size",
         SPARQ_E_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *at = strstr(json, bad[i].from);
        CHECK_MSG(at != NULL, "case %zu: '%s' not in the config", i, bad[i].from);
        if (!at) continue;
        char *edited = sparq_malloc(len + 64);
        const size_t pre = (size_t)(at - json);
        memcpy(edited, json, pre);
        strcpy(edited + pre, bad[i].to);
        strcat(edited, at + strlen(bad[i].from));
        sparq_status st = parse(&c, edited);
        CHECK_MSG(st == bad[i].st, "case %zu: status %d (%s)", i, st, sparq_errmsg());
        CHECK_STR_CONTAINS(sparq_errmsg(), bad[i].needle);
        sq_config_free(&c);
        sparq_free(edited);
    }
    /* without engram_num_embeddings the tables count one prime >= engram_vocab_size per column (a
     * lower bound, 0.01 % under the real rows), and a token reads no more rows than a table has (the
     * fuzzer's active > total, once: the tables counted 0 rows) */
    const char *from = "\"engram_num_embeddings\": [\n      384006168,\n      384016682\n    ],";
    const char *at = strstr(json, from);
    CHECK_MSG(at != NULL, "'%s' not in the config", from);
    if (at) {
        char *edited = sparq_malloc(len + 1);
        memcpy(edited, json, (size_t)(at - json));
        strcpy(edited + (at - json), at + strlen(from));
        CHECK_MSG(parse(&c, edited) == SPARQ_OK, "%s", sparq_errmsg());
        CHECK(c.v41.n_engram == 2 && c.v41.engram_rows[0] == 0);
        uint64_t t2 = 0, a2 = 0;
        sq_config_param_counts(&c, &t2, &a2);
        CHECK_MSG(a2 == active && t2 < total && t2 > total - total / 1000, "total %llu of %llu, active %llu of %llu",
                  (unsigned long long)t2, (unsigned long long)total, (unsigned long long)a2, (unsigned long long)active);
        sq_config_free(&c);
        sparq_free(edited);
    }
    sparq_free(json);
}

static void test_fault_injection(void)
{
    const char *json = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,\"num_attention_heads\":4,"
                       "\"num_hidden_layers\":8,\"mlp_only_layers\":[1,2],"
                       "\"quantization_config\":{\"quant_method\":\"exl3\",\"bits\":3,\"calibration\":{\"rows\":1}}}";
    int n, fails = 0;
    for (n = 1; n < 2000; n++) {
        sq_model_config c;
        sparq_alloc_fail_at((uint64_t)n, false);
        sparq_status st = parse(&c, json);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_OK) {
            CHECK(c.n_mlp_only_layers == 2);
            sq_config_free(&c);
            break;
        }
        fails++;
        CHECK_MSG(st == SPARQ_E_NOMEM || st == SPARQ_E_FORMAT, "n=%d: %d %s", n, st, sparq_errmsg());
        CHECK(c.mlp_only_layers == NULL);
    }
    CHECK(fails >= 1); /* the mlp_only_layers array (jansson keeps plain malloc) */
    /* loading from a directory adds the path and the file buffer */
    fails = 0;
    for (n = 1; n < 2000; n++) {
        sq_model_config c;
        sparq_alloc_fail_at((uint64_t)n, false);
        sparq_status st = sq_config_load(&c, t_data_path("exl3-model/exl3-3.0bpw"));
        sparq_alloc_fail_at(0, false);
        sq_config_free(&c);
        if (st == SPARQ_OK) break;
        fails++;
        CHECK_EQ_INT(st, SPARQ_E_NOMEM);
    }
    CHECK(fails >= 2);
}

/* DeepSeek's FP8 quantization_config (V4.1 as released, V3 without scale_fmt
 * / expert_dtype): accepted with every field; other values refused by name. */
static void test_fp8_quant_config(void)
{
    sq_model_config c;
    const char *v41 = "{\"model_type\":\"qwen3_moe\"," SIZES
                      "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
                      "\"weight_block_size\":[32,32],\"scale_fmt\":\"ue8m0\",\"activation_scheme\":\"dynamic\","
                      "\"expert_dtype\":\"fp4\"}}";
    CHECK_MSG(parse(&c, v41) == SPARQ_OK, "%s", sparq_errmsg());
    CHECK(c.quant.present && !strcmp(c.quant.quant_method, "fp8") && !strcmp(c.quant.fmt, "e4m3"));
    CHECK(c.quant.weight_block_size[0] == 32 && c.quant.weight_block_size[1] == 32);
    CHECK(!strcmp(c.quant.scale_fmt, "ue8m0") && !strcmp(c.quant.activation_scheme, "dynamic"));
    CHECK(!strcmp(c.quant.expert_dtype, "fp4") && c.quant.bits == 0 && !c.quant.codebook[0]);
    sq_config_free(&c);
    const char *v3 = "{\"model_type\":\"qwen3_moe\"," SIZES
                     "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
                     "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,128]}}";
    CHECK_MSG(parse(&c, v3) == SPARQ_OK, "%s", sparq_errmsg());
    CHECK(c.quant.weight_block_size[0] == 128 && !c.quant.scale_fmt[0] && !c.quant.expert_dtype[0]);
    sq_config_free(&c);
    const char *bare = "{\"model_type\":\"qwen3_moe\"," SIZES "\"quantization_config\":{\"quant_method\":\"fp8\"}}";
    CHECK(parse(&c, bare) == SPARQ_OK && c.quant.weight_block_size[0] == 0); /* the block is then inferred */
    sq_config_free(&c);
#define Q(body) "{\"model_type\":\"qwen3_moe\",\"quantization_config\":{\"quant_method\":\"fp8\"," body "}}"
    expect_bad(Q("\"fmt\":\"e5m2\""), SPARQ_E_UNSUPPORTED, "quantization_config.fmt 'e5m2' is not supported (supported: e4m3)");
    expect_bad(Q("\"scale_fmt\":\"fp32\""), SPARQ_E_UNSUPPORTED, "scale_fmt 'fp32'");
    expect_bad(Q("\"activation_scheme\":\"static\""), SPARQ_E_UNSUPPORTED, "activation_scheme 'static'");
    expect_bad(Q("\"expert_dtype\":\"int4\""), SPARQ_E_UNSUPPORTED, "supported: fp4, fp8");
    expect_bad(Q("\"weight_block_size\":[32]"), SPARQ_E_FORMAT, "list of two integers");
    expect_bad(Q("\"weight_block_size\":[32,32,1]"), SPARQ_E_FORMAT, "list of two integers");
    expect_bad(Q("\"weight_block_size\":{\"rows\":32}"), SPARQ_E_FORMAT, "list of two integers");
    expect_bad(Q("\"weight_block_size\":[0,32]"), SPARQ_E_FORMAT, "weight_block_size[0]");
    expect_bad(Q("\"weight_block_size\":[32,\"32\"]"), SPARQ_E_FORMAT, "weight_block_size[1]");
    expect_bad(Q("\"weight_block_size\":[32,1e9]"), SPARQ_E_FORMAT, "weight_block_size[1]");
    expect_bad(Q("\"fmt\":4"), SPARQ_E_FORMAT, "fmt");
#undef Q
    expect_bad("{\"model_type\":\"qwen3_moe\",\"quantization_config\":{\"quant_method\":\"awq\"}}",
               SPARQ_E_UNSUPPORTED, "'awq' is not supported (supported: exl3, fp8)");
}

int main(void)
{
    RUN(test_golden_exl3_config);
    RUN(test_transformers5_style);
    RUN(test_transformers4_style);
    RUN(test_defaults);
    RUN(test_bad_configs);
    RUN(test_deepseek_v41);
    RUN(test_fp8_quant_config);
    RUN(test_fault_injection);
    return t_summary();
}
