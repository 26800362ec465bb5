/* tests/pack/test_bundle.c — pack / verify / quick load check on a small
 * synthetic Qwen3-MoE written at test time with sf_writer: node shards hold
 * exactly their tensors, a flipped random byte is located (file and block),
 * truncation is reported by verify and by the runtime's quick check, a budget
 * one byte too small is refused with nothing written, the manifest's plan
 * equals the memplan functions the runtime calls, and malformed manifests are
 * rejected with a message; the DeepSeek V4.1 fixture's Engram tables packed
 * per node by layer. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/json.h"
#include "formats/engram.h"
#include "formats/manifest.h"
#include "pack/pack.h"
#include "t.h"

#define HID 128
#define LAYERS 4
#define VOCAB 512
#define EXPERTS 4
#define MOE_I 64

static char model_dir[600];

static void add(sf_writer *w, const char *name, uint64_t rows, uint64_t cols)
{
    uint64_t shape[2] = {rows, cols};
    uint64_t n = rows * (cols ? cols : 1) * 2;
    uint16_t *d = malloc(n);
    for (uint64_t i = 0; i < n / 2; i++) d[i] = (uint16_t)(0x3c00 ^ (rand() & 0x3ff));
    CHECK_EQ_INT(sf_writer_add(w, name, SF_BF16, cols ? 2 : 1, shape, d, n), SPARQ_OK);
    free(d);
}

/* Engram-shaped tables at model layers 1 and 3 of a model whose config has
 * no Engram layers (Qwen3-MoE): pack must refuse them, not guess a layout. */
static void add_engram(sf_writer *w)
{
    for (int t = 0; t < 2; t++) {
        const uint64_t rows = 1000;
        uint8_t *v = calloc(rows, 256), *sc = calloc(rows, 8);
        char name[128];
        uint64_t sv[2] = {rows, 256}, ss[2] = {rows, 8};
        snprintf(name, sizeof name, "model.layers.%d.engram.embed.weight", t ? 3 : 1);
        CHECK_EQ_INT(sf_writer_add(w, name, SF_F8_E4M3, 2, sv, v, rows * 256), SPARQ_OK);
        snprintf(name, sizeof name, "model.layers.%d.engram.embed.scale", t ? 3 : 1);
        CHECK_EQ_INT(sf_writer_add(w, name, SF_F8_E8M0, 2, ss, sc, rows * 8), SPARQ_OK);
        free(v);
        free(sc);
    }
}

static void write_model_to(const char *sub, int engram);

static void write_model(void) { write_model_to("model", 0); }

static void write_model_to(const char *sub, int engram)
{
    snprintf(model_dir, sizeof model_dir, "%s/%s", t_tmpdir(), sub);
    CHECK_EQ_INT(sparq_mkdirs(model_dir), SPARQ_OK);
    char path[700], name[128];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    const char *cfg = "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 512, \"hidden_size\": 128,"
                      " \"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
                      " \"head_dim\": 64, \"moe_intermediate_size\": 64, \"num_experts\": 4,"
                      " \"num_experts_per_tok\": 2, \"tie_word_embeddings\": false}\n";
    CHECK_EQ_INT(sparq_file_write_atomic(path, cfg, strlen(cfg)), SPARQ_OK);
    /* pack loads the tokenizer: a real one, with ids below the vocab_size */
    char *tok = NULL;
    size_t tok_n = 0;
    CHECK_EQ_INT(sparq_file_read_all(t_data_path("quantize/tiny-synth/tokenizer.json"), 0, &tok, &tok_n), SPARQ_OK);
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    CHECK_EQ_INT(sparq_file_write_atomic(path, tok, tok_n), SPARQ_OK);
    sparq_free(tok);
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    sf_writer *w;
    CHECK_EQ_INT(sf_writer_create(&w, path), SPARQ_OK);
    srand(42);
    add(w, "model.embed_tokens.weight", VOCAB, HID);
    add(w, "lm_head.weight", VOCAB, HID);
    add(w, "model.norm.weight", HID, 0);
    for (int l = 0; l < LAYERS; l++) {
        static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        static const uint64_t out[] = {128, 64, 64, 128};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, attn[i]);
            add(w, name, out[i], HID);
        }
        static const char *const norms[] = {"input_layernorm", "post_attention_layernorm", "self_attn.q_norm",
                                            "self_attn.k_norm"};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, norms[i]);
            add(w, name, i < 2 ? HID : 64, 0);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        add(w, name, EXPERTS, HID);
        for (int e = 0; e < EXPERTS; e++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            add(w, name, MOE_I, HID);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            add(w, name, MOE_I, HID);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            add(w, name, HID, MOE_I);
        }
    }
    if (engram) add_engram(w);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
}

static const char *tmp(const char *name)
{
    static char buf[4][700];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", t_tmpdir(), name);
    return buf[i];
}

static sq_pack_options small_options(int boxes)
{
    sq_pack_options o;
    sq_pack_options_default(&o);
    o.boxes = boxes;
    o.params.ctx = 256;
    o.params.users = 2;
    o.params.chunk = 64;
    o.block_size = 65536;
    return o;
}

static char bundle[700];

static void test_pack(void)
{
    write_model();
    snprintf(bundle, sizeof bundle, "%s", tmp("b2"));
    sq_pack_options o = small_options(2);
    CHECK_EQ_INT(sq_pack_bundle(model_dir, bundle, &o), SPARQ_OK);
    CHECK(!sparq_path_exists(tmp("b2.partial")));
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_load(&m, bundle), SPARQ_OK);
    CHECK_EQ_INT(m.boxes, 2);
    CHECK_EQ_INT(m.block_size, 65536);
    CHECK_EQ_INT(m.ctx, 256);
    CHECK_EQ_INT(m.users, 2);
    CHECK(sq_manifest_find(&m, "node-0/model.safetensors") != NULL);
    CHECK(sq_manifest_find(&m, "node-1/model.safetensors") != NULL);
    CHECK(sq_manifest_find(&m, "config.json") != NULL);
    const sq_manifest_file *tok = sq_manifest_find(&m, "tokenizer.json");
    char tpath[800];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", model_dir);
    struct stat tst;
    CHECK(stat(tpath, &tst) == 0);
    CHECK(tok && tok->node == -1 && tok->size == (uint64_t)tst.st_size && tok->n_blocks == 1);
    CHECK_EQ_INT(m.nodes[0].first_layer + m.nodes[0].n_layers, m.nodes[1].first_layer);
    CHECK_EQ_INT(m.nodes[1].first_layer + m.nodes[1].n_layers, LAYERS);
    CHECK(m.nodes[0].has_embed && m.nodes[1].has_head);
    /* each shard holds exactly its node's tensors, same bytes as the source */
    sf_model *src = NULL, *n0 = NULL, *n1 = NULL;
    char p[800];
    CHECK_EQ_INT(sf_open(&src, model_dir), SPARQ_OK);
    snprintf(p, sizeof p, "%s/node-0/model.safetensors", bundle);
    CHECK_EQ_INT(sf_open(&n0, p), SPARQ_OK);
    snprintf(p, sizeof p, "%s/node-1/model.safetensors", bundle);
    CHECK_EQ_INT(sf_open(&n1, p), SPARQ_OK);
    if (src && n0 && n1) {
        CHECK_EQ_INT(sf_count(n0) + sf_count(n1), sf_count(src));
        CHECK(sf_find(n0, "model.embed_tokens.weight") && !sf_find(n1, "model.embed_tokens.weight"));
        CHECK(sf_find(n1, "lm_head.weight") && sf_find(n1, "model.norm.weight"));
        int same = 1;
        for (size_t i = 0; i < sf_count(src); i++) {
            const sf_tensor *a = sf_at(src, i);
            const sf_tensor *b = sf_find(n0, a->name);
            if (!b) b = sf_find(n1, a->name);
            if (!b || b->nbytes != a->nbytes || memcmp(a->data, b->data, a->nbytes)) same = 0;
        }
        CHECK(same);
        char lname[64];
        snprintf(lname, sizeof lname, "model.layers.%lld.mlp.experts.3.down_proj.weight",
                 (long long)m.nodes[1].first_layer);
        CHECK(sf_find(n1, lname) != NULL);
    }
    sf_close(src);
    sf_close(n0);
    sf_close(n1);
    /* the data of a shard starts on a 4096-byte boundary */
    snprintf(p, sizeof p, "%s/node-1/model.safetensors", bundle);
    FILE *f = fopen(p, "rb");
    uint64_t hl = 0;
    CHECK(f && fread(&hl, 8, 1, f) == 1);
    if (f) fclose(f);
    CHECK_EQ_INT((8 + hl) % 4096, 0);
    CHECK_EQ_INT(sq_bundle_check_quick(bundle, &m, -1), SPARQ_OK);
    sq_manifest_free(&m);

    sq_verify_options vo = {-1, false, 2};
    sq_verify_report r;
    CHECK_EQ_INT(sq_verify_bundle(bundle, &vo, &r), SPARQ_OK);
    CHECK_EQ_INT(r.n_bad, 0);
    CHECK(r.blocks >= 20);
    sq_verify_report_free(&r);
}

/* The manifest's per-node numbers are the memplan functions the runtime
 * calls at load (sq_memplan_kv_bytes / sq_memplan_workspace_bytes / ...). */
static void test_plan_matches_runtime_formulas(void)
{
    sq_model_config cfg;
    CHECK_EQ_INT(sq_config_load(&cfg, model_dir), SPARQ_OK);
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_load(&m, bundle), SPARQ_OK);
    json_t *root;
    char mp[800];
    snprintf(mp, sizeof mp, "%s/manifest.json", bundle);
    CHECK_EQ_INT(sq_json_load_file(&root, mp, 0), SPARQ_OK);
    sq_memplan_params p;
    sq_memplan_params_default(&p);
    p.ctx = m.ctx;
    p.users = m.users;
    p.chunk = m.chunk;
    p.logits_rows = m.logits_rows;
    p.threads = m.threads;
    CHECK(sq_kv_dtype_parse(m.kv_dtype, &p.kv_dtype));
    json_t *nodes = json_object_get(json_object_get(root, "plan"), "nodes");
    for (int k = 0; k < m.boxes; k++) {
        json_t *n = json_array_get(nodes, (size_t)k);
        CHECK_EQ_INT(json_integer_value(json_object_get(n, "kv")), sq_memplan_kv_bytes_range(&cfg, m.nodes[k].first_layer, m.nodes[k].n_layers, &p));
        CHECK_EQ_INT(json_integer_value(json_object_get(n, "workspace")),
                     sq_memplan_workspace_bytes(&cfg, &p, m.nodes[k].has_head));
        CHECK_EQ_INT(json_integer_value(json_object_get(n, "comm")), sq_memplan_comm_bytes(&cfg, &p, m.boxes));
        /* weights = the bytes of the tensors in the node's shard */
        char sp[800];
        snprintf(sp, sizeof sp, "%s/node-%d/model.safetensors", bundle, k);
        sf_model *sf;
        uint64_t w = 0;
        if (sf_open(&sf, sp) == SPARQ_OK) {
            for (size_t i = 0; i < sf_count(sf); i++) w += sf_at(sf, i)->nbytes;
            sf_close(sf);
        }
        CHECK_EQ_INT(json_integer_value(json_object_get(n, "weights")), w);
    }
    json_decref(root);
    sq_manifest_free(&m);
    sq_config_free(&cfg);
}

static void flip(const char *p, uint64_t off)
{
    int fd = open(p, O_RDWR);
    unsigned char c = 0;
    CHECK(fd >= 0 && pread(fd, &c, 1, (off_t)off) == 1);
    c ^= 0x80;
    CHECK(pwrite(fd, &c, 1, (off_t)off) == 1);
    close(fd);
}

static void test_flip_random_byte(void)
{
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_load(&m, bundle), SPARQ_OK);
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    for (int round = 0; round < 6; round++) {
        const sq_manifest_file *f = &m.files[(size_t)rand() % m.n_files];
        uint64_t off = ((uint64_t)rand() << 16 ^ (uint64_t)rand()) % f->size;
        char p[800], want[128];
        snprintf(p, sizeof p, "%s/%s", bundle, f->path);
        flip(p, off);
        sq_verify_options vo = {-1, false, 2};
        sq_verify_report r;
        CHECK_EQ_INT(sq_verify_bundle(bundle, &vo, &r), SPARQ_E_CHECKSUM);
        snprintf(want, sizeof want, "%s: block %llu ", f->path, (unsigned long long)(off / m.block_size));
        CHECK_MSG(r.n_problems == 1 && strstr(r.problems[0], want), "seed %u: wanted '%s' got '%s'", seed, want,
                  r.n_problems ? r.problems[0] : "(none)");
        CHECK_STR_CONTAINS(sparq_errmsg(), want);
        sq_verify_report_free(&r);
        /* --node of another node skips that node's shard */
        if (f->node >= 0) {
            sq_verify_options other = {1 - f->node, false, 1};
            CHECK_EQ_INT(sq_verify_bundle(bundle, &other, &r), SPARQ_OK);
            sq_verify_report_free(&r);
        }
        flip(p, off);
    }
    sq_verify_options vo = {-1, false, 1};
    sq_verify_report r;
    CHECK_EQ_INT(sq_verify_bundle(bundle, &vo, &r), SPARQ_OK);
    sq_verify_report_free(&r);
    sq_manifest_free(&m);
}

static void test_truncate(void)
{
    char p[800], saved[820];
    snprintf(p, sizeof p, "%s/node-1/model.safetensors", bundle);
    snprintf(saved, sizeof saved, "%s.saved", p);
    char *data;
    size_t n;
    CHECK_EQ_INT(sparq_file_read_all(p, 0, &data, &n), SPARQ_OK);
    CHECK(truncate(p, (off_t)(n - 1000)) == 0);
    sq_verify_options vo = {-1, false, 2};
    sq_verify_report r;
    CHECK_EQ_INT(sq_verify_bundle(bundle, &vo, &r), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "node-1/model.safetensors");
    CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    sq_verify_report_free(&r);
    vo.quick = true;
    CHECK_EQ_INT(sq_verify_bundle(bundle, &vo, &r), SPARQ_E_FORMAT);
    sq_verify_report_free(&r);
    /* the runtime's load check */
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_load(&m, bundle), SPARQ_OK);
    CHECK_EQ_INT(sq_bundle_check_quick(bundle, &m, 1), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "node-1/model.safetensors: ");
    CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    CHECK_EQ_INT(sq_bundle_check_quick(bundle, &m, 0), SPARQ_OK); /* node 0 does not load it */
    CHECK_EQ_INT(sq_bundle_check_quick(bundle, &m, 2), SPARQ_E_ARG);
    /* missing */
    CHECK(rename(p, saved) == 0);
    CHECK_EQ_INT(sq_bundle_check_quick(bundle, &m, -1), SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "missing");
    CHECK(rename(saved, p) == 0);
    sq_manifest_free(&m);
    CHECK_EQ_INT(sparq_file_write_atomic(p, data, n), SPARQ_OK);
    sparq_free(data);
    vo.quick = false;
    CHECK_EQ_INT(sq_verify_bundle(bundle, &vo, &r), SPARQ_OK);
    sq_verify_report_free(&r);
}

static void test_budget_one_byte_short(void)
{
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_load(&m, bundle), SPARQ_OK);
    uint64_t need = 0;
    for (int k = 0; k < m.boxes; k++)
        if (m.nodes[k].total_bytes > need) need = m.nodes[k].total_bytes;
    sq_manifest_free(&m);
    sq_pack_options o = small_options(2);
    o.budget.mem_per_box = need - 1;
    o.budget.reserve_os = o.budget.display_reserve = o.budget.unlock_display = 0;
    o.budget.gpu_util = 1.0;
    const char *out = tmp("short");
    CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_E_FIT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "over by 0.00 GiB (1 bytes)");
    CHECK_STR_CONTAINS(sparq_errmsg(), "nothing written");
    CHECK(!sparq_path_exists(out));
    CHECK(!sparq_path_exists(tmp("short.partial")));
    /* an existing OUT is left untouched too */
    CHECK_EQ_INT(sq_pack_bundle(model_dir, bundle, &o), SPARQ_E_FIT);
    CHECK(sparq_path_exists(bundle));
    /* exactly enough packs */
    o.budget.mem_per_box = need;
    CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_OK);
    /* OUT exists: refused */
    CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "already exists");
}

static void test_partial_without_resume(void)
{
    const char *out = tmp("again");
    CHECK_EQ_INT(sparq_mkdirs(tmp("again.partial")), SPARQ_OK);
    sq_pack_options o = small_options(2);
    CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "--resume");
    o.resume = true; /* a partial holding files but no state file is someone else's: refused */
    char foreign[800];
    snprintf(foreign, sizeof foreign, "%s/notes.txt", tmp("again.partial"));
    CHECK_EQ_INT(sparq_file_write_atomic(foreign, "x", 1), SPARQ_OK);
    CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "other options");
    unlink(foreign);
    /* an empty one (killed right after mkdir) is resumed */
    CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_OK);
    CHECK(!sparq_path_exists(tmp("again.partial")));
    /* same options, same bytes */
    char a[800], b[800];
    snprintf(a, sizeof a, "%s/manifest.json", bundle);
    snprintf(b, sizeof b, "%s/manifest.json", out);
    char *ta, *tb;
    size_t na, nb;
    CHECK_EQ_INT(sparq_file_read_all(a, 0, &ta, &na), SPARQ_OK);
    CHECK_EQ_INT(sparq_file_read_all(b, 0, &tb, &nb), SPARQ_OK);
    CHECK(na == nb && !memcmp(ta, tb, na));
    sparq_free(ta);
    sparq_free(tb);
}

static void test_manifest_rejects(void)
{
    char *text;
    size_t n;
    char mp[800];
    snprintf(mp, sizeof mp, "%s/manifest.json", bundle);
    CHECK_EQ_INT(sparq_file_read_all(mp, 0, &text, &n), SPARQ_OK);
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_parse(&m, text, n, "m.json"), SPARQ_OK);
    sq_manifest_free(&m);
    /* the tokenizer's entry: a file of one block */
    char tok_size[64];
    {
        char tp[800];
        struct stat tst;
        snprintf(tp, sizeof tp, "%s/tokenizer.json", bundle);
        CHECK(stat(tp, &tst) == 0);
        snprintf(tok_size, sizeof tok_size, "\"size\": %llu,", (unsigned long long)tst.st_size);
    }
    struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"\"format\": \"sparq-bundle\"", "\"format\": \"other\"", "'format'"},
        {"\"format_version\": 1", "\"format_version\": 3", "format_version 3"},
        /* version 2 is the expert split's: a pipeline plan under it is refused */
        {"\"format_version\": 1", "\"format_version\": 2", "is \"pipeline\" but format_version is 2"},
        {"\"block_size\": 65536", "\"block_size\": 65535", "power of two"},
        {"\"path\": \"tokenizer.json\"", "\"path\": \"../tokenizer.json\"", "without '..'"},
        {"\"path\": \"tokenizer.json\"", "\"path\": \"config.json\"", "listed twice"},
        {tok_size, "\"size\": 70000,", "block digests"},
        {"\"boxes\": 2", "\"boxes\": 3", "3 nodes"},
        {"\"first_layer\": 0", "\"first_layer\": 1", "first_layer"},
        {"\"kv_dtype\": \"f32\"", "\"kv_dtype\": \"q8\"", "kv_dtype"},
        {"\"node\": 1,\n   \"size\"", "\"node\": 5,\n   \"size\"", "'node'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *at = strstr(text, cases[i].from);
        CHECK_MSG(at != NULL, "case %zu: '%s' not in the manifest", i, cases[i].from);
        if (!at) continue;
        size_t fl = strlen(cases[i].from), tl = strlen(cases[i].to);
        char *mod = malloc(n + tl + 1);
        size_t pre = (size_t)(at - text);
        memcpy(mod, text, pre);
        memcpy(mod + pre, cases[i].to, tl);
        memcpy(mod + pre + tl, at + fl, n - pre - fl);
        size_t mn = n - fl + tl;
        sparq_status st = sq_manifest_parse(&m, mod, mn, "m.json");
        CHECK_MSG(st != SPARQ_OK, "case %zu accepted", i);
        CHECK_MSG(strstr(sparq_errmsg(), cases[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, sparq_errmsg(),
                  cases[i].msg);
        sq_manifest_free(&m);
        free(mod);
    }
    CHECK_EQ_INT(sq_manifest_parse(&m, "[1]", 3, "m.json"), SPARQ_E_FORMAT);
    CHECK_EQ_INT(sq_manifest_parse(&m, "{", 1, "m.json"), SPARQ_E_FORMAT);
    CHECK_EQ_INT(sq_manifest_load(&m, t_tmpdir()), SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "not a sparq bundle");
    /* allocation faults: clean failures only */
    int fails = 0;
    for (uint64_t k = 1; k < 400; k += 7) {
        sparq_alloc_fail_at(k, false);
        sparq_status st = sq_manifest_parse(&m, text, n, "m.json");
        sparq_alloc_fail_at(0, false);
        if (st != SPARQ_OK) {
            fails++;
            CHECK_EQ_INT(st, SPARQ_E_NOMEM);
        }
        sq_manifest_free(&m);
    }
    CHECK(fails > 0);
    sparq_free(text);
}

/* The real EXL3 model made by exllamav3 (trellis tensors) packs and verifies. */
static void test_exl3_model(void)
{
    const char *model = t_data_path("exl3-model/exl3-3.0bpw");
    if (!sparq_path_exists(model)) {
        printf("note: %s absent, EXL3 pack test skipped\n", model);
        return;
    }
    sq_pack_options o = small_options(4);
    const char *out = tmp("exl3-4");
    CHECK_EQ_INT(sq_pack_bundle(model, out, &o), SPARQ_OK);
    sq_verify_options vo = {-1, false, 2};
    sq_verify_report r;
    CHECK_EQ_INT(sq_verify_bundle(out, &vo, &r), SPARQ_OK);
    sq_verify_report_free(&r);
    sq_manifest m;
    CHECK_EQ_INT(sq_manifest_load(&m, out), SPARQ_OK);
    for (int k = 0; k < 4; k++) CHECK_EQ_INT(m.nodes[k].n_layers, 1);
    CHECK(sq_manifest_find(&m, "quantization_config.json") != NULL);
    sq_manifest_free(&m);
}

/* Allocation failures anywhere in pack give a clean SPARQ_E_NOMEM, and a
 * --resume afterwards finishes the same bundle, byte for byte. */
static void test_pack_alloc_faults(void)
{
    char ref[800], *want = NULL;
    size_t wn = 0;
    snprintf(ref, sizeof ref, "%s/manifest.json", bundle);
    CHECK_EQ_INT(sparq_file_read_all(ref, 0, &want, &wn), SPARQ_OK);
    int failed = 0, runs = 0;
    for (uint64_t k = 1; k < 6000 && runs < 40; k += 1 + k / 6, runs++) {
        char name[64];
        snprintf(name, sizeof name, "fault-%llu", (unsigned long long)k);
        const char *out = tmp(name);
        sq_pack_options o = small_options(2);
        sparq_alloc_fail_at(k, false);
        sparq_status st = sq_pack_bundle(model_dir, out, &o);
        sparq_alloc_fail_at(0, false);
        if (st != SPARQ_OK) {
            failed++;
            CHECK_MSG(st == SPARQ_E_NOMEM, "allocation %llu: %s: %s", (unsigned long long)k, sparq_status_str(st),
                      sparq_errmsg());
            o.resume = true;
            CHECK_EQ_INT(sq_pack_bundle(model_dir, out, &o), SPARQ_OK);
        }
        char mp[800], *have = NULL;
        size_t hn = 0;
        snprintf(mp, sizeof mp, "%s/manifest.json", out);
        CHECK_EQ_INT(sparq_file_read_all(mp, 0, &have, &hn), SPARQ_OK);
        CHECK_MSG(have && hn == wn && !memcmp(have, want, wn), "allocation %llu: manifest differs",
                  (unsigned long long)k);
        sparq_free(have);
        char cmd[900];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        CHECK(system(cmd) == 0);
    }
    printf("pack under allocation faults: %d of %d runs failed cleanly and resumed\n", failed, runs);
    CHECK(failed > 10);
    sparq_free(want);
}

static void flip_at(const char *p, uint64_t off)
{
    int fd = open(p, O_RDWR);
    unsigned char c;
    if (pread(fd, &c, 1, (off_t)off) == 1) {
        c ^= 0x5A;
        CHECK(pwrite(fd, &c, 1, (off_t)off) == 1);
    }
    close(fd);
}

/* The DeepSeek V4.1 fixture packed for 2 boxes: node K's Engram file holds
 * the tables of node K's Engram layers (layer 1 on node 0, 14 on node 1),
 * named by the manifest; the rows the hash addresses come back as in the
 * checkpoint; a flipped byte and a truncation are named by verify. */
static void test_engram_tables(void)
{
    char plain[600];
    snprintf(plain, sizeof plain, "%s", model_dir);
    /* Engram tables in a model whose config has no Engram layers */
    write_model_to("model-engram", 1);
    sq_pack_options o = small_options(2);
    CHECK_EQ_INT(sq_pack_bundle(model_dir, tmp("engbad"), &o), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "config.json gives layer 1 no Engram table");
    CHECK(!sparq_path_exists(tmp("engbad")) && !sparq_path_exists(tmp("engbad.partial")));
    snprintf(model_dir, sizeof model_dir, "%s", plain);

    const char *fx = t_data_path("tiny-dsv41");
    for (int boxes = 1; boxes <= 2; boxes++) {
        o = small_options(boxes);
        char name[32];
        snprintf(name, sizeof name, "dsv41-b%d", boxes);
        const char *out = tmp(name);
        CHECK_EQ_INT(sq_pack_bundle(fx, out, &o), SPARQ_OK);
        sq_manifest m;
        CHECK_EQ_INT(sq_manifest_load(&m, out), SPARQ_OK);
        if (m.boxes != boxes) {
            sq_manifest_free(&m);
            return;
        }
        for (int k = 0; k < boxes; k++) {
            char want[64];
            snprintf(want, sizeof want, "engram/engram-node-%d.bin", k);
            CHECK_MSG(!strcmp(m.nodes[k].engram_file, want), "node %d engram_file '%s'", k, m.nodes[k].engram_file);
            const sq_manifest_file *f = sq_manifest_find(&m, want);
            CHECK(f && f->node == k);
        }
        sq_manifest_free(&m);
        sq_verify_options vo = {-1, false, 2};
        sq_verify_report r;
        CHECK_EQ_INT(sq_verify_bundle(out, &vo, &r), SPARQ_OK);
        sq_verify_report_free(&r);
        /* the tables are not in the node shards; the rows are in the node files */
        char p[800];
        sf_model *n0 = NULL, *src = NULL;
        snprintf(p, sizeof p, "%s/node-0/model.safetensors", out);
        CHECK_EQ_INT(sf_open(&n0, p), SPARQ_OK);
        CHECK(n0 && !sf_find(n0, "layers.1.engram.embed.weight") && !sf_find(n0, "layers.14.engram.embed.weight"));
        sf_close(n0);
        CHECK_EQ_INT(sf_open(&src, fx), SPARQ_OK);
        const int layers[2] = {1, 14};
        int bad = 0, checked = 0;
        for (int t = 0; t < 2 && src; t++) {
            const int k = boxes == 1 ? 0 : t; /* the 2-box plan cuts at layer 10 */
            snprintf(p, sizeof p, "%s/engram/engram-node-%d.bin", out, k);
            sq_engram_reader *rd = NULL;
            CHECK_EQ_INT(sq_engram_open(&rd, p, 16), SPARQ_OK);
            if (!rd) continue;
            const sq_engram_layout *lay = &sq_engram_reader_header(rd)->layout;
            const int ft = sq_engram_table_of(lay, layers[t]);
            CHECK(ft >= 0);
            CHECK_EQ_INT(lay->n_layers, boxes == 1 ? 2 : 1);
            CHECK_EQ_INT(lay->row_bytes, 33);
            CHECK(lay->n_tokens >= 129280 && lay->token_map[2] == 2);
            char wn[64], sn[64];
            snprintf(wn, sizeof wn, "layers.%d.engram.embed.weight", layers[t]);
            snprintf(sn, sizeof sn, "layers.%d.engram.embed.scale", layers[t]);
            const sf_tensor *w = sf_find(src, wn), *sc = sf_find(src, sn);
            const uint32_t ids[] = {0, 791, 17, 40000, 129279, 2};
            uint32_t cids[6];
            for (int i = 0; i < 6; i++) cids[i] = lay->token_map[ids[i]];
            for (size_t pos = 0; pos < 6 && w && sc && ft >= 0; pos++) {
                uint64_t b[SQ_ENGRAM_MAX_COLUMNS];
                sq_engram_buckets(lay, (uint32_t)ft, cids, 6, pos, b);
                for (uint32_t c = 0; c < lay->n_columns; c++) {
                    sq_engram_key key = {(uint32_t)ft, c, b[c]};
                    uint8_t row[33];
                    CHECK_EQ_INT(sq_engram_fetch(rd, 1, &key, row), SPARQ_OK);
                    const uint64_t g = lay->row_offset[ft][c] + b[c];
                    bad += memcmp(row, (const uint8_t *)w->data + g * 32, 32) ||
                           row[32] != ((const uint8_t *)sc->data)[g];
                    checked++;
                }
            }
            sq_engram_close(rd);
        }
        CHECK_EQ_INT(checked, 2 * 6 * 24);
        CHECK_EQ_INT(bad, 0);
        sf_close(src);
        if (boxes != 2) continue;
        /* a flipped byte in node 1's Engram file: verify names the file and the block */
        snprintf(p, sizeof p, "%s/engram/engram-node-1.bin", out);
        flip_at(p, 300000);
        CHECK_EQ_INT(sq_verify_bundle(out, &vo, &r), SPARQ_E_CHECKSUM);
        CHECK_STR_CONTAINS(sparq_errmsg(), "engram/engram-node-1.bin");
        CHECK_STR_CONTAINS(sparq_errmsg(), "block 4");
        sq_verify_report_free(&r);
        flip_at(p, 300000);
        CHECK_EQ_INT(sq_verify_bundle(out, &vo, &r), SPARQ_OK);
        sq_verify_report_free(&r);
        /* truncated: verify and the file's own reader name it */
        struct stat sb;
        CHECK(stat(p, &sb) == 0);
        CHECK(truncate(p, sb.st_size - 1000) == 0);
        CHECK(sq_verify_bundle(out, &vo, &r) != SPARQ_OK);
        CHECK_STR_CONTAINS(sparq_errmsg(), "engram/engram-node-1.bin");
        sq_verify_report_free(&r);
        sq_engram_reader *rd = NULL;
        CHECK_EQ_INT(sq_engram_open(&rd, p, 0), SPARQ_E_FORMAT);
        CHECK_STR_CONTAINS(sparq_errmsg(), "engram-node-1.bin: file is");
        CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    }
}

int main(void)
{
    RUN(test_pack);
    RUN(test_plan_matches_runtime_formulas);
    RUN(test_flip_random_byte);
    RUN(test_truncate);
    RUN(test_budget_one_byte_short);
    RUN(test_partial_without_resume);
    RUN(test_manifest_rejects);
    RUN(test_exl3_model);
    RUN(test_pack_alloc_faults);
    RUN(test_engram_tables);
    return t_summary();
}
