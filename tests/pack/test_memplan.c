/* tests/pack/test_memplan.c — the memory plan: every formula against numbers
 * worked out by hand (see the comments), the DGX Spark budget, tensor
 * classification, the layer split, the fit verdict and the suggestions. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/memplan.h"
#include "t.h"

/* A small Qwen3-MoE: the shape of tests/data/exl3-model. */
static sq_model_config tiny_cfg(void)
{
    sq_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = SQ_ARCH_QWEN3_MOE;
    c.vocab_size = 4096;
    c.hidden_size = 256;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 768;
    c.moe_intermediate_size = 128;
    c.num_experts = 16;
    c.num_experts_per_tok = 4;
    c.decoder_sparse_step = 1;
    c.tie_word_embeddings = true;
    return c;
}

static sq_memplan_params params(int64_t ctx, int64_t users)
{
    sq_memplan_params p;
    sq_memplan_params_default(&p);
    p.ctx = ctx;
    p.users = users;
    return p;
}

static void test_kv(void)
{
    sq_model_config c = tiny_cfg();
    sq_memplan_params p = params(1000, 3);
    /* 2 (K,V) x 2 layers x 2 kv heads x 64 x 1000 ctx x 3 users x 4 bytes */
    CHECK_EQ_INT(sq_memplan_kv_bytes(&c, 2, &p), 6144000);
    p.kv_dtype = SQ_KV_F16;
    CHECK_EQ_INT(sq_memplan_kv_bytes(&c, 2, &p), 3072000);
    CHECK_EQ_INT(sq_memplan_kv_bytes(&c, 0, &p), 0);
    /* saturates instead of wrapping */
    p.ctx = (int64_t)1 << 40;
    p.users = 1 << 20;
    CHECK(sq_memplan_kv_bytes(&c, 4, &p) == UINT64_MAX);
}

static void test_workspace(void)
{
    sq_model_config c = tiny_cfg();
    sq_memplan_params p = params(1000, 3); /* chunk 512 -> rows 512; threads 32 */
    CHECK_EQ_INT(sq_memplan_rows(&p), 512);
    CHECK_EQ_INT(p.threads, 32);
    sq_memplan_workspace w;
    sq_memplan_workspace_terms(&c, &p, true, &w);
    CHECK_EQ_INT(w.hidden, 6 * 512 * 256 * 4);                             /* 3,145,728 */
    CHECK_EQ_INT(w.attn, 512 * (8 + 4) * 64 * 4);                          /* 1,572,864 */
    CHECK_EQ_INT(w.moe, (512 * 16 + 4 * 512 * 4 + 2 * 512 * 128) * 4);     /* 589,824 */
    CHECK_EQ_INT(w.misc, (3 * 512 + 2 * 17) * 4 + 65536);                  /* 71,816 */
    CHECK_EQ_INT(w.norms, (4 * (2 * 256 + 2 * 64) + 256) * 4);             /* 11,264 */
    CHECK_EQ_INT(w.scratch, 32 * (64 * 256) * 4);                          /* 64 x max_in > ctx */
    CHECK_EQ_INT(w.logits, 3 * 4096 * 4);                                  /* users rows */
    CHECK_EQ_INT(w.total, 7537800);
    CHECK_EQ_INT(sq_memplan_workspace_bytes(&c, &p, true), 7537800);
    CHECK_EQ_INT(sq_memplan_workspace_bytes(&c, &p, false), 7537800 - 49152);
    p.logits_rows = 512;
    CHECK_EQ_INT(sq_memplan_workspace_bytes(&c, &p, true), 7537800 - 49152 + 512 * 4096 * 4);
    /* a long context: the per-thread score row is the scratch */
    p.ctx = 100000;
    p.threads = 2;
    sq_memplan_workspace_terms(&c, &p, false, &w);
    CHECK_EQ_INT(w.scratch, 2 * 100000 * 4);
    /* a dense layer makes the MLP the widest: gate/up and scratch grow */
    p = params(1000, 3);
    int64_t dense[] = {0};
    c.mlp_only_layers = dense;
    c.n_mlp_only_layers = 1;
    sq_memplan_workspace_terms(&c, &p, false, &w);
    CHECK_EQ_INT(w.moe, (512 * 16 + 4 * 512 * 4 + 2 * 512 * 768) * 4);
    CHECK_EQ_INT(w.scratch, 32 * (64 * 768) * 4);
    /* decode with many users: rows = users */
    p = params(1000, 600);
    CHECK_EQ_INT(sq_memplan_rows(&p), 600);
}

static void test_comm_budget(void)
{
    sq_model_config c = tiny_cfg();
    sq_memplan_params p = params(1000, 3);
    CHECK_EQ_INT(sq_memplan_comm_bytes(&c, &p, 1), 0);
    CHECK_EQ_INT(sq_memplan_comm_bytes(&c, &p, 2), 2 * 2 * 512 * 256 * 4 + (64 << 20));
    sq_memplan_budget b;
    sq_memplan_budget_default(&b);
    uint64_t u;
    CHECK_EQ_INT(sq_memplan_usable(&b, &u), SPARQ_OK);
    /* (128 - 6 - 2 + 1.75) GiB = 130,728,067,072 B; x 0.92 = 120,269,821,706.24 */
    CHECK_EQ_INT(u, 120269821706ull);
    b.gpu_util = 1.0;
    b.reserve_os = b.display_reserve = b.unlock_display = 0;
    b.mem_per_box = 12345;
    CHECK_EQ_INT(sq_memplan_usable(&b, &u), SPARQ_OK);
    CHECK_EQ_INT(u, 12345);
    b.reserve_os = 20000;
    CHECK_EQ_INT(sq_memplan_usable(&b, &u), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "exceed mem-per-box");
    sq_memplan_budget_default(&b);
    b.unlock_display = b.display_reserve + 1;
    CHECK_EQ_INT(sq_memplan_usable(&b, &u), SPARQ_E_ARG);
    sq_memplan_budget_default(&b);
    b.gpu_util = 1.5;
    CHECK_EQ_INT(sq_memplan_usable(&b, &u), SPARQ_E_ARG);
}

static void test_classify(void)
{
    int64_t l;
    bool ex;
    CHECK_EQ_INT(sq_memplan_classify("model.layers.3.mlp.experts.7.down_proj.trellis", &l, &ex), SQ_TENSOR_LAYER);
    CHECK_EQ_INT(l, 3);
    CHECK(ex);
    CHECK_EQ_INT(sq_memplan_classify("model.layers.12.self_attn.q_proj.weight", &l, &ex), SQ_TENSOR_LAYER);
    CHECK_EQ_INT(l, 12);
    CHECK(!ex);
    CHECK_EQ_INT(sq_memplan_classify("layers.5.ffn.shared_experts.w1.weight", &l, &ex), SQ_TENSOR_LAYER);
    CHECK(!ex);
    CHECK_EQ_INT(sq_memplan_classify("layers.14.engram.embed.weight", &l, &ex), SQ_TENSOR_ENGRAM_TABLE);
    CHECK_EQ_INT(l, 14);
    CHECK_EQ_INT(sq_memplan_classify("layers.14.engram.wkv.weight", &l, &ex), SQ_TENSOR_LAYER);
    CHECK_EQ_INT(sq_memplan_classify("model.embed_tokens.weight", &l, &ex), SQ_TENSOR_EMBED);
    CHECK_EQ_INT(l, -1);
    CHECK_EQ_INT(sq_memplan_classify("embed.weight", &l, &ex), SQ_TENSOR_EMBED);
    CHECK_EQ_INT(sq_memplan_classify("lm_head.trellis", &l, &ex), SQ_TENSOR_HEAD);
    CHECK_EQ_INT(sq_memplan_classify("head.weight", &l, &ex), SQ_TENSOR_HEAD);
    CHECK_EQ_INT(sq_memplan_classify("model.norm.weight", &l, &ex), SQ_TENSOR_FINAL_NORM);
    CHECK_EQ_INT(sq_memplan_classify("mtp.0.norm.weight", &l, &ex), SQ_TENSOR_LAST_OTHER);
    CHECK_EQ_INT(sq_memplan_classify("vision.patch.weight", &l, &ex), SQ_TENSOR_OTHER);
    CHECK_EQ_INT(sq_memplan_classify("model.layers.x.foo", &l, &ex), SQ_TENSOR_OTHER);
}

/* Budget of exactly `usable` bytes per box. */
static sq_memplan_budget exact_budget(uint64_t usable)
{
    sq_memplan_budget b;
    sq_memplan_budget_default(&b);
    b.mem_per_box = usable;
    b.reserve_os = b.display_reserve = b.unlock_display = 0;
    b.gpu_util = 1.0;
    b.margin = 1000;
    return b;
}

static void test_split_and_fit(void)
{
    sq_model_config c = tiny_cfg();
    c.num_hidden_layers = 8;
    c.tie_word_embeddings = true;
    sq_memplan_params p = params(64, 1);
    p.chunk = 16;
    /* 8 equal layers of 1 MB (half of it experts), a small embedding, tied head */
    static char names[8][2][64];
    sq_memplan_tensor t[17];
    size_t n = 0;
    for (int l = 0; l < 8; l++) {
        snprintf(names[l][0], 64, "model.layers.%d.self_attn.q_proj.weight", l);
        snprintf(names[l][1], 64, "model.layers.%d.mlp.experts.0.up_proj.weight", l);
        t[n++] = (sq_memplan_tensor){names[l][0], 500000};
        t[n++] = (sq_memplan_tensor){names[l][1], 500000};
    }
    t[n++] = (sq_memplan_tensor){"model.embed_tokens.weight", 1000};
    sq_memplan_budget b = exact_budget((uint64_t)1 << 40);
    sq_memplan plan;
    CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, 2, &p, &b), SPARQ_OK);
    CHECK(plan.fits);
    CHECK(plan.tied_head);
    CHECK_EQ_INT(plan.nodes[0].first_layer, 0);
    CHECK_EQ_INT(plan.nodes[0].n_layers, 4);
    CHECK_EQ_INT(plan.nodes[1].first_layer, 4);
    CHECK_EQ_INT(plan.nodes[1].n_layers, 4);
    CHECK(plan.nodes[0].has_embed && !plan.nodes[0].has_head);
    CHECK(plan.nodes[1].has_head && !plan.nodes[1].has_embed);
    /* tied: the last node holds the embedding as lm_head too */
    CHECK_EQ_INT(plan.nodes[0].weights, 4 * 1000000 + 1000);
    CHECK_EQ_INT(plan.nodes[1].weights, 4 * 1000000 + 1000);
    CHECK_EQ_INT(plan.nodes[0].experts, 4 * 16);
    CHECK_EQ_INT(plan.weights_total, 8 * 1000000 + 1000);
    for (int k = 0; k < 2; k++) {
        const sq_memplan_node *nd = &plan.nodes[k];
        CHECK_EQ_INT(nd->kv, sq_memplan_kv_bytes(&c, nd->n_layers, &p));
        CHECK_EQ_INT(nd->workspace, sq_memplan_workspace_bytes(&c, &p, nd->has_head));
        CHECK_EQ_INT(nd->comm, sq_memplan_comm_bytes(&c, &p, 2));
        CHECK_EQ_INT(nd->total, nd->weights + nd->kv + nd->workspace + nd->comm + nd->margin);
    }
    int also;
    CHECK_EQ_INT(sq_memplan_tensor_node(&plan, "model.layers.5.self_attn.q_proj.weight", &also), 1);
    CHECK_EQ_INT(also, -1);
    CHECK_EQ_INT(sq_memplan_tensor_node(&plan, "model.embed_tokens.weight", &also), 0);
    CHECK_EQ_INT(also, 1);
    CHECK_EQ_INT(sq_memplan_tensor_node(&plan, "lm_head.weight", &also), 1);
    uint64_t need = plan.nodes[0].total > plan.nodes[1].total ? plan.nodes[0].total : plan.nodes[1].total;
    sq_memplan_free(&plan);

    /* one heavy first layer: it gets a node to itself on 2 boxes */
    t[0].nbytes = 20000000;
    CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, 2, &p, &b), SPARQ_OK);
    CHECK_EQ_INT(plan.nodes[0].n_layers, 1);
    CHECK_EQ_INT(plan.nodes[1].n_layers, 7);
    sq_memplan_free(&plan);
    t[0].nbytes = 500000;

    /* every box count: contiguous, complete, at least one layer each */
    for (int boxes = 1; boxes <= 8; boxes++) {
        CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, boxes, &p, &b), SPARQ_OK);
        int64_t next = 0;
        for (int k = 0; k < boxes; k++) {
            CHECK_EQ_INT(plan.nodes[k].first_layer, next);
            CHECK(plan.nodes[k].n_layers >= 1);
            next += plan.nodes[k].n_layers;
        }
        CHECK_EQ_INT(next, 8);
        sq_memplan_free(&plan);
    }
    CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, 9, &p, &b), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "only 8 layers");

    /* exactly enough fits; one byte less does not, and says what to blame */
    b = exact_budget(need);
    CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, 2, &p, &b), SPARQ_OK);
    CHECK(plan.fits);
    CHECK_EQ_INT(plan.nodes[plan.worst_node].headroom, 0);
    sq_memplan_free(&plan);
    b = exact_budget(need - 1);
    CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, 2, &p, &b), SPARQ_OK);
    CHECK(!plan.fits);
    CHECK_EQ_INT(plan.nodes[plan.worst_node].headroom, -1);
    CHECK(!strcmp(plan.blame, "comm")); /* 64 MiB of transport buffers dwarf 4 MB of weights */
    int min_boxes;
    int64_t max_ctx;
    CHECK_EQ_INT(sq_memplan_suggest(&plan, &c, t, n, &min_boxes, &max_ctx), SPARQ_OK);
    CHECK_EQ_INT(min_boxes, 3); /* 3 layers at most per node: enough room */
    CHECK(max_ctx >= 1 && max_ctx < 64);
    sq_memplan_free(&plan);

    /* a layer index past the config is a format error naming the tensor */
    t[0].name = "model.layers.8.self_attn.q_proj.weight";
    CHECK_EQ_INT(sq_memplan_build(&plan, &c, t, n, 2, &p, &b), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "model.layers.8.self_attn.q_proj.weight");
}

/* The expert split's naming and ownership rules (the numbers of a whole plan:
 * tests/pack/test_split_experts.sh, from the fixture's header). */
static void test_expert_rules(void)
{
    CHECK_EQ_INT(sq_memplan_expert_of("model.layers.3.mlp.experts.12.up_proj.weight"), 12);
    CHECK_EQ_INT(sq_memplan_expert_of("model.layers.3.mlp.experts.12.up_proj.trellis"), 12);
    CHECK_EQ_INT(sq_memplan_expert_of("layers.2.ffn.experts.7.w1.weight"), 7);
    CHECK_EQ_INT(sq_memplan_expert_of("layers.2.ffn.shared_experts.w1.weight"), -1);
    CHECK_EQ_INT(sq_memplan_expert_of("model.layers.3.mlp.gate.weight"), -1);
    CHECK_EQ_INT(sq_memplan_expert_of("model.layers.3.mlp.experts.x.up_proj.weight"), -1);
    CHECK_EQ_INT(sq_memplan_expert_of("lm_head.weight"), -1);
    for (int e = 0; e < 16; e++) CHECK_EQ_INT(sq_memplan_expert_owner(e, 3), e % 3);
    CHECK_EQ_INT(sq_memplan_expert_owner(5, 1), 0);
    CHECK_EQ_INT(sq_memplan_experts_of_node(16, 3, 0), 6);
    CHECK_EQ_INT(sq_memplan_experts_of_node(16, 3, 2), 5);
    CHECK_EQ_INT(sq_memplan_experts_of_node(16, 1, 0), 16);
    sq_memplan_split sp;
    CHECK(sq_memplan_split_parse("experts", &sp) && sp == SQ_SPLIT_EXPERTS);
    CHECK(sq_memplan_split_parse("pipeline", &sp) && sp == SQ_SPLIT_PIPELINE);
    CHECK(!sq_memplan_split_parse("layers", &sp));
    sq_memplan_node nodes[3] = {{0}};
    sq_memplan pl = {.boxes = 3, .nodes = nodes, .params = {.split = SQ_SPLIT_EXPERTS}};
    for (int k = 0; k < 3; k++) {
        CHECK(sq_memplan_tensor_on_node(&pl, "model.layers.0.self_attn.q_proj.weight", k));
        CHECK(sq_memplan_tensor_on_node(&pl, "model.embed_tokens.weight", k));
        CHECK_EQ_INT(sq_memplan_tensor_on_node(&pl, "lm_head.weight", k), k == 0);
        CHECK_EQ_INT(sq_memplan_tensor_on_node(&pl, "model.norm.weight", k), k == 0);
        CHECK_EQ_INT(sq_memplan_tensor_on_node(&pl, "model.layers.1.mlp.experts.7.down_proj.weight", k), k == 1);
    }
    CHECK(!sq_memplan_tensor_on_node(&pl, "model.layers.0.self_attn.q_proj.weight", 3));
}

static void test_alloc_faults(void)
{
    sq_model_config c = tiny_cfg();
    sq_memplan_params p = params(64, 1);
    sq_memplan_budget b = exact_budget((uint64_t)1 << 40);
    sq_memplan_tensor t[] = {{"model.layers.0.a", 10}, {"model.layers.1.a", 10}, {"model.layers.2.a", 10},
                             {"model.layers.3.a", 10}};
    int failures = 0;
    for (uint64_t k = 1; k < 20; k++) {
        sq_memplan plan;
        sparq_alloc_fail_at(k, false);
        sparq_status st = sq_memplan_build(&plan, &c, t, 4, 2, &p, &b);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_OK) sq_memplan_free(&plan);
        else {
            failures++;
            CHECK_EQ_INT(st, SPARQ_E_NOMEM);
        }
    }
    CHECK(failures > 0);
}

int main(void)
{
    RUN(test_kv);
    RUN(test_workspace);
    RUN(test_comm_budget);
    RUN(test_classify);
    RUN(test_split_and_fit);
    RUN(test_alloc_faults);
    RUN(test_expert_rules);
    return t_summary();
}
